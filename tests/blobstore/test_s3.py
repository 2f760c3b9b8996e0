"""The S3 driver against a real HTTP S3 server (moto_server), with and without injected faults."""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import crc32c
import pytest

from offloadd.blobstore import s3 as s3_module
from offloadd.blobstore.base import BlobStore, MultipartUpload
from offloadd.blobstore.health import HealthPolicy, HealthState, StoreHealth
from offloadd.blobstore.s3 import ReadEndpoint, S3BlobStore, S3Options
from offloadd.blobstore.s3 import calls as s3_calls
from offloadd.blobstore.s3 import errors as s3_errors
from offloadd.blobstore.s3.session import Endpoint
from offloadd.errors import Fatal, NotFound, OffloaddError, Retriable
from tests.fixtures.faultproxy import FaultPlan, FaultProxy
from tests.fixtures.s3 import MIN_PART_SIZE, MotoBucket, running_moto

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PULSAR_METADATA = {
    "s3managedledgeroffloaderformatversion": "1",
    "role": "data",
    "managedledgername": "public/default/persistent/orders",
    "offloadd-format": "1",
}
PART = 64 * 1024  # parts of a realistic shape, well above moto's minimum here
FAST_RETRIES: dict[str, Any] = {"retry_base_s": 0.01, "retry_max_s": 0.1}


@pytest.fixture
async def store(s3_bucket: MotoBucket) -> AsyncIterator[S3BlobStore]:
    s = await S3BlobStore.open(s3_bucket.options(**FAST_RETRIES))
    yield s
    await s.close()


@pytest.fixture
def proxy(moto_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_server, seed=32) as p:
        yield p


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def split_buffers(data: bytes) -> list[bytes | bytearray | memoryview]:
    """One part handed over as several buffers of every accepted type."""
    third = len(data) // 3
    return [data[:third], bytearray(data[third : 2 * third]), memoryview(data)[2 * third :]]


async def upload_in_parts(
    store: S3BlobStore, key: str, data: bytes, part_size: int = PART
) -> MultipartUpload:
    """Start an upload and send every part concurrently, in shuffled order; not completed."""
    upload = await store.start_upload(key, PULSAR_METADATA)
    offsets = list(range(0, len(data), part_size))
    order = list(enumerate(offsets, start=1))
    random.Random(key).shuffle(order)
    await asyncio.gather(
        *(upload.put_part(n, off, split_buffers(data[off : off + part_size])) for n, off in order)
    )
    return upload


def incomplete_uploads(bucket: MotoBucket) -> list[str]:
    resp = bucket.boto3().list_multipart_uploads(Bucket=bucket.name)
    return [u["Key"] for u in resp.get("Uploads", [])]


class TestRoundTrip:
    """Objects written through the driver read back byte for byte, with their metadata."""

    async def test_the_driver_satisfies_the_blobstore_protocol(self, store: S3BlobStore) -> None:
        assert isinstance(store, BlobStore)
        upload = await store.start_upload("p", {})
        assert isinstance(upload, MultipartUpload)
        await upload.abort()

    async def test_concurrent_out_of_order_parts_make_one_object(
        self, store: S3BlobStore, s3_bucket: MotoBucket
    ) -> None:
        data = blob(4 * PART + 1234)
        upload = await upload_in_parts(store, "obj", data)
        assert isinstance(upload, s3_module.S3MultipartUpload)
        parts = await asyncio.to_thread(
            s3_bucket.boto3().list_parts,
            Bucket=s3_bucket.name,
            Key="obj",
            UploadId=upload.upload_id,
        )
        assert [(p["PartNumber"], p["Size"]) for p in parts["Parts"]] == [
            (1, PART),
            (2, PART),
            (3, PART),
            (4, PART),
            (5, 1234),
        ]

        info = await upload.complete()

        assert (info.key, info.size) == ("obj", len(data))
        assert await store.get_range("obj", 0, len(data)) == data
        for start, end in [
            (0, 1),
            (PART - 3, PART + 5),
            (len(data) - 7, len(data)),
        ]:
            assert await store.get_range("obj", start, end) == data[start:end]
        assert incomplete_uploads(s3_bucket) == []

    async def test_user_metadata_is_stored_as_given(self, store: S3BlobStore) -> None:
        upload = await upload_in_parts(store, "meta", blob(100))
        await upload.complete()
        await store.put("meta-index", [b"index"], {**PULSAR_METADATA, "role": "index"})

        data_info = await store.head("meta")
        index_info = await store.head("meta-index")

        assert data_info.metadata == PULSAR_METADATA
        assert data_info.size == 100
        assert index_info.metadata["s3managedledgeroffloaderformatversion"] == "1"
        assert index_info.metadata["role"] == "index"
        assert abs(index_info.mtime - time.time()) < 3600

    async def test_put_joins_buffers_and_sends_a_crc32c(
        self, store: S3BlobStore, s3_bucket: MotoBucket
    ) -> None:
        data = blob(3000, seed=7)
        info = await store.put("index", split_buffers(data), {})
        head = await asyncio.to_thread(
            s3_bucket.boto3().head_object,
            Bucket=s3_bucket.name,
            Key="index",
            ChecksumMode="ENABLED",
        )
        assert info.size == 3000
        assert (
            head["ChecksumCRC32C"]
            == base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()
        )
        assert await store.get_range("index", 0, 3000) == data

    async def test_reads_are_short_only_at_the_end(self, store: S3BlobStore) -> None:
        await store.put("short", [b"0123456789"], {})
        assert await store.get_range("short", 5, 100) == b"56789"
        assert await store.get_range("short", 10, 20) == b""
        assert await store.get_range("short", 3, 3) == b""

    async def test_absent_objects_are_not_found(self, store: S3BlobStore) -> None:
        with pytest.raises(NotFound):
            await store.head("nothing")
        with pytest.raises(NotFound):
            await store.get_range("nothing", 0, 10)
        with pytest.raises(NotFound):
            await store.get_range("nothing", 0, 0)
        await store.delete("nothing")

    async def test_delete_removes_the_object(self, store: S3BlobStore) -> None:
        await store.put("gone", [b"x"], {})
        await store.delete("gone")
        with pytest.raises(NotFound):
            await store.head("gone")

    async def test_prefix_is_added_on_write_and_stripped_on_list(
        self, s3_bucket: MotoBucket, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(s3_calls, "LIST_PAGE_SIZE", 2)  # force several pages
        s3_bucket.boto3().put_object(Bucket=s3_bucket.name, Key="elsewhere", Body=b"")
        store = await S3BlobStore.open(s3_bucket.options(prefix="tier/", **FAST_RETRIES))
        try:
            for name in ("a", "b", "c", "d-index", "e"):
                await store.put(name, [name.encode()], {})
            listed = [o async for o in store.list()]
            some = [o.key async for o in store.list("d")]
        finally:
            await store.close()
        assert [(o.key, o.size) for o in listed] == [
            ("a", 1),
            ("b", 1),
            ("c", 1),
            ("d-index", 7),
            ("e", 1),
        ]
        assert some == ["d-index"]
        raw = s3_bucket.boto3().list_objects_v2(Bucket=s3_bucket.name)
        assert "tier/a" in [o["Key"] for o in raw["Contents"]]

    async def test_driver_properties_use_pulsar_names_and_no_credentials(
        self, store: S3BlobStore, s3_bucket: MotoBucket
    ) -> None:
        assert store.driver_properties() == {
            "managedLedgerOffloadDriver": "aws-s3",
            "bucket": s3_bucket.name,
            "region": "us-east-1",
            "serviceEndpoint": s3_bucket.endpoint,
        }


class TestMultipartRules:
    """S3's multipart rules come back as clear errors; aborts and sweeps leave nothing behind."""

    async def test_a_small_non_last_part_is_fatal_and_says_why(self, store: S3BlobStore) -> None:
        upload = await store.start_upload("small", {})
        small = b"a" * (MIN_PART_SIZE - 1)  # moto's minimum stands in for S3's 5 MiB
        await upload.put_part(1, 0, [small])
        await upload.put_part(2, len(small), [b"last"])
        with pytest.raises(Fatal, match=r"EntityTooSmall.*at least 5 MiB"):
            await upload.complete()
        await upload.abort()

    async def test_gaps_in_parts_are_refused_before_completing(self, store: S3BlobStore) -> None:
        upload = await store.start_upload("gap", {})
        await upload.put_part(1, 0, [blob(PART)])
        await upload.put_part(3, 2 * PART, [b"tail"])
        with pytest.raises(Fatal, match="not contiguous"):
            await upload.complete()
        await upload.abort()

    async def test_abort_discards_the_upload(
        self, store: S3BlobStore, s3_bucket: MotoBucket
    ) -> None:
        upload = await upload_in_parts(store, "aborted", blob(2 * PART))
        await upload.abort()
        assert incomplete_uploads(s3_bucket) == []
        with pytest.raises(Fatal, match="aborted"):
            await upload.put_part(3, 2 * PART, [b"late"])
        with pytest.raises(NotFound):
            await store.head("aborted")

    async def test_sweep_aborts_stale_uploads_under_the_prefix_only(
        self, s3_bucket: MotoBucket
    ) -> None:
        foreign = s3_bucket.boto3().create_multipart_upload(Bucket=s3_bucket.name, Key="other/x")
        store = await S3BlobStore.open(s3_bucket.options(prefix="tier/", **FAST_RETRIES))
        try:
            for name in ("one", "two"):
                await store.start_upload(name, {})
            pending = sorted([u.key async for u in store.list_incomplete_uploads()])
            # the fixture's moto reports real start times: uploads a moment old are kept
            young = await store.sweep_incomplete_uploads(older_than_s=3600)
            # a cutoff a minute ahead of now makes every upload under the prefix stale
            swept = await store.sweep_incomplete_uploads(older_than_s=-60)
            left = [u async for u in store.list_incomplete_uploads()]
        finally:
            await store.close()
        assert pending == ["one", "two"]
        assert young == 0
        assert swept == 2
        assert left == []
        assert incomplete_uploads(s3_bucket) == ["other/x"]
        s3_bucket.boto3().abort_multipart_upload(
            Bucket=s3_bucket.name, Key="other/x", UploadId=foreign["UploadId"]
        )


class TestFatalErrors:
    """Permanent failures are Fatal at once, name what to check, and never show secrets."""

    async def test_a_missing_bucket_is_fatal(self, s3_bucket: MotoBucket) -> None:
        options = s3_bucket.options(bucket="offloadd-no-such-bucket", max_attempts=5)
        store = await S3BlobStore.open(options)
        try:
            with pytest.raises(Fatal, match=r"NoSuchBucket.*check bucket, region and endpoint"):
                await store.start_upload("k", {})
            with pytest.raises(Fatal, match="NoSuchBucket"):
                await store.put("k", [b"x"], {})
        finally:
            await store.close()

    async def test_secrets_appear_in_no_repr_log_or_error(
        self, s3_bucket: MotoBucket, caplog: pytest.LogCaptureFixture
    ) -> None:
        secret, token = "SeCrEt-9f8e7d6c5b4a", "ToKeN-0a1b2c3d4e5f"
        options = S3Options(
            bucket="offloadd-no-such-bucket",
            endpoint=s3_bucket.endpoint,
            access_key_id="AKIDTESTING",
            secret_access_key=secret,
            session_token=token,
            **FAST_RETRIES,
        )
        caplog.set_level(logging.DEBUG)
        store = await S3BlobStore.open(options)
        try:
            with pytest.raises(Fatal) as failure:
                await store.put("k", [b"x"], {})
            logging.getLogger("offloadd.test").info("store options: %s", options)
        finally:
            await store.close()
        shown = [
            repr(options),
            str(options),
            caplog.text,
            str(failure.value),
            repr(failure.value),
            "".join(traceback.format_exception(failure.value)),
        ]
        for text in shown:
            assert secret not in text
            assert token not in text
            assert "AKIDTESTING" not in text
        assert "secret_access_key='***'" in repr(options)


class TestFaults:
    """Through a proxy injecting errors, resets, stalls and cut bodies, results stay exact."""

    async def test_uploads_and_ranged_reads_survive_mixed_faults(
        self, s3_bucket: MotoBucket, proxy: FaultProxy
    ) -> None:
        proxy.plan = FaultPlan(
            error_500=0.03, slowdown_503=0.03, reset=0.03, stall=0.01, truncate=0.02, stall_s=1.5
        )
        options = s3_bucket.options(
            endpoint=proxy.url,
            read_timeout_s=0.5,
            connect_timeout_s=1.0,
            max_attempts=12,
            health=HealthPolicy(high=0.9, low=0.1),
            **FAST_RETRIES,
        )
        store = await S3BlobStore.open(options)
        objects = {f"seg-{i}": blob(2 * PART + 100 * i, seed=i) for i in range(4)}
        try:

            async def write(key: str, data: bytes) -> None:
                upload = await upload_in_parts(store, key, data)
                await upload.complete()
                await store.put(f"{key}-index", [data[:64]], PULSAR_METADATA)

            await asyncio.gather(*(write(k, d) for k, d in objects.items()))
            rng = random.Random(1)
            for key, data in objects.items():
                for _ in range(4):
                    start = rng.randrange(len(data))
                    end = min(len(data), start + rng.randrange(1, 3 * PART))
                    assert await store.get_range(key, start, end) == data[start:end]
                assert await store.get_range(f"{key}-index", 0, 64) == data[:64]
                assert (await store.head(key)).metadata == PULSAR_METADATA
        finally:
            await store.close()
        assert set(proxy.injected) >= {"500", "503", "reset", "stall", "truncate"}
        assert incomplete_uploads(s3_bucket) == []

    async def test_aborting_a_failed_attempt_cleans_up_under_faults(
        self, s3_bucket: MotoBucket, proxy: FaultProxy
    ) -> None:
        proxy.plan = FaultPlan(error_500=0.1, slowdown_503=0.1, reset=0.2)
        store = await S3BlobStore.open(
            s3_bucket.options(
                endpoint=proxy.url,
                max_attempts=15,
                health=HealthPolicy(high=0.95, low=0.1),
                **FAST_RETRIES,
            )
        )
        try:
            for i in range(3):
                upload = await upload_in_parts(store, f"failed-{i}", blob(2 * PART))
                await upload.abort()
        finally:
            await store.close()
        assert sum(proxy.injected.values()) > 0
        assert incomplete_uploads(s3_bucket) == []

    async def test_a_lost_create_reply_leaves_no_stray_upload(
        self, s3_bucket: MotoBucket, proxy: FaultProxy
    ) -> None:
        proxy.plan = FaultPlan(
            reset=1.0, after_forward=1.0, target=f"POST /{s3_bucket.name}/k?uploads", limit=1
        )
        store = await S3BlobStore.open(s3_bucket.options(endpoint=proxy.url, **FAST_RETRIES))
        try:
            upload = await store.start_upload("k", {})
            remaining = [u async for u in store.list_incomplete_uploads()]
            await upload.abort()
        finally:
            await store.close()
        assert proxy.injected["reset"] == 1
        assert [(u.key, u.upload_id) for u in remaining] == [("k", upload.upload_id)]

    async def test_a_lost_complete_reply_is_recognised_not_repeated_blindly(
        self, s3_bucket: MotoBucket, proxy: FaultProxy
    ) -> None:
        # The first complete is applied but its reply lost; later ones would fail (as S3's
        # NoSuchUpload may): only checking what the first one did can succeed in 3 attempts.
        options = s3_bucket.options(endpoint=proxy.url, max_attempts=3, **FAST_RETRIES)
        store = await S3BlobStore.open(options)
        data = blob(2 * PART + 5)
        try:
            upload = await upload_in_parts(store, "k", data)
            proxy.plan = FaultPlan(
                after_forward=1.0,
                target=f"POST /{s3_bucket.name}/k?uploadId",
                script=("reset", "500", "500"),
            )
            info = await upload.complete()
            assert await store.get_range("k", 0, len(data)) == data
        finally:
            await store.close()
        assert proxy.injected["reset"] == 1
        assert info.size == len(data)
        assert incomplete_uploads(s3_bucket) == []

    @pytest.mark.parametrize(
        "outage_s",
        [1.0, pytest.param(30.0, marks=[pytest.mark.slow, pytest.mark.timeout(120)])],
    )
    async def test_an_outage_pauses_writes_then_they_resume_by_themselves(
        self, s3_bucket: MotoBucket, proxy: FaultProxy, outage_s: float
    ) -> None:
        changes: list[tuple[float, HealthState]] = []
        policy = HealthPolicy(
            window_s=60, high=0.5, low=0.2, min_samples=3, probe_interval_s=0.2, pause_timeout_s=90
        )
        paused = asyncio.Event()

        def on_change(old: HealthState, new: HealthState) -> None:
            changes.append((time.monotonic(), new))
            if new is HealthState.PAUSED:
                paused.set()

        health = StoreHealth(policy, on_change=on_change)
        # Two attempts only: the write below can succeed only by waiting out the outage.
        options = s3_bucket.options(
            endpoint=proxy.url, max_attempts=2, connect_timeout_s=1.0, **FAST_RETRIES
        )
        store = await S3BlobStore.open(options, health=health)
        data = blob(PART + 10)
        try:
            upload = await store.start_upload("outage", PULSAR_METADATA)

            async def heal() -> None:
                await asyncio.wait_for(paused.wait(), 20)
                await asyncio.sleep(outage_s)
                proxy.set_outage(False)

            proxy.set_outage(True)
            healer = asyncio.create_task(heal())
            await upload.put_part(1, 0, [data[:PART]])
            await healer
            await upload.put_part(2, PART, [data[PART:]])
            await upload.complete()
            for i in range(policy.min_samples):  # enough traffic to judge the store healthy
                await store.put(f"after-{i}", [b"x"], {})
            assert await store.get_range("outage", 0, len(data)) == data
        finally:
            await store.close()

        assert [state for _, state in changes] == [
            HealthState.PAUSED,
            HealthState.RECOVERING,
            HealthState.HEALTHY,
        ]
        paused_at, recovered_at = changes[0][0], changes[1][0]
        during = [
            (method, path) for t, method, path, _ in proxy.log if paused_at < t < recovered_at
        ]
        assert during, "the prober should have probed during the outage"
        assert set(during) == {("HEAD", f"/{s3_bucket.name}")}, "only probes while paused"
        assert proxy.injected["outage"] >= len(during)


class TestReadEndpoints:
    """Reads prefer the local zone's endpoint and fail over when it fails."""

    async def test_reads_use_the_local_zone_and_fail_over_when_it_is_down(
        self, s3_bucket: MotoBucket, proxy: FaultProxy
    ) -> None:
        options = s3_bucket.options(
            read_endpoints=(
                ReadEndpoint(s3_bucket.endpoint, zone="zone-b"),
                ReadEndpoint(proxy.url, zone="zone-a"),
            ),
            local_zone="zone-a",
            max_attempts=3,
            **FAST_RETRIES,
        )
        store = await S3BlobStore.open(options)
        try:
            await store.put("replicated", [b"0123456789"], {})
            assert proxy.log == []  # writes go to the primary endpoint only
            assert await store.get_range("replicated", 2, 6) == b"2345"
            assert [m for _, m, _, _ in proxy.log] == ["GET"]

            proxy.set_outage(True)
            assert await store.get_range("replicated", 0, 4) == b"0123"
            assert (await store.head("replicated")).size == 10
        finally:
            await store.close()
        # Both reads tried the local zone first (aiohttp may retry a dropped keep-alive once).
        assert {method for _, method, _, fault in proxy.log if fault == "outage"} == {"GET", "HEAD"}
        assert store.health.state is HealthState.HEALTHY

    async def test_a_dead_endpoint_is_skipped(self, s3_bucket: MotoBucket) -> None:
        with FaultProxy(s3_bucket.endpoint) as dead:
            dead_url = dead.url  # a port that refuses connections once the proxy is gone
        options = s3_bucket.options(
            read_endpoints=(ReadEndpoint(dead_url, zone="here"),),
            local_zone="here",
            connect_timeout_s=1.0,
            max_attempts=3,
            **FAST_RETRIES,
        )
        store = await S3BlobStore.open(options)
        try:
            await store.put("k", [b"abc"], {})
            assert await store.get_range("k", 0, 3) == b"abc"
        finally:
            await store.close()

    async def test_a_replica_that_lacks_the_object_defers_to_the_primary(
        self, s3_bucket: MotoBucket
    ) -> None:
        with running_moto() as replica_url:
            # The replica has the bucket but has not received the object (yet).
            MotoBucket(replica_url, s3_bucket.name).boto3().create_bucket(Bucket=s3_bucket.name)
            options = s3_bucket.options(
                read_endpoints=(ReadEndpoint(replica_url, "z"),), local_zone="z"
            )
            store = await S3BlobStore.open(options)
            try:
                await store.put("fresh", [b"new"], {})
                assert await store.get_range("fresh", 0, 3) == b"new"
                assert (await store.head("fresh")).size == 3
                with pytest.raises(NotFound):
                    await store.head("never-written")
            finally:
                await store.close()


def test_errors_raised_are_only_offloadd_errors() -> None:
    """The translation table maps botocore/aiohttp failures into the error tree."""
    import aiohttp
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    def client_error(code: str, status: int) -> ClientError:
        return ClientError(
            {
                "Error": {"Code": code, "Message": "m"},
                "ResponseMetadata": {"HTTPStatusCode": status},
            },
            "Op",
        )

    cases: list[tuple[BaseException, type[OffloaddError]]] = [
        (client_error("SlowDown", 503), Retriable),
        (client_error("InternalError", 500), Retriable),
        (client_error("RequestTimeout", 400), Retriable),
        (client_error("Throttling", 400), Retriable),
        (client_error("NoSuchKey", 404), NotFound),
        (client_error("404", 404), NotFound),
        (client_error("NoSuchBucket", 404), Fatal),
        (client_error("AccessDenied", 403), Fatal),
        (client_error("EntityTooSmall", 400), Fatal),
        (EndpointConnectionError(endpoint_url="http://x"), Retriable),
        (aiohttp.ClientPayloadError("cut"), Retriable),
        (ConnectionResetError(), Retriable),
        (TimeoutError(), Retriable),
        (NoCredentialsError(), Fatal),
    ]
    for exc, kind in cases:
        assert type(s3_errors.translate(exc, "Op", "s3://b/k")) is kind, exc
    assert "AccessDenied" in str(s3_errors.translate(cases[7][0], "Op", "s3://b/k"))
    assert "policy" in str(s3_errors.translate(cases[7][0], "Op", "s3://b/k"))


def test_options_validate_and_redact() -> None:
    with pytest.raises(OffloaddError, match="sse"):
        S3Options(bucket="b", sse="rot13")  # type: ignore[arg-type]
    with pytest.raises(OffloaddError, match="both"):
        S3Options(bucket="b", access_key_id="id")
    opts = S3Options(bucket="b", access_key_id="id-value", secret_access_key="s-value")
    assert "s-value" not in repr(opts)
    assert "id-value" not in f"{opts}"


def test_reads_prefer_the_local_zone_then_the_least_busy_endpoint() -> None:
    endpoint = Endpoint
    primary = endpoint("http://primary", None, None, True)
    far = endpoint("http://far", "zone-b", None, False)
    near_busy = endpoint("http://near-1", "zone-a", None, False, pending=3)
    near_idle = endpoint("http://near-2", "zone-a", None, False, pending=1)
    requests = s3_calls.Requests(
        S3Options(bucket="b", local_zone="zone-a"),
        primary,
        (far, near_busy, near_idle),
        StoreHealth(),
    )
    assert requests.pick(read=True, skip=set()) is near_idle
    assert requests.pick(read=True, skip={id(near_idle)}) is near_busy
    assert requests.pick(read=True, skip={id(near_idle), id(near_busy)}) is far
    assert requests.pick(read=True, skip={id(near_idle), id(near_busy), id(far)}) is primary
    assert requests.pick(read=False, skip=set()) is primary

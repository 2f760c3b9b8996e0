"""Every store operation ends by its deadline, whatever the store does (issue 13 defect 7).

A store that hangs instead of failing is the hard case: botocore sends ``Expect: 100-continue``
on ``PutObject`` and ``UploadPart`` and waits for the interim answer before the body, and no
socket timeout runs during that wait, so an endpoint that never answers it held a topic for
ever. Here ``moto_server`` sits behind the fault proxy, which freezes on demand: ``silent``
answers nothing (not even 100-continue), ``body`` answers 100-continue and then stalls. The
filesystem driver gets the same treatment with a disk call that blocks.

Each operation runs under an outer guard of several deadlines, so a hang shows up as a test
failure naming the operation, not as the suite's global timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.blobstore.health import HealthPolicy, HealthState, StoreHealth
from offloadd.blobstore.s3 import S3BlobStore
from offloadd.errors import Retriable
from tests.fixtures.faultproxy import FaultProxy
from tests.fixtures.s3 import MotoBucket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

DEADLINE = 1.5  # request_timeout_s in these tests
GUARD = 6 * DEADLINE  # an operation still running after this has no deadline
BODY = b"p" * 4096


@pytest.fixture
def proxy(moto_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_server, seed=13) as p:
        yield p


@pytest.fixture
async def store(s3_bucket: MotoBucket, proxy: FaultProxy) -> AsyncIterator[S3BlobStore]:
    options = MotoBucket(proxy.url, s3_bucket.name).options(
        request_timeout_s=DEADLINE, read_timeout_s=30.0, connect_timeout_s=30.0,
        retry_base_s=0.01, retry_max_s=0.05,
        # a circuit that never trips by rate here: these tests look at single operations
        health=HealthPolicy(min_samples=1000, max_samples=1000, probe_interval_s=0.5))
    s = await S3BlobStore.open(options)
    yield s
    await s.close()


async def guarded(op: Awaitable[object]) -> float:
    """Run ``op``; return how long it took. A hang fails the test with a clear message."""
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(op, GUARD)
    except TimeoutError:
        pytest.fail(f"the operation was still waiting after {GUARD:.0f}s: it has no deadline")
    return time.monotonic() - t0


Op = Callable[[S3BlobStore], Awaitable[object]]


async def _put(s: S3BlobStore) -> object:
    return await s.put("frozen/put", [BODY], {"role": "index"})


async def _create(s: S3BlobStore) -> object:
    return await s.start_upload("frozen/create", {})


async def _get(s: S3BlobStore) -> object:
    return await s.get_range("warm", 0, 10)


async def _head(s: S3BlobStore) -> object:
    return await s.head("warm")


async def _delete(s: S3BlobStore) -> object:
    await s.delete("warm")
    return None


async def _list(s: S3BlobStore) -> object:
    return [o async for o in s.list()]


OPS: list[tuple[str, str, Op]] = [
    ("PutObject", "frozen/put", _put),
    ("CreateMultipartUpload", "frozen/create", _create),
    ("GetObject", "warm", _get),
    ("HeadObject", "warm", _head),
    ("DeleteObject", "warm", _delete),
    ("ListObjectsV2", "", _list),
]


class TestTheFreezingProxy:
    """The fixture itself: what a client on a raw socket sees of each freeze mode."""

    @staticmethod
    def _put_with_expect(proxy: FaultProxy) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        sock.sendall(b"PUT /bucket/key HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        return sock

    @staticmethod
    def _silent_for(sock: socket.socket, seconds: float) -> bool:
        """Nothing at all (no byte, no close) arrives for ``seconds``."""
        sock.settimeout(seconds)
        try:
            sock.recv(100)
        except TimeoutError:
            return True
        return False

    def test_silent_never_answers_100_continue(self, proxy: FaultProxy) -> None:
        proxy.freeze("silent")
        with self._put_with_expect(proxy) as sock:
            assert self._silent_for(sock, 1.0)
            assert proxy.held == 1 and proxy.injected["freeze"] == 1

    def test_body_answers_100_continue_then_nothing(self, proxy: FaultProxy) -> None:
        proxy.freeze("body")
        with self._put_with_expect(proxy) as sock:
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
            sock.sendall(b"data")
            assert self._silent_for(sock, 1.0)

    def test_a_timed_freeze_ends_by_itself_and_serves_what_it_held(
            self, proxy: FaultProxy, s3_bucket: MotoBucket) -> None:
        proxy.freeze("silent", seconds=1.0)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.sendall(f"HEAD /{s3_bucket.name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            t0 = time.monotonic()
            answer = sock.recv(100)
            assert answer.startswith(b"HTTP/1.1 ") and time.monotonic() - t0 >= 0.5
        assert not proxy.frozen

    def test_thaw_with_reset_drops_held_connections(self, proxy: FaultProxy) -> None:
        proxy.freeze("silent")
        with self._put_with_expect(proxy) as sock:
            t0 = time.monotonic()
            while proxy.held == 0:
                assert time.monotonic() - t0 < 5
                time.sleep(0.01)
            proxy.thaw(release="reset")
            sock.settimeout(5)
            with pytest.raises(ConnectionResetError):
                sock.recv(100)


class TestS3:
    """Each S3 operation fails as retriable at its deadline, naming itself and its key."""

    @pytest.mark.parametrize("mode", ["silent", "body"])
    @pytest.mark.parametrize(("name", "key", "op"), [pytest.param(*o, id=o[0]) for o in OPS])
    async def test_a_frozen_store_fails_each_operation_at_its_deadline(
            self, store: S3BlobStore, proxy: FaultProxy, mode: str, name: str, key: str,
            op: Op, caplog: pytest.LogCaptureFixture) -> None:
        await store.put("warm", [b"0123456789"], {})
        proxy.freeze(mode)
        with caplog.at_level(logging.WARNING, "offloadd.blobstore.s3"), \
                pytest.raises(Retriable) as caught:
            await guarded(op(store))
        message = str(caught.value)
        assert name in message and "deadline" in message and "request_timeout_s" in message
        assert f"s3://{store.options.bucket}/{key}" in message
        assert any(name in r.getMessage() and "deadline" in r.getMessage()
                   for r in caplog.records if r.levelno == logging.WARNING)
        assert proxy.injected["freeze"] >= 1

    @pytest.mark.parametrize("mode", ["silent", "body"])
    async def test_parts_and_completion_of_a_multipart_upload_have_deadlines(
            self, store: S3BlobStore, proxy: FaultProxy, mode: str) -> None:
        upload = await store.start_upload("frozen/multipart", {})
        await upload.put_part(1, 0, [BODY])
        proxy.freeze(mode)
        with pytest.raises(Retriable, match=r"UploadPart .*frozen/multipart.*deadline"):
            await guarded(upload.put_part(2, len(BODY), [BODY]))
        with pytest.raises(Retriable, match=r"CompleteMultipartUpload .*deadline"):
            await guarded(upload.complete())
        await guarded(upload.abort())  # best effort, never raises, and ends in time
        proxy.thaw(release="reset")

    async def test_a_part_waiting_for_100_continue_gets_the_time_its_bytes_need(
            self, s3_bucket: MotoBucket, proxy: FaultProxy) -> None:
        """The deadline grows with the bytes moved (min_transfer_rate_bytes_per_s)."""
        options = MotoBucket(proxy.url, s3_bucket.name).options(
            request_timeout_s=0.5, min_transfer_rate_bytes_per_s=len(BODY) / 1.0)
        s = await S3BlobStore.open(options)
        try:
            upload = await s.start_upload("frozen/sized", {})
            proxy.freeze("silent")
            with pytest.raises(Retriable, match=r"deadline 1\.5s"):
                await guarded(upload.put_part(1, 0, [BODY]))
        finally:
            proxy.thaw(release="reset")
            await s.close()

    async def test_a_freeze_trips_the_circuit_within_two_deadlines_and_it_recovers(
            self, s3_bucket: MotoBucket, proxy: FaultProxy) -> None:
        """One writer, one request at a time: far fewer failures than the rate rule needs.
        The stall watchdog trips the circuit anyway; a thaw closes it by itself."""
        health = StoreHealth(HealthPolicy(probe_interval_s=0.5, stall_after_s=DEADLINE))
        s = await S3BlobStore.open(MotoBucket(proxy.url, s3_bucket.name).options(
            request_timeout_s=DEADLINE, retry_base_s=0.01), health=health)
        stop = asyncio.Event()
        outcomes: list[str] = []

        async def writer() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    await s.put(f"w/{n}", [BODY], {})
                    outcomes.append("ok")
                except Retriable as exc:
                    outcomes.append(str(exc))
                    await asyncio.sleep(0.2)

        task = asyncio.create_task(writer())
        try:
            await asyncio.sleep(0.5)
            assert "ok" in outcomes
            frozen_at = time.monotonic()
            proxy.freeze("silent")
            while health.state is not HealthState.PAUSED:
                assert time.monotonic() - frozen_at < GUARD, "the circuit never opened"
                await asyncio.sleep(0.05)
            tripped_after = time.monotonic() - frozen_at
            failures = sum(1 for o in outcomes if o != "ok")
            assert failures < health.policy.min_samples  # not the rate rule's doing
            # the documented bound, plus scheduling slack for a loaded machine
            print(f"circuit open {tripped_after:.2f}s after the freeze")
            assert tripped_after <= 2 * DEADLINE + 1.0, tripped_after
            assert not health.readiness()[0]
            proxy.thaw(release="reset")
            thawed_at = time.monotonic()
            while health.state is HealthState.PAUSED:
                assert time.monotonic() - thawed_at < GUARD, "the circuit never closed again"
                await asyncio.sleep(0.05)
            n_ok = outcomes.count("ok")
            while outcomes.count("ok") == n_ok:
                assert time.monotonic() - thawed_at < GUARD, "writes never resumed"
                await asyncio.sleep(0.05)
            assert health.readiness()[0]
        finally:
            stop.set()
            proxy.thaw(release="reset")
            await asyncio.wait_for(task, GUARD)
            await s.close()

    async def test_a_missing_bucket_makes_the_store_not_ready_until_it_works(
            self, s3_bucket: MotoBucket) -> None:
        bucket = MotoBucket(s3_bucket.endpoint, s3_bucket.name + "-late")
        s = await S3BlobStore.open(bucket.options(request_timeout_s=DEADLINE))
        try:
            with pytest.raises(Exception, match="NoSuchBucket"):
                await s.put("k", [BODY], {})
            ok, why = s.health.readiness()
            assert not ok and "PutObject" in why and "NoSuchBucket" in why
            assert s.health.state is HealthState.HEALTHY  # the store answered: up
            bucket.boto3().create_bucket(Bucket=bucket.name)
            await s.put("k", [BODY], {})
            assert s.health.readiness()[0]
        finally:
            await s.close()


class TestFilesystem:
    """A disk call that blocks (a hung mount) fails at the deadline and trips the circuit."""

    async def test_a_hung_write_fails_at_the_deadline_and_never_lands_elsewhere(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        health = StoreHealth(HealthPolicy(probe_interval_s=0.2, stall_after_s=DEADLINE))
        store = FilesystemBlobStore(tmp_path / "tier", request_timeout_s=DEADLINE,
                                    health=health)
        release = threading.Event()
        real_pwritev, real_stat = os.pwritev, os.stat
        hung: list[int] = []

        def hanging_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
            hung.append(fd)
            release.wait(60)
            return real_pwritev(fd, buffers, offset)

        def hanging_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
            if path == store.root and not release.is_set():
                release.wait(60)  # the watchdog's probe hangs too
            return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

        try:
            upload = await store.start_upload("obj", {})
            monkeypatch.setattr(os, "pwritev", hanging_pwritev)
            monkeypatch.setattr(os, "stat", hanging_stat)
            with pytest.raises(Retriable, match=r"writing part 1 of obj.*request_timeout_s"):
                await guarded(upload.put_part(1, 0, [b"late bytes"]))
            t0 = time.monotonic()
            while health.state is not HealthState.PAUSED:
                assert time.monotonic() - t0 < GUARD, "the circuit never opened"
                await asyncio.sleep(0.05)
            await guarded(upload.abort())  # the thread still holds the descriptor
            # a file opened now must not get that descriptor number while the write waits
            other = tmp_path / "other"
            fd = os.open(other, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                assert fd != hung[0]
            finally:
                os.close(fd)
            release.set()
            monkeypatch.setattr(os, "pwritev", real_pwritev)
            monkeypatch.setattr(os, "stat", real_stat)
            t0 = time.monotonic()
            while upload.temp_path.exists():  # the late thread cleans up after itself
                assert time.monotonic() - t0 < GUARD
                await asyncio.sleep(0.05)
            assert other.read_bytes() == b""
            while health.state is HealthState.PAUSED:
                assert time.monotonic() - t0 < GUARD, "the circuit never closed"
                await asyncio.sleep(0.05)
            await store.put("after", [b"ok"], {})
            assert await store.get_range("after", 0, 2) == b"ok"
        finally:
            release.set()
            await store.close()

    async def test_the_deadline_counts_from_when_a_thread_takes_the_call_up(
            self, tmp_path: Path) -> None:
        # one thread, three calls of 0.6 budgets each: the third starts 1.2 budgets after it
        # was queued, past a deadline counted from the submit, well within one from its start
        budget = 2.0
        store = FilesystemBlobStore(tmp_path / "tier", request_timeout_s=budget, workers=1)

        def slow(i: int) -> int:
            time.sleep(0.6 * budget)
            return i

        try:
            calls = [store.call("head", f"call {i}", slow, i) for i in range(3)]
            assert await asyncio.wait_for(asyncio.gather(*calls), GUARD) == [0, 1, 2]
        finally:
            await store.close()

    async def test_a_call_queued_behind_a_hung_disk_fails_too(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from offloadd.blobstore.filesystem import store as store_module
        monkeypatch.setattr(store_module, "QUEUED_BUDGETS", 2)
        store = FilesystemBlobStore(tmp_path / "tier", request_timeout_s=0.5, workers=1)
        release = threading.Event()
        try:
            running = store.call("head", "the hung call", release.wait, 60)
            queued = store.call("head", "the queued call", os.getpid)
            results = await asyncio.wait_for(
                asyncio.gather(running, queued, return_exceptions=True), GUARD)
            assert [type(r) for r in results] == [store_module._Unanswered] * 2
            assert "the queued call" in str(results[1])
        finally:
            release.set()
            await store.close()

"""Open the configured edges: metadata store, blob store, ledger source.

The only place that maps configuration onto concrete implementations; everything else talks to
the protocols. Heavy client libraries (kazoo, aiobotocore) are imported only when configured.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from offloadd.blobstore.base import BlobStore, StoreView
from offloadd.blobstore.requests import OnRequest, RequestCounts
from offloadd.config import OffloadPolicy, Settings
from offloadd.errors import ConfigError, NotFound
from offloadd.ledger.base import LedgerSource, SourceView
from offloadd.ledger.local import LocalLedgerSource, LocalLedgerStore, RolloverPolicy
from offloadd.metadata.base import MetadataStore, Sessions
from offloadd.offload.policy import PolicyKeys, SchedulerSettings
from offloadd.retention.gc import GcSettings
from offloadd.retention.policy import RetentionLimits

if TYPE_CHECKING:
    from offloadd.blobstore.filesystem import FilesystemBlobStore
    from offloadd.blobstore.s3 import S3BlobStore
    from offloadd.metadata.schemas import SchemaReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetadataConnection:
    """The configured metadata store, and its sessions when it has them (ZooKeeper)."""

    store: MetadataStore
    sessions: Sessions | None = None


async def open_metadata(settings: Settings, *, read_only: bool = False,
                        must_exist: bool = False) -> MetadataStore:
    """The configured metadata store (see :func:`connect_metadata`)."""
    return (await connect_metadata(settings, read_only=read_only, must_exist=must_exist)).store


async def connect_metadata(settings: Settings, *, read_only: bool = False,
                           must_exist: bool = False) -> MetadataConnection:
    """The configured metadata store, with its sessions.

    ``read_only`` (``status``, ``verify``, ``read``): every write is refused and nothing is
    created; implies ``must_exist``. ``must_exist`` (``gc``): a store that does not exist yet
    (no embedded database, no ZooKeeper chroot) is ``NotFound`` instead of being created empty.
    """
    conn = await _open_metadata(settings, read_only=read_only,
                                must_exist=must_exist or read_only)
    if read_only:
        from offloadd.metadata.readonly import ReadOnlyMetadataStore

        return MetadataConnection(ReadOnlyMetadataStore(conn.store), conn.sessions)
    return conn


def deployment(settings: Settings) -> str:
    """Which metadata store this configuration uses, as ``status`` shows it: an embedded
    store's absolute directory or the ZooKeeper URL, never a credential. ``offloadd status``
    merges a daemon's live view only when the daemon answering on ``[metrics] bind`` says the
    same (another deployment's daemon may listen there)."""
    url = settings.metadata.url
    if url.startswith("embedded:"):
        return "embedded:" + str(Path(url[len("embedded:"):] or "./data/metadata").absolute())
    head, sep, tail = url.partition("@")  # zk://user:secret@host is refused, but never echo one
    return f"{head.split('//')[0]}//***@{tail}" if sep else url


async def _open_metadata(settings: Settings, *, read_only: bool,
                         must_exist: bool) -> MetadataConnection:
    url = settings.metadata.url
    if url.startswith("embedded:"):
        from offloadd.metadata.embedded import EmbeddedMetadataStore

        path = url[len("embedded:"):] or "./data/metadata"
        store = EmbeddedMetadataStore(path, read_only=read_only)
        if must_exist and not store.db_path.is_file():
            raise NotFound(f"no embedded metadata store at {store.db_path}: nothing has been "
                           "offloaded with this configuration (check --config and the "
                           "[metadata] url, and the working directory for relative paths)")
        return MetadataConnection(await EmbeddedMetadataStore.open(path, read_only=read_only))
    if url.startswith("zk://"):
        from offloadd.metadata.zookeeper import DigestAcl, ZooKeeperMetadataStore

        acl = None
        if settings.metadata.acl_digest is not None:
            user, sep, pw = settings.metadata.acl_digest.get_secret_value().partition(":")
            if not sep or not user or not pw:
                raise ConfigError('[metadata] acl_digest must be "user:password"')
            acl = DigestAcl(user, pw)
        zk = await ZooKeeperMetadataStore.open(
            url, session_timeout_s=settings.metadata.session_timeout_s,
            connect_timeout_s=settings.metadata.connect_timeout_s, acl=acl,
            create_chroot=not must_exist)
        return MetadataConnection(zk, sessions=zk)
    raise ConfigError(f"[metadata] url {url!r}: unsupported scheme")


async def open_blobstore(settings: Settings,
                         on_circuit: Callable[[str], None] | None = None) -> BlobStore:
    """The configured blob store (see :func:`open_tier`)."""
    return (await open_tier(settings, on_circuit)).store


async def open_tier(settings: Settings,
                    on_circuit: Callable[[str], None] | None = None,
                    on_request: OnRequest | None = None, *,
                    probe_writes: bool = False) -> StoreView:
    """The configured tier; ``on_circuit`` hears the store-health circuit's state names,
    ``on_request`` every request the driver sends ``(driver, op, result)``.
    ``probe_writes`` (a process that writes objects): find out once whether the store refuses
    overwrites and make its writes create-only if so (``[blobstore] conditional_writes``)."""
    view = await _open_tier(settings, on_circuit, on_request)
    mode = settings.blobstore.conditional_writes
    if probe_writes and mode != "off" and view.fence is not None:
        try:
            # a store that does not answer must not hold the start-up: the daemon asks again
            # later (Daemon._fence_probe_loop); writes overwrite until it has answered
            async with asyncio.timeout(2 * settings.blobstore.request_timeout_s):
                found = await view.fence.probe_conditional_writes()
        except TimeoutError:
            found = view.fence.conditional
        except BaseException:
            await view.store.close()
            raise
        log.info("blob store: conditional writes %s", found.how if found.answered else
                 f"unknown, asked again every 30 s: {found.how}")
        if mode == "on" and not (found.put and found.complete):
            await view.store.close()
            raise ConfigError(f'[blobstore] conditional_writes = "on", but the store does not '
                              f"refuse overwrites on every write: {found.how}; use \"auto\" "
                              "to write create-only where it can (docs/s3.md)")
    return view


async def _open_tier(settings: Settings,
                     on_circuit: Callable[[str], None] | None = None,
                     on_request: OnRequest | None = None) -> StoreView:
    bs = settings.blobstore
    requests = RequestCounts(bs.driver, on_request)
    from offloadd.blobstore.health import HealthPolicy, StoreHealth

    # the stall watchdog's patience is the request deadline (docs/s3.md, "Stalls")
    policy = HealthPolicy(window_s=bs.health_window_s, high=bs.health_high, low=bs.health_low,
                          pause_timeout_s=bs.health_pause_timeout_s,
                          stall_after_s=bs.request_timeout_s)
    health = StoreHealth(policy, on_change=(
        (lambda old, new: on_circuit(new.value)) if on_circuit is not None else None))
    if on_circuit is not None:
        on_circuit(health.state.value)
    if bs.driver == "filesystem":
        from offloadd.blobstore.filesystem import FilesystemBlobStore

        fs = FilesystemBlobStore(
            bs.path, request_timeout_s=bs.request_timeout_s,
            min_transfer_rate_bytes_per_s=bs.min_transfer_rate_bytes_per_s, health=health,
            requests=requests)
        return filesystem_view(fs)

    from offloadd.blobstore.s3 import ReadEndpoint, S3BlobStore, S3Options

    def secret(v: SecretStr | None) -> str | None:
        return v.get_secret_value() if v is not None else None

    opts = S3Options(
        bucket=bs.bucket, region=bs.region, endpoint=bs.endpoint, prefix=bs.prefix,
        access_key_id=bs.access_key_id, secret_access_key=secret(bs.secret_access_key),
        session_token=secret(bs.session_token), sse=bs.sse, sse_kms_key_id=bs.sse_kms_key_id,
        verify_tls=bs.verify_tls, ca_bundle=bs.ca_bundle,
        max_pool_connections=bs.max_pool_connections, connect_timeout_s=bs.connect_timeout_s,
        read_timeout_s=bs.read_timeout_s, request_timeout_s=bs.request_timeout_s,
        min_transfer_rate_bytes_per_s=bs.min_transfer_rate_bytes_per_s,
        max_attempts=bs.max_attempts,
        read_endpoints=tuple(ReadEndpoint(e.url, e.zone) for e in bs.read_endpoints),
        local_zone=bs.local_zone, health=policy)
    return s3_view(await S3BlobStore.open(opts, health=health, requests=requests))


def s3_view(s3: S3BlobStore) -> StoreView:
    """The S3 driver with its capabilities: its health circuit, its multipart-upload sweep."""
    return StoreView(s3, health=s3.health, sweeper=s3, requests=s3.requests, fence=s3)


def filesystem_view(fs: FilesystemBlobStore) -> StoreView:
    """The filesystem driver with its capabilities: its health circuit, its upload sweep."""
    return StoreView(fs, health=fs.health, sweeper=fs, requests=fs.requests, fence=fs)


def rollover_policy(settings: Settings) -> RolloverPolicy:
    src = settings.source
    return RolloverPolicy(max_entries=src.rollover_entries, max_bytes=src.rollover_bytes,
                          max_age_s=src.rollover_minutes * 60)


def open_local_store(settings: Settings, metadata: MetadataStore) -> LocalLedgerStore:
    src = settings.source
    return LocalLedgerStore(src.path, metadata, rollover_policy(settings),
                            max_entry_bytes=src.max_entry_bytes, verify_crc=src.verify_crc)


def local_view(src: LocalLedgerSource) -> SourceView:
    """The embedded store's source: every capability but metrics of its own."""
    return SourceView(src, deleter=src, copies=src, checksums=src, stored=src, offsets=src,
                      changes=src)


def open_source(settings: Settings, metadata: MetadataStore, *,
                read_only: bool = False) -> LedgerSource:
    """The configured ledger source (see :func:`connect_source`)."""
    return connect_source(settings, metadata, read_only=read_only).source


def connect_source(settings: Settings, metadata: MetadataStore, *,
                   read_only: bool = False) -> SourceView:
    """The configured ledger source; ``read_only`` for every command but the daemon: such a
    source never writes the metadata store (the BookKeeper source's mirror is the daemon's)."""
    src = settings.source
    if src.kind == "local":
        return local_view(LocalLedgerSource(src.path, metadata, verify_crc=src.verify_crc))
    if src.kind == "bookkeeper":
        from offloadd.ledger.bookkeeper import BookKeeperLedgerSource

        bk = BookKeeperLedgerSource.from_settings(settings, metadata, read_only=read_only)
        # its watches and long polls wake idle topics (ChangeFeed): no per-topic polling
        return SourceView(bk, checksums=bk, metrics=bk.metrics, changes=bk)
    raise ConfigError(f'[source] kind = "{src.kind}" is not supported (use "local" or '
                      '"bookkeeper")')


def schema_reader(settings: Settings, metadata: MetadataStore,
                  source: LedgerSource | None = None) -> SchemaReader:
    """Where the lakehouse reads topics' Pulsar schemas: Pulsar's own registry (the locators in
    its ZooKeeper, the versions in BookKeeper ledgers) through the BookKeeper ``source``, the
    embedded store's registry (``offloadd produce --schema``) otherwise."""
    from offloadd.metadata.schemas import SchemaReader

    if settings.source.kind == "bookkeeper" and source is not None:
        from offloadd.ledger.bookkeeper import BookKeeperLedgerSource
        from offloadd.ledger.bookkeeper.schemas import bookkeeper_schema_reader

        if isinstance(source, BookKeeperLedgerSource):
            return bookkeeper_schema_reader(source)
    return SchemaReader(metadata)


def gc_settings(settings: Settings) -> GcSettings:
    """What a gc pass needs of the configuration."""
    ret = settings.retention
    return GcSettings(
        orphan_grace_s=ret.orphan_grace_s,
        limits=RetentionLimits.from_config(ret.max_age_minutes, ret.max_size_mbytes),
        trim_source=ret.trim_source,
        deletion_lag_ms=lambda topic: settings.policy_for(topic).deletion_lag_ms)
def source_status(settings: Settings, source: LedgerSource) -> dict[str, Any] | None:
    """What the source :func:`open_source` built says about itself in ``status`` (the
    BookKeeper source: how it reads each bookie), or None."""
    if settings.source.kind != "bookkeeper":
        return None
    from offloadd.ledger.bookkeeper import BookKeeperLedgerSource

    return source.status() if isinstance(source, BookKeeperLedgerSource) else None


def policy_keys(settings: Settings, policy: OffloadPolicy) -> PolicyKeys:
    """What the pipeline reads of a topic's resolved offload policy."""
    return PolicyKeys(mode=policy.mode,
                      max_size_per_segment_mbytes=policy.max_size_per_segment_mbytes,
                      max_segment_rollover_time_minutes=policy.max_segment_rollover_time_minutes,
                      max_block_size_bytes=policy.max_block_size_bytes,
                      min_block_size_bytes=settings.min_block_size(policy),
                      threshold_bytes=policy.threshold_bytes,
                      threshold_seconds=policy.threshold_seconds)


def scheduler_settings(settings: Settings) -> SchedulerSettings:
    """What the scheduler reads of ``[daemon]``."""
    d = settings.daemon
    return SchedulerSettings(shutdown_deadline_s=d.shutdown_deadline_s,
                             stop_close_budget_s=d.stop_close_budget_s,
                             status_interval_s=d.status_interval_s)

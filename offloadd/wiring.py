"""Open the configured edges: metadata store, blob store, ledger source.

The only place that maps configuration onto concrete implementations; everything else talks to
the protocols. Heavy client libraries (kazoo, aiobotocore) are imported only when configured.
"""

from __future__ import annotations

from offloadd.blobstore.base import BlobStore
from offloadd.config import Settings
from offloadd.errors import ConfigError
from offloadd.ledger.base import LedgerSource
from offloadd.ledger.local import LocalLedgerSource, LocalLedgerStore, RolloverPolicy
from offloadd.metadata.base import MetadataStore


async def open_metadata(settings: Settings) -> MetadataStore:
    url = settings.metadata.url
    if url.startswith("embedded:"):
        from offloadd.metadata.embedded import EmbeddedMetadataStore

        return await EmbeddedMetadataStore.open(url[len("embedded:"):] or "./data/metadata")
    if url.startswith("zk://"):
        from offloadd.metadata.zookeeper import DigestAcl, ZooKeeperMetadataStore

        acl = None
        if settings.metadata.acl_digest is not None:
            user, sep, pw = settings.metadata.acl_digest.get_secret_value().partition(":")
            if not sep or not user or not pw:
                raise ConfigError('[metadata] acl_digest must be "user:password"')
            acl = DigestAcl(user, pw)
        return await ZooKeeperMetadataStore.open(
            url, session_timeout_s=settings.metadata.session_timeout_s,
            connect_timeout_s=settings.metadata.connect_timeout_s, acl=acl)
    raise ConfigError(f"[metadata] url {url!r}: unsupported scheme")


async def open_blobstore(settings: Settings) -> BlobStore:
    bs = settings.blobstore
    if bs.driver == "filesystem":
        from offloadd.blobstore.filesystem import FilesystemBlobStore

        return FilesystemBlobStore(bs.path)
    from offloadd.blobstore.s3 import S3BlobStore, s3_options_from_settings

    return await S3BlobStore.open(s3_options_from_settings(bs))


def rollover_policy(settings: Settings) -> RolloverPolicy:
    src = settings.source
    return RolloverPolicy(max_entries=src.rollover_entries, max_bytes=src.rollover_bytes,
                          max_age_s=src.rollover_minutes * 60)


def open_local_store(settings: Settings, metadata: MetadataStore) -> LocalLedgerStore:
    src = settings.source
    return LocalLedgerStore(src.path, metadata, rollover_policy(settings),
                            max_entry_bytes=src.max_entry_bytes, verify_crc=src.verify_crc)


def open_source(settings: Settings, metadata: MetadataStore) -> LedgerSource:
    src = settings.source
    if src.kind == "local":
        return LocalLedgerSource(src.path, metadata, verify_crc=src.verify_crc)
    raise ConfigError('[source] kind = "bookkeeper" is not available in this build '
                      '(use "local")')

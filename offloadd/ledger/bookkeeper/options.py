"""The BookKeeper source's own settings, and how they come out of offloadd's configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offloadd.errors import ConfigError
from offloadd.ledger.bookkeeper.client import ClientOptions
from offloadd.ledger.bookkeeper.layout import DEFAULT_LEDGERS_ROOT
from offloadd.ledger.bookkeeper.replicas import ReplicaPolicy
from offloadd.model.sizes import MiB

__all__ = ["BookKeeperOptions", "options_from_settings"]


@dataclass(frozen=True)
class BookKeeperOptions:
    pulsar_zk: str
    ledgers_root: str = DEFAULT_LEDGERS_ROOT
    password: bytes = field(default=b"", repr=False)
    topics: tuple[str, ...] = ()
    client: ClientOptions = field(default_factory=ClientOptions)
    # reads: entries in flight per ledger (a window, in chunks), and read ahead of the offloader
    reads_in_flight: int = 1024
    readahead_bytes: int = 8 * MiB
    # A long poll is answered at once when the ledger moves: its length only matters while the
    # ledger is idle, and each end wakes the topic for nothing (10 s: 500 wake-ups and long
    # polls a second for 5,000 idle topics, each with its open ledger). So it lasts as long as
    # the waiter waits (the topic's idle look, IDLE_LOOK_S, or its roll deadline). A dead
    # bookie's connection fails its polls at once; an ensemble change or a close wakes the
    # waiter through the ledger's watch, whatever the poll is doing.
    long_poll_max_s: float = 300.0
    # Pulsar's ZooKeeper
    session_timeout_s: float = 10.0
    connect_timeout_s: float = 15.0
    zk_auth: tuple[tuple[str, str], ...] = field(default=(), repr=False)


def options_from_settings(settings: Any) -> BookKeeperOptions:
    """From :class:`offloadd.config.Settings` (``[source] kind = "bookkeeper"``);
    ``ConfigError`` names what is missing or wrong."""
    src = settings.source
    if not src.pulsar_zk:
        raise ConfigError('[source] kind = "bookkeeper" needs pulsar_zk, Pulsar\'s '
                          'ZooKeeper, e.g. "zk://zk1:2181,zk2:2181" (add /chroot if Pulsar '
                          "uses one)")
    _check_separate_stores(settings.metadata.url, src.pulsar_zk)
    auth: tuple[tuple[str, str], ...] = ()
    if src.pulsar_zk_digest is not None:
        cred = src.pulsar_zk_digest.get_secret_value()
        if ":" not in cred:
            raise ConfigError('[source] pulsar_zk_digest must be "user:password"')
        auth = (("digest", cred),)
    return BookKeeperOptions(
        pulsar_zk=src.pulsar_zk, ledgers_root=src.ledgers_root,
        password=src.digest_password.get_secret_value().encode(), topics=tuple(src.topics),
        client=ClientOptions(
            read_timeout_s=src.read_timeout_s, connect_timeout_s=src.bookie_connect_timeout_s,
            replicas=ReplicaPolicy(quarantine_s=src.bookie_quarantine_s, local_zone=src.zone,
                                   zones=dict(src.zones)),
            protocol=src.bookie_protocol, batch_reads=src.batch_reads),
        reads_in_flight=src.reads_in_flight, readahead_bytes=src.readahead_bytes,
        session_timeout_s=settings.metadata.session_timeout_s,
        connect_timeout_s=settings.metadata.connect_timeout_s, zk_auth=auth)


def _check_separate_stores(metadata_url: str, pulsar_zk: str) -> None:
    """offloadd's catalog must not live in Pulsar's own tree (it would be Pulsar's metadata)."""
    from offloadd.metadata.zookeeper import ZooKeeperUrl

    if not metadata_url.startswith("zk://"):
        return
    try:
        ours, theirs = ZooKeeperUrl.parse(metadata_url), ZooKeeperUrl.parse(pulsar_zk)
    except ValueError as exc:
        raise ConfigError(f"[source] pulsar_zk: {exc}") from None
    if set(ours.hosts) & set(theirs.hosts) and ours.chroot == theirs.chroot:
        raise ConfigError(
            f"[metadata] url {metadata_url!r} is Pulsar's own ZooKeeper tree ([source] "
            f"pulsar_zk {pulsar_zk!r}): in sidecar mode offloadd keeps its catalog under its "
            f"own chroot, e.g. {str(theirs).rstrip('/')}/offloadd")

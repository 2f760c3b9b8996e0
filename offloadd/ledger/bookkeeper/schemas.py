"""Pulsar's schema registry where Pulsar keeps it, for a sidecar's typed lakehouse columns.

Pulsar's ``BookkeeperSchemaStorage`` (``../shared/PULSAR-METADATA.md`` §3) keeps per topic
schema (``<tenant>/<namespace>/<topic>``) a ``SchemaLocator`` in the znode
``/schemas/<schema id>`` of its local metadata store, and each version in a ledger of its own:
one entry (a ``SchemaEntry``, no message framing), written with an empty password and the
broker's digest type, closed at once. So a version is read here as any closed ledger is: its
metadata from Pulsar's ZooKeeper (read-only, the source's session), its entry from the bookies
through the source's client (digest-checked, with replica failover).

:func:`bookkeeper_schema_reader` is the :class:`~offloadd.metadata.schemas.SchemaReader` the
lakehouse uses, over these two.
"""

from __future__ import annotations

from offloadd.errors import NotFound
from offloadd.ledger.bookkeeper.layout import decode_ledger_metadata, ledger_path
from offloadd.ledger.bookkeeper.ledgers import KnownLedger
from offloadd.ledger.bookkeeper.source import BookKeeperLedgerSource
from offloadd.metadata.base import Versioned
from offloadd.metadata.schemas import SchemaReader

__all__ = ["SCHEMA_LEDGER_PASSWORD", "PulsarNodes", "SchemaLedgerReader",
           "bookkeeper_schema_reader"]

# BookkeeperSchemaStorage creates its ledgers with an empty password, whatever the managed
# ledgers' is (it matters to the digest of HMAC-SHA1 ledgers)
SCHEMA_LEDGER_PASSWORD = b""


class PulsarNodes:
    """Nodes of Pulsar's metadata store, through the source's read-only session."""

    def __init__(self, source: BookKeeperLedgerSource) -> None:
        self.source = source

    async def get(self, path: str) -> Versioned:
        return await (await self.source.pulsar_zk()).get(path)


class SchemaLedgerReader:
    """``(ledger id, entry id) -> entry bytes`` of a schema ledger, from the bookies."""

    def __init__(self, source: BookKeeperLedgerSource) -> None:
        self.source = source

    async def __call__(self, ledger_id: int, entry_id: int) -> bytes:
        zk = await self.source.pulsar_zk()
        path = ledger_path(ledger_id, self.source.options.ledgers_root)
        try:
            node = await zk.get(path)
        except NotFound:
            raise NotFound(f"schema ledger {ledger_id} is not in BookKeeper ({path})") from None
        meta = decode_ledger_metadata(node.data, ledger_id, path)
        # Pulsar closes a schema ledger right after its one add; an open one is being written
        # (or its broker died then): nothing readable yet
        if not meta.closed or not 0 <= entry_id <= meta.last_entry_id:
            raise NotFound(f"schema ledger {ledger_id} has no readable entry {entry_id} "
                           f"(state {meta.state.name}, last entry {meta.last_entry_id})")
        ledger = KnownLedger(meta, node.version, password=SCHEMA_LEDGER_PASSWORD,
                             root=self.source.options.ledgers_root, read_node=zk.get,
                             on_closed=lambda _meta: None)
        got = await self.source.client.read_entries(ledger, entry_id, entry_id)
        return bytes(got.payloads[0])


def bookkeeper_schema_reader(source: BookKeeperLedgerSource) -> SchemaReader:
    """Topics' schema versions as Pulsar stores them (see the module's docstring)."""
    return SchemaReader(PulsarNodes(source), SchemaLedgerReader(source))

"""A topic's schema versions, kept as Pulsar's schema registry keeps them.

The locator is Pulsar's own: ``/schemas/<schema id>`` in the (local) metadata store holds a
``SchemaLocator`` listing every version and where its ``SchemaEntry`` is (ledger, entry).
Pulsar puts each version's entry in its own BookKeeper ledger of one entry; the embedded store
has no BookKeeper, so it keeps that one entry in the node ``/offloadd/schema-ledgers/<ledger id>``
(the ledger id drawn from the same counter as the topics' ledgers, so the locator's positions
stay meaningful). A sidecar reads Pulsar's own: the locator in Pulsar's ZooKeeper and the entry
from BookKeeper (:mod:`offloadd.ledger.bookkeeper.schemas`): :class:`SchemaReader` takes where
the locators are and how an entry is read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from offloadd.errors import Conflict, FormatError, NotFound
from offloadd.format.schema_storage import (
    IndexEntry,
    SchemaEntry,
    SchemaInfo,
    SchemaLocator,
    SchemaType,
    schema_id,
)
from offloadd.metadata.base import MetadataStore, Versioned
from offloadd.model import TopicName
from offloadd.model.keys import OFFLOADD_ROOT

__all__ = ["SCHEMAS_ROOT", "EntryReader", "NodeReader", "SchemaReader", "SchemaVersion",
           "embedded_entry_reader", "locator_path", "register", "topic_schema_id"]

log = logging.getLogger(__name__)
SCHEMAS_ROOT = "/schemas"
SCHEMA_LEDGERS = f"{OFFLOADD_ROOT}/schema-ledgers"
EntryReader = Callable[[int, int], Awaitable[bytes]]  # (ledger id, entry id) -> entry bytes


class NodeReader(Protocol):
    """Where the locators are: a metadata store, or a read-only view of Pulsar's."""

    async def get(self, path: str) -> Versioned: ...


def topic_schema_id(topic: TopicName) -> str:
    return schema_id(topic.tenant, topic.namespace, topic.local)


def locator_path(topic: TopicName) -> str:
    return f"{SCHEMAS_ROOT}/{topic_schema_id(topic)}"


def schema_ledger_path(ledger_id: int) -> str:
    return f"{SCHEMA_LEDGERS}/{ledger_id}"


@dataclass(frozen=True)
class SchemaVersion:
    """One version of a topic's schema, parsed."""

    version: int
    info: SchemaInfo

    @property
    def type_name(self) -> str:
        return SchemaType.name(self.info.type)

    def avro(self) -> Any:
        """The Avro schema (parsed JSON) of an AVRO or JSON version."""
        try:
            return json.loads(self.info.schema)
        except ValueError as exc:
            raise FormatError(f"schema {self.info.schema_id}", 0, f"version {self.version}: "
                              f"definition is not JSON: {exc}") from None


async def register(md: MetadataStore, topic: TopicName, info: SchemaInfo,
                   allocate_ledger: Callable[[], Awaitable[int]]) -> int:
    """Add ``info`` as the topic's next version (or return the version of an identical latest
    definition, as Pulsar does for a producer reconnecting with the same schema); returns the
    version. The entry node is written first, then the locator by compare-and-set, so a lost
    race leaves at most an unreferenced entry node, never a locator pointing nowhere."""
    path = locator_path(topic)
    while True:
        try:
            node = await md.get(path)
            locator: SchemaLocator | None = SchemaLocator.decode(node.data)
            node_version = node.version
        except NotFound:
            locator, node_version = None, -1
        if locator is not None and locator.info.hash == info.hash():
            return locator.info.version
        version = 0 if locator is None else locator.info.version + 1
        ledger_id = await allocate_ledger()
        chain = locator.index if locator is not None else (IndexEntry(0, -1, -1, info.hash()),)
        await md.create(schema_ledger_path(ledger_id),
                        SchemaEntry(info.encode(), chain).encode())
        entry = IndexEntry(version, ledger_id, 0, info.hash())
        new = SchemaLocator(entry, (locator.index if locator is not None else ()) + (entry,))
        try:
            if locator is None:
                await md.create(path, new.encode())
            else:
                await md.set(path, new.encode(), node_version)
            return version
        except Conflict:
            await md.delete(schema_ledger_path(ledger_id))  # as Pulsar deletes its orphan


def embedded_entry_reader(md: NodeReader) -> EntryReader:
    async def read(ledger_id: int, entry_id: int) -> bytes:
        if entry_id != 0:
            raise NotFound(f"schema ledger {ledger_id} has one entry, not {entry_id}")
        return (await md.get(schema_ledger_path(ledger_id))).data

    return read


class SchemaReader:
    """A topic's versions by number, read once and cached (versions never change)."""

    def __init__(self, md: NodeReader, read_entry: EntryReader | None = None) -> None:
        self.md = md
        self.read_entry = read_entry or embedded_entry_reader(md)
        self._cache: dict[tuple[str, int], SchemaVersion] = {}
        self._unreadable: set[TopicName] = set()

    async def locator(self, topic: TopicName) -> SchemaLocator | None:
        try:
            return SchemaLocator.decode((await self.md.get(locator_path(topic))).data)
        except NotFound:
            return None

    async def versions(self, topic: TopicName) -> list[SchemaVersion]:
        """Every version of the topic's schema, oldest first ([] without a schema)."""
        loc = await self.locator(topic)
        if loc is None:
            return []
        try:
            return [await self._version(topic, e) for e in loc.index]
        except NotFound as exc:
            # e.g. a sidecar seeing Pulsar's locator, whose entries are in BookKeeper ledgers
            # that this reader does not read: project the topic untyped rather than not at all
            if topic not in self._unreadable:
                self._unreadable.add(topic)
                log.warning("schemas of %s: a version's entry is not readable (%s); the topic "
                            "is projected without typed columns", topic, exc)
            return []

    async def _version(self, topic: TopicName, e: IndexEntry) -> SchemaVersion:
        key = (topic_schema_id(topic), e.version)
        got = self._cache.get(key)
        if got is None:
            entry = SchemaEntry.decode(await self.read_entry(e.ledger_id, e.entry_id))
            got = self._cache[key] = SchemaVersion(e.version, SchemaInfo.decode(
                entry.schema_data))
        return got

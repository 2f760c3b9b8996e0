"""In-process helpers for the cluster tests: a memory store whose session can be expired like a
ZooKeeper session, and daemons sharing one memory tree, one ledger directory and one tier."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from offloadd import config, wiring
from offloadd.blobstore.base import StoreView
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.commit.cluster import ClusterOwnership
from offloadd.ledger.local import LocalLedgerSource, LocalLedgerStore, RolloverPolicy
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore, Op, Sessions, Versioned
from offloadd.metadata.memory import MemoryMetadataStore, MemoryTree
from offloadd.model import TopicName, catalog
from offloadd.read.verify import Report, verify
from offloadd.shell.daemon import Daemon


class State(enum.Enum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


class SessionedStore:
    """A session on a :class:`MemoryTree` with ZooKeeper's session surface (``session_id``,
    ``session_state``, listeners) and the server's side of an expiry: :meth:`expire` drops the
    session's ephemerals, tells listeners LOST, then reconnects with a new session."""

    def __init__(self, tree: MemoryTree) -> None:
        self._tree = tree
        self.inner = MemoryMetadataStore(tree)
        self.session_id: int | None = 1
        self.session_state = State.CONNECTED
        self._listeners: list[Callable[[Any], object]] = []

    def add_session_listener(self, listener: Callable[[Any], object]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _tell(self, state: State) -> None:
        self.session_state = state
        for fn in list(self._listeners):
            fn(state)

    def suspend(self) -> None:
        self._tell(State.SUSPENDED)

    def resume(self) -> None:
        self._tell(State.CONNECTED)

    async def expire(self, *, reconnect: bool = True) -> None:
        await self.inner.close()
        self.session_id = None
        self._tell(State.LOST)
        if reconnect:
            await self.reconnect()

    async def reconnect(self) -> None:
        self.inner = MemoryMetadataStore(self._tree)
        self.session_id = id(self.inner)
        self._tell(State.CONNECTED)

    async def get(self, path: str) -> Versioned:
        return await self.inner.get(path)

    async def exists(self, path: str) -> bool:
        return await self.inner.exists(path)

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        return await self.inner.create(path, data, ephemeral=ephemeral, sequential=sequential,
                                       make_parents=make_parents)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        return await self.inner.set(path, data, version)

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        await self.inner.delete(path, version, recursive=recursive)

    async def children(self, path: str) -> list[str]:
        return await self.inner.children(path)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        return await self.inner.multi(ops)

    async def close(self) -> None:
        await self.inner.close()


def settings(**extra: Any) -> config.Settings:
    base: dict[str, Any] = {
        "offload__max_size_per_segment_mbytes": 0.03,
        "offload__max_segment_rollover_time_minutes": 0.004,  # 0.24 s
        "offload__max_block_size_bytes": 8192,
        "offload__retry_base_s": 0.02,
        "offload__retry_max_s": 0.2,
        "daemon__shutdown_deadline_s": 10,
        "metrics__enabled": False,
    }
    base.update(extra)
    return config.load(None, **base)


async def until(pred: Callable[[], Awaitable[bool] | bool], timeout: float, what: str) -> None:
    try:
        async with asyncio.timeout(timeout):
            while True:
                res = pred()
                if isinstance(res, Awaitable):
                    res = await res
                if res:
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout:g}s waiting for {what}") from None


class Node:
    """One daemon of the in-process cluster."""

    def __init__(self, name: str, store: MetadataStore, path: Path, blob: MemoryBlobStore,
                 sessions: Sessions | None = None) -> None:
        self.name = name
        self.store = store
        self.ownership = ClusterOwnership(store, name, sessions=sessions)
        source = wiring.local_view(LocalLedgerSource(path, store, watch_interval=0.02))
        self.daemon = Daemon(settings(), source=source, metadata=store, tier=StoreView(blob),
                             ownership=self.ownership, discovery_interval_s=0.05)
        self.task = asyncio.create_task(self.daemon.run(install_signals=False))

    @property
    def running(self) -> set[TopicName]:
        return {t for t, r in self.daemon.topics.items() if not r.task.done()}

    async def stop(self) -> None:
        self.daemon.request_stop()
        await asyncio.wait_for(self.task, 20)

    async def crash(self) -> None:
        """Die without a goodbye: tasks end mid-flight, the session ends with the process."""
        self.task.cancel()
        for r in self.daemon.topics.values():
            r.task.cancel()
        await asyncio.gather(self.task, *(r.task for r in self.daemon.topics.values()),
                             return_exceptions=True)
        await self.store.close()


class Cluster:
    """Daemons on one memory tree, a writer appending to ``topics`` in the background."""

    def __init__(self, tmp: Path, topics: int, *, entries_per_ledger: int = 40) -> None:
        self.tree = MemoryTree()
        self.path = tmp / "ledgers"
        self.blob = MemoryBlobStore()
        self.writer_store = MemoryMetadataStore(self.tree)
        self.local = LocalLedgerStore(self.path, self.writer_store,
                                      RolloverPolicy(max_entries=entries_per_ledger))
        self.topics = [TopicName.parse(f"persistent://public/default/t{i}") for i in range(topics)]
        self.nodes: dict[str, Node] = {}
        self.written = 0
        self._stop = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    async def start_writer(self, per_batch: int = 8, pause: float = 0.01) -> None:
        for t in self.topics:  # every topic exists before any daemon looks
            await self.local.writer.append(t, [b"x" * 512])
            self.written += 1

        async def write() -> None:
            i = 0
            while not self._stop.is_set():
                t = self.topics[i % len(self.topics)]
                await self.local.writer.append(t, [f"{i:08d}".encode() * 64] * per_batch)
                self.written += per_batch
                i += 1
                await asyncio.sleep(pause)

        self._writer = asyncio.create_task(write())

    async def stop_writer(self) -> None:
        self._stop.set()
        if self._writer is not None:
            await self._writer
        await self.local.writer.close()

    def add(self, name: str, store: MetadataStore | None = None,
            sessions: Sessions | None = None) -> Node:
        node = Node(name, store or MemoryMetadataStore(self.tree), self.path, self.blob, sessions)
        self.nodes[name] = node
        return node

    def owner_counts(self) -> dict[TopicName, int]:
        """How many live daemons run each topic right now (must never exceed 1)."""
        counts = dict.fromkeys(self.topics, 0)
        for node in self.nodes.values():
            if not node.task.done():
                for t in node.running:
                    counts[t] += 1
        return counts

    async def committed(self) -> dict[TopicName, int]:
        out = {}
        for t in self.topics:
            info, _ = await managed_ledger.load(self.writer_store, t.managed_ledger)
            out[t] = sum(s.entries for s in catalog.segments(info) if s.complete)
        return out

    async def drained(self) -> bool:
        return sum((await self.committed()).values()) >= self.written

    async def verify(self) -> Report:
        return await verify(self.writer_store, self.blob, wiring.local_view(self.local.source),
                            self.topics, grace_s=0)

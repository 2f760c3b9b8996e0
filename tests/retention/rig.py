"""A topic on the embedded store (SQLite metadata, ledger files) offloaded to a filesystem tier,
for retention scenarios; plus a blob store wrapper that fails deletes on demand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from offloadd import config, wiring
from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.commit.fence import NoFence
from offloadd.config import Settings
from offloadd.errors import Retriable
from offloadd.ledger.local import LocalLedgerStore, RolloverPolicy
from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import Position, TopicName, catalog
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.roller import RollPolicy
from offloadd.offload.topic import OffloadEnv, TopicOffloader, TopicPolicy
from offloadd.read.reader import TierReader
from offloadd.read.verify import Report, verify
from offloadd.retention.gc import GcReport, gc_pass
from offloadd.retry import Backoff

TOPIC = TopicName.parse("persistent://public/default/keep")
KiB = 1024
ENTRY = KiB
FRAME = ENTRY + 12


class FlakyStore(FilesystemBlobStore):
    """The filesystem driver, whose deletes fail for the keys ``fails(key)`` picks."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.fails: Callable[[str], bool] = lambda key: False

    async def delete(self, key: str) -> None:
        if self.fails(key):
            raise Retriable(f"injected failure deleting {key}")
        await super().delete(key)


class Rig:
    """Ledgers of ``per_ledger`` entries; segments roll at ``per_segment`` entries' frames."""

    def __init__(self, tmp: Path, md: EmbeddedMetadataStore, *, per_ledger: int = 10,
                 per_segment: int = 25) -> None:
        self.tmp = tmp
        self.metadata = md
        self.store = LocalLedgerStore(tmp / "ledgers", md, RolloverPolicy(max_entries=per_ledger))
        self.blob = FlakyStore(tmp / "tier")
        self.roll = RollPolicy(per_segment * FRAME, 600, 4 * KiB)
        self.env = OffloadEnv(source=self.store.source, metadata=md, blobstore=self.blob,
                              buffer=OffloadBuffer(8 << 20), retry=Backoff(0.01, 0.05),
                              idle_poll_s=0.05)
        self.payloads: dict[tuple[int, int], bytes] = {}  # (ledger, entry) -> payload

    @classmethod
    async def open(cls, tmp: Path, **kw: int) -> Rig:
        return cls(tmp, await EmbeddedMetadataStore.open(tmp / "metadata"), **kw)

    async def close(self) -> None:
        await self.store.close()
        await self.blob.close()
        await self.metadata.close()

    async def write(self, n: int) -> None:
        for _ in range(n):
            i = len(self.payloads)
            p = (f"{i:08d}".encode() * (ENTRY // 8 + 1))[:ENTRY]
            pos = await self.store.writer.append(TOPIC, [p])
            self.payloads[pos] = p

    async def offload_all(self, timeout: float = 30) -> None:
        """Run the topic task until every written entry is in committed segments."""
        off = TopicOffloader(TOPIC, self.env, lambda: TopicPolicy(self.roll), NoFence())
        task = asyncio.create_task(off.run())
        last_l, last_e = max(self.payloads)
        try:
            async with asyncio.timeout(timeout):
                # segments roll by size; the trigger only closes the tail, once all is read
                while off.position is None or off.position <= Position(last_l, last_e):
                    await asyncio.sleep(0.02)
                while await self.committed_entries() < len(self.payloads):
                    off.trigger()
                    await asyncio.sleep(0.05)
        finally:
            off.request_stop()
            await asyncio.wait_for(task, 10)

    async def info(self) -> managed_ledger.ManagedLedgerInfo:
        info, _ = await managed_ledger.load(self.metadata, TOPIC.managed_ledger)
        return info

    async def segments(self) -> list[catalog.Segment]:
        return [s for s in catalog.segments(await self.info()) if s.complete]

    async def committed_entries(self) -> int:
        return sum(s.entries for s in await self.segments())

    async def ledger_ids(self) -> list[int]:
        return [li.ledgerId for li in (await self.info()).ledgerInfo]

    async def delete_ledgers(self, ids: list[int]) -> None:
        for lid in ids:
            await self.store.source.delete_ledger(TOPIC, lid)

    async def gc(self, settings: Settings | None = None, *, grace_s: float | None = 0,
                 now: float | None = None, dry_run: bool = False) -> GcReport:
        return await gc_pass(self.metadata, wiring.filesystem_view(self.blob),
                             wiring.local_view(self.store.source),
                             wiring.gc_settings(settings or config.load(None)),
                             now=now or time.time(), grace_s=grace_s, dry_run=dry_run)

    def objects(self) -> set[str]:
        root = self.tmp / "tier"
        return {str(p.relative_to(root)) for p in root.rglob("*")
                if p.is_file() and not p.relative_to(root).parts[0].startswith(".")}

    async def read_back(self) -> dict[tuple[int, int], bytes]:
        reader = TierReader(self.metadata, self.blob)
        return {tuple(e.position): bytes(e.payload)  # type: ignore[misc]
                async for e in reader.read(TOPIC)}

    async def verify(self) -> Report:
        return await verify(self.metadata, self.blob, wiring.local_view(self.store.source),
                            [TOPIC], grace_s=0)


def settings(**overrides: Any) -> Settings:
    return config.load(None, **overrides)


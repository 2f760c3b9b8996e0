"""Histories for the backfill tests: ledgers of chosen sizes in a fresh embedded store, and the
source-side truth (entry count, CRC-32 sum) the tier must match."""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from offloadd import config, wiring
from offloadd.config import Settings
from offloadd.ledger.local import LocalLedgerSource, LocalLedgerWriter, RolloverPolicy
from offloadd.model import Position, TopicName

TOPIC = TopicName.parse("persistent://public/default/history")


@dataclass
class Rig:
    root: Path
    config: Path
    settings: Settings
    topic: TopicName = TOPIC


def write_config(root: Path, *, segment_mbytes: float, block_bytes: int,
                 metadata_url: str | None = None, blobstore: str | None = None,
                 extra: str = "") -> Path:
    cfg = root / "offloadd.toml"
    url = metadata_url or f"embedded:{root / 'data' / 'metadata'}"
    tier = blobstore or f'driver = "filesystem"\npath = "{root / "data" / "tier"}"'
    cfg.write_text(f"""
[metadata]
url = "{url}"
[source]
path = "{root / 'data' / 'ledgers'}"
rollover_bytes = 1073741824
[blobstore]
{tier}
[offload]
max_size_per_segment_mbytes = {segment_mbytes}
max_block_size_bytes = {block_bytes}
max_segment_rollover_time_minutes = 0.02
[metrics]
enabled = false
[daemon]
pid_file = "{root / 'data' / 'offloadd.pid'}"
{extra}
""")
    return cfg


async def write_ledgers(settings: Settings, topic: TopicName,
                        ledgers: list[tuple[int, int]], *, close_last: bool = True,
                        seed: int = 0) -> None:
    """Append ``(entries, entry size)`` per ledger, rolling between them."""
    md = await wiring.open_metadata(settings)
    writer = LocalLedgerWriter(settings.source.path, md, RolloverPolicy(max_bytes=1 << 40))
    pool = os.urandom(1 << 20) + bytes([seed % 256])
    try:
        for i, (entries, size) in enumerate(ledgers):
            step = 0
            batch: list[bytes] = []
            for e in range(entries):
                off = (e * 7919 + i * 104729 + seed) % (len(pool) - size)
                batch.append(pool[off:off + size] + e.to_bytes(4, "big"))
                step += size
                if step >= 256 * 1024:
                    await writer.append(topic, batch)
                    batch, step = [], 0
            if batch:
                await writer.append(topic, batch)
            if i + 1 < len(ledgers) or close_last:
                await writer.roll(topic)
    finally:
        if close_last:
            await writer.close()
        await md.close()


async def make_rig(root: Path, ledgers: list[tuple[int, int]], *, segment_mbytes: float = 1,
                   block_bytes: int = 256 * 1024) -> Rig:
    cfg = write_config(root, segment_mbytes=segment_mbytes, block_bytes=block_bytes)
    settings = config.load(cfg)
    await write_ledgers(settings, TOPIC, ledgers)
    return Rig(root, cfg, settings)


async def source_truth(settings: Settings, topic: TopicName, upto: Position | None = None
                       ) -> tuple[int, int]:
    """(entries, sum of zlib CRC-32 of payloads) of the topic's entries (up to ``upto``)."""
    md = await wiring.open_metadata(settings)
    src = LocalLedgerSource(settings.source.path, md)
    count = total = 0
    try:
        for d in await src.ledgers(topic):
            nxt = 0
            while nxt <= d.last_entry_id:
                run = await src.read(topic, d.ledger_id, nxt, d.last_entry_id, max_bytes=1 << 22)
                data = bytes(run.data)
                for i in range(run.count):
                    if upto is not None and Position(d.ledger_id, nxt + i) > upto:
                        return count, total
                    total += zlib.crc32(data[run.offsets[i] + 12:run.offsets[i + 1]])
                    count += 1
                nxt = run.last_entry_id + 1
    finally:
        await md.close()
    return count, total

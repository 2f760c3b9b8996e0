"""A ledger writer in its own process, for the cross-process tests.

``python -m tests.ledger.writer_process DATA METADATA TOPIC COUNT MAX_ENTRIES MODE`` appends
``support.payload(i)`` for ``i < COUNT`` in batches of 1..50 entries, rolling every
``MAX_ENTRIES``; MODE ``close`` closes the writer, ``kill`` SIGKILLs itself instead (leaving its
ledger open, as a crash does).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from offloadd.ledger.local import LocalLedgerWriter, RolloverPolicy
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import TopicName
from tests.ledger.support import payload


async def main(data: str, meta: str, topic_name: str, count: int, max_entries: int,
               mode: str) -> None:
    metadata = await EmbeddedMetadataStore.open(meta)
    writer = LocalLedgerWriter(data, metadata, RolloverPolicy(max_entries, 1 << 30, 3600))
    topic = TopicName.parse(topic_name)
    i = batch = 0
    while i < count:
        batch = batch % 50 + 1
        n = min(batch, count - i)
        await writer.append(topic, [payload(j) for j in range(i, i + n)])
        i += n
        await asyncio.sleep(0.001)  # let the tailer catch up now and then
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    await writer.close()
    await metadata.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], a[2], int(a[3]), int(a[4]), a[5]))

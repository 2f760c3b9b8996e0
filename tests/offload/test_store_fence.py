"""A refused create-only write stops the topic task: a lost race (``Fenced``), not an error to
retry, and nothing is deleted (``offload/attempt.py``, ``docs/s3.md`` "Conditional writes").

The race is real: right before the task's index PUT another writer puts an object at that key,
and the filesystem store itself refuses the task's write (``link(2)``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import pytest

from offloadd.blobstore.base import Buffers, ObjectInfo
from offloadd.blobstore.filesystem import FilesystemBlobStore
from offloadd.commit.fence import NoFence
from offloadd.model import catalog
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.topic import OffloadEnv, TopicOffloader, TopicPolicy
from offloadd.retry import Backoff
from tests.retention.rig import TOPIC, Rig

pytestmark = pytest.mark.timeout(60)


class RacedStore(FilesystemBlobStore):
    """A filesystem store where another writer puts the first index key just before us."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.index_puts = 0
        self.raced: str | None = None

    async def put(self, key: str, data: Buffers, metadata: Mapping[str, str], *,
                  crc32c: int | None = None) -> ObjectInfo:
        if key.endswith("-index"):
            self.index_puts += 1
            if self.raced is None:
                self.raced = key
                other = FilesystemBlobStore(self.root)
                await other.probe_conditional_writes()
                await other.put(key, [b"the other writer's index"], {"role": "other"})
                await other.close()
        return await super().put(key, data, metadata, crc32c=crc32c)


async def test_a_refused_index_put_stops_the_task_and_touches_nothing(tmp_path: Path) -> None:
    rig = await Rig.open(tmp_path)
    store = RacedStore(tmp_path / "raced")
    try:
        assert (await store.probe_conditional_writes()).put
        await rig.write(30)
        env = OffloadEnv(source=rig.store.source, metadata=rig.metadata, blobstore=store,
                         buffer=OffloadBuffer(8 << 20), retry=Backoff(0.01, 0.05),
                         idle_poll_s=0.05)
        off = TopicOffloader(TOPIC, env, lambda: TopicPolicy(rig.roll), NoFence())
        task = asyncio.create_task(off.run())
        # the task ends by itself: fenced, no retry loop (a retry would put the index again)
        await asyncio.wait_for(task, 30)
        assert store.index_puts == 1 and store.raced is not None
        assert await store.get_range(store.raced, 0, 100) == b"the other writer's index"
        assert (await store.head(store.raced)).metadata == {"role": "other"}
        segs = catalog.segments(await rig.info())
        # the attempt's record stays ASSIGNED for recovery, and its data object is not deleted
        assert len(segs) == 1 and not segs[0].complete
        assert f"{segs[0].uid}-index" == store.raced
        assert await store.head(str(segs[0].uid))
    finally:
        await store.close()
        await rig.close()

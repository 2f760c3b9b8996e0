"""One segment attempt: the data object part by part, the index last; an abort leaves nothing."""

from __future__ import annotations

import pytest

from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.errors import NotFound, Retriable
from offloadd.format.streaming import decode_streaming_index as decode_index
from offloadd.ledger.memory import MemoryLedgerSource
from offloadd.model import TopicName
from offloadd.model.catalog import LedgerRange
from offloadd.model.keys import streaming_data_key, streaming_index_key
from offloadd.offload.attempt import Uploads, attempt_keys, delete_attempt, open_streaming
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.parts import DEFAULT_PART_SIZE
from offloadd.offload.runs import RunReader

pytestmark = pytest.mark.timeout(30)

TOPIC = TopicName.parse("persistent://public/default/attempt")
KiB = 1024


def setup(store: MemoryBlobStore, part_size: int = DEFAULT_PART_SIZE,
          ) -> tuple[RunReader, Uploads, OffloadBuffer]:
    src = MemoryLedgerSource()
    src.append(TOPIC, [bytes([i]) * 300 for i in range(40)])
    src.close_ledger(TOPIC)
    buf = OffloadBuffer(1 << 20)
    return RunReader(src, buf, TOPIC), Uploads(store, TOPIC.managed_ledger, 2,
                                               part_size=part_size), buf


class TestSegmentAttempt:
    """seal() completes the data object, then writes the index; abort() discards the upload."""

    async def test_the_index_is_written_last(self) -> None:
        ops: list[tuple[str, str]] = []
        store = MemoryBlobStore(lambda op, key: ops.append((op, key)))
        reader, uploads, buf = setup(store, part_size=2 * KiB)
        att = await open_streaming(uploads, max_block_size=4 * KiB, opened_at=0.0)
        async for run in reader.runs(LedgerRange(0, 0, 39), 2 * KiB, att.wait_for_room):
            att.feed(run, 1234)
        with pytest.raises(NotFound):
            await store.head(streaming_index_key(att.uid))  # nothing marks the pair yet
        await att.seal()
        data, index = streaming_data_key(att.uid), streaming_index_key(att.uid)
        assert ops.index(("complete", data)) < ops.index(("put", index)) == len(ops) - 1
        assert (await store.head(data)).size == att.length
        idx = decode_index(await store.get_range(index, 0, (await store.head(index)).size),
                           index)
        assert idx.section(0).last_entry_id == 39
        assert (att.entries, att.end) == (40, (0, 39)) and buf.used == 0
        parts = ops.count(("put_part", data))
        assert parts > 1 and att.usage.put_requests == parts + 3  # create, complete, index

    async def test_a_segment_within_one_part_is_one_put_then_the_index(self) -> None:
        ops: list[tuple[str, str]] = []
        store = MemoryBlobStore(lambda op, key: ops.append((op, key)))
        reader, uploads, buf = setup(store)  # the default part size: 8 MiB
        att = await open_streaming(uploads, max_block_size=4 * KiB, opened_at=0.0)
        async for run in reader.runs(LedgerRange(0, 0, 39), 2 * KiB, att.wait_for_room):
            att.feed(run, 1234)
        assert ops == []  # no multipart upload created for what may stay below one part
        await att.seal()
        data, index = streaming_data_key(att.uid), streaming_index_key(att.uid)
        assert ops == [("put", data), ("put", index)]
        assert (await store.head(data)).size == att.length
        idx = decode_index(await store.get_range(index, 0, (await store.head(index)).size),
                           index)
        assert idx.section(0).last_entry_id == 39 and buf.used == 0
        assert att.usage.put_requests == 2

    async def test_an_aborted_attempt_leaves_no_object_and_no_held_bytes(self) -> None:
        store = MemoryBlobStore()
        reader, uploads, buf = setup(store)
        att = await open_streaming(uploads, max_block_size=4 * KiB, opened_at=0.0)
        async for run in reader.runs(LedgerRange(0, 0, 9), 2 * KiB):
            att.feed(run)
        await att.abort()
        assert [o async for o in store.list()] == [] and buf.used == 0

    @pytest.mark.parametrize(("failing", "part_size"), [("put_part", 2 * KiB),
                                                        ("put", DEFAULT_PART_SIZE)],
                             ids=["a-part-of-a-multipart-upload", "the-one-put"])
    async def test_a_failed_write_fails_the_seal_and_holds_nothing(self, failing: str,
                                                                   part_size: int) -> None:
        def fault(op: str, key: str) -> None:
            if op == failing:
                raise Retriable("injected")

        store = MemoryBlobStore(fault)
        reader, uploads, buf = setup(store, part_size=part_size)
        att = await open_streaming(uploads, max_block_size=4 * KiB, opened_at=0.0)
        async for run in reader.runs(LedgerRange(0, 0, 9), 2 * KiB):
            att.feed(run)
        with pytest.raises(Retriable):
            await att.seal()
        await att.abort()
        assert [o async for o in store.list()] == [] and buf.used == 0

    async def test_its_objects_are_deleted_index_first(self) -> None:
        deleted: list[str] = []
        store = MemoryBlobStore(lambda op, key: deleted.append(key) if op == "delete" else None)
        att = await open_streaming(Uploads(store, TOPIC.managed_ledger, 1),
                                   max_block_size=4 * KiB, opened_at=0.0)
        await delete_attempt(store, att.uid, [7])
        assert deleted == attempt_keys(att.uid, [7])
        assert deleted[:2] == [streaming_index_key(att.uid), streaming_data_key(att.uid)]

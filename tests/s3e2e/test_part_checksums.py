"""Every part and every one-shot object goes with an ``x-amz-checksum-crc32c`` header the
uploader combined from its blocks' own CRCs (issue 22: no second pass over the bytes): the
header must be the CRC32C of the very bytes sent, or S3 refuses the part (``BadDigest``).
Checked on the requests as botocore sends them, with the request body offloadd hands it
(``blobstore/s3/body.py``), which must still get ``Expect: 100-continue``.

Neither moto nor RGW checks the header (pinned in ``test_server_quirks.py``), so the refusal
itself is AWS's; here the header is compared with the bytes on the way out.
"""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import crc32c
import pytest

from offloadd.blobstore.s3 import S3BlobStore, checksums
from offloadd.ledger.memory import MemoryLedgerSource
from offloadd.model import TopicName
from offloadd.model.catalog import LedgerRange
from offloadd.offload.attempt import Uploads, open_streaming
from offloadd.offload.buffer import OffloadBuffer
from offloadd.offload.runs import RunReader
from tests.fixtures.s3 import MotoBucket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TOPIC = TopicName.parse("persistent://public/default/part-checksums")
MiB = 1024 * 1024


async def _segment(store: S3BlobStore, src: MemoryLedgerSource, ledgers: int,
                   entries: int) -> None:
    reader = RunReader(src, OffloadBuffer(64 * MiB), TOPIC)
    att = await open_streaming(Uploads(store, TOPIC.managed_ledger, 2, part_size=5 * MiB),
                               max_block_size=MiB, opened_at=0.0)
    for lid in range(ledgers):  # a fresh source numbers its ledgers from 0
        async for run in reader.runs(LedgerRange(lid, 0, entries - 1), 4 * MiB,
                                     att.wait_for_room):
            att.feed(run)
    await att.seal()


async def test_each_part_and_put_carries_the_crc32c_of_the_bytes_sent(
        s3_bucket: MotoBucket, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []  # the lengths the driver itself passed through CRC32C

    def counted(data: bytes, value: int = 0) -> int:
        read.append(len(data))
        return crc32c.crc32c(data, value)

    monkeypatch.setattr(checksums, "crc32c", SimpleNamespace(crc32c=counted))
    store = await S3BlobStore.open(s3_bucket.options())
    sent: list[tuple[str, str, str, str | None]] = []

    def capture(request: Any, event_name: str = "", **_: Any) -> None:
        body = request.body
        # offloadd's Body, or what botocore makes of bytes (a BytesIO)
        data = body.data if hasattr(body, "data") else body.getvalue()
        header = request.headers.get("x-amz-checksum-crc32c")
        expect = request.headers.get("Expect")
        sent.append((event_name.rsplit(".", 1)[-1],
                     header.decode() if isinstance(header, bytes) else header,
                     crc32c_b64(data),
                     expect.decode() if isinstance(expect, bytes) else expect))

    events = store._calls.primary.client.meta.events
    events.register("before-send.s3.UploadPart", capture)
    events.register("before-send.s3.PutObject", capture)
    try:
        big = MemoryLedgerSource()
        for i in range(3):  # 3 × 40 × 64 KiB: two parts of whole 1 MiB blocks
            big.append(TOPIC, [bytes([i, k % 256]) * 32 * 1024 for k in range(40)])
            big.close_ledger(TOPIC)
        await _segment(store, big, 3, 40)
        small = MemoryLedgerSource()
        small.append(TOPIC, [b"tiny entry %d" % k for k in range(5)])
        small.close_ledger(TOPIC)
        await _segment(store, small, 1, 5)  # under one part: a single PutObject
    finally:
        await store.close()
    parts = [s for s in sent if s[0] == "UploadPart"]
    puts = [s for s in sent if s[0] == "PutObject"]
    assert len(parts) >= 2 and len(puts) >= 3  # two index objects and one small data object
    for op, header, actual, _ in sent:
        assert header == actual, (op, header, actual)
    assert all(expect == "100-continue" for *_, expect in parts)
    # no data part or data object was read again for its header: only the index objects'
    # (and each is far smaller than one 1 MiB block)
    assert len(read) == len(puts) - 1 and all(n < MiB for n in read), read


def crc32c_b64(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()

"""Chunked messages reassembled as Pulsar's consumer does: a resent chunk counts once, chunks of
several messages interleave, a republished message starts over at chunk 0, an incomplete one gives
no row — through a real table (pyiceberg, SQLite catalog) and ``offloadd query``'s
``<topic>__messages``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from offloadd._proto import pulsar_api_pb2 as pb
from offloadd.format.compression import Compression, compress
from offloadd.format.message import encode_entry
from offloadd.lakehouse.chunks import reassemble
from offloadd.lakehouse.query import run_query
from offloadd.lakehouse.rows import RowBuilder
from offloadd.lakehouse.schema import table_schema
from offloadd.lakehouse.tables import open_catalog, open_table
from offloadd.model import Position, TopicName
from tests.lakehouse.support import run, settings_of, write_config

T0 = "persistent://public/default/topic-0"


def message(seed: int, size: int) -> bytes:
    words = [b"order-%d-%d " % (seed, i) for i in range(size // 12 + 1)]
    return b"".join(words)[:size - 64] + os.urandom(32).hex().encode()


def chunks(uuid: str, whole: bytes, codec: Compression, n: int, seq: int) -> list[bytes]:
    packed = compress(codec, whole)
    step = -(-len(packed) // n)
    out = []
    for i in range(n):
        md = pb.MessageMetadata(producer_name="big", sequence_id=seq, publish_time=1_000 + i,
                                uuid=uuid, chunk_id=i, num_chunks_from_msg=n,
                                total_chunk_msg_size=len(packed), compression=codec,
                                uncompressed_size=len(whole))
        out.append(encode_entry(md, packed[i * step:(i + 1) * step]))
    return out


def plain(payload: bytes, seq: int) -> bytes:
    return encode_entry(pb.MessageMetadata(producer_name="small", sequence_id=seq,
                                           publish_time=1_000), payload)


@pytest.mark.parametrize("codec", list(Compression))
def test_duplicated_interleaved_and_republished_chunks(tmp_path: Path, codec: Compression) -> None:
    a, b, d = message(1, 350_000), message(2, 120_000), message(4, 90_000)
    ca = chunks("big-1", a, codec, 4, 1)
    cb = chunks("big-2", b, codec, 3, 2)
    cc = chunks("big-3", message(3, 50_000), codec, 3, 3)
    cd_lost = chunks("big-4", message(5, 80_000), codec, 3, 4)  # published, then again
    cd = chunks("big-4", d, codec, 3, 4)
    log = [plain(b"first", 0), ca[0], ca[1], cb[0], ca[1],  # a's chunk 1 resent: [0,1,1,2,3]
           cb[1], ca[2], cc[0], ca[3], cb[1], cb[2], cd_lost[0], cd_lost[1],
           cd[0], cd[1], cd[2], cc[1], plain(b"last", 9)]  # big-3 never completes
    settings = settings_of(write_config(tmp_path))
    catalog = open_catalog(settings)
    table = open_table(catalog, TopicName.parse(T0))
    builder = RowBuilder(T0, table.schema())
    for i, raw in enumerate(log):
        builder.add(Position(3, i), raw)
    table.append(builder.table())

    every = run_query(catalog, "SELECT count(*) FROM topic_0").rows
    assert every == [(len(log),)]  # the table: once per log entry
    res = run_query(catalog, 'SELECT entry_id, payload, chunk_uuid, num_chunks, decode_error '
                    'FROM "topic-0__messages" ORDER BY entry_id')
    assert [(r[0], r[1], r[2], r[4]) for r in res.rows] == [
        (0, b"first", None, None), (1, a, "big-1", None), (3, b, "big-2", None),
        (13, d, "big-4", None), (17, b"last", None, None)]
    assert [r[3] for r in res.rows] == [None, 4, 3, 3, None]


def test_the_messages_view_in_offloadd_query(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    settings = settings_of(cfg)
    catalog = open_catalog(settings)
    table = open_table(catalog, TopicName.parse(T0))
    whole = message(7, 200_000)
    c = chunks("big-7", whole, Compression.LZ4, 3, 7)
    builder = RowBuilder(T0, table.schema())
    for i, raw in enumerate([c[0], c[1], c[1], c[2]]):
        builder.add(Position(1, i), raw)
    table.append(builder.table())
    out = run(["query", "--config", str(cfg), "--json",
               "SELECT count(*) AS n, sum(octet_length(payload)) AS bytes "
               "FROM topic_0__messages"], tmp_path)
    assert json.loads(out.stdout) == [{"n": 1, "bytes": len(whole)}]


def test_rows_without_chunks_pass_through() -> None:
    builder = RowBuilder(T0, table_schema())
    builder.add(Position(1, 0), plain(b"x", 0))
    rows = builder.table()
    assert reassemble(rows).equals(rows)

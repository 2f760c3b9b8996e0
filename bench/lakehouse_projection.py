"""Typed projection cost: µs per message of schema'd topics (``produce --schema avro|json``
messages, batches of 1..16), with the compiled Avro decoder
(:mod:`offloadd.lakehouse.avro_compiled`) and with the reference path that walks the schema
per message (``TypedDecoder(compiled=False)``), measured alternately in the same process.

Two figures per kind: ``decode`` (the ``value`` column alone: ``TypedDecoder.decode`` per
message) and ``rows`` (every column: entry decoding, :class:`RowBuilder` rows, the Arrow table).

    .venv/bin/python bench/lakehouse_projection.py [--messages 40000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from offloadd import config
from offloadd.format.message import decode_entry
from offloadd.lakehouse.rows import RowBuilder
from offloadd.lakehouse.schemas import TypedDecoder
from offloadd.lakehouse.tables import open_catalog, open_table
from offloadd.lakehouse.typed import evolve
from offloadd.metadata.schemas import SchemaVersion
from offloadd.model import Position, TopicName
from offloadd.shell.produce_schema import ORDER_SCHEMA, SchemaEntries, schema_info

TOPIC = TopicName.parse("persistent://public/default/orders")


def _decode_us(decoder: TypedDecoder, msgs: list[tuple[bytes | None, bytes | None]]) -> float:
    t0 = time.perf_counter()
    for version, payload in msgs:
        decoder.decode(version, payload)
    return (time.perf_counter() - t0) / len(msgs) * 1e6


def _rows_us(table: Any, decoder: TypedDecoder, entries: list[bytes], n: int) -> float:
    t0 = time.perf_counter()
    b = RowBuilder(str(TOPIC), table.schema(), None, decoder)
    for i, raw in enumerate(entries):
        b.add(Position(3, i), raw)
    b.table()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    out: dict[str, Any] = {"messages": a.messages, "rounds": a.rounds,
                           "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="offloadd-projbench-") as d:
        cwd = os.getcwd()
        os.chdir(d)
        try:
            for kind in ("avro", "json"):
                settings = config.load(None, lakehouse__path=str(Path(d) / kind))
                table = open_table(open_catalog(settings), TOPIC)
                compiled = evolve(table, str(TOPIC), [SchemaVersion(
                    0, schema_info(TOPIC, kind, ORDER_SCHEMA, 0))])  # type: ignore[arg-type]
                assert compiled is not None
                reference = TypedDecoder(str(TOPIC), list(compiled.versions.values()),
                                         compiled=False)
                src = SchemaEntries(kind, {TOPIC: 0})  # type: ignore[arg-type]
                entries: list[bytes] = []
                n = 0
                while n < a.messages:
                    raw = bytes(src.take(TOPIC, 1)[0][0])
                    entries.append(raw)
                    n += len(decode_entry(raw, "bench").messages)
                msgs = [(e.schema_version, m.payload) for e in
                        (decode_entry(r, "bench") for r in entries) for m in e.messages]
                best: dict[str, float] = {}
                for _ in range(a.rounds):  # alternating, the best of each
                    for name, dec in (("before", reference), ("after", compiled)):
                        for what, us in (("decode", _decode_us(dec, msgs)),
                                         ("rows", _rows_us(table, dec, entries, n))):
                            k = f"{what}_{name}_us"
                            best[k] = min(best.get(k, float("inf")), us)
                res = {k: round(v, 2) for k, v in sorted(best.items())}
                res["decode_ratio"] = round(best["decode_before_us"] / best["decode_after_us"], 2)
                res["rows_ratio"] = round(best["rows_before_us"] / best["rows_after_us"], 2)
                out[kind] = res
        finally:
            os.chdir(cwd)
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

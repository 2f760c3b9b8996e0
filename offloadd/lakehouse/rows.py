"""Entries in, Arrow rows out: each entry decoded (:mod:`offloadd.format.message`) into one row
per message, in the columns of :mod:`offloadd.lakehouse.schema` (pure: no I/O).

An entry that does not decode is not dropped and does not stop the projection: it becomes one row
with ``decode_error`` saying what is wrong (the decoder's message names topic, position and byte)
and the raw entry as payload, so nothing is lost and the problem is queryable.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from offloadd.errors import FormatError
from offloadd.format.compression import Compression
from offloadd.format.message import DecodedEntry, decode_entry
from offloadd.lakehouse.schemas import KEY_COLUMN, VALUE_COLUMN, TypedDecoder
from offloadd.model import Position

__all__ = ["RowBuilder", "decode"]

log = logging.getLogger(__name__)

_I64 = 1 << 63


def _signed(v: int) -> int:
    """uint64 protobuf values in an Iceberg long (two's complement above 2**63)."""
    return v - (1 << 64) if v >= _I64 else v


class RowBuilder:
    """Accumulates rows for one topic; :meth:`table` hands them out as a ``pa.Table``."""

    def __init__(self, topic: str, schema: Schema,
                 json_fields: Mapping[str, str] | None = None,
                 typed: TypedDecoder | None = None) -> None:
        self.topic = topic
        self.schema = schema
        self.arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
        self.json_fields = dict(json_fields or {})
        self._json_cols: dict[str, list[Any]] = {k: [] for k in self.json_fields}
        self._cols: dict[str, list[Any]] = {name: [] for name in (
            "ledger_id", "entry_id", "batch_index", "publish_time", "event_time", "key",
            "ordering_key", "properties", "producer_name", "sequence_id", "payload",
            "broker_timestamp", "broker_index", "schema_version", "encrypted", "chunk_uuid",
            "chunk_id", "num_chunks", "payload_compression", "decode_error")}
        self.typed = typed  # the topic's schema versions: the ``value`` column
        self._values: list[Any] = []
        self._keys: list[Any] = []  # a KEY_VALUE schema's typed keys (kv_key)
        self.rows = 0
        self.entries = 0
        self.payload_bytes = 0
        self.undecodable = 0
        self.last: Position | None = None
        # (first row, end row, txn_id, hidden) per entry that sets them: most entries do not
        self._marks: list[tuple[int, int, str | None, str | None]] = []

    def add(self, position: Position, raw: bytes | memoryview) -> None:
        """One entry at ``position`` (entries must come in log order)."""
        self.add_decoded(position, raw, decode(self.topic, position, raw))

    def add_decoded(self, position: Position, raw: bytes | memoryview,
                    d: DecodedEntry | FormatError, *, txn: str | None = None,
                    hidden: str | None = None) -> None:
        """One entry already decoded (:func:`decode`); ``txn`` and ``hidden`` fill the columns
        of the same names for every message of the entry."""
        self.entries += 1
        self.last = position
        first = self.rows
        if isinstance(d, FormatError):
            self.undecodable += 1
            self._values.append(None)
            self._keys.append(None)
            self._row(position, -1, None, None, None, None, (), None, None, bytes(raw), None,
                      None, None, False, None, None, None, None, str(d))
        else:
            self._messages(position, d)
        if txn is not None or hidden is not None:  # per entry, not per message: filled later
            self._marks.append((first, self.rows, txn, hidden))

    def _messages(self, position: Position, d: DecodedEntry) -> None:
        pt = d.publish_time * 1000
        b = d.broker
        bts = b.broker_timestamp * 1000 if b is not None and b.broker_timestamp is not None \
            else None
        bidx = _signed(b.index) if b is not None and b.index is not None else None
        raw_codec = None
        chunk = d.chunk
        if (d.encrypted or chunk is not None) and d.compression != Compression.NONE:
            raw_codec = _codec_name(d.compression)
        for m in d.messages:
            value, typed_key, error = None, None, None
            if self.typed is not None and not d.encrypted and chunk is None:
                value, typed_key, error = self.typed.decode(d.schema_version, m.payload, m.key)
            self._values.append(value)
            self._keys.append(typed_key)
            self._row(position, m.batch_index, pt,
                      m.event_time * 1000 if m.event_time else None, m.key, m.ordering_key,
                      m.properties, d.producer_name, _signed(m.sequence_id), m.payload, bts, bidx,
                      d.schema_version, d.encrypted,
                      chunk.uuid if chunk else None, chunk.chunk_id if chunk else None,
                      chunk.num_chunks if chunk else None, raw_codec, error)

    def _row(self, pos: Position, batch_index: int, publish_us: int | None,
             event_us: int | None, key: str | None, ordering_key: bytes | None,
             props: tuple[tuple[str, str], ...], producer: str | None, seq: int | None,
             payload: bytes | None, broker_us: int | None, broker_index: int | None,
             schema_version: bytes | None, encrypted: bool, chunk_uuid: str | None,
             chunk_id: int | None, num_chunks: int | None, codec: str | None,
             error: str | None) -> None:
        c = self._cols
        c["ledger_id"].append(pos.ledger_id)
        c["entry_id"].append(pos.entry_id)
        c["batch_index"].append(batch_index)
        c["publish_time"].append(publish_us)
        c["event_time"].append(event_us)
        c["key"].append(key)
        c["ordering_key"].append(ordering_key)
        c["properties"].append(props)
        c["producer_name"].append(producer)
        c["sequence_id"].append(seq)
        c["payload"].append(payload)
        c["broker_timestamp"].append(broker_us)
        c["broker_index"].append(broker_index)
        c["schema_version"].append(schema_version)
        c["encrypted"].append(encrypted)
        c["chunk_uuid"].append(chunk_uuid)
        c["chunk_id"].append(chunk_id)
        c["num_chunks"].append(num_chunks)
        c["payload_compression"].append(codec)
        c["decode_error"].append(error)
        if self.json_fields:
            self._json(payload if error is None and not encrypted and chunk_uuid is None
                       else None)
        self.rows += 1
        if payload is not None:
            self.payload_bytes += len(payload)

    def _json(self, payload: bytes | None) -> None:
        doc: Any = None
        if payload is not None and payload[:1] == b"{":
            try:
                doc = json.loads(payload)
            except ValueError:  # not JSON after all (UnicodeDecodeError is a ValueError)
                doc = None
        for name, kind in self.json_fields.items():
            v = doc.get(name) if isinstance(doc, dict) else None
            self._json_cols[name].append(_coerce(v, kind))

    def table(self) -> pa.Table:
        """The rows so far as a table of :attr:`arrow_schema`; the builder is reset."""
        arrays = []
        for f in self.arrow_schema:
            if f.name == "topic":
                arrays.append(pa.array([self.topic] * self.rows, f.type))
            elif f.name in self._cols:
                arrays.append(pa.array(self._cols[f.name], f.type))
            elif f.name in self._json_cols:
                arrays.append(pa.array(self._json_cols[f.name], f.type))
            elif f.name == VALUE_COLUMN and self.typed is not None:
                arrays.append(pa.array(self._values, f.type))
            elif f.name == KEY_COLUMN and self.typed is not None:
                arrays.append(pa.array(self._keys, f.type))
            elif f.name in _MARK_COLUMNS:
                arrays.append(self._mark_column(_MARK_COLUMNS[f.name], f.type))
            else:  # a column this builder does not fill (e.g. a JSON field no longer configured)
                arrays.append(pa.nulls(self.rows, f.type))
        out = pa.Table.from_arrays(arrays, schema=self.arrow_schema)
        for col in self._cols.values():
            col.clear()
        for col in self._json_cols.values():
            col.clear()
        self._values.clear()
        self._keys.clear()
        self._marks.clear()
        self.rows = self.entries = self.payload_bytes = 0
        return out

    def _mark_column(self, which: int, typ: pa.DataType) -> pa.Array:
        if not any(m[which] is not None for m in self._marks):
            return pa.nulls(self.rows, typ)
        values: list[str | None] = [None] * self.rows
        for m in self._marks:
            v = m[which]
            if v is not None:
                values[m[0]:m[1]] = [str(v)] * (m[1] - m[0])
        return pa.array(values, typ)


_MARK_COLUMNS = {"txn_id": 2, "hidden": 3}


def decode(topic: str, position: Position, raw: bytes | memoryview) -> DecodedEntry | FormatError:
    """The entry decoded, or the decoder's error (logged: the entry becomes a flagged row)."""
    try:
        return decode_entry(raw, f"{topic} {position}")
    except FormatError as exc:
        log.warning("undecodable entry kept as a flagged row: %s", exc)
        return exc


def _codec_name(codec: int) -> str:
    try:
        return Compression(codec).name
    except ValueError:
        return f"UNKNOWN({codec})"


def _coerce(v: Any, kind: str) -> Any:
    if v is None:
        return None
    if kind == "string":
        return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    if kind == "long":
        return v if isinstance(v, int) and not isinstance(v, bool) and -_I64 <= v < _I64 \
            else None
    if kind == "double":
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
    if kind == "boolean":
        return v if isinstance(v, bool) else None
    return None

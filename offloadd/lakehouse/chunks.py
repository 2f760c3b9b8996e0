"""Chunked messages put back together, as Pulsar's consumer does (pure: Arrow in, Arrow out).

A producer cuts a large message — compressed whole first — into chunks, one entry each, all
with the same ``uuid`` (``"<producer>-<sequence id>"``), ``chunk_id`` 0..n-1 and ``num_chunks``
n. The table keeps every entry as a row (once per log entry), so a chunk the producer resent
after a lost receipt is in it twice, and a message the producer republished under the same uuid
starts again at chunk 0. :func:`reassemble` follows ``ConsumerImpl.processMessageChunk``
(Pulsar's client), per uuid in log order:

- chunk 0 starts the message (a partial one under the same uuid is discarded);
- the next chunk id is appended; a chunk id already seen is a duplicate and ignored (the first
  copy is kept, as the consumer keeps it);
- any other id (a gap, or no chunk 0 before it) discards the partial message;
- after chunk n-1 the concatenation is decompressed with ``payload_compression`` and becomes one
  row at the position of its chunk 0, with ``chunk_id`` null and ``payload_compression`` null.

Incomplete messages (chunks missing, or still to come) give no row. Encrypted chunks cannot be
opened without the key: they stay as they are. A concatenation that does not decompress gives
one row with ``decode_error`` set and the concatenated bytes as payload. Rows that are not chunks
pass through unchanged; the result is in log order.

``offloadd query`` offers this as a table per topic: ``<name>__messages`` (e.g.
``topic_0__messages`` or ``"topic-0__messages"``) beside ``<name>``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from offloadd.format.compression import DEFAULT_LIMIT, CodecError, Compression, decompress

__all__ = ["MESSAGES_SUFFIX", "reassemble", "unsized_decompress"]

MESSAGES_SUFFIX = "__messages"
_ORDER = [("ledger_id", "ascending"), ("entry_id", "ascending"), ("batch_index", "ascending")]


def reassemble(rows: pa.Table, *, limit: int = DEFAULT_LIMIT) -> pa.Table:
    """``rows`` (any columns of a topic table, with the chunk columns) with each chunked message
    as one row; see the module docstring."""
    if "chunk_uuid" not in rows.column_names:
        return rows
    is_chunk = pc.fill_null(pc.is_valid(rows.column("chunk_uuid")), False)
    if "encrypted" in rows.column_names:
        is_chunk = pc.and_(is_chunk, pc.invert(pc.fill_null(rows.column("encrypted"), False)))
    if not pc.any(is_chunk).as_py():
        return rows
    plain = rows.filter(pc.invert(is_chunk))
    chunks = rows.filter(is_chunk).sort_by(_ORDER)
    uuids = chunks.column("chunk_uuid").to_pylist()
    ids = chunks.column("chunk_id").to_pylist()
    counts = chunks.column("num_chunks").to_pylist()
    payloads = chunks.column("payload").to_pylist()
    codecs = (chunks.column("payload_compression").to_pylist()
              if "payload_compression" in chunks.column_names else [None] * len(uuids))
    partial: dict[str, tuple[int, list[int]]] = {}  # uuid → (last chunk id, row indexes)
    done: list[tuple[int, bytes | None, str | None]] = []  # (row of chunk 0, payload, error)
    for i, (uuid, cid, n) in enumerate(zip(uuids, ids, counts, strict=True)):
        ctx = partial.get(uuid)
        if cid == 0:
            ctx = (0, [i])
        elif ctx is not None and cid == ctx[0] + 1:
            ctx = (cid, [*ctx[1], i])
        elif ctx is not None and cid is not None and cid <= ctx[0]:
            continue  # a duplicate chunk: the first copy stays
        else:  # a gap, or no chunk 0: the partial message is dropped, as the consumer does
            partial.pop(uuid, None)
            continue
        if n is not None and ctx[0] == n - 1:
            partial.pop(uuid, None)
            whole = b"".join(payloads[j] or b"" for j in ctx[1])
            done.append((ctx[1][0], *_open(whole, codecs[ctx[1][0]], limit)))
        else:
            partial[uuid] = ctx
    if not done:
        return plain.sort_by(_ORDER)
    firsts = chunks.take(pa.array([d[0] for d in done], pa.int64()))
    firsts = _replace(firsts, "payload", [d[1] for d in done])
    firsts = _replace(firsts, "chunk_id", [None] * len(done))
    if "payload_compression" in firsts.column_names:
        firsts = _replace(firsts, "payload_compression",
                          [codecs[d[0]] if d[2] is not None else None for d in done])
    if "decode_error" in firsts.column_names:
        firsts = _replace(firsts, "decode_error", [d[2] for d in done])
    return pa.concat_tables([plain, firsts]).sort_by(_ORDER)


def _replace(t: pa.Table, name: str, values: list[Any]) -> pa.Table:
    i = t.schema.get_field_index(name)
    if i < 0:
        return t
    field = t.schema.field(i)
    return t.set_column(i, field, pa.array(values, field.type))


def _open(whole: bytes, codec: str | None, limit: int) -> tuple[bytes | None, str | None]:
    if codec is None or codec == "NONE":
        return whole, None
    try:
        return unsized_decompress(Compression[codec], whole, limit), None
    except (KeyError, CodecError) as exc:
        return whole, f"chunked message does not decompress with {codec}: {exc}"


def unsized_decompress(codec: Compression, data: bytes, limit: int = DEFAULT_LIMIT) -> bytes:
    """``data`` decompressed when the uncompressed size is not at hand (the table does not keep
    a chunked message's ``uncompressed_size``): ZLIB, ZSTD and SNAPPY say it themselves; an LZ4
    block expands at most 255-fold, so that bounds the buffer. Never more than ``limit``."""
    if codec == Compression.LZ4:
        import lz4.block

        bound = min(limit, 255 * len(data) + 16)
        try:
            out: bytes = lz4.block.decompress(data, uncompressed_size=bound)
        except Exception as exc:  # lz4 raises its own LZ4BlockError
            raise CodecError(f"LZ4: {exc}") from None
        return out
    if codec == Compression.ZLIB:
        import zlib

        d = zlib.decompressobj()
        try:
            out = d.decompress(data, limit + 1)
        except zlib.error as exc:
            raise CodecError(f"ZLIB: {exc}") from None
        if len(out) > limit or not d.eof:
            raise CodecError("ZLIB: beyond the limit or truncated")
        return out
    if codec == Compression.ZSTD:
        import zstandard

        declared = zstandard.frame_content_size(data)
        if declared > limit:
            raise CodecError(f"ZSTD frame declares {declared} bytes, beyond the limit")
        size = declared if declared >= 0 else limit
        return decompress(codec, data, size, limit) if declared >= 0 else \
            zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    if codec == Compression.SNAPPY:
        from offloadd.format.compression import _snappy_length

        return decompress(codec, data, _snappy_length(data), limit)
    return decompress(codec, data, len(data), limit)

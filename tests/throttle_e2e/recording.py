"""Measuring what the real pipeline sends to the tier.

:class:`RecordingBlobStore` wraps a real store (``FilesystemBlobStore`` here) and timestamps the
byte count of every data-object part per topic; index objects (``put``) are small, unthrottled
and not recorded. The pure functions below turn those records into the figures issue 5 asks for.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from offloadd.blobstore.base import BlobStore, Buffers, MultipartUpload, ObjectInfo


@dataclass(frozen=True)
class PartRecord:
    started: float  # monotonic: when the part's bytes were handed to the store
    landed: float  # monotonic: when the store had them
    topic: str  # the managed-ledger name from the object's user metadata
    nbytes: int


class RecordingUpload:
    def __init__(self, inner: MultipartUpload, topic: str, sink: list[PartRecord],
                 clock: Callable[[], float]) -> None:
        self.key = inner.key
        self._inner = inner
        self._topic = topic
        self._sink = sink
        self._clock = clock

    async def put_part(self, part_number: int, offset: int, data: Buffers, *,
                       crc32c: int | None = None) -> None:
        started = self._clock()
        await self._inner.put_part(part_number, offset, data, crc32c=crc32c)
        nbytes = sum(memoryview(b).nbytes for b in data)
        self._sink.append(PartRecord(started, self._clock(), self._topic, nbytes))

    async def complete(self) -> ObjectInfo:
        return await self._inner.complete()

    async def abort(self) -> None:
        await self._inner.abort()


class RecordingBlobStore:
    """Delegates everything to ``inner``; records multipart parts in :attr:`parts`."""

    def __init__(self, inner: BlobStore, clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self.name = inner.name
        self.parts: list[PartRecord] = []
        self._clock = clock

    async def start_upload(self, key: str, metadata: Mapping[str, str]) -> MultipartUpload:
        upload = await self.inner.start_upload(key, metadata)
        topic = metadata.get("managedledgername", "?")
        return RecordingUpload(upload, topic, self.parts, self._clock)

    async def put(self, key: str, data: Buffers, metadata: Mapping[str, str], *,
                  crc32c: int | None = None) -> ObjectInfo:
        return await self.inner.put(key, data, metadata, crc32c=crc32c)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        return await self.inner.get_range(key, start, end)

    async def head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix)

    def driver_properties(self) -> Mapping[str, str]:
        return self.inner.driver_properties()

    async def close(self) -> None:
        await self.inner.close()


# ---- figures -------------------------------------------------------------------------------

Sample = tuple[float, str, int]  # (time, topic, bytes)


def in_window(samples: list[Sample], start: float, end: float) -> list[Sample]:
    return sorted(s for s in samples if start <= s[0] < end)


def rate(samples: list[Sample], start: float, end: float) -> float:
    """Bytes per second of the samples in ``[start, end)``."""
    return sum(n for _, _, n in in_window(samples, start, end)) / (end - start)


def max_window(samples: list[Sample], width: float = 1.0) -> int:
    """Most bytes in any half-open window ``[t, t + width)`` starting at a sample (the windows
    that can hold the most start at one)."""
    ordered = sorted(samples)
    best = total = lo = 0
    for t, _, n in ordered:
        total += n
        while t >= ordered[lo][0] + width:
            total -= ordered[lo][2]
            lo += 1
        best = max(best, total)
    return best


def shares(samples: list[Sample]) -> dict[str, float]:
    """Each topic's fraction of the bytes."""
    per: dict[str, int] = defaultdict(int)
    for _, topic, n in samples:
        per[topic] += n
    total = sum(per.values())
    return {t: n / total for t, n in sorted(per.items())}

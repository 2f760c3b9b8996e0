"""The blob-store protocol: whole objects, uploaded in parts, read by byte range.

A driver never knows the formats: it stores bytes plus string user metadata. Every driver stores
the same objects (no driver-specific on-disk format for the bytes). An object becomes visible only
when its upload completes: a reader never sees half an object.

Parts: ``start_upload`` returns a :class:`MultipartUpload`; parts (numbered from 1, contiguous,
each given as a sequence of buffers so callers never join) may be uploaded concurrently and out of
order; ``complete()`` publishes the object; ``abort()`` discards it. ``put`` is the one-shot form
used for index objects.

Checksums: a caller that knows the CRC32C of a part's (or a ``put``'s) bytes passes it
(``crc32c=``): the uploader combines it from the blocks' own checksums (``offload/parts.py``).
A driver whose store checks what it receives sends it instead of reading the bytes again (S3's
``x-amz-checksum-crc32c``: a part whose bytes do not match it is refused); the memory driver
checks it, as S3 would; the filesystem driver ignores it. Without it a driver computes its own.

Errors: ``NotFound``, ``Retriable`` (transient; caller may retry), ``Fatal``, and ``Conflict``
from a create-only write whose key exists (below); nothing else.

Implementations: ``filesystem/``, ``s3/`` (aiobotocore), ``memory.py`` (unit tests).

Optional capabilities, each a protocol below. :class:`StoreView` carries a store with its
capabilities, each typed as its protocol; :mod:`offloadd.wiring` builds it (it built the store
and so knows its type: nobody probes an object for a method):

=====================  ===========================================  ==========================
capability             used by                                      implemented by
=====================  ===========================================  ==========================
``UploadSweeper``      the gc pass's sweep of stale uploads         filesystem, s3
``StoreHealthView``    ``/readyz``, ``/status``, the circuit gauge  ``health.StoreHealth``
``RequestCounts``      ``offloadd_blobstore_requests_total``,       ``requests.RequestCounts``
                       benchmarks                                   (filesystem, s3)
``WriteFence``         the store as a second fence (create-only     filesystem, s3
                       writes of index and data objects)
=====================  ===========================================  ==========================

The store as a second fence: once :meth:`WriteFence.probe_conditional_writes` found that the
store refuses to overwrite an existing key (S3's ``If-None-Match: *``, the filesystem's
``link(2)``), every ``put`` and every ``complete()`` of that store is create-only and an
existing key is refused with ``Conflict``: a zombie writer cannot replace a committed object even
if the catalog's fence were missed. Every object offloadd writes has a fresh key (a new uuid per
attempt), so nothing it does legitimately overwrites. Until probed, writes overwrite as before.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from offloadd.blobstore.requests import RequestCounts

Buffers = Sequence[bytes | bytearray | memoryview]


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    mtime: float = 0.0  # seconds since the epoch


@runtime_checkable
class MultipartUpload(Protocol):
    key: str

    async def put_part(self, part_number: int, offset: int, data: Buffers, *,
                       crc32c: int | None = None) -> None:
        """Upload part ``part_number`` (1-based) whose bytes start at ``offset`` of the object.
        ``crc32c``: the CRC32C of the bytes when the caller knows it (see the module
        docstring, "Checksums")."""
        ...

    async def complete(self) -> ObjectInfo: ...

    async def abort(self) -> None: ...


@runtime_checkable
class BlobStore(Protocol):
    name: str  # driver name as Pulsar writes it in OffloadDriverMetadata: "filesystem", "aws-s3"

    async def start_upload(self, key: str, metadata: Mapping[str, str]) -> MultipartUpload: ...

    async def put(self, key: str, data: Buffers, metadata: Mapping[str, str], *,
                  crc32c: int | None = None) -> ObjectInfo: ...

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; ``NotFound`` if absent; short only at the object's end."""
        ...

    async def head(self, key: str) -> ObjectInfo: ...

    async def delete(self, key: str) -> None:
        """Delete; deleting an absent key is not an error (idempotent retries)."""
        ...

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]: ...

    def driver_properties(self) -> Mapping[str, str]:
        """Pulsar's ``OffloadDriverMetadata`` properties (bucket, region, serviceEndpoint...)."""
        ...

    async def close(self) -> None: ...


# ---- optional capabilities (see the module docstring) -------------------------------------------

class UploadSweeper(Protocol):
    """A store whose incomplete uploads outlive the process that started them (S3 multipart
    uploads, the filesystem store's ``.uploads`` files)."""

    async def sweep_incomplete_uploads(self, older_than_s: float) -> int:
        """Discard uploads started more than ``older_than_s`` ago and never completed; how
        many were discarded."""
        ...


class StoreHealthView(Protocol):
    """A store's health circuit as the pipeline sees it (:class:`~offloadd.blobstore.health.
    StoreHealth`): the state the circuit gauge shows and the readiness ``/readyz`` answers."""

    @property
    def state(self) -> enum.Enum:
        """``.value`` is ``healthy``, ``degraded-paused`` or ``recovering``."""
        ...

    def readiness(self) -> tuple[bool, str]:
        """(ready, why): False while the circuit is open or the store refuses everything."""
        ...


# The probe's key (plus a random suffix): no object of the formats, and gc's orphan sweep
# removes one a process killed during its probe left behind.
PROBE_KEY_PREFIX = "offloadd-probe-"


@dataclass(frozen=True)
class ConditionalWrites:
    """What a store's writes refuse to overwrite, as its probe found (all False: not probed,
    or the store overwrites)."""

    put: bool = False  # put(): the index object, the commit marker
    complete: bool = False  # MultipartUpload.complete(): the data object
    how: str = "not probed"  # what the store does, for status and logs
    # the store answered the probe (False: not probed yet, or it was unreachable: ask again)
    answered: bool = False

    @property
    def on(self) -> bool:
        return self.put or self.complete

    def to_json(self) -> dict[str, object]:
        return {"on": self.on, "put": self.put, "complete": self.complete, "how": self.how,
                "answered": self.answered}


class WriteFence(Protocol):
    """A store whose writes can be made create-only (see the module docstring)."""

    conditional: ConditionalWrites

    async def probe_conditional_writes(self) -> ConditionalWrites:
        """Find out (with a key of ours, written twice, then deleted) whether the store
        refuses to overwrite; from then on its writes are create-only where it does."""
        ...


@dataclass(frozen=True)
class StoreView:
    """A blob store and its optional capabilities, each None when it has not got it (built by
    :mod:`offloadd.wiring`, which knows the driver)."""

    store: BlobStore
    health: StoreHealthView | None = None
    sweeper: UploadSweeper | None = None
    requests: RequestCounts | None = None  # what the driver sent, by operation and result
    fence: WriteFence | None = None

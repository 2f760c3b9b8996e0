"""In-memory blob store for unit tests, with a fault hook.

Objects are ``key → (bytes, metadata, mtime)``. Multipart uploads collect parts and publish the
joined bytes on ``complete()``, so an object is absent until then, as with every driver.

``fault`` (constructor argument or attribute, replaceable at any time) is called as
``fault(operation, key)`` before each operation — ``operation`` is one of ``start_upload``,
``put_part``, ``complete``, ``abort``, ``put``, ``get_range``, ``head``, ``delete``, ``list``
(``key`` is the prefix for ``list``). It may raise (say ``Retriable``) to inject a failure, and
may return an awaitable, which is awaited: a test can hold an operation mid-flight.

A CRC32C given with a part or a put (``crc32c=``) is checked against the bytes, as S3 checks
``x-amz-checksum-crc32c``: every test on this store checks the checksums the uploader derives.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from crc32c import crc32c as crc32c_of

from offloadd.blobstore.base import BlobStore, Buffers, MultipartUpload, ObjectInfo
from offloadd.blobstore.parts import check_part, check_parts, check_range
from offloadd.errors import Fatal, NotFound

FaultHook = Callable[[str, str], Awaitable[object] | None]


@dataclass(frozen=True)
class _Object:
    data: bytes
    metadata: Mapping[str, str]
    mtime: float

    def info(self, key: str) -> ObjectInfo:
        return ObjectInfo(key, len(self.data), self.metadata, self.mtime)


class MemoryBlobStore(BlobStore):
    name = "memory"

    def __init__(self, fault: FaultHook | None = None) -> None:
        self.fault = fault
        self.objects: dict[str, _Object] = {}

    async def _hook(self, operation: str, key: str) -> None:
        if self.fault is not None:
            result = self.fault(operation, key)
            if inspect.isawaitable(result):
                await result

    async def start_upload(self, key: str, metadata: Mapping[str, str]) -> MemoryUpload:
        await self._hook("start_upload", key)
        return MemoryUpload(self, key, dict(metadata))

    async def put(self, key: str, data: Buffers, metadata: Mapping[str, str], *,
                  crc32c: int | None = None) -> ObjectInfo:
        await self._hook("put", key)
        obj = _Object(_checked(f"put of {key}", b"".join(data), crc32c), dict(metadata),
                      time.time())
        self.objects[key] = obj
        return obj.info(key)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        await self._hook("get_range", key)
        check_range(key, start, end)
        return self._get(key).data[start:end]

    async def head(self, key: str) -> ObjectInfo:
        await self._hook("head", key)
        return self._get(key).info(key)

    async def delete(self, key: str) -> None:
        await self._hook("delete", key)
        self.objects.pop(key, None)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        await self._hook("list", prefix)
        for key in sorted(k for k in self.objects if k.startswith(prefix)):
            obj = self.objects.get(key)
            if obj is not None:  # deleted while the caller was iterating
                yield ObjectInfo(key, len(obj.data), {}, obj.mtime)

    def driver_properties(self) -> Mapping[str, str]:
        return {"managedLedgerOffloadDriver": self.name}

    async def close(self) -> None:
        pass

    def _get(self, key: str) -> _Object:
        obj = self.objects.get(key)
        if obj is None:
            raise NotFound(f"object {key} does not exist")
        return obj


class MemoryUpload(MultipartUpload):
    def __init__(self, store: MemoryBlobStore, key: str, metadata: dict[str, str]) -> None:
        self.key = key
        self._store = store
        self._metadata = metadata
        self._parts: dict[int, tuple[int, bytes]] = {}
        self._state = "open"

    async def put_part(self, part_number: int, offset: int, data: Buffers, *,
                       crc32c: int | None = None) -> None:
        await self._store._hook("put_part", self.key)
        self._check_open()
        check_part(f"upload of {self.key}", part_number, offset)
        # Copied: the caller may reuse its buffers once this returns.
        self._parts[part_number] = (offset, _checked(f"upload of {self.key} part {part_number}",
                                                     b"".join(data), crc32c))

    async def complete(self) -> ObjectInfo:
        await self._store._hook("complete", self.key)
        self._check_open()
        check_parts(f"upload of {self.key}",
                    {n: (off, len(b)) for n, (off, b) in self._parts.items()})
        data = b"".join(b for _, (_, b) in sorted(self._parts.items()))
        self._state = "completed"
        obj = _Object(data, self._metadata, time.time())
        self._store.objects[self.key] = obj
        return obj.info(self.key)

    async def abort(self) -> None:
        await self._store._hook("abort", self.key)
        if self._state == "open":
            self._state = "aborted"
            self._parts.clear()

    def _check_open(self) -> None:
        if self._state != "open":
            raise Fatal(f"upload of {self.key} is already {self._state}")


def _checked(what: str, data: bytes, crc: int | None) -> bytes:
    """``data``, if it matches the CRC32C its writer gave (S3 refuses a body that does not:
    ``BadDigest``); a wrong one is a bug of the writer, so here it is ``Fatal``."""
    if crc is not None and (got := crc32c_of(data)) != crc:
        raise Fatal(f"{what}: BadDigest: the bytes' CRC32C is {got:08x}, the writer said "
                    f"{crc:08x}")
    return data

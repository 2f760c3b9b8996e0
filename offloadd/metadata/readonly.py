"""A metadata store that refuses every write, for the commands that only look.

``offloadd status``, ``verify`` and ``read`` open the store through this wrapper, so no code path
under them (a helper that "just creates the parent", a source that mirrors something) can change
the catalog: a write raises :class:`~offloadd.errors.Fatal` naming the command's promise instead.
Reads pass through, batched ones too (one by one when the wrapped store has no batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offloadd.errors import Fatal, NotFound
from offloadd.metadata.base import BatchedReads, MetadataStore, Op, Versioned

__all__ = ["ReadOnlyMetadataStore"]


class ReadOnlyMetadataStore(MetadataStore):
    """Wraps ``inner``; ``close()`` closes it."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner

    def _refuse(self, what: str, path: str) -> Fatal:
        return Fatal(f"{what} {path}: this command opened the metadata store read-only and "
                     "never changes it")

    async def get(self, path: str) -> Versioned:
        return await self.inner.get(path)

    async def exists(self, path: str) -> bool:
        return await self.inner.exists(path)

    async def children(self, path: str) -> list[str]:
        return await self.inner.children(path)

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        raise self._refuse("create", path)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        raise self._refuse("set", path)

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        raise self._refuse("delete", path)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        raise self._refuse("multi", ops[0].path if ops else "/")

    async def multi_batch(self, groups: Sequence[Sequence[Op]]) -> list[Any]:
        raise self._refuse("multi_batch", groups[0][0].path if groups and groups[0] else "/")

    async def close(self) -> None:
        await self.inner.close()

    async def get_many(self, paths: Sequence[str]) -> list[Versioned | None]:
        """Batched reads when the wrapped store has them, one read after another if not."""
        if isinstance(self.inner, BatchedReads):
            return await self.inner.get_many(paths)
        out: list[Versioned | None] = []
        for path in paths:
            try:
                out.append(await self.inner.get(path))
            except NotFound:
                out.append(None)
        return out

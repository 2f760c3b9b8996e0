"""What every metadata store shares: ZooKeeper's node paths, and a multi's ops in order."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from offloadd.errors import Conflict, Fatal, NotFound
from offloadd.metadata.base import Op


def check_path(path: str) -> None:
    """Reject what ZooKeeper rejects: relative paths, trailing ``/``, empty components."""
    if not isinstance(path, str) or not path.startswith("/") or (
            path != "/" and (path.endswith("/") or "//" in path)):
        raise Fatal(f"invalid metadata path {path!r}: must be absolute, no empty components")


def parent_of(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def apply_all(ops: Sequence[Op],
              apply: Callable[[Op], int | str | None]) -> list[int | str | None]:
    """A ``multi``'s ops applied in order; the error of the one that fails names its index and
    the op (the caller discards what the earlier ones did)."""
    results: list[int | str | None] = []
    for i, op in enumerate(ops):
        try:
            results.append(apply(op))
        except (Conflict, NotFound, Fatal) as e:
            raise type(e)(f"multi op {i} {op!r} failed: {e}") from e
    return results

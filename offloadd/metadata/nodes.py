"""Node paths as ZooKeeper takes them, for every metadata store: absolute, no empty components."""

from __future__ import annotations

from offloadd.errors import Fatal


def check_path(path: str) -> None:
    """Reject what ZooKeeper rejects: relative paths, trailing ``/``, empty components."""
    if not isinstance(path, str) or not path.startswith("/") or (
            path != "/" and (path.endswith("/") or "//" in path)):
        raise Fatal(f"invalid metadata path {path!r}: must be absolute, no empty components")


def parent_of(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"

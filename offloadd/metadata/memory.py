"""In-process metadata store with ZooKeeper's semantics, for unit tests.

State is a :class:`MemoryTree` (path → node); each :class:`MemoryMetadataStore` is one session
on a tree. ``MemoryMetadataStore()`` makes a private tree; ``store.session()`` opens another
session on the same tree, which is how tests see another client's ephemerals vanish on
``close()``.

Semantics copied from ZooKeeper: versions start at 0 and grow by one per ``set``; ``/`` always
exists and cannot be deleted; sequential creates append the parent's child-change counter
(``cversion``) as 10 zero-padded digits; ephemeral nodes cannot have children; ``multi`` ops
see the effects of earlier ops in the same call and create no parents.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from offloadd.errors import Conflict, Fatal, NotFound
from offloadd.metadata.base import CheckOp, CreateOp, DeleteOp, MetadataStore, Op, SetOp, Versioned
from offloadd.metadata.nodes import apply_all, check_path, parent_of

_sessions = itertools.count(1)


@dataclass(frozen=True)
class _Node:
    data: bytes
    version: int = 0
    cversion: int = 0
    owner: int = 0  # session id of an ephemeral node's creator; 0 = persistent


@dataclass
class MemoryTree:
    nodes: dict[str, _Node] = field(default_factory=lambda: {"/": _Node(b"")})


def _child_prefix(path: str) -> str:
    return "/" if path == "/" else path + "/"


class MemoryMetadataStore(MetadataStore):
    def __init__(self, tree: MemoryTree | None = None) -> None:
        self._tree = tree if tree is not None else MemoryTree()
        self._session = next(_sessions)
        self._closed = False

    def session(self) -> MemoryMetadataStore:
        """Another client session on the same tree."""
        return MemoryMetadataStore(self._tree)

    # -- the protocol ---------------------------------------------------------------------

    async def get(self, path: str) -> Versioned:
        self._open()
        node = self._node(self._tree.nodes, path)
        return Versioned(node.data, node.version)

    async def exists(self, path: str) -> bool:
        self._open()
        check_path(path)
        return path in self._tree.nodes

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False,
                     sequential: bool = False, make_parents: bool = True) -> str:
        self._open()
        check_path(path)
        nodes = self._tree.nodes
        if make_parents:
            missing: list[str] = []
            p = parent_of(path)
            while p not in nodes:
                missing.append(p)
                p = parent_of(p)
            for p in reversed(missing):
                self._create(nodes, p, b"", ephemeral=False, sequential=False)
        return self._create(nodes, path, data, ephemeral=ephemeral, sequential=sequential)

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        self._open()
        return self._set(self._tree.nodes, path, data, version)

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        self._open()
        self._delete(self._tree.nodes, path, version, recursive=recursive)

    async def children(self, path: str) -> list[str]:
        self._open()
        self._node(self._tree.nodes, path)
        return self._children(self._tree.nodes, path)

    async def multi(self, ops: Sequence[Op]) -> list[int | str | None]:
        self._open()
        # Nodes are immutable, so a shallow copy is a snapshot; it is swapped in only if
        # every op succeeds.
        staged = dict(self._tree.nodes)
        results = apply_all(ops, lambda op: self._apply(staged, op))
        self._tree.nodes = staged
        return results

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        nodes = self._tree.nodes
        for path in [p for p, n in nodes.items() if n.owner == self._session]:
            self._delete(nodes, path, -1, recursive=False)

    # -- the operations on a node map ----------------------------------------------------

    def _open(self) -> None:
        if self._closed:
            raise Fatal("metadata store session is closed")

    def _node(self, nodes: dict[str, _Node], path: str) -> _Node:
        check_path(path)
        node = nodes.get(path)
        if node is None:
            raise NotFound(f"metadata node {path} does not exist")
        return node

    @staticmethod
    def _children(nodes: dict[str, _Node], path: str) -> list[str]:
        prefix = _child_prefix(path)
        return sorted(p[len(prefix):] for p in nodes
                      if p != "/" and p.startswith(prefix) and "/" not in p[len(prefix):])

    def _create(self, nodes: dict[str, _Node], path: str, data: bytes, *,
                ephemeral: bool, sequential: bool) -> str:
        check_path(path)
        if path == "/":
            raise Conflict("metadata node / already exists")
        ppath = parent_of(path)
        parent = nodes.get(ppath)
        if parent is None:
            raise NotFound(f"parent {ppath} of metadata node {path} does not exist")
        if parent.owner:
            raise Fatal(f"cannot create {path}: parent {ppath} is ephemeral")
        if sequential:
            path = f"{path}{parent.cversion:010d}"
        if path in nodes:
            raise Conflict(f"metadata node {path} already exists")
        nodes[ppath] = replace(parent, cversion=parent.cversion + 1)
        nodes[path] = _Node(bytes(data), owner=self._session if ephemeral else 0)
        return path

    def _set(self, nodes: dict[str, _Node], path: str, data: bytes, version: int) -> int:
        node = self._node(nodes, path)
        if version != -1 and version != node.version:
            raise Conflict(f"metadata node {path} is at version {node.version}, not {version}")
        nodes[path] = replace(node, data=bytes(data), version=node.version + 1)
        return node.version + 1

    def _delete(self, nodes: dict[str, _Node], path: str, version: int, *,
                recursive: bool) -> None:
        node = self._node(nodes, path)
        if path == "/":
            raise Fatal("the root metadata node cannot be deleted")
        if version != -1 and version != node.version:
            raise Conflict(f"metadata node {path} is at version {node.version}, not {version}")
        kids = self._children(nodes, path)
        if kids and not recursive:
            raise Conflict(f"metadata node {path} has children ({len(kids)}); not deleting")
        prefix = _child_prefix(path)
        for p in [p for p in nodes if p.startswith(prefix)]:
            del nodes[p]
        del nodes[path]
        ppath = parent_of(path)
        parent = nodes[ppath]
        nodes[ppath] = replace(parent, cversion=parent.cversion + 1)

    def _apply(self, nodes: dict[str, _Node], op: Op) -> int | str | None:
        if isinstance(op, CreateOp):
            return self._create(nodes, op.path, op.data, ephemeral=op.ephemeral,
                                sequential=False)
        if isinstance(op, SetOp):
            return self._set(nodes, op.path, op.data, op.version)
        if isinstance(op, DeleteOp):
            self._delete(nodes, op.path, op.version, recursive=False)
            return None
        if isinstance(op, CheckOp):
            node = self._node(nodes, op.path)
            if op.version != -1 and node.version != op.version:
                raise Conflict(f"metadata node {op.path} is at version {node.version}, "
                               f"not {op.version}")
            return None
        raise Fatal(f"unknown metadata op {op!r}")

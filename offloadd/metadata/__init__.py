"""Metadata stores: the protocol plus the implementations that need only the standard library.

The ZooKeeper store lives in :mod:`offloadd.metadata.zookeeper` and is imported from there, so
importing this package never pulls in kazoo.
"""

from offloadd.metadata.base import (
    CheckOp,
    CreateOp,
    DeleteOp,
    MetadataStore,
    Op,
    SetOp,
    Versioned,
)
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.metadata.memory import MemoryMetadataStore

__all__ = [
    "CheckOp",
    "CreateOp",
    "DeleteOp",
    "EmbeddedMetadataStore",
    "MemoryMetadataStore",
    "MetadataStore",
    "Op",
    "SetOp",
    "Versioned",
]

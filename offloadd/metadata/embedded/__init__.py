"""Embedded metadata store: one SQLite file shared by the processes of one machine.

Semantics are ZooKeeper's, as in :mod:`offloadd.metadata.memory`. Every write is one
``BEGIN IMMEDIATE`` transaction (read, check, write under SQLite's write lock), so
compare-and-set holds across processes. A store instance is a session: ``close()`` deletes its
ephemeral nodes, and any store removes ephemerals whose owning process is gone before each
operation, which makes "session ends when the process dies" true without a server.

Every call runs in a worker thread (``asyncio.to_thread``); one connection per store, used under a
lock.

============  ==========================================================================
module        job
============  ==========================================================================
``database``  the file, its schema, connections, transactions, sqlite3 errors translated
``tree``      ZooKeeper's node semantics on the ``nodes`` table
``owners``    who owns ephemeral nodes, and whether that process still lives
``store``     :class:`EmbeddedMetadataStore`: a session, the protocol
============  ==========================================================================
"""

from offloadd.metadata.embedded.store import EmbeddedMetadataStore

__all__ = ["EmbeddedMetadataStore"]

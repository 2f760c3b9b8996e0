"""The :class:`~offloadd.metadata.base.MetadataStore` on ZooKeeper, through kazoo, in asyncio.

URL: ``zk://host1:2181,host2:2181/chroot`` (port defaults to 2181, ``[v6addr]:port`` allowed,
chroot optional). Every path the store is given is under the chroot, which
:meth:`ZooKeeperMetadataStore.open` creates when missing (with the store's ACL). The chroot is
applied here, not by kazoo, so error messages name the store-relative path the caller used.

Nothing from kazoo escapes (see :mod:`.errors`): callers see ``NotFound``, ``Conflict``,
``Retriable`` and ``Fatal``.

Ambiguous writes. A ``Retriable`` from a write (``create``/``set``/``delete``/``multi``) means the
outcome is unknown: the request may have been applied before the connection dropped, and a
request still queued in kazoo when the per-call timeout fires may even be sent after the
reconnect. Callers must re-read and decide, never blindly repeat: a compare-and-set repeated at the
old version fails with ``Conflict`` if the first attempt landed (the re-read shows it did); a
``create`` repeated after success fails with ``Conflict`` (read the node to see whether it is
ours); an ephemeral create is ours only if the node's owner session is ours, so ownership code
compares the stored owner id. Reads are always safe to retry.

===========  ============================================================================
module       job
===========  ============================================================================
``url``      :class:`ZooKeeperUrl`: hosts and chroot
``acl``      :class:`DigestAcl`, and each client's kazoo logger redacting its secrets
``errors``   kazoo's exceptions mapped to the error tree; a failed ``multi`` op described
``bridge``   kazoo's threads into the event loop: calls, events, callbacks
``session``  :class:`SessionState` and the session as the loop sees it, with its listeners
``watch``    :class:`Watch`: level-triggered, surviving reconnects and session loss
``store``    :class:`ZooKeeperMetadataStore`: open/close, the protocol's operations
===========  ============================================================================
"""

from offloadd.metadata.zookeeper.acl import DigestAcl
from offloadd.metadata.zookeeper.session import SessionListener, SessionState
from offloadd.metadata.zookeeper.store import ZooKeeperMetadataStore
from offloadd.metadata.zookeeper.url import DEFAULT_PORT, ZooKeeperUrl
from offloadd.metadata.zookeeper.watch import ChildrenCallback, DataCallback, Watch

__all__ = [
    "DEFAULT_PORT",
    "ChildrenCallback",
    "DataCallback",
    "DigestAcl",
    "SessionListener",
    "SessionState",
    "Watch",
    "ZooKeeperMetadataStore",
    "ZooKeeperUrl",
]

"""The BookKeeper ledger source: offloadd as a sidecar of an existing Pulsar cluster.

Modules, pure: :mod:`.codec` (framing, status codes, entry bodies and digests), :mod:`.v2` and
:mod:`.v3` (the two wire protocols, read side), :mod:`.replicas` (bookie health and rank, read
plans), :mod:`.layout` (where Pulsar and BookKeeper keep metadata, the mirror edit),
:mod:`.options`. With I/O: :mod:`.connection` (one connection to a bookie), :mod:`.client` (the
bookies: protocol per bookie, failover), :mod:`.stream` (pipelined reads of a ledger, framing),
:mod:`.ledgers` (one ledger's state), :mod:`.tail` (an open ledger's last-add-confirmed),
:mod:`.zk` (read-only access to Pulsar's ZooKeeper), :mod:`.names` (the topic names, from
children watches), :mod:`.topics` (a watched topic's state, which topics list which ledger),
:mod:`.metrics`, :mod:`.source` (the :class:`~offloadd.ledger.base.LedgerSource`).
See ``docs/sidecar.md``.
"""

from offloadd.ledger.bookkeeper.client import BookieClient, ClientOptions
from offloadd.ledger.bookkeeper.connection import BookieError
from offloadd.ledger.bookkeeper.metrics import BookKeeperMetrics
from offloadd.ledger.bookkeeper.options import BookKeeperOptions
from offloadd.ledger.bookkeeper.replicas import ReplicaPolicy
from offloadd.ledger.bookkeeper.source import BookKeeperLedgerSource
from offloadd.model.losses import LostLedger, lost_ledgers

__all__ = [
    "BookKeeperLedgerSource",
    "BookKeeperMetrics",
    "BookKeeperOptions",
    "BookieClient",
    "BookieError",
    "ClientOptions",
    "LostLedger",
    "ReplicaPolicy",
    "lost_ledgers",
]

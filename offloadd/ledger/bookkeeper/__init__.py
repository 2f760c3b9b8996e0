"""The BookKeeper ledger source: offloadd as a sidecar of an existing Pulsar cluster.

Modules: :mod:`.codec` (wire protocol v3/v2 and entry bodies, pure), :mod:`.layout` (where
Pulsar and BookKeeper keep metadata, the mirror edit, pure), :mod:`.zk` (read-only access to
Pulsar's ZooKeeper), :mod:`.client` (bookie connections, replica choice, failover),
:mod:`.metrics`, :mod:`.source` (the :class:`~offloadd.ledger.base.LedgerSource`).
See ``docs/sidecar.md``.
"""

from offloadd.ledger.bookkeeper.client import BookieClient, BookieError, ClientOptions
from offloadd.ledger.bookkeeper.metrics import BookKeeperMetrics
from offloadd.ledger.bookkeeper.source import BookKeeperLedgerSource, BookKeeperOptions
from offloadd.model.losses import LostLedger, lost_ledgers

__all__ = [
    "BookKeeperLedgerSource",
    "BookKeeperMetrics",
    "BookKeeperOptions",
    "BookieClient",
    "BookieError",
    "ClientOptions",
    "LostLedger",
    "lost_ledgers",
]

"""The daemon's read-back check: can what was just committed be read from the tier?

Every ``[offload] read_check_interval_s`` (default 60 s; 0 turns it off), for each topic that
committed something since the last check, the daemon reads the newest committed segment's index
and the head of its last block back through :class:`~offloadd.read.reader.TierReader`
(:meth:`~offloadd.read.reader.TierReader.check_segment`: a few KiB). It catches what uploads
cannot show — a bucket policy that allows PUT but not GET, a KMS key the daemon may encrypt
with but not decrypt, a proxy that mangles bytes — before a consumer needs the data, and it
feeds Pulsar's read series for the topic (``brk_ledgeroffloader_read_offload_index_latency``,
``_data_latency``, ``_read_offload_error``, ``_read_offload_rate``, ``_read_bytes``,
``offloadd_read_duration_seconds``). A failed check is logged and counted, and tried again next
interval; it changes nothing in the tier or the metadata.
"""

from __future__ import annotations

from collections.abc import Callable

from offloadd.blobstore.base import BlobStore
from offloadd.metadata import managed_ledger
from offloadd.metadata.base import MetadataStore
from offloadd.model import TopicName, catalog
from offloadd.model.catalog import Segment
from offloadd.read.reader import ReadProbe, TierReader

__all__ = ["read_back"]


class _Counting:
    """A probe that passes every report on and counts the errors it reported, and the
    GET-class requests and bytes of the reads (an index read is a HEAD and a GET)."""

    def __init__(self, probe: ReadProbe) -> None:
        self._probe = probe
        self.errors = 0
        self.requests = 0
        self.nbytes = 0

    def index_read(self, seconds: float) -> None:
        self.requests += 2
        self._probe.index_read(seconds)

    def data_read(self, seconds: float) -> None:
        self.requests += 1
        self._probe.data_read(seconds)

    def read_offload(self, nbytes: int) -> None:
        self.nbytes += nbytes
        self._probe.read_offload(nbytes)

    def read_error(self) -> None:
        self.errors += 1
        self._probe.read_error()

    def reread(self) -> None:
        self._probe.reread()


async def read_back(metadata: MetadataStore, blobstore: BlobStore, topic: TopicName,
                    probe: ReadProbe, *, head_bytes: int = 64 * 1024,
                    on_requests: Callable[[int, int], None] | None = None) -> Segment | None:
    """Check the newest committed segment of ``topic`` (None when it has none). A failure to
    read the tier counts once in ``probe.read_error`` and raises; a metadata failure only
    raises (it is not a tier read). ``on_requests(requests, nbytes)`` hears the GET-class
    requests the check made that were answered."""
    info, _ = await managed_ledger.load(metadata, topic.managed_ledger)
    done = [s for s in catalog.segments(info) if s.complete]
    if not done:
        return None
    seg = done[-1]
    counting = _Counting(probe)
    reader = TierReader(metadata, blobstore, prefetch=0, index_cache=1, probe=counting)
    try:
        await reader.check_segment(seg, head_bytes)
    except Exception:
        if counting.errors == 0:  # e.g. a structural error of the index found past decoding
            counting.read_error()
        raise
    finally:
        if on_requests is not None:
            on_requests(counting.requests, counting.nbytes)
    return seg

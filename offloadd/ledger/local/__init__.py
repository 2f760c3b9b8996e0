"""The embedded managed-ledger store: a writer and a :class:`LedgerSource` over plain files.

Layout under the data directory (besides the lock files and the change journal ``changes``,
:mod:`.journal`), five files per ledger (ids are global, so files are not
grouped by topic; the topic → ledgers mapping lives in the metadata store)::

    <ledgerId:020d>.log   frames, back to back, exactly as blocks frame them (big-endian):
                          [int32 payload length][int64 entryId][payload]
    <ledgerId:020d>.crc   uint32 little-endian CRC32C of each payload, one per entry
    <ledgerId:020d>.sum   uint32 little-endian CRC32C of each complete 64 KiB chunk of .log
                          (bytes k*65536 .. (k+1)*65536), one per chunk
    <ledgerId:020d>.osum  the same for each complete 1 KiB chunk (128 records) of .off
    <ledgerId:020d>.off   int64 little-endian offset in .log where each frame starts

The number of readable entries is the number of *complete* 8-byte records of ``.off`` whose frames
end within ``.log``. A batch is written ``.log`` first, then ``.crc``, ``.sum`` and ``.osum``,
then ``.off``, each with one positional write; so a reader in any process that trusts only whole
``.off`` records never sees a torn entry, and the checksums of everything it can see are already
there. A block payload is therefore one byte range of ``.log``: :meth:`LocalLedgerSource.read`
cuts it by bisecting ``.off`` and reads it with one ``pread``, with no Python work per entry.

Reads are checked against the checksums by default (``verify_crc``): bit rot in a ledger file
must fail the read, not be uploaded under a fresh, valid block checksum. Checking each entry's
CRC32C costs a few C calls per entry (~0.3 CPU-s/GiB at 1 KiB entries, more than the whole
offload path); the chunk records make it one CRC pass over the bytes just read, in the reading
thread: a run's frames are checked chunk by chunk against ``.sum`` and the offsets that cut them
against ``.osum`` (reading at most a chunk more at each end), and only where no chunk record
covers them — the tail of a ledger still being written, a ledger written before the records
existed — entry by entry (frame header and payload CRC32C). A chunk that does not match is then
checked entry by entry too, so the error names the entry.

Metadata, in Pulsar's layout: ``/managed-ledgers/<ml name>`` holds the topic's
``ManagedLedgerInfo``; the writer appends ``LedgerInfo(ledgerId, timestamp=ctime ms)`` when it
opens a ledger and sets ``entries``/``size`` (payload bytes) when it closes it, always by
compare-and-set so the offloader's concurrent ``offloadContext`` edits survive. A ledger is open
while its ``LedgerInfo`` has no ``entries``; only the last one can be. Ledger ids come from the
counter node ``/offloadd/ledger-id`` (the next unreserved id, ASCII decimal), reserved in ranges
by CAS: ids are unique across topics and processes and never reused, even after a crash, and every
new ledger of a topic gets an id above the topic's previous ledgers (ledgers are ordered by id).

One writer process per store: the commands that write (``standalone``, ``produce``) hold the
store's *writer lock* (:class:`StoreLock`), so a second one is refused instead of closing the
first one's open ledgers under it. A writer that finds a topic's last ledger still open (its
previous writer died) closes it at the last whole entry on disk, cutting torn bytes (and the
records of chunks they completed) off its files, before opening a new one.

Durability: writes reach the page cache, which survives a process crash; ``sync=True`` adds an
``fdatasync`` per batch for power loss.

Modules, one job each:

=============  ===========================================================================
``records``    the records' layouts, computed without I/O (frames, offsets, chunk CRCs)
``files``      one ledger's five files and the blocking I/O on them (scan, cut a torn tail)
``check``      a run read back, checked against the chunk and entry checksums
``meta``       the store's records in the metadata store: open ledgers, the id counter
``lock``       the writer and offloader locks (:class:`StoreLock`)
``notifier``   in-process heads, so a reader beside the writer waits without polling
``journal``    the change journal a writer keeps for readers in other processes
``watch``      one watcher per source that reads the journal and wakes the topics it names
``source``     :class:`LocalLedgerSource`, the :class:`~offloadd.ledger.base.LedgerSource`
``writer``     :class:`LocalLedgerWriter` and its :class:`RolloverPolicy`
``store``      :class:`LocalLedgerStore`: a writer and a source sharing one notifier
=============  ===========================================================================
"""

from offloadd.ledger.local.files import LedgerFiles, ledger_files
from offloadd.ledger.local.lock import StoreLock
from offloadd.ledger.local.notifier import LedgerNotifier
from offloadd.ledger.local.records import CHUNK, OFF_CHUNK, chunk_sums, frame_entries
from offloadd.ledger.local.source import LocalLedgerSource
from offloadd.ledger.local.store import LocalLedgerStore
from offloadd.ledger.local.writer import DEFAULT_MAX_ENTRY_BYTES, LocalLedgerWriter, RolloverPolicy

__all__ = [
    "CHUNK",
    "DEFAULT_MAX_ENTRY_BYTES",
    "OFF_CHUNK",
    "LedgerFiles",
    "LedgerNotifier",
    "LocalLedgerSource",
    "LocalLedgerStore",
    "LocalLedgerWriter",
    "RolloverPolicy",
    "StoreLock",
    "chunk_sums",
    "frame_entries",
    "ledger_files",
]

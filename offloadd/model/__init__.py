"""The pure model every stage shares: values and their operations, no I/O.

==================  ==========================================================================
``positions.py``    ``Position`` (``ledgerId:entryId``), ``TopicName``, ``LedgerDesc``
``frames.py``       ``EntryRun``: entries framed as blocks frame them; the frame header
``catalog.py``      ``Segment`` and the pure edits of ``ManagedLedgerInfo``'s offload records
``keys.py``         every object key and metadata path, built and parsed
``objects.py``      the user metadata of the objects offloadd writes
``losses.py``       entries a Pulsar cluster deleted before offloadd held them
``sizes.py``        sizes with units (``"64MiB"``, ``"2MB"``): parsed and shown
==================  ==========================================================================

Imports nothing of offloadd but :mod:`offloadd.errors` and the generated protobuf classes
(an import-linter contract in ``pyproject.toml`` says so).
"""

from offloadd.model.frames import FRAME, FRAME_OVERHEAD, EntryRun, PieceSums
from offloadd.model.positions import INT64_MAX, LedgerDesc, LedgerState, Position, TopicName

__all__ = [
    "FRAME",
    "FRAME_OVERHEAD",
    "INT64_MAX",
    "EntryRun",
    "LedgerDesc",
    "LedgerState",
    "PieceSums",
    "Position",
    "TopicName",
]

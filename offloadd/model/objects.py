"""User metadata of the objects offloadd writes (Pulsar's keys and values; docs/design.md
"Formats"), in one place.

Every data and index object carries::

    s3managedledgeroffloaderformatversion  "1"         Pulsar's readers refuse objects without it
    role                                   data|index
    managedledgername                      <tenant>/<ns>/persistent/<topic>
    offloadd-format-version                "1"
    offloadd-version                       the writing software's version
    offloadd-block-checksum                "crc32c": every block carries its CRC32C (header
                                           bytes 36..43, ``format/checksum.py``)

and an index, written last, adds what :mod:`offloadd.read.verify` checks the pair with (the data
object's blocks carry their own CRC32C in their headers, see ``format/checksum.py``)::

    offloadd-data-length    the data object's length in bytes (decimal)
    offloadd-crc32c         CRC32C of the index object itself, 8 lowercase hex digits

A reader decides from this metadata, never from a block's own bytes, whether a block must carry
a checksum (objects offloadd wrote before the key existed carry ``offloadd-format-version``,
and always stamped every block: either key means "required").

The streaming pipeline and the Spark backfill both write their objects through
``offload/attempt.py``, so they write identical keys through these helpers.
"""

from __future__ import annotations

from collections.abc import Mapping

import crc32c

from offloadd import __version__

FORMAT_VERSION_KEY = "s3managedledgeroffloaderformatversion"
BLOCK_CHECKSUM_KEY = "offloadd-block-checksum"


def object_metadata(ml_name: str, role: str) -> dict[str, str]:
    """The keys every object of ``ml_name`` carries; ``role`` is ``data`` or ``index``."""
    return {
        FORMAT_VERSION_KEY: "1",
        "role": role,
        "managedledgername": ml_name,
        "offloadd-format-version": "1",
        "offloadd-version": __version__,
        BLOCK_CHECKSUM_KEY: "crc32c",
    }


def blocks_checksummed(metadata: Mapping[str, str]) -> bool:
    """Whether every block of the object pair carries a CRC32C, by its (index's) metadata."""
    return BLOCK_CHECKSUM_KEY in metadata or "offloadd-format-version" in metadata


def index_metadata(ml_name: str, *, data_length: int, index: bytes) -> dict[str, str]:
    """An index object's keys: the common ones plus the pair's length and checksum."""
    meta = object_metadata(ml_name, "index")
    meta["offloadd-data-length"] = str(data_length)
    meta["offloadd-crc32c"] = f"{crc32c.crc32c(index):08x}"
    return meta

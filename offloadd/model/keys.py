"""Every object key and metadata path, built and parsed in one place.

Object keys follow Pulsar's offloaders (``DataBlockUtils``):

=====================================  ===============================================
``<uuid>``                     streaming data object (PIP-76)
``<uuid>-index``               streaming index
``<uuid>-ledger-<ledgerId>``   ledger-based data object (PIP-17)
``<uuid>-ledger-<id>-index``   ledger-based index
=============================  ===============================================

A blob-store driver may keep every object under a prefix of its own (``[blobstore] prefix`` on
aws-s3): it prepends it to the keys it is given and strips it from those it lists, so the keys
here never carry it.

Metadata paths (relative to the store's root/chroot):

=========================================  ==========================================
``/managed-ledgers/<ml name>``             ``ManagedLedgerInfo`` (Pulsar's)
``/offloadd/topics/<ml name>``             the daemon's per-topic state (epoch, owner)
``/offloadd/owners/<ml name>``             ephemeral owner node
``/offloadd/status/<ml name>``             the owner's offload status of the topic (JSON)
``/offloadd/segments/<ml name>/<uuid>``    retention's record of a committed segment
``/offloadd/deletions/<uuid>``             pending deletion records
``/offloadd/ledger-id``                    global ledger-id counter of the embedded store
``/offloadd/tier/conditional-writes``      the last start-up probe of the store's create-only writes
=========================================  ==========================================
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

MANAGED_LEDGERS = "/managed-ledgers"
OFFLOADD_ROOT = "/offloadd"
LEDGER_ID_COUNTER = f"{OFFLOADD_ROOT}/ledger-id"


def managed_ledger_path(ml_name: str) -> str:
    return f"{MANAGED_LEDGERS}/{ml_name}"


def topic_state_path(ml_name: str) -> str:
    return f"{OFFLOADD_ROOT}/topics/{ml_name}"


def owner_path(ml_name: str) -> str:
    return f"{OFFLOADD_ROOT}/owners/{ml_name}"


def offload_status_path(ml_name: str) -> str:
    return f"{OFFLOADD_ROOT}/status/{ml_name}"


def deletion_path(uid: uuid.UUID) -> str:
    return f"{OFFLOADD_ROOT}/deletions/{uid}"


DELETIONS = f"{OFFLOADD_ROOT}/deletions"  # parent of every deletion_path()
SEGMENT_RECORDS = f"{OFFLOADD_ROOT}/segments"
CONDITIONAL_WRITES = f"{OFFLOADD_ROOT}/tier/conditional-writes"  # JSON, written at start-up


def segment_records_path(ml_name: str) -> str:
    """Parent of a topic's segment records (see :mod:`offloadd.retention`)."""
    return f"{SEGMENT_RECORDS}/{ml_name}"


def segment_record_path(ml_name: str, uid: uuid.UUID) -> str:
    return f"{SEGMENT_RECORDS}/{ml_name}/{uid}"


def streaming_data_key(uid: uuid.UUID) -> str:
    return f"{uid}"


def streaming_index_key(uid: uuid.UUID) -> str:
    return f"{uid}-index"


def ledger_data_key(uid: uuid.UUID, ledger_id: int) -> str:
    return f"{uid}-ledger-{ledger_id}"


def ledger_index_key(uid: uuid.UUID, ledger_id: int) -> str:
    return f"{uid}-ledger-{ledger_id}-index"


def segment_key_pairs(uid: uuid.UUID,
                      ledger_ids: Iterable[int] | None = None) -> list[tuple[str, str]]:
    """The (index, data) key pairs of the objects under ``uid``: the streaming pair when
    ``ledger_ids`` is None, else one ledger-based pair per ledger."""
    if ledger_ids is None:
        return [(streaming_index_key(uid), streaming_data_key(uid))]
    return [(ledger_index_key(uid, lid), ledger_data_key(uid, lid)) for lid in ledger_ids]


def segment_keys(uid: uuid.UUID, ledger_ids: Iterable[int] | None = None) -> list[str]:
    """:func:`segment_key_pairs` flattened, each index before its data: the index is written
    last and is the commit marker, so deleting in this order leaves a half-deleted pair looking
    abandoned, never committed with its data missing."""
    return [key for pair in segment_key_pairs(uid, ledger_ids) for key in pair]


_KEY_RE = re.compile(
    r"^(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
    r"(?:-ledger-(?P<ledger>-?\d+))?(?P<index>-index)?$"
)


@dataclass(frozen=True)
class ParsedKey:
    uid: uuid.UUID
    ledger_id: int | None  # set for ledger-based (PIP-17) objects
    is_index: bool

    @property
    def streaming(self) -> bool:
        return self.ledger_id is None


def parse_key(key: str) -> ParsedKey | None:
    """Inverse of the ``*_key`` builders; ``None`` for keys that are not ours."""
    m = _KEY_RE.match(key)
    if not m:
        return None
    ledger = m.group("ledger")
    return ParsedKey(uuid.UUID(m.group("uuid")), int(ledger) if ledger is not None else None,
                     m.group("index") is not None)


def uuid_to_msb_lsb(uid: uuid.UUID) -> tuple[int, int]:
    """Split a uuid into the signed int64 halves Pulsar stores (``uidMsb``, ``uidLsb``)."""
    v = uid.int
    msb, lsb = v >> 64, v & 0xFFFF_FFFF_FFFF_FFFF
    return _signed64(msb), _signed64(lsb)


def msb_lsb_to_uuid(msb: int, lsb: int) -> uuid.UUID:
    return uuid.UUID(int=((msb & 0xFFFF_FFFF_FFFF_FFFF) << 64) | (lsb & 0xFFFF_FFFF_FFFF_FFFF))


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v

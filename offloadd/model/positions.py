"""Values shared by every stage: positions, topic names, ledger descriptions.

Pure: no I/O. Everything here is immutable.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import NamedTuple

from offloadd.errors import ConfigError

INT64_MAX = 2**63 - 1


class Position(NamedTuple):
    """``ledgerId:entryId``; tuples order by ledger, then entry, which is the log order."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """Parse ``L:E`` (as printed by :meth:`__str__`); both ids are int64s >= 0, as in
        BookKeeper and Pulsar."""
        # ASCII: \d and int() also take other scripts' digits ("١٢:٠")
        m = re.fullmatch(r"\s*(-?\d+):(-?\d+)\s*", text, re.ASCII)
        if not m:
            raise ValueError(f"position {text!r} is not of the form LEDGER:ENTRY, e.g. 12:0")
        ledger_id, entry_id = int(m.group(1)), int(m.group(2))
        for what, v in (("ledger", ledger_id), ("entry", entry_id)):
            if not 0 <= v <= INT64_MAX:
                raise ValueError(f"position {text!r}: {what} id {v} is out of range (0.."
                                 f"{INT64_MAX}, a non-negative int64)")
        return cls(ledger_id, entry_id)


_TOPIC_RE = re.compile(
    r"^(persistent)://([A-Za-z0-9_.=:-]+)/([A-Za-z0-9_.=:-]+)/([A-Za-z0-9_.=:%-]+)$")


@dataclass(frozen=True, order=True)
class TopicName:
    """A Pulsar topic ``persistent://tenant/namespace/local``."""

    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, text: str) -> TopicName:
        m = _TOPIC_RE.match(text)
        if not m:
            raise ConfigError(
                f"topic name {text!r} is invalid: expected "
                "persistent://<tenant>/<namespace>/<topic> using letters, digits and -_.=: only"
            )
        for part in m.group(2, 3, 4):
            if part in (".", ".."):
                # it would name a directory's self or parent in every path built from it
                # (ZooKeeper nodes, the embedded store's tables, object keys)
                raise ConfigError(f"topic name {text!r} is invalid: {part!r} cannot be a tenant, "
                                  "namespace or topic name")
        return cls(m.group(2), m.group(3), m.group(4))

    @classmethod
    def from_managed_ledger(cls, name: str) -> TopicName:
        """Inverse of :attr:`managed_ledger`: ``tenant/ns/persistent/local``."""
        parts = name.split("/")
        if len(parts) != 4 or parts[2] != "persistent":
            raise ConfigError(
                f"managed ledger name {name!r} is not tenant/namespace/persistent/topic")
        return cls.parse(f"persistent://{parts[0]}/{parts[1]}/{parts[3]}")

    @property
    def managed_ledger(self) -> str:
        """The name Pulsar uses under ``/managed-ledgers``: ``tenant/ns/persistent/local``."""
        return f"{self.tenant}/{self.namespace}/persistent/{self.local}"

    @property
    def ns(self) -> str:
        """``tenant/namespace``: the ``namespace`` metric label and config level."""
        return f"{self.tenant}/{self.namespace}"

    def __str__(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.local}"


class LedgerState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class LedgerDesc:
    """One ledger of a managed ledger as the source sees it right now.

    ``last_entry_id`` is the last readable entry (the LAC for an open ledger), -1 when empty.
    ``size`` is the sum of payload bytes of the readable entries.
    """

    ledger_id: int
    state: LedgerState
    last_entry_id: int
    size: int
    ctime_ms: int

    @property
    def entries(self) -> int:
        return self.last_entry_id + 1

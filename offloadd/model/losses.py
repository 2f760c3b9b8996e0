"""Entries a Pulsar cluster deleted before offloadd held them, as the sidecar records them.

The BookKeeper source mirrors Pulsar's ledger list into the catalog's ``ManagedLedgerInfo``;
when Pulsar's retention deletes a ledger whose entries offloadd had not yet committed, the
mirror records the loss as a ``properties`` key ``offloadd.lost.<ledgerId>`` with a JSON value
``{"first", "last", "bytes", "at_ms"}`` (:class:`LostLedger`). Pure: reading and describing
those records needs nothing of the source, so ``offloadd status`` reports them from the
catalog alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from offloadd._proto import mldataformats_pb2 as mlpb

__all__ = ["LOST_PREFIX", "LostLedger", "describe_lost", "lost_ledgers"]

LOST_PREFIX = "offloadd.lost."


@dataclass(frozen=True)
class LostLedger:
    """Entries ``first..last`` of a ledger that Pulsar deleted before offloadd held them.

    ``last`` is -1 when the ledger's end was never known (it was deleted while open);
    ``bytes`` counts payload bytes when known, else -1.
    """

    ledger_id: int
    first: int
    last: int
    bytes: int
    at_ms: int

    @property
    def entries(self) -> int:
        return self.last - self.first + 1 if self.last >= self.first else 0

    def key(self) -> str:
        return f"{LOST_PREFIX}{self.ledger_id}"

    def value(self) -> str:
        return json.dumps({"first": self.first, "last": self.last, "bytes": self.bytes,
                           "at_ms": self.at_ms}, sort_keys=True)


def lost_ledgers(info: mlpb.ManagedLedgerInfo) -> list[LostLedger]:
    """The losses recorded in a mirror node, by ledger id."""
    out: list[LostLedger] = []
    for kv in info.properties:
        if not kv.key.startswith(LOST_PREFIX):
            continue
        try:
            v = json.loads(kv.value)
            out.append(LostLedger(int(kv.key[len(LOST_PREFIX):]), int(v["first"]),
                                  int(v["last"]), int(v["bytes"]), int(v["at_ms"])))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda lost: lost.ledger_id)


def describe_lost(losses: Iterable[LostLedger]) -> str:
    parts = []
    for lost in losses:
        if lost.last >= lost.first:
            parts.append(f"ledger {lost.ledger_id} entries {lost.first}..{lost.last} "
                         f"({lost.entries} entries)")
        else:
            parts.append(f"ledger {lost.ledger_id} from entry {lost.first} (its end was never "
                         "known)")
    return "; ".join(parts)

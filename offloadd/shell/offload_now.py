"""``offloadd offload-now``, on the daemon's side: close topics' open segments at their tails.

The signal (SIGUSR1), the control endpoint (``POST /offload-now``) and the CLI's ``--wait`` all
come here. Each topic's tail is read as it is now (many at once), its task is triggered to close
the open segment there, and with ``wait`` each is followed until the segment holding its tail is
committed, an attempt at it fails, or the time is up. Like ``pulsar-admin topics offload -w`` +
``offload-status -w``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from offloadd.errors import OffloaddError
from offloadd.ledger.base import LedgerSource
from offloadd.model import LedgerDesc, Position, TopicName
from offloadd.model.lifecycle import Lifecycle
from offloadd.offload.context import OffloadMode
from offloadd.offload.scheduler import Running
from offloadd.offload.threshold import TailLog
from offloadd.offload.topic import TopicOffloader, TopicPolicy

__all__ = ["OffloadNow", "Served", "offload_now"]

log = logging.getLogger(__name__)

OFFLOAD_NOW_AT_ONCE = 64  # topics whose tails offload-now reads at once
POLL_S_PER_PENDING = 0.00005  # offload-now --wait: 0.5 s between looks at 10,000 topics


@dataclass(frozen=True)
class OffloadNow:
    """What an offload-now did for one topic.

    ``result``: ``committed`` (everything up to ``target`` is in the tier), ``triggered``
    (asked, not waited for), ``nothing`` (no entry past what is committed), ``failed`` (an
    attempt failed: ``error``; the daemon keeps retrying), ``timeout``, ``not-served``,
    ``ledger-mode``.
    """

    topic: str
    result: str
    target: str | None = None
    last_committed: str | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result in ("committed", "triggered", "nothing")

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "result": self.result, "target": self.target,
                "last_committed": self.last_committed, "error": self.error,
                "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Served:
    """What offload-now needs of the daemon: its running topics (read at each look: a topic
    may stop meanwhile), their policies, the source and the wall clock."""

    topics: Callable[[], Mapping[TopicName, Running]]
    policy: Callable[[TopicName], TopicPolicy]
    source: LedgerSource
    wall_ms: Callable[[], int]


@dataclass
class _Pending:
    off: TopicOffloader
    tail: Position
    failed_before: int


def _text(pos: Position | None) -> str | None:
    return str(pos) if pos is not None else None


def _tail(ledgers: Sequence[LedgerDesc]) -> Position | None:
    """The topic's last readable entry."""
    return next((Position(d.ledger_id, d.last_entry_id) for d in reversed(ledgers)
                 if d.last_entry_id >= 0), None)


async def offload_now(served: Served, names: Sequence[TopicName], *, wait: bool,
                      timeout_s: float, poll_s: float) -> list[OffloadNow]:
    """One result per name, in the order given (a name given twice is handled once)."""
    t0 = time.monotonic()
    results: dict[TopicName, OffloadNow] = {}
    pending: dict[TopicName, _Pending] = {}
    # the tails are read many at once: one after the other, 10,000 topics' reads (a
    # worker-thread hop each) held the last topics' triggers back by seconds
    gate = asyncio.Semaphore(OFFLOAD_NOW_AT_ONCE)

    async def close(name: TopicName) -> None:
        done = await _close(served, name, gate, wait)
        if isinstance(done, _Pending):
            pending[name] = done
        else:
            results[name] = done

    await asyncio.gather(*map(close, dict.fromkeys(names)))
    log.info("offload-now: closing open segments (%s)",
             ", ".join(map(str, names)) or "no topic")
    while pending:
        for name, p in list(pending.items()):
            done = _settled(served, name, p, t0)
            if done is not None:
                results[name] = done
                del pending[name]
        if not pending:
            break
        if time.monotonic() - t0 >= timeout_s:
            for name, p in pending.items():
                results[name] = OffloadNow(str(name), "timeout", str(p.tail),
                                           _text(p.off.last_committed), error=p.off.last_error,
                                           seconds=time.monotonic() - t0)
            break
        # each look goes over every pending topic: with thousands, look less often
        await asyncio.sleep(max(poll_s, len(pending) * POLL_S_PER_PENDING))
    return [results[n] for n in names]


async def _close(served: Served, name: TopicName, gate: asyncio.Semaphore,
                 wait: bool) -> OffloadNow | _Pending:
    """Trigger ``name``'s close at its tail: the result now, or what to follow (``wait``)."""
    r = served.topics().get(name)
    if r is None:
        return OffloadNow(str(name), "not-served", error="this daemon does not offload that "
                          "topic (unknown, filtered out by [source] topics, or owned by "
                          "another daemon)")
    off = r.offloader
    policy = served.policy(name)
    if policy.mode is OffloadMode.LEDGER:
        return OffloadNow(str(name), "ledger-mode", _text(off.last_committed),
                          error="the topic offloads whole ledgers as they close")
    try:
        async with gate:
            ledgers = await served.source.ledgers(name)
        # the thresholds keep the newest data in the source: the segment closes at what may
        # be offloaded now (ledger boundaries tell that much for sure)
        tail = _tail(TailLog().clip(policy.thresholds, ledgers, served.wall_ms()))
    except OffloaddError as exc:
        return OffloadNow(str(name), "failed", _text(off.last_committed),
                          error=f"cannot read the topic's tail: {exc}")
    done = off.last_committed
    if tail is None or (done is not None and done >= tail):
        return OffloadNow(str(name), "nothing", _text(done), _text(done))
    off.trigger()
    if not wait:
        return OffloadNow(str(name), "triggered", _text(tail), _text(done))
    return _Pending(off, tail, off.failed_attempts)


def _settled(served: Served, name: TopicName, p: _Pending, t0: float) -> OffloadNow | None:
    """The outcome of a followed topic, or None while it is still on its way."""
    done = p.off.last_committed
    seconds = time.monotonic() - t0
    if done is not None and done >= p.tail:
        return OffloadNow(str(name), "committed", str(p.tail), str(done), seconds=seconds)
    if p.off.failed_attempts > p.failed_before:
        return OffloadNow(str(name), "failed", str(p.tail), _text(done), error=p.off.last_error,
                          seconds=seconds)
    if p.off.state is Lifecycle.STOPPED or served.topics().get(name) is None:
        return OffloadNow(str(name), "failed", str(p.tail), _text(done),
                          error="the topic's task stopped", seconds=seconds)
    return None

"""A topic's offload status, kept in the metadata store so it outlives the daemon.

One small JSON node per managed ledger, written only by the topic's owner::

    /offloadd/status/<ml>   {"v": 1, "state": "ok" | "failing" | "stopped", "owner": "...",
                             "updated_ms": ..., "failed_attempts": N, "failing_since_ms": ...,
                             "last_success_ms": ..., "last_success_position": "L:E",
                             "last_segment": "<uuid>", "last_error": "...",
                             "last_error_ms": ..., "get_requests": N, "get_bytes": N,
                             "get_since_ms": ...}

``state``: ``ok`` while the last attempt (or recovery) succeeded, ``failing`` from the first
failure until the next commit, ``stopped`` when the owner let the topic go (a graceful stop or a
hand-over); ``failed_attempts`` and the last error are kept when it stops, so a topic that was
failing when its daemon stopped still says so. Pulsar's ``offload-status`` forgets all of this
on a restart; ``offloadd status`` reads it with no daemon running. ``get_*``: the GET-class
requests (and bytes) the owners' read-back checks made of the topic since ``get_since_ms``,
summed across owners (each new owner goes on from the record): the GET side of the topic's
tier cost (:mod:`offloadd.model.cost`).

Writes carry the owner's fence (``guard_ops``): a daemon that lost the topic cannot overwrite
its successor's record. They are throttled by the writer (:mod:`offloadd.offload.recorder`):
every state change at once, otherwise at most once per ``[daemon] status_interval_s``.
Unknown keys are ignored when reading, so later versions may add some.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from offloadd.errors import FormatError, NotFound
from offloadd.metadata import cas
from offloadd.metadata.base import MetadataStore, Op
from offloadd.model.keys import offload_status_path

__all__ = ["OffloadStatus", "absent", "read", "write"]

STATES = ("ok", "failing", "stopped")
LIST_FROM = 4  # topics of one namespace starting together that :func:`absent` lists for
_ERROR_CHARS = 2000  # one error message; the node stays small whatever a backend says


@dataclass(frozen=True, slots=True)  # one or two per running topic
class OffloadStatus:
    state: str = "ok"
    owner: str = ""
    updated_ms: int = 0
    failed_attempts: int = 0
    failing_since_ms: int | None = None
    last_success_ms: int | None = None
    last_success_position: str | None = None
    last_segment: str | None = None
    last_error: str | None = None
    last_error_ms: int | None = None
    get_requests: int = 0
    get_bytes: int = 0
    get_since_ms: int | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {"v": 1, **self.as_dict()}  # (asdict: deep copies, 3x the time)
        if doc["last_error"] is not None:
            doc["last_error"] = doc["last_error"][:_ERROR_CHARS]
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> OffloadStatus:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("state") not in STATES:
                raise ValueError(f"state must be one of {', '.join(STATES)}")
            return cls(**{k: v for k, v in doc.items() if k in _NAMES})
        except (ValueError, TypeError) as exc:
            raise FormatError(where, 0, f"offload status is not the expected JSON ({exc})") \
                from exc

    def as_dict(self) -> dict[str, Any]:
        # every field is a plain value: a shallow copy is asdict's result without its deep
        # copies (10,000 topics' records in one ``offloadd status``)
        return {f.name: getattr(self, f.name) for f in _FIELDS}


_FIELDS = fields(OffloadStatus)
_NAMES = frozenset(f.name for f in _FIELDS)  # decode's: 10,000 records in one ``status``


async def read(store: MetadataStore, ml_name: str,
               known: cas.Known | None = None) -> OffloadStatus | None:
    """The topic's recorded status; None if no owner ever wrote one. ``known`` is given the
    node as read (for the writer's first :func:`write`)."""
    path = offload_status_path(ml_name)
    node = await cas.read(store, path)
    status = None if node is None else OffloadStatus.decode(node.data, path)
    if known is not None:
        known.set(node)
    return status


async def absent(store: MetadataStore, ml_names: Iterable[str], *,
                 list_from: int = LIST_FROM) -> set[str]:
    """Those of ``ml_names`` that have no record, from one listing of each directory at least
    ``list_from`` of them share (a namespace's; the others are not in the result, for
    :func:`read`): at start-up every topic's read found nothing, one request each.
    What is listed as present still needs a :func:`read`; a record created after the listing
    is the compare-and-set's business (the first write that expected none loses and reads)."""
    by_dir: dict[str, list[tuple[str, str]]] = {}
    for ml in ml_names:
        directory, _, name = offload_status_path(ml).rpartition("/")
        by_dir.setdefault(directory, []).append((name, ml))
    out: set[str] = set()
    for directory, names in by_dir.items():
        if len(names) < list_from:  # a listing of a big namespace for one or two topics
            continue
        try:
            present = set(await store.children(directory))
        except NotFound:
            present = set()
        out.update(ml for name, ml in names if name not in present)
    return out


async def write(store: MetadataStore, ml_name: str, status: OffloadStatus,
                guard: Sequence[Op] = (),
                on_conflict: Callable[[], Awaitable[None]] | None = None,
                multi: cas.Multi | None = None, known: cas.Known | None = None) -> None:
    """Replace the record (creating it the first time), in one transaction with ``guard``
    (:func:`offloadd.metadata.cas.update`; ``on_conflict`` is the fence's check, which raises
    ``Fenced`` once another owner holds the topic); ``multi`` and ``known`` as there (a commit
    batcher; the record as the writer last read or wrote it)."""
    data = status.encode()
    await cas.update(store, offload_status_path(ml_name), lambda node: data, create=True,
                     guard=guard, on_conflict=on_conflict, multi=multi, known=known)

"""Pulsar's namespace offload policies, as its brokers store them (pure: bytes in, values out).

A namespace's policies are one znode of Pulsar's configuration store,
``/admin/policies/<tenant>/<namespace>``: UTF-8 JSON written by Jackson from the broker's
``Policies`` class (snake_case keys; null fields omitted; unknown keys ignored on read). The
offload values live in two places, and the broker reads them so
(``OffloadPoliciesImpl.oldPoliciesCompatible``, then ``mergeConfiguration``):

- ``offload_policies`` (an ``OffloadPoliciesImpl``, camelCase keys): what ``pulsar-admin
  namespaces set-offload-policies`` writes. ``managedLedgerOffloadThresholdInBytes``,
  ``...ThresholdInSeconds``, ``...DeletionLagInMillis`` are nullable ``Long``\\ s (null/absent:
  not set at this level), ``managedLedgerOffloadedReadPriority`` an enum
  (``BOOKKEEPER_FIRST`` / ``TIERED_STORAGE_FIRST``; an unknown name reads as null).
- the older top-level fields (``set-offload-threshold``, ``set-offload-deletion-lag``):
  ``offload_threshold`` and ``offload_threshold_in_seconds`` (primitive longs, ``-1`` = not set)
  and ``offload_deletion_lag_ms`` (nullable). Each is used only where the new field is null.

:func:`parse_namespace_policies` returns what is set (None where nothing is) and raises
:class:`~offloadd.errors.FormatError` naming the node for bytes the broker could not have
written (not JSON, not an object, a threshold that is not a whole number).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from offloadd.errors import FormatError

__all__ = ["POLICIES_ROOT", "READ_PRIORITIES", "PulsarOffloadPolicy", "namespace_policies_path",
           "parse_namespace_policies", "parse_offload_policies"]

POLICIES_ROOT = "/admin/policies"  # NamespaceResources.BASE_POLICIES_PATH
READ_PRIORITIES = ("bookkeeper-first", "tiered-storage-first")  # OffloadedReadPriority's values
_JAVA_LONG = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class PulsarOffloadPolicy:
    """The offload values one Pulsar policy sets (None: not set at this level)."""

    threshold_bytes: int | None = None
    threshold_seconds: int | None = None
    deletion_lag_ms: int | None = None
    read_priority: str | None = None  # one of READ_PRIORITIES

    @property
    def empty(self) -> bool:
        return self == PulsarOffloadPolicy()

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in (
            ("threshold_bytes", self.threshold_bytes),
            ("threshold_seconds", self.threshold_seconds),
            ("deletion_lag_ms", self.deletion_lag_ms),
            ("read_priority", self.read_priority)) if v is not None]
        return ", ".join(parts) or "no offload values"


def namespace_policies_path(ns: str) -> str:
    """The znode of namespace ``tenant/namespace`` (in Pulsar's configuration store)."""
    return f"{POLICIES_ROOT}/{ns}"


def parse_namespace_policies(data: bytes, where: str) -> PulsarOffloadPolicy:
    """The offload values of a ``Policies`` node's bytes; ``where`` names the node in errors."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormatError(where, 0, f"not Pulsar's namespace policies (JSON expected): "
                          f"{exc}") from None
    if not isinstance(doc, dict):
        raise FormatError(where, 0, "not Pulsar's namespace policies: a JSON object expected, "
                          f"found {type(doc).__name__}")
    new = doc.get("offload_policies")
    if new is None:
        new = {}
    elif not isinstance(new, dict):
        raise FormatError(where, 0, "offload_policies: a JSON object expected, found "
                          f"{type(new).__name__}")
    nbytes = _long(new, "managedLedgerOffloadThresholdInBytes", where)
    seconds = _long(new, "managedLedgerOffloadThresholdInSeconds", where)
    lag = _long(new, "managedLedgerOffloadDeletionLagInMillis", where)
    old_bytes = _long(doc, "offload_threshold", where)
    old_seconds = _long(doc, "offload_threshold_in_seconds", where)
    old_lag = _long(doc, "offload_deletion_lag_ms", where)
    # the old primitive fields say "not set" by -1 (the broker's oldPoliciesCompatible)
    if nbytes is None and old_bytes is not None and old_bytes != -1:
        nbytes = old_bytes
    if seconds is None and old_seconds is not None and old_seconds != -1:
        seconds = old_seconds
    if lag is None:
        lag = old_lag
    return PulsarOffloadPolicy(nbytes, seconds, lag,
                               _priority(new.get("managedLedgerOffloadedReadPriority"), where))


def parse_offload_policies(obj: dict[str, Any], where: str) -> PulsarOffloadPolicy:
    """The offload values of one ``OffloadPoliciesImpl`` object (its Java field names as keys:
    Jackson's JSON, or the Avro record of a topic policy), without the namespace node's old
    top-level fields."""
    return PulsarOffloadPolicy(
        _long(obj, "managedLedgerOffloadThresholdInBytes", where),
        _long(obj, "managedLedgerOffloadThresholdInSeconds", where),
        _long(obj, "managedLedgerOffloadDeletionLagInMillis", where),
        _priority(obj.get("managedLedgerOffloadedReadPriority"), where))


def _long(obj: dict[str, Any], key: str, where: str) -> int | None:
    """A Java ``Long`` as Jackson reads it: a whole number (or a string of one); null: None."""
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, str):  # Jackson coerces a numeric string to a number
        try:
            v = int(v.strip())
        except ValueError:
            raise FormatError(where, 0, f"{key}: a whole number expected, found {v!r}") from None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise FormatError(where, 0, f"{key}: a whole number expected, found {v!r}")
    if not _JAVA_LONG[0] <= v <= _JAVA_LONG[1]:
        raise FormatError(where, 0, f"{key}: {v} does not fit a Java long")
    return v


def _priority(v: object, where: str) -> str | None:
    """``BOOKKEEPER_FIRST`` (as Jackson writes the enum) or ``bookkeeper-first`` (its string
    form): ``bookkeeper-first``. An unknown name is null, as the broker's mapper reads it."""
    if v is None:
        return None
    if not isinstance(v, str):
        raise FormatError(where, 0, "managedLedgerOffloadedReadPriority: a string expected, "
                          f"found {v!r}")
    name = v.strip().lower().replace("_", "-")
    return name if name in READ_PRIORITIES else None

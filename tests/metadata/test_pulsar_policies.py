"""Pulsar's namespace policies node (``/admin/policies/<tenant>/<ns>``) as the broker writes it:
the offload values read as the broker reads them (offload_policies first, the old top-level
fields where it is null), and bytes it could not have written refused naming the node."""

from __future__ import annotations

import json

import pytest

from offloadd.errors import FormatError
from offloadd.metadata.pulsar_policies import (
    PulsarOffloadPolicy,
    namespace_policies_path,
    parse_namespace_policies,
)
from tests.fixtures.pulsar_policies import namespace_policies, offload_policies

WHERE = "/admin/policies/public/default"


def test_set_offload_policies_as_the_broker_writes_it() -> None:
    data = namespace_policies(offload_policies(threshold_bytes=10 * 1024 * 1024,
                                               deletion_lag_ms=3_600_000,
                                               read_priority="TIERED_STORAGE_FIRST"))
    assert parse_namespace_policies(data, WHERE) == PulsarOffloadPolicy(
        threshold_bytes=10485760, threshold_seconds=None, deletion_lag_ms=3600000,
        read_priority="tiered-storage-first")


def test_a_namespace_without_offload_values_sets_nothing() -> None:
    # a new namespace: offload_threshold -1, offload_threshold_in_seconds -1, no lag, no policies
    assert parse_namespace_policies(namespace_policies(), WHERE) == PulsarOffloadPolicy()
    # set-offload-policies with only a driver: the nullable fields are omitted
    assert parse_namespace_policies(namespace_policies(offload_policies()), WHERE).empty


def test_the_old_fields_count_where_the_new_ones_are_null() -> None:
    # set-offload-threshold / set-offload-deletion-lag of an older broker
    old = namespace_policies(offload_threshold=0, offload_threshold_in_seconds=600,
                             offload_deletion_lag_ms=1000)
    assert parse_namespace_policies(old, WHERE) == PulsarOffloadPolicy(0, 600, 1000)
    both = namespace_policies(offload_policies(threshold_bytes=5, threshold_seconds=7,
                                               deletion_lag_ms=9),
                              offload_threshold=100, offload_threshold_in_seconds=200,
                              offload_deletion_lag_ms=300)
    assert parse_namespace_policies(both, WHERE) == PulsarOffloadPolicy(5, 7, 9)


def test_negative_thresholds_in_offload_policies_are_values() -> None:
    # -1 in offload_policies disables that trigger at this level (not "unset": the field is
    # non-null, so it beats broker.conf), unlike the old primitive fields' -1
    data = namespace_policies(offload_policies(threshold_bytes=-1, threshold_seconds=-1))
    assert parse_namespace_policies(data, WHERE) == PulsarOffloadPolicy(-1, -1, None)


@pytest.mark.parametrize(("written", "read"), [
    ("BOOKKEEPER_FIRST", "bookkeeper-first"), ("TIERED_STORAGE_FIRST", "tiered-storage-first"),
    ("bookkeeper-first", "bookkeeper-first"), ("SOMETHING_NEWER", None)])
def test_read_priority_by_name_or_value(written: str, read: str | None) -> None:
    data = namespace_policies(offload_policies(read_priority=written))
    assert parse_namespace_policies(data, WHERE).read_priority == read


def test_numbers_as_jackson_coerces_them() -> None:
    doc = json.loads(namespace_policies(offload_policies()))
    doc["offload_policies"]["managedLedgerOffloadThresholdInBytes"] = "1024"
    doc["offload_policies"]["managedLedgerOffloadThresholdInSeconds"] = 60.0
    got = parse_namespace_policies(json.dumps(doc).encode(), WHERE)
    assert (got.threshold_bytes, got.threshold_seconds) == (1024, 60)


@pytest.mark.parametrize(("data", "problem"), [
    (b"", "JSON expected"),
    (b"\xff\xfe{", "JSON expected"),
    (b"{\"offload_threshold\": ", "JSON expected"),
    (b"[1, 2]", "a JSON object expected, found list"),
    (b"{\"offload_policies\": 5}", "offload_policies: a JSON object expected"),
    (b"{\"offload_threshold\": \"lots\"}", "offload_threshold: a whole number expected"),
    (b"{\"offload_policies\": {\"managedLedgerOffloadThresholdInBytes\": true}}",
     "managedLedgerOffloadThresholdInBytes: a whole number expected"),
    (b"{\"offload_policies\": {\"managedLedgerOffloadDeletionLagInMillis\": 1.5}}",
     "managedLedgerOffloadDeletionLagInMillis: a whole number expected"),
    (b"{\"offload_threshold\": 99999999999999999999}", "does not fit a Java long"),
    (b"{\"offload_policies\": {\"managedLedgerOffloadedReadPriority\": 1}}",
     "managedLedgerOffloadedReadPriority: a string expected"),
])
def test_malformed_nodes_are_refused_naming_the_node(data: bytes, problem: str) -> None:
    with pytest.raises(FormatError) as err:
        parse_namespace_policies(data, WHERE)
    assert WHERE in str(err.value) and problem in str(err.value)


def test_node_path() -> None:
    assert namespace_policies_path("billing/eu") == "/admin/policies/billing/eu"

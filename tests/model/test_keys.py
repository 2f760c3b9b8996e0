"""Object keys are built and parsed in one place, and round-trip."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from offloadd.model.keys import (
    ParsedKey,
    ledger_data_key,
    ledger_index_key,
    parse_key,
    streaming_data_key,
    streaming_index_key,
)


class TestKeys:
    """Every key a builder makes parses back to what made it; other keys are not ours."""

    @given(st.uuids(), st.integers(0, 2**63 - 1))
    def test_every_builder_round_trips(self, uid: uuid.UUID, ledger_id: int) -> None:
        assert parse_key(streaming_data_key(uid)) == ParsedKey(uid, None, False)
        assert parse_key(streaming_index_key(uid)) == ParsedKey(uid, None, True)
        assert parse_key(ledger_data_key(uid, ledger_id)) == ParsedKey(uid, ledger_id, False)
        assert parse_key(ledger_index_key(uid, ledger_id)) == ParsedKey(uid, ledger_id, True)

    @given(st.text(max_size=60))
    def test_anything_else_is_not_ours(self, text: str) -> None:
        parsed = parse_key(text)
        assert parsed is None or streaming_data_key(parsed.uid) in text

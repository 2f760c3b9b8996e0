"""The daemon's merges (``compact_once``) keep the objects they replace for the deletion lag the
daemon resolved for the topic (Pulsar's namespace policy included, docs/sidecar.md), not only
the configuration file's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from offloadd.blobstore.base import StoreView
from offloadd.commit.fence import NoFence
from offloadd.model.keys import deletion_path
from offloadd.retention.policy import DeletionRecord
from offloadd.shell.compact import compact_once
from tests.retention.rig import TOPIC, Rig, settings

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = await Rig.open(tmp_path, per_ledger=45, per_segment=10)
    try:
        await r.write(100)
        await r.offload_all()
        yield r
    finally:
        await r.close()


@pytest.mark.parametrize(("lag_ms", "want"), [(None, 14_400_000), (123_000, 123_000)])
async def test_the_merge_records_the_lag_it_is_given(rig: Rig, lag_ms: int | None,
                                                     want: int) -> None:
    old = await rig.segments()
    rep = await compact_once(settings(), TOPIC, rig.metadata, StoreView(rig.blob), NoFence(),
                             target_bytes=64 * 1024, deletion_lag_ms=lag_ms)
    assert rep.merged
    rec = DeletionRecord.decode((await rig.metadata.get(deletion_path(old[0].uid))).data, "x")
    assert rec.merged_into is not None
    assert rec.not_before_ms - rec.created_ms == want

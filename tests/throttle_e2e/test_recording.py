"""The measuring helpers the pipeline test relies on: if they were wrong, its figures would be."""

from __future__ import annotations

import pytest

from offloadd.blobstore.base import BlobStore
from offloadd.blobstore.memory import MemoryBlobStore
from tests.throttle_e2e.recording import (
    RecordingBlobStore,
    in_window,
    max_window,
    rate,
    shares,
)


def test_max_window_finds_the_densest_second_and_excludes_its_end() -> None:
    samples = [(0.0, "a", 1), (0.5, "a", 1), (0.99, "b", 1), (1.0, "b", 5), (1.2, "a", 2)]
    # [0.5, 1.5) holds 1 + 1 + 5 + 2; [0, 1) only 3, since a window is half-open
    assert max_window(samples) == 9
    assert max_window(samples[:3]) == 3


def test_rate_counts_only_the_window() -> None:
    samples = [(0.5, "a", 100), (1.0, "a", 10), (2.9, "b", 30), (3.0, "b", 1000)]
    assert in_window(samples, 1.0, 3.0) == [(1.0, "a", 10), (2.9, "b", 30)]
    assert rate(samples, 1.0, 3.0) == 20


def test_shares_are_fractions_of_the_bytes_per_topic() -> None:
    assert shares([(0, "a", 3), (1, "b", 1), (2, "a", 0)]) == {"a": 0.75, "b": 0.25}


@pytest.mark.timeout(10)
async def test_recorder_times_multipart_parts_per_topic_but_not_one_shot_puts() -> None:
    ticks = iter(range(100))
    store = RecordingBlobStore(MemoryBlobStore(), clock=lambda: float(next(ticks)))
    assert isinstance(store, BlobStore)
    up = await store.start_upload("k", {"managedledgername": "t/ns/persistent/x"})
    await up.put_part(1, 0, [b"abc", memoryview(b"de")])
    await up.put_part(2, 5, [bytearray(3)])
    info = await up.complete()
    await store.put("k-index", [b"index"], {"managedledgername": "t/ns/persistent/x"})
    assert info.size == 8
    assert [(p.started, p.landed, p.topic, p.nbytes) for p in store.parts] == [
        (0.0, 1.0, "t/ns/persistent/x", 5), (2.0, 3.0, "t/ns/persistent/x", 3)]
    assert await store.get_range("k", 0, 8) == b"abcde\0\0\0"

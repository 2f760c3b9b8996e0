"""The payload codecs used from several threads at once (the lakehouse decodes in worker
threads; two projectors of the same tables do so side by side)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from offloadd.format.compression import Compression, _zstd_codecs, compress, decompress


def test_each_thread_has_its_own_zstd_context() -> None:
    """A zstandard (de)compressor keeps one context that two threads must not use at once: a
    shared one mixed two frames into one output (a valid entry became a flagged row)."""
    mine = _zstd_codecs()
    assert _zstd_codecs() is mine  # reused within a thread: no context per call
    with ThreadPoolExecutor(1) as pool:
        theirs = pool.submit(_zstd_codecs).result()
    assert theirs[0] is not mine[0] and theirs[1] is not mine[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("codec", list(Compression))
def test_concurrent_decompression_returns_each_frames_own_bytes(codec: Compression) -> None:
    # equal sizes and a common prefix: a mixed-up output passes every size check, so only the
    # bytes show it (what a shared zstd context produced about once in 20,000 calls)
    plains = [os.urandom(256) * 40 + bytes([i]) * 4096 for i in range(8)]
    packed = [compress(codec, p) for p in plains]
    start = threading.Barrier(2)

    def work(k: int) -> list[int]:
        start.wait()
        wrong = []
        for i in range(10_000):
            j = (i + k) % len(plains)
            if decompress(codec, packed[j], len(plains[j])) != plains[j]:
                wrong.append(i)
        return wrong

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(work, range(2)))
    assert results == [[], []]

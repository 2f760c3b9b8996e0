"""The change journal: a reader learns which topics a writer touched, or that it cannot say."""

from __future__ import annotations

from pathlib import Path

import pytest

from offloadd.ledger.local.journal import (
    ANY,
    SLOTS,
    TOPICS_KEY,
    JournalReader,
    JournalWriter,
    topic_key,
)
from offloadd.model import TopicName

pytestmark = pytest.mark.timeout(30)

A = TopicName.parse("persistent://public/default/a")
B = TopicName.parse("persistent://public/default/b")


def test_a_reader_gets_the_keys_written_since_its_last_look(tmp_path: Path) -> None:
    reader = JournalReader(tmp_path)
    assert reader.changes() == set()  # no journal yet: no writer has run
    writer = JournalWriter(tmp_path)
    writer.record(A)
    assert reader.changes() is ANY  # its first look has no baseline
    assert reader.changes() == set()
    writer.record(A)
    writer.record(B)
    writer.record(None)
    assert reader.changes() == {topic_key(A), topic_key(B), TOPICS_KEY}
    assert reader.changes() == set()


def test_a_new_writer_continues_the_sequence(tmp_path: Path) -> None:
    first = JournalWriter(tmp_path)
    first.record(A)
    first.close()
    reader = JournalReader(tmp_path)
    assert reader.changes() is ANY
    second = JournalWriter(tmp_path)
    second.record(B)
    assert reader.changes() == {topic_key(B)}


def test_a_reader_lapped_by_the_writer_is_told_anything_may_have_changed(
        tmp_path: Path) -> None:
    writer = JournalWriter(tmp_path)
    writer.record(A)
    reader = JournalReader(tmp_path)
    reader.changes()
    for _ in range(SLOTS + 1):
        writer.record(B)
    assert reader.changes() is ANY
    writer.record(A)
    assert reader.changes() == {topic_key(A)}


def test_a_replaced_journal_is_followed(tmp_path: Path) -> None:
    writer = JournalWriter(tmp_path)
    writer.record(A)
    reader = JournalReader(tmp_path)
    reader.changes()
    writer.close()
    (tmp_path / "changes").unlink()
    assert not reader.replaced()  # gone, not yet replaced
    JournalWriter(tmp_path).record(B)
    assert reader.replaced()
    assert reader.changes() is ANY


async def test_a_follower_takes_the_topics_changed_since_it_last_asked(tmp_path: Path) -> None:
    """The watcher's drain for one consumer (the daemon's lag loop, issue 22): the topics the
    journal named since the last call, or None when nothing can be said."""
    import asyncio

    from offloadd.ledger.local.watch import ChangeWatcher

    writer = JournalWriter(tmp_path)
    writer.record(A)
    watcher = ChangeWatcher(tmp_path, interval_s=0.01)
    take = watcher.follow()
    assert take() is None  # not watching yet
    watcher.generation(A)
    watcher.generation(B)  # the topics it is asked about
    watcher.start()
    try:
        assert take() is None  # its first answer has no baseline
        assert take() == set()
        writer.record(B)
        await asyncio.sleep(0.1)
        assert take() == {B}
        assert take() == set()
        for _ in range(SLOTS + 1):  # lapped: anything may have changed
            writer.record(A)
        await asyncio.sleep(0.1)
        assert take() is None
        assert take() == set()
    finally:
        await watcher.close()
    assert take() is None


async def test_the_watchers_tick_ends_waits_at_their_deadline(tmp_path: Path) -> None:
    """A wait's deadline is the watcher's (issue 22: no timer per idle topic): its tick ends
    the wait at the first tick at or after the deadline; a change ends it sooner; an
    unregistered wait leaves nothing behind."""
    import asyncio

    from offloadd.ledger.local.watch import ChangeWatcher

    writer = JournalWriter(tmp_path)
    writer.record(A)
    watcher = ChangeWatcher(tmp_path, interval_s=0.02)
    loop = asyncio.get_running_loop()
    try:
        now = loop.time()
        soon = watcher.register(A, now + 0.1)
        late = watcher.register(B, now + 30)
        changed = watcher.register(A, now + 30)
        await asyncio.sleep(0.05)
        assert not soon.done() and not late.done()
        await asyncio.wait_for(asyncio.shield(soon), 2)
        assert loop.time() - now >= 0.1
        assert not late.done() and not changed.done()
        writer.record(A)
        await asyncio.wait_for(asyncio.shield(changed), 2)  # its topic changed
        assert not late.done()
        for topic, fut, deadline in ((A, soon, now + 0.1), (B, late, now + 30),
                                     (A, changed, now + 30)):
            watcher.unregister(topic, fut, deadline)
        assert watcher.waiting == 0 and not watcher._due
        past = watcher.register(B, now - 5)  # a deadline already past: the next tick
        await asyncio.wait_for(asyncio.shield(past), 2)
        watcher.unregister(B, past, now - 5)
    finally:
        await watcher.close()

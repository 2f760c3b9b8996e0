"""Which topics list which ledger (:class:`~offloadd.ledger.bookkeeper.topics.Listers`)."""

from __future__ import annotations

from offloadd.ledger.bookkeeper.topics import Listers
from offloadd.model import TopicName

A = TopicName.parse("persistent://public/default/a")
B = TopicName.parse("persistent://public/default/b")


def test_a_ledger_is_orphaned_when_the_last_list_naming_it_drops_it() -> None:
    ix = Listers()
    assert ix.relist(A, [], [1, 2]) == []
    assert ix.relist(B, [], [2, 3]) == []
    assert sorted(ix.of(2)) == sorted([A, B])
    assert ix.relist(A, [1, 2], [2]) == [1]  # nobody else lists 1
    assert ix.relist(A, [2], []) == []  # B still lists 2
    assert list(ix.of(2)) == [B]
    assert sorted(ix.relist(B, [2, 3], [])) == [2, 3]
    assert list(ix.of(2)) == []


def test_a_ledger_loaded_while_unlisted_is_reported_once_unless_listed_meanwhile() -> None:
    ix = Listers()
    ix.loaded(7)
    ix.loaded(8)
    ix.relist(A, [], [8])  # listed before the next look
    ix.loaded(8)
    assert ix.take_unlisted() == [7]
    assert ix.take_unlisted() == []

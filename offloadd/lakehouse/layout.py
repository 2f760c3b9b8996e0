"""How a topic's table is laid out: its partition spec (``[lakehouse] partition`` and
``partitions`` per topic) and its declared sort order (the log order).

Choices: ``day(publish_time)`` (the default), ``hour(publish_time)``, ``day(event_time)``,
``hour(event_time)``, or ``none``. A table created under another choice is evolved to the
configured one (Iceberg partition evolution: files already written keep the spec they were
written with; pruning works on both). The sort order ``ledger_id, entry_id, batch_index`` is what
the projection writes anyway (entries in log order) and what compaction sorts by; declaring it
lets engines skip a sort.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform, Transform

from offloadd.config import Settings
from offloadd.errors import ConfigError
from offloadd.model import TopicName

__all__ = ["CHOICES", "DEFAULT", "SORT_COLUMNS", "choice_for", "evolve", "partition_spec",
           "sort_order"]

DEFAULT = "day(publish_time)"
CHOICES = ("day(publish_time)", "hour(publish_time)", "day(event_time)", "hour(event_time)",
           "none")
SORT_COLUMNS = ("ledger_id", "entry_id", "batch_index")
_SOURCE_IDS = {"publish_time": 5, "event_time": 6, "ledger_id": 2, "entry_id": 3,
               "batch_index": 4}
_TRANSFORMS: dict[str, Transform[Any, Any]] = {"day": DayTransform(),
                                                     "hour": HourTransform()}


def choice_for(settings: Settings, topic: TopicName) -> str:
    lh = settings.lakehouse
    return lh.partitions.get(str(topic), lh.partition)


def _parse(choice: str) -> tuple[str, str] | None:
    if choice == "none":
        return None
    if choice not in CHOICES:
        raise ConfigError(f"partition {choice!r}: use one of {', '.join(CHOICES)}")
    transform, _, rest = choice.partition("(")
    return transform, rest.rstrip(")")


def _field_name(transform: str, column: str) -> str:
    # day(publish_time) keeps the name tables of earlier versions have: publish_day
    return f"{column.removesuffix('_time')}_{transform}"


def partition_spec(choice: str = DEFAULT) -> PartitionSpec:
    parsed = _parse(choice)
    if parsed is None:
        return PartitionSpec()
    transform, column = parsed
    return PartitionSpec(PartitionField(source_id=_SOURCE_IDS[column], field_id=1000,
                                        transform=_TRANSFORMS[transform],
                                        name=_field_name(transform, column)))


def sort_order() -> SortOrder:
    return SortOrder(*(SortField(source_id=_SOURCE_IDS[c], transform=IdentityTransform())
                       for c in SORT_COLUMNS))


def _current(table: Table) -> tuple[str, str] | None:
    fields = table.spec().fields
    if not fields:
        return None
    f = fields[0]
    column = table.schema().find_column_name(f.source_id) or ""
    name = "day" if isinstance(f.transform, DayTransform) else (
        "hour" if isinstance(f.transform, HourTransform) else str(f.transform))
    return name, column


def evolve(table: Table, choice: str) -> bool:
    """Bring the table's spec and sort order to ``choice`` and :func:`sort_order`; whether it
    changed anything (one metadata commit)."""
    want = _parse(choice)
    have = _current(table)
    spec_differs = want != have or len(table.spec().fields) > 1
    order = table.sort_order()
    order_differs = [(f.source_id, str(f.transform)) for f in order.fields] != [
        (_SOURCE_IDS[c], "identity") for c in SORT_COLUMNS]
    if not spec_differs and not order_differs:
        return False
    with table.transaction() as tx:
        if spec_differs:
            with tx.update_spec() as upd:
                for f in table.spec().fields:
                    upd.remove_field(f.name)
                if want is not None:
                    transform, column = want
                    upd.add_field(column, _TRANSFORMS[transform],
                                  _field_name(transform, column))
        if order_differs:
            with tx.update_sort_order() as so:
                for c in SORT_COLUMNS:
                    so.asc(c, IdentityTransform())
    return True

"""The in-process notifier: a writer publishes each topic's head, readers wait on it."""

from __future__ import annotations

import asyncio
import contextlib

from offloadd.model import Position, TopicName


class LedgerNotifier:
    """Heads of the topics a writer in this process owns, so readers can wait without polling.

    ``head`` is the last written position (entry -1 for a new, empty ledger). Used from one
    event loop only.
    """

    def __init__(self) -> None:
        self._heads: dict[TopicName, Position] = {}
        self._events: dict[TopicName, asyncio.Event] = {}

    def head(self, topic: TopicName) -> Position | None:
        return self._heads.get(topic)

    def publish(self, topic: TopicName, head: Position | None) -> None:
        """Record a new head (None: this process no longer writes the topic) and wake waiters."""
        if head is None:
            self._heads.pop(topic, None)
        else:
            self._heads[topic] = head
        event = self._events.pop(topic, None)
        if event is not None:
            event.set()

    async def wait_past(self, topic: TopicName, ledger_id: int, entry_id: int,
                        within: float) -> bool:
        """Wait until the head passes ``ledger_id:entry_id``; False when the topic is not
        written by this process (the caller must poll instead)."""
        if topic not in self._heads:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            head = self._heads.get(topic)
            # No head any more: the writer let go of the topic, so the caller must look again.
            if head is None or head.ledger_id != ledger_id or head.entry_id > entry_id:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return True
            event = self._events.setdefault(topic, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # (wait_for: a task per wait)
                    await event.wait()

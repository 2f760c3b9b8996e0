"""Which topics this process offloads: the scheduler's ownership hook.

The default, :class:`Ownership`, owns every topic with :class:`~offloadd.commit.fence.NoFence`
(one process on its own store). :class:`~offloadd.commit.cluster.ClusterOwnership` divides a
shared store's topics among daemons and hands out epoch fences.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import os
import socket
from collections.abc import Callable, Collection, Mapping

from offloadd.commit.fence import Fence, NoFence
from offloadd.model import TopicName

__all__ = ["Ownership", "Revoke", "hostname", "process_owner_id"]


@functools.cache
def hostname() -> str:
    """The machine's name, asked once per process: every topic's status record names its owner,
    and the system call per topic showed in a 5,000-topic start-up's profile."""
    return socket.gethostname()


def process_owner_id(role: str = "") -> str:
    """Who this process is in ownership records when not configured: ``[role-]host-pid``, so an
    operator reading a record finds the process (and a backfill or compact is told apart from
    the daemon)."""
    me = f"{hostname()}-{os.getpid()}"
    return f"{role}-{me}" if role else me

RELEASES_AT_ONCE = 64  # release_many's default: releases in flight at once


class Revoke(enum.Enum):
    """Why a running topic must stop (see :meth:`Ownership.revoked`)."""

    HANDOFF = "handoff"  # another daemon should own it: close and commit the open segment first
    LOST = "lost"  # ownership already ended (session lost, newer epoch): stop now, commit nothing


class Ownership:
    """Decides which topics this process offloads; the default owns every topic."""

    owner_id: str | None = None  # who this process is in the ownership records, if anyone

    async def acquire(self, topic: TopicName) -> Fence | None:
        return NoFence()

    async def release(self, topic: TopicName) -> None:
        return None

    async def release_many(self, topics: Collection[TopicName]) -> None:
        """:meth:`release` each of ``topics`` (a stop gives up every topic at once: an
        implementation with a shared store does it in few requests); never raises."""
        gate = asyncio.Semaphore(RELEASES_AT_ONCE)

        async def one(topic: TopicName) -> None:
            async with gate:
                await self.release(topic)

        await asyncio.gather(*map(one, topics), return_exceptions=True)

    async def revoked(self, running: Collection[TopicName]) -> Mapping[TopicName, Revoke]:
        """Before each discovery pass: running topics to give up, and how."""
        return {}

    def bind(self, revoke: Callable[[Mapping[TopicName, Revoke]], None]) -> None:
        """``revoke(verdicts)`` stops those running topics at once and runs a discovery pass
        soon: for what happens between passes (a lost session must stop its tasks before they
        act on the failed requests it leaves behind)."""

"""kazoo's threads bridged into one asyncio event loop (:class:`Bridge`).

kazoo runs its connection and callbacks in its own threads. Every request uses kazoo's
``*_async`` call; the ``IAsyncResult`` gets a ``rawlink`` callback (run in kazoo's thread) that
hands the outcome to the event loop with ``call_soon_threadsafe`` (:meth:`Bridge.call`).
Session-state changes and watch events arrive in kazoo's threads and are likewise re-delivered
on the event loop (:meth:`Bridge.from_kazoo_thread`); listeners and watch callbacks always run
there, one at a time, in the order kazoo saw the events (:meth:`Bridge.invoke`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from offloadd.errors import OffloaddError, Retriable
from offloadd.metadata.zookeeper.errors import translate

log = logging.getLogger(__name__)


class Bridge:
    """``session``: says the session's state, for the error a timed-out call raises."""

    def __init__(self, loop: asyncio.AbstractEventLoop, op_timeout_s: float,
                 session: Callable[[], str]) -> None:
        self.loop = loop
        self.op_timeout_s = op_timeout_s
        self._session = session
        self._tasks: set[asyncio.Task[Any]] = set()

    def from_kazoo_thread(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop; from any thread."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self.loop.call_soon_threadsafe(fn)

    def invoke(self, fn: Callable[[Any], object], arg: object, what: str) -> None:
        """Call a listener or watch callback on the loop; an awaitable it returns runs as a
        task. Its failures are logged, never raised into the bridge."""
        try:
            result = fn(arg)
        except Exception:
            log.exception("%s raised", what)
            return
        if inspect.isawaitable(result):
            self.spawn(_await_logged(result, what))

    def spawn(self, coro: Any) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self) -> None:
        """Cancel every task :meth:`spawn` started (the store is closing)."""
        for task in list(self._tasks):
            task.cancel()

    async def call(self, start: Callable[[], Any], what: str, path: str) -> Any:
        """Run one kazoo ``*_async`` call to completion on the loop, within the per-call
        timeout; translate its errors."""
        try:
            async_result = start()
        except OffloaddError:
            raise
        except Exception as exc:
            raise translate(exc, what, path) from None
        future: asyncio.Future[Any] = self.loop.create_future()
        async_result.rawlink(lambda r: self._settle(future, r))
        # a timer on the future rather than ``asyncio.timeout``: the context manager's own
        # work (its Timeout object, rescheduling, the task's cancel bookkeeping) was a tenth
        # of the event loop's time when thousands of topics start
        timer = self.loop.call_later(self.op_timeout_s, _expire, future)
        try:
            return await future
        except _Expired:
            raise Retriable(
                f"ZooKeeper {what} {path} got no answer within {self.op_timeout_s:g}s (session "
                f"{self._session()}); a write may or may not have been applied: re-read"
            ) from None
        except OffloaddError:
            raise
        except Exception as exc:
            raise translate(exc, what, path) from None
        finally:
            timer.cancel()

    async def call_many(self, starts: Sequence[Callable[[], Any]], what: str,
                        paths: Sequence[str]) -> list[Any]:
        """Several kazoo ``*_async`` calls sent at once (kazoo pipelines them on the session's
        connection), awaited in order within one per-call timeout for the lot: no task and no
        timer a call (``offloadd status`` reads 20,000 nodes). Each slot holds the call's value
        or its translated error (an ``OffloaddError``), as :meth:`call` would raise it."""
        futures: list[asyncio.Future[Any]] = []
        for start, path in zip(starts, paths, strict=True):
            future: asyncio.Future[Any] = self.loop.create_future()
            try:
                start().rawlink(lambda r, f=future: self._settle(f, r))
            except OffloaddError as exc:
                future.set_exception(exc)
            except Exception as exc:
                future.set_exception(translate(exc, what, path))
            futures.append(future)
        timer = self.loop.call_later(self.op_timeout_s, _expire_all, futures)
        out: list[Any] = []
        try:
            for future, path in zip(futures, paths, strict=True):
                try:
                    out.append(await future)
                except _Expired:
                    out.append(Retriable(
                        f"ZooKeeper {what} {path} got no answer within {self.op_timeout_s:g}s "
                        f"(session {self._session()})"))
                except OffloaddError as exc:
                    out.append(exc)
                except Exception as exc:
                    out.append(translate(exc, what, path))
        finally:
            timer.cancel()
            for future in futures[len(out):]:  # cancelled half-way: nobody reads the rest
                if future.done() and not future.cancelled():
                    future.exception()
                future.cancel()
        return out

    def _settle(self, future: asyncio.Future[Any], result: Any) -> None:
        """rawlink callback: runs in a kazoo thread (or inline when kazoo is stopping)."""
        exc, value = result.exception, result.value

        def settle() -> None:
            if future.done():
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(value)

        self.from_kazoo_thread(settle)


class _Expired(Exception):
    """A call's answer did not come within the per-call timeout."""


def _expire_all(futures: Sequence[asyncio.Future[Any]]) -> None:
    for future in futures:
        _expire(future)


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(_Expired())


async def _await_logged(awaitable: Any, what: str) -> None:
    try:
        await awaitable
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s raised", what)

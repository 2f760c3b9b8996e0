"""The filesystem store's worker threads: daemon threads, started on demand (:class:`Workers`)."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from offloadd.errors import Fatal

T = TypeVar("T")


class Workers(concurrent.futures.Executor):
    """Up to ``size`` daemon threads, started on demand. Not ThreadPoolExecutor: its threads
    are joined at interpreter exit, so one call stuck on a hung mount would hang the exit."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[tuple[concurrent.futures.Future[Any],
                                             Callable[[], Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._unfinished = 0  # submitted, not yet done (queued or running)
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
               ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise Fatal("the filesystem store is closed")
            self._unfinished += 1
            if self._unfinished > self._threads and self._threads < self._size:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self._name}-{self._threads}",
                                 daemon=True).start()
            self._queue.put((future, lambda: fn(*args, **kwargs)))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, call = item
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = call()
                    except BaseException as exc:
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._lock:
                    self._unfinished -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            for _ in range(self._threads):
                self._queue.put(None)

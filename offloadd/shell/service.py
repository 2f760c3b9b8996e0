"""``offloadd run``: the daemon as a service — pid file, metrics endpoint, systemd notify.

systemd ``Type=notify``: ``READY=1`` once the stores are open and topic discovery has run,
``STATUS=`` lines as topics come and go, ``WATCHDOG=1`` every half ``WATCHDOG_USEC`` while the
event loop is alive, ``STOPPING=1`` on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable

from offloadd import config as config_mod
from offloadd.config import Settings
from offloadd.ledger.local import StoreLock
from offloadd.model.sizes import MiB
from offloadd.shell.pidfile import PidFile
from offloadd.shell.runtime import Runtime

log = logging.getLogger(__name__)


class Notifier:
    """sd_notify(3) over ``$NOTIFY_SOCKET``; a no-op outside systemd."""

    def __init__(self, path: str | None = None) -> None:
        path = path if path is not None else os.environ.get("NOTIFY_SOCKET")
        self._addr: str | None = None
        self._sock: socket.socket | None = None
        if path:
            self._addr = "\0" + path[1:] if path.startswith("@") else path
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, msg: str) -> None:
        if self._sock is None or self._addr is None:
            return
        with contextlib.suppress(OSError):
            self._sock.sendto(msg.encode(), self._addr)

    def watchdog_interval(self) -> float | None:
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        try:
            return int(usec) / 2e6
        except ValueError:
            return None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


async def run_service(settings: Settings, config_path: str | None) -> int:
    if settings.daemon.nice:
        os.nice(settings.daemon.nice)  # before any worker thread exists: they inherit it
    notify = Notifier()
    pid_file = settings.daemon.pid_file
    # SIGUSR1/SIGHUP terminate a process by default: until the daemon's handlers are in place
    # (and again once they are gone) an early offload-now or reload must not kill us
    _ignore(signal.SIGUSR1, signal.SIGHUP)
    # the locked pid file is both the check that no other daemon runs here and, held until
    # exit, what lets `offloadd offload-now` tell this process from one that reused a pid
    pid_handle = await asyncio.to_thread(PidFile.acquire, pid_file)
    # an embedded store: shared with other `run` daemons (they divide its topics through
    # ownership records) and with a `produce` writer, never with a `standalone`
    try:
        lock = (await asyncio.to_thread(StoreLock.acquire, settings.source.path,
                                        StoreLock.OFFLOADER, shared=True)
                if settings.source.kind == "local" else None)
    except BaseException:
        pid_handle.release()
        raise
    try:
        return await _serve(settings, config_path, notify, pid_handle.release)
    finally:
        if lock is not None:
            lock.release()


async def _serve(settings: Settings, config_path: str | None, notify: Notifier,
                 release_pid: Callable[[], None]) -> int:
    pid_file = settings.daemon.pid_file
    notify.send("STATUS=opening the metadata and blob stores")
    try:
        rt = await Runtime.open(settings)
    except BaseException:
        release_pid()
        raise
    helpers: list[asyncio.Task[None]] = []
    try:
        await rt.start_metrics()
        await rt.start_lakehouse()
        interval = notify.watchdog_interval()
        if interval:
            helpers.append(asyncio.create_task(_watchdog(notify, interval)))

        def on_ready() -> None:
            notify.send(f"READY=1\nSTATUS={_status_line(rt)}\nMAINPID={os.getpid()}")
            log.info("offloadd ready (config %s): %d topic(s)", config_path,
                     len(rt.daemon.topics))
            if notify.enabled:
                helpers.append(asyncio.create_task(_status_updates(notify, rt)))

        def reload() -> Settings:
            # runs in a worker thread (file I/O); sendto is thread-safe
            notify.send(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
            try:
                return config_mod.load(config_path)
            finally:
                notify.send("READY=1")

        def on_stopping() -> None:
            notify.send("STOPPING=1\nSTATUS=stopping: closing open segments")

        try:
            await rt.daemon.run(reload=reload, on_ready=on_ready, on_stopping=on_stopping,
                                trigger_file=pid_file.with_suffix(".trigger"))
        finally:
            _ignore(signal.SIGUSR1, signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
        log.info("offloadd stopped")
        return 0
    finally:
        for task in helpers:
            task.cancel()
        await rt.close()
        release_pid()
        notify.close()


def _ignore(*signals: signal.Signals) -> None:
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)


def _status_line(rt: Runtime) -> str:
    st = rt.daemon.status()
    return (f"offloading {len(st['topics'])} topic(s); buffer {st['buffer']['used'] / MiB:.1f} "
            f"of {st['buffer']['cap'] / MiB:.0f} MiB")


async def _status_updates(notify: Notifier, rt: Runtime, every_s: float = 5.0) -> None:
    last = ""
    while True:
        await asyncio.sleep(every_s)
        line = _status_line(rt)
        if line != last:
            notify.send(f"STATUS={line}")
            last = line


async def _watchdog(notify: Notifier, interval: float) -> None:
    # the pings come from the event loop itself: a wedged loop stops them and systemd restarts
    while True:
        notify.send("WATCHDOG=1")
        await asyncio.sleep(interval)

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
import socket

from offloadd import config as config_mod
from offloadd.config import Settings
from offloadd.daemon import remove_pid_file, write_pid_file
from offloadd.runtime import Runtime

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
    notify = Notifier()
    rt = await Runtime.open(settings)
    write_pid_file(settings.daemon.pid_file)
    watchdog: asyncio.Task[None] | None = None
    try:
        await rt.start_metrics()
        interval = notify.watchdog_interval()
        if interval:
            watchdog = asyncio.create_task(_watchdog(notify, interval))

        def on_ready() -> None:
            notify.send(f"READY=1\nSTATUS=offloading {len(rt.daemon.topics)} topic(s)\n"
                        f"MAINPID={os.getpid()}")
            log.info("offloadd %s ready: %d topic(s)", config_path, len(rt.daemon.topics))

        def reload() -> Settings:
            notify.send("RELOADING=1")
            try:
                return config_mod.load(config_path)
            finally:
                notify.send("READY=1")

        await rt.daemon.run(reload=reload, on_ready=on_ready,
                            trigger_file=settings.daemon.pid_file.with_suffix(".trigger"))
        notify.send("STOPPING=1")
        return 0
    finally:
        if watchdog is not None:
            watchdog.cancel()
        remove_pid_file(settings.daemon.pid_file)
        await rt.close()
        notify.close()


async def _watchdog(notify: Notifier, interval: float) -> None:
    while True:
        notify.send("WATCHDOG=1")
        await asyncio.sleep(interval)

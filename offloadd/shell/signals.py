"""The daemon's signals and its wait between discovery passes. Installed by
:meth:`Daemon.run`: ``SIGUSR1`` closes open segments now (every topic, or those ``offloadd
offload-now --topic`` wrote to the trigger file), ``SIGHUP`` reloads the configuration (read off
the event loop), ``SIGTERM``/``SIGINT`` stop. A part of :class:`~offloadd.shell.daemon.Daemon`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from offloadd.aio import first_of
from offloadd.config import Settings
from offloadd.errors import OffloaddError
from offloadd.model import TopicName
from offloadd.offload.scheduler import Scheduler

# the daemon's lines keep its logger name wherever its code lives (operators filter on it)
log = logging.getLogger("offloadd.shell.daemon")


class Signals:
    """The signal handlers of :class:`~offloadd.shell.daemon.Daemon` (a mixin)."""

    # what the handlers read of the daemon
    scheduler: Scheduler
    _stop: asyncio.Event
    _discovery_interval: float
    _reloading: asyncio.Task[None] | None
    request_stop: Callable[[], None]
    trigger: Callable[[list[TopicName] | None], None]
    default_trigger_topics: Callable[[], list[TopicName] | None]
    reload: Callable[[Settings], None]

    def _install_signals(self, trigger_file: Path | None,
                         reload: Callable[[], Settings] | None) -> list[int]:
        """SIGUSR1 closes segments now, SIGTERM/SIGINT stop, SIGHUP reloads (with ``reload``);
        the signals installed, to remove at the end."""
        handlers: dict[int, Callable[[], None]] = {
            signal.SIGUSR1: lambda: self._signal_trigger(trigger_file),
            signal.SIGTERM: self.request_stop,
            signal.SIGINT: self.request_stop,
        }
        if reload is not None:
            handlers[signal.SIGHUP] = lambda: self._signal_reload(reload)
        loop = asyncio.get_running_loop()
        for sig, fn in handlers.items():
            loop.add_signal_handler(sig, fn)
        return list(handlers)

    def _signal_trigger(self, trigger_file: Path | None) -> None:
        """SIGUSR1: all topics, or those ``offloadd offload-now --topic`` wrote down."""
        names: list[TopicName] | None = None
        if trigger_file is not None:
            try:
                text = trigger_file.read_text()
                trigger_file.unlink()
                names = [TopicName.parse(line.strip()) for line in text.splitlines()
                         if line.strip()] or None
            except FileNotFoundError:
                pass
            except (OSError, OffloaddError) as exc:
                log.warning("SIGUSR1: ignoring trigger file %s: %s", trigger_file, exc)
        if names is None:
            names = self.default_trigger_topics()
        log.info("SIGUSR1: closing open segments now (%s)",
                 "all topics" if names is None else ", ".join(map(str, names)) or "no topic")
        self.trigger(names)

    def _signal_reload(self, reload: Callable[[], Settings]) -> None:
        if self._reloading is not None and not self._reloading.done():
            log.warning("SIGHUP: a reload is already under way; ignoring this one")
            return
        self._reloading = asyncio.ensure_future(self._reload(reload))

    async def _reload(self, reload: Callable[[], Settings]) -> None:
        try:
            # reading and validating the file is blocking I/O: keep it off the event loop
            self.reload(await asyncio.to_thread(reload))
        except OffloaddError as exc:
            log.error("SIGHUP: configuration not reloaded, keeping the old one: %s", exc)

    async def _pause(self) -> None:
        """Until the next pass is due, a stop is requested or the ownership hook wakes us."""
        await first_of(self._stop.wait(), self.scheduler.wake.wait(),
                       timeout=self._discovery_interval)

"""``offloadd backfill --config F --topic T [--master URL]``: the command around :mod:`.job`.

Prints a summary on stdout at the end (also when segments failed), with ``--json`` the JSON
report instead; the progress bar and logs go to stderr. Exit codes: 0 all planned segments
offloaded, 1 some failed (they stay ASSIGNED: rerun), 2 bad usage/config, 130 interrupted
(SIGINT/SIGTERM: running Spark jobs are cancelled, committed segments stay, the rest is redone
by the next run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from typing import Any

from offloadd.backfill.job import BackfillFailed, run_backfill
from offloadd.backfill.progress import TerminalBar
from offloadd.backfill.spark import parse_conf, session
from offloadd.config import Settings
from offloadd.model.sizes import size_text


def backfill_command(settings: Settings, args: argparse.Namespace) -> int:
    import uvloop

    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per closed connection
    try:
        conf = parse_conf(args.spark_conf)
    except ValueError as exc:
        print(f"offloadd: {exc}", file=sys.stderr)
        return 2
    topic = args.topic
    bind = args.metrics_bind or (settings.metrics.bind if settings.metrics.enabled else None)
    started: list[Any] = []

    def spark() -> Any:
        s = session(args.master, app_name=f"offloadd backfill {topic}", conf=conf)
        started.append(s)
        return s

    async def go() -> int:
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        assert me is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, me.cancel)
        try:
            report = await run_backfill(settings, topic, spark=spark,
                                        max_attempts=args.max_attempts,
                                        sinks=[TerminalBar(str(topic))], metrics_bind=bind)
        except BackfillFailed as exc:
            _show(exc.report.to_json(), args.json)
            raise
        _show(report.to_json(), args.json)
        return 0

    try:
        return uvloop.run(go())
    except asyncio.CancelledError:
        print(f"offloadd: backfill of {topic} interrupted; committed segments stay, run it "
              "again to finish", file=sys.stderr)
        return 130
    finally:
        for s in started:
            with contextlib.suppress(Exception):
                s.stop()


def _show(report: dict[str, Any], as_json: bool) -> None:
    print(json.dumps(report) if as_json else report_text(report))


def report_text(r: dict[str, Any]) -> str:
    """The report of a run for a reader (``--json`` prints ``r`` itself)."""
    lines = [f"backfill {r['topic']}: {'OK' if r['ok'] else 'FAILED'}: "
             f"{r['offloaded_segments']} segment(s) offloaded ({r['new_segments']} new, "
             f"{r['redone_segments']} redone), {r['skipped_segments']} already offloaded, "
             f"{r['failed_segments']} failed after {r['failed_attempts']} failed attempt(s)",
             f"  {r['entries']:,} entries, {size_text(r['bytes'])} in {r['seconds']:.1f} s "
             f"({r['throughput_mib_s']} MiB/s while uploading), from {r['first'] or '-'} to "
             f"{r['last'] or '-'}"]
    if not r["ok"]:
        lines.append("  the failed segments stay assigned: run the same command again")
    return "\n".join(lines)

"""The ``offloadd`` command line (DESIGN §9). Exit codes: 0 ok, 1 failure, 2 bad usage/config."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from offloadd import __version__
from offloadd.errors import ConfigError, OffloaddError
from offloadd.model import Position, TopicName

log = logging.getLogger("offloadd")


def _positive_int(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return v


def _positive_float(text: str) -> float:
    v = float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return v


def _topic(text: str) -> TopicName:
    try:
        return TopicName.parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _position(text: str) -> Position:
    try:
        return Position.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="offloadd", description=__doc__)
    p.add_argument("--version", action="version", version=f"offloadd {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help_: str, *, config_required: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("--config", "-c", required=config_required,
                        help="TOML config file (default: the embedded standalone set-up)")
        return sp

    cmd("run", "run the daemon in the foreground (systemd Type=notify)", config_required=True)

    sp = cmd("standalone", "embedded writer + daemon + metrics, no external service")
    sp.add_argument("--duration", type=_positive_float, help="seconds to write (default: "
                    "until SIGTERM/SIGINT)")
    sp.add_argument("--rate", type=_positive_float, default=1_000_000,
                    help="total bytes/s written across all topics (default 1000000)")
    sp.add_argument("--entry-size", type=_positive_int, default=1024)
    sp.add_argument("--topics", type=_positive_int, default=3)

    sp = cmd("produce", "the embedded writer alone (history, live load)")
    g = sp.add_mutually_exclusive_group(required=True)
    g.add_argument("--topic", type=_topic)
    g.add_argument("--topics", type=_positive_int)
    sp.add_argument("--bytes", type=_positive_int, help="stop after this many bytes")
    sp.add_argument("--duration", type=_positive_float)
    sp.add_argument("--rate", type=_positive_float, help="total bytes/s")
    sp.add_argument("--entry-size", type=_positive_int, default=1024)

    sp = cmd("status", "per topic: segments by state, lag, last offloaded position")
    sp.add_argument("--json", action="store_true")

    sp = cmd("read", "print offloaded entries: ledger:entry<TAB>base64 per line")
    sp.add_argument("--topic", type=_topic, required=True)
    sp.add_argument("--from", dest="start", type=_position)
    sp.add_argument("--count", type=_positive_int)
    sp.add_argument("--raw", action="store_true", help="write raw payload bytes instead")

    sp = cmd("verify", "check every committed segment; exit 0 only if all is well")
    sp.add_argument("--topic", type=_topic, action="append")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--orphan-grace", type=float, default=300.0,
                    help="ignore unreferenced objects younger than this (s)")

    sp = cmd("offload-now", "close and upload the current segment now (SIGUSR1)")
    sp.add_argument("--topic", type=_topic, action="append")

    sp = cmd("gc", "apply retention and deletions, retry failed ones, sweep orphans")
    sp.add_argument("--grace", type=float, help="remove unreferenced objects older than this "
                    "(s; default [retention] orphan_grace_s)")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--dry-run", action="store_true", help="report, change nothing")

    sp = cmd("backfill", "upload a topic's closed history on Spark, then let streaming resume",
             config_required=True)
    sp.add_argument("--topic", type=_topic, required=True)
    sp.add_argument("--master", help="Spark master URL (default local[*])")
    sp.add_argument("--max-attempts", type=_positive_int, default=3,
                    help="attempts per segment before the run fails (default 3)")
    sp.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Spark configuration (repeatable)")
    sp.add_argument("--metrics-bind", metavar="HOST:PORT",
                    help="serve progress gauges here (default: [metrics] bind, if enabled)")

    sp = sub.add_parser("config", help="configuration tools")
    csub = sp.add_subparsers(dest="config_command", required=True)
    cc = csub.add_parser("check", help="validate a config file (exit 2 if invalid)")
    cc.add_argument("--config", "-c", required=False)
    csub.add_parser("reference", help="print the configuration reference (Markdown)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except ConfigError as exc:
        print(f"offloadd: config error: {exc}", file=sys.stderr)
        return 2
    except OffloaddError as exc:
        print(f"offloadd: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run(coro: Coroutine[Any, Any, int]) -> int:
    import uvloop

    return uvloop.run(coro)


def _settings(args: argparse.Namespace) -> Any:
    from offloadd.standalone import load_settings

    return load_settings(getattr(args, "config", None))


def _dispatch(args: argparse.Namespace) -> int:
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "run": _cmd_run,
        "standalone": _cmd_standalone,
        "produce": _cmd_produce,
        "status": _cmd_status,
        "read": _cmd_read,
        "verify": _cmd_verify,
        "offload-now": _cmd_offload_now,
        "gc": _cmd_gc,
        "backfill": _cmd_backfill,
        "config": _cmd_config,
    }
    return handlers[args.command](args)


def _setup_logs(settings: Any) -> None:
    from offloadd import logs
    from offloadd.config import secret_values

    logs.configure(settings.daemon.log_format, settings.daemon.log_level,
                   secret_values(settings))


# ---- commands ------------------------------------------------------------------------------
def _cmd_standalone(args: argparse.Namespace) -> int:
    from offloadd.standalone import run_standalone

    settings = _settings(args)
    _setup_logs(settings)
    summary = _run_dict(run_standalone(settings, duration=args.duration, rate=args.rate,
                                       entry_size=args.entry_size, topics=args.topics,
                                       config_path=args.config))
    print(json.dumps(summary))
    return 1 if summary.get("drained") is False else 0


def _run_dict(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    async def wrap() -> int:
        out.update(await coro)
        return 0

    _run(wrap())
    return out


def _cmd_run(args: argparse.Namespace) -> int:
    # SIGHUP and SIGUSR1 terminate by default: ignore them before the second or so of imports
    # (run_service keeps them ignored until the daemon's handlers are in place)
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    from offloadd.service import run_service

    settings = _settings(args)
    _setup_logs(settings)
    return _run(run_service(settings, args.config))


def _cmd_produce(args: argparse.Namespace) -> int:
    from offloadd import wiring
    from offloadd.ledger.local import LocalLedgerWriter
    from offloadd.produce import produce, topic_names

    if args.bytes is None and args.duration is None:
        print("offloadd: produce needs --bytes N or --duration S", file=sys.stderr)
        return 2
    settings = _settings(args)
    _setup_logs(settings)
    topics = [args.topic] if args.topic else topic_names(args.topics)

    async def go() -> int:
        md = await wiring.open_metadata(settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            writer = LocalLedgerWriter(settings.source.path, md, wiring.rollover_policy(settings),
                                       max_entry_bytes=settings.source.max_entry_bytes)
            try:
                stats = await produce(writer, topics, entry_size=args.entry_size,
                                      total_bytes=args.bytes, rate=args.rate,
                                      duration=args.duration, stop=stop)
            finally:
                await writer.close()
        finally:
            await md.close()
        print(json.dumps({"entries": stats.entries, "bytes": stats.bytes,
                          "seconds": round(stats.seconds, 3),
                          "topics": [str(t) for t in topics]}))
        return 0

    return _run(go())


def _cmd_status(args: argparse.Namespace) -> int:
    from offloadd.status import collect, render_text

    settings = _settings(args)
    _setup_logs(settings)

    async def go() -> int:
        st = await collect(settings)
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            print(render_text(st))
        return 0

    return _run(go())


def _cmd_read(args: argparse.Namespace) -> int:
    from offloadd import wiring
    from offloadd.read.reader import TierReader

    settings = _settings(args)
    _setup_logs(settings)

    async def go() -> int:
        md = await wiring.open_metadata(settings)
        bs = await wiring.open_blobstore(settings)
        try:
            reader = TierReader(md, bs, prefetch=settings.offload.read_prefetch_blocks,
                                key_prefix=_prefix(settings))
            out = sys.stdout.buffer
            async for e in reader.read(args.topic, args.start, args.count):
                if args.raw:
                    out.write(e.payload)
                else:
                    out.write(f"{e.position}\t".encode() + base64.b64encode(e.payload) + b"\n")
            out.flush()
        finally:
            await bs.close()
            await md.close()
        return 0

    try:
        return _run(go())
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _prefix(settings: Any) -> str:
    return ""  # drivers apply their own key prefix


def _cmd_verify(args: argparse.Namespace) -> int:
    from offloadd import wiring
    from offloadd.metadata import managed_ledger
    from offloadd.verify import verify

    settings = _settings(args)
    _setup_logs(settings)

    async def go() -> int:
        md = await wiring.open_metadata(settings)
        bs = await wiring.open_blobstore(settings)
        src = wiring.open_source(settings, md, read_only=True)
        try:
            topics = args.topic or [TopicName.from_managed_ledger(n)
                                    for n in await managed_ledger.list_names(md)]
            rep = await verify(md, bs, src, topics, prefix=_prefix(settings),
                               grace_s=args.orphan_grace)
        finally:
            await src.close()
            await bs.close()
            await md.close()
        if args.json:
            print(json.dumps(rep.to_json(), indent=2))
        else:
            for t in rep.topics:
                mark = "ok " if t.ok else "BAD"
                print(f"{mark} {t.topic}: {t.segments} segments, {t.entries} entries, "
                      f"last offloaded {t.last_offloaded}, gaps {len(t.gaps)}, "
                      f"duplicates {t.duplicates}, checksum mismatches {t.checksum_mismatches}")
                for e in t.errors + t.gaps:
                    print(f"    {e}")
            print(f"orphans: {len(rep.orphans)}")
            for o in rep.orphans:
                print(f"    {o}")
            print("verify: OK" if rep.ok else "verify: FAILED")
        return 0 if rep.ok else 1

    return _run(go())


def _cmd_gc(args: argparse.Namespace) -> int:
    import time

    from offloadd import wiring
    from offloadd.retention.gc import gc_pass, render_text

    settings = _settings(args)
    _setup_logs(settings)
    if args.grace is not None and args.grace < 0:
        print("offloadd: --grace must not be negative", file=sys.stderr)
        return 2

    async def go() -> int:
        md = await wiring.open_metadata(settings)
        try:
            bs = await wiring.open_blobstore(settings)
            try:
                try:
                    src = wiring.open_source(settings, md, read_only=True)
                except ConfigError as exc:  # deletions and the sweep need no source
                    log.warning("gc without the ledger source: %s", exc)
                    src = None
                try:
                    rep = await gc_pass(md, bs, src, settings, now=time.time(),
                                        grace_s=args.grace, dry_run=args.dry_run)
                finally:
                    if src is not None:
                        await src.close()
            finally:
                await bs.close()
        finally:
            await md.close()
        print(json.dumps(rep.to_json(), indent=2) if args.json else render_text(rep))
        return 0 if rep.ok else 1

    return _run(go())


def _cmd_backfill(args: argparse.Namespace) -> int:
    from offloadd.backfill.command import backfill_command

    settings = _settings(args)
    _setup_logs(settings)
    return backfill_command(settings, args)


def _cmd_offload_now(args: argparse.Namespace) -> int:
    from offloadd.daemon import read_pid_file

    settings = _settings(args)
    pid_file = Path(settings.daemon.pid_file)
    pid = read_pid_file(pid_file)
    if args.topic:
        trig = pid_file.with_suffix(".trigger")
        trig.write_text("".join(f"{t}\n" for t in args.topic))
    os.kill(pid, signal.SIGUSR1)
    print(f"asked offloadd (pid {pid}) to close its open segment(s) now")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from offloadd import config

    if args.config_command == "reference":
        print(config.reference_markdown(), end="")
        return 0
    settings = config.load(args.config)
    print(f"{args.config or '<defaults>'}: ok (metadata {settings.metadata.url.split('@')[-1]}, "
          f"driver {settings.blobstore.driver}, {len(settings.namespaces)} namespace and "
          f"{len(settings.topics)} topic override(s))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

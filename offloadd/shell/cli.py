"""offloadd: stream Pulsar managed ledgers into object storage, read them back, check them.

Every command takes --config FILE (a TOML file; without it, the embedded standalone set-up
under ./data) and --log-level. Exit codes: 0 ok, 1 failure, 2 bad usage or configuration.
Run `offloadd COMMAND --help` for a command's options and examples."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import math
import os
import signal
import sys
import textwrap
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from offloadd import __version__
from offloadd.errors import ConfigError, OffloaddError
from offloadd.model import Position, TopicName
from offloadd.shell.ttyline import StatusLine

log = logging.getLogger("offloadd")


def _positive_int(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return v


def _positive_float(text: str) -> float:
    v = _finite(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return v


def _finite(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v):  # float() takes "nan" and "inf": never a duration, rate or grace
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return v


def _compressions(text: str) -> tuple[Any, ...]:
    from offloadd.format.compression import Compression

    try:
        return tuple(Compression.parse(c) for c in text.split(",") if c.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _payload_args(sp: argparse.ArgumentParser, *, default_compression: str) -> None:
    sp.add_argument("--payload", choices=("pulsar", "raw"), default="pulsar",
                    help="pulsar: Pulsar-format entries (batches of JSON messages with keys, "
                    "properties, event times), as a broker stores them; raw: random bytes, for "
                    "benchmarks (default pulsar)")
    sp.add_argument("--compression", type=_compressions, default=default_compression,
                    metavar="CODEC[,CODEC...]",
                    help="pulsar entries: one producer per codec (none, lz4, zlib, zstd, "
                    f"snappy), used in turn (default {default_compression})")
    sp.add_argument("--max-batch", type=_positive_int, default=16, metavar="N",
                    help="pulsar entries: at most this many messages per entry (default 16)")


def _shape(args: argparse.Namespace) -> Any:
    from offloadd.shell.produce import PulsarShape

    codecs = args.compression
    if isinstance(codecs, str):  # argparse does not convert a string default
        codecs = _compressions(codecs)
    return PulsarShape(compression=codecs, max_batch=args.max_batch)


def _topic(text: str) -> TopicName:
    try:
        return TopicName.parse(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _position(text: str) -> Position:
    try:
        return Position.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a position is LEDGER:ENTRY, e.g. 42:0)"
                                         ) from None


def _non_negative_float(text: str) -> float:
    v = _finite(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} must not be negative")
    return v


TOPIC_HELP = "a full topic name, e.g. persistent://public/default/orders"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _common_options(sp: argparse.ArgumentParser, *, config_required: bool = False) -> None:
    """``--config`` and ``--log-level``, the same on every command."""
    sp.add_argument("--config", "-c", required=config_required, metavar="FILE",
                    help="TOML configuration file" + (
                        "" if config_required else " (default: the embedded standalone "
                        "set-up under ./data)"))
    sp.add_argument("--log-level", choices=LOG_LEVELS, type=str.upper,
                    help="log verbosity on stderr (default: [daemon] log_level, INFO)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="offloadd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"offloadd {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help_: str, examples: str = "", *, config_required: bool = False,
            description: str = "") -> argparse.ArgumentParser:
        epilog = "examples:\n" + examples.rstrip() if examples else None
        # the raw formatter keeps the examples' lines; the description is wrapped here
        sp = sub.add_parser(name, help=help_, description=textwrap.fill(description or help_, 79),
                            epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
        _common_options(sp, config_required=config_required)
        return sp

    cmd("run", "run the daemon in the foreground (systemd Type=notify)",
        "  offloadd run --config /etc/offloadd/offloadd.toml\n",
        config_required=True)

    sp = cmd("standalone", "embedded writer + daemon + metrics, no external service",
             "  offloadd standalone --duration 30 --rate 2000000 --topics 3\n"
             "  offloadd standalone --config my.toml          # until SIGTERM or Ctrl-C\n")
    sp.add_argument("--duration", type=_positive_float, metavar="SECONDS",
                    help="seconds to write (default: until SIGTERM/SIGINT)")
    sp.add_argument("--rate", type=_positive_float, default=1_000_000, metavar="BYTES_PER_S",
                    help="total bytes/s written across all topics (default 1000000)")
    sp.add_argument("--entry-size", type=_positive_int, default=1024, metavar="BYTES",
                    help="payload bytes per entry (default 1024)")
    sp.add_argument("--topics", type=_positive_int, default=3, metavar="K",
                    help="write K topics, persistent://public/default/topic-0 .. topic-(K-1) "
                    "(default 3)")
    _payload_args(sp, default_compression="lz4,zstd,snappy,zlib,none")

    sp = cmd("produce", "the embedded writer alone (history, live load)",
             "  offloadd produce --topic persistent://public/default/orders --bytes 104857600\n"
             "  offloadd produce --topics 4 --duration 60 --rate 4000000\n")
    g = sp.add_mutually_exclusive_group(required=True)
    g.add_argument("--topic", type=_topic, help="the one topic to write: " + TOPIC_HELP)
    g.add_argument("--topics", type=_positive_int, metavar="K",
                   help="write K topics, persistent://public/default/topic-0 .. topic-(K-1)")
    sp.add_argument("--bytes", type=_positive_int, metavar="N", help="stop after N bytes")
    sp.add_argument("--duration", type=_positive_float, metavar="SECONDS",
                    help="stop after this many seconds")
    sp.add_argument("--rate", type=_positive_float, metavar="BYTES_PER_S",
                    help="total bytes/s across topics (default: as fast as possible)")
    sp.add_argument("--entry-size", type=_positive_int, default=1024, metavar="BYTES",
                    help="payload bytes per entry (default 1024)")
    _payload_args(sp, default_compression="none")

    sp = cmd("status", "per topic: failing or not, last error, lag, segments by state",
             "  offloadd status --config /etc/offloadd/offloadd.toml\n"
             "  offloadd status --topic persistent://public/default/orders\n"
             "  offloadd status --json | jq '.topics[] | {topic, lag}'\n",
             description="Per topic: failing or not and the last error, lag (entries, bytes, "
             "seconds), segments by state, last offloaded position, owner. Reads the metadata "
             "store (read-only; it must exist) and the running daemon's /status when it "
             "answers. Exit 0 when all is well, 1 when a topic is failing, 3 when data was "
             "lost to retention.")
    sp.add_argument("--json", action="store_true",
                    help="one JSON document on stdout instead of text (for scripts)")
    sp.add_argument("--topic", type=_topic, action="append", metavar="TOPIC",
                    help="only this topic (repeatable), e.g. persistent://public/default/orders")

    sp = cmd("read", "print offloaded entries: LEDGER:ENTRY<TAB>base64 per line",
             "  offloadd read --topic persistent://public/default/orders --count 5\n"
             "  offloadd read --topic persistent://public/default/orders --from 42:1000 "
             "--count 10\n"
             "  offloadd read --topic persistent://public/default/orders --raw > payloads.bin\n",
             description="Print offloaded entries in log order, one per line as "
             "LEDGER:ENTRY<TAB>base64(payload). Exits 1 when --from names an entry the tier "
             "does not hold (past the end, or deleted by retention).")
    sp.add_argument("--topic", type=_topic, required=True, help=TOPIC_HELP)
    sp.add_argument("--from", dest="start", type=_position, metavar="L:E",
                    help="start at ledger L, entry E, e.g. 42:0 (default: the first offloaded "
                    "entry)")
    sp.add_argument("--count", type=_positive_int, metavar="N",
                    help="print at most N entries (default: all)")
    sp.add_argument("--raw", action="store_true",
                    help="write the raw payload bytes, concatenated, instead of lines")

    sp = cmd("verify", "check every committed segment; exit 0 only if all is well",
             "  offloadd verify --config /etc/offloadd/offloadd.toml\n"
             "  offloadd verify --topic persistent://public/default/orders --json\n",
             description="Read every committed segment back and check it: contiguous, every "
             "block and checksum right, entries equal to the source's where it still has "
             "them, no orphan objects. Read-only. Exit 0 only if all is well.")
    sp.add_argument("--topic", type=_topic, action="append",
                    help=TOPIC_HELP + " (repeatable; default: every topic)")
    sp.add_argument("--json", action="store_true",
                    help="one JSON report on stdout instead of text (for scripts)")
    sp.add_argument("--orphan-grace", type=_non_negative_float, default=300.0,
                    metavar="SECONDS",
                    help="ignore unreferenced objects younger than this (default 300)")

    sp = cmd("offload-now", "close and upload the open segment(s) now",
             "  offloadd offload-now --config /etc/offloadd/offloadd.toml\n"
             "  offloadd offload-now --topic persistent://public/default/orders --wait\n"
             "  offloadd offload-now --url http://broker-1:9105 --wait   # token: "
             "[metrics] control_token\n",
             description="Close the open segment(s) now and upload them. Without --wait or "
             "--url: SIGUSR1 to the daemon named by the locked [daemon] pid_file. With --wait "
             "or --url: POST /offload-now on the daemon's metrics endpoint, then (with --wait) "
             "block until the segment is committed or an attempt at it fails, and print the "
             "result. Exit 1 if a topic failed, timed out or is not served there.")
    sp.add_argument("--topic", type=_topic, action="append",
                    help=TOPIC_HELP + " (repeatable; default: [daemon] offload_now_topics, "
                    "or every topic)")
    sp.add_argument("--wait", action="store_true",
                    help="wait until the closed segment is committed or fails")
    sp.add_argument("--timeout", type=_positive_float, default=300.0, metavar="SECONDS",
                    help="with --wait: give up after this long (default 300)")
    sp.add_argument("--url", metavar="URL",
                    help="the daemon's metrics endpoint, e.g. http://127.0.0.1:9105 (default "
                    "with --wait: [metrics] bind)")
    sp.add_argument("--json", action="store_true", help="print the results as JSON")

    sp = cmd("gc", "apply retention and deletions, retry failed ones, sweep orphans",
             "  offloadd gc --config /etc/offloadd/offloadd.toml --dry-run\n"
             "  offloadd gc --config /etc/offloadd/offloadd.toml --grace 3600 --json\n")
    sp.add_argument("--grace", type=_finite, metavar="SECONDS",
                    help="remove unreferenced objects older than this "
                    "(default [retention] orphan_grace_s)")
    sp.add_argument("--json", action="store_true",
                    help="one JSON report on stdout instead of text (for scripts)")
    sp.add_argument("--dry-run", action="store_true", help="report, change nothing")

    sp = cmd("backfill", "upload a topic's closed history on Spark, then let streaming resume",
             "  offloadd backfill --config offloadd.toml --topic "
             "persistent://public/default/orders\n"
             "  offloadd backfill --config offloadd.toml --topic "
             "persistent://public/default/orders --master spark://spark-master:7077\n",
             config_required=True,
             description="Upload a topic's closed history on Spark, then let streaming "
             "resume. Needs the spark extra (pip install 'offloadd[spark]') and Java 17.")
    sp.add_argument("--topic", type=_topic, required=True, help=TOPIC_HELP)
    sp.add_argument("--master", metavar="URL", help="Spark master URL (default local[*])")
    sp.add_argument("--max-attempts", type=_positive_int, default=3, metavar="N",
                    help="attempts per segment before the run fails (default 3)")
    sp.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="extra Spark configuration (repeatable)")
    sp.add_argument("--metrics-bind", metavar="HOST:PORT",
                    help="serve progress gauges here (default: [metrics] bind if free, else "
                    "the next port)")

    from offloadd.lakehouse.command import add_commands

    add_commands(sub, _topic, _positive_int, _common_options)

    sp = sub.add_parser("config", help="configuration tools", description="configuration tools")
    csub = sp.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    cc = csub.add_parser("check", help="validate a config file (exit 2 if invalid)",
                         description="Validate a config file and the OFFLOADD_* environment; "
                         "exit 2 with one line naming the problem if invalid.")
    cc.add_argument("--config", "-c", required=False, metavar="FILE",
                    help="TOML configuration file (default: check the defaults and the "
                    "environment)")
    csub.add_parser("reference", help="print the configuration reference (Markdown)",
                    description="Print every configuration key (Markdown).")
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
    from offloadd.shell.standalone import load_settings

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
        "query": _cmd_query,
        "lakehouse": _cmd_lakehouse,
    }
    return handlers[args.command](args)


def _setup_logs(settings: Any, args: argparse.Namespace | None = None) -> None:
    from offloadd import logs
    from offloadd.config import secret_values

    level = getattr(args, "log_level", None) or settings.daemon.log_level
    logs.configure(settings.daemon.log_format, level, secret_values(settings))


# ---- commands ------------------------------------------------------------------------------
def _cmd_standalone(args: argparse.Namespace) -> int:
    from offloadd.shell.standalone import run_standalone

    settings = _settings(args)
    _setup_logs(settings, args)
    summary = _run_dict(run_standalone(settings, duration=args.duration, rate=args.rate,
                                       entry_size=args.entry_size, topics=args.topics,
                                       config_path=args.config, payload=args.payload,
                                       shape=_shape(args)))
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
    from offloadd.shell.service import run_service

    settings = _settings(args)
    _setup_logs(settings, args)
    return _run(run_service(settings, args.config))


def _cmd_produce(args: argparse.Namespace) -> int:
    from offloadd import wiring
    from offloadd.ledger.local import LocalLedgerWriter, StoreLock
    from offloadd.shell.produce import produce, topic_names

    if args.bytes is None and args.duration is None:
        print("offloadd: produce needs --bytes N or --duration S", file=sys.stderr)
        return 2
    settings = _settings(args)
    _setup_logs(settings, args)
    topics = [args.topic] if args.topic else topic_names(args.topics)

    # one writer per store: a second one would close this one's open ledgers under it
    lock = StoreLock.acquire(settings.source.path, StoreLock.WRITER, holder="offloadd produce")

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
                                      duration=args.duration, stop=stop,
                                      payload=args.payload, shape=_shape(args))
            finally:
                await writer.close()
        finally:
            await md.close()
        out = {"entries": stats.entries, "bytes": stats.bytes,
               "seconds": round(stats.seconds, 3), "topics": [str(t) for t in topics]}
        if stats.digests:
            out["sent"] = {str(t): d.to_json() for t, d in stats.digests.items()}
        print(json.dumps(out))
        return 0

    try:
        return _run(go())
    finally:
        lock.release()


def _cmd_status(args: argparse.Namespace) -> int:
    from offloadd.shell.status import collect, exit_code, render_text

    settings = _settings(args)
    _setup_logs(settings, args)

    async def go() -> int:
        st = await collect(settings, args.topic)
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            print(render_text(st))
        return exit_code(st)

    return _run(go())


def _cmd_read(args: argparse.Namespace) -> int:
    from offloadd import wiring
    from offloadd.read.reader import TierReader

    settings = _settings(args)
    _setup_logs(settings, args)

    async def go() -> int:
        md = await wiring.open_metadata(settings, read_only=True)
        try:
            bs = await wiring.open_blobstore(settings)
        except BaseException:
            await md.close()
            raise
        try:
            reader = TierReader(md, bs, prefetch=settings.offload.prefetch_blocks())
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


def _cmd_verify(args: argparse.Namespace) -> int:
    from offloadd import wiring
    from offloadd.metadata import managed_ledger
    from offloadd.read.verify import verify

    settings = _settings(args)
    _setup_logs(settings, args)

    async def go() -> int:
        md = await wiring.open_metadata(settings, read_only=True)
        try:
            bs = await wiring.open_blobstore(settings)
            try:
                src = wiring.connect_source(settings, md, read_only=True)
                try:
                    topics = args.topic or [TopicName.from_managed_ledger(n)
                                            for n in await managed_ledger.list_names(md)]
                    with StatusLine(sys.stderr, prefix="verify") as line:
                        rep = await verify(md, bs, src, topics,
                                           grace_s=args.orphan_grace, on_progress=line.show)
                finally:
                    await src.source.close()
            finally:
                await bs.close()
        finally:
            await md.close()
        if args.json:
            print(json.dumps(rep.to_json(), indent=2))
        else:
            for t in rep.topics:
                mark = "ok " if t.ok else "BAD"
                print(f"{mark} {t.topic}: {t.segments} segments, {t.entries} entries, "
                      f"last offloaded {t.last_offloaded}, gaps {len(t.gaps)}, "
                      f"duplicates {t.duplicates}, checksum mismatches {t.checksum_mismatches}"
                      + (f", differences from the source {t.source_mismatches}"
                         if t.source_mismatches else ""))
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
    _setup_logs(settings, args)
    if args.grace is not None and args.grace < 0:
        print("offloadd: --grace must not be negative", file=sys.stderr)
        return 2

    async def go() -> int:
        md = await wiring.open_metadata(settings, must_exist=True)  # gc never creates a store
        try:
            tier = await wiring.open_tier(settings)
            try:
                try:
                    src = wiring.connect_source(settings, md, read_only=True)
                except ConfigError as exc:  # deletions and the sweep need no source
                    log.warning("gc without the ledger source: %s", exc)
                    src = None
                try:
                    with StatusLine(sys.stderr, prefix="gc") as line:
                        rep = await gc_pass(md, tier, src, wiring.gc_settings(settings),
                                            now=time.time(), grace_s=args.grace,
                                            dry_run=args.dry_run, on_progress=line.show)
                finally:
                    if src is not None:
                        await src.source.close()
            finally:
                await tier.store.close()
        finally:
            await md.close()
        print(json.dumps(rep.to_json(), indent=2) if args.json else render_text(rep))
        return 0 if rep.ok else 1

    return _run(go())


# Optional features (pyproject's [project.optional-dependencies]): extra -> modules it brings.
EXTRAS: dict[str, tuple[str, ...]] = {"spark": ("pyspark", "pyarrow")}


def _need_extra(extra: str, command: str) -> None:
    """``OffloaddError`` naming what to install when an optional feature's packages are
    missing (a daemon install leaves them out)."""
    import importlib.util

    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if missing:
        raise OffloaddError(
            f"{command} needs the '{extra}' extra ({', '.join(missing)} not installed): "
            f"install it with  pip install 'offloadd[{extra}]'  (or  uv pip install "
            f"'offloadd[{extra}]'  into this environment; the backfill container image "
            "has it)")


def _cmd_backfill(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _need_extra("spark", "offloadd backfill")
    from offloadd.backfill.command import backfill_command

    _setup_logs(settings, args)
    return backfill_command(settings, args)


def _cmd_query(args: argparse.Namespace) -> int:
    from offloadd.lakehouse.command import cmd_query

    settings = _settings(args)
    _setup_logs(settings, args)
    return cmd_query(settings, args)


def _cmd_lakehouse(args: argparse.Namespace) -> int:
    from offloadd.lakehouse.command import cmd_lakehouse

    settings = _settings(args)
    _setup_logs(settings, args)
    return cmd_lakehouse(settings, args, _run)


def _cmd_offload_now(args: argparse.Namespace) -> int:
    from offloadd.shell.pidfile import read_pid_file

    settings = _settings(args)
    if args.wait or args.url:
        return _offload_now_http(settings, args)
    pid_file = Path(settings.daemon.pid_file)
    pid = read_pid_file(pid_file)  # refuses a stale file or a process that is not offloadd
    if args.topic:
        trig = pid_file.with_suffix(".trigger")
        trig.write_text("".join(f"{t}\n" for t in args.topic))
    os.kill(pid, signal.SIGUSR1)
    print(f"asked offloadd (pid {pid}) to close its open segment(s) now")
    return 0


def _offload_now_http(settings: Any, args: argparse.Namespace) -> int:
    """POST /offload-now on the daemon's metrics endpoint (``--url`` or ``[metrics] bind``)."""
    import urllib.error
    import urllib.request

    url = args.url
    if url is None:
        if not settings.metrics.enabled:
            raise ConfigError("offload-now --wait talks to the daemon's metrics endpoint, "
                              "which [metrics] enabled = false turns off: enable it, or give "
                              "--url, or drop --wait (then SIGUSR1 is sent)")
        host, _, port = settings.metrics.bind.rpartition(":")
        host = host.strip("[]")
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    endpoint = url.rstrip("/") + "/offload-now"
    body = {"topics": [str(t) for t in args.topic] if args.topic else None,
            "wait": bool(args.wait), "timeout_s": args.timeout}
    req = urllib.request.Request(endpoint, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    token = settings.metrics.control_token
    if token is not None:
        req.add_header("Authorization", f"Bearer {token.get_secret_value()}")
    try:
        with urllib.request.urlopen(req, timeout=args.timeout + 30) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            why = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            why = exc.reason
        raise OffloaddError(f"{endpoint}: HTTP {exc.code}: {why}") from None
    except (OSError, ValueError) as exc:
        raise OffloaddError(f"{endpoint}: no answer from offloadd ({exc}); is it running, "
                            "with its metrics endpoint there?") from None
    results = answer.get("results", [])
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        for r in results:
            line = f"{r['topic']}: {r['result']}"
            if r.get("result") == "committed":
                line += f" up to {r['last_committed']} in {r['seconds']:.1f}s"
            elif r.get("target"):
                line += f" (target {r['target']}, last committed {r.get('last_committed')})"
            if r.get("error"):
                line += f": {r['error']}"
            print(line)
        if not results:
            print("no topic to close")
    return 0 if answer.get("ok") else 1


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

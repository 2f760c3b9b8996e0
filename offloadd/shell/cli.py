"""offloadd: stream Pulsar managed ledgers into object storage, read them back, check them.

Every command takes --config FILE (a TOML file; without it, the embedded standalone set-up
under ./data) and --log-level. Exit codes: 0 ok, 1 failure, 2 bad usage or configuration,
75 the daemon's metrics port stayed in use ([metrics] bind_retry_s; a restart may work).
Run `offloadd COMMAND --help` for a command's options and examples."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from offloadd import __version__
from offloadd.errors import ConfigError, OffloaddError
from offloadd.model import Position, TopicName
from offloadd.model.sizes import SIZE_UNITS, parse_size
from offloadd.shell import commands

log = logging.getLogger("offloadd")


# Upper bounds of the arguments that size what the process allocates: a typo of a few digits
# must be refused, not grow the process until the machine swaps (--topics 1000000000 reached
# 2.4 GB and never ended; --entry-size 10000000000000 ended in a traceback).
MAX_TOPICS = 100_000
MAX_ENTRY_SIZE = 64 * 1024 * 1024  # far above Pulsar's own 5 MiB default maxMessageSize


def _positive_int(text: str) -> int:
    # ASCII digits only: int() also takes "١٢", "1_000" and " 12 "
    if not text.isascii() or not text.isdigit() or (len(text) <= 30 and int(text) <= 0):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a positive integer")
    if len(text) > 30:  # over 4300 digits int() raises ValueError; no size or count has 30
        raise argparse.ArgumentTypeError(f"{text[:20]}... ({len(text)} digits) is too large")
    return int(text)


def _at_most(parse_one: Callable[[str], int], limit: int, what: str,
             name: str) -> Callable[[str], int]:
    """``parse_one``, refusing values above ``limit`` (named ``what`` in the refusal); ``name``
    is what argparse says when the value does not parse at all."""

    def parse(text: str) -> int:
        v = parse_one(text)
        if v > limit:
            raise argparse.ArgumentTypeError(f"{v} is more than the {limit:,} {what} allowed")
        return v

    parse.__name__ = name
    return parse


def _size(text: str) -> int:
    """A positive number of bytes: an integer, or a size with a unit ("64MiB", "2MB")."""
    if text.isascii() and text.strip().isdigit():
        return _positive_int(text.strip())
    try:
        v = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size")
    return v


def _rate(text: str) -> float:
    """A positive number of bytes per second: a number, or a size with a unit ("2MB")."""
    try:
        float(text)
    except ValueError:
        pass
    else:
        return _positive_float(text)  # a plain number, with its own refusals (nan, inf)
    try:
        v = parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a rate: bytes per second as a number, or a size with a "
            f"unit per second: {SIZE_UNITS}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive rate")
    return float(v)


_topic_count = _at_most(_positive_int, MAX_TOPICS, "topics", "integer")
_entry_size = _at_most(_size, MAX_ENTRY_SIZE, "bytes per entry", "size")


def _positive_float(text: str) -> float:
    v = _finite(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return v


def _finite(text: str) -> float:
    try:
        if not text.isascii():  # float() also takes other scripts' digits
            raise ValueError(text)
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
    sp.add_argument("--transactions", action="store_true",
                    help="pulsar entries: two in three are messages of transactions (several "
                    "open at once), one transaction in four is aborted, and commit/abort "
                    "markers follow as a broker writes them; the JSON adds visible_messages "
                    "(what a read-committed consumer sees)")


def _policy_bytes(text: str) -> int:
    """A Pulsar offload threshold: -1 (none), 0, or a size ("10MiB")."""
    t = text.strip()
    if t in ("-1", "0"):
        return int(t)
    return _size(text)


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
    _log_level(sp)


def _log_level(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--log-level", choices=LOG_LEVELS, type=str.upper,
                    help="log verbosity on stderr (default: [daemon] log_level, INFO)")


# argparse names a type function in some refusals ("invalid _positive_int value"): give each
# the name a user reads, never the internal one
for _fn, _name in ((_positive_int, "positive integer"), (_positive_float, "positive number"),
                   (_finite, "number"), (_compressions, "compression list"),
                   (_topic, "topic name"), (_position, "position"),
                   (_non_negative_float, "non-negative number"), (_size, "size"),
                   (_rate, "rate"), (_policy_bytes, "size")):
    _fn.__name__ = _name


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
             "  offloadd standalone --duration 30 --rate 2MB --topics 3\n"
             "  offloadd standalone --config my.toml          # until SIGTERM or Ctrl-C\n"
             "  offloadd standalone --duration 10 --json | jq .drained\n")
    sp.add_argument("--json", action="store_true",
                    help="the summary as one JSON document on stdout instead of text (for scripts)")
    sp.add_argument("--duration", type=_positive_float, metavar="SECONDS",
                    help="seconds to write (default: until SIGTERM/SIGINT)")
    sp.add_argument("--rate", type=_rate, default=1_000_000, metavar="BYTES_PER_S",
                    help="total bytes/s written across all topics, a number or a size such as "
                    "2MB or 1MiB (default 1000000)")
    sp.add_argument("--entry-size", type=_entry_size, default=1024, metavar="BYTES",
                    help="payload bytes per entry, e.g. 1024 or 4KiB (default 1024, at most "
                    f"{MAX_ENTRY_SIZE:,})")
    sp.add_argument("--topics", type=_topic_count, default=3, metavar="K",
                    help="write K topics, persistent://public/default/topic-0 .. topic-(K-1) "
                    f"(default 3, at most {MAX_TOPICS:,})")
    _payload_args(sp, default_compression="lz4,zstd,snappy,zlib,none")
    sp.add_argument("--schema", choices=("avro", "json"),
                    help="register a schema (an Order record) for each topic and write "
                    "messages of it, Avro binary or JSON, uncompressed, each carrying its "
                    "schema_version (replaces --payload and --compression; with "
                    "--transactions, inside transactions): the tables get typed columns")

    sp = cmd("produce", "the embedded writer alone (history, live load)",
             "  offloadd produce --topic persistent://public/default/orders --bytes 100MiB\n"
             "  offloadd produce --topics 4 --duration 60 --rate 4MB --json\n")
    sp.add_argument("--json", action="store_true",
                    help="the totals as one JSON document on stdout instead of text (for scripts)")
    g = sp.add_mutually_exclusive_group(required=True)
    g.add_argument("--topic", type=_topic, help="the one topic to write: " + TOPIC_HELP)
    g.add_argument("--topics", type=_topic_count, metavar="K",
                   help="write K topics, persistent://public/default/topic-0 .. topic-(K-1) "
                   f"(at most {MAX_TOPICS:,})")
    sp.add_argument("--bytes", type=_size, metavar="N",
                    help="stop after N bytes, e.g. 104857600 or 100MiB")
    sp.add_argument("--duration", type=_positive_float, metavar="SECONDS",
                    help="stop after this many seconds")
    sp.add_argument("--rate", type=_rate, metavar="BYTES_PER_S",
                    help="total bytes/s across topics, a number or a size such as 2MB or 1MiB "
                    "(default: as fast as possible)")
    sp.add_argument("--entry-size", type=_entry_size, default=1024, metavar="BYTES",
                    help="payload bytes per entry, e.g. 1024 or 4KiB (default 1024, at most "
                    f"{MAX_ENTRY_SIZE:,})")
    _payload_args(sp, default_compression="none")
    sp.add_argument("--schema", choices=("avro", "json"),
                    help="register a schema for each topic in the embedded store's schema "
                    "registry (an Order record) and write messages of it, Avro binary or JSON, "
                    "each carrying its schema_version (replaces --payload)")
    sp.add_argument("--schema-file", type=Path, metavar="PATH",
                    help="with --schema: register this Avro record schema (JSON) instead, e.g. "
                    "the Order record with a field added: a new version when it differs from "
                    "the latest; messages fill fields the Order record lacks with their "
                    "defaults")

    sp = cmd("topic-policy", "set or remove a topic's offload policy as Pulsar keeps it "
             "(embedded store)",
             "  offloadd topic-policy --topic persistent://public/default/orders "
             "--threshold 0\n"
             "  offloadd topic-policy --topic persistent://public/default/orders --global "
             "--threshold-seconds 3600 --json\n"
             "  offloadd topic-policy --topic persistent://public/default/orders --remove\n",
             description="Write the topic's offload policies to its namespace's "
             "__change_events topic of the embedded store, as a Pulsar broker does for "
             "pulsar-admin topics set-offload-policies / remove-offload-policies: the daemon "
             "applies them over the namespace's levels (docs/config.md).")
    sp.add_argument("--json", action="store_true",
                    help="what was written as one JSON document on stdout (for scripts)")
    sp.add_argument("--topic", type=_topic, required=True, help=TOPIC_HELP)
    sp.add_argument("--threshold", type=_policy_bytes, metavar="BYTES",
                    help="managedLedgerOffloadThresholdInBytes: a size such as 0, 10MiB, or -1 "
                    "(no size threshold)")
    sp.add_argument("--threshold-seconds", type=int, metavar="S",
                    help="managedLedgerOffloadThresholdInSeconds (-1: none)")
    sp.add_argument("--deletion-lag-ms", type=int, metavar="MS",
                    help="managedLedgerOffloadDeletionLagInMillis")
    sp.add_argument("--read-priority", choices=("bookkeeper-first", "tiered-storage-first"),
                    help="managedLedgerOffloadedReadPriority (reported, not used by offloadd)")
    sp.add_argument("--global", dest="is_global", action="store_true",
                    help="a global policy (its key prefixed __G__); a local one overrides it")
    sp.add_argument("--remove", action="store_true",
                    help="remove the topic's (local, or with --global global) policy")

    sp = cmd("status", "per topic: failing or not, last error, lag, segments by state",
             "  offloadd status --config /etc/offloadd/offloadd.toml\n"
             "  offloadd status --topic persistent://public/default/orders\n"
             "  offloadd status --namespace public/default --summary\n"
             "  offloadd status --json | jq '.topics[] | {topic, lag}'\n",
             description="Per topic: failing or not and the last error, lag (entries, bytes, "
             "seconds), segments by state, last offloaded position, owner. Reads the metadata "
             "store (read-only; it must exist) and the running daemon's /status when it "
             "answers. Exit 0 when all is well, 1 when a topic is failing, 3 when data was "
             "lost to retention.")
    sp.add_argument("--json", action="store_true",
                    help="one JSON document on stdout instead of text (for scripts; above 50 "
                    "topics written a topic a line)")
    sp.add_argument("--topic", type=_topic, action="append", metavar="TOPIC",
                    help="only this topic (repeatable), e.g. persistent://public/default/orders")
    sp.add_argument("--namespace", action="append", metavar="TENANT/NS",
                    help="only the topics of this namespace (repeatable; TENANT/* for a whole "
                    "tenant), e.g. public/default")
    view = sp.add_mutually_exclusive_group()
    view.add_argument("--summary", action="store_true",
                      help="counts of topics by state, the 20 with the most lag and every "
                      "failing topic, instead of every topic (the default in text above 50 "
                      "topics; with --json: a summary object and no topic list)")
    view.add_argument("--all-topics", action="store_true",
                      help="every topic in text, however many")

    sp = cmd("read", "print offloaded entries: LEDGER:ENTRY<TAB>base64 per line",
             "  offloadd read --topic persistent://public/default/orders --count 5\n"
             "  offloadd read --topic persistent://public/default/orders --from 42:1000 "
             "--count 10\n"
             "  offloadd read --topic persistent://public/default/orders --raw > payloads.bin\n"
             "  offloadd read --topic persistent://public/default/orders --count 3 --json\n",
             description="Print offloaded entries in log order, one per line as "
             "LEDGER:ENTRY<TAB>base64(payload). Exits 1 when --from names an entry the tier "
             "does not hold (past the end, or deleted by retention).")
    sp.add_argument("--topic", type=_topic, required=True, help=TOPIC_HELP)
    sp.add_argument("--from", dest="start", type=_position, metavar="L:E",
                    help="start at ledger L, entry E, e.g. 42:0 (default: the first offloaded "
                    "entry)")
    sp.add_argument("--count", type=_positive_int, metavar="N",
                    help="print at most N entries (default: all)")
    form = sp.add_mutually_exclusive_group()
    form.add_argument("--raw", action="store_true",
                      help="write the raw payload bytes, concatenated, instead of lines")
    form.add_argument("--json", action="store_true",
                      help="one JSON object a line instead of text: {\"position\": "
                      "\"L:E\", \"payload\": base64} (for scripts)")

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

    sp = cmd("compact", "merge each topic's small adjacent segments in the tier",
             "  offloadd compact --config offloadd.toml\n"
             "  offloadd compact --config offloadd.toml --topic "
             "persistent://public/default/orders --target-bytes 64MiB\n"
             "  offloadd compact --config offloadd.toml --json\n",
             description="Merge runs of adjacent committed segments below the target size "
             "into one segment each (same object format), swap them in the catalog in one "
             "compare-and-set, and leave the old objects to gc after the deletion lag "
             "(docs/retention.md, \"Merging small segments\"). Takes each topic's ownership; "
             "a topic a running daemon owns is refused.")
    sp.add_argument("--json", action="store_true",
                    help="one JSON report on stdout instead of text (for scripts)")
    sp.add_argument("--topic", type=_topic, help=TOPIC_HELP + " (default: every topic)")
    sp.add_argument("--target-bytes", type=_size, metavar="N",
                    help="a merged segment's data object stays within N bytes, e.g. 67108864 "
                    "or 64MiB (default [compact] target_mbytes)")

    sp = cmd("backfill", "upload a topic's closed history on Spark, then let streaming resume",
             "  offloadd backfill --config offloadd.toml --topic "
             "persistent://public/default/orders\n"
             "  offloadd backfill --config offloadd.toml --topic "
             "persistent://public/default/orders --master spark://spark-master:7077\n"
             "  offloadd backfill --config offloadd.toml --topic "
             "persistent://public/default/orders --json\n",
             config_required=True,
             description="Upload a topic's closed history on Spark, then let streaming "
             "resume. Needs the spark extra (pip install 'offloadd[spark]') and Java 17.")
    sp.add_argument("--json", action="store_true",
                    help="one JSON report on stdout instead of text (for scripts)")
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

    sp = sub.add_parser("config", help="configuration tools", description="configuration tools",
                        epilog="examples:\n"
                        "  offloadd config check --config /etc/offloadd/offloadd.toml\n"
                        "  offloadd config reference > docs/config.md",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    csub = sp.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    cc = csub.add_parser("check", help="validate a config file (exit 2 if invalid)",
                         description="Validate a config file and the OFFLOADD_* environment; "
                         "exit 2 with every problem found, one per line, if invalid.",
                         epilog="examples:\n"
                         "  offloadd config check --config /etc/offloadd/offloadd.toml\n"
                         "  OFFLOADD_OFFLOAD__MAX_BLOCK_SIZE_BYTES=64MiB offloadd config check "
                         "-c my.toml --json",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    cc.add_argument("--config", "-c", required=False, metavar="FILE",
                    help="TOML configuration file (default: check the defaults and the "
                    "environment)")
    cc.add_argument("--json", action="store_true",
                    help="one JSON document on stdout instead of text: {\"ok\": ..., "
                    "\"problems\": [...]} (for scripts)")
    _log_level(cc)
    cr = csub.add_parser("reference", help="print the configuration reference (Markdown)",
                         description="Print every configuration key (Markdown).",
                         epilog="examples:\n  offloadd config reference > docs/config.md",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    _log_level(cr)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except ConfigError as exc:
        for line in str(exc).splitlines() or [""]:  # every problem found, a line each
            print(f"offloadd: config error: {line}", file=sys.stderr)
        return 2
    except OffloaddError as exc:
        print(f"offloadd: error: {exc}", file=sys.stderr)
        # 1, or a failure's own code (75: a busy metrics port, which a restart may fix)
        code = getattr(exc, "exit_code", 1)
        return code if isinstance(code, int) else 1
    except KeyboardInterrupt:
        return 130


def _topic_policy(args: argparse.Namespace) -> int:
    from offloadd.shell.topic_policy import cmd_topic_policy

    return cmd_topic_policy(args)


def _dispatch(args: argparse.Namespace) -> int:
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "run": commands.cmd_run,
        "standalone": commands.cmd_standalone,
        "produce": commands.cmd_produce,
        "status": commands.cmd_status,
        "topic-policy": _topic_policy,
        "read": commands.cmd_read,
        "verify": commands.cmd_verify,
        "offload-now": commands.cmd_offload_now,
        "gc": commands.cmd_gc,
        "compact": commands.cmd_compact,
        "backfill": commands.cmd_backfill,
        "config": commands.cmd_config,
        "query": commands.cmd_query,
        "lakehouse": commands.cmd_lakehouse,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())

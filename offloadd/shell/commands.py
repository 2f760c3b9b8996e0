"""The commands' bodies: each ``cmd_*`` takes the parsed arguments and returns an exit code.

:mod:`offloadd.shell.cli` parses; this module runs. Heavy parts (the daemon, the stores, Spark,
the lakehouse) are imported inside each command, so ``offloadd --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

from offloadd.blobstore.base import BlobStore
from offloadd.errors import ConfigError, OffloaddError
from offloadd.metadata.base import MetadataStore
from offloadd.model import TopicName
from offloadd.model.hostport import connect_url
from offloadd.shell.ttyline import StatusLine

log = logging.getLogger("offloadd")


def _shape(args: argparse.Namespace) -> Any:
    from offloadd.shell.produce import PulsarShape

    codecs = args.compression
    if isinstance(codecs, str):  # argparse does not convert a string default
        from offloadd.format.compression import Compression

        codecs = tuple(Compression.parse(c) for c in codecs.split(",") if c.strip())
    return PulsarShape(compression=codecs, max_batch=args.max_batch,
                       transactions=getattr(args, "transactions", False))


def _run(coro: Coroutine[Any, Any, int]) -> int:
    import uvloop

    return uvloop.run(coro)


def _settings(args: argparse.Namespace) -> Any:
    path = getattr(args, "config", None)
    if path is not None:
        # not through offloadd.shell.standalone: it imports the daemon, its HTTP server and
        # aiohttp, a quarter of a one-shot command's start-up (`status` at 10,000 topics)
        from offloadd import config

        return config.load(path)
    from offloadd.shell.standalone import load_settings

    return load_settings(None)


def setup_logs(settings: Any, args: argparse.Namespace | None = None) -> None:
    from offloadd import logs
    from offloadd.config import secret_values

    level = getattr(args, "log_level", None) or settings.daemon.log_level
    # a one-shot command prints its answer: the store connection's own lines (connecting,
    # connected, closing) only bury it, so they show at DEBUG only; the daemons keep them
    command = getattr(args, "command", None)
    quiet = () if command in DAEMON_COMMANDS else QUIET_FOR_COMMANDS
    logs.configure(settings.daemon.log_format, level, secret_values(settings), quiet=quiet)


DAEMON_COMMANDS = ("run", "standalone")
QUIET_FOR_COMMANDS = ("offloadd.metadata.zookeeper",)


def cmd_standalone(args: argparse.Namespace) -> int:
    from offloadd.shell.standalone import run_standalone

    settings = _settings(args)
    setup_logs(settings, args)
    summary = _run_dict(run_standalone(settings, duration=args.duration, rate=args.rate,
                                       entry_size=args.entry_size, topics=args.topics,
                                       config_path=args.config, payload=args.payload,
                                       shape=_shape(args), schema=args.schema))
    if args.json:
        print(json.dumps(summary))
    else:
        from offloadd.shell.summaries import standalone_text

        print(standalone_text(summary))
    # 1: not everything written was offloaded in time, or nothing was (summary["problem"])
    return 1 if summary.get("drained") is False or summary.get("problem") else 0


def _run_dict(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    async def wrap() -> int:
        out.update(await coro)
        return 0

    _run(wrap())
    return out


def cmd_run(args: argparse.Namespace) -> int:
    # SIGHUP and SIGUSR1 terminate by default: ignore them before the second or so of imports
    # (run_service keeps them ignored until the daemon's handlers are in place)
    for sig in (signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    from offloadd.shell.service import run_service

    settings = _settings(args)
    setup_logs(settings, args)
    return _run(run_service(settings, args.config))


def cmd_produce(args: argparse.Namespace) -> int:
    from offloadd import wiring
    from offloadd.ledger.local import LocalLedgerWriter, StoreLock
    from offloadd.shell.produce import produce, topic_names

    if args.bytes is None and args.duration is None:
        print("offloadd: produce needs --bytes N or --duration S", file=sys.stderr)
        return 2
    settings = _settings(args)
    setup_logs(settings, args)
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
                source = await _schema_source(md, topics, args)
                stats = await produce(writer, topics, entry_size=args.entry_size,
                                      total_bytes=args.bytes, rate=args.rate,
                                      duration=args.duration, stop=stop,
                                      payload=args.payload, shape=_shape(args), source=source)
            finally:
                await writer.close()
        finally:
            await md.close()
        out = {"entries": stats.entries, "bytes": stats.bytes,
               "seconds": round(stats.seconds, 3), "topics": [str(t) for t in topics]}
        if stats.digests:
            out["sent"] = {str(t): d.to_json() for t, d in stats.digests.items()}
            if args.transactions:  # what a read-committed consumer sees, over every topic
                out["visible_messages"] = sum(d.visible_messages or 0
                                              for d in stats.digests.values())
        if args.json:
            print(json.dumps(out))
        else:
            from offloadd.shell.summaries import produce_text

            print(produce_text(out))
        return 0

    try:
        return _run(go())
    finally:
        lock.release()


async def _schema_source(md: MetadataStore, topics: list[TopicName],
                         args: argparse.Namespace) -> Any:
    """``--schema avro|json``: the schema registered for each topic (as a producer's is) and an
    entry source writing messages of it; None without the option."""
    kind = getattr(args, "schema", None)
    if kind is None:
        return None
    from offloadd.shell.produce_schema import schema_entries

    definition = None
    if getattr(args, "schema_file", None) is not None:
        try:
            definition = json.loads(args.schema_file.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--schema-file {args.schema_file}: {exc}") from None
    return await schema_entries(md, topics, kind, definition=definition,
                                max_batch=args.max_batch,
                                transactions=getattr(args, "transactions", False))


def cmd_status(args: argparse.Namespace) -> int:
    from offloadd.shell.status import SUMMARY_OVER, collect
    from offloadd.shell.status_view import (
        exit_code,
        render_json,
        render_summary,
        render_text,
        summarize,
    )

    settings = _settings(args)
    setup_logs(settings, args)
    summary = getattr(args, "summary", False)
    # the summary view (asked for, or text over many topics) reads two nodes a topic, not four
    every = args.json or args.topic or getattr(args, "all_topics", False)
    lean_over = 0 if summary else None if every else SUMMARY_OVER

    async def go() -> int:
        st = await collect(settings, args.topic, getattr(args, "namespace", None),
                           lean_over=lean_over)
        code = exit_code(st)
        if args.json:
            if summary:  # the summary instead of the (long) list, and of the daemon's
                st = {**{k: v for k, v in st.items() if k != "topics"},
                      "summary": summarize(st)}
                if isinstance(st.get("daemon"), dict):
                    st["daemon"] = {k: v for k, v in st["daemon"].items() if k != "topics"}
            print(render_json(st))
        elif summary or (len(st["topics"]) > SUMMARY_OVER and not every):
            print(render_summary(st))
        else:
            print(render_text(st))
        return code

    return _run(go())


@contextlib.asynccontextmanager
async def _looking(settings: Any) -> AsyncIterator[tuple[MetadataStore, BlobStore]]:
    """The metadata store (read-only) and the blob store, for a command that only looks."""
    from offloadd import wiring

    md = await wiring.open_metadata(settings, read_only=True)
    try:
        bs = await wiring.open_blobstore(settings)
        try:
            yield md, bs
        finally:
            await bs.close()
    finally:
        await md.close()


def cmd_read(args: argparse.Namespace) -> int:
    from offloadd.read.reader import TierReader

    settings = _settings(args)
    setup_logs(settings, args)

    async def go() -> int:
        async with _looking(settings) as (md, bs):
            reader = TierReader(md, bs, prefetch=settings.offload.prefetch_blocks(),
                                range_bytes=settings.blobstore.part_size_bytes)
            out = sys.stdout.buffer
            async for e in reader.read(args.topic, args.start, args.count):
                if args.raw:
                    out.write(e.payload)
                elif args.json:
                    out.write(json.dumps({"position": str(e.position), "payload": base64.b64encode(
                        e.payload).decode()}).encode() + b"\n")
                else:
                    out.write(f"{e.position}\t".encode() + base64.b64encode(e.payload) + b"\n")
            out.flush()
        return 0

    try:
        return _run(go())
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from offloadd import wiring
    from offloadd.metadata import managed_ledger
    from offloadd.read.verify import verify

    settings = _settings(args)
    setup_logs(settings, args)

    async def go() -> int:
        async with _looking(settings) as (md, bs):
            src = wiring.connect_source(settings, md, read_only=True)
            try:
                topics = args.topic or [TopicName.from_managed_ledger(n)
                                        for n in await managed_ledger.list_names(md)]
                with StatusLine(sys.stderr, prefix="verify") as line:
                    rep = await verify(md, bs, src, topics,
                                       grace_s=args.orphan_grace, on_progress=line.show)
            finally:
                await src.source.close()
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


def cmd_gc(args: argparse.Namespace) -> int:
    import time

    from offloadd import wiring
    from offloadd.retention.gc import gc_pass, render_text

    settings = _settings(args)
    setup_logs(settings, args)
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


def cmd_compact(args: argparse.Namespace) -> int:
    from offloadd.shell.compact import run_compact

    settings = _settings(args)
    setup_logs(settings, args)

    async def go() -> int:
        reports, ok = await run_compact(settings, [args.topic] if args.topic else None,
                                        target_bytes=args.target_bytes)
        if args.json:
            print(json.dumps({"topics": reports, "ok": ok}, indent=2))
        else:
            from offloadd.shell.summaries import compact_text

            print(compact_text(reports, ok))
        return 0 if ok else 1

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


def cmd_backfill(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _need_extra("spark", "offloadd backfill")
    from offloadd.backfill.command import backfill_command

    setup_logs(settings, args)
    return backfill_command(settings, args)


def cmd_query(args: argparse.Namespace) -> int:
    from offloadd.lakehouse.command import cmd_query

    settings = _settings(args)
    setup_logs(settings, args)
    return cmd_query(settings, args)


def cmd_lakehouse(args: argparse.Namespace) -> int:
    from offloadd.lakehouse.command import cmd_lakehouse

    settings = _settings(args)
    setup_logs(settings, args)
    return cmd_lakehouse(settings, args, _run)


def cmd_offload_now(args: argparse.Namespace) -> int:
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
        url = connect_url(settings.metrics.bind)
    from offloadd import wiring

    ours = wiring.deployment(settings)
    token = settings.metrics.control_token
    auth = {"Authorization": f"Bearer {token.get_secret_value()}"} if token is not None else {}
    # whatever answers on the port may be another deployment's daemon (a shared host, a copied
    # config): check whose it is first (as status does), and let the daemon check again (the
    # body's metadata; 409 if not its own) so one that took the port meanwhile refuses too
    _same_deployment(url.rstrip("/"), ours, auth)
    endpoint = url.rstrip("/") + "/offload-now"
    body = {"topics": [str(t) for t in args.topic] if args.topic else None,
            "wait": bool(args.wait), "timeout_s": args.timeout, "metadata": ours}
    req = urllib.request.Request(endpoint, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **auth})
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


def _same_deployment(base: str, ours: str, auth: dict[str, str]) -> None:
    """``OffloaddError`` unless the daemon at ``base`` says (``/status``) it serves ``ours``."""
    import urllib.request

    try:
        req = urllib.request.Request(base + "/status", headers=auth)
        with urllib.request.urlopen(req, timeout=10) as resp:
            st = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise OffloaddError(f"{base}/status: no answer from offloadd ({exc}); is it running, "
                            "with its metrics endpoint there?") from None
    theirs = st.get("metadata") if isinstance(st, dict) else None
    if theirs != ours:
        pid = st.get("pid") if isinstance(st, dict) else None
        raise OffloaddError(
            f"the daemon answering on {base} (pid {pid}) serves another deployment: {theirs}; "
            f"this configuration's is {ours}. Nothing was asked of it: check --url or "
            "[metrics] bind")


def cmd_config(args: argparse.Namespace) -> int:
    from offloadd import config

    if args.log_level:
        from offloadd import logs

        logs.configure("auto", args.log_level)
    if args.config_command == "reference":
        print(config.reference_markdown(), end="")
        return 0
    try:
        settings = config.load(args.config)
    except ConfigError as exc:
        if not args.json:
            raise
        print(json.dumps({"config": args.config, "ok": False,
                          "problems": str(exc).splitlines()}, indent=2))
        return 2
    if args.json:
        print(json.dumps({"config": args.config, "ok": True, "problems": [],
                          "metadata": settings.metadata.url.split("@")[-1],
                          "driver": settings.blobstore.driver,
                          "namespace_overrides": len(settings.namespaces),
                          "topic_overrides": len(settings.topics)}, indent=2))
        return 0
    print(f"{args.config or '<defaults>'}: ok (metadata {settings.metadata.url.split('@')[-1]}, "
          f"driver {settings.blobstore.driver}, {len(settings.namespaces)} namespace and "
          f"{len(settings.topics)} topic override(s))")
    return 0

"""``offloadd lakehouse …`` and ``offloadd query``: the command-line side of the lakehouse."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

from offloadd.config import Settings
from offloadd.model import TopicName

log = logging.getLogger(__name__)


def add_commands(sub: Any, topic_type: Any, positive_int: Any,
                 common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``query`` and ``lakehouse`` on the CLI's sub-parser set; ``common`` adds the
    options every command has (``--config``, ``--log-level``)."""
    sp = sub.add_parser("query", help="SQL over the lakehouse tables (DuckDB), e.g. "
                        "'SELECT count(*) FROM topic_0'",
                        description="Run SQL over the topic tables with DuckDB. A topic's table "
                        "is named by its local name (\"topic-0\" or topic_0) or its full "
                        "\"tenant.namespace.topic\".",
                        **_examples(
                            "  offloadd query --config offloadd.toml 'SELECT count(*) FROM "
                            "topic_0'\n"
                            "  offloadd query 'SELECT key, count(*) FROM topic_0 GROUP BY key' "
                            "--json\n"))
    common(sp)
    sp.add_argument("sql", type=_sql, help="the query, e.g. \"SELECT key, count(*) FROM "
                    "topic_0 GROUP BY key\"")
    sp.add_argument("--json", action="store_true", help="one JSON array of row objects")
    sp.add_argument("--max-rows", type=positive_int, help="print at most this many rows")

    sp = sub.add_parser("lakehouse", help="the Iceberg projection of offloaded messages",
                        description="The Iceberg projection of offloaded messages "
                        "(docs/lakehouse.md).", **_examples(
                            "  offloadd lakehouse sync --config offloadd.toml\n"
                            "  offloadd lakehouse maintain --config offloadd.toml\n"
                            "  offloadd lakehouse tables --config offloadd.toml --json\n"))
    lsub = sp.add_subparsers(dest="lakehouse_command", required=True, metavar="SUBCOMMAND",
                            help="sync, maintain or tables")
    s = lsub.add_parser("sync", help="project committed segments into the tables, then exit "
                        "(or --follow)", description="Project committed segments into the "
                        "topic tables, then exit (or keep following with --follow). Exit 1 "
                        "when a topic failed.", **_examples(
                            "  offloadd lakehouse sync --config offloadd.toml\n"
                            "  offloadd lakehouse sync --config offloadd.toml --topic "
                            "persistent://public/default/orders --maintain --json\n"
                            "  offloadd lakehouse sync --config offloadd.toml --follow\n"))
    common(s)
    s.add_argument("--topic", type=topic_type, action="append", metavar="TOPIC",
                   help="only this topic (repeatable), e.g. persistent://public/default/orders")
    s.add_argument("--follow", action="store_true", help="keep following until SIGTERM/SIGINT")
    s.add_argument("--max-commits", type=positive_int, help="per topic, then stop")
    s.add_argument("--maintain", action="store_true", help="then compact and expire snapshots")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s = lsub.add_parser("maintain", help="compact small files, expire old snapshots (and apply "
                        "retention when configured)", description="Compact the tables' small "
                        "files and expire old snapshots (and delete the rows of ledgers "
                        "retention deleted, when [lakehouse] delete_with_retention is on).",
                        **_examples(
                            "  offloadd lakehouse maintain --config offloadd.toml\n"
                            "  offloadd lakehouse maintain --config offloadd.toml --topic "
                            "persistent://public/default/orders --json\n"))
    common(s)
    s.add_argument("--topic", type=topic_type, action="append", metavar="TOPIC",
                   help="only this topic (repeatable), e.g. persistent://public/default/orders")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s = lsub.add_parser("tables", help="the tables: rows, files, last projected position",
                        description="The topic tables: rows, data files, snapshots, last "
                        "projected position.", **_examples(
                            "  offloadd lakehouse tables --config offloadd.toml\n"
                            "  offloadd lakehouse tables --config offloadd.toml --json\n"))
    common(s)
    s.add_argument("--json", action="store_true", help="one JSON document instead of a table")


JSON_HELP = "one JSON report on stdout instead of text (for scripts)"


def sync_text(result: dict[str, Any]) -> str:
    """``lakehouse sync``'s report for a reader (``--json`` prints ``result`` itself)."""
    lines = []
    for r in result["topics"]:
        line = (f"{r['topic']}: {r['rows']:,} row(s) from {r['entries']:,} entries in "
                f"{r['commits']} commit(s), projected up to {r['last_position'] or '-'}")
        if r.get("undecodable"):
            line += f", {r['undecodable']} undecodable entries"
        if r.get("lost"):
            line += f", deleted by retention before projection: {', '.join(r['lost'])}"
        if r.get("error"):
            line = f"FAILED {line}: {r['error']}"
        lines.append(line)
    if not result["topics"]:
        lines.append("no topic to project")
    if "maintenance" in result:
        lines.append(maintain_text(result["maintenance"]))
    return "\n".join(lines)


def maintain_text(reports: list[dict[str, Any]]) -> str:
    """``lakehouse maintain``'s report for a reader."""
    lines = [f"{r['topic']}: {r['files_rewritten']} small file(s) rewritten into "
             f"{r['files_written']}, {r['snapshots_expired']} snapshot(s) expired"
             + (", rows of retention-deleted ledgers removed"
                if r.get("rows_deleted_with_retention") else "")
             for r in reports]
    return "\n".join(lines) if lines else "maintain: no table to maintain"


def _examples(lines: str) -> dict[str, Any]:
    """A sub-parser's ``epilog`` of examples, kept line by line in ``--help``."""
    return {"epilog": "examples:\n" + lines.rstrip(),
            "formatter_class": argparse.RawDescriptionHelpFormatter}


def _sql(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the query is empty; give an SQL statement, e.g. "
                                         "\"SELECT count(*) FROM topic_0\"")
    return text


_sql.__name__ = "SQL statement"  # argparse may name the type function in a refusal


def cmd_query(settings: Settings, args: argparse.Namespace) -> int:
    from offloadd import lakehouse

    lakehouse.require()
    from offloadd.lakehouse.query import run_query
    from offloadd.lakehouse.tables import open_catalog

    catalog = open_catalog(settings, create=False)
    import duckdb

    try:
        res = run_query(catalog, args.sql, args.max_rows)
    except duckdb.Error as exc:
        print(f"offloadd: query failed: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # no statement at all (only comments or semicolons)
        print(f"offloadd: query failed: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res.to_json(), indent=1))
    else:
        res.render(sys.stdout)
    return 0


def cmd_lakehouse(settings: Settings, args: argparse.Namespace, run: Any) -> int:
    from offloadd import lakehouse

    lakehouse.require()
    if args.lakehouse_command == "tables":
        return _tables(settings, args)

    async def go() -> int:
        from offloadd import wiring
        from offloadd.lakehouse.projector import Projector

        md = await wiring.open_metadata(settings)
        # a sidecar's schemas are in Pulsar's registry, read through a read-only source
        src = wiring.open_source(settings, md, read_only=True) \
            if settings.source.kind == "bookkeeper" else None
        try:
            bs = await wiring.open_blobstore(settings)
            try:
                proj = Projector(settings, md, bs,
                                 schemas=wiring.schema_reader(settings, md, src))
                topics: list[TopicName] | None = args.topic
                if args.lakehouse_command == "maintain":
                    out: list[dict[str, Any]] = [r.to_json() for r in await _maintain(
                        proj, topics)]
                    print(json.dumps(out, indent=1) if args.json else maintain_text(out))
                    return 0
                if args.follow:
                    stop = asyncio.Event()
                    loop = asyncio.get_running_loop()
                    for sig in (signal.SIGTERM, signal.SIGINT):
                        loop.add_signal_handler(sig, stop.set)
                    await proj.run(stop)
                    return 0
                reps = await _sync(proj, topics, args.max_commits)
                result: dict[str, Any] = {"topics": [r.to_json() for r in reps]}
                if args.maintain:
                    result["maintenance"] = [r.to_json() for r in await _maintain(proj, topics)]
                print(json.dumps(result, indent=1) if args.json else sync_text(result))
                return 1 if any(r.error for r in reps) else 0
            finally:
                await bs.close()
        finally:
            if src is not None:
                await src.close()
            await md.close()

    code: int = run(go())
    return code


async def _sync(proj: Any, topics: list[TopicName] | None,
                max_commits: int | None) -> list[Any]:
    """``Projector.sync`` topic by topic, with progress on a terminal (lakehouse/progress.py)."""
    from offloadd.lakehouse.progress import Progress

    todo = topics if topics is not None else await proj.topics()
    progress = Progress("lakehouse sync", len(todo))
    if not progress.enabled:
        return list(await proj.sync(todo, max_commits=max_commits))
    reps = []
    for i, topic in enumerate(todo):
        progress.topic(i, str(topic))
        done = await proj.sync([topic], max_commits=max_commits)
        for r in done:
            progress.add_rows(r.rows)
        reps.extend(done)
    progress.done()
    return reps


async def _maintain(proj: Any, topics: list[TopicName] | None) -> list[Any]:
    from offloadd.lakehouse.progress import Progress

    todo = topics if topics is not None else await proj.topics()
    progress = Progress("lakehouse maintain", len(todo))
    if not progress.enabled:
        return list(await proj.maintain(todo))
    out = []
    for i, topic in enumerate(todo):
        progress.topic(i, str(topic))
        out.extend(await proj.maintain([topic]))
    progress.done()
    return out


def _tables(settings: Settings, args: argparse.Namespace) -> int:
    from offloadd.lakehouse.query import list_tables
    from offloadd.lakehouse.tables import (
        CATALOG_NAME,
        TOPIC_PROPERTY,
        client_properties,
        last_position,
        open_catalog,
    )
    from offloadd.lakehouse.transactions import hidden_totals, last_held

    catalog = open_catalog(settings, create=False)
    out: list[dict[str, Any]] = []
    for ident in list_tables(catalog):
        table = catalog.load_table(ident)
        snap = table.current_snapshot()
        summary = snap.summary if snap is not None else None
        out.append({
            "table": ".".join(ident),
            "identifier": list(ident),
            "topic": table.properties.get(TOPIC_PROPERTY),
            "location": table.location(),
            "metadata_location": table.metadata_location,
            "rows": int(summary["total-records"] or 0) if summary else 0,
            "data_files": int(summary["total-data-files"] or 0) if summary else 0,
            "snapshots": len(table.metadata.snapshots),
            "last_position": str(p) if (p := last_position(table)) else None,
            # read-committed: running totals of what it hid, held entries at the last commit
            "read_committed": hidden_totals(table).to_json(),
            "held_entries": last_held(table),
        })
    props = client_properties(settings)
    if args.json:  # what a client needs to open them (docs/lakehouse.md, "From other tools")
        print(json.dumps({"catalog": CATALOG_NAME, "type": props["type"], "uri": props["uri"],
                          "warehouse": props["warehouse"], "properties": props,
                          "tables": out}, indent=1))
    else:
        print(f"catalog {CATALOG_NAME!r} ({props['type']}) at {props['uri']}, warehouse "
              f"{props['warehouse']}")
        for t in out:
            rc = t["read_committed"]
            hidden = (f"; read-committed: {t['held_entries']} entries held, hidden "
                      f"{rc['markers']} markers, {rc['aborted_messages']} aborted and "
                      f"{rc['timed_out_messages']} timed-out messages"
                      if any(rc.values()) or t["held_entries"] else "")
            print(f"{t['table']}: {t['rows']} rows in {t['data_files']} files, "
                  f"{t['snapshots']} snapshots, last position {t['last_position']}{hidden}")
    return 0

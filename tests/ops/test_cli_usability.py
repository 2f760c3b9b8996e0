"""The command line explains itself: every option has help, commands show examples, no internal
references leak into what users read; --log-level; JSON logs carry topic/segment/ledger as
fields; verify and gc show progress on a terminal; standalone stops on the first SIGTERM."""

from __future__ import annotations

import argparse
import io
import json
import logging
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from offloadd import config, wiring
from offloadd import logs as logs_mod
from offloadd.blobstore.base import StoreView
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.model import TopicName
from offloadd.shell import cli, commands
from offloadd.shell.ttyline import StatusLine
from tests.ops.support import OFFLOADD, offloadd

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = ("DESIGN", "§")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = dict(sub.choices)
    cfg = out.pop("config")
    csub = next(a for a in cfg._actions if isinstance(a, argparse._SubParsersAction))
    out.update({f"config {k}": v for k, v in csub.choices.items()})
    return out


class TestHelp:
    def test_every_option_of_every_command_has_help(self) -> None:
        for name, sp in subcommands().items():
            for action in sp._actions:
                if isinstance(action, argparse._HelpAction):
                    continue
                assert action.help, f"offloadd {name} {action.option_strings}: no help text"

    @pytest.mark.parametrize("name", ["run", "standalone", "produce", "status", "read", "verify",
                                      "offload-now", "gc", "backfill"])
    def test_every_command_shows_examples(self, name: str) -> None:
        text = subcommands()[name].format_help()
        assert "examples:\n  offloadd " + name in text, text

    def test_the_options_people_ask_about_say_what_to_give(self) -> None:
        read = " ".join(subcommands()["read"].format_help().split())
        assert "persistent://public/default/orders" in read  # --topic
        assert "L:E" in read and "e.g. 42:0" in read  # --from
        verify = " ".join(subcommands()["verify"].format_help().split())
        assert "--json" in verify and "for scripts" in verify

    def test_a_bad_position_says_what_a_position_is(self, tmp_path: Path) -> None:
        res = offloadd(["read", "--topic", "persistent://a/b/c", "--from", "42"], tmp_path,
                       check=False)
        assert res.returncode == 2 and "LEDGER:ENTRY, e.g. 42:0" in res.stderr

    def test_no_internal_references_in_help_errors_or_docs(self, tmp_path: Path) -> None:
        texts = {"offloadd --help": cli.build_parser().format_help()}
        texts.update({f"offloadd {n} --help": sp.format_help()
                      for n, sp in subcommands().items()})
        texts["config reference"] = config.reference_markdown()
        for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                    *sorted((ROOT / "deploy").rglob("*")), *sorted((ROOT / "config").glob("*"))]:
            if doc.is_file():
                texts[str(doc.relative_to(ROOT))] = doc.read_text()
        texts["an error"] = offloadd(["status"], tmp_path, check=False).stderr
        leaks = {where: word for where, text in texts.items() for word in INTERNAL
                 if word in text}
        assert not leaks, leaks


class TestLogLevel:
    def test_the_option_overrides_the_config(self, tmp_path: Path) -> None:
        root = logging.getLogger()
        old = (root.level, root.handlers[:])
        try:
            args = cli.build_parser().parse_args(["status", "--log-level", "error"])
            commands.setup_logs(config.load(None), args)
            assert root.level == logging.ERROR
            commands.setup_logs(config.load(None), cli.build_parser().parse_args(["status"]))
            assert root.level == logging.INFO
        finally:
            root.setLevel(old[0])
            root.handlers[:] = old[1]

    def test_a_wrong_level_is_a_usage_error(self, tmp_path: Path) -> None:
        res = offloadd(["status", "--log-level", "loud"], tmp_path, check=False)
        assert res.returncode == 2 and "argument --log-level: invalid choice" in res.stderr


class TestStructuredFields:
    """JSON records carry topic, segment and ledger as fields of their own."""

    def record(self, msg: str, *args: object, **extra: object) -> dict[str, object]:
        rec = logging.LogRecord("offloadd.x", logging.INFO, __file__, 1, msg, args, None)
        rec.__dict__.update(extra)
        out: dict[str, object] = json.loads(logs_mod.JsonFormatter().format(rec))
        return out

    def test_fields_come_from_the_message_arguments(self) -> None:
        t = TopicName.parse("persistent://public/default/orders")
        uid = uuid.uuid4()
        rec = self.record("topic %s: ledger %d was deleted before %s", t, 42, "3:0")
        assert (rec["topic"], rec["ledger"]) == (str(t), 42)
        rec = self.record("segment %s: %d part(s) uploading", uid, 3)
        assert rec["segment"] == str(uid) and "ledger" not in rec
        assert self.record("100%% of %s done", t)["topic"] == str(t)

    def test_explicit_extra_wins_and_the_task_context_fills_in(self) -> None:
        ctx = logs_mod.context_with(topic="persistent://t/n/x")
        rec = ctx.run(self.record, "plain line")
        assert rec["topic"] == "persistent://t/n/x"
        rec = ctx.run(self.record, "line", ledger=7, topic="persistent://t/n/y")
        assert (rec["topic"], rec["ledger"]) == ("persistent://t/n/y", 7)
        assert "topic" not in self.record("plain line")


class TestProgress:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    def test_nothing_before_two_seconds_then_one_line_redrawn_then_erased(self) -> None:
        now = [0.0]
        out = self.Tty()
        with StatusLine(out, prefix="verify", clock=lambda: now[0]) as line:
            line.show("topic 1/3")
            assert out.getvalue() == ""
            now[0] = 2.5
            line.show("topic 2/3")
            assert out.getvalue().endswith("verify: topic 2/3  (0:02)")
            now[0] = 2.6
            line.show("topic 3/3")  # too soon after the last redraw
            assert "3/3" not in out.getvalue()
        assert out.getvalue().endswith("\r\x1b[2K")

    def test_never_on_a_pipe(self) -> None:
        now = [0.0]
        out = io.StringIO()
        line = StatusLine(out, clock=lambda: now[0])
        now[0] = 100
        line.show("x")
        line.close()
        assert out.getvalue() == ""

    async def test_verify_and_gc_report_their_steps(self) -> None:
        from offloadd.read.verify import verify
        from offloadd.retention.gc import gc_pass

        steps: list[str] = []
        md, bs = MemoryMetadataStore(), MemoryBlobStore()
        await verify(md, bs, None, [], on_progress=steps.append)
        await gc_pass(md, StoreView(bs), None, wiring.gc_settings(config.load(None)),
                      now=time.time(), dry_run=True, on_progress=steps.append)
        assert steps == ["looking for orphan objects",
                         "deleting segments whose ledgers are all gone", "sweeping orphan objects"]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_standalone_stops_on_the_first_sigterm_while_draining(tmp_path: Path) -> None:
    """A throttled offload would need minutes to drain what was written; SIGTERM then stops
    within the shutdown deadline (5 s, plus the bounded abandon) instead."""
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text("[offload]\nflow_permits_per_second = 20000\nmax_block_size_bytes = 16384\n"
                   "max_segment_rollover_time_minutes = 0.01\n"
                   "[metrics]\nenabled = false\n[daemon]\nshutdown_deadline_s = 5\n"
                   "log_format = \"json\"\n"
                   # gc's grace must outlast a throttled 64 MiB segment's upload
                   "[retention]\norphan_grace_s = 7200\n")
    log = (tmp_path / "standalone.log").open("w")
    proc = subprocess.Popen([*OFFLOADD, "standalone", "--json", "--config", str(cfg),
                             "--duration", "2",
                             "--rate", "1000000", "--topics", "1"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        deadline = time.monotonic() + 60
        while "writer stopped; offloading what it wrote" not in (
                tmp_path / "standalone.log").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "standalone.log").read_text()[-2000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)  # 5 s deadline + 10 s abandon + slack
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert proc.returncode == 0
    summary = json.loads(out)
    assert summary["drained"] is None  # stopped by the signal, not drained


def _type_functions(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """(option, type function name) for every typed argument of every (sub)command."""
    out: list[tuple[str, str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += _type_functions(sub)
        elif callable(action.type):
            out.append((action.dest, getattr(action.type, "__name__", repr(action.type))))
    return out


def test_no_type_function_shows_an_internal_name() -> None:
    # issue 23 item 12: argparse says "invalid <type.__name__> value" when a type function
    # raises ValueError; "_positive_int" is no name for a user
    names = _type_functions(cli.build_parser())
    assert names and not [n for n in names if n[1].startswith("_")], names


def test_a_huge_integer_is_refused_by_a_readable_message(
        capsys: pytest.CaptureFixture[str]) -> None:
    # int() raises ValueError past 4300 digits: argparse then printed "invalid _positive_int"
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["read", "--topic", "persistent://a/b/c", "--count",
                                       "9" * 5000])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--count: 99999999999999999999... (5000 digits) is too large" in err, err
    assert "_positive_int" not in err

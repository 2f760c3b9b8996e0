"""Bad input at the command line and the daemon's edges: every case gets an exit code and a message
that names the problem, never a traceback, a hang or a wrong answer.

The byte formats' own junk tests live in tests/format; here the same kinds of damage are put into
a real filesystem tier written by ``offloadd standalone`` (corrupt, truncated and missing data and
index objects, wrong magic, an unknown format version, an index pointing past its object, a
managed-ledger node of junk) and read through ``offloadd read`` and ``offloadd verify``, next to
bad arguments, bad topic names, invalid configuration and environment values, an oversize entry,
and signals at awkward moments of a real ``offloadd run``.

The CLI cases run :func:`offloadd.shell.cli.main` in-process (the same code as the process,
without a second of interpreter start-up per case); the signal cases run real processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import crc32c
import pytest

from offloadd.metadata import managed_ledger
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.model import catalog
from offloadd.shell import cli
from tests.reliability.conftest import Figures
from tests.reliability.support import (
    Proc,
    TomlValue,
    local_sections,
    merge,
    ok,
    verify,
    write_config,
)
from tests.reliability.support import (
    cli as run_cli,
)

pytestmark = pytest.mark.integration

TOPIC = "persistent://public/default/topic-0"
ML = "public/default/persistent/topic-0"


# ---- a small tier to damage ------------------------------------------------------------------
@dataclass(frozen=True)
class Tier:
    root: Path
    config: Path
    uid: str  # the first committed segment's uuid

    @property
    def data(self) -> Path:
        return self.root / "data" / "tier" / self.uid

    @property
    def index(self) -> Path:
        return self.root / "data" / "tier" / f"{self.uid}-index"

    def meta(self, key: str) -> Path:
        return self.root / "data" / "tier" / ".meta" / f"{key}.json"


def sections(root: Path) -> dict[str, dict[str, TomlValue]]:
    return merge(local_sections(root), {"daemon": {"log_level": "INFO"},
                                        "offload": {"max_size_per_segment_mbytes": 0.1,
                                                    "max_block_size_bytes": 16384}})


async def _first_uid(root: Path) -> str:
    md = await EmbeddedMetadataStore.open(root / "data" / "metadata")
    try:
        info, _ = await managed_ledger.load(md, ML)
        return str(next(s.uid for s in catalog.segments(info) if s.complete))
    finally:
        await md.close()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    cfg = write_config(root / "offloadd.toml", sections(root))
    ok(run_cli(["standalone", "--config", str(cfg), "--duration", "1", "--rate", "400000",
                "--topics", "1"], root, timeout=120))
    return root


@pytest.fixture
def tier(pristine: Path, tmp_path: Path) -> Tier:
    """A copy of the pristine tier (and its metadata and ledgers) to damage."""
    shutil.copytree(pristine / "data", tmp_path / "data")
    cfg = write_config(tmp_path / "offloadd.toml", sections(tmp_path))
    for leftover in (tmp_path / "data").glob("*.pid"):
        leftover.unlink()
    return Tier(tmp_path, cfg, asyncio.run(_first_uid(tmp_path)))


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def main(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., Result]]:
    """``main(*argv)``: :func:`offloadd.shell.cli.main` in-process; its logging set-up is undone."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)

    def run(*argv: str) -> Result:
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            root.handlers[:], _ = saved
            root.setLevel(saved[1])
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    yield run
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


def flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def set_meta(t: Tier, key: str, **changes: str) -> None:
    path = t.meta(key)
    doc = json.loads(path.read_text())
    doc["metadata"].update(changes)
    path.write_text(json.dumps(doc))


async def _junk_node(root: Path) -> None:
    md = await EmbeddedMetadataStore.open(root / "data" / "metadata")
    try:
        await md.set(f"/managed-ledgers/{ML}", b"\x08\xff\xff junk, not a ManagedLedgerInfo")
    finally:
        await md.close()


# ---- damaged objects: read and verify ----------------------------------------------------------
def truncate_data(t: Tier) -> None:
    t.data.write_bytes(t.data.read_bytes()[: t.data.stat().st_size // 2])


def data_magic(t: Tier) -> None:
    patch(t.data, 0, b"\xde\xad\xbe\xef")


def data_payload(t: Tier) -> None:
    flip(t.data, 128 + 12 + 5)  # a payload byte of the first entry


def data_mark_and_payload(t: Tier) -> None:
    """The block checksum's mark (header bytes 36..39) and a payload byte rot together."""
    flip(t.data, 36)
    flip(t.data, 128 + 12 + 5)


def data_missing(t: Tier) -> None:
    t.data.unlink()


def index_missing(t: Tier) -> None:
    t.index.unlink()


def index_truncated(t: Tier) -> None:
    t.index.write_bytes(t.index.read_bytes()[:30])


def index_magic(t: Tier) -> None:
    patch(t.index, 0, b"\x00\x00\x00\x01")


def restamp(t: Tier) -> None:
    """Record the damaged index's own CRC32C, as a writer with a bug would have: only the
    structural checks can catch what follows."""
    crc = f"{crc32c.crc32c(t.index.read_bytes()):08x}"
    set_meta(t, f"{t.uid}-index", **{"offloadd-crc32c": crc})


def index_bit_rot(t: Tier) -> None:
    flip(t.index, len(t.index.read_bytes()) - 9)  # a part id: nothing else would notice


def index_past_object(t: Tier) -> None:
    size = t.data.stat().st_size
    patch(t.index, 8, struct.pack(">q", size + 65536))  # the data object's length
    restamp(t)


def index_offset_past_object(t: Tier) -> None:
    raw = t.index.read_bytes()
    patch(t.index, len(raw) - 8, struct.pack(">q", t.data.stat().st_size + 4096))


def index_offset_mid_block(t: Tier) -> None:
    raw = t.index.read_bytes()
    (off,) = struct.unpack(">q", raw[-8:])
    patch(t.index, len(raw) - 8, struct.pack(">q", off + 64))
    restamp(t)


def unknown_version(t: Tier) -> None:
    set_meta(t, f"{t.uid}-index", s3managedledgeroffloaderformatversion="7")


def junk_node(t: Tier) -> None:
    asyncio.run(_junk_node(t.root))


# (case id, damage, message pattern for read and verify)
DAMAGE = [
    ("truncated-data-object", truncate_data, r"block \d+ is truncated: got \d+ of \d+ bytes"),
    ("data-block-wrong-magic", data_magic, r"bad block magic 0xDEADBEEF"),
    ("data-payload-bit-rot", data_payload, r"block checksum mismatch: CRC32C"),
    ("data-checksum-mark-and-payload-bit-rot", data_mark_and_payload,
     r"\(block 1 at byte 0\) at byte 36: block checksum mark damaged"),
    ("data-object-missing", data_missing, r"reading [0-9a-f-]{36} .*no such object"),
    ("index-object-missing", index_missing, r"[0-9a-f-]{36}-index .*no such object"),
    ("index-truncated", index_truncated, r"-index at byte 4: truncated index"),
    ("index-wrong-magic", index_magic, r"-index at byte 0: unknown index magic 0x00000001"),
    ("index-bit-rot", index_bit_rot, r"-index at byte 0: index checksum mismatch"),
    ("index-length-past-object", index_past_object, r"block \d+ is truncated"),
    ("index-offset-past-object", index_offset_past_object, r"is outside the data object"),
    ("index-offset-mid-block", index_offset_mid_block, r"disagrees with the index"),
    ("unknown-format-version", unknown_version, r"unknown object format version '7'"),
    ("managed-ledger-node-junk", junk_node, rf"/managed-ledgers/{ML} at byte 0: not a "
                                            r"ManagedLedgerInfo protobuf"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("damage", "pattern"), [pytest.param(d, p, id=i) for i, d, p in DAMAGE])
def test_damaged_objects_fail_read_and_verify_with_a_message_naming_the_problem(
        tier: Tier, main: Callable[..., Result], figures: Figures,
        damage: Callable[[Tier], None], pattern: str) -> None:
    figures.add("bad_input", cases=2)
    damage(tier)
    read = main("read", "--config", str(tier.config), "--topic", TOPIC)
    assert read.code == 1, read
    assert re.search(pattern, read.err) and "Traceback" not in read.err, read.err
    said = read.err
    if damage is not junk_node:  # the key of the damaged object, or its segment, is named
        assert tier.uid in said, said
    ver = main("verify", "--config", str(tier.config), "--orphan-grace", "0")
    assert ver.code == 1, ver
    assert "verify: FAILED" in ver.out
    assert re.search(pattern, ver.out + ver.err), ver.out + ver.err
    figures.add("bad_input", cases_passed=2)


# ---- arguments, topic names, configuration, environment ----------------------------------------
CONFIG_CASES = [
    ("unknown-key", "[offload]\nmax_segment_size = 1\n",
     r"\[offload\.max_segment_size\] unknown key"),
    ("wrong-type", '[offload]\nmax_block_size_bytes = "big"\n',
     r"max_block_size_bytes\] must be an integer"),
    ("below-minimum", "[offload]\nmax_block_size_bytes = 10\n",
     r"max_block_size_bytes\] must be >= 1024"),
    ("bad-metadata-url", '[metadata]\nurl = "http://zk:2181"\n', r"\[metadata\.url\] must be"),
    ("bad-zk-port", '[metadata]\nurl = "zk://h:99999/x"\n', r"port in 1\.\.65535"),
    ("bad-metrics-bind", '[metrics]\nbind = "localhost"\n',
     r'\[metrics\.bind\] must be "host:port"'),
    ("bad-acl-digest", '[metadata]\nacl_digest = "nocolon"\n',
     r'acl_digest\] must be "user:password"'),
    ("half-credentials", '[blobstore]\naccess_key_id = "AKIA"\n',
     r"set both access_key_id and secret_access_key"),
    ("bad-driver", '[blobstore]\ndriver = "ftp"\n', r"\[blobstore\.driver\] must be"),
    ("bad-topic-key", '[topics."orders"]\nmode = "ledger"\n', r"topic name 'orders' is invalid"),
    ("toml-syntax", "[offload\nx = 1\n", r"not valid TOML"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("text", "pattern"),
                         [pytest.param(t, p, id=i) for i, t, p in CONFIG_CASES])
def test_invalid_configuration_exits_2_naming_the_key(
        tmp_path: Path, main: Callable[..., Result], figures: Figures, text: str,
        pattern: str) -> None:
    figures.add("bad_input", cases=2)
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    for argv in (["config", "check", "--config", str(cfg)], ["run", "--config", str(cfg)]):
        res = main(*argv)
        assert res.code == 2, res
        assert re.search(pattern, res.err) and str(cfg) in res.err, res.err
        assert "Traceback" not in res.err
    figures.add("bad_input", cases_passed=2)


ARG_CASES = [
    ("from-not-a-position", ["read", "--topic", TOPIC, "--from", "abc"], 2, r"LEDGER:ENTRY"),
    ("from-half-a-position", ["read", "--topic", TOPIC, "--from", "12:"], 2, r"LEDGER:ENTRY"),
    ("count-zero", ["read", "--topic", TOPIC, "--count", "0"], 2, r"not a positive integer"),
    ("topic-no-scheme", ["read", "--topic", "orders"], 2, r"topic name 'orders' is invalid"),
    ("topic-too-short", ["read", "--topic", "persistent://a/b"], 2, r"is invalid"),
    ("topic-non-persistent", ["read", "--topic", "non-persistent://a/b/c"], 2, r"is invalid"),
    ("topic-with-space", ["read", "--topic", "persistent://a/b/c d"], 2, r"is invalid"),
    ("topic-unknown", ["read", "--topic", "persistent://public/default/nope"], 1,
     r"topic persistent://public/default/nope does not exist: .*"
     r"/managed-ledgers/public/default/persistent/nope does not exist"),
    ("verify-bad-topic", ["verify", "--topic", "a/b/c"], 2, r"is invalid"),
    ("produce-no-amount", ["produce", "--topic", TOPIC], 2, r"needs --bytes N or --duration S"),
    ("produce-oversize-entry", ["produce", "--topic", "persistent://public/default/big",
                                "--bytes", "7000000", "--entry-size", "6000000",
                                "--payload", "raw"], 1,
     r"6000000 bytes, more than max_entry_bytes=5242880; nothing of this batch was written"),
    ("gc-negative-grace", ["gc", "--grace", "-1"], 2, r"--grace must not be negative"),
    # values that parse but can never be right (issue 13, defect 9)
    ("from-negative-entry", ["read", "--topic", TOPIC, "--from", "0:-5"], 2,
     r"--from: position '0:-5': entry id -5 is out of range"),
    ("from-past-int64", ["read", "--topic", TOPIC, "--from", "9223372036854775808:0"], 2,
     r"ledger id 9223372036854775808 is out of range \(0\.\.9223372036854775807"),
    ("topic-dot-dot", ["read", "--topic", "persistent://public/default/.."], 2,
     r"'\.\.' cannot be a tenant, namespace or topic name"),
    ("topic-dot-tenant", ["verify", "--topic", "persistent://./default/x"], 2,
     r"'\.' cannot be a tenant, namespace or topic name"),
    ("standalone-rate-nan", ["standalone", "--rate", "nan", "--duration", "1"], 2,
     r"--rate: nan is not a finite number"),
    ("standalone-duration-nan", ["standalone", "--duration", "nan"], 2,
     r"--duration: nan is not a finite number"),
    ("produce-duration-inf", ["produce", "--topic", TOPIC, "--duration", "inf"], 2,
     r"--duration: inf is not a finite number"),
    ("produce-rate-nan", ["produce", "--topic", TOPIC, "--duration", "1", "--rate", "nan"], 2,
     r"--rate: nan is not a finite number"),
    ("gc-grace-nan", ["gc", "--grace", "nan"], 2, r"--grace: nan is not a finite number"),
    ("verify-orphan-grace-inf", ["verify", "--orphan-grace", "inf"], 2,
     r"--orphan-grace: inf is not a finite number"),
    ("offload-now-no-daemon", ["offload-now"], 1, r"no daemon pid file"),
    # issue 23, item 11: ASCII digits only, and bounds on what sizes the process
    ("from-arabic-indic-digits", ["read", "--topic", TOPIC, "--from", "\u0661\u0662:\u0660"],
     2, r"--from: position .* is not of the form LEDGER:ENTRY"),
    ("count-arabic-indic-digits", ["read", "--topic", TOPIC, "--count", "\u0661\u0662"], 2,
     r"--count: '\u0661\u0662' is not a positive integer"),
    ("duration-arabic-indic-digits", ["produce", "--topic", TOPIC, "--duration", "\u0661"], 2,
     r"--duration: '\u0661' is not a number"),
    ("produce-a-billion-topics", ["produce", "--topics", "1000000000", "--bytes", "1"], 2,
     r"--topics: 1000000000 is more than the 100,000 topics allowed"),
    ("standalone-entry-size-past-the-maximum",
     ["standalone", "--entry-size", "10000000000000", "--duration", "1"], 2,
     r"--entry-size: 10000000000000 is more than the 67,108,864 bytes per entry allowed"),
    ("query-empty", ["query", ""], 2, r"argument sql: the query is empty"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("argv", "code", "pattern"),
                         [pytest.param(a, c, p, id=i) for i, a, c, p in ARG_CASES])
def test_bad_arguments_exit_with_a_message_naming_them(
        tier: Tier, main: Callable[..., Result], figures: Figures, argv: list[str], code: int,
        pattern: str) -> None:
    figures.add("bad_input", cases=1)
    res = main(argv[0], "--config", str(tier.config), *argv[1:])
    assert res.code == code, res
    assert re.search(pattern, res.err) and "Traceback" not in res.err, res.err
    figures.add("bad_input", cases_passed=1)


@pytest.mark.timeout(60)
def test_a_stale_pid_file_is_named_not_signalled(
        tier: Tier, main: Callable[..., Result], figures: Figures) -> None:
    figures.add("bad_input", cases=1)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tier.root / "data" / "offloadd.pid").write_text(f"{dead.pid}\n")
    res = main("offload-now", "--config", str(tier.config))
    assert res.code == 1 and "not running (stale pid file)" in res.err, res
    figures.add("bad_input", cases_passed=1)


ENV_CASES = [
    ("env-typo", "OFFLOADD_OFFLOAD_BLOCKS_IN_FLIGHT", "2",
     r"OFFLOADD_OFFLOAD_BLOCKS_IN_FLIGHT: names no configuration key.*"
     r"OFFLOADD_OFFLOAD__BLOCKS_IN_FLIGHT"),
    ("env-out-of-range", "OFFLOADD_OFFLOAD__BLOCKS_IN_FLIGHT", "0",
     r"environment OFFLOADD_OFFLOAD__BLOCKS_IN_FLIGHT: \[offload\.blocks_in_flight\] must be >= 1"),
    ("env-not-a-number", "OFFLOADD_OFFLOAD__RETRY_BASE_S", "soon",
     r"OFFLOADD_OFFLOAD__RETRY_BASE_S: \[offload\.retry_base_s\] must be a number"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "value", "pattern"),
                         [pytest.param(n, v, p, id=i) for i, n, v, p in ENV_CASES])
def test_invalid_environment_overrides_exit_2_naming_the_variable(
        tier: Tier, main: Callable[..., Result], figures: Figures,
        monkeypatch: pytest.MonkeyPatch, name: str, value: str, pattern: str) -> None:
    figures.add("bad_input", cases=1)
    monkeypatch.setenv(name, value)
    res = main("status", "--config", str(tier.config))
    assert res.code == 2, res
    assert re.search(pattern, res.err), res.err
    figures.add("bad_input", cases_passed=1)


# ---- signals at awkward moments ----------------------------------------------------------------
def ignores(pid: int, *sigs: signal.Signals) -> bool:
    """``/proc/<pid>/status`` says ``sigs`` are ignored or caught (not left at the default)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    masks = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
    handled = int(masks["SigIgn"], 16) | int(masks["SigCgt"], 16)
    return all(handled >> (s - 1) & 1 for s in sigs)


@pytest.mark.timeout(120)
def test_signals_during_start_up_reload_and_shutdown_never_kill_or_corrupt(
        tier: Tier, figures: Figures) -> None:
    figures.add("bad_input", cases=5)
    d = Proc(["run", "--config", str(tier.config)], tier.root, tier.root / "run.log")
    try:
        # 1. SIGHUP and SIGUSR1 before the daemon is ready (their default would kill it)
        deadline = time.monotonic() + 20
        while not ignores(d.pid, signal.SIGHUP, signal.SIGUSR1):
            assert d.alive() and time.monotonic() < deadline, d.text()
            time.sleep(0.002)
        d.signal(signal.SIGHUP)
        d.signal(signal.SIGUSR1)
        d.wait_for(lambda t: "offloadd ready" in t, 30, "readiness after early signals")
        # 2. SIGHUP with a configuration that no longer loads: the old one stays
        good = tier.config.read_text()
        tier.config.write_text(good + "\n[offload]\nbogus = 1\n")
        d.signal(signal.SIGHUP)
        d.wait_for(lambda t: "configuration not reloaded, keeping the old one" in t, 20,
                   "the bad reload to be refused")
        tier.config.write_text(good)
        # 3. SIGUSR1 with nothing to offload is a no-op
        d.signal(signal.SIGUSR1)
        d.wait_for(lambda t: "SIGUSR1: closing open segments now" in t, 20, "the trigger")
        assert d.alive()
        # 4. SIGTERM, then SIGUSR1, SIGHUP and a second SIGTERM while it shuts down
        d.signal(signal.SIGTERM)
        for sig in (signal.SIGUSR1, signal.SIGHUP, signal.SIGTERM):
            time.sleep(0.01)
            if d.alive():
                d.signal(sig)
        code = d.wait(60)
    finally:
        d.kill9()
    assert code == 0, d.text()[-4000:]
    assert "Traceback" not in d.text()
    # 5. SIGTERM right after start-up: it stops (by its handler, or by the signal before the
    # handler is in place) and leaves nothing half-done
    d2 = Proc(["run", "--config", str(tier.config)], tier.root, tier.root / "run2.log")
    try:
        d2.wait_for(bool, 30, "the first log line")
        d2.signal(signal.SIGTERM)
        code2 = d2.wait(60)
    finally:
        d2.kill9()
    assert code2 in (0, -signal.SIGTERM), d2.text()[-4000:]
    assert "Traceback" not in d2.text()
    rep = verify(tier.config, tier.root)
    assert rep["ok"], rep
    figures.add("bad_input", cases_passed=5)


def test_case_table_holds_at_least_thirty_cases() -> None:
    n = 2 * len(DAMAGE) + 2 * len(CONFIG_CASES) + len(ARG_CASES) + 1 + len(ENV_CASES) + 5
    assert n >= 30, n

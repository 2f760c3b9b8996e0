"""Commands that only look never create or change anything, and say so when there is nothing to
look at; ``gc`` (which writes by design) also refuses a store that does not exist; ``read``
never starts elsewhere than asked."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest

from offloadd import config, wiring
from offloadd.blobstore.memory import MemoryBlobStore
from offloadd.errors import Fatal, NotFound
from offloadd.metadata.embedded import EmbeddedMetadataStore
from offloadd.metadata.memory import MemoryMetadataStore
from offloadd.metadata.readonly import ReadOnlyMetadataStore
from offloadd.model import Position, TopicName
from offloadd.read.reader import TierReader
from tests.fixtures.zookeeper import zk_server
from tests.ops.support import DaemonProcess, offloadd, wait_for

__all__ = ["zk_server"]

TOPIC = "persistent://public/default/ro"


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a hash of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


class TestEmptyDirectory:
    """Nothing offloaded here: the commands say so, exit non-zero, and leave nothing behind."""

    @pytest.mark.parametrize("argv", [["status"], ["status", "--json"], ["verify"], ["gc"],
                                      ["gc", "--dry-run"], ["read", "--topic", TOPIC]])
    def test_refuses_and_creates_nothing(self, tmp_path: Path, argv: list[str]) -> None:
        res = offloadd(argv, tmp_path, check=False)
        assert res.returncode == 1, res
        assert "no embedded metadata store at data/metadata/metadata.db" in res.stderr
        assert "Traceback" not in res.stderr
        assert list(tmp_path.iterdir()) == [], "the command created files"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_status_verify_and_read_change_no_byte_of_an_existing_store(tmp_path: Path) -> None:
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text("[offload]\nmax_segment_rollover_time_minutes = 0.01\n"
                   "[metrics]\nenabled = false\n")
    res = offloadd(["produce", "--json", "--config", str(cfg), "--topic", TOPIC, "--bytes",
                    "100000"],
                   tmp_path)
    n = json.loads(res.stdout)["entries"]
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready")
        wait_for(lambda: len(offloadd(["read", "--config", str(cfg), "--topic", TOPIC],
                                      tmp_path).stdout.splitlines()) == n, 60, "all offloaded")
        assert d.stop() == 0
    finally:
        d.close()
    before = tree(tmp_path / "data")
    for argv in (["status"], ["status", "--json"], ["verify", "--orphan-grace", "0"],
                 ["read", "--topic", TOPIC, "--count", "3"]):
        offloadd([*argv, "--config", str(cfg)], tmp_path)
    after = tree(tmp_path / "data")
    # SQLite may leave its (empty) -wal/-shm companions beside the database it read
    companions = {k for k in after if k.endswith(("-wal", "-shm"))}
    assert {k: v for k, v in after.items() if k not in companions} == before


class TestReadOnlyStore:
    """A read-only session refuses writes whatever asks for them."""

    async def test_every_write_is_refused_and_reads_pass(self) -> None:
        inner = MemoryMetadataStore()
        await inner.create("/a", b"x")
        ro = ReadOnlyMetadataStore(inner)
        assert (await ro.get("/a")).data == b"x"
        assert await ro.children("/") == ["a"]
        for write in (ro.create("/b", b""), ro.set("/a", b"y"), ro.delete("/a"), ro.multi([])):
            with pytest.raises(Fatal, match="read-only"):
                await write
        assert (await inner.get("/a")).data == b"x"

    async def test_embedded_store_opened_read_only_is_not_created(self, tmp_path: Path) -> None:
        with pytest.raises(NotFound, match="no embedded metadata store"):
            await EmbeddedMetadataStore.open(tmp_path / "md", read_only=True)
        assert not (tmp_path / "md").exists()

    async def test_embedded_store_read_only_refuses_writes_sqlite_would_do(
            self, tmp_path: Path) -> None:
        rw = await EmbeddedMetadataStore.open(tmp_path)
        await rw.create("/x", b"1")
        await rw.close()
        ro = await EmbeddedMetadataStore.open(tmp_path, read_only=True)
        try:
            assert (await ro.get("/x")).data == b"1"
            with pytest.raises(Fatal, match="read-only"):
                await ro.set("/x", b"2")
        finally:
            await ro.close()

    @pytest.mark.integration
    @pytest.mark.timeout(60)
    async def test_zookeeper_chroot_is_not_created_by_read_only_commands(
            self, zk_server: str) -> None:
        chroot = f"/ro-{uuid.uuid4().hex}"
        settings = config.load(None, metadata__url=f"zk://{zk_server}{chroot}")
        with pytest.raises(NotFound, match=f"has no {chroot}"):
            await wiring.open_metadata(settings, read_only=True)
        with pytest.raises(NotFound, match=f"has no {chroot}"):
            await wiring.open_metadata(settings, must_exist=True)
        probe = await wiring.open_metadata(config.load(
            None, metadata__url=f"zk://{zk_server}"))
        try:
            assert not await probe.exists(chroot)
        finally:
            await probe.close()


class TestReadStartsWhereAsked:
    """``--from`` outside what the tier holds is an error naming what it does hold."""

    async def test_past_the_end_before_the_start_and_in_a_hole(self) -> None:
        from offloadd.metadata.managed_ledger import ManagedLedgerInfo
        from offloadd.model import catalog
        from offloadd.model.catalog import LedgerRange
        from offloadd.model.keys import managed_ledger_path

        md = MemoryMetadataStore()
        topic = TopicName.parse(TOPIC)
        info = ManagedLedgerInfo()
        for lid in (5, 6, 7):
            info.ledgerInfo.add(ledgerId=lid, entries=10, size=100, timestamp=1)
        uid_a, uid_b = uuid.uuid4(), uuid.uuid4()
        driver = catalog.driver_metadata("filesystem", {})
        # segments over 5:0..6:9 and 7:0..7:9; ledger 4 was deleted by retention
        catalog.add_assigned(info, uid_a, (LedgerRange(5, 0, 9), LedgerRange(6, 0, 9)), 1,
                             driver)
        catalog.mark_offloaded(info, uid_a, 2)
        catalog.add_assigned(info, uid_b, (LedgerRange(7, 0, 9),), 3, driver)
        catalog.mark_offloaded(info, uid_b, 4)
        await md.create(managed_ledger_path(topic.managed_ledger), info.SerializeToString())
        reader = TierReader(md, MemoryBlobStore())

        async def first(start: Position) -> None:
            async for _ in reader.read(topic, start, 1):
                break

        with pytest.raises(NotFound, match=r"8:0 is past the last offloaded entry .* \(7:9\)"):
            await first(Position(8, 0))
        with pytest.raises(NotFound, match=r"7:10 is past the last offloaded entry"):
            await first(Position(7, 10))
        with pytest.raises(NotFound, match=r"4:2 is before the first offloaded entry .*\(5:0\): "
                                           r"it was deleted by retention or never offloaded"):
            await first(Position(4, 2))
        with pytest.raises(NotFound, match=r"6:12 is not an offloaded entry .* next offloaded "
                                           r"entry is 7:0"):
            await first(Position(6, 12))


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_read_from_past_the_end_exits_1_naming_the_last_entry(tmp_path: Path) -> None:
    cfg = tmp_path / "offloadd.toml"
    cfg.write_text("[offload]\nmax_segment_rollover_time_minutes = 0.01\n"
                   "[metrics]\nenabled = false\n")
    n = json.loads(offloadd(["produce", "--json", "--config", str(cfg), "--topic", TOPIC, "--bytes",
                             "20000"], tmp_path).stdout)["entries"]
    d = DaemonProcess(tmp_path, cfg)
    try:
        d.wait_logged("ready")
        wait_for(lambda: len(offloadd(["read", "--config", str(cfg), "--topic", TOPIC],
                                      tmp_path).stdout.splitlines()) == n, 60, "all offloaded")
    finally:
        assert d.stop() == 0
    last = offloadd(["read", "--config", str(cfg), "--topic", TOPIC], tmp_path
                    ).stdout.splitlines()[-1].split("\t")[0]
    ledger, entry = map(int, last.split(":"))
    res = offloadd(["read", "--config", str(cfg), "--topic", TOPIC, "--from",
                    f"{ledger}:{entry + 1}"], tmp_path, check=False)
    assert res.returncode == 1 and res.stdout == ""
    assert f"past the last offloaded entry of {TOPIC} ({last})" in res.stderr
    ok = offloadd(["read", "--config", str(cfg), "--topic", TOPIC, "--from", last], tmp_path)
    assert ok.stdout.startswith(f"{last}\t")

"""Snapshot expiry and the orphan-file sweep: a table's directory holds only what its live
snapshots need (blocking: run from a worker thread).

pyiceberg's ``expire_snapshots`` (0.12) removes snapshots from the table metadata but deletes no
file, and nothing deletes the files a compaction replaced: an engine reading the warehouse
directory (``read_parquet('…/*.parquet')``) would count those rows twice. So maintenance:

1. **expires** a snapshot when it is older than ``snapshot_max_age_minutes`` *and* stopped being
   the current one at least ``reader_grace_minutes`` ago (a query that planned on it a moment ago
   can still read its files); the current snapshot and branch/tag heads always stay;
2. **sweeps** the table's directory: every file no live snapshot references — data and delete
   files of their manifests (entries not marked deleted), the manifests, the manifest lists, the
   metadata files of the table's log, statistics files — is deleted once it is older than the
   grace. A projection's data files are written before its commit: the grace (and the rule that
   nothing written after the listing started is touched) keeps a running writer's files. The
   directory is listed *before* the table is reloaded, so a commit landing meanwhile is seen.

:func:`usage` counts the files and bytes under the warehouse (``status`` and its cost line).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyarrow.fs import FileInfo, FileSelector, FileSystem, FileType
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

__all__ = ["SweepReport", "Usage", "expirable", "expire", "referenced", "sweep", "usage"]


@dataclass
class SweepReport:
    files_deleted: int = 0
    bytes_deleted: int = 0
    files_kept_in_grace: int = 0  # unreferenced, but younger than the grace


@dataclass(frozen=True)
class Usage:
    files: int
    bytes: int


def expirable(metadata: TableMetadata, now_ms: int, max_age_ms: int,
              grace_ms: int) -> list[int]:
    """Snapshots older than ``max_age_ms`` that stopped being current ``grace_ms`` ago or more.

    When a snapshot stopped being current: the time of the next entry of the snapshot log after
    its last one; a snapshot the log does not show (history trimmed) stopped no later than its
    first child was made, else it is taken as made-and-replaced at its own timestamp."""
    protected = {ref.snapshot_id for ref in metadata.refs.values()}
    if metadata.current_snapshot_id is not None:
        protected.add(metadata.current_snapshot_id)
    log = metadata.snapshot_log
    replaced_at: dict[int, int] = {}
    for prev, nxt in itertools.pairwise(log):
        if prev.snapshot_id != nxt.snapshot_id:
            replaced_at[prev.snapshot_id] = nxt.timestamp_ms
    children: dict[int, int] = {}
    for snap in metadata.snapshots:
        parent = snap.parent_snapshot_id
        if parent is not None:
            children[parent] = min(children.get(parent, snap.timestamp_ms), snap.timestamp_ms)
    for sid, ts in children.items():
        replaced_at.setdefault(sid, ts)
    out = []
    for snap in metadata.snapshots:
        if snap.snapshot_id in protected or snap.timestamp_ms >= now_ms - max_age_ms:
            continue
        if replaced_at.get(snap.snapshot_id, snap.timestamp_ms) <= now_ms - grace_ms:
            out.append(snap.snapshot_id)
    return out


def expire(table: Table, now_s: float, max_age_s: float, grace_s: float) -> int:
    """Expire what :func:`expirable` selects in one metadata commit; how many were expired."""
    now_ms = int(now_s * 1000)
    ids = expirable(table.metadata, now_ms, int(max_age_s * 1000), int(grace_s * 1000))
    if ids:
        table.maintenance.expire_snapshots().by_ids(ids).commit()
        table.refresh()
    return len(ids)


def referenced(table: Table) -> set[str]:
    """Every file the table's live metadata needs, as ``scheme-less paths`` (see :func:`_path`)."""
    md = table.metadata
    out = {table.metadata_location}
    out.update(e.metadata_file for e in md.metadata_log)
    out.update(s.statistics_path for s in md.statistics)
    out.update(s.statistics_path for s in md.partition_statistics)
    manifests: set[str] = set()
    for snap in md.snapshots:
        out.add(snap.manifest_list)
        for m in snap.manifests(table.io):
            if m.manifest_path in manifests:
                continue
            manifests.add(m.manifest_path)
            # entries marked deleted are files this snapshot removed: not part of it
            out.update(e.data_file.file_path for e in m.fetch_manifest_entry(
                table.io, discard_deleted=True))
    out |= manifests
    return {_path(p) for p in out}


def sweep(table: Table, now_s: float, grace_s: float) -> SweepReport:
    """Delete the files under the table's location that no live snapshot references and that
    are older than ``grace_s`` (see the module docstring)."""
    fs, root = _fs(table.io.properties, table.location())
    started = time.time()
    listing = _list(fs, root)
    table.refresh()  # after the listing: a commit that landed meanwhile is seen
    keep = referenced(table)
    cutoff = min(now_s - grace_s, started)
    rep = SweepReport()
    for info in listing:
        if info.path in keep:
            continue
        if info.mtime is None or info.mtime.timestamp() >= cutoff:
            rep.files_kept_in_grace += 1
            continue
        try:
            fs.delete_file(info.path)
        except FileNotFoundError:  # another maintenance run got it first
            continue
        rep.files_deleted += 1
        rep.bytes_deleted += info.size or 0
    return rep


def usage(properties: dict[str, str], location: str) -> Usage:
    """Files and bytes under ``location`` (the warehouse); zero when it does not exist."""
    fs, root = _fs(properties, location)
    files = _list(fs, root)
    return Usage(len(files), sum(f.size or 0 for f in files))


def _fs(properties: dict[str, Any], location: str) -> tuple[FileSystem, str]:
    io = PyArrowFileIO(properties={k: str(v) for k, v in properties.items()})
    scheme, netloc, path = io.parse_location(location, io.properties)
    return io.fs_by_scheme(scheme, netloc), path.rstrip("/")


def _list(fs: FileSystem, root: str) -> list[FileInfo]:
    try:
        infos: Iterable[FileInfo] = fs.get_file_info(FileSelector(root, recursive=True,
                                                                  allow_not_found=True))
    except FileNotFoundError:
        return []
    return [i for i in infos if i.type == FileType.File]


def _path(location: str) -> str:
    """A location as the filesystem lists it: ``s3://b/k`` → ``b/k``, ``file:///p`` → ``/p``."""
    _, _, path = PyArrowFileIO.parse_location(location)
    return path

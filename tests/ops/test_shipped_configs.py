"""Every configuration the repository ships loads through the real loader, and the production
and Kubernetes examples offload a Pulsar cluster (sidecar mode: ZooKeeper + bookies + S3)
instead of an embedded store on a private volume that no broker writes to."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML arrives with moto[server]

from offloadd import config
from offloadd.config import Settings
from offloadd.ledger.bookkeeper import BookKeeperLedgerSource
from offloadd.metadata.memory import MemoryMetadataStore
from tests.ops.test_deploy import instructions

ROOT = Path(__file__).resolve().parents[2]


def shipped(tmp_path: Path) -> dict[str, Path]:
    """name -> a file holding that config: config/*.toml, every ConfigMap's TOML, and the
    config the Dockerfile bakes in."""
    out = {f"config/{p.name}": p for p in sorted((ROOT / "config").glob("*.toml"))}
    for manifest in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(manifest.read_text()):
            if doc and doc.get("kind") == "ConfigMap":
                for key, text in doc["data"].items():
                    if key.endswith(".toml"):
                        p = tmp_path / f"{doc['metadata']['name']}-{key}"
                        p.write_text(text)
                        out[f"{manifest.name}:{doc['metadata']['name']}/{key}"] = p
    for ins, args in instructions():
        if ins == "COPY" and args.endswith(".toml"):
            src = shlex.split(args)[0]
            out[f"Dockerfile:{src}"] = ROOT / src
    return out


def test_there_is_a_config_of_each_kind(tmp_path: Path) -> None:
    names = set(shipped(tmp_path))
    assert {"config/standalone.toml", "config/production.toml"} <= names
    assert any(n.startswith("offloadd.yaml:") for n in names)


def test_every_shipped_config_loads(tmp_path: Path) -> None:
    for name, path in shipped(tmp_path).items():
        try:
            config.load(path)
        except config.ConfigError as exc:
            pytest.fail(f"{name}: {exc}")


def sidecar(settings: Settings) -> Any:
    """The sidecar source as `offloadd run` builds it (its own checks included)."""
    return BookKeeperLedgerSource.from_settings(settings, MemoryMetadataStore())


@pytest.mark.parametrize("which", ["config/production.toml", "offloadd.yaml:"])
def test_the_production_examples_offload_a_pulsar_cluster_to_s3(tmp_path: Path,
                                                                 which: str) -> None:
    path = next(p for n, p in shipped(tmp_path).items() if n.startswith(which))
    s = config.load(path)
    assert s.source.kind == "bookkeeper", f"{which}: offloads nothing a broker writes"
    assert s.source.pulsar_zk is not None and s.source.pulsar_zk.startswith("zk://")
    assert s.metadata.url.startswith("zk://")
    assert s.blobstore.driver == "aws-s3"
    sidecar(s)  # e.g. refuses a catalog inside Pulsar's own tree

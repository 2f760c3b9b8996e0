"""The container image and the Kubernetes example, checked statically (no container engine
here): what the Dockerfile copies exists, it runs as a non-root user with a /healthz health
check, and the manifests parse, probe /healthz and /readyz, run as non-root and hand the S3
secret over as an environment override that the configuration accepts."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from offloadd import config

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
MANIFEST = ROOT / "deploy" / "kubernetes" / "offloadd.yaml"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages() -> dict[str, list[tuple[str, str]]]:
    """Instructions per build stage (``FROM image AS name``), in order."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for ins, args in instructions():
        if ins == "FROM":
            current = []
            out[args.split()[-1] if " AS " in args.upper() else args] = current
        current.append((ins, args))
    return out


class TestDockerfile:
    def test_it_builds_on_python_3_11_slim_with_the_locked_dependencies(self) -> None:
        ins = instructions()
        assert ins[0] == ("FROM", "python:3.11-slim-bookworm AS base")
        runs = " ".join(a for i, a in ins if i == "RUN")
        assert "uv sync --frozen --no-dev" in runs

    def test_the_daemon_image_is_lean_and_the_backfill_image_can_run_spark(self) -> None:
        st = stages()
        assert list(st) == ["base", "backfill", "daemon"]  # daemon last: the default target
        shared = " ".join(a for i, a in st["base"] if i == "RUN")
        daemon = " ".join(a for i, a in st["daemon"])
        assert "--extra spark" not in shared + daemon and "jre" not in shared + daemon
        assert "--all-extras" not in shared + daemon
        assert st["daemon"][0] == ("FROM", "base AS daemon")
        backfill = dict(st["backfill"])
        runs = " ".join(a for i, a in st["backfill"] if i == "RUN")
        assert "uv sync --frozen --no-dev --extra spark" in runs
        assert "openjdk-17-jre-headless" in runs
        assert json.loads(backfill["ENTRYPOINT"]) == ["offloadd", "backfill"]
        assert backfill["USER"].split(":")[0] not in ("root", "0")

    def test_every_copied_path_exists_in_the_repository(self) -> None:
        copies = [shlex.split(a) for i, a in instructions() if i == "COPY"]
        assert copies
        for args in copies:
            sources = [a for a in args[:-1] if not a.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert (ROOT / "uv.lock").exists()

    def test_the_config_baked_in_passes_the_check(self) -> None:
        copied = next(shlex.split(a) for i, a in instructions()
                      if i == "COPY" and a.endswith("/etc/offloadd/offloadd.toml"))
        config.load(ROOT / copied[0])

    def test_it_runs_as_a_non_root_user(self) -> None:
        users = [a for i, a in instructions() if i == "USER"]
        assert users, "no USER instruction: the container would run as root"
        user = users[-1].split(":")[0]
        assert user not in ("root", "0")

    def test_it_checks_health_on_healthz_and_exposes_the_metrics_port(self) -> None:
        ins = dict(instructions())
        assert "http://127.0.0.1:9105/healthz" in ins["HEALTHCHECK"]
        assert ins["EXPOSE"] == "9105"
        assert json.loads(ins["ENTRYPOINT"]) == ["offloadd", "run"]
        assert ins["STOPSIGNAL"] == "SIGTERM"

    def test_the_metrics_bind_override_is_a_valid_environment_override(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        env = next(a for i, a in instructions() if i == "ENV" and "OFFLOADD_" in a)
        for word in shlex.split(env):
            name, _, value = word.partition("=")
            if name.startswith("OFFLOADD_"):
                monkeypatch.setenv(name, value)
        assert config.load(None).metrics.bind == "0.0.0.0:9105"


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    yaml = pytest.importorskip("yaml")
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return docs


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


class TestKubernetesExample:
    def test_it_has_the_config_map_secret_and_stateful_set(self,
                                                           manifests: list[dict[str, Any]]
                                                           ) -> None:
        kinds = {d["kind"] for d in manifests}
        assert {"ConfigMap", "Secret", "StatefulSet"} <= kinds

    def test_the_config_map_holds_a_valid_config(self, manifests: list[dict[str, Any]],
                                                 tmp_path: Path) -> None:
        cm = of_kind(manifests, "ConfigMap")
        p = tmp_path / "offloadd.toml"
        p.write_text(cm["data"]["offloadd.toml"])
        s = config.load(p)
        pod = of_kind(manifests, "StatefulSet")["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] > s.daemon.shutdown_deadline_s
        assert s.metrics.bind.startswith("0.0.0.0:")  # the probes come from outside the pod

    def test_probes_and_non_root(self, manifests: list[dict[str, Any]]) -> None:
        pod = of_kind(manifests, "StatefulSet")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        c = pod["containers"][0]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["securityContext"]["allowPrivilegeEscalation"] is False

    def test_s3_credentials_come_from_the_secret_as_config_overrides(
            self, manifests: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
        secret = of_kind(manifests, "Secret")
        c = of_kind(manifests, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
        assert env["OFFLOADD_BLOBSTORE__SECRET_ACCESS_KEY"]["name"] == secret["metadata"]["name"]
        for name, ref in env.items():
            assert ref["key"] in secret["stringData"]
            monkeypatch.setenv(name, "dummy-" + ref["key"])
        s = config.load(None)  # the names are real keys, or load() would say so
        assert s.blobstore.secret_access_key is not None
        assert s.blobstore.secret_access_key.get_secret_value() == "dummy-secret-access-key"

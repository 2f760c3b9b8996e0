"""The documented install works for a service account, the daemon install is lean, and the
package runs on every Python it claims (3.11-3.13).

``scripts/install`` (what docs/operations.md and the systemd unit tell operators to run) builds
the wheel with ``uv build``, installs it with the locked dependencies into a venv on an
interpreter any user can run, and the result runs as ``nobody``, as systemd's ``DynamicUser``
would. The same package is then installed on Python 3.12 and 3.13 (where this machine has
them: ``uv python install`` needs GitHub, which is not reachable from CI here) and runs a short
``standalone`` that ``verify`` finds clean.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from offloadd import __version__

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv")
needs_uv = pytest.mark.skipif(UV is None, reason="uv is not installed (scripts/setup installs it)")


def world_usable(path: str) -> list[str]:
    """What stops another user from running ``path``: private directories on the way, or the
    file itself not readable by others."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    bad = [os.sep.join(parts[:i]) for i in range(2, len(parts))
           if not os.stat(os.sep.join(parts[:i])).st_mode & stat.S_IXOTH]
    if not os.stat(real).st_mode & stat.S_IROTH:
        bad.append(real)
    return bad


def as_nobody(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("setpriv")
    if os.geteuid() != 0 or tool is None:
        pytest.skip("needs root and setpriv (util-linux) to run a command as nobody")
    return subprocess.run([tool, "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv],
                          cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


@pytest.fixture
def prefix() -> Iterator[Path]:
    """A world-searchable directory (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="offloadd-install-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@needs_uv
@pytest.mark.timeout(300)
def test_the_documented_install_runs_as_a_dynamic_user(prefix: Path) -> None:
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no system Python at /usr/bin/python3")
    res = subprocess.run([str(ROOT / "scripts" / "install"), str(prefix / "opt")],
                         capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr
    venv = prefix / "opt" / ".venv"
    assert (prefix / "opt" / "dist" / f"offloadd-{__version__}-py3-none-any.whl").exists()
    assert world_usable(str(venv / "bin" / "python")) == []
    out = as_nobody(str(venv / "bin" / "offloadd"), "--version", cwd=prefix)
    assert out.returncode == 0 and out.stdout.strip() == f"offloadd {__version__}", out
    cfg = prefix / "offloadd.toml"
    cfg.write_text('[metadata]\nurl = "zk://zk-0:2181/offloadd"\n[blobstore]\n'
                   'driver = "aws-s3"\nbucket = "b"\n')
    cfg.chmod(0o644)
    out = as_nobody(str(venv / "bin" / "offloadd"), "config", "check", "--config", str(cfg),
                    cwd=prefix)
    assert out.returncode == 0, out
    # the daemon install leaves Spark out, and the backfill command says what to add
    out = as_nobody(str(venv / "bin" / "offloadd"), "backfill", "--json", "--config", str(cfg),
                    "--topic",
                    "persistent://public/default/t", cwd=prefix)
    assert out.returncode == 1, out
    assert "pip install 'offloadd[spark]'" in out.stderr and "Traceback" not in out.stderr
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    assert size < 150 * 1024 * 1024, f"daemon install is {size / 2**20:.0f} MiB"


def test_a_private_interpreter_is_refused_before_anything_is_installed(prefix: Path) -> None:
    """The old instruction (`uv venv` picking a Python under /root) is what failed with
    203/EXEC: the script names the private directory instead of installing."""
    private = prefix / "private"
    (private / "bin").mkdir(parents=True)
    private.chmod(0o700)
    fake = private / "bin" / "python3"
    fake.symlink_to(os.path.realpath("/usr/bin/python3") if Path("/usr/bin/python3").exists()
                    else os.path.realpath(shutil.which("python3") or "/bin/false"))
    assert world_usable(str(private / "bin" / "python3")) == []  # resolves elsewhere: fine
    copy = private / "bin" / "python-copy"
    shutil.copy2(os.path.realpath(str(fake)), copy)
    assert world_usable(str(copy)) == [str(private)]
    res = subprocess.run([str(ROOT / "scripts" / "install"), str(prefix / "opt")],
                         env={**os.environ, "PYTHON": str(copy)}, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode != 0
    assert f"{private} is private" in res.stderr or "is Python" in res.stderr, res.stderr
    assert not (prefix / "opt" / ".venv").exists()


def interpreter(version: str) -> str | None:
    """A Python ``version`` on this machine (system, /usr/local, or pyenv's)."""
    for pattern in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}",
                    os.path.expanduser(f"~/.pyenv/versions/{version}*/bin/python{version}")):
        for found in sorted(glob.glob(pattern)):
            if os.access(found, os.X_OK):
                return found
    return None


@needs_uv
@pytest.mark.timeout(300)
@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_the_package_runs_on(version: str, tmp_path: Path) -> None:
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (uv python install needs GitHub)")
    assert UV is not None
    dist = tmp_path / "dist"
    subprocess.run([UV, "build", "--wheel", "--out-dir", str(dist), "-q"], cwd=ROOT, check=True,
                   timeout=120)
    reqs = tmp_path / "requirements.txt"
    subprocess.run([UV, "export", "--frozen", "--no-dev", "--no-emit-project", "-q", "-o",
                    str(reqs)], cwd=ROOT, check=True, timeout=60)
    venv = tmp_path / "venv"
    subprocess.run([UV, "venv", "-q", "--python", python, str(venv)], check=True, timeout=60)
    py = str(venv / "bin" / "python")
    for args in (["-r", str(reqs)], ["--no-deps", *map(str, dist.glob("*.whl"))]):
        subprocess.run([UV, "pip", "install", "-q", "--python", py, *args], check=True,
                       timeout=240)
    exe = str(venv / "bin" / "offloadd")
    ver = subprocess.run([py, "-c", "import sys; print(sys.version_info[:2])"],
                         capture_output=True, text=True, check=True)
    assert ver.stdout.strip() == str(tuple(map(int, version.split("."))))
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "OFFLOADD_METRICS__ENABLED": "false"}  # port 9105 may be taken
    res = subprocess.run([exe, "standalone", "--json", "--duration", "1", "--rate", "200000",
                          "--topics",
                          "1"], cwd=run, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    res = subprocess.run([exe, "verify"], cwd=run, capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 0 and "verify: OK" in res.stdout, res.stdout + res.stderr

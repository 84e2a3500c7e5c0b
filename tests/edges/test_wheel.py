"""The package as the container runs it: the built wheel, installed with the pinned dependencies into a
clean virtualenv, serving as a non-root user from a read-only directory (the Dockerfile's layout)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.edges.serving import CLUSTER, REVIEWS, ROOT, Process
from webhook.tools import devcerts

NOBODY = 65534
UNTRACKED = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".lock-venv",
    "out",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
)


def reachable(path: Path) -> bool:
    """Whether any user can run ``path``: it and every directory above it are open to others."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])


def interpreter() -> str:
    """A Python this project supports that a non-root user can run too (a Python installed under
    /root, as pyenv does for root, is not; Debian's /usr/bin/python3 is)."""
    candidates = [Path(sys._base_executable), Path("/usr/bin/python3"), Path("/usr/local/bin/python3")]
    for candidate in candidates:
        if candidate.exists() and reachable(candidate):
            version = subprocess.run(
                [str(candidate), "-c", "import sys, venv; print(sys.version_info >= (3, 11))"],
                capture_output=True,
                text=True,
            )
            if version.stdout.strip() == "True":
                return str(candidate)
    pytest.fail(f"no Python >= 3.11 with venv that another user can run among {candidates}")


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """A world-readable directory holding a virtualenv with only the wheel and the locked dependencies
    (pytest's own temporary directories are private to their owner, so another user could not run it)."""
    base = Path(tempfile.mkdtemp(prefix="cardquota-wheel-"))
    base.chmod(0o755)
    try:
        wheels = base / "wheels"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
        # Built from a copy: setuptools builds in the tree's build/, which `make plugin-archive` (the
        # kubectl plugin's test, on another worker) may be using at the same moment.
        source = base / "source"
        shutil.copytree(ROOT, source, ignore=UNTRACKED)
        subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(source)], check=True)
        subprocess.run([interpreter(), "-m", "venv", str(base / "venv")], check=True)
        venv_pip = [str(base / "venv" / "bin" / "pip"), "--disable-pip-version-check", "--quiet"]
        lock = ROOT / "requirements.lock"
        subprocess.run([*venv_pip, "install", "--only-binary=:all:", "-r", str(lock)], check=True)
        wheel = next(wheels.glob("cardquota-*.whl"))
        subprocess.run([*venv_pip, "install", "--no-deps", str(wheel)], check=True)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)  # never the tree's build/: `make plugin-archive` may be in it


def test_the_wheel_alone_pins_nothing_beyond_the_lock(installed: Path) -> None:
    pip = [str(installed / "venv" / "bin" / "pip"), "--disable-pip-version-check"]
    frozen = subprocess.run(
        [*pip, "freeze", "--exclude", "cardquota"], check=True, capture_output=True, text=True
    )
    locked = [
        line for line in (ROOT / "requirements.lock").read_text().splitlines() if not line.startswith("#")
    ]
    assert frozen.stdout.split() == locked
    subprocess.run([*pip, "check"], check=True, capture_output=True)


def test_the_installed_server_runs_as_a_non_root_user_in_a_read_only_directory(installed: Path) -> None:
    user = NOBODY if os.geteuid() == 0 else None
    workdir, certs, cluster = installed / "readonly", installed / "tls", installed / "cluster"
    shutil.copytree(CLUSTER, cluster)
    devcerts.ensure_dev_certs(certs)
    for path in [certs, *certs.iterdir()]:  # as a mounted Secret: readable by the pod's user
        path.chmod(0o755 if path.is_dir() else 0o644)
    workdir.mkdir(mode=0o555)
    process = Process(
        certs,
        installed / "server.log",
        cluster=cluster,
        make_certs=False,
        program=(str(installed / "venv" / "bin" / "cardquota"),),
        cwd=workdir,
        user=user,
    )
    try:
        process.wait_ready()
        status = Path(f"/proc/{process.proc.pid}/status").read_text()
        uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        assert int(uid) == (NOBODY if user is not None else os.geteuid())
        with process.client() as client:
            body = (REVIEWS / "pod-over-quota.json").read_bytes()
            answer = client.post("/validate", content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code == 200
            assert json.loads(answer.content)["response"]["allowed"] is False
        assert list(workdir.iterdir()) == []
        assert "Traceback" not in process.log()
    finally:
        process.stop()

"""``kubectl cardquota`` as a user gets it: the release archive installed as Krew does, its launcher
putting the built wheel into a clean virtualenv on the first run, found by the real kubectl as a
plugin on PATH, reading the current context of a kubeconfig file."""

import json
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import ControlPlane
from tests.e2e.objects import H200

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plugin_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory for PATH, laid out as Krew installs the plugin: the release archive (``make
    plugin-archive``: the built wheel and the launcher) unpacked into a store, its launcher linked
    into ``bin``. The first run installs the wheel into a clean virtualenv of its own."""
    tmp = tmp_path_factory.mktemp("plugin")
    run(["make", "-s", "plugin-archive", f"PLUGIN_OUT={tmp / 'out'}"], cwd=ROOT)
    store, bin_dir = tmp / "store", tmp / "bin"
    store.mkdir()
    bin_dir.mkdir()
    with tarfile.open(tmp / "out" / "kubectl-cardquota.tar.gz") as archive:
        archive.extractall(store, filter="data")
    (bin_dir / "kubectl-cardquota").symlink_to(store / "kubectl-cardquota")
    return bin_dir


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return done


def user_kubeconfig(plane: ControlPlane, path: Path, namespace: str) -> Path:
    """The control plane's kubeconfig as a user's: a context of their own (current, with a
    namespace) beside one that reaches nothing."""
    config = yaml.safe_load(plane.kubeconfig.read_text())
    config["clusters"].append({"name": "elsewhere", "cluster": {"server": "https://127.0.0.1:9"}})
    config["contexts"] = [
        {"name": "gpu-lab", "context": {"cluster": "cardquota-e2e", "user": "admin", "namespace": namespace}},
        {"name": "elsewhere", "context": {"cluster": "elsewhere", "user": "admin"}},
    ]
    config["current-context"] = "gpu-lab"
    path.write_text(yaml.safe_dump(config))
    return path


def kubectl_cardquota(
    plane: ControlPlane, bin_dir: Path, kubeconfig: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """The real kubectl, with the virtualenv's ``bin`` on PATH and only ``KUBECONFIG`` to go by."""
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KUBECONFIG": str(kubeconfig)}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        [str(plane.bin / "kubectl"), "cardquota", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_kubectl_cardquota_status_reads_the_current_context_of_a_kubeconfig_file(
    control_plane: ControlPlane,
    namespace: str,
    card_quota: Callable[[dict[str, int]], str],
    plugin_bin: Path,
    tmp_path: Path,
) -> None:
    queue = card_quota({H200: 3})
    kubeconfig = user_kubeconfig(control_plane, tmp_path / "config", namespace)
    listed = control_plane.kubectl("plugin", "list", check=False)  # kubectl's own discovery, for the log
    print(listed.stdout, listed.stderr)

    table = kubectl_cardquota(control_plane, plugin_bin, kubeconfig, "status")
    assert table.returncode == 0, table.stderr
    row = next(line.split() for line in table.stdout.splitlines() if line.startswith(queue + " "))
    assert row[:3] == [queue, H200, "3"], table.stdout

    as_json = kubectl_cardquota(control_plane, plugin_bin, kubeconfig, "status", "-o", "json")
    status = json.loads(as_json.stdout)
    assert queue in status["queues"], as_json.stdout
    as_yaml = kubectl_cardquota(control_plane, plugin_bin, kubeconfig, "status", "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout) == status

    elsewhere = kubectl_cardquota(
        control_plane, plugin_bin, kubeconfig, "status", "--context", "elsewhere", "--request-timeout", "3"
    )
    assert elsewhere.returncode == 3, elsewhere.stderr
    assert "not all listed within 3 s" in elsewhere.stderr
    missing = kubectl_cardquota(control_plane, plugin_bin, kubeconfig, "status", "--context", "nowhere")
    assert missing.returncode == 2 and 'context "nowhere" is not in kubeconfig' in missing.stderr


def test_kubectl_cardquota_headroom_takes_the_namespace_from_the_context(
    control_plane: ControlPlane,
    namespace: str,
    card_quota: Callable[[dict[str, int]], str],
    plugin_bin: Path,
    tmp_path: Path,
) -> None:
    queue = card_quota({H200: 3})
    kubeconfig = user_kubeconfig(control_plane, tmp_path / "config", namespace)
    new = kubectl_cardquota(
        control_plane, plugin_bin, kubeconfig, "headroom", "--queue", queue, "--card", H200, "-o", "json"
    )
    assert new.returncode == 0, new.stderr
    assert json.loads(new.stdout)[0]["more"] == 3
    unknown = kubectl_cardquota(control_plane, plugin_bin, kubeconfig, "headroom", "deployment/absent")
    assert unknown.returncode == 2
    assert f"deployment {namespace}/absent is not in the cluster" in unknown.stderr

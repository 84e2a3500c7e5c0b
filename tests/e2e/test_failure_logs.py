"""A failing end-to-end test shows every component's log: tails in the report, whole logs on disk."""

import subprocess
import sys

from tests.e2e.cluster import ROOT
from tests.e2e.conftest import OUT


def test_a_failing_test_reports_the_component_logs() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "python_files=failing_example.py",
            "tests/e2e/failing_example.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 1, done.stdout[-2000:]
    for component in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
        assert f"{component} (last lines; whole log in" in done.stdout
        assert (OUT / "test_fails_on_purpose" / f"{component}.log").stat().st_size > 0

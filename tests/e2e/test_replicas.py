"""Several replicas with --leader-elect on the real API server: one serves, and when it dies another
takes over within the Lease's duration."""

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.cluster import ControlPlane, wait_for
from tests.edges.serving import Process


@pytest.fixture
def replicas(control_plane: ControlPlane, tmp_path: Path) -> Iterator[list[Process]]:
    lease = f"cardquota-e2e-{int(time.time() * 1000) % 100000}"
    flags = ("--kubeconfig", str(control_plane.kubeconfig), "--drain-seconds", "0", "--leader-elect")
    flags += ("--lease-name", lease, "--lease-namespace", "default")
    started = [
        Process(tmp_path / "certs", tmp_path / f"replica-{i}.log", *flags, cluster=None) for i in range(3)
    ]
    try:
        yield started
    finally:
        for process in started:
            process.stop()


def ready(process: Process) -> bool:
    if process.proc.poll() is not None:
        return False
    try:
        with process.client() as client:
            return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def test_one_replica_serves_and_another_takes_over_when_it_dies(replicas: list[Process]) -> None:
    leaders = wait_for("one ready replica", lambda: [p for p in replicas if ready(p)], timeout=60)
    time.sleep(3)  # a second leader would have had time to appear
    leaders = [p for p in replicas if ready(p)]
    assert len(leaders) == 1
    with leaders[0].client() as client:
        assert "another replica holds the lease" not in client.get("/readyz").text
    others = [p for p in replicas if p is not leaders[0]]
    with others[0].client() as client:
        assert "another replica holds the lease default/cardquota-e2e-" in client.get("/readyz").text
    leaders[0].proc.kill()
    died = time.monotonic()
    successor = wait_for("another replica to take over", lambda: [p for p in others if ready(p)], timeout=40)
    gap = time.monotonic() - died
    assert len(successor) == 1 and gap < 15 + 5, gap
    print(f"failover gap: {gap:.1f} s")

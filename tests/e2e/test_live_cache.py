"""``cardquota serve --kubeconfig`` on the real control plane: the cache syncs, follows creates,
binds and deletes, and the decisions it serves use what the cluster holds now."""

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import ControlPlane, wait_for
from tests.e2e.objects import H200, card_queue, queued_deployment
from tests.edges.serving import Process, queue_figure

Quota = Callable[[dict[str, int]], str]


@pytest.fixture(scope="module")
def live(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    tmp = tmp_path_factory.mktemp("live")
    flags = ("--kubeconfig", str(control_plane.webhook_kubeconfig), "--drain-seconds", "0")
    flags += ("--audit-seconds", "1")
    process = Process(tmp / "certs", tmp / "server.log", *flags, cluster=None)
    try:
        process.wait_ready(timeout=60)
        yield process
        control_plane.assert_no_rbac_refusal(process.log())
    finally:
        process.stop()


def pod_review(namespace: str, queue_name: str, gpus: int) -> bytes:
    name = f"probe-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": {"volcano.sh/card.name": H200, "scheduling.volcano.sh/queue-name": queue_name},
        },
        "spec": {
            "containers": [
                {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ]
        },
    }
    request = {
        "uid": f"review-{name}",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": "CREATE",
        "object": pod,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def test_the_live_cache_follows_creates_binds_and_deletes(
    control_plane: ControlPlane, live: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 3})
    control_plane.apply(queued_deployment("train", 2, queue_name), namespace=namespace)
    with live.client() as client:
        wait_for(
            "the queue's quota in the cache", lambda: queue_figure(client, "quota", queue_name, H200) == 3
        )
        wait_for(
            "both pods bound, in the cache",
            lambda: queue_figure(client, "running", queue_name, H200) == 2,
            timeout=90,
        )
        denied = client.post("/validate", content=pod_review(namespace, queue_name, 2)).json()["response"]
        assert denied["allowed"] is False
        assert denied["status"]["message"].startswith(
            f'queue "{queue_name}" has 1 NVIDIA-H200 left (quota 3: 2 running)'
        )
        control_plane.kubectl("scale", "deployment/train", "--replicas=0", "-n", namespace)
        wait_for(
            "the pods gone from the cache",
            lambda: queue_figure(client, "used", queue_name, H200) == 0,
            timeout=90,
        )
        allowed = client.post("/validate", content=pod_review(namespace, queue_name, 2)).json()["response"]
        assert allowed["allowed"] is True


def test_an_odd_queue_in_the_cluster_is_reported_and_the_cache_goes_on(
    control_plane: ControlPlane, live: Process
) -> None:
    odd = card_queue(f"odd-{uuid.uuid4().hex[:6]}", {H200: 1})
    odd["spec"]["parent"] = {"not": "a string"}  # the minimal CRD preserves unknown fields
    control_plane.apply(odd)
    good = card_queue(f"good-{uuid.uuid4().hex[:6]}", {H200: 2})
    control_plane.apply(good)
    with live.client() as client:
        wait_for(
            "the later queue in the cache",
            lambda: queue_figure(client, "quota", good["metadata"]["name"], H200) == 2,
        )
        assert client.get("/readyz").status_code == 200
    for name in (odd["metadata"]["name"], good["metadata"]["name"]):
        control_plane.kubectl("delete", "queue", name, check=False)


def test_serve_without_a_state_source_says_what_to_pass(tmp_path: Path) -> None:
    process = Process(tmp_path / "certs", tmp_path / "server.log", cluster=None)
    assert process.proc.wait(timeout=30) == 2
    assert "pass --cluster DIR (a snapshot) or --kubeconfig PATH" in process.log()
    process.stop()


def test_the_cache_survives_an_api_server_restart_mid_watch_and_decides_right_afterwards(
    control_plane: ControlPlane, live: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 3})
    deployment = queued_deployment("serve", 1, queue_name)
    control_plane.apply(deployment, namespace=namespace)
    with live.client() as client:
        wait_for(
            "one pod bound, in the cache",
            lambda: queue_figure(client, "running", queue_name, H200) == 1,
            timeout=90,
        )
        control_plane.restart_apiserver()
        control_plane.kubectl("scale", "deployment/serve", "--replicas=2", "-n", namespace)
        wait_for(
            "the second pod, seen after the restart",
            lambda: queue_figure(client, "running", queue_name, H200) == 2,
            timeout=120,
        )
        assert client.get("/readyz").status_code == 200
        denied = client.post("/validate", content=pod_review(namespace, queue_name, 2)).json()["response"]
        assert denied["status"]["message"].startswith(
            f'queue "{queue_name}" has 1 NVIDIA-H200 left (quota 3: 2 running)'
        )
    assert "API server unavailable, retrying" in live.log() or "watch expired" in live.log()


def test_a_quota_lowered_below_use_is_reported_by_the_auditor_without_evicting_anything(
    control_plane: ControlPlane, live: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 2})
    deployment = queued_deployment("busy", 2, queue_name)
    control_plane.apply(deployment, namespace=namespace)
    with live.client() as client:
        wait_for(
            "two pods bound, in the cache",
            lambda: queue_figure(client, "running", queue_name, H200) == 2,
            timeout=90,
        )
        lowered = control_plane.kubectl(
            "apply", "-f", "-", stdin=json.dumps(card_queue(queue_name, {H200: 1}))
        )
        assert lowered.returncode == 0
        wait_for(
            "the overcommitment metric", lambda: queue_figure(client, "overcommitted", queue_name, H200) == 1
        )

    def recorded() -> list[dict[str, Any]]:
        found = control_plane.get(
            "events", "--field-selector", "reason=CardQuotaOvercommitted", namespace="default"
        )
        return [e for e in found["items"] if e["involvedObject"]["name"] == queue_name]

    event = wait_for("a CardQuotaOvercommitted event on the queue", recorded, timeout=30)[0]
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Queue"
    assert event["message"].startswith(
        f'queue "{queue_name}" uses 2 NVIDIA-H200, above its quota (quota 1: 2 running)'
    )
    running = [
        p
        for p in control_plane.get("pods", "-l", "app=busy", namespace=namespace)["items"]
        if p["status"].get("phase") == "Running"
    ]
    assert len(running) == 2  # nothing evicted


def test_status_reads_the_live_cluster_too(control_plane: ControlPlane, card_quota: Quota) -> None:
    queue_name = card_quota({H200: 5})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "status",
            "--kubeconfig",
            str(control_plane.kubeconfig),
            "--output",
            "json",
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["queues"][queue_name][H200]["quota"] == 5
    assert status["cards"][H200]["total"] > 0

"""Shared GPUs on the local control plane: kwok nodes advertise Volcano vGPU and Koordinator
resources, and Deployments of pods that take a fraction of a card are admitted exactly up to the
queue's quota (decisions.md §21)."""

from collections.abc import Callable
from typing import Any

from tests.e2e.cluster import ControlPlane, headroom, wait_for
from tests.e2e.objects import H200, deployment_of, hpa
from tests.edges.serving import Process

Quota = Callable[[dict[str, int]], str]
H800 = "NVIDIA-H800"
THIRD = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "33", "volcano.sh/vgpu-memory": "20480"}
QUARTER = {"koordinator.sh/gpu-core": "25", "koordinator.sh/gpu-memory-ratio": "25"}


def shared_deployment(
    name: str, replicas: int, queue: str, product: str, limits: dict[str, str]
) -> dict[str, Any]:
    container = {"name": "main", "image": "registry.example/app:1", "resources": {"limits": limits}}
    annotations = {"volcano.sh/card.name": product, "scheduling.volcano.sh/queue-name": queue}
    return deployment_of(
        name, replicas, {"metadata": {"annotations": annotations}, "spec": {"containers": [container]}}
    )


def events(plane: ControlPlane, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in plane.get("events", namespace=namespace)["items"] if e.get("reason") == reason]


def running(plane: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]]:
    pods = plane.get("pods", "-l", f"app={app}", namespace=namespace)["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"]


def test_thirds_of_a_vgpu_fill_two_cards_as_headroom_says_and_the_seventh_is_denied_to_kubectl_and_the_hpa(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H800: 2})
    control_plane.apply(shared_deployment("embed", 4, queue_name, H800, THIRD), namespace=namespace)
    wait_for("4 running pods", lambda: len(running(control_plane, namespace, "embed")) == 4, timeout=120)
    ref = f"deployment/{namespace}/embed"
    answer = wait_for(
        "the 4 pods bound in the headroom view",
        lambda: (a := headroom(control_plane, ref))["cards"][H800]["bound"] == 1.32 and a,
        timeout=60,
    )
    assert (answer["replicas"], answer["more"]) == (4, 2)  # 0.68 left: two more thirds (0.33 each)
    control_plane.kubectl("scale", "deployment/embed", "--replicas=6", "-n", namespace)
    pods = wait_for(
        "6 running pods",
        lambda: len(found := running(control_plane, namespace, "embed")) == 6 and found,
        timeout=120,
    )
    assert {p["spec"]["nodeName"] for p in pods} == {"h800-vgpu-0"}  # the only H800 node with vGPUs
    scaled = control_plane.kubectl("scale", "deployment/embed", "--replicas=7", "-n", namespace, check=False)
    assert scaled.returncode != 0
    assert f"scale-up of deployment {namespace}/embed from 6 to 7 replicas needs 0.33" in scaled.stderr
    assert f'queue "{queue_name}" has 0.02 NVIDIA-H800 left (quota 2: 1.98 running)' in scaled.stderr
    control_plane.apply(hpa("embed", 8, 8), namespace=namespace)
    rescale = wait_for(
        "a FailedRescale event", lambda: events(control_plane, namespace, "FailedRescale"), timeout=90
    )
    assert (
        f"scale-up of deployment {namespace}/embed from 6 to 8 replicas needs 0.66" in rescale[0]["message"]
    )
    assert headroom(control_plane, ref)["more"] == 0


def test_koordinator_quarters_are_admitted_up_to_the_quota_and_the_next_pod_fails_to_create(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 1})
    control_plane.apply(shared_deployment("vision", 5, queue_name, H200, QUARTER), namespace=namespace)
    failed = wait_for(
        "a FailedCreate event", lambda: events(control_plane, namespace, "FailedCreate"), timeout=90
    )
    assert f'queue "{queue_name}" has 0 NVIDIA-H200 left (quota 1: ' in failed[0]["message"]
    assert "needs 0.25" in failed[0]["message"]
    pods = wait_for(
        "4 running pods",
        lambda: len(found := running(control_plane, namespace, "vision")) == 4 and found,
        timeout=120,
    )
    assert {p["spec"]["nodeName"] for p in pods} == {"h200-koord-0"}

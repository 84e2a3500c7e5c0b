"""The CPU/memory check end to end: a webhook run with ``--cpu-memory-check`` on the live cache of a
real API server refuses Volcano pods and scale-ups past their queue's ``spec.capability``."""

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import ControlPlane, wait_for
from tests.e2e.objects import H200, card_queue, deployment_of
from tests.e2e.registration import configurations
from tests.edges.serving import Process

CHECKED = {"cardquota-e2e-cpu-check": "on"}  # namespaces sent to this module's webhook only


@contextlib.contextmanager
def cpu_checked(plane: ControlPlane, tmp: Path) -> Iterator[str]:
    """A namespace whose pods and workloads go to a webhook run with ``--cpu-memory-check`` on
    ``plane``, registered from the chart with ``cpuMemoryCheck.enabled=true``."""
    flags = (
        "--kubeconfig",
        str(plane.webhook_kubeconfig),
        "--drain-seconds",
        "0",
        "--cpu-memory-check",
    )
    process = Process(tmp / "certs", tmp / "server.log", *flags, cluster=None)
    prefix = f"cq-cpu-{uuid.uuid4().hex[:6]}"
    registered = configurations(
        process.url,
        process.certs / "ca.crt",
        CHECKED,
        prefix,
        plane.webhook_user,
        values=("cpuMemoryCheck.enabled=true",),
    )
    name = f"e2e-cpu-{uuid.uuid4().hex[:6]}"
    probe_queue = f"probe-{name}"  # a queue without a capability: the check refuses any CPU in it
    try:
        process.wait_ready(timeout=60)
        plane.apply(*registered)
        plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": CHECKED}})
        plane.apply(card_queue(probe_queue, {H200: 1}))

        def answers() -> bool:
            probe = cpu_pod("probe", probe_queue, "1")
            done = plane.kubectl(
                "create", "--dry-run=server", "-n", name, "-f", "-", stdin=json.dumps(probe), check=False
            )
            assert "sets no cpu in spec.capability" in done.stderr, done.stderr or done.stdout
            return True

        wait_for("the API server to call the checking webhook", answers, timeout=30)
        yield name
        plane.assert_no_rbac_refusal(process.log())
    finally:
        for config in registered:
            plane.kubectl("delete", config["kind"].lower(), config["metadata"]["name"], check=False)
        plane.kubectl("delete", "namespace", name, "--wait=false", check=False)
        plane.kubectl("delete", "queue", probe_queue, check=False)
        process.stop()


@pytest.fixture(scope="module")
def checked_namespace(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cpu_checked(control_plane, tmp_path_factory.mktemp("cpu-check")) as name:
        yield name


def cpu_pod(name: str, queue: str, cpu: str, scheduler: str = "volcano") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"scheduling.volcano.sh/queue-name": queue}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {"name": "c", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}
            ],
        },
    }


def created(plane: ControlPlane, namespace: str, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``kubectl create`` of ``obj`` in ``namespace``, whatever it answers."""
    return plane.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(obj), check=False)


def test_volcano_pods_and_scale_ups_past_the_queue_capability_are_refused(
    control_plane: ControlPlane, checked_namespace: str
) -> None:
    namespace, queue = checked_namespace, f"q-{checked_namespace}"
    capacity = card_queue(queue, {H200: 4})
    capacity["spec"]["capability"] = {"cpu": "2", "memory": "4Gi"}
    control_plane.apply(capacity)
    try:
        create = partial(created, control_plane, namespace)
        assert create(cpu_pod("a", queue, "1")).returncode == 0
        refused = create(cpu_pod("b", queue, "1500m"))
        assert refused.returncode != 0
        assert f'queue "{queue}" has 1 cpu left (capability 2: 1 ' in refused.stderr
        assert f"pod {namespace}/b needs 1.5 cpu" in refused.stderr
        assert create(cpu_pod("elsewhere", queue, "8", scheduler="default-scheduler")).returncode == 0
        web = deployment_of("web", 1, cpu_pod("web", queue, "500m"))
        assert create(web).returncode == 0
        wait_for(
            "the Deployment's pod",
            lambda: len(control_plane.get("pods", namespace=namespace)["items"]) == 3,
            timeout=60,
        )
        scaled = control_plane.kubectl(
            "scale", "-n", namespace, "deployment/web", "--replicas=3", check=False
        )
        assert scaled.returncode != 0
        assert (
            f"scale-up of deployment {namespace}/web from 1 to 3 replicas needs 1 cpu (500m per pod)"
            in scaled.stderr
        )
        assert (
            control_plane.kubectl("scale", "-n", namespace, "deployment/web", "--replicas=2").returncode == 0
        )
    finally:
        control_plane.kubectl("delete", "queue", queue, check=False)


def test_an_in_place_resize_or_a_pod_level_request_past_the_capability_is_refused(
    control_plane: ControlPlane, checked_namespace: str
) -> None:
    """Two writes the check once missed: ``pods/resize`` (in-place resize, GA in Kubernetes 1.35)
    and a pod whose containers ask nothing but whose pod-level ``spec.resources`` (KEP-2837) does;
    each with its twin inside the capability."""
    resize_and_pod_level(control_plane, checked_namespace)


def resize_and_pod_level(plane: ControlPlane, namespace: str, scheduled: bool = False) -> None:
    """A resize and a pod-level request past the capability are refused, each twin inside it is
    admitted; ``scheduled``: a real scheduler runs ``plane``, and the twins run."""
    queue = f"qr-{namespace}"
    capacity = card_queue(queue, {H200: 4})
    capacity["spec"]["capability"] = {"cpu": "2", "memory": "4Gi"}
    plane.apply(capacity)
    try:
        create = partial(created, plane, namespace)
        assert create(cpu_pod("small", queue, "500m")).returncode == 0
        if scheduled:
            wait_for("the small pod running", lambda: running(plane, namespace, "small"), timeout=90)
            supports_resize(plane, namespace, "small")

        def resize(cpu: str) -> Any:
            patch = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}
            return plane.kubectl(
                "patch",
                "-n",
                namespace,
                "pod/small",
                "--subresource=resize",
                "-p",
                json.dumps(patch),
                check=False,
            )

        refused = resize("3")
        assert refused.returncode != 0, refused.stdout
        assert f"resize of pod {namespace}/small from 500m to 3 cpu needs 2.5 cpu more" in refused.stderr, (
            refused.stderr
        )
        assert resize("1").returncode == 0  # its twin: inside the capability
        pod_level = cpu_pod("pod-level", queue, "0")
        del pod_level["spec"]["containers"][0]["resources"]
        pod_level["spec"]["resources"] = {"requests": {"cpu": "2", "memory": "256Mi"}}
        refused = create(pod_level)
        assert refused.returncode != 0 and f"pod {namespace}/pod-level needs 2 cpu" in refused.stderr, (
            refused.stderr
        )
        pod_level["spec"]["resources"]["requests"]["cpu"] = "500m"  # its twin
        assert create(pod_level).returncode == 0, "a pod-level request inside the capability"
        if scheduled:
            wait_for("the pod-level twin running", lambda: running(plane, namespace, "pod-level"), timeout=90)
    finally:
        plane.kubectl("delete", "queue", queue, check=False)


def running(plane: ControlPlane, namespace: str, name: str) -> bool:
    got = plane.get("pod", name, namespace=namespace)
    return got["status"].get("phase") == "Running" and bool(got["spec"].get("nodeName"))


def supports_resize(plane: ControlPlane, namespace: str, name: str) -> None:
    """Say in the pod's status, as a kubelet that resizes in place does (kwok's does not), the
    resources its containers run with: the API server refuses to resize a running pod without."""
    got = plane.get("pod", name, namespace=namespace)
    by_name = {c["name"]: c["resources"] for c in got["spec"]["containers"]}
    for status in got["status"]["containerStatuses"]:
        status["resources"] = by_name[status["name"]]
    plane.kubectl("replace", "--subresource=status", "-f", "-", stdin=json.dumps(got))

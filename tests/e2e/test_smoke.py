"""Every component of the local control plane does its part: the ReplicaSet controller creates pods,
kube-scheduler binds them to kwok GPU nodes, kwok runs them, the HPA scales through
``deployments/scale``, the API server calls a webhook registered by URL, kubectl and helm work."""

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.e2e.cluster import ControlPlane, wait_for
from tests.e2e.objects import gpu_deployment, hpa
from tests.e2e.recorder import Recorder

CAPTURED = Path(__file__).resolve().parents[1] / "data"


def running_pods(plane: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]]:
    pods = plane.get("pods", "-l", f"app={app}", namespace=namespace)["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"]


def test_deployment_pods_are_scheduled_onto_kwok_gpu_nodes_and_run(
    control_plane: ControlPlane, recorder: Recorder, namespace: str
) -> None:
    control_plane.apply(gpu_deployment("infer", 2), namespace=namespace)
    pods = wait_for(
        "2 running pods",
        lambda: (found := running_pods(control_plane, namespace, "infer")) and len(found) == 2 and found,
        timeout=90,
    )
    assert {p["spec"]["nodeName"] for p in pods} == {"rtx4090-0"}
    creates = recorder.matching("pods", "CREATE", namespace=namespace)
    assert len(creates) >= 2
    assert creates[0]["userInfo"]["username"] == "system:serviceaccount:kube-system:replicaset-controller"


def test_the_hpa_scales_a_deployment_through_the_scale_subresource(
    control_plane: ControlPlane, recorder: Recorder, namespace: str
) -> None:
    control_plane.apply(gpu_deployment("chat", 1), namespace=namespace)
    control_plane.apply(hpa("chat", 3, 4), namespace=namespace)
    wait_for(
        "the HPA to scale chat to 3",
        lambda: control_plane.get("deployment", "chat", namespace=namespace)["spec"]["replicas"] == 3,
        timeout=90,
    )
    scales = recorder.matching("deployments", "UPDATE", sub_resource="scale", namespace=namespace)
    assert scales, "the API server did not send the scale write to the webhook"
    review = scales[0]
    assert review["kind"] == {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    assert review["userInfo"]["username"] == "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
    assert (review["oldObject"]["spec"]["replicas"], review["object"]["spec"]["replicas"]) == (1, 3)
    captured = json.loads((CAPTURED / "scale-subresource.review.json").read_text())["request"]
    assert set(review) == set(captured), (
        "the scale AdmissionReview changed shape: run python -m tests.e2e.capture"
    )


def test_a_podgroup_create_reaches_the_webhook(
    control_plane: ControlPlane, recorder: Recorder, namespace: str
) -> None:
    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "pg-1"},
        "spec": {"minMember": 1, "queue": "default"},
    }
    control_plane.apply(group, namespace=namespace)
    created = recorder.matching("podgroups", "CREATE", namespace=namespace)
    assert created and created[0]["object"]["spec"]["minMember"] == 1
    captured = json.loads((CAPTURED / "podgroup-create.review.json").read_text())["request"]
    assert set(created[0]) == set(captured), (
        "the PodGroup AdmissionReview changed shape: run python -m tests.e2e.capture"
    )


def test_kubectl_and_helm_work_against_the_control_plane(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.36.3"
    chart = tmp_path / "hello"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: hello\nversion: 0.1.0\nkubeVersion: '>= 1.30.0-0'\n"
    )
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: hello}\ndata: {greeting: {{ .Values.greeting | quote }}}\n"
    )
    (chart / "values.yaml").write_text("greeting: hi\n")
    helm = [str(control_plane.bin / "helm"), f"--kubeconfig={control_plane.kubeconfig}", "-n", namespace]
    subprocess.run([*helm, "install", "hello", str(chart)], check=True, capture_output=True, timeout=120)
    assert (
        json.loads(
            subprocess.run([*helm, "list", "-o", "json"], check=True, capture_output=True, timeout=60).stdout
        )[0]["status"]
        == "deployed"
    )
    assert control_plane.get("configmap", "hello", namespace=namespace)["data"] == {"greeting": "hi"}

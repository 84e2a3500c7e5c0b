"""The webhook registered with the real API server, deciding from its live cache: what a user of
kubectl, a ReplicaSet and the HPA controller see."""

import json
import ssl
import subprocess
import sys
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import yaml

from tests.e2e import cluster
from tests.e2e.cluster import ControlPlane, wait_for
from tests.e2e.objects import H200, card_queue, editor_rights, hpa, queued_deployment
from tests.edges.serving import Process

Quota = Callable[[dict[str, int]], str]


def test_a_malformed_quota_is_refused_with_our_message_and_an_overcommit_is_warned(
    control_plane: ControlPlane, webhook: Process
) -> None:
    bad = control_plane.kubectl(
        "apply", "-f", "-", stdin=json.dumps(card_queue("bad-q", '{"NVIDIA-H200": -1}')), check=False
    )
    assert bad.returncode != 0
    assert (
        "queue \"bad-q\" has a malformed volcano.sh/card.quota: count for 'NVIDIA-H200' must be >= 0, got -1"
        in bad.stderr
    )
    name = f"big-{uuid.uuid4().hex[:6]}"
    big = control_plane.kubectl(
        "apply", "-f", "-", stdin=json.dumps(card_queue(name, '{"NVIDIA-H200": 500}'))
    )
    assert "Warning: NVIDIA-H200: all queues' quotas sum to" in big.stderr
    control_plane.kubectl("delete", "queue", name, check=False)


def events(plane: ControlPlane, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in plane.get("events", namespace=namespace)["items"] if e.get("reason") == reason]


def test_pods_within_quota_get_affinity_and_land_on_their_model_and_the_rest_fail_to_create(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 2})
    deployment = queued_deployment("train", 3, queue_name)
    del deployment["spec"]["template"]["spec"]["nodeSelector"]  # the injected affinity must do the pinning
    control_plane.apply(deployment, namespace=namespace)
    failed = wait_for(
        "a FailedCreate event", lambda: events(control_plane, namespace, "FailedCreate"), timeout=60
    )
    assert f'queue "{queue_name}" has 0 NVIDIA-H200 left (quota 2: ' in failed[0]["message"]
    assert "needs 1" in failed[0]["message"]

    def running() -> list[dict[str, Any]]:
        pods = control_plane.get("pods", "-l", "app=train", namespace=namespace)["items"]
        return [p for p in pods if p["status"].get("phase") == "Running"]

    pods = wait_for("2 running pods", lambda: len(found := running()) == 2 and found, timeout=90)
    for pod in pods:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H200]}
        ]
        assert pod["spec"]["nodeName"] == "h200-mig-0"


def test_kubectl_scale_and_apply_are_denied_alike_and_a_server_dry_run_holds_nothing(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 2})
    deployment = queued_deployment("chat", 1, queue_name)
    control_plane.apply(deployment, namespace=namespace)
    wait_for(
        "1 running pod",
        lambda: [
            p
            for p in control_plane.get("pods", "-l", "app=chat", namespace=namespace)["items"]
            if p["spec"].get("nodeName")
        ],
        timeout=90,
    )
    scaled = control_plane.kubectl("scale", "deployment/chat", "--replicas=4", "-n", namespace, check=False)
    message = f"scale-up of deployment {namespace}/chat from 1 to 4 replicas needs 3 NVIDIA-H200 (1 per pod)"
    assert scaled.returncode != 0 and message in scaled.stderr
    assert f'queue "{queue_name}" has 1 left (quota 2: 1 running)' in scaled.stderr
    deployment["spec"]["replicas"] = 4
    for extra in (["--dry-run=server"], []):
        applied = control_plane.kubectl(
            "apply", *extra, "-n", namespace, "-f", "-", stdin=json.dumps(deployment), check=False
        )
        assert applied.returncode != 0 and message in applied.stderr
    deployment["spec"]["replicas"] = 2
    for _ in range(3):  # dry runs leave no hold: the real scale to 2 still fits afterwards
        control_plane.kubectl(
            "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=json.dumps(deployment)
        )
    control_plane.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(deployment))


def test_the_hpa_is_denied_past_the_quota_and_scales_once_cards_are_freed(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 2})
    for name, replicas in (("other", 1), ("chat", 1)):
        control_plane.apply(queued_deployment(name, replicas, queue_name), namespace=namespace)
    control_plane.apply(hpa("chat", 2, 4), namespace=namespace)
    rescale = wait_for(
        "a FailedRescale event", lambda: events(control_plane, namespace, "FailedRescale"), timeout=90
    )
    message = rescale[0]["message"]
    assert f'queue "{queue_name}" has 0 NVIDIA-H200 left (quota 2: 2 running)' in message
    assert f"scale-up of deployment {namespace}/chat from 1 to 2 replicas needs 1" in message
    control_plane.kubectl("scale", "deployment/other", "--replicas=0", "-n", namespace)
    wait_for(
        "the HPA to scale chat to 2",
        lambda: control_plane.get("deployment", "chat", namespace=namespace)["spec"]["replicas"] == 2,
        timeout=90,
    )


def test_a_podgroup_created_for_a_pod_gets_the_card_annotations(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 4})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "solo",
            "annotations": {"volcano.sh/card.name": H200, "scheduling.volcano.sh/queue-name": queue_name},
        },
        "spec": {
            "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
        },
    }
    control_plane.apply(pod, namespace=namespace)
    uid = control_plane.get("pod", "solo", namespace=namespace)["metadata"]["uid"]
    # Written here as Volcano's pg-controller writes it: this control plane runs no Volcano controller
    # (it would race the tests that write PodGroups in given phases). The real controller's
    # PodGroups are checked in test_scheduler_agreement.py.
    group = {  # as the Volcano controller creates it: named after, and owned by, the pod
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": f"podgroup-{uid}",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "solo", "uid": uid, "controller": True}
            ],
        },
        "spec": {"minMember": 1, "queue": queue_name},
    }

    # Created right after the pod, as Volcano does: if the cache has not seen the pod yet, the
    # webhook reads it live (SPEC §7), so the first create is annotated.
    control_plane.apply(group, namespace=namespace)
    annotations = control_plane.get("podgroup", f"podgroup-{uid}", namespace=namespace)["metadata"][
        "annotations"
    ]
    assert annotations["volcano.sh/card.name"] == H200
    assert json.loads(annotations["volcano.sh/card.request"]) == {H200: 2}


def test_a_podgroup_for_a_deployments_pods_gets_the_inference_service_type_and_is_not_preemptable(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 4})
    control_plane.apply(queued_deployment("chat", 1, queue_name), namespace=namespace)
    replicaset = wait_for(
        "the Deployment's ReplicaSet",
        lambda: control_plane.get("replicasets", "-l", "app=chat", namespace=namespace)["items"],
        timeout=30,
    )[0]["metadata"]
    # Written as Volcano's pg-controller writes it (see the test above for why; the real one is in
    # test_scheduler_agreement.py), so that the service-type settings are checked on this webhook.
    group = {  # as the Volcano controller creates it: one per ReplicaSet, owned by it
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": f"podgroup-{replicaset['uid']}",
            "annotations": {"scheduling.k8s.io/group-name": "kept"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": replicaset["name"],
                    "uid": replicaset["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"minMember": 1, "queue": queue_name},
    }
    control_plane.apply(group, namespace=namespace)
    annotations = control_plane.get("podgroup", group["metadata"]["name"], namespace=namespace)["metadata"][
        "annotations"
    ]
    assert annotations["volcano.sh/service.type"] == "inference"
    assert annotations["volcano.sh/preemptable"] == "false"
    assert annotations["volcano.sh/card.name"] == H200
    assert annotations["scheduling.k8s.io/group-name"] == "kept"
    # A training PodGroup the user marked stays as the user set it.
    group["metadata"]["name"] += "-user"
    group["metadata"]["annotations"] = {"volcano.sh/service.type": "training"}
    control_plane.apply(group, namespace=namespace)
    mine = control_plane.get("podgroup", group["metadata"]["name"], namespace=namespace)["metadata"][
        "annotations"
    ]
    assert (mine["volcano.sh/service.type"], mine["volcano.sh/preemptable"]) == ("training", "true")


def test_two_hundred_concurrent_creates_against_fifty_free_cards_admit_exactly_fifty(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 50})
    context = ssl.create_default_context(cafile=str(control_plane.certs / "ca.crt"))
    context.load_cert_chain(control_plane.certs / "admin.crt", control_plane.certs / "admin.key")
    url = f"{control_plane.server}/api/v1/namespaces/{namespace}/pods"

    def body(i: int) -> dict[str, Any]:
        annotations = {"volcano.sh/card.name": H200, "scheduling.volcano.sh/queue-name": queue_name}
        limits = {"nvidia.com/gpu": "1"}
        container = {"name": "c", "image": "i", "resources": {"limits": limits}}
        # Pinned to a node that does not exist: they stay pending, and pending pods count.
        spec = {"containers": [container], "nodeSelector": {"cardquota-e2e/nowhere": "true"}}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"burst-{i}", "annotations": annotations},
            "spec": spec,
        }

    with httpx.Client(verify=context, timeout=30) as client, ThreadPoolExecutor(max_workers=32) as pool:
        statuses = list(pool.map(lambda i: client.post(url, json=body(i)).status_code, range(200)))
    assert statuses.count(201) == 50 and statuses.count(403) == 150, sorted(set(statuses))
    pods = control_plane.get("pods", namespace=namespace)["items"]
    assert len([p for p in pods if p["metadata"]["name"].startswith("burst-")]) == 50


def test_headroom_on_the_live_cluster_is_what_the_hpa_can_scale_to(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 5})
    for name, replicas in (("other", 2), ("chat", 1)):
        control_plane.apply(queued_deployment(name, replicas, queue_name), namespace=namespace)

    def headroom() -> dict[str, Any]:
        return cluster.headroom(control_plane, f"deployment/{namespace}/chat")

    def settled() -> dict[str, Any] | None:
        answer = headroom()
        return answer if answer["cards"].get(H200, {}).get("bound") == 3 else None

    answer = wait_for("the three pods bound in the headroom view", settled, timeout=90)
    assert (answer["replicas"], answer["more"]) == (1, 2)
    assert f'queue "{queue_name}" has 2 left' in answer["reason"]
    control_plane.apply(hpa("chat", 1 + answer["more"], 1 + answer["more"]), namespace=namespace)
    wait_for(
        "the HPA to scale chat by the headroom",
        lambda: control_plane.get("deployment", "chat", namespace=namespace)["spec"]["replicas"] == 3,
        timeout=90,
    )
    assert not events(control_plane, namespace, "FailedRescale")
    patch = json.dumps({"spec": {"minReplicas": 4, "maxReplicas": 4}})
    control_plane.kubectl("patch", "hpa", "chat", "-n", namespace, "--type=merge", "-p", patch)
    rescale = wait_for(
        "one more denied", lambda: events(control_plane, namespace, "FailedRescale"), timeout=90
    )
    assert f"scale-up of deployment {namespace}/chat from 3 to 4 replicas needs 1" in rescale[0]["message"]
    assert wait_for("headroom 0", lambda: (a := headroom())["more"] == 0 and a, timeout=60)


def test_whatif_on_the_live_cluster_says_what_applying_the_manifest_then_gets(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 1})

    def card_pod(name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {"volcano.sh/card.name": H200, "scheduling.volcano.sh/queue-name": queue_name},
            },
            "spec": {
                "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            },
        }

    manifest = yaml.safe_dump_all([card_pod("wi-0"), card_pod("wi-1")])
    asked = [
        sys.executable,
        "-m",
        "webhook",
        "whatif",
        "-f",
        "-",
        "--kubeconfig",
        str(control_plane.kubeconfig),
    ]
    done = subprocess.run(
        [*asked, "--output", "json"], input=manifest.encode(), capture_output=True, check=True, timeout=120
    )
    first, second = json.loads(done.stdout)
    assert (first["allowed"], second["allowed"]) == (True, False)
    assert [p["path"] for p in first["patch"]] == ["/spec/affinity"]
    full = f'queue "{queue_name}" has 0 NVIDIA-H200 left (quota 1: '
    assert second["message"].startswith(full) and second["message"].endswith(f"pod {namespace}/wi-1 needs 1")
    assert not control_plane.get("pods", namespace=namespace)["items"]  # nothing was recorded or created
    applied = control_plane.kubectl("create", "-f", "-", stdin=manifest, check=False)
    assert "pod/wi-0 created" in applied.stdout
    assert full in applied.stderr and f"pod {namespace}/wi-1 needs 1" in applied.stderr
    (made,) = control_plane.get("pods", namespace=namespace)["items"]
    assert made["spec"]["affinity"] == first["patch"][0]["value"]


def test_a_child_queue_under_a_full_parent_is_denied_with_the_parent_named(
    control_plane: ControlPlane, webhook: Process, namespace: str
) -> None:
    parent, child = f"org-{namespace}", f"team-{namespace}"
    child_queue = card_queue(child, {H200: 5})
    child_queue["spec"]["parent"] = parent
    control_plane.apply(card_queue(parent, {H200: 2}), child_queue)
    try:
        control_plane.apply(queued_deployment("train", 3, child), namespace=namespace)
        failed = wait_for(
            "a FailedCreate event", lambda: events(control_plane, namespace, "FailedCreate"), timeout=60
        )
        message = failed[0]["message"]
        assert (
            f'queue "{parent}" (above "{child}", counting all its queues) has 0 NVIDIA-H200 left' in message
        )
        assert f"pod {namespace}/train-" in message
    finally:
        control_plane.kubectl("delete", "queue", child, parent, check=False)


def gated_pods(plane: ControlPlane, namespace: str, prefix: str) -> list[dict[str, Any]]:
    return [
        p
        for p in plane.get("pods", namespace=namespace)["items"]
        if p["metadata"]["name"].startswith(f"{prefix}-")
        and any(g["name"] == "cardquota.volcano.sh/waiting" for g in p["spec"].get("schedulingGates") or [])
    ]


def test_in_wait_mode_a_pod_that_does_not_fit_waits_gated_and_no_one_else_may_ungate_it(
    control_plane: ControlPlane, webhook: Process, namespace: str, card_quota: Quota
) -> None:
    queue_name = card_quota({H200: 1})
    control_plane.kubectl("annotate", "queue", queue_name, "cardquota.volcano.sh/over-quota=wait")
    control_plane.apply(queued_deployment("hog", 1, queue_name), namespace=namespace)
    wait_for("the hog's pod", lambda: control_plane.get("pods", namespace=namespace)["items"], timeout=60)
    control_plane.apply(queued_deployment("web", 1, queue_name), namespace=namespace)
    (held,) = wait_for(
        "web's pod, held under the gate", lambda: gated_pods(control_plane, namespace, "web"), timeout=30
    )
    name = held["metadata"]["name"]
    waiting = events(control_plane, namespace, "CardQuotaWaiting")
    assert not events(control_plane, namespace, "FailedCreate")
    # Someone with every right to update pods in the namespace tries to let it through.
    control_plane.apply(*editor_rights("mallory"), namespace=namespace)
    remove = json.dumps([{"op": "remove", "path": "/spec/schedulingGates/0"}])
    args = ("--as=mallory", "patch", "-n", namespace, f"pod/{name}", "--type=json", "-p", remove)
    denied = control_plane.kubectl(*args, check=False)
    assert denied.returncode != 0
    assert (
        f'pod {namespace}/{name} waits 1st in queue "{queue_name}"\'s line for 1 NVIDIA-H200 under the'
        " scheduling gate cardquota.volcano.sh/waiting; only the card-quota webhook removes it"
    ) in denied.stderr, denied.stderr
    assert gated_pods(control_plane, namespace, "web")
    wait_for(
        "the CardQuotaWaiting Event",
        lambda: events(control_plane, namespace, "CardQuotaWaiting") or waiting,
        timeout=10,
    )
    # Its card frees: the webhook itself removes the gate (its removal is never sent to it).
    control_plane.kubectl("delete", "-n", namespace, "deployment/hog", "--wait=false")
    wait_for("web released", lambda: not gated_pods(control_plane, namespace, "web"), timeout=30)
    (released,) = events(control_plane, namespace, "CardQuotaReleased")
    assert released["involvedObject"]["name"] == name
    assert released["message"].startswith(
        f'cards freed in queue "{queue_name}": released to run on 1 NVIDIA-H200'
    )

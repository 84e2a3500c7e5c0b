"""Decisions on AdmissionReviews captured from the real kube-apiserver (``python -m tests.e2e.capture``),
so the unit tests stay honest about the wire format of scale writes and PodGroup creates."""

import base64
import json
from pathlib import Path
from typing import Any

from tests.builders import R4090, cluster, node, pod, queue
from webhook.core.model.verdicts import Allowed, Denied
from webhook.serve import review

DATA = Path(__file__).resolve().parents[1] / "data"
SCALE = (DATA / "scale-subresource.review.json").read_bytes()
PODGROUP = (DATA / "podgroup-create.review.json").read_bytes()
REPLICASET: dict[str, Any] = json.loads((DATA / "podgroup-owner-replicaset.json").read_text())


def captured_cluster(quota: int) -> Any:
    """The captured Deployment, its ReplicaSet (as the API server returned it) and one running pod."""
    namespace = REPLICASET["metadata"]["namespace"]
    owner = REPLICASET["metadata"]["ownerReferences"][0]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": owner["name"], "namespace": namespace, "uid": owner["uid"]},
        "spec": {"replicas": 1, "template": REPLICASET["spec"]["template"]},
    }
    rs_ref = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": REPLICASET["metadata"]["name"],
        "uid": REPLICASET["metadata"]["uid"],
        "controller": True,
    }
    running = pod(
        "chat-0",
        R4090,
        queue_name=None,
        namespace=namespace,
        node_name="rtx4090-0",
        phase="Running",
        owner=rs_ref,
    )
    return cluster(
        node("rtx4090-0", R4090, 4),
        queue("default", json.dumps({R4090: quota})),
        deployment,
        REPLICASET,
        running,
    )


def test_the_captured_hpa_scale_write_is_denied_with_the_full_message() -> None:
    state = captured_cluster(quota=2)
    uid, decision = review.decide(state, SCALE, "validate", 0.0)
    namespace = REPLICASET["metadata"]["namespace"]
    assert uid == json.loads(SCALE)["request"]["uid"]
    assert isinstance(decision, Denied)
    assert decision.message == (
        f"scale-up of deployment {namespace}/chat from 1 to 3 replicas needs 2 NVIDIA-GeForce-RTX-4090 (1 per pod);"
        ' queue "default" has 1 left (quota 2: 1 running)'
    )


def test_the_captured_hpa_scale_write_passes_when_the_quota_holds_it() -> None:
    _, decision = review.decide(captured_cluster(quota=3), SCALE, "validate", 0.0)
    assert isinstance(decision, Allowed) and decision.hold is not None and decision.hold.pods == 2


def test_the_captured_podgroup_create_gets_its_owners_card_annotations() -> None:
    response = review.answer(captured_cluster(quota=2), PODGROUP, "mutate", 0.0)["response"]
    patch = json.loads(base64.b64decode(response["patch"]))
    assert patch == [
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {
                "volcano.sh/card.name": R4090,
                "volcano.sh/card.request": json.dumps({R4090: 1}, separators=(",", ":")),
            },
        }
    ]

"""Capture, once, what this API server version sends a webhook for a ``deployments/scale`` write (by
the HPA) and for a PodGroup create owned by a ReplicaSet: ``python -m tests.e2e.capture``.

Writes ``tests/data/*.review.json``; the unit tests in ``tests/edges/test_captured_reviews.py``
decide on them, so they stay honest about the wire format.
"""

import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

from tests.e2e.cluster import ROOT, ControlPlane, wait_for
from tests.e2e.objects import SELECTOR, gpu_deployment, hpa, namespace
from tests.e2e.recorder import Recorder

DATA = ROOT / "tests" / "data"


def capture(plane: ControlPlane, hook: Recorder) -> dict[str, dict[str, Any]]:
    name = f"capture-{uuid.uuid4().hex[:6]}"
    plane.apply(namespace(name))
    plane.apply(gpu_deployment("chat", 1), namespace=name)
    plane.apply(hpa("chat", 3, 4), namespace=name)
    scale = wait_for(
        "the HPA's scale write",
        lambda: hook.matching("deployments", "UPDATE", "scale", name),
        timeout=90,
    )[0]
    rs = wait_for("chat's ReplicaSet", lambda: plane.get("replicasets", namespace=name)["items"], timeout=30)[
        0
    ]
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": rs["metadata"]["name"],
        "uid": rs["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": f"podgroup-{rs['metadata']['uid']}", "ownerReferences": [owner]},
        "spec": {"minMember": 1, "queue": "default"},
    }
    plane.apply(group, namespace=name)
    created = hook.matching("podgroups", "CREATE", namespace=name)[0]
    return {
        "scale-subresource.review.json": {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": scale,
        },
        "podgroup-create.review.json": {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": created,
        },
        "podgroup-owner-replicaset.json": rs,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(Path(tmp)).start()
        hook = Recorder(plane.certs).start()
        try:
            plane.apply(hook.configuration("cardquota-capture", SELECTOR))
            wait_for(
                "the webhook configuration",
                lambda: plane.get("validatingwebhookconfigurations")["items"],
                timeout=30,
            )
            found = capture(plane, hook)
        finally:
            hook.stop()
            plane.stop()
    DATA.mkdir(exist_ok=True)
    for name, body in found.items():
        (DATA / name).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
        print(f"wrote {DATA / name}")


if __name__ == "__main__":
    main()

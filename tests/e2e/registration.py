"""Register a webhook served outside the cluster (by URL) for exactly the rules SPEC §6 needs."""

import base64
from pathlib import Path
from typing import Any

APPS = ["deployments", "statefulsets", "replicasets"]


def _rule(group: str, version: str, resources: list[str], operations: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "apiVersions": [version], "resources": resources, "operations": operations}


VALIDATING_RULES = [
    _rule("", "v1", ["pods"], ["CREATE"]),
    _rule("apps", "v1", [f"{r}/scale" for r in APPS], ["UPDATE"]),
    _rule("apps", "v1", APPS, ["UPDATE"]),
    _rule("scheduling.volcano.sh", "v1beta1", ["queues"], ["CREATE", "UPDATE"]),
    _rule("batch.volcano.sh", "v1alpha1", ["jobs"], ["CREATE", "UPDATE"]),
]


SYSTEM_NAMESPACES = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "kube-node-lease"],
        }
    ]
}


def configurations(
    url: str, ca: Path, selector: dict[str, str] | None, prefix: str = "cardquota"
) -> list[dict[str, Any]]:
    """A validating and a mutating configuration pointing at ``url`` (``/validate``, ``/mutate``),
    for namespaces labelled ``selector``, or every namespace but the system ones."""
    bundle = base64.b64encode(ca.read_bytes()).decode()
    common = {
        "namespaceSelector": {"matchLabels": selector} if selector else SYSTEM_NAMESPACES,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
        "matchPolicy": "Equivalent",
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"{prefix}-validate"},
        "webhooks": [
            {
                "name": "validate.cardquota.volcano.sh",
                "clientConfig": {"url": f"{url}/validate", "caBundle": bundle},
                "rules": VALIDATING_RULES,
                "failurePolicy": "Fail",
                **common,
            }
        ],
    }
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": f"{prefix}-mutate"},
        "webhooks": [
            {
                "name": "pods.mutate.cardquota.volcano.sh",
                "clientConfig": {"url": f"{url}/mutate", "caBundle": bundle},
                "rules": [_rule("", "v1", ["pods"], ["CREATE"])],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                **common,
            },
            {
                "name": "podgroups.mutate.cardquota.volcano.sh",
                "clientConfig": {"url": f"{url}/mutate", "caBundle": bundle},
                "rules": [_rule("scheduling.volcano.sh", "v1beta1", ["podgroups"], ["CREATE"])],
                "failurePolicy": "Ignore",
                **common,
            },
        ],
    }
    return [validating, mutating]

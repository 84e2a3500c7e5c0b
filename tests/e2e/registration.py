"""Register a webhook served outside the cluster (by URL) for exactly the rules SPEC §6 needs."""

import base64
from pathlib import Path
from typing import Any

from webhook.core.model import keys

APPS = ["deployments", "statefulsets", "replicasets"]
WEBHOOK_USER = "cardquota-admin"  # the user of the control plane's kubeconfig, the webhook's too


def _rule(group: str, version: str, resources: list[str], operations: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "apiVersions": [version], "resources": resources, "operations": operations}


VALIDATING_RULES = [
    _rule("", "v1", ["pods"], ["CREATE"]),
    _rule("apps", "v1", [f"{r}/scale" for r in APPS], ["UPDATE"]),
    _rule("apps", "v1", APPS, ["CREATE", "UPDATE"]),
    _rule("scheduling.volcano.sh", "v1beta1", ["queues"], ["CREATE", "UPDATE"]),
    _rule("batch.volcano.sh", "v1alpha1", ["jobs"], ["CREATE", "UPDATE"]),
    _rule("", "v1", ["pods/resize"], ["UPDATE"]),
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


HAS_GATE = "has({0}.spec.schedulingGates) && {0}.spec.schedulingGates.exists(g, g.name == '{1}')"
GATE_REMOVED = f"({HAS_GATE.format('oldObject', keys.GATE)}) && !({HAS_GATE.format('object', keys.GATE)})"
_VALUE = "(has({0}.metadata.annotations) && '{1}' in {0}.metadata.annotations ? {0}.metadata.annotations['{1}'] : '')"
# An edit of what a pod's charge is read from: its card or queue annotations, or its PodGroup's name
# once it has one (SPEC §4b)
CHARGE_EDITED = " || ".join(
    [f"{_VALUE.format('object', k)} != {_VALUE.format('oldObject', k)}" for k in keys.CHARGED]
    + [
        f"({_VALUE.format('oldObject', keys.GROUP_NAME)} != ''"
        f" && {_VALUE.format('object', keys.GROUP_NAME)} != {_VALUE.format('oldObject', keys.GROUP_NAME)})"
    ]
)
IN = "has({0}.status) && has({0}.status.phase) && {0}.status.phase in ['Inqueue', 'Running']"
ENQUEUED = f"({IN.format('object')}) && !({IN.format('oldObject')})"
CARD_PODGROUP = (
    "has(object.metadata.annotations) && ('volcano.sh/card.request' in object.metadata.annotations"
    " || 'volcano.sh/card.name' in object.metadata.annotations)"
)

# DRA: a ResourceClaim made for a pod (its controlling owner), checked and pinned at its create.
POD_CLAIM = (
    "has(object.metadata.ownerReferences)"
    " && object.metadata.ownerReferences.exists(r, r.kind == 'Pod' && has(r.controller) && r.controller)"
)

# An edit of what an enqueued PodGroup's reservation is read from (SPEC §4b)
REQUEST_EDITED = "({}) && ({})".format(
    IN.format("oldObject"),
    " || ".join(
        [
            "(has(object.spec.queue) ? object.spec.queue : '')"
            " != (has(oldObject.spec.queue) ? oldObject.spec.queue : '')"
        ]
        + [
            f"{_VALUE.format('object', k)} != {_VALUE.format('oldObject', k)}"
            for k in (keys.CARD_REQUEST, keys.CARD_NAME)
        ]
    ),
)

# DRA: a new allocation that gives devices of a GPU driver (the allocation checked, SPEC §4b)
_ALLOCATED = (
    "has({0}.status) && has({0}.status.allocation) && has({0}.status.allocation.devices)"
    " && has({0}.status.allocation.devices.results)"
)
GPU_ALLOCATION = (
    f"({_ALLOCATED.format('object')}) && object.status.allocation.devices.results.exists(r, r.driver in"
    ' ["gpu.nvidia.com","hami-core-gpu.project-hami.io"]) && (!('
    f"{_ALLOCATED.format('oldObject')}) || oldObject.status.allocation != object.status.allocation)"
)

# The PodGroup mutation: every create, and the update enqueueing a PodGroup its create left bare.
BARE_ENQUEUE = f"request.operation == 'CREATE' || (({ENQUEUED}) && !({CARD_PODGROUP}))"


def configurations(
    url: str,
    ca: Path,
    selector: dict[str, str] | None,
    prefix: str = "cardquota",
    identity: str = WEBHOOK_USER,
) -> list[dict[str, Any]]:
    """A validating and a mutating configuration pointing at ``url`` (``/validate``, ``/mutate``),
    for namespaces labelled ``selector``, or every namespace but the system ones. ``identity``: the
    user the webhook writes as, whose removal of its own scheduling gate is never sent."""
    bundle = base64.b64encode(ca.read_bytes()).decode()

    def hook(name: str, path: str, rules: list[dict[str, Any]], failure: str, **extra: str) -> dict[str, Any]:
        return {
            "name": f"{name}.cardquota.volcano.sh",
            "clientConfig": {"url": f"{url}{path}", "caBundle": bundle},
            "rules": rules,
            "failurePolicy": failure,
            "namespaceSelector": {"matchLabels": selector} if selector else SYSTEM_NAMESPACES,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "matchPolicy": "Equivalent",
            **extra,
        }

    def configuration(kind: str, name: str, hooks: list[dict[str, Any]]) -> dict[str, Any]:
        meta = {"name": f"{prefix}-{name}"}
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": meta,
            "webhooks": hooks,
        }

    pods = [_rule("", "v1", ["pods"], ["CREATE"])]
    gates = hook("gates.validate", "/validate", [_rule("", "v1", ["pods"], ["UPDATE"])], "Fail")
    gates["matchConditions"] = [
        {"name": "our-gate-removed-or-charge-edited", "expression": f"({GATE_REMOVED}) || {CHARGE_EDITED}"},
        {"name": "not-by-the-webhook", "expression": f"request.userInfo.username != '{identity}'"},
    ]
    podgroups = hook(
        "podgroups.mutate",
        "/mutate",
        [_rule("scheduling.volcano.sh", "v1beta1", ["podgroups"], ["CREATE", "UPDATE"])],
        "Ignore",
    )
    podgroups["matchConditions"] = [{"name": "creates-and-bare-enqueues", "expression": BARE_ENQUEUE}]
    enqueue = hook(
        "enqueue.validate",
        "/validate",
        [_rule("scheduling.volcano.sh", "v1beta1", ["podgroups"], ["UPDATE"])],
        "Fail",
    )
    enqueue["matchConditions"] = [
        {"name": "enqueued-or-request-edited", "expression": f"({ENQUEUED}) || ({REQUEST_EDITED})"},
        {"name": "card-podgroups-only", "expression": CARD_PODGROUP},
    ]
    claim_rules = [_rule("resource.k8s.io", "v1", ["resourceclaims"], ["CREATE"])]
    claims = hook("claims.validate", "/validate", claim_rules, "Fail")
    status_rules = [_rule("resource.k8s.io", "v1", ["resourceclaims/status"], ["UPDATE"])]
    allocations = hook("allocations.validate", "/validate", status_rules, "Fail")
    allocations["matchConditions"] = [{"name": "new-gpu-allocations-only", "expression": GPU_ALLOCATION}]
    pins = hook("claims.mutate", "/mutate", claim_rules, "Fail", reinvocationPolicy="IfNeeded")
    for claim_hook in (claims, pins):
        claim_hook["matchConditions"] = [{"name": "pods-claims-only", "expression": POD_CLAIM}]
    return [
        configuration(
            "ValidatingWebhookConfiguration",
            "validate",
            [hook("validate", "/validate", VALIDATING_RULES, "Fail"), gates, enqueue, claims, allocations],
        ),
        configuration(
            "MutatingWebhookConfiguration",
            "mutate",
            [
                hook("pods.mutate", "/mutate", pods, "Fail", reinvocationPolicy="IfNeeded"),
                podgroups,
                pins,
            ],
        ),
    ]

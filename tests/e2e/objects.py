"""Objects the end-to-end tests and the capture script create."""

import json
from typing import Any

SELECTOR = {"cardquota-e2e": "true"}  # namespaces the test webhooks apply to
R4090 = "NVIDIA-GeForce-RTX-4090"


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": SELECTOR}}


def deployment_of(name: str, replicas: int, template: dict[str, Any]) -> dict[str, Any]:
    """A Deployment of ``replicas`` pods like ``template`` (a pod's ``spec`` and optionally its
    ``metadata`` annotations), selected by the label ``app: name``."""
    labels = {"app": name}
    metadata = {"labels": labels, "annotations": template.get("metadata", {}).get("annotations", {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": metadata, "spec": template["spec"]},
        },
    }


def gpu_deployment(name: str, replicas: int, product: str = R4090, gpus: int = 1) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "registry.example/app:1",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "100m"}},
    }
    return deployment_of(
        name,
        replicas,
        {
            "metadata": {"annotations": {"volcano.sh/card.name": product}},
            "spec": {"nodeSelector": {"nvidia.com/gpu.product": product}, "containers": [container]},
        },
    )


def hpa(deployment: str, min_replicas: int, max_replicas: int) -> dict[str, Any]:
    """An HPA on CPU: with no metrics server it still scales a Deployment below ``min_replicas`` up to
    it (the controller checks the replica bounds before it asks for metrics)."""
    target = {"type": "Utilization", "averageUtilization": 50}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": deployment},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": target}}],
        },
    }


H200 = "NVIDIA-H200"


def card_queue(name: str, quota: dict[str, int] | str) -> dict[str, Any]:
    """A Volcano Queue with a ``volcano.sh/card.quota`` (a dict, or the annotation's raw text)."""
    text = quota if isinstance(quota, str) else json.dumps(quota)
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name, "annotations": {"volcano.sh/card.quota": text}},
        "spec": {"weight": 1},
    }


def queued_deployment(name: str, replicas: int, queue: str, product: str = H200) -> dict[str, Any]:
    """``gpu_deployment`` whose pods name their Volcano queue."""
    deployment = gpu_deployment(name, replicas, product=product)
    deployment["spec"]["template"]["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] = queue
    return deployment


def editor_rights(user: str) -> list[dict[str, Any]]:
    """A Role and RoleBinding letting ``user`` edit pods and PodGroups of a namespace (a tenant's
    own rights)."""
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-editor"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "update", "patch"]},
                {
                    "apiGroups": ["scheduling.volcano.sh"],
                    "resources": ["podgroups"],
                    "verbs": ["get", "list", "update", "patch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pod-editor"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-editor"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    ]

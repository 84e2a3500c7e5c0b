"""Small builders of raw Kubernetes objects and AdmissionRequests for tests."""

from typing import Any

from webhook.cluster.snapshot import build_state
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.objects import mark_text
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Request

H200, H800 = "NVIDIA-H200", "NVIDIA-H800"
R4090, R4090D = "NVIDIA-GeForce-RTX-4090", "NVIDIA-GeForce-RTX-4090-D"
GPU = "nvidia.com/gpu"


def node(name: str, product: str, gpus: int = 8, memory: int = 81920, **allocatable: Any) -> dict[str, Any]:
    labels = {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(memory),
    }
    alloc = {"cpu": "64", GPU: str(gpus)} if not allocatable else {"cpu": "64", **allocatable}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": alloc},
    }


def queue(name: str, quota: str | None = None, state: str = "Open", **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if quota is not None:
        meta["annotations"] = {"volcano.sh/card.quota": quota}
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": meta,
        "spec": {"weight": 1, **extra},
        "status": {"state": state},
    }


def pod(
    name: str,
    card: str | None = H200,
    count: int | str | None = 1,
    *,
    queue_name: str | None = "q",
    namespace: str = "ns",
    node_name: str = "",
    phase: str | None = "Pending",
    resource: str = GPU,
    owner: dict[str, Any] | None = None,
    group: str = "",
    spec: dict[str, Any] | None = None,
    uid: str | None = None,
    annotations: dict[str, str] | None = None,
    gated: float | None = None,
    priority: int = 0,
) -> dict[str, Any]:
    """A pod; ``gated``: held under our scheduling gate since then (seconds), with ``priority``."""
    annotations = dict(annotations or {})
    if gated is not None:
        annotations[keys.WAITING] = mark_text(gated, priority)
        spec = {**(spec or {}), "schedulingGates": [{"name": keys.GATE}], "priority": priority}
    if card is not None:
        annotations["volcano.sh/card.name"] = card
    if queue_name:
        annotations["scheduling.volcano.sh/queue-name"] = queue_name
    if group:
        annotations["scheduling.k8s.io/group-name"] = group
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}"}
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [owner]
    container: dict[str, Any] = {"name": "c", "image": "i"}
    if count is not None:
        container["resources"] = {"limits": {resource: str(count)}}
    body: dict[str, Any] = {"containers": [container], **(spec or {})}
    if node_name:
        body["nodeName"] = node_name
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}
    if phase:
        out["status"] = {"phase": phase}
    return out


def owner(kind: str, name: str, uid: str, api: str = "apps/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def template(card: str | None, count: int = 1, queue_name: str = "q", resource: str = GPU) -> dict[str, Any]:
    annotations = {"scheduling.volcano.sh/queue-name": queue_name}
    if card is not None:
        annotations["volcano.sh/card.name"] = card
    return {
        "metadata": {"annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {resource: str(count)}}}]},
    }


def deployment(
    name: str, replicas: int, card: str | None = H200, count: int = 1, **kw: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-dep-{name}"},
        "spec": {"replicas": replicas, "template": template(card, count, **kw)},
    }


def batch_job(
    name: str,
    parallelism: int | None = 1,
    card: str | None = H200,
    *,
    completions: int | None = None,
    succeeded: int = 0,
    suspend: bool = False,
    finished: str = "",
    **kw: Any,
) -> dict[str, Any]:
    """A batch/v1 Job; ``finished``: a condition type set True (e.g. "Complete")."""
    status: dict[str, Any] = {"succeeded": succeeded}
    if finished:
        status["conditions"] = [{"type": finished, "status": "True"}]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-batch-{name}"},
        "spec": {
            "parallelism": parallelism,
            "completions": completions,
            "suspend": suspend,
            "template": template(card, **kw),
        },
        "status": status,
    }


def replicaset(
    name: str, replicas: int, deployment_name: str, card: str | None = H200, **kw: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-rs-{name}",
            "ownerReferences": [owner("Deployment", deployment_name, f"uid-dep-{deployment_name}")],
        },
        "spec": {"replicas": replicas, "template": template(card, **kw)},
    }


def statefulset(name: str, replicas: int, card: str | None = H200, **kw: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-sts-{name}"},
        "spec": {"replicas": replicas, "template": template(card, **kw)},
    }


def podgroup(
    name: str,
    phase: str,
    request: str | None = None,
    queue_name: str = "q",
    owner_ref: Any = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-pg-{name}"}
    if request is not None:
        meta["annotations"] = {"volcano.sh/card.request": request}
    if owner_ref:
        meta["ownerReferences"] = [owner_ref]
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": meta,
        "spec": {"queue": queue_name, **spec},
        "status": {"phase": phase},
    }


def vcjob(
    name: str, tasks: list[tuple[int, dict[str, Any]]], request: str | None = None, **spec: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-job-{name}"}
    if request is not None:
        meta["annotations"] = {"volcano.sh/card.request": request}
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "queue": "q",
            **spec,
            "tasks": [{"name": f"t{i}", "replicas": n, "template": t} for i, (n, t) in enumerate(tasks)],
        },
    }


def cluster(*objects: dict[str, Any], policy: Policy | None = None) -> ClusterState:
    return build_state(((f"object {i}", o) for i, o in enumerate(objects)), policy)


def request(
    obj: dict[str, Any] | None,
    *,
    resource: str = "pods",
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    sub: str = "",
    group: str = "",
    dry_run: bool = False,
) -> Request:
    meta = (obj or old or {}).get("metadata", {})
    return Request(
        uid="uid-review",
        kind=(obj or old or {}).get("kind", ""),
        group=group,
        resource=resource,
        sub_resource=sub,
        operation=operation,
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        obj=obj or {},
        old_obj=old or {},
        dry_run=dry_run,
    )


def scale_request(
    name: str, old: int, new: int, resource: str = "deployments", dry_run: bool = False
) -> Request:
    def scale(replicas: int) -> dict[str, Any]:
        return {
            "kind": "Scale",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"replicas": replicas} if replicas else {},  # omitempty: the API server leaves 0 out
        }

    return request(
        scale(new),
        resource=resource,
        operation="UPDATE",
        old=scale(old),
        sub="scale",
        group="apps",
        dry_run=dry_run,
    )


def ascend_node(name: str = "ascend-0", npus: int = 8) -> dict[str, Any]:
    labels = {
        "huawei.com/npu.product": "Ascend-910B",
        "huawei.com/npu.count": str(npus),
        "huawei.com/npu.memory": "65536",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"huawei.com/Ascend910": str(npus)}},
    }


def expression(operator: str, *values: str, key: str = "nvidia.com/gpu.product") -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def required_affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod spec fragment: required node affinity with one term per list of expressions."""
    selector = {"nodeSelectorTerms": [{"matchExpressions": list(term)} for term in terms]}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}}


def shared(limits: dict[str, Any]) -> dict[str, Any]:
    """A pod spec whose one container asks ``limits``: a shared GPU's resources (pass as ``spec``)."""
    resources = {"limits": {name: str(value) for name, value in limits.items()}}
    return {"containers": [{"name": "c", "image": "i", "resources": resources}]}


# ---- Dynamic Resource Allocation (resource.k8s.io/v1) ------------------------------------------
NVIDIA_DRA = "gpu.nvidia.com"
GPU_CLASS_CEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
MIG_CLASS_CEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"


def resource_slice(
    node_name: str,
    product: str,
    gpus: int,
    *,
    driver: str = NVIDIA_DRA,
    mig_profile: str = "",
    memory: str = "80Gi",
    name: str = "",
    extra: dict[str, Any] | None = None,
    start: int = 0,
) -> dict[str, Any]:
    """A slice of ``gpus`` devices of NVML name ``product`` (spaces) on ``node_name``, as NVIDIA's
    driver publishes them (MIG devices when ``mig_profile``), numbered from ``start``."""
    kind = "mig" if mig_profile else ("hami-gpu" if driver.startswith("hami") else "gpu")
    devices = []
    for i in range(start, start + gpus):
        attributes: dict[str, Any] = {
            "type": {"string": kind},
            "productName": {"string": product},
            "uuid": {"string": f"GPU-{node_name}-{i}"},
        }
        if mig_profile:
            attributes["profile"] = {"string": mig_profile}
        capacity = {"memory": {"value": memory}}
        shared: dict[str, Any] = {}
        if driver.startswith("hami"):  # consumable capacity: a device several claims take shares of
            capacity["cores"] = {"value": "100"}
            shared = {"allowMultipleAllocations": True}
        label = f"gpu-{i}-mig-{mig_profile.replace('.', '')}-{i}" if mig_profile else f"gpu-{i}"
        devices.append(
            {"name": label, "attributes": attributes, "capacity": capacity, **shared, **(extra or {})}
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node_name}-{driver}"},
        "spec": {
            "driver": driver,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node_name,
            "devices": devices,
        },
    }


def device_class(
    name: str, expression: str | None = GPU_CLASS_CEL, card: str | None = None, extended: str = ""
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if card is not None:
        meta["annotations"] = {"cardquota.volcano.sh/card": card}
    spec: dict[str, Any] = {}
    if expression is not None:
        spec["selectors"] = [{"cel": {"expression": expression}}]
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": meta, "spec": spec}


def gpu_request(
    name: str = "gpu",
    device_class_name: str = NVIDIA_DRA,
    count: int | None = 1,
    *,
    selectors: tuple[str, ...] = (),
    mode: str | None = None,
    admin: bool = False,
    capacity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class_name}
    if count is not None:
        exactly["count"] = count
    if mode:
        exactly["allocationMode"] = mode
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if admin:
        exactly["adminAccess"] = True
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": exactly}


def first_available(name: str, *subrequests: dict[str, Any]) -> dict[str, Any]:
    """A request whose alternatives are ``subrequests`` (``gpu_request`` values: their ``exactly``)."""
    return {"name": name, "firstAvailable": [{"name": s["name"], **s["exactly"]} for s in subrequests]}


def claim_template(name: str, *requests: dict[str, Any], namespace: str = "ns") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": list(requests)}}},
    }


def resource_claim(
    name: str,
    *requests: dict[str, Any],
    namespace: str = "ns",
    pod_owner: dict[str, Any] | None = None,
    pod_claim: str = "",
    allocated: tuple[tuple[str, str, str], ...] = (),
) -> dict[str, Any]:
    """A claim; ``pod_owner``: the pod it was made for (``{"name", "uid"}``) with ``pod_claim``, the
    pod's name for it; ``allocated``: (request, pool, device) of driver gpu.nvidia.com."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-claim-{name}"}
    if pod_owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "controller": True, **pod_owner}]
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": pod_claim}
    out: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": list(requests)}},
    }
    if allocated:
        results = [{"request": r, "driver": NVIDIA_DRA, "pool": p, "device": d} for r, p, d in allocated]
        out["status"] = {"allocation": {"devices": {"results": results}}}
    return out


def claiming(
    obj: dict[str, Any], *, templates: tuple[str, ...] = (), claims: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``obj`` (a pod, or a pod template) taking its GPUs through these claim templates and claims
    (its entries named ``t0``.., ``c0``..)."""
    spec = obj.setdefault("spec", {})
    refs = [{"name": f"t{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    refs += [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    spec["resourceClaims"] = refs
    for container in spec.get("containers") or []:
        container.setdefault("resources", {})["claims"] = [{"name": r["name"]} for r in refs]
    return obj

"""Raw cluster objects into the state: one way in for snapshots and the live cache alike.

``upsert`` and ``remove`` take the JSON of any kind the decisions use; an object whose fields have
the wrong types (Volcano's CRDs accept much) is skipped with a one-line reason kept in
``state.skipped``, so that nothing the cluster holds can stop a loader or an informer.
"""

from collections.abc import Container, Mapping
from typing import Any

from webhook.core.index.state import ClusterState
from webhook.core.model import devices, nodes, objects, placement, shapes

WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "ReplicaSet"})
RESOURCES = {
    "Node": "nodes",
    "Queue": "queues",
    "Workload": "deployments",
    "PodGroup": "podgroups",
    "Pod": "pods",
    "Namespace": "namespaces",
}
# DRA's kinds (SPEC §4b): read by tolerant readers (``devices``), each odd field a reason, no shape check.
DRA_KINDS = frozenset({"DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate"})
# Applied in this order when many arrive at once, so each finds what it refers to already there.
ORDER = (
    "Node",
    "DeviceClass",
    "ResourceSlice",
    "ResourceClaimTemplate",
    "ResourceClaim",
    "Queue",
    "Namespace",
    "Workload",
    "PodGroup",
    "Pod",
)


def bucket(obj: Mapping[str, Any]) -> str | None:
    """Which part of the state an object feeds, or None when the decisions do not use its kind."""
    kind, api = str(obj.get("kind", "")), str(obj.get("apiVersion", ""))
    if kind in WORKLOAD_KINDS or (kind == "Job" and api.startswith(("batch.volcano.sh", "batch/"))):
        return "Workload"
    if kind in ("PodGroup", "Queue") and api.startswith("scheduling.volcano.sh"):
        return kind
    if kind in DRA_KINDS and api.startswith(devices.API_GROUP + "/"):
        return kind
    if kind == "Namespace" and api == "v1":
        return kind
    return kind if kind in ("Node", "Pod") else None


def key(obj: Mapping[str, Any]) -> str:
    """``kind/namespace/name``: how ``state.skipped`` names an object."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{obj.get('kind', '')}/{meta.get('namespace') or ''}/{meta.get('name') or ''}".replace("//", "/")


def upsert(state: ClusterState, obj: Mapping[str, Any]) -> str:
    """Add or replace ``obj``; returns why it was skipped, or "" when it was applied."""
    state.inventory.devices.turn()
    where = bucket(obj)
    if where is None:
        return f"{obj.get('kind', '?')} is not used"
    if where in DRA_KINDS:
        return _apply_dra(state, where, obj)
    problem = shapes.problem(_resource(where, obj), "", obj)
    if problem:
        state.skip(key(obj), problem)
        return problem
    state.skip(key(obj), "")
    _apply(state, where, obj)
    return ""


def remove(state: ClusterState, obj: Mapping[str, Any]) -> None:
    """Forget ``obj`` (only its identity is read: a DELETED event may carry an old body)."""
    state.inventory.devices.turn()
    where = bucket(obj)
    state.skip(key(obj), "")
    if where is None or shapes.problem(RESOURCES.get(where, "nodes"), "", {"metadata": obj.get("metadata")}):
        return
    meta = obj.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "default")
    if where == "DeviceClass":
        state.delete_device_class(name)
    elif where == "ResourceSlice":
        state.delete_slice(name)
    elif where == "ResourceClaim":
        state.delete_claim(f"{namespace}/{name}")
    elif where == "ResourceClaimTemplate":
        state.delete_claim_template(f"{namespace}/{name}")
    elif where == "Node":
        state.delete_node(name)
    elif where == "Queue":
        state.delete_queue(name)
    elif where == "Namespace":
        state.delete_namespace(name)
    elif where == "Workload":
        kind = objects.record_kind(str(obj.get("kind")), str(obj.get("apiVersion", "")))
        state.delete_workload(kind, f"{namespace}/{name}")
    elif where == "PodGroup":
        state.delete_podgroup(f"{namespace}/{name}")
    else:
        state.delete_pod(str(meta.get("uid") or f"{meta.get('namespace', '')}/{name}"))


def _apply_dra(state: ClusterState, where: str, obj: Mapping[str, Any]) -> str:
    """A DRA object into the state; what of it is left out is kept in ``state.skipped``."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta.get("name"):
        problem = "metadata.name is missing or not a string"
        state.skip(key(obj), problem)
        return problem
    drivers = state.policy.dra_drivers
    problem = ""
    if where == "DeviceClass":
        found = devices.class_record(obj, drivers)
        problem = found.problem
        state.upsert_device_class(found)
    elif where == "ResourceSlice":
        record = devices.slice_record(obj, drivers)
        if record is None:
            state.delete_slice(str(meta["name"]))
        else:
            problem = "; ".join(record.skipped)
            state.upsert_slice(record)
    elif where == "ResourceClaim":
        claim = devices.claim_record(obj, drivers)
        problem = claim.problem
        state.upsert_claim(claim)
    else:
        template = devices.template_record(obj, drivers)
        problem = template.problem
        state.upsert_claim_template(template)
    state.skip(key(obj), problem)
    return problem


def _resource(where: str, obj: Mapping[str, Any]) -> str:
    """The shape ``obj`` is checked against: a batch/v1 Job's own, else its part's."""
    kind = objects.record_kind(str(obj.get("kind", "")), str(obj.get("apiVersion", "")))
    return "jobs.batch" if kind == objects.BATCH_JOB else RESOURCES[where]


def _apply(state: ClusterState, where: str, obj: Mapping[str, Any]) -> None:
    if where == "Node":
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        state.upsert_node(
            nodes.discover_node_cards(
                str(meta.get("name", "")), meta.get("labels") or {}, status.get("allocatable") or {}
            ),
            placement.node_facts(obj),
        )
    elif where == "Queue":
        state.upsert_queue(objects.queue_record(obj))
    elif where == "Namespace":
        state.upsert_namespace(*objects.namespace_queue(obj), objects.namespace_labels(obj))
    elif where == "Workload":
        state.upsert_workload(objects.workload_record(obj))
    elif where == "PodGroup":
        state.upsert_podgroup(objects.podgroup_record(obj))
    else:
        state.upsert_pod(objects.pod_record(obj))


CLUSTER_SCOPED = frozenset({"Node", "Queue", "Namespace", "DeviceClass", "ResourceSlice"})


def identity(obj: Mapping[str, Any], kind: str) -> str:
    """How a relist of ``kind`` names an object, as the state holds it: a pod by uid (the state's
    key), anything else by namespace/name, a namespaced object that names no namespace in
    ``default`` (where it is applied: else the relist that applied it would remove it as gone)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    if kind == "Pod" and meta.get("uid"):
        return str(meta["uid"])
    namespace = meta.get("namespace") or ("" if kind in CLUSTER_SCOPED or kind == "Pod" else "default")
    return f"{namespace}/{meta.get('name') or ''}"


def identities(
    state: ClusterState, kind: str, api_version: str, exclude: Container[str] = ()
) -> dict[str, dict[str, Any]]:
    """Every object of ``kind`` the state holds, by identity, as the little ``remove`` needs; but
    those in ``exclude``."""

    def stub(namespace: str, name: str, uid: str = "") -> dict[str, Any]:
        meta = {"namespace": namespace or None, "name": name, "uid": uid or None}
        return {"kind": kind, "apiVersion": api_version, "metadata": meta}

    if kind == "Pod":
        return {uid: stub(p.namespace, p.name, uid) for uid, p in state.pods.items() if uid not in exclude}
    if kind == "Node":
        return {f"/{name}": stub("", name) for name in state.nodes if f"/{name}" not in exclude}
    if kind == "Queue":
        return {f"/{name}": stub("", name) for name in state.tree.queues if f"/{name}" not in exclude}
    if kind == "Namespace":  # those the state keeps: the ones carrying a default queue
        return {f"/{name}": stub("", name) for name in state.namespace_queues if f"/{name}" not in exclude}
    if kind == "PodGroup":
        return {key: stub(*key.split("/", 1)) for key in state.podgroups if key not in exclude}
    if kind in DRA_KINDS:
        found = state.inventory.devices
        names: list[str] = {
            "DeviceClass": [f"/{n}" for n in found.classes],
            "ResourceSlice": [f"/{n}" for n in found.slices],
            "ResourceClaim": list(found.claims),
            "ResourceClaimTemplate": list(found.templates),
        }[kind]
        return {key: stub(*key.split("/", 1)) for key in names if key not in exclude}
    held_as = objects.record_kind(kind, api_version)
    kept = (key for (held, key) in state.workloads.by_key if held == held_as and key not in exclude)
    return {key: stub(*key.split("/", 1)) for key in kept}

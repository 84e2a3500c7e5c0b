"""What a queue and a pod say about tidal reclaim (SPEC §5e, decisions.md §26, §33): the queue's
reclaim mode, priority, whether its training gives cards back, its minimum run time and notice, and
a pod's service type. Read from the state only; ``tidal`` plans with them, the serving replica's
reclaimer and the enqueue gate read them too."""

from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.reclaim import parse_duration

MODES = ("on", "dry-run", "off")


def mode_of(state: ClusterState, queue: str) -> str:
    """The queue's reclaim mode: its annotation, else the cluster's setting; "off" while its quota
    only warns or audits (decisions.md §34: a queue not enforced takes nothing from others)."""
    if state.enforcement(queue) != "deny":
        return "off"
    info = state.tree.queues.get(queue)
    said = info.record.annotations.get(keys.RECLAIM, "") if info is not None else ""
    return said if said in MODES else state.policy.reclaim


def priority_of(state: ClusterState, queue: str) -> int:
    info = state.tree.queues.get(queue)
    return info.record.priority if info is not None else 0


def reclaimable(state: ClusterState, queue: str) -> bool:
    """Whether the queue's training may give cards back: our annotation, else spec.reclaimable."""
    info = state.tree.queues.get(queue)
    if info is None:
        return True
    said = info.record.annotations.get(keys.RECLAIMABLE, "").lower()
    return info.record.reclaimable if said not in ("true", "false") else said == "true"


def service_of(state: ClusterState, uid: str, said_counts: bool = True) -> str:
    """A pod's service type: its PodGroup's volcano.sh/service.type, else its PodGroup's owner kind
    (the pod's own for a pod with no PodGroup) by the service-type table. ``said_counts`` False:
    by the owner kind alone (the annotation is the tenant's to write)."""
    pod = state.pods[uid]
    group = state.podgroups.get(f"{pod.namespace}/{pod.group_name}") if pod.group_name else None
    if group is not None:
        said = group.annotations.get(keys.SERVICE_TYPE)
        if said and said_counts:
            return said
        owner = group.owner
    else:
        owner = pod.owner
    if owner is None:
        return ""
    kind = "ReplicaSet" if owner.kind == "Deployment" else owner.kind
    return state.policy.service_type_by_kind.get(kind, "")


def min_runtime(state: ClusterState, queue: str) -> float:
    """``queue``'s minimum run time before cards its gangs borrow are taken back (seconds; 0: none,
    or unreadable: its write was refused)."""
    return _duration(state, queue, keys.RECLAIM_MIN_RUNTIME)


def notice(state: ClusterState, queue: str) -> float:
    """How long before their eviction ``queue``'s gangs are told (seconds; 0: none, or unreadable),
    at most ``MAX_NOTICE``."""
    return min(_duration(state, queue, keys.RECLAIM_NOTICE), MAX_NOTICE)


MAX_NOTICE = 600.0  # seconds: a longer notice keeps the lender waiting past what a hold lasts


def _duration(state: ClusterState, queue: str, key: str) -> float:
    info = state.tree.queues.get(queue)
    text = info.record.annotations.get(key) if info is not None else None
    return (parse_duration(text) or 0.0) if text else 0.0

"""Slim records of cluster objects: only what the decisions read, built from raw API dicts.

The snapshot loader and the live cache both build these with the same functions, so the
offline answer and the live one agree.
"""

import json
import math
from collections.abc import Mapping
from dataclasses import field
from datetime import UTC, datetime
from typing import Any

from webhook.core.model import keys
from webhook.core.model.cards import figure
from webhook.core.model.devices import ClaimRef, claim_refs
from webhook.core.model.reclaim import Taken
from webhook.core.model.resources import Resources, resources_of
from webhook.core.model.values import value_class

Raw = Mapping[str, Any]
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
BATCH_JOB = "Job.batch"  # a batch/v1 Job's record kind ("Job" is a Volcano Job's), as kubectl names it
FINISHED = frozenset({"Complete", "Failed", "SuccessCriteriaMet", "FailureTarget"})  # a batch Job's end


@value_class(weakref_slot=True)
class OwnerRef:
    kind: str
    name: str
    uid: str
    api_version: str = ""


@value_class(weakref_slot=True)
class PodTemplate:
    """What demand and affinity need from a pod or a pod template."""

    annotations: Mapping[str, str]
    resources: Resources
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[Raw, ...] | None = None
    scheduler: str = ""  # spec.schedulerName
    # spec.resourceClaims (SPEC §4b) and, when there are any, the namespace they are read in
    claims: tuple[ClaimRef, ...] = ()
    namespace: str = ""
    # spec.priority, from the PriorityClass: here, not on each pod, as a workload's pods share it
    priority: int = 0


@value_class
class PodRecord:
    uid: str
    namespace: str
    name: str
    template: PodTemplate
    node_name: str = ""
    phase: str = "Pending"
    deletion_deadline: float | None = None
    owner: OwnerRef | None = None
    # Held under our scheduling gate (wait mode): its place ``(since, priority)`` from its waiting
    # mark (behind everyone when the mark is unreadable); None for a pod that is not ours to release.
    waiting: tuple[float, int] | None = None
    generated: bool = False  # no name yet, only ``generateName``: a create being mutated
    started: float = 0.0  # status.startTime, seconds since the epoch (0: not started, or unreadable)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def own_name(self) -> str:
        """Its name, empty while only its ``generateName`` is known."""
        return "" if self.generated else self.name

    @property
    def priority(self) -> int:
        """spec.priority, from its PriorityClass (kept in its shared template)."""
        return self.template.priority

    @property
    def group_name(self) -> str:
        return self.template.annotations.get(keys.GROUP_NAME, "")

    @property
    def is_live(self) -> bool:
        """Counted by its controller: not finished and not being deleted."""
        return self.phase not in TERMINAL_PHASES and self.deletion_deadline is None

    def is_terminal(self, now: float) -> bool:
        if self.phase in TERMINAL_PHASES:
            return True
        return self.deletion_deadline is not None and now > self.deletion_deadline


@value_class
class Task:
    name: str
    replicas: int
    template: PodTemplate


@value_class
class WorkloadRecord:
    """A Deployment, StatefulSet, ReplicaSet or Volcano Job."""

    kind: str
    namespace: str
    name: str
    uid: str
    replicas: int
    annotations: Mapping[str, str]
    tasks: tuple[Task, ...]
    owner: OwnerRef | None = None
    queue: str = ""
    min_available: int = 0
    waiting: tuple[float, int] | None = None  # (since, priority) from our mark, in the waiting line
    # A Volcano Job that an eviction of its pods would end rather than restart: why ("" if none)
    evicted_ends: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


ENDING_ACTIONS = frozenset({"AbortJob", "TerminateJob", "CompleteJob"})  # what a job never comes back from
RESTART_ACTIONS = frozenset({"RestartJob", "RestartTask", "RestartPod"})  # each spends one of maxRetry
VOLCANO_MAX_RETRY = 3  # a Volcano Job's maxRetry when unset


def evicted_ends(spec: Raw, status: Raw) -> str:
    """Why evicting a pod of this Volcano Job would end it, as its job controller reads its
    policies (job-level, then each task's: an event ``PodEvicted`` or ``*``); "" when it would
    recreate the pod (no such policy: ``SyncJob``), or restart with retries left."""
    policies = [p for p in _items(spec.get("policies")) if isinstance(p, Mapping)]
    for task in _items(spec.get("tasks")):
        if isinstance(task, Mapping):
            policies.extend(p for p in _items(task.get("policies")) if isinstance(p, Mapping))
    for policy in policies:
        listed = policy.get("events")
        events: list[Any] = listed if isinstance(listed, list) else [policy.get("event")]
        if not any(e in ("PodEvicted", "*") for e in events):
            continue
        action = str(policy.get("action") or "")
        if action in ENDING_ACTIONS:
            return f"its Volcano Job's policy ends it when a pod is evicted (PodEvicted: {action})"
        if action in RESTART_ACTIONS:
            most = _int(spec.get("maxRetry"), VOLCANO_MAX_RETRY) or VOLCANO_MAX_RETRY
            spent = _int(status.get("retryCount"), 0) if isinstance(status, Mapping) else 0
            if spent >= most:
                return f"its Volcano Job has no retries left ({action} on PodEvicted: {spent} of {most} used)"
    return ""


@value_class
class PodGroupRecord:
    namespace: str
    name: str
    uid: str
    queue: str
    phase: str
    min_member: int
    min_resources: Mapping[str, Any]
    annotations: Mapping[str, str]
    owner: OwnerRef | None = None
    created: float = 0.0  # metadata.creationTimestamp, seconds since the epoch (0: unreadable)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@value_class
class QueueRecord:
    name: str
    state: str
    annotations: Mapping[str, str]
    parent: str = ""
    capability: Mapping[str, Any] = field(default_factory=dict)  # spec.capability as written
    priority: int = 0  # spec.priority: who may take back cards from whom (tidal reclaim)
    reclaimable: bool = True  # spec.reclaimable (unset is true, as in Volcano)


def _meta(obj: Raw) -> Raw:
    meta = obj.get("metadata") or {}
    return meta if type(meta) is dict or isinstance(meta, Mapping) else {}


# Go's strconv.ParseBool, which Volcano reads volcano.sh/preemptable with
_TRUE, _FALSE = (
    frozenset({"1", "t", "T", "TRUE", "true", "True"}),
    frozenset({"0", "f", "F", "FALSE", "false", "False"}),
)


def preemptable(value: str | None) -> bool:
    """Whether a pod marked ``value`` (its ``volcano.sh/preemptable``; None: unmarked) may be a
    victim, as Volcano's ``GetPodPreemptable`` reads it: unmarked is preemptable, a value
    ``ParseBool`` refuses is not."""
    return value is None or value in _TRUE


def with_preemptable(annotations: dict[str, str], labels: Any) -> dict[str, str]:
    """``annotations`` with ``volcano.sh/preemptable`` as Volcano reads it: the annotation, else
    the label of that name (kept under the annotation's key: the core reads one value)."""
    if (
        not labels
        or keys.PREEMPTABLE in annotations
        or (type(labels) is not dict and not isinstance(labels, Mapping))
    ):
        return annotations
    label = labels.get(keys.PREEMPTABLE)
    return annotations if label is None else {**annotations, keys.PREEMPTABLE: str(label)}


def _strings(value: Any) -> dict[str, str]:
    if not value or (type(value) is not dict and not isinstance(value, Mapping)):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


def controller_of(obj: Raw) -> OwnerRef | None:
    """The controlling owner reference (``controller: true``), else None."""
    for ref in _meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return OwnerRef(
                str(ref.get("kind") or ""),
                str(ref.get("name") or ""),
                str(ref.get("uid") or ""),
                str(ref.get("apiVersion") or ""),
            )
    return None


def pod_template_of(template: Raw, namespace: str = "") -> PodTemplate:
    """Slim view of a Pod or a PodTemplateSpec (``metadata`` + ``spec``); ``namespace``: where its
    claims are (a pod's own, else the workload's)."""
    spec, meta = template.get("spec") or {}, _meta(template)
    claims = claim_refs(spec, template.get("status")) if spec.get("resourceClaims") else ()
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = None
    if isinstance(affinity, Mapping):
        terms = tuple(t for t in affinity.get("nodeSelectorTerms") or [] if isinstance(t, Mapping))
    return PodTemplate(
        annotations=with_preemptable(_strings(meta.get("annotations")), meta.get("labels")),
        resources=resources_of(spec),
        node_selector=_strings(spec.get("nodeSelector")),
        required_terms=terms,
        scheduler=str(spec.get("schedulerName") or ""),
        claims=claims,
        namespace=(namespace or str(meta.get("namespace") or "default")) if claims else "",
        priority=priority_of(spec.get("priority")),
    )


def priority_of(value: Any) -> int:
    """spec.priority (an int32 the API server sets from the PriorityClass), else 0."""
    return max(-(2**31), min(value, 2**31)) if type(value) is int else 0


def _timestamp(value: Any) -> float | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def pod_namespace(meta: Raw, namespace: str) -> str:
    """Where a pod is: the namespace its object names, else (none, or ``default``) ``namespace``, a
    review's, else ``default``."""
    named = str(meta.get("namespace") or "default")
    return (namespace or named) if named == "default" else named


def pod_record(obj: Raw, template: PodTemplate | None = None, namespace: str = "") -> PodRecord:
    """``template``: the pod's own, read already (``reviewed_template``); ``namespace``: where it is
    when the object names none or ``default`` (a review's)."""
    meta, spec = _meta(obj), obj.get("spec") or {}
    where = pod_namespace(meta, namespace)
    return PodRecord(
        uid=str(meta.get("uid") or f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"),
        namespace=where,
        name=str(meta.get("name") or meta.get("generateName") or ""),
        template=template or pod_template_of(obj, where),
        node_name=str(spec.get("nodeName") or ""),
        phase=str((obj.get("status") or {}).get("phase") or "Pending"),
        deletion_deadline=deletion_deadline(
            meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
        ),
        owner=controller_of(obj),
        waiting=pod_waiting(spec.get("schedulingGates"), meta.get("annotations")),
        generated=not meta.get("name"),
        started=_created((obj.get("status") or {}).get("startTime")),
    )


def event_targets(group: PodGroupRecord) -> list[dict[str, str]]:
    """What an Event about a PodGroup is recorded on: the PodGroup, and its Volcano Job (what
    ``kubectl describe vcjob`` shows)."""
    targets = [
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "name": group.name,
            "uid": group.uid,
        }
    ]
    owner = group.owner
    if owner is not None and owner.kind == "Job" and owner.api_version.startswith("batch.volcano.sh"):
        targets.append({"apiVersion": owner.api_version, "kind": "Job", "name": owner.name, "uid": owner.uid})
    return targets


def reviewed_pod(obj: Raw, namespace: str, template: PodTemplate | None = None) -> PodRecord:
    """The pod of a review: its record, in the request's namespace when the object names none (a
    create by a controller sends the object without it); ``template``: read already at the entry."""
    return pod_record(obj, template, namespace=namespace)


def reviewed_template(obj: Raw, namespace: str) -> PodTemplate:
    """The template of a review's pod, its claims read where the pod is (``pod_namespace``)."""
    return pod_template_of(obj, pod_namespace(_meta(obj), namespace))


BEHIND: tuple[float, int] = (math.inf, -(2**31))  # the place of a gated pod whose mark is unreadable


def pod_waiting(gates: Any, annotations: Any) -> tuple[float, int] | None:
    """A pod's place when it carries our scheduling gate (SPEC §5c), else None."""
    if not isinstance(gates, list) or not any(
        isinstance(g, Mapping) and g.get("name") == keys.GATE for g in gates
    ):
        return None
    text = annotations.get(keys.WAITING) if isinstance(annotations, Mapping) else None
    return waiting_mark(text if isinstance(text, str) else None) or BEHIND


def deletion_deadline(timestamp: Any, grace: Any) -> float | None:
    """When a pod being deleted stops counting: its deletion time plus its grace period."""
    deletion = _timestamp(timestamp)
    return None if deletion is None else deletion + float(grace or 0)


def _items(value: Any) -> list[Any]:
    """A list as written, else nothing (an object in an odd shape is read as having none)."""
    return value if type(value) is list else []


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def record_kind(kind: str, api_version: str) -> str:
    """The kind a workload is held under: a batch/v1 Job is ``Job.batch``, any other its kind."""
    return BATCH_JOB if kind == "Job" and api_version.startswith("batch/") else kind


def batch_job_wants(spec: Raw, status: Raw) -> int:
    """How many pods a batch/v1 Job's controller wants running: none while suspended or once
    finished; else its parallelism, no more than the completions left (a Job without completions
    wants none more once one pod succeeded), as the Job controller counts them."""
    conditions = status.get("conditions") or []
    if spec.get("suspend") is True or any(
        isinstance(c, Mapping) and c.get("type") in FINISHED and c.get("status") == "True" for c in conditions
    ):
        return 0
    parallelism = max(0, _int(spec.get("parallelism"), 1))
    succeeded = max(0, _int(status.get("succeeded"), 0))
    completions = spec.get("completions")
    if completions is None:
        return 0 if succeeded else parallelism
    return max(0, min(parallelism, _int(completions, 1) - succeeded))


def workload_record(obj: Raw) -> WorkloadRecord:
    meta, spec = _meta(obj), obj.get("spec") or {}
    kind = record_kind(str(obj.get("kind", "")), str(obj.get("apiVersion", "")))
    namespace = str(meta.get("namespace") or "default")
    tasks: tuple[Task, ...]
    if kind == BATCH_JOB:
        replicas = batch_job_wants(spec, obj.get("status") or {})
        tasks = (Task("", replicas, pod_template_of(spec.get("template") or {}, namespace)),)
    elif kind == "Job":  # Volcano Job (batch.volcano.sh): tasks, each with a template
        tasks = tuple(
            Task(
                str(t.get("name", "")),
                _int(t.get("replicas"), 0),
                pod_template_of(t.get("template") or {}, namespace),
            )
            for t in spec.get("tasks") or []
        )
        replicas = sum(t.replicas for t in tasks)
    else:
        tasks = (
            Task("", _int(spec.get("replicas"), 1), pod_template_of(spec.get("template") or {}, namespace)),
        )
        replicas = _int(spec.get("replicas"), 1)
    annotations = _strings(meta.get("annotations"))
    return WorkloadRecord(
        kind=kind,
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or f"{kind}/{meta.get('namespace')}/{meta.get('name')}"),
        replicas=replicas,
        annotations=annotations,
        tasks=tasks,
        owner=controller_of(obj),
        queue=str(spec.get("queue") or ""),
        min_available=_int(spec.get("minAvailable"), 0),
        waiting=waiting_mark(annotations.get(keys.WAITING)),
        evicted_ends=evicted_ends(spec, obj.get("status") or {})
        if kind == "Job" and isinstance(spec, Mapping)
        else "",
    )


def waiting_mark(text: str | None) -> tuple[float, int] | None:
    """``(since, priority)`` from a workload's waiting mark; None when absent or unreadable (a
    mark is ours, but anyone may edit it: an odd one is ignored, never fatal)."""
    if not text:
        return None
    try:
        mark = json.loads(text)
        since = _timestamp(mark["since"])
        priority = mark.get("priority", 0)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None
    if since is None or type(priority) is not int or not math.isfinite(since):
        return None
    return since, max(-(2**31), min(priority, 2**31))


def mark_text(since: float, priority: int) -> str:
    """The waiting mark a workload carries: its first refusal, to the millisecond, and priority."""
    return json.dumps({"since": moment(since), "priority": priority}, separators=(",", ":"))


def moment(seconds: float) -> str:
    """Seconds since the epoch as RFC 3339 in UTC, to the millisecond: 2026-11-24T18:00:00.123Z."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def podgroup_record(obj: Raw) -> PodGroupRecord:
    meta, spec = _meta(obj), obj.get("spec") or {}
    return PodGroupRecord(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        queue=str(spec.get("queue") or ""),
        phase=str((obj.get("status") or {}).get("phase") or "Pending"),
        min_member=_int(spec.get("minMember"), 0),
        min_resources=dict(spec.get("minResources") or {}),
        annotations=_strings(meta.get("annotations")),
        owner=controller_of(obj),
        created=_created(meta.get("creationTimestamp")),
    )


def started(value: Any) -> float:
    """A pod's ``status.startTime`` in seconds since the epoch; 0 when absent or unreadable."""
    return _created(value)


def _created(value: Any) -> float:
    try:
        return _timestamp(value) or 0.0
    except (ValueError, TypeError, OverflowError):
        return 0.0


def queue_record(obj: Raw) -> QueueRecord:
    meta, spec = _meta(obj), obj.get("spec") or {}
    return QueueRecord(
        name=str(meta.get("name") or ""),
        state=str((obj.get("status") or {}).get("state") or "Open"),
        annotations=_strings(meta.get("annotations")),
        parent=str(spec.get("parent") or ""),
        capability=dict(spec.get("capability") or {}),
        priority=_int(spec.get("priority"), 0),
        reclaimable=spec.get("reclaimable") is not False,
    )


def namespace_queue(obj: Raw) -> tuple[str, str | None]:
    """A Namespace's name and its ``scheduling.volcano.sh/queue-name`` (None when it carries none):
    all the state keeps of it (``runqueue.namespace_default``)."""
    meta = _meta(obj)
    annotations = meta.get("annotations")
    value = annotations.get(keys.QUEUE_NAME) if isinstance(annotations, Mapping) else None
    return str(meta.get("name") or ""), None if value is None else str(value)


def namespace_labels(obj: Raw) -> dict[str, str]:
    """A Namespace's labels (those that are strings), with ``kubernetes.io/metadata.name`` always:
    the API server sets it to the name on every Namespace."""
    meta = _meta(obj)
    name = str(meta.get("name") or "")
    return {**_strings(meta.get("labels")), keys.NAMESPACE_NAME_LABEL: name}


def reclaim_mark(text: str | None) -> Taken | None:
    """What a PodGroup's reclaim mark says it gave back and for whom; None when absent or
    unreadable (anyone may edit it: an odd one is ignored, never fatal)."""
    if not text:
        return None
    try:
        mark = json.loads(text)
        until = _timestamp(mark["until"])
        pods = tuple(str(uid) for uid in mark["pods"])
        evict = _timestamp(mark["evict"]) if "evict" in mark else None  # none before notices
        taken = Taken(
            str(mark["card"]), int(mark["cards"]), str(mark["queue"]), pods, until or 0.0, evict=evict or 0.0
        )
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None
    return taken if math.isfinite(taken.until) and math.isfinite(taken.evict) else None


def reclaim_text(taken: Taken) -> str:
    return json.dumps(
        {
            "card": taken.card,
            "cards": taken.cards,
            "queue": taken.queue,
            "pods": list(taken.for_pods),
            "until": moment(taken.until),
            **({"evict": moment(taken.evict), "deadline": moment(taken.deadline)} if taken.evict else {}),
        },
        separators=(",", ":"),
    )


def eviction_notice(taken: Taken) -> str:
    """The notice on each pod of a gang tidal reclaim evicts, written before its eviction: when
    it is evicted, when it is killed if still running, and for whom."""
    return json.dumps(
        {
            "evict": moment(taken.evict),
            "deadline": moment(taken.deadline),
            "for": taken.queue,
            "card": taken.card,
            "cards": figure(taken.cards),
        },
        separators=(",", ":"),
    )

"""Slim records of cluster objects: only what the decisions read, built from raw API dicts.

The snapshot loader and the live cache both build these with the same functions, so the
offline answer and the live one agree.
"""

from collections.abc import Callable, Mapping
from dataclasses import field
from datetime import datetime
from typing import Any

from webhook.core import keys
from webhook.core.quantity import QuantityError, parse_quantity
from webhook.core.values import value_class

Raw = Mapping[str, Any]
NOT_CARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})
COMPUTE = ("cpu", "memory")
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@value_class(weakref_slot=True)
class OwnerRef:
    kind: str
    name: str
    uid: str
    api_version: str = ""


@value_class
class Resources:
    """A pod's effective extended-resource requests and limits (Kubernetes rules), and its effective
    CPU (millicores) and memory (bytes) requests, a container's limit standing in for its missing
    request as the API server defaults it."""

    requests: Mapping[str, Any] = field(default_factory=dict)
    limits: Mapping[str, Any] = field(default_factory=dict)
    cpu: int = 0
    memory: int = 0


@value_class(weakref_slot=True)
class PodTemplate:
    """What demand and affinity need from a pod or a pod template."""

    annotations: Mapping[str, str]
    resources: Resources
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_terms: tuple[Raw, ...] | None = None
    scheduler: str = ""  # spec.schedulerName


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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def group_name(self) -> str:
        return self.template.annotations.get(keys.GROUP_NAME, "")

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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


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


def _meta(obj: Raw) -> Raw:
    meta = obj.get("metadata") or {}
    return meta if type(meta) is dict or isinstance(meta, Mapping) else {}


def _strings(value: Any) -> dict[str, str]:
    if type(value) is not dict and not isinstance(value, Mapping):
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


def _extended(container: Raw, which: str) -> dict[str, Any]:
    res = (container.get("resources") or {}).get(which) or {}
    return {k: v for k, v in res.items() if k not in NOT_CARD_RESOURCES and not k.startswith("hugepages-")}


def _compute(container: Raw, _: str = "") -> dict[str, Any]:
    """A container's CPU and memory request, its limit where it sets no request."""
    res = container.get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    return {
        name: requests.get(name, limits.get(name)) for name in COMPUTE if name in requests or name in limits
    }


def _add(total: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Sum of two resource lists; ``total`` holds parsed amounts already."""
    out = dict(total)
    for name, value in extra.items():
        out[name] = out.get(name, 0) + _q(value)
    return out


def _max(left: Mapping[str, Any], right: Mapping[str, Any]) -> dict[str, Any]:
    """Per-resource maximum of two parsed resource lists."""
    out = dict(left)
    for name, value in right.items():
        out[name] = max(out.get(name, 0), value)
    return out


def _q(value: Any) -> Any:
    try:
        return parse_quantity(value)
    except QuantityError:
        return 0


def effective_resources(
    spec: Raw, which: str, pick: Callable[[Raw, str], dict[str, Any]] = _extended
) -> dict[str, Any]:
    """Kubernetes' pod-level value: max(sum of containers (+sidecars), running init max) + overhead."""
    containers = spec.get("containers") or []
    if len(containers) == 1 and not spec.get("initContainers") and not spec.get("overhead"):
        return {name: _q(value) for name, value in pick(containers[0], which).items()}  # the usual pod
    total: dict[str, Any] = {}
    for container in spec.get("containers") or []:
        total = _add(total, pick(container, which))
    sidecars: dict[str, Any] = {}
    init_max: dict[str, Any] = {}
    for container in spec.get("initContainers") or []:
        own = pick(container, which)
        if container.get("restartPolicy") == "Always":
            total = _add(total, own)
            sidecars = _add(sidecars, own)
            init_max = _max(init_max, sidecars)
        else:
            init_max = _max(init_max, _add(sidecars, own))
    total = _max(total, init_max)
    wanted = COMPUTE if pick is _compute else None
    overhead = {
        k: v
        for k, v in (spec.get("overhead") or {}).items()
        if (k in wanted if wanted else k not in NOT_CARD_RESOURCES)
    }
    return _add(total, overhead) if overhead else total


def compute_requests(spec: Raw) -> tuple[int, int]:
    """The pod's effective CPU (millicores, rounded up) and memory (bytes, rounded up) requests."""
    if spec.get("initContainers") or spec.get("overhead"):
        total = effective_resources(spec, "", _compute)
        cpu, memory = total.get("cpu", 0), total.get("memory", 0)
    else:  # the usual pod: a plain sum over its containers, read once (every review pays for it)
        cpu = memory = 0
        for container in spec.get("containers") or []:
            res = container.get("resources")
            if not res:
                continue
            requests, limits = res.get("requests") or {}, res.get("limits") or {}
            if (value := requests.get("cpu", limits.get("cpu"))) is not None:
                cpu = cpu + _q(value) if cpu else _q(value)  # no Fraction sum for the usual one container
            if (value := requests.get("memory", limits.get("memory"))) is not None:
                memory = memory + _q(value) if memory else _q(value)
    return max(0, _ceil_times(cpu, 1000)), max(0, _ceil_times(memory, 1))


def _ceil_times(value: Any, scale: int) -> int:
    """``ceil(value * scale)`` for an int or a Fraction, in integers (no Fraction arithmetic)."""
    return int(-((-value.numerator * scale) // value.denominator))


def resources_of(spec: Raw) -> Resources:
    """What a pod spec requests: reads only the containers', init containers' and overhead's
    resources and the init containers' ``restartPolicy``."""
    containers = spec.get("containers") or []
    if len(containers) == 1 and not spec.get("initContainers") and not spec.get("overhead"):
        return _one_container(containers[0].get("resources") or {})  # the usual pod, read in one pass
    cpu, memory = compute_requests(spec)
    return Resources(effective_resources(spec, "requests"), effective_resources(spec, "limits"), cpu, memory)


def _one_container(res: Raw) -> Resources:
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    cpu, memory = requests.get("cpu", limits.get("cpu")), requests.get("memory", limits.get("memory"))
    return Resources(
        {
            k: _q(v)
            for k, v in requests.items()
            if k not in NOT_CARD_RESOURCES and not k.startswith("hugepages-")
        },
        {
            k: _q(v)
            for k, v in limits.items()
            if k not in NOT_CARD_RESOURCES and not k.startswith("hugepages-")
        },
        0 if cpu is None else max(0, _ceil_times(_q(cpu), 1000)),
        0 if memory is None else max(0, _ceil_times(_q(memory), 1)),
    )


def pod_template_of(template: Raw) -> PodTemplate:
    """Slim view of a Pod or a PodTemplateSpec (``metadata`` + ``spec``)."""
    spec = template.get("spec") or {}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = None
    if isinstance(affinity, Mapping):
        terms = tuple(t for t in affinity.get("nodeSelectorTerms") or [] if isinstance(t, Mapping))
    return PodTemplate(
        annotations=_strings(_meta(template).get("annotations")),
        resources=resources_of(spec),
        node_selector=_strings(spec.get("nodeSelector")),
        required_terms=terms,
        scheduler=str(spec.get("schedulerName") or ""),
    )


def _timestamp(value: Any) -> float | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def pod_record(obj: Raw, template: PodTemplate | None = None) -> PodRecord:
    """``template``: the pod's own, read already (``pod_template_of(obj)``)."""
    meta, spec = _meta(obj), obj.get("spec") or {}
    return PodRecord(
        uid=str(meta.get("uid") or f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or meta.get("generateName") or ""),
        template=template or pod_template_of(obj),
        node_name=str(spec.get("nodeName") or ""),
        phase=str((obj.get("status") or {}).get("phase") or "Pending"),
        deletion_deadline=deletion_deadline(
            meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
        ),
        owner=controller_of(obj),
    )


def deletion_deadline(timestamp: Any, grace: Any) -> float | None:
    """When a pod being deleted stops counting: its deletion time plus its grace period."""
    deletion = _timestamp(timestamp)
    return None if deletion is None else deletion + float(grace or 0)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def workload_record(obj: Raw) -> WorkloadRecord:
    meta, spec, kind = _meta(obj), obj.get("spec") or {}, str(obj.get("kind", ""))
    if kind == "Job":  # Volcano Job (batch.volcano.sh): tasks, each with a template
        tasks = tuple(
            Task(str(t.get("name", "")), _int(t.get("replicas"), 0), pod_template_of(t.get("template") or {}))
            for t in spec.get("tasks") or []
        )
        replicas = sum(t.replicas for t in tasks)
    else:
        tasks = (Task("", _int(spec.get("replicas"), 1), pod_template_of(spec.get("template") or {})),)
        replicas = _int(spec.get("replicas"), 1)
    return WorkloadRecord(
        kind=kind,
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or f"{kind}/{meta.get('namespace')}/{meta.get('name')}"),
        replicas=replicas,
        annotations=_strings(meta.get("annotations")),
        tasks=tasks,
        owner=controller_of(obj),
        queue=str(spec.get("queue") or ""),
        min_available=_int(spec.get("minAvailable"), 0),
    )


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
    )


def queue_record(obj: Raw) -> QueueRecord:
    meta, spec = _meta(obj), obj.get("spec") or {}
    return QueueRecord(
        name=str(meta.get("name") or ""),
        state=str((obj.get("status") or {}).get("state") or "Open"),
        annotations=_strings(meta.get("annotations")),
        parent=str(spec.get("parent") or ""),
        capability=dict(spec.get("capability") or {}),
    )

"""A pod's resources as Kubernetes counts them: effective extended-resource requests and limits
(containers, sidecars, init containers and overhead), and effective CPU and memory requests."""

from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from webhook.core.model.quantity import QuantityError, parse_quantity
from webhook.core.model.values import value_class

Raw = Mapping[str, Any]
NOT_CARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})
COMPUTE = ("cpu", "memory")


@value_class
class Resources:
    """A pod's effective extended-resource requests and limits (Kubernetes rules), and its effective
    CPU (millicores) and memory (bytes) requests, a container's limit standing in for its missing
    request as the API server defaults it."""

    requests: Mapping[str, Any] = field(default_factory=dict)
    limits: Mapping[str, Any] = field(default_factory=dict)
    cpu: int = 0
    memory: int = 0


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
    total = _containers(spec, which, pick)
    wanted = COMPUTE if pick is _compute else None
    overhead = {
        k: v
        for k, v in (spec.get("overhead") or {}).items()
        if (k in wanted if wanted else k not in NOT_CARD_RESOURCES)
    }
    return _add(total, overhead) if overhead else total


def _containers(spec: Raw, which: str, pick: Callable[[Raw, str], dict[str, Any]]) -> dict[str, Any]:
    """The containers' part: max(sum of containers and sidecars, each init container beside the
    sidecars before it); a resource no container names is absent, not 0."""
    containers = spec.get("containers") or []
    if len(containers) == 1 and not spec.get("initContainers"):
        return {name: _q(value) for name, value in pick(containers[0], which).items()}  # the usual pod
    total: dict[str, Any] = {}
    for container in containers:
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
    return _max(total, init_max)


def _pod_level(containers: dict[str, Any], resources: Raw) -> dict[str, Any]:
    """The pod's CPU and memory requests under its ``spec.resources`` (KEP-2837), before overhead:
    a pod-level request is the pod's request, whatever its containers ask; a pod-level limit with no
    pod-level request stands in for it only when no container names that resource (the API server
    defaults the pod-level request from the containers' requests when one does, else from the
    pod-level limit: ``defaultPodRequests``)."""
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    out = dict(containers)
    for name in COMPUTE:
        if name in requests:
            out[name] = _q(requests[name])
        elif name in limits and name not in containers:
            out[name] = _q(limits[name])
    return out


def compute_requests(spec: Raw) -> tuple[int, int]:
    """The pod's effective CPU (millicores, rounded up) and memory (bytes, rounded up) requests:
    its containers', or its pod-level ones where it sets them (KEP-2837), plus its overhead."""
    if spec.get("initContainers") or spec.get("overhead") or spec.get("resources"):
        total = _containers(spec, "", _compute)
        if pod_level := spec.get("resources"):
            total = _pod_level(total, pod_level)
        overhead = spec.get("overhead") or {}
        total = _add(total, {k: overhead[k] for k in COMPUTE if k in overhead})
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
    """What a pod spec requests: reads only the containers', init containers', the pod's own
    (``spec.resources``) and overhead's resources and the init containers' ``restartPolicy``."""
    containers = spec.get("containers") or []
    if (
        len(containers) == 1
        and not spec.get("initContainers")
        and not spec.get("overhead")
        and not spec.get("resources")
    ):
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

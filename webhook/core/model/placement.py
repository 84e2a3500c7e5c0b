"""Which nodes a pod may be scheduled on, as kube-scheduler's filters read a node: cordoned
(``spec.unschedulable``: NodeUnschedulable), a NoSchedule or NoExecute taint the pod does not
tolerate (TaintToleration; a node that is not Ready carries the node lifecycle controller's
``node.kubernetes.io/not-ready`` or ``unreachable`` taints), a nodeSelector or required node
affinity it does not match (NodeAffinity). Tidal reclaim takes cards back only on nodes the pods it takes them
for can use (SPEC §5e).
"""

import math
from collections.abc import Mapping
from dataclasses import field
from fractions import Fraction
from typing import Any

from webhook.core.model.quantity import QuantityError, parse_quantity
from webhook.core.model.values import value_class

Raw = Mapping[str, Any]
BLOCKING = frozenset({"NoSchedule", "NoExecute"})
UNCOUNTED = frozenset({"pods", "ephemeral-storage"})  # not held against by tidal reclaim


@value_class
class NodeFacts:
    """What of a node decides whether a pod may land on it."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect), NoSchedule and NoExecute only
    schedulable: bool  # not cordoned
    # status.allocatable: CPU in millicores, memory in bytes, other resources in units (rounded down)
    allocatable: Mapping[str, int] = field(default_factory=dict)


def node_facts(obj: Raw) -> NodeFacts:
    meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
    labels = {str(k): str(v) for k, v in _dict(meta.get("labels")).items() if v is not None}
    taints = tuple(
        (str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect")))
        for t in _list(spec.get("taints"))
        if isinstance(t, Mapping) and t.get("effect") in BLOCKING
    )
    allocatable = _allocatable(_dict(_dict(obj.get("status")).get("allocatable")))
    return NodeFacts(
        str(meta.get("name") or ""), labels, taints, spec.get("unschedulable") is not True, allocatable
    )


def _allocatable(listed: Raw) -> dict[str, int]:
    """A node's allocatable resources that a pod's requests are held against (an unreadable
    amount counts as none: nothing is placed on it)."""
    out: dict[str, int] = {}
    for name, value in listed.items():
        if name in UNCOUNTED or not isinstance(name, str) or name.startswith("hugepages-"):
            continue
        try:
            amount = parse_quantity(value)
        except QuantityError:
            amount = Fraction(0)
        out[name] = max(0, math.floor(amount * 1000 if name == "cpu" else amount))
    return out


@value_class
class PodPlace:
    """What of a pending pod decides where it may land, and whether the scheduler found nowhere."""

    unschedulable: bool  # PodScheduled False, reason Unschedulable, and no scheduling gate
    selector: Mapping[str, str]  # spec.nodeSelector
    terms: tuple[Raw, ...] | None  # its required node affinity's nodeSelectorTerms
    tolerations: tuple[Raw, ...]


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def pod_place(pod: Raw) -> PodPlace:
    """A pod object, as the API server shows it, as a ``PodPlace``."""
    spec, status = _dict(pod.get("spec")), _dict(pod.get("status"))
    unschedulable = not spec.get("schedulingGates") and any(
        isinstance(c, Mapping)
        and c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in _list(status.get("conditions"))
    )
    selector = {str(k): str(v) for k, v in _dict(spec.get("nodeSelector")).items()}
    required = _dict(_dict(_dict(spec.get("affinity")).get("nodeAffinity")).get(REQUIRED))
    terms = tuple(t for t in _list(required.get("nodeSelectorTerms")) if isinstance(t, Mapping))
    tolerations = tuple(t for t in _list(spec.get("tolerations")) if isinstance(t, Mapping))
    return PodPlace(unschedulable, selector, terms if required else None, tolerations)


def usable(node: NodeFacts, pod: PodPlace) -> bool:
    """Whether ``pod`` may be scheduled on ``node``, as the scheduler's filters read them."""
    if not node.schedulable:
        return False
    if any(node.labels.get(k) != v for k, v in pod.selector.items()):
        return False
    if pod.terms is not None and not any(_term(term, node) for term in pod.terms):
        return False
    return all(any(_tolerates(t, taint) for t in pod.tolerations) for taint in node.taints)


def _term(term: Raw, node: NodeFacts) -> bool:
    """A node selector term: all its expressions and fields hold (an empty term selects nothing)."""
    expressions, fields = _list(term.get("matchExpressions")), _list(term.get("matchFields"))
    if not expressions and not fields:
        return False
    return all(_holds(e, node.labels) for e in expressions) and all(
        _holds(f, {"metadata.name": node.name}) for f in fields
    )


def _holds(expression: Any, labels: Mapping[str, str]) -> bool:
    if not isinstance(expression, Mapping):
        return False
    key, operator, values = (
        str(expression.get("key")),
        expression.get("operator"),
        _list(expression.get("values")),
    )
    value = labels.get(key)
    match operator:
        case "In":
            return value is not None and value in values
        case "NotIn":
            return value is None or value not in values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case "Gt" | "Lt":
            try:
                have, bound = int(value or ""), int(str(values[0]))
            except (ValueError, IndexError):
                return False
            return have > bound if operator == "Gt" else have < bound
    return False


def _tolerates(toleration: Any, taint: tuple[str, str, str]) -> bool:
    if not isinstance(toleration, Mapping):
        return False
    key, value, effect = taint
    if toleration.get("effect") and toleration.get("effect") != effect:
        return False
    operator = toleration.get("operator") or "Equal"
    if not toleration.get("key"):
        return operator == "Exists"  # an empty key with Exists tolerates every taint
    if toleration.get("key") != key:
        return False
    return operator == "Exists" or (operator == "Equal" and str(toleration.get("value") or "") == value)


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []

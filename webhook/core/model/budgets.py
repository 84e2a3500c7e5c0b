"""PodDisruptionBudgets as the Eviction API applies them (policy/v1), judged for a gang evicted
whole: one eviction at a time, each would pass alone, and the budget refuses the second.

The API server's rule (``pkg/registry/core/pod/storage/eviction.go``), read here for every pod of
the gang at once, in its order: a pod Pending, finished or being deleted ignores budgets; a pod
covered by more than one budget cannot be evicted; an unready pod takes none of its budget's
disruptions when the budget's ``unhealthyPodEvictionPolicy`` is ``AlwaysAllow`` or its application
is healthy enough (``currentHealthy >= desiredHealthy > 0``), whatever else its budget says; then
a budget whose status is older than its spec refuses, and so does one whose ``disruptionsAllowed``
are fewer than the gang's pods that would take one, or whose ``disruptedPods`` (the evictions its
controller has not seen go yet, each pod it lets go added) would list more than 2,000.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core.model.values import value_class

Raw = Mapping[str, Any]
_IGNORING = frozenset({"Pending", "Succeeded", "Failed"})
# evictions a budget's status may list unconfirmed before the API server refuses (MaxDisruptedPodSize)
MAX_DISRUPTED = 2000


@value_class
class Member:
    """A pod of the gang as the API server shows it now."""

    key: str  # namespace/name
    labels: Mapping[str, str]
    phase: str
    ready: bool
    deleting: bool


def member(key: str, pod: Raw) -> Member:
    """A pod object (as read from the API server) as a ``Member``."""
    meta, status = _dict(pod.get("metadata")), _dict(pod.get("status"))
    labels = {str(k): str(v) for k, v in _dict(meta.get("labels")).items() if v is not None}
    conditions = status.get("conditions")
    ready = any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in (conditions if isinstance(conditions, list) else ())
    )
    return Member(
        key, labels, str(status.get("phase") or "Pending"), ready, bool(meta.get("deletionTimestamp"))
    )


def selects(selector: Any, labels: Mapping[str, str]) -> bool | None:
    """Whether a policy/v1 label ``selector`` selects ``labels`` (None: no selector, selects none;
    ``{}`` selects every pod); None as well when it is invalid (the API server skips it)."""
    if not isinstance(selector, Mapping):
        return False if selector is None else None
    wanted = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(wanted, Mapping) or not isinstance(expressions, list):
        return None
    if any(labels.get(str(k)) != str(v) for k, v in wanted.items()):
        return False
    for expression in expressions:
        if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str):
            return None
        key, operator, values = expression["key"], expression.get("operator"), expression.get("values") or []
        if not isinstance(values, list):
            return None
        match operator:
            case "In":
                if not values or labels.get(key) not in values:
                    return False if values else None
            case "NotIn":
                if not values:
                    return None
                if key in labels and labels[key] in values:
                    return False
            case "Exists":
                if key not in labels:
                    return False
            case "DoesNotExist":
                if key in labels:
                    return False
            case _:
                return None
    return True


def refusal(members: Sequence[Member], budgets: Sequence[Raw], going: Sequence[Member] = ()) -> str:
    """Why evicting every pod of ``members`` one after another would be refused by the namespace's
    ``budgets`` (PodDisruptionBudget objects), or "" when every eviction would pass. ``going``: the
    pods evicted just before them (the other gangs of one reclaim, judged already), whose evictions
    take from the same budgets first."""
    taken, before = _taken(members, budgets), _taken(going, budgets)
    if isinstance(taken, str):
        return taken
    for budget in budgets:
        name = _name(budget)
        if name in taken:
            said = _over(budget, [] if isinstance(before, str) else before.get(name, []), taken[name])
            if said:
                return said
    return ""


def _taken(pods: Sequence[Member], budgets: Sequence[Raw]) -> dict[str, list[str]] | str:
    """Per budget (by name), the pods of ``pods`` that would each take one of its disruptions; or
    why one of them cannot be evicted at all."""
    taken: dict[str, list[str]] = {}
    for pod in pods:
        if pod.phase in _IGNORING or pod.deleting:
            continue
        covering = [b for b in budgets if selects(_dict(b.get("spec")).get("selector"), pod.labels)]
        if len(covering) > 1:
            names = ", ".join(sorted(_name(b) for b in covering))
            return f"pod {pod.key} is covered by more than one PodDisruptionBudget ({names}): none evicts it"
        if not covering:
            continue
        budget = covering[0]
        if not pod.ready and _spares_unready(budget):
            continue
        taken.setdefault(_name(budget), []).append(pod.key)
    return taken


def _over(budget: Raw, before: list[str], pods: list[str]) -> str:
    """Why ``budget`` refuses one of the evictions of ``pods`` (each taking a disruption) after those
    of ``before``, or ""."""
    meta, spec, status = _dict(budget.get("metadata")), _dict(budget.get("spec")), _dict(budget.get("status"))
    allowed = _int(status.get("disruptionsAllowed"))
    if _int(status.get("observedGeneration")) < _int(meta.get("generation")):
        return f"PodDisruptionBudget {_name(budget)} is not yet processed by its controller"
    if allowed < len(before) + len(pods):
        what = spec.get("minAvailable", spec.get("maxUnavailable"))
        rule = "minAvailable" if "minAvailable" in spec else "maxUnavailable"
        after = f" after the {len(before)} of the gangs evicted before it" if before else ""
        return (
            f"PodDisruptionBudget {_name(budget)} ({rule} {what}) allows {max(allowed, 0)}"
            f" disruption{'s' if allowed != 1 else ''} now; the gang would take {len(pods)}{after}"
            f" ({', '.join(pods[:4])}{', ...' if len(pods) > 4 else ''})"
        )
    # each eviction it passes names its pod in ``disruptedPods`` until the controller sees it go
    unseen = set(_dict(status.get("disruptedPods"))) | {p.rpartition("/")[2] for p in [*before, *pods][:-1]}
    if len(unseen) > MAX_DISRUPTED:
        return (
            f"PodDisruptionBudget {_name(budget)} would have more than {MAX_DISRUPTED:,} evictions"
            " not yet confirmed by its controller"
        )
    return ""


def _spares_unready(budget: Raw) -> bool:
    spec, status = _dict(budget.get("spec")), _dict(budget.get("status"))
    if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
        return True
    desired = _int(status.get("desiredHealthy"))
    return _int(status.get("currentHealthy")) >= desired > 0


def _name(budget: Raw) -> str:
    meta = _dict(budget.get("metadata"))
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int:
    return value if type(value) is int else 0

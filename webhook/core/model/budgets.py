"""PodDisruptionBudgets as the Eviction API applies them (policy/v1), judged for a gang evicted
whole: one eviction at a time, each would pass alone, and the budget refuses the second.

The API server's rule (``pkg/registry/core/pod/storage/eviction.go``), read here for every pod of
the gang at once: a pod Pending, finished or being deleted ignores budgets; a pod covered by more
than one budget cannot be evicted; a budget whose status is older than its spec refuses; a ready
pod takes one of the budget's ``disruptionsAllowed``; an unready one takes none when the budget's
``unhealthyPodEvictionPolicy`` is ``AlwaysAllow`` or its application is healthy enough
(``currentHealthy >= desiredHealthy > 0``).
"""

from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core.model.values import value_class

Raw = Mapping[str, Any]
_IGNORING = frozenset({"Pending", "Succeeded", "Failed"})


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


def refusal(members: Sequence[Member], budgets: Sequence[Raw]) -> str:
    """Why evicting every pod of ``members`` one after another would be refused by the namespace's
    ``budgets`` (PodDisruptionBudget objects), or "" when every eviction would pass."""
    taken: dict[str, list[str]] = {}
    for pod in members:
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
    for budget in budgets:
        pods = taken.get(_name(budget))
        if not pods:
            continue
        meta, spec, status = (
            _dict(budget.get("metadata")),
            _dict(budget.get("spec")),
            _dict(budget.get("status")),
        )
        allowed = _int(status.get("disruptionsAllowed"))
        if _int(status.get("observedGeneration")) < _int(meta.get("generation")):
            return f"PodDisruptionBudget {_name(budget)} is not yet processed by its controller"
        if allowed < len(pods):
            what = spec.get("minAvailable", spec.get("maxUnavailable"))
            rule = "minAvailable" if "minAvailable" in spec else "maxUnavailable"
            return (
                f"PodDisruptionBudget {_name(budget)} ({rule} {what}) allows {max(allowed, 0)}"
                f" disruption{'s' if allowed != 1 else ''} now; the gang would take {len(pods)}"
                f" ({', '.join(pods[:4])}{', ...' if len(pods) > 4 else ''})"
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

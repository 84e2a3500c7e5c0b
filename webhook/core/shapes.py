"""Total shape checks of the raw objects the decisions read, so nonsense gets a denial, not a crash.

The API server decodes built-in kinds before admission, but Volcano's CRDs allow much, and anyone
can POST a review. Every field the core reads is checked here once, at the entry, for the type the
core expects; a problem is one line naming the field (``spec.containers[0].resources.limits:
quantity 'NaN' is not a Kubernetes quantity``). ``null`` stands for absent, as in Kubernetes.
"""

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from webhook.core.quantity import QuantityError, parse_quantity
from webhook.core.quoting import shorten

Check = Callable[[Any, str], str]  # (value, where) -> problem, or "" when the value is fine


def _type_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else type(value).__name__


def _join(where: str, key: str) -> str:
    plain = key.replace("-", "").replace("_", "").isalnum()
    return f"{where}.{key}" if plain and where else (key if plain else f"{where}[{shorten(key)}]")


def obj(fields: Mapping[str, Check]) -> Check:
    """A JSON object whose named fields pass their checks; other fields are not read."""

    def check(value: Any, where: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, Mapping):
            return f"{where or 'the object'} must be an object, got {_type_name(value)}"
        for key, field_check in fields.items():
            if (problem := field_check(value.get(key), _join(where, key))) != "":
                return problem
        return ""

    return check


def items(each: Check) -> Check:
    """A JSON list whose every element passes ``each``."""

    def check(value: Any, where: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, list):
            return f"{where} must be a list, got {_type_name(value)}"
        for index, element in enumerate(value):
            if element is None:
                return f"{where}[{index}] must not be null"
            if (problem := each(element, f"{where}[{index}]")) != "":
                return problem
        return ""

    return check


def _scalar(kind: type | tuple[type, ...], name: str) -> Check:
    def check(value: Any, where: str) -> str:
        if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
            return ""
        return f"{where} must be {name}, got {_type_name(value)}"

    return check


text = _scalar(str, "a string")
integer = _scalar(int, "a whole number")


def boolean(value: Any, where: str) -> str:
    return "" if value is None or isinstance(value, bool) else f"{where} must be true or false"


def strings(value: Any, where: str) -> str:
    """A map of strings to strings (labels, annotations, nodeSelector)."""
    if value is None:
        return ""
    if not isinstance(value, Mapping):
        return f"{where} must be an object of strings, got {_type_name(value)}"
    for key, element in value.items():
        if element is not None and not isinstance(element, str):
            return f"{_join(where, key)} must be a string, got {_type_name(element)}"
    return ""


def quantities(value: Any, where: str) -> str:
    """A resource list: every value a Kubernetes quantity."""
    if value is None:
        return ""
    if not isinstance(value, Mapping):
        return f"{where} must be an object of quantities, got {_type_name(value)}"
    for key, element in value.items():
        try:
            parse_quantity(element)
        except QuantityError as exc:
            return f"{_join(where, key)}: {exc}"
    return ""


def timestamp(value: Any, where: str) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
            return ""
        except ValueError:
            pass
    return f"{where} must be an RFC 3339 time, got {shorten(str(value))}"


OWNER = obj({"kind": text, "name": text, "uid": text, "apiVersion": text, "controller": boolean})
META = obj(
    {
        "name": text,
        "generateName": text,
        "namespace": text,
        "uid": text,
        "annotations": strings,
        "labels": strings,
        "ownerReferences": items(OWNER),
        "deletionTimestamp": timestamp,
        "deletionGracePeriodSeconds": integer,
    }
)
CONTAINER = obj({"resources": obj({"requests": quantities, "limits": quantities}), "restartPolicy": text})
EXPRESSION = obj({"key": text, "operator": text, "values": items(text)})
TERM = obj({"matchExpressions": items(EXPRESSION)})
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
AFFINITY = obj({"nodeAffinity": obj({REQUIRED: obj({"nodeSelectorTerms": items(TERM)})})})
POD_SPEC = obj(
    {
        "containers": items(CONTAINER),
        "initContainers": items(CONTAINER),
        "overhead": quantities,
        "nodeSelector": strings,
        "nodeName": text,
        "affinity": AFFINITY,
    }
)
TEMPLATE = obj({"metadata": META, "spec": POD_SPEC})
POD = obj({"metadata": META, "spec": POD_SPEC, "status": obj({"phase": text})})
TASK = obj({"name": text, "replicas": integer, "template": TEMPLATE})
WORKLOAD = obj(
    {
        "metadata": META,
        "spec": obj(
            {
                "replicas": integer,
                "template": TEMPLATE,
                "tasks": items(TASK),
                "queue": text,
                "minAvailable": integer,
            }
        ),
    }
)
SCALE = obj({"metadata": META, "spec": obj({"replicas": integer})})
PODGROUP = obj(
    {
        "metadata": META,
        "spec": obj({"queue": text, "minMember": integer, "minResources": quantities}),
        "status": obj({"phase": text}),
    }
)
QUEUE = obj({"metadata": META, "spec": obj({"parent": text}), "status": obj({"state": text})})
NODE = obj({"metadata": META, "status": obj({"allocatable": quantities})})

# By the resource a review names (scale subresources carry an autoscaling/v1 Scale).
BY_RESOURCE: Mapping[str, Check] = {
    "pods": POD,
    "deployments": WORKLOAD,
    "statefulsets": WORKLOAD,
    "replicasets": WORKLOAD,
    "jobs": WORKLOAD,
    "podgroups": PODGROUP,
    "queues": QUEUE,
    "nodes": NODE,
}


def problem(resource: str, sub_resource: str, value: Any) -> str:
    """What is wrong with an object of ``resource`` (one line), or "" when the core can read it."""
    check = SCALE if sub_resource == "scale" else BY_RESOURCE.get(resource)
    if check is None or sub_resource not in ("", "scale"):
        return ""
    if not isinstance(value, Mapping):
        return f"the object must be a JSON object, got {_type_name(value)}"
    return check(value, "")

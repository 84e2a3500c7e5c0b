"""Total shape checks of the raw objects the decisions read, so nonsense gets a denial, not a crash.

The API server decodes built-in kinds before admission, but Volcano's CRDs allow much, and anyone
can POST a review. Every field the core reads is checked here once, at the entry, for the type the
core expects; a problem is one line naming the field (``spec.containers[0].resources.limits:
quantity 'NaN' is not a Kubernetes quantity``). ``null`` stands for absent, as in Kubernetes.
"""

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from webhook.core.model.quantity import QuantityError, parse_quantity
from webhook.core.model.quoting import shorten

Check = Callable[[Any], "Problem | None"]  # None when the value is fine


class Problem:
    """What is wrong, and where: the path is built on the way out, so a good object costs no text."""

    __slots__ = ("path", "text")

    def __init__(self, text: str) -> None:
        self.path: list[str] = []
        self.text = text

    def under(self, part: str) -> "Problem":
        self.path.append(part)
        return self

    def __str__(self) -> str:
        where = ""
        for part in reversed(self.path):
            if part.startswith("["):
                where += part
            elif part.replace("-", "").replace("_", "").isalnum():
                where += f".{part}" if where else part
            else:
                where += f"[{shorten(part)}]"
        return f"{where} {self.text}" if where and not self.text.startswith(":") else where + self.text


def _type_name(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else type(value).__name__


def obj(fields: Mapping[str, Check]) -> Check:
    """A JSON object whose named fields pass their checks; other fields are not read."""
    pairs = tuple(fields.items())

    def check(value: Any) -> Problem | None:
        if value is None:
            return None
        if type(value) is not dict:
            return Problem(f"must be an object, got {_type_name(value)}")
        for key, field_check in pairs:  # an absent field passes every check: not called for it
            if (field := value.get(key)) is not None and (problem := field_check(field)) is not None:
                return problem.under(key)
        return None

    return check


def items(each: Check) -> Check:
    """A JSON list whose every element passes ``each`` (and is not null)."""

    def check(value: Any) -> Problem | None:
        if value is None:
            return None
        if type(value) is not list:
            return Problem(f"must be a list, got {_type_name(value)}")
        for index, element in enumerate(value):
            problem = Problem("must not be null") if element is None else each(element)
            if problem is not None:
                return problem.under(f"[{index}]")
        return None

    return check


def _scalar(kind: type, name: str) -> Check:
    def check(value: Any) -> Problem | None:
        if value is None or (type(value) is kind):
            return None
        return Problem(f"must be {name}, got {_type_name(value)}")

    return check


text = _scalar(str, "a string")
integer = _scalar(int, "a whole number")


def boolean(value: Any) -> Problem | None:
    return None if value is None or type(value) is bool else Problem("must be true or false")


def _map_of(noun: str, each: Callable[[Any], str]) -> Check:
    """A JSON object whose every value passes ``each`` (which returns a problem text, or "")."""

    def check(value: Any) -> Problem | None:
        if value is None:
            return None
        if type(value) is not dict:
            return Problem(f"must be an object of {noun}, got {_type_name(value)}")
        for key, element in value.items():
            if text := each(element):
                return Problem(text).under(key)
        return None

    return check


def _string(value: Any) -> str:
    return "" if value is None or type(value) is str else f"must be a string, got {_type_name(value)}"


def _quantity(value: Any) -> str:
    try:
        parse_quantity(value)
    except QuantityError as exc:
        return f": {exc}"
    return ""


strings = _map_of("strings", _string)  # labels, annotations, nodeSelector
quantities = _map_of("quantities", _quantity)  # resource lists


def timestamp(value: Any) -> Problem | None:
    if value is None or value == "":
        return None
    if type(value) is str:
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
            return None
        except ValueError:
            pass
    return Problem(f"must be an RFC 3339 time, got {shorten(str(value))}")


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
RESOURCES = obj({"requests": quantities, "limits": quantities})
CONTAINER = obj({"resources": RESOURCES, "restartPolicy": text})
EXPRESSION = obj({"key": text, "operator": text, "values": items(text)})
TERM = obj({"matchExpressions": items(EXPRESSION)})
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
AFFINITY = obj({"nodeAffinity": obj({REQUIRED: obj({"nodeSelectorTerms": items(TERM)})})})
POD_SPEC = obj(
    {
        "containers": items(CONTAINER),
        "initContainers": items(CONTAINER),
        "overhead": quantities,
        "resources": RESOURCES,  # pod-level resources (KEP-2837)
        "nodeSelector": strings,
        "nodeName": text,
        "affinity": AFFINITY,
        "schedulerName": text,
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
CONDITION = obj({"type": text, "status": text})
BATCH_JOB = obj(  # a batch/v1 Job, as the cache reads it (the webhook reviews none)
    {
        "metadata": META,
        "spec": obj(
            {"parallelism": integer, "completions": integer, "suspend": boolean, "template": TEMPLATE}
        ),
        "status": obj({"succeeded": integer, "conditions": items(CONDITION)}),
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
QUEUE = obj(
    {
        "metadata": META,
        "spec": obj({"parent": text, "capability": quantities}),
        "status": obj({"state": text}),
    }
)
NODE = obj({"metadata": META, "status": obj({"allocatable": quantities})})
NAMESPACE = obj({"metadata": META})  # its default queue annotation (not reviewed: for the cache)

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
    "jobs.batch": BATCH_JOB,  # not reviewed: for the cache
    "namespaces": NAMESPACE,
}


def problem(resource: str, sub_resource: str, value: Any) -> str:
    """What is wrong with an object of ``resource`` (one line), or "" when the core can read it."""
    if sub_resource == "scale":
        check: Check | None = SCALE
    elif sub_resource:
        check = POD if (resource, sub_resource) == ("pods", "resize") else None  # the whole pod
    else:
        check = BY_RESOURCE.get(resource)
    if check is None:
        return ""
    if type(value) is not dict:
        return f"the object must be a JSON object, got {_type_name(value)}"
    found = check(value)
    return "" if found is None else str(found)

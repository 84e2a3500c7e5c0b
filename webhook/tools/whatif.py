"""``cardquota whatif -f FILE``: what the webhooks would say to every object of a manifest.

Each object becomes the request the API server would send: CREATE, or UPDATE when the cluster
already holds an object of that kind and name. The old object of a workload carries the replicas
the cluster has; that of a pod or PodGroup is the manifest's with what the cluster holds of the
fields the count reads (annotations, queue, phase, node, scheduling gates), and the manifest is
read as the object after the edit (``kubectl replace``), the fields the server sets (uid, node,
phase, gates) kept where it leaves them out. The pod and PodGroup mutation answers first, with
its patch, then the validation decides. Objects are taken in file order and an admitted one
holds its cards for the next, as if the file were applied; the holds live only in this process's
copy of the state, so nothing is recorded anywhere. Kinds the webhooks are not registered for
are reported as not sent. Pods admitted on a model their queue lends and borrows in its cohort
(``card.deserved``) are told apart: how many fit within its deserved, how many more with what its
cohort lends now; an ``A|B`` scale-up's per model, each pod on the model the pod mutation would give it.
"""

import copy
import dataclasses
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import orjson

from webhook.cluster import snapshot
from webhook.core.decide import admission, assignment
from webhook.core.index import cohorts
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.demand import PodDemand, pod_demand
from webhook.core.model.objects import workload_record
from webhook.core.model.verdicts import Allowed, Decision, Denied, Hold, Request
from webhook.errors import ConfigError

# (API group, kind) -> resource, for the kinds the webhooks are registered for.
RESOURCES: Mapping[tuple[str, str], str] = {
    ("", "Pod"): "pods",
    ("apps", "Deployment"): "deployments",
    ("apps", "StatefulSet"): "statefulsets",
    ("apps", "ReplicaSet"): "replicasets",
    ("scheduling.volcano.sh", "Queue"): "queues",
    ("scheduling.volcano.sh", "PodGroup"): "podgroups",
    ("batch.volcano.sh", "Job"): "jobs",
}
MUTATED = frozenset({"pods", "podgroups"})
SCALED = frozenset({"deployments", "statefulsets", "replicasets"})  # an A|B hold: a scale-up's pods
WORKLOADS = {
    "deployments": "Deployment",
    "statefulsets": "StatefulSet",
    "replicasets": "ReplicaSet",
    "jobs": "Job",
}


@dataclass
class Answer:
    """What the webhooks say to one object."""

    source: str  # where in the manifest
    target: str  # kind namespace/name
    operation: str
    sent: bool = True
    allowed: bool = True
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    lending: list[dict[str, Any]] = field(default_factory=list)  # see _lent

    def as_json(self) -> dict[str, Any]:
        return {
            "object": self.target,
            "source": self.source,
            "operation": self.operation,
            "sent": self.sent,
            "allowed": self.allowed,
            "message": self.message,
            "warnings": self.warnings,
            "patch": self.patch,
            "lending": self.lending,
        }


def read_manifest(path: str, stdin: bytes | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Every object of a multi-document YAML/JSON manifest (``-``: standard input), Lists unrolled."""
    if path == "-":
        return list(snapshot.objects_of("stdin", stdin or b""))
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{path}: no such file")
    return list(snapshot.objects_of(str(file), file.read_bytes()))


def whatif(
    state: ClusterState, objects: list[tuple[str, dict[str, Any]]], now: float | None = None
) -> list[Answer]:
    """Answer every object in order; ``state`` receives the holds of what is admitted (pass a copy)."""
    now = time.time() if now is None else now
    return [_answer(state, source, obj, now) for source, obj in objects]


def _answer(state: ClusterState, source: str, obj: dict[str, Any], now: float) -> Answer:
    api_version = str(obj.get("apiVersion") or "")
    group = api_version.rpartition("/")[0] if "/" in api_version else ""
    kind = str(obj.get("kind") or "")
    meta = _dict(obj.get("metadata"))
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
    resource = RESOURCES.get((group, kind))
    target = f"{kind.lower()} {name}" if kind == "Queue" else f"{kind.lower()} {namespace}/{name}"
    if resource is None:
        return Answer(
            source, target, "CREATE", sent=False, message=f"{api_version} {kind} is not sent to the webhooks"
        )
    if kind != "Queue":
        obj = {**obj, "metadata": {**meta, "namespace": namespace}}
    operation, old, obj = _operation(state, resource, kind, namespace, name, obj)
    request = Request(
        uid=f"whatif-{uuid.uuid4().hex[:8]}",
        kind=kind,
        group=group,
        resource=resource,
        sub_resource="",
        operation=operation,
        namespace="" if kind == "Queue" else namespace,
        name=name,
        obj=obj,
        old_obj=old,
    )
    answer = Answer(source, target, operation)
    if resource in MUTATED and operation == "CREATE":
        mutation = admission.mutate(state, request, now=now)
        admission.admit(state, request, mutation, now)  # a multi-card pod's assigned model
        if _record(answer, mutation):
            return answer
        if isinstance(mutation, Allowed) and mutation.patch:  # validation sees the mutated object
            patched = jsonpatch.apply_patch(obj, [dict(op) for op in mutation.patch])
            request = dataclasses.replace(request, obj=patched)
    validation = admission.validate(state, request, now)
    answer.lending = _lent(state, request, validation)
    admission.admit(state, request, validation, now)
    _record(answer, validation)
    return answer


def _lent(state: ClusterState, request: Request, decision: Decision) -> list[dict[str, Any]]:
    """For each hold of pods an admitted ``decision`` makes on one model its queue lends and borrows
    in its cohort: how many of those pods fit within the queue's deserved and how many more take
    what its cohort lends now (and which queues lend it, most first); an ``A|B`` scale-up's pods
    each on the model the pod mutation would give it (see _spread). Asked before the holds count;
    pods that come out of a PodGroup's reservation, counted already, are left out."""
    if not isinstance(decision, Allowed) or decision.hold is None:
        return []
    out: list[dict[str, Any]] = []
    used: dict[tuple[str, str], int] = {}
    for hold in (decision.hold, *decision.more):
        if hold.spec is None or hold.covers is not None or hold.pods < 1:
            continue
        if hold.spec.is_multi:
            out += _spread(state, request, hold)
            continue
        card = hold.spec.cards[0]
        found = cohorts.share(state, hold.queue, card)
        if found is None:
            continue
        before = used.get((hold.queue, card))
        if before is None:  # a pod's own model assignment, held since its mutation, is not counted
            before = cohorts.load(
                state, hold.queue, card, hold.transfer_from[0] if hold.transfer_from else ""
            )
        room = max(0, found.deserved - before)
        within = min(hold.pods, room // hold.per_pod) if hold.per_pod else hold.pods
        used[(hold.queue, card)] = before + hold.per_pod * hold.pods
        out.append(
            {
                "queue": hold.queue,
                "card": card,
                "pods": hold.pods,
                "within_deserved": within,
                "borrowing": hold.pods - within,
                "lenders": list(cohorts.lenders(state, hold.queue, card)) if hold.pods > within else [],
            }
        )
    return out


def _spread(state: ClusterState, request: Request, hold: Hold) -> list[dict[str, Any]]:
    """An ``A|B`` scale-up's hold: its pods on each model as the pod mutation would give them
    models (``assignment.spread``, one model a pod), told per model its queue lends and borrows."""
    if request.resource not in SCALED:
        return []
    template = workload_record(request.obj).tasks[0].template
    demand = pod_demand(template, state.inventory, state.policy)
    if not isinstance(demand, PodDemand) or demand.spec != hold.spec:
        return []
    out: list[dict[str, Any]] = []
    for card, pods in assignment.spread(state, hold.queue, template, demand, hold.pods, hold.key).items():
        found = cohorts.share(state, hold.queue, card)
        if found is None or not pods:
            continue
        per_pod = demand.count_on(card, state.inventory)
        room = max(0, found.deserved - cohorts.load(state, hold.queue, card, hold.key))
        within = min(pods, room // per_pod) if per_pod else pods
        out.append(
            {
                "queue": hold.queue,
                "card": card,
                "pods": pods,
                "within_deserved": within,
                "borrowing": pods - within,
                "lenders": list(cohorts.lenders(state, hold.queue, card)) if pods > within else [],
                "spec": hold.spec.text,
            }
        )
    return out


def _operation(
    state: ClusterState, resource: str, kind: str, namespace: str, name: str, obj: dict[str, Any]
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """CREATE, or UPDATE with the old object as the cluster holds it (replicas; a pod's or
    PodGroup's annotations, queue, phase), and the object as the request carries it."""
    if resource == "queues" and name in state.tree.queues:
        return "UPDATE", obj, obj
    if resource == "pods":
        return _pod_edit(state, namespace, name, obj)
    if resource == "podgroups":
        return _podgroup_edit(state, namespace, name, obj)
    workload = state.workloads.get(WORKLOADS[resource], namespace, name) if resource in WORKLOADS else None
    if workload is None:
        return "CREATE", {}, obj
    old = copy.deepcopy(obj)
    spec = _dict(old.get("spec"))
    if resource == "jobs":
        tasks = spec.get("tasks")
        for task, held in zip(tasks if isinstance(tasks, list) else [], workload.tasks, strict=False):
            if isinstance(task, dict):
                task["replicas"] = held.replicas
    else:
        spec["replicas"] = workload.replicas
    old["spec"] = spec
    return "UPDATE", old, obj


def _pod_edit(
    state: ClusterState, namespace: str, name: str, obj: dict[str, Any]
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    held = next((p for p in state.pods.values() if p.namespace == namespace and p.name == name), None)
    if held is None:
        return "CREATE", {}, obj
    server: dict[str, dict[str, Any]] = {
        "metadata": {"uid": held.uid},
        "spec": {"nodeName": held.node_name} if held.node_name else {},
        "status": {"phase": held.phase},
    }
    if held.waiting is not None:
        server["spec"]["schedulingGates"] = [{"name": keys.GATE}]
    new = _kept(obj, server)
    if new is None:  # a section that is not an object: the validation says what is wrong
        return "UPDATE", obj, obj
    old = copy.deepcopy(new)
    old["metadata"]["annotations"] = dict(held.template.annotations)
    old["spec"].update(server["spec"])
    return "UPDATE", old, new


def _podgroup_edit(
    state: ClusterState, namespace: str, name: str, obj: dict[str, Any]
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    held = state.podgroups.get(f"{namespace}/{name}")
    if held is None:
        return "CREATE", {}, obj
    new = _kept(obj, {"metadata": {"uid": held.uid}, "spec": {}, "status": {"phase": held.phase}})
    if new is None:
        return "UPDATE", obj, obj
    old = copy.deepcopy(new)
    old["metadata"]["annotations"] = dict(held.annotations)
    old["spec"].update(queue=held.queue, minResources=dict(held.min_resources), minMember=held.min_member)
    old["status"] = {"phase": held.phase}
    return "UPDATE", old, new


def _kept(obj: dict[str, Any], server: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """``obj`` with the server's fields (``server``: section -> fields) where it leaves them out;
    None when one of those sections is there but not an object."""
    new = copy.deepcopy(obj)
    for section, fields in server.items():
        part = new.setdefault(section, {})
        if part is None:
            part = new[section] = {}
        if not isinstance(part, dict):
            return None
        for key, value in fields.items():
            part.setdefault(key, value)
    return new


def _record(answer: Answer, decision: Decision) -> bool:
    """Fold one decision into the answer; True when it ends the object's story (a denial)."""
    match decision:
        case Denied(message=message):
            answer.allowed, answer.message = False, message
            return True
        case Allowed(reason=reason, patch=patch, warnings=warnings):
            answer.warnings += list(warnings)
            answer.patch += [dict(op) for op in patch]
            answer.message = f"{answer.message}; {reason}" if answer.message else reason
    return False


def table(answers: list[Answer]) -> str:
    lines: list[str] = []
    for a in answers:
        verdict = "NOT SENT" if not a.sent else ("ALLOWED" if a.allowed else "DENIED")
        lines.append(f"{a.target} ({a.operation}): {verdict}: {a.message}")
        lines += [f"  warning: {w}" for w in a.warnings]
        lines += [f"  patch: {orjson.dumps(op).decode()}" for op in a.patch]
        lines += [_lent_line(n) for n in a.lending]
    return "\n".join(lines)


def _lent_line(n: dict[str, Any]) -> str:
    lenders = n["lenders"]
    by = f" (lent by queue{'s' if len(lenders) > 1 else ''} {', '.join(repr(q) for q in lenders)})"
    lent = f"what its cohort lends now{by if lenders else ''}"
    if "spec" in n:  # an A|B scale-up's pods given this model
        told = (
            f"{n['pods']} of the {n['spec']} pods it adds {'go' if n['pods'] > 1 else 'goes'} on it,"
            f" {n['within_deserved']} of them within its deserved, {n['borrowing']} more with {lent}"
        )
    elif n["pods"] == 1:
        told = "the pod fits within its deserved" if n["within_deserved"] else f"the pod takes {lent}"
    else:
        told = (
            f"{n['within_deserved']} of the {n['pods']} pods it adds fit within its deserved,"
            f" {n['borrowing']} more with {lent}"
        )
    return f"  queue {n['queue']!r} on {n['card']}: {told}"


def as_json(answers: list[Answer]) -> bytes:
    return orjson.dumps([a.as_json() for a in answers], option=orjson.OPT_INDENT_2)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}

"""Mutations as RFC 6902 JSON Patches (SPEC §6b): never overwrite what the user set, idempotent."""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core.decide import decisions
from webhook.core.decide.assignment import assign_model
from webhook.core.index.state import ClusterState
from webhook.core.model import keys, shapes
from webhook.core.model.cards import UNIT, CardName, CardSpec, product_of
from webhook.core.model.demand import PodDemand, label_key_of, pod_demand
from webhook.core.model.objects import (
    OwnerRef,
    PodRecord,
    PodTemplate,
    WorkloadRecord,
    controller_of,
    mark_text,
    pod_record,
    pod_template_of,
    pod_waiting,
    reviewed_pod,
    reviewed_template,
    waiting_mark,
    workload_record,
)
from webhook.core.model.verdicts import WAITS, Allowed, Denied, Hold, PatchOp, Request

Raw = Mapping[str, Any]
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def pointer(*parts: str | int) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


_CARD_NAME_PATH = pointer("metadata", "annotations", keys.CARD_NAME)
_CARD_SPEC_PATH = pointer("metadata", "annotations", keys.CARD_SPEC)
_WAITING_PATH = pointer("metadata", "annotations", keys.WAITING)
# How old a new pod's waiting mark may be and still be the one an earlier pass of its own create's
# mutation wrote (a create's webhooks answer within seconds; the assignment's hold lasts as long).
_MARK_FRESH = 10.0


def pod_patch(state: ClusterState, request: Request, now: float) -> Allowed:
    """Canonical ``card.name`` and a required ``<product key> In [products]`` in every term; a
    multi-card pod is first assigned one model (SPEC §5b), held in the ledger until its validation.
    In wait mode a controller's pod that does not fit now is put under our scheduling gate instead
    (SPEC §5c), with its place; an ``A|B`` one keeps both models until it is released."""
    pod = request.obj
    template = request.template or reviewed_template(pod, request.namespace)
    demand = pod_demand(template, state.inventory, state.policy)
    if not isinstance(demand, PodDemand):
        return Allowed("not a card pod (or refused by validation)")
    gate = _gate_ops(state, request, template, now)
    chosen, dra = None, demand.only_claims
    if gate is not None:
        ops = [*_card_name_ops(template, demand.spec, dra=dra), *gate]
        if not dra:
            ops.extend(affinity_ops(pod.get("spec") or {}, _expression(state, demand.spec)))
        record = reviewed_pod(pod, request.namespace, template)
        return Allowed(
            "waits in its queue's line under our scheduling gate",
            patch=tuple(ops),
            card=demand.spec.text,
            gated=(record.owner.uid, record.own_name) if record.owner is not None else None,
        )
    if demand.spec.is_multi:
        record = reviewed_pod(pod, request.namespace, template)
        chosen = assign_model(state, record, demand)
    spec = CardSpec((chosen.card,)) if chosen else demand.spec
    ops = _card_name_ops(template, spec, assigned=chosen is not None, dra=dra)
    if chosen is not None:
        ops.append({"op": "add", "path": _CARD_SPEC_PATH, "value": demand.spec.text})
    if not dra:
        ops.extend(affinity_ops(pod.get("spec") or {}, _expression(state, spec)))
    if chosen is None:
        if dra:
            return Allowed(
                "its GPUs come through claims, pinned to its model when made",
                patch=tuple(ops),
                card=spec.text,
            )
        return Allowed("card pod confined to its models", patch=tuple(ops), card=spec.text)
    where = "a node has it free now" if chosen.free_now else "no node has it free now, the quota has room"
    key = f"assign:{request.uid}"
    hold = Hold(
        key,
        chosen.queue,
        spec,
        demand.count_on(chosen.card, state.inventory),
        1,
        assignment=True,
        covers=chosen.covers,
        task=chosen.task,
    )
    return Allowed(
        f"assigned {chosen.card} of {demand.spec.text} ({where})"
        + (", its claims pinned to it when made" if dra else " and confined to it"),
        patch=tuple(ops),
        hold=hold,
        queue=chosen.queue,
        card=spec.text,
    )


def _card_name_ops(
    template: PodTemplate, spec: CardSpec, assigned: bool = False, dra: bool = False
) -> list[PatchOp]:
    """The canonical ``card.name``; a pod whose claims (or DRA extended resources, ``dra``) name its
    model and that has none gets one only when the mutation assigned it one model of several
    (``assigned``)."""
    current = template.annotations.get(keys.CARD_NAME)
    if current is None and (template.claims or dra):  # a DRA pod's model is ours to write (SPEC §4b)
        current = template.annotations.get(keys.DRA_CARD)
        if current == spec.text or not assigned:
            return []
        ops: list[PatchOp] = (
            [] if template.annotations else [{"op": "add", "path": "/metadata/annotations", "value": {}}]
        )
        verb = "add" if current is None else "replace"
        return [
            *ops,
            {"op": verb, "path": pointer("metadata", "annotations", keys.DRA_CARD), "value": spec.text},
        ]
    if current == spec.text:
        return []
    return [{"op": "replace", "path": _CARD_NAME_PATH, "value": spec.text}]


def _gate_ops(
    state: ClusterState, request: Request, template: PodTemplate, now: float
) -> list[PatchOp] | None:
    """The ops that hold the pod under our gate with its waiting mark: those still missing when it
    carries the gate already (a second pass, or a template that sets it), None when it is not to
    wait (it fits, or it is refused whatever the mode)."""
    pod = request.obj
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if pod_waiting(gates, annotations) is None:
        if not state.policy.waiting_line or controller_of(pod) is None:
            return None
        record = reviewed_pod(pod, request.namespace, template)
        queue = state.queue_of_pod(record)
        if state.waiting.over_quota(queue) != "wait" or state.enforcement(queue) != "deny":
            return None  # deny mode, or a quota not enforced: validation alone decides
        decision = decisions.decide_pod_create(state, request, now)
        if not (isinstance(decision, Denied) and decision.cause == WAITS):
            return None
        ops: list[PatchOp] = [
            {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": keys.GATE}}
            if isinstance(gates, list)
            else {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": keys.GATE}]}
        ]
    else:
        ops = []
    priority = decisions.pod_priority(pod)
    found = waiting_mark(annotations.get(keys.WAITING))
    if found is None or not _ours(found, priority, now):
        verb = "add" if keys.WAITING not in annotations else "replace"
        ops.append({"op": verb, "path": _WAITING_PATH, "value": mark_text(now, priority)})
    return ops


def _ours(mark: tuple[float, int], priority: int, now: float) -> bool:
    """Whether a new pod's waiting mark is the one this mutation wrote in an earlier pass of the same
    create (moments ago, with the pod's own priority): anything else was written by someone else (a
    template or a hand-made pod claiming the head of the line) and is replaced."""
    since, marked = mark
    return marked == priority and now - _MARK_FRESH <= since <= now + 1.0


def release_patch(state: ClusterState, pod: Raw, card: CardName | None) -> list[PatchOp] | None:
    """The JSON Patch that releases a gated pod (the live object, ``pod``): our gate removed (tested
    first, with the version it was read at), and an ``A|B`` pod given ``card``: its ``card.name``,
    our note of what it asked for, and its affinity narrowed to that model, which Kubernetes allows
    in the update that removes a gate. None when it carries no gate of ours."""
    spec = pod.get("spec") or {}
    gates = spec.get("schedulingGates")
    index = (
        next(
            (i for i, g in enumerate(gates) if isinstance(g, Mapping) and g.get("name") == keys.GATE),
            None,
        )
        if isinstance(gates, list)
        else None
    )
    if index is None:
        return None
    version = (pod.get("metadata") or {}).get("resourceVersion")
    ops: list[PatchOp] = (
        [{"op": "test", "path": "/metadata/resourceVersion", "value": version}] if version else []
    )
    ops.append({"op": "test", "path": pointer("spec", "schedulingGates", index, "name"), "value": keys.GATE})
    ops.append({"op": "remove", "path": pointer("spec", "schedulingGates", index)})
    if card is not None:
        template = pod_template_of(pod)
        demand = pod_demand(template, state.inventory, state.policy)
        dra = isinstance(demand, PodDemand) and demand.only_claims
        ops.extend(_card_name_ops(template, CardSpec((card,)), dra=dra))
        if keys.CARD_SPEC not in template.annotations:
            asked = template.annotations.get(keys.CARD_NAME, "")
            ops.append({"op": "add", "path": _CARD_SPEC_PATH, "value": asked})
        if not dra:
            ops.extend(affinity_ops(spec, _expression(state, CardSpec((card,)))))
    return ops


def _expression(state: ClusterState, spec: CardSpec) -> dict[str, Any]:
    products = list(dict.fromkeys(product_of(card) for card in spec.cards))
    key = label_key_of(spec.cards[0], state.inventory, state.policy)
    return {"key": key, "operator": "In", "values": products}


def _has(term: Raw, expression: Raw) -> bool:
    return any(
        e.get("key") == expression["key"]
        and e.get("operator") == "In"
        and sorted(e.get("values") or []) == sorted(expression["values"])
        for e in term.get("matchExpressions") or []
    )


def affinity_ops(spec: Raw, expression: dict[str, Any]) -> list[PatchOp]:
    """AND ``expression`` into every required nodeSelectorTerm, creating what is missing."""
    affinity = spec.get("affinity")
    node_affinity = (affinity or {}).get("nodeAffinity")
    required = (node_affinity or {}).get(_REQUIRED)
    terms: Sequence[Raw] = (required or {}).get("nodeSelectorTerms") or []
    new_required = {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}
    if affinity is None:
        return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {_REQUIRED: new_required}}}]
    if node_affinity is None:
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {_REQUIRED: new_required}}]
    base = ("spec", "affinity", "nodeAffinity", _REQUIRED)
    if required is None:
        return [{"op": "add", "path": pointer(*base), "value": new_required}]
    if not terms:
        return [
            {
                "op": "add",
                "path": pointer(*base, "nodeSelectorTerms"),
                "value": new_required["nodeSelectorTerms"],
            }
        ]
    ops: list[PatchOp] = []
    for index, term in enumerate(terms):
        if _has(term, expression):
            continue
        if term.get("matchExpressions") is None:
            path = pointer(*base, "nodeSelectorTerms", index, "matchExpressions")
            ops.append({"op": "add", "path": path, "value": [expression]})
        else:
            path = pointer(*base, "nodeSelectorTerms", index, "matchExpressions", "-")
            ops.append({"op": "add", "path": path, "value": expression})
    return ops


Owner = WorkloadRecord | PodRecord


def resolve_owner(state: ClusterState, group: Raw) -> Owner | None:
    """The PodGroup's controlling owner from the cache (a pod of it for a batch Job)."""
    ref = controller_of(group)
    if ref is None:
        return None
    namespace = str((group.get("metadata") or {}).get("namespace") or "")
    if ref.kind == "Pod":
        return state.pods.get(ref.uid)
    workload = state.workloads.by_uid.get(ref.uid)
    if workload is not None:
        return workload
    if ref.kind == "Job" and not ref.api_version.startswith("batch.volcano.sh"):
        pods = state.pods_owned_by(ref.uid)
        return pods[0] if pods else None
    return state.workloads.get(ref.kind, namespace, ref.name)


FETCHABLE = frozenset({"Pod", "ReplicaSet", "StatefulSet", "Deployment", "Job"})


def owner_to_fetch(state: ClusterState, group: Raw) -> OwnerRef | None:
    """The controlling owner of a PodGroup being created when the cache does not hold it yet (the
    Volcano controller creates the PodGroup right after it sees the pod): the one live read allowed.
    A batch Job is not read: what the PodGroup needs is one of its pods."""
    ref = controller_of(group)
    if ref is None or ref.kind not in FETCHABLE or resolve_owner(state, group) is not None:
        return None
    if ref.kind == "Job" and not ref.api_version.startswith("batch.volcano.sh"):
        return None
    return ref


def owner_from(ref: OwnerRef, raw: Raw) -> Owner | None:
    """The owner's record from what the live read returned; None when it is not the same object."""
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping) or meta.get("uid") != ref.uid:
        return None
    body = {**raw, "kind": ref.kind}
    if shapes.problem("pods" if ref.kind == "Pod" else "deployments", "", body):
        return None
    return pod_record(body) if ref.kind == "Pod" else workload_record(body)


def podgroup_patch(state: ClusterState, group: Raw, owner: Owner | None) -> Allowed:
    """Copy ``card.name``, derive ``card.request``, set the service type; only where absent."""
    ref = controller_of(group)
    if ref is None:
        return Allowed("PodGroup has no controlling owner: left unchanged")
    if owner is None:
        return Allowed(f"owner {ref.kind.lower()} {ref.name} not found: PodGroup left unchanged")
    annotations = dict(((group.get("metadata") or {}).get("annotations")) or {})
    spec = group.get("spec") or {}
    wanted = _derived(state, owner, int(spec.get("minMember") or 1))
    if state.policy.service_type and (service := state.policy.service_type_by_kind.get(ref.kind)):
        wanted[keys.SERVICE_TYPE] = service
        chosen = annotations.get(keys.SERVICE_TYPE, service)
        if (preemptable := state.policy.preemptable_by_service_type.get(chosen)) is not None:
            wanted[keys.PREEMPTABLE] = preemptable
    missing = {k: v for k, v in wanted.items() if k not in annotations}
    if not missing:
        return Allowed("nothing to add")
    if "annotations" not in (group.get("metadata") or {}) or group["metadata"]["annotations"] is None:
        return Allowed(
            "annotations added", patch=({"op": "add", "path": "/metadata/annotations", "value": missing},)
        )
    ops = tuple(
        {"op": "add", "path": pointer("metadata", "annotations", k), "value": v} for k, v in missing.items()
    )
    return Allowed("annotations added", patch=ops)


def _derived(state: ClusterState, owner: Owner, min_member: int) -> dict[str, str]:
    if isinstance(owner, PodRecord):
        templates: list[tuple[PodTemplate, int]] = [(owner.template, min_member)]
    elif owner.kind == "Job":
        templates = [(task.template, task.replicas) for task in owner.tasks]
    else:
        templates = [(owner.tasks[0].template, min_member)]
    request: dict[str, int] = {}
    for template, pods in templates:
        demand = pod_demand(template, state.inventory, state.policy)
        if isinstance(demand, PodDemand):
            count = demand.count
            if isinstance(owner, PodRecord):  # shared claims paid by others
                count -= state.claims.unpaid(owner, demand)
            if count > 0:
                request[demand.spec.text] = request.get(demand.spec.text, 0) + count * pods
    out: dict[str, str] = {}
    if len(request) == 1:
        out[keys.CARD_NAME] = next(iter(request))
    if request:  # whole cards, as the plugin reads them
        cards = {spec: -(-count // UNIT) for spec, count in request.items()}
        out[keys.CARD_REQUEST] = json.dumps(cards, separators=(",", ":"))
    return out

"""The two entry points every front (CLI, server) calls: ``validate`` and ``mutate``, and
``admit`` to record what was really admitted. Routing by resource lives here and nowhere else."""

from typing import Any

from webhook.core.decide import (
    capability,
    claiming,
    decisions,
    enforcement,
    enqueue,
    patches,
    scaling,
    writes,
)
from webhook.core.index.state import ClusterState
from webhook.core.model import shapes
from webhook.core.model.ledger import Entry
from webhook.core.model.objects import PodTemplate, reviewed_template
from webhook.core.model.verdicts import Allowed, Borrowing, Decision, Denied, Hold, Request

VOLCANO_BATCH = "batch.volcano.sh"
# A multi-card pod's assignment waits for its validation, which follows its mutation within the same
# API request (webhook timeouts are seconds): one never validated (another webhook refused the pod)
# stops holding its card after this long, or the in-flight TTL if shorter.
ASSIGNMENT_TTL = 10.0
VOLCANO_SCHEDULING = "scheduling.volcano.sh"
DRA = "resource.k8s.io"

TOLD_BOUND = 10_000  # admissions on borrowed cards waiting for their Event at most


def pod_template(
    resource: str, sub_resource: str, operation: str, obj: Any, namespace: str
) -> PodTemplate | None:
    """The template of a review's pod, read once at the entry (every step then reads it): a pod
    create, update or resize whose shape the core can read; None for anything else. ``namespace``:
    the request's, where the pod is when its object names none."""
    if resource != "pods" or sub_resource not in ("", "resize") or operation not in ("CREATE", "UPDATE"):
        return None
    return None if shapes.problem("pods", sub_resource, obj) else reviewed_template(obj, namespace)


def validate(state: ClusterState, request: Request, now: float) -> Decision:
    """The validating webhook's decision on ``request``, as its queue enforces it (decisions.md §34)."""
    return enforcement.enforce(state, request, _validate(state, request, now))


def _validate(state: ClusterState, request: Request, now: float) -> Decision:
    state.inventory.devices.turn()
    state.expire(now)
    if request.operation == "DELETE":
        return Allowed("deletes are always allowed")
    if (malformed := _malformed(request)) is not None:
        return malformed
    resource, sub = request.resource, request.sub_resource
    if resource == "pods" and not sub and request.operation == "CREATE":
        return decisions.decide_pod_create(state, request, now)
    if resource == "pods" and not sub and request.operation == "UPDATE":
        return decisions.decide_pod_update(state, request)
    if resource == "pods" and sub == "resize" and request.operation == "UPDATE":
        return capability.decide_resize(state, request)
    if resource in scaling.SCALABLE and sub == "scale" and request.operation == "UPDATE":
        return scaling.decide_scale(state, request)
    if resource in scaling.SCALABLE and not sub and request.operation in ("CREATE", "UPDATE"):
        return scaling.validate_workload(state, request)
    if resource == "jobs" and request.group == VOLCANO_BATCH and request.operation in ("CREATE", "UPDATE"):
        return writes.decide_volcano_job(state, request)
    if resource == "podgroups" and request.group == VOLCANO_SCHEDULING and request.operation == "UPDATE":
        return enqueue.decide_enqueue(state, request, now)
    if resource == "podgroups" and request.group == VOLCANO_SCHEDULING and request.operation == "CREATE":
        return enqueue.decide_create(state, request)
    if resource == "resourceclaims" and request.group == DRA and request.operation == "CREATE" and not sub:
        return claiming.decide_claim_create(state, request)
    if (
        resource == "resourceclaims"
        and request.group == DRA
        and sub == "status"
        and request.operation == "UPDATE"
    ):
        return claiming.decide_allocation(state, request)
    if (
        resource == "queues"
        and request.group == VOLCANO_SCHEDULING
        and request.operation in ("CREATE", "UPDATE")
    ):
        return writes.decide_queue(state, request)
    return Allowed(f"{resource} {request.operation} is not checked")


def mutate(
    state: ClusterState, request: Request, owner: patches.Owner | None = None, now: float = 0.0
) -> Decision:
    """Pod CREATE: affinity and canonical card name, and in wait mode the scheduling gate of a
    controller's pod that does not fit now. PodGroup CREATE, and an UPDATE that enqueues one created
    without them (its create's mutation failed, and its policy is Ignore): annotations from its owner."""
    state.inventory.devices.turn()
    repair = request.operation == "UPDATE" and request.resource == "podgroups"
    if (request.operation != "CREATE" and not repair) or request.sub_resource:
        return Allowed("only creates, and PodGroup updates, are mutated")
    if (malformed := _malformed(request)) is not None:
        return malformed
    if request.resource == "pods":
        return patches.pod_patch(state, request, now)
    if request.resource == "resourceclaims" and request.group == DRA:
        return claiming.claim_patch(state, request)
    if request.resource == "podgroups" and request.group == VOLCANO_SCHEDULING:
        found = owner or patches.resolve_owner(state, request.obj)
        return patches.podgroup_patch(state, request.obj, found)
    return Allowed(f"{request.resource} is not mutated")


def _malformed(request: Request) -> Denied | None:
    """A denial naming the field the core cannot read, in the object or the old object."""
    for label, value in (("", request.obj), ("old ", request.old_obj)):
        if (label and not value) or (not label and request.template is not None):
            continue  # no old object; a pod read at the entry (``pod_template``), its shape checked then
        problem = shapes.problem(request.resource, request.sub_resource, value)
        if problem:
            sub = request.sub_resource
            what = f"{request.resource}/{sub}" if sub else (request.kind.lower() or request.resource)
            what = "volcano job" if request.group == VOLCANO_BATCH and not sub else what
            return Denied(f"{label}{what} {request.target} is malformed: {problem}")
    return None


def admit(state: ClusterState, request: Request, decision: Decision, now: float) -> None:
    """Record an admitted demand (or a mutation's assignment) in the in-flight ledger, and release
    what a denied pod's assignment held; dry runs leave no trace."""
    if request.dry_run:
        return
    if isinstance(decision, Denied):
        for key in decision.release:
            state.ledger.settle(key)
        if (join := decision.join) is not None:
            state.waiting.wait(join.uid, now, join.priority, join.group)
        if decision.podgroup:
            state.refusals[decision.podgroup] = decision.message  # told on the PodGroup and its job
        return
    if decision.would is not None and decision.would.involved and len(state.would_refuse) < TOLD_BOUND:
        state.would_refuse.append(decision.would)  # told by an Event
    if decision.marked and decision.borrowed and len(state.borrowings) < TOLD_BOUND:
        told = "; ".join(decision.warnings) if decision.told else ""  # by an Event: no kubectl printed it
        state.borrowings[decision.marked] = Borrowing(told, decision.borrowed, now)
    if decision.gated is not None:
        owner_uid, name = decision.gated
        state.waiting.gating(owner_uid, name, now + min(state.policy.in_flight_ttl, ASSIGNMENT_TTL))
    if decision.hold is None:
        return
    for hold in (decision.hold, *decision.more):
        _record(state, hold, now)


def _record(state: ClusterState, hold: Hold, now: float) -> None:
    for key in hold.transfer_from:
        state.ledger.settle(key)
    if hold.key in state.pods and not hold.key.startswith("scale:"):
        return
    ttl = state.policy.in_flight_ttl
    expires = now + (min(ttl, ASSIGNMENT_TTL) if hold.assignment else ttl)
    entry = Entry(
        hold.queue,
        hold.spec,
        hold.per_pod,
        hold.pods,
        expires,
        hold.cpu,
        hold.memory,
        hold.covers,
        hold.task,
        hold.demand,
        hold.charged,
        hold.transfer_from[0] if hold.transfer_from else "",
    )
    for claim in hold.claims:  # a claim by name it is charged for: its other pods are not
        state.claims.expect(claim, hold.queue, hold.key, expires)
    if hold.assignment:
        state.ledger.record_assignment(hold.key, entry)
    else:
        state.ledger.record(hold.key, entry)

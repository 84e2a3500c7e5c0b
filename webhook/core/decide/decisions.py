"""Validation decisions for every row of SPEC §6. Pure: state and request in, Decision out."""

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core.decide import capability, messages, reclaim_holds
from webhook.core.decide.constraints import contradiction
from webhook.core.index import cohorts, line
from webhook.core.index.charges import charge_edits
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage, tree_has_room, tree_usage
from webhook.core.index.waiting import scale_key
from webhook.core.model import keys, objects
from webhook.core.model.cards import UNIT, CardSpec, amount
from webhook.core.model.demand import BadDemand, NotCardPod, PodDemand, UnnamedCardPod, pod_demand
from webhook.core.model.feasibility import TooComplex
from webhook.core.model.ledger import Cover
from webhook.core.model.objects import PodRecord, PodTemplate, WorkloadRecord, reviewed_pod
from webhook.core.model.quota import AnnotationError, parse_card_request
from webhook.core.model.runqueue import misnamed
from webhook.core.model.verdicts import (
    TOO_COMPLEX,
    WAITS,
    Allowed,
    Borrowed,
    Decision,
    Denied,
    Hold,
    Join,
    Request,
)

CLOSED_STATES = frozenset({"Closed", "Closing"})
# the owners whose pods wait under our gate (wait mode): (kind, API group of apiVersion)
GATED_OWNERS = frozenset({("ReplicaSet", "apps"), ("StatefulSet", "apps"), ("Job", "batch")})


def decide_pod_create(state: ClusterState, request: Request, now: float) -> Decision:
    pod = reviewed_pod(request.obj, request.namespace, request.template)
    what = f"pod {pod.namespace}/{pod.name or request.name}"
    demand = state.demand_of(pod)
    runs = state.run_queue(pod.namespace, pod.template.annotations, pod.owner)
    queue = runs.queue
    match demand:
        case NotCardPod():
            named = misnamed(pod.template.annotations, runs)
            if named and state.compute_charged(pod.template) is not None:
                return Denied(messages.misnamed_queue(what, named, runs), queue=queue)
            return compute_only(state, pod.template, queue, what, pod.uid)
        case UnnamedCardPod(resource, count):
            return _unnamed(state, what, resource, count)
        case BadDemand(reason):
            return Denied(f"{what} {reason}")
        case PodDemand():
            pass
    if named := misnamed(pod.template.annotations, runs):
        taken = state.ledger.assignment(queue, demand.spec.cards[0], demand.count) if demand.origin else ""
        message = messages.misnamed_queue(what, named, runs)
        return Denied(message, queue=queue, card=demand.spec.text, release=(taken,) if taken else ())
    if demand.origin is not None:
        what += f" (assigned {demand.spec.text} of its {demand.origin.text})"
    problem = contradiction(state, pod.template, pod.node_name, demand.spec, what)
    if problem:
        return Denied(problem, card=demand.spec.text)
    paying: tuple[str, ...] = ()
    admitted = demand if demand.claims is not None else None  # what it is charged while it lives
    charged = tuple((k, v) for k in keys.CHARGED if (v := pod.template.annotations.get(k)) is not None)
    if demand.claims is not None:
        what += f" ({demand.claims.told})"
        unpaid = _unpaid(state, pod, queue, demand, what, now)
        if isinstance(unpaid, Allowed):  # it holds nothing, but is charged as admitted when it pays
            return replace(unpaid, hold=Hold(pod.uid, queue, None, 0, 1, demand=admitted, charged=charged))
        if not isinstance(unpaid, tuple):
            return unpaid
        demand, paying = unpaid
    if pod.group_name and (gave := reclaim_holds.holding(state, f"{pod.namespace}/{pod.group_name}", now)):
        message = messages.reclaimed(
            f"{what} of podgroup {pod.namespace}/{pod.group_name}",
            gave,
            reclaim_holds.unbound(state, gave),
            now,
            "its pods are not created again",
        )
        return Denied(message, queue=queue, card=demand.spec.text)
    if pod.waiting is not None:
        return _gated(state, pod, queue, demand, what)
    if (guard := reclaim_holds.guarding(state, queue, demand.spec.cards, now)) is not None:
        then = "its controller creates it again after that"
        message = messages.held_for_reclaim(
            what, queue, guard, reclaim_holds.unbound(state, guard), now, then
        )
        return Denied(message, queue=queue, card=demand.spec.text)
    # A pod the mutation assigned a model: its assignment is held in the ledger until now.
    taken = state.ledger.assignment(queue, demand.spec.cards[0], demand.count) if demand.origin else ""
    release = (taken,) if taken else ()
    refused = queue_refuses(state, queue, what, demand.spec, demand.count, pod.namespace)
    if refused is not None:
        return replace(refused, release=release)
    cpu, memory = state.compute_charged(pod.template) or (0, 0)
    hold = Hold(
        pod.uid,
        queue,
        demand.spec,
        demand.count,
        1,
        release,
        cpu,
        memory,
        claims=paying,
        demand=admitted,
        charged=charged,
    )
    if demand.origin and (task := volcano_task(state, pod)) is not None:
        hold = replace(hold, task=task[0])  # its siblings are given its model until the cache has it
    held = covering(state, pod, demand)
    if held is not None and held.origin == "reserved":
        over = capability.refuses(state, queue, what, cpu, memory)
        if over is not None:
            return replace(over, card=demand.spec.text, release=release)
        # Its cards are reserved already (CPU/memory is not): an assigned pod's model is held, out of
        # its PodGroup's flexible reservation; an unassigned pod holds no cards.
        if demand.origin:
            refused = _model_refuses(state, queue, what, demand, held, taken)
            if refused is not None:
                return replace(refused, release=release)
            hold = replace(hold, covers=held)
        elif demand.spec.is_multi:  # admitted with no model, the scheduler could bind it to any
            message = messages.unassigned_covered(what, demand.spec, "its PodGroup")
            return Denied(message, queue=queue, card=demand.spec.text)
        else:
            hold = replace(hold, spec=None, per_pod=0)
        return Allowed("covered by its PodGroup's reservation", hold=hold, queue=queue, card=demand.spec.text)
    if held is not None:
        if demand.spec.is_multi and demand.origin is None and not demand.only_claims:
            # Its mutation found no model (the cards freed between the two): admitted so, the
            # scheduler could bind it to a model past the quota. The scale-up keeps its cards.
            message = messages.unassigned_covered(what, demand.spec, "its workload's scale-up")
            return Denied(message, queue=queue, card=demand.spec.text, release=release)
        hold = replace(hold, transfer_from=(held.key, *release))
        return Allowed(
            "admitted under its workload's scale-up",
            hold=hold,
            queue=queue,
            card=demand.spec.text,
            marked=f"pod:{pod.key}",
            borrowed=borrowed_by(state, queue, demand.spec),  # its cards counted in its scale-up's
        )
    place = _place(state, pod, request.obj, now)
    ahead = state.line.ahead(queue, place)
    usage = queue_usage(state, queue, exclude_ledger=taken, ahead=ahead)
    try:
        fits = usage.fits(demand.spec, demand.count, 1)
    except TooComplex as error:
        return replace(too_complex(queue, what, demand.spec, demand.count, 1, error), release=release)
    if fits:
        above = ancestors_refuse(state, queue, demand.spec, demand.count, 1, what, taken)
        if above is not None:
            return replace(above, release=release, hold=hold)
        if demand.spec.is_multi and demand.origin is None:
            # No model had room at its mutation, some has now: admitted, it would run on no one model.
            message = messages.unassigned(what, demand.spec, queue)
            return _refused(state, pod, queue, demand, message, len(ahead), place, release, quota=False)
        over = capability.refuses(state, queue, what, cpu, memory)
        if over is not None:
            return replace(over, card=demand.spec.text, release=release)
        waiter = state.line.get(pod.owner.uid) if pod.owner is not None else None
        if waiter is not None and not waiter.pod:
            # Its controller waits in the line: this pod is one it waits for, counted out of it
            # until the cache sees it (a call now would hold cards for a pod already made).
            hold = replace(hold, transfer_from=(waiter.hold, *hold.transfer_from))
        warned = borrows(state, queue, demand.spec, demand.count, what)
        told = f"pod:{pod.key}" if warned and pod.owner is not None else ""  # a controller's pod
        return Allowed(
            "fits the queue's quota",
            warned,
            hold=hold,
            queue=queue,
            card=demand.spec.text,
            told=told,
            marked=f"pod:{pod.key}",
            borrowed=borrowed_by(state, queue, demand.spec, demand.count),
        )
    message = messages.no_room(usage, demand.spec, what, demand.count) + messages.ahead_in_line(ahead)
    return replace(_refused(state, pod, queue, demand, message, len(ahead), place, release), hold=hold)


def _unpaid(
    state: ClusterState, pod: PodRecord, queue: str, demand: PodDemand, what: str, now: float
) -> Decision | tuple[PodDemand, tuple[str, ...]]:
    """A claiming pod's demand less the claims by name another pod of its queue is charged for
    (SPEC §4b: a shared claim is charged once), and the claims it pays for itself; refused when
    that pod is another queue's."""
    count, paying = demand.count, []
    for key, units in demand.claims.named if demand.claims is not None else ():
        holder = state.claims.holder(key, pod.uid, now)
        if holder is None:
            paying.append(key)
            continue
        theirs, _, payer = holder
        if theirs != queue:
            return Denied(
                messages.claim_of_another_queue(what, key, payer, theirs, queue),
                queue=queue,
                card=demand.spec.text,
            )
        count -= units
    if count <= 0 and count != demand.count:
        return Allowed("its claims are charged already, to the pods it shares them with", queue=queue)
    return (demand if count == demand.count else replace(demand, count=count)), tuple(paying)


def _refused(
    state: ClusterState,
    pod: PodRecord,
    queue: str,
    demand: PodDemand,
    message: str,
    ahead: int,
    place: line.Place,
    release: tuple[str, ...],
    quota: bool = True,
) -> Denied:
    """A pod create refused for want of room (``quota``; else for want of a model): its controller
    joins the line (deny mode), or its next create waits under the gate (wait mode), and the message
    says which."""
    waits = _waits(state, pod, queue, demand)
    join, cause = None, ""
    if waits == "deny":
        join = Join(pod.owner.uid, -place[0])  # type: ignore[union-attr]
        message += messages.joins_line(ahead + 1, _surge_of(state, pod))
    elif waits == "wait":
        cause = WAITS
        message += messages.gated_next(ahead + 1)
    elif waits == "never":
        owner = state.workloads.by_uid[pod.owner.uid]  # type: ignore[union-attr]
        message += messages.never_whole(f"{owner.kind.lower()} {owner.key}", _missing(state, owner), demand)
        join = Join(owner.uid, -place[0])  # registered with its place, which it keeps out of the line
    return Denied(
        message, queue=queue, card=demand.spec.text, release=release, join=join, cause=cause, quota=quota
    )


def _gated(state: ClusterState, pod: PodRecord, queue: str, demand: PodDemand, what: str) -> Decision:
    """A pod created under our scheduling gate (wait mode, set by the pod mutation): it is charged
    nothing and waits in its queue's line, if it is a controller's pod that could ever fit."""
    refused = queue_refuses(state, queue, what, demand.spec, demand.count, pod.namespace)
    if refused is not None:
        return refused
    if not _may_wait(state, pod, queue, demand):
        return Denied(
            f"{what} carries the scheduling gate {keys.GATE}, which the webhook alone sets, on a pod"
            " of a ReplicaSet, StatefulSet or Job that fits its queue's whole quota; remove it from the"
            " pod (template)",
            queue=queue,
            card=demand.spec.text,
        )
    since, priority = pod.waiting or objects.BEHIND
    ahead = state.line.ahead(queue, line.place_of(priority, since, pod.uid))
    return Allowed(
        f"waits {line.ordinal(len(ahead) + 1)} in the queue's line under its scheduling gate",
        queue=queue,
        card=demand.spec.text,
    )


def decide_pod_update(state: ClusterState, request: Request) -> Decision:
    """Only the webhook removes its scheduling gate (SPEC §5c), and a card pod's charge is fixed
    while it lives (SPEC §4b): the registration sends a pod UPDATE here only when someone else
    removes the gate or edits an annotation the count reads."""
    old = reviewed_pod(request.old_obj, request.namespace)
    new = reviewed_pod(request.obj, request.namespace, request.template)
    if old.waiting is None or new.waiting is not None:
        return _charge_edit(state, old, new)
    waiter = state.line.get(old.uid)
    what = f"pod {old.namespace}/{old.name}"
    if waiter is None:
        where = "waits in its queue's line"
    else:
        place = state.line.line(waiter.queue).index(waiter) + 1
        where = (
            f'waits {line.ordinal(place)} in queue "{waiter.queue}"\'s line for'
            f" {amount(waiter.per_pod)} {waiter.spec.text}"
        )
    return Denied(
        f"{what} {where} under the scheduling gate {keys.GATE}; only the card-quota webhook removes"
        " it, the moment its cards free (delete the pod to leave the line)",
        queue=waiter.queue if waiter else "",
        card=waiter.spec.text if waiter else "",
    )


def _charge_edit(state: ClusterState, old: PodRecord, new: PodRecord) -> Decision:
    """An edit of a card pod's card or queue annotations (or of its PodGroup's name, once it has
    one) is refused: its charge could drop or move while it keeps its cards."""
    edited = charge_edits(old, new)
    if not edited:
        return _grouped(state, old, new)
    if old.phase in objects.TERMINAL_PHASES:
        return Allowed("the pod has finished: it is charged nothing")
    demand = state.demand_of(old)
    if isinstance(demand, NotCardPod) and isinstance(
        pod_demand(new.template, state.inventory, state.policy), NotCardPod
    ):
        return Allowed("not a card pod")
    queue = state.queue_of_pod(state.pods.get(old.uid) or old)
    charge = state.charged.charge(old.uid)
    if charge is not None:
        held = (
            f'is charged {amount(charge.count)} {charge.card or charge.spec.text} to queue "{charge.queue}"'
        )
    elif isinstance(demand, PodDemand):
        held = f'asks {amount(demand.count)} {demand.spec.text} of queue "{queue}"'
    else:
        held = f'is a card pod of queue "{queue}"'
    return Denied(
        messages.charge_fixed(f"pod {old.namespace}/{old.name}", edited, held),
        queue=charge.queue if charge is not None else queue,
        card=(charge.card or charge.spec.text) if charge is not None else "",
    )


def _grouped(state: ClusterState, old: PodRecord, new: PodRecord) -> Decision:
    """A pod given the name of its PodGroup (Volcano's PodGroup controller names it once, after the
    pod): Volcano runs it in that group's queue from then on, so the group must be in the queue the
    pod is charged to; one the cache does not hold yet passes (a group created later elsewhere is
    refused at its create)."""
    name = new.template.annotations.get(keys.GROUP_NAME)
    if not name or old.template.annotations.get(keys.GROUP_NAME) or old.phase in objects.TERMINAL_PHASES:
        return Allowed("no annotation the count reads is edited")
    group = state.podgroups.get(f"{new.namespace}/{name}")
    charge = state.charged.charge(old.uid)
    if group is None or charge is None or (group.queue or keys.DEFAULT_QUEUE) == charge.queue:
        return Allowed("its PodGroup is in the queue it is charged to")
    card, its = charge.card or charge.spec.text, group.queue or keys.DEFAULT_QUEUE
    return Denied(
        f"pod {old.namespace}/{old.name} is charged {amount(charge.count)} {card}"
        f' to queue "{charge.queue}", but podgroup {group.key} is in queue "{its}":'
        " naming it would move the pod's charge to a queue that never admitted it; name a PodGroup of"
        f' queue "{charge.queue}", or create the pod anew',
        queue=charge.queue,
        card=card,
    )


def _place(state: ClusterState, pod: PodRecord, obj: Mapping[str, Any], now: float) -> line.Place:
    """Where a pod create stands: its controller's place when that waits, else behind every waiter
    of its priority or higher that came before it."""
    waiter = state.line.get(pod.owner.uid) if pod.owner is not None else None
    if waiter is not None:
        return waiter.place
    return line.place_of(pod_priority(obj), now)


def pod_priority(obj: Mapping[str, Any]) -> int:
    """The pod's ``spec.priority`` (set from its PriorityClass before any webhook runs), else 0;
    held to the API's int32 range, as a waiting mark is read back."""
    spec = obj.get("spec")
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    return max(-(2**31), min(value, 2**31)) if type(value) is int else 0


def _waits(state: ClusterState, pod: PodRecord, queue: str, demand: PodDemand) -> str:
    """How a controller's pod that does not fit now waits (SPEC §5c): "deny" (a cached ReplicaSet's
    or StatefulSet's controller joins the line), "wait" (the pod is created under our gate), or ""
    (it is refused: the line is off, it is no controller's pod, or it could never fit), "never"
    (refused in no line: the pods its controller still wants could never all fit)."""
    if not state.policy.waiting_line or not _may_wait(state, pod, queue, demand):
        return ""
    if state.waiting.over_quota(queue) == "wait" and not _one_gated_already(state, pod):
        return "wait"
    owner = state.workloads.by_uid.get(pod.owner.uid) if pod.owner is not None else None
    if owner is None or owner.kind not in line.CALLED_KINDS:
        return ""
    return "deny" if ever_holds(state, queue, demand.spec, demand.count, _missing(state, owner)) else "never"


def _missing(state: ClusterState, workload: WorkloadRecord) -> int:
    """How many pods ``workload`` still wants (at least the one being created): what its place in
    the line waits for, so what the line would hold ahead of everyone behind it."""
    return max(1, workload.replicas - state.live_pods_of(workload))


def _one_gated_already(state: ClusterState, pod: PodRecord) -> bool:
    """A Volcano pod that a gate would make reserve cards in the capacity-card plugin's enqueue
    check; it is refused instead, and its controller waits in the line (deny mode's way):

    * its workload has an unbound pod already (gated, or released and pending) and no PodGroup
      enqueued yet: the plugin enqueues a PodGroup only when every pod of it fits, gated ones
      included (``capacity_card_job.go``: its request sums every task), so a second gated pod
      would keep the first from running once released (a pod another mutation gated that the
      cache has not seen yet counts too: creates come back to back);
    * its workload's PodGroup is enqueued: the plugin counts what an enqueued group's pods request
      beyond what it has allocated as reserved, gated pods included (it deducts gated pods under
      ``nvidia.com/gpu`` but reserves by card name), so a gated pod there would keep another
      workload's group, released ahead of it in the line, from being enqueued."""
    if pod.owner is None or pod.template.scheduler not in state.policy.volcano_schedulers:
        return False
    owner = pod.owner.uid
    return (
        state.groups.enqueued(owner)
        or state.groups.unenqueued_pods(owner) > 0
        or state.waiting.gated_in_flight(owner, pod.own_name)
    )


def _may_wait(state: ClusterState, pod: PodRecord, queue: str, demand: PodDemand) -> bool:
    """A pod of a ReplicaSet, StatefulSet or batch Job whose pods could fit its queue's whole quota
    and every ancestor's (waiting would otherwise be forever)."""
    owner = pod.owner
    if owner is None or (owner.kind, owner.api_version.split("/")[0]) not in GATED_OWNERS:
        return False
    return ever_fits(state, queue, demand.spec, demand.count)


def ever_holds(state: ClusterState, queue: str, spec: CardSpec, per_pod: int, pods: int) -> bool:
    """Whether ``pods`` pods of ``per_pod`` units of ``spec`` could all fit the whole quota of
    ``queue`` and of every ancestor that limits its cards at once: each pod whole on one of its
    cards, the pods of an ``A|B`` spec spread over its models (a workload's pods are assigned one by
    one). False: the line would hold them forever, ahead of everyone behind."""
    return state.tree.ever_holds(queue, spec.cards, per_pod, pods)


def ever_fits(state: ClusterState, queue: str, spec: CardSpec, count: int) -> bool:
    """Whether ``count`` units of ``spec`` (whole, on one of its cards) could fit the whole quota of
    ``queue`` and of every ancestor that limits its cards: waiting for more would be forever."""
    return queue not in state.tree.queues or state.tree.ever_holds(queue, spec.cards, count, 1)


def _surge_of(state: ClusterState, pod: PodRecord) -> str:
    """The Deployment whose rolling update the pod is a surge pod of, or ""."""
    workload = state.workload_of(pod)
    if workload is None or workload.kind != "Deployment":
        return ""
    return workload.key if state.live_pods_of(workload) >= workload.replicas else ""


def volcano_task(state: ClusterState, pod: PodRecord) -> tuple[str, int] | None:
    """A Volcano Job pod's task, as ``("<job uid>/<task>", replicas)``. The real scheduler treats
    the pods of one task as alike (a predicate failure of one is cached for all), so they must all
    be assigned one model."""
    task = pod.template.annotations.get(keys.TASK_SPEC)
    owner = pod.owner
    if (
        not task
        or owner is None
        or owner.kind != "Job"
        or not owner.api_version.startswith("batch.volcano.sh")
    ):
        return None
    job = state.workloads.by_uid.get(owner.uid)
    replicas = next((t.replicas for t in job.tasks if t.name == task), 1) if job else 1
    return f"{owner.uid}/{task}", max(1, replicas)


def _model_refuses(
    state: ClusterState, queue: str, what: str, demand: PodDemand, held: Cover, taken: str
) -> Denied | None:
    """An assigned pod its PodGroup's reservation covers: the reservation holds cards of the spec it
    asked, not of the model it was given, so that model's quota (and every ancestor's) must hold it
    beside all else, the reservation's cards this pod takes over left out."""
    usage = queue_usage(state, queue, exclude_ledger=taken).without(held)
    try:
        fits = usage.fits(demand.spec, demand.count, 1)
    except TooComplex as error:
        return too_complex(queue, what, demand.spec, demand.count, 1, error)
    if not fits:
        message = messages.reserved_elsewhere(usage, what, demand.spec.cards[0], demand.count)
        return Denied(message, queue=queue, card=demand.spec.text)
    return ancestors_refuse(state, queue, demand.spec, demand.count, 1, what, taken, less=held)


def covering(state: ClusterState, pod: PodRecord, demand: PodDemand) -> Cover | None:
    """What already holds this pod's cards: its PodGroup's reservation (cards of size 1), or one pod
    of its workload's scale-up in flight."""
    if _covered_by_podgroup(state, pod, demand):
        return Cover(demand.asked, UNIT, -(-demand.count // UNIT), "reserved")
    workload = state.workload_of(pod)
    if workload is not None:
        key = scale_key(workload)
        entry = state.ledger.get(key)
        asked = demand.asked_count(state.inventory)
        if entry and entry.pods > 0 and entry.spec == demand.asked and entry.per_pod == asked:
            return Cover(entry.spec, entry.per_pod, 1, "in flight", key)
    return None


def compute_only(
    state: ClusterState,
    template: PodTemplate,
    queue: str,
    what: str,
    key: str,
    pods: int = 1,
    unchecked: str = "not a card pod",
) -> Decision:
    """A pod (``key`` its uid) or a scale-up (``key`` its ledger key) that uses no card: only the
    optional CPU/memory check has a say."""
    charged = state.compute_charged(template)
    if charged is None:
        return Allowed(unchecked)
    over = capability.refuses(state, queue, what, *charged, pods, exclude=key)
    if over is not None:
        return over
    hold = Hold(key, queue, None, 0, pods, cpu=charged[0], memory=charged[1])
    return Allowed("fits the queue's capability", hold=hold, queue=queue)


def too_complex(queue: str, what: str, spec: CardSpec, per_pod: int, pods: int, error: TooComplex) -> Denied:
    """The exact check gave up at its guard: fail closed, and say so."""
    each = f"{amount(per_pod)} {spec.text}"
    need = f"{pods} pods of {each} each" if pods > 1 else each
    message = messages.too_complex(queue, what, need, error)
    return Denied(message, queue=queue, card=spec.text, cause=TOO_COMPLEX)


def _unnamed(state: ClusterState, what: str, resource: str, count: int) -> Decision:
    models = state.inventory.cards_of_resource(resource)
    example = f", one of: {', '.join(models)}" if models else ""
    text = (
        f"{what} requests {count} {resource} but has no {keys.CARD_NAME} annotation, so it would"
        f" escape per-model quota; name the card model{example}"
    )
    if state.policy.unnamed_card_pods == "warn":
        return Allowed("unnamed card pod allowed by policy", warnings=(text,))
    return Denied(text)


def queue_refuses(
    state: ClusterState, queue: str, what: str, spec: CardSpec, count: int, namespace: str = ""
) -> Denied | None:
    """Why ``queue`` admits nothing of ``what`` (asking ``count`` of ``spec``): it does not exist,
    is closed, has no card quota, or may not be used from ``namespace`` (its
    ``cardquota.volcano.sh/namespaces``); None when none of these holds."""
    info = state.tree.queues.get(queue)
    if info is None:
        return Denied(
            f'queue "{queue}" does not exist; {what} needs {amount(count)} {spec.text}'
            f" (set {keys.QUEUE_NAME} to an existing queue)",
            queue=queue,
            card=spec.text,
        )
    if info.record.state in CLOSED_STATES:
        return Denied(
            f'queue "{queue}" is {info.record.state} and admits no new pods;'
            f" {what} needs {amount(count)} {spec.text}",
            queue=queue,
            card=spec.text,
        )
    if info.quota is None:
        return Denied(messages.no_quota_annotation(queue, what, spec, count), queue=queue, card=spec.text)
    if namespace and (why := state.queue_refuses_namespace(queue, namespace)):
        needs = f"needs {amount(count)} {spec.text}"
        return Denied(messages.closed_to(queue, namespace, why, what, needs), queue=queue, card=spec.text)
    return None


def _covered_by_podgroup(state: ClusterState, pod: PodRecord, demand: PodDemand) -> bool:
    """A Volcano-gated pod: its own PodGroup (same controlling owner) still reserves its cards."""
    if not pod.group_name or pod.owner is None:
        return False
    group = state.podgroups.get(f"{pod.namespace}/{pod.group_name}")
    if group is None or group.phase not in ("Inqueue", "Running") or group.owner is None:
        return False
    if group.owner.uid != pod.owner.uid:
        return False
    asked = state.group_request(group).get(demand.asked, 0)
    others = state.charged.group_demand(group.key).get(demand.asked, 0)
    charge = state.charged.charge(pod.uid)
    if charge is not None and charge.group == group.key:
        others -= charge.count
    return asked - others >= demand.count


def ancestors_refuse(
    state: ClusterState,
    queue: str,
    spec: CardSpec,
    per_pod: int,
    pods: int,
    what: str,
    exclude: str = "",
    less: Cover | None = None,
) -> Denied | None:
    """Hierarchical queues: the demand must also fit every ancestor whose card quota names all of
    ``spec``'s cards, counting the ancestor's whole subtree. An ancestor whose quota leaves a card
    out does not limit that card (a parent need not list every model its children use)."""
    cards = spec.cards
    for ancestor in state.tree.ancestors.get(queue, ()):
        quota = state.tree.queues[ancestor].quota
        if not quota or (cards[0] not in quota if len(cards) == 1 else not quota.keys() >= set(cards)):
            continue
        if tree_has_room(state, ancestor, quota, spec, per_pod * pods, exclude):
            continue
        usage = tree_usage(state, ancestor, exclude)
        if less is not None:
            usage = usage.without(less)
        try:
            fits = usage.fits(spec, per_pod, pods)
        except TooComplex as error:
            return too_complex(ancestor, what, spec, per_pod, pods, error)
        if not fits:
            message = messages.no_room(usage, spec, what, per_pod, pods, below=queue)
            return Denied(message, queue=ancestor, card=spec.text, quota=True)
    return None


def annotation_problem(
    state: ClusterState, annotations: Mapping[str, str], templates: Iterable[PodTemplate], what: str
) -> str:
    """Why a workload's ``card.request`` or a pod template's ``card.name`` is malformed, or ""."""
    text = annotations.get(keys.CARD_REQUEST)
    if text is not None:
        try:
            parse_card_request(keys.CARD_REQUEST, text)
        except AnnotationError as exc:
            return f"{what} has a malformed {exc}"
    for template in templates:
        demand = pod_demand(template, state.inventory, state.policy)
        if isinstance(demand, BadDemand):
            return f"{what}: its pod template {demand.reason}"
    return ""


def borrows(state: ClusterState, queue: str, spec: CardSpec, count: int, what: str) -> tuple[str, ...]:
    """The warning of an admission that takes ``count`` cards of ``spec``'s one model beyond its
    queue's deserved, on cards its cohort lends (decisions.md §33); none inside it, or for a wall."""
    if spec.is_multi:
        return ()
    beyond, lenders = cohorts.borrowing(state, queue, spec.cards[0], count)
    if not beyond:
        return ()
    info = state.tree.queues[queue]
    deserved = info.lending.deserved[spec.cards[0]] if info.lending is not None else 0
    return (messages.borrowed(what, spec.cards[0], beyond, deserved, lenders),)


def borrowed_by(state: ClusterState, queue: str, spec: CardSpec, more: int = 0) -> tuple[Borrowed, ...]:
    """The borrowing mark of an admission of ``spec``'s one model in ``queue`` with ``more`` of its
    cards not yet in the queue's load: the queue's use past its deserved, this admission counted,
    and its lenders; () inside its deserved, or for a wall (decisions.md §33)."""
    if spec.is_multi:
        return ()
    card = spec.cards[0]
    past = cohorts.beyond(state, queue, card, more)
    if not past:
        return ()
    info = state.tree.queues[queue]
    deserved = info.lending.deserved[card] if info.lending is not None else 0
    return (Borrowed(card, past, deserved, cohorts.lenders(state, queue, card)),)

"""The enqueue gate (SPEC §5d): a PodGroup's move to Inqueue, checked as the capacity-card plugin
checks it, so that stock Volcano (no card plugin) cannot enqueue a job past its queue's card quota.

Volcano's scheduler writes the phase with a plain UPDATE of the PodGroup, and its job controller
creates a job's pods only once the phase is Inqueue. The move is allowed when the cards the group
asks for beyond what its pods hold already (what it would reserve once enqueued) fit what is left of
its queue, after what waits ahead in the queue's line, and of every ancestor. Like the plugin
(``capacity_card_fn_job_enqueueable.go``: a job's ``card.request`` is checked whole, and an ``A|B``
key must fit one of its cards alone), an ``A|B`` request is judged whole on one alternative. A group
refused takes its place in the line; the scheduler retries every period, and a call holds the cards
it waits for until then.
"""

from dataclasses import replace

from webhook.core.decide import messages, reclaim_holds
from webhook.core.decide.decisions import (
    ancestors_refuse,
    borrowed_by,
    borrows,
    ever_fits,
    queue_refuses,
    too_complex,
)
from webhook.core.index import line
from webhook.core.index.groups import ENQUEUED_WITH, enqueue_key
from webhook.core.index.reservations import RESERVING_PHASES, asks_more
from webhook.core.index.state import ClusterState
from webhook.core.index.tally import Charge
from webhook.core.index.usage import QueueUsage, queue_usage, tree_usage
from webhook.core.model import keys
from webhook.core.model.cards import CardSpec, amount
from webhook.core.model.feasibility import TooComplex
from webhook.core.model.objects import PodGroupRecord, podgroup_record
from webhook.core.model.quoting import shorten
from webhook.core.model.verdicts import ENQUEUE, Allowed, Decision, Denied, Hold, Join, Request


def decide_enqueue(state: ClusterState, request: Request, now: float) -> Decision:
    """A PodGroup UPDATE: the gate applies only to a move into Inqueue (or Running) from a phase that
    reserves nothing."""
    group = podgroup_record(request.obj)
    old = podgroup_record(request.old_obj) if request.old_obj else None
    if not group.namespace or group.namespace == "default":
        group = replace(group, namespace=request.namespace or group.namespace)
    if old is not None and (old.queue or keys.DEFAULT_QUEUE) != (group.queue or keys.DEFAULT_QUEUE):
        moved = _charged_elsewhere(state, group, group.queue or keys.DEFAULT_QUEUE)
        if moved:
            return _moves_charge(state, group, moved, "cannot move to")
    if old is not None and old.phase in RESERVING_PHASES:
        return _edit(state, old, group)
    if group.phase not in RESERVING_PHASES:
        return Allowed("not an enqueue")
    taken = reclaim_holds.holding(state, group.key, now)
    if taken is not None:
        message = messages.reclaimed(
            describe(group), taken, reclaim_holds.unbound(state, taken), now, "it stays Pending"
        )
        return Denied(
            message + ", then is enqueued as its quota allows",
            queue=group.queue or keys.DEFAULT_QUEUE,
            card=taken.card,
            cause=ENQUEUE,
            podgroup=group.key,
        )
    rest = state.groups.unreserved(group)
    if not rest:
        return Allowed("its pods hold every card it asks for")
    queue = group.queue or keys.DEFAULT_QUEUE
    what = describe(group)
    guard = reclaim_holds.guarding(state, queue, {card for spec in rest for card in spec.cards}, now)
    if guard is not None:
        then = "it stays Pending, then is enqueued as its quota allows"
        return Denied(
            messages.held_for_reclaim(what, queue, guard, reclaim_holds.unbound(state, guard), now, then),
            queue=queue,
            card=guard.card,
            cause=ENQUEUE,
            podgroup=group.key,
        )
    waiter = state.line.get(group.uid)
    ahead = state.line.ahead(queue, waiter.place if waiter else line.place_of(0, now, group.uid))
    usage = queue_usage(state, queue, exclude_ledger=enqueue_key(group.uid, 0), ahead=ahead)
    holds: list[Hold] = []
    for index, (spec, count) in enumerate(rest.items()):
        refused = queue_refuses(state, queue, what, spec, count, group.namespace)
        if refused is not None:
            join = Join(group.uid, 0, group.key)
            return replace(
                refused, message=refused.message + _stays(group), join=join, cause=ENQUEUE, podgroup=group.key
            )
        try:
            fits = usage.fits(spec, count, 1)
        except TooComplex as error:
            return too_complex(queue, what, spec, count, 1, error)
        if not fits and not ever_fits(state, queue, spec, count):
            return _never(queue, spec, group, messages.no_room(usage, spec, what, count) + " to be enqueued")
        if not fits:
            place = line.ordinal(len(ahead) + 1)
            message = (
                messages.no_room(usage, spec, what, count)
                + " to be enqueued"
                + messages.ahead_in_line(ahead)
                + f"; it waits {place} in the queue's line"
                + _stays(group)
            )
            return Denied(
                message,
                queue=queue,
                card=spec.text,
                join=Join(group.uid, 0, group.key),
                cause=ENQUEUE,
                podgroup=group.key,
                quota=True,
            )
        key = enqueue_key(group.uid, index)
        above = ancestors_refuse(state, queue, spec, count, 1, what, key)
        if above is not None:
            stays = _stays(group)
            return replace(
                above,
                message=above.message + stays,
                join=Join(group.uid, 0, group.key),
                cause=ENQUEUE,
                podgroup=group.key,
            )
        apart = _on_no_one_model(state, queue, usage, spec, count, what, key) if spec.is_multi else ""
        if apart and not ever_fits(state, queue, spec, count):
            return _never(queue, spec, group, apart)
        if apart:
            join = Join(group.uid, 0, group.key)
            message = apart + _stays(group)
            return Denied(
                message, queue=queue, card=spec.text, join=join, cause=ENQUEUE, podgroup=group.key, quota=True
            )
        usage = usage.plus(spec, count)
        holds.append(Hold(key, queue, spec, count, 1))
    text = ", ".join(f"{amount(count)} {spec.text}" for spec, count in rest.items())
    warned = tuple(w for spec, count in rest.items() for w in borrows(state, queue, spec, count, what))
    return Allowed(
        f"enqueued: {text} fit its queue",
        warned,
        hold=holds[0],
        more=tuple(holds[1:]),
        queue=queue,
        card=next(iter(rest)).text,
        told=f"podgroup:{group.key}" if warned else "",
        marked=f"podgroup:{group.key}",
        borrowed=tuple(b for spec, count in rest.items() for b in borrowed_by(state, queue, spec, count)),
    )


def _never(queue: str, spec: CardSpec, group: PodGroupRecord, why: str) -> Denied:
    """A refusal at enqueue that no wait ends: the whole quota does not hold the request."""
    return Denied(
        f"{why}: more than the whole quota of its queue (or of an ancestor) holds, so it stays"
        " Pending, in no line, until the quota is raised or the job asks for less",
        queue=queue,
        card=spec.text,
        cause=ENQUEUE,
        podgroup=group.key,
        quota=True,
    )


def _on_no_one_model(
    state: ClusterState, queue: str, usage: QueueUsage, spec: CardSpec, count: int, what: str, key: str
) -> str:
    """Why an ``A|B`` request that its queue and each ancestor hold whole on some model, each on its
    own, has no one model that all of them hold it on (its pods are all given one, SPEC §5b); ""
    when it has."""
    above = [
        name
        for name in state.tree.ancestors.get(queue, ())
        if (quota := state.tree.queues[name].quota) and quota.keys() & set(spec.cards)
    ]
    if not above:
        return ""  # the queue alone: its own check was the whole one
    for card in spec.cards:
        one = CardSpec((card,))
        try:
            if usage.fits(one, count, 1) and ancestors_refuse(state, queue, one, count, 1, what, key) is None:
                return ""
        except TooComplex:
            continue  # no answer for this model: another may hold it; else refused, as not held
    levels = [(f'queue "{queue}"', usage)] + [(f'"{name}"', tree_usage(state, name, key)) for name in above]
    return messages.on_no_one_model(spec, count, what, levels)


def decide_create(state: ClusterState, request: Request) -> Decision:
    """A PodGroup is created Pending (or with no status): only the scheduler enqueues one, through
    the gate. A group created Inqueue or Running would reserve cards, and cover its pods, that no
    check ever admitted (the PodGroup CRD has no status subresource, so a create can set it)."""
    group = podgroup_record(request.obj)
    if not group.namespace or group.namespace == "default":
        group = replace(group, namespace=request.namespace or group.namespace)
    queue, asked = group.queue or keys.DEFAULT_QUEUE, state.group_request(group)
    why = state.queue_refuses_namespace(queue, group.namespace) if asked else ""
    if why:
        needs = f"asks {_listed(asked)}"
        card = next(iter(asked)).text
        return Denied(
            messages.closed_to(queue, group.namespace, why, describe(group), needs), queue=queue, card=card
        )
    moved = _charged_elsewhere(state, group, queue)
    if moved:
        return _moves_charge(state, group, moved, "is created in")
    if group.phase == "Pending":
        return Allowed("a PodGroup created Pending reserves nothing until it is enqueued")
    return Denied(
        f"{describe(group)} is created in phase {shorten(group.phase)}, asking {_listed(asked)} of queue"
        f' "{queue}": a PodGroup is created Pending (or with no status) and only the scheduler enqueues'
        " it, through the card quota's enqueue gate; create it without status.phase",
        queue=queue,
        card=next(iter(asked)).text if asked else "",
    )


def _charged_elsewhere(state: ClusterState, group: PodGroupRecord, queue: str) -> tuple[str, Charge] | None:
    """A live pod that already names ``group`` and is charged to another queue than ``queue``: the
    group's create would move its charge where no check admitted it (its pods run in its queue)."""
    for uid in sorted(state.charged.in_group(group.key)):
        charge = state.charged.charge(uid)
        if charge is not None and charge.queue != queue:
            return uid, charge
    return None


def _moves_charge(state: ClusterState, group: PodGroupRecord, moved: tuple[str, Charge], how: str) -> Denied:
    uid, charge = moved
    pod, queue = state.pods[uid], group.queue or keys.DEFAULT_QUEUE
    return Denied(
        f'{describe(group)} {how} queue "{queue}", but its pod {pod.namespace}/{pod.name} is charged'
        f' {amount(charge.count)} {charge.spec.text} to queue "{charge.queue}", which admitted it: Volcano'
        f" would run it in the PodGroup's queue, which never did; keep the PodGroup in queue"
        f' "{charge.queue}", or create its pods anew',
        queue=queue,
        card=charge.spec.text,
    )


def _edit(state: ClusterState, old: PodGroupRecord, group: PodGroupRecord) -> Decision:
    """An enqueued PodGroup's reservation was admitted at its enqueue: an edit that would have it
    reserve more, another model or in another queue, or that removes the card annotations it was
    enqueued with, is refused (SPEC §4b); less passes."""
    was, now = state.group_request(old), state.group_request(group)
    queue, moved_to = old.queue or keys.DEFAULT_QUEUE, group.queue or keys.DEFAULT_QUEUE
    removed = [k for k in sorted(ENQUEUED_WITH) if old.annotations.get(k) and not group.annotations.get(k)]
    if not removed and not asks_more(was, now, moved_to != queue):
        return Allowed("an enqueued PodGroup's request is not raised")
    if removed:
        change = f"lose its {' and '.join(removed)} annotation{'s' if len(removed) > 1 else ''}"
    elif moved_to != queue:
        change = f'move to queue "{moved_to}"'
    else:
        change = f"ask {_listed(now)}"
    return Denied(
        f'{describe(group)} was enqueued in queue "{queue}" with {_listed(was)}: it cannot {change}'
        f" while it is {old.phase} (its reservation was admitted at its enqueue);"
        f" {'keep it' if removed else 'lower it'}, or delete the job and create it anew",
        queue=queue,
        card=next(iter(now or was)).text if now or was else "",
    )


def _listed(request: dict[CardSpec, int]) -> str:
    return ", ".join(f"{amount(count)} {spec.text}" for spec, count in request.items()) or "no card"


def describe(group: PodGroupRecord) -> str:
    """``podgroup ns/name`` and, when it has one, its owner: ``(volcano job ns/train)``."""
    text = f"podgroup {group.namespace}/{group.name}"
    owner = group.owner
    if owner is not None and owner.kind == "Job" and owner.api_version.startswith("batch.volcano.sh"):
        return f"{text} (volcano job {group.namespace}/{owner.name})"
    if owner is not None:
        return f"{text} ({owner.kind.lower()} {group.namespace}/{owner.name})"
    return text


def _stays(group: PodGroupRecord) -> str:
    owner = group.owner
    if owner is not None and owner.kind == "Job" and owner.api_version.startswith("batch.volcano.sh"):
        return "; it stays Pending, none of its pods created, and is enqueued the moment its cards free"
    return "; it stays Pending and is enqueued the moment its cards free"

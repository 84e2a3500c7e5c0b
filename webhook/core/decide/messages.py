"""The one-line texts people read in kubectl, ReplicaSet and HPA events. Only the target queue's
numbers ever appear: never another tenant's."""

from collections.abc import Sequence

from webhook.core.index.line import Waiter, ordinal
from webhook.core.index.usage import CardUse, QueueUsage
from webhook.core.model.cards import CardName, CardSpec, amount
from webhook.core.model.demand import PodDemand
from webhook.core.model.feasibility import TooComplex
from webhook.core.model.keys import QUEUE_NAME
from webhook.core.model.reclaim import Taken
from webhook.core.model.runqueue import JOB, PODGROUP, RunQueue


def charge_fixed(what: str, edited: Sequence[str], held: str) -> str:
    """Why an edit of what a live pod's charge is read from is refused."""
    names = ", ".join(edited)
    return (
        f"{what} {held}: {names} cannot change while the pod lives (its charge would drop or move"
        " while it keeps its cards); delete the pod and create it anew to change its card or queue"
    )


def breakdown(use: CardUse) -> str:
    parts = [
        f"{amount(n)} {label}"
        for n, label in (
            (use.bound, "running"),
            (use.pending, "pending"),
            (use.reserved, "reserved by PodGroups"),
            (use.in_flight, "admitted, not yet seen"),
            (use.waiting, "waiting ahead in line"),
        )
        if n
    ]
    quota = f"quota {amount(use.quota)}"
    if use.share is not None:  # lent and borrowed in its cohort: what it may use now, and why
        quota = (
            f"deserved {amount(use.share.deserved)} and {amount(use.share.borrowable)} idle in its cohort"
            f" to borrow, quota {amount(use.share.quota)}"
        )
    return f"{quota}: {', '.join(parts)}" if parts else quota


def left_of(usage: QueueUsage, card: CardName) -> str:
    """``1 NVIDIA-H200 left (quota 3: 1 running, 1 pending)``, or why there is none at all."""
    if card not in usage.quota:
        return f"no {card} quota"
    use = usage.card(card)
    return f"{amount(use.left)} {card} left ({breakdown(use)})"


def no_room(
    usage: QueueUsage, spec: CardSpec, what: str, per_pod: int, pods: int = 1, below: str = ""
) -> str:
    """Why ``pods`` pods of ``spec`` do not fit; ``what`` names the object; ``below`` names the
    queue it asked for when ``usage`` is an ancestor's (its whole subtree's)."""
    text = _no_room(usage, spec, what, per_pod, pods, below)
    if usage.has_line:
        return text  # the line's own remark says what waits
    try:
        waiting = usage.backlog(spec)
    except TooComplex:
        waiting = False  # only a remark: never worth a slow or failed message
    if waiting:
        text += f'; queue "{usage.queue}" already has more demand for these cards than quota: new pods wait'
    return text


def not_together(
    queue: str, above: Sequence[str], spread: dict[CardName, int], demand: PodDemand, pods: int, what: str
) -> str:
    """Why ``pods`` pods of a multi-card ``demand`` that each of ``queue`` and ``above`` holds on its
    own do not fit: ``spread``, the pods per model all of them hold together."""
    holders = f'queue "{queue}" and the queues above it' if above else f'queue "{queue}"'
    split = ", ".join(f"{n} on {card}" for card, n in spread.items())
    held = sum(spread.values())
    return (
        f"{holders} hold {held} of the {pods} more pods of {what} ({demand.spec.text},"
        f" {amount(demand.count)} each): {split}"
    )


def on_no_one_model(spec: CardSpec, count: int, what: str, levels: Sequence[tuple[str, QueueUsage]]) -> str:
    """Why ``count`` cards of a multi-card ``spec`` fit no one of its models in every one of
    ``levels`` (the queue, then each ancestor whose quota names one of them: its label and usage)."""
    first = levels[0][0]
    rooms = ", ".join(
        f"{card} (" + ", ".join(f"{label}: {_left_short(usage, card)}" for label, usage in levels) + ")"
        for card in spec.cards
    )
    return (
        f"no one model of {spec.text} holds the {amount(count)} cards of {what} to be enqueued in {first}"
        f" and the queues above it: {rooms}"
    )


def _no_room(usage: QueueUsage, spec: CardSpec, what: str, per_pod: int, pods: int, below: str) -> str:
    queue = f'queue "{usage.queue}"' + (f' (above "{below}", counting all its queues)' if below else "")
    if not spec.is_multi:
        card = spec.cards[0]
        if pods == 1:
            return f"{queue} has {left_of(usage, card)}; {what} needs {amount(per_pod)}"
        return (
            f"{what} needs {amount(per_pod * pods)} {card} ({amount(per_pod)} per pod); {queue} has"
            f" {_trim_card(left_of(usage, card), card)}"
        )
    options = ", ".join(f"{card} ({_left_short(usage, card)})" for card in spec.cards)
    if pods == 1:
        return f"none of {options} in {queue} can hold {what} needing {amount(per_pod)}"
    return (
        f"{what} needs {pods} pods of {amount(per_pod)} card(s) from {spec.text}; none of {options}"
        f" in {queue} can hold them"
    )


def reserved_elsewhere(usage: QueueUsage, what: str, card: CardName, count: int) -> str:
    """Why a pod its PodGroup's reservation covers cannot have the model it was given."""
    return (
        f'queue "{usage.queue}" has {left_of(usage, card)}; {what} needs {amount(count)}, and its'
        " PodGroup's reservation holds cards of the spec it asked, not of this model"
    )


def _left_short(usage: QueueUsage, card: CardName) -> str:
    return f"{amount(usage.card(card).left)} left" if card in usage.quota else "no quota"


def _trim_card(text: str, card: CardName) -> str:
    """``1 NVIDIA-H200 left (...)`` -> ``1 left (...)`` where the card was just named."""
    return text.replace(f" {card} left", " left", 1)


def no_quota_annotation(queue: str, what: str, spec: CardSpec, count: int) -> str:
    return (
        f'queue "{queue}" has no card quota (no volcano.sh/card.quota annotation), so it may use no'
        f" card; {what} needs {amount(count)} {spec.text}"
    )


def too_complex(queue: str, what: str, need: str, error: TooComplex) -> str:
    """Why a request was denied without an answer: the exact check gave up at its guard."""
    return (
        f'{what} needs {need}, but the flexible card demand of queue "{queue}" ({error}) is too'
        " tangled to check exactly in time, so it is denied to be safe; fewer distinct pod sizes or"
        " card alternatives in the queue avoid this"
    )


def ahead_in_line(ahead: Sequence[Waiter]) -> str:
    """``; 2 wait ahead of it in the line (first: replicaset ns/a, 1 pod of 1 NVIDIA-H200)``."""
    if not ahead:
        return ""
    first = ahead[0]
    pods = f"{first.pods} pod{'s' if first.pods != 1 else ''} of {amount(first.per_pod)} {first.spec.text}"
    count = f"{len(ahead)} wait" if len(ahead) != 1 else "1 waits"
    return f"; {count} ahead of it in the queue's line (first: {first.what}, {pods})"


def gated_next(place: int) -> str:
    """What a wait-mode controller's pod is told when it reached validation ungated (it fitted when
    mutated): its controller's next create waits under the gate."""
    return (
        f"; its controller's next create waits {ordinal(place)} in the queue's line, under a scheduling gate"
    )


def joins_line(place: int, surge_of: str) -> str:
    """What a refused controller's pod is told in deny mode: its controller waits, and is called."""
    if surge_of:
        return (
            f"; it is a rolling-update surge pod of deployment {surge_of}: its ReplicaSet waits"
            f" {ordinal(place)} in the queue's line and creates it the moment an old pod frees its card"
        )
    return (
        f"; its controller waits {ordinal(place)} in the queue's line and is told to retry the moment"
        " its cards free"
    )


def closed_to(queue: str, namespace: str, why: str, what: str, needs: str) -> str:
    """A queue that may not be used from a namespace (its ``cardquota.volcano.sh/namespaces``)."""
    return (
        f'queue "{queue}" may not be used from namespace {namespace}: {why}; {what} {needs}'
        " (name a queue your namespace may use)"
    )


def never_whole(what: str, missing: int, demand: PodDemand) -> str:
    """Why a refused controller's pod's controller waits out of the line: what it still wants could
    never all fit the queue's whole quota (or an ancestor's), so its place would hold up everyone
    behind; it keeps that place and takes it again when the quota changes."""
    return (
        f"; {what} still wants {missing} pods, {amount(missing * demand.count)} {demand.spec.text} in all,"
        " more than the whole quota of its queue (or of a queue above it) holds, so it waits out of the"
        " line, ahead of no one, until that quota changes (lower its replicas, or raise the quota)"
    )


def unassigned(what: str, spec: CardSpec, queue: str) -> str:
    """A multi-card pod that reached validation with no model: none had room when it was mutated,
    one has now (cards freed in between). Admitted, it would run on no one model (decisions.md §19)."""
    return (
        f"{what} asks for one of {spec.text} and was given no model: none had room in queue"
        f' "{queue}" when it was mutated; cards freed since, so a new create is given one'
    )


def reclaimed(what: str, taken: Taken, waiting: int, now: float, then: str) -> str:
    """Why a gang whose cards tidal reclaim took back is not started again yet: ``what`` (its
    PodGroup, or one of its pods) waits while ``waiting`` pods the cards went to are unbound."""
    return (
        f'{what} gave {amount(taken.cards)} {taken.card} back to queue "{taken.queue}" (tidal reclaim):'
        f" {then} {_held_while(taken, waiting, now)}"
    )


def _held_while(taken: Taken, waiting: int, now: float) -> str:
    """How long a reclaim's cards stay held: while its ``waiting`` pods are unbound, until its end."""
    pods = f"{waiting} pod{'s' if waiting != 1 else ''}"
    return (
        f"while the {pods} they were taken for wait{'s' if waiting == 1 else ''} to be bound"
        f" ({max(0, int(taken.until - now))} s at most)"
    )


def held_for_reclaim(what: str, queue: str, taken: Taken, waiting: int, now: float, then: str) -> str:
    """Why new demand of a queue of lower priority waits: tidal reclaim took cards of its model back
    for ``taken.queue``, and they are held while ``waiting`` of the pods they went to are unbound."""
    return (
        f'{what} of queue "{queue}" waits for {taken.card}: {amount(taken.cards)} were taken back for'
        f' queue "{taken.queue}", of higher priority (tidal reclaim), and are held'
        f" {_held_while(taken, waiting, now)}; {then}"
    )


def unassigned_covered(what: str, spec: CardSpec, holder: str) -> str:
    """A multi-card pod whose cards ``holder`` holds (its PodGroup's reservation, its workload's
    scale-up) that reached validation with no model (its mutation did not see the hold yet, found
    no room a moment before, or did not run)."""
    return (
        f"{what} asks for one of {spec.text} and was given no model, though {holder} holds cards"
        " for it: a new create is given one (its controller creates it again)"
    )


def claim_of_another_queue(what: str, claim: str, payer: str, theirs: str, queue: str) -> str:
    """A pod naming a ResourceClaim another queue's pod is charged for (SPEC §4b)."""
    return (
        f"{what} shares ResourceClaim {claim} with pod {payer} of queue {theirs!r}: its GPUs are charged"
        f" to that queue, not to queue {queue!r}; give the pod a claim of its own"
    )


def misnamed_queue(what: str, named: str, runs: RunQueue, template: bool = False) -> str:
    """A pod, or a pod template (``template``: a workload's, a Volcano Job task's), whose queue
    annotation names another queue than the one Volcano schedules it in (decisions.md §30)."""
    if runs.source == PODGROUP:
        where = f"its podgroup {runs.key}"
    elif runs.source == JOB:
        where = "the job" if template else f"its volcano job {runs.key}"
    else:
        where = f"the podgroup Volcano makes for {'its pods' if template else 'it'}"
    why = ""
    if runs.defaulted:
        namespace = runs.key.split("/", 1)[0]
        why = (
            f' (a podgroup created in queue "default" goes to the queue namespace {namespace} names in its'
            f" {QUEUE_NAME} annotation)"
        )
    subject, them, their = (
        (f"{what}'s pod template", "its pods", "their") if template else (what, "it", "its")
    )
    return (
        f'{subject} names queue "{named}" but {where} is in queue "{runs.queue}", where Volcano schedules'
        f" {them}{why}: {their} cards would count there, not in the queue named; name queue"
        f' "{runs.queue}" in {QUEUE_NAME}, or none'
    )


def borrowed(what: str, card: CardName, count: int, deserved: int, lenders: Sequence[str]) -> str:
    """The admission warning of ``what`` taking ``count`` of ``card`` beyond its queue's deserved."""
    names = ", ".join(f'"{name}"' for name in lenders[:3]) + (" and others" if len(lenders) > 3 else "")
    return (
        f"{what} uses {amount(count)} {card} borrowed from queue{'s' if len(lenders) > 1 else ''} {names}"
        f" (beyond its queue's deserved {amount(deserved)}): they may be taken back when lenders need them"
    )

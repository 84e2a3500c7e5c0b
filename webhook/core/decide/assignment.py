"""Multi-card placement (SPEC §5b): the one model a multi-card pod is given when it is created.

The capacity-card scheduler plugin enqueues a PodGroup only if all its pods fit one alternative
of an ``A|B`` spec, and binds an ``A|B`` pod to whichever model node order picks, full or not.
Pods whose ``card.name`` names one model it counts exactly, per model. So the pod mutation gives
every multi-card pod one model: one that keeps the queue's demand feasible with this pod fixed
to it (and every ancestor's), in the spec's order, preferring a model with a free card on some
node now. No such model: the pod is left as it is, and the validation denies it.
"""

from collections.abc import Sequence

from webhook.core.decide.constraints import allowed_cards
from webhook.core.decide.decisions import ancestors_refuse, covering, queue_refuses, volcano_task
from webhook.core.index.cohorts import caps
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import QueueUsage, queue_usage, tree_has_room, tree_usage
from webhook.core.model import keys
from webhook.core.model.cards import UNIT, CardName, CardSpec
from webhook.core.model.demand import PodDemand
from webhook.core.model.feasibility import TooComplex
from webhook.core.model.ledger import Cover
from webhook.core.model.objects import PodRecord, PodTemplate
from webhook.core.model.values import value_class


@value_class
class Assignment:
    card: CardName
    queue: str
    free_now: bool  # some node of the model has the pod's cards free now
    covers: Cover | None  # the flexible demand already holding the pod's cards, if any
    task: str = ""  # the Volcano Job task whose pods all get this model


def assign_model(state: ClusterState, pod: PodRecord, demand: PodDemand) -> Assignment | None:
    """The model for a multi-card pod (``pod.namespace`` already the request's), or None."""
    spec = demand.spec
    if not spec.is_multi:
        return None
    candidates = allowed_cards(state, pod.template, pod.node_name, spec)
    queue = state.queue_of_pod(pod)
    if not candidates or queue_refuses(state, queue, "", spec, demand.count) is not None:
        return None
    less = covering(state, pod, demand)
    task = volcano_task(state, pod)
    pods = 1
    if task is not None:
        sibling = _sibling_model(state, pod, task[0], demand)
        if sibling is not None:  # the task's model, feasible or not: the validation decides
            return Assignment(sibling, queue, state.free.has_free(sibling, demand.count), less, task[0])
        if less is None or less.origin == "reserved":
            # The first pod: its siblings follow it, so the model must hold the whole task, its
            # PodGroup's reservation seen yet or not.
            pods = task[1]
        if less is not None and less.origin == "reserved":
            less = _reserved(less, demand.count, pods)
    whole = less if less is not None or task is None else _enqueued(state, pod, demand)
    if less is not None and pods > 1:
        less = _reserved(less, demand.count, 1)  # what this one pod's hold covers
    found = _model(state, queue, candidates, demand, pods, whole)
    if found is None and pods > 1:
        # No model holds the whole task (an elastic job, its replicas past every model's quota):
        # the one that holds the most of its pods (by bisection: a model that holds n holds fewer);
        # the validation checks each sibling against the model's quota.
        low, high = 0, pods - 1
        while low < high:
            middle = (low + high + 1) // 2
            part = (
                whole
                if whole is None or whole.origin != "reserved"
                else _reserved(whole, demand.count, middle)
            )
            if (held := _model(state, queue, candidates, demand, middle, part)) is not None:
                low, found = middle, held
            else:
                high = middle - 1
    if found is None:
        return None
    return Assignment(found[0], queue, found[1], less, task[0] if task else "")


def spread(
    state: ClusterState, queue: str, template: PodTemplate, demand: PodDemand, pods: int, exclude: str = ""
) -> dict[CardName, int]:
    """The models the pod mutation would give ``pods`` new pods of ``template``, a multi-card
    ``demand`` in ``queue`` (a scale-up's, held under ``exclude`` or not yet held), as their
    controller creates them one after another: each the first model, those with a free card on some
    node now first, that the queue and every ancestor whose quota names it hold with the pods not yet
    created still to place (``_model``'s check); pods per model of the spec, each pod on one. A pod
    no model holds is left out (the validation denies it). Once a model holds no more, it holds none
    of the later pods either, so each model's run is found by bisection."""
    spec = demand.spec
    out = dict.fromkeys(spec.cards, 0)
    sizes = {card: demand.count_on(card, state.inventory) for card in spec.cards}
    candidates = sorted(
        allowed_cards(state, template, "", spec), key=lambda card: not state.free.has_free(card, sizes[card])
    )
    usages = [queue_usage(state, queue, exclude)]
    limits: list[frozenset[CardName] | None] = [None]  # None: the queue itself, its caps every card
    for ancestor in state.tree.ancestors.get(queue, ()):
        quota = state.tree.queues[ancestor].quota
        if quota:
            usages.append(tree_usage(state, ancestor, exclude))
            limits.append(frozenset(quota))
    rest = pods

    def holds(card: CardName, k: int) -> bool:
        """Whether the k-th pod fits ``card``, the k - 1 before it there and the rest flexible."""
        one = CardSpec((card,))
        for usage, named in zip(usages, limits, strict=True):
            if named is not None and card not in named:
                continue
            with_them = usage.adding(((one, sizes[card], k - 1), (spec, demand.count, rest - k)), "in flight")
            try:
                if not with_them.fits(one, sizes[card], 1):
                    return False
            except TooComplex:
                return False
        return True

    for card in candidates:
        low, high = 0, rest  # holds at low (none), the most it may hold: high
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if holds(card, middle) else (low, middle - 1)
        if low:
            one = CardSpec((card,))
            usages = [usage.plus(one, sizes[card], low) for usage in usages]
            out[card], rest = low, rest - low
    return out


def _enqueued(state: ClusterState, pod: PodRecord, demand: PodDemand) -> Cover | None:
    """The hold of the pod's PodGroup's enqueue, admitted here, for the spec the pod asks, while
    the cache does not show the group enqueued yet (its job's pods are created as soon as it is):
    the task's pods come out of it, so it is left out when sizing their model (SPEC §5d)."""
    group = state.groups.enqueued_unseen(f"{pod.namespace}/{pod.group_name}") if pod.group_name else None
    for key, entry in state.groups.enqueue_holds(group.uid) if group is not None else ():
        if entry.spec == demand.spec:
            return Cover(entry.spec, entry.per_pod, entry.pods, "in flight", key)
    return None


def _reserved(cover: Cover, count: int, pods: int) -> Cover:
    """A PodGroup's reservation, as far as ``pods`` pods of ``count`` each go."""
    return Cover(cover.spec, UNIT, -(-count * pods // UNIT), "reserved")


def _model(
    state: ClusterState,
    queue: str,
    candidates: Sequence[CardName],
    demand: PodDemand,
    pods: int,
    whole: Cover | None,
) -> tuple[CardName, bool] | None:
    """The first model, in the spec's order, that holds ``pods`` pods of ``demand`` beside the
    queue's use (``whole``, the flexible demand they take over, left out), preferring one with a
    free card on some node now; and whether it has one."""
    quota = caps(state, queue) or {}  # a model lent and borrowed in its cohort: its cap now
    usage: QueueUsage | None = None
    first: CardName | None = None  # the first feasible model, if none has a free card now
    for card in candidates:
        size = demand.count_on(card, state.inventory)  # a shared GPU's byte share differs by model
        if first is not None and not state.free.has_free(card, size):
            continue  # it could only come second to ``first``
        one = CardSpec((card,))
        # The quick sufficient check first (every flexible pod counted on each of its models, this
        # pod's own demand included); the exact one only when it fails.
        if not tree_has_room(state, queue, quota, one, size * pods):
            if usage is None:
                usage = queue_usage(state, queue)
                usage = usage if whole is None else usage.without(whole)
            try:
                if not usage.fits(one, size, pods):
                    continue
            except TooComplex:
                continue
        if ancestors_refuse(state, queue, one, size, pods, "", less=whole) is not None:
            continue
        if state.free.has_free(card, size):
            return card, True
        first = first or card
    return (first, False) if first is not None else None


def _sibling_model(state: ClusterState, pod: PodRecord, task: str, demand: PodDemand) -> CardName | None:
    """The model the other pods of this Volcano Job task were assigned: held, or live in the cache."""
    assert pod.owner is not None
    return task_model(state, pod.owner.uid, task, demand)


def task_model(state: ClusterState, job_uid: str, task: str, demand: PodDemand) -> CardName | None:
    """The model the pods of Volcano Job task ``task`` (``"<job uid>/<task>"``), of a multi-card
    ``demand``, are assigned once one of them is (every later one follows it): held, or live in the
    cache; None before."""
    held = state.ledger.task_model(task)
    if held is not None:
        return held
    name = task.rpartition("/")[2]
    for other in state.pods_owned_by(job_uid):
        if other.template.annotations.get(keys.TASK_SPEC) != name:
            continue
        found = state.demand_of(other)
        if isinstance(found, PodDemand) and found.origin == demand.spec:
            return found.spec.cards[0]
    return None

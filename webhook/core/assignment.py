"""Multi-card placement (SPEC §5b): the one model a multi-card pod is given when it is created.

The capacity-card scheduler plugin enqueues a PodGroup only if all its pods fit one alternative
of an ``A|B`` spec, and binds an ``A|B`` pod to whichever model node order picks, full or not.
Pods whose ``card.name`` names one model it counts exactly, per model. So the pod mutation gives
every multi-card pod one model: one that keeps the queue's demand feasible with this pod fixed
to it (and every ancestor's), in the spec's order, preferring a model with a free card on some
node now. No such model: the pod is left as it is, and the validation denies it.
"""

from dataclasses import dataclass

from webhook.core.cards import CardName, CardSpec
from webhook.core.constraints import allowed_cards
from webhook.core.decisions import ancestors_refuse, covering, queue_refuses
from webhook.core.demand import PodDemand
from webhook.core.feasibility import TooComplex
from webhook.core.ledger import Cover
from webhook.core.objects import PodRecord
from webhook.core.state import ClusterState
from webhook.core.usage import queue_usage


@dataclass(frozen=True, slots=True)
class Assignment:
    card: CardName
    queue: str
    free_now: bool  # some node of the model has the pod's cards free now
    covers: Cover | None  # the flexible demand already holding the pod's cards, if any


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
    usage = queue_usage(state, queue)
    if less is not None:
        usage = usage.without(less)
    feasible: list[CardName] = []
    for card in candidates:
        one = CardSpec((card,))
        try:
            if not usage.fits(one, demand.count, 1):
                continue
        except TooComplex:
            continue
        if ancestors_refuse(state, queue, one, demand.count, 1, "", less=less) is None:
            feasible.append(card)
    for card in feasible:
        if state.free.has_free(card, demand.count):
            return Assignment(card, queue, True, less)
    return Assignment(feasible[0], queue, False, less) if feasible else None

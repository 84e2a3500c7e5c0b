"""Tidal reclaim (SPEC §5e): which whole gangs of training pods give back the cards of one model
that admitted pods cannot find free on any node.

Pure, and not wired yet: the serving replica is to build a ``Gang`` for each PodGroup holding
cards of the model, and the cards each waiting pod needs on one node, from its cache; then evict
every pod of what ``choose`` returns. Who may be a victim at all is ``why_not``; ``choose`` only
picks among the gangs it is given.

The order (decisions.md §26): the highest-ranked victim as low as it can be (PriorityClass, then
queue priority, then the youngest first), then the fewest gangs, then the fewest cards; a set
with one gang too many is never chosen.
"""

from collections.abc import Mapping, Sequence
from itertools import combinations

from webhook.core.model.values import value_class

TRAINING = "training"
INFERENCE = "inference"
SEARCH_BUDGET = 20_000  # placements tried before the greedy answer is taken instead


@value_class
class Gang:
    """A PodGroup whose running pods hold cards of the model: evicted whole, or not at all."""

    key: str  # the PodGroup, namespace/name
    queue: str
    queue_priority: int  # its queue's spec.priority
    reclaimable: bool  # its queue's spec.reclaimable (unset is true)
    service: str  # volcano.sh/service.type, else from its owner kind
    # False when a pod of it (or its PodGroup) is marked volcano.sh/preemptable other than true,
    # annotation or label, as Volcano reads it (``objects.preemptable``)
    preemptable: bool
    priority: int  # the highest spec.priority of its pods (their PriorityClass)
    created: float  # the PodGroup's creation time, seconds since the epoch
    card: str  # the model its pods hold
    cards: Mapping[str, int]  # node -> cards of the model its pods hold there
    pods: tuple[str, ...]  # every pod of it, namespace/name

    @property
    def rank(self) -> "Rank":
        """Smallest first out: lower PriorityClass, then lower queue priority, then younger."""
        return (self.priority, self.queue_priority, -self.created, self.key)

    @property
    def total(self) -> int:
        return sum(self.cards.values())


@value_class
class Taken:
    """A gang's cards taken back (its pods evicted) for the pods ``for_pods`` (uids) of ``queue``:
    it is not enqueued again while any of them waits unbound, until ``until`` at the latest."""

    card: str
    cards: int
    queue: str
    for_pods: tuple[str, ...]
    until: float


def why_not(gang: Gang, card: str, queue: str, queue_priority: int) -> str:
    """Why ``gang`` may not give its cards to a pod of ``queue`` (of ``queue_priority``) waiting
    for ``card``; "" when it may."""
    if gang.card != card:
        return f"it holds {gang.card}, not {card}"
    if gang.queue == queue:
        return "it is in the same queue"
    if gang.service != TRAINING:
        return f"its service type is {gang.service or 'unknown'}, not {TRAINING}"
    if not gang.reclaimable:
        return f'its queue "{gang.queue}" is not reclaimable'
    if gang.queue_priority >= queue_priority:
        return f'its queue "{gang.queue}" has priority {gang.queue_priority}, not below {queue_priority}'
    if not gang.preemptable:
        return "a pod of it is not preemptable (volcano.sh/preemptable)"
    return ""


def placeable(nodes: Mapping[str, int], needs: Sequence[int]) -> bool:
    """Whether every pod of ``needs`` (cards, all on one node each) fits the free cards ``nodes``."""
    free = sorted((n for n in nodes.values() if n > 0), reverse=True)
    pods = sorted((n for n in needs if n > 0), reverse=True)
    if sum(pods) > sum(free):
        return False

    def fit(index: int) -> bool:
        if index == len(pods):
            return True
        tried: set[int] = set()
        for slot, room in enumerate(free):
            if room < pods[index] or room in tried:
                continue
            tried.add(room)  # nodes with the same room are the same choice
            free[slot] -= pods[index]
            if fit(index + 1):
                return True
            free[slot] += pods[index]
        return False

    return fit(0)


def freed(free: Mapping[str, int], gangs: Sequence[Gang]) -> dict[str, int]:
    """The free cards of each node once ``gangs`` are gone."""
    nodes = dict(free)
    for gang in gangs:
        for node, cards in gang.cards.items():
            nodes[node] = nodes.get(node, 0) + cards
    return nodes


Rank = tuple[int, int, float, str]


def order_key(gangs: Sequence[Gang]) -> tuple[Rank, int, int, list[Rank]]:
    """How two (non-empty) victim sets compare, smaller first: their highest rank, how many gangs,
    how many cards, then their ranks from the highest down."""
    ranks = sorted((g.rank for g in gangs), reverse=True)
    return (ranks[0], len(gangs), sum(g.total for g in gangs), ranks)


def choose(free: Mapping[str, int], needs: Sequence[int], gangs: Sequence[Gang]) -> tuple[Gang, ...] | None:
    """The gangs to evict so that every pod of ``needs`` finds its cards on one node (``free``:
    the nodes of the model and their free cards), smallest by ``order_key``; () when the free
    cards suffice; None when all the gangs together would not."""
    if placeable(free, needs):
        return ()
    ordered = sorted(gangs, key=lambda g: g.rank)
    if not placeable(freed(free, ordered), needs):
        return None
    wanted, budget = sum(needs), SEARCH_BUDGET
    have = sum(n for n in free.values() if n > 0)
    for top, highest in enumerate(ordered):  # the highest-ranked victim, as low as it can be
        below = ordered[:top]
        if have + highest.total + sum(g.total for g in below) < wanted:
            continue
        for size in range(len(below) + 1):
            found: list[tuple[Gang, ...]] = [
                (*others, highest)
                for others in combinations(below, size)
                if have + highest.total + sum(g.total for g in others) >= wanted
            ]
            budget -= len(found)
            if budget < 0:
                return _greedy(free, needs, ordered)
            fitting = [chosen for chosen in found if placeable(freed(free, chosen), needs)]
            if fitting:
                best: tuple[Gang, ...] = min(fitting, key=order_key)
                return tuple(sorted(best, key=lambda g: g.rank))
    return None  # unreachable: all of them together fit


def victims(
    free: Mapping[str, int], needs: Sequence[int], gangs: Sequence[Gang], card: str, queue: str, priority: int
) -> tuple[Gang, ...] | None:
    """``choose`` among the gangs that may give their cards to pods of ``queue`` (of queue
    ``priority``) waiting for ``card``."""
    return choose(free, needs, [g for g in gangs if not why_not(g, card, queue, priority)])


def _greedy(free: Mapping[str, int], needs: Sequence[int], ordered: Sequence[Gang]) -> tuple[Gang, ...]:
    """Too many gangs to search: the lowest-ranked until they fit, then each one not needed
    dropped, highest first. Minimal (none can go), not always the smallest."""
    chosen: list[Gang] = []
    for gang in ordered:
        chosen.append(gang)
        if placeable(freed(free, chosen), needs):
            break
    for gang in sorted(chosen, key=lambda g: g.rank, reverse=True):
        rest = [g for g in chosen if g is not gang]
        if placeable(freed(free, rest), needs):
            chosen = rest
    return tuple(sorted(chosen, key=lambda g: g.rank))

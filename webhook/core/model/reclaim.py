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

import math
import re
from bisect import bisect_left, insort
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import field, replace
from itertools import chain, combinations
from typing import TypeVar, cast

from webhook.core.model.values import value_class

TRAINING = "training"
INFERENCE = "inference"
# Steps of search (a combination of gangs tried, a placement step, a hundred nodes read), each some
# microseconds: what one question may cost before the cheaper answer is taken
SEARCH_BUDGET = 20_000  # the smallest set of victims, then the greedy answer on its own budget
GREEDY_BUDGET = 20_000
PLACE_BUDGET = 20_000  # one placement question asked alone
NODES_PER_STEP = 100


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
    whole: int | None = None  # its cards on every node, when ``cards`` keeps only some (``within``)
    # node -> what else its pods there request and give back when they go (CPU, memory, other
    # resources), in the order of the problem's ``Room`` after the cards; empty when none is asked
    frees: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    ends: str = ""  # why an eviction would end its job rather than restart it ("" if it would not)
    started: float = 0.0  # when its last pod started running (seconds since the epoch; 0: unknown)
    # its queue's minimum run time before cards it borrows are taken back (seconds; 0: none)
    min_run: float = 0.0

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
    group_uid: str = ""  # the PodGroup it was taken from (its mark is on it; not in the mark's text)
    evict: float = 0.0  # when its pods are evicted: its queue's notice after the decision
    deadline: float = 0.0  # when they are killed if still running: ``evict`` and their grace period


def why_not(
    gang: Gang,
    card: str,
    queue: str,
    queue_priority: int,
    borrowers: Collection[str] = (),
    now: float = math.inf,
) -> str:
    """Why ``gang`` may not give its cards to a pod of ``queue`` (of ``queue_priority``) waiting
    for ``card``; "" when it may. ``borrowers``: the queues using ``card`` lent by ``queue``'s
    cohort while ``queue`` is inside its deserved: their gangs give lent cards back whatever their
    service type, queue priority or reclaimable setting (decisions.md §33)."""
    if gang.card != card:
        return f"it holds {gang.card}, not {card}"
    if gang.queue == queue:
        return "it is in the same queue"
    if gang.queue in borrowers:
        if not gang.preemptable:
            return "a pod of it is not preemptable (volcano.sh/preemptable)"
        if gang.min_run and now < gang.started + gang.min_run:
            return (
                f'it has run {_seconds(max(0.0, now - gang.started))} of queue "{gang.queue}"\'s minimum run'
                f" time of {_seconds(gang.min_run)} (cardquota.volcano.sh/reclaim-min-runtime)"
            )
        return gang.ends
    if gang.service != TRAINING:
        return f"its service type is {gang.service or 'unknown'}, not {TRAINING}"
    if not gang.reclaimable:
        return f'its queue "{gang.queue}" is not reclaimable'
    if gang.queue_priority >= queue_priority:
        return f'its queue "{gang.queue}" has priority {gang.queue_priority}, not below {queue_priority}'
    if not gang.preemptable:
        return "a pod of it is not preemptable (volcano.sh/preemptable)"
    if gang.ends:
        return gang.ends
    return ""


class Exhausted(Exception):
    """The search budget is spent: the caller takes a cheaper answer (or none)."""


class Budget:
    """Steps a search may take: every combination of gangs tried and every placement step counts,
    so no input makes one pass cost more than ``steps`` of them."""

    def __init__(self, steps: int) -> None:
        self.left = steps

    def spend(self, steps: int = 1) -> None:
        self.left -= steps
        if self.left < 0:
            raise Exhausted


# What a node has free, or a pod needs: its cards, or its cards and then each other resource a
# waiting pod asks (CPU millicores, memory bytes, other extended resources), in one order per model
Room = tuple[int, ...]
Size = int | Room
T = TypeVar("T", int, Room)


def placeable(nodes: Mapping[str, Size], needs: Sequence[Size], budget: Budget | None = None) -> bool:
    """Whether every pod of ``needs`` (cards, or a ``Room``: all on one node each) fits what
    ``nodes`` have free.

    First fit decreasing answers most cases at once; otherwise an exact search, without recursion,
    that remembers the partial placements it found hopeless (nodes with the same rooms are the same
    choice). Each step spends ``budget`` (``Exhausted`` when it runs out); asked without one, the
    search has ``PLACE_BUDGET`` steps and a question it cannot settle in them is answered no (no
    gang is evicted for pods not known to fit)."""
    if budget is None:
        try:
            return placeable(nodes, needs, Budget(PLACE_BUDGET))
        except Exhausted:
            return False
    if _in_rooms(nodes) or _in_rooms(needs):
        return _placeable_rooms(nodes, needs, budget)
    return _placeable_cards(cast(Mapping[str, int], nodes), cast(Sequence[int], needs), budget)


def _cards(sizes: Collection[Size]) -> int:
    """The cards of ``sizes`` (none counted below zero)."""
    return sum(cards for cards in map(card_count, sizes) if cards > 0)


def _in_rooms(sizes: Mapping[str, Size] | Sequence[Size]) -> bool:
    """Whether a question is asked in rooms: its sizes are all rooms or all cards (one problem's
    are made alike), so the first tells."""
    first = next(iter(sizes.values() if isinstance(sizes, Mapping) else sizes), 0)
    return not isinstance(first, int)


def card_count(size: Size) -> int:
    """The cards of ``size``."""
    return size if isinstance(size, int) else size[0]


def _placeable_cards(nodes: Mapping[str, int], needs: Sequence[int], budget: Budget) -> bool:
    """``placeable`` when only cards count."""
    pods = sorted((n for n in needs if n > 0), reverse=True)
    if not pods:
        return True
    if budget is not None:
        budget.spend(len(nodes) // NODES_PER_STEP)  # reading the nodes is work too
    rooms = tuple(sorted((n for n in nodes.values() if n >= pods[-1]), reverse=True))
    if sum(pods) > sum(rooms) or not rooms or pods[0] > rooms[0]:
        return False
    if pods[0] == pods[-1]:  # pods of one size (one card each, most often): counting decides
        return sum(room // pods[0] for room in rooms) >= len(pods)
    return _first_fit(rooms, pods) or _search(rooms, pods, _after, budget)


def _placeable_rooms(nodes: Mapping[str, Size], needs: Sequence[Size], budget: Budget) -> bool:
    """``placeable`` when other resources count beside the cards: every pod needs a node whose room
    holds it in each of them. The same search over rooms as vectors."""
    width = max(1 if isinstance(n, int) else len(n) for n in chain(nodes.values(), needs))
    asked = [_room(n, width) for n in needs]
    pods = sorted((pod for pod in asked if any(pod)), reverse=True)
    if not pods:
        return True
    budget.spend(len(nodes) // NODES_PER_STEP)
    kinds = set(pods)
    offered = [_room(n, width) for n in nodes.values()]
    rooms = tuple(sorted((room for room in offered if any(_fits(room, p) for p in kinds)), reverse=True))
    if not rooms or any(sum(p[d] for p in pods) > sum(r[d] for r in rooms) for d in range(width)):
        return False
    if len(kinds) == 1:  # pods all alike: how many each node holds decides
        (alike,) = kinds
        return sum(_holds(room, alike) for room in rooms) >= len(pods)
    return _first_fit_rooms(rooms, pods) or _search(rooms, pods, _after_rooms, budget)


def _search(
    rooms: tuple[T, ...],
    pods: Sequence[T],
    after: Callable[[tuple[T, ...], T], Iterator[tuple[T, ...]]],
    budget: Budget,
) -> bool:
    """The exact search, largest pod first, without recursion: ``after`` gives the rooms left once
    a pod takes one node (one answer per distinct room); the partial placements found hopeless are
    remembered. Each step spends ``budget``."""
    hopeless: set[tuple[int, tuple[T, ...]]] = set()
    stack = [(0, rooms, after(rooms, pods[0]))]
    while stack:
        index, at, choices = stack[-1]
        taken = next(choices, None)
        if taken is None:
            hopeless.add((index, at))
            stack.pop()
            continue
        budget.spend()
        if index + 1 == len(pods):
            return True
        if (index + 1, taken) not in hopeless:
            stack.append((index + 1, taken, after(taken, pods[index + 1])))
    return False


def _room(size: Size, width: int) -> Room:
    """``size`` as a room of ``width`` (a bare card count asks nothing else)."""
    room = (size,) if isinstance(size, int) else size
    return room if len(room) >= width else (*room, *([0] * (width - len(room))))


def _fits(room: Room, pod: Room) -> bool:
    return all(have >= need for have, need in zip(room, pod, strict=True))


def _holds(room: Room, pod: Room) -> int:
    """How many pods of ``pod`` fit ``room``."""
    return min(have // need for have, need in zip(room, pod, strict=True) if need > 0)


def _less(room: Room, pod: Room) -> Room:
    return tuple(have - need for have, need in zip(room, pod, strict=True))


def _first_fit_rooms(rooms: tuple[Room, ...], pods: Sequence[Room]) -> bool:
    """Each pod, largest first, on the first node (least room first) that holds it."""
    left = sorted(rooms)
    for pod in pods:
        slot = next((i for i, room in enumerate(left) if _fits(room, pod)), None)
        if slot is None:
            return False
        room = _less(left.pop(slot), pod)
        insort(left, room)
    return True


def _after(rooms: tuple[int, ...], size: int) -> Iterator[tuple[int, ...]]:
    """The rooms once a pod of ``size`` takes one node: one answer per distinct room it fits."""
    last = -1
    for slot, room in enumerate(rooms):
        if room >= size and room != last:
            last = room
            yield tuple(sorted((*rooms[:slot], room - size, *rooms[slot + 1 :]), reverse=True))


def _after_rooms(rooms: tuple[Room, ...], pod: Room) -> Iterator[tuple[Room, ...]]:
    """``_after`` over rooms of several resources."""
    last: Room | None = None
    for slot, room in enumerate(rooms):
        if room != last and _fits(room, pod):
            last = room
            yield tuple(sorted((*rooms[:slot], _less(room, pod), *rooms[slot + 1 :]), reverse=True))


def _first_fit(rooms: tuple[int, ...], pods: Sequence[int]) -> bool:
    """Each pod, largest first, on the node with the least room that still fits it."""
    left = sorted(rooms)
    for size in pods:
        slot = bisect_left(left, size)
        if slot == len(left):
            return False
        room = left.pop(slot) - size
        insort(left, room)
    return True


def freed(free: Mapping[str, Size], gangs: Sequence[Gang]) -> dict[str, Size]:
    """What each node has free once ``gangs`` are gone: cards, or rooms when ``free`` is of rooms
    (a gang's ``frees`` added then)."""
    nodes = dict(free)
    rooms = _in_rooms(free)
    for gang in gangs:
        for node, cards in gang.cards.items():
            have = nodes.get(node, (0,) if rooms else 0)
            if isinstance(have, int):
                nodes[node] = have + cards
            else:
                nodes[node] = (have[0] + cards, *_plus(have[1:], gang.frees.get(node, ())))
        for node, more in gang.frees.items():
            there = nodes.get(node)
            if node not in gang.cards and there is not None and not isinstance(there, int):
                nodes[node] = (there[0], *_plus(there[1:], more))  # its pods there that hold no card
    return nodes


def _plus(room: Sequence[int], more: Sequence[int]) -> tuple[int, ...]:
    return tuple(have + (more[d] if d < len(more) else 0) for d, have in enumerate(room))


Rank = tuple[int, int, float, str]


def order_key(gangs: Sequence[Gang]) -> tuple[Rank, int, int, list[Rank]]:
    """How two (non-empty) victim sets compare, smaller first: their highest rank, how many gangs,
    how many cards, then their ranks from the highest down."""
    ranks = sorted((g.rank for g in gangs), reverse=True)
    return (ranks[0], len(gangs), sum(g.total if g.whole is None else g.whole for g in gangs), ranks)


def choose(
    free: Mapping[str, Size], needs: Sequence[Size], gangs: Sequence[Gang], budget: Budget | None = None
) -> tuple[Gang, ...] | None:
    """The gangs to evict so that every pod of ``needs`` finds its cards on one node (``free``:
    the nodes of the model and their free cards), smallest by ``order_key``; () when the free
    cards suffice; None when all the gangs together would not, or when even the cheap answer
    cannot be had within the budget. Every combination tried and every placement step spends
    ``budget`` (a fresh one of ``SEARCH_BUDGET`` steps without one); when it runs out, the greedy
    answer is taken instead, on a budget of its own of ``GREEDY_BUDGET`` steps."""
    budget = budget if budget is not None else Budget(SEARCH_BUDGET)
    try:
        if placeable(free, needs, budget):
            return ()
        ordered = sorted(gangs, key=lambda g: g.rank)
        if not placeable(freed(free, ordered), needs, budget):
            return None
        return _smallest(free, needs, ordered, budget)
    except Exhausted:
        try:
            return _greedy(free, needs, sorted(gangs, key=lambda g: g.rank), Budget(GREEDY_BUDGET))
        except Exhausted:
            return None


def _smallest(
    free: Mapping[str, Size], needs: Sequence[Size], ordered: Sequence[Gang], budget: Budget
) -> tuple[Gang, ...] | None:
    wanted, have = _cards(needs), _cards(free.values())
    lower = 0  # the cards of every gang ranked below ``highest``
    for top, highest in enumerate(ordered):  # the highest-ranked victim, as low as it can be
        lower += ordered[top - 1].total if top else 0
        budget.spend()
        if have + highest.total + lower < wanted:
            continue
        below = ordered[:top]
        for size in range(len(below) + 1):
            fitting: list[tuple[Gang, ...]] = []
            for others in combinations(below, size):
                budget.spend(size + 1)  # every combination tried counts, those that free too few too
                chosen = (*others, highest)
                if have + sum(g.total for g in chosen) >= wanted and placeable(
                    freed(free, chosen), needs, budget
                ):
                    fitting.append(chosen)
            if fitting:
                best: tuple[Gang, ...] = min(fitting, key=order_key)
                return tuple(sorted(best, key=lambda g: g.rank))
    return None  # unreachable: all of them together fit


def victims(
    free: Mapping[str, Size],
    needs: Sequence[Size],
    gangs: Sequence[Gang],
    card: str,
    queue: str,
    priority: int,
    budget: Budget | None = None,
    nodes: Collection[str] | None = None,
    borrowers: Collection[str] = (),
    now: float = math.inf,
) -> tuple[Gang, ...] | None:
    """``choose`` among the gangs that may give their cards to pods of ``queue`` (of queue
    ``priority``) waiting for ``card``; ``nodes``: the only nodes those pods may land on (the free
    cards and the cards a gang frees elsewhere help nobody); ``borrowers``: see ``why_not``."""
    allowed = [g for g in gangs if not why_not(g, card, queue, priority, borrowers, now)]
    if nodes is None:
        return choose(free, needs, allowed, budget)
    near = {k: n for k, n in free.items() if k in nodes}
    kept = [w for g in allowed if (w := within(g, nodes)) is not None]
    chosen = choose(near, needs, kept, budget)
    if chosen is None:
        return None
    by_key = {g.key: g for g in allowed}
    return tuple(by_key[g.key] for g in chosen)


def within(gang: Gang, nodes: Collection[str]) -> Gang | None:
    """``gang`` as far as ``nodes`` are concerned: its cards there (None when it has none)."""
    cards = {node: n for node, n in gang.cards.items() if node in nodes}
    if not cards:
        return None
    return gang if len(cards) == len(gang.cards) else replace(gang, cards=cards, whole=gang.total)


def _greedy(
    free: Mapping[str, Size], needs: Sequence[Size], ordered: Sequence[Gang], budget: Budget
) -> tuple[Gang, ...] | None:
    """Too many gangs to search: the lowest-ranked until they fit, then each one not needed
    dropped, highest first. Minimal (none can go), not always the smallest; None when even all
    of them do not fit."""
    wanted, have = _cards(needs), _cards(free.values())
    chosen: list[Gang] = []
    for gang in ordered:
        chosen.append(gang)
        have += gang.total
        budget.spend()
        if have >= wanted and placeable(freed(free, chosen), needs, budget):
            break
    else:
        return None
    for gang in sorted(chosen, key=lambda g: g.rank, reverse=True):
        budget.spend()
        if have - gang.total < wanted:
            continue  # without it, too few cards in all
        rest = [g for g in chosen if g is not gang]
        if placeable(freed(free, rest), needs, budget):
            chosen, have = rest, have - gang.total
    return tuple(sorted(chosen, key=lambda g: g.rank))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str) -> float | None:
    """A duration as Kubernetes writes one (``90s``, ``10m``, ``1h30m``) in seconds; None when it is
    not one."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        return None
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    return seconds if math.isfinite(seconds) and seconds < 10**9 else None


def _seconds(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"

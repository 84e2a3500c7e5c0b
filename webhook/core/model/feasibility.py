"""Exact multi-card feasibility: can every flexible demand be given one of its alternatives?

A *group* is ``pods`` pods that each need ``per_pod`` cards of any one of ``cards``. A pod is never
split across models. Admission asks whether *every* group near the request, the request included,
can be given whole pods within quota (:func:`fits`): a yes/no question, answered exactly.

The question is NP-hard in general (it contains partition), but small here: a connected set of
cards (≤ a handful of models), a few pod sizes, and groups already merged by (alternatives, size).
:func:`assign` answers it in steps, each exact (docs/decisions.md §13):

1. *presolve*: a group left with one usable alternative is placed; a card with room for everything
   that wants it takes all of it; every card's room is rounded down to the largest load the pods
   that can reach it make exactly (a card of 9 wanted only by 2- and 4-card pods holds 8);
2. the groups split into independent components, each solved on its own; one pod size is a
   max-flow in pods;
3. greedy passes, largest pods first, each group spread where the rest presses least, stuck pods
   making room by moving placed ones along short chains: they find most placements at once;
4. Hall's condition (for every set of cards, what can only go inside it fits inside it, in cards
   and, for each pod size, in units of that size), which proves most infeasible states at once;
5. the depth-first search: sizes in the order that makes the rest's common divisor grow (odd
   pods first), every split cut at once when the rooms it leaves, rounded to what the rest can
   fill exactly, cannot hold the rest; failures remembered by the rounded room left; the last
   size closing as a max-flow.

The search is exact, so no step budget ever changes an answer; as a guard against a hostile state,
past :data:`GUARD` search nodes it raises :class:`TooComplex` and admission fails closed.
"""

import functools
import math
import operator
from collections.abc import Iterator, Mapping, Sequence

from webhook.core.model.cards import CardName
from webhook.core.model.values import value_class

GUARD = 10_000  # search nodes for one check: tens of milliseconds at worst
VIEW_GUARD = 1_000  # the same for a placement only shown (messages, status, metrics)
_DIVES = 3  # greedy passes before the exact search, each with the last one's stuck group first
_FILL_LIMIT = 1 << 14  # room up to which exact loads are worked out (a bitset that long)
_REPAIR_TRIES = 64  # placed groups the greedy dive may try to move before the exact search takes over
_REPAIR_DEPTH = 2  # cards a chain of moves may reach


@value_class
class Group:
    cards: tuple[CardName, ...]
    per_pod: int
    pods: int
    origin: str = "pending"

    @property
    def demand(self) -> int:
        return self.per_pod * self.pods


@value_class
class Placement:
    """Cards placed per (group index, card). ``complete`` when every group is placed whole."""

    placed: Mapping[tuple[int, CardName], int]
    complete: bool = True

    @property
    def total(self) -> int:
        return sum(self.placed.values())


class TooComplex(Exception):
    """The exact check gave up at the guard: the demand is too tangled to check in time."""

    def __init__(self, groups: int, cards: int) -> None:
        super().__init__(f"{groups} flexible groups over {cards} cards")
        self.groups, self.cards = groups, cards


def clear_caches() -> None:
    """Forget the remembered room roundings (for benchmarks that time a cold check)."""
    _fillable.cache_clear()


def fits(capacity: Mapping[CardName, int], groups: Sequence[Group], request: Group) -> bool:
    """Whether there is an assignment of every flexible demand, ``request`` included, within quota.

    Only the cards the request can reach matter (its alternatives, and the alternatives of every
    group that shares a card with them, transitively): over-use elsewhere blocks nothing. This is
    monotone in free quota. Raises :class:`TooComplex` past the guard.
    """
    cards, related = component(groups, request.cards)
    local = {card: capacity.get(card, 0) for card in cards}
    if min(local.values(), default=0) < 0:
        return False
    if not related:  # the request alone: whole pods on each alternative (the common case)
        return sum(n // request.per_pod for n in local.values()) >= request.pods
    return assign(local, [*related, request]) is not None


def backlog(capacity: Mapping[CardName, int], groups: Sequence[Group], cards: Sequence[CardName]) -> bool:
    """Whether the demand already around ``cards`` cannot all be placed, before any new request."""
    reach, related = component(groups, tuple(cards))
    local = {card: capacity.get(card, 0) for card in reach}
    return min(local.values(), default=0) < 0 or assign(local, related) is None


def place(capacity: Mapping[CardName, int], groups: Sequence[Group]) -> Placement:
    """A placement to show: the exact one when all demand fits; otherwise (demand above quota, or a
    state past the guard) a greedy one, largest pods first, each on its alternatives in order of
    preference. Never slow; never decides anything."""
    try:
        placed = assign(capacity, groups, guard=VIEW_GUARD)
    except TooComplex:
        placed = None
    if placed is not None:
        return Placement(placed)
    return Placement(_greedy({c: max(0, n) for c, n in capacity.items()}, groups), complete=False)


def assign(
    capacity: Mapping[CardName, int], groups: Sequence[Group], guard: int | None = None
) -> dict[tuple[int, CardName], int] | None:
    """Cards per (group index, card) placing every group whole within ``capacity``, or None when no
    such assignment exists. Exact; raises :class:`TooComplex` past ``guard`` search nodes."""
    names = sorted({card for group in groups for card in group.cards})
    index = {card: k for k, card in enumerate(names)}
    # Every load is a multiple of the sizes' common divisor, so counting in it is exact: whole-card
    # pods counted in card units (cards.UNIT) search as small numbers as whole cards would.
    step = math.gcd(*(group.per_pod for group in groups if group.pods > 0)) or 1
    caps = [max(0, capacity.get(card, 0)) // step for card in names]
    items = [
        (tuple(index[c] for c in group.cards), group.per_pod // step, group.pods, i)
        for i, group in enumerate(groups)
        if group.pods > 0
    ]
    taken: dict[tuple[int, int], int] = {}
    remaining = _presolve(caps, items, taken)
    if remaining is None:
        return None
    budget = [GUARD if guard is None else guard]
    for part in _components(remaining):
        try:
            if not _Search(caps, part, taken, budget).run():
                return None
        except _Exhausted:
            raise TooComplex(len(items), len(names)) from None
    return {(i, names[k]): pods * groups[i].per_pod for (i, k), pods in taken.items() if pods}


Item = tuple[tuple[int, ...], int, int, int]  # alternatives (card indexes), size, pods, group index


class _Exhausted(Exception):
    pass


def _presolve(caps: list[int], items: list[Item], taken: dict[tuple[int, int], int]) -> list[Item] | None:
    """Place what has only one place, give a roomy card all it is wanted for, round room down to
    what the sizes can fill; None when something cannot be placed at all."""
    while True:
        kept: list[Item] = []
        for item in items:
            alts, size, pods, i = item
            if len(alts) > 1 and min(map(caps.__getitem__, alts)) >= size:  # all still have room
                kept.append(item)
                continue
            room = tuple(k for k in alts if caps[k] >= size)
            if len(room) > 1:
                kept.append((room, size, pods, i))
                continue
            if not room:
                return None
            k = room[0]
            caps[k] -= size * pods
            if caps[k] < 0:
                return None
            taken[(i, k)] = taken.get((i, k), 0) + pods
        items = kept
        wanted: dict[int, int] = {}
        for alts, size, pods, _ in items:
            for k in alts:
                wanted[k] = wanted.get(k, 0) + size * pods
        roomy = next((k for k, want in wanted.items() if caps[k] >= want), None)
        if roomy is None:
            for k, held in _holding(items).items():
                caps[k] = _fillable(caps[k], held)
            # done when every group still has two alternatives with room for one of its pods
            if all(sorted(map(caps.__getitem__, alts))[-2] >= size for alts, size, _, _ in items):
                return items
            continue
        kept = []
        for alts, size, pods, i in items:
            if roomy in alts:
                caps[roomy] -= size * pods
                taken[(i, roomy)] = taken.get((i, roomy), 0) + pods
            else:
                kept.append((alts, size, pods, i))
        items = kept


def _components(items: list[Item]) -> list[list[Item]]:
    """The groups split by the cards they share, each part in the groups' own order. Parts keep
    disjoint sets of cards (bit masks), so one pass over the parts joins all a group touches."""
    parts: list[tuple[int, list[Item]]] = []
    for item in items:
        mask = 0
        for k in item[0]:
            mask |= 1 << k
        joined, apart = [item], []
        for part_mask, part in parts:
            if part_mask & mask:
                mask |= part_mask
                joined += part
            else:
                apart.append((part_mask, part))
        apart.append((mask, joined))
        parts = apart
    return [sorted(part, key=operator.itemgetter(3)) for _, part in parts]


@functools.lru_cache(maxsize=65536)
def _fillable(room: int, pods: tuple[tuple[int, int], ...]) -> int:
    """The largest load no more than ``room`` that some of these pods ((size, count) pairs) make
    exactly: a card of 9 wanted only by 2- and 4-card pods holds 8; a card of 41 wanted by two
    3-card pods and any number of 8-card pods holds 40."""
    if room <= 0:
        return 0
    if sum(size * count for size, count in pods) <= room:
        return sum(size * count for size, count in pods)
    if room > _FILL_LIMIT:  # a huge room: round to the sizes' common divisor, weaker but sound
        gcd = math.gcd(*(size for size, _ in pods))
        return room - room % gcd
    made, window = 1, (1 << (room + 1)) - 1  # bit n set: a load of n can be made
    for size, count in pods:
        step = 1
        while count > 0:  # counts in binary pieces: 1, 2, 4, ... pods at a time
            take = min(step, count)
            if size * take <= room:  # a piece past the room adds nothing (and would shift far out)
                made = (made | (made << (size * take))) & window
            count -= take
            step *= 2
    return made.bit_length() - 1


def _holding(items: Sequence[Item]) -> dict[int, tuple[tuple[int, int], ...]]:
    """Per card, the pods (size, count) of the groups that could go there."""
    per: dict[int, dict[int, int]] = {}
    for alts, size, pods, _ in items:
        for k in alts:
            held = per.setdefault(k, {})
            held[size] = held.get(size, 0) + pods
    return {k: tuple(sorted(held.items())) for k, held in per.items()}


def _size_rank(sizes: set[int]) -> dict[int, int]:
    """The order the search takes pod sizes in: each time the size whose going makes the common
    divisor of the sizes still to come largest (the smallest on a tie). With 1, 2, 3, 4 and 8 that
    is 1, 3, 2, 4, 8: once the odd pods are placed, every card's room must be even, and rooms that
    the rest cannot fill are cut at once."""
    left, rank = set(sizes), dict[int, int]()
    while left:
        best = max(sorted(left), key=lambda size: math.gcd(*(left - {size})))
        rank[best] = len(rank)
        left.remove(best)
    return rank


def _largest_first(item: Item) -> tuple[int, int, int]:
    return (-item[1], len(item[0]), -item[2])


class _Search:
    """Greedy passes first; then Hall's condition; then the exact depth-first search.

    The search takes the sizes that break the others' common divisor first (:func:`_size_rank`):
    they decide what is left of each card in the units the later ones need. Each card's room is
    rounded down to what the groups still to come can fill exactly, and a split of a group whose
    rounded rooms could no longer hold the rest of the demand is cut before it is tried (for tight
    queues, where every card must end exactly full, that cuts almost everything wrong at once).
    Failures are remembered by the rounded room left, so placements that leave the same usable
    room are tried once. The last size is a max-flow in pods (exact, no branching)."""

    def __init__(
        self, caps: list[int], items: list[Item], taken: dict[tuple[int, int], int], budget: list[int]
    ) -> None:
        self.caps, self.taken, self.budget = caps, taken, budget
        self.items = items  # put in the search's order by _prepare, once the passes have failed
        self.cards = sorted({k for it in items for k in it[0]})
        self.failed: set[tuple[int, ...]] = set()
        self.demand: list[int] = []
        self.press: list[list[float]] = []
        # per position, for each card the groups from there on can reach: the card, the most they
        # could put there, the roundings of its room worked out so far, and their pods
        self.rounders: list[list[tuple[int, int, dict[int, int], tuple[tuple[int, int], ...]]]] = []
        self.reaching: list[list[int]] = []  # those cards alone
        self.round_at: list[dict[int, tuple[int, dict[int, int], tuple[tuple[int, int], ...]]]] = []
        self.flow_from = 0
        self.path: list[tuple[int, int, int]] = []  # (position, card, pods) the search placed

    def run(self) -> bool:
        if sum(self.caps[k] for k in self.cards) < sum(size * pods for _, size, pods, _ in self.items):
            return False
        if len({size for _, size, _, _ in self.items}) == 1:  # one pod size: pods are units
            return _flow(self.caps, self.items, self.taken)
        order = sorted(self.items, key=_largest_first)
        for _ in range(_DIVES):  # squeaky wheel: the group a dive could not place goes first next
            stuck = _dive(self.caps, order, self.taken)
            if stuck < 0:
                return True
            order.insert(0, order.pop(stuck))
        if not _hall(self.caps, self.items, self.cards):
            return False
        self._prepare()
        if not self.group(0):
            return False
        for p, k, pods in self.path:  # what the search itself placed (the closing flow records its own)
            i = self.items[p][3]
            self.taken[(i, k)] = self.taken.get((i, k), 0) + pods
        return True

    def _prepare(self) -> None:
        """Put the groups in the search's order; then for each position p, over the groups from p on:
        their total demand, their expected pressure per card, and the rounders of the cards they
        can reach."""
        rank = _size_rank({size for _, size, _, _ in self.items})
        self.items = sorted(self.items, key=lambda it: (rank[it[1]], len(it[0]), -it[2]))
        n, width = len(self.items), len(self.caps)
        self.demand = [0] * (n + 1)
        self.press = [[0.0] * width for _ in range(n + 1)]
        self.rounders = [[] for _ in range(n + 1)]
        reach, press = [0] * width, [0.0] * width
        counts: dict[int, dict[int, int]] = {}  # card -> pod size -> pods that could go there
        rounder: dict[int, tuple[int, int, dict[int, int], tuple[tuple[int, int], ...]]] = {}
        for p in range(n - 1, -1, -1):
            alts, size, pods, _ = self.items[p]
            self.demand[p] = self.demand[p + 1] + size * pods
            for k in alts:  # a card no group here can use keeps its rounder (and what it knows)
                reach[k] += size * pods
                press[k] += size * pods / len(alts)
                per = counts.setdefault(k, {})
                per[size] = per.get(size, 0) + pods
                rounder[k] = (k, reach[k], {}, tuple(sorted(per.items())))
            self.press[p] = list(press)
            self.rounders[p] = [rounder[k] for k in self.cards if k in rounder]
        self.reaching = [[k for k, *_ in rounders] for rounders in self.rounders]
        self.round_at = [{k: (most, memo, held) for k, most, memo, held in r} for r in self.rounders]
        last = self.items[-1][1]
        self.flow_from = next(p for p, it in enumerate(self.items) if it[1] == last)

    def group(self, p: int) -> bool:
        caps = self.caps
        raw = (p, *map(caps.__getitem__, self.reaching[p]))
        if raw in self.failed:
            return False
        room, total = [p], 0
        for k, most, memo, held in self.rounders[p]:
            c = caps[k]
            if c > most:
                c = most
            r = memo.get(c)
            if r is None:
                r = memo[c] = _fillable(c, held)
            room.append(r)
            total += r
        if total < self.demand[p]:
            self.failed.add(raw)
            return False
        key = tuple(room)
        if key in self.failed:
            self.failed.add(raw)
            return False
        self.budget[0] -= 1
        if self.budget[0] < 0:
            raise _Exhausted
        if p >= self.flow_from:
            if _flow(self.caps, self.items[p:], self.taken):
                return True
            self.failed.update((key, raw))
            return False
        alts, size, pods, _ = self.items[p]
        press = self.press[p + 1]
        targets = _spread([caps[k] - press[k] for k in alts], [caps[k] // size for k in alts], size, pods)
        order = sorted(range(len(alts)), key=lambda j: -targets[j])
        # what the cards this group cannot touch will leave the groups after it, rounded
        kept = sum(self.rounded(p + 1, k, caps[k]) for k in self.reaching[p + 1] if k not in alts)
        if self.split(p, [alts[j] for j in order], [targets[j] for j in order], 0, pods, kept):
            return True
        self.failed.update((key, raw))
        return False

    def rounded(self, p: int, k: int, room: int) -> int:
        """Card ``k``'s room as the groups from ``p`` on can fill it exactly."""
        entry = self.round_at[p].get(k)
        if entry is None:
            return 0
        most, memo, held = entry
        if room > most:
            room = most
        r = memo.get(room)
        if r is None:
            r = memo[room] = _fillable(room, held)
        return r

    def split(self, p: int, alts: list[int], targets: list[int], j: int, left: int, kept: int) -> bool:
        """Put ``left`` pods of group ``p`` on ``alts[j:]``, nearest the targets first; on success
        the pods placed are recorded in ``path`` on the way back up, otherwise ``caps`` is as before.
        ``kept``: the rounded room the cards already settled leave the groups after ``p``; a split
        that cannot leave them their demand is cut before it is tried."""
        if left == 0:
            return self.group(p + 1)
        size, need = self.items[p][1], self.demand[p + 1]
        caps, k = self.caps, alts[j]
        room = caps[k] // size
        if j == len(alts) - 1:
            if room < left or kept + self.rounded(p + 1, k, caps[k] - size * left) < need:
                return False
            self.budget[0] -= 1
            if self.budget[0] < 0:
                raise _Exhausted
            caps[k] -= size * left
            if self.group(p + 1):
                self.path.append((p, k, left))
                return True
            caps[k] += size * left
            return False
        rest = most = 0
        for a in alts[j + 1 :]:
            rest += caps[a] // size
            most += caps[a]
        high, low = min(left, room), max(0, left - rest)
        for x in _around(min(max(targets[j], low), high), low, high):
            here = self.rounded(p + 1, k, caps[k] - size * x)
            if kept + here + most - size * (left - x) < need:
                continue
            self.budget[0] -= 1
            if self.budget[0] < 0:
                raise _Exhausted
            caps[k] -= size * x
            if self.split(p, alts, targets, j + 1, left - x, kept + here):
                if x:
                    self.path.append((p, k, x))
                return True
            caps[k] += size * x
        return False


def _dive(caps: list[int], order: Sequence[Item], taken: dict[tuple[int, int], int]) -> int:
    """One greedy pass over ``order``: each group spread where the groups after it press least; a
    group that does not fit makes room by moving pods placed in this pass along their other
    alternatives (short chains, a bounded number of tries). On success it commits to ``caps`` and
    ``taken`` and returns -1; otherwise it changes nothing and returns where it got stuck."""
    press = [0.0] * len(caps)
    shares = [size * pods / len(alts) for alts, size, pods, _ in order]
    for (alts, *_), share in zip(order, shares, strict=True):
        for k in alts:
            press[k] += share
    left = list(caps)
    on: dict[int, dict[int, int]] = {k: {} for alts, *_ in order for k in alts}  # card -> position -> pods
    tries = [_REPAIR_TRIES]
    for p, (alts, size, pods, _) in enumerate(order):
        share = shares[p]
        for k in alts:
            press[k] -= share
        room = [left[k] // size for k in alts]
        for j, x in enumerate(_spread([left[k] - press[k] for k in alts], room, size, pods)):
            if x:
                left[alts[j]] -= x * size
                on[alts[j]][p] = on[alts[j]].get(p, 0) + x
                pods -= x
        while pods:
            roomy = (k for k in alts if _free(left, on, order, k, size - left[k], _REPAIR_DEPTH, {k}, tries))
            card = next(roomy, None)
            if card is None:
                return p
            k = card
            left[k] -= size
            on[k][p] = on[k].get(p, 0) + 1
            pods -= 1
    caps[:] = left
    for k, held in on.items():
        for p, x in held.items():
            if x:
                i = order[p][3]
                taken[(i, k)] = taken.get((i, k), 0) + x
    return -1


def _free(
    left: list[int],
    on: dict[int, dict[int, int]],
    order: Sequence[Item],
    card: int,
    need: int,
    depth: int,
    seen: set[int],
    tries: list[int],
) -> bool:
    """Make ``need`` more room on ``card`` by moving placed pods to their other alternatives,
    freeing room there in turn up to ``depth`` cards deep. Every move keeps the placement within
    capacity, so a failed attempt leaves a valid (different) placement behind."""
    while need > 0:
        if depth == 0:
            return False
        for q, x in on[card].items():
            tries[0] -= 1
            if tries[0] < 0:
                return False
            if not x:
                continue
            alts, size = order[q][0], order[q][1]
            target = next(
                (
                    b
                    for b in alts
                    if b not in seen
                    and (
                        left[b] >= size
                        or _free(left, on, order, b, size - left[b], depth - 1, seen | {b}, tries)
                    )
                ),
                None,
            )
            if target is not None:
                on[card][q] -= 1
                on[target][q] = on[target].get(q, 0) + 1
                left[card] += size
                left[target] -= size
                need -= size
                break
        else:
            return False
    return True


def _flow(caps: list[int], items: Sequence[Item], taken: dict[tuple[int, int], int]) -> bool:
    """Groups of one pod size: a max-flow in pods (augmenting paths over group → card), exact.
    On success it commits to ``caps`` and ``taken``; otherwise it changes nothing."""
    size = items[0][1]
    room = {k: caps[k] // size for alts, *_ in items for k in alts}
    on: dict[tuple[int, int], int] = {}  # (position, card) -> pods
    holders: dict[int, set[int]] = {k: set() for k in room}  # card -> positions with pods on it
    for p, (_, _, pods, _) in enumerate(items):
        while pods:
            found = _augmenting(items, room, on, holders, p)
            if found is None:
                return False
            steps, card = found
            moved = min(pods, room[card], *(on[(q, k)] for q, k, step in steps if step < 0))
            room[card] -= moved
            pods -= moved
            for q, k, step in steps:
                on[(q, k)] = on.get((q, k), 0) + step * moved
                holders[k].add(q)
    for (q, k), pods in on.items():
        if pods:
            caps[k] -= pods * size
            i = items[q][3]
            taken[(i, k)] = taken.get((i, k), 0) + pods
    return True


def _augmenting(
    items: Sequence[Item],
    room: dict[int, int],
    on: dict[tuple[int, int], int],
    holders: dict[int, set[int]],
    start: int,
) -> tuple[list[tuple[int, int, int]], int] | None:
    """A shortest way to place one more pod of ``start``: onto a card with room, or onto a card
    another group's pod leaves for one of its other alternatives, and so on. Returns the steps
    (position, card, +1 or -1) and the card whose room it takes."""
    came: dict[int, tuple[int, int]] = {}  # card -> (position that moves onto it, card it leaves)
    queue: list[tuple[int, int]] = [(start, -1)]
    seen = {start}
    for q, leaving in queue:
        for k in items[q][0]:
            if k in came or k == leaving:
                continue
            came[k] = (q, leaving)
            if room[k] > 0:
                steps, card = [], k
                while card >= 0:
                    mover, left = came[card]
                    steps.append((mover, card, 1))
                    if left >= 0:
                        steps.append((mover, left, -1))
                    card = left
                return steps, k
            for holder in holders[k]:
                if holder not in seen and on.get((holder, k), 0) > 0:
                    seen.add(holder)
                    queue.append((holder, k))
    return None


def _around(start: int, low: int, high: int) -> Iterator[int]:
    """``start``, then its neighbours outward, within ``low..high``."""
    yield start
    for step in range(1, high - low + 1):
        if start - step >= low:
            yield start - step
        if start + step <= high:
            yield start + step


def _spread(slack: list[float], room: list[int], size: int, pods: int) -> list[int]:
    """Where the pods would best go: one at a time to the alternative with the most slack left
    (for many pods, in proportion to the room instead: only a starting point either way).
    ``slack`` is used up; ``room`` may be returned."""
    if sum(room) <= pods:  # every pod that fits goes
        return room
    if pods > 64:
        total = sum(room) or 1
        return [min(r, pods * r // total) for r in room]
    out = [0] * len(slack)
    alive = [j for j in range(len(slack)) if room[j]]
    if len(alive) == 1:
        out[alive[0]] = pods
        return out
    for _ in range(pods):
        if not alive:
            break
        best = max(alive, key=slack.__getitem__)
        out[best] += 1
        slack[best] -= size
        if out[best] == room[best]:
            alive.remove(best)
    return out


def _hall(caps: list[int], items: Sequence[Item], cards: list[int]) -> bool:
    """Hall's condition: for every set of cards, the demand that can only go inside it fits
    inside it, in cards (all groups) and, for each pod size, in units of that size: pods whose size
    it divides, against each card's room divided by it (a card of 9 holds two 4-card units).

    The checks run side by side, each in a field of one integer per set of cards, so the sums over
    subsets are done once. Each field carries a guard bit above its largest possible value: in
    room + guards - demand a field keeps its guard bit exactly when its room covers its demand."""
    divisors = [1, *sorted({size for _, size, _, _ in items} - {1})]
    rooms = [[caps[k] // d for k in cards] for d in divisors]
    demands = [[pods * (size // d) if size % d == 0 else 0 for _, size, pods, _ in items] for d in divisors]
    width = max(max(sum(r), sum(n)) for r, n in zip(rooms, demands, strict=True)).bit_length() + 1
    guards = sum(1 << (width * c + width - 1) for c in range(len(divisors)))
    bit = {k: 1 << b for b, k in enumerate(cards)}
    inside, total = [0] * (1 << len(cards)), [0] * (1 << len(cards))
    for j, (alts, *_) in enumerate(items):
        inside[sum(bit[k] for k in alts)] += sum(n[j] << (width * c) for c, n in enumerate(demands))
    for b in range(len(cards)):
        total[1 << b] = sum(r[b] << (width * c) for c, r in enumerate(rooms))
    # inside[T]: the demand whose alternatives all lie in T; total[T]: the room of T
    return all(
        (have + guards - need) & guards == guards
        for have, need in zip(_subset_sums(total), _subset_sums(inside), strict=True)
    )


def _subset_sums(values: list[int]) -> list[int]:
    """Each ``values[T]`` (T a set of cards as a bit mask) summed over every subset of T, in place.
    Bit by bit, each slice adding the entries without the bit to those with it: a few long slices
    instead of an addition per entry."""
    full, one = len(values), 1
    while one < full:
        step = 2 * one
        if one <= full // step:  # the entries with the bit: ``one`` strided slices
            for low in range(one):
                values[one + low :: step] = map(operator.add, values[one + low :: step], values[low::step])
        else:  # or ``full / step`` blocks
            for base in range(0, full, step):
                high = slice(base + one, base + step)
                values[high] = map(operator.add, values[high], values[base : base + one])
        one = step
    return values


def _greedy(capacity: dict[CardName, int], groups: Sequence[Group]) -> dict[tuple[int, CardName], int]:
    placed: dict[tuple[int, CardName], int] = {}
    for i in sorted(range(len(groups)), key=lambda i: -groups[i].per_pod):
        group, left = groups[i], groups[i].pods
        for card in group.cards:
            pods = min(left, capacity.get(card, 0) // group.per_pod)
            if pods:
                capacity[card] -= pods * group.per_pod
                placed[(i, card)] = placed.get((i, card), 0) + pods * group.per_pod
                left -= pods
    return placed


def component(groups: Sequence[Group], cards: tuple[CardName, ...]) -> tuple[set[CardName], list[Group]]:
    """The cards reachable from ``cards`` through groups sharing a card, and those groups."""
    reach, related, rest = set(cards), [], list(groups)
    grew = True
    while grew:
        grew = False
        for group in list(rest):
            if reach.intersection(group.cards):
                reach.update(group.cards)
                related.append(group)
                rest.remove(group)
                grew = True
    return reach, related

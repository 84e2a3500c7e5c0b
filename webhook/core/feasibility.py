"""Exact multi-card feasibility: can every flexible demand be given one of its alternatives?

A *group* is ``pods`` pods that each need ``per_pod`` cards of any one of ``cards``. A pod is
never split across models. When every card is only wanted in one pod size (the usual case: all
sizes 1, or all 8), pods are units and the question is a small max-flow
(source → group → card → sink). Otherwise a bounded branch-and-bound search answers it.
Either way the cost depends on the number of cards and groups, never on the number of pods.

Admission (:func:`fits`) asks for an assignment of *all* demand near the request within quota,
the request included; that is exact, and monotone in free quota.
"""

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from webhook.core.cards import CardName

SEARCH_BUDGET = 200_000


@dataclass(frozen=True, slots=True)
class Group:
    cards: tuple[CardName, ...]
    per_pod: int
    pods: int
    origin: str = "pending"

    @property
    def demand(self) -> int:
        return self.per_pod * self.pods


@dataclass(frozen=True, slots=True)
class Placement:
    """The best assignment found: cards placed per (group index, card)."""

    placed: Mapping[tuple[int, CardName], int]
    exact: bool = True

    @property
    def total(self) -> int:
        return sum(self.placed.values())


def place(capacity: Mapping[CardName, int], groups: Sequence[Group]) -> Placement:
    """Place as many cards of the groups as the capacity allows."""
    if _uniform_sizes(groups):
        return _max_flow(capacity, groups)
    return _search(capacity, groups)


def fits(capacity: Mapping[CardName, int], groups: Sequence[Group], request: Group) -> bool:
    """Whether there is an assignment of every flexible demand, ``request`` included, within quota.

    Only the cards the request can reach matter (its alternatives, and the alternatives of every
    group that shares a card with them, transitively): over-use elsewhere blocks nothing. This is
    monotone in free quota.
    """
    cards, related = component(groups, request.cards)
    local = {card: capacity.get(card, 0) for card in cards}
    if not related:  # the request alone: whole pods on each alternative (the common case, no flow)
        free = local.values()
        return min(free) >= 0 and sum(n // request.per_pod for n in free) >= request.pods
    wanted = [*related, request]
    return min(local.values(), default=0) >= 0 and place(local, wanted).total == sum(g.demand for g in wanted)


def backlog(capacity: Mapping[CardName, int], groups: Sequence[Group], cards: Sequence[CardName]) -> bool:
    """Whether the demand already around ``cards`` cannot all be placed, before any new request."""
    reach, related = component(groups, tuple(cards))
    local = {card: capacity.get(card, 0) for card in reach}
    return min(local.values(), default=0) < 0 or place(local, related).total < sum(g.demand for g in related)


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


def _uniform_sizes(groups: Sequence[Group]) -> bool:
    size: dict[CardName, int] = {}
    for group in groups:
        for card in group.cards:
            if size.setdefault(card, group.per_pod) != group.per_pod:
                return False
    return True


def _max_flow(capacity: Mapping[CardName, int], groups: Sequence[Group]) -> Placement:
    """Edmonds-Karp over source → group (pods) → card (pods that fit) → sink, in pods."""
    residual: dict[object, dict[object, int]] = defaultdict(dict)
    source, sink = ("source",), ("sink",)
    for index, group in enumerate(groups):
        if group.pods <= 0:
            continue
        residual[source][index] = group.pods
        residual[index].setdefault(source, 0)
        for card in group.cards:
            residual[index][card] = group.pods
            residual[card].setdefault(index, 0)
            units = max(0, capacity.get(card, 0)) // group.per_pod
            residual[card][sink] = units
            residual[sink].setdefault(card, 0)
    while path := _augmenting_path(residual, source, sink):
        flow = min(residual[u][v] for u, v in path)
        for u, v in path:
            residual[u][v] -= flow
            residual[v][u] += flow
    placed: dict[tuple[int, CardName], int] = {}
    for index, group in enumerate(groups):
        for card in group.cards:
            pods = residual.get(card, {}).get(index, 0)
            if pods:
                placed[(index, card)] = pods * group.per_pod
    return Placement(placed)


def _augmenting_path(
    residual: Mapping[object, Mapping[object, int]], source: object, sink: object
) -> list[tuple[object, object]]:
    parent: dict[object, object] = {source: source}
    queue = deque([source])
    while queue:
        node = queue.popleft()
        for nxt, cap in residual[node].items():
            if cap > 0 and nxt not in parent:
                parent[nxt] = node
                if nxt == sink:
                    path = []
                    while nxt != source:
                        path.append((parent[nxt], nxt))
                        nxt = parent[nxt]
                    return path[::-1]
                queue.append(nxt)
    return []


def _search(capacity: Mapping[CardName, int], groups: Sequence[Group]) -> Placement:
    """Branch and bound, maximising cards placed; gives up exactness past a step budget."""
    order = sorted(range(len(groups)), key=lambda i: (len(groups[i].cards), -groups[i].per_pod))
    caps = {card: max(0, c) for card, c in capacity.items()}
    best: list[int | dict[tuple[int, CardName], int]] = [-1, {}]
    steps = [0]
    current: dict[tuple[int, CardName], int] = {}
    suffix = [0] * (len(order) + 1)
    for pos in range(len(order) - 1, -1, -1):
        suffix[pos] = suffix[pos + 1] + groups[order[pos]].demand

    def visit(pos: int, alt: int, left: int, placed: int) -> None:
        steps[0] += 1
        if steps[0] > SEARCH_BUDGET:
            return
        if pos == len(order):
            if placed > best[0]:  # type: ignore[operator]
                best[0], best[1] = placed, dict(current)
            return
        group = groups[order[pos]]
        if placed + left * group.per_pod + suffix[pos + 1] <= best[0]:  # type: ignore[operator]
            return
        if alt == len(group.cards) or left == 0:
            visit(pos + 1, 0, groups[order[pos + 1]].pods if pos + 1 < len(order) else 0, placed)
            return
        card = group.cards[alt]
        most = min(left, caps.get(card, 0) // group.per_pod)
        for pods in range(most, -1, -1):
            cards = pods * group.per_pod
            caps[card] = caps.get(card, 0) - cards
            if cards:
                current[(order[pos], card)] = cards
            visit(pos, alt + 1, left - pods, placed + cards)
            current.pop((order[pos], card), None)
            caps[card] += cards

    if order:
        visit(0, 0, groups[order[0]].pods, 0)
    placed = best[1] if isinstance(best[1], dict) else {}
    return Placement(placed, exact=steps[0] <= SEARCH_BUDGET)

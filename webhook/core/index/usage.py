"""What a queue has used, per card, and what is left: the numbers decisions and messages show."""

from collections import Counter
from collections.abc import Iterable, Mapping

from webhook.core.index.cohorts import Share, share
from webhook.core.index.line import Waiter
from webhook.core.index.state import ClusterState
from webhook.core.index.tally import Tally
from webhook.core.model.cards import CardName, CardSpec
from webhook.core.model.feasibility import Group, Placement, backlog, fits, place
from webhook.core.model.ledger import Cover
from webhook.core.model.values import value_class


@value_class
class CardUse:
    quota: int
    bound: int = 0
    pending: int = 0
    reserved: int = 0
    in_flight: int = 0
    waiting: int = 0  # waiting ahead of the request in the queue's line
    share: Share | None = None  # the model is lent and borrowed in its cohort: ``quota`` is its cap

    @property
    def used(self) -> int:
        return self.bound + self.pending + self.reserved + self.in_flight + self.waiting

    @property
    def left(self) -> int:
        return max(0, self.quota - self.used)

    @property
    def ceiling(self) -> int:
        """The queue's card quota, what the scheduler enforces (``quota`` is what it may use now)."""
        return self.share.quota if self.share is not None else self.quota


@value_class
class QueueUsage:
    """A queue's quota and usage, flexible demand placed by an exact assignment."""

    queue: str
    quota: dict[CardName, int]  # what it may use of each model now (a lent model: its cap)
    fixed: dict[CardName, dict[str, int]]  # card -> origin ("bound", "pending", ...) -> cards
    groups: tuple[Group, ...]
    shares: Mapping[CardName, Share] | None = None  # the models lent and borrowed in its cohort

    def capacity(self) -> dict[CardName, int]:
        cards = set(self.quota) | set(self.fixed)
        return {c: self.quota.get(c, 0) - sum(self.fixed.get(c, {}).values()) for c in cards}

    @property
    def placement(self) -> Placement:
        """An exact assignment of the flexible demand: what messages and status show. Not needed to
        decide, so it is computed only when asked for."""
        return place(self.capacity(), self.groups)

    def card(self, card: CardName, placement: Placement | None = None) -> CardUse:
        parts: Counter[str] = Counter(self.fixed.get(card, {}))
        for (index, placed_card), cards in (placement or self.placement).placed.items():
            if placed_card == card:
                parts[self.groups[index].origin] += cards
        return CardUse(
            self.quota.get(card, 0),
            parts["bound"],
            parts["pending"],
            parts["reserved"],
            parts["in flight"],
            parts["waiting"],
            (self.shares or {}).get(card),
        )

    @property
    def has_line(self) -> bool:
        """Whether demand waiting ahead in the queue's line is counted."""
        return any("waiting" in parts for parts in self.fixed.values()) or any(
            g.origin == "waiting" for g in self.groups
        )

    def backlog(self, spec: CardSpec) -> bool:
        """Whether demand already waiting around ``spec``'s cards exceeds what the quota holds."""
        return backlog(self.capacity(), self.groups, spec.cards)

    def fits(self, spec: CardSpec, per_pod: int, pods: int) -> bool:
        return fits(self.capacity(), self.groups, Group(spec.cards, per_pod, pods, "request"))

    def plus(self, spec: CardSpec, per_pod: int, pods: int = 1, origin: str = "in flight") -> "QueueUsage":
        """This usage with ``pods`` more of ``spec`` counted (an ``A|B`` group whole per pod)."""
        return self.adding(((spec, per_pod, pods),), origin)

    def adding(self, demands: Iterable[tuple[CardSpec, int, int]], origin: str) -> "QueueUsage":
        """This usage with each ``(spec, per_pod, pods)`` of ``demands`` counted as ``origin``."""
        fixed = {card: dict(parts) for card, parts in self.fixed.items()}
        groups = list(self.groups)
        for spec, per_pod, pods in demands:
            if spec.is_multi:
                groups.append(Group(spec.cards, per_pod, pods, origin))
            else:
                slot = fixed.setdefault(spec.cards[0], {})
                slot[origin] = slot.get(origin, 0) + per_pod * pods
        return QueueUsage(self.queue, self.quota, fixed, tuple(groups), self.shares)

    def without(self, *covers: Cover) -> "QueueUsage":
        """This usage less the flexible demand ``covers`` take over (a pod of a scale-up held in
        flight, or cards a PodGroup reserves, now held for one pod on its assigned model)."""
        return QueueUsage(self.queue, self.quota, self.fixed, _less(self.groups, covers), self.shares)


def queue_usage(
    state: ClusterState, queue: str, exclude_ledger: str = "", ahead: Iterable[Waiter] = ()
) -> QueueUsage:
    """The usage of ``queue`` from the state's tallies and in-flight ledger (cost: cards × groups),
    with the pods of ``ahead`` (waiters before the request in its line) counted as "waiting"."""
    tally = state.tree.tallies.get(queue)
    usage = _usage(state, queue, [tally] if tally is not None else [], frozenset((queue,)), exclude_ledger)
    info = state.tree.queues.get(queue)
    if info is not None and info.lending is not None:  # a model lent and borrowed: its cap, now
        found = {card: s for card in info.lending.deserved if (s := share(state, queue, card)) is not None}
        quota = {**usage.quota, **{card: s.cap for card, s in found.items()}}
        usage = QueueUsage(queue, quota, usage.fixed, usage.groups, found)
    return after(state, usage, ahead) if ahead else usage


def after(state: ClusterState, usage: QueueUsage, ahead: Iterable[Waiter]) -> QueueUsage:
    """``usage`` with the pods ``ahead`` still wait for counted, as "waiting"."""
    waiting = ((w.spec, w.per_pod, state.waiting.waiting_pods(w)) for w in ahead)
    return usage.adding(((spec, per_pod, pods) for spec, per_pod, pods in waiting if pods > 0), "waiting")


def tree_usage(state: ClusterState, queue: str, exclude_ledger: str = "") -> QueueUsage:
    """The usage an ancestor's quota limits: its own and all its descendants' (the subtree tally is
    kept incrementally, so the cost does not grow with the number of pods or of descendants)."""
    tally = state.tree.subtree.get(queue) or state.tree.tallies.get(queue)
    tallies = [tally] if tally is not None else []
    queues = state.tree.descendants.get(queue) or frozenset((queue,))
    return _usage(state, queue, tallies, queues, exclude_ledger)


def tree_has_room(
    state: ClusterState,
    queue: str,
    quota: Mapping[CardName, int],
    spec: CardSpec,
    ask: int,
    exclude_ledger: str = "",
) -> bool:
    """A sufficient condition for ``tree_usage(...).fits(...)`` of ``ask`` more cards, straight from
    the subtree's ``load`` (every flexible pod counted on each alternative): the request's cards can
    take it on top, and no other card is loaded past ``quota``. An ancestor far from its quota, the
    usual case, is then passed without building its usage or searching."""
    tally = state.tree.subtree.get(queue) or state.tree.tallies.get(queue)
    load: Mapping[CardName, int] = tally.load if tally is not None else {}
    if state.ledger:  # in-flight holds: rare enough to fold in the slow way
        queues = state.tree.descendants.get(queue) or frozenset((queue,))
        merged = Counter(load)
        for (held, size), count in state.ledger.held_in(queues, exclude_ledger).items():
            for card in held.cards:
                merged[card] += size * count
        load = merged
    cards = spec.cards
    for card in cards:
        if quota.get(card, 0) - load.get(card, 0) < ask:
            return False
    for card, count in load.items():  # noqa: SIM110 (a loop: the hot path, faster than all())
        if count > quota.get(card, 0) and card not in cards:
            return False
    return True


def _usage(
    state: ClusterState, queue: str, tallies: list[Tally], queues: frozenset[str], exclude_ledger: str
) -> QueueUsage:
    info = state.tree.queues.get(queue)
    quota = dict(info.quota or {}) if info is not None else {}
    fixed: dict[CardName, dict[str, int]] = {}
    flex: dict[tuple[str, tuple[CardSpec, int]], int] = {}
    for tally in tallies:
        for origin, counter in (
            ("bound", tally.bound),
            ("pending", tally.pending),
            ("reserved", tally.reserved),
        ):
            for card, count in counter.items():
                slot = fixed.setdefault(card, {})
                slot[origin] = slot.get(origin, 0) + count
        for origin, flexible in (("pending", tally.pending_flex), ("reserved", tally.reserved_flex)):
            for key, pods in flexible.items():
                flex[(origin, key)] = flex.get((origin, key), 0) + pods
    groups = [
        Group(spec.cards, per_pod, pods, origin)
        for (origin, (spec, per_pod)), pods in sorted(flex.items(), key=_origin_order)
    ]
    held = state.ledger.held_in(queues, exclude_ledger)
    for (spec, per_pod), pods in sorted(held.items(), key=_flex_order):
        if spec.is_multi:
            groups.append(Group(spec.cards, per_pod, pods, "in flight"))
        else:
            slot = fixed.setdefault(spec.cards[0], {})
            slot["in flight"] = slot.get("in flight", 0) + per_pod * pods
    covers = state.ledger.covers_in(queues, exclude_ledger)
    return QueueUsage(queue, quota, fixed, _less(tuple(groups), covers) if covers else tuple(groups))


def _less(groups: tuple[Group, ...], covers: Iterable[Cover]) -> tuple[Group, ...]:
    out = list(groups)
    for cover in covers:
        for index, group in enumerate(out):
            if (
                group.origin == cover.origin
                and group.cards == cover.spec.cards
                and group.per_pod == cover.per_pod
            ):
                out[index] = Group(group.cards, group.per_pod, max(0, group.pods - cover.pods), group.origin)
                break
    return tuple(out)


def _origin_order(item: tuple[tuple[str, tuple[CardSpec, int]], int]) -> tuple[int, str, int]:
    (origin, (spec, per_pod)), _ = item
    return (0 if origin == "pending" else 1, spec.text, per_pod)


def _flex_order(item: tuple[tuple[CardSpec, int], int]) -> tuple[str, int]:
    (spec, per_pod), _ = item
    return (spec.text, per_pod)

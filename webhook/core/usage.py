"""What a queue has used, per card, and what is left: the numbers decisions and messages show."""

from collections import Counter
from dataclasses import dataclass

from webhook.core.cards import CardName, CardSpec
from webhook.core.feasibility import Group, Placement, backlog, fits, place
from webhook.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class CardUse:
    quota: int
    bound: int = 0
    pending: int = 0
    reserved: int = 0
    in_flight: int = 0

    @property
    def used(self) -> int:
        return self.bound + self.pending + self.reserved + self.in_flight

    @property
    def left(self) -> int:
        return max(0, self.quota - self.used)


@dataclass(frozen=True, slots=True)
class QueueUsage:
    """A queue's quota and usage, flexible demand placed by an exact assignment."""

    queue: str
    quota: dict[CardName, int]
    fixed: dict[CardName, dict[str, int]]  # card -> origin ("bound", "pending", ...) -> cards
    groups: tuple[Group, ...]

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
            self.quota.get(card, 0), parts["bound"], parts["pending"], parts["reserved"], parts["in flight"]
        )

    def backlog(self, spec: CardSpec) -> bool:
        """Whether demand already waiting around ``spec``'s cards exceeds what the quota holds."""
        return backlog(self.capacity(), self.groups, spec.cards)

    def fits(self, spec: CardSpec, per_pod: int, pods: int) -> bool:
        return fits(self.capacity(), self.groups, Group(spec.cards, per_pod, pods, "request"))


def queue_usage(state: ClusterState, queue: str, exclude_ledger: str = "") -> QueueUsage:
    """The usage of ``queue`` from the state's tallies and in-flight ledger (cost: cards × groups)."""
    info = state.queues.get(queue)
    quota = dict(info.quota or {}) if info is not None else {}
    tally = state.tallies.get(queue)
    fixed: dict[CardName, dict[str, int]] = {}
    groups: list[Group] = []
    if tally is not None:
        for origin, counter in (
            ("bound", tally.bound),
            ("pending", tally.pending),
            ("reserved", tally.reserved),
        ):
            for card, count in counter.items():
                fixed.setdefault(card, {})[origin] = count
        for (spec, per_pod), pods in sorted(tally.pending_flex.items(), key=_flex_order):
            groups.append(Group(spec.cards, per_pod, pods, "pending"))
        for (spec, per_pod), pods in sorted(tally.reserved_flex.items(), key=_flex_order):
            groups.append(Group(spec.cards, per_pod, pods, "reserved"))
    for (spec, per_pod), pods in sorted(state.ledger.held(queue, exclude_ledger).items(), key=_flex_order):
        if spec.is_multi:
            groups.append(Group(spec.cards, per_pod, pods, "in flight"))
        else:
            slot = fixed.setdefault(spec.cards[0], {})
            slot["in flight"] = slot.get("in flight", 0) + per_pod * pods
    return QueueUsage(queue, quota, fixed, tuple(groups))


def _flex_order(item: tuple[tuple[CardSpec, int], int]) -> tuple[str, int]:
    (spec, per_pod), _ = item
    return (spec.text, per_pod)

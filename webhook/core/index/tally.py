"""What one pod or PodGroup counts against a queue, and the per-queue sums those counts add up to.

A ``Charge`` is a live pod's card demand, a ``Reservation`` what an Inqueue/Running PodGroup holds
for pods not created yet; a ``Tally`` sums both per card so a decision reads a queue's figures
without walking its pods.
"""

from collections import Counter
from typing import Any

from webhook.core.model.cards import CardName, CardSpec
from webhook.core.model.values import value_class

FlexKey = tuple[CardSpec, int]


@value_class(weakref_slot=True)
class Charge:
    """What one live pod counts against its queue."""

    queue: str
    bound: bool
    card: CardName | None  # a fixed card, else flexible over spec
    spec: CardSpec  # what the pod asked for (before an assignment): its PodGroup's request key
    count: int
    group: str


@value_class(weakref_slot=True)
class ComputeCharge:
    """What one live Volcano-scheduled pod counts against its queue's capability (CPU/memory check)."""

    queue: str
    cpu: int  # millicores
    memory: int  # bytes


@value_class
class Reservation:
    """What one Inqueue/Running PodGroup holds for pods not created yet."""

    queue: str
    fixed: Counter[CardName]
    flex: Counter[FlexKey]


class Tally:
    """Per-queue sums: bound, pending (fixed and flexible), reserved (fixed and flexible), and per
    card the most that could land on it (``load``: fixed cards, plus every flexible pod counted on
    each of its alternatives), which a one-pass sufficient check reads."""

    __slots__ = ("bound", "load", "pending", "pending_flex", "reserved", "reserved_flex")

    def __init__(self) -> None:
        self.bound: Counter[CardName] = Counter()
        self.pending: Counter[CardName] = Counter()
        self.pending_flex: Counter[FlexKey] = Counter()
        self.reserved: Counter[CardName] = Counter()
        self.reserved_flex: Counter[FlexKey] = Counter()
        self.load: Counter[CardName] = Counter()

    def charge(self, charge: Charge, sign: int) -> None:
        if charge.card is None:
            _bump(self.pending_flex, (charge.spec, charge.count), sign)
            for card in charge.spec.cards:
                _bump(self.load, card, sign * charge.count)
        else:
            _bump(self.bound if charge.bound else self.pending, charge.card, sign * charge.count)
            _bump(self.load, charge.card, sign * charge.count)

    def reserve(self, reservation: Reservation, sign: int) -> None:
        for card, count in reservation.fixed.items():
            _bump(self.reserved, card, sign * count)
            _bump(self.load, card, sign * count)
        for (spec, size), count in reservation.flex.items():
            _bump(self.reserved_flex, (spec, size), sign * count)
            for card in spec.cards:
                _bump(self.load, card, sign * size * count)

    def add(self, other: "Tally") -> None:
        """Add every sum of ``other`` (a subtree's tally is its descendants' added up)."""
        for mine, theirs in (
            (self.bound, other.bound),
            (self.pending, other.pending),
            (self.pending_flex, other.pending_flex),
            (self.reserved, other.reserved),
            (self.reserved_flex, other.reserved_flex),
            (self.load, other.load),
        ):
            for key, count in theirs.items():
                _bump(mine, key, count)


def _bump(counter: Counter[Any], key: Any, delta: int) -> None:
    """Add ``delta`` and forget keys that reach zero, so tallies hold only what is in use."""
    value = counter[key] + delta
    if value:
        counter[key] = value
    else:
        del counter[key]

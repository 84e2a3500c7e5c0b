"""The queues and their tree: each queue's quota, its tally, and for hierarchical queues
(``spec.parent``) its ancestors and the tally of its whole subtree.

Every charge or reservation is counted here, in the queue's own tally and in the subtree tally of
each queue it counts in, so an ancestor's usage costs no more to read than a queue's.
"""

import math
from collections import Counter, defaultdict
from collections.abc import Mapping

from webhook.core.index.tally import Charge, Reservation, Tally
from webhook.core.model import keys
from webhook.core.model.cards import CardName
from webhook.core.model.objects import QueueRecord
from webhook.core.model.quantity import QuantityError, parse_quantity
from webhook.core.model.quota import AnnotationError, Lending, parse_lending, parse_quota
from webhook.core.model.values import value_class

MAX_DEPTH = 16  # ancestors followed at most (Volcano trees are a few levels deep)


@value_class
class QueueInfo:
    record: QueueRecord
    quota: dict[CardName, int] | None  # None: no card.quota annotation
    quota_error: str = ""
    cpu: int | None = None  # spec.capability.cpu in millicores; None: not set
    memory: int | None = None  # spec.capability.memory in bytes; None: not set
    lending: Lending | None = None  # card.deserved (and card.lendable); None: the quota is a wall
    lending_error: str = ""


class QueueTree:
    """Queues by name, their tallies, and the hierarchy over them."""

    def __init__(self, hierarchical: bool = True) -> None:
        self.hierarchical = hierarchical
        self.queues: dict[str, QueueInfo] = {}
        self.tallies: dict[str, Tally] = defaultdict(Tally)
        self.ancestors: dict[str, tuple[str, ...]] = {}  # nearest first
        self.descendants: dict[str, frozenset[str]] = {}  # a queue with children -> it and all below
        self.subtree: dict[str, Tally] = {}  # a queue with children -> its whole subtree's tally
        # a cohort (its queues' nearest existing parent, "" for the top) -> the queues in it
        self.cohorts: dict[str, frozenset[str]] = {}
        self.version = 0  # moves at every change of a queue or a tally (what is read is cached by it)
        # what ``cohorts`` worked out per (cohort, model), kept while nothing it read changes
        self.pools: dict[tuple[str, CardName], object] = {}
        self.shares: dict[tuple[str, CardName], object] = {}  # and per (queue, model)
        self.pools_at: tuple[int, int] = (-1, -1)

    def ever_holds(self, queue: str, cards: tuple[CardName, ...], per_pod: int, pods: int) -> bool:
        """Whether ``pods`` pods of ``per_pod`` units, each whole on one of ``cards`` (the pods
        spread over them), could all fit at once the whole quota of ``queue`` and of every ancestor,
        each pod's model within each quota that names it (as the pod mutation gives models); a
        queue the tree does not know holds nothing."""
        if queue not in self.queues:
            return False
        if per_pod <= 0:  # asks nothing: any quota holds it
            return True
        own = self.queues[queue].quota or {}
        caps = dict.fromkeys(cards, 0) | {card: own[card] for card in cards if card in own}
        for name in self.ancestors.get(queue, ()):  # each limits the models its quota names
            quota = self.queues[name].quota or {}
            for card in cards:
                if card in quota:
                    caps[card] = min(caps[card], quota[card])
        return sum(cap // per_pod for cap in caps.values()) >= pods

    def upsert(self, record: QueueRecord) -> None:
        text = record.annotations.get(keys.CARD_QUOTA)
        quota, error = None, ""
        if text is not None:
            try:
                quota = parse_quota(keys.CARD_QUOTA, text)
            except AnnotationError as exc:
                quota, error = {}, str(exc)
        lending, lending_error = _lending(record, quota)
        self.version += 1
        before = self.queues.get(record.name)
        cpu, memory = _capability(record, "cpu", 1000), _capability(record, "memory", 1)
        self.queues[record.name] = QueueInfo(record, quota, error, cpu, memory, lending, lending_error)
        if before is None or before.record.parent != record.parent:
            self._rebuild()

    def delete(self, name: str) -> None:
        self.version += 1
        if self.queues.pop(name, None) is not None:
            self._rebuild()

    def count(
        self, queue: str, charge: Charge | None = None, reservation: Reservation | None = None, sign: int = 1
    ) -> None:
        """Apply one charge or reservation to ``queue``'s tally and the subtree tallies it counts in."""
        self.version += 1
        tallies = [self.tallies[queue], *(self.subtree[q] for q in self._counted_in(queue))]
        for tally in tallies:
            if charge is not None:
                tally.charge(charge, sign)
            if reservation is not None:
                tally.reserve(reservation, sign)

    def _rebuild(self) -> None:
        """Recompute ancestors and subtree tallies: only when a queue appears, goes, or moves."""
        self.ancestors = {name: self._chain(name) for name in self.queues}
        below: dict[str, set[str]] = defaultdict(set)
        for name, chain in self.ancestors.items():
            for ancestor in chain:
                below[ancestor].add(name)
        self.descendants = {name: frozenset(names | {name}) for name, names in below.items()}
        self.subtree = {name: Tally() for name in self.descendants}
        cohorts: dict[str, set[str]] = defaultdict(set)
        for name, chain in self.ancestors.items():
            cohorts[chain[0] if chain else ""].add(name)
        self.cohorts = {key: frozenset(names) for key, names in cohorts.items()}
        for name, tally in self.tallies.items():
            for queue in self._counted_in(name):
                self.subtree[queue].add(tally)

    def cohort(self, queue: str) -> frozenset[str]:
        """The queues ``queue`` lends to and borrows from, itself included: those of the same nearest
        existing parent (the top-level queues are one cohort)."""
        chain = self.ancestors.get(queue, ())
        return self.cohorts.get(chain[0] if chain else "", frozenset((queue,)))

    def _counted_in(self, queue: str) -> tuple[str, ...]:
        """The subtrees ``queue``'s own use counts in: its ancestors', and its own if it has children."""
        chain = self.ancestors.get(queue, ())
        return (queue, *chain) if queue in self.descendants else chain

    def _chain(self, name: str) -> tuple[str, ...]:
        """The existing queues above ``name``, nearest first; a cycle or a missing parent ends it."""
        chain: list[str] = []
        seen = {name}
        parent = self.queues[name].record.parent if self.hierarchical else ""
        while parent and parent in self.queues and parent not in seen and len(chain) < MAX_DEPTH:
            chain.append(parent)
            seen.add(parent)
            parent = self.queues[parent].record.parent
        return tuple(chain)


def _lending(record: QueueRecord, quota: dict[CardName, int] | None) -> tuple[Lending | None, str]:
    """The queue's ``card.deserved`` and ``card.lendable``; (None, why) when malformed: the queue's
    quota is then a wall, as without them (its write was refused; this one came around the webhook)."""
    deserved = record.annotations.get(keys.CARD_DESERVED)
    if deserved is None or quota is None:
        return None, ""
    try:
        lendable = record.annotations.get(keys.CARD_LENDABLE)
        return parse_lending(quota, keys.CARD_DESERVED, deserved, keys.CARD_LENDABLE, lendable), ""
    except AnnotationError as exc:
        return None, str(exc)


def _capability(record: QueueRecord, name: str, scale: int) -> int | None:
    value = record.capability.get(name)
    if value is None:
        return None
    try:
        return max(0, math.floor(parse_quantity(value) * scale))
    except QuantityError:
        return None


def quota_sums(
    quotas: Mapping[str, Mapping[CardName, int]], chains: Mapping[str, tuple[str, ...]]
) -> Counter[CardName]:
    """Per card, what the queues' quotas promise the cluster: a queue under an ancestor whose quota
    also names the card is counted within that ancestor's quota, not again."""
    totals: Counter[CardName] = Counter()
    for queue, cards in quotas.items():
        for card, count in cards.items():
            if not any(card in quotas.get(above, {}) for above in chains.get(queue, ())):
                totals[card] += count
    return totals

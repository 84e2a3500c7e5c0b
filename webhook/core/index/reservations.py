"""What an Inqueue or Running PodGroup holds for the pods it has not created yet.

A PodGroup asks for ``card.request`` (else the card resource of its ``minResources``); what its
existing pods already charge is taken off, and the rest is reserved in its queue's tally.
``Reservations`` owns the reservation of every group and counts it in the queue tree; the state
calls ``refresh`` whenever a group, its owner or the demand of its pods changes.
"""

from collections import Counter
from collections.abc import Mapping

from webhook.core.index.queues import QueueTree
from webhook.core.index.tally import FlexKey, Reservation
from webhook.core.model import keys
from webhook.core.model.cards import UNIT, CardName, CardSpec, units
from webhook.core.model.demand import PodDemand, pod_demand
from webhook.core.model.inventory import Inventory
from webhook.core.model.objects import PodGroupRecord, WorkloadRecord
from webhook.core.model.policy import Policy
from webhook.core.model.quantity import QuantityError, ceil_quantity
from webhook.core.model.quota import AnnotationError, parse_card_request

RESERVING_PHASES = frozenset({"Inqueue", "Running"})


def asks_more(was: Mapping[CardSpec, int], now: Mapping[CardSpec, int], moved: bool) -> bool:
    """Whether an enqueued PodGroup's request ``now`` (or its queue, ``moved``) asks more than it
    was enqueued with (``was``): more of a spec, another spec, or another queue (SPEC §4b)."""
    return moved or any(count > was.get(spec, 0) for spec, count in now.items())


class Reservations:
    """Each reserving PodGroup's reservation, by PodGroup key, counted in the queue tree."""

    def __init__(self, tree: QueueTree) -> None:
        self._tree = tree
        self._held: dict[str, Reservation] = {}

    def refresh(
        self,
        key: str,
        group: PodGroupRecord | None,
        asked: Mapping[CardSpec, int],
        existing: Counter[CardSpec],
        bound: int,
    ) -> None:
        """Take back the group's old reservation, if any, and count the one it holds now: ``asked``
        less ``existing`` (what its pods charge already); ``bound``: its bound live pods."""
        old = self._held.pop(key, None)
        if old is not None:
            self._tree.count(old.queue, reservation=old, sign=-1)
        new = reservation(group, asked, existing, bound) if group is not None else None
        if new is not None and (new.fixed or new.flex):
            self._held[key] = new
            self._tree.count(new.queue, reservation=new, sign=+1)

    def get(self, key: str) -> Reservation | None:
        return self._held.get(key)

    def __len__(self) -> int:
        return len(self._held)


def reservation(
    group: PodGroupRecord, asked: Mapping[CardSpec, int], existing: Counter[CardSpec], bound: int
) -> Reservation | None:
    """What ``group`` reserves beyond its existing pods' demand; None unless Inqueue, or Running with
    at least ``minMember`` of its pods bound (``bound``): a Running group whose pods finished or
    went below its minimum reserves nothing, as the plugin counts it (``capacity_card_queue.go``:
    a Running job's inqueue part only while its allocated tasks reach ``minMember``)."""
    if group.phase not in RESERVING_PHASES:
        return None
    if group.phase == "Running" and bound < group.min_member:
        return None
    fixed: Counter[CardName] = Counter()
    flex: Counter[FlexKey] = Counter()
    for spec, count in asked.items():
        rest = count - existing.get(spec, 0)
        if rest <= 0:
            continue
        if spec.is_multi:
            flex[(spec, UNIT)] += -(-rest // UNIT)  # reserved cards, whole, split card by card
        else:
            fixed[spec.cards[0]] += rest
    return Reservation(group.queue or keys.DEFAULT_QUEUE, fixed, flex)


def group_request(
    group: PodGroupRecord, owner: WorkloadRecord | None, inventory: Inventory, policy: Policy
) -> dict[CardSpec, int]:
    """What a PodGroup asks for: ``card.request``, else ``minResources`` of its card resource, the
    card read from its ``owner``'s pod templates."""
    text = group.annotations.get(keys.CARD_REQUEST)
    if text:
        try:
            return dict(parse_card_request(keys.CARD_REQUEST, text).counts)
        except AnnotationError:
            return {}
    if owner is None:
        return {}
    asked: dict[CardSpec, int] = {}
    for task in owner.tasks:
        demand = pod_demand(task.template, inventory, policy)
        if isinstance(demand, PodDemand) and demand.resource in group.min_resources:
            try:
                asked[demand.spec] = units(ceil_quantity(group.min_resources[demand.resource]))
            except QuantityError:
                continue
    return asked

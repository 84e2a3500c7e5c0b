"""What an Inqueue or Running PodGroup holds for the pods it has not created yet.

A PodGroup asks for ``card.request`` (else the card resource of its ``minResources``); what its
existing pods already charge is taken off, and the rest is reserved in its queue's tally. Each pod
indexed or unindexed in the group refreshes the reservation.
"""

from collections import Counter
from typing import TYPE_CHECKING

from webhook.core import keys
from webhook.core.cards import UNIT, CardName, CardSpec, units
from webhook.core.demand import PodDemand, pod_demand
from webhook.core.objects import PodGroupRecord
from webhook.core.quantity import QuantityError, ceil_quantity
from webhook.core.quota import AnnotationError, parse_card_request
from webhook.core.tally import FlexKey, Reservation

if TYPE_CHECKING:
    from webhook.core.state import ClusterState

RESERVING_PHASES = frozenset({"Inqueue", "Running"})


def refresh(state: "ClusterState", key: str) -> None:
    """Take back the PodGroup's old reservation, if any, and count its current one."""
    old = state.reservations.pop(key, None)
    if old is not None:
        state.tree.count(old.queue, reservation=old, sign=-1)
    new = _reservation(state, key)
    if new is not None and (new.fixed or new.flex):
        state.reservations[key] = new
        state.tree.count(new.queue, reservation=new, sign=+1)


def group_request(state: "ClusterState", group: PodGroupRecord) -> dict[CardSpec, int]:
    """What a PodGroup asks for: ``card.request``, else ``minResources`` of its card resource."""
    text = group.annotations.get(keys.CARD_REQUEST)
    if text:
        try:
            return dict(parse_card_request(keys.CARD_REQUEST, text).counts)
        except AnnotationError:
            return {}
    owner = state.workloads_by_uid.get(group.owner.uid) if group.owner else None
    if owner is None:
        return {}
    asked: dict[CardSpec, int] = {}
    for task in owner.tasks:
        demand = pod_demand(task.template, state.inventory, state.policy)
        if isinstance(demand, PodDemand) and demand.resource in group.min_resources:
            try:
                asked[demand.spec] = units(ceil_quantity(group.min_resources[demand.resource]))
            except QuantityError:
                continue
    return asked


def _reservation(state: "ClusterState", key: str) -> Reservation | None:
    group = state.podgroups.get(key)
    if group is None or group.phase not in RESERVING_PHASES:
        return None
    existing = state.group_cards.get(key, Counter())
    fixed: Counter[CardName] = Counter()
    flex: Counter[FlexKey] = Counter()
    for spec, count in group_request(state, group).items():
        rest = count - existing.get(spec, 0)
        if rest <= 0:
            continue
        if spec.is_multi:
            flex[(spec, UNIT)] += -(-rest // UNIT)  # reserved cards, whole, split card by card
        else:
            fixed[spec.cards[0]] += rest
    return Reservation(group.queue or keys.DEFAULT_QUEUE, fixed, flex)

"""What each live pod counts against its queue, and the indexes that find a pod's charge again.

Indexing a pod charges its queue (and the queues above it), the node's free cards when it is bound,
and its PodGroup's demand; unindexing takes exactly that back. The CPU/memory check's charge is
kept beside the card charge.
"""

from collections.abc import Iterable
from typing import TYPE_CHECKING

from webhook.core import reservations
from webhook.core.cards import CardName
from webhook.core.demand import Demand, NotCardPod, PodDemand, pod_demand
from webhook.core.objects import TERMINAL_PHASES, PodRecord, PodTemplate
from webhook.core.tally import Charge, ComputeCharge

if TYPE_CHECKING:
    from webhook.core.state import ClusterState


def index_pod(state: "ClusterState", pod: PodRecord) -> None:
    if pod.group_name:
        state.group_pods[f"{pod.namespace}/{pod.group_name}"].add(pod.uid)
    if pod.node_name:
        state.node_pods[pod.node_name].add(pod.uid)
    if pod.owner is not None:
        state.owner_pods[pod.owner.uid].add(pod.uid)
    if state.policy.cpu_memory_check:
        _index_compute(state, pod)
    charge = charge_of(state, pod)
    if charge is None:
        return
    state.charges[pod.uid] = charge
    state.tree.count(charge.queue, charge=charge, sign=+1)
    if charge.bound and charge.card is not None:
        state.free.use(pod.node_name, charge.card, charge.count)
    if charge.group:
        state.group_cards[charge.group][charge.spec] += charge.count
        reservations.refresh(state, charge.group)


def unindex_pod(state: "ClusterState", uid: str) -> None:
    pod = state.pods.get(uid)
    if pod is None:
        return
    if pod.group_name:
        state.group_pods[f"{pod.namespace}/{pod.group_name}"].discard(uid)
    state.node_pods[pod.node_name].discard(uid)
    if pod.owner is not None:
        state.owner_pods[pod.owner.uid].discard(uid)
    compute = state.compute.pop(uid, None)
    if compute is not None:
        used = state.compute_used[compute.queue]
        used[0] -= compute.cpu
        used[1] -= compute.memory
    charge = state.charges.pop(uid, None)
    if charge is None:
        return
    state.tree.count(charge.queue, charge=charge, sign=-1)
    if charge.bound and charge.card is not None:
        state.free.use(pod.node_name, charge.card, -charge.count)
    if charge.group:
        state.group_cards[charge.group][charge.spec] -= charge.count
        reservations.refresh(state, charge.group)


def recharge(state: "ClusterState", uids: Iterable[str]) -> None:
    """Charge these pods again: their node, queue, PodGroup or owner changed."""
    for uid in uids:
        pod = state.pods.get(uid)
        if pod is not None:
            unindex_pod(state, uid)
            index_pod(state, pod)


def charge_of(state: "ClusterState", pod: PodRecord) -> Charge | None:
    """The card charge of a live pod: fixed to a card, or flexible over its ``A|B`` spec until it is
    bound; None for a finished pod or one that uses no card."""
    if pod.phase in ("Succeeded", "Failed"):
        return None
    memo = state.memo
    demand: Demand | None = None if memo is None else memo.get(id(pod.template))
    if demand is None:
        demand = pod_demand(pod.template, state.inventory, state.policy)
        if memo is not None:
            memo[id(pod.template)] = demand
    if not isinstance(demand, PodDemand):
        return None
    group = f"{pod.namespace}/{pod.group_name}" if pod.group_name else ""
    queue = state.queue_of_pod(pod)
    card: CardName | None = demand.spec.cards[0] if not demand.spec.is_multi else None
    if pod.node_name and card is None:
        on_node = state.nodes.get(pod.node_name)
        names = on_node.card_names() if on_node else frozenset()
        card = next((c for c in demand.spec.cards if c in names), None)
    bound = bool(pod.node_name) and card is not None
    if memo is None:
        return state.pool.share(Charge(queue, bound, card, demand.asked, demand.count, group))
    key = (id(demand), queue, bound, card, group)
    if (charge := memo.get(key)) is None:
        charge = memo[key] = state.pool.share(Charge(queue, bound, card, demand.asked, demand.count, group))
    return charge


def _index_compute(state: "ClusterState", pod: PodRecord) -> None:
    if pod.phase in TERMINAL_PHASES:
        return
    charged = compute_charged(state, pod.template)
    if charged is None:
        return
    compute = state.pool.share(ComputeCharge(state.queue_of_pod(pod), *charged))
    state.compute[pod.uid] = compute
    used = state.compute_used[compute.queue]
    used[0] += compute.cpu
    used[1] += compute.memory


def compute_charged(state: "ClusterState", template: PodTemplate) -> tuple[int, int] | None:
    """CPU (millicores) and memory (bytes) the CPU/memory check charges one pod of ``template``:
    None when the check is off, the pod is not Volcano's to schedule, requests neither, or uses
    cards while card pods are unlimited."""
    policy = state.policy
    if not policy.cpu_memory_check or template.scheduler not in policy.volcano_schedulers:
        return None
    cpu, memory = template.resources.cpu, template.resources.memory
    if not cpu and not memory:
        return None
    unlimited = policy.card_unlimited_cpu_memory
    if unlimited and not isinstance(pod_demand(template, state.inventory, policy), NotCardPod):
        return None  # a pod that uses cards
    return cpu, memory

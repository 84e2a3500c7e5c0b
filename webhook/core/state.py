"""The in-memory cluster state both fronts decide from, with per-queue tallies kept incrementally.

Every pod, PodGroup and workload update adjusts the tallies of the one queue it touches, so a
decision reads a queue's tally (cards × groups) and never walks the pods.
"""

import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.core import compact, keys
from webhook.core.cards import UNIT, CardName, CardSpec, units
from webhook.core.demand import Demand, NotCardPod, PodDemand, pod_demand
from webhook.core.freecards import FreeCards
from webhook.core.ledger import Ledger
from webhook.core.nodes import Inventory, NodeCards
from webhook.core.objects import (
    TERMINAL_PHASES,
    PodGroupRecord,
    PodRecord,
    PodTemplate,
    QueueRecord,
    WorkloadRecord,
)
from webhook.core.policy import Policy
from webhook.core.quantity import QuantityError, ceil_quantity, parse_quantity
from webhook.core.quota import AnnotationError, parse_card_request, parse_quota
from webhook.core.values import value_class

RESERVING_PHASES = frozenset({"Inqueue", "Running"})
MAX_DEPTH = 16  # ancestors followed at most (Volcano trees are a few levels deep)
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


@value_class
class QueueInfo:
    record: QueueRecord
    quota: dict[CardName, int] | None  # None: no card.quota annotation
    quota_error: str = ""
    cpu: int | None = None  # spec.capability.cpu in millicores; None: not set
    memory: int | None = None  # spec.capability.memory in bytes; None: not set


def _capability(record: QueueRecord, name: str, scale: int) -> int | None:
    value = record.capability.get(name)
    if value is None:
        return None
    try:
        return max(0, math.floor(parse_quantity(value) * scale))
    except QuantityError:
        return None


class ClusterState:
    """Nodes, queues, pods, PodGroups and workloads, indexed for admission decisions."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        self.nodes: dict[str, NodeCards] = {}
        self.inventory = Inventory()
        self.queues: dict[str, QueueInfo] = {}
        self.pods: dict[str, PodRecord] = {}
        self.podgroups: dict[str, PodGroupRecord] = {}
        self.workloads: dict[tuple[str, str], WorkloadRecord] = {}  # (kind, ns/name)
        self.workloads_by_uid: dict[str, WorkloadRecord] = {}
        self.ledger = Ledger()
        self.free = FreeCards()  # free cards per node and model, for the multi-card assignment
        self.tallies: dict[str, Tally] = defaultdict(Tally)
        # Hierarchical queues (spec.parent): each queue's ancestors, nearest first, and for each
        # queue with children the tally of its whole subtree (itself and all its descendants), kept
        # with the queues' own tallies so an ancestor's usage costs no more than a queue's.
        self.ancestors: dict[str, tuple[str, ...]] = {}
        self.descendants: dict[str, frozenset[str]] = {}  # a queue with children -> it and all below
        self.subtree: dict[str, Tally] = {}
        # CPU/memory check: millicores and bytes charged per queue by its live pods.
        self.compute_used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.notes: list[str] = []
        self.skipped: dict[str, str] = {}  # kind/namespace/name -> why its shape cannot be read
        self._charges: dict[str, Charge] = {}
        self._compute: dict[str, ComputeCharge] = {}
        self._reservations: dict[str, Reservation] = {}
        self._group_pods: dict[str, set[str]] = defaultdict(set)
        self._group_demand: dict[str, Counter[CardSpec]] = defaultdict(Counter)
        self._node_pods: dict[str, set[str]] = defaultdict(set)
        self._owner_pods: dict[str, set[str]] = defaultdict(set)
        self._owner_groups: dict[str, set[str]] = defaultdict(set)
        self._children: dict[str, set[str]] = defaultdict(set)  # owner uid -> workload uids
        self._deadlines: list[tuple[float, str]] = []
        self._pool = compact.Pool()
        self._memo: dict[Any, Any] | None = None  # only while ``upsert_pods`` runs

    # ---- nodes -------------------------------------------------------------------------
    def upsert_node(self, cards: NodeCards) -> None:
        if self.nodes.get(cards.node) == cards:
            return
        self.nodes[cards.node] = cards
        self.free.set_node(cards)
        self._after_node_change(cards.node, self.inventory.put(cards))

    def delete_node(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self.free.delete_node(name)
            self._after_node_change(name, self.inventory.remove(name))

    def _after_node_change(self, node: str, moved: set[CardName]) -> None:
        if moved:
            self._recharge(list(self.pods))  # a card's resource name moved: rare, walk all
        else:
            self._recharge(list(self._node_pods.get(node, ())))

    # ---- queues ------------------------------------------------------------------------
    def upsert_queue(self, record: QueueRecord) -> None:
        text = record.annotations.get(keys.CARD_QUOTA)
        quota, error = None, ""
        if text is not None:
            try:
                quota = parse_quota(keys.CARD_QUOTA, text)
            except AnnotationError as exc:
                quota, error = {}, str(exc)
        before = self.queues.get(record.name)
        cpu, memory = _capability(record, "cpu", 1000), _capability(record, "memory", 1)
        self.queues[record.name] = QueueInfo(record, quota, error, cpu, memory)
        if before is None or before.record.parent != record.parent:
            self._rebuild_tree()

    def delete_queue(self, name: str) -> None:
        if self.queues.pop(name, None) is not None:
            self._rebuild_tree()

    def _rebuild_tree(self) -> None:
        """Recompute ancestors and subtree tallies: only when a queue appears, goes, or moves."""
        self.ancestors = {name: self._chain(name) for name in self.queues}
        below: dict[str, set[str]] = defaultdict(set)
        for name, chain in self.ancestors.items():
            for ancestor in chain:
                below[ancestor].add(name)
        self.descendants = {name: frozenset(names | {name}) for name, names in below.items()}
        self.subtree = {name: Tally() for name in self.descendants}
        for name, tally in self.tallies.items():
            for queue in self._counted_in(name):
                self.subtree[queue].add(tally)

    def _counted_in(self, queue: str) -> tuple[str, ...]:
        """The subtrees ``queue``'s own use counts in: its ancestors', and its own if it has children."""
        chain = self.ancestors.get(queue, ())
        return (queue, *chain) if queue in self.descendants else chain

    def _chain(self, name: str) -> tuple[str, ...]:
        """The existing queues above ``name``, nearest first; a cycle or a missing parent ends it."""
        chain: list[str] = []
        seen = {name}
        parent = self.queues[name].record.parent if self.policy.hierarchical_queues else ""
        while parent and parent in self.queues and parent not in seen and len(chain) < MAX_DEPTH:
            chain.append(parent)
            seen.add(parent)
            parent = self.queues[parent].record.parent
        return tuple(chain)

    def _count(
        self, queue: str, charge: Charge | None = None, reservation: Reservation | None = None, sign: int = 1
    ) -> None:
        """Apply one charge or reservation to ``queue``'s tally and the subtree tallies it counts in."""
        tallies = [self.tallies[queue], *(self.subtree[q] for q in self._counted_in(queue))]
        for tally in tallies:
            if charge is not None:
                tally.charge(charge, sign)
            if reservation is not None:
                tally.reserve(reservation, sign)

    # ---- pods --------------------------------------------------------------------------
    @property
    def pool(self) -> compact.Pool:
        """The shared values this state's records are built from."""
        return self._pool

    def upsert_pod(self, pod: PodRecord, pooled: bool = False) -> None:
        """Add or replace a pod; ``pooled``: its record is built from ``self.pool`` already."""
        if not pooled:
            pod = self._pool.pod(pod)
        old = self.pods.get(pod.uid)
        self._unindex_pod(pod.uid)
        self.pods[pod.uid] = pod
        if old is None:
            # A pod admitted here holds its own entry (taken from its scale-up's at admission);
            # one admitted elsewhere still comes out of its workload's scale-up hold.
            if self.ledger.get(pod.uid) is not None:
                self.ledger.settle(pod.uid)
            elif (workload := self.workload_of(pod)) is not None:
                self.ledger.settle(scale_key(workload))
        if pod.deletion_deadline is not None:
            heapq.heappush(self._deadlines, (pod.deletion_deadline, pod.uid))
        self._index_pod(pod)

    def upsert_pods(self, pods: Iterable[PodRecord]) -> None:
        """Many pods at once (a list), their records built from ``self.pool``: the demand and the
        charge of each template are worked out once for all its pods (nodes and queues do not
        change meanwhile)."""
        self._memo = {}  # id(template) -> demand, (id(demand), queue, ...) -> charge: alive meanwhile
        try:
            for pod in pods:
                self.upsert_pod(pod, pooled=True)
        finally:
            self._memo = None

    def delete_pod(self, uid: str) -> None:
        if uid in self.pods:
            self._unindex_pod(uid)
            del self.pods[uid]

    def expire(self, now: float) -> None:
        """Drop pods past their deletion grace period and stale in-flight entries."""
        while self._deadlines and self._deadlines[0][0] < now:
            _, uid = heapq.heappop(self._deadlines)
            pod = self.pods.get(uid)
            if pod is not None and pod.is_terminal(now):
                self._unindex_pod(uid)
        self.ledger.expire(now)

    def _index_pod(self, pod: PodRecord) -> None:
        if pod.group_name:
            self._group_pods[f"{pod.namespace}/{pod.group_name}"].add(pod.uid)
        if pod.node_name:
            self._node_pods[pod.node_name].add(pod.uid)
        if pod.owner is not None:
            self._owner_pods[pod.owner.uid].add(pod.uid)
        if self.policy.cpu_memory_check:
            self._index_compute(pod)
        charge = self._charge_of(pod)
        if charge is None:
            return
        self._charges[pod.uid] = charge
        self._count(charge.queue, charge=charge, sign=+1)
        if charge.bound and charge.card is not None:
            self.free.use(pod.node_name, charge.card, charge.count)
        if charge.group:
            self._group_demand[charge.group][charge.spec] += charge.count
            self._refresh_reservation(charge.group)

    def _unindex_pod(self, uid: str) -> None:
        pod = self.pods.get(uid)
        if pod is None:
            return
        if pod.group_name:
            self._group_pods[f"{pod.namespace}/{pod.group_name}"].discard(uid)
        self._node_pods[pod.node_name].discard(uid)
        if pod.owner is not None:
            self._owner_pods[pod.owner.uid].discard(uid)
        compute = self._compute.pop(uid, None)
        if compute is not None:
            used = self.compute_used[compute.queue]
            used[0] -= compute.cpu
            used[1] -= compute.memory
        charge = self._charges.pop(uid, None)
        if charge is None:
            return
        self._count(charge.queue, charge=charge, sign=-1)
        if charge.bound and charge.card is not None:
            self.free.use(pod.node_name, charge.card, -charge.count)
        if charge.group:
            self._group_demand[charge.group][charge.spec] -= charge.count
            self._refresh_reservation(charge.group)

    def _recharge(self, uids: Iterable[str]) -> None:
        for uid in uids:
            pod = self.pods.get(uid)
            if pod is not None:
                self._unindex_pod(uid)
                self._index_pod(pod)

    def _charge_of(self, pod: PodRecord) -> Charge | None:
        if pod.phase in ("Succeeded", "Failed"):
            return None
        memo = self._memo
        demand: Demand | None = None if memo is None else memo.get(id(pod.template))
        if demand is None:
            demand = pod_demand(pod.template, self.inventory, self.policy)
            if memo is not None:
                memo[id(pod.template)] = demand
        if not isinstance(demand, PodDemand):
            return None
        group = f"{pod.namespace}/{pod.group_name}" if pod.group_name else ""
        queue = self.queue_of_pod(pod)
        card: CardName | None = demand.spec.cards[0] if not demand.spec.is_multi else None
        if pod.node_name and card is None:
            on_node = self.nodes.get(pod.node_name)
            names = on_node.card_names() if on_node else frozenset()
            card = next((c for c in demand.spec.cards if c in names), None)
        bound = bool(pod.node_name) and card is not None
        if memo is None:
            return self._pool.share(Charge(queue, bound, card, demand.asked, demand.count, group))
        key = (id(demand), queue, bound, card, group)
        if (charge := memo.get(key)) is None:
            charge = memo[key] = self._pool.share(
                Charge(queue, bound, card, demand.asked, demand.count, group)
            )
        return charge

    def _index_compute(self, pod: PodRecord) -> None:
        if pod.phase in TERMINAL_PHASES:
            return
        charged = self.compute_charged(pod.template)
        if charged is None:
            return
        compute = self._pool.share(ComputeCharge(self.queue_of_pod(pod), *charged))
        self._compute[pod.uid] = compute
        used = self.compute_used[compute.queue]
        used[0] += compute.cpu
        used[1] += compute.memory

    def compute_charged(self, template: PodTemplate) -> tuple[int, int] | None:
        """CPU (millicores) and memory (bytes) the CPU/memory check charges one pod of ``template``:
        None when the check is off, the pod is not Volcano's to schedule, requests neither, or uses
        cards while card pods are unlimited."""
        policy = self.policy
        if not policy.cpu_memory_check or template.scheduler not in policy.volcano_schedulers:
            return None
        cpu, memory = template.resources.cpu, template.resources.memory
        if not cpu and not memory:
            return None
        unlimited = policy.card_unlimited_cpu_memory
        if unlimited and not isinstance(pod_demand(template, self.inventory, policy), NotCardPod):
            return None  # a pod that uses cards
        return cpu, memory

    def charge_of(self, uid: str) -> Charge | None:
        return self._charges.get(uid)

    # ---- queue resolution and ownership --------------------------------------------------
    def queue_of_pod(self, pod: PodRecord) -> str:
        named = pod.template.annotations.get(keys.QUEUE_NAME)
        if named:
            return named
        group = self.podgroups.get(f"{pod.namespace}/{pod.group_name}") if pod.group_name else None
        if group is not None and group.queue:
            return group.queue
        owner = self.workloads_by_uid.get(pod.owner.uid) if pod.owner else None
        if owner is not None and owner.kind == "Job" and owner.queue:
            return owner.queue
        return keys.DEFAULT_QUEUE

    def workload_of(self, pod: PodRecord) -> WorkloadRecord | None:
        """The scalable workload a pod belongs to (a ReplicaSet's Deployment when it has one)."""
        if pod.owner is None:
            return None
        owner = self.workloads_by_uid.get(pod.owner.uid)
        if owner is not None and owner.kind == "ReplicaSet" and owner.owner is not None:
            return self.workloads_by_uid.get(owner.owner.uid, owner)
        return owner

    def live_pods_of(self, workload: WorkloadRecord) -> int:
        uids = set(self._owner_pods.get(workload.uid, ()))
        for child in self._children.get(workload.uid, ()):
            uids |= self._owner_pods.get(child, set())
        return sum(
            1 for uid in uids if uid in self.pods and self.pods[uid].phase not in ("Succeeded", "Failed")
        )

    def pods_owned_by(self, uid: str) -> list[PodRecord]:
        return [self.pods[p] for p in self._owner_pods.get(uid, ()) if p in self.pods]

    def group_demand(self, group: str) -> Counter[CardSpec]:
        return self._group_demand.get(group, Counter())

    # ---- workloads ---------------------------------------------------------------------
    def upsert_workload(self, workload: WorkloadRecord) -> None:
        old = self.workloads_by_uid.get(workload.uid)
        if old is not None:
            self.workloads.pop((old.kind, old.key), None)
            if old.owner is not None:
                self._children[old.owner.uid].discard(old.uid)
        if workload.owner is not None:
            self._children[workload.owner.uid].add(workload.uid)
        self.workloads[(workload.kind, workload.key)] = workload
        self.workloads_by_uid[workload.uid] = workload
        self._after_owner_change(workload.uid)

    def delete_workload(self, kind: str, key: str) -> None:
        workload = self.workloads.pop((kind, key), None)
        if workload is not None:
            self.workloads_by_uid.pop(workload.uid, None)
            if workload.owner is not None:
                self._children[workload.owner.uid].discard(workload.uid)
            self._after_owner_change(workload.uid)

    def workload(self, kind: str, namespace: str, name: str) -> WorkloadRecord | None:
        return self.workloads.get((kind, f"{namespace}/{name}"))

    def _after_owner_change(self, uid: str) -> None:
        self._recharge(list(self._owner_pods.get(uid, ())))
        for group in list(self._owner_groups.get(uid, ())):
            self._refresh_reservation(group)

    # ---- PodGroups ---------------------------------------------------------------------
    def upsert_podgroup(self, group: PodGroupRecord) -> None:
        old = self.podgroups.get(group.key)
        if old is not None and old.owner is not None:
            self._owner_groups[old.owner.uid].discard(group.key)
        self.podgroups[group.key] = group
        if group.owner is not None:
            self._owner_groups[group.owner.uid].add(group.key)
        if old is None or old.queue != group.queue:
            self._recharge(list(self._group_pods.get(group.key, ())))
        self._refresh_reservation(group.key)

    def delete_podgroup(self, key: str) -> None:
        group = self.podgroups.pop(key, None)
        if group is None:
            return
        if group.owner is not None:
            self._owner_groups[group.owner.uid].discard(key)
        self._refresh_reservation(key)
        self._recharge(list(self._group_pods.get(key, ())))

    def _refresh_reservation(self, key: str) -> None:
        old = self._reservations.pop(key, None)
        if old is not None:
            self._count(old.queue, reservation=old, sign=-1)
        new = self._reservation_of(key)
        if new is not None and (new.fixed or new.flex):
            self._reservations[key] = new
            self._count(new.queue, reservation=new, sign=+1)

    def reservation_of(self, key: str) -> Reservation | None:
        return self._reservations.get(key)

    def group_request(self, group: PodGroupRecord) -> dict[CardSpec, int]:
        """What a PodGroup asks for: ``card.request``, else ``minResources`` of its card resource."""
        text = group.annotations.get(keys.CARD_REQUEST)
        if text:
            try:
                return dict(parse_card_request(keys.CARD_REQUEST, text).counts)
            except AnnotationError:
                return {}
        owner = self.workloads_by_uid.get(group.owner.uid) if group.owner else None
        if owner is None:
            return {}
        asked: dict[CardSpec, int] = {}
        for task in owner.tasks:
            demand = pod_demand(task.template, self.inventory, self.policy)
            if isinstance(demand, PodDemand) and demand.resource in group.min_resources:
                try:
                    asked[demand.spec] = units(ceil_quantity(group.min_resources[demand.resource]))
                except QuantityError:
                    continue
        return asked

    def _reservation_of(self, key: str) -> Reservation | None:
        group = self.podgroups.get(key)
        if group is None or group.phase not in RESERVING_PHASES:
            return None
        existing = self._group_demand.get(key, Counter())
        fixed: Counter[CardName] = Counter()
        flex: Counter[FlexKey] = Counter()
        for spec, count in self.group_request(group).items():
            rest = count - existing.get(spec, 0)
            if rest <= 0:
                continue
            if spec.is_multi:
                flex[(spec, UNIT)] += -(-rest // UNIT)  # reserved cards, whole, split card by card
            else:
                fixed[spec.cards[0]] += rest
        return Reservation(group.queue or keys.DEFAULT_QUEUE, fixed, flex)


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


def scale_key(workload: WorkloadRecord) -> str:
    return f"scale:{workload.kind}/{workload.key}"

"""The in-memory cluster state both fronts decide from: every index, behind one façade.

Each update rule lives with its concept: the queue tree and its tallies in ``queues``, a pod's charge
in ``charges``, a PodGroup's reservation in ``reservations``. This class holds the indexes, routes
each update to its rule, and answers the questions decisions ask (a queue's tally, a pod's queue, a
workload's live pods), so a decision reads a queue's tally (cards × groups) and never walks pods.
"""

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from webhook.core import charges, compact, keys, reservations
from webhook.core.cards import CardName, CardSpec
from webhook.core.freecards import FreeCards
from webhook.core.inventory import Inventory
from webhook.core.ledger import Ledger
from webhook.core.nodes import NodeCards
from webhook.core.objects import PodGroupRecord, PodRecord, PodTemplate, QueueRecord, WorkloadRecord
from webhook.core.policy import Policy
from webhook.core.queues import QueueInfo, QueueTree
from webhook.core.tally import Charge, ComputeCharge, Reservation, Tally


class ClusterState:
    """Nodes, queues, pods, PodGroups and workloads, indexed for admission decisions."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        self.nodes: dict[str, NodeCards] = {}
        self.inventory = Inventory()
        self.free = FreeCards()  # free cards per node and model, for the multi-card assignment
        self.tree = QueueTree(self.policy.hierarchical_queues)
        self.pods: dict[str, PodRecord] = {}
        self.podgroups: dict[str, PodGroupRecord] = {}
        self.workloads: dict[tuple[str, str], WorkloadRecord] = {}  # (kind, ns/name)
        self.workloads_by_uid: dict[str, WorkloadRecord] = {}
        self.ledger = Ledger()
        # CPU/memory check: millicores and bytes charged per queue by its live pods.
        self.compute_used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.notes: list[str] = []
        self.skipped: dict[str, str] = {}  # kind/namespace/name -> why its shape cannot be read
        # The indexes the update rules keep (charges, reservations): by pod uid, PodGroup key, node
        # and owner uid.
        self.charges: dict[str, Charge] = {}
        self.compute: dict[str, ComputeCharge] = {}
        self.reservations: dict[str, Reservation] = {}
        self.group_pods: dict[str, set[str]] = defaultdict(set)
        self.group_cards: dict[str, Counter[CardSpec]] = defaultdict(Counter)
        self.node_pods: dict[str, set[str]] = defaultdict(set)
        self.owner_pods: dict[str, set[str]] = defaultdict(set)
        self.owner_groups: dict[str, set[str]] = defaultdict(set)
        self.children: dict[str, set[str]] = defaultdict(set)  # owner uid -> workload uids
        self.memo: dict[Any, Any] | None = None  # only while ``upsert_pods`` runs
        self._deadlines: list[tuple[float, str]] = []
        self._pool = compact.Pool()

    # ---- the queue tree (``queues``) ----------------------------------------------------
    @property
    def queues(self) -> dict[str, QueueInfo]:
        return self.tree.queues

    @property
    def tallies(self) -> dict[str, Tally]:
        return self.tree.tallies

    @property
    def ancestors(self) -> dict[str, tuple[str, ...]]:
        """Each queue's ancestors, nearest first."""
        return self.tree.ancestors

    @property
    def descendants(self) -> dict[str, frozenset[str]]:
        """Each queue with children: itself and every queue below it."""
        return self.tree.descendants

    @property
    def subtree(self) -> dict[str, Tally]:
        """Each queue with children: the tally of its whole subtree."""
        return self.tree.subtree

    def upsert_queue(self, record: QueueRecord) -> None:
        self.tree.upsert(record)

    def delete_queue(self, name: str) -> None:
        self.tree.delete(name)

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
            charges.recharge(self, list(self.pods))  # a card's resource name moved: rare, walk all
        else:
            charges.recharge(self, list(self.node_pods.get(node, ())))

    # ---- pods (``charges``) --------------------------------------------------------------
    @property
    def pool(self) -> compact.Pool:
        """The shared values this state's records are built from."""
        return self._pool

    def upsert_pod(self, pod: PodRecord, pooled: bool = False) -> None:
        """Add or replace a pod; ``pooled``: its record is built from ``self.pool`` already."""
        if not pooled:
            pod = self._pool.pod(pod)
        old = self.pods.get(pod.uid)
        charges.unindex_pod(self, pod.uid)
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
        charges.index_pod(self, pod)

    def upsert_pods(self, pods: Iterable[PodRecord]) -> None:
        """Many pods at once (a list), their records built from ``self.pool``: the demand and the
        charge of each template are worked out once for all its pods (nodes and queues do not
        change meanwhile)."""
        self.memo = {}  # id(template) -> demand, (id(demand), queue, ...) -> charge: alive meanwhile
        try:
            for pod in pods:
                self.upsert_pod(pod, pooled=True)
        finally:
            self.memo = None

    def delete_pod(self, uid: str) -> None:
        if uid in self.pods:
            charges.unindex_pod(self, uid)
            del self.pods[uid]

    def expire(self, now: float) -> None:
        """Drop pods past their deletion grace period and stale in-flight entries."""
        while self._deadlines and self._deadlines[0][0] < now:
            _, uid = heapq.heappop(self._deadlines)
            pod = self.pods.get(uid)
            if pod is not None and pod.is_terminal(now):
                charges.unindex_pod(self, uid)
        self.ledger.expire(now)

    def charge_of(self, uid: str) -> Charge | None:
        return self.charges.get(uid)

    def compute_charged(self, template: PodTemplate) -> tuple[int, int] | None:
        return charges.compute_charged(self, template)

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
        uids = set(self.owner_pods.get(workload.uid, ()))
        for child in self.children.get(workload.uid, ()):
            uids |= self.owner_pods.get(child, set())
        return sum(
            1 for uid in uids if uid in self.pods and self.pods[uid].phase not in ("Succeeded", "Failed")
        )

    def pods_owned_by(self, uid: str) -> list[PodRecord]:
        return [self.pods[p] for p in self.owner_pods.get(uid, ()) if p in self.pods]

    # ---- workloads ---------------------------------------------------------------------
    def upsert_workload(self, workload: WorkloadRecord) -> None:
        old = self.workloads_by_uid.get(workload.uid)
        if old is not None:
            self.workloads.pop((old.kind, old.key), None)
            if old.owner is not None:
                self.children[old.owner.uid].discard(old.uid)
        if workload.owner is not None:
            self.children[workload.owner.uid].add(workload.uid)
        self.workloads[(workload.kind, workload.key)] = workload
        self.workloads_by_uid[workload.uid] = workload
        self._after_owner_change(workload.uid)

    def delete_workload(self, kind: str, key: str) -> None:
        workload = self.workloads.pop((kind, key), None)
        if workload is not None:
            self.workloads_by_uid.pop(workload.uid, None)
            if workload.owner is not None:
                self.children[workload.owner.uid].discard(workload.uid)
            self._after_owner_change(workload.uid)

    def workload(self, kind: str, namespace: str, name: str) -> WorkloadRecord | None:
        return self.workloads.get((kind, f"{namespace}/{name}"))

    def _after_owner_change(self, uid: str) -> None:
        charges.recharge(self, list(self.owner_pods.get(uid, ())))
        for group in list(self.owner_groups.get(uid, ())):
            reservations.refresh(self, group)

    # ---- PodGroups (``reservations``) ----------------------------------------------------
    def upsert_podgroup(self, group: PodGroupRecord) -> None:
        old = self.podgroups.get(group.key)
        if old is not None and old.owner is not None:
            self.owner_groups[old.owner.uid].discard(group.key)
        self.podgroups[group.key] = group
        if group.owner is not None:
            self.owner_groups[group.owner.uid].add(group.key)
        if old is None or old.queue != group.queue:
            charges.recharge(self, list(self.group_pods.get(group.key, ())))
        reservations.refresh(self, group.key)

    def delete_podgroup(self, key: str) -> None:
        group = self.podgroups.pop(key, None)
        if group is None:
            return
        if group.owner is not None:
            self.owner_groups[group.owner.uid].discard(key)
        reservations.refresh(self, key)
        charges.recharge(self, list(self.group_pods.get(key, ())))

    def reservation_of(self, key: str) -> Reservation | None:
        return self.reservations.get(key)

    def group_request(self, group: PodGroupRecord) -> dict[CardSpec, int]:
        return reservations.group_request(self, group)

    def group_demand(self, group: str) -> Counter[CardSpec]:
        """What a PodGroup's existing pods charge, per card spec."""
        return self.group_cards.get(group, Counter())


def scale_key(workload: WorkloadRecord) -> str:
    return f"scale:{workload.kind}/{workload.key}"

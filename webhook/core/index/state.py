"""The in-memory cluster state both fronts decide from: every index, behind one façade.

Each index is an object that owns its data: the queue tree and its tallies (``queues.QueueTree``),
the live pods' charges (``charges.PodIndex``), the PodGroups' reservations
(``reservations.Reservations``), free cards per node (``freecards.FreeCards``), the in-flight ledger.
This class composes them, forwards each update to the owners it concerns, and answers the questions
decisions ask (a queue's tally, a pod's queue, a workload's live pods), so a decision reads a
queue's tally (cards × groups) and never walks pods.
"""

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace

from webhook.core.index.charges import Charger, PodIndex, admitted_as, as_charged, compute_charged
from webhook.core.index.claimbook import ClaimBook
from webhook.core.index.freecards import FreeCards
from webhook.core.index.line import Refused, Waiter, WaitingLine, group_waiter, pod_waiter, workload_waiter
from webhook.core.index.queues import QueueInfo, QueueTree
from webhook.core.index.reservations import RESERVING_PHASES, Reservations, asks_more, group_request
from webhook.core.index.tally import Charge, ComputeCharge, Reservation, Tally
from webhook.core.index.workloads import Workloads
from webhook.core.model import compact, keys
from webhook.core.model.cards import CardName, CardSpec
from webhook.core.model.claims import Devices
from webhook.core.model.demand import Demand, PodDemand, pod_demand
from webhook.core.model.devices import ClaimRecord, ClassRecord, SliceRecord, TemplateRecord
from webhook.core.model.inventory import Inventory
from webhook.core.model.ledger import Ledger
from webhook.core.model.nodes import NodeCards, with_devices
from webhook.core.model.objects import (
    TERMINAL_PHASES,
    PodGroupRecord,
    PodRecord,
    PodTemplate,
    QueueRecord,
    WorkloadRecord,
)
from webhook.core.model.policy import Policy
from webhook.core.model.reclaim import Taken

# A PodGroup's annotations its reservation is read from (besides spec.minResources and spec.queue)
ENQUEUED_WITH = frozenset({keys.CARD_REQUEST, keys.CARD_NAME})


class ClusterState:
    """Nodes, queues, pods, PodGroups and workloads, indexed for admission decisions."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        self.nodes: dict[str, NodeCards] = {}
        self.inventory = Inventory(Devices(self.policy.dra_drivers))
        self._labelled: dict[str, NodeCards] = {}  # each node's cards from its labels (SPEC §3)
        self.free = FreeCards()  # free cards per node and model, for the multi-card assignment
        self.tree = QueueTree(self.policy.hierarchical_queues)
        self.pods: dict[str, PodRecord] = {}
        self.claims = ClaimBook(self.pods, self.inventory.devices, self.queue_of_pod)  # DRA (SPEC §4b)
        self.podgroups: dict[str, PodGroupRecord] = {}
        self._workloads = Workloads()
        self.ledger = Ledger()
        self.charged = PodIndex(self.tree, self.free)
        self.reserved = Reservations(self.tree)
        self.line = WaitingLine()
        self._refused = Refused()  # deny mode: who was refused, since when, at what priority
        # wait mode: what each PodGroup's gated pods ask for, left out of its reservation as the
        # plugin leaves it out of its queue's (DeductSchGatedResources)
        self._gated: defaultdict[str, Counter[CardSpec]] = defaultdict(Counter)
        self.notes: list[str] = []
        self.skipped: dict[str, str] = {}  # kind/namespace/name -> why its shape cannot be read
        self._owner_groups: dict[str, set[str]] = defaultdict(set)  # owner uid -> PodGroup keys
        self._group_keys: dict[str, str] = {}  # PodGroup uid -> key, for those refused at enqueue
        self.refusals: dict[str, str] = {}  # PodGroup key -> its last enqueue refusal, not told yet
        self._unfit: dict[str, str] = {}  # gated pod uid -> its queue, whose quota can never hold it
        # PodGroup key -> the cards tidal reclaim took back from it, held for the pods they went to
        self.reclaims: dict[str, Taken] = {}
        # Owner uid -> (name, expiry) of the last pod a mutation put under our gate: until the cache
        # sees it, a second create of the same workload must not be gated as well.
        self.gating: dict[str, tuple[str, float]] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._pool = compact.Pool()
        self._charger = Charger(self.inventory, self.policy, self._pool, self.queue_of_pod)

    def skip(self, key: str, problem: str) -> None:
        """Remember why the object ``key`` (kind/namespace/name) is left out; "" forgets it."""
        if problem:
            self.skipped[key] = problem
        else:
            self.skipped.pop(key, None)

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
        if self._unfit:  # its quota may hold them now: back in line, judged again
            self._recharge([uid for uid, queue in self._unfit.items() if queue == record.name])

    def delete_queue(self, name: str) -> None:
        self.tree.delete(name)

    # ---- nodes -------------------------------------------------------------------------
    def upsert_node(self, cards: NodeCards) -> None:
        self._labelled[cards.node] = cards
        cards = with_devices(
            cards, self.inventory.devices.node_cards(cards.node), self.policy.default_resource
        )
        if self.nodes.get(cards.node) == cards:
            return
        self.nodes[cards.node] = cards
        self.free.set_node(cards)
        self._after_node_change(cards.node, self.inventory.put(cards))

    def delete_node(self, name: str) -> None:
        self._labelled.pop(name, None)
        if self.nodes.pop(name, None) is not None:
            self.free.delete_node(name)
            self._after_node_change(name, self.inventory.remove(name))

    def _after_node_change(self, node: str, moved: set[CardName]) -> None:
        if moved:
            self._recharge(list(self.pods))  # a card's resource name moved: rare, walk all
        else:
            self._recharge(list(self.charged.on_node(node)))

    # ---- DRA: slices, classes, claims, templates (SPEC §4b) ---------------------------------
    def upsert_slice(self, record: SliceRecord) -> None:
        self._refresh_nodes(self.inventory.devices.put_slice(record))

    def delete_slice(self, name: str) -> None:
        self._refresh_nodes(self.inventory.devices.drop_slice(name))

    def _refresh_nodes(self, names: Iterable[str]) -> None:
        for name in names:
            if name in self._labelled:
                self.upsert_node(self._labelled[name])

    def upsert_device_class(self, record: ClassRecord) -> None:
        if self.inventory.devices.classes.get(record.name) != record:
            self.inventory.devices.classes[record.name] = record
            self._recharge_claimants()

    def delete_device_class(self, name: str) -> None:
        if self.inventory.devices.classes.pop(name, None) is not None:
            self._recharge_claimants()

    def upsert_claim(self, record: ClaimRecord) -> None:
        if self.inventory.devices.claims.get(record.key) != record:
            self.inventory.devices.claims[record.key] = record
            self._recharge(list(self.claims.users(record.key)))

    def delete_claim(self, key: str) -> None:
        if self.inventory.devices.claims.pop(key, None) is not None:
            self._recharge(list(self.claims.users(key)))

    def upsert_claim_template(self, record: TemplateRecord) -> None:
        if self.inventory.devices.templates.get(record.key) != record:
            self.inventory.devices.templates[record.key] = record
            self._recharge(list(self.claims.users(f"template:{record.key}")))

    def delete_claim_template(self, key: str) -> None:
        if self.inventory.devices.templates.pop(key, None) is not None:
            self._recharge(list(self.claims.users(f"template:{key}")))

    def _recharge_claimants(self) -> None:
        self._recharge(self.claims.claimants())

    def demand_of(self, pod: PodRecord) -> Demand:
        """What ``pod`` is charged for: the demand it was admitted or first charged with (a DRA
        pod's: its templates, claims and classes may change after), else read from it now."""
        return self.claims.fixed(pod.uid) or pod_demand(pod.template, self.inventory, self.policy)

    def _claim_demand(self, pod: PodRecord) -> PodDemand | None:
        """A live DRA pod's demand, fixed from the first time it is charged."""
        demand = self.demand_of(pod)
        if not isinstance(demand, PodDemand):
            return None
        self.claims.fix(pod.uid, demand)
        return demand

    # ---- pods (``charges``) --------------------------------------------------------------
    @property
    def pool(self) -> compact.Pool:
        """The shared values this state's records are built from."""
        return self._pool

    def upsert_pod(self, pod: PodRecord, pooled: bool = False) -> None:
        """Add or replace a pod; ``pooled``: its record is built from ``self.pool`` already."""
        old = self.pods.get(pod.uid)
        if (held := self._as_charged(old, pod)) is not pod:
            pod, pooled = held, False
        if not pooled:
            pod = self._pool.pod(pod)
        self._unindex(pod.uid, leaving=old is not None and old.is_live and not pod.is_live)
        self.pods[pod.uid] = pod
        if self.gating and pod.owner is not None and self.gating.get(pod.owner.uid, ("",))[0] == pod.name:
            del self.gating[pod.owner.uid]  # the gated pod is seen: the cache's own count takes over
        if pod.waiting is None and (old is None or old.waiting is not None):
            # A pod admitted here holds its own entry (taken from its scale-up's at admission), so
            # does a pod released from the line; one admitted elsewhere still comes out of its
            # workload's scale-up hold. A pod under our gate holds nothing yet.
            if (entry := self.ledger.get(pod.uid)) is not None:
                if entry.demand is not None and pod.template.claims:
                    self.claims.fix(pod.uid, entry.demand)  # what it was admitted with, not what is now
                self.ledger.settle(pod.uid)
            elif old is None and (workload := self.workload_of(pod)) is not None:
                self.ledger.settle(scale_key(workload))
        if pod.deletion_deadline is not None:
            heapq.heappush(self._deadlines, (pod.deletion_deadline, pod.uid))
        self._index(pod)

    def _as_charged(self, old: PodRecord | None, pod: PodRecord) -> PodRecord:
        """``pod`` with the annotations its charge is read from as it was charged: as the cache first
        saw it ungated, or, arriving, as it was admitted (an edit seen before the pod itself)."""
        if old is not None:
            return as_charged(old, pod) if old.waiting is None else pod
        entry = self.ledger.get(pod.uid) if pod.waiting is None else None
        if entry is None or entry.charged is None:
            return pod
        return as_charged(admitted_as(pod, entry.charged), pod)

    def upsert_pods(self, pods: Iterable[PodRecord]) -> None:
        """Many pods at once (a list), their records built from ``self.pool``: the demand and the
        charge of each template are worked out once for all its pods (nodes and queues do not
        change meanwhile)."""
        with self._charger.batch():
            for pod in pods:
                self.upsert_pod(pod, pooled=True)

    def delete_pod(self, uid: str) -> None:
        if uid in self.pods:
            self._unindex(uid, leaving=True)
            del self.pods[uid]

    def expire(self, now: float) -> None:
        """Drop pods past their deletion grace period and stale in-flight entries."""
        while self._deadlines and self._deadlines[0][0] < now:
            _, uid = heapq.heappop(self._deadlines)
            pod = self.pods.get(uid)
            if pod is not None and pod.is_terminal(now):
                self._unindex(uid, leaving=True)
        self.ledger.expire(now)
        self._recharge(self.claims.expire(now))
        if self.gating:
            self.gating = {uid: mark for uid, mark in self.gating.items() if mark[1] >= now}

    def gated_in_flight(self, owner_uid: str, name: str) -> bool:
        """Whether a mutation put another pod of ``owner_uid`` under our gate that the cache has not
        seen arrive yet (two creates of a ReplicaSet can be mutated before the first is seen)."""
        mark = self.gating.get(owner_uid)
        return mark is not None and mark[0] != name

    def charge_of(self, uid: str) -> Charge | None:
        return self.charged.charge(uid)

    def compute_used(self, queue: str) -> tuple[int, int]:
        """CPU (millicores) and memory (bytes) charged to ``queue`` by its live pods."""
        return self.charged.compute_used(queue)

    def compute_charged(self, template: PodTemplate) -> tuple[int, int] | None:
        return compute_charged(template, self.inventory, self.policy)

    def _index(self, pod: PodRecord) -> None:
        if pod.template.claims:
            self.claims.join(pod)
            demand = self._claim_demand(pod) if pod.is_live and pod.waiting is None else None
            charge = self._charger.card(pod, self.nodes.get(pod.node_name), demand)
            charge = self.claims.charge(pod, charge, demand) if pod.is_live else charge
        else:
            charge = self._charger.card(pod, self.nodes.get(pod.node_name))
        group = self.charged.add(pod, charge, self._compute_charge(pod))
        if group:
            self._refresh_reservation(group)
        if pod.owner is not None and pod.owner.uid in self._refused:
            self._rewait(pod.owner.uid)
        if pod.waiting is not None and pod.is_live:
            asked = pod_demand(pod.template, self.inventory, self.policy)
            if isinstance(asked, PodDemand):
                waiter = pod_waiter(pod, asked, self.queue_of_pod(pod))
                self.line.put(waiter)
                self._gate_in_group(pod, waiter, +1)

    def _unindex(self, uid: str, leaving: bool = False) -> None:
        """Take a pod's charges back; ``leaving``: it is counted no more (deleted, finished)."""
        pod = self.pods.get(uid)
        if pod is None:
            return
        if group := self.charged.remove(pod):
            self._refresh_reservation(group)
        if (waiter := self.line.remove(uid)) is not None and waiter.pod:
            self._gate_in_group(pod, waiter, -1)
        self._unfit.pop(uid, None)
        if pod.owner is not None and pod.owner.uid in self._refused:
            self._rewait(pod.owner.uid, leaving=uid)
        if pod.template.claims and leaving:
            for heir in self.claims.leave(pod):  # the claims it paid for go to another of their pods
                self._recharge((heir,))

    def _recharge(self, uids: Iterable[str]) -> None:
        """Charge these pods again: their node, queue, PodGroup or owner changed."""
        for uid in uids:
            pod = self.pods.get(uid)
            if pod is not None:
                self._unindex(uid)
                self._index(pod)

    def _compute_charge(self, pod: PodRecord) -> ComputeCharge | None:
        if not self.policy.cpu_memory_check or pod.phase in TERMINAL_PHASES or pod.waiting is not None:
            return None
        charged = self.compute_charged(pod.template)
        if charged is None:
            return None
        return self._pool.share(ComputeCharge(self.queue_of_pod(pod), *charged))

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
        return self._workloads.scalable(owner) if owner is not None else None

    def live_pods_of(self, workload: WorkloadRecord) -> int:
        uids = set(self.charged.owned_by(workload.uid))
        for child in self._workloads.children(workload.uid):
            uids |= self.charged.owned_by(child)
        return sum(
            1 for uid in uids if uid in self.pods and self.pods[uid].phase not in ("Succeeded", "Failed")
        )

    def pods_owned_by(self, uid: str) -> list[PodRecord]:
        return [self.pods[p] for p in self.charged.owned_by(uid) if p in self.pods]

    # ---- workloads (``workloads``) ------------------------------------------------------
    @property
    def workloads(self) -> Mapping[tuple[str, str], WorkloadRecord]:
        """Every workload by (kind, namespace/name)."""
        return self._workloads.by_key

    @property
    def workloads_by_uid(self) -> Mapping[str, WorkloadRecord]:
        return self._workloads.by_uid

    def upsert_workload(self, workload: WorkloadRecord) -> None:
        self._workloads.put(workload)
        self._refused.marked(workload.uid, workload.waiting)
        self._after_owner_change(workload.uid)
        if workload.uid in self._refused:
            self._rewait(workload.uid)

    def delete_workload(self, kind: str, key: str) -> None:
        workload = self._workloads.remove(kind, key)
        if workload is not None:
            self._after_owner_change(workload.uid)
            self._refused.forget(workload.uid)
            self.line.remove(workload.uid)

    def workload(self, kind: str, namespace: str, name: str) -> WorkloadRecord | None:
        return self._workloads.by_key.get((kind, f"{namespace}/{name}"))

    def _after_owner_change(self, uid: str) -> None:
        self._recharge(list(self.charged.owned_by(uid)))
        for group in list(self._owner_groups.get(uid, ())):
            self._refresh_reservation(group)

    # ---- the waiting line (``line``) -------------------------------------------------------
    def wait(self, uid: str, since: float, priority: int, group: str = "") -> None:
        """The workload ``uid``, whose controller was just refused a pod, or the PodGroup ``uid``
        (key ``group``) refused at enqueue, takes its place in its queue's line; one already there
        keeps its place (its first refusal, its highest priority)."""
        if group:
            self._group_keys[uid] = group
        self._refused.refuse(uid, since, priority)
        self._rewait(uid)

    def unfit(self, waiter: Waiter) -> None:
        """``waiter`` can never fit its queue's quota (or an ancestor's) as it is now: it leaves the
        line, so those behind it are called. A refused workload or PodGroup rejoins when refused
        again and it could fit; a gated pod keeps its gate and rejoins when its queue changes."""
        self.line.remove(waiter.key)
        if waiter.pod and (pod := self.pods.get(waiter.key)) is not None:
            self._gate_in_group(pod, waiter, -1)
            self._unfit[waiter.key] = waiter.queue
        else:
            self._refused.served(waiter.key)
            self._group_keys.pop(waiter.key, None)

    def over_quota(self, queue: str) -> str:
        """ "deny" or "wait": the queue's own choice (its over-quota annotation), else the policy's."""
        info = self.tree.queues.get(queue)
        chosen = info.record.annotations.get(keys.OVER_QUOTA, "") if info is not None else ""
        return chosen if chosen in ("deny", "wait") else self.policy.over_quota

    def marked(self) -> set[str]:
        """Workloads that wait in line or carry a waiting mark (``calls.marks`` reconciles them)."""
        return self._refused.all()

    def enqueued(self, owner_uid: str) -> bool:
        """Whether one of ``owner_uid``'s PodGroups is Inqueue or Running."""
        groups = self._owner_groups.get(owner_uid, ())
        return any(
            (g := self.podgroups.get(key)) is not None and g.phase in ("Inqueue", "Running") for key in groups
        )

    def unenqueued_pods(self, owner_uid: str) -> int:
        """How many live pods of ``owner_uid`` are not bound (gated, or released and pending) while
        none of its PodGroups is Inqueue or Running (0 once one is): their group is enqueued only
        when all of them fit."""
        if self.enqueued(owner_uid):
            return 0
        pods = self.pods
        return sum(
            1
            for uid in self.charged.owned_by(owner_uid)
            if (p := pods.get(uid)) and p.is_live and not p.node_name
        )

    def waiting_pods(self, waiter: Waiter) -> int:
        """The pods ``waiter`` still waits for: those not called yet (held in the ledger)."""
        entry = self.ledger.get(waiter.hold)
        return max(0, waiter.pods - (entry.pods if entry is not None else 0))

    def _rewait(self, uid: str, leaving: str = "") -> None:
        """Bring a refused workload's place up to date; it leaves the line once it has every pod it
        wants (or is gone, or uses no card). ``leaving``: a pod being taken out, not counted."""
        workload, place = self.workloads_by_uid.get(uid), self._refused.place(uid)
        waiter = None
        group = self.podgroups.get(self._group_keys.get(uid, ""))
        if group is not None and place is not None and group.phase not in RESERVING_PHASES:
            rest = self.unreserved(group)
            if rest:
                spec, count = next(iter(rest.items()))
                waiter = group_waiter(group, spec, count, *place, enqueue_key(uid, 0))
        elif workload is not None and place is not None and workload.tasks:
            demand = pod_demand(workload.tasks[0].template, self.inventory, self.policy)
            if isinstance(demand, PodDemand):
                pods = self.pods
                live = sum(
                    1 for p in self.charged.owned_by(uid) if p != leaving and p in pods and pods[p].is_live
                )
                hold = scale_key(self._workloads.scalable(workload))
                waiter = workload_waiter(workload, demand, live, *place, hold)
        if waiter is None:
            self._refused.served(uid)
            self._group_keys.pop(uid, None)
            self.line.remove(uid)
        else:
            self.line.put(waiter)

    # ---- PodGroups (``reservations``) ----------------------------------------------------
    def upsert_podgroup(self, group: PodGroupRecord) -> None:
        old = self.podgroups.get(group.key)
        if old is not None and old.phase in RESERVING_PHASES and group.phase in RESERVING_PHASES:
            group = self._as_enqueued(old, group)
        if old is not None and old.owner is not None:
            self._owner_groups[old.owner.uid].discard(group.key)
        self.podgroups[group.key] = group
        if group.owner is not None:
            self._owner_groups[group.owner.uid].add(group.key)
        if old is None or old.queue != group.queue:
            self._recharge(list(self.charged.in_group(group.key)))
        if group.phase in RESERVING_PHASES and (old is None or old.phase not in RESERVING_PHASES):
            self._settle_enqueue(group.uid)  # its reservation counts from now on
        self._refresh_reservation(group.key)

    def _as_enqueued(self, old: PodGroupRecord, group: PodGroupRecord) -> PodGroupRecord:
        """An enqueued group reserves at most what it was enqueued with, in the queue it was enqueued
        in (SPEC §4b): an edit asking more or elsewhere (refused by the webhook; one that got past
        it, or its job's sizes raised) keeps what it asked then; one asking less takes effect."""
        if not asks_more(self.group_request(old), self.group_request(group), group.queue != old.queue):
            return group
        annotations = {k: v for k, v in group.annotations.items() if k not in ENQUEUED_WITH}
        annotations |= {k: v for k, v in old.annotations.items() if k in ENQUEUED_WITH}
        return replace(group, queue=old.queue, annotations=annotations, min_resources=old.min_resources)

    def delete_podgroup(self, key: str) -> None:
        group = self.podgroups.pop(key, None)
        if group is None:
            return
        if group.owner is not None:
            self._owner_groups[group.owner.uid].discard(key)
        self._settle_enqueue(group.uid)
        self._refused.forget(group.uid)
        self._group_keys.pop(group.uid, None)
        self.line.remove(group.uid)
        self._refresh_reservation(key)
        self._recharge(list(self.charged.in_group(key)))

    def unreserved(self, group: PodGroupRecord) -> dict[CardSpec, int]:
        """What ``group`` asks for beyond what its pods (gated ones included) hold: what it reserves
        once enqueued, per card spec, in card units. Gated pods are taken off as the capacity-card
        plugin takes them off its queue's inqueue tally (``DeductSchGatedResources``,
        ``capacity_card_queue.go``)."""
        asked = self.group_request(group)
        held = self.charged.group_demand(group.key)
        gated = self._gated.get(group.key)
        if gated:
            held = held + gated
        return {spec: count - held.get(spec, 0) for spec, count in asked.items() if count > held.get(spec, 0)}

    def _settle_enqueue(self, uid: str) -> None:
        """The cache shows the group enqueued (or gone): its enqueue holds are done."""
        self.ledger.drop(enqueue_key(uid, 0))
        index = 1
        while self.ledger.get(enqueue_key(uid, index)) is not None:
            self.ledger.drop(enqueue_key(uid, index))
            index += 1

    def reservation_of(self, key: str) -> Reservation | None:
        return self.reserved.get(key)

    def group_request(self, group: PodGroupRecord) -> dict[CardSpec, int]:
        owner = self.workloads_by_uid.get(group.owner.uid) if group.owner else None
        return group_request(group, owner, self.inventory, self.policy)

    def group_demand(self, group: str) -> Counter[CardSpec]:
        """What a PodGroup's existing pods charge, per card spec."""
        return self.charged.group_demand(group)

    def _gate_in_group(self, pod: PodRecord, waiter: Waiter, sign: int) -> None:
        if not pod.group_name:
            return
        key = f"{pod.namespace}/{pod.group_name}"
        self._gated[key][waiter.spec] += sign * waiter.per_pod
        if not +self._gated[key]:
            del self._gated[key]
        self._refresh_reservation(key)

    def _refresh_reservation(self, key: str) -> None:
        group = self.podgroups.get(key)
        asked = self.group_request(group) if group is not None else {}
        existing = self.charged.group_demand(key)
        gated = self._gated.get(key)
        bound = self.charged.group_bound(key)
        self.reserved.refresh(key, group, asked, existing + gated if gated else existing, bound)
        if group is not None and group.uid in self._refused:
            self._rewait(group.uid)  # what it waits for changed with its pods or its phase


def scale_key(workload: WorkloadRecord) -> str:
    return f"scale:{workload.kind}/{workload.key}"


def enqueue_key(uid: str, index: int) -> str:
    """The ledger key of a PodGroup's enqueue: one per card spec it asks for (``index``)."""
    return f"enqueue:{uid}/{index}"

"""The in-memory cluster state both fronts decide from: every index, behind one façade.

Each part is an object that owns its data: the nodes and their cards (``nodebook.NodeBook``), the
queue tree and its tallies (``queues.QueueTree``), the live pods' charges (``charges.PodIndex``),
the claims' bookkeeping (``claimbook.ClaimBook``), the PodGroups and their reservations
(``groups.PodGroups``), the waiting line (``waiting.Waiting``), the workloads, the in-flight ledger.
This class composes them and forwards each update to the parts it concerns, so a decision reads a
queue's tally (cards × groups) and never walks pods.
"""

import contextlib
import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace

from webhook.core.index.charges import Charger, PodIndex, admitted_as, as_charged, compute_charged
from webhook.core.index.claimbook import ClaimBook
from webhook.core.index.groups import PodGroups
from webhook.core.index.nodebook import NodeBook
from webhook.core.index.queues import QueueTree
from webhook.core.index.reservations import group_request
from webhook.core.index.tally import ComputeCharge
from webhook.core.index.waiting import Waiting, scale_key
from webhook.core.index.workloads import Workloads
from webhook.core.model import compact, keys
from webhook.core.model.cards import CardName, CardSpec
from webhook.core.model.claims import Devices, Done, Job
from webhook.core.model.demand import Demand, PodDemand, allocated_demand, known_card, pod_demand
from webhook.core.model.devices import ClaimRecord, ClassRecord, SliceRecord, TemplateRecord
from webhook.core.model.inventory import Inventory
from webhook.core.model.ledger import Ledger, resize_key
from webhook.core.model.nodes import NodeCards
from webhook.core.model.objects import (
    TERMINAL_PHASES,
    OwnerRef,
    PodGroupRecord,
    PodRecord,
    PodTemplate,
    QueueRecord,
    WorkloadRecord,
)
from webhook.core.model.placement import NodeFacts
from webhook.core.model.policy import Policy
from webhook.core.model.quoting import shorten
from webhook.core.model.reclaim import Taken
from webhook.core.model.runqueue import CREATED, JOB, PODGROUP, RunQueue, created_queue, namespace_default
from webhook.core.model.selector import SelectorError, parse_selector
from webhook.core.model.verdicts import Borrowing, Would


class ClusterState:
    """Nodes, queues, pods, PodGroups and workloads, indexed for admission decisions."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        self.inventory = Inventory(Devices(self.policy.dra_drivers))
        self.nodebook = NodeBook(self.inventory, self.policy.default_resource)
        self.nodes, self.free = self.nodebook.cards, self.nodebook.free
        self.tree = QueueTree(self.policy.hierarchical_queues)
        self.pods: dict[str, PodRecord] = {}
        # Namespace -> its scheduling.volcano.sh/queue-name, for those that carry one (Volcano's
        # default queue for the PodGroups made there: ``runqueue.namespace_default``)
        self.namespace_queues: dict[str, str] = {}
        self.namespace_labels: dict[str, Mapping[str, str]] = {}  # those the cache has seen
        self.claims = ClaimBook(self.pods, self.inventory.devices, self.queue_of_pod)  # DRA (SPEC §4b)
        self.workloads = Workloads()  # by kind and name, by uid, with each owner's children
        self.ledger = Ledger()
        self.charged = PodIndex(self.tree, self.free)
        self.groups = PodGroups(
            self.tree,
            self.pods,
            self.charged,
            self.ledger,
            self.group_request,
            lambda uid: self.waiting.changed(uid),
        )
        self.podgroups = self.groups.by_key
        self.waiting = Waiting(
            self.pods,
            self.workloads,
            self.groups,
            self.charged,
            self.ledger,
            self.tree,
            self.asked,
            lambda workload: self.template_queue(workload).queue,
            self.policy.over_quota,
        )
        self.line = self.waiting.line
        self.notes: list[str] = []
        self.skipped: dict[str, str] = {}  # kind/namespace/name -> why its shape cannot be read
        self.refusals: dict[str, str] = {}  # PodGroup key -> its last enqueue refusal, not told yet
        # "pod:"/"podgroup:" key -> an admission on borrowed cards, its Event and mark not written yet
        self.borrowings: dict[str, Borrowing] = {}
        self.enforcing_all = False  # every quota refuses, whatever its mode: what ``audit`` asks
        self.would_refuse: list[
            Would
        ] = []  # admissions a quota that warns or audits would refuse, not told yet
        # PodGroup key -> the cards tidal reclaim took back from it, held for the pods they went to
        self.reclaims: dict[str, Taken] = {}
        self._deadlines: list[tuple[float, str]] = []
        self.pool = compact.Pool()  # the shared values this state's records are built from
        self.pending: set[str] = set()  # pods charged while a reading of their selectors was deferred
        self._charger = Charger(self.inventory, self.policy, self.pool, self.queue_of_pod)

    def skip(self, key: str, problem: str) -> None:
        """Remember why the object ``key`` (kind/namespace/name) is left out; "" forgets it."""
        if problem:
            self.skipped[key] = problem
        else:
            self.skipped.pop(key, None)

    # ---- the queue tree (``queues``) ----------------------------------------------------
    def upsert_queue(self, record: QueueRecord) -> None:
        old = self.tree.queues.get(record.name)
        self.tree.upsert(record)
        self._recharge(self.waiting.unfit_in(record.name))  # its quota may hold them now: judged again
        quota = record.annotations.get(keys.CARD_QUOTA)
        if (
            old is None
            or old.record.annotations.get(keys.CARD_QUOTA) != quota
            or old.record.parent != record.parent
        ):
            self.waiting.requota()  # workloads out of the line, or in it, judged again

    def delete_queue(self, name: str) -> None:
        self.tree.delete(name)

    # ---- nodes and their ResourceSlices (``nodebook``) --------------------------------------
    def upsert_node(self, cards: NodeCards, facts: NodeFacts | None = None) -> None:
        if facts is not None:
            self.nodebook.facts[cards.node] = facts
        self._after_node_change(cards.node, self.nodebook.put(cards))

    def delete_node(self, name: str) -> None:
        self._after_node_change(name, self.nodebook.drop(name))

    def _after_node_change(self, node: str, moved: set[CardName] | None) -> None:
        if moved is not None:  # changed; a card's resource name moved: rare, walk all
            self._recharge(list(self.pods) if moved else list(self.charged.on_node(node)))

    def upsert_slice(self, record: SliceRecord) -> None:
        old = self.inventory.devices.slices.get(record.name)
        for cards in self.nodebook.put_slice(record):
            self.upsert_node(cards)
        self._after_slice_change(old, record)

    def delete_slice(self, name: str) -> None:
        old = self.inventory.devices.slices.get(name)
        for cards in self.nodebook.drop_slice(name):
            self.upsert_node(cards)
        self._after_slice_change(old, None)

    def _after_slice_change(self, old: SliceRecord | None, new: SliceRecord | None) -> None:
        """The pods of claims allocated devices of the slices' pools are charged again: what a
        device is, and whether it is known at all, is read from the slices."""
        if old == new:
            return
        pools = {(found.driver, found.pool) for found in (old, new) if found is not None}
        self._recharge({uid for where in pools for uid in self.claims.in_pool(*where)})

    # ---- DRA: classes, claims, templates (``claimbook``, SPEC §4b) ---------------------------
    def upsert_device_class(self, record: ClassRecord) -> None:
        self._recharge(self.claims.put_class(record))

    def delete_device_class(self, name: str) -> None:
        self._recharge(self.claims.drop_class(name))

    def upsert_claim(self, record: ClaimRecord) -> None:
        self._recharge(self.claims.put_claim(record))

    def delete_claim(self, key: str) -> None:
        self._recharge(self.claims.drop_claim(key))

    def upsert_claim_template(self, record: TemplateRecord) -> None:
        self._recharge(self.claims.put_template(record))

    def delete_claim_template(self, key: str) -> None:
        self._recharge(self.claims.drop_template(key))

    def asked(self, template: PodTemplate) -> Demand:
        """What a pod of ``template`` asks for now."""
        return pod_demand(template, self.inventory, self.policy)

    def demand_of(self, pod: PodRecord) -> Demand:
        """What ``pod`` is charged for: the demand it was admitted or first charged with (a DRA
        pod's: its templates, claims and classes may change after), else read from it now."""
        return self.claims.fixed(pod.uid) or self.asked(pod.template)

    # ---- pods (``charges``) --------------------------------------------------------------
    def upsert_pod(self, pod: PodRecord, pooled: bool = False) -> None:
        """Add or replace a pod; ``pooled``: its record is built from ``self.pool`` already."""
        old = self.pods.get(pod.uid)
        if (held := self._as_charged(old, pod)) is not pod:
            pod, pooled = held, False
        if not pooled:
            pod = self.pool.pod(pod)
        self._unindex(pod.uid, leaving=old is not None and old.is_live and not pod.is_live)
        if self.ledger and (old is None or (old.template is not pod.template and _resized(old, pod))):
            self.ledger.settle(resize_key(pod.uid))  # its CPU and memory now count as resized
        self.pods[pod.uid] = pod
        self.waiting.seen(pod)
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
        self.inventory.devices.turn()
        with self._charger.batch():
            for pod in pods:
                self.upsert_pod(pod, pooled=True)

    def delete_pod(self, uid: str) -> None:
        if uid in self.pods:
            self._unindex(uid, leaving=True)
            del self.pods[uid]
            self.pending.discard(uid)
            self.ledger.settle(resize_key(uid))

    def expire(self, now: float) -> None:
        """Drop pods past their deletion grace period and stale in-flight entries."""
        while self._deadlines and self._deadlines[0][0] < now:
            _, uid = heapq.heappop(self._deadlines)
            pod = self.pods.get(uid)
            if pod is not None and pod.is_terminal(now):
                self._unindex(uid, leaving=True)
        self.ledger.expire(now)
        if again := self.claims.expire(now):
            self._recharge(again)
        self.waiting.expire(now)

    def compute_charged(self, template: PodTemplate) -> tuple[int, int] | None:
        return compute_charged(template, self.inventory, self.policy)

    def selectors_evaluated(self, job: Job, done: Done) -> None:
        """Work deferred off the loop is done (``Devices.settle``): once a reading's is all done,
        the pods charged while any was pending are charged again (a turn of their own)."""
        self.inventory.devices.turn()
        if self.inventory.devices.settle(job, done):
            again, self.pending = self.pending, set()
            self._recharge(sorted(again))

    def recharge_pending(self) -> None:
        """Charge again the pods charged while their readings were deferred (a turn of its own):
        what they still need is asked for again."""
        self.inventory.devices.turn()
        again, self.pending = self.pending, set()
        self._recharge(sorted(again))

    def _index(self, pod: PodRecord) -> None:
        missed = self.inventory.devices.missed
        self._index_charges(pod)
        if self.inventory.devices.missed != missed:
            self.pending.add(pod.uid)  # charged again once its readings are done

    def _index_charges(self, pod: PodRecord) -> None:
        if pod.template.claims:
            self.claims.join(pod)
            demand = self._claim_demand(pod) if pod.is_live and pod.waiting is None else None
            charge = self._charger.card(pod, self.nodes.get(pod.node_name), demand)
            charge = self.claims.charge(pod, charge, demand) if pod.is_live else charge
        else:
            charge = self._charger.card(pod, self.nodes.get(pod.node_name))
        if group := self.charged.add(pod, charge, self._compute_charge(pod)):
            self.groups.refresh(group)
        self.waiting.pod_in(pod, self.queue_of_pod(pod))

    def _claim_demand(self, pod: PodRecord) -> PodDemand | None:
        """What a live pod that uses claims is charged for (SPEC §4b): once every claim of it is
        allocated, what they were given, read from the devices through the slices whatever their
        classes now say; before, what it was admitted or first charged with (held while it lives),
        or, when it has nothing held (its classes gone), what its allocated claims were given."""
        held = self.claims.fix(pod.uid, self.claims.held(pod.uid) or self.asked(pod.template))
        found = self.claims.given(pod, known_card(pod.template, held))
        if found is None or not (found.complete or held is None):
            self.claims.settle(pod, None, None)
            return held
        demand = allocated_demand(pod.template, self.inventory, self.policy, found, held)
        if held is None and demand is not None and found.complete and not found.unpublished:
            self.claims.fix(pod.uid, demand)  # what it was first charged with, should its allocation go
        self.claims.settle(pod, found, demand)
        return demand

    def _unindex(self, uid: str, leaving: bool = False) -> None:
        """Take a pod's charges back; ``leaving``: it is counted no more (deleted, finished)."""
        pod = self.pods.get(uid)
        if pod is None:
            return
        if group := self.charged.remove(pod):
            self.groups.refresh(group)
        self.waiting.pod_out(pod)
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
        return self.pool.share(ComputeCharge(self.queue_of_pod(pod), *charged))

    # ---- PodGroups (``groups``) -----------------------------------------------------------
    def upsert_podgroup(self, group: PodGroupRecord) -> None:
        if self.groups.put(group):
            self._recharge(list(self.charged.in_group(group.key)))

    def delete_podgroup(self, key: str) -> None:
        if (group := self.groups.drop(key)) is not None:
            self.waiting.gone(group.uid)
            self._recharge(list(self.charged.in_group(key)))

    def group_request(self, group: PodGroupRecord) -> dict[CardSpec, int]:
        owner = self.workloads.by_uid.get(group.owner.uid) if group.owner else None
        return group_request(group, owner, self.inventory, self.policy)

    # ---- queue resolution and ownership --------------------------------------------------
    def enforcement(self, queue: str) -> str:
        """Whether ``queue``'s quota refuses: its ``cardquota.volcano.sh/enforcement`` ("deny", "warn"
        or "audit"), else the cluster's (decisions.md §34)."""
        if self.enforcing_all:
            return "deny"
        info = self.tree.queues.get(queue)
        said = info.record.annotations.get(keys.ENFORCEMENT, "") if info is not None else ""
        return said if said in keys.ENFORCEMENTS else self.policy.enforcement

    @contextlib.contextmanager
    def enforcing(self) -> Iterator["ClusterState"]:
        """This state with every quota refusing, whatever its mode, while the block runs: what
        ``audit`` and ``headroom`` answer (what ``deny`` would)."""
        before, self.enforcing_all = self.enforcing_all, True
        try:
            yield self
        finally:
            self.enforcing_all = before

    def queue_of_pod(self, pod: PodRecord) -> str:
        """The queue ``pod`` is charged to: the one Volcano schedules it in (``run_queue``). Read for
        every pod charged: the PodGroup the cache holds, nearly every pod's case, is taken here
        without building the answer ``run_queue`` gives (a tenth of the cost)."""
        annotations = pod.template.annotations
        name = annotations.get(keys.GROUP_NAME)
        if name:
            group = self.podgroups.get(f"{pod.namespace}/{name}")
            if group is not None:
                return group.queue or keys.DEFAULT_QUEUE
        return self.run_queue(pod.namespace, annotations, pod.owner).queue

    def run_queue(
        self, namespace: str, annotations: Mapping[str, str], owner: OwnerRef | None = None
    ) -> RunQueue:
        """The queue Volcano schedules a pod of ``namespace`` with ``annotations`` (and controller
        ``owner``) in, the one rule for pods and pod templates (decisions.md §30): the PodGroup its
        ``scheduling.k8s.io/group-name`` names, as the cache holds it; not seen yet, its Volcano
        Job's (``job_queue``); else the PodGroup the pg-controller makes for it, from its own
        queue annotation, in its namespace's default queue where Volcano puts it there."""
        name = annotations.get(keys.GROUP_NAME)
        if name:
            key = f"{namespace}/{name}"
            group = self.podgroups.get(key)
            if group is not None:
                return RunQueue(group.queue or keys.DEFAULT_QUEUE, PODGROUP, key)
            job = self.workloads.by_uid.get(owner.uid) if owner is not None else None
            if job is not None and job.kind == "Job":
                return self.job_queue(job)
        default = self.namespace_queues.get(namespace)
        queue, defaulted = namespace_default(created_queue(annotations), default)
        return RunQueue(queue, CREATED, namespace, defaulted)

    def job_queue(self, job: WorkloadRecord) -> RunQueue:
        """The queue a Volcano Job's pods run in: its PodGroup's, once the cache holds it; before,
        the one its controller creates it in (``spec.queue``, ``default`` when empty), moved to its
        namespace's default by Volcano's PodGroup mutation."""
        for key in self.groups.of_owner(job.uid):
            group = self.podgroups[key]
            return RunQueue(group.queue or keys.DEFAULT_QUEUE, PODGROUP, key)
        default = self.namespace_queues.get(job.namespace)
        queue, defaulted = namespace_default(job.queue or keys.DEFAULT_QUEUE, default)
        return RunQueue(queue, JOB, job.key, defaulted)

    def template_queue(self, workload: WorkloadRecord, namespace: str = "") -> RunQueue:
        """The queue the pods of ``workload`` run in (a Volcano Job's tasks all run in the job's);
        ``namespace``: where it is when its object names none (a review's)."""
        where = namespace or workload.namespace
        if workload.kind == "Job":
            return self.job_queue(replace(workload, namespace=where))
        annotations = workload.tasks[0].template.annotations if workload.tasks else {}
        return self.run_queue(where, annotations)

    # ---- namespaces -----------------------------------------------------------------------
    def upsert_namespace(self, name: str, queue: str | None, labels: Mapping[str, str] | None = None) -> None:
        """A Namespace and its ``scheduling.volcano.sh/queue-name`` (None: it carries none). When it
        changes, the pods of the namespace whose PodGroup the cache does not hold are charged again
        (a PodGroup keeps the queue it was created in), and its refused workloads wait again."""
        if labels is None:
            self.namespace_labels.pop(name, None)
        else:
            self.namespace_labels[name] = labels
        old = self.namespace_queues.get(name)
        if queue is None:
            self.namespace_queues.pop(name, None)
        else:
            self.namespace_queues[name] = queue
        if old == queue:
            return
        groups = self.podgroups
        self._recharge(
            [
                uid
                for uid, pod in self.pods.items()
                if pod.namespace == name and f"{name}/{pod.group_name}" not in groups
            ]
        )
        for uid, workload in list(self.workloads.by_uid.items()):
            if workload.namespace == name:
                self.waiting.changed(uid)

    def delete_namespace(self, name: str) -> None:
        self.upsert_namespace(name, None)

    def queue_refuses_namespace(self, queue: str, namespace: str) -> str:
        """Why ``namespace`` may not charge ``queue`` (its ``cardquota.volcano.sh/namespaces`` selects
        it not), or "". A namespace the cache has not seen yet is judged by its name label alone,
        which the API server sets on every Namespace."""
        info = self.tree.queues.get(queue)
        text = info.record.annotations.get(keys.NAMESPACES) if info is not None else None
        if text is None or not namespace:
            return ""
        try:
            selector = parse_selector(text)
        except SelectorError:
            return f"its {keys.NAMESPACES} ({shorten(text)}) does not parse, so it admits no namespace"
        labels = self.namespace_labels.get(namespace) or {keys.NAMESPACE_NAME_LABEL: namespace}
        if selector.selects(labels):
            return ""
        return f"its {keys.NAMESPACES} ({shorten(text)}) does not select namespace {namespace}"

    def workload_of(self, pod: PodRecord) -> WorkloadRecord | None:
        """The scalable workload a pod belongs to (a ReplicaSet's Deployment when it has one)."""
        if pod.owner is None:
            return None
        owner = self.workloads.by_uid.get(pod.owner.uid)
        return self.workloads.scalable(owner) if owner is not None else None

    def live_pods_of(self, workload: WorkloadRecord) -> int:
        uids = set(self.charged.owned_by(workload.uid))
        for child in self.workloads.children(workload.uid):
            uids |= self.charged.owned_by(child)
        return sum(
            1 for uid in uids if uid in self.pods and self.pods[uid].phase not in ("Succeeded", "Failed")
        )

    def pods_owned_by(self, uid: str) -> list[PodRecord]:
        return [self.pods[p] for p in self.charged.owned_by(uid) if p in self.pods]

    # ---- workloads (``workloads``) ------------------------------------------------------
    def upsert_workload(self, workload: WorkloadRecord) -> None:
        self.workloads.put(workload)
        self.waiting.workload_in(workload)
        self._after_owner_change(workload.uid)
        self.waiting.changed(workload.uid)

    def delete_workload(self, kind: str, key: str) -> None:
        workload = self.workloads.remove(kind, key)
        if workload is not None:
            self._after_owner_change(workload.uid)
            self.waiting.gone(workload.uid)

    def _after_owner_change(self, uid: str) -> None:
        self._recharge(list(self.charged.owned_by(uid)))
        for group in self.groups.of_owner(uid):
            self.groups.refresh(group)


def _resized(old: PodRecord, new: PodRecord) -> bool:
    """Whether ``new`` asks other CPU or memory than ``old`` (an in-place resize the cache sees)."""
    was, now = old.template.resources, new.template.resources
    return was.cpu != now.cpu or was.memory != now.memory

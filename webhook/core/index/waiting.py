"""Who stands in the waiting line and why (SPEC §5c, §5d): the line kept current from the cache.

``Waiting`` owns the line (``line.WaitingLine``), the refused workloads and PodGroups with their
places (``line.Refused``), and the gated pods whose queue's quota can never hold them. The state
tells it of pods, workloads and PodGroups as they come and go; it brings each waiter's place up to
date (``rewait``), and the decisions and ``calls`` read the line.
"""

from collections.abc import Callable, Mapping

from webhook.core.index.charges import PodIndex
from webhook.core.index.groups import PodGroups, enqueue_key
from webhook.core.index.line import Refused, Waiter, WaitingLine, group_waiter, pod_waiter, workload_waiter
from webhook.core.index.queues import QueueTree
from webhook.core.index.reservations import RESERVING_PHASES
from webhook.core.index.workloads import Workloads
from webhook.core.model import keys
from webhook.core.model.demand import Demand, PodDemand
from webhook.core.model.ledger import Ledger
from webhook.core.model.objects import PodRecord, PodTemplate, WorkloadRecord

LEFT_BOUND = 100_000  # departures kept between two passes of the caller (it takes them every second)


def scale_key(workload: WorkloadRecord) -> str:
    """The ledger key of a workload's scale-up: the pods admitted for it and not seen yet."""
    return f"scale:{workload.kind}/{workload.key}"


class Waiting:
    def __init__(
        self,
        pods: Mapping[str, PodRecord],
        workloads: Workloads,
        groups: PodGroups,
        charged: PodIndex,
        ledger: Ledger,
        tree: QueueTree,
        asked: Callable[[PodTemplate], Demand],
        queue_of: Callable[[WorkloadRecord], str],
        over_quota: str,
    ) -> None:
        """``asked``: what a pod template asks for now; ``queue_of``: the queue a workload's pods run
        in; ``over_quota``: the policy's "deny" or "wait"."""
        self.line = WaitingLine()
        self._pods, self._workloads, self._groups, self._charged = pods, workloads, groups, charged
        self._ledger, self._tree, self._asked, self._over_quota = ledger, tree, asked, over_quota
        self._queue_of = queue_of
        self._refused = Refused()  # deny mode: who was refused, since when, at what priority
        self._group_keys: dict[str, str] = {}  # PodGroup uid -> key, for those refused at enqueue
        self._unfit: dict[str, str] = {}  # gated pod uid -> its queue, whose quota can never hold it
        # Refused workload uid -> its queue, whose quota could never hold all it still wants: it
        # keeps its place but stands out of the line (ahead of no one) until that changes.
        self._parked: dict[str, str] = {}
        self._newly_parked: dict[str, Waiter] = {}  # parked since the caller last asked (an Event)
        # Owner uid -> (name, expiry) of the last pod a mutation put under our gate: until the cache
        # sees it, a second create of the same workload must not be gated as well.
        self._gating: dict[str, tuple[str, float]] = {}
        # Waiters that left the line with what they waited for (or wanting no more), until the
        # caller takes them: every departure counts, not only those a caller's pass saw standing.
        self._left: dict[str, Waiter] = {}

    def wait(self, uid: str, since: float, priority: int, group: str = "") -> None:
        """The workload ``uid``, whose controller was just refused a pod, or the PodGroup ``uid``
        (key ``group``) refused at enqueue, takes its place in its queue's line; one already there
        keeps its place (its first refusal, its highest priority). A workload whose missing pods
        its queue could never all hold keeps that place out of the line (``rewait``)."""
        if group:
            self._group_keys[uid] = group
        self._refused.refuse(uid, since, priority)
        self.rewait(uid)

    def unfit(self, waiter: Waiter) -> None:
        """``waiter`` can never fit its queue's quota (or an ancestor's) as it is now: it leaves the
        line, so those behind it are called. A refused workload or PodGroup rejoins when refused
        again and it could fit; a gated pod keeps its gate and rejoins when its queue changes."""
        self.line.remove(waiter.key)
        if waiter.pod and (pod := self._pods.get(waiter.key)) is not None:
            self._groups.gate(pod, waiter, -1)
            self._unfit[waiter.key] = waiter.queue
        else:
            self._refused.served(waiter.key)
            self._group_keys.pop(waiter.key, None)

    def departed(self) -> list[Waiter]:
        """The waiters that left the line served since the last call and are not back in it."""
        left, self._left = self._left, {}
        return [waiter for key, waiter in left.items() if self.line.get(key) is None]

    def _leave(self, key: str) -> Waiter | None:
        waiter = self.line.remove(key)
        if waiter is not None and len(self._left) < LEFT_BOUND:
            self._left[key] = waiter
        return waiter

    def requota(self) -> None:
        """A queue's quota changed: every refused workload is judged again, in the line or out of it
        (``rewait``)."""
        for uid in list(self._refused.all()):
            if uid not in self._group_keys:
                self.rewait(uid)

    def take_parked(self) -> list[Waiter]:
        """The workloads that went out of the line since the last call, still out of it."""
        parked, self._newly_parked = self._newly_parked, {}
        return [waiter for uid, waiter in parked.items() if uid in self._parked]

    def parked_place(self, uid: str) -> tuple[float, int] | None:
        """A parked workload's place, ``(since, priority)``; None for one that is not parked."""
        return self._refused.place(uid) if uid in self._parked else None

    def unfit_in(self, queue: str) -> list[str]:
        """The gated pods that left ``queue``'s line as never fitting (its quota changed)."""
        return [uid for uid, at in self._unfit.items() if at == queue]

    def over_quota(self, queue: str) -> str:
        """ "deny" or "wait": the queue's own choice (its over-quota annotation), else the policy's."""
        info = self._tree.queues.get(queue)
        chosen = info.record.annotations.get(keys.OVER_QUOTA, "") if info is not None else ""
        return chosen if chosen in ("deny", "wait") else self._over_quota

    def marked(self) -> set[str]:
        """Workloads that wait in line or carry a waiting mark (``calls.marks`` reconciles them)."""
        return self._refused.all()

    def waiting_pods(self, waiter: Waiter) -> int:
        """The pods ``waiter`` still waits for: those not called yet (held in the ledger), nor
        admitted out of its call and not seen yet (called again for those, it would hold cards its
        controller, its pods all made, never uses, keeping them from those behind it)."""
        entry = self._ledger.get(waiter.hold)
        called = entry.pods if entry is not None else 0
        return max(0, waiter.pods - called - self._ledger.admitted_from(waiter.hold))

    def gating(self, owner_uid: str, name: str, until: float) -> None:
        """A mutation put pod ``name`` of ``owner_uid`` under our gate, not seen yet (``name`` is
        empty for a pod named by ``generateName``: the mutation runs before the name is made)."""
        self._gating[owner_uid] = (name, until)

    def gated_in_flight(self, owner_uid: str, name: str) -> bool:
        """Whether a mutation put another pod of ``owner_uid`` under our gate that the cache has not
        seen arrive yet (two creates of a ReplicaSet can be mutated before the first is seen). A
        mutation of a pod with no name yet cannot be the gated one's again: that one has the gate."""
        mark = self._gating.get(owner_uid)
        return mark is not None and (not name or mark[0] != name)

    def expire(self, now: float) -> None:
        if self._gating:
            self._gating = {uid: mark for uid, mark in self._gating.items() if mark[1] >= now}

    # ---- what the cache sees ------------------------------------------------------------
    def seen(self, pod: PodRecord) -> None:
        """``pod`` is in the cache: if it is the one a mutation gated, the cache's count takes over."""
        if not self._gating or pod.owner is None or (mark := self._gating.get(pod.owner.uid)) is None:
            return
        if mark[0] == pod.name or (not mark[0] and pod.waiting is not None):
            del self._gating[pod.owner.uid]

    def pod_in(self, pod: PodRecord, queue: str) -> None:
        """``pod`` is indexed (in ``queue``): a gated one takes its place; its owner's is updated."""
        if pod.owner is not None and pod.owner.uid in self._refused:
            self.rewait(pod.owner.uid)
        if pod.waiting is not None and pod.is_live:
            asked = self._asked(pod.template)
            if isinstance(asked, PodDemand):
                waiter = pod_waiter(pod, asked, queue)
                self.line.put(waiter)
                self._groups.gate(pod, waiter, +1)

    def pod_out(self, pod: PodRecord) -> None:
        """``pod`` is taken out of the index (to change, or to leave)."""
        if (waiter := self._leave(pod.uid)) is not None and waiter.pod:
            self._groups.gate(pod, waiter, -1)
        self._unfit.pop(pod.uid, None)
        if pod.owner is not None and pod.owner.uid in self._refused:
            self.rewait(pod.owner.uid, leaving=pod.uid)

    def workload_in(self, workload: WorkloadRecord) -> None:
        """A workload's record as it is now: with its waiting mark, or without."""
        self._refused.marked(workload.uid, workload.waiting)

    def changed(self, uid: str) -> None:
        """What the workload or PodGroup ``uid`` waits for may have changed."""
        if uid in self._refused:
            self.rewait(uid)

    def gone(self, uid: str) -> None:
        """The workload or PodGroup ``uid`` is deleted."""
        self._refused.forget(uid)
        self._parked.pop(uid, None)
        self._group_keys.pop(uid, None)
        self.line.remove(uid)
        self._left.pop(uid, None)

    def rewait(self, uid: str, leaving: str = "") -> None:
        """Bring a refused workload's place up to date; it leaves the line once it has every pod it
        wants (or is gone, or uses no card). ``leaving``: a pod being taken out, not counted."""
        workload, place = self._workloads.by_uid.get(uid), self._refused.place(uid)
        waiter = None
        group = self._groups.by_key.get(self._group_keys.get(uid, ""))
        if group is not None and place is not None and group.phase not in RESERVING_PHASES:
            rest = self._groups.unreserved(group)
            if rest:
                spec, count = next(iter(rest.items()))
                waiter = group_waiter(group, spec, count, *place, enqueue_key(uid, 0))
        elif workload is not None and place is not None and workload.tasks:
            demand = self._asked(workload.tasks[0].template)
            if isinstance(demand, PodDemand):
                pods = self._pods
                live = sum(
                    1 for p in self._charged.owned_by(uid) if p != leaving and p in pods and pods[p].is_live
                )
                hold = scale_key(self._workloads.scalable(workload))
                waiter = workload_waiter(workload, self._queue_of(workload), demand, live, *place, hold)
        if waiter is None:
            self._refused.served(uid)
            self._group_keys.pop(uid, None)
            self._parked.pop(uid, None)
            self._leave(uid)
        elif not waiter.group and not self._tree.ever_holds(
            waiter.queue, waiter.spec.cards, waiter.per_pod, waiter.pods
        ):
            if uid not in self._parked and len(self._newly_parked) < LEFT_BOUND:
                self._newly_parked[uid] = waiter
            self._parked[uid] = waiter.queue  # all it still wants could never fit: ahead of no one
            self.line.remove(uid)

        else:
            self._parked.pop(uid, None)
            self.line.put(waiter)

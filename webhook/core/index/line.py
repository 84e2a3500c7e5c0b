"""The waiting line (SPEC §5c): who waits for cards in each queue, and in what order.

A ``Waiter`` is a workload whose controller was refused a pod and still wants more pods than it has
(``deny`` mode), a pod held under the webhook's scheduling gate (``wait`` mode), or a PodGroup
refused at enqueue (the enqueue gate, SPEC §5d). Each queue's
waiters are ordered by priority (highest first), then by when they started waiting, then by key, so
the order is total and the same on every replica that rebuilds it. ``WaitingLine`` owns the
waiters; the state keeps it current from its events, and ``calls`` serves it.
"""

import math
from collections.abc import Iterator

from webhook.core.model import keys
from webhook.core.model.cards import CardSpec
from webhook.core.model.demand import PodDemand
from webhook.core.model.objects import BATCH_JOB, BEHIND, PodGroupRecord, PodRecord, WorkloadRecord
from webhook.core.model.values import value_class

# The controllers that wait in line when refused (deny mode), by the kind the state holds them under:
# each reacts to an update of its own object (our call mark) by syncing again at once.
CALLED_KINDS = frozenset({"ReplicaSet", "StatefulSet", BATCH_JOB})
Place = tuple[int, float, str]  # (-priority, since, key): the line's order, smallest first


@value_class
class Waiter:
    """One place in a queue's line."""

    key: str  # a workload's uid (deny mode), or a gated pod's uid (wait mode)
    queue: str
    spec: CardSpec  # what each pod asks for; an A|B spec stays flexible while it waits
    per_pod: int  # cards per pod, in card units
    pods: int  # pods it waits for: a workload's missing pods, 1 for a gated pod
    priority: int
    since: float  # when it started waiting, seconds since the epoch
    what: str  # how messages and status name it: "replicaset ns/name", "pod ns/name"
    hold: str  # the ledger key what it is called for is held under (a scale-up's, a pod's uid)
    pod: bool = False  # a gated pod (wait mode), not a workload
    group: bool = False  # a PodGroup refused at enqueue: the scheduler retries it every period
    namespace: str = ""

    @property
    def place(self) -> Place:
        return (-self.priority, self.since, self.key)


def workload_waiter(
    workload: WorkloadRecord,
    queue: str,
    demand: PodDemand,
    live: int,
    since: float,
    priority: int,
    hold: str,
) -> Waiter | None:
    """The place of a refused workload (a ReplicaSet, StatefulSet or batch Job) whose pods run in
    ``queue``, that has ``live`` pods and wants ``workload.replicas``; None once it has them all."""
    missing = workload.replicas - live
    if missing <= 0:
        return None
    what = f"{workload.kind.lower()} {workload.key}"
    return Waiter(
        workload.uid,
        queue,
        demand.spec,
        demand.count,
        missing,
        priority,
        since,
        what,
        hold,
        namespace=workload.namespace,
    )


def pod_waiter(pod: PodRecord, demand: PodDemand, queue: str) -> Waiter:
    """The place of a pod held under our scheduling gate (wait mode): its hold is its own uid."""
    since, priority = pod.waiting or BEHIND
    what = f"pod {pod.key}"
    return Waiter(
        pod.uid,
        queue,
        demand.spec,
        demand.count,
        1,
        priority,
        since,
        what,
        pod.uid,
        pod=True,
        namespace=pod.namespace,
    )


def group_waiter(
    group: PodGroupRecord, spec: CardSpec, count: int, since: float, priority: int, hold: str
) -> Waiter:
    """The place of a PodGroup refused at enqueue (SPEC §5d), waiting for ``count`` units of
    ``spec`` (the first card it lacks), whole: one "pod" of them all."""
    queue = group.queue or keys.DEFAULT_QUEUE
    what = f"podgroup {group.key}"
    return Waiter(
        group.uid, queue, spec, count, 1, priority, since, what, hold, group=True, namespace=group.namespace
    )


def place_of(priority: int, since: float, key: str = "\uffff") -> Place:
    """Where a request that is not in the line would stand: behind its equals that came first."""
    return (-priority, since, key)


LAST: Place = (2**63, math.inf, "\uffff")  # behind everyone: where a scale-up stands


def ordinal(place: int) -> str:
    """1 -> "1st", 2 -> "2nd", 11 -> "11th", 23 -> "23rd"."""
    suffix = "th" if 10 <= place % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(place % 10, "th")
    return f"{place}{suffix}"


class WaitingLine:
    """Every queue's line of waiters, kept in order."""

    def __init__(self) -> None:
        self._waiters: dict[str, Waiter] = {}
        self._lines: dict[str, list[Waiter]] = {}

    def put(self, waiter: Waiter) -> None:
        """Add ``waiter``, or replace the one with its key (its place may move)."""
        self.remove(waiter.key)
        self._waiters[waiter.key] = waiter
        line = self._lines.setdefault(waiter.queue, [])
        line.append(waiter)
        line.sort(key=_place)

    def remove(self, key: str) -> Waiter | None:
        waiter = self._waiters.pop(key, None)
        if waiter is not None:
            line = self._lines[waiter.queue]
            line.remove(waiter)
            if not line:
                del self._lines[waiter.queue]
        return waiter

    def get(self, key: str) -> Waiter | None:
        return self._waiters.get(key)

    def line(self, queue: str) -> tuple[Waiter, ...]:
        """``queue``'s waiters in order, first in line first."""
        return tuple(self._lines.get(queue, ()))

    def ahead(self, queue: str, place: Place, skip_hold: str = "") -> tuple[Waiter, ...]:
        """The waiters of ``queue`` that stand before ``place``, leaving out those held under
        ``skip_hold`` (a scale-up already counts its own workload's missing pods)."""
        return tuple(
            w
            for w in self._lines.get(queue, ())
            if w.place < place and not (skip_hold and w.hold == skip_hold)
        )

    def queues(self) -> tuple[str, ...]:
        """The queues that have a line, sorted."""
        return tuple(sorted(self._lines))

    def __len__(self) -> int:
        return len(self._waiters)

    def __iter__(self) -> Iterator[Waiter]:
        return iter(list(self._waiters.values()))


class Refused:
    """The workloads refused in deny mode: when each first was and at what priority, from the
    refusals this replica made and from the marks the serving replica left on them."""

    def __init__(self) -> None:
        self._places: dict[str, tuple[float, int]] = {}  # uid -> (since, priority)
        self._marked: set[str] = set()  # uids whose record carries a waiting mark

    def refuse(self, uid: str, since: float, priority: int) -> None:
        """A refusal: a workload refused before keeps its first time and its highest priority."""
        known = self._places.get(uid)
        if known is not None:
            since, priority = min(known[0], since), max(known[1], priority)
        self._places[uid] = (since, priority)

    def marked(self, uid: str, mark: tuple[float, int] | None) -> None:
        """The workload's record as it is now: with its mark (a rebuilt place), or without."""
        if mark is None:
            self._marked.discard(uid)
        else:
            self._marked.add(uid)
            self._places.setdefault(uid, mark)

    def place(self, uid: str) -> tuple[float, int] | None:
        return self._places.get(uid)

    def served(self, uid: str) -> None:
        """It has every pod it wants (or is gone): it waits no more."""
        self._places.pop(uid, None)

    def forget(self, uid: str) -> None:
        self._places.pop(uid, None)
        self._marked.discard(uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._places

    def all(self) -> set[str]:
        """Every workload that waits or carries a mark (``calls.marks`` reconciles them)."""
        return set(self._places) | self._marked


def _place(waiter: Waiter) -> Place:
    return waiter.place

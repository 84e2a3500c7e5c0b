"""A property of the waiting line, in both modes, over random sequences of creates, frees, quota
changes and priorities: it never calls or releases beyond quota, never leaves its head waiting
while the head fits, serves no one ahead of someone before it who fits, and equals the line rebuilt
from scratch. Deny mode: refused ReplicaSets wait and are called; wait mode: their pods are created
under the gate and released.

The expected answers come from the cluster the test keeps itself (its pods, which of them are
gated, the ReplicaSets' replicas, who was refused when, at what priority), never from the webhook's
ledger, line or tallies: every create's verdict, every call, and the line after every step are
counted here first and then compared, so a slip in the webhook's bookkeeping fails the property."""

from dataclasses import dataclass
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.builders import H200, cluster, node, owner, pod, queue, replicaset, request
from webhook.core.decide import admission, calls, patches
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.objects import pod_record, queue_record, workload_record
from webhook.core.model.verdicts import Allowed

WORKLOADS = ("a", "b", "c")
ACTIONS = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(WORKLOADS)),
    st.tuples(st.just("finish"), st.integers(0, 30)),
    st.tuples(st.just("quota"), st.integers(0, 5)),
    st.tuples(st.just("replicas"), st.sampled_from(WORKLOADS), st.integers(0, 4)),
    st.tuples(st.just("call"), st.just(0)),
)
UNIT = 1000  # a card in the webhook's units
# What the test expects of a create, and the reason the webhook gives when it admits one.
CALLED, FITS, GATED, JOINS, REFUSED = "called", "fits", "gated", "joins the line", "refused"
PARKED = "keeps its place out of the line"  # what it still wants could never all fit the quota
REASONS = {CALLED: "admitted under its workload's scale-up", FITS: "fits the queue's quota", GATED: "waits "}
Place = tuple[int, float, str]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A place in the queue's line, as the test counts it from its own cluster."""

    what: str  # as the webhook names it: "replicaset ns/a", "pod ns/a-3"
    name: str  # the ReplicaSet, or the one whose pod it is
    uid: str  # the gated pod (wait mode); "" for a ReplicaSet (deny mode)
    size: int  # cards per pod
    pods: int  # pods it waits for
    place: Place  # (-priority, since, uid): the line's order


class Model:
    """A queue of H200 cards, three ReplicaSets of one-card pods with their own priorities, and
    the cache seeing every admitted pod at once (bound and running)."""

    def __init__(
        self,
        quota: int,
        priorities: tuple[int, ...],
        replicas: tuple[int, ...],
        sizes: tuple[int, ...],
        mode: str = "deny",
    ) -> None:
        self.quota, self.now, self.serial, self.mode = quota, 1, 0, mode
        self.sizes = dict(zip(WORKLOADS, sizes, strict=True))
        self.priorities = dict(zip(WORKLOADS, priorities, strict=True))
        self.replicas = dict(zip(WORKLOADS, replicas, strict=True))
        self.marks: dict[str, str] = {}
        self.occupants = [self._pod(f"occupant-{i}", None) for i in range(quota)]
        self.live: dict[str, dict[str, Any]] = {p["metadata"]["uid"]: p for p in self.occupants}
        self.refused: dict[str, float] = {}  # deny mode: ReplicaSets refused that want more -> when
        self.gated: dict[str, float] = {}  # wait mode: pods created under the gate -> when
        self.holds: dict[str, int] = {}  # deny mode: pods a call told a ReplicaSet to create, not yet
        self.state = cluster(*self.objects())

    def _rs(self, name: str) -> dict[str, Any]:
        obj = replicaset(name, self.replicas[name], name, H200)
        obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(
            self.sizes[name]
        )
        obj["spec"]["template"]["spec"]["priority"] = self.priorities[name]
        if name in self.marks:
            obj["metadata"]["annotations"] = {"cardquota.volcano.sh/waiting": self.marks[name]}
        return obj

    def _pod(self, name: str, rs_name: str | None) -> dict[str, Any]:
        ref = owner("ReplicaSet", rs_name, f"uid-rs-{rs_name}") if rs_name else None
        priority = self.priorities[rs_name] if rs_name else 0
        return pod(name, owner=ref, spec={"priority": priority}, count=self.sizes[rs_name] if rs_name else 1)

    def _queue(self) -> dict[str, Any]:
        obj = queue("q", f'{{"{H200}": {self.quota}}}')
        obj["metadata"]["annotations"][keys.OVER_QUOTA] = self.mode
        return obj

    def objects(self) -> list[dict[str, Any]]:
        return [
            node("h200", H200, gpus=16),
            self._queue(),
            *(self._rs(name) for name in WORKLOADS),
            *(self.seen(p) for p in self.live.values()),
        ]

    @staticmethod
    def seen(obj: dict[str, Any]) -> dict[str, Any]:
        """The pod as the cache sees it: bound and running at once, unless it is gated."""
        if gated(obj):
            return obj
        return {**obj, "spec": {**obj["spec"], "nodeName": "h200"}, "status": {"phase": "Running"}}

    # ---- the test's own count -------------------------------------------------------------
    def pods_of(self, name: str) -> list[dict[str, Any]]:
        return [p for p in self.live.values() if owner_of(p) == name]

    def used(self) -> int:
        """Cards the queue's live pods take (gated ones take none), and what calls hold."""
        running = sum(size_of(p) for uid, p in self.live.items() if uid not in self.gated)
        return running + sum(pods * self.sizes[name] for name, pods in self.holds.items())

    def line(self) -> list[Waiting]:
        """The queue's line: ReplicaSets refused that still want pods (deny mode) and pods under the
        gate (wait mode), by priority, then since when, then uid."""
        out = [
            Waiting(
                f"replicaset ns/{name}",
                name,
                "",
                self.sizes[name],
                self.replicas[name] - len(self.pods_of(name)),
                (-self.priorities[name], since, f"uid-rs-{name}"),
            )
            for name, since in self.refused.items()
            if not self.parked(name)
        ]
        for uid, since in self.gated.items():
            name = owner_of(self.live[uid])
            what = f"pod ns/{self.live[uid]['metadata']['name']}"
            out.append(Waiting(what, name, uid, self.sizes[name], 1, (-self.priorities[name], since, uid)))
        return sorted(out, key=lambda w: w.place)

    def parked(self, name: str) -> bool:
        """A refused ReplicaSet whose missing pods the whole quota could never hold: it keeps its
        place out of the line, ahead of no one, while that lasts."""
        return (self.replicas[name] - len(self.pods_of(name))) * self.sizes[name] > self.quota

    def waiting(self, waiter: Waiting) -> int:
        """Pods ``waiter`` still waits for: not those a call holds for it."""
        return waiter.pods - (0 if waiter.uid else self.holds.get(waiter.name, 0))

    def place_of(self, name: str) -> Place:
        """Where a create by ``name``'s controller stands: at its place when it waits in the line,
        else (never refused, or parked: out of the line, ahead of no one) behind every waiter of its
        priority or higher."""
        since = self.refused.get(name)
        if since is not None and not self.parked(name):
            return (-self.priorities[name], since, f"uid-rs-{name}")
        return (-self.priorities[name], float(self.now), "\uffff")

    def ahead(self, name: str) -> int:
        """Cards still waiting ahead of a create by ``name``'s controller."""
        place = self.place_of(name)
        return sum(self.waiting(w) * w.size for w in self.line() if w.place < place)

    def expect(self, name: str) -> str:
        """What the webhook must answer a create by ``name``'s controller."""
        size = self.sizes[name]
        if self.holds.get(name, 0) > 0:
            return CALLED
        if self.used() + self.ahead(name) + size <= self.quota:
            return FITS
        if size > self.quota:  # never fits the whole quota: refused, in no line
            return REFUSED
        if self.mode == "wait":
            return GATED
        missing = self.replicas[name] - len(self.pods_of(name))
        return JOINS if missing * size <= self.quota else PARKED  # the whole it waits for never fits

    def callable(self) -> list[tuple[Waiting, int]]:
        """Who a call must call, head first, and for how many pods: as many as fit after all that
        waits ahead (a waiter that does not fit keeps its demand ahead of everyone behind it)."""
        room, out = self.quota - self.used(), []
        for waiter in self.line():
            waiting = self.waiting(waiter)
            pods = min(waiting, max(0, room) // waiter.size)
            if pods > 0:
                out.append((waiter, pods))
            room -= waiting * waiter.size
        return out

    def settle(self) -> None:
        """A ReplicaSet that has every pod it wants leaves the line (a later refusal starts anew)."""
        self.refused = {n: s for n, s in self.refused.items() if len(self.pods_of(n)) < self.replicas[n]}

    # ---- the webhook, driven as the cluster drives it ---------------------------------------
    def create(self, name: str) -> Allowed | None:
        """The ReplicaSet controller's create, if it wants a pod; what the webhook said."""
        if len(self.pods_of(name)) >= self.replicas[name]:
            return None
        self.serial += 1
        obj = self._pod(f"{name}-{self.serial}", name)
        expected, before, ahead = self.expect(name), self.used(), self.ahead(name)
        mutation = admission.mutate(self.state, request(obj), now=self.now)
        assert isinstance(mutation, Allowed)
        obj = jsonpatch.apply_patch(obj, [dict(op) for op in mutation.patch])
        review = request(obj)
        decision = admission.validate(self.state, review, self.now)
        admission.admit(self.state, review, decision, self.now)
        if not isinstance(decision, Allowed):
            assert expected in (JOINS, PARKED, REFUSED), (
                f"{name} refused, but by the test's count it {expected}"
            )
            assert (decision.join is not None) == (expected in (JOINS, PARKED)), (expected, decision)
            if expected in (JOINS, PARKED):  # its place is its first refusal's, in or out of the line
                self.refused.setdefault(name, float(self.now))
            return None
        assert expected in REASONS and decision.reason.startswith(REASONS[expected]), (expected, decision)
        if decision.reason == "fits the queue's quota":
            need = self.sizes[name]
            assert before + need <= self.quota, "admitted beyond quota"
            assert before + ahead + need <= self.quota, "admitted ahead of the line"
        assert gated(obj) == (self.mode == "wait" and decision.reason.startswith("waits")), decision
        uid = obj["metadata"]["uid"]
        self.live[uid] = obj
        if expected == GATED:
            self.gated[uid] = float(self.now)
        if expected == CALLED:
            self.holds[name] -= 1
        self.state.upsert_pod(pod_record(self.seen(obj)))
        self.settle()
        return decision

    def step(self, action: tuple[Any, ...]) -> None:
        self.now += 1
        match action:
            case ("create", name):
                self.create(name)
            case ("finish", index):
                if self.live:
                    uid = sorted(self.live)[index % len(self.live)]
                    del self.live[uid]
                    self.gated.pop(uid, None)
                    self.state.delete_pod(uid)
            case ("quota", quota):
                self.quota = quota
                self.state.upsert_queue(queue_record(self._queue()))
            case ("replicas", name, replicas):
                self.replicas[name] = replicas
                self.state.upsert_workload(workload_record(self._rs(name)))
                self.settle()
            case ("call", _):
                self.call()
        self.write_marks()

    def call(self) -> None:
        room = self.quota - self.used()
        before, expected = self.line(), self.callable()
        called = calls.call_next(self.state, self.now)
        assert [(c.waiter.what, c.pods, c.card) for c in called] == [
            (w.what, pods, None) for w, pods in expected
        ], "the line called others than the test counts"
        assert sum(c.pods * c.waiter.per_pod for c in called) <= max(0, room) * UNIT, "called beyond quota"
        pods = {c.waiter.what: c.pods for c in called}
        for waiter in before:  # nobody is called into room that those ahead of it wait for
            assert pods.get(waiter.what, 0) * waiter.size <= max(0, room), f"{waiter.what} overtook"
            room -= self.waiting(waiter) * waiter.size
        self.holds = {w.name: count for w, count in expected if not w.uid}  # held until they arrive
        for (waiter, count), call in zip(expected, called, strict=True):
            if waiter.uid:  # released: the gate removed, as the caller's patch does
                ops = patches.release_patch(self.state, self.live[waiter.uid], call.card)
                assert ops is not None
                live = jsonpatch.apply_patch(self.live[waiter.uid], [dict(op) for op in ops])
                assert not gated(live)
                self.live[waiter.uid] = live
                del self.gated[waiter.uid]
                self.state.upsert_pod(pod_record(self.seen(live)))
                continue
            for _ in range(count):  # its controller is told to retry: admitted within the hold
                assert self.create(waiter.name) is not None, f"{waiter.name} was called but refused"
        assert not any(self.holds.values()), f"called pods never created: {self.holds}"
        self.holds.clear()

    def write_marks(self) -> None:
        """What the serving replica does after calls: the waiting marks on the ReplicaSets."""
        for mark in calls.marks(self.state):
            if mark.text is None:
                self.marks.pop(mark.name, None)
            else:
                self.marks[mark.name] = mark.text
            self.state.upsert_workload(workload_record(self._rs(mark.name)))
        assert set(self.marks) == set(self.refused), "a ReplicaSet's waiting mark says otherwise"


def owner_of(obj: dict[str, Any]) -> str:
    return str((obj["metadata"].get("ownerReferences") or [{}])[0].get("name", ""))


def size_of(obj: dict[str, Any]) -> int:
    return int(obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])


def gated(obj: dict[str, Any]) -> bool:
    return any(g.get("name") == keys.GATE for g in obj["spec"].get("schedulingGates") or [])


def line(state: ClusterState) -> list[tuple[str, int, tuple[int, float, str]]]:
    return [(w.what, w.pods, w.place) for w in state.line.line("q")]


def check_line(model: Model) -> None:
    """The webhook's line is the test's: the same waiters, sizes, pods and places, in order."""
    theirs = [(w.what, w.per_pod, w.pods, w.place) for w in model.state.line.line("q")]
    mine = [(w.what, w.size * UNIT, w.pods, w.place) for w in model.line()]
    assert theirs == mine, "the line differs from the test's count"


def check_head_not_starved(model: Model) -> None:
    """After a call, every waiter still waiting is one that does not fit after those ahead of it."""
    room = model.quota - model.used()
    for waiter in model.line():
        waiting = model.waiting(waiter)
        if waiting > 0:
            assert room < waiter.size, f"{waiter.what} fits but waits"
            room -= waiting * waiter.size


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Always run: a ReplicaSet of higher priority refused last is called first, one refused again while
# it waits keeps its first place, and two called at once each get their pods (deny mode); a gated
# pod of higher priority is released before an older one, and two are released at once (wait mode).
@example(
    quota=2,
    priorities=(0, 10, 0),
    replicas=(1, 1, 2),
    sizes=(1, 1, 1),
    actions=[
        *[("create", "a"), ("create", "c"), ("create", "b"), ("create", "a"), ("finish", 0)],
        *[("call", 0), ("finish", 1), ("quota", 4), ("call", 0)],
    ],
    mode="deny",
)
@example(  # a parked ReplicaSet's pod that fits the quota stands behind those in the line
    quota=2,
    priorities=(0, 0, 0),
    replicas=(0, 2, 1),
    sizes=(1, 2, 1),
    actions=[("create", "b"), ("create", "c"), ("finish", 0), ("finish", 0), ("create", "b")],
    mode="deny",
)
@example(
    quota=1,
    priorities=(0, 10, 0),
    replicas=(2, 1, 0),
    sizes=(1, 1, 1),
    actions=[
        *[("create", "a"), ("create", "b"), ("finish", 2), ("call", 0), ("create", "a"), ("call", 0)],
        *[("quota", 3), ("call", 0)],
    ],
    mode="wait",
)
@given(
    quota=st.integers(0, 4),
    priorities=st.tuples(*(st.sampled_from((0, 0, 10)) for _ in WORKLOADS)),
    replicas=st.tuples(*(st.integers(0, 4) for _ in WORKLOADS)),
    sizes=st.tuples(*(st.integers(1, 2) for _ in WORKLOADS)),
    actions=st.lists(ACTIONS, max_size=40),
    mode=st.sampled_from(("deny", "wait")),
)
def test_the_line_never_calls_beyond_quota_never_starves_its_head_and_equals_a_rebuild(
    quota: int,
    priorities: tuple[int, ...],
    replicas: tuple[int, ...],
    sizes: tuple[int, ...],
    actions: list[tuple[Any, ...]],
    mode: str,
) -> None:
    model = Model(quota, priorities, replicas, sizes, mode)
    for action in actions:
        model.step(action)
        check_line(model)
        if action[0] == "call":
            check_head_not_starved(model)
        places = [w.place for w in model.state.line.line("q")]
        assert places == sorted(places)
        rebuilt = cluster(*model.objects())
        assert [(what, pods) for what, pods, _ in line(rebuilt)] == [
            (w.what, w.pods) for w in model.state.line.line("q")
        ], "the line differs from one rebuilt from the cluster"
        assert line(rebuilt) == line(model.state)
    model.step(("quota", 100))
    model.step(("call", 0))
    check_line(model)
    assert model.line() == [] and line(model.state) == [], "a waiter was never served once its cards freed"

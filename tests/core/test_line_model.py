"""A property of the waiting line, in both modes, over random sequences of creates, frees, quota
changes and priorities: it never calls or releases beyond quota, never leaves its head waiting
while the head fits, serves no one ahead of someone before it who fits, and equals the line rebuilt
from scratch. Deny mode: refused ReplicaSets wait and are called; wait mode: their pods are created
under the gate and released."""

from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import H200, cluster, node, owner, pod, queue, replicaset, request
from webhook.core import admission, calls, keys, patches
from webhook.core.objects import pod_record, queue_record, workload_record
from webhook.core.state import ClusterState
from webhook.core.verdicts import Allowed

WORKLOADS = ("a", "b", "c")
ACTIONS = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(WORKLOADS)),
    st.tuples(st.just("finish"), st.integers(0, 30)),
    st.tuples(st.just("quota"), st.integers(0, 5)),
    st.tuples(st.just("replicas"), st.sampled_from(WORKLOADS), st.integers(0, 4)),
    st.tuples(st.just("call"), st.just(0)),
)


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

    def used(self) -> int:
        """Cards the queue's live pods (gated ones take none) and the ledger's holds take."""
        held = sum(pods * per_pod for (_, per_pod), pods in self.state.ledger.held("q").items())
        return sum(self.size_of(p) for p in self.live.values() if not gated(p)) * 1000 + held

    def size_of(self, obj: dict[str, Any]) -> int:
        return int(obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])

    def ahead(self, name: str) -> int:
        """Card units still waiting ahead of a create by ``name``'s controller."""
        mine = self.state.line.get(f"uid-rs-{name}")
        place = mine.place if mine is not None else (-self.priorities[name], float(self.now), "\uffff")
        return sum(
            self.state.waiting_pods(w) * w.per_pod for w in self.state.line.line("q") if w.place < place
        )

    def create(self, name: str) -> Allowed | None:
        """The ReplicaSet controller's create, if it wants a pod; what the webhook said."""
        mine = [
            p
            for p in self.live.values()
            if (p["metadata"].get("ownerReferences") or [{}])[0].get("name") == name
        ]
        if len(mine) >= self.replicas[name]:
            return None
        self.serial += 1
        obj = self._pod(f"{name}-{self.serial}", name)
        before, ahead = self.used(), self.ahead(name)
        mutation = admission.mutate(self.state, request(obj), now=self.now)
        assert isinstance(mutation, Allowed)
        obj = jsonpatch.apply_patch(obj, [dict(op) for op in mutation.patch])
        review = request(obj)
        decision = admission.validate(self.state, review, self.now)
        admission.admit(self.state, review, decision, self.now)
        if isinstance(decision, Allowed):
            if decision.reason == "fits the queue's quota":
                need = self.sizes[name] * 1000
                assert before + need <= self.quota * 1000, "admitted beyond quota"
                assert before + ahead + need <= self.quota * 1000, "admitted ahead of the line"
            assert gated(obj) == (self.mode == "wait" and decision.reason.startswith("waits")), decision
            self.live[obj["metadata"]["uid"]] = obj
            self.state.upsert_pod(pod_record(self.seen(obj)))
            return decision
        return None

    def step(self, action: tuple[Any, ...]) -> None:
        self.now += 1
        match action:
            case ("create", name):
                self.create(name)
            case ("finish", index):
                if self.live:
                    uid = sorted(self.live)[index % len(self.live)]
                    del self.live[uid]
                    self.state.delete_pod(uid)
            case ("quota", quota):
                self.quota = quota
                self.state.upsert_queue(queue_record(self._queue()))
            case ("replicas", name, replicas):
                self.replicas[name] = replicas
                self.state.upsert_workload(workload_record(self._rs(name)))
            case ("call", _):
                self.call()
        self.write_marks()

    def call(self) -> None:
        room = self.quota * 1000 - self.used()
        before = [(w, self.state.waiting_pods(w)) for w in self.state.line.line("q")]
        called = calls.call_next(self.state, self.now)
        assert sum(c.pods * c.waiter.per_pod for c in called) <= max(0, room), "called beyond quota"
        pods = {c.waiter.key: c.pods for c in called}
        for waiter, waiting in before:  # nobody is called into room that those ahead of it wait for
            assert pods.get(waiter.key, 0) * waiter.per_pod <= max(0, room), f"{waiter.what} overtook"
            room -= waiting * waiter.per_pod
        for call in called:
            if call.waiter.pod:  # released: the gate removed, as the caller's patch does
                live = self.live[call.waiter.key]
                ops = patches.release_patch(self.state, live, call.card)
                assert ops is not None
                live = jsonpatch.apply_patch(live, [dict(op) for op in ops])
                assert not gated(live)
                self.live[call.waiter.key] = live
                self.state.upsert_pod(pod_record(self.seen(live)))
                continue
            name = call.waiter.what.split("/")[1]  # each controller is told to retry: admitted
            for _ in range(call.pods):
                assert self.create(name) is not None, f"{name} was called but refused"

    def write_marks(self) -> None:
        """What the serving replica does after calls: the waiting marks on the ReplicaSets."""
        for mark in calls.marks(self.state):
            if mark.text is None:
                self.marks.pop(mark.name, None)
            else:
                self.marks[mark.name] = mark.text
            self.state.upsert_workload(workload_record(self._rs(mark.name)))


def gated(obj: dict[str, Any]) -> bool:
    return any(g.get("name") == keys.GATE for g in obj["spec"].get("schedulingGates") or [])


def line(state: ClusterState) -> list[tuple[str, int, tuple[int, float, str]]]:
    return [(w.what, w.pods, w.place) for w in state.line.line("q")]


def check_head_not_starved(model: Model) -> None:
    """After a call, every waiter still waiting is one that does not fit after those ahead of it."""
    room = model.quota * 1000 - model.used()
    for waiter in model.state.line.line("q"):
        waiting = model.state.waiting_pods(waiter)
        if waiting > 0:
            assert room < waiter.per_pod, f"{waiter.what} fits but waits"
            room -= waiting * waiter.per_pod


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
    assert line(model.state) == [], "a waiter was never served once its cards freed"

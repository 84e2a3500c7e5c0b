"""A random sequence of admissions, arrivals, binds, deletions and expiries never leaves a queue's
card demand (running + pending + admitted-in-flight) without an assignment within its quota."""

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.builders import R4090, R4090D, cluster, node, pod, queue, request
from webhook.core.decide import admission
from webhook.core.index.usage import queue_usage
from webhook.core.model.feasibility import place
from webhook.core.model.objects import pod_record
from webhook.core.model.verdicts import Allowed

SPECS = [R4090, R4090D, f"{R4090}|{R4090D}"]
NODE_OF = {R4090: "r", R4090D: "rd"}


def feasible_total(state: Any) -> tuple[int, int]:
    usage = queue_usage(state, "q")
    capacity = usage.capacity()
    if min(capacity.values(), default=0) < 0:
        return -1, 0
    return place(capacity, usage.groups).total, sum(g.demand for g in usage.groups)


class Admissions(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = cluster(
            node("r", R4090, 8),
            node("rd", R4090D, 8),
            queue("q", '{"NVIDIA-GeForce-RTX-4090": 3, "NVIDIA-GeForce-RTX-4090-D": 2}'),
        )
        self.now = 0.0
        self.serial = 0
        self.in_flight: dict[str, dict[str, Any]] = {}
        self.live: dict[str, dict[str, Any]] = {}

    @rule(spec=st.sampled_from(SPECS), count=st.integers(1, 2))
    def create(self, spec: str, count: int) -> None:
        self.serial += 1
        obj = pod(f"p{self.serial}", spec, count)
        req = request(obj)
        decision = admission.validate(self.state, req, self.now)
        admission.admit(self.state, req, decision, self.now)
        if isinstance(decision, Allowed):
            self.in_flight[obj["metadata"]["uid"]] = obj

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        uid = data.draw(st.sampled_from(sorted(self.in_flight)))
        obj = self.in_flight.pop(uid)
        self.live[uid] = obj
        self.state.upsert_pod(pod_record(obj))

    @precondition(lambda self: any(not o["spec"].get("nodeName") for o in self.live.values()))
    @rule(data=st.data())
    def bind(self, data: st.DataObject) -> None:
        """A careful scheduler: binds only where everything still has a place."""
        uid = data.draw(
            st.sampled_from(sorted(u for u, o in self.live.items() if not o["spec"].get("nodeName")))
        )
        obj = self.live[uid]
        for card in obj["metadata"]["annotations"]["volcano.sh/card.name"].split("|"):
            bound = {
                **obj,
                "spec": {**obj["spec"], "nodeName": NODE_OF[card]},
                "status": {"phase": "Running"},
            }
            before = pod_record(obj)
            self.state.upsert_pod(pod_record(bound))
            total, demand = feasible_total(self.state)
            if total == demand:
                self.live[uid] = bound
                return
            self.state.upsert_pod(before)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), finish=st.booleans())
    def end(self, data: st.DataObject, finish: bool) -> None:
        uid = data.draw(st.sampled_from(sorted(self.live)))
        obj = self.live.pop(uid)
        if finish:
            self.state.upsert_pod(pod_record({**obj, "status": {"phase": "Succeeded"}}))
        else:
            self.state.delete_pod(uid)

    @rule(seconds=st.sampled_from([1.0, 40.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        self.state.expire(self.now)
        if seconds > self.state.policy.in_flight_ttl:
            self.in_flight.clear()  # those creates failed later in the chain and never arrive

    @invariant()
    def demand_always_has_a_place_within_quota(self) -> None:
        total, demand = feasible_total(self.state)
        assert total == demand

    @invariant()
    def bound_cards_never_exceed_quota(self) -> None:
        usage = queue_usage(self.state, "q")
        for card, quota in usage.quota.items():
            assert usage.card(card).bound <= quota


TestAdmissions = Admissions.TestCase
TestAdmissions.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)

"""A property of the enqueue gate (SPEC §5d) over random sequences of Volcano Job creates, enqueue
attempts (as stock Volcano's scheduler makes them, every period), pod creates and finishes, quota
raises and calls of the line: no model of the queue is ever over its quota, a move to Inqueue is
admitted exactly when the job's cards fit after the jobs that wait ahead of it (an independent
count), and the tallies equal a recount from scratch."""

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import H200, H800, cluster, node, owner, pod, podgroup, queue, request
from webhook.core import admission, calls
from webhook.core.objects import pod_record, podgroup_record, queue_record
from webhook.core.verdicts import Allowed

CARDS = (H200, H800)
NODE = {H200: "h200", H800: "h800"}
JOBS = ("a", "b", "c", "d")
ACTIONS = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(JOBS)),
    st.tuples(st.just("enqueue"), st.just(0)),
    st.tuples(st.just("pod"), st.just(0)),
    st.tuples(st.just("bare"), st.sampled_from(CARDS)),
    st.tuples(st.just("finish"), st.integers(0, 30)),
    st.tuples(st.just("raise"), st.sampled_from(CARDS)),
    st.tuples(st.just("call"), st.just(0)),
)


class Model:
    """One queue of H200 and H800 cards; four Volcano Jobs, each of ``size`` one-card pods of one
    model; the cache sees each admitted write at once (pods bound and running)."""

    def __init__(self, quota: dict[str, int], jobs: dict[str, tuple[str, int]]) -> None:
        self.quota, self.jobs, self.now, self.serial = dict(quota), jobs, 1.0, 0
        self.groups: dict[str, dict[str, Any]] = {}  # created jobs' PodGroups, as the API holds them
        self.live: dict[str, dict[str, Any]] = {}  # live pods by uid
        self.refused: dict[str, float] = {}  # jobs refused at enqueue that may wait: first refusal
        self.state = cluster(node("h200", H200, gpus=16), node("h800", H800, gpus=16), self._queue())

    def _queue(self) -> dict[str, Any]:
        return queue("q", "{" + ", ".join(f'"{c}": {n}' for c, n in self.quota.items()) + "}")

    def objects(self) -> list[dict[str, Any]]:
        return [
            node("h200", H200, gpus=16),
            node("h800", H800, gpus=16),
            self._queue(),
            *self.groups.values(),
            *self.live.values(),
        ]

    def pods_of(self, job: str) -> list[dict[str, Any]]:
        return [p for p in self.live.values() if p["metadata"].get("labels", {}).get("job") == job]

    def used(self, card: str) -> int:
        """Cards of ``card`` the queue's live pods take, and its enqueued jobs' pods not created yet."""
        pods = sum(
            1 for p in self.live.values() if p["metadata"]["annotations"]["volcano.sh/card.name"] == card
        )
        return pods + sum(
            self.unreserved(job)
            for job in self.groups
            if self.jobs[job][0] == card and self.phase(job) == "Inqueue"
        )

    def unreserved(self, job: str) -> int:
        return max(0, self.jobs[job][1] - len(self.pods_of(job)))

    def phase(self, job: str) -> str:
        return str(self.groups[job]["status"]["phase"])

    def ahead(self, job: str) -> int:
        """Cards of its model that jobs refused before it still wait for: the line's order (time of
        the first refusal, then uid), counted here on its own; a job that could never fit the
        queue's whole quota does not wait in line."""
        card = self.jobs[job][0]
        mine = (self.refused.get(job, self.now), f"uid-pg-{job}")
        return sum(
            self.unreserved(other)
            for other, since in self.refused.items()
            if self.jobs[other][0] == card
            and self.phase(other) == "Pending"
            and (since, f"uid-pg-{other}") < mine
        )

    def step(self, action: tuple[Any, ...]) -> None:
        self.now += 1.0
        match action:
            case ("create", job) if job not in self.groups:
                card, size = self.jobs[job]
                ref = owner("Job", job, f"uid-job-{job}", api="batch.volcano.sh/v1alpha1")
                self.groups[job] = podgroup(
                    job, "Pending", f'{{"{card}": {size}}}', owner_ref=ref, minMember=size
                )
                self.state.upsert_podgroup(podgroup_record(self.groups[job]))
            case ("enqueue", _):  # the scheduler's next period: every Pending job tries, in turn
                for job in [j for j in self.groups if self.phase(j) == "Pending"]:
                    self.enqueue(job)
            case ("pod", _):  # the job controller creates the pods of every enqueued job
                for job in [j for j in self.groups if self.phase(j) == "Inqueue"]:
                    while self.unreserved(job):
                        self.create(job)
            case ("bare", card):
                self.create(None, card)
            case ("finish", index) if self.live:
                uid = sorted(self.live)[index % len(self.live)]
                del self.live[uid]
                self.state.delete_pod(uid)
            case ("raise", card):
                self.quota[card] += 1
                self.state.upsert_queue(queue_record(self._queue()))
            case ("call", _):
                calls.call_next(self.state, self.now)
        for card in CARDS:
            assert self.used(card) <= self.quota[card], (
                f"{card} over quota: {self.used(card)} > {self.quota[card]}"
            )

    def enqueue(self, job: str) -> None:
        card, size = self.jobs[job]
        held = (
            sum(
                pods * per_pod
                for (spec, per_pod), pods in self.state.ledger.held("q").items()
                if spec.cards == (card,)
            )
            // 1000
        )  # cards a call holds for the head of the line
        mine = self.state.ledger.get(f"enqueue:uid-pg-{job}/0")
        held -= mine.per_pod * mine.pods // 1000 if mine is not None else 0
        fits = self.used(card) + held + self.ahead(job) + size <= self.quota[card]
        new = copy.deepcopy(self.groups[job])
        new["status"]["phase"] = "Inqueue"
        review = request(
            new, resource="podgroups", operation="UPDATE", old=self.groups[job], group="scheduling.volcano.sh"
        )
        decision = admission.validate(self.state, review, self.now)
        admission.admit(self.state, review, decision, self.now)
        assert isinstance(decision, Allowed) == fits, (job, fits, decision)
        if isinstance(decision, Allowed):
            self.groups[job] = new
            self.state.upsert_podgroup(podgroup_record(new))
            self.refused.pop(job, None)
        elif size <= self.quota[card]:
            self.refused.setdefault(job, self.now)
        else:
            assert "whole quota" in decision.message and self.state.line.get(f"uid-pg-{job}") is None

    def create(self, job: str | None, card: str = "") -> None:
        self.serial += 1
        if job is not None:
            card = self.jobs[job][0]
            ref = owner("Job", job, f"uid-job-{job}", api="batch.volcano.sh/v1alpha1")
            obj = pod(f"{job}-{self.serial}", card=card, owner=ref, group=job)
            obj["metadata"]["labels"] = {"job": job}
        else:
            obj = pod(f"bare-{self.serial}", card=card)
        review = request(obj)
        decision = admission.validate(self.state, review, self.now)
        admission.admit(self.state, review, decision, self.now)
        if job is not None:
            assert isinstance(decision, Allowed), f"a pod of enqueued job {job} refused: {decision}"
        if isinstance(decision, Allowed):
            seen = {**obj, "spec": {**obj["spec"], "nodeName": NODE[card]}, "status": {"phase": "Running"}}
            self.live[obj["metadata"]["uid"]] = seen
            self.state.upsert_pod(pod_record(seen))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    quota=st.fixed_dictionaries({card: st.integers(0, 4) for card in CARDS}),
    jobs=st.fixed_dictionaries({job: st.tuples(st.sampled_from(CARDS), st.integers(1, 3)) for job in JOBS}),
    actions=st.lists(ACTIONS, min_size=5, max_size=50),
)
def test_the_gate_never_enqueues_beyond_quota_admits_what_fits_and_keeps_the_tallies_true(
    quota: dict[str, int], jobs: dict[str, tuple[str, int]], actions: list[tuple[Any, ...]]
) -> None:
    model = Model(quota, jobs)
    for action in actions:
        model.step(action)
    model.state.expire(model.now + 3600)  # holds of calls nobody took up
    recount = cluster(*model.objects())
    for name in ("q",):
        mine, theirs = model.state.tallies[name], recount.tallies[name]
        assert (mine.bound, mine.pending, mine.reserved) == (theirs.bound, theirs.pending, theirs.reserved)

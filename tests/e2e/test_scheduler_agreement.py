"""Admitted means it runs: the webhook in front of the REAL Volcano controller-manager and
scheduler (built from ../shared/volcano), SPEC §5b, against both partners: the capacity-card fork,
and stock Volcano v1.15.1 (no card plugin: the enqueue gate, SPEC §5d, is the only check).

Every scenario checks what a user would: each pod the webhook let in is bound to a node, no model's
bound use goes over the queue's quota, and nothing is left Pending by quota. Skipped, with the
reason, when a partner's source is not beside the repository.
"""

import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.agreement import (
    H200,
    H800,
    MIG,
    MPS,
    R4090,
    R4090D,
    Tenant,
    app,
    card_template,
    flex_deployment,
    gated,
    long_job,
    volcano_job,
)
from tests.e2e.cluster import ControlPlane, holds_for, soak_seed, wait_for
from tests.e2e.conftest import partner_plane
from tests.e2e.objects import card_queue, deployment_of, hpa
from tests.e2e.test_capability import cpu_checked, resize_and_pod_level
from tests.edges.serving import Process


@pytest.fixture(scope="module", params=["fork", "stock"])
def volcano(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """This module runs against each partner in turn."""
    with partner_plane(request.param, tmp_path_factory) as plane:
        yield plane


FLEX = f"{R4090}|{R4090D}"
Scenario = Callable[[Tenant], None]


def deployment_case(quota: dict[str, int], spec: str, replicas: int, running: int) -> Scenario:
    def run(t: Tenant) -> None:
        t.set_quota(quota)
        t.plane.apply(flex_deployment("app", replicas, spec, t.queue), namespace=t.ns)
        t.wait_settled(running, refused="app" if running < replicas else "")
        t.check_agreement()
        if running < replicas:
            assert any(t.queue in message for message in t.denials()), t.denials()

    return run


def podgroup_of_real_controller(t: Tenant) -> None:
    """The real pg-controller creates one PodGroup per ReplicaSet with no card annotations; the
    PodGroup mutation gives it the template's spec and request, and the plugin enqueues it."""
    t.set_quota({R4090: 1, R4090D: 2})
    t.plane.apply(flex_deployment("app", 2, FLEX, t.queue), namespace=t.ns)
    t.wait_settled(2)
    t.check_agreement()
    (group,) = t.plane.get("podgroups", namespace=t.ns)["items"]
    assert group["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    annotations = group["metadata"]["annotations"]
    assert annotations["volcano.sh/card.name"] == FLEX
    assert json.loads(annotations["volcano.sh/card.request"]) == {FLEX: 1}  # minMember 1
    assert group["status"]["phase"] in ("Inqueue", "Running")


def hpa_scale_up(t: Tenant) -> None:
    t.set_quota({R4090: 1, R4090D: 2})
    t.plane.apply(flex_deployment("app", 1, FLEX, t.queue), namespace=t.ns)
    t.wait_settled(1)
    t.plane.apply(hpa("app", 3, 5), namespace=t.ns)
    t.wait_settled(3)
    t.check_agreement()
    assert t.use() == Counter({R4090: 1, R4090D: 2})
    done = t.plane.kubectl("scale", "-n", t.ns, "deployment/app", "--replicas=4", check=False)
    assert done.returncode != 0 and f'queue "{t.queue}"' in done.stderr, done.stderr


def volcano_job_case(t: Tenant) -> None:
    t.set_quota({R4090: 1, R4090D: 2})
    refused = t.plane.kubectl(
        "create", "-n", t.ns, "-f", "-", stdin=json.dumps(volcano_job("big", 3, FLEX, t.queue)), check=False
    )
    assert refused.returncode != 0 and "whole on one model" in refused.stderr, refused.stderr
    t.plane.apply(volcano_job("train", 2, FLEX, t.queue), namespace=t.ns)
    # kwok runs a Job's pods to completion at once: count those that ran, too.
    wait_for(
        "both pods of the job bound",
        lambda: len([p for p in t.pods(finished=True) if p["spec"].get("nodeName")]) == 2,
        timeout=90,
    )
    use = t.use(finished=True)
    assert sum(use.values()) == 2 and all(n <= t.quota.get(card, 0) for card, n in use.items()), use
    cards = {p["metadata"]["annotations"]["volcano.sh/card.name"] for p in t.pods(finished=True)}
    assert cards == {R4090D}, "one task, one model: the one that holds the whole task"


def hierarchy_case(t: Tenant) -> None:
    parent = f"{t.queue}-parent"
    t.queues.append(parent)
    t.plane.kubectl("apply", "-f", "-", stdin=json.dumps(card_queue(parent, {R4090: 1, R4090D: 1})))
    t.set_quota({R4090: 2, R4090D: 2}, parent=parent)
    t.plane.apply(flex_deployment("app", 3, FLEX, t.queue), namespace=t.ns)
    t.wait_settled(2, refused="app")
    t.check_agreement()
    assert t.use() == Counter({R4090: 1, R4090D: 1})
    assert any(parent in m for m in t.denials()), t.denials()


SCENARIOS = [
    pytest.param(deployment_case({H200: 2}, H200, 2, 2), id="single model under quota"),
    pytest.param(deployment_case({H200: 2}, H200, 4, 2), id="single model over quota"),
    pytest.param(deployment_case({R4090: 1, R4090D: 2}, FLEX, 2, 2), id="A|B split quota, 2 replicas"),
    pytest.param(deployment_case({R4090: 1, R4090D: 2}, FLEX, 3, 3), id="A|B split quota, 3 replicas"),
    pytest.param(deployment_case({R4090: 1, R4090D: 2}, FLEX, 4, 3), id="A|B split quota, 4 replicas"),
    pytest.param(podgroup_of_real_controller, id="the real controller's PodGroup gets the card annotations"),
    pytest.param(hpa_scale_up, id="HPA scale-up of a running A|B Deployment"),
    pytest.param(
        deployment_case({H200: 1, H800: 1, R4090: 1}, f"{H200}|{H800}|{R4090}", 3, 3), id="three-model spec"
    ),
    pytest.param(deployment_case({MIG: 2}, MIG, 3, 2), id="MIG card"),
    pytest.param(deployment_case({MPS: 2}, MPS, 3, 2), id="MPS card"),
    pytest.param(volcano_job_case, id="Volcano Job with an A|B task"),
    pytest.param(hierarchy_case, id="hierarchy child under the real scheduler"),
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_pod_the_webhook_admits_runs_within_quota_under_the_real_scheduler(
    tenant: Tenant, scenario: Scenario
) -> None:
    scenario(tenant)


# ---- what kubectl apply says ----------------------------------------------------------------------


def kubectl_apply(t: Tenant, obj: dict[str, Any]) -> str:
    """``kubectl apply`` of one object into the tenant's namespace: kubectl's own stderr."""
    done = t.plane.kubectl("apply", "-n", t.ns, "-f", "-", stdin=json.dumps(obj))
    return done.stderr


def busy(t: Tenant, spec: str, replicas: int) -> None:
    """Cards of the queue in use by a Deployment of its own, bound before the test goes on."""
    t.plane.apply(flex_deployment("busy", replicas, spec, t.queue), namespace=t.ns)
    t.wait_settled(replicas)


def test_kubectl_apply_of_an_oversized_deployment_warns_and_exactly_the_pods_that_fit_run(
    tenant: Tenant,
) -> None:
    tenant.set_quota({H200: 4})
    busy(tenant, H200, 2)
    stderr = kubectl_apply(tenant, flex_deployment("chat", 3, H200, tenant.queue))
    assert (
        f"Warning: deployment {tenant.ns}/chat asks 3 replicas of 1 {H200} each; only 2 fit now:"
        f' queue "{tenant.queue}" has 2 {H200} left (quota 4: 2 running); the other 1 will be refused'
        " until cards free up"
    ) in stderr, stderr
    tenant.wait_settled(4, refused="chat")
    tenant.check_agreement()
    never = kubectl_apply(tenant, flex_deployment("huge", 5, H200, tenant.queue))
    assert f'the whole quota of queue "{tenant.queue}" (4 {H200}) holds at most 4 of them' in never, never


def test_kubectl_apply_of_an_oversized_multi_card_deployment_warns_per_model(tenant: Tenant) -> None:
    tenant.set_quota({R4090: 2, R4090D: 1})
    busy(tenant, R4090, 1)
    stderr = kubectl_apply(tenant, flex_deployment("chat", 3, FLEX, tenant.queue))
    assert (
        f"Warning: deployment {tenant.ns}/chat asks 3 replicas of 1 {FLEX} each; only 2 fit now:"
        f' queue "{tenant.queue}" has 1 {R4090} left (quota 2: 1 running) and 1 {R4090D} left (quota 1);'
        " the other 1 will be refused until cards free up"
    ) in stderr, stderr
    tenant.wait_settled(3, refused="chat")
    tenant.check_agreement()


def test_kubectl_apply_of_an_oversized_volcano_job_warns_and_its_pods_come_when_all_fit(
    tenant: Tenant,
) -> None:
    """The PodGroup's card.request counts every replica, so the real plugin enqueues the job whole:
    the pods that fit now are none of its own until all fit, and then all of them."""
    tenant.set_quota({H200: 4})
    busy(tenant, H200, 2)
    job = volcano_job("train", 3, H200, tenant.queue)
    job["spec"]["minAvailable"] = 1
    stderr = kubectl_apply(tenant, job)
    assert (
        f"Warning: volcano job {tenant.ns}/train needs all 3 of its pods at once (its card.request counts"
        " every replica, and Volcano enqueues the job whole); only 2 fit now:"
        f' queue "{tenant.queue}" has 2 {H200} left (quota 4: 2 running); it waits in the queue with'
        " none of its pods created until cards free up"
    ) in stderr, stderr
    wait_for(
        "the job's PodGroup",
        lambda: [
            g
            for g in tenant.plane.get("podgroups", namespace=tenant.ns)["items"]
            if any(r.get("name") == "train" for r in g["metadata"].get("ownerReferences") or [])
        ],
    )
    # The scheduler's sessions run every second: three of them had every chance to enqueue it.
    holds_for(
        "no pod of the job",
        lambda: not [p for p in tenant.pods(finished=True) if p["metadata"]["name"].startswith("train-")],
        3,
    )
    tenant.wait_settled(2)
    tenant.plane.kubectl("scale", "-n", tenant.ns, "deployment/busy", "--replicas=1")

    def bound_train_pods() -> list[str]:  # kwok runs them to completion: count finished ones too
        pods = tenant.pods(finished=True)
        return [
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["name"].startswith("train-") and p["spec"].get("nodeName")
        ]

    wait_for("the job's 3 pods, all bound", lambda: len(bound_train_pods()) == 3, timeout=90)
    tenant.check_agreement()


def test_a_volcano_job_whose_task_names_another_queue_is_refused_and_its_twin_runs_in_its_queue(
    tenant: Tenant,
) -> None:
    """decisions.md §30: the job controller gives every pod the job's PodGroup, in the job's queue,
    whatever queue its task's template names; a task naming another queue was charged there while
    Volcano ran it in the job's (held in a live run on the fork). Refused at the job's create, naming
    both; the same job naming its own queue runs there, its PodGroup in that queue."""
    tenant.set_quota({H200: 2})
    other = f"{tenant.queue}-other"
    tenant.plane.kubectl("apply", "-f", "-", stdin=json.dumps(card_queue(other, {H200: 2})))
    tenant.queues.append(other)
    split = long_job("split", 2, H200, tenant.queue)
    split["spec"]["tasks"][0]["template"]["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] = (
        other
    )
    refused = tenant.plane.kubectl("create", "-n", tenant.ns, "-f", "-", stdin=json.dumps(split), check=False)
    assert refused.returncode != 0, refused.stdout
    assert (
        f'volcano job {tenant.ns}/split task w\'s pod template names queue "{other}" but the job is in'
        f' queue "{tenant.queue}", where Volcano schedules its pods'
    ) in refused.stderr, refused.stderr
    tenant.plane.apply(long_job("train", 2, H200, tenant.queue), namespace=tenant.ns)
    tenant.wait_settled(2)
    tenant.check_agreement()
    (group,) = tenant.plane.get("podgroups", namespace=tenant.ns)["items"]
    assert group["spec"]["queue"] == tenant.queue
    assert not [p for p in tenant.pods(finished=True) if p["metadata"]["name"].startswith("split-")]


# ---- the randomized soak ------------------------------------------------------------------------

CAPACITY = {R4090: 4, R4090D: 2, H200: 7, H800: 6}  # whole cards the kwok nodes carry
SOAK_SPECS = [R4090, FLEX, f"{R4090D}|{R4090}", f"{H200}|{H800}", f"{H800}|{R4090}|{R4090D}", H200]
SOAK_OPS = int(os.environ.get("CARDQUOTA_SOAK_OPS", "60"))
JOB_WINDOW = 3.0  # seconds a job predicted not to fit must stay un-enqueued: three scheduler sessions
LINE_WITHIN = 10.0  # seconds a waiter that fits may go without a pod (wait mode releases one at a time)


@dataclass(frozen=True)
class Demand:
    """``pods`` pods of ``per_pod`` cards each, every pod on one model of ``spec`` (a Volcano Job's
    task, which must fit whole on one model, is one pod of all its cards)."""

    spec: str
    per_pod: int
    pods: int

    @property
    def cards(self) -> set[str]:
        return set(self.spec.split("|"))


def fits(room: dict[str, int], ahead: list[Demand], request: Demand) -> bool:
    """The test's own count (SPEC §5c), independent of the webhook's code: ``request`` fits after
    the demand that waits ahead of it, on the cards it can reach. A one-model waiter takes its cards
    off the room; an ``A|B`` waiter ties its models together. Over the request's cards and every
    model tied to them: nothing over, and some assignment of every pod of those waiters and of the
    request (tried exhaustively: the soak's states are small). Waiters on other cards block nothing."""
    if request.pods <= 0:
        return True
    free = dict(room)
    groups = []
    for demand in ahead:
        if demand.pods <= 0:
            continue
        if len(demand.cards) == 1:
            (card,) = demand.cards
            free[card] = free.get(card, 0) - demand.per_pod * demand.pods
        else:
            groups.append(demand)
    reach, related = set(request.cards), []
    grown = True
    while grown:
        grown = False
        for group in groups:
            if group not in related and group.cards & reach:
                related.append(group)
                reach |= group.cards
                grown = True
    if any(free.get(card, 0) < 0 for card in reach):
        return False
    pods = [(d.spec.split("|"), d.per_pod) for d in [*related, request] for _ in range(d.pods)]

    def place(index: int) -> bool:
        if index == len(pods):
            return True
        cards, size = pods[index]
        for card in cards:
            if free.get(card, 0) >= size:
                free[card] -= size
                if place(index + 1):
                    return True
                free[card] += size
        return False

    return place(0)


def admitted(room: dict[str, int], ahead: list[Demand], spec: str, per_pod: int, pods: int) -> int:
    """How many of ``pods`` new pods of ``spec`` the webhook admits now, one by one (SPEC §5b,
    §5c): the mutation gives an ``A|B`` pod the first of its models the quota has room for, the line
    aside, and the validation checks that one model after what waits ahead; a pod given no model is
    checked on all of them. So a pod goes first on a model no waiter ahead of it can use."""
    free, placed = dict(room), []
    for n in range(pods):
        cards = spec.split("|")
        chosen = next((c for c in cards if free.get(c, 0) >= per_pod), None) if len(cards) > 1 else None
        one = chosen or spec
        if not fits(free, [*ahead, *placed], Demand(one, per_pod, 1)):
            return n
        if "|" in one:
            placed.append(Demand(one, per_pod, 1))
        else:
            free[one] -= per_pod
    return pods


@dataclass
class Workload:
    spec: str
    per_pod: int
    replicas: int
    arrived: int  # the op that made it: waiters stand in that order (all at priority 0)
    admitted: int = 0  # pods admitted at its create or last scale: they come without the line


class Soak:
    """Random creates, scales and deletes of Deployments and long-running Volcano Jobs in one
    queue. Every decision is predicted by the test's own count (``fits``) over the cluster's
    pods, after what waits ahead in the line (SPEC §5c): a scale-up and a job fit only after the
    Deployments that wait for pods; a Deployment made larger than what is left waits, and must get
    every pod that fits as soon as it fits."""

    def __init__(self, t: Tenant, rng: random.Random) -> None:
        self.t, self.rng = t, rng
        self.deployments: dict[str, Workload] = {}
        self.jobs: dict[str, Workload] = {}  # running Volcano Jobs (their pods run for an hour)
        self.log: list[str] = []
        self.waited: set[str] = set()  # Deployments seen waiting, and those later served
        self.served: set[str] = set()
        self.short: dict[str, int] = {}  # the waiting ones at the last settle: how many pods each had

    # ---- what the cluster shows -------------------------------------------------------------
    def _of(self, name: str, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [p for p in pods if p["metadata"]["name"].startswith(f"{name}-")]

    def room(self, pods: list[dict[str, Any]] | None = None) -> dict[str, int]:
        """Quota minus the cards of every live pod but those held under our gate, by the model its
        card.name names (the webhook gives each ``A|B`` pod one)."""
        used: Counter[str] = Counter()
        for pod in self.t.pods() if pods is None else pods:
            if gated(pod):
                continue
            card = pod["metadata"]["annotations"]["volcano.sh/card.name"]
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            used[card] += int(next(iter(limits.values())))
        return {card: self.t.quota.get(card, 0) - used[card] for card in CAPACITY}

    def waiting(self, pods: list[dict[str, Any]]) -> list[tuple[str, Demand]]:
        """The Deployments short of pods (ungated ones), in the order they came, with what they lack."""
        short = []
        for name, w in sorted(self.deployments.items(), key=lambda item: item[1].arrived):
            has = len([p for p in self._of(name, pods) if not gated(p)])
            if has < w.replicas:
                short.append((name, Demand(w.spec, w.per_pod, w.replicas - has)))
        return short

    def ahead(self, pods: list[dict[str, Any]]) -> list[Demand]:
        return [demand for _, demand in self.waiting(pods)]

    # ---- settling ---------------------------------------------------------------------------
    def _standing(self, pods: list[dict[str, Any]]) -> str:
        """ "settled": every ungated pod bound, no Deployment over its replicas, gated pods only of
        those that wait, every job whole, and no waiter could get one more pod after those ahead of
        it; "unserved": all that but a waiter that fits now; "moving": anything else."""
        if not all(p["spec"].get("nodeName") for p in pods if not gated(p)):
            return "moving"
        waiting = {name for name, _ in self.waiting(pods)}
        for name, w in self.deployments.items():
            mine = self._of(name, pods)
            if len([p for p in mine if not gated(p)]) > w.replicas:
                return "moving"
            if name not in waiting and any(gated(p) for p in mine):
                return "moving"
            if len([p for p in mine if not gated(p)]) < min(w.admitted, w.replicas):
                return "moving"  # pods admitted at its create or scale-up, not made yet
        if any(len(self._of(name, pods)) != w.replicas for name, w in self.jobs.items()):
            return "moving"
        known = [*self.deployments, *self.jobs]
        if any(not any(p["metadata"]["name"].startswith(f"{n}-") for n in known) for p in pods):
            return "moving"  # pods of a deleted workload still going
        # An enqueued PodGroup of a deleted workload still reserves its cards, for the webhook and
        # the scheduler alike, until the garbage collector removes it (seconds after its pods).
        owners = [
            r.get("name", "") for g in self._groups() for r in g["metadata"].get("ownerReferences") or []
        ]
        if any(not any(owner == n or owner.startswith(f"{n}-") for n in known) for owner in owners):
            return "moving"
        room, line = self.room(pods), self.waiting(pods)
        for index, (_, demand) in enumerate(line):
            ahead = [d for _, d in line[:index]]
            if fits(room, ahead, Demand(demand.spec, demand.per_pod, 1)):
                return "unserved"  # it fits now: the line must serve it
        return "settled"

    def settle(self) -> None:
        """Until the queue is settled (60 s at most). A waiter that fits must get a pod within
        LINE_WITHIN of the last change: the line calls it; a controller's back-off would not."""
        deadline, since, last = time.monotonic() + 60, time.monotonic(), None
        while True:
            self.t.plane._check_alive()
            pods = self.t.pods()
            standing = self._standing(pods)
            if standing == "settled":
                break
            now = time.monotonic()
            seen = sorted((p["metadata"]["name"], gated(p), bool(p["spec"].get("nodeName"))) for p in pods)
            if seen != last:
                since, last = now, seen
            stuck = standing == "unserved" and now - since > LINE_WITHIN
            if stuck or now > deadline:
                state = {"room": self.room(pods), "waiting": self.waiting(pods), "pods": seen}
                why = (
                    f"a waiter that fits got no pod for {LINE_WITHIN:.0f} s"
                    if stuck
                    else "not settled in 60 s"
                )
                raise AssertionError(f"{why}: {state}")
            time.sleep(0.25)
        self.t.check_agreement(gated_too=True)
        pods = self.t.pods()
        has = {name: len([p for p in self._of(name, pods) if not gated(p)]) for name in self.deployments}
        # Served: it waited at the last settle and has more pods now (the line called or released it).
        self.served |= {name for name, before in self.short.items() if has.get(name, 0) > before}
        self.short = {name: has[name] for name, _ in self.waiting(pods)}
        self.waited |= set(self.short)

    # ---- operations -------------------------------------------------------------------------
    def create(self) -> None:
        """A Deployment of up to 4 pods the queue's whole quota can hold; beyond what is left it waits."""
        name = f"d{len(self.log)}"
        spec, per_pod = self.rng.choice(SOAK_SPECS), self.rng.choice([1, 1, 2])
        holds = max(n for n in range(5) if fits(self.t.quota, [], Demand(spec, per_pod, n)))
        pods = self.t.pods()
        room, ahead = self.room(pods), self.ahead(pods)
        fit = admitted(room, ahead, spec, per_pod, holds)
        if self.t.mode == "wait":
            # Wait mode leaves the line to the squeeze: with waiters here an `A|B` pod was once
            # admitted with no model (its cards freed between its mutation, which found no room,
            # and its validation), which this count cannot place (docs/development.md, "Checks that
            # can fail", 6).
            replicas = self.rng.randint(0, fit)
        elif fit < holds and self.rng.random() < 0.5:
            replicas = min(holds, fit + self.rng.randint(1, 2))  # more than is left: it waits
        else:
            replicas = self.rng.randint(0, holds)
        fit = min(fit, replicas)
        self.t.plane.apply(flex_deployment(name, replicas, spec, self.t.queue, per_pod), namespace=self.t.ns)
        self.deployments[name] = Workload(spec, per_pod, replicas, len(self.log), fit)
        self.log.append(f"create {name} {spec} x{per_pod} replicas {replicas}: {fit} fit now")

    def scale(self, name: str) -> None:
        w = self.deployments[name]
        pods = self.t.pods()
        has = len([p for p in self._of(name, pods) if not gated(p)])
        # A Deployment that waits is only scaled down: it already stands in the line.
        target = self.rng.randint(0, 4 if has >= w.replicas else w.replicas)
        fit = target <= w.replicas or fits(
            self.room(pods), self.ahead(pods), Demand(w.spec, w.per_pod, target - has)
        )
        done = self.t.plane.kubectl(
            "scale", "-n", self.t.ns, f"deployment/{name}", f"--replicas={target}", check=False
        )
        self.log.append(
            f"scale {name} {w.replicas}->{target}: {'allowed' if done.returncode == 0 else 'denied'}"
        )
        assert (done.returncode == 0) == fit, (
            f"{self.log[-1]} but the test's count says fits={fit}: {done.stderr}"
        )
        if done.returncode == 0:
            w.replicas, w.admitted = target, target if target > w.replicas else min(w.admitted, target)
            self.short.pop(name, None)  # what it gets now comes from its own scale, not the line

    def delete(self, name: str) -> None:
        self.t.plane.kubectl("delete", "-n", self.t.ns, f"deployment/{name}", "--wait=false")
        del self.deployments[name]
        self.log.append(f"delete {name}")

    def job(self) -> None:
        """A Volcano Job whose pods run for an hour: enqueued iff its task fits whole on one model
        after what waits ahead; one that does not fit must stay Pending with no pod, and goes."""
        name = f"j{len(self.log)}"
        spec, replicas = self.rng.choice(SOAK_SPECS), self.rng.randint(1, 3)
        never = not any(self.t.quota.get(card, 0) >= replicas for card in spec.split("|"))
        pods = self.t.pods()
        fit = fits(self.room(pods), self.ahead(pods), Demand(spec, replicas, 1))  # whole on one model
        done = self.t.plane.kubectl(
            "create",
            "-n",
            self.t.ns,
            "-f",
            "-",
            stdin=json.dumps(long_job(name, replicas, spec, self.t.queue)),
            check=False,
        )
        verdict = "denied" if done.returncode else ("runs" if fit else "waits")
        self.log.append(f"job {name} {spec} x{replicas}: {verdict}")
        assert (done.returncode != 0) == never, (
            f"{self.log[-1]} but the test's count says never={never}: {done.stderr}"
        )
        if never:
            return
        if fit:
            self.jobs[name] = Workload(spec, 1, replicas, len(self.log))
            return  # settle() waits for all its pods, bound
        wait_for(f"the PodGroup of job {name}", lambda: self._group(name) is not None, timeout=30)
        holds_for(
            f"job {name} not enqueued, none of its pods made",
            lambda: self._group(name) == "Pending" and not self._of(name, self.t.pods(finished=True)),
            JOB_WINDOW,
        )
        self.t.plane.kubectl("delete", "-n", self.t.ns, f"jobs.batch.volcano.sh/{name}", check=False)
        wait_for(f"job {name} to go", lambda: self._group(name) is None, timeout=60)

    def _groups(self) -> list[dict[str, Any]]:
        return list(self.t.plane.get("podgroups", namespace=self.t.ns)["items"])

    def _group(self, job: str) -> str | None:
        """The phase of ``job``'s PodGroup ("Pending" until the scheduler writes one), None without one."""
        for group in self._groups():
            if any(r.get("name") == job for r in group["metadata"].get("ownerReferences") or []):
                return str((group.get("status") or {}).get("phase") or "Pending")
        return None

    def end_job(self, name: str) -> None:
        self.t.plane.kubectl("delete", "-n", self.t.ns, f"jobs.batch.volcano.sh/{name}", "--wait=false")
        del self.jobs[name]
        self.log.append(f"end job {name}")

    def step(self) -> None:
        roll = self.rng.random()
        if (roll < 0.25 and len(self.deployments) < 5) or not self.deployments:
            self.create()
        elif roll < 0.6:
            self.scale(self.rng.choice(sorted(self.deployments)))
        elif roll < 0.72:
            self.delete(self.rng.choice(sorted(self.deployments)))
        elif roll < 0.86 or not self.jobs:
            self.job()
        else:
            self.end_job(self.rng.choice(sorted(self.jobs)))
        self.settle()

    def make_one_wait(self) -> None:
        """When the random phase left nothing waiting (wait mode makes no waiters there, and small
        quotas make it rare in deny mode): a Deployment takes what is left of the card with the
        largest quota, another asks one pod more of it and must wait, and the first goes: the line
        must serve the second within LINE_WITHIN (``settle``)."""
        card = max(sorted(CAPACITY), key=lambda c: self.t.quota.get(c, 0))
        if self.t.quota.get(card, 0) < 1:
            return
        room = self.room()[card]
        hog, waiter = f"d{len(self.log)}", f"d{len(self.log) + 1}"
        if room > 0:
            self.t.plane.apply(flex_deployment(hog, room, card, self.t.queue), namespace=self.t.ns)
            self.deployments[hog] = Workload(card, 1, room, len(self.log), room)
            self.log.append(f"create {hog} {card} x1 replicas {room}: {room} fit now")
            self.settle()
        self.t.plane.apply(flex_deployment(waiter, 1, card, self.t.queue), namespace=self.t.ns)
        self.deployments[waiter] = Workload(card, 1, 1, len(self.log))
        self.log.append(f"create {waiter} {card} x1 replicas 1: 0 fit now")
        self.settle()
        assert waiter in self.waited, f"{waiter} did not wait: {self.room()}"
        if room > 0:
            self.delete(hog)
            self.settle()

    def finish(self) -> None:
        """The jobs end and every Deployment that does not wait goes; then, if the first in line
        still waits, those behind it go too: its quota holds it whole, so it must get every pod."""
        for name in sorted(self.jobs):
            self.end_job(name)
        line = [name for name, _ in self.waiting(self.t.pods())]
        for name in sorted(set(self.deployments) - set(line)):
            self.delete(name)
        self.settle()
        if not self.waited:
            self.make_one_wait()
            line = [name for name, _ in self.waiting(self.t.pods())]
        assert self.waited, "no Deployment ever waited: the line was not exercised"
        if line and line[0] not in self.served:
            for name in line[1:]:
                self.delete(name)
            self.settle()
            assert line[0] in self.served, (line, sorted(self.served))
        self.log.append(
            f"finish: {len(self.waited)} waited, {len(self.served)} served: {sorted(self.served)}"
        )


def line_waiters(front: Process, queue: str) -> int:
    """Waiters in ``queue``'s line, from the webhook's metrics (other tests' queues left out)."""
    with front.client() as client:
        text = client.get("/metrics").text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith(f'cardquota_line_waiters{{queue="{queue}"}}')
    )


def seen_by_the_webhook(soak: Soak, front: Process) -> str:
    """What the webhook and the cluster say of a line that did not move: the webhook's line and
    queue figures for this queue, each ReplicaSet's last refusal, the PodGroups' phases and the
    namespace's last Events (what a failure needs to be understood once its cluster is gone)."""
    t = soak.t
    with front.client() as client:
        lines = client.get("/metrics").text.splitlines()
        figures = [x for x in lines if f'"{t.queue}"' in x and "_bucket" not in x]
    sets = []
    for r in t.plane.get("replicasets", namespace=t.ns)["items"]:
        status = r.get("status") or {}
        said = [c.get("message", "") for c in status.get("conditions") or []]
        sets.append((r["metadata"]["name"], r["spec"].get("replicas"), status.get("replicas"), said))
    groups = [(g["metadata"]["name"], (g.get("status") or {}).get("phase")) for g in soak._groups()]
    events = sorted(
        t.plane.get("events", namespace=t.ns)["items"],
        key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "",
    )
    told = [f"{e['involvedObject'].get('name')}: {e.get('reason')}: {e.get('message')}" for e in events[-12:]]
    return f"the webhook's figures: {figures}; replicasets: {sets}; podgroups: {groups}; last events: {told}"


def squeeze(soak: Soak, front: Process, wanted: dict[str, tuple[str, int, int]]) -> None:
    """The waiting line under the real scheduler: the Deployments are made again while hogs hold a
    quota of 2 of every card, so every pod is refused and each ReplicaSet waits in line (deny mode)
    or every pod is held under our gate (wait mode); then the quota comes back and the hogs go: each
    gets all its pods at once, within quota and bound, and the line ends empty."""
    t, quota = soak.t, dict(soak.t.quota)
    for name in soak.deployments:
        t.plane.kubectl("delete", "-n", t.ns, f"deployment/{name}", "--wait=false")
    gone = lambda: not t.pods() and not t.plane.get("replicasets", namespace=t.ns)["items"]  # noqa: E731
    wait_for("every pod and ReplicaSet to go", gone, timeout=60)
    cards = sorted({card for spec in SOAK_SPECS for card in spec.split("|")})
    t.set_quota({card: 2 if card in cards else 0 for card in quota})
    t.plane.apply(
        *(flex_deployment(f"hog{i}", 1, card, t.queue, 2) for i, card in enumerate(cards)), namespace=t.ns
    )
    t.wait_settled(len(cards))
    soak.deployments = {}
    for name, (spec, per_pod, replicas) in wanted.items():
        t.plane.apply(flex_deployment(name, replicas, spec, t.queue, per_pod), namespace=t.ns)
        soak.deployments[name] = Workload(spec, per_pod, replicas, len(soak.log))
        soak.log.append(f"again {name} {spec} x{per_pod} replicas {replicas}")
    # Deny mode: each ReplicaSet waits. Wait mode: its first pod waits under the gate, and the
    # ReplicaSet of the rest, while its PodGroup is not enqueued (the capacity-card plugin enqueues it
    # only whole, so one pod is held at a time); stock Volcano enqueues it with gated pods, and the
    # ReplicaSet's next pods are held too as its back-off lets it create them.
    asked = {name: replicas for name, (_, _, replicas) in wanted.items() if replicas}
    # A ReplicaSet whose pods could never all fit the squeeze's quota of 2 (each pod whole on one of
    # its models) keeps its place out of the line until the quota comes back (decisions.md §29).
    # In wait mode one pod of each is held under the gate already: the ReplicaSet wants the rest.
    held_first = 1 if t.mode == "wait" else 0
    whole = {
        name
        for name, (spec, per_pod, replicas) in wanted.items()
        if sum(2 // per_pod for _ in spec.split("|")) >= replicas - held_first
    }

    def standing() -> tuple[int, int]:
        """(pods held under the gate, ReplicaSets short of pods and in the line): what the line must
        hold."""
        pods = t.pods()
        held = len([p for p in pods if gated(p)])
        short = sum(
            1
            for name, n in asked.items()
            if len([p for p in pods if p["metadata"]["name"].startswith(f"{name}-")]) < n and name in whole
        )
        return held, short

    def in_line() -> bool:
        held, short = standing()
        every = t.mode == "deny" or all(
            any(gated(p) for p in t.pods() if p["metadata"]["name"].startswith(f"{name}-")) for name in asked
        )
        return every and line_waiters(front, t.queue) == held + short

    try:
        wait_for("every refused ReplicaSet and held pod in line", in_line, timeout=30)
    except TimeoutError as exc:
        with front.client() as client:
            lines = [x for x in client.get("/metrics").text.splitlines() if x.startswith("cardquota_line_")]
        raise AssertionError(f"(held, short) {standing()}; the webhook's lines: {lines}") from exc
    held, short = standing()
    if t.mode == "wait" and t.plane.partner == "fork":
        assert held == len(asked) and short == sum(1 for m, n in asked.items() if n > 1 and m in whole), (
            held,
            short,
        )
    if t.mode == "deny":
        assert held == 0 and short == len(set(asked) & whole), (held, short)
    soak.log.append(f"squeeze: {short} ReplicaSets and {held} pods waiting")
    t.set_quota(quota)
    for i in range(len(cards)):
        t.plane.kubectl("delete", "-n", t.ns, f"deployment/hog{i}", "--wait=false")
    try:
        soak.settle()  # and no waiter that fits after those ahead of it is left without a pod
    except AssertionError as exc:
        try:
            seen = seen_by_the_webhook(soak, front)
        except Exception as unread:  # the diagnosis must not hide the failure
            seen = f"(not read: {unread!r})"
        raise AssertionError(f"{exc}; {seen}") from exc
    left = soak.waiting(t.pods())
    if all("|" not in spec for spec, _, _ in wanted.values()):
        assert not left, left  # they ran together: each got every pod it wants
    else:
        # An `A|B` pod may be given another model than it had when the snapshot was taken (the
        # first with a free card on a node now), and what comes after it may then no longer fit:
        # settle has shown that what is left does not fit after those ahead of it.
        assert not left or len(left) < len(asked), (left, asked)
    waiters = len(left) + sum(1 for p in t.pods() if gated(p))
    wait_for(
        "the line to hold only what is left", lambda: line_waiters(front, t.queue) <= waiters, timeout=10
    )


@pytest.mark.parametrize("mode", ["deny", "wait"])
def test_a_seeded_soak_of_creates_scales_deletes_and_jobs_keeps_the_pair_in_agreement(
    volcano: ControlPlane, front: Process, mode: str, request: pytest.FixtureRequest
) -> None:
    tenant = Tenant(volcano, mode=mode)
    try:
        soak_in(tenant, front, soak_seed(request.node))
    finally:
        tenant.delete()


def soak_in(tenant: Tenant, front: Process, seed: int) -> None:
    print(
        f"soak seed {seed}, {tenant.mode} mode (replay: CARDQUOTA_SOAK_SEED={seed} pytest -k"
        f" 'soak and {tenant.mode}' tests/e2e/test_scheduler_agreement.py)"
    )
    rng = random.Random(seed)
    tenant.set_quota({card: rng.randint(0, cap) for card, cap in CAPACITY.items()})
    soak = Soak(tenant, rng)
    try:
        for _ in range(SOAK_OPS):
            soak.step()
        pods = tenant.pods()
        wanted = {  # the Deployments as they ran at the end: they all fit the quota together
            name: (w.spec, w.per_pod, len([p for p in soak._of(name, pods) if not gated(p)]))
            for name, w in soak.deployments.items()
        }
        soak.finish()
        squeeze(soak, front, wanted)
        print("\n".join(line for line in soak.log if line.startswith(("job", "finish", "squeeze"))))
    except BaseException as exc:
        raise AssertionError(f"soak seed {seed}, quota {tenant.quota}, after: {soak.log}") from exc


# ---- what a tenant writes around its pods (decisions.md §29) -------------------------------------
def owned_pod(t: Tenant, name: str, group: str, owner: dict[str, Any]) -> dict[str, Any]:
    """A one-card pod of the PodGroup ``group``, controlled by ``owner`` (any object of the tenant's)."""
    template = card_template(R4090, t.queue)
    template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = group
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "controller": True, **owner}
    metadata = {"name": name, "ownerReferences": [ref], **template["metadata"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def tenant_group(t: Tenant, name: str, ask: int, owner: dict[str, Any], phase: str = "") -> dict[str, Any]:
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "controller": True, **owner}
    group: dict[str, Any] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "annotations": {"volcano.sh/card.request": json.dumps({R4090: ask})},
            "ownerReferences": [ref],
        },
        "spec": {"queue": t.queue, "minMember": ask},
    }
    if phase:
        group["status"] = {"phase": phase}
    return group


def test_a_podgroup_created_enqueued_is_refused_and_its_pending_twin_runs_only_what_its_quota_holds(
    tenant: Tenant,
) -> None:
    """A PodGroup created Inqueue (the CRD has no status subresource) would skip the enqueue gate
    and cover its pods: 3 of 3 one-card pods admitted at quota 1, all 3 bound on stock Volcano."""
    t = tenant
    t.set_quota({R4090: 1})
    t.plane.kubectl("create", "configmap", "owner", "-n", t.ns)
    owner = {"name": "owner", "uid": t.plane.get("configmap", "owner", namespace=t.ns)["metadata"]["uid"]}
    for phase in ("Inqueue", "Running"):
        forged = json.dumps(tenant_group(t, f"squat-{phase.lower()}", 3, owner, phase))
        done = t.plane.kubectl("create", "-n", t.ns, "-f", "-", stdin=forged, check=False)
        assert done.returncode != 0, done.stdout
        assert f"is created in phase '{phase}', asking 3 {R4090} of queue \"{t.queue}\"" in done.stderr
    assert t.plane.get("podgroups", namespace=t.ns)["items"] == []
    # The twin: the same group created Pending, asking what its queue holds; its pods beyond it refused.
    t.plane.apply(tenant_group(t, "honest", 1, owner), namespace=t.ns)
    admitted = []
    for index in range(3):
        made = json.dumps(owned_pod(t, f"honest-{index}", "honest", owner))
        done = t.plane.kubectl("create", "-n", t.ns, "-f", "-", stdin=made, check=False)
        if done.returncode == 0:
            admitted.append(index)
        else:
            assert f'queue "{t.queue}"' in done.stderr, done.stderr
    assert len(admitted) == 1, admitted
    t.wait_settled(1)
    t.check_agreement()
    # Enqueued, the group keeps the card annotations its reservation was admitted with.
    wait_for(
        "the group enqueued",
        lambda: (
            (t.plane.get("podgroup", "honest", namespace=t.ns).get("status") or {}).get("phase")
            in ("Inqueue", "Running")
        ),
        timeout=30,
    )
    stripped = t.plane.kubectl(
        "annotate", "podgroup", "honest", "volcano.sh/card.request-", "-n", t.ns, check=False
    )
    assert (
        stripped.returncode != 0 and "cannot lose its volcano.sh/card.request annotation" in stripped.stderr
    ), stripped.stderr
    t.plane.kubectl("annotate", "podgroup", "honest", "team=a", "-n", t.ns)  # its twin: another annotation
    assert (
        "volcano.sh/card.request"
        in t.plane.get("podgroup", "honest", namespace=t.ns)["metadata"]["annotations"]
    )


@pytest.mark.parametrize(
    "resources",
    [{"volcano.sh/vgpu-number": "1"}, {"koordinator.sh/gpu-core": "50"}],
    ids=["Volcano vGPU", "Koordinator"],
)
def test_a_shared_gpu_pod_naming_no_card_reaches_the_webhook_through_the_charts_filters(
    tenant: Tenant, resources: dict[str, str]
) -> None:
    """The chart's filters once sent only nvidia.com/, Ascend and DRA resources: these pods were never
    checked. The live webhook is registered with the chart's own configurations."""
    t = tenant
    t.set_quota({H200: 1})
    container = {"name": "main", "image": "registry.example/app:1", "resources": {"limits": resources}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "share", "annotations": {"scheduling.volcano.sh/queue-name": t.queue}},
        "spec": {"schedulerName": "volcano", "containers": [container]},
    }
    done = t.plane.kubectl(
        "create", "--dry-run=server", "-n", t.ns, "-f", "-", stdin=json.dumps(pod), check=False
    )
    assert done.returncode != 0 and "has no volcano.sh/card.name annotation" in done.stderr, done.stderr
    # its twin: a pod asking no GPU at all is never sent
    container["resources"] = {"limits": {"cpu": "1"}}
    done = t.plane.kubectl(
        "create", "--dry-run=server", "-n", t.ns, "-f", "-", stdin=json.dumps(pod), check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_forged_place_in_the_line_is_refused_and_the_queue_serves_its_own(tenant: Tenant) -> None:
    """A StatefulSet of 1,000 replicas marked at the head of the line (since 1970, the highest
    priority) once kept the victim's own pod out of a queue with room; the mark on it, or on a pod
    template, is refused, and the victim's pod runs."""
    t = tenant
    t.set_quota({H200: 2})
    forged = '{"since":"1970-01-01T00:00:00Z","priority":2147483647}'
    squat = deployment_of("squat", 0, card_template(H200, t.queue))
    squat["kind"] = "StatefulSet"
    squat["spec"] = {**squat["spec"], "replicas": 1000, "serviceName": "squat"}
    squat["metadata"]["annotations"] = {"cardquota.volcano.sh/waiting": forged}
    done = t.plane.kubectl("create", "-n", t.ns, "-f", "-", stdin=json.dumps(squat), check=False)
    assert (
        done.returncode != 0
        and "only the card-quota webhook sets, changes or removes its marks" in done.stderr
    ), done.stderr
    squat["metadata"]["annotations"] = {}
    squat["spec"]["replicas"] = 0
    squat["spec"]["template"]["metadata"]["annotations"]["cardquota.volcano.sh/waiting"] = forged
    done = t.plane.kubectl("create", "-n", t.ns, "-f", "-", stdin=json.dumps(squat), check=False)
    assert done.returncode != 0 and "its pod template carries the waiting mark" in done.stderr, done.stderr
    t.plane.apply(app("victim", 1, H200, t), namespace=t.ns)  # the twin: the queue's own pod
    t.wait_settled(1)
    t.check_agreement()


def test_a_queue_closed_to_a_namespace_refuses_its_pods_and_serves_its_own(tenant: Tenant) -> None:
    """A Queue's cardquota.volcano.sh/namespaces keeps other teams from charging, blocking or
    squatting it (decisions.md §31); its own namespace's Deployment runs."""
    t = tenant
    t.set_quota({H200: 2})
    closed = card_queue(t.queue, {H200: 2})
    closed["metadata"]["annotations"]["cardquota.volcano.sh/namespaces"] = (
        f"kubernetes.io/metadata.name in ({t.ns})"
    )
    t.plane.kubectl("apply", "-f", "-", stdin=json.dumps(closed))
    other = Tenant(t.plane)
    try:
        squat = app("squat", 1, H200, t)  # names t's queue from another namespace
        done = other.plane.kubectl("create", "-n", other.ns, "-f", "-", stdin=json.dumps(squat), check=False)
        assert done.returncode != 0, done.stdout
        assert f'queue "{t.queue}" may not be used from namespace {other.ns}' in done.stderr, done.stderr
        t.plane.apply(app("own", 2, H200, t), namespace=t.ns)  # its twin
        t.wait_settled(2)
        t.check_agreement()
    finally:
        other.delete()


def test_a_resize_or_a_pod_level_request_past_the_capability_is_refused_and_its_twins_run(
    volcano: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The CPU/memory check (a webhook run with ``--cpu-memory-check``, registered from the chart
    with the check on) refuses an in-place resize and a pod-level request past the queue's
    capability; their twins inside it are admitted and the partner runs them."""
    with cpu_checked(volcano, tmp_path_factory.mktemp("cpu-check")) as namespace:
        resize_and_pod_level(volcano, namespace, scheduled=True)

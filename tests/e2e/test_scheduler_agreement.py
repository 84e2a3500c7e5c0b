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
    flex_deployment,
    gated,
    volcano_job,
)
from tests.e2e.cluster import ControlPlane, wait_for
from tests.e2e.conftest import partner_plane
from tests.e2e.objects import card_queue, hpa
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
        t.wait_settled(running)
        t.check_agreement()
        if running < replicas:
            wait_for("the webhook's denial in the ReplicaSet's events", t.denials, timeout=30)
            assert any(t.queue in message for message in t.denials())

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
    t.wait_settled(2)
    t.check_agreement()
    assert t.use() == Counter({R4090: 1, R4090D: 1})
    wait_for("the parent queue's denial", lambda: any(parent in m for m in t.denials()), timeout=30)


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
    tenant.wait_settled(4)
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
    tenant.wait_settled(3)
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
    time.sleep(10)  # the scheduler's sessions run every second: it had every chance to enqueue it
    tenant.wait_settled(2)
    assert not [p for p in tenant.pods(finished=True) if p["metadata"]["name"].startswith("train-")]
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


# ---- the randomized soak ------------------------------------------------------------------------

CAPACITY = {R4090: 4, R4090D: 2, H200: 7, H800: 6}  # whole cards the kwok nodes carry
SOAK_SPECS = [R4090, FLEX, f"{R4090D}|{R4090}", f"{H200}|{H800}", f"{H800}|{R4090}|{R4090D}", H200]
SOAK_OPS = int(os.environ.get("CARDQUOTA_SOAK_OPS", "60"))


def _fits(room: dict[str, int], spec: str, per_pod: int, pods: int) -> bool:
    """The test's own count: ``pods`` more pods of ``per_pod`` cards, each on one model of ``spec``."""
    return sum(max(0, room.get(card, 0)) // per_pod for card in spec.split("|")) >= pods


class Soak:
    def __init__(self, t: Tenant, rng: random.Random) -> None:
        self.t, self.rng = t, rng
        self.deployments: dict[str, tuple[str, int, int]] = {}  # name -> spec, cards per pod, replicas
        self.log: list[str] = []

    def room(self) -> dict[str, int]:
        """Quota minus the cards of every live pod (but those held under our gate), by the model
        its card.name names."""
        used: Counter[str] = Counter()
        for pod in self.t.pods():
            if gated(pod):
                continue
            card = pod["metadata"]["annotations"]["volcano.sh/card.name"]
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            used[card] += int(next(iter(limits.values())))
        return {card: self.t.quota.get(card, 0) - used[card] for card in CAPACITY}

    def settle(self) -> None:
        want = sum(replicas for _, _, replicas in self.deployments.values())
        self.t.wait_settled(want, timeout=60)
        self.t.check_agreement()

    def create(self) -> None:
        name = f"d{len(self.log)}"
        spec, per_pod = self.rng.choice(SOAK_SPECS), self.rng.choice([1, 1, 2])
        self.t.plane.apply(flex_deployment(name, 0, spec, self.t.queue, per_pod), namespace=self.t.ns)
        self.deployments[name] = (spec, per_pod, 0)
        self.log.append(f"create {name} {spec} x{per_pod}")
        self.scale(name)

    def scale(self, name: str) -> None:
        spec, per_pod, replicas = self.deployments[name]
        target = self.rng.randint(0, 4)
        fits = target <= replicas or _fits(self.room(), spec, per_pod, target - replicas)
        done = self.t.plane.kubectl(
            "scale", "-n", self.t.ns, f"deployment/{name}", f"--replicas={target}", check=False
        )
        self.log.append(
            f"scale {name} {replicas}->{target}: {'allowed' if done.returncode == 0 else 'denied'}"
        )
        assert (done.returncode == 0) == fits, (
            f"{self.log[-1]} but the test's count says fits={fits}: {done.stderr}"
        )
        if done.returncode == 0:
            self.deployments[name] = (spec, per_pod, target)

    def delete(self, name: str) -> None:
        self.t.plane.kubectl("delete", "-n", self.t.ns, f"deployment/{name}", "--wait=false")
        del self.deployments[name]
        self.log.append(f"delete {name}")
        wait_for(f"the pods of {name} to go", lambda: not self._of(name), timeout=60)

    def job(self) -> None:
        name = f"j{len(self.log)}"
        spec, replicas = self.rng.choice(SOAK_SPECS), self.rng.randint(1, 3)
        never = not any(self.t.quota.get(card, 0) >= replicas for card in spec.split("|"))
        done = self.t.plane.kubectl(
            "create",
            "-n",
            self.t.ns,
            "-f",
            "-",
            stdin=json.dumps(volcano_job(name, replicas, spec, self.t.queue)),
            check=False,
        )
        self.log.append(f"job {name} {spec} x{replicas}: {'allowed' if done.returncode == 0 else 'denied'}")
        assert (done.returncode != 0) == never, (
            f"{self.log[-1]} but the test's count says never={never}: {done.stderr}"
        )
        if done.returncode == 0:
            try:
                wait_for(f"job {name} to run", lambda: self._bound_of(name) == replicas, timeout=15)
            except TimeoutError:
                self.log.append(f"job {name} waits in the queue: deleted")
            self.t.plane.kubectl("delete", "-n", self.t.ns, f"jobs.batch.volcano.sh/{name}", check=False)
            wait_for(f"the pods of job {name} to go", lambda: not self._of(name, finished=True), timeout=60)

    def _of(self, name: str, finished: bool = False) -> list[dict[str, Any]]:
        return [p for p in self.t.pods(finished) if p["metadata"]["name"].startswith(f"{name}-")]

    def _bound_of(self, name: str) -> int:
        return len([p for p in self._of(name, finished=True) if p["spec"].get("nodeName")])

    def step(self) -> None:
        roll = self.rng.random()
        if (roll < 0.2 and len(self.deployments) < 4) or not self.deployments:
            self.create()
        elif roll < 0.7:
            self.scale(self.rng.choice(sorted(self.deployments)))
        elif roll < 0.8:
            self.delete(self.rng.choice(sorted(self.deployments)))
        else:
            self.job()
        self.settle()


def line_waiters(front: Process, queue: str) -> int:
    """Waiters in ``queue``'s line, from the webhook's metrics (other tests' queues left out)."""
    with front.client() as client:
        text = client.get("/metrics").text
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith(f'cardquota_line_waiters{{queue="{queue}"}}')
    )


def squeeze(soak: Soak, front: Process) -> None:
    """The waiting line under the real scheduler: the Deployments are made again while hogs hold a
    quota of 2 of every card, so every pod is refused and each ReplicaSet waits in line (deny mode)
    or every pod is held under our gate (wait mode); then the quota comes back and the hogs go: each
    gets all its pods at once, within quota and bound, and the line ends empty."""
    t, quota, wanted = soak.t, dict(soak.t.quota), dict(soak.deployments)
    for name in wanted:
        t.plane.kubectl("delete", "-n", t.ns, f"deployment/{name}", "--wait=false")
    gone = lambda: not t.pods() and not t.plane.get("replicasets", namespace=t.ns)["items"]  # noqa: E731
    wait_for("every pod and ReplicaSet to go", gone, timeout=60)
    cards = sorted({card for spec in SOAK_SPECS for card in spec.split("|")})
    t.set_quota({card: 2 if card in cards else 0 for card in quota})
    t.plane.apply(
        *(flex_deployment(f"hog{i}", 1, card, t.queue, 2) for i, card in enumerate(cards)), namespace=t.ns
    )
    t.wait_settled(len(cards))
    for name, (spec, per_pod, replicas) in wanted.items():
        t.plane.apply(flex_deployment(name, replicas, spec, t.queue, per_pod), namespace=t.ns)
    # Deny mode: each ReplicaSet waits. Wait mode: its first pod waits under the gate, and the
    # ReplicaSet of the rest, while its PodGroup is not enqueued (the capacity-card plugin enqueues it
    # only whole, so one pod is held at a time); stock Volcano enqueues it with gated pods, and the
    # ReplicaSet's next pods are held too as its back-off lets it create them.
    asked = {name: replicas for name, (_, _, replicas) in wanted.items() if replicas}

    def standing() -> tuple[int, int]:
        """(pods held under the gate, ReplicaSets short of pods): what the line must hold."""
        pods = t.pods()
        held = len([p for p in pods if gated(p)])
        short = sum(
            1
            for name, n in asked.items()
            if len([p for p in pods if p["metadata"]["name"].startswith(f"{name}-")]) < n
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
        assert held == len(asked) and short == sum(1 for n in asked.values() if n > 1), (held, short)
    if t.mode == "deny":
        assert held == 0 and short == len(asked), (held, short)
    soak.log.append(f"squeeze: {short} ReplicaSets and {held} pods waiting")
    t.set_quota(quota)
    for i in range(len(cards)):
        t.plane.kubectl("delete", "-n", t.ns, f"deployment/hog{i}", "--wait=false")
    soak.settle()
    wait_for("the line to empty", lambda: line_waiters(front, t.queue) == 0, timeout=10)


@pytest.mark.parametrize("mode", ["deny", "wait"])
def test_a_seeded_soak_of_creates_scales_deletes_and_jobs_keeps_the_pair_in_agreement(
    volcano: ControlPlane, front: Process, mode: str
) -> None:
    tenant = Tenant(volcano, mode=mode)
    try:
        soak_in(tenant, front)
    finally:
        tenant.delete()


def soak_in(tenant: Tenant, front: Process) -> None:
    seed = int(os.environ.get("CARDQUOTA_SOAK_SEED", random.randrange(1 << 32)))
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
        time.sleep(5)  # the scheduler given time to settle
        soak.settle()
        squeeze(soak, front)
    except BaseException as exc:
        raise AssertionError(f"soak seed {seed}, quota {tenant.quota}, after: {soak.log}") from exc

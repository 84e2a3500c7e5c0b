"""Tidal reclaim (SPEC §5e, decisions.md §26) in front of each REAL partner: the seed-002 setup, an
inference queue (priority 80000, not reclaimable) and a training queue (priority 20000, reclaimable)
over-committing one model's cards. A training Volcano Job holds every card of the model, on two
nodes; an inference Deployment scaled up by an HPA inside its quota gets its pods bound within the
victims' grace period + 5 s: the job is evicted whole, nothing else is touched. At "night" the
inference goes and the job runs again within 2 s of its cards freeing. Skipped, with the reason,
when a partner's source is not beside the repository."""

import json
import os
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agreement import R4090, card_template, long_job
from tests.e2e.cluster import SHUTDOWN, ControlPlane, holds_for, soak_seed, wait_for
from tests.e2e.conftest import partner_plane
from tests.e2e.objects import SELECTOR, card_queue, deployment_of, hpa
from tests.e2e.registration import configurations
from tests.e2e.test_replicas import serving
from tests.edges.serving import Process

L40S = "NVIDIA-L40S"  # a model only this module's nodes have: two nodes of 2 cards
NODES = ("l40s-0", "l40s-1")
GRACE = 3  # seconds a training pod takes to stop (kwok's delayed delete)
BOUND_WITHIN = GRACE + 5.0
BACK_WITHIN = 2.0
RECLAIMED = "cardquota.volcano.sh/reclaimed"  # the hold mark on a victim's PodGroup


@pytest.fixture(scope="module", params=["fork", "stock"])
def volcano(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    with partner_plane(request.param, tmp_path_factory) as plane:
        yield prepared(plane)


def prepared(plane: ControlPlane) -> ControlPlane:
    """``plane`` with the two L40S nodes and the two PriorityClasses the seed-002 setup uses."""
    plane.apply(*[l40s_node(name) for name in NODES])
    plane.kubectl("apply", "-f", "-", stdin=json.dumps(priority_class("tidal-low", 100)))
    plane.kubectl("apply", "-f", "-", stdin=json.dumps(priority_class("tidal-high", 1000)))

    def ready() -> bool:
        nodes = [plane.get("node", name) for name in NODES]
        return all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            for n in nodes
        )

    wait_for("kwok to mark the L40S nodes Ready", ready, timeout=60)
    return plane


def l40s_node(name: str) -> dict[str, Any]:
    allocatable = {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "2", "pods": "110"}
    labels = {
        "nvidia.com/gpu.product": L40S,
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.memory": "46068",
        "type": "kwok",
        "kubernetes.io/hostname": name,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": []},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


class Seed002:
    """One test's namespace, its training and inference queues, removed afterwards."""

    def __init__(self, plane: ControlPlane, labels: dict[str, str] = SELECTOR) -> None:
        self.plane = plane
        self.ns = f"tidal-{uuid.uuid4().hex[:8]}"
        self.train, self.serve = f"train-{self.ns}", f"serve-{self.ns}"
        self.queues: list[str] = []
        plane.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns, "labels": labels}}
        )
        self.queue(self.train, {L40S: 4, R4090: 1}, 20000, True)
        self.queue(self.serve, {L40S: 2}, 80000, False)

    def queue(
        self, name: str, quota: dict[str, int], priority: int, reclaimable: bool, **annotations: str
    ) -> None:
        queue = card_queue(name, quota)
        queue["spec"].update(priority=priority, reclaimable=reclaimable)
        queue["metadata"]["annotations"].update(annotations)
        self.plane.kubectl("apply", "-f", "-", stdin=json.dumps(queue))
        self.queues.append(name)
        wait_for(f"queue {name} to be Open", lambda: self._open(name), timeout=30)

    def _open(self, queue: str) -> bool:
        return str((self.plane.get("queue", queue).get("status") or {}).get("state")) == "Open"

    def pods(self, prefix: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.plane.get("pods", namespace=self.ns)["items"]
            if p["metadata"]["name"].startswith(prefix)
        ]

    def running(self, prefix: str) -> list[dict[str, Any]]:
        """Bound and not being deleted."""
        return [
            p
            for p in self.pods(prefix)
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        ]

    def training(self, name: str, pods: int, card: str = L40S, stops: float = GRACE, queue: str = "") -> None:
        """A Volcano Job of ``pods`` pods of ``card``, each taking ``stops`` seconds to stop."""
        job = long_job(name, pods, card, queue or self.train)
        template = job["spec"]["tasks"][0]["template"]
        template["metadata"]["annotations"][SHUTDOWN] = f"{stops:g}s"
        template["spec"]["priorityClassName"] = "tidal-low"
        self.plane.apply(job, namespace=self.ns)

    def two_jobs(self) -> None:
        """Training jobs a and b, 2 pods each, holding every L40S (one after the other)."""
        for name in ("a", "b"):
            self.training(name, 2)
            wait_for(f"job {name} to be bound", lambda n=name: len(self.running(f"{n}-")) == 2, timeout=90)

    def budget(self, job: str) -> None:
        """A PodDisruptionBudget over the 4 pods of Volcano Job ``job`` allowing one disruption, once
        its controller counts them."""
        budget = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": job},
            "spec": {"minAvailable": 3, "selector": {"matchLabels": {"volcano.sh/job-name": job}}},
        }
        self.plane.apply(budget, namespace=self.ns)
        wait_for(
            "the budget to count the job's pods",
            lambda: (
                (self.plane.get("pdb", job, namespace=self.ns).get("status") or {}).get("expectedPods") == 4
            ),
            timeout=30,
        )

    def inference(self, name: str, replicas: int, queue: str = "", **spec: Any) -> None:
        """``spec``: more of the pods' spec (a nodeSelector, tolerations)."""
        template = card_template(L40S, queue or self.serve)
        template["spec"]["priorityClassName"] = "tidal-high"
        template["spec"].update(spec)
        self.plane.apply(deployment_of(name, replicas, template), namespace=self.ns)

    def reclaim_marks(self) -> set[str]:
        """The PodGroups carrying tidal reclaim's hold mark (written by the webhook's account)."""
        groups = self.plane.get("podgroups", namespace=self.ns)["items"]
        return {
            g["metadata"]["name"] for g in groups if RECLAIMED in (g["metadata"].get("annotations") or {})
        }

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.plane.get("events", namespace=self.ns)["items"] if e.get("reason") == reason]

    def delete(self) -> None:
        self.plane.kubectl("delete", "namespace", self.ns, "--wait=false", check=False)
        self.plane.kubectl(
            "delete", "jobs.batch.volcano.sh", "--all", "-n", self.ns, "--wait=false", check=False
        )
        wait_for(f"the pods of {self.ns} to go", lambda: not self.pods(""), timeout=120)
        for queue in self.queues:
            self.plane.kubectl("delete", "queue", queue, check=False)


@pytest.fixture
def seed(volcano: ControlPlane, front: Process) -> Iterator[Seed002]:
    made = Seed002(volcano)
    yield made
    made.delete()


def seconds_until(check: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    wait_for("the condition", check, timeout=timeout, every=0.1)
    return time.monotonic() - start


def test_inference_takes_back_a_whole_training_job_on_two_nodes_and_training_returns_at_night(
    seed: Seed002,
) -> None:
    seed.training("other", 1, card=R4090)  # training on another model: never touched
    seed.training("train", 4)
    wait_for("the training job to hold every L40S", lambda: len(seed.running("train-")) == 4, timeout=90)
    wait_for("the other model's training to run", lambda: len(seed.running("other-")) == 1, timeout=90)
    held = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in seed.running("train-")}
    assert set(held.values()) == set(NODES), "the victims are on both nodes"
    other = [p["metadata"]["uid"] for p in seed.running("other-")]

    seed.inference("web", 1)
    seed.plane.apply(hpa("web", 2, 2), namespace=seed.ns)
    marked: set[str] = set()  # the PodGroups seen with the hold mark while web waited

    def web_bound(count: int) -> bool:
        marked.update(seed.reclaim_marks())
        return len(seed.running("web-")) >= count

    first = seconds_until(lambda: web_bound(1), timeout=60)
    assert first <= BOUND_WITHIN, f"the first inference pod took {first:.1f} s to be bound"
    wait_for("the HPA to scale web to 2", lambda: len(seed.pods("web-")) == 2, timeout=60)
    second = seconds_until(lambda: web_bound(2), timeout=60)
    web = uids(seed.running("web-"))
    assert second <= BOUND_WITHIN, f"the HPA's pod took {second:.1f} s to be bound"
    # The hold was written on the victim's PodGroup (a new leader would hold the cards too), for as
    # long as web waited: written before the evictions, and at least the victims' grace period.
    assert marked and all(name.startswith("train-") for name in marked), marked
    wait_for("the hold mark to go once web is bound", lambda: not seed.reclaim_marks(), timeout=15)

    # The job went whole, nothing else did, and it is held back while web is bound.
    assert not [p for p in seed.running("train-") if p["metadata"]["uid"] in held], "half-evicted"
    assert [p["metadata"]["uid"] for p in seed.running("other-")] == other
    assert len(seed.running("train-")) == 0, "the job restarted on the cards web holds"
    reclaimed = seed.events("CardQuotaReclaimed")
    assert any(f'queue "{seed.serve}"' in e["message"] for e in reclaimed), reclaimed
    assert seed.events("CardQuotaReclaiming"), "the inference pods are told"

    # Night: the inference goes (its HPA first); the job runs again within 2 s of its cards freeing.
    seed.plane.kubectl("delete", "hpa", "web", "-n", seed.ns)
    assert uids(seed.pods("web-")) == web, "an inference pod was evicted or replaced"
    seed.plane.kubectl("scale", "deployment/web", "--replicas=0", "-n", seed.ns)
    wait_for("web's pods to go", lambda: not seed.pods("web-"), timeout=60, every=0.1)
    back = seconds_until(lambda: len(seed.running("train-")) == 4, timeout=60)
    assert back <= BACK_WITHIN, f"the training job ran again {back:.1f} s after its cards freed"
    # Only the inference queue ever took cards back: never training, from anyone.
    takers = {
        e["message"].split('taken back for queue "')[1].split('"')[0]
        for e in seed.events("CardQuotaReclaimed")
    }
    assert takers == {seed.serve}, takers
    assert [p["metadata"]["uid"] for p in seed.running("other-")] == other


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def test_a_budget_that_forbids_the_eviction_is_reported_and_nothing_is_half_evicted(seed: Seed002) -> None:
    seed.training("train", 4)
    wait_for("the training job to hold every L40S", lambda: len(seed.running("train-")) == 4, timeout=90)
    held = uids(seed.running("train-"))
    seed.budget("train")  # one disruption allowed: each pod alone would pass, the gang not
    seed.inference("web", 1)
    refused = wait_for("the refusal to be reported", lambda: seed.events("CardQuotaNotReclaimed"), timeout=30)
    budget_named = f"PodDisruptionBudget {seed.ns}/train "  # the gang judged whole against it
    assert any(
        budget_named in e["message"] and "none of its pods evicted" in e["message"] for e in refused
    ), [e["message"] for e in refused]
    # What an eviction would have started has had time to show: never one pod of the gang gone.
    holds_for("the protected job whole", lambda: uids(seed.running("train-")) == held, GRACE + 2, every=0.1)
    assert not seed.running("web-")
    assert not seed.events("CardQuotaReclaimed")


def test_two_inference_workloads_racing_for_the_same_training_each_card_is_taken_once(seed: Seed002) -> None:
    second = f"serve2-{seed.ns}"
    seed.queue(second, {L40S: 2}, 70000, False)
    seed.two_jobs()
    seed.inference("web", 2)
    seed.inference("api", 2, queue=second)
    wait_for(
        "every inference pod bound", lambda: len(seed.running("web-") + seed.running("api-")) == 4, timeout=60
    )
    # Each job's PodGroup and Volcano Job were told once: no gang was evicted twice.
    told = sorted(
        e["involvedObject"]["kind"] + "/" + e["involvedObject"]["name"]
        for e in seed.events("CardQuotaReclaimed")
    )
    assert len(told) == len(set(told)) == 4, told


def test_a_free_card_elsewhere_is_used_first_and_only_the_gang_still_needed_is_evicted(seed: Seed002) -> None:
    """Training job a (2 pods) then b (1 pod) hold 3 of the 4 L40S; web (2 pods) needs 2: the free
    card serves one, and one more card is taken back: b alone (the younger, and the fewest cards),
    never a, and nothing for the pod the free card holds."""
    seed.training("a", 2)
    wait_for("job a to be bound", lambda: len(seed.running("a-")) == 2, timeout=90)
    time.sleep(1.1)  # b's PodGroup a second younger than a's (the order has seconds only)
    seed.training("b", 1)
    wait_for("job b to be bound", lambda: len(seed.running("b-")) == 1, timeout=90)
    kept = uids(seed.running("a-"))
    seed.inference("web", 2)
    wait_for("web's pods bound", lambda: len(seed.running("web-")) == 2, timeout=60, every=0.1)
    assert uids(seed.running("a-")) == kept, "job a lost pods, though b alone freed what web needed"
    assert not seed.running("b-"), "job b runs on a card web holds"
    told = [e["involvedObject"]["name"] for e in seed.events("CardQuotaReclaimed")]
    assert told and all(name.startswith("b") for name in told), told  # b's PodGroup and Job only
    holds_for("job a whole while web runs", lambda: uids(seed.running("a-")) == kept, 3, every=0.25)


def test_a_card_still_being_freed_elsewhere_counts_and_only_the_gang_still_needed_is_evicted(
    seed: Seed002,
) -> None:
    """Jobs a (2 pods), b and c (1 pod each) hold every L40S; c is deleted and takes 20 s to stop, so
    the scheduler has no card for either of web's 2 pods while it stops. Reclaim counts c's card as
    free already: it takes back one more, b's (the younger of a and b, and the fewest cards), never
    a's two, and web's second pod gets c's card when c is gone."""
    seed.training("a", 2)
    wait_for("job a to be bound", lambda: len(seed.running("a-")) == 2, timeout=90)
    time.sleep(1.1)  # b's PodGroup a second younger than a's (the order has seconds only)
    seed.training("b", 1)
    seed.training("c", 1, stops=20)
    wait_for("b and c bound", lambda: len(seed.running("b-") + seed.running("c-")) == 2, timeout=90)
    kept = uids(seed.running("a-"))
    seed.plane.kubectl("delete", "jobs.batch.volcano.sh", "c", "-n", seed.ns, "--wait=false")
    # The garbage collector deletes a deleted Volcano Job's pods; it may first have to learn the
    # job's kind from discovery (every 30 s on a young control plane): seen once past 30 s (run 57).
    wait_for("c's pod to be stopping", lambda: not seed.running("c-") and seed.pods("c-"), timeout=90)
    seed.inference("web", 2)
    wait_for("web's first pod bound", lambda: len(seed.running("web-")) >= 1, timeout=60, every=0.1)
    assert seed.pods("c-"), "c stopped before web's first pod was bound: its card was not the one counted"
    wait_for("web's second pod bound, on c's card", lambda: len(seed.running("web-")) == 2, timeout=60)
    assert uids(seed.running("a-")) == kept, "job a lost pods, though c's card and b's were enough"
    told = [e["involvedObject"]["name"] for e in seed.events("CardQuotaReclaimed")]
    assert told and all(name.startswith("b") for name in told), told


def test_the_freed_cards_are_held_from_a_third_lower_priority_queue_until_inference_is_bound(
    seed: Seed002,
) -> None:
    """Two 2-pod training jobs hold every L40S; web (2 pods) takes one back. A third queue's job
    (lower priority than web's queue, its pods as high a PriorityClass as web's), made the moment
    the reclaim begins, asks for exactly the cards it frees: it is not enqueued (none of its pods
    is even made) before web's two pods are bound, and it is told why."""
    batch = f"batch-{seed.ns}"
    seed.queue(batch, {L40S: 2}, 10000, True)
    seed.two_jobs()
    seed.inference("web", 2)
    wait_for("the reclaim to begin (its hold mark)", seed.reclaim_marks, timeout=30, every=0.1)
    job = long_job("third", 2, L40S, batch)
    job["spec"]["tasks"][0]["template"]["spec"]["priorityClassName"] = "tidal-high"
    seed.plane.apply(job, namespace=seed.ns)
    early: list[str] = []

    def web_bound() -> bool:
        web, third = len(seed.running("web-")), seed.pods("third-")
        if third and web < 2:
            early.extend(p["metadata"]["name"] for p in third)
        return web == 2

    wait_for("web's pods to be bound", web_bound, timeout=60, every=0.1)
    assert not early, f"pods of queue {batch} made for the freed cards before web's were bound: {early}"
    told = [e["message"] for e in seed.events("CardQuotaEnqueueRefused")]
    assert any(f'of queue "{batch}" waits for {L40S}' in m and f'queue "{seed.serve}"' in m for m in told), (
        told
    )


PROBE_GRACE = 12345
DRY_RUN = (  # an eviction's dry run is in its deleteOptions (the request's own dryRun is not set)
    "request.dryRun || has(object.deleteOptions) && has(object.deleteOptions.dryRun)"
    " && object.deleteOptions.dryRun.size() > 0"
)
PROBE = (
    "has(object.deleteOptions) && has(object.deleteOptions.gracePeriodSeconds)"
    f" && object.deleteOptions.gracePeriodSeconds == {PROBE_GRACE}"
)


def eviction_block(name: str, namespace: str, pod: str) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy and its binding refusing every eviction of ``pod`` (anyone's)
    but a dry run (the reclaimer's judgement of the gang, which so begins it): its gang's reclaim
    is held mid-way, one pod left, until the binding is deleted. A dry run with the probe's grace
    period is refused too: it tells when the policy is in force."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods/eviction"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": f"!(request.namespace == '{namespace}' && request.name == '{pod}'"
                    f" && (!({DRY_RUN}) || {PROBE}))",
                    "message": "held for the test",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def eviction_refused(plane: ControlPlane, namespace: str, pod: str) -> bool:
    """Whether the probe's dry-run eviction of ``pod`` is refused by the test's hold."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
        "deleteOptions": {"dryRun": ["All"], "gracePeriodSeconds": PROBE_GRACE},
    }
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    done = plane.kubectl("create", "--raw", path, "-f", "-", stdin=json.dumps(eviction), check=False)
    return "held for the test" in done.stderr


def test_a_leader_killed_mid_reclaim_leaves_its_hold_and_its_gang_to_the_next(
    volcano: ControlPlane, front: Process, tmp_path: Path
) -> None:
    """Two replicas under the chart's ServiceAccount elect a leader; the API server calls the
    standby, which forwards to the leader. The leader is killed mid-reclaim: its hold mark written,
    one pod of the gang still running (its eviction refused by a policy of the test's until then).
    The next leader adopts the gang from the mark and evicts that pod, web's pods are bound, and
    the training job runs again on none of their cards meanwhile."""
    lease = f"tidal-{uuid.uuid4().hex[:6]}"
    flags = ("--kubeconfig", str(volcano.webhook_kubeconfig), "--drain-seconds", "0", "--leader-elect")
    flags += ("--lease-name", lease, "--lease-namespace", volcano.release_namespace)
    first = Process(tmp_path / "certs", volcano.logs / f"{lease}-1.log", *flags, cluster=None)
    second: Process | None = None
    labels = {"cardquota-e2e-failover": lease}
    registered: list[dict[str, Any]] = []
    block: list[dict[str, Any]] = []
    try:
        first.wait_ready(timeout=60)
        wait_for("the first replica to lead", lambda: serving(first), timeout=30)
        second = Process(tmp_path / "certs", volcano.logs / f"{lease}-2.log", *flags, cluster=None)
        second.wait_ready(timeout=60)
        registered = configurations(second.url, second.certs / "ca.crt", labels, lease, volcano.webhook_user)
        volcano.apply(*registered)
        seed = Seed002(volcano, labels=labels)
        # The module's own webhook reclaims on this plane too (its cache is the whole cluster's): it
        # is paused meanwhile, so the reclaim is the two replicas' alone (nothing it reviews is
        # written until it resumes: the queues are made, and deleted after).
        os.kill(front.proc.pid, signal.SIGSTOP)
        try:
            seed.training("train", 4)
            wait_for("the job to hold every L40S", lambda: len(seed.running("train-")) == 4, timeout=90)
            held = uids(seed.running("train-"))
            last = max(p["metadata"]["name"] for p in seed.running("train-"))
            block = eviction_block(f"hold-{lease}", seed.ns, last)
            volcano.apply(*block)
            wait_for(
                "the eviction hold in force", lambda: eviction_refused(volcano, seed.ns, last), timeout=30
            )
            seed.inference("web", 2)
            wait_for("the hold mark", seed.reclaim_marks, timeout=30, every=0.05)
            wait_for("the gang's other pods evicted", lambda: len(seed.running("train-")) == 1, timeout=60)
            first.proc.kill()
            (kept,) = seed.running("train-")
            assert kept["metadata"]["name"] == last, "the held pod is the one left, running, not deleting"
            for doc in reversed(block):
                volcano.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], check=False)
            block = []
            wait_for(
                "the eviction hold lifted", lambda: not eviction_refused(volcano, seed.ns, last), timeout=30
            )
            wait_for("the second replica to lead", lambda: serving(second), timeout=30)  # type: ignore[arg-type]
            back: set[str] = set()

            def web_bound() -> bool:
                web = len(seed.running("web-"))
                if web < 2:
                    back.update(uids(seed.running("train-")) - held)
                return web == 2

            wait_for("web's pods to be bound", web_bound, timeout=90, every=0.1)
            assert not back, f"the training job ran again before web was bound: {back}"
            wait_for(
                "the next leader to evict the gang's last pod",
                lambda: not uids(seed.running("train-")) & held,
                timeout=30,
            )
            assert "finishing an earlier leader's reclaim" in second.log(), "the next leader adopted the gang"  # type: ignore[union-attr]
            volcano.assert_no_rbac_refusal(second.log())  # type: ignore[union-attr]
        finally:
            os.kill(front.proc.pid, signal.SIGCONT)
            front.wait_ready(timeout=60)
            seed.delete()
    finally:
        for doc in reversed(block):
            volcano.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], check=False)
        for config in registered:
            volcano.kubectl("delete", config["kind"].lower(), config["metadata"]["name"], check=False)
        first.stop()
        if second is not None:
            second.stop()


TAINT = "dedicated=training:NoSchedule"
NOTHING_FOR = 60.0  # seconds nothing may be evicted for pods the freed cards could not serve


def test_inference_pods_no_freed_card_could_serve_evict_nothing_and_are_told_why(seed: Seed002) -> None:
    """One inference pod asks for a node label no L40S node has, another does not tolerate the
    taint on them both; both inside their quota while training holds every card. Evicting the
    training would free nothing either could use: for a minute nothing is evicted, and each is
    told why (its CardQuotaNotReclaimed Event)."""
    for node in NODES:
        seed.plane.kubectl("taint", "nodes", node, TAINT, "--overwrite")
    try:
        job = long_job("train", 4, L40S, seed.train)
        template = job["spec"]["tasks"][0]["template"]
        template["spec"]["priorityClassName"] = "tidal-low"
        template["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
        seed.plane.apply(job, namespace=seed.ns)
        wait_for("the training job to hold every L40S", lambda: len(seed.running("train-")) == 4, timeout=90)
        held = uids(seed.running("train-"))
        tolerates = [{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}]
        seed.inference("labelled", 1, nodeSelector={"pool": "inference"}, tolerations=tolerates)
        seed.inference("untolerated", 1)

        def told(prefix: str) -> bool:
            names = {p["metadata"]["name"] for p in seed.pods(prefix)}
            return any(
                e["involvedObject"]["name"] in names
                and "no node with NVIDIA-L40S is one the pods may be scheduled on" in e["message"]
                for e in seed.events("CardQuotaNotReclaimed")
            )

        wait_for("both inference pods to be told why", lambda: told("labelled-") and told("untolerated-"), 30)
        holds_for(
            "the training job untouched",
            lambda: uids(seed.running("train-")) == held and not seed.events("CardQuotaReclaimed"),
            NOTHING_FOR,
            every=1.0,
        )
        assert not seed.running("labelled-") and not seed.running("untolerated-")
        assert not seed.reclaim_marks()
    finally:
        for node in NODES:
            seed.plane.kubectl("taint", "nodes", node, f"{TAINT}-", check=False)


SOAK_OPS = int(os.environ.get("CARDQUOTA_TIDAL_SOAK_OPS", "8"))
SETTLE = GRACE + 12.0  # seconds a step may take to settle: the victims' grace, a reclaim, a bind


def test_a_seeded_tidal_soak_keeps_quotas_gangs_whole_and_inference_bound(
    seed: Seed002, request: pytest.FixtureRequest
) -> None:
    """Inference scaled up and down at random against training jobs that come and go: at every
    settled point no queue is over its quota, no training job is half-running, and every inference
    pod (always inside its quota) is bound."""
    number = soak_seed(request.node)
    print(f"tidal soak seed {number} (replay: CARDQUOTA_SOAK_SEED={number})")
    rng = random.Random(number)
    # Quotas below what the nodes hold (training 3 of 4 cards; inference asked up to 3 over its 2),
    # so that "no queue over its quota" is the webhook's doing, not the nodes'.
    seed.queue(seed.train, {L40S: 3, R4090: 1}, 20000, True)
    seed.inference("web", 0)
    jobs: dict[str, int] = {}
    log: list[str] = []

    over: list[str] = []  # any moment a queue was seen past its quota, not only settled ones

    def use() -> dict[str, int]:
        """L40S of each queue held by its pods running (bound, not being deleted) on ``NODES``."""
        held = {queue: 0 for queue in (seed.train, seed.serve)}
        for pod in seed.running(""):
            queue = pod["metadata"]["annotations"].get("scheduling.volcano.sh/queue-name", "")
            if pod["spec"]["nodeName"] in NODES and queue in held:
                held[queue] += 1
        if held[seed.train] > 3 or held[seed.serve] > 2:
            over.append(f"{held} after {log}")
        return held

    def settled() -> str:
        """ "" when settled, else what is not: pods being deleted, web not all bound, a job
        half-running, or every waiting job (none running) fitting both its quota and the free
        cards, so that the first in the queue's line should run."""
        held = use()  # every poll: over quota at no moment
        pods = seed.pods("")
        if any(p["metadata"].get("deletionTimestamp") for p in pods):
            return "pods are being deleted"
        web = seed.pods("web-")
        wanted = seed.plane.get("deployment", "web", namespace=seed.ns)["spec"]["replicas"]
        if len(web) != wanted or not all(p["spec"].get("nodeName") for p in web):
            return f"web has {len([p for p in web if p['spec'].get('nodeName')])} of {wanted} pods bound"
        waiting = []
        for name, replicas in jobs.items():
            running = len(seed.running(f"{name}-"))
            if running not in (0, replicas):
                return f"job {name} runs {running} of its {replicas} pods"
            if running == 0:
                waiting.append(name)
        free = 2 * len(NODES) - sum(held.values())
        if waiting and all(held[seed.train] + jobs[n] <= 3 and jobs[n] <= free for n in waiting):
            return f"jobs {waiting} run none of their pods with {free} L40S free and room in their quota"
        return ""

    for step in range(SOAK_OPS):
        op = rng.choice(["job", "job", "scale", "scale", "end"])
        if op == "job" and len(jobs) < 3:
            name = f"j{step}"
            jobs[name] = rng.randint(1, 2)
            seed.training(name, jobs[name])
            log.append(f"job {name} x{jobs[name]}")
        elif op == "end" and jobs:
            name = rng.choice(sorted(jobs))
            del jobs[name]
            seed.plane.kubectl("delete", "jobs.batch.volcano.sh", name, "-n", seed.ns, "--wait=false")
            log.append(f"end {name}")
        else:
            replicas = rng.randint(0, 3)
            done = seed.plane.kubectl(
                "scale", "deployment/web", f"--replicas={replicas}", "-n", seed.ns, check=False
            )
            if done.returncode:  # past its quota (2): refused at the scale, naming the queue
                assert replicas > 2, (
                    f"seed {number}: a scale to {replicas}, inside the quota, refused: {done.stderr}"
                )
                assert f'queue "{seed.serve}"' in done.stderr, done.stderr
            log.append(f"web -> {replicas}" + (": denied" if done.returncode else ""))
        try:
            wait_for(f"step {step} to settle", lambda: not settled(), timeout=SETTLE, every=0.25)
        except TimeoutError as exc:
            raise AssertionError(f"seed {number}: {settled()} after {log}") from exc
        use()
        assert not over, f"seed {number}: over quota {over[0]}"
    if not seed.events("CardQuotaReclaimed"):  # the random steps never needed one: make one
        seed.plane.kubectl("scale", "deployment/web", "--replicas=0", "-n", seed.ns)
        for name in list(jobs):
            seed.plane.kubectl("delete", "jobs.batch.volcano.sh", name, "-n", seed.ns, "--wait=false")
            del jobs[name]
        try:
            wait_for("the soak's jobs and web to go", lambda: not seed.pods(""), timeout=60)
        except TimeoutError as exc:
            left = [(p["metadata"]["name"], p["status"].get("phase")) for p in seed.pods("")]
            raise AssertionError(f"seed {number}: left {left} after {log}") from exc
        jobs["fill"] = 3
        seed.training("fill", 3)
        wait_for("fill to hold 3 L40S", lambda: len(seed.running("fill-")) == 3, timeout=90)
        seed.plane.kubectl("scale", "deployment/web", "--replicas=2", "-n", seed.ns)
        log.append("fill x3, web -> 2")
        try:
            wait_for("the last step to settle", lambda: not settled(), timeout=SETTLE, every=0.25)
        except TimeoutError as exc:
            raise AssertionError(f"seed {number}: {settled()} after {log}") from exc
    assert seed.events("CardQuotaReclaimed"), f"seed {number}: nothing was reclaimed after {log}"


DESERVED = "cardquota.volcano.sh/card.deserved"
LENDABLE = "cardquota.volcano.sh/card.lendable"


def lending(seed: Seed002, lendable: int | None = None) -> tuple[str, str]:
    """decisions.md §33 on the 4 L40S: queue a (deserved 2, quota 4) and queue b (deserved 2,
    quota 2, lending at most ``lendable``), top-level queues, one cohort. Neither tidal reason
    applies: a's queue is of higher priority than b's and not reclaimable."""
    a, b = f"a-{seed.ns}", f"b-{seed.ns}"
    seed.queue(a, {L40S: 4}, 90000, False, **{DESERVED: json.dumps({L40S: 2})})
    more = {LENDABLE: json.dumps({L40S: lendable})} if lendable is not None else {}
    seed.queue(b, {L40S: 2}, 10000, False, **{DESERVED: json.dumps({L40S: 2})}, **more)
    return a, b


def test_a_lender_takes_its_lent_cards_back_from_the_borrowing_gang_whole(seed: Seed002) -> None:
    """a's 4-pod job runs while b is idle, 2 of its cards borrowed from b. b's 2-pod Deployment is
    admitted (inside its deserved) and bound within the victims' grace + 5 s: a's gang is evicted
    whole and held back (a may now use its deserved 2, and the job needs 4) while b's pods run."""
    a, b = lending(seed)
    seed.training("borrow", 4, queue=a)
    wait_for("a's job to hold every L40S", lambda: len(seed.running("borrow-")) == 4, timeout=90)
    held = uids(seed.running("borrow-"))
    wait_for(
        "a's job told it borrows b's cards",
        lambda: any(
            f'2 {L40S} borrowed from queue "{b}"' in e["message"] for e in seed.events("CardQuotaBorrowing")
        ),
        timeout=30,
    )

    def marked() -> list[Any]:  # the borrowing marks on the namespace's PodGroups
        groups = seed.plane.get("podgroups.scheduling.volcano.sh", namespace=seed.ns)["items"]
        found = [g["metadata"].get("annotations", {}).get("cardquota.volcano.sh/borrowing") for g in groups]
        return [json.loads(mark)["cards"] for mark in found if mark]

    wait_for("a's PodGroup marked as borrowing", marked, timeout=10)
    assert marked() == [{L40S: {"beyond": 2, "deserved": 2, "from": [b]}}]
    seed.inference("web", 2, queue=b)
    bound = seconds_until(lambda: len(seed.running("web-")) == 2, timeout=60)
    assert bound <= BOUND_WITHIN, f"b's pods took {bound:.1f} s to be bound"
    assert not uids(seed.running("borrow-")) & held, "a's gang was left half evicted"
    holds_for("a's job held back while b's pods run", lambda: not seed.running("borrow-"), 5)
    reclaimed = seed.events("CardQuotaReclaimed")
    assert any(f'taken back for queue "{b}"' in e["message"] for e in reclaimed), reclaimed


def test_a_lender_lending_nothing_lends_nothing(seed: Seed002) -> None:
    """Its twin: b's card.lendable is 0, so a may use its deserved 2 alone: its 4-pod job (enqueued
    whole) is held at enqueue with none of its pods, and b's Deployment runs at once."""
    a, b = lending(seed, lendable=0)
    seed.training("borrow", 4, queue=a)
    wait_for(
        "the enqueue refusal told on the job", lambda: seed.events("CardQuotaEnqueueRefused"), timeout=60
    )
    holds_for("a's job held at enqueue (b lends nothing)", lambda: not seed.pods("borrow-"), 5)
    seed.inference("web", 2, queue=b)
    wait_for("b's pods bound", lambda: len(seed.running("web-")) == 2, timeout=60)
    assert not seed.events("CardQuotaReclaimed")


def test_a_lender_waits_while_a_budget_forbids_the_borrowing_gangs_eviction(seed: Seed002) -> None:
    """The same with a PodDisruptionBudget over a's job allowing one disruption (the gang's four do
    not pass): b's pods are admitted and wait, told why, and no pod of a's job is evicted."""
    a, b = lending(seed)
    seed.training("borrow", 4, queue=a)
    wait_for("a's job to hold every L40S", lambda: len(seed.running("borrow-")) == 4, timeout=90)
    held = uids(seed.running("borrow-"))
    seed.budget("borrow")  # one disruption allowed: each pod alone would pass, the gang not
    seed.inference("web", 2, queue=b)
    refused = wait_for("the refusal to be reported", lambda: seed.events("CardQuotaNotReclaimed"), timeout=30)
    assert any(f"PodDisruptionBudget {seed.ns}/borrow " in e["message"] for e in refused), [
        e["message"] for e in refused
    ]
    holds_for("a's job whole", lambda: uids(seed.running("borrow-")) == held, GRACE + 2, every=0.1)
    assert len(seed.pods("web-")) == 2 and not seed.running("web-"), "b's pods admitted, waiting"
    assert not seed.events("CardQuotaReclaimed")


MIN_RUN = 20.0  # seconds: the borrower's queue's minimum run time in the case below


def test_a_borrowing_gang_keeps_its_cards_its_minimum_run_time_then_gives_them_back(seed: Seed002) -> None:
    """With a's ``reclaim-min-runtime`` of 20 s, b's pods (inside b's deserved) wait, told why,
    until a's job has run 20 s, then are bound within the victims' grace + 5 s of that."""
    a, b = lending(seed)
    seed.plane.kubectl("annotate", "queue", a, f"cardquota.volcano.sh/reclaim-min-runtime={MIN_RUN:.0f}s")
    seed.training("borrow", 4, queue=a)
    wait_for("a's job to hold every L40S", lambda: len(seed.running("borrow-")) == 4, timeout=90)
    started = max(
        datetime.fromisoformat(p["status"]["startTime"].replace("Z", "+00:00")).timestamp()
        for p in seed.running("borrow-")
    )
    seed.inference("web", 2, queue=b)
    wait_for(
        "b's pods told a's job has not run its minimum run time",
        lambda: any("minimum run time" in e["message"] for e in seed.events("CardQuotaNotReclaimed")),
        timeout=30,
    )
    assert not seed.running("web-") and len(seed.running("borrow-")) == 4
    wait_for("b's pods bound", lambda: len(seed.running("web-")) == 2, timeout=MIN_RUN + 60)
    bound = time.time() - started
    assert bound >= MIN_RUN, (
        f"b's pods bound {bound:.1f} s after a's job started, before its minimum run time"
    )
    assert bound <= MIN_RUN + BOUND_WITHIN + 5, f"b's pods bound {bound:.1f} s after a's job started"


NOTICE = 10.0  # seconds: the borrower's queue's notice before its gangs are evicted, below


def test_a_borrowing_gang_is_told_its_queues_notice_before_it_is_evicted(seed: Seed002) -> None:
    """With a's ``reclaim-notice`` of 10 s, the pass that takes a's cards back for b writes each of
    a's pods its notice (when it is evicted, when killed) and tells the job, evicting nothing;
    10 s later a's gang is evicted whole and b's pods are bound within the victims' grace + 5 s."""
    a, b = lending(seed)
    seed.plane.kubectl("annotate", "queue", a, f"cardquota.volcano.sh/reclaim-notice={NOTICE:.0f}s")
    seed.training("borrow", 4, queue=a)
    wait_for("a's job to hold every L40S", lambda: len(seed.running("borrow-")) == 4, timeout=90)
    held = uids(seed.running("borrow-"))
    seed.inference("web", 2, queue=b)

    def notices() -> list[Any]:
        found = [
            p["metadata"].get("annotations", {}).get("cardquota.volcano.sh/evicting")
            for p in seed.running("borrow-")
        ]
        return [json.loads(text) for text in found if text]

    wait_for("a's pods told of their eviction", lambda: len(notices()) == 4, timeout=30, every=0.1)
    told = time.time()
    (notice,) = {json.dumps(n, sort_keys=True) for n in notices()}
    evict = datetime.fromisoformat(json.loads(notice)["evict"].replace("Z", "+00:00")).timestamp()
    assert json.loads(notice)["for"] == b and evict > told, notice
    assert any(
        "are evicted at" in e["message"] and "reclaim-notice" in e["message"]
        for e in seed.events("CardQuotaReclaimNotice")
    )
    holds_for(
        "a's job running through its notice", lambda: uids(seed.running("borrow-")) == held, evict - told - 1
    )
    wait_for("b's pods bound", lambda: len(seed.running("web-")) == 2, timeout=NOTICE + 60)
    assert time.time() - evict <= BOUND_WITHIN, (
        f"b's pods bound {time.time() - evict:.1f} s after the notice ran out"
    )
    assert not uids(seed.running("borrow-")) & held, "a's gang was left half evicted"

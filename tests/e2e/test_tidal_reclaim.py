"""Tidal reclaim (SPEC §5e, decisions.md §26) in front of each REAL partner: the seed-002 setup, an
inference queue (priority 80000, not reclaimable) and a training queue (priority 20000, reclaimable)
over-committing one model's cards. A training Volcano Job holds every card of the model, on two
nodes; an inference Deployment scaled up by an HPA inside its quota gets its pods bound within the
victims' grace period + 5 s: the job is evicted whole, nothing else is touched. At "night" the
inference goes and the job runs again within 2 s of its cards freeing. Skipped, with the reason,
when a partner's source is not beside the repository."""

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.agreement import R4090, card_template, long_job
from tests.e2e.cluster import SHUTDOWN, ControlPlane, wait_for
from tests.e2e.conftest import partner_plane
from tests.e2e.objects import SELECTOR, card_queue, deployment_of, hpa
from tests.edges.serving import Process

L40S = "NVIDIA-L40S"  # a model only this module's nodes have: two nodes of 2 cards
NODES = ("l40s-0", "l40s-1")
GRACE = 3  # seconds a training pod takes to stop (kwok's delayed delete)
BOUND_WITHIN = GRACE + 5.0
BACK_WITHIN = 2.0


@pytest.fixture(scope="module", params=["fork", "stock"])
def volcano(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    with partner_plane(request.param, tmp_path_factory) as plane:
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
        yield plane


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

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.ns = f"tidal-{uuid.uuid4().hex[:8]}"
        self.train, self.serve = f"train-{self.ns}", f"serve-{self.ns}"
        plane.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns, "labels": SELECTOR}}
        )
        for name, quota, priority, reclaimable in (
            (self.train, {L40S: 4, R4090: 1}, 20000, True),
            (self.serve, {L40S: 2}, 80000, False),
        ):
            queue = card_queue(name, quota)
            queue["spec"].update(priority=priority, reclaimable=reclaimable)
            plane.kubectl("apply", "-f", "-", stdin=json.dumps(queue))
        wait_for(
            "both queues to be Open", lambda: all(self._open(q) for q in (self.train, self.serve)), timeout=30
        )

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

    def training(self, name: str, pods: int, card: str = L40S) -> None:
        job = long_job(name, pods, card, self.train)
        template = job["spec"]["tasks"][0]["template"]
        template["metadata"]["annotations"][SHUTDOWN] = f"{GRACE}s"
        template["spec"]["priorityClassName"] = "tidal-low"
        self.plane.apply(job, namespace=self.ns)

    def inference(self, name: str, replicas: int) -> None:
        template = card_template(L40S, self.serve)
        template["spec"]["priorityClassName"] = "tidal-high"
        self.plane.apply(deployment_of(name, replicas, template), namespace=self.ns)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.plane.get("events", namespace=self.ns)["items"] if e.get("reason") == reason]

    def delete(self) -> None:
        self.plane.kubectl("delete", "namespace", self.ns, "--wait=false", check=False)
        self.plane.kubectl(
            "delete", "jobs.batch.volcano.sh", "--all", "-n", self.ns, "--wait=false", check=False
        )
        wait_for(f"the pods of {self.ns} to go", lambda: not self.pods(""), timeout=120)
        for queue in (self.train, self.serve):
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
    first = seconds_until(lambda: len(seed.running("web-")) >= 1, timeout=60)
    assert first <= BOUND_WITHIN, f"the first inference pod took {first:.1f} s to be bound"
    wait_for("the HPA to scale web to 2", lambda: len(seed.pods("web-")) == 2, timeout=60)
    second = seconds_until(lambda: len(seed.running("web-")) == 2, timeout=60)
    assert second <= BOUND_WITHIN, f"the HPA's pod took {second:.1f} s to be bound"

    # The job went whole, nothing else did, and it is held back while web is bound.
    assert not [p for p in seed.running("train-") if p["metadata"]["uid"] in held], "half-evicted"
    assert [p["metadata"]["uid"] for p in seed.running("other-")] == other
    assert len(seed.running("train-")) == 0, "the job restarted on the cards web holds"
    reclaimed = seed.events("CardQuotaReclaimed")
    assert any(f'queue "{seed.serve}"' in e["message"] for e in reclaimed), reclaimed
    assert seed.events("CardQuotaReclaiming"), "the inference pods are told"

    # Night: the inference goes (its HPA first); the job runs again within 2 s of its cards freeing.
    seed.plane.kubectl("delete", "hpa", "web", "-n", seed.ns)
    web = {p["metadata"]["uid"] for p in seed.pods("web-")}
    assert len(web) == 2, "no inference pod was evicted or replaced"
    seed.plane.kubectl("scale", "deployment/web", "--replicas=0", "-n", seed.ns)
    wait_for("web's pods to go", lambda: not seed.pods("web-"), timeout=60, every=0.1)
    back = seconds_until(lambda: len(seed.running("train-")) == 4, timeout=60)
    assert back <= BACK_WITHIN, f"the training job ran again {back:.1f} s after its cards freed"

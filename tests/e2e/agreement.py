"""What the real-scheduler end-to-end tests share: the kwok nodes' models, a tenant (namespace and
queue) on the Volcano control plane, and card workloads of a spec."""

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.e2e.cluster import RUNS_FOR, ControlPlane, wait_for
from tests.e2e.objects import SELECTOR, card_queue, deployment_of
from webhook.core.model import keys

H200, H800 = "NVIDIA-H200", "NVIDIA-H800"
R4090, R4090D = "NVIDIA-GeForce-RTX-4090", "NVIDIA-GeForce-RTX-4090-D"
MIG = "NVIDIA-H200/mig-1g.18gb-mixed"
MPS = "NVIDIA-H800/mps-80g*1/2"
# The test's own knowledge of the kwok nodes (tests/e2e/cluster.gpu_nodes): which model a pod on a
# node uses through each resource. Independent of the webhook's discovery code.
NODE_MODELS = {
    ("h200-mig-0", "nvidia.com/gpu"): H200,
    ("h200-mig-0", "nvidia.com/mig-1g.18gb"): MIG,
    ("h800-mps-0", "nvidia.com/gpu"): H800,
    ("h800-mps-0", "nvidia.com/gpu.shared"): MPS,
    ("rtx4090-0", "nvidia.com/gpu"): R4090,
    ("rtx4090d-0", "nvidia.com/gpu"): R4090D,
}
RESOURCE = {MIG: "nvidia.com/mig-1g.18gb", MPS: "nvidia.com/gpu.shared"}


class Tenant:
    """One test's namespace and queue on the real-scheduler control plane."""

    def __init__(self, plane: ControlPlane, labels: dict[str, str] = SELECTOR, mode: str = "deny") -> None:
        self.plane, self.mode = plane, mode  # mode: the queue's over-quota mode (SPEC §5c)
        self.ns = f"agree-{uuid.uuid4().hex[:8]}"
        self.queue = f"q-{self.ns}"
        self.quota: dict[str, int] = {}
        self.queues = [self.queue]  # deleted last, child first
        plane.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns, "labels": labels}}
        )

    def set_quota(self, quota: dict[str, int], parent: str = "", wait: bool = True) -> None:
        """Write the queue with ``quota``; ``wait``: until Volcano shows it Open (a new queue)."""
        self.quota = quota
        queue = card_queue(self.queue, quota)
        if self.mode != "deny":
            queue["metadata"]["annotations"][keys.OVER_QUOTA] = self.mode
        if parent:
            queue["spec"]["parent"] = parent
        self.plane.kubectl("apply", "-f", "-", stdin=json.dumps(queue))
        if wait:
            wait_for(f"queue {self.queue} to be Open", lambda: self._queue_state() == "Open", timeout=30)

    def _queue_state(self) -> str:
        queue = self.plane.get("queue", self.queue)
        return str((queue.get("status") or {}).get("state") or "")

    def pods(self, finished: bool = False) -> list[dict[str, Any]]:
        """The tenant's live pods (``finished``: those that ran to the end too)."""
        return [
            p
            for p in self.plane.get("pods", namespace=self.ns)["items"]
            if (finished or (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
            and not p["metadata"].get("deletionTimestamp")
        ]

    def use(self, finished: bool = False) -> Counter[str]:
        """Cards in use per model by this tenant's bound pods, from the nodes they are bound to."""
        used: Counter[str] = Counter()
        for pod in self.pods(finished):
            node = pod["spec"].get("nodeName")
            if not node:
                continue
            for container in pod["spec"]["containers"]:
                for resource, value in (container.get("resources") or {}).get("limits", {}).items():
                    if (node, resource) in NODE_MODELS:
                        used[NODE_MODELS[(node, resource)]] += int(value)
        return used

    def settled(self, pods: int) -> bool:
        self.plane._check_alive()  # a dead scheduler binds nothing: say so at once, with its log
        found = self.pods()
        return len(found) == pods and all(p["spec"].get("nodeName") for p in found)

    def wait_settled(self, pods: int, timeout: float = 90, refused: str = "") -> None:
        """Until exactly ``pods`` live pods exist, every one bound. ``refused``: a workload the
        webhook refuses pods of; then its refusal is awaited too, and the count must still hold after
        it: the pods it did not get were refused, not late."""
        wait_for(f"{pods} pods of {self.ns}, every one bound", lambda: self.settled(pods), timeout=timeout)
        if refused:
            wait_for(f"the refusal of {refused} in {self.ns}", lambda: any_refused(self, refused), timeout=30)
            assert self.settled(pods), [p["metadata"]["name"] for p in self.pods()]

    def check_agreement(self, gated_too: bool = False) -> None:
        """Every pod bound (``gated_too``: but those held under our gate), no model over the quota,
        every assigned pod on its own model."""
        pods = [p for p in self.pods() if not (gated_too and gated(p))]
        pending = [
            (p["metadata"]["name"], p["metadata"]["annotations"].get("volcano.sh/card.name"))
            for p in pods
            if not p["spec"].get("nodeName")
        ]
        assert not pending, f"pods left Pending: {pending}; bound: {sorted(self.use().items())}"
        use = self.use()
        over = {card: n for card, n in use.items() if n > self.quota.get(card, 0)}
        assert not over, f"over quota {self.quota}: {dict(use)}"
        for pod in pods:
            card = pod["metadata"]["annotations"]["volcano.sh/card.name"]
            assert "|" not in card, f"pod {pod['metadata']['name']} was left with {card}"

    def denials(self) -> list[str]:
        events = self.plane.get("events", namespace=self.ns)["items"]
        return [e["message"] for e in events if e.get("reason") in ("FailedCreate", "FailedRescale")]

    def delete(self) -> None:
        """The namespace; the tenant is gone when its pods and PodGroups are (they hold cards and
        queue shares). Its queues go in the background once the namespace has (``reap_queues``).
        The namespace controller starts on a deleted namespace's content only after 5 s: the pods and
        PodGroups are deleted at once here (a terminating namespace takes no new ones)."""
        self.plane.kubectl("delete", "namespace", self.ns, "--wait=false", check=False)
        kinds = "pods,podgroups.scheduling.volcano.sh"
        self.plane.kubectl("delete", kinds, "--all", "-n", self.ns, "--wait=false", check=False)

        def gone() -> bool:
            return not any(self.plane.get(kind, namespace=self.ns)["items"] for kind in ("pods", "podgroups"))

        wait_for(f"the pods and PodGroups of {self.ns} to go", gone, timeout=120)
        self.plane.reap_queues(self.ns, self.queues)


def card_template(spec: str, queue: str, gpus: int = 1) -> dict[str, Any]:
    first = spec.split("|")[0].strip()
    resource = RESOURCE.get(first, "nvidia.com/gpu")
    container = {
        "name": "main",
        "image": "registry.example/app:1",
        "resources": {"limits": {resource: str(gpus)}, "requests": {"cpu": "100m"}},
    }
    annotations = {"volcano.sh/card.name": spec, "scheduling.volcano.sh/queue-name": queue}
    return {
        "metadata": {"annotations": annotations},
        "spec": {"schedulerName": "volcano", "containers": [container]},
    }


def flex_deployment(name: str, replicas: int, spec: str, queue: str, gpus: int = 1) -> dict[str, Any]:
    return deployment_of(name, replicas, card_template(spec, queue, gpus))


def volcano_job(name: str, replicas: int, spec: str, queue: str) -> dict[str, Any]:
    template = card_template(spec, queue)
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano",
            "queue": queue,
            "minAvailable": replicas,
            "tasks": [{"name": "w", "replicas": replicas, "template": template}],
        },
    }


def long_job(name: str, replicas: int, spec: str, queue: str) -> dict[str, Any]:
    """A Volcano Job whose pods run for an hour on kwok (they would succeed at once otherwise)."""
    job = volcano_job(name, replicas, spec, queue)
    job["spec"]["tasks"][0]["template"]["metadata"]["annotations"][RUNS_FOR] = "1h"
    return job


def app(name: str, replicas: int, card: str, t: Tenant, **annotations: str) -> dict[str, Any]:
    template = card_template(card, t.queue)
    template["metadata"]["annotations"].update(annotations)
    return deployment_of(name, replicas, template)


def batch_job(name: str, pods: int, card: str, t: Tenant) -> dict[str, Any]:
    """A batch/v1 Job of ``pods`` card pods, all at once (its parallelism and completions)."""
    template = card_template(card, t.queue)
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "template": template},
    }


def pods_of(t: Tenant, name: str, finished: bool = False) -> list[dict[str, Any]]:
    return [p for p in t.pods(finished) if p["metadata"]["name"].startswith(f"{name}-")]


def refused(t: Tenant, name: str) -> bool:
    return any(name in message and t.queue in message for message in t.denials())


def any_refused(t: Tenant, name: str) -> bool:
    """A denial of ``name``'s pods, naming any queue (an ancestor's, say)."""
    return any(f"{name}-" in message or f"/{name}" in message for message in t.denials())


def gated(pod: dict[str, Any]) -> bool:
    """Held under the webhook's scheduling gate (wait mode)."""
    return any(g.get("name") == keys.GATE for g in pod["spec"].get("schedulingGates") or [])


class Case:
    """A queue of one card, full: a hog holds it, and ``web`` (a Deployment, or with ``job`` a batch
    Job) is refused (deny mode) or its pods are held under our gate (wait mode)."""

    def __init__(
        self, t: Tenant, card: str, hog: Callable[[Tenant], dict[str, Any]], web: int = 1, job: bool = False
    ) -> None:
        self.t, self.web, self.job = t, web, job
        t.set_quota({card: 1})
        t.plane.apply(hog(t), namespace=t.ns)
        wait_for(f"the hog of {t.ns} to be bound", lambda: t.settled(1), timeout=60)
        workload = batch_job("web", web, card, t) if job else app("web", web, card, t)
        t.plane.apply(workload, namespace=t.ns)
        if t.mode == "wait":  # one pod held; more would keep its PodGroup from being enqueued
            held = lambda: len([p for p in pods_of(t, "web") if gated(p)]) == 1  # noqa: E731
            wait_for(f"web of {t.ns} to be held under the gate", held, timeout=30)
            if web > 1:
                wait_for(f"the rest of web of {t.ns} to be refused", lambda: refused(t, "web"), timeout=30)
        else:
            wait_for(f"web of {t.ns} to be refused", lambda: refused(t, "web"), timeout=30)

    def pods(self) -> list[dict[str, Any]]:
        """Its pods; a batch Job's that ran to the end too (kwok completes a Job's pods at once)."""
        return pods_of(self.t, "web", finished=self.job)

    def has_its_pods(self) -> bool:
        """Deny mode: its missing pods exist. Wait mode: they are released (ungated)."""
        return len([p for p in self.pods() if not gated(p)]) == self.web

    def ready(self) -> bool:
        """What must hold within 2 s of the cards freeing: deny mode, the pods exist (the
        scheduler binds them next); wait mode, they are released and bound."""
        return self.has_its_pods() if self.t.mode == "deny" else self.bound()

    def bound(self) -> bool:
        return self.has_its_pods() and all(p["spec"].get("nodeName") for p in self.pods())


def hog_pod(card: str) -> Callable[[Tenant], dict[str, Any]]:
    def make(t: Tenant) -> dict[str, Any]:
        template = card_template(card, t.queue)
        template["spec"]["restartPolicy"] = "Never"
        metadata = {"name": "hog", **template["metadata"]}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}

    return make


def hog_deployment(card: str) -> Callable[[Tenant], dict[str, Any]]:
    return lambda t: app("hog", 1, card, t)


def roll(t: Tenant, name: str) -> None:
    """A rolling update of the Deployment ``name``: a new template revision."""
    patch = {"spec": {"template": {"metadata": {"annotations": {"example.com/revision": str(time.time())}}}}}
    t.plane.kubectl("patch", "-n", t.ns, f"deployment/{name}", "--type=merge", "-p", json.dumps(patch))


def rolled_out(t: Tenant, name: str) -> bool:
    """What ``kubectl rollout status`` waits for: every replica updated and available, none old."""
    deployment = t.plane.get("deployment", name, namespace=t.ns)
    status, want = deployment.get("status") or {}, deployment["spec"]["replicas"]
    return (
        status.get("observedGeneration", 0) >= deployment["metadata"]["generation"]
        and status.get("updatedReplicas") == want
        and status.get("replicas") == want
        and status.get("availableReplicas") == want
    )

"""Dynamic Resource Allocation (resource.k8s.io/v1) under each real Volcano partner.

First the partner alone (no webhook in that namespace): a pod's ResourceClaimTemplate becomes its
claim (kube-controller-manager's resourceclaim controller), the partner's predicates allocate it
from a kwok node's ResourceSlice and reserve it for the pod, which kwok then runs. A claim no device
matches, or one past the devices left, keeps its pod Pending; a freed claim's devices go to the next
pod; a device-plugin pod still runs beside them.

Then with the webhook in front (SPEC §4b, §6b), on kwok nodes whose GPUs only slices publish:
device-plugin and DRA pods share one quota exactly, through a per-model class, a request selector,
a generic class with card.name (the claim pinned at its create), firstAvailable as A|B, a shared
claim, MIG; All refused; a scale-up refused; a refused DRA workload served by the waiting line.
Every admitted pod bound and its claim allocated on the model it was charged for. An allocation of
another model refused, hand-written or the scheduler's own (the partner's, and kube-scheduler's
beside it, each trying again until it allocates the charged model), and what the allocation rule
costs their time from create to bind. A webhook restarted after a running pod's class was deleted
charges the pod the devices its claim was allocated."""

import contextlib
import http.client
import json
import os
import random
import signal
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.agreement import Tenant
from tests.e2e.cluster import RUNS_FOR, ControlPlane, holds_for, soak_seed, wait_for
from tests.e2e.conftest import partner_plane
from tests.e2e.objects import deployment_of, editor_rights, hpa
from tests.e2e.registration import configurations
from tests.edges.serving import Process

DRIVER = "gpu.nvidia.com"
NODE = "h200-mig-0"
NS = "dra"
QUEUE = "dra"


@pytest.fixture(scope="module", params=["fork", "stock"])
def volcano(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """Each partner's plane (named as conftest's lanes expect: one lane per partner)."""
    with partner_plane(request.param, tmp_path_factory) as made:
        made.apply(*inventory())
        yield made


def inventory() -> list[dict[str, Any]]:
    """NVIDIA's DeviceClass, 4 H200 published on ``NODE`` as its driver would, a queue, templates."""
    device = {
        "attributes": {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"}},
        "capacity": {"memory": {"value": "80Gi"}},
    }
    devices = [
        {
            **device,
            "name": f"gpu-{i}",
            "attributes": {**device["attributes"], "uuid": {"string": f"GPU-{uuid.uuid4()}"}},
        }
        for i in range(4)
    ]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
                        }
                    }
                ]
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-{DRIVER}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        },
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {  # the fork's capacity-card plugin admits a card-less job only within the queue's capability
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": QUEUE, "annotations": {"volcano.sh/card.quota": '{"NVIDIA-H200": 4}'}},
            "spec": {"weight": 1, "capability": {"cpu": "100", "memory": "1Ti"}},
        },
        template("two-gpus"),
        template("two-b200", "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"),
    ]


def template(name: str, selector: str = "") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 2}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}},
    }


def pod(name: str, claim_template: str = "", gpus: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "busybox",
        "resources": {"requests": {"cpu": "100m"}},
    }
    spec: dict[str, Any] = {"schedulerName": "volcano", "containers": [container]}
    annotations = {"scheduling.volcano.sh/queue-name": QUEUE}
    if claim_template:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": claim_template}]
        container["resources"]["claims"] = [{"name": "gpus"}]
    if gpus:
        container["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
        annotations["volcano.sh/card.name"] = "NVIDIA-H200"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
    }


def claim_of(plane: ControlPlane, name: str) -> dict[str, Any] | None:
    claims = plane.get("resourceclaims", namespace=NS)["items"]
    return next((c for c in claims if c["metadata"]["ownerReferences"][0]["name"] == name), None)


def running(plane: ControlPlane, name: str) -> dict[str, Any] | None:
    got = plane.get("pod", name, namespace=NS)
    return got if got["status"].get("phase") == "Running" else None


def test_claims_are_allocated_reserved_and_run_and_the_rest_wait(volcano: ControlPlane) -> None:
    plane = volcano
    plane.apply(pod("dra-a", "two-gpus"), pod("dra-b", "two-gpus"), pod("plain-gpu", gpus=2), namespace=NS)
    held: set[str] = set()
    for name in ("dra-a", "dra-b"):
        ran = wait_for(f"{name} running", lambda name=name: running(plane, name), timeout=60)
        assert ran["spec"]["nodeName"] == NODE
        claim = claim_of(plane, name)
        assert (
            claim is not None
            and claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpus"
        )
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"]) for r in results] == [(DRIVER, NODE)] * 2
        held |= {r["device"] for r in results}
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [ran["metadata"]["uid"]]
    assert held == {f"gpu-{i}" for i in range(4)}
    wait_for("the device-plugin pod running", lambda: running(plane, "plain-gpu"), timeout=60)

    plane.apply(pod("dra-c", "two-gpus"), pod("dra-x", "two-b200"), namespace=NS)
    wait_for("dra-c's and dra-x's claims", lambda: claim_of(plane, "dra-c") and claim_of(plane, "dra-x"))
    holds_for(
        "dra-c (no device left) and dra-x (no B200) Pending, their claims unallocated",
        lambda: all(
            plane.get("pod", n, namespace=NS)["status"]["phase"] == "Pending"
            and "allocation" not in (claim_of(plane, n) or {}).get("status", {})
            for n in ("dra-c", "dra-x")
        ),
        seconds=8,
    )
    plane.kubectl("delete", "pod", "dra-a", "-n", NS, "--wait=false")
    wait_for("dra-c running on dra-a's devices", lambda: running(plane, "dra-c"), timeout=60)
    assert plane.get("pod", "dra-x", namespace=NS)["status"]["phase"] == "Pending"
    plane.kubectl("delete", "pods", "--all", "-n", NS, "--wait=false")
    wait_for(
        "the partner test's pods to go", lambda: not plane.get("pods", namespace=NS)["items"], timeout=120
    )


# ---- with the webhook in front -------------------------------------------------------------------
H200, R4090 = "NVIDIA-H200", "NVIDIA-GeForce-RTX-4090"
MIG = "NVIDIA-H200/mig-1g.18gb-mixed"
PRODUCTS = {"NVIDIA H200": H200, "NVIDIA GeForce RTX 4090": R4090}
DRA_NODES = {"dra-h200-0": "NVIDIA H200", "dra-4090-0": "NVIDIA GeForce RTX 4090"}
IS = "device.attributes['gpu.nvidia.com'].productName == '{}'"
# After this long refused, a ReplicaSet's own retries are more than 5 s apart (its back-off doubles
# from 5 ms: 20 s of refusals reach 10 s or more).
BACKED_OFF = 25.0


def dra_node(name: str) -> dict[str, Any]:
    """A kwok node with no GPU labels and no GPU in allocatable: its GPUs are in its slice."""
    allocatable = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"type": "kwok", "kubernetes.io/hostname": name},
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": []},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


def dra_slice(node: str, product: str, gpus: int, mig: int = 0) -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": product},
                "uuid": {"string": f"GPU-{node}-{i}"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(gpus)
    ]
    devices += [
        {
            "name": f"gpu-{gpus}-mig-1g18gb-19-{i}",
            "attributes": {
                "type": {"string": "mig"},
                "productName": {"string": product},
                "profile": {"string": "1g.18gb"},
                "uuid": {"string": f"MIG-{node}-{i}"},
            },
            "capacity": {"memory": {"value": "18Gi"}},
        }
        for i in range(mig)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class(name: str, expression: str, card: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if card:
        meta["annotations"] = {"cardquota.volcano.sh/card": card}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": meta,
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def apply_all(plane: ControlPlane, items: list[dict[str, Any]]) -> None:
    """``kubectl apply`` of cluster-scoped objects (created, or left as they are)."""
    plane.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


@pytest.fixture(scope="module")
def dra(volcano: ControlPlane, front: Process) -> ControlPlane:
    """The DRA nodes, their slices and the classes, once per plane, with the webhook serving."""
    volcano.apply(*(dra_node(n) for n in DRA_NODES))
    apply_all(
        volcano,
        [
            dra_slice("dra-h200-0", "NVIDIA H200", 2, mig=2),
            dra_slice("dra-4090-0", "NVIDIA GeForce RTX 4090", 2),
            device_class(
                "mig.nvidia.com",
                f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'",
            ),
            device_class(
                "h200.nvidia.com", f"device.driver == '{DRIVER}' && {IS.format('NVIDIA H200')}", H200
            ),
        ],
    )

    def ready() -> bool:
        return all(
            any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in volcano.get("node", n)["status"].get("conditions", [])
            )
            for n in DRA_NODES
        )

    wait_for("kwok to mark the DRA nodes Ready", ready, timeout=60)
    return volcano


class DraTenant(Tenant):
    """A tenant whose queue has a CPU capability too (the fork's plugin admits a pod that asks no
    card resource only within it)."""

    def set_quota(self, quota: dict[str, int], parent: str = "") -> None:
        super().set_quota(quota, parent)
        self.plane.kubectl(
            "patch",
            "queue",
            self.queue,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"capability": {"cpu": "100", "memory": "1Ti"}}}),
        )

    def template(self, name: str, *requests: dict[str, Any]) -> None:
        self.plane.apply(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": name},
                "spec": {"spec": {"devices": {"requests": list(requests)}}},
            },
            namespace=self.ns,
        )

    def claim(self, name: str, *requests: dict[str, Any]) -> None:
        self.plane.apply(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": list(requests)}},
            },
            namespace=self.ns,
        )

    def pod(
        self,
        name: str,
        *,
        card: str = "",
        template: str = "",
        claim: str = "",
        gpus: int = 0,
        queue: str = "",
    ) -> dict[str, Any]:
        obj = pod(name, template, gpus)
        obj["metadata"]["annotations"] = {"scheduling.volcano.sh/queue-name": queue or self.queue}
        if card:  # the fork's plugin asks a pod naming volcano.sh/card.name for its nvidia.com/gpu
            key = "volcano.sh/card.name" if gpus else "cardquota.volcano.sh/card"
            obj["metadata"]["annotations"][key] = card
        if claim:
            obj["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
            obj["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
        return obj

    def create(self, obj: dict[str, Any]) -> str:
        """Create ``obj``; "" when admitted, else the API server's refusal."""
        done = self.plane.kubectl("create", "-n", self.ns, "-f", "-", stdin=json.dumps(obj), check=False)
        return "" if done.returncode == 0 else done.stderr

    def claims(self) -> list[dict[str, Any]]:
        return self.plane.get("resourceclaims", namespace=self.ns)["items"]

    def allocated(self, pod_name: str) -> list[str]:
        """The cards of the devices allocated to the claims ``pod_name`` uses, once allocated."""
        got = self.plane.get("pod", pod_name, namespace=self.ns)
        names = [s.get("resourceClaimName") for s in got.get("status", {}).get("resourceClaimStatuses", [])]
        names += [
            r["resourceClaimName"]
            for r in got["spec"].get("resourceClaims", [])
            if r.get("resourceClaimName")
        ]
        cards = []
        for claim in self.claims():
            if claim["metadata"]["name"] in names:
                for result in (
                    (claim.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", [])
                ):
                    cards.append(device_card(self.plane, result["pool"], result["device"]))
        return cards

    def wait_running(self, name: str) -> dict[str, Any]:
        return wait_for(f"{name} running", lambda: running_in(self.plane, self.ns, name), timeout=90)


def running_in(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    got = plane.get("pod", name, namespace=namespace)
    return got if got["status"].get("phase") == "Running" and got["spec"].get("nodeName") else None


def device_card(plane: ControlPlane, pool: str, device: str) -> str:
    """The card a published device is (what the webhook names it)."""
    for found in plane.get("resourceslices")["items"]:
        if found["spec"]["pool"]["name"] != pool:
            continue
        for d in found["spec"].get("devices", []):
            if d["name"] == device:
                product = PRODUCTS.get(d["attributes"]["productName"]["string"], A100)
                kind = d["attributes"]["type"]["string"]
                if kind in ("gpu", "hami-gpu"):
                    return product
                return f"{product}/mig-{d['attributes']['profile']['string']}-mixed"
    raise AssertionError(f"no device {pool}/{device}")


def exactly(
    name: str = "gpu", device_class_name: str = DRIVER, count: int = 1, *selectors: str, **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "deviceClassName": device_class_name,
        **({"count": count} if count else {}),
        **extra,
    }
    if selectors:
        spec["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": spec}


@pytest.fixture
def t(dra: ControlPlane) -> Iterator[DraTenant]:
    made = DraTenant(dra)
    yield made
    made.delete()


def test_device_plugin_and_dra_pods_share_one_quota_and_every_claim_gets_its_model(t: DraTenant) -> None:
    t.set_quota({H200: 3})
    t.template("per-model", exactly("gpu", "h200.nvidia.com", 1))
    t.template("selector", exactly("gpu", DRIVER, 1, IS.format("NVIDIA H200")))
    assert t.create(t.pod("plugin", card=H200, gpus=1)) == ""
    assert t.create(t.pod("per-model", template="per-model")) == ""
    assert t.create(t.pod("selector", template="selector")) == ""
    refused = t.create(t.pod("past", template="per-model"))
    assert f'queue "{t.queue}" has 0 NVIDIA-H200 left (quota 3: ' in refused, refused
    assert "pod " in refused and "(claim gpus from template per-model: 1 NVIDIA-H200) needs 1" in refused
    for name in ("plugin", "per-model", "selector"):
        t.wait_running(name)
    assert t.allocated("per-model") == [H200] and t.allocated("selector") == [H200]
    refused = t.create(t.pod("plugin-past", card=H200, gpus=1))
    assert "has 0 NVIDIA-H200 left" in refused, refused


def test_a_generic_class_with_card_name_is_pinned_and_allocated_on_that_model(t: DraTenant) -> None:
    t.set_quota({R4090: 1})
    t.template("any-gpu", exactly())
    assert t.create(t.pod("infer", card=R4090, template="any-gpu")) == ""
    ran = t.wait_running("infer")
    assert ran["spec"]["nodeName"] == "dra-4090-0"
    assert t.allocated("infer") == [R4090]
    (claim,) = t.claims()
    selectors = [
        s["cel"]["expression"] for s in claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    ]
    assert selectors == [IS.format("NVIDIA GeForce RTX 4090")]
    refused = t.create(t.pod("infer-2", card=R4090, template="any-gpu"))
    assert "has 0 NVIDIA-GeForce-RTX-4090 left" in refused, refused
    # Without card.name the class's request may get any model its devices are: an A|B pod, for
    # which no model has room here (RTX-4090 used up, no H200 quota).
    no_model = t.create(t.pod("no-model", template="any-gpu"))
    assert "NVIDIA-GeForce-RTX-4090 (0 left)" in no_model and "NVIDIA-H200" in no_model, no_model


def test_first_available_is_a_choice_of_models_and_the_claim_keeps_the_one_assigned(t: DraTenant) -> None:
    t.set_quota({H200: 0, R4090: 1})
    t.template(
        "either",
        {
            "name": "gpu",
            "firstAvailable": [
                {
                    "name": "h200",
                    "deviceClassName": DRIVER,
                    "count": 1,
                    "selectors": [{"cel": {"expression": IS.format("NVIDIA H200")}}],
                },
                {
                    "name": "r4090",
                    "deviceClassName": DRIVER,
                    "count": 1,
                    "selectors": [{"cel": {"expression": IS.format("NVIDIA GeForce RTX 4090")}}],
                },
            ],
        },
    )
    assert t.create(t.pod("flex", template="either")) == ""
    ran = t.wait_running("flex")
    assert ran["metadata"]["annotations"]["cardquota.volcano.sh/card"] == R4090
    assert t.allocated("flex") == [R4090]
    (claim,) = t.claims()
    assert [s["name"] for s in claim["spec"]["devices"]["requests"][0]["firstAvailable"]] == ["r4090"]


def test_a_shared_claim_is_charged_once_and_refused_to_another_queue(t: DraTenant) -> None:
    t.set_quota({H200: 2})
    other = f"other-{t.ns}"
    t.plane.kubectl("apply", "-f", "-", stdin=json.dumps(card_queue_with_capability(other, {H200: 2})))
    t.queues.insert(0, other)
    t.claim("shared", exactly("gpu", "h200.nvidia.com", 1))
    assert t.create(t.pod("s1", claim="shared")) == ""
    assert t.create(t.pod("s2", claim="shared")) == ""
    for name in ("s1", "s2"):
        t.wait_running(name)
    (claim,) = t.claims()
    assert len(claim["status"]["reservedFor"]) == 2
    t.template("two", exactly("gpu", "h200.nvidia.com", 2))
    probe = t.create(t.pod("probe", template="two"))  # the shared claim counted once: 1 of 2 left
    assert f'queue "{t.queue}" has 1 NVIDIA-H200 left (quota 2: 1 running)' in probe, probe
    t.template("one", exactly("gpu", "h200.nvidia.com", 1))
    assert t.create(t.pod("third", template="one")) == ""  # the shared claim counted once: 1 of 2 left
    assert "has 0 NVIDIA-H200 left" in t.create(t.pod("fourth", template="one"))
    refused = t.create(t.pod("theirs", claim="shared", queue=other))
    assert "shares ResourceClaim" in refused and f"not to queue '{other}'" in refused, refused


def card_queue_with_capability(name: str, quota: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name, "annotations": {"volcano.sh/card.quota": json.dumps(quota)}},
        "spec": {"weight": 1, "capability": {"cpu": "100", "memory": "1Ti"}},
    }


def test_all_devices_is_refused_and_mig_is_its_own_card(t: DraTenant) -> None:
    t.set_quota({H200: 4, MIG: 1})
    t.template("every", exactly("gpu", DRIVER, 0, allocationMode="All"))
    every = t.pod("every", card=H200, template="every")
    every_template = t.plane.get("resourceclaimtemplate", "every", namespace=t.ns)
    assert every_template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] == "All"
    refused = t.create(every)
    assert "allocationMode All" in refused, refused
    t.template(
        "mig",
        exactly(
            "slice",
            "mig.nvidia.com",
            1,
            f"{IS.format('NVIDIA H200')} && device.attributes['gpu.nvidia.com'].profile == '1g.18gb'",
        ),
    )
    assert t.create(t.pod("mig-0", template="mig")) == ""
    t.wait_running("mig-0")
    assert t.allocated("mig-0") == [MIG]
    assert "has 0 NVIDIA-H200/mig-1g.18gb-mixed left" in t.create(t.pod("mig-1", template="mig"))


def dra_deployment(t: DraTenant, name: str, replicas: int, template: str) -> dict[str, Any]:
    shape = t.pod(name, template=template)
    return deployment_of(name, replicas, {"metadata": shape["metadata"], "spec": shape["spec"]})


def test_dra_scale_ups_are_refused_and_a_refused_workload_is_served_when_cards_free(t: DraTenant) -> None:
    t.set_quota({H200: 2})
    t.template("one", exactly("gpu", "h200.nvidia.com", 1))
    assert t.create(t.pod("holder", template="one")) == ""
    t.plane.apply(dra_deployment(t, "serve", 1, "one"), namespace=t.ns)
    wait_for(
        "serve's pod running",
        lambda: [
            p for p in t.pods() if p["metadata"]["name"].startswith("serve-") and p["spec"].get("nodeName")
        ],
        timeout=90,
    )
    t.plane.apply(hpa("serve", 2, 3), namespace=t.ns)
    wait_for(
        "the HPA's scale-up refused",
        lambda: [m for m in t.denials() if "scale-up of deployment" in m and "NVIDIA-H200" in m],
        timeout=120,
    )
    t.plane.kubectl("delete", "hpa", "serve", "-n", t.ns)
    refused = t.plane.kubectl("scale", "-n", t.ns, "deployment/serve", "--replicas=3", check=False)
    assert refused.returncode != 0 and f'queue "{t.queue}"' in refused.stderr, refused.stderr
    assert f"scale-up of deployment {t.ns}/serve from 1 to 3 replicas needs 2 NVIDIA-H200 (1 per pod)" in (
        refused.stderr
    ), refused.stderr
    # A workload created when its cards are taken: its pod is refused, its ReplicaSet waits in the
    # queue's line and is called the moment "holder" goes.
    t.plane.apply(dra_deployment(t, "late", 1, "one"), namespace=t.ns)
    wait_for("late's pod refused", lambda: any("late-" in m for m in t.denials()), timeout=60)
    # Long enough for its ReplicaSet's own retries to back off past the promise: what creates its
    # pod at once is the line's call, not a retry.
    time.sleep(BACKED_OFF)
    assert not [p for p in t.pods() if p["metadata"]["name"].startswith("late-")]
    t.plane.kubectl("delete", "pod", "holder", "-n", t.ns, "--wait=false")
    gone = time.monotonic()
    wait_for(
        "late's pod created",
        lambda: [p for p in t.pods() if p["metadata"]["name"].startswith("late-")],
        timeout=30,
        every=0.1,
    )
    took = time.monotonic() - gone
    assert took < 2.0, f"late's pod came {took:.1f} s after its cards freed"
    late = wait_for(
        "late's pod running",
        lambda: [
            p for p in t.pods() if p["metadata"]["name"].startswith("late-") and p["spec"].get("nodeName")
        ],
        timeout=90,
    )
    assert t.allocated(late[0]["metadata"]["name"]) == [H200]


def test_a_volcano_job_whose_tasks_claim_gpus_is_held_at_enqueue_until_they_fit(t: DraTenant) -> None:
    t.set_quota({H200: 2})
    t.template("one", exactly("gpu", "h200.nvidia.com", 1))
    assert t.create(t.pod("holder", template="one")) == ""
    shape = t.pod("w", template="one")
    shape["metadata"]["annotations"][RUNS_FOR] = "1h"
    shape["spec"]["restartPolicy"] = "Never"
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "schedulerName": "volcano",
            "queue": t.queue,
            "minAvailable": 2,
            "tasks": [
                {
                    "name": "w",
                    "replicas": 2,
                    "template": {"metadata": shape["metadata"], "spec": shape["spec"]},
                }
            ],
        },
    }
    assert t.create(job) == ""

    def job_pods() -> list[dict[str, Any]]:
        return [p for p in t.pods() if p["metadata"]["name"].startswith("train-")]

    def group() -> dict[str, Any] | None:
        groups = t.plane.get("podgroups", namespace=t.ns)["items"]
        return next(
            (g for g in groups if g["metadata"].get("ownerReferences", [{}])[0].get("kind") == "Job"), None
        )

    wait_for("the job's PodGroup", group, timeout=60)
    assert json.loads(group()["metadata"]["annotations"]["volcano.sh/card.request"]) == {H200: 2}  # type: ignore[index]
    holds_for(
        "the job held: its PodGroup not enqueued, none of its pods bound",
        lambda: (
            (group() or {}).get("status", {}).get("phase") in (None, "Pending")
            and not [p for p in job_pods() if p["spec"].get("nodeName")]
        ),
        seconds=6,
    )
    t.plane.kubectl("delete", "pod", "holder", "-n", t.ns, "--wait=false")
    wait_for(
        "both job pods running",
        lambda: len([p for p in job_pods() if p["spec"].get("nodeName")]) == 2,
        timeout=90,
    )
    for p in job_pods():
        wait_for("its claim allocated", lambda p=p: t.allocated(p["metadata"]["name"]), timeout=30)
        assert t.allocated(p["metadata"]["name"]) == [H200]


# ---- seeded soak: device-plugin and DRA pods in one queue ----------------------------------------
def in_use(t: DraTenant) -> Counter[str]:
    """What the cluster shows the tenant's bound pods hold, by model: the cards of the devices
    allocated to their claims, or their node's model times their nvidia.com/gpu."""
    use: Counter[str] = Counter()
    for found in t.pods():
        node = found["spec"].get("nodeName")
        if not node:
            continue
        if found["spec"].get("resourceClaims"):
            use.update(t.allocated(found["metadata"]["name"]))
            continue
        product = t.plane.get("node", node)["metadata"]["labels"]["nvidia.com/gpu.product"]
        limits = found["spec"]["containers"][0]["resources"].get("limits", {})
        use[product] += int(limits.get("nvidia.com/gpu", 0))
    return use


DRA_GPUS = {H200: 2, R4090: 2}  # whole GPUs the DRA nodes' slices publish (dra_slice above)


def dra_held(live: dict[str, str], card: str) -> int:
    """The DRA GPUs of ``card`` the soak's live pods hold."""
    return sum(
        SOAK_KINDS[k][1] for k in live.values() if SOAK_KINDS[k][0] == card and SOAK_KINDS[k][2] != "plugin"
    )


SOAK_KINDS = {  # kind -> (card, cards per pod, how it asks)
    "plugin-h200": (H200, 1, "plugin"),
    "plugin-4090": (R4090, 1, "plugin"),
    "class-h200": (H200, 1, "one"),
    "class-h200-x2": (H200, 2, "two"),
    "generic-4090": (R4090, 1, "any"),
}


def test_a_seeded_soak_of_device_plugin_and_dra_pods_keeps_every_model_within_quota(
    t: DraTenant, request: pytest.FixtureRequest
) -> None:
    """Random creates and deletes of pods of both forms: every create is admitted exactly when the
    test's own count says it fits; after each step every admitted pod is bound, and what the cluster
    itself shows in use (each bound pod's allocated devices, or its node's model times its
    nvidia.com/gpu) is the test's count, model by model, within the quota."""
    seed = soak_seed(request.node)
    rng = random.Random(seed)
    quota = {H200: rng.randint(1, 3), R4090: rng.randint(1, 2)}
    t.set_quota(quota)
    t.template("one", exactly("gpu", "h200.nvidia.com", 1))
    t.template("two", exactly("gpu", "h200.nvidia.com", 2))
    t.template("any", exactly())
    live: dict[str, str] = {}  # pod -> its kind
    log: list[str] = []
    try:
        for n in range(16):
            used = Counter({card: 0 for card in quota})
            for kind in live.values():
                used[SOAK_KINDS[kind][0]] += SOAK_KINDS[kind][1]
            if live and rng.random() < 0.35:
                name = rng.choice(sorted(live))
                t.plane.kubectl("delete", "pod", name, "-n", t.ns, "--wait=false")
                # gone with its PodGroup (a bare pod's: until then it still reserves the pod's cards)
                wait_for(
                    f"{name} and its PodGroup gone",
                    lambda name=name: (
                        not [p for p in t.pods() if p["metadata"]["name"] == name]
                        and len(t.plane.get("podgroups", namespace=t.ns)["items"]) == len(live) - 1
                    ),
                    timeout=60,
                )
                log.append(f"delete {name}")
                del live[name]
                continue
            kind = rng.choice(sorted(SOAK_KINDS))
            card, per_pod, how = SOAK_KINDS[kind]
            if how != "plugin" and dra_held(live, card) + per_pod > DRA_GPUS[card]:
                kind = next(k for k, v in SOAK_KINDS.items() if v[2] == "plugin" and v[0] == card)
                card, per_pod, how = SOAK_KINDS[kind]  # the DRA nodes are full: the quota is not the test
            name = f"{kind}-{n}"
            obj = (
                t.pod(name, card=card, gpus=per_pod)
                if how == "plugin"
                else t.pod(name, template=how, card=card if how == "any" else "")
            )
            fits = used[card] + per_pod <= quota[card]
            refused = t.create(obj)
            log.append(
                f"create {name}: {'refused' if refused else 'admitted'} ({used[card]}+{per_pod} of {quota[card]})"
            )
            assert (refused == "") == fits, refused
            if refused:
                assert f'queue "{t.queue}"' in refused and card in refused, refused
                continue
            live[name] = kind
            for each in live:
                t.wait_running(each)
            if how != "plugin":
                wait_for(f"{name}'s claim allocated", lambda name=name: t.allocated(name), timeout=30)
            expected = Counter({c: 0 for c in quota})
            for each in live.values():
                expected[SOAK_KINDS[each][0]] += SOAK_KINDS[each][1]
            assert in_use(t) == expected, (in_use(t), expected)
            assert all(expected[c] <= quota[c] for c in quota)
    except BaseException as exc:
        raise AssertionError(f"DRA soak seed {seed}, quota {quota}, after: {log}") from exc


def test_a_claim_larger_than_its_pod_was_admitted_with_is_refused(t: DraTenant) -> None:
    """The template is replaced by a larger one between the pod's admission and the claim's
    creation (kube-controller-manager stopped meanwhile): the claim made from the new template, as
    the resource claim controller makes it, is refused at its create; whatever the controller makes
    once it runs again (from its own copy of the template, old or new), the pod never holds a claim
    larger than it was admitted with; and once the template asks what the pod was admitted with
    again, its claim is made (a check that passed with no claim at all would prove nothing)."""
    t.set_quota({H200: 2})
    t.template("grow", exactly("gpu", "h200.nvidia.com", 1))
    manager = t.plane.procs["kube-controller-manager"]
    manager.send_signal(signal.SIGSTOP)
    try:
        assert t.create(t.pod("grown", template="grow")) == ""
        # replaced at once, whether the webhook's cache has seen the pod yet or not: it is charged
        # what it was admitted with (the in-flight hold carries it), never the template at arrival
        t.plane.kubectl("delete", "resourceclaimtemplate", "grow", "-n", t.ns)
        t.template("grow", exactly("gpu", "h200.nvidia.com", 2))
        uid = t.plane.get("pod", "grown", namespace=t.ns)["metadata"]["uid"]
        made = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": "grown-gpus-",
                "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": "grown", "uid": uid, "controller": True}
                ],
            },
            "spec": {"devices": {"requests": [exactly("gpu", "h200.nvidia.com", 2)]}},
        }
        refused = t.create(made)
        assert "asks 2 NVIDIA-H200, but the pod was admitted with 1 for its claim gpus" in refused, refused
        assert "its template grow asks more" in refused, refused
    finally:
        manager.send_signal(signal.SIGCONT)

    def asked() -> list[int]:
        return [
            r["exactly"].get("count", 1)
            for claim in t.claims()
            if claim["metadata"]["ownerReferences"][0]["name"] == "grown"
            for r in claim["spec"]["devices"]["requests"]
        ]

    holds_for(
        "no claim of the pod asks more than it was admitted with",
        lambda: max(asked(), default=0) <= 1,
        seconds=5,
    )
    # The controller may have made none yet: each try from its copy of the new template is refused,
    # and it tries again with a growing backoff (about 5 s apart by now, then 10, 20). The template as
    # the pod was admitted with it: the claim it makes then passes, and is the pod's only one.
    t.plane.kubectl("delete", "resourceclaimtemplate", "grow", "-n", t.ns)
    t.template("grow", exactly("gpu", "h200.nvidia.com", 1))
    made_claims = wait_for("the pod's claim made, of 1 H200", lambda: asked() or None, timeout=60)
    assert made_claims == [1], made_claims


def test_a_running_pods_charge_cannot_be_edited_away(t: DraTenant) -> None:
    """SPEC §4b, a charge lives as long as its pod: a tenant's ``kubectl annotate`` of a running
    device-plugin or DRA pod's card or queue is refused with our message, and the next pod past the
    quota is still refused; so it is after the DeviceClass that gave a running pod its model is
    deleted."""
    t.set_quota({H200: 2})
    doomed = f"h200-{t.ns}.nvidia.com"
    apply_all(
        t.plane, [device_class(doomed, f"device.driver == '{DRIVER}' && {IS.format('NVIDIA H200')}", H200)]
    )
    t.template("doomed", exactly("gpu", doomed, 1))
    t.plane.apply(*editor_rights("mallory"), namespace=t.ns)
    try:
        assert t.create(t.pod("plugin", card=H200, gpus=1)) == ""
        assert t.create(t.pod("claims", template="doomed")) == ""
        t.wait_running("plugin")
        t.wait_running("claims")
        tried = [
            ("plugin", "volcano.sh/card.name-", "is charged 1 NVIDIA-H200", "volcano.sh/card.name"),
            ("plugin", "scheduling.volcano.sh/queue-name=elsewhere", "is charged 1", "queue-name"),
            ("claims", f"cardquota.volcano.sh/card={R4090}", "is charged 1 NVIDIA-H200", "volcano.sh/card"),
            ("claims", "scheduling.volcano.sh/queue-name-", "is charged 1", "queue-name"),
        ]
        for name, change, charged, key in tried:
            done = t.plane.kubectl(
                "--as=mallory", "annotate", "-n", t.ns, f"pod/{name}", change, "--overwrite", check=False
            )
            assert done.returncode != 0, (change, done.stdout)
            assert f"pod {t.ns}/{name} {charged}" in done.stderr and f'to queue "{t.queue}"' in done.stderr, (
                done.stderr
            )
            assert key in done.stderr and "cannot change while the pod lives" in done.stderr, done.stderr
        annotations = t.plane.get("pod", "plugin", namespace=t.ns)["metadata"]["annotations"]
        assert annotations["volcano.sh/card.name"] == H200  # a refused edit changed nothing
        refused = t.create(t.pod("past", card=H200, gpus=1))
        assert f'queue "{t.queue}" has 0 NVIDIA-H200 left (quota 2: 2 running)' in refused, refused
        t.plane.kubectl("delete", "deviceclass", doomed)

        def still_full() -> bool:
            dry = t.plane.kubectl(
                "create",
                "--dry-run=server",
                "-n",
                t.ns,
                "-f",
                "-",
                stdin=json.dumps(t.pod("past", card=H200, gpus=1)),
                check=False,
            )
            return "has 0 NVIDIA-H200 left" in dry.stderr

        holds_for("the queue full with the running pod's class deleted", still_full, seconds=4)
    finally:
        t.plane.kubectl("delete", "deviceclass", doomed, "--ignore-not-found", check=False)


RESTARTED = {"cardquota-e2e-dra-restart": "on"}  # namespaces sent to the restart test's own webhook only


def test_a_pod_first_seen_after_a_restart_is_charged_its_allocated_devices_whatever_its_class(
    dra: ControlPlane, tmp_path: Path
) -> None:
    """SPEC §4b after a restart: a pod holds 2 H200 through a claim of a per-model class, in a queue
    of quota 2; the webhook process is stopped, the class deleted, a new webhook started. It reads
    the claim's allocation (its devices' cards through the slices), charges the pod its 2 H200, and
    the next pod is refused, as before the restart. Found: it charged the pod nothing (its class
    gone), and the next pod was admitted. The webhook is this test's own, for its namespace only, so
    that the module's goes on as it is."""
    t = DraTenant(dra, labels=RESTARTED)
    flags = ("--kubeconfig", str(dra.webhook_kubeconfig), "--drain-seconds", "0")
    first = Process(tmp_path / "certs", dra.logs / f"{t.ns}-webhook-1.log", *flags, cluster=None)
    registered: list[dict[str, Any]] = []
    doomed = f"h200-{t.ns}.nvidia.com"
    full = f'queue "{t.queue}" has 0 NVIDIA-H200 left (quota 2: 2 running)'
    started: list[Process] = [first]

    def refused(obj: dict[str, Any]) -> str:
        """A server-side dry run of ``obj``'s create: the refusal, "" when admitted."""
        dry = dra.kubectl(
            "create", "--dry-run=server", "-n", t.ns, "-f", "-", stdin=json.dumps(obj), check=False
        )
        return "" if dry.returncode == 0 else dry.stderr

    def past() -> list[dict[str, Any]]:
        """One more H200 of the queue, through the device plugin and through a claim."""
        return [t.pod("past", card=H200, gpus=1), t.pod("past-claim", template="one")]

    try:
        first.wait_ready(timeout=60)
        registered = configurations(
            first.url, first.certs / "ca.crt", RESTARTED, f"cq-{t.ns}", dra.webhook_user
        )
        dra.apply(*registered)
        t.set_quota({H200: 2})
        wait_for(
            "the API server to call the test's webhook",
            lambda: f'queue "{t.queue}" has 2 NVIDIA-H200 left' in refused(t.pod("probe", card=H200, gpus=3)),
            timeout=30,
        )
        apply_all(
            dra, [device_class(doomed, f"device.driver == '{DRIVER}' && {IS.format('NVIDIA H200')}", H200)]
        )
        t.template("doomed", exactly("gpus", doomed, 2))
        t.template("one", exactly("gpu", "h200.nvidia.com", 1))
        assert t.create(t.pod("holder", template="doomed")) == ""
        t.wait_running("holder")
        wait_for("the holder's claim allocated", lambda: t.allocated("holder"), timeout=30)
        assert t.allocated("holder") == [H200, H200]
        for obj in past():
            assert full in refused(obj), refused(obj)

        first.stop()
        dra.kubectl("delete", "deviceclass", doomed)  # while no webhook runs
        second = Process(
            first.certs, dra.logs / f"{t.ns}-webhook-2.log", *flags, cluster=None, port=first.port
        )
        started.append(second)
        second.wait_ready(timeout=60)  # ready: every kind listed, the class not among them
        for obj in past():
            wait_for(
                f"the new webhook to refuse {obj['metadata']['name']} past the quota",
                lambda obj=obj: full in refused(obj),
                timeout=30,
            )
        holds_for(
            "the queue full with the holder charged its 2 H200",
            lambda: all(full in refused(o) for o in past()),
            seconds=4,
        )
        assert second.figure("used", t.queue, H200) == 2
        dra.assert_no_rbac_refusal(second.log())
    finally:
        for config in registered:
            dra.kubectl("delete", config["kind"].lower(), config["metadata"]["name"], check=False)
        for process in started:
            process.stop()
        dra.kubectl("delete", "deviceclass", doomed, "--ignore-not-found", check=False)
        t.delete()


def test_an_enqueued_podgroups_request_cannot_be_raised(t: DraTenant) -> None:
    """SPEC §4b: a PodGroup's reservation was admitted at its enqueue; the tenant raising its
    card.request or moving its queue afterwards is refused, lowering it passes."""
    t.set_quota({H200: 2})
    t.plane.apply(*editor_rights("mallory"), namespace=t.ns)
    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "train", "annotations": {"volcano.sh/card.request": json.dumps({H200: 2})}},
        "spec": {"minMember": 1, "queue": t.queue},
    }
    t.plane.apply(group, namespace=t.ns)
    wait_for(
        "the PodGroup enqueued",
        lambda: t.plane.get("podgroup", "train", namespace=t.ns).get("status", {}).get("phase") == "Inqueue",
        timeout=30,
    )

    def annotate(*change: str) -> Any:
        args = ("--as=mallory", "annotate", "-n", t.ns, "podgroup/train", *change, "--overwrite")
        return t.plane.kubectl(*args, check=False)

    raised = annotate(f"volcano.sh/card.request={json.dumps({H200: 4})}")
    assert raised.returncode != 0
    assert (
        f'podgroup {t.ns}/train was enqueued in queue "{t.queue}" with 2 NVIDIA-H200: it cannot ask 4'
        " NVIDIA-H200 while it is Inqueue"
    ) in raised.stderr, raised.stderr
    moved = t.plane.kubectl(
        "--as=mallory",
        "patch",
        "-n",
        t.ns,
        "podgroup/train",
        "--type=merge",
        "-p",
        '{"spec":{"queue":"default"}}',
        check=False,
    )
    assert moved.returncode != 0 and 'it cannot move to queue "default"' in moved.stderr, moved.stderr
    assert annotate(f"volcano.sh/card.request={json.dumps({H200: 1})}").returncode == 0


def test_an_allocation_of_another_model_is_refused_and_the_schedulers_own_passes(t: DraTenant) -> None:
    """SPEC §4b, the allocation checked: a hand-written allocation (``kubectl --subresource=status``)
    giving a pod charged for an H200 an RTX 4090 is refused with our message; the scheduler's own
    allocations of the charged model pass (the pod runs on it)."""
    t.set_quota({H200: 2})
    t.claim("manual", exactly("gpu", "h200.nvidia.com", 1))
    held = t.pod("held", claim="manual")
    held["spec"]["schedulerName"] = "nobody"  # never scheduled: only the hand-written allocation
    assert t.create(held) == ""
    refused = write_allocation(t, "manual", "held", "dra-4090-0", "gpu-0")
    assert refused.returncode != 0
    assert (
        f"resourceclaim {t.ns}/manual: its allocation gives 1 NVIDIA-GeForce-RTX-4090 to pod {t.ns}/held,"
        " which was charged for NVIDIA-H200: refused" in refused.stderr
    ), refused.stderr
    assert "allocation" not in t.plane.get("resourceclaim", "manual", namespace=t.ns).get("status", {})
    t.template("per-model", exactly("gpu", "h200.nvidia.com", 1))
    assert t.create(t.pod("scheduled", template="per-model")) == ""
    t.wait_running("scheduled")
    assert t.allocated("scheduled") == [H200]


def write_allocation(t: DraTenant, claim: str, pod: str, pool: str, device: str, *flags: str) -> Any:
    """``kubectl patch --subresource=status``: claim ``claim`` given ``pool``/``device`` and reserved
    for pod ``pod``, as a scheduler writes it (``flags``: ``--dry-run=server`` to ask only)."""
    uid = t.plane.get("pod", pod, namespace=t.ns)["metadata"]["uid"]
    result = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
    status = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}],
    }
    patch = json.dumps({"status": status})
    args = ("patch", "resourceclaim", claim, "-n", t.ns, "--subresource=status", "--type=merge", "-p", patch)
    return t.plane.kubectl(*args, *flags, check=False)


# The webhooks of tests/e2e/registration.py a test takes out for a while
PIN_RULE = "claims.mutate.cardquota.volcano.sh"  # a pod's claim pinned to its model at its create
ALLOCATION_RULE = "allocations.validate.cardquota.volcano.sh"  # the allocation checked


@contextlib.contextmanager
def unregistered(
    plane: ControlPlane, hook: str, gone: Callable[[], bool], back: Callable[[], bool]
) -> Iterator[None]:
    """Meanwhile the webhook ``hook`` is out of its configuration, as if it had never been
    registered: from when the API server no longer calls it (``gone``) until it is back in its place
    and called again (``back``)."""
    found = [
        (kind, config["metadata"]["name"], index, each)
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
        for config in plane.get(kind)["items"]
        for index, each in enumerate(config.get("webhooks") or [])
        if each["name"] == hook
    ]
    assert len(found) == 1, f"{hook} registered {len(found)} times"
    ((kind, name, index, saved),) = found
    at = f"/webhooks/{index}"

    def patch(*ops: dict[str, Any]) -> None:
        plane.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(list(ops)))

    patch({"op": "test", "path": f"{at}/name", "value": hook}, {"op": "remove", "path": at})
    try:
        wait_for(f"the API server to stop calling {hook}", gone, timeout=30, every=0.2)
        yield
    finally:
        patch({"op": "add", "path": at, "value": saved})
        wait_for(f"the API server to call {hook} again", back, timeout=30, every=0.2)


def pinned(t: DraTenant, owner: str) -> bool:
    """Whether a claim of the generic class made for pod ``owner`` is pinned at its create now: a
    server-side dry run of the claim the resource claim controller would make for it."""
    uid = t.plane.get("pod", owner, namespace=t.ns)["metadata"]["uid"]
    made = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{owner}-gpus-",
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": uid, "controller": True}
            ],
        },
        "spec": {"devices": {"requests": [exactly()]}},
    }
    done = t.plane.kubectl(
        "create", "--dry-run=server", "-o", "json", "-n", t.ns, "-f", "-", stdin=json.dumps(made)
    )
    return "selectors" in json.loads(done.stdout)["spec"]["devices"]["requests"][0]["exactly"]


def allocation_checked(t: DraTenant, claim: str, pod: str) -> bool:
    """Whether the API server sends a new allocation to the rule now: a server-side dry run of an
    RTX 4090 given to ``pod``'s claim ``claim`` of an H200 is refused by it, or passes."""
    done = write_allocation(t, claim, pod, "dra-4090-0", "gpu-0", "--dry-run=server")
    if done.returncode == 0:
        return False
    assert ALLOCATION_RULE in done.stderr, done.stderr
    return True


def claim_for(t: DraTenant, pod: str) -> dict[str, Any] | None:
    """The claim made for ``pod`` (whose controlling owner it is)."""
    return next(
        (
            c
            for c in t.claims()
            if any(r["name"] == pod and r.get("controller") for r in c["metadata"].get("ownerReferences", []))
        ),
        None,
    )


def events_of(t: DraTenant, name: str) -> list[dict[str, Any]]:
    events = t.plane.get("events", namespace=t.ns)["items"]
    return [e for e in events if e["involvedObject"].get("name") == name]


def refused_tries(t: DraTenant, scheduler: str, pod: str, message: str) -> int:
    """How many of the scheduler's tries to bind ``pod`` its log shows refused with ``message``, a
    line per try (Volcano: the PreBind after which it resyncs the task; kube-scheduler: its retry)."""
    log, marker = (
        ("vc-scheduler.log", f"execute preBind for pod {t.ns}/{pod} failed")
        if scheduler == "volcano"
        else ("kube-scheduler.log", "Error scheduling pod; retrying")
    )
    lines = (t.plane.logs / log).read_text(errors="replace").splitlines()
    return sum(1 for line in lines if marker in line and message in line)


@pytest.mark.parametrize("scheduler", ["volcano", "default-scheduler"])
def test_a_refused_allocation_is_tried_again_and_the_charged_model_then_allocated(
    t: DraTenant, scheduler: str
) -> None:
    """SPEC §4b, the allocation checked, from the scheduler's side (the partner's, and kube-scheduler
    beside it): a pod charged for an H200 whose claim of the generic class was made while the pin
    rule was not registered (as a claim made before the webhook was installed), every whole H200
    held by other pods and the RTX 4090 free. The scheduler allocates an RTX 4090 and its write is
    refused with our message (the pod's FailedScheduling Event and the scheduler's log carry it);
    the claim stays unallocated and the pod unbound while the scheduler tries again and is refused
    again. Then an H200 frees and the RTX 4090 node is cordoned: the scheduler's next try allocates
    the H200 and the pod runs."""
    t.set_quota({H200: 8})
    t.template("two-h200", exactly("gpu", DRIVER, 2, IS.format("NVIDIA H200")))
    t.template("any-gpu", exactly())
    holders = ["hold-0", "hold-1", "hold-2"]  # every whole H200 the slices publish: 4 + 2
    for name in holders:
        assert t.create(t.pod(name, template="two-h200")) == ""
    for name in holders:
        t.wait_running(name)
    wait_for("the holders' claims allocated", lambda: all(t.allocated(h) for h in holders), timeout=30)
    assert [t.allocated(h) for h in holders] == [[H200, H200]] * len(holders)
    owner = t.pod("owner", card=H200, template="any-gpu")
    owner["spec"]["schedulerName"] = "nobody"  # never scheduled: the pod dry-run claims are made for
    assert t.create(owner) == ""
    wait_for("a claim made for a card pod pinned", lambda: pinned(t, "owner"), timeout=30)
    wrong = t.pod("wrong", card=H200, template="any-gpu")
    wrong["spec"]["schedulerName"] = scheduler
    with unregistered(t.plane, PIN_RULE, lambda: not pinned(t, "owner"), lambda: pinned(t, "owner")):
        assert t.create(wrong) == ""
        claim = wait_for("wrong's claim", lambda: claim_for(t, "wrong"), timeout=30)
    asked = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert "selectors" not in asked, asked  # any GPU of the class: an RTX 4090 as well as an H200
    message = (
        f"resourceclaim {t.ns}/{claim['metadata']['name']}: its allocation gives 1 {R4090} to pod"
        f" {t.ns}/wrong, which was charged for {H200}: refused"
    )
    wait_for(
        "the scheduler's allocation of an RTX 4090 refused, in the pod's events",
        lambda: [
            e for e in events_of(t, "wrong") if e["reason"] == "FailedScheduling" and message in e["message"]
        ],
        timeout=60,
    )

    def waiting() -> bool:
        unbound = not t.plane.get("pod", "wrong", namespace=t.ns)["spec"].get("nodeName")
        return unbound and "allocation" not in (claim_for(t, "wrong") or {}).get("status", {})

    holds_for("wrong unbound and its claim unallocated", waiting, seconds=4)
    wait_for(
        "the scheduler's next try refused as well",
        lambda: refused_tries(t, scheduler, "wrong", message) >= 2,
        timeout=30,
    )
    assert waiting()
    t.plane.kubectl("cordon", "dra-4090-0")
    try:
        t.plane.kubectl("delete", "pod", "hold-0", "-n", t.ns, "--wait=false")
        t.wait_running("wrong")
        assert t.allocated("wrong") == [H200]
    finally:
        t.plane.kubectl("uncordon", "dra-4090-0")


BENCH_NODE = "dra-bench-0"
BENCH_PODS = 20
# of each case, alternating: with, without, without, with, with, ... (more for a run by hand)
BENCH_ROUNDS = int(os.environ.get("CARDQUOTA_DRA_BENCH_ROUNDS", "2"))


def create_timed(plane: ControlPlane, namespace: str, pods: list[dict[str, Any]]) -> dict[str, float]:
    """Create ``pods`` one after another over one connection; when each create returned."""
    conn = http.client.HTTPSConnection("127.0.0.1", plane.api_port, context=plane.reader.context, timeout=30)
    created: dict[str, float] = {}
    try:
        for made in pods:
            body = json.dumps(made)
            headers = {"Content-Type": "application/json"}
            conn.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body, headers=headers)
            answer = conn.getresponse()
            text = answer.read().decode(errors="replace")
            assert answer.status == 201, text
            created[made["metadata"]["name"]] = time.monotonic()
    finally:
        conn.close()
    return created


def times_to_bind(t: DraTenant, front: Process, scheduler: str, prefix: str) -> list[float]:
    """``BENCH_PODS`` pods of a claim of 1 H200 each created for the bench node: the seconds from each
    create's return to the first read that shows it bound (a read every 50 ms). Each must be
    allocated an H200; then they go, with their claims and PodGroups, and the webhook counts only
    the held probe again (the next batch needs the whole quota)."""
    pods = []
    for i in range(BENCH_PODS):
        made = t.pod(f"{prefix}-{i}", template="bench")
        made["spec"]["schedulerName"] = scheduler
        made["spec"]["nodeSelector"] = {"kubernetes.io/hostname": BENCH_NODE}
        pods.append(made)
    created = create_timed(t.plane, t.ns, pods)
    bound: dict[str, float] = {}
    deadline = time.monotonic() + 120
    while len(bound) < len(created):
        assert time.monotonic() < deadline, f"{prefix}: {len(bound)} of {len(created)} pods bound in 120 s"
        now = time.monotonic()
        for found in t.plane.get("pods", namespace=t.ns)["items"]:
            name = found["metadata"]["name"]
            if name in created and name not in bound and found["spec"].get("nodeName"):
                bound[name] = now
        time.sleep(0.05)
    for name in created:
        assert t.allocated(name) == [H200], (name, t.allocated(name))
    t.plane.kubectl("delete", "pods", *created, "-n", t.ns, "--wait=false")

    def gone() -> bool:
        left = [p for p in t.pods() if p["metadata"]["name"] in created]
        claims = [c for c in t.claims() if c["metadata"]["name"] != "probe"]
        return not left and not claims and not t.plane.get("podgroups", namespace=t.ns)["items"]

    wait_for(f"the {prefix} pods gone with their claims and PodGroups", gone, timeout=120)
    wait_for(
        f"the webhook to count only the probe once the {prefix} pods are gone",
        lambda: front.figure("used", t.queue, H200) == 1,
        timeout=30,
    )
    return [bound[name] - created[name] for name in created]


def rule_calls(plane: ControlPlane) -> tuple[float, float]:
    """How many times the API server has called the allocation rule, and the seconds those calls
    took (its own ``apiserver_admission_webhook_admission_duration_seconds``)."""
    status, body = plane.reader.request("/metrics")
    assert status == 200, body[:200]
    count = seconds = 0.0
    for family in text_string_to_metric_families(body.decode()):
        if family.name != "apiserver_admission_webhook_admission_duration_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("name") == ALLOCATION_RULE:
                if sample.name.endswith("_count"):
                    count += sample.value
                elif sample.name.endswith("_sum"):
                    seconds += sample.value
    return count, seconds


@pytest.mark.parametrize("scheduler", ["volcano", "default-scheduler"])
def test_the_allocation_rule_costs_the_scheduler_little_time_to_bind(
    t: DraTenant, front: Process, scheduler: str
) -> None:
    """What the allocation rule costs the scheduler that writes the allocations (the partner, and
    kube-scheduler beside it): the time from create to bind of 20 pods of a claim of 1 H200 each, on a
    node whose slice publishes 20, with the rule registered and not, rounds alternating in the same
    run. The figures are printed (``-s``), with what the API server measured of its calls to the
    rule; the rule was called for every allocation with it and never without it, with it the median
    is within twice that without it plus 1 s, and every pod is allocated an H200 either way."""
    # the probe, a batch, and room for what the webhook may count a moment longer of the batch
    # before (a bench of the scheduler's time, not of the quota's edge)
    t.set_quota({H200: BENCH_PODS + 5})
    t.plane.apply(dra_node(BENCH_NODE))
    apply_all(t.plane, [dra_slice(BENCH_NODE, "NVIDIA H200", BENCH_PODS)])
    try:
        wait_for(
            "kwok to mark the bench node Ready",
            lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in t.plane.get("node", BENCH_NODE)["status"].get("conditions", [])
            ),
            timeout=60,
        )
        t.claim("probe", exactly("gpu", DRIVER, 1, IS.format("NVIDIA H200")))
        held = t.pod("held", claim="probe")
        held["spec"]["schedulerName"] = "nobody"  # never scheduled: the rule's dry-run probe
        assert t.create(held) == ""
        wait_for(
            "the webhook to know the bench node's GPUs",
            lambda: (
                write_allocation(t, "probe", "held", BENCH_NODE, "gpu-0", "--dry-run=server").returncode == 0
            ),
            timeout=30,
        )
        assert allocation_checked(t, "probe", "held")
        t.template("bench", exactly("gpu", DRIVER, 1, IS.format("NVIDIA H200")))
        times: dict[str, list[float]] = {"with": [], "without": []}
        calls = {"with": 0.0, "without": 0.0}  # the API server's calls of the rule meanwhile
        took = 0.0  # the seconds of those calls, with the rule

        def batch(case: str, n: int) -> None:
            nonlocal took
            before = rule_calls(t.plane)
            times[case] += times_to_bind(t, front, scheduler, f"{case}-{n}")
            after = rule_calls(t.plane)
            calls[case] += after[0] - before[0]
            took += after[1] - before[1]

        for n, case in enumerate((["with", "without", "without", "with"] * BENCH_ROUNDS)[: 2 * BENCH_ROUNDS]):
            if case == "with":
                batch(case, n)
                continue
            off = unregistered(
                t.plane,
                ALLOCATION_RULE,
                lambda: not allocation_checked(t, "probe", "held"),
                lambda: allocation_checked(t, "probe", "held"),
            )
            with off:
                batch(case, n)
    finally:
        t.plane.kubectl("delete", "pods", "--all", "-n", t.ns, "--wait=false", check=False)
        with contextlib.suppress(TimeoutError):  # a failure above is the one to report
            wait_for("the bench pods gone before their node", lambda: not t.pods(), timeout=120)
        t.plane.kubectl(
            "delete", "resourceslice", f"{BENCH_NODE}-{DRIVER}", "--ignore-not-found", check=False
        )
        t.plane.kubectl("delete", "node", BENCH_NODE, "--ignore-not-found", check=False)
    median = {case: statistics.median(got) for case, got in times.items()}
    most = {case: max(got) for case, got in times.items()}
    print(
        f"\n{t.plane.partner} plane, {scheduler}: create to bind of {BENCH_PODS} DRA pods,"
        f" {BENCH_ROUNDS} rounds a case: with the allocation rule median {median['with']:.2f} s,"
        f" max {most['with']:.2f} s; without median {median['without']:.2f} s, max"
        f" {most['without']:.2f} s; ratio of medians {median['with'] / median['without']:.2f},"
        f" of maxima {most['with'] / most['without']:.2f}; the API server called the rule"
        f" {calls['with']:.0f} times, {1000 * took / max(calls['with'], 1):.1f} ms a call on average"
    )
    assert calls["with"] >= BENCH_PODS * BENCH_ROUNDS and calls["without"] == 0, calls
    assert median["with"] <= 2 * median["without"] + 1.0, (median, most)


def test_the_dra_corners_are_charged_as_the_scheduler_allocates(t: DraTenant) -> None:
    """SPEC §4b read as the scheduler reads it, a row per corner: each refused with our message, or
    admitted and allocated only on the model it was charged for."""
    t.set_quota({H200: 2, R4090: 1})
    nothing = IS.format("NVIDIA B200")
    t.template(
        "one-model-two-counts",
        {
            "name": "gpu",
            "firstAvailable": [
                {
                    "name": "cheap",
                    "deviceClassName": DRIVER,
                    "count": 1,
                    "selectors": [{"cel": {"expression": nothing}}],
                },
                {"name": "real", "deviceClassName": "h200.nvidia.com", "count": 3},
            ],
        },
    )
    refused = t.create(t.pod("two-counts", template="one-model-two-counts"))
    assert f'queue "{t.queue}" has 2 NVIDIA-H200 left' in refused and refused.rstrip().endswith("needs 3"), (
        refused
    )
    # a // comment: the API server never evaluates what follows it, and neither do we
    commented = f"device.attributes['{DRIVER}'].productName.startsWith('NVIDIA GeForce') // && {IS.format('NVIDIA H200')}\n"
    t.template("commented", exactly("gpu", DRIVER, 1, commented))
    assert t.create(t.pod("commented", template="commented")) == ""
    t.wait_running("commented")
    assert t.allocated("commented") == [R4090]
    # a capacity request on devices that are not shared takes whole devices, and is charged so
    t.template("sliver", exactly("gpu", "h200.nvidia.com", 2, capacity={"requests": {"memory": "1Mi"}}))
    assert t.create(t.pod("sliver", template="sliver")) == ""
    t.wait_running("sliver")
    assert t.allocated("sliver") == [H200, H200]
    extended = t.pod("extended")
    extended["spec"]["containers"][0]["resources"]["limits"] = {
        "deviceclass.resource.kubernetes.io/h200.nvidia.com": "1"
    }
    refused = t.create(extended)
    assert f'queue "{t.queue}" has 0 NVIDIA-H200 left' in refused and "extended resource" in refused, refused
    t.claim("anyone", exactly())
    refused = t.create(t.pod("by-name", claim="anyone", card=R4090))
    assert f"uses ResourceClaim {t.ns}/anyone, whose request gpu may be given any of" in refused, refused
    assert "a claim by name is shared, never pinned" in refused, refused


HAMI = "hami-core-gpu.project-hami.io"
A100 = "NVIDIA-A100-SXM4-80GB"


def hami_inventory(plane: ControlPlane) -> None:
    """A node whose two A100 HAMi's DRA driver shares by consumable capacity, and its class."""
    if [n for n in plane.get("nodes")["items"] if n["metadata"]["name"] == "hami-a100-0"]:
        return
    plane.apply(dra_node("hami-a100-0"))
    device = {
        "attributes": {"type": {"string": "hami-gpu"}, "productName": {"string": "NVIDIA A100-SXM4-80GB"}},
        "capacity": {"cores": {"value": "100"}, "memory": {"value": "80Gi"}},
        "allowMultipleAllocations": True,
    }
    apply_all(
        plane,
        [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"hami-a100-0-{HAMI}"},
                "spec": {
                    "driver": HAMI,
                    "nodeName": "hami-a100-0",
                    "pool": {"name": "hami-a100-0", "generation": 1, "resourceSliceCount": 1},
                    "devices": [{**device, "name": f"hami-gpu-{i}"} for i in range(2)],
                },
            },
            device_class(
                HAMI, f"device.driver == '{HAMI}' && device.attributes['{HAMI}'].type == 'hami-gpu'"
            ),
        ],
    )


def test_a_consumable_share_of_a_gpu_is_charged_as_its_fraction(t: DraTenant) -> None:
    """HAMi's form: 30 % of an A100's compute and 8 of its 80 GiB is 0.3 of a card (the larger
    fraction); the pod runs on a share of a device (the partners with DRAConsumableCapacity on, as
    HAMi asks); one asking 80 % more is refused."""
    hami_inventory(t.plane)
    t.set_quota({A100: 1})
    t.template("share", exactly("gpu", HAMI, 1, capacity={"requests": {"cores": "30", "memory": "8Gi"}}))
    t.template("big", exactly("gpu", HAMI, 1, capacity={"requests": {"cores": "80", "memory": "8Gi"}}))
    stored = t.plane.get("resourceclaimtemplate", "share", namespace=t.ns)["spec"]["spec"]["devices"][
        "requests"
    ][0]
    assert stored["exactly"].get("capacity") == {"requests": {"cores": "30", "memory": "8Gi"}}, stored
    assert t.create(t.pod("share-0", card=A100, template="share")) == ""
    t.wait_running("share-0")
    wait_for("share-0's claim allocated", lambda: t.allocated("share-0"), timeout=30)
    assert t.allocated("share-0") == [A100]
    # The pod is charged its 0.3; its PodGroup asks whole cards (card.request, as the capacity-card
    # plugin reads it) and reserves the 0.7 beyond its pod while Running.
    refused = t.create(t.pod("big-0", card=A100, template="big"))
    assert "(quota 1: 0.3 running, 0.7 reserved by PodGroups)" in refused and "needs 0.8" in refused, refused


NINETY_NINE = "[" + ", ".join(str(i) for i in range(99)) + "]"


def costly(i: int) -> str:
    """The costly selector the API server's cost check accepts (10,000 steps of a nested
    comprehension a device, 3 ms in the webhook's CEL), made distinct by ``i`` and reading each
    device's own uuid, so no two devices are answered as one."""
    nested = f"{NINETY_NINE}.all(x, {NINETY_NINE}.all(y, x + y >= -{i}))"
    return f"device.attributes['{DRIVER}'].uuid != '' && {IS.format('NVIDIA H200')} && {nested}"


def test_a_costly_selector_is_worked_out_off_the_loop_and_the_reviews_beside_it_are_answered(
    t: DraTenant,
) -> None:
    """decisions.md §32: a template of 16 costly selectors over 128 more published H200 is seconds
    of evaluation (off the loop, on a processor nothing else wants: a busy machine takes longer). It is worked out off the loop that answers reviews: its pod is told to try
    again meanwhile, then admitted and charged its H200, and every review beside it (its twin with a
    product-name selector, a device-plugin pod) is answered in time, none refused by the API server
    for a webhook that did not answer (the chart's 5 s, under ``Fail``)."""
    t.set_quota({H200: 3})
    far = dra_slice("costly-absent", "NVIDIA H200", 128)  # a node that does not exist: never allocated
    apply_all(t.plane, [far])
    try:
        t.template("costly", exactly("gpu", DRIVER, 1, *(costly(i) for i in range(16))))
        t.template("cheap", exactly("gpu", DRIVER, 1, IS.format("NVIDIA H200")))
        first = t.create(t.pod("costly", template="costly"))
        # its review waits up to 2 s for the work, then is told to try again (a fast machine may
        # have it done by then: admitted at once)
        assert first == "" or "is being evaluated, off the loop that answers reviews" in first, first
        beside: list[tuple[float, str]] = []
        for i in range(6):  # while the selectors are worked out: each answered, dry runs
            obj = t.pod(f"beside-{i}", template="cheap") if i % 2 else t.pod(f"beside-{i}", card=H200, gpus=1)
            began = time.monotonic()
            args = ("create", "--dry-run=server", "-n", t.ns, "-f", "-")
            done = t.plane.kubectl(*args, stdin=json.dumps(obj), check=False)
            beside.append((time.monotonic() - began, done.stderr if done.returncode else ""))
        assert [said for _, said in beside] == [""] * 6, beside
        assert t.create(t.pod("twin", template="cheap")) == ""

        def admitted() -> bool:
            said = t.create(t.pod("costly", template="costly"))
            assert said == "" or "is being evaluated" in said, said
            return said == ""

        if first:
            wait_for("the costly selectors worked out and their pod admitted", admitted, timeout=300, every=2)
        assert t.wait_running("costly") and t.wait_running("twin")
        assert t.allocated("costly") == [H200] and t.allocated("twin") == [H200]
        refused = t.create(t.pod("past", card=H200, gpus=2))
        assert f'queue "{t.queue}" has 1 {H200} left' in refused, refused
    finally:
        t.plane.kubectl("delete", "resourceslice", far["metadata"]["name"], check=False)

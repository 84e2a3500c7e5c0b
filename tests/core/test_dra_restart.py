"""SPEC §4b after a restart: a pod the cache first sees with its claims allocated (the webhook
restarted, or another leader admitted it) is charged the devices the scheduler allocated, each
device's card read through the ResourceSlices, whatever its DeviceClass says now or whether it still
exists. The state is rebuilt from the cluster's objects, as a new webhook's first lists rebuild it."""

from typing import Any

import pytest

from tests.builders import (
    H200,
    R4090,
    claim_template,
    claiming,
    cluster,
    device_class,
    first_available,
    gpu_request,
    node,
    pod,
    queue,
    request,
    resource_claim,
    resource_slice,
)
from webhook.core.decide import admission
from webhook.core.decide.report import cluster_status
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model import keys
from webhook.core.model.cards import UNIT, CardName
from webhook.core.model.verdicts import Allowed, Denied

H200_ONLY = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
PER_MODEL = "h200"  # an operator's per-model class: the one the tests delete
FULL = 'queue "q" has 0 NVIDIA-H200 left (quota 2: 2 running)'


def dra_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "64"}},
    }


def per_model_class() -> dict[str, Any]:
    return device_class(PER_MODEL, f"device.driver == 'gpu.nvidia.com' && {H200_ONLY}", card=H200)


def world(*objects: dict[str, Any], with_class: bool = True) -> list[dict[str, Any]]:
    """Node ``dra`` publishes 4 H200 (gpu-0..3) and 2 RTX 4090 (gpu-4, gpu-5) through NVIDIA's
    driver; node ``dp`` has 4 H200 through the device plugin; queue ``q`` holds 2 H200 and 2 RTX
    4090; the generic class, and the per-model class ``h200`` unless it was deleted."""
    return [
        dra_node("dra"),
        node("dp", H200, 4),
        resource_slice("dra", "NVIDIA H200", 4),
        resource_slice("dra", "NVIDIA GeForce RTX 4090", 2, name="dra-4090", start=4),
        device_class("gpu.nvidia.com"),
        *([per_model_class()] if with_class else []),
        claim_template("two", gpu_request("gpus", PER_MODEL, 2)),
        queue("q", f'{{"{H200}": 2, "{R4090}": 2}}'),
        *objects,
    ]


def running(name: str, *, claims: tuple[str, ...] = (), templates: tuple[str, ...] = (), **kw: Any) -> Any:
    """A pod of queue ``q`` bound to ``dra`` and running; its claims made from templates are named
    ``<pod>-t<i>``."""
    obj = claiming(
        pod(name, None, None, node_name="dra", phase="Running", **kw), templates=templates, claims=claims
    )
    obj["status"]["resourceClaimStatuses"] = [
        {"name": f"t{i}", "resourceClaimName": f"{name}-t{i}"} for i in range(len(templates))
    ]
    return obj


def made(pod_name: str, *devices: str, request_: dict[str, Any] | None = None, entry: str = "t0") -> Any:
    """The claim made for ``pod_name``'s entry ``entry`` from template ``two``, allocated ``devices``
    of node ``dra`` (none: not allocated yet)."""
    return resource_claim(
        f"{pod_name}-{entry}",
        request_ or gpu_request("gpus", PER_MODEL, 2),
        pod_owner={"name": pod_name, "uid": f"uid-ns-{pod_name}"},
        pod_claim=entry,
        allocated=tuple(("gpus", "dra", d) for d in devices),
    )


def by_name(name: str, count: int, *devices: str) -> Any:
    return resource_claim(
        name, gpu_request("gpus", PER_MODEL, count), allocated=tuple(("gpus", "dra", d) for d in devices)
    )


def charge(state: ClusterState, name: str) -> tuple[str, str, int] | None:
    found = state.charged.charge(f"uid-ns-{name}")
    if found is None:
        return None
    return found.queue, str(found.card or found.spec.text), found.count // UNIT


def used(state: ClusterState, card: str = H200) -> int:
    return queue_usage(state, "q").card(CardName(card)).used // UNIT


def decide(state: ClusterState, obj: dict[str, Any]) -> Allowed | Denied:
    return admission.validate(state, request(obj), 0.0)


def claim_warnings(state: ClusterState) -> list[str]:
    return [w for w in cluster_status(state)["warnings"] if w.startswith("resourceclaim")]


def next_pod() -> dict[str, Any]:
    """One more H200 for queue ``q``, through the device plugin (its form needs no class)."""
    return pod("next", H200, 1)


# ---- the case of the issue, and its twin ------------------------------------------------------
@pytest.mark.parametrize("with_class", [True, False], ids=["class present", "class deleted"])
def test_a_pod_first_seen_with_its_claim_allocated_is_charged_the_devices_allocated(with_class: bool) -> None:
    """A pod holds 2 H200 through a claim of the per-model class, allocated gpu-0 and gpu-1; the
    class is deleted while the webhook is down. Found: the restarted webhook charged it nothing, and
    its 2 H200 were free for the next pod of a queue of quota 2. Now it is charged its 2 H200, as
    when the class is there, and the next pod is refused."""
    state = cluster(
        *world(running("p", templates=("two",)), made("p", "gpu-0", "gpu-1"), with_class=with_class)
    )
    assert charge(state, "p") == ("q", H200, 2)
    assert queue_usage(state, "q").card(CardName(H200)).bound == 2 * UNIT
    refused = decide(state, next_pod())
    assert isinstance(refused, Denied) and FULL in refused.message, refused
    assert not cluster_status(state)["warnings"]


def test_the_charge_is_the_same_before_a_restart_and_after_it() -> None:
    """The webhook that admitted the pod charges it what it was admitted with, then its allocation;
    the class deleted changes nothing there; a new webhook reading the same objects without the
    class charges the same."""
    first = cluster(*world())
    obj = claiming(pod("p", None, None), templates=("two",))
    review = request(obj)
    admitted = admission.validate(first, review, 0.0)
    admission.admit(first, review, admitted, 0.0)
    assert isinstance(admitted, Allowed)
    live = running("p", templates=("two",))
    for step in (live, made("p"), made("p", "gpu-0", "gpu-1")):
        ingest.upsert(first, step)
        assert charge(first, "p") == ("q", H200, 2)
    ingest.remove(first, per_model_class())
    assert charge(first, "p") == ("q", H200, 2)
    second = cluster(*world(live, made("p", "gpu-0", "gpu-1"), with_class=False))
    assert charge(second, "p") == charge(first, "p")
    assert used(second) == used(first) == 2


@pytest.mark.parametrize("with_class", [True, False], ids=["class present", "class deleted"])
def test_the_model_is_the_devices_whatever_the_pod_or_its_class_says(with_class: bool) -> None:
    """A claim of the generic class for a pod naming no model, allocated 2 RTX 4090: it is counted
    on RTX 4090, with its class there or not."""
    obj = running("p", templates=("any",))
    claim = made("p", "gpu-4", "gpu-5", request_=gpu_request("gpus", count=2))
    objects = world(claim_template("any", gpu_request("gpus", count=2)), obj, claim)
    if not with_class:
        objects = [
            o for o in objects if o["metadata"]["name"] != "gpu.nvidia.com" or o["kind"] != "DeviceClass"
        ]
    state = cluster(*objects)
    assert charge(state, "p") == ("q", R4090, 2)
    assert used(state, R4090) == 2 and used(state) == 0


def test_an_admitted_pod_is_charged_what_its_allocation_gave_once_allocated() -> None:
    """``firstAvailable``: one H200 or else two, charged two while it waits (the scheduler takes the
    first it can satisfy); allocated one, it holds one and is charged one, as a new webhook reading
    the pod would charge it."""
    choice = first_available("gpus", gpu_request("one", PER_MODEL, 1), gpu_request("two", PER_MODEL, 2))
    state = cluster(*world(claim_template("either", choice)))
    obj = claiming(pod("p", None, None), templates=("either",))
    review = request(obj)
    admission.admit(state, review, admission.validate(state, review, 0.0), 0.0)
    ingest.upsert(state, running("p", templates=("either",)))
    assert charge(state, "p") == ("q", H200, 2)
    ingest.upsert(state, made("p", "gpu-0", request_=choice))
    assert charge(state, "p") == ("q", H200, 1)
    assert isinstance(decide(state, next_pod()), Allowed)


# ---- shared claims -----------------------------------------------------------------------------
def test_a_shared_claim_allocated_is_charged_once_after_a_restart_whatever_its_class() -> None:
    """Claim ``shared`` (2 H200, allocated gpu-2 and gpu-3) used by two running pods, its class
    deleted meanwhile: charged once, to one of them (the first the cache holds), then to the other
    when that one goes, then to no one."""
    state = cluster(
        *world(
            by_name("shared", 2, "gpu-2", "gpu-3"),
            running("a", claims=("shared",)),
            running("b", claims=("shared",)),
            with_class=False,
        )
    )
    charges = {name: charge(state, name) for name in ("a", "b")}
    assert sorted(charges.values(), key=str) == [("q", H200, 2), None]
    assert used(state) == 2
    assert isinstance(decide(state, next_pod()), Denied)
    payer = next(name for name, found in charges.items() if found is not None)
    other = "b" if payer == "a" else "a"
    ingest.remove(state, running(payer, claims=("shared",)))
    assert charge(state, other) == ("q", H200, 2) and used(state) == 2
    ingest.remove(state, running(other, claims=("shared",)))
    assert used(state) == 0


# ---- partly allocated ---------------------------------------------------------------------------
def test_a_pod_partly_allocated_is_charged_at_least_what_its_allocated_claims_hold() -> None:
    """A pod of a claim made from template ``two``-like ``one`` (1 H200, allocated) and a claim by
    name ``later`` (1 H200, not allocated yet), its class deleted: charged the 1 H200 its allocated
    claim holds (its other claim cannot be read without its class), then 2 once ``later`` is
    allocated. With the class there it is charged as it reads, 2, before and after."""
    one = gpu_request("gpus", PER_MODEL, 1)
    for with_class, before in ((False, 1), (True, 2)):
        obj = running("p", templates=("one",), claims=("later",))
        state = cluster(
            *world(
                claim_template("one", one),
                made("p", "gpu-0", request_=one),
                by_name("later", 1),
                obj,
                with_class=with_class,
            )
        )
        assert charge(state, "p") == ("q", H200, before), with_class
        ingest.upsert(state, by_name("later", 1, "gpu-1"))
        assert charge(state, "p") == ("q", H200, 2), with_class


# ---- devices no slice publishes ------------------------------------------------------------------
def test_a_device_no_slice_publishes_is_counted_on_the_model_the_pod_is_known_to_use_and_told() -> None:
    """A claim allocated gpu-0 and gpu-1 (H200) and gpu-9, which no slice publishes (its slice gone,
    or not seen yet): all counted as H200, and status says which device and how it was counted; once
    a slice publishes gpu-9 it is counted as what it is: an RTX 4090 beside H200 (a claim allocated
    before the webhook checked it) is counted with the pod's H200, and said."""
    state = cluster(
        *world(running("p", templates=("two",)), made("p", "gpu-0", "gpu-1", "gpu-9"), with_class=False)
    )
    assert charge(state, "p") == ("q", H200, 3)
    status = cluster_status(state)
    assert status["claims_unpublished"] == [
        {"claim": "ns/p-t0", "pod": "ns/p", "devices": ["dra/gpu-9 of gpu.nvidia.com"], "counted_as": H200}
    ]
    assert claim_warnings(state) == [
        "resourceclaim ns/p-t0 of pod ns/p was allocated dra/gpu-9 of gpu.nvidia.com, which no ResourceSlice"
        " the webhook has seen publishes: counted as 1 NVIDIA-H200 (the model its pod is known to use)"
    ]
    ingest.upsert(state, resource_slice("dra", "NVIDIA GeForce RTX 4090", 1, name="dra-late", start=9))
    assert charge(state, "p") == ("q", H200, 3)
    assert "claims_unpublished" not in cluster_status(state)
    assert claim_warnings(state) == [
        "resourceclaim ns/p-t0 of pod ns/p was allocated NVIDIA-GeForce-RTX-4090 but charged for NVIDIA-H200:"
        " counted as NVIDIA-H200, the model of its pod's other devices"
    ]
    ingest.upsert(state, resource_slice("dra", "NVIDIA H200", 1, name="dra-late", start=9))
    assert charge(state, "p") == ("q", H200, 3)
    assert not claim_warnings(state)


@pytest.mark.parametrize(
    ("annotations", "charged", "told"),
    [
        pytest.param(
            {keys.DRA_CARD: H200}, ("q", H200, 1), "counted as 1 NVIDIA-H200", id="the pod names it"
        ),
        pytest.param({}, None, "not counted: neither its pod nor its other devices", id="nothing names it"),
    ],
)
def test_a_pod_whose_only_device_no_slice_publishes_is_counted_on_its_own_word_else_told(
    annotations: dict[str, str], charged: tuple[str, str, int] | None, told: str
) -> None:
    """Its class deleted and its one device published by no slice: the model the pod names, else
    nothing it can be counted on; either way status says so, never silently. A slice publishing the
    device brings its charge."""
    state = cluster(
        *world(
            running("p", templates=("two",), annotations=annotations), made("p", "gpu-9"), with_class=False
        )
    )
    assert charge(state, "p") == charged
    assert any(told in w and "dra/gpu-9" in w for w in claim_warnings(state))
    ingest.upsert(state, resource_slice("dra", "NVIDIA H200", 1, name="dra-late", start=9))
    assert charge(state, "p") == ("q", H200, 1)


def test_an_allocated_pod_not_bound_yet_is_charged_again_when_its_slice_arrives() -> None:
    """The scheduler writes the allocation before it binds: a pod with no node whose devices' slice
    the cache sees after it is charged once it does (no node change tells it)."""
    obj = running("p", templates=("two",))
    del obj["spec"]["nodeName"]
    obj["status"]["phase"] = "Pending"
    objects = [
        o for o in world(obj, made("p", "gpu-0", "gpu-1"), with_class=False) if o["kind"] != "ResourceSlice"
    ]
    state = cluster(*objects)
    assert charge(state, "p") is None
    assert cluster_status(state)["claims_unpublished"][0]["devices"] == [
        "dra/gpu-0 of gpu.nvidia.com",
        "dra/gpu-1 of gpu.nvidia.com",
    ]
    ingest.upsert(state, resource_slice("dra", "NVIDIA H200", 4))
    assert charge(state, "p") == ("q", H200, 2)
    assert "claims_unpublished" not in cluster_status(state)

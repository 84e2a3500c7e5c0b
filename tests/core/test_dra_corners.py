"""SPEC §4b read as the API server and the scheduler read it: the DRA corners a tenant could use to
be charged less than the scheduler allocates, each beside the same shape inside its quota."""

from typing import Any

import jsonpatch
import pytest

from tests.builders import (
    GPU_CLASS_CEL,
    H200,
    R4090,
    claim_template,
    device_class,
    first_available,
    gpu_request,
    pod,
    request,
    resource_claim,
    resource_slice,
)
from tests.core.test_dra import PRODUCT_IS, claim_request, decide, demand, dra_cluster, dra_pod, made_claim
from webhook.core.decide import admission
from webhook.core.index import ingest
from webhook.core.model.cards import UNIT
from webhook.core.model.demand import BadDemand, PodDemand
from webhook.core.model.verdicts import Allowed, Denied

NOTHING_MEETS = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"
SOME_H200 = '{"NVIDIA-H200": 2, "NVIDIA-GeForce-RTX-4090": 2}'


def test_first_available_alternatives_of_one_model_are_charged_the_largest_count() -> None:
    """``[{h200 x1, a selector no device meets}, {h200 x4}]``: the scheduler skips the first and
    takes four; charging the first's one would let a tenant take four on a quota of two."""
    template = claim_template(
        "t",
        first_available(
            "gpu",
            gpu_request("cheap", count=1, selectors=(NOTHING_MEETS,)),
            gpu_request("real", "h200", 4),
        ),
    )
    state = dra_cluster(template, quota=SOME_H200)
    found = demand(state, dra_pod("p", templates=("t",)))
    assert isinstance(found, PodDemand) and found.count == 4 * UNIT
    refused = decide(state, dra_pod("p", templates=("t",)))
    assert isinstance(refused, Denied) and 'queue "q" has 2 NVIDIA-H200 left' in refused.message
    assert refused.message.endswith("needs 4")
    inside = dra_cluster(template, quota='{"NVIDIA-H200": 4}')
    assert isinstance(decide(inside, dra_pod("p", templates=("t",))), Allowed)


@pytest.mark.parametrize(
    ("selector", "card"),
    [
        pytest.param(
            "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H')"
            " // && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA GeForce RTX 4090'",
            H200,
            id="a comment",
        ),
        pytest.param(
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA \\'H200'"
            " || device.attributes['gpu.nvidia.com'].productName == 'NVIDIA GeForce RTX 4090'",
            R4090,
            id="an escaped quote",
        ),
        pytest.param(
            "!(device.attributes['gpu.nvidia.com'].productName in ['NVIDIA H200'])",
            R4090,
            id="a negation",
        ),
        pytest.param(
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
            H200,
            id="a quantity: only the 80Gi cards",
        ),
    ],
)
def test_a_selector_is_evaluated_not_read(selector: str, card: str) -> None:
    state = dra_cluster(
        claim_template("t", gpu_request(count=1, selectors=(selector,))),
        resource_slice("r", "NVIDIA GeForce RTX 4090", 2, memory="24Gi"),
    )
    found = demand(state, dra_pod("p", templates=("t",)))
    assert isinstance(found, PodDemand) and found.spec.text == card, found


def test_a_class_it_cannot_evaluate_is_refused_never_read_as_no_gpu() -> None:
    broken = device_class("broken", f"{GPU_CLASS_CEL} && device.attributes['gpu.nvidia.com'].productName")
    state = dra_cluster(broken, claim_template("t", gpu_request("g", "broken", 1)))
    found = demand(state, dra_pod("p", H200, templates=("t",)))
    assert isinstance(found, BadDemand), found
    assert "whose model cannot be read: its CEL selector" in found.reason
    assert "fails on device dra/gpu-0: No matching overloads found : _&&_" in found.reason
    fine = dra_cluster(claim_template("t", gpu_request("g", "h200", 1)))
    assert isinstance(demand(fine, dra_pod("p", templates=("t",))), PodDemand)


def test_a_capacity_request_on_devices_that_are_not_shared_takes_whole_devices() -> None:
    """``count 4, memory 1Mi`` on NVIDIA's exclusive devices: the scheduler allocates four whole
    GPUs, so four are charged, not 4 × 1Mi/80Gi."""
    state = dra_cluster(claim_template("t", gpu_request("g", "h200", 4, capacity={"memory": "1Mi"})))
    found = demand(state, dra_pod("p", templates=("t",)))
    assert isinstance(found, PodDemand) and found.count == 4 * UNIT
    hami = "hami-core-gpu.project-hami.io"
    shared = dra_cluster(
        resource_slice("dra", "NVIDIA H200", 2, driver=hami, name="hami"),
        device_class(hami, f"device.driver == '{hami}'"),
        claim_template("t", gpu_request("g", hami, 1, capacity={"memory": "8Gi"})),
    )
    share = demand(shared, dra_pod("p", H200, templates=("t",)))
    assert isinstance(share, PodDemand) and share.count == UNIT // 10  # 8 of 80 GiB: a tenth


def _pinned(state: Any, claim: dict[str, Any]) -> list[str]:
    mutated = admission.mutate(state, claim_request(claim), 0.0)
    assert isinstance(mutated, Allowed), mutated
    made = jsonpatch.apply_patch(claim, [dict(op) for op in mutated.patch])
    return [
        s["cel"]["expression"] for s in made["spec"]["devices"]["requests"][0]["exactly"].get("selectors", [])
    ]


def test_a_request_several_models_can_meet_is_pinned_to_the_charged_one() -> None:
    either = "device.attributes['gpu.nvidia.com'].productName in ['NVIDIA H200', 'NVIDIA GeForce RTX 4090']"
    state = dra_cluster(
        claim_template("t", gpu_request(count=1, selectors=(either,))),
        dra_pod("p", R4090, templates=("t",)),
    )
    expressions = _pinned(state, made_claim("p", "t0", gpu_request(count=1, selectors=(either,))))
    assert expressions == [either, PRODUCT_IS.format("NVIDIA GeForce RTX 4090")]
    one = dra_cluster(claim_template("t", gpu_request("g", "h200", 1)), dra_pod("p", templates=("t",)))
    assert _pinned(one, made_claim("p", "t0", gpu_request("g", "h200", 1))) == []  # one model already


def test_a_class_annotated_with_two_models_is_pinned_too() -> None:
    state = dra_cluster(
        device_class("any", GPU_CLASS_CEL, card=f"{H200}|{R4090}"),
        claim_template("t", gpu_request("g", "any", 1)),
        dra_pod("p", H200, templates=("t",)),
    )
    assert _pinned(state, made_claim("p", "t0", gpu_request("g", "any", 1))) == [
        PRODUCT_IS.format("NVIDIA H200")
    ]


def test_a_claim_by_name_whose_model_no_class_or_selector_fixes_is_refused() -> None:
    """A claim by name is never made for one pod, so never pinned: from a class of every model, its
    pod's card.name would not keep the scheduler from giving it another."""
    state = dra_cluster(resource_claim("shared", gpu_request(count=1)))
    refused = decide(state, dra_pod("p", H200, claims=("shared",)))
    assert isinstance(refused, Denied)
    assert (
        "uses ResourceClaim ns/shared, whose request gpu may be given any of"
        " NVIDIA-GeForce-RTX-4090|NVIDIA-H200: a claim by name is shared, never pinned" in refused.message
    )
    fixed = dra_cluster(resource_claim("shared", gpu_request("g", "h200", 1)))
    assert isinstance(decide(fixed, dra_pod("p", claims=("shared",))), Allowed)


# ---- the allocation checked (ResourceClaim status UPDATE) ---------------------------------------
def allocation_write(
    claim: dict[str, Any], pod_uid: str, *results: tuple[str, str, str], also_for: tuple[str, ...] = ()
) -> Any:
    """The scheduler's write of ``claim``'s status: devices (driver, pool, device) for pod_uid (and
    the pods of uids ``also_for``, as for a claim several pods share)."""
    new = {
        **claim,
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": d, "pool": p, "device": n} for d, p, n in results
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": uid} for uid in (pod_uid, *also_for)],
        },
    }
    return request(
        new, resource="resourceclaims", sub="status", operation="UPDATE", old=claim, group="resource.k8s.io"
    )


NV = "gpu.nvidia.com"


@pytest.fixture
def made() -> tuple[Any, dict[str, Any]]:
    """A pod charged 1 H200 through its claim from a generic class, and that claim as made."""
    obj = dra_pod("p", H200, templates=("t",), node_name="dra")
    obj["status"]["resourceClaimStatuses"] = [{"name": "t0", "resourceClaimName": "p-t0-x"}]
    claim = resource_claim(
        "p-t0-x", gpu_request(count=1), pod_owner={"name": "p", "uid": "uid-ns-p"}, pod_claim="t0"
    )
    state = dra_cluster(claim_template("t", gpu_request(count=1)), claim, obj)
    return state, claim


def test_the_schedulers_allocation_of_the_charged_model_passes(made: tuple[Any, dict[str, Any]]) -> None:
    state, claim = made
    decision = admission.validate(state, allocation_write(claim, "uid-ns-p", (NV, "dra", "gpu-0")), 0.0)
    assert decision == Allowed("it gives what its pods were charged for", card=H200)


def test_an_allocation_of_another_model_is_refused_naming_claim_model_and_numbers(
    made: tuple[Any, dict[str, Any]],
) -> None:
    state, claim = made
    decision = admission.validate(state, allocation_write(claim, "uid-ns-p", (NV, "r", "gpu-0")), 0.0)
    assert isinstance(decision, Denied)
    assert decision.message == (
        "resourceclaim ns/p-t0-x: its allocation gives 1 NVIDIA-GeForce-RTX-4090 to pod ns/p, which was"
        " charged for NVIDIA-H200: refused, so that no pod holds more of a model than its queue was charged"
    )


def test_an_allocation_of_more_devices_than_charged_is_refused(made: tuple[Any, dict[str, Any]]) -> None:
    state, claim = made
    write = allocation_write(claim, "uid-ns-p", (NV, "dra", "gpu-0"), (NV, "dra", "gpu-1"))
    decision = admission.validate(state, write, 0.0)
    assert (
        isinstance(decision, Denied)
        and "gives 2 NVIDIA-H200 to pod ns/p, which was charged for 1 NVIDIA-H200" in decision.message
    )


def test_an_allocation_to_a_pod_the_cache_has_not_seen_passes_and_of_an_unseen_device_is_refused(
    made: tuple[Any, dict[str, Any]],
) -> None:
    """A pod the cache has not seen yet (admitted, still in flight: what it holds is in the ledger,
    not per pod) does not stop the allocation; a device no ResourceSlice the cache has seen publishes
    does (the scheduler tries again once it is seen); another driver's device is not a GPU of ours."""
    state, claim = made
    stranger = admission.validate(state, allocation_write(claim, "uid-ns-nobody", (NV, "dra", "gpu-0")), 0.0)
    assert stranger == Allowed("reserved for no pod the cache knows")
    unseen = admission.validate(state, allocation_write(claim, "uid-ns-p", (NV, "dra", "gpu-9")), 0.0)
    assert (
        isinstance(unseen, Denied)
        and "device dra/gpu-9 of gpu.nvidia.com, which no ResourceSlice" in unseen.message
    )
    other_driver = admission.validate(
        state, allocation_write(claim, "uid-ns-p", ("nic.example.com", "n", "eth0")), 0.0
    )
    assert other_driver == Allowed("it gives no GPU of ours")


def test_an_allocation_to_a_pod_not_seen_yet_and_one_charged_nothing_is_refused(
    made: tuple[Any, dict[str, Any]],
) -> None:
    """The case that is refused beside the one above: a pod in flight among the pods the claim is
    reserved for lets nothing through; the pods the cache knows must have been charged what the
    allocation gives, and a pod charged no GPU was not."""
    state, claim = made
    ingest.upsert(state, pod("cpu", None, None))
    write = allocation_write(claim, "uid-ns-nobody", (NV, "dra", "gpu-0"), also_for=("uid-ns-cpu",))
    decision = admission.validate(state, write, 0.0)
    assert (
        isinstance(decision, Denied)
        and "gives 1 NVIDIA-H200 to pod ns/cpu, which was charged for no GPU" in decision.message
    ), decision


def test_an_allocation_to_a_pod_charged_for_no_gpu_is_refused(made: tuple[Any, dict[str, Any]]) -> None:
    """The backstop for a class read as no GPU: the pod was charged nothing, the scheduler gives it
    a GPU."""
    state, claim = made
    ingest.upsert(state, pod("cpu", None, None))
    decision = admission.validate(state, allocation_write(claim, "uid-ns-cpu", (NV, "dra", "gpu-0")), 0.0)
    assert (
        isinstance(decision, Denied)
        and "gives 1 NVIDIA-H200 to pod ns/cpu, which was charged for no GPU" in decision.message
    )


def test_a_claim_whose_pod_the_webhook_does_not_know_is_refused_not_let_through_unchecked() -> None:
    """Its pod's live read found nothing or timed out: allowed, it would be neither pinned nor
    checked; refused, the resource claim controller makes it again."""
    state = dra_cluster(claim_template("t", gpu_request(count=8)))
    claim = made_claim("ghost", "t0", gpu_request(count=8))
    refused = admission.validate(state, claim_request(claim), 0.0)
    assert isinstance(refused, Denied)
    assert refused.message.startswith(
        "resourceclaim ns/ghost-t0-… of pod ns/ghost: the webhook does not know the pod yet"
    )
    known = dra_cluster(claim_template("t", gpu_request(count=1)), dra_pod("ghost", H200, templates=("t",)))
    assert isinstance(
        admission.validate(known, claim_request(made_claim("ghost", "t0", gpu_request(count=1))), 0.0),
        Allowed,
    )


@pytest.mark.parametrize("webhook", ["validate", "mutate"])
def test_a_reviewed_pod_is_read_once_for_every_step(monkeypatch: pytest.MonkeyPatch, webhook: str) -> None:
    """Parse once (STYLE): the live-read step and the decision read the same template, read once;
    the pod's record (its metadata) is built once by the validation and not at all by the mutation
    of a pod that waits for nothing (it reads only the template: the device-plugin pod's hot path)."""
    from webhook.core.model import objects
    from webhook.serve import review, wire

    templates: list[object] = []
    records: list[object] = []
    read_resources, read_waiting = objects.resources_of, objects.pod_waiting
    monkeypatch.setattr(objects, "resources_of", lambda *a: templates.append(a) or read_resources(*a))
    monkeypatch.setattr(objects, "pod_waiting", lambda *a: records.append(a) or read_waiting(*a))
    state = dra_cluster(claim_template("t", gpu_request("g", "h200", 1)))
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "ns",
            "object": dra_pod("p", templates=("t",)),
        },
    }
    import json

    read = wire.to_request(wire.parse_review(json.dumps(body)))
    assert read.template is not None and read.template.claims  # what the live-read step looks at
    assert review.dra_to_fetch(state, read) == []
    assert isinstance(review.decide_request(state, read, webhook, 0.0), Allowed)  # type: ignore[arg-type]
    assert (len(templates), len(records)) == (1, 1 if webhook == "validate" else 0)


@pytest.mark.parametrize(
    "resource",
    [
        pytest.param("deviceclass.resource.kubernetes.io/h200", id="a class's implicit name"),
        pytest.param("example.com/h200", id="a class's extendedResourceName"),
    ],
)
def test_dra_extended_resources_are_card_requests_of_their_class(resource: str) -> None:
    """KEP-5004: the scheduler turns them into a claim of the class; without this they escaped."""
    state = dra_cluster(
        device_class(
            "h200",
            GPU_CLASS_CEL + " && " + PRODUCT_IS.format("NVIDIA H200"),
            card=H200,
            extended="example.com/h200",
        ),
        quota=SOME_H200,
    )
    over = pod("big", None, 3, resource=resource)
    found = demand(state, over)
    assert isinstance(found, PodDemand) and (found.spec.text, found.count) == (H200, 3 * UNIT)
    refused = decide(state, over)
    assert isinstance(refused, Denied) and 'queue "q" has 2 NVIDIA-H200 left' in refused.message
    assert "(extended resource" in refused.message
    assert isinstance(decide(state, pod("fits", None, 2, resource=resource)), Allowed)


def test_a_dra_extended_resource_pod_keeps_no_card_name_after_its_mutation() -> None:
    """Its mutation must not name its card through volcano.sh/card.name (a device-plugin count would
    then be asked of it): mutated and validated as the API server runs them, it is admitted."""
    state = dra_cluster(quota=SOME_H200)
    obj = pod("ext", None, 1, resource="deviceclass.resource.kubernetes.io/h200")
    mutated = admission.mutate(state, request(obj), 0.0)
    assert isinstance(mutated, Allowed)
    made = jsonpatch.apply_patch(obj, [dict(op) for op in mutated.patch])
    assert "volcano.sh/card.name" not in made["metadata"].get("annotations", {})
    assert isinstance(admission.validate(state, request(made), 0.0), Allowed)


def test_the_schedulers_claim_for_a_dra_served_nvidia_gpu_is_checked_against_the_pods_count() -> None:
    """The extended-resource form: a pod asking nvidia.com/gpu that DRA serves gets a claim the
    scheduler makes; its allocation is held to the pod's count, not refused for want of claims."""
    state = dra_cluster(pod("plain", H200, 1, node_name="dra"))
    claim = resource_claim(
        "plain-extended-x", gpu_request(count=1), pod_owner={"name": "plain", "uid": "uid-ns-plain"}
    )
    ok = admission.validate(state, allocation_write(claim, "uid-ns-plain", (NV, "dra", "gpu-0")), 0.0)
    assert ok == Allowed("it gives what its pods were charged for", card=H200)
    two = allocation_write(claim, "uid-ns-plain", (NV, "dra", "gpu-0"), (NV, "dra", "gpu-1"))
    refused = admission.validate(state, two, 0.0)
    assert (
        isinstance(refused, Denied)
        and "gives 2 NVIDIA-H200 to pod ns/plain, which was charged for 1 NVIDIA-H200" in refused.message
    )

"""SPEC §4b: GPUs asked through ResourceClaims count against the same card quota as device-plugin
GPUs. Table tests over small clusters built in memory, as ``test_pod_decisions`` does."""

from dataclasses import replace
from typing import Any

import jsonpatch
import pytest

from tests.builders import (
    GPU_CLASS_CEL,
    H200,
    MIG_CLASS_CEL,
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
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model.cards import UNIT, CardName
from webhook.core.model.demand import BadDemand, NotCardPod, PodDemand, pod_demand
from webhook.core.model.objects import pod_template_of
from webhook.core.model.verdicts import Allowed, Denied

H200_MIG = "NVIDIA-H200/mig-1g.18gb-mixed"
HAMI = "hami-core-gpu.project-hami.io"
HAMI_CEL = f"device.driver == '{HAMI}' && device.attributes['{HAMI}'].type == 'hami-gpu'"
PRODUCT_IS = "device.attributes['gpu.nvidia.com'].productName == '{}'"


def dra_cluster(
    *objects: dict[str, Any], quota: str = '{"NVIDIA-H200": 3, "NVIDIA-GeForce-RTX-4090": 2}'
) -> ClusterState:
    """Node ``dp`` serves 4 H200 through the device plugin; node ``dra`` 4 H200 and node ``r`` 2
    RTX-4090 through NVIDIA's DRA driver (no GPU labels, nothing in allocatable); NVIDIA's classes,
    a per-model class ``h200`` and queues ``q`` and ``other`` with ``quota``."""
    return cluster(
        node("dp", H200, 4),
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "dra"},
            "status": {"allocatable": {"cpu": "64"}},
        },
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "r"},
            "status": {"allocatable": {"cpu": "64"}},
        },
        resource_slice("dra", "NVIDIA H200", 4),
        resource_slice("r", "NVIDIA GeForce RTX 4090", 2, memory="24Gi"),
        device_class("gpu.nvidia.com"),
        device_class("mig.nvidia.com", MIG_CLASS_CEL),
        device_class("h200", GPU_CLASS_CEL, card=H200),
        queue("q", quota),
        queue("other", quota),
        *objects,
    )


def decide(state: ClusterState, obj: dict[str, Any]) -> Allowed | Denied:
    return admission.validate(state, request(obj), 0.0)


def dra_pod(
    name: str,
    card: str | None = None,
    *,
    templates: tuple[str, ...] = (),
    claims: tuple[str, ...] = (),
    **kw: Any,
) -> dict[str, Any]:
    return claiming(pod(name, card, None, **kw), templates=templates, claims=claims)


def pending(state: ClusterState, queue_name: str = "q", card: str = H200) -> int:
    return queue_usage(state, queue_name).card(CardName(card)).pending // UNIT


def add(state: ClusterState, *objects: dict[str, Any]) -> ClusterState:
    """Objects as a watch brings them: an odd one is skipped with its reason (a snapshot refuses it)."""
    for obj in objects:
        ingest.upsert(state, obj)
    return state


def demand(state: ClusterState, obj: dict[str, Any]) -> object:
    return pod_demand(pod_template_of(obj), state.inventory, state.policy)


# ---- inventory --------------------------------------------------------------------------------
def test_slice_devices_are_cards_of_their_nodes_by_the_device_plugins_names() -> None:
    state = dra_cluster(resource_slice("dra", "NVIDIA H200", 2, mig_profile="1g.18gb", name="dra-mig"))
    cards = state.inventory.cards
    assert cards[CardName(H200)].total == 8 * UNIT  # 4 through the device plugin, 4 through DRA
    assert cards[CardName(H200)].nodes == ("dp", "dra")
    assert cards[CardName(R4090)].total == 2 * UNIT
    assert cards[CardName(H200_MIG)].total == 2 * UNIT
    assert dict(state.nodes["dra"].devices) == {H200: 4 * UNIT, H200_MIG: 2 * UNIT}


def test_a_gpu_both_forms_show_is_counted_once() -> None:
    """A node whose device plugin and DRA driver both show its 4 GPUs has 4, not 8."""
    state = dra_cluster(resource_slice("dp", "NVIDIA H200", 4))
    assert state.inventory.cards[CardName(H200)].total == 8 * UNIT
    assert dict((c.name, c.count) for c in state.nodes["dp"].cards) == {H200: 4 * UNIT}


def test_slices_going_away_take_their_cards() -> None:
    state = dra_cluster()
    ingest.remove(state, resource_slice("r", "NVIDIA GeForce RTX 4090", 2))
    assert CardName(R4090) not in state.inventory.cards


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        pytest.param(resource_slice("dra", "", 1, name="s"), "has no productName", id="no product"),
        pytest.param(
            resource_slice(
                "dra",
                "NVIDIA H200",
                1,
                name="s",
                extra={"attributes": {"type": {"string": "vfio"}, "productName": {"string": "NVIDIA H200"}}},
            ),
            "neither a GPU nor a MIG",
            id="vfio",
        ),
        pytest.param(
            {
                **resource_slice("dra", "NVIDIA H200", 1, name="s"),
                "spec": {"driver": "gpu.nvidia.com", "allNodes": True, "devices": []},
            },
            "no one node",
            id="network attached",
        ),
        pytest.param(
            {
                **resource_slice("dra", "NVIDIA H200", 1, name="s"),
                "spec": {"driver": "gpu.nvidia.com", "nodeName": "dra", "devices": "x"},
            },
            "not a list",
            id="devices not a list",
        ),
    ],
)
def test_slices_of_odd_shape_are_skipped_with_a_reason(obj: dict[str, Any], why: str) -> None:
    state = add(dra_cluster(), obj)
    assert why in state.skipped["ResourceSlice/s"]
    assert state.inventory.cards[CardName(H200)].total == 8 * UNIT


def test_another_drivers_slice_is_not_a_card() -> None:
    state = dra_cluster(resource_slice("dra", "NVIDIA H200", 4, driver="example.com/nic", name="nic"))
    assert state.inventory.cards[CardName(H200)].total == 8 * UNIT


# ---- the card of a request ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("objects", "card", "expected"),
    [
        pytest.param(
            (claim_template("t", gpu_request("g", "h200", 2)),), None, (H200, 2), id="per-model class"
        ),
        pytest.param(
            (claim_template("t", gpu_request(count=2)),), H200, (H200, 2), id="generic class, card.name"
        ),
        pytest.param(
            (claim_template("t", gpu_request(count=1, selectors=(PRODUCT_IS.format("NVIDIA H200"),))),),
            None,
            (H200, 1),
            id="request selector",
        ),
        pytest.param(
            (
                claim_template(
                    "t",
                    gpu_request(
                        count=1,
                        selectors=('device.attributes["gpu.nvidia.com"]["productName"] in ["NVIDIA H200"]',),
                    ),
                ),
            ),
            None,
            (H200, 1),
            id="selector, index form and in",
        ),
        pytest.param(
            (
                device_class("h200-only", f"{GPU_CLASS_CEL} && {PRODUCT_IS.format('NVIDIA H200')}"),
                claim_template("t", gpu_request("g", "h200-only", 3)),
            ),
            None,
            (H200, 3),
            id="class selector",
        ),
        pytest.param(
            (
                resource_slice("dra", "NVIDIA H200", 2, mig_profile="1g.18gb", name="dra-mig"),
                claim_template(
                    "t",
                    gpu_request(
                        "g",
                        "mig.nvidia.com",
                        2,
                        selectors=(
                            PRODUCT_IS.format("NVIDIA H200")
                            + " && device.attributes['gpu.nvidia.com'].profile == '1g.18gb'",
                        ),
                    ),
                ),
            ),
            None,
            (H200_MIG, 2),
            id="MIG",
        ),
        pytest.param(
            (claim_template("t", gpu_request(count=1), gpu_request("b", count=2)),),
            H200,
            (H200, 3),
            id="two requests add up",
        ),
        pytest.param(
            (
                claim_template(
                    "t",
                    gpu_request(
                        count=1,
                        selectors=(
                            PRODUCT_IS.format("NVIDIA H200"),
                            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
                        ),
                    ),
                ),
            ),
            None,
            (H200, 1),
            id="a term not read only narrows",
        ),
    ],
)
def test_the_card_of_a_request(
    objects: tuple[dict[str, Any], ...], card: str | None, expected: tuple[str, int]
) -> None:
    state = dra_cluster(*objects)
    found = demand(state, dra_pod("p", card, templates=("t",)))
    assert isinstance(found, PodDemand), found
    assert (found.spec.text, found.count // UNIT) == expected
    assert found.only_claims


@pytest.mark.parametrize(
    ("objects", "card", "says"),
    [
        pytest.param(
            (
                device_class("nothing-published", f"{GPU_CLASS_CEL} && {PRODUCT_IS.format('NVIDIA B200')}"),
                claim_template("t", gpu_request("g", "nothing-published", 1)),
            ),
            None,
            [
                "whose selectors select no GPU a ResourceSlice publishes",
                "pod annotation cardquota.volcano.sh/card",
                "DeviceClass annotated cardquota.volcano.sh/card",
            ],
            id="a model no slice publishes, no card.name",
        ),
        pytest.param(
            (
                claim_template(
                    "t",
                    gpu_request(
                        count=1, selectors=("device.attributes['gpu.nvidia.com'].productName.size()",)
                    ),
                ),
            ),
            None,
            [
                "whose model cannot be read: its CEL selector",
                "fails on device dra/gpu-0: its result is of type int, not bool",
            ],
            id="a selector that is no condition",
        ),
        pytest.param(
            (claim_template("t", gpu_request(count=1, selectors=("device.attributes['gpu.nvidia.com'].",))),),
            None,
            ["whose model cannot be read", "does not compile"],
            id="a selector that does not compile",
        ),
        pytest.param(
            (claim_template("t", gpu_request(mode="All", count=None)),),
            H200,
            ["allocationMode All", "unbounded"],
            id="All",
        ),
        pytest.param(
            (
                claim_template(
                    "t", gpu_request(count=1, selectors=(PRODUCT_IS.format("NVIDIA GeForce RTX 4090"),))
                ),
            ),
            H200,
            ["names card NVIDIA-H200 but asks NVIDIA-GeForce-RTX-4090"],
            id="selector against card.name",
        ),
        pytest.param(
            (
                claim_template(
                    "t",
                    gpu_request("g", "h200", 1, selectors=(PRODUCT_IS.format("NVIDIA GeForce RTX 4090"),)),
                ),
            ),
            None,
            ["asks NVIDIA-GeForce-RTX-4090 of DeviceClass h200, whose devices are NVIDIA-H200"],
            id="selector against the class",
        ),
        pytest.param(
            (
                claim_template("t", gpu_request("g", "h200", 1)),
                claim_template(
                    "u", gpu_request(count=1, selectors=(PRODUCT_IS.format("NVIDIA GeForce RTX 4090"),))
                ),
            ),
            None,
            ["one model"],
            id="two models",
        ),
        pytest.param((), H200, ["ResourceClaimTemplate ns/t, which does not exist"], id="no template"),
        pytest.param(
            (
                claim_template(
                    "t", gpu_request("g", "nope", 1, selectors=("device.driver == 'gpu.nvidia.com'",))
                ),
            ),
            H200,
            ["DeviceClass nope", "does not exist"],
            id="no class",
        ),
        pytest.param(
            (claim_template("t", gpu_request(count=10**9)),),
            H200,
            ["asks 1000000000 devices (at most 65536)"],
            id="huge count",
        ),
        pytest.param(
            (device_class("bad", card="not a card|"), claim_template("t", gpu_request("g", "bad", 1))),
            None,
            ["cardquota.volcano.sh/card is malformed"],
            id="malformed class annotation",
        ),
    ],
)
def test_requests_we_cannot_count_are_refused_saying_why(
    objects: tuple[dict[str, Any], ...], card: str | None, says: list[str]
) -> None:
    names = tuple(o["metadata"]["name"] for o in objects if o["kind"] == "ResourceClaimTemplate")
    templates = names or ("t",)
    state = add(dra_cluster(), *objects)
    decision = decide(state, dra_pod("p", card, templates=templates))
    assert isinstance(decision, Denied), decision
    assert decision.message.startswith("pod ns/p ")
    for text in says:
        assert text in decision.message


def test_admin_access_and_other_drivers_are_not_charged() -> None:
    state = dra_cluster(
        device_class("nic", "device.driver == 'example.com/nic'"),
        claim_template("t", gpu_request("g", "gpu.nvidia.com", 1, admin=True), gpu_request("n", "nic", 4)),
    )
    assert isinstance(demand(state, dra_pod("p", templates=("t",))), NotCardPod)
    assert isinstance(decide(state, dra_pod("p", templates=("t",))), Allowed)
    ingest.upsert(
        state,
        claim_template(
            "u",
            gpu_request("g", "h200", 1, admin=True),
            gpu_request("h", "h200", 1),
            gpu_request("n", "nic", 4),
        ),
    )
    found = demand(state, dra_pod("p", templates=("u",)))
    assert isinstance(found, PodDemand) and found.count == UNIT  # the admin request and the NIC free


def test_an_exact_count_left_out_is_one() -> None:
    state = dra_cluster(claim_template("t", gpu_request("g", "h200", None)))
    found = demand(state, dra_pod("p", templates=("t",)))
    assert isinstance(found, PodDemand) and found.count == UNIT


def test_first_available_is_a_choice_of_models_with_a_count_each() -> None:
    state = dra_cluster(
        claim_template(
            "t",
            first_available(
                "gpu",
                gpu_request("big", count=1, selectors=(PRODUCT_IS.format("NVIDIA H200"),)),
                gpu_request("small", count=2, selectors=(PRODUCT_IS.format("NVIDIA GeForce RTX 4090"),)),
            ),
        )
    )
    found = demand(state, dra_pod("p", templates=("t",)))
    assert isinstance(found, PodDemand) and found.claims is not None
    assert found.spec.text == f"{H200}|{R4090}"
    assert dict(found.claims.per_card) == {H200: UNIT, R4090: 2 * UNIT}


def test_a_consumable_share_is_the_larger_fraction_of_one_card() -> None:
    state = dra_cluster(
        resource_slice("dra", "NVIDIA H200", 2, driver=HAMI, name="hami"),
        device_class(HAMI, HAMI_CEL),
        claim_template("t", gpu_request("g", HAMI, 1, capacity={"cores": "30", "memory": "4Gi"})),
    )
    found = demand(state, dra_pod("p", H200, templates=("t",)))
    assert isinstance(found, PodDemand)
    assert found.count == 300  # 30 % of its compute beats 4 of its 80 GiB


def test_a_share_larger_than_a_card_is_refused() -> None:
    state = dra_cluster(
        resource_slice("dra", "NVIDIA H200", 2, driver=HAMI, name="hami"),
        device_class(HAMI, HAMI_CEL),
        claim_template("t", gpu_request("g", HAMI, 1, capacity={"memory": "100Gi"})),
    )
    found = demand(state, dra_pod("p", H200, templates=("t",)))
    assert isinstance(found, BadDemand) and "more than one has" in found.reason


# ---- one quota for both forms ------------------------------------------------------------------
def test_device_plugin_and_dra_pods_share_one_quota_exactly() -> None:
    state = dra_cluster(
        claim_template("two", gpu_request("g", "h200", 2)),
        pod("dp-0", H200, 1),
        dra_pod("dra-0", templates=("two",)),
    )
    assert pending(state) == 3  # 1 through the device plugin, 2 through a claim: the quota
    refused = decide(state, dra_pod("dra-1", templates=("two",)))
    assert isinstance(refused, Denied)
    assert refused.message == (
        'queue "q" has 0 NVIDIA-H200 left (quota 3: 3 pending); pod ns/dra-1'
        " (claim t0 from template two: 2 NVIDIA-H200) needs 2"
    )
    assert isinstance(decide(state, pod("dp-1", H200, 1)), Denied)
    assert isinstance(decide(state, pod("r-0", R4090, 1)), Allowed)


def test_a_pod_asking_through_both_forms_is_charged_both() -> None:
    state = dra_cluster(claim_template("one", gpu_request("g", "h200", 1)))
    found = demand(state, claiming(pod("p", H200, 1), templates=("one",)))
    assert isinstance(found, PodDemand) and found.count == 2 * UNIT and not found.only_claims


def test_a_claim_made_from_its_template_is_what_the_pod_is_charged() -> None:
    """Once the pod's status names the claim made for it, the claim counts, not the template (a
    template replaced later does not change what running pods hold)."""
    obj = dra_pod("p", templates=("t",), uid="uid-p")
    obj["status"]["resourceClaimStatuses"] = [{"name": "t0", "resourceClaimName": "p-t0-abcde"}]
    state = dra_cluster(
        claim_template("t", gpu_request("g", "h200", 3)),
        resource_claim(
            "p-t0-abcde", gpu_request("g", "h200", 1), pod_owner={"name": "p", "uid": "uid-p"}, pod_claim="t0"
        ),
        obj,
    )
    assert pending(state) == 1


def test_a_shared_claim_is_charged_once_and_refused_to_another_queue() -> None:
    state = dra_cluster(
        resource_claim("shared", gpu_request("g", "h200", 2)),
        dra_pod("a", claims=("shared",)),
        dra_pod("b", claims=("shared",)),
    )
    assert pending(state) == 2
    assert isinstance(decide(state, dra_pod("c", claims=("shared",))), Allowed)
    refused = decide(state, dra_pod("d", claims=("shared",), queue_name="other"))
    assert isinstance(refused, Denied)
    assert "shares ResourceClaim ns/shared with pod ns/a of queue 'q'" in refused.message
    assert "not to queue 'other'" in refused.message


def test_a_shared_claim_goes_on_being_charged_when_its_first_pod_goes() -> None:
    a, b = dra_pod("a", claims=("shared",)), dra_pod("b", claims=("shared",))
    state = dra_cluster(resource_claim("shared", gpu_request("g", "h200", 2)), a, b)
    ingest.remove(state, a)
    assert pending(state) == 2
    ingest.remove(state, b)
    assert pending(state) == 0


def test_a_template_that_arrives_after_its_pods_charges_them() -> None:
    state = dra_cluster(dra_pod("a", templates=("late",)))
    assert pending(state) == 0  # unreadable: refused at its create, charged nothing here
    ingest.upsert(state, claim_template("late", gpu_request("g", "h200", 2)))
    assert pending(state) == 2


def test_a_template_replaced_after_its_pod_was_charged_changes_nothing_until_the_claim() -> None:
    state = dra_cluster(claim_template("t", gpu_request("g", "h200", 2)), dra_pod("a", templates=("t",)))
    ingest.upsert(state, claim_template("t", gpu_request("g", "h200", 3)))
    assert pending(state) == 2
    assert state.claims.admitted("uid-ns-a", "t0") == 2 * UNIT


def test_a_dra_only_pod_is_not_confined_by_node_labels() -> None:
    """DRA nodes need no GPU labels: the claim holds the model (SPEC §6b), not node affinity."""
    state = dra_cluster(claim_template("t", gpu_request("g", "h200", 1)))
    mutated = admission.mutate(state, request(dra_pod("p", templates=("t",))), 0.0)
    assert not any("affinity" in op["path"] for op in mutated.patch)
    plain = admission.mutate(state, request(pod("q", H200, 1)), 0.0)
    assert any("affinity" in op["path"] for op in plain.patch)


def test_status_shows_the_cards_resource_slices_publish_and_their_nodes() -> None:
    from webhook.core.decide.report import cluster_status, status_table

    status = cluster_status(dra_cluster())
    assert status["cards"][H200]["dra"] == {"devices": 4, "nodes": ["dra"]}
    assert status["cards"][R4090]["dra"] == {"devices": 2, "nodes": ["r"]}
    assert "4 in ResourceSlices on dra" in status_table(status)


# ---- the claim made for a pod (SPEC §6b) --------------------------------------------------------
def made_claim(pod_name: str, entry: str, *requests: dict[str, Any]) -> dict[str, Any]:
    """A claim as the resource claim controller creates it for ``pod_name``'s entry ``entry``."""
    obj = resource_claim(
        "", *requests, pod_owner={"name": pod_name, "uid": f"uid-ns-{pod_name}"}, pod_claim=entry
    )
    obj["metadata"].pop("name")
    obj["metadata"]["generateName"] = f"{pod_name}-{entry}-"
    return obj


def claim_request(obj: dict[str, Any]) -> Any:
    return request(obj, resource="resourceclaims", group="resource.k8s.io")


def test_a_claim_from_a_generic_class_is_pinned_to_the_pods_card() -> None:
    state = dra_cluster(claim_template("t", gpu_request(count=2)), dra_pod("p", H200, templates=("t",)))
    claim = made_claim("p", "t0", gpu_request(count=2))
    mutated = admission.mutate(state, claim_request(claim), 0.0)
    assert isinstance(mutated, Allowed)
    assert list(mutated.patch) == [
        {
            "op": "add",
            "path": "/spec/devices/requests/0/exactly/selectors",
            "value": [
                {"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}
            ],
        }
    ]
    pinned = jsonpatch.apply_patch(claim, list(mutated.patch))
    again = admission.mutate(state, claim_request(pinned), 0.0)
    assert not again.patch  # idempotent
    assert isinstance(admission.validate(state, claim_request(pinned), 0.0), Allowed)


def test_a_claim_whose_class_names_the_model_is_left_as_it_is() -> None:
    state = dra_cluster(claim_template("t", gpu_request("g", "h200", 2)), dra_pod("p", templates=("t",)))
    mutated = admission.mutate(state, claim_request(made_claim("p", "t0", gpu_request("g", "h200", 2))), 0.0)
    assert not mutated.patch


def test_a_first_available_claim_keeps_the_alternative_its_pod_was_assigned() -> None:
    choice = first_available(
        "gpu",
        gpu_request("big", count=1, selectors=(PRODUCT_IS.format("NVIDIA H200"),)),
        gpu_request("small", count=2, selectors=(PRODUCT_IS.format("NVIDIA GeForce RTX 4090"),)),
    )
    assigned = dra_pod(
        "p", R4090, templates=("t",), annotations={"cardquota.volcano.sh/card.spec": f"{H200}|{R4090}"}
    )
    state = dra_cluster(claim_template("t", choice), assigned)
    mutated = admission.mutate(state, claim_request(made_claim("p", "t0", choice)), 0.0)
    assert list(mutated.patch) == [
        {
            "op": "replace",
            "path": "/spec/devices/requests/0/firstAvailable",
            "value": [choice["firstAvailable"][1]],
        }
    ]


def test_a_mig_claim_is_pinned_to_its_profile() -> None:
    state = dra_cluster(
        resource_slice("dra", "NVIDIA H200", 2, mig_profile="1g.18gb", name="dra-mig"),
        resource_slice("dra", "NVIDIA H200", 1, mig_profile="3g.71gb", name="dra-mig-3g", start=2),
        claim_template("t", gpu_request("g", "mig.nvidia.com", 1)),
        dra_pod("p", H200_MIG, templates=("t",)),
    )
    mutated = admission.mutate(
        state, claim_request(made_claim("p", "t0", gpu_request("g", "mig.nvidia.com", 1))), 0.0
    )
    (op,) = mutated.patch
    assert op["value"][0]["cel"]["expression"] == (
        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
        " && device.attributes['gpu.nvidia.com'].profile == '1g.18gb'"
    )


def test_a_claim_larger_than_its_pod_was_admitted_with_is_refused() -> None:
    """The template was replaced by a larger one after the pod was admitted: refused at the claim."""
    state = dra_cluster(claim_template("t", gpu_request("g", "h200", 1)), dra_pod("p", templates=("t",)))
    ingest.upsert(state, claim_template("t", gpu_request("g", "h200", 3)))
    refused = admission.validate(
        state, claim_request(made_claim("p", "t0", gpu_request("g", "h200", 3))), 0.0
    )
    assert isinstance(refused, Denied)
    assert refused.message == (
        "resourceclaim ns/p-t0-… of pod ns/p asks 3 NVIDIA-H200, but the pod was admitted with 1 for its"
        " claim t0: its template t asks more than when the pod was created; delete the pod to have it"
        " admitted again as the template is now"
    )
    same = admission.validate(state, claim_request(made_claim("p", "t0", gpu_request("g", "h200", 1))), 0.0)
    assert isinstance(same, Allowed)


def test_a_claim_of_another_model_than_its_pods_is_refused() -> None:
    state = dra_cluster(claim_template("t", gpu_request(count=1)), dra_pod("p", H200, templates=("t",)))
    other = made_claim(
        "p", "t0", gpu_request(count=1, selectors=(PRODUCT_IS.format("NVIDIA GeForce RTX 4090"),))
    )
    refused = admission.validate(state, claim_request(other), 0.0)
    assert (
        isinstance(refused, Denied)
        and "names card NVIDIA-H200 but asks NVIDIA-GeForce-RTX-4090" in refused.message
    )


# ---- allocation checked (SPEC §4b) --------------------------------------------------------------
def allocated_pod(
    card: str | None, allocated: tuple[str, str], *, name: str = "p"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pod bound to ``allocated``'s node and its claim made from template ``t`` allocated
    (pool, device)."""
    obj = dra_pod(name, card, templates=("t",), node_name=allocated[0])
    obj["status"]["resourceClaimStatuses"] = [{"name": "t0", "resourceClaimName": f"{name}-t0-x"}]
    claim = resource_claim(
        f"{name}-t0-x",
        gpu_request(count=1),
        pod_owner={"name": name, "uid": f"uid-ns-{name}"},
        pod_claim="t0",
        allocated=(("gpu", *allocated),),
    )
    return obj, claim


def test_an_allocation_on_the_charged_model_changes_nothing() -> None:
    obj, claim = allocated_pod(H200, ("dra", "gpu-0"))
    state = dra_cluster(claim_template("t", gpu_request(count=1)), claim, obj)
    assert queue_usage(state, "q").card(CardName(H200)).bound == UNIT
    assert not state.claims.off_model


def test_an_allocation_on_another_model_is_counted_as_allocated_and_reported() -> None:
    """It must not happen to a pinned claim; a claim made before the webhook was installed can."""
    obj, claim = allocated_pod(H200, ("r", "gpu-0"))
    state = dra_cluster(claim_template("t", gpu_request(count=1)), claim, obj)
    usage = queue_usage(state, "q")
    assert (usage.card(CardName(H200)).used, usage.card(CardName(R4090)).bound) == (0, UNIT)
    assert state.claims.off_model == {"ns/p-t0-x": ("ns/p", H200, R4090, R4090)}
    from webhook.core.decide.report import cluster_status

    status = cluster_status(state)
    assert status["claims_off_model"] == [
        {"claim": "ns/p-t0-x", "pod": "ns/p", "charged": H200, "allocated": R4090}
    ]
    assert any(
        "was allocated NVIDIA-GeForce-RTX-4090 but charged for NVIDIA-H200" in w for w in status["warnings"]
    )
    ingest.remove(state, obj)
    assert not state.claims.off_model and queue_usage(state, "q").card(CardName(R4090)).used == 0


@pytest.mark.parametrize(("device", "card"), [("gpu-5", R4090), ("gpu-0", H200)])
def test_the_allocation_decides_an_unassigned_first_available_pods_model(device: str, card: str) -> None:
    """Bound to a node that has both models (so the node cannot tell), it is counted on the model
    of the device its claim got."""
    choice = first_available(
        "gpu",
        gpu_request("big", count=1, selectors=(PRODUCT_IS.format("NVIDIA H200"),)),
        gpu_request("small", count=1, selectors=(PRODUCT_IS.format("NVIDIA GeForce RTX 4090"),)),
    )
    obj, claim = allocated_pod(None, ("dra", device))
    claim["spec"]["devices"]["requests"] = [choice]
    both = resource_slice("dra", "NVIDIA GeForce RTX 4090", 2, name="dra-4090", start=4)  # gpu-4, gpu-5
    state = dra_cluster(both, claim_template("t", choice), claim, obj)
    assert state.nodes["dra"].card_names() >= {H200, R4090}
    usage = queue_usage(state, "q")
    assert (usage.card(CardName(card)).bound, sum(usage.card(CardName(c)).used for c in (H200, R4090))) == (
        UNIT,
        UNIT,
    )
    assert not state.claims.off_model


def test_our_pod_annotation_names_the_model_where_card_name_cannot() -> None:
    """The capacity-card plugin asks a pod naming volcano.sh/card.name for its nvidia.com/gpu: a DRA
    pod says its model with cardquota.volcano.sh/card instead."""
    state = dra_cluster(claim_template("t", gpu_request(count=2)))
    obj = dra_pod("p", templates=("t",), annotations={"cardquota.volcano.sh/card": H200})
    found = demand(state, obj)
    assert isinstance(found, PodDemand) and (found.spec.text, found.count) == (H200, 2 * UNIT)


def test_an_assigned_dra_pod_gets_our_annotation_not_card_name() -> None:
    choice = first_available(
        "gpu",
        gpu_request("big", count=1, selectors=(PRODUCT_IS.format("NVIDIA H200"),)),
        gpu_request("small", count=1, selectors=(PRODUCT_IS.format("NVIDIA GeForce RTX 4090"),)),
    )
    state = dra_cluster(claim_template("t", choice), quota='{"NVIDIA-H200": 0, "NVIDIA-GeForce-RTX-4090": 1}')
    mutated = admission.mutate(state, request(dra_pod("p", templates=("t",))), 0.0)
    ops = {op["path"]: op["value"] for op in mutated.patch}
    assert ops["/metadata/annotations/cardquota.volcano.sh~1card"] == R4090
    assert ops["/metadata/annotations/cardquota.volcano.sh~1card.spec"] == f"{H200}|{R4090}"
    assert "/metadata/annotations/volcano.sh~1card.name" not in ops


def test_the_podgroup_of_a_pod_whose_claim_another_pod_pays_for_reserves_nothing() -> None:
    from webhook.core.decide import patches

    a, b = dra_pod("a", claims=("shared",)), dra_pod("b", claims=("shared",))
    state = dra_cluster(resource_claim("shared", gpu_request("g", "h200", 1)), a, b)
    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": "pg-b",
            "namespace": "ns",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": "b", "uid": "uid-ns-b", "controller": True}
            ],
        },
        "spec": {"minMember": 1, "queue": "q"},
    }
    first = {
        **group,
        "metadata": {
            **group["metadata"],
            "name": "pg-a",
            "ownerReferences": [{**group["metadata"]["ownerReferences"][0], "name": "a", "uid": "uid-ns-a"}],
        },
    }
    paid = patches.podgroup_patch(state, first, state.pods["uid-ns-a"])
    assert {op["path"]: op["value"] for op in paid.patch}["/metadata/annotations"] == {
        "volcano.sh/card.name": H200,
        "volcano.sh/card.request": '{"NVIDIA-H200":1}',
    }
    free = patches.podgroup_patch(state, group, state.pods["uid-ns-b"])
    assert not any("card.request" in str(op) for op in free.patch)


@pytest.mark.parametrize("step", ["validate", "mutate"])
def test_a_reviewed_pod_naming_no_namespace_has_its_claims_read_in_the_requests(step: str) -> None:
    """A review whose pod names no namespace (hand-written: the API server fills it in) is read in
    the request's namespace, its claim templates too: the pod asks 2 H200 of a quota of 1."""
    state = dra_cluster(claim_template("t", gpu_request("g", "h200", 2)), quota='{"NVIDIA-H200": 1}')
    obj = dra_pod("a", templates=("t",))
    del obj["metadata"]["namespace"]
    review = replace(request(obj), namespace="ns")
    review = replace(review, template=admission.pod_template("pods", "", "CREATE", obj, "ns"))
    if step == "validate":
        decision = admission.validate(state, review, 0.0)
        assert isinstance(decision, Denied), decision
        assert "pod ns/a" in decision.message and "2 NVIDIA-H200" in decision.message, decision.message
    else:
        decision = admission.mutate(state, review, None, 0.0)
        assert isinstance(decision, Allowed) and decision.card == H200, decision

"""SPEC §4b, "a charge lives as long as its pod": what a card pod is charged (card, count, queue,
the claims it pays) is fixed when it is admitted or first seen. An edit of the annotations the
count reads is refused (``decide_pod_update``); one that got past the webhook moves nothing in the
cache; a DeviceClass deleted or a template replaced under a pod changes nothing it holds."""

from typing import Any

import pytest

from tests.builders import H200, R4090, claim_template, gpu_request, pod, podgroup, queue, request
from tests.core.test_dra import add, claim_request, dra_cluster, dra_pod, made_claim
from webhook.core.decide import admission
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model import keys
from webhook.core.model.cards import UNIT, CardName
from webhook.core.model.verdicts import Allowed, Denied

QUOTA = '{"NVIDIA-H200": 1, "NVIDIA-GeForce-RTX-4090": 2}'


def used(state: ClusterState, queue_name: str, card: str = H200) -> int:
    return queue_usage(state, queue_name).card(CardName(card)).used // UNIT


def edited(obj: dict[str, Any], **changes: str | None) -> dict[str, Any]:
    """``obj`` with these annotations set (a value) or removed (None); keys by their last part."""
    by_name = {
        "card": keys.CARD_NAME,
        "dra_card": keys.DRA_CARD,
        "spec": keys.CARD_SPEC,
        "queue": keys.QUEUE_NAME,
        "group": keys.GROUP_NAME,
    }
    out = {
        **obj,
        "metadata": {**obj["metadata"], "annotations": dict(obj["metadata"].get("annotations", {}))},
    }
    for name, value in changes.items():
        if value is None:
            out["metadata"]["annotations"].pop(by_name[name], None)
        else:
            out["metadata"]["annotations"][by_name[name]] = value
    return out


def running(name: str = "a", phase: str = "Running", **kw: Any) -> dict[str, Any]:
    return pod(name, H200, 1, node_name="dp", phase=phase, **kw)


def update(state: ClusterState, old: dict[str, Any], new: dict[str, Any]) -> Allowed | Denied:
    return admission.validate(state, request(new, operation="UPDATE", old=old), 0.0)


# ---- the cache: an edit that got through moves nothing ------------------------------------------
@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"card": None}, id="card.name removed"),
        pytest.param({"card": "NVIDIA-H999"}, id="card.name to a model no quota has"),
        pytest.param({"card": R4090}, id="card.name to another model"),
        pytest.param({"card": "bad name!"}, id="card.name unreadable"),
        pytest.param({"queue": "other"}, id="queue moved"),
        pytest.param({"queue": None}, id="queue removed"),
    ],
)
def test_an_edit_of_a_running_pods_card_or_queue_moves_nothing(changes: dict[str, str | None]) -> None:
    a = running()
    state = dra_cluster(a, quota=QUOTA)
    assert used(state, "q") == 1
    add(state, edited(a, **changes))
    assert (used(state, "q"), used(state, "other"), used(state, "q", R4090)) == (1, 0, 0)
    refused = admission.validate(state, request(pod("b", H200, 1)), 0.0)
    assert isinstance(refused, Denied) and 'queue "q" has 0 NVIDIA-H200 left' in refused.message


def test_a_pod_named_into_a_podgroup_once_stays_in_it() -> None:
    a = running(group="pg-1")
    state = dra_cluster(a, quota=QUOTA)
    add(state, edited(a, group="pg-2"))
    assert state.charged.charge("uid-ns-a").group == "ns/pg-1"
    b = running("b")  # Volcano names the PodGroup of a pod created without one, after the pod
    add(state, b, edited(b, group="podgroup-b"))
    assert state.charged.charge("uid-ns-b").group == "ns/podgroup-b"


def test_a_pod_released_from_our_gate_is_charged_as_released() -> None:
    """The release writes the model of an ``A|B`` pod: the charge starts there, not before."""
    gated = pod("g", f"{H200}|{R4090}", 1, gated=5.0)
    state = dra_cluster(gated, quota=QUOTA)
    assert used(state, "q") == 0
    add(state, edited(pod("g", H200, 1), spec=f"{H200}|{R4090}"))
    assert used(state, "q") == 1


def test_a_dra_pod_keeps_its_charge_when_its_class_is_deleted_or_its_template_replaced() -> None:
    state = dra_cluster(
        claim_template("t", gpu_request("g", "h200", 1)), dra_pod("p", templates=("t",)), quota=QUOTA
    )
    assert used(state, "q") == 1
    ingest.upsert(state, claim_template("t", gpu_request("g", "h200", 3)))
    ingest.remove(
        state, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "h200"}}
    )
    assert used(state, "q") == 1
    assert isinstance(admission.validate(state, request(pod("b", H200, 1)), 0.0), Denied)


def test_a_dra_pod_admitted_in_flight_is_charged_as_admitted_not_as_its_template_is_at_arrival() -> None:
    """The template is replaced by a larger one between the pod's admission and the cache seeing
    it: it is charged what it was admitted with, and the claim made from the new template refused."""
    state = dra_cluster(claim_template("t", gpu_request("g", "h200", 1)), quota='{"NVIDIA-H200": 3}')
    p = dra_pod("p", templates=("t",))
    admitted = admission.validate(state, request(p), 0.0)
    assert isinstance(admitted, Allowed)
    admission.admit(state, request(p), admitted, 0.0)
    ingest.upsert(state, claim_template("t", gpu_request("g", "h200", 3)))
    add(state, p)
    assert used(state, "q") == 1
    refused = admission.validate(
        state, claim_request(made_claim("p", "t0", gpu_request("g", "h200", 3))), 0.0
    )
    assert isinstance(refused, Denied) and "the pod was admitted with 1 for its claim t0" in refused.message


# ---- the webhook: the edit refused -------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "names"),
    [
        pytest.param({"card": None}, keys.CARD_NAME, id="card.name"),
        pytest.param({"dra_card": H200}, keys.DRA_CARD, id="cardquota card"),
        pytest.param({"spec": f"{H200}|{R4090}"}, keys.CARD_SPEC, id="card.spec"),
        pytest.param({"queue": "other"}, keys.QUEUE_NAME, id="queue"),
        pytest.param({"group": "pg-2"}, keys.GROUP_NAME, id="group renamed"),
        pytest.param({"card": R4090, "queue": "other"}, f"{keys.CARD_NAME}, {keys.QUEUE_NAME}", id="both"),
    ],
)
def test_an_edit_of_a_card_pods_charge_is_refused_naming_it(
    changes: dict[str, str | None], names: str
) -> None:
    a = running(group="pg-1")
    state = dra_cluster(a, quota=QUOTA)
    refused = update(state, a, edited(a, **changes))
    assert isinstance(refused, Denied)
    assert refused.message == (
        f'pod ns/a is charged 1 NVIDIA-H200 to queue "q": {names} cannot change while the pod lives'
        " (its charge would drop or move while it keeps its cards); delete the pod and create it anew"
        " to change its card or queue"
    )
    assert (refused.queue, refused.card) == ("q", H200)


def test_a_gated_pods_card_edit_is_refused_too() -> None:
    """Under our gate it is charged nothing yet, but what it waits for would change."""
    gated = pod("g", H200, 1, gated=5.0)
    state = dra_cluster(gated, quota=QUOTA)
    refused = update(state, gated, edited(gated, card=R4090))
    assert isinstance(refused, Denied) and "pod ns/g asks 1 NVIDIA-H200 of queue" in refused.message


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param(running(), edited(running(), group="podgroup-a"), id="its PodGroup named once"),
        pytest.param(
            pod("cpu", None, None, phase="Running"),
            edited(pod("cpu", None, None, phase="Running"), queue="other"),
            id="not a card pod",
        ),
        pytest.param(
            running(phase="Succeeded"), edited(running(phase="Succeeded"), card=None), id="finished"
        ),
        pytest.param(running(), edited(running(), card=H200), id="unchanged"),
    ],
)
def test_edits_that_move_no_charge_pass(old: dict[str, Any], new: dict[str, Any]) -> None:
    state = dra_cluster(old, quota=QUOTA)
    assert isinstance(update(state, old, {**new, "kind": "Pod"}), Allowed)


def test_an_edit_of_a_running_dra_pods_model_is_refused() -> None:
    p = dra_pod("p", H200, templates=("t",), node_name="dra", phase="Running")
    state = dra_cluster(claim_template("t", gpu_request(count=1)), p, quota=QUOTA)
    refused = update(state, p, edited(p, card=R4090))
    assert isinstance(refused, Denied)
    assert refused.message.startswith('pod ns/p is charged 1 NVIDIA-H200 to queue "q": volcano.sh/card.name')
    add(state, edited(p, card=R4090))
    assert (used(state, "q"), used(state, "q", R4090)) == (1, 0)


def test_queue_other_exists() -> None:
    """The cluster these tests use has the queue edits move to (else they would prove little)."""
    state = dra_cluster(quota=QUOTA)
    assert {"q", "other"} <= set(state.tree.queues)
    add(state, queue("third", QUOTA))
    assert "third" in state.tree.queues


# ---- an enqueued PodGroup's reservation ---------------------------------------------------------
def enqueued(ask: str = f'{{"{H200}": 2}}', queue_name: str = "q", phase: str = "Inqueue") -> dict[str, Any]:
    return podgroup("train", phase, ask, queue_name=queue_name, minMember=2)


def group_edit(state: ClusterState, old: dict[str, Any], new: dict[str, Any]) -> Allowed | Denied:
    review = request(new, resource="podgroups", operation="UPDATE", old=old, group="scheduling.volcano.sh")
    return admission.validate(state, review, 0.0)


@pytest.mark.parametrize(
    ("new", "change"),
    [
        pytest.param(enqueued(f'{{"{H200}": 3}}'), "ask 3 NVIDIA-H200", id="raised"),
        pytest.param(enqueued(f'{{"{R4090}": 1}}'), f"ask 1 {R4090}", id="another model"),
        pytest.param(enqueued(queue_name="other"), 'move to queue "other"', id="another queue"),
        pytest.param(
            enqueued(f'{{"{H200}": 3}}', phase="Running"), "ask 3 NVIDIA-H200", id="raised as it runs"
        ),
    ],
)
def test_an_enqueued_podgroups_request_raised_or_moved_is_refused(new: dict[str, Any], change: str) -> None:
    old = enqueued()
    state = dra_cluster(old, quota=QUOTA)
    refused = group_edit(state, old, new)
    assert isinstance(refused, Denied)
    assert refused.message == (
        f'podgroup ns/train was enqueued in queue "q" with 2 NVIDIA-H200: it cannot {change} while it is'
        " Inqueue (its reservation was admitted at its enqueue); lower it, or delete the job and create it anew"
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param(enqueued(), enqueued(f'{{"{H200}": 1}}'), id="lowered"),
        pytest.param(enqueued(), enqueued(phase="Running"), id="the scheduler runs it"),
        pytest.param(
            enqueued(phase="Pending"), enqueued(f'{{"{H200}": 1}}', phase="Pending"), id="not enqueued yet"
        ),
    ],
)
def test_an_enqueued_podgroups_request_lowered_passes(old: dict[str, Any], new: dict[str, Any]) -> None:
    state = dra_cluster(old, quota=QUOTA)
    assert isinstance(group_edit(state, old, new), Allowed)


def test_an_enqueued_podgroup_raised_past_the_webhook_reserves_what_it_was_enqueued_with() -> None:
    state = dra_cluster(enqueued(), quota='{"NVIDIA-H200": 4}')
    assert queue_usage(state, "q").card(CardName(H200)).reserved == 2 * UNIT
    add(state, enqueued(f'{{"{H200}": 4}}'))
    assert queue_usage(state, "q").card(CardName(H200)).reserved == 2 * UNIT
    add(state, enqueued(queue_name="other"))
    assert queue_usage(state, "other").card(CardName(H200)).reserved == 0
    add(state, enqueued(f'{{"{H200}": 1}}'))
    assert queue_usage(state, "q").card(CardName(H200)).reserved == UNIT


@pytest.mark.parametrize(
    ("new", "change"),
    [
        pytest.param(
            podgroup("train", "Inqueue", None, queue_name="q", minMember=2),
            "lose its volcano.sh/card.request annotation",
            id="card.request removed",
        ),
        pytest.param(
            podgroup("train", "Running", "", queue_name="q", minMember=2),
            "lose its volcano.sh/card.request annotation",
            id="card.request emptied as it runs",
        ),
    ],
)
def test_an_enqueued_podgroup_stripped_of_its_card_annotations_is_refused(
    new: dict[str, Any], change: str
) -> None:
    old = enqueued()
    state = dra_cluster(old, quota=QUOTA)
    refused = group_edit(state, old, new)
    assert isinstance(refused, Denied)
    assert refused.message.startswith(
        f'podgroup ns/train was enqueued in queue "q" with 2 NVIDIA-H200: it cannot {change} while it is'
    )


def test_a_pending_podgroup_may_lose_its_card_annotations() -> None:
    old = enqueued(phase="Pending")
    state = dra_cluster(old, quota=QUOTA)
    assert isinstance(group_edit(state, old, podgroup("train", "Pending", None, minMember=2)), Allowed)


# ---- a PodGroup is born Pending -----------------------------------------------------------------
def group_create(state: ClusterState, new: dict[str, Any]) -> Allowed | Denied:
    review = request(new, resource="podgroups", operation="CREATE", group="scheduling.volcano.sh")
    return admission.validate(state, review, 0.0)


@pytest.mark.parametrize("phase", ["Inqueue", "Running", "Completed", "Unknown"])
def test_a_podgroup_created_in_any_phase_but_pending_is_refused_naming_what_it_asks(phase: str) -> None:
    state = dra_cluster(quota=QUOTA)
    refused = group_create(state, podgroup("train", phase, f'{{"{R4090}": 3}}', minMember=3))
    assert isinstance(refused, Denied)
    assert refused.message.startswith(
        f'podgroup ns/train is created in phase {phase!r}, asking 3 {R4090} of queue "q": a PodGroup is'
        " created Pending (or with no status) and only the scheduler enqueues it"
    )
    assert (refused.queue, refused.card) == ("q", R4090)


@pytest.mark.parametrize("status", [{"phase": "Pending"}, {}, None], ids=["Pending", "no phase", "no status"])
def test_a_podgroup_created_pending_or_without_status_passes(status: dict[str, Any] | None) -> None:
    group = podgroup("train", "Pending", f'{{"{R4090}": 3}}', minMember=3)
    if status is None:
        del group["status"]
    else:
        group["status"] = status
    state = dra_cluster(quota=QUOTA)
    assert isinstance(group_create(state, group), Allowed)


def test_a_podgroup_created_for_pods_charged_to_another_queue_is_refused_and_its_twin_passes() -> None:
    """Pods name a PodGroup before it exists (kubectl apply of both, or by hand); Volcano runs them
    in the group's queue once it does. A group created elsewhere would move their charge to a
    queue that never admitted them."""
    state = dra_cluster(quota=QUOTA)
    add(state, queue("other", QUOTA))
    add(state, pod("a", card=H200, group="train", phase="Running", node_name="h200"))
    elsewhere = group_create(state, podgroup("train", "Pending", f'{{"{H200}": 1}}', queue_name="other"))
    assert isinstance(elsewhere, Denied)
    assert elsewhere.message == (
        'podgroup ns/train is created in queue "other", but its pod ns/a is charged 1 NVIDIA-H200 to queue "q",'
        " which admitted it: Volcano would run it in the PodGroup's queue, which never did; keep the"
        ' PodGroup in queue "q", or create its pods anew'
    )
    assert isinstance(group_create(state, podgroup("train", "Pending", f'{{"{H200}": 1}}')), Allowed)


@pytest.mark.parametrize("phase", ["Pending", "Inqueue"])
def test_a_podgroup_moved_to_another_queue_under_its_charged_pods_is_refused_in_any_phase(phase: str) -> None:
    """Volcano's scheduler may set an enqueued group back to Pending; a move of its queue then was
    never sent, and its pods' charges moved to a queue that never admitted them."""
    old = podgroup("train", phase, f'{{"{H200}": 1}}', minMember=1)
    state = dra_cluster(old, quota=QUOTA)
    add(state, queue("other", QUOTA))
    add(state, pod("a", card=H200, group="train", phase="Running", node_name="h200"))
    moved = podgroup("train", phase, f'{{"{H200}": 1}}', queue_name="other", minMember=1)
    refused = group_edit(state, old, moved)
    assert isinstance(refused, Denied) and refused.message.startswith(
        'podgroup ns/train cannot move to queue "other", but its pod ns/a is charged 1 NVIDIA-H200 to queue "q"'
    )
    add(
        state, pod("a", card=H200, group="train", phase="Succeeded", node_name="h200")
    )  # its twin: none charged
    assert isinstance(group_edit(state, old, moved), Allowed) is (phase == "Pending")


@pytest.mark.parametrize(
    ("queue_name", "allowed"), [("other", False), ("q", True)], ids=["another queue", "its own"]
)
def test_a_pod_given_a_podgroup_of_another_queue_is_refused(queue_name: str, allowed: bool) -> None:
    """Volcano's PodGroup controller names a pod's group once, after the pod: a group it made in the
    pod's own queue. Naming a group of another queue would move the running pod's charge there."""
    state = dra_cluster(podgroup("theirs", "Running", f'{{"{H200}": 1}}', queue_name=queue_name), quota=QUOTA)
    add(state, queue("other", QUOTA))
    old = running()
    add(state, old)
    decision = update(state, old, edited(old, group="theirs"))
    assert isinstance(decision, Allowed) is allowed, decision
    if not allowed:
        assert decision.message == (
            'pod ns/a is charged 1 NVIDIA-H200 to queue "q", but podgroup ns/theirs is in queue "other": naming'
            " it would move the pod's charge to a queue that never admitted it; name a PodGroup of queue"
            ' "q", or create the pod anew'
        )

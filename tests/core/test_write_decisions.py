"""SPEC §6 for scale-ups, workload writes, Volcano Jobs and Queues."""

import copy
from typing import Any

import pytest

from tests.builders import (
    H200,
    R4090,
    R4090D,
    cluster,
    deployment,
    node,
    owner,
    pod,
    podgroup,
    queue,
    replicaset,
    request,
    scale_request,
    template,
    vcjob,
)
from webhook.core.decide import admission
from webhook.core.index.state import ClusterState
from webhook.core.model.verdicts import Allowed, Denied


def inference(running: int = 6, pending: int = 1) -> ClusterState:
    """Deployment ns/chat (2 replicas) in queue q with an H200 quota of 8."""
    rs_owner = owner("ReplicaSet", "chat-1", "uid-rs-chat-1")
    pods = [pod(f"run-{i}", node_name="h200", phase="Running") for i in range(running - 2)]
    pods += [pod(f"chat-1-{i}", owner=rs_owner, node_name="h200", phase="Running") for i in range(2)]
    pods += [pod(f"wait-{i}") for i in range(pending)]
    return cluster(
        node("h200", H200),
        queue("q", '{"NVIDIA-H200": 8}'),
        deployment("chat", 2),
        replicaset("chat-1", 2, "chat"),
        *pods,
    )


@pytest.mark.parametrize(
    ("old", "new", "denial"),
    [
        pytest.param(
            2,
            5,
            'scale-up of deployment ns/chat from 2 to 5 replicas needs 3 NVIDIA-H200 (1 per pod); queue "q" has 1 left (quota 8: 6 running, 1 pending)',
            id="N to M over quota",
        ),
        pytest.param(2, 3, None, id="N to M within quota"),
        pytest.param(0, 4, "from 0 to 4 replicas needs 4 NVIDIA-H200", id="0 to N"),
        pytest.param(5, 2, None, id="scale-down always passes"),
        pytest.param(2, 2, None, id="unchanged replicas pass"),
    ],
)
def test_deployment_scale_subresource(old: int, new: int, denial: str | None) -> None:
    decision = admission.validate(inference(), scale_request("chat", old, new), 0.0)
    if denial is None:
        assert isinstance(decision, Allowed)
    else:
        assert isinstance(decision, Denied) and denial in decision.message, decision


def test_a_scale_up_from_zero_is_checked_though_the_scale_leaves_replicas_0_out() -> None:
    state = inference(running=6, pending=2)  # quota 8, all used
    decision = admission.validate(state, scale_request("chat", 0, 1), 0.0)
    assert isinstance(decision, Denied)
    assert decision.message == (
        'queue "q" has 0 NVIDIA-H200 left (quota 8: 6 running, 2 pending);'
        " scale-up of deployment ns/chat from 0 to 1 replicas needs 1"
    )


def test_a_scale_up_counts_live_pods_when_fewer_exist_than_replicas() -> None:
    state = inference(running=2, pending=0)  # only chat's 2 pods, quota 8
    state.delete_pod("uid-ns-chat-1-0")  # one pod gone: 1 live for 2 replicas
    decision = admission.validate(state, scale_request("chat", 2, 9), 0.0)
    assert isinstance(decision, Denied) and "needs 8 NVIDIA-H200" in decision.message


def test_admitted_scale_ups_are_held_until_their_pods_arrive() -> None:
    state = inference(running=2, pending=0)  # 6 free
    first = scale_request("chat", 2, 6)
    admission.admit(state, first, admission.validate(state, first, 0.0), 0.0)
    other = scale_request("chat", 6, 9)  # the HPA raises again before any pod exists: 9 - 2 live = 7 > 6
    assert isinstance(admission.validate(state, other, 1.0), Denied)
    bare = admission.validate(state, request(pod("bare", count=3)), 1.0)
    assert isinstance(bare, Denied)
    assert "has 2 NVIDIA-H200 left (quota 8: 2 running, 4 admitted, not yet seen)" in bare.message


def test_pods_of_an_admitted_scale_up_are_admitted_under_it() -> None:
    state = inference(running=7, pending=0)  # 1 free
    up = scale_request("chat", 2, 3)
    admission.admit(state, up, admission.validate(state, up, 0.0), 0.0)
    new = request(pod("chat-1-new", owner=owner("ReplicaSet", "chat-1", "uid-rs-chat-1")))
    decision = admission.validate(state, new, 0.5)
    assert isinstance(decision, Allowed) and "scale-up" in decision.reason
    admission.admit(state, new, decision, 0.5)
    assert isinstance(admission.validate(state, request(pod("bare")), 0.6), Denied)


def test_dry_run_scale_ups_get_the_answer_but_hold_nothing() -> None:
    state = inference(running=2, pending=0)
    dry = scale_request("chat", 2, 8, dry_run=True)
    decision = admission.validate(state, dry, 0.0)
    admission.admit(state, dry, decision, 0.0)
    assert isinstance(decision, Allowed) and len(state.ledger) == 0


def test_statefulset_and_replicaset_scale_like_deployments() -> None:
    sts = deployment("db", 1) | {"kind": "StatefulSet"}
    sts["metadata"] = {**sts["metadata"], "uid": "uid-sts-db"}
    state = cluster(node("h200", H200), queue("q", '{"NVIDIA-H200": 1}'), sts)
    decision = admission.validate(state, scale_request("db", 1, 3, resource="statefulsets"), 0.0)
    assert isinstance(decision, Denied) and "scale-up of statefulset ns/db from 1 to 3" in decision.message


def test_a_deployment_update_that_raises_replicas_is_a_scale_up() -> None:
    old = deployment("chat", 2)
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 5
    decision = admission.validate(
        inference(), request(new, resource="deployments", operation="UPDATE", old=old, group="apps"), 0.0
    )
    assert isinstance(decision, Denied) and "from 2 to 5 replicas needs 3 NVIDIA-H200" in decision.message


@pytest.mark.parametrize(
    ("card", "says"),
    [
        pytest.param("NVIDIA-H200||NVIDIA-H800", "empty alternative", id="malformed card.name"),
        pytest.param(f"{R4090}|NVIDIA-H20/mig-1g.24gb-mixed", "different resources", id="mixed resources"),
    ],
)
def test_workloads_with_malformed_card_templates_are_refused(card: str, says: str) -> None:
    bad = deployment("x", 1, card=card)
    decision = admission.validate(cluster(), request(bad, resource="deployments", group="apps"), 0.0)
    assert isinstance(decision, Denied) and says in decision.message and "deployment ns/x" in decision.message


VC = dict(resource="jobs", group="batch.volcano.sh")


@pytest.mark.parametrize(
    ("job", "denial"),
    [
        pytest.param(
            vcjob("big", [(5, template(H200))]),
            'needs at least 5 NVIDIA-H200 but the whole quota of queue "q" is 3 NVIDIA-H200',
            id="never fits",
        ),
        pytest.param(vcjob("ok", [(3, template(H200))]), None, id="has to wait: allowed"),
        pytest.param(
            vcjob("min", [(5, template(H200))], minAvailable=3), None, id="minAvailable fits the whole quota"
        ),
        pytest.param(
            vcjob("req", [(1, template(H200))], request='{"NVIDIA-H200": 4}'),
            "needs at least 4",
            id="card.request is the minimum",
        ),
        pytest.param(
            vcjob("bad", [(1, template(H200))], request='{"NVIDIA-H200": 1.5}'),
            "must be a whole number, got 1.5",
            id="malformed card.request",
        ),
        pytest.param(
            vcjob("bad2", [(1, template(H200))], request='{"NVIDIA-H200": 0}'),
            "must be >= 1",
            id="zero card.request",
        ),
        pytest.param(
            vcjob("bad3", [(1, template("H200|"))]), "empty alternative", id="malformed task card.name"
        ),
        pytest.param(
            vcjob("flex", [(2, template(f"{R4090}|{R4090D}"))]),
            None,
            id="multi-card job whose whole request fits one alternative",
        ),
        pytest.param(
            vcjob("flex", [(4, template(f"{R4090}|{R4090D}"))]),
            f"volcano job ns/flex needs 4 {R4090}|{R4090D}, and Volcano enqueues a multi-card request whole"
            f' on one model, but no model of it holds 4 in the whole quota of queue "q" (2 {R4090}, 2 {R4090D}):'
            " it could never run; split the request per model",
            id="multi-card job that fits only across alternatives: the plugin never enqueues it",
        ),
        pytest.param(
            vcjob("flex", [(1, template(R4090)), (1, template(f"{R4090}|{R4090D}", count=2))], request=None),
            None,
            id="multi-card task beside a fixed one: the other alternative holds it",
        ),
        pytest.param(
            vcjob("flex", [(1, template(H200))], request=f'{{"{R4090}|{R4090D}": 3}}'),
            "no model of it holds 3",
            id="multi-card card.request above every alternative's quota",
        ),
    ],
)
def test_volcano_jobs(job: dict[str, Any], denial: str | None) -> None:
    state = cluster(
        node("h200", H200),
        queue("q", '{"NVIDIA-H200": 3, "NVIDIA-GeForce-RTX-4090": 2, "NVIDIA-GeForce-RTX-4090-D": 2}'),
    )
    decision = admission.validate(state, request(job, **VC), 0.0)
    if denial is None:
        assert isinstance(decision, Allowed), decision
    else:
        assert isinstance(decision, Denied) and denial in decision.message, decision


QUEUES = dict(resource="queues", group="scheduling.volcano.sh")


@pytest.mark.parametrize(
    ("quota", "denial"),
    [
        pytest.param('{"NVIDIA-H200": 3}', None, id="well-formed"),
        pytest.param("{", "not JSON", id="not JSON"),
        pytest.param('["NVIDIA-H200"]', "must be a JSON object", id="not an object"),
        pytest.param('{"NVIDIA-H200": 1.5}', "whole number", id="non-integer"),
        pytest.param('{"NVIDIA-H200": -2}', ">= 0", id="negative"),
        pytest.param('{"NVIDIA H200": 2}', "is not a card name", id="malformed card name"),
        pytest.param('{"A|B": 2}', "quota is per card model", id="multi-card key"),
    ],
)
def test_queue_quota_annotations(quota: str, denial: str | None) -> None:
    decision = admission.validate(cluster(), request(queue("team", quota), **QUEUES), 0.0)
    if denial is None:
        assert isinstance(decision, Allowed)
    else:
        assert (
            isinstance(decision, Denied)
            and denial in decision.message
            and decision.message.startswith('queue "team"')
        )


def test_queue_warnings_for_overcommit_and_quota_below_use() -> None:
    state = cluster(
        node("h200", H200, 8),
        queue("a", '{"NVIDIA-H200": 6}'),
        queue("q", '{"NVIDIA-H200": 4}'),
        *[pod(f"p{i}", node_name="h200", phase="Running") for i in range(3)],
    )
    update = request(
        queue("q", '{"NVIDIA-H200": 2, "NVIDIA-B200": 1}'),
        operation="UPDATE",
        old=queue("q", '{"NVIDIA-H200": 4}'),
        **QUEUES,
    )
    decision = admission.validate(state, update, 0.0)
    assert isinstance(decision, Allowed)
    text = "\n".join(decision.warnings)
    assert "NVIDIA-H200: all queues' quotas sum to 8 but the cluster has 8" not in text
    assert 'queue "q": new NVIDIA-H200 quota 2 is below its current use 3 (3 running)' in text
    assert "NVIDIA-B200 is on no node yet" in text
    bigger = request(queue("q", '{"NVIDIA-H200": 5}'), operation="UPDATE", **QUEUES)
    assert "quotas sum to 11 but the cluster has 8" in "\n".join(
        admission.validate(state, bigger, 0.0).warnings
    )  # type: ignore[union-attr]


def test_the_deployment_controller_can_resize_its_replicaset_after_an_admitted_scale_up() -> None:
    state = inference(running=2, pending=0)  # 6 free
    up = scale_request("chat", 2, 8)
    admission.admit(state, up, admission.validate(state, up, 0.0), 0.0)
    old_rs = replicaset("chat-1", 2, "chat")
    new_rs = copy.deepcopy(old_rs)
    new_rs["spec"]["replicas"] = 8
    decision = admission.validate(
        state, request(new_rs, resource="replicasets", operation="UPDATE", old=old_rs, group="apps"), 1.0
    )
    assert isinstance(decision, Allowed) and "deployment" in decision.reason


def test_a_standalone_replicaset_scale_up_is_checked() -> None:
    rs = replicaset("solo", 1, "gone")
    rs["metadata"].pop("ownerReferences")
    state = cluster(node("h200", H200), queue("q", '{"NVIDIA-H200": 1}'), rs)
    decision = admission.validate(state, scale_request("solo", 1, 3, resource="replicasets"), 0.0)
    assert isinstance(decision, Denied) and "scale-up of replicaset ns/solo from 1 to 3" in decision.message


def test_pods_admitted_under_a_scale_up_are_counted_once_when_they_arrive() -> None:
    from webhook.core.model.objects import pod_record

    state = inference(running=2, pending=0)  # 6 free
    up = scale_request("chat", 2, 5)  # holds 3
    admission.admit(state, up, admission.validate(state, up, 0.0), 0.0)
    rs_owner = owner("ReplicaSet", "chat-1", "uid-rs-chat-1")
    for i in range(2):  # two of the three pods are created and arrive
        new = request(pod(f"chat-1-n{i}", owner=rs_owner))
        admission.admit(state, new, admission.validate(state, new, 0.1), 0.1)
        state.upsert_pod(pod_record(pod(f"chat-1-n{i}", owner=rs_owner)))
    # 2 running + 2 pending + 1 still held for the third pod = 5: 3 left, not 4
    decision = admission.validate(state, request(pod("bare", count=4)), 0.2)
    assert isinstance(decision, Denied) and "has 3 NVIDIA-H200 left" in decision.message


def test_a_queue_limiting_dra_devices_by_class_beside_its_card_quota_is_warned_of_the_double_limit() -> None:
    """Stock Volcano v1.15's capacity plugin counts claims per DeviceClass (``deviceclass/<class>``)."""
    state = cluster(node("h200", H200, 8))
    both = queue("q", '{"NVIDIA-H200": 4}', capability={"deviceclass/gpu.nvidia.com": "4", "cpu": "10"})
    decision = admission.validate(state, request(both, **QUEUES), 0.0)
    assert isinstance(decision, Allowed)
    assert decision.warnings == (
        'queue "q" limits DRA devices by DeviceClass (capability deviceclass/gpu.nvidia.com) as well as by'
        " its volcano.sh/card.quota: two limits on the same GPUs (Volcano's capacity plugin holds it to the"
        " first, the card-quota webhook to the second) and its pods run only within both; keep one",
    )
    plain = queue("q", '{"NVIDIA-H200": 4}', capability={"cpu": "10"})
    assert admission.validate(state, request(plain, **QUEUES), 0.0).warnings == ()


@pytest.mark.parametrize(
    ("phase", "replicas", "refused"),
    [
        pytest.param("Inqueue", 3, True, id="enqueued, raised"),
        pytest.param("Running", 3, True, id="running, raised"),
        pytest.param("Inqueue", 1, False, id="enqueued, lowered"),
        pytest.param("Pending", 3, False, id="not enqueued yet: Volcano's own queueing"),
    ],
)
def test_an_enqueued_volcano_jobs_sizes_cannot_be_raised(phase: str, replicas: int, refused: bool) -> None:
    """SPEC §4b: its PodGroup reserves what it was enqueued with; more pods would be charged past it."""
    job = vcjob("train", [(2, template(H200))])
    ref = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")
    state = cluster(
        node("h200", H200, 8),
        queue("q", '{"NVIDIA-H200": 4}'),
        job,
        podgroup("train", phase, owner_ref=ref, minMember=2),
    )
    raised = vcjob("train", [(replicas, template(H200))])
    decision = admission.validate(state, request(raised, operation="UPDATE", old=job, **VC), 0.0)
    if refused:
        assert isinstance(decision, Denied)
        assert decision.message == (
            "volcano job ns/train is enqueued (its PodGroup reserves what it was enqueued with) and cannot ask"
            " more now: 3 NVIDIA-H200 where it asked 2; lower it, or delete the job and create it anew"
        )
    else:
        assert isinstance(decision, Allowed)

"""Workload creates that do not all fit: admitted, with a warning that says how many fit now."""

import copy
import json
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import (
    H200,
    R4090,
    R4090D,
    cluster,
    deployment,
    node,
    owner,
    pod,
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
from webhook.tools import whatif

MULTI = f"{R4090}|{R4090D}"


def inference(running: int = 6) -> ClusterState:
    """Queue q with an H200 quota of 8 and ``running`` H200 pods bound."""
    pods = [pod(f"run-{i}", node_name="h200", phase="Running") for i in range(running)]
    return cluster(node("h200", H200, gpus=16), queue("q", '{"NVIDIA-H200": 8}'), *pods)


def wait_queue(name: str, quota: str) -> dict[str, Any]:
    obj = queue(name, quota)
    obj["metadata"]["annotations"]["cardquota.volcano.sh/over-quota"] = "wait"
    return obj


def create(state: ClusterState, obj: dict[str, Any], resource: str = "deployments") -> Allowed:
    group = "batch.volcano.sh" if resource == "jobs" else "apps"
    decision = admission.validate(state, request(obj, resource=resource, group=group), 0.0)
    assert isinstance(decision, Allowed), decision
    return decision


@pytest.mark.parametrize(
    ("state", "obj", "warning"),
    [
        pytest.param(
            inference(6),
            deployment("chat", 5),
            'deployment ns/chat asks 5 replicas of 1 NVIDIA-H200 each; only 2 fit now: queue "q" has'
            " 2 NVIDIA-H200 left (quota 8: 6 running); the other 3 will be refused until cards free up, then created at once (its controller waits in the queue's line)",
            id="over what is left",
        ),
        pytest.param(
            inference(8),
            deployment("chat", 2),
            'deployment ns/chat asks 2 replicas of 1 NVIDIA-H200 each; none fit now: queue "q" has'
            " 0 NVIDIA-H200 left (quota 8: 8 running); the other 2 will be refused until cards free up, then created at once (its controller waits in the queue's line)",
            id="nothing left",
        ),
        pytest.param(
            cluster(
                node("h200", H200, gpus=16),
                wait_queue("q", '{"NVIDIA-H200": 8}'),
                *[pod(f"run-{i}", node_name="h200", phase="Running") for i in range(8)],
            ),
            deployment("chat", 2),
            'deployment ns/chat asks 2 replicas of 1 NVIDIA-H200 each; none fit now: queue "q" has'
            " 0 NVIDIA-H200 left (quota 8: 8 running); the other 2 will be created under a scheduling"
            " gate and wait in the queue's line, each released the moment its cards free",
            id="nothing left, wait mode",
        ),
        pytest.param(
            inference(7),
            deployment("chat", 5, count=2),
            'deployment ns/chat asks 5 replicas of 2 NVIDIA-H200 each, but the whole quota of queue "q"'
            " (8 NVIDIA-H200) holds at most 4 of them: 1 can never run; none fit now",
            id="could never fit the whole quota",
        ),
        pytest.param(
            cluster(
                node("r", R4090, gpus=4),
                node("rd", R4090D, gpus=4),
                queue("q", json.dumps({R4090: 2, R4090D: 3})),
                pod("busy", R4090, node_name="r", phase="Running"),
            ),
            deployment("chat", 5, card=MULTI),
            f'deployment ns/chat asks 5 replicas of 1 {MULTI} each; only 4 fit now: queue "q" has'
            f" 1 {R4090} left (quota 2: 1 running) and 3 {R4090D} left (quota 3); the other 1 will be"
            " refused until cards free up, then created at once (its controller waits in the queue's line)",
            id="multi-card: per model",
        ),
        pytest.param(
            cluster(
                node("h200", H200),
                queue("org", json.dumps({H200: 4})),
                queue("q", json.dumps({H200: 4}), parent="org"),
                queue("other", json.dumps({H200: 4}), parent="org"),
                *[pod(f"o-{i}", queue_name="other", node_name="h200", phase="Running") for i in range(3)],
            ),
            deployment("chat", 3),
            'deployment ns/chat asks 3 replicas of 1 NVIDIA-H200 each; only 1 fits now: queue "org"'
            ' (above "q", counting all its queues) has 1 NVIDIA-H200 left (quota 4: 3 running); the'
            " other 2 will be refused until cards free up, then created at once (its controller waits in the queue's line)",
            id="an ancestor limits it",
        ),
        pytest.param(
            cluster(node("h200", H200), queue("q", json.dumps({H200: 8}), state="Closed")),
            deployment("chat", 1),
            'deployment ns/chat asks 1 replica of 1 NVIDIA-H200 each; none fit now: queue "q" is'
            " Closed and admits no new pods; deployment ns/chat needs 1 NVIDIA-H200; the other 1 will be"
            " refused",
            id="a closed queue: the refusal's own words",
        ),
    ],
)
def test_an_oversized_workload_create_is_admitted_with_a_warning(
    state: ClusterState, obj: dict[str, Any], warning: str
) -> None:
    decision = create(state, obj)
    assert decision.warnings == (warning,)


def test_a_workload_that_fits_says_nothing() -> None:
    assert create(inference(6), deployment("chat", 2)).warnings == ()


def test_a_replicaset_of_a_deployment_is_left_to_its_deployment() -> None:
    rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": "chat-1",
            "namespace": "ns",
            "ownerReferences": [owner("Deployment", "chat", "uid-dep-chat")],
        },
        "spec": {"replicas": 5, "template": template(H200)},
    }
    assert create(inference(8), rs, "replicasets").warnings == ()


def test_an_update_that_is_not_a_scale_up_warns_about_replicas_without_pods() -> None:
    rs_owner = owner("ReplicaSet", "chat-1", "uid-rs-chat-1")
    state = cluster(
        node("h200", H200),
        queue("q", json.dumps({H200: 4})),
        deployment("chat", 4),
        replicaset("chat-1", 4, "chat"),
        *[pod(f"chat-1-{i}", owner=rs_owner, node_name="h200", phase="Running") for i in range(2)],
        pod("other", node_name="h200", phase="Running"),
    )
    edited = copy.deepcopy(deployment("chat", 4))
    edited["metadata"]["labels"] = {"edited": "yes"}
    update = request(edited, resource="deployments", operation="UPDATE", old=deployment("chat", 4))
    decision = admission.validate(state, update, 0.0)
    assert isinstance(decision, Allowed)
    assert decision.warnings == (
        "deployment ns/chat asks 4 replicas of 1 NVIDIA-H200 each (2 have pods); only 1 more fits now:"
        ' queue "q" has 1 NVIDIA-H200 left (quota 4: 3 running); the other 1 will be refused until cards'
        " free up, then created at once (its controller waits in the queue's line)",
    )


def test_a_scale_up_that_does_not_fit_is_still_denied() -> None:
    state = inference(6)
    decision = admission.validate(
        state,
        request(deployment("chat", 5), resource="deployments", operation="UPDATE", old=deployment("chat", 1)),
        0.0,
    )
    assert isinstance(decision, Denied)


def test_a_volcano_job_counts_each_task_after_the_pods_of_the_tasks_before_it() -> None:
    job = vcjob("train", [(1, template(H200, 2)), (4, template(H200))], request='{"NVIDIA-H200": 2}')
    decision = create(inference(5), job, "jobs")
    assert decision.warnings == (
        'volcano job ns/train task t1 asks 4 replicas of 1 NVIDIA-H200 each; only 1 fits now: queue "q"'
        " has 1 NVIDIA-H200 left (quota 8: 5 running, 2 admitted, not yet seen); the other 3 will be"
        " refused until cards free up",
    )


def test_a_volcano_job_warning_leaves_no_hold_behind() -> None:
    state = inference(5)
    create(state, vcjob("train", [(4, template(H200))], request='{"NVIDIA-H200": 1}'), "jobs")
    assert len(state.ledger) == 0


def test_whatif_prints_the_same_warning() -> None:
    state, obj = inference(6), deployment("chat", 5)
    expected = create(inference(6), obj).warnings
    answers = whatif.whatif(state, [("manifest", obj)], now=0.0)
    assert answers[0].warnings == list(expected)
    assert "only 2 fit now" in whatif.table(answers)


@settings(max_examples=60, deadline=None)
@given(
    quota=st.integers(0, 10),
    running=st.integers(0, 10),
    per_pod=st.integers(1, 3),
    replicas=st.integers(1, 8),
)
def test_the_pods_that_fit_are_exactly_those_the_pod_check_then_admits(
    quota: int, running: int, per_pod: int, replicas: int
) -> None:
    """Create the workload, then its pods one by one as the controller does: the pods admitted are
    the number the warning said fit (or all of them when there is no warning)."""
    pods = [pod(f"run-{i}", node_name="h200", phase="Running") for i in range(running)]
    state = cluster(node("h200", H200, gpus=32), queue("q", json.dumps({H200: quota})), *pods)
    decision = create(state, deployment("chat", replicas, count=per_pod))
    admitted = 0
    for i in range(replicas):
        review = request(pod(f"chat-{i}", count=per_pod))
        answer = admission.validate(state, review, 0.0)
        admission.admit(state, review, answer, 0.0)
        admitted += isinstance(answer, Allowed)
    if not decision.warnings:
        assert admitted == replicas
    else:
        text = decision.warnings[0]
        said = 0 if "none fit" in text else int(text.split(" fit")[0].split()[-1])
        assert admitted == said, text


def test_a_volcano_job_enqueued_whole_says_it_waits_with_no_pod_created() -> None:
    job = vcjob("train", [(1, template(H200)), (3, template(H200))], minAvailable=1)
    decision = create(inference(6), job, "jobs")
    assert decision.warnings == (
        "volcano job ns/train needs all 4 of its pods at once (its card.request counts every replica,"
        ' and Volcano enqueues the job whole); only 2 fit now: queue "q" has 2 NVIDIA-H200 left (quota 8:'
        " 6 running); it waits in the queue with none of its pods created until"
        " cards free up",
    )


@pytest.mark.parametrize("replicas", [2**31 - 1, 10**18])
def test_a_huge_multi_card_workload_is_answered_without_memory_in_proportion_to_its_replicas(
    replicas: int,
) -> None:
    """The exact check's subset sums once shifted a bit set by pods x size before masking it: a
    scale-up of 10**12 A|B pods took 18 GB. Replicas are int32 in the API, not in a hostile review."""
    state = cluster(
        node("r", R4090, gpus=4),
        node("rd", R4090D, gpus=4),
        queue("q", json.dumps({R4090: 2, R4090D: 3})),
        pod("busy", MULTI),
        deployment("chat", 1, card=MULTI),
    )
    tracemalloc.start()
    try:
        decision = create(state, deployment("chat", replicas, card=MULTI))
        scale = admission.validate(state, scale_request("chat", 1, replicas), 0.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "holds at most 5 of them" in decision.warnings[0]
    assert isinstance(scale, Denied) and "none of" in scale.message
    assert peak < 20 * 2**20, peak

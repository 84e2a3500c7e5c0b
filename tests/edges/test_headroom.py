"""``cardquota headroom``: N more replicas fit exactly when a scale-up by N is admitted and by N + 1
is denied, and the answer says what stops the next one."""

import json
import subprocess
import sys
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import H200, H800, cluster, deployment, node, pod, queue, scale_request, statefulset
from tests.core.test_borrowing import NODES, lender, running
from tests.edges.serving import CLUSTER, ROOT
from webhook.cluster import snapshot
from webhook.core.decide import admission
from webhook.core.model.verdicts import Allowed
from webhook.errors import ConfigError
from webhook.tools import headroom


@pytest.mark.parametrize(
    ("workload", "more", "stops"),
    [
        ("deployment/team-a/chat", 1, 'queue "inference" has 1 left (quota 8: 6 running, 1 pending)'),
        (
            "deployment/team-c/vllm",
            0,
            'queue "cr-queue1" has 0 NVIDIA-GeForce-RTX-4090 left (quota 2: 2 running)',
        ),
    ],
)
def test_the_example_cluster(workload: str, more: int, stops: str) -> None:
    answer = headroom.of_workload(snapshot.load_snapshot(CLUSTER), workload, time.time())
    assert answer.more == more and stops in answer.reason


def test_a_workload_not_created_yet_and_one_that_needs_no_cards() -> None:
    state = snapshot.load_snapshot(CLUSTER)
    new = headroom.of_new(state, "cr-queue1", H200, 1, time.time())
    assert new.more == 1 and list(new.cards) == [H200] and new.cards[H200]["free"] == 1
    assert headroom.of_new(state, "inference", H200, 2, time.time()).more == 0
    cpu = cluster(node("h0", H200), queue("q", json.dumps({H200: 1})), deployment("web", 1, card=None))
    assert headroom.of_workload(cpu, "deployment/ns/web", time.time()).more is None


@pytest.mark.parametrize(
    ("ref", "error"),
    [
        ("pod/ns/x", "expected deployment|statefulset|replicaset/NAMESPACE/NAME"),
        ("deployment/ns", "expected"),
        ("deployment/ns/missing", "deployment ns/missing is not in the cluster"),
    ],
)
def test_a_bad_reference_says_what_is_wrong(ref: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        headroom.of_workload(snapshot.load_snapshot(CLUSTER), ref, time.time())


def admitted(state: Any, name: str, old: int, new: int, resource: str) -> bool:
    """The validating webhook's answer to the HPA's scale write, as a test builds it."""
    return isinstance(
        admission.validate(state, scale_request(name, old, new, resource, dry_run=True), 0.0), Allowed
    )


@settings(max_examples=150, deadline=None)
@given(
    quota=st.fixed_dictionaries({H200: st.integers(0, 12), H800: st.integers(0, 12)}),
    running=st.integers(0, 6),
    pending=st.integers(0, 4),
    replicas=st.integers(0, 5),
    per_pod=st.integers(1, 3),
    spec=st.sampled_from([H200, H800, f"{H200}|{H800}"]),
    kind=st.sampled_from(["deployment", "statefulset"]),
)
def test_headroom_n_means_n_is_admitted_and_n_plus_1_is_denied(
    quota: dict[str, int], running: int, pending: int, replicas: int, per_pod: int, spec: str, kind: str
) -> None:
    make = deployment if kind == "deployment" else statefulset
    objects = [node("h0", H200, 16), node("h8", H800, 16), queue("q", json.dumps(quota))]
    objects += [pod(f"r{i}", H200, node_name="h0", phase="Running") for i in range(running)]
    objects += [pod(f"p{i}", H800) for i in range(pending)]
    objects.append(make("app", replicas, card=spec, count=per_pod))
    state = cluster(*objects)
    answer = headroom.of_workload(state, f"{kind}/ns/app", 0.0)
    assert answer.more is not None
    resource = f"{kind}s"
    assert answer.more == 0 or admitted(state, "app", replicas, replicas + answer.more, resource)
    assert not admitted(state, "app", replicas, replicas + answer.more + 1, resource)
    assert 'queue "q"' in answer.reason and f"{kind} ns/app" in answer.reason


def test_the_cli_answers_in_json() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "headroom",
            "deployment/team-a/chat",
            "--cluster",
            str(CLUSTER),
            "--output",
            "json",
        ],
        capture_output=True,
        cwd=ROOT,
        check=True,
    )
    answer = json.loads(done.stdout)
    assert (answer["workload"], answer["replicas"], answer["more"]) == ("deployment team-a/chat", 2, 1)
    wrong = subprocess.run(
        [sys.executable, "-m", "webhook", "headroom", "--cluster", str(CLUSTER)],
        capture_output=True,
        cwd=ROOT,
    )
    assert wrong.returncode == 2 and b"name a workload" in wrong.stderr


def test_a_volcano_job_is_answered_per_card_task_beyond_what_it_holds() -> None:
    state = snapshot.load_snapshot(CLUSTER)
    (task,) = headroom.of_ref(state, "vcjob/team-b/cr-job", time.time())
    assert (task.target, task.replicas, task.more, task.limited_by) == (
        "volcano job team-b/cr-job task worker",
        2,
        0,
        "cr-queue1",
    )
    assert (
        task.reason
        == 'queue "cr-queue1" has 0 NVIDIA-H800 left (quota 2: 2 reserved by PodGroups); 1 more pod needs 1'
    )
    with pytest.raises(ConfigError, match="volcano job team-b/nope is not in the cluster"):
        headroom.of_ref(state, "vcjob/team-b/nope", time.time())


def test_what_holds_one_more_back_is_named_even_when_it_is_an_ancestor() -> None:
    state = snapshot.load_snapshot(CLUSTER)
    child = headroom.of_new(state, "org-a", H800, 1, time.time())
    assert (child.more, child.limited_by) == (0, "org")
    assert child.cards[H800]["free"] == 1  # org-a itself has room: its parent has none
    assert 'queue "org" (above "org-a", counting all its queues) has 0 NVIDIA-H800 left' in child.reason


def test_a_multi_card_spec_is_also_answered_per_model() -> None:
    state = snapshot.load_snapshot(CLUSTER)
    r4090, r4090d = "NVIDIA-GeForce-RTX-4090", "NVIDIA-GeForce-RTX-4090-D"
    both = headroom.of_new(state, "q", f"{r4090}|{r4090d}", 1, time.time())
    assert both.more == 1 and set(both.cards) == {r4090, r4090d}
    # The pending pod of q may use either model, so each model alone still takes one more.
    assert both.per_model == {r4090: 1, r4090d: 1}
    for card, more in both.per_model.items():
        assert headroom.of_new(state, "q", card, 1, time.time()).more == more
    assert "on NVIDIA-GeForce-RTX-4090-D alone: 1" in headroom.table(both)


def lending_cohort(a_runs: int, b_runs: int) -> snapshot.ClusterState:
    """``a`` (quota 6 H200 and 2 H800, deserved 3 and 1) and ``b`` (deserved its quota of 3 and 2)
    lend and borrow both models; ``w`` (quota 2 H200, no card.deserved) is a wall."""
    return cluster(
        *NODES,
        lender("a", {H200: 6, H800: 2}, {H200: 3, H800: 1}),
        lender("b", {H200: 3, H800: 2}, {H200: 3, H800: 2}),
        lender("w", {H200: 2}),
        *(running(f"a{i}", "a") for i in range(a_runs)),
        *(running(f"b{i}", "b") for i in range(b_runs)),
    )


def test_headroom_tells_the_pods_within_the_deserved_from_those_that_borrow() -> None:
    answer = headroom.of_new(lending_cohort(1, 1), "a", H200, 1, 0.0)
    assert answer.more == 4  # its deserved 3 and the 2 H200 b leaves idle, less the 1 running
    assert answer.lending == {H200: {"within_deserved": 2, "borrowing": 2, "lenders": ["b"]}}
    lines = headroom.table(answer).splitlines()
    assert lines[-2:] == [
        f"  {H200}: quota 6, deserved 3, may use 5 now, free 4 (running 1, pending 0, reserved 0, in flight 0)",
        f"  {H200}: 2 more fit within its deserved, 2 more with what its cohort lends now (lent by queue 'b')",
    ]
    two = headroom.of_new(lending_cohort(1, 1), "a", H200, 2, 0.0)  # 2 left in its deserved: one pod
    assert (two.more, two.lending[H200]["within_deserved"], two.lending[H200]["borrowing"]) == (2, 1, 1)


def test_headroom_with_nothing_lent_borrows_nothing() -> None:
    answer = headroom.of_new(lending_cohort(1, 3), "a", H200, 1, 0.0)
    assert answer.more == 2 and answer.lending == {
        H200: {"within_deserved": 2, "borrowing": 0, "lenders": []}
    }
    assert headroom.table(answer).endswith(
        f"  {H200}: 2 more fit within its deserved, 0 more with what its cohort lends now"
    )


def test_twin_headroom_of_a_queue_without_card_deserved_says_nothing_of_lending() -> None:
    answer = headroom.of_new(lending_cohort(1, 1), "w", H200, 1, 0.0)
    assert answer.more == 2 and answer.lending == {} and "deserved" not in answer.cards[H200]
    assert "deserved" not in headroom.table(answer) and "lends" not in headroom.table(answer)


def test_headroom_of_a_multi_card_spec_tells_each_model_alone() -> None:
    answer = headroom.of_new(lending_cohort(1, 1), "a", f"{H200}|{H800}", 1, 0.0)
    assert answer.per_model == {H200: 4, H800: 2}
    assert answer.lending == {
        H200: {"within_deserved": 2, "borrowing": 2, "lenders": ["b"]},
        H800: {"within_deserved": 1, "borrowing": 1, "lenders": ["b"]},
    }
    assert (
        f"  {H800}: 1 more fit within its deserved, 1 more with what its cohort lends now"
        in headroom.table(answer)
    )

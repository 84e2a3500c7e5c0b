"""``cardquota audit`` (decisions.md §34): what enforcement would refuse now, whatever the mode the
queues are in, so an operator reads it before switching them to deny."""

import json
from typing import Any

import pytest

from tests.builders import H200, cluster, deployment, node, owner, pod, queue, replicaset
from webhook.core.model import keys
from webhook.tools import audit, cli, headroom

RS = owner("ReplicaSet", "chat-1", "uid-rs-chat-1")


def chat(quota: int, mode: str = "warn") -> list[dict[str, Any]]:
    """Deployment chat runs 3 H200 pods in queue q of quota ``quota``, q enforcing in ``mode``."""
    q = queue("q", json.dumps({H200: quota}))
    q["metadata"]["annotations"][keys.ENFORCEMENT] = mode
    pods = [pod(f"chat-1-{i}", owner=RS, node_name="h200", phase="Running") for i in range(3)]
    return [node("h200", H200), q, deployment("chat", 3), replicaset("chat-1", 3, "chat"), *pods]


@pytest.mark.parametrize(
    ("quota", "over", "scale_up", "recreated"),
    [
        pytest.param(2, 1, "refused", "refused", id="a new quota below what runs: past it by 1"),
        pytest.param(3, 0, "refused", "admitted", id="twin: at its quota, a pod re-created fits"),
        pytest.param(4, 0, "admitted", "admitted", id="twin: room for one more"),
    ],
)
@pytest.mark.parametrize("mode", ["warn", "audit", "deny"])
def test_the_report_says_what_deny_would_refuse_whatever_the_queues_mode(
    quota: int, over: int, scale_up: str, recreated: str, mode: str
) -> None:
    state = cluster(*chat(quota, mode))
    found = audit.report(state, 1.0)
    assert found["queues"] == [
        {"queue": "q", "card": H200, "enforcement": mode, "quota": quota, "used": 3, "over": over}
    ]
    (row,) = found["workloads"]
    assert (row["workload"], row["queue"], row["card"], row["replicas"]) == (
        "deployment ns/chat",
        "q",
        H200,
        3,
    )
    assert (row["next_scale_up"], row["pod_recreated"]) == (scale_up, recreated)
    if scale_up == "refused":
        assert row["why"].startswith(f'queue "q" has 0 {H200} left (quota {quota}: 3 running)')
    assert state.enforcement("q") == mode, "the report leaves the queue's mode as it was"
    table = audit.table(found)
    assert f"q                {H200:<40} {mode:<11}" in table and "deployment ns/chat" in table


def test_cardquota_audit_reads_a_snapshot_and_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["audit", "--cluster", "examples/cluster", "--output", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert {row["queue"] for row in found["queues"]} >= {"cr-queue1", "inference"}
    vllm = next(row for row in found["workloads"] if row["workload"] == "deployment team-c/vllm")
    assert vllm["next_scale_up"] == "refused" and "cr-queue1" in vllm["why"]


@pytest.mark.parametrize("mode", ["deny", "warn", "audit"])
def test_headroom_answers_what_deny_admits_and_says_the_queues_mode(mode: str) -> None:
    """q has room for one more of chat's pods: headroom says 1 in every mode (a relaxed queue would
    admit any number, telling it), and names a relaxed mode beside it."""
    state = cluster(*chat(4, mode))
    (answer,) = headroom.of_ref(state, "deployment/ns/chat", 1.0)
    assert (answer.more, answer.enforcement) == (1, mode)
    assert 'queue "q" has 1 left (quota 4: 3 running)' in answer.reason, answer.reason
    assert (f"its queue's quota only {mode}s" in headroom.table(answer)) is (mode != "deny")
    new = headroom.of_new(state, "q", H200, 1, 1.0)
    assert (new.more, new.enforcement) == (1, mode)
    assert state.enforcement("q") == mode

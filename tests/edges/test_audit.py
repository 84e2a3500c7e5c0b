"""``cardquota audit`` (decisions.md §34): what enforcement would refuse now, whatever the mode the
queues are in, so an operator reads it before switching them to deny."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

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


def told(queue: str, mode: str, count: int, first: str, card: str = H200, **more: Any) -> dict[str, Any]:
    """A CardQuotaWouldRefuse Event as the serving replica writes it and the API server returns it."""
    whose = json.dumps({"queue": queue, "card": card, "mode": mode})
    return {
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": {"name": f"chat.{count}", "namespace": "ns", "annotations": {keys.WOULD_REFUSE: whose}},
        "involvedObject": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat", "namespace": "ns"},
        "reason": "CardQuotaWouldRefuse",
        "count": count,
        "firstTimestamp": first,
        **more,
    }


def test_the_report_adds_up_the_would_be_refusals_of_the_queues_mode_now() -> None:
    """q audits now: its audit Events are added up (3 + 1, since the first's time); those of its
    warn days before, a Volcano Job's Event without the annotation (its PodGroup's counts) and
    another reason's are not."""
    state = cluster(*chat(2, "audit"))
    events = [
        told("q", "audit", 1, "2026-11-28T10:00:00Z"),
        told("q", "audit", 3, "2026-11-28T10:05:00Z"),
        told("q", "warn", 7, "2026-11-27T09:00:00Z"),
        {**told("q", "audit", 5, "2026-11-28T09:00:00Z"), "metadata": {"name": "train.1", "namespace": "ns"}},
        {**told("q", "audit", 9, "2026-11-28T09:00:00Z"), "reason": "CardQuotaBorrowing"},
    ]
    found = audit.report(state, 1.0, events)
    assert found["would_refuse"] == [
        {"queue": "q", "card": H200, "mode": "audit", "refusals": 4, "since": "2026-11-28T10:00:00Z"}
    ]
    table = audit.table(found)
    assert f"q                {H200:<40} audit         4  2026-11-28T10:00:00Z" in table, table
    state = cluster(*chat(2, "deny"))
    found = audit.report(state, 1.0, events)
    assert found["would_refuse"] == [], "none admitted in deny"
    assert "none: no queue in warn or audit has admitted one" in audit.table(found)


def test_events_that_could_not_be_read_are_said_the_rest_answered() -> None:
    found = audit.report(cluster(*chat(2)), 1.0, "the CardQuotaWouldRefuse Events could not be read: 403")
    assert found["would_refuse"] is None and found["workloads"], found
    assert "the CardQuotaWouldRefuse Events could not be read: 403" in audit.table(found)


def test_cardquota_audit_counts_the_events_of_a_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(chat(2, "warn")))
    (tmp_path / "events.yaml").write_text(
        yaml.safe_dump({"kind": "EventList", "items": [told("q", "warn", 2, "2026-11-28T10:00:00Z")]})
    )
    assert cli.main(["audit", "--cluster", str(tmp_path), "--output", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["would_refuse"]
    assert (row["queue"], row["mode"], row["refusals"]) == ("q", "warn", 2)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    count=JSONISH,
    first=JSONISH,
    whose=st.one_of(JSONISH.map(json.dumps), JSONISH, st.just("[" * 5000)),
    meta=JSONISH,
)
def test_an_event_in_any_shape_counts_nothing_or_one_row_never_raises(
    count: Any, first: Any, whose: Any, meta: Any
) -> None:
    """Events are anyone's to write: an odd count, time, annotation or metadata is read as 1, no
    time, nothing, never an error."""
    event = told("q", "warn", 1, "")
    event["count"], event["firstTimestamp"] = count, first
    event["metadata"]["annotations"][keys.WOULD_REFUSE] = whose
    for shaped in (event, {**event, "metadata": meta}, meta):
        rows = audit.told([shaped])
        assert all(row["refusals"] >= 1 and row["mode"] in ("warn", "audit") for row in rows)

"""Enforcement in steps (decisions.md §34): a queue whose quota warns or audits admits what it would
refuse, carrying exactly the refusal; its enforced twin refuses it. Each kind a quota refuses: a pod
create, a scale-up, an enqueue, a Volcano Job its queue could never hold, and the line's call."""

import copy
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import (
    H200,
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
from webhook.core.decide import admission, calls, reclaim_settings, tidal
from webhook.core.model import keys
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Allowed, Denied

RS = owner("ReplicaSet", "chat-1", "uid-rs-chat-1")
MODES = ["warn", "audit"]


def full_queue(mode: str | None = None, quota: int = 2, running: int = 2) -> list[dict[str, Any]]:
    """Queue q, its H200 quota ``quota`` all used by ``running`` pods; ``mode``: its enforcement."""
    q = queue("q", json.dumps({H200: quota}))
    if mode is not None:
        q["metadata"]["annotations"][keys.ENFORCEMENT] = mode
    pods = [pod(f"run-{i}", node_name="h200", phase="Running") for i in range(running)]
    return [node("h200", H200), q, deployment("chat", 1), replicaset("chat-1", 1, "chat"), *pods]


def enqueue_request(objects: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Any]:
    job = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")
    group = podgroup("train", "Pending", json.dumps({H200: 1}), owner_ref=job, minMember=1)
    new = copy.deepcopy(group)
    new["status"]["phase"] = "Inqueue"
    return [*objects, group], request(
        new, resource="podgroups", operation="UPDATE", old=group, group="scheduling.volcano.sh"
    )


def kinds(mode: str | None) -> dict[str, tuple[Any, Any]]:
    """Per kind a quota refuses: (the cluster, the request), queue q enforcing in ``mode``."""
    objects = full_queue(mode)
    groups, enqueue = enqueue_request(objects)
    job = vcjob("big", [(3, template(H200))], queue="q")
    return {
        "pod create": (cluster(*objects), request(pod("chat-1-x", owner=RS))),
        "user's pod": (cluster(*objects), request(pod("mine"))),
        "scale-up": (cluster(*objects), scale_request("chat", 1, 3)),
        "enqueue": (cluster(*groups), enqueue),
        "volcano job it could never run": (
            cluster(*objects),
            request(job, resource="jobs", group="batch.volcano.sh"),
        ),
    }


KINDS = list(kinds(None))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["queue", "cluster"])
def test_a_quota_that_warns_or_audits_admits_what_its_enforced_twin_refuses_saying_exactly_that(
    kind: str, mode: str, where: str
) -> None:
    denied_state, denied_request = kinds(None)[kind]
    refused = admission.validate(denied_state, denied_request, 1.0)
    assert isinstance(refused, Denied) and refused.quota, refused
    if where == "queue":
        state, review = kinds(mode)[kind]
    else:
        state, review = kinds(None)[kind]
        state.policy = replace(state.policy, enforcement=mode)
    decision = admission.validate(state, review, 1.0)
    assert isinstance(decision, Allowed), decision
    assert decision.would is not None and decision.would.mode == mode
    assert decision.would.message == refused.message
    assert decision.warnings == ((refused.message,) if mode == "warn" else ())
    assert decision.queue == "q" and decision.card == H200
    admission.admit(state, review, decision, 1.0)
    assert not state.line.line("q"), "a quota not enforced keeps no line"
    assert [w.message for w in state.would_refuse] == [refused.message], "told by an Event"


@pytest.mark.parametrize("mode", MODES)
def test_what_a_quota_that_warns_admits_is_counted_at_once(mode: str) -> None:
    """A pod admitted over its quota is held as any admission: the next review sees it in flight."""
    state, review = kinds(mode)["user's pod"]
    admission.admit(state, review, admission.validate(state, review, 1.0), 1.0)
    other = admission.validate(state, request(pod("next")), 1.0)
    assert isinstance(other, Allowed) and other.would is not None
    assert "1 admitted, not yet seen" in other.would.message, other.would.message


@pytest.mark.parametrize("mode", MODES)
def test_refusals_that_are_no_quotas_refuse_whatever_the_mode(mode: str) -> None:
    """A malformed card annotation, a queue its namespace may not use: refused in every mode."""
    objects = full_queue(mode)
    objects[1]["metadata"]["annotations"][keys.NAMESPACES] = "team=a"
    state = cluster(*objects)
    bad = pod("bad")
    bad["metadata"]["annotations"][keys.CARD_NAME] = "not a card|"
    for review in (request(bad), request(pod("elsewhere"))):
        decision = admission.validate(state, review, 1.0)
        assert isinstance(decision, Denied) and not decision.quota, decision


@pytest.mark.parametrize("mode", ["deny", *MODES])
def test_the_line_calls_only_for_an_enforced_quota(mode: str) -> None:
    """Refused, chat's controller waits in q's line and is called when a card frees; in warn or
    audit it was admitted, so nothing waits and nothing is called."""
    state = cluster(*full_queue(mode))
    review = request(pod("chat-1-x", owner=RS))
    admission.admit(state, review, admission.validate(state, review, 1.0), 1.0)
    state.delete_pod("uid-ns-run-0")
    called = calls.call_next(state, 2.0)
    assert bool(called) is (mode == "deny"), called


@pytest.mark.parametrize("mode", ["deny", *MODES])
def test_a_queue_not_enforced_takes_no_card_back(mode: str) -> None:
    q = queue("q", json.dumps({H200: 2}), priority=90000, reclaimable=False)
    if mode != "deny":
        q["metadata"]["annotations"][keys.ENFORCEMENT] = mode
    train = queue("train", json.dumps({H200: 8}), priority=10)
    state = cluster(node("h200", H200), q, train)
    assert tidal.may_take(state, "q") is (mode == "deny")
    assert reclaim_settings.mode_of(state, "q") == ("on" if mode == "deny" else "off")


@pytest.mark.parametrize("mode", ["deny", *MODES, "enforce", ""])
def test_a_queues_enforcement_is_one_of_three(mode: str) -> None:
    made = queue("q", json.dumps({H200: 2}))
    made["metadata"]["annotations"][keys.ENFORCEMENT] = mode
    decision = admission.validate(
        cluster(), request(made, resource="queues", group="scheduling.volcano.sh"), 0.0
    )
    if mode in keys.ENFORCEMENTS:
        assert isinstance(decision, Allowed), decision
    else:
        assert isinstance(decision, Denied)
        assert decision.message.startswith(f'queue "q" has a malformed {keys.ENFORCEMENT} ')


@settings(max_examples=300, deadline=None)
@given(
    quota=st.integers(0, 4),
    running=st.integers(0, 5),
    count=st.integers(1, 3),
    scale=st.integers(0, 4),
    kind=st.sampled_from(["pod", "owned pod", "scale"]),
    mode=st.sampled_from(MODES),
    on_queue=st.booleans(),
)
def test_a_quota_that_warns_or_audits_always_admits_and_carries_exactly_the_enforced_decision(
    quota: int, running: int, count: int, scale: int, kind: str, mode: str, on_queue: bool
) -> None:
    """Whatever the quota and its use: where ``deny`` admits, so do warn and audit, alike; where it
    refuses for want of room, they admit carrying exactly its message."""

    def decide(enforcement: str | None) -> Any:
        objects = full_queue(enforcement if on_queue else None, quota=quota, running=running)
        state = cluster(*objects, policy=Policy(enforcement=enforcement or "deny") if not on_queue else None)
        if kind == "scale":
            review = scale_request("chat", 1, 1 + scale)
        else:
            review = request(pod("new", count=count, owner=RS if kind == "owned pod" else None))
        return admission.validate(state, review, 1.0)

    enforced, relaxed = decide(None), decide(mode)
    if isinstance(enforced, Denied) and enforced.quota:
        assert isinstance(relaxed, Allowed) and relaxed.would is not None
        assert relaxed.would.message == enforced.message
        assert relaxed.warnings == ((enforced.message,) if mode == "warn" else ())
    else:
        assert type(relaxed) is type(enforced) and relaxed.would is None
        assert getattr(relaxed, "message", None) == getattr(enforced, "message", None)


def _edited(obj: dict[str, Any], change: str) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    if change == "finalizer added":
        new["metadata"]["finalizers"] = ["example.com/keep"]
    elif change == "another's gate removed":
        new["spec"]["schedulingGates"] = []
    elif change == "a label":
        new["metadata"].setdefault("labels", {})["team"] = "a"
    return new


@pytest.mark.parametrize("change", ["finalizer added", "another's gate removed", "a label"])
def test_switched_to_deny_a_queue_past_its_quota_refuses_no_update_its_running_pods_need(change: str) -> None:
    """q runs 3 H200 with a new quota of 2, enforced: an update of one of its pods (a finalizer,
    another party's scheduling gate removed, a label) is no quota decision and is admitted."""
    running = pod("run-0", node_name="h200", phase="Running")
    gated = pod("gated")
    gated["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    old = gated if change == "another's gate removed" else running
    state = cluster(*full_queue(quota=2, running=3), gated)
    review = request(_edited(old, change), operation="UPDATE", old=old)
    decision = admission.validate(state, review, 1.0)
    assert isinstance(decision, Allowed), decision

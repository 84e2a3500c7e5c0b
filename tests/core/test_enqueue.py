"""The enqueue gate (SPEC §5d): a PodGroup's move to Inqueue is allowed only when the cards it asks
for beyond what its pods hold fit its queue and every ancestor, after what waits ahead; an ``A|B``
request whole on one alternative; a refused group waits in the queue's line."""

import copy
from typing import Any

import pytest

from tests.builders import (
    H200,
    H800,
    R4090,
    cluster,
    node,
    owner,
    pod,
    podgroup,
    queue,
    replicaset,
    request,
    template,
)
from webhook.core.decide import admission, calls, report
from webhook.core.index.state import ClusterState
from webhook.core.model.objects import pod_record, podgroup_record, queue_record
from webhook.core.model.verdicts import ENQUEUE, Allowed, Denied

JOB = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")
NODES = [node("h200", H200), node("h800", H800), node("r4090", R4090)]


def group(
    name: str = "train", ask: str = f'{{"{H200}": 3}}', phase: str = "Pending", **kw: Any
) -> dict[str, Any]:
    ref = owner("Job", name, f"uid-job-{name}", api="batch.volcano.sh/v1alpha1")
    return podgroup(name, phase, ask, owner_ref=ref, minMember=3, **kw)


def enqueue(
    state: ClusterState, obj: dict[str, Any], now: float = 10.0, to: str = "Inqueue"
) -> Allowed | Denied:
    """What the API server does with the scheduler's UPDATE of the phase: validate, record."""
    new = copy.deepcopy(obj)
    new["status"]["phase"] = to
    review = request(new, resource="podgroups", operation="UPDATE", old=obj, group="scheduling.volcano.sh")
    decision = admission.validate(state, review, now)
    admission.admit(state, review, decision, now)
    return decision


def running(name: str, card: str = H200, queue_name: str = "q") -> dict[str, Any]:
    where = {H200: "h200", H800: "h800", R4090: "r4090"}[card]
    return pod(name, card=card, node_name=where, phase="Running", queue_name=queue_name)


def test_a_job_beyond_what_is_left_stays_pending_and_waits_in_line() -> None:
    pg = group()
    state = cluster(*NODES, queue("q", f'{{"{H200}": 3}}'), running("a"), running("b"), pg)
    decision = enqueue(state, pg)
    assert isinstance(decision, Denied) and decision.cause == ENQUEUE
    assert decision.message == (
        'queue "q" has 1 NVIDIA-H200 left (quota 3: 2 running); podgroup ns/train (volcano job ns/train)'
        " needs 3 to be enqueued; it waits 1st in the queue's line; it stays Pending, none of its pods"
        " created, and is enqueued the moment its cards free"
    )
    assert [(w.what, w.per_pod) for w in state.line.line("q")] == [("podgroup ns/train", 3000)]
    assert state.refusals == {"ns/train": decision.message}


def test_a_job_larger_than_the_whole_quota_stays_pending_in_no_line() -> None:
    """The issue's case: quota 1, a job of 3 H200 pods; stock Volcano would enqueue and run it. It
    waits in no line: it would stand at the head forever, in everyone's way."""
    pg = group()
    state = cluster(*NODES, queue("q", f'{{"{H200}": 1}}'), pg)
    decision = enqueue(state, pg)
    assert isinstance(decision, Denied)
    assert decision.message == (
        'queue "q" has 1 NVIDIA-H200 left (quota 1); podgroup ns/train (volcano job ns/train) needs 3 to'
        " be enqueued: more than the whole quota of its queue (or of an ancestor) holds, so it stays"
        " Pending, in no line, until the quota is raised or the job asks for less"
    )
    assert state.line.line("q") == () and state.refusals == {"ns/train": decision.message}
    assert isinstance(admission.validate(state, request(pod("small")), 11.0), Allowed)


def test_a_job_that_fits_is_enqueued_and_held_until_the_cache_sees_it() -> None:
    pg = group()
    state = cluster(*NODES, queue("q", f'{{"{H200}": 4}}'), running("other"), pg)
    assert isinstance(enqueue(state, pg), Allowed)
    second = group("second", f'{{"{H200}": 1}}')
    state.upsert_podgroup(podgroup_record(second))
    late = enqueue(state, second)
    assert isinstance(late, Denied) and "(quota 4: 1 running, 3 admitted, not yet seen)" in late.message
    seen = copy.deepcopy(pg)
    seen["status"]["phase"] = "Inqueue"
    state.upsert_podgroup(podgroup_record(seen))
    assert len(state.ledger) == 0
    assert state.tree.tallies["q"].reserved[H200] == 3000


@pytest.mark.parametrize(
    ("quota", "fits"),
    [
        pytest.param(f'{{"{H200}": 1, "{H800}": 2}}', True, id="whole on the second alternative"),
        pytest.param(f'{{"{H200}": 1, "{H800}": 1}}', False, id="split across both is not enough"),
    ],
)
def test_an_a_or_b_request_is_judged_whole_on_one_alternative(quota: str, fits: bool) -> None:
    pg = group(ask=f'{{"{H200}|{H800}": 2}}')
    state = cluster(*NODES, queue("q", quota), pg)
    assert isinstance(enqueue(state, pg), Allowed) is fits


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        pytest.param(
            "Inqueue", "Running", "an enqueued PodGroup's request is not raised", id="Inqueue to Running"
        ),
        pytest.param("Pending", "Pending", "not an enqueue", id="a status write that keeps Pending"),
        pytest.param(
            "Running", "Inqueue", "an enqueued PodGroup's request is not raised", id="Running back to Inqueue"
        ),
    ],
)
def test_only_a_move_into_a_reserving_phase_is_checked(old: str, new: str, why: str) -> None:
    pg = group(phase=old)
    state = cluster(*NODES, queue("q", f'{{"{H200}": 0}}'), pg)
    assert enqueue(state, pg, to=new) == Allowed(why)


def test_a_group_whose_pods_hold_its_cards_already_is_enqueued() -> None:
    """A ReplicaSet's PodGroup: its pods were admitted one by one; the group asks for nothing more."""
    rs = replicaset("web", 2, "web")
    ref = owner("ReplicaSet", "web", "uid-rs-web")
    pg = podgroup("web", "Pending", f'{{"{H200}": 2}}', owner_ref=ref, minMember=2)
    pods = [pod(f"web-{i}", owner=ref, group="web") for i in range(2)]
    state = cluster(*NODES, queue("q", f'{{"{H200}": 2}}'), rs, pg, *pods)
    assert enqueue(state, pg) == Allowed("its pods hold every card it asks for")


def test_a_child_queue_whose_parent_is_full_keeps_the_job_pending() -> None:
    parent = queue("parent", f'{{"{H200}": 2}}')
    child = queue("q", f'{{"{H200}": 4}}', parent="parent")
    pg = group(ask=f'{{"{H200}": 2}}')
    state = cluster(*NODES, parent, child, queue("sibling", f'{{"{H200}": 2}}', parent="parent"))
    state.upsert_pod(pod_record(running("busy", queue_name="sibling")))
    state.upsert_podgroup(podgroup_record(pg))
    decision = enqueue(state, pg)
    assert isinstance(decision, Denied)
    assert decision.message.startswith(
        'queue "parent" (above "q", counting all its queues) has 1 NVIDIA-H200'
    )
    assert [w.what for w in state.line.line("q")] == ["podgroup ns/train"]


def test_a_closed_or_missing_queue_keeps_the_job_waiting_and_says_why() -> None:
    pg = group()
    state = cluster(*NODES, queue("q", f'{{"{H200}": 8}}', state="Closed"), pg)
    decision = enqueue(state, pg)
    assert isinstance(decision, Denied) and decision.message.startswith('queue "q" is Closed')
    missing = group("lost", queue_name="nowhere")
    state.upsert_podgroup(podgroup_record(missing))
    assert enqueue(state, missing).message.startswith('queue "nowhere" does not exist')  # type: ignore[union-attr]


def test_two_jobs_racing_for_the_last_cards_exactly_one_is_enqueued() -> None:
    a, b = group("a", f'{{"{H200}": 2}}'), group("b", f'{{"{H200}": 2}}')
    state = cluster(*NODES, queue("q", f'{{"{H200}": 3}}'), a, b)
    outcomes = [isinstance(enqueue(state, g), Allowed) for g in (a, b)]
    assert outcomes == [True, False]


def test_a_waiting_job_keeps_its_cards_from_later_pods_and_is_enqueued_when_they_free() -> None:
    pg = group(ask=f'{{"{H200}": 2}}')
    state = cluster(*NODES, queue("q", f'{{"{H200}": 2}}'), running("a"), running("b"), pg)
    assert isinstance(enqueue(state, pg, now=10.0), Denied)
    state.delete_pod("uid-ns-a")
    late = request(pod("late"))
    refused = admission.validate(state, late, 11.0)
    assert isinstance(refused, Denied)
    assert "1 waits ahead of it in the queue's line (first: podgroup ns/train, 1 pod of 2 NVIDIA-H200)" in (
        refused.message
    )
    assert calls.call_next(state, 12.0) == ()  # 1 free: the head needs 2
    state.delete_pod("uid-ns-b")
    [call] = calls.call_next(state, 13.0)
    assert call.waiter.what == "podgroup ns/train"
    assert isinstance(admission.validate(state, request(pod("later")), 13.5), Denied)  # held for it
    assert isinstance(enqueue(state, pg, now=14.0), Allowed)  # the scheduler's next try
    seen = copy.deepcopy(pg)
    seen["status"]["phase"] = "Inqueue"
    state.upsert_podgroup(podgroup_record(seen))
    assert state.line.line("q") == () and len(state.ledger) == 0


def test_status_and_waiting_list_a_job_refused_at_enqueue_in_its_namespace() -> None:
    pg = group(ask=f'{{"{H200}": 2}}')
    state = cluster(*NODES, queue("q", f'{{"{H200}": 2}}'), running("a"), pg)
    assert isinstance(enqueue(state, pg, now=10.0), Denied)
    [entry] = report.lines(state, namespace="ns")["q"]
    assert (entry["place"], entry["workload"], entry["pods"], entry["card"]) == (
        1,
        "podgroup ns/train",
        1,
        H200,
    )
    assert report.lines(state, namespace="other") == {}


def test_a_deleted_job_leaves_the_line_and_the_ledger() -> None:
    pg = group()
    state = cluster(*NODES, queue("q", f'{{"{H200}": 1}}'), pg)
    assert isinstance(enqueue(state, pg), Denied)
    state.delete_podgroup("ns/train")
    assert state.line.line("q") == ()


def test_a_dry_run_enqueue_holds_nothing() -> None:
    pg = group()
    state = cluster(*NODES, queue("q", f'{{"{H200}": 1}}'), pg)
    new = copy.deepcopy(pg)
    new["status"]["phase"] = "Inqueue"
    review = request(
        new, resource="podgroups", operation="UPDATE", old=pg, group="scheduling.volcano.sh", dry_run=True
    )
    admission.admit(state, review, admission.validate(state, review, 1.0), 1.0)
    assert state.line.line("q") == () and state.refusals == {}


def test_min_resources_without_a_card_request_is_read_through_the_job_template() -> None:
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ns", "uid": "uid-job-train"},
        "spec": {"queue": "q", "tasks": [{"name": "t", "replicas": 2, "template": template(R4090)}]},
    }
    pg = podgroup("train", "Pending", None, owner_ref=JOB, minMember=2, minResources={"nvidia.com/gpu": "2"})
    state = cluster(*NODES, queue("q", f'{{"{R4090}": 1}}'), job, pg)
    decision = enqueue(state, pg)
    assert isinstance(decision, Denied) and "needs 2 to be enqueued" in decision.message
    state.upsert_queue(queue_record(queue("q", f'{{"{R4090}": 2}}')))
    assert isinstance(enqueue(state, pg), Allowed)

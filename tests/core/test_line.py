"""The waiting line (SPEC §5c), deny mode: refused controllers wait in order and are called the
moment their cards free; nobody overtakes what waits ahead."""

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import (
    H200,
    H800,
    R4090,
    batch_job,
    cluster,
    node,
    owner,
    pod,
    queue,
    replicaset,
    request,
    scale_request,
    vcjob,
)
from tests.builders import deployment as deployment_obj
from webhook.core.decide import admission, calls, report
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model.objects import mark_text, pod_record, queue_record, waiting_mark, workload_record
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Allowed, Denied

NODES = [node("h200", H200), node("r4090", R4090)]


def rs(name: str, replicas: int, card: str = H200, priority: int = 0, mark: str = "") -> dict[str, Any]:
    obj = replicaset(name, replicas, name, card)
    obj["spec"]["template"]["spec"]["priority"] = priority
    if mark:
        obj["metadata"]["annotations"] = {"cardquota.volcano.sh/waiting": mark}
    return obj


def controller_pod(
    rs_name: str, index: int, card: str = H200, priority: int = 0, **kw: Any
) -> dict[str, Any]:
    ref = owner("ReplicaSet", rs_name, f"uid-rs-{rs_name}")
    return pod(f"{rs_name}-{index}", card=card, owner=ref, spec={"priority": priority}, **kw)


def running(name: str, card: str = H200) -> dict[str, Any]:
    return pod(name, card=card, node_name="h200" if card == H200 else "r4090", phase="Running")


def create(state: ClusterState, obj: dict[str, Any], now: float, dry_run: bool = False) -> Allowed | Denied:
    """What the API server does with a pod create: validate, record, and (admitted) the cache sees it."""
    review = request(obj, dry_run=dry_run)
    decision = admission.validate(state, review, now)
    admission.admit(state, review, decision, now)
    if isinstance(decision, Allowed) and not dry_run:
        state.upsert_pod(pod_record(obj))
    return decision


def order(state: ClusterState, queue_name: str = "q") -> list[tuple[str, int]]:
    return [(w.what, w.pods) for w in state.line.line(queue_name)]


def full_queue(*extra: dict[str, Any], quota: int = 2) -> ClusterState:
    return cluster(
        *NODES,
        queue("q", f'{{"{H200}": {quota}, "{R4090}": 2}}'),
        *[running(f"occupant-{i}") for i in range(quota)],
        *extra,
    )


def test_a_refused_replicaset_takes_its_place_in_the_line_and_is_told_so() -> None:
    state = full_queue(rs("web", 2))
    decision = create(state, controller_pod("web", 0), now=100.0)
    assert isinstance(decision, Denied)
    assert decision.message == (
        'queue "q" has 0 NVIDIA-H200 left (quota 2: 2 running); pod ns/web-0 needs 1; its controller'
        " waits 1st in the queue's line and is told to retry the moment its cards free"
    )
    assert order(state) == [("replicaset ns/web", 2)]


def test_a_dry_run_refusal_leaves_the_line_alone() -> None:
    state = full_queue(rs("web", 2))
    assert isinstance(create(state, controller_pod("web", 0), now=100.0, dry_run=True), Denied)
    assert order(state) == []


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod("bare"), id="a bare pod"),
        pytest.param(controller_pod("web", 0, count=3), id="a pod larger than the queue's whole quota"),
    ],
)
def test_who_never_joins_the_line(obj: dict[str, Any]) -> None:
    state = full_queue(rs("web", 1))
    assert isinstance(create(state, obj, now=100.0), Denied)
    assert order(state) == []


def test_wait_mode_queues_do_not_line_up_refused_controllers() -> None:
    waiting = queue("q", f'{{"{H200}": 1}}')
    waiting["metadata"]["annotations"]["cardquota.volcano.sh/over-quota"] = "wait"
    state = cluster(*NODES, waiting)
    state.upsert_pod(pod_record(running("occupant")))
    state.upsert_workload(workload_record(rs("web", 1)))
    assert isinstance(create(state, controller_pod("web", 0), now=1.0), Denied)
    assert order(state) == []


def test_waiters_are_called_by_priority_then_arrival_one_card_at_a_time() -> None:
    state = full_queue(rs("a", 1, priority=0), rs("b", 1, priority=0), rs("c", 1, priority=100), quota=3)
    for now, name, prio in ((10.0, "a", 0), (20.0, "b", 0), (30.0, "c", 100)):
        assert isinstance(create(state, controller_pod(name, 0, priority=prio), now), Denied)
    assert order(state) == [("replicaset ns/c", 1), ("replicaset ns/a", 1), ("replicaset ns/b", 1)]
    served = []
    for index in range(3):
        state.delete_pod(f"uid-ns-occupant-{index}")
        called = calls.call_next(state, now=40.0 + index)
        assert [(c.waiter.what, c.pods) for c in called] == [(order(state)[0][0], 1)]
        name = called[0].waiter.what.split("/")[1]
        assert isinstance(
            create(state, controller_pod(name, 0, priority=100 if name == "c" else 0), 41.0 + index), Allowed
        )
        served.append(name)
    assert served == ["c", "a", "b"]
    assert order(state) == []


def test_a_called_workload_holds_its_cards_against_any_other_create() -> None:
    state = full_queue(rs("web", 1), rs("late", 1))
    assert isinstance(create(state, controller_pod("web", 0), now=10.0), Denied)
    state.delete_pod("uid-ns-occupant-0")
    assert [c.pods for c in calls.call_next(state, now=20.0)] == [1]
    late = create(state, controller_pod("late", 0), now=21.0)
    assert isinstance(late, Denied)
    assert "1 admitted, not yet seen" in late.message
    assert isinstance(create(state, controller_pod("web", 0), now=22.0), Allowed)
    assert order(state) == [("replicaset ns/late", 1)]


def test_a_new_pod_does_not_take_the_cards_freed_for_what_waits_ahead() -> None:
    state = full_queue(rs("web", 2), rs("other", 1))
    assert isinstance(create(state, controller_pod("web", 0), now=10.0), Denied)
    state.delete_pod("uid-ns-occupant-0")  # freed; nobody has called the line yet
    decision = create(state, controller_pod("other", 0), now=11.0)
    assert isinstance(decision, Denied)
    assert decision.message.startswith(
        'queue "q" has 0 NVIDIA-H200 left (quota 2: 1 running, 2 waiting ahead in line); pod ns/other-0'
        " needs 1; 1 waits ahead of it in the queue's line (first: replicaset ns/web, 2 pods of 1 NVIDIA-H200)"
    )


def test_the_waiter_itself_is_not_kept_out_by_its_own_place() -> None:
    state = full_queue(rs("web", 2))
    assert isinstance(create(state, controller_pod("web", 0), now=10.0), Denied)
    state.delete_pod("uid-ns-occupant-0")
    assert isinstance(create(state, controller_pod("web", 0), now=11.0), Allowed)  # its controller's retry
    assert order(state) == [("replicaset ns/web", 1)]


def test_a_waiter_on_another_card_is_called_past_a_head_that_does_not_fit() -> None:
    state = full_queue(rs("big", 1), rs("small", 1, card=R4090))
    state.upsert_pod(pod_record(running("r-0", R4090)))
    state.upsert_pod(pod_record(running("r-1", R4090)))
    assert isinstance(create(state, controller_pod("big", 0), now=10.0), Denied)
    assert isinstance(create(state, controller_pod("small", 0, card=R4090), now=11.0), Denied)
    state.delete_pod("uid-ns-r-0")
    assert [c.waiter.what for c in calls.call_next(state, now=12.0)] == ["replicaset ns/small"]


def test_a_scale_up_while_pods_wait_is_refused_naming_what_waits_ahead() -> None:
    state = full_queue(rs("web", 1), deployment_obj("chat", 1), quota=3)
    state.delete_pod("uid-ns-occupant-2")
    assert isinstance(create(state, controller_pod("web", 0), now=10.0), Allowed)  # takes the free card
    state.upsert_workload(workload_record(rs("web", 2)))
    assert isinstance(create(state, controller_pod("web", 1), now=11.0), Denied)
    state.delete_pod("uid-ns-occupant-1")
    decision = admission.validate(state, scale_request("chat", 1, 2), now=12.0)
    assert isinstance(decision, Denied)
    assert decision.message == (
        "scale-up of deployment ns/chat from 1 to 2 replicas needs 2 NVIDIA-H200 (1 per pod); queue"
        ' "q" has 0 left (quota 3: 1 running, 1 pending, 1 waiting ahead in line); 1 waits ahead of it'
        " in the queue's line (first: replicaset ns/web, 1 pod of 1 NVIDIA-H200)"
    )


def test_a_closed_queue_keeps_its_line_and_calls_nobody() -> None:
    state = full_queue(rs("web", 1))
    assert isinstance(create(state, controller_pod("web", 0), now=10.0), Denied)
    closed = queue("q", f'{{"{H200}": 2}}', state="Closed")
    state.upsert_queue(queue_record(closed))
    state.delete_pod("uid-ns-occupant-0")
    assert calls.call_next(state, now=11.0) == ()
    assert order(state) == [("replicaset ns/web", 1)]


def test_a_raised_quota_calls_the_line() -> None:
    state = full_queue(rs("web", 2))
    assert isinstance(create(state, controller_pod("web", 0), now=10.0), Denied)
    state.upsert_queue(queue_record(queue("q", f'{{"{H200}": 3}}')))
    assert [c.pods for c in calls.call_next(state, now=11.0)] == [1]
    state.upsert_queue(queue_record(queue("q", f'{{"{H200}": 5}}')))
    assert [c.pods for c in calls.call_next(state, now=12.0)] == [1]


def test_a_deleted_or_complete_workload_leaves_the_line() -> None:
    state = full_queue(rs("web", 1), rs("gone", 1))
    for name in ("web", "gone"):
        assert isinstance(create(state, controller_pod(name, 0), now=10.0), Denied)
    state.delete_workload("ReplicaSet", "ns/gone")
    state.upsert_workload(workload_record(rs("web", 0)))  # scaled down to what it has
    assert order(state) == []


def test_the_line_is_marked_on_its_workloads_and_rebuilt_from_the_marks() -> None:
    state = full_queue(rs("a", 2), rs("b", 1, priority=5))
    assert isinstance(create(state, controller_pod("a", 0), now=10.0), Denied)
    assert isinstance(create(state, controller_pod("b", 0, priority=5), now=20.0), Denied)
    marks = {m.name: m.text for m in calls.marks(state)}
    assert marks == {"a": mark_text(10.0, 0), "b": mark_text(20.0, 5)}
    assert marks["b"] == '{"since":"1970-01-01T00:00:20.000Z","priority":5}'
    rebuilt = full_queue(rs("a", 2, mark=marks["a"] or ""), rs("b", 1, priority=5, mark=marks["b"] or ""))
    assert order(rebuilt) == order(state) == [("replicaset ns/b", 1), ("replicaset ns/a", 2)]
    assert calls.marks(rebuilt) == ()
    rebuilt.upsert_workload(workload_record(rs("b", 0, priority=5, mark=marks["b"] or "")))
    assert [(m.name, m.text) for m in calls.marks(rebuilt)] == [("b", None)]


def test_an_unreadable_mark_is_ignored() -> None:
    state = full_queue(rs("web", 1, mark="{not json"))
    assert order(state) == []


def test_a_smaller_waiter_does_not_overtake_a_larger_head_on_the_same_card() -> None:
    state = full_queue(rs("big", 1), rs("small", 1), quota=3)
    big = replicaset("big", 1, "big", H200)
    big["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    state.upsert_workload(workload_record(big))
    assert isinstance(create(state, controller_pod("big", 0, count=2), now=10.0), Denied)
    assert isinstance(create(state, controller_pod("small", 0), now=11.0), Denied)
    state.delete_pod("uid-ns-occupant-0")  # one card free: not enough for the head
    assert calls.call_next(state, now=12.0) == ()
    state.delete_pod("uid-ns-occupant-1")  # two: the head first
    assert [(c.waiter.what, c.pods) for c in calls.call_next(state, now=13.0)] == [("replicaset ns/big", 1)]


def test_status_lists_each_queues_line_in_order() -> None:
    state = full_queue(rs("a", 2), rs("b", 1, priority=5))
    assert isinstance(create(state, controller_pod("a", 0), now=10.0), Denied)
    assert isinstance(create(state, controller_pod("b", 0, priority=5), now=20.0), Denied)
    waiting = report.lines(state)
    assert waiting == {
        "q": [
            {
                "place": 1,
                "workload": "replicaset ns/b",
                "pods": 1,
                "card": "NVIDIA-H200",
                "per_pod": 1,
                "priority": 5,
                "since": "1970-01-01T00:00:20.000Z",
            },
            {
                "place": 2,
                "workload": "replicaset ns/a",
                "pods": 2,
                "card": "NVIDIA-H200",
                "per_pod": 1,
                "priority": 0,
                "since": "1970-01-01T00:00:10.000Z",
            },
        ]
    }
    assert report.lines(state, namespace="other") == {}
    table = report.status_table(report.cluster_status(state))
    assert "WAITING LINES (first in line first)" in table
    assert "q                    1  replicaset ns/b" in table


def job_pod(job: str, index: int, **kw: Any) -> dict[str, Any]:
    return pod(f"{job}-{index}", owner=owner("Job", job, f"uid-batch-{job}", api="batch/v1"), **kw)


def test_a_refused_batch_job_waits_in_line_is_called_and_its_pods_are_covered() -> None:
    state = full_queue(batch_job("train", 2, completions=4))
    decision = create(state, job_pod("train", 0), now=10.0)
    assert isinstance(decision, Denied)
    assert decision.message.endswith(
        "its controller waits 1st in the queue's line and is told to retry the moment its cards free"
    )
    assert order(state) == [("job.batch ns/train", 2)]
    assert [(m.kind, m.name) for m in calls.marks(state)] == [("Job.batch", "train")]
    state.delete_pod("uid-ns-occupant-0")
    assert [(c.waiter.what, c.pods) for c in calls.call_next(state, now=11.0)] == [("job.batch ns/train", 1)]
    assert isinstance(create(state, pod("other"), now=11.5), Denied)  # held for the job
    assert isinstance(create(state, job_pod("train", 0), now=12.0), Allowed)
    assert order(state) == [("job.batch ns/train", 1)]


@pytest.mark.parametrize(
    ("job", "wants"),
    [
        pytest.param(batch_job("j", 3), 3, id="parallelism without completions"),
        pytest.param(batch_job("j", 3, succeeded=1), 0, id="a work queue once one pod succeeded"),
        pytest.param(batch_job("j", 3, completions=5, succeeded=3), 2, id="no more than completions left"),
        pytest.param(batch_job("j", 2, completions=5, succeeded=1), 2, id="parallelism when more are left"),
        pytest.param(batch_job("j", None, completions=4), 1, id="parallelism defaults to 1"),
        pytest.param(batch_job("j", 3, suspend=True), 0, id="suspended"),
        pytest.param(batch_job("j", 3, finished="Complete"), 0, id="complete"),
        pytest.param(batch_job("j", 3, finished="FailureTarget"), 0, id="failing"),
        pytest.param(batch_job("j", 0), 0, id="parallelism 0"),
    ],
)
def test_a_batch_job_waits_for_the_pods_its_controller_still_wants(job: dict[str, Any], wants: int) -> None:
    assert workload_record(job).replicas == wants


def test_a_batch_job_that_completes_or_is_deleted_leaves_the_line() -> None:
    state = full_queue(batch_job("a", 1), batch_job("b", 1))
    for name in ("a", "b"):
        assert isinstance(create(state, job_pod(name, 0), now=10.0), Denied)
    assert len(order(state)) == 2
    state.upsert_workload(workload_record(batch_job("a", 1, finished="Complete")))
    ingest.remove(state, batch_job("b", 1))
    assert order(state) == []


def test_a_batch_job_and_a_volcano_job_of_one_name_are_held_apart() -> None:
    volcano = vcjob("train", [(1, replicaset("x", 1, "x")["spec"]["template"])])
    state = full_queue(volcano, batch_job("train", 1))
    assert state.workloads.get("Job", "ns", "train") is not None
    assert state.workloads.get("Job.batch", "ns", "train") is not None
    ingest.remove(state, batch_job("train", 1))
    assert state.workloads.get("Job.batch", "ns", "train") is None
    assert state.workloads.get("Job", "ns", "train") is not None
    assert set(ingest.identities(state, "Job", "batch.volcano.sh/v1alpha1")) == {"ns/train"}
    assert ingest.identities(state, "Job", "batch/v1") == {}


def test_with_the_line_off_a_refusal_is_all_there_is() -> None:
    state = full_queue(rs("web", 1))
    state.policy = Policy(waiting_line=False)
    decision = create(state, controller_pod("web", 0), now=10.0)
    assert isinstance(decision, Denied) and decision.message.endswith("pod ns/web-0 needs 1")
    assert order(state) == []


@given(
    st.one_of(
        st.text(max_size=60),
        st.builds(
            lambda since, priority: json.dumps({"since": since, "priority": priority}),
            st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.none()),
            st.one_of(st.integers(-(2**80), 2**80), st.floats(), st.text(max_size=5), st.booleans()),
        ),
    )
)
def test_a_waiting_mark_of_any_text_is_read_or_ignored_never_fatal(text: str) -> None:
    mark = waiting_mark(text)
    assert mark is None or (math.isfinite(mark[0]) and -(2**31) <= mark[1] <= 2**31)
    state = full_queue(rs("web", 1, mark=text))  # a workload carrying it is ingested all the same
    assert state.workloads.get("ReplicaSet", "ns", "web") is not None


def test_a_head_waiter_the_quota_can_no_longer_hold_leaves_and_those_behind_are_called() -> None:
    """The quota cut below one pod of the head waiter: it would wait forever, and on its card
    nobody behind it overtakes it. It leaves the line saying why; the next is called."""
    state = full_queue(rs("big", 1), rs("small", 1), quota=3)
    big = replicaset("big", 1, "big", H200)
    big["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "3"
    state.upsert_workload(workload_record(big))
    assert isinstance(create(state, controller_pod("big", 0, count=3), now=10.0), Denied)
    assert isinstance(create(state, controller_pod("small", 0), now=11.0), Denied)
    state.upsert_queue(queue_record(queue("q", f'{{"{H200}": 2, "{R4090}": 2}}')))
    state.delete_pod("uid-ns-occupant-0")
    state.delete_pod("uid-ns-occupant-1")  # one card free under the new quota of 2
    (gone,) = calls.unfit(state)  # out of the line the moment the quota was cut, told once
    assert calls.unfit(state) == ()
    assert calls.unfit_message(state, gone) == (
        'replicaset ns/big left queue "q"\'s line: one pod of it needs 3 NVIDIA-H200, more than the'
        ' whole quota of queue "q" (or of a queue above it) holds now, so it waits out of the line,'
        " ahead of no one, until that quota changes; those behind it are called (lower its replicas,"
        " or raise the quota)"
    )
    assert [(c.waiter.what, c.pods) for c in calls.call_next(state, now=13.0)] == [("replicaset ns/small", 1)]
    assert order(state) == [("replicaset ns/small", 1)]
    assert calls.unfit(state) == ()


def test_a_called_pod_admitted_but_not_seen_yet_is_not_called_again() -> None:
    """A called ReplicaSet's pod is admitted (its card moves from the call's hold to the pod's own)
    and another card frees before the cache shows the pod: the ReplicaSet, whose pods are all made,
    is not called again for it (that card would be held for nothing), and the next in line gets it."""
    state = full_queue(rs("web", 1), rs("late", 1))
    for name, at in (("web", 10.0), ("late", 11.0)):
        assert isinstance(create(state, controller_pod(name, 0), now=at), Denied)
    state.delete_pod("uid-ns-occupant-0")
    assert [(c.waiter.what, c.pods) for c in calls.call_next(state, now=20.0)] == [("replicaset ns/web", 1)]
    review = request(controller_pod("web", 0))
    decision = admission.validate(state, review, 21.0)
    assert isinstance(decision, Allowed)
    admission.admit(state, review, decision, 21.0)  # admitted; the cache has not shown it yet
    state.delete_pod("uid-ns-occupant-1")
    assert [(c.waiter.what, c.pods) for c in calls.call_next(state, now=21.5)] == [("replicaset ns/late", 1)]
    state.upsert_pod(pod_record(controller_pod("web", 0)))  # now it has: web leaves the line served
    assert order(state) == [("replicaset ns/late", 1)]


def test_a_workload_whose_missing_pods_could_never_all_fit_waits_in_no_line_and_blocks_nobody() -> None:
    """A squatter's 1,000 replicas (1 card each) in a queue of 2: each pod alone could fit, but the
    whole it waits for never can; holding the head of the line it would refuse everyone after it."""
    state = full_queue(rs("squat", 1000), rs("web", 1))
    decision = create(state, controller_pod("squat", 0), now=100.0)
    assert isinstance(decision, Denied) and order(state) == []
    assert decision.message == (
        'queue "q" has 0 NVIDIA-H200 left (quota 2: 2 running); pod ns/squat-0 needs 1; replicaset ns/squat'
        " still wants 1000 pods, 1000 NVIDIA-H200 in all, more than the whole quota of its queue (or of a"
        " queue above it) holds, so it waits out of the line, ahead of no one, until that quota changes"
        " (lower its replicas, or raise the quota)"
    )
    assert isinstance(create(state, controller_pod("web", 0), now=101.0), Denied)
    assert order(state) == [("replicaset ns/web", 1)]  # first in line: nothing ahead of it


def test_its_twin_that_could_fit_whole_waits_in_line() -> None:
    state = full_queue(rs("web", 2))
    assert isinstance(create(state, controller_pod("web", 0), now=100.0), Denied)
    assert order(state) == [("replicaset ns/web", 2)]


def test_a_waiter_whose_missing_pods_the_quota_no_longer_holds_leaves_the_line_saying_why() -> None:
    state = full_queue(rs("web", 2))
    assert isinstance(create(state, controller_pod("web", 0), now=100.0), Denied)
    ingest.upsert(state, queue("q", f'{{"{H200}": 1, "{R4090}": 2}}'))
    (waiter,) = calls.unfit(state)
    assert order(state) == []
    assert calls.unfit_message(state, waiter) == (
        'replicaset ns/web left queue "q"\'s line: the 2 pods it still wants need 2 NVIDIA-H200, more than'
        ' the whole quota of queue "q" (or of a queue above it) holds now, so it waits out of the line,'
        " ahead of no one, until that quota changes; those behind it are called (lower its replicas, or"
        " raise the quota)"
    )


def test_a_parked_workload_takes_its_place_again_when_its_quota_is_raised_and_is_called() -> None:
    """Out of the line it holds up no one; the operator raising the quota is what it waits for."""
    state = full_queue(rs("web", 3), rs("api", 1))
    assert isinstance(create(state, controller_pod("web", 0), now=100.0), Denied)
    assert isinstance(create(state, controller_pod("api", 0), now=101.0), Denied)
    assert order(state) == [("replicaset ns/api", 1)]  # web (3 of a quota of 2) parked
    relabelled = queue("q", f'{{"{H200}": 2, "{R4090}": 2}}')
    relabelled["metadata"]["annotations"]["team"] = "a"
    state.upsert_queue(queue_record(relabelled))
    assert order(state) == [("replicaset ns/api", 1)]  # not its quota: still parked
    state.upsert_queue(queue_record(queue("q", f'{{"{H200}": 6, "{R4090}": 2}}')))
    assert order(state) == [("replicaset ns/web", 3), ("replicaset ns/api", 1)]  # its first refusal's place
    assert [(c.waiter.what, c.pods) for c in calls.call_next(state, 102.0)] == [
        ("replicaset ns/web", 3),
        ("replicaset ns/api", 1),
    ]


def test_an_a_or_b_workload_is_whole_when_its_pods_spread_over_its_models() -> None:
    """Each pod of an A|B Deployment gets its own model: 4 pods of 1 card are whole on 2 H200 and
    2 H800 (none of the models holds all 4), so it waits in line."""
    occupants = [
        pod(f"o-{card}-{i}", card=card, node_name="h200", phase="Running")
        for card in (H200, H800)
        for i in range(2)
    ]
    state = cluster(*NODES, node("h800", H800), queue("q", f'{{"{H200}": 2, "{H800}": 2}}'), *occupants)
    ingest.upsert(state, rs("flex", 4, card=f"{H200}|{H800}"))
    assert isinstance(create(state, controller_pod("flex", 0, card=f"{H200}|{H800}"), now=100.0), Denied)
    assert order(state) == [("replicaset ns/flex", 4)]

"""Wait mode (SPEC §5c): a controller's pod that does not fit now is created under our scheduling
gate, charged nothing, and released by the line the moment its cards free, in order; only the
webhook removes the gate."""

import copy
from typing import Any

import jsonpatch
import pytest

from tests.builders import H200, R4090, cluster, node, owner, pod, podgroup, queue, request, scale_request
from tests.builders import deployment as deployment_obj
from tests.builders import replicaset as replicaset_obj
from webhook.core.decide import admission, calls, patches, report
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model import keys
from webhook.core.model.cards import UNIT
from webhook.core.model.objects import pod_record, podgroup_record, queue_record
from webhook.core.model.verdicts import Allowed, Denied

NODES = [node("h200", H200), node("r4090", R4090)]


def wait_queue(quota: str, name: str = "q") -> dict[str, Any]:
    obj = queue(name, quota)
    obj["metadata"]["annotations"][keys.OVER_QUOTA] = "wait"
    return obj


def full(*extra: dict[str, Any], h200: int = 1) -> ClusterState:
    """A wait-mode queue whose ``h200`` H200 (and 1 RTX-4090) are all taken."""
    occupants = [pod(f"occupant-{i}", node_name="h200", phase="Running", uid=f"occ-{i}") for i in range(h200)]
    return cluster(
        *NODES,
        wait_queue(f'{{"{H200}": {h200}, "{R4090}": 1}}'),
        *occupants,
        pod("r-occupant", R4090, node_name="r4090", phase="Running", uid="occ-r"),
        *extra,
    )


def rs_pod(
    name: str, card: str = H200, priority: int = 0, kind: str = "ReplicaSet", **kw: Any
) -> dict[str, Any]:
    api = "batch/v1" if kind == "Job" else "apps/v1"
    obj = pod(name, card=card, owner=owner(kind, "web", "uid-web", api), uid=f"uid-{name}", **kw)
    obj["spec"]["priority"] = priority
    return obj


def create(
    state: ClusterState, obj: dict[str, Any], now: float, seen: bool = True, generated: bool = False
) -> tuple[Allowed | Denied, dict[str, Any]]:
    """What the API server does with a pod create: mutate, validate the mutated pod, record, and
    (admitted; ``seen``) the cache sees it. ``generated``: the pod is named by ``generateName``, as
    a controller's pods are: the mutation sees no name, the validation the one generated."""
    name = obj["metadata"]["name"]
    if generated:
        obj = copy.deepcopy(obj)
        del obj["metadata"]["name"]
        obj["metadata"]["generateName"] = name.rsplit("-", 1)[0] + "-"
    review = request(obj)
    mutation = admission.mutate(state, review, now=now)
    admission.admit(state, review, mutation, now)
    assert isinstance(mutation, Allowed), mutation
    made = jsonpatch.apply_patch(obj, [dict(op) for op in mutation.patch])
    made["metadata"]["name"] = name
    review = request(made)
    decision = admission.validate(state, review, now)
    admission.admit(state, review, decision, now)
    if isinstance(decision, Allowed) and seen:
        state.upsert_pod(pod_record(made))
    return decision, made


def release(state: ClusterState, now: float) -> list[dict[str, Any]]:
    """The caller's pass: every pod released now, patched as the API server would, then seen."""
    released = []
    for call in calls.call_next(state, now):
        live = state_objects[call.waiter.key]
        ops = patches.release_patch(state, live, call.card)
        assert ops is not None
        made = jsonpatch.apply_patch(live, [dict(op) for op in ops if op["op"] != "test"])
        state_objects[call.waiter.key] = made
        state.upsert_pod(pod_record(made))
        released.append(made)
    return released


state_objects: dict[str, dict[str, Any]] = {}


@pytest.fixture(autouse=True)
def _objects() -> None:
    state_objects.clear()


def held(state: ClusterState, obj: dict[str, Any], now: float) -> dict[str, Any]:
    decision, made = create(state, obj, now)
    assert isinstance(decision, Allowed), decision
    state_objects[made["metadata"]["uid"]] = made
    return made


def used(state: ClusterState, card: str = H200, origin: str = "") -> int:
    """What the queue counts of ``card`` (of one origin: "bound", "reserved", ...), as a
    decision sees it."""
    parts = queue_usage(state, "q").fixed.get(card, {})
    return (parts.get(origin, 0) if origin else sum(parts.values())) // UNIT


def test_a_controllers_pod_that_does_not_fit_is_created_gated_charged_nothing_and_waits() -> None:
    state = full()
    decision, made = create(state, rs_pod("web-0"), now=100.0)
    assert isinstance(decision, Allowed)
    assert decision.reason == "waits 1st in the queue's line under its scheduling gate"
    assert made["spec"]["schedulingGates"] == [{"name": keys.GATE}]
    assert (
        made["metadata"]["annotations"][keys.WAITING] == '{"since":"1970-01-01T00:01:40.000Z","priority":0}'
    )
    assert used(state) == 1  # the occupant only
    assert [(w.what, w.pod) for w in state.line.line("q")] == [("pod ns/web-0", True)]


def test_a_pod_that_fits_is_not_gated() -> None:
    state = cluster(*NODES, wait_queue(f'{{"{H200}": 1}}'))
    decision, made = create(state, rs_pod("web-0"), now=100.0)
    assert isinstance(decision, Allowed) and "schedulingGates" not in made["spec"]


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod("bare", uid="uid-bare"), id="a bare pod"),
        pytest.param(rs_pod("big", count=2), id="a pod larger than the queue's whole quota"),
    ],
)
def test_who_is_refused_in_wait_mode_too(obj: dict[str, Any]) -> None:
    state = full()
    decision, made = create(state, obj, now=100.0)
    assert isinstance(decision, Denied) and "schedulingGates" not in made["spec"]
    assert len(state.line) == 0


def test_a_batch_jobs_pod_waits_too() -> None:
    state = full()
    decision, _ = create(state, rs_pod("job-0", kind="Job"), now=100.0)
    assert isinstance(decision, Allowed) and len(state.line) == 1


def test_the_freed_card_releases_the_head_once_and_the_cache_settles_its_hold() -> None:
    state = full()
    held(state, rs_pod("web-0"), 100.0)
    assert release(state, 101.0) == []
    state.delete_pod("occ-0")
    [made] = release(state, 102.0)
    assert "schedulingGates" not in made["spec"] or made["spec"]["schedulingGates"] == []
    assert len(state.line) == 0 and len(state.ledger) == 0
    assert used(state) == 1
    assert calls.call_next(state, 103.0) == ()


def test_a_call_is_held_until_the_cache_sees_the_pod_released_so_nobody_takes_its_card() -> None:
    state = full()
    held(state, rs_pod("web-0"), 100.0)
    state.delete_pod("occ-0")
    [call] = calls.call_next(state, 101.0)
    assert call.waiter.what == "pod ns/web-0" and len(state.ledger) == 1
    assert calls.call_next(state, 101.5) == ()  # called once
    decision, made = create(state, rs_pod("other-0"), now=101.6)  # gated: web-0 still has its card
    assert isinstance(decision, Allowed) and decision.reason.startswith("waits 2nd")
    assert made["spec"]["schedulingGates"] == [{"name": keys.GATE}]


def test_pods_are_released_by_priority_then_arrival() -> None:
    state = full()
    for now, name, priority in ((10.0, "a", 0), (20.0, "b", 0), (30.0, "c", 100)):
        held(state, rs_pod(name, priority=priority), now)
    assert [w.what for w in state.line.line("q")] == ["pod ns/c", "pod ns/a", "pod ns/b"]
    served = []
    for _ in range(3):
        occupant = next(p for p in state.pods.values() if p.waiting is None and p.node_name == "h200")
        state.delete_pod(occupant.uid)
        served += [p["metadata"]["name"] for p in release(state, 50.0)]
        state.upsert_pod(
            pod_record(
                {
                    **state_objects[f"uid-{served[-1]}"],
                    "spec": {**state_objects[f"uid-{served[-1]}"]["spec"], "nodeName": "h200"},
                    "status": {"phase": "Running"},
                }
            )
        )
    assert served == ["c", "a", "b"]


def test_a_scale_up_waits_behind_the_gated_pods_and_says_so() -> None:
    state = full(deployment_obj("chat", 1, H200))
    held(state, rs_pod("web-0"), 100.0)
    state.delete_pod("occ-0")
    decision = admission.validate(state, scale_request("chat", 1, 2), 101.0)
    assert isinstance(decision, Denied)
    assert (
        "1 waits ahead of it in the queue's line (first: pod ns/web-0, 1 pod of 1 NVIDIA-H200)"
        in decision.message
    )


def test_an_a_or_b_pod_waits_on_both_models_and_is_released_on_the_one_that_frees() -> None:
    state = full()
    made = held(state, rs_pod("flex-0", card=f"{H200}|{R4090}"), 100.0)
    terms = made["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [
        "NVIDIA-H200",
        "NVIDIA-GeForce-RTX-4090",
    ]
    state.delete_pod("occ-r")
    [released] = release(state, 101.0)
    annotations = released["metadata"]["annotations"]
    assert annotations[keys.CARD_NAME] == R4090 and annotations[keys.CARD_SPEC] == f"{H200}|{R4090}"
    expressions = released["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    assert [e["values"] for e in expressions] == [
        ["NVIDIA-H200", "NVIDIA-GeForce-RTX-4090"],
        ["NVIDIA-GeForce-RTX-4090"],
    ]
    assert used(state, R4090) == 1 and used(state, H200) == 1


def test_removing_the_gate_as_anyone_else_is_denied_saying_where_the_pod_stands() -> None:
    state = full()
    held(state, rs_pod("a"), 10.0)
    made = held(state, rs_pod("b"), 20.0)
    ungated = {**made, "spec": {**made["spec"], "schedulingGates": []}}
    decision = admission.validate(state, request(ungated, operation="UPDATE", old=made), 30.0)
    assert isinstance(decision, Denied)
    assert decision.message == (
        'pod ns/b waits 2nd in queue "q"\'s line for 1 NVIDIA-H200 under the scheduling gate'
        " cardquota.volcano.sh/waiting; only the card-quota webhook removes it, the moment its cards"
        " free (delete the pod to leave the line)"
    )
    relabelled = {**made, "metadata": {**made["metadata"], "labels": {"x": "y"}}}
    assert isinstance(
        admission.validate(state, request(relabelled, operation="UPDATE", old=made), 30.0), Allowed
    )


def test_a_gate_set_by_hand_on_a_bare_pod_is_refused() -> None:
    state = full()
    decision = admission.validate(state, request(pod("bare", gated=5.0)), 10.0)
    assert isinstance(decision, Denied) and "which the webhook alone sets" in decision.message


def test_a_deleted_waiting_pod_leaves_the_line() -> None:
    state = full()
    held(state, rs_pod("web-0"), 100.0)
    state.delete_pod("uid-web-0")
    assert len(state.line) == 0


def test_a_new_replica_rebuilds_the_same_line_from_the_pods_alone() -> None:
    state = full()
    for now, name in ((10.0, "a"), (20.0, "b")):
        held(state, rs_pod(name), now)
    rebuilt = full(*state_objects.values())
    assert [(w.what, w.since) for w in rebuilt.line.line("q")] == [
        (w.what, w.since) for w in state.line.line("q")
    ]


def test_a_podgroup_reserves_nothing_for_its_gated_pods_as_the_plugin_deducts_them() -> None:
    ref = owner("ReplicaSet", "web", "uid-web")
    state = full(podgroup("pg-web", "Pending", f'{{"{H200}": 1}}', owner_ref=ref))
    held(state, rs_pod("web-0", group="pg-web"), 100.0)
    inqueue = podgroup("pg-web", "Inqueue", f'{{"{H200}": 1}}', owner_ref=ref)
    state.upsert_podgroup(podgroup_record(inqueue))
    assert used(state, origin="reserved") == 0
    state.delete_pod("uid-web-0")
    assert used(state, origin="reserved") == 1


def test_a_smaller_pod_behind_a_larger_head_is_not_released_into_the_room_the_head_waits_for() -> None:
    state = full(h200=2)
    held(state, rs_pod("big", count=2), 10.0)
    held(state, rs_pod("small"), 20.0)
    state.delete_pod("occ-0")  # 1 card free: the head needs 2
    assert release(state, 30.0) == []
    state.delete_pod("occ-1")
    assert [p["metadata"]["name"] for p in release(state, 31.0)] == ["big"]


def test_a_volcano_workload_holds_one_gated_pod_and_none_once_its_podgroup_is_enqueued() -> None:
    """The capacity-card plugin enqueues a PodGroup only when every pod of it fits, gated ones
    included: so while the ReplicaSet's group is not enqueued, its second pod is refused and the
    ReplicaSet waits in the line instead. Once the group is enqueued the plugin counts its gated
    pods as reserved (by card name; it deducts them only under nvidia.com/gpu), which would keep a
    group released ahead of them from being enqueued: its pods are refused too, never gated."""
    ref = owner("ReplicaSet", "web", "uid-web")
    rs = replicaset_obj("web", 2, "web")
    rs["metadata"]["uid"] = "uid-web"
    state = full(rs, podgroup("pg-web", "Pending", f'{{"{H200}": 1}}', owner_ref=ref))
    volcano = {"schedulerName": "volcano"}
    first = held(state, rs_pod("web-0", spec=volcano), 10.0)
    assert first["spec"]["schedulingGates"] == [{"name": keys.GATE}]
    decision, second = create(state, rs_pod("web-1", spec=volcano), 11.0)
    assert isinstance(decision, Denied) and "schedulingGates" not in second["spec"]
    assert decision.message.endswith(
        "its controller waits 2nd in the queue's line and is told to retry the moment its cards free"
    )
    state.upsert_podgroup(podgroup_record(podgroup("pg-web", "Running", f'{{"{H200}": 1}}', owner_ref=ref)))
    decision, third = create(state, rs_pod("web-2", spec=volcano), 12.0)
    assert isinstance(decision, Denied) and "schedulingGates" not in third["spec"]
    assert (
        f'queue "q" has 0 {H200} left' in decision.message
        and "waits 2nd in the queue's line" in decision.message
    )
    plain = rs_pod("solo-0", spec={"schedulerName": "default-scheduler"})
    assert held(state, plain, 13.0)["spec"]["schedulingGates"] == [{"name": keys.GATE}]  # not Volcano's


@pytest.mark.parametrize("generated", [False, True], ids=["named", "generateName"])
def test_a_second_pod_created_before_the_cache_sees_the_first_gated_one_is_not_gated_too(
    generated: bool,
) -> None:
    """A ReplicaSet creates its pods back to back: the second can be mutated before the cache has
    seen the first arrive under the gate. It is refused all the same (its controller waits in the
    line), not gated beside it; once the first is seen, or the mark expires, the rule is the cache's.
    A controller's pods are named by ``generateName``: the mutation sees none of their names."""
    ref = owner("ReplicaSet", "web", "uid-web")
    rs = replicaset_obj("web", 3, "web")
    rs["metadata"]["uid"] = "uid-web"
    state = full(rs, podgroup("pg-web", "Pending", f'{{"{H200}": 1}}', owner_ref=ref))
    volcano = {"schedulerName": "volcano"}
    decision, first = create(state, rs_pod("web-0", spec=volcano), 10.0, seen=False, generated=generated)
    assert isinstance(decision, Allowed) and first["spec"]["schedulingGates"] == [{"name": keys.GATE}]
    decision, second = create(state, rs_pod("web-1", spec=volcano), 10.01, seen=False, generated=generated)
    assert isinstance(decision, Denied) and "schedulingGates" not in second["spec"], decision
    state.upsert_pod(pod_record(first))  # seen now: the cache's count takes over
    decision, again = create(state, rs_pod("web-1", spec=volcano), 11.0, generated=generated)
    assert isinstance(decision, Denied) and "schedulingGates" not in again["spec"]
    state.delete_pod(first["metadata"]["uid"])  # the first is gone: a pod of it may wait again
    decision, third = create(state, rs_pod("web-2", spec=volcano), 12.0, generated=generated)
    assert isinstance(decision, Allowed) and third["spec"]["schedulingGates"] == [{"name": keys.GATE}]


def test_a_released_pod_still_pending_keeps_its_siblings_from_the_gate_until_its_group_is_enqueued() -> None:
    ref = owner("ReplicaSet", "web", "uid-web")
    rs = replicaset_obj("web", 2, "web")
    rs["metadata"]["uid"] = "uid-web"
    state = full(rs, podgroup("pg-web", "Pending", f'{{"{H200}": 1}}', owner_ref=ref))
    volcano = {"schedulerName": "volcano"}
    held(state, rs_pod("web-0", spec=volcano), 10.0)
    state.delete_pod("occ-0")
    [released] = release(state, 11.0)  # pending: its group not enqueued yet
    assert "nodeName" not in released["spec"]
    decision, second = create(state, rs_pod("web-1", spec=volcano), 12.0)
    assert isinstance(decision, Denied) and "schedulingGates" not in second["spec"]


def test_waiting_lists_the_held_pods_in_order_in_their_namespace() -> None:
    state = full()
    for now, name in ((10.0, "a"), (20.0, "b")):
        held(state, rs_pod(name), now)
    listed = report.lines(state, namespace="ns")
    assert [(e["place"], e["workload"], e["pods"]) for e in listed["q"]] == [
        (1, "pod ns/a", 1),
        (2, "pod ns/b", 1),
    ]
    assert report.lines(state, namespace="other") == {}


def test_a_gated_pod_the_quota_can_no_longer_hold_leaves_the_line_and_rejoins_when_it_is_raised() -> None:
    state = full(h200=2)
    big = held(state, rs_pod("big-0", count=2), now=100.0)
    held(state, rs_pod("small-0"), now=101.0)
    state.upsert_queue(queue_record(wait_queue(f'{{"{H200}": 1, "{R4090}": 1}}')))
    state.delete_pod("occ-0")
    state.delete_pod("occ-1")
    assert [w.what for w in calls.unfit(state)] == ["pod ns/big-0"]
    assert [r["metadata"]["name"] for r in release(state, now=102.0)] == ["small-0"]
    assert big["spec"]["schedulingGates"] == [{"name": keys.GATE}]  # it keeps its gate
    state.upsert_queue(queue_record(wait_queue(f'{{"{H200}": 3, "{R4090}": 1}}')))
    assert [w.what for w in state.line.line("q")] == ["pod ns/big-0"]
    assert calls.unfit(state) == ()
    assert [r["metadata"]["name"] for r in release(state, now=103.0)] == ["big-0"]


FORGED = '{"since":"1970-01-01T00:00:00Z","priority":2147483647}'


@pytest.mark.parametrize("gated", [True, False], ids=["with the gate", "mark alone"])
def test_a_forged_waiting_mark_on_a_new_pod_is_replaced_so_it_cannot_jump_the_line(gated: bool) -> None:
    state = full()
    held(state, rs_pod("early"), 50.0)
    forged = rs_pod("squat")
    forged["metadata"]["annotations"][keys.WAITING] = FORGED
    if gated:
        forged["spec"]["schedulingGates"] = [{"name": keys.GATE}]
    decision, made = create(state, forged, now=100.0)
    assert (
        isinstance(decision, Allowed)
        and decision.reason == "waits 2nd in the queue's line under its scheduling gate"
    )
    assert (
        made["metadata"]["annotations"][keys.WAITING] == '{"since":"1970-01-01T00:01:40.000Z","priority":0}'
    )
    assert [w.what for w in state.line.line("q")] == ["pod ns/early", "pod ns/squat"]


def test_the_mark_a_first_pass_of_the_same_create_wrote_is_kept() -> None:
    state = full()
    again = rs_pod("web-0")
    again["metadata"]["annotations"][keys.WAITING] = '{"since":"1970-01-01T00:01:39.500Z","priority":0}'
    again["spec"]["schedulingGates"] = [{"name": keys.GATE}]
    decision, made = create(state, again, now=100.0)
    assert isinstance(decision, Allowed)
    assert (
        made["metadata"]["annotations"][keys.WAITING] == '{"since":"1970-01-01T00:01:39.500Z","priority":0}'
    )


@pytest.mark.parametrize("mode", ["warn", "audit"])
def test_a_wait_mode_queue_whose_quota_only_warns_or_audits_gates_nothing(mode: str) -> None:
    """Its twin above is created under the gate; here its quota is not enforced (decisions.md §34):
    the pod is created as it is, admitted carrying the refusal it would have been, and waits in no
    line."""
    state = full()
    state.tree.queues["q"].record.annotations[keys.ENFORCEMENT] = mode
    decision, made = create(state, rs_pod("web-0"), now=100.0)
    assert isinstance(decision, Allowed) and decision.would is not None, decision
    assert "schedulingGates" not in made["spec"] and keys.WAITING not in made["metadata"]["annotations"]
    assert decision.would.message.startswith('queue "q" has 0 NVIDIA-H200 left')
    assert not state.line.line("q")

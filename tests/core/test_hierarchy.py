"""Hierarchical queues (spec.parent): a child's card demand also counts against every ancestor with
a card quota, and a request is admitted only if it fits the queue and each such ancestor."""

import copy
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import (
    H200,
    H800,
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
    vcjob,
)
from tests.core.test_assignment import Created
from webhook.core.decide import admission
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.index.tally import Tally
from webhook.core.index.usage import queue_usage, tree_usage
from webhook.core.model import keys
from webhook.core.model.cards import units
from webhook.core.model.objects import pod_record, queue_record
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Allowed, Denied
from webhook.tools import headroom

R4090 = "NVIDIA-GeForce-RTX-4090"


def tree(*queues: tuple[str, str, dict[str, int] | None]) -> list[dict[str, Any]]:
    """(name, parent, quota) triples as Queue objects."""
    return [
        queue(
            name, json.dumps(quota) if quota is not None else None, **({"parent": parent} if parent else {})
        )
        for name, parent, quota in queues
    ]


NODES = [node("h0", H200, 16), node("h8", H800, 16), node("r0", R4090, 16)]


def running(name: str, queue_name: str, card: str = H200, count: int = 1) -> dict[str, Any]:
    return pod(name, card, count, queue_name=queue_name, node_name="h0", phase="Running")


def create(state: ClusterState, obj: dict[str, Any]) -> Allowed | Denied:
    decision = admission.validate(state, request(obj), 0.0)
    assert isinstance(decision, Allowed | Denied)
    return decision


def test_a_child_with_room_under_a_full_parent_is_denied_with_the_parent_named() -> None:
    queues = tree(("org", "", {H200: 4}), ("a", "org", {H200: 3}), ("b", "org", {H200: 3}))
    state = cluster(
        *NODES,
        *queues,
        *[running(f"a{i}", "a") for i in range(2)],
        *[running(f"b{i}", "b") for i in range(2)],
    )
    decision = create(state, pod("x", H200, queue_name="a"))
    assert isinstance(decision, Denied)
    assert decision.message == (
        'queue "org" (above "a", counting all its queues) has 0 NVIDIA-H200 left (quota 4: 4 running);'
        " pod ns/x needs 1"
    )
    assert decision.queue == "org"


def test_the_childs_own_quota_still_comes_first() -> None:
    state = cluster(*NODES, *tree(("org", "", {H200: 10}), ("a", "org", {H200: 1})), running("a0", "a"))
    decision = create(state, pod("x", H200, queue_name="a"))
    assert isinstance(decision, Denied) and decision.message.startswith('queue "a" has 0 NVIDIA-H200 left')


@pytest.mark.parametrize(
    ("parent_quota", "admitted"),
    [
        pytest.param({R4090: 1}, True, id="a parent quota that leaves the card out does not limit it"),
        pytest.param(None, True, id="a parent without a card quota does not limit"),
        pytest.param({H200: 3}, False, id="a parent quota naming the card limits it"),
    ],
)
def test_which_ancestors_limit(parent_quota: dict[str, int] | None, admitted: bool) -> None:
    queues = tree(("org", "", parent_quota), ("a", "org", {H200: 5}))
    state = cluster(*NODES, *queues, *[running(f"a{i}", "a") for i in range(3)])
    assert isinstance(create(state, pod("x", H200, queue_name="a")), Allowed) is admitted


def test_a_grandparent_limits_through_two_levels_and_a_cousin_counts() -> None:
    queues = tree(
        ("root", "", {H200: 3}),
        ("dept", "root", None),
        ("team", "dept", {H200: 5}),
        ("other", "root", {H200: 5}),
    )
    state = cluster(*NODES, *queues, running("t0", "team"), running("o0", "other"), running("o1", "other"))
    assert state.tree.ancestors["team"] == ("dept", "root")
    decision = create(state, pod("x", H200, queue_name="team"))
    assert isinstance(decision, Denied) and 'queue "root" (above "team"' in decision.message


def test_an_admission_in_one_child_holds_the_parent_for_its_sibling() -> None:
    state = cluster(*NODES, *tree(("org", "", {H200: 1}), ("a", "org", {H200: 1}), ("b", "org", {H200: 1})))
    first = request(pod("x", H200, queue_name="a"))
    decision = admission.validate(state, first, 0.0)
    admission.admit(state, first, decision, 0.0)
    sibling = create(state, pod("y", H200, queue_name="b"))
    assert isinstance(sibling, Denied)
    assert (
        'queue "org" (above "b", counting all its queues) has 0 NVIDIA-H200 left (quota 1: 1 admitted'
        in sibling.message
    )


def test_a_scale_up_is_checked_against_the_parent() -> None:
    objects = [*NODES, *tree(("org", "", {H200: 3}), ("a", "org", {H200: 8}))]
    objects += [running("o0", "a"), deployment("chat", 1, queue_name="a")]
    state = cluster(*objects)
    # chat has no live pod yet: a scale to N needs N pods; org has 2 of 3 left, a has 7 of 8
    assert isinstance(admission.validate(state, scale_request("chat", 1, 2), 0.0), Allowed)
    denied = admission.validate(state, scale_request("chat", 1, 3), 0.0)
    assert isinstance(denied, Denied) and 'queue "org" (above "a"' in denied.message


def test_a_cycle_of_parents_ends_and_decides() -> None:
    state = cluster(*NODES, *tree(("a", "b", {H200: 1}), ("b", "a", {H200: 5})))
    assert state.tree.ancestors == {"a": ("b",), "b": ("a",)}
    assert isinstance(create(state, pod("x", H200, queue_name="a")), Allowed)


def recomputed(state: ClusterState, queue_name: str) -> Tally:
    total = Tally()
    for name in state.tree.descendants.get(queue_name) or {queue_name}:
        if name in state.tree.tallies:
            total.add(state.tree.tallies[name])
    return total


def same(left: Tally, right: Tally) -> bool:
    return all(getattr(left, f) == getattr(right, f) for f in Tally.__slots__)


def load_of(tally: Tally) -> Counter[str]:
    """The most that could land on each card, derived from the tally's own sums."""
    load: Counter[str] = Counter()
    for fixed in (tally.bound, tally.pending, tally.reserved):
        load.update(fixed)
    for flexible in (tally.pending_flex, tally.reserved_flex):
        for (spec, size), count in flexible.items():
            for card in spec.cards:
                load[card] += size * count
    return +load


NAMES = ["q0", "q1", "q2", "q3"]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("parent"), st.sampled_from(NAMES), st.sampled_from(["", *NAMES])),
            st.tuples(
                st.just("pod"), st.integers(0, 30), st.sampled_from(NAMES), st.sampled_from([H200, H800])
            ),
            st.tuples(st.just("bind"), st.integers(0, 30)),
            st.tuples(st.just("delete"), st.integers(0, 30)),
        ),
        max_size=40,
    ),
    st.fixed_dictionaries({name: st.integers(0, 4) for name in NAMES}),
)
def test_admissions_never_leave_a_queue_or_ancestor_above_quota_and_subtree_sums_stay_exact(
    steps: list[tuple[Any, ...]], quotas: dict[str, int]
) -> None:
    parents = {name: "" for name in NAMES}
    state = cluster(*NODES, *tree(*((n, parents[n], {H200: quotas[n], H800: quotas[n]}) for n in NAMES)))
    pods: dict[int, dict[str, Any]] = {}
    for step in steps:
        if step[0] == "parent":
            _, name, parent = step
            parents[name] = parent if parent != name else ""
            state.upsert_queue(
                queue_record(tree((name, parents[name], {H200: quotas[name], H800: quotas[name]}))[0])
            )
        elif step[0] == "pod" and step[1] not in pods:
            _, number, queue_name, card = step
            obj = pod(f"p{number}", card, queue_name=queue_name)
            req = request(obj)
            decision = admission.validate(state, req, 0.0)
            admission.admit(state, req, decision, 0.0)
            if isinstance(decision, Allowed):
                pods[number] = obj
                state.upsert_pod(pod_record(obj))
        elif step[0] == "bind" and step[1] in pods:
            obj = pods[step[1]]
            obj["spec"]["nodeName"] = (
                "h0" if obj["metadata"]["annotations"]["volcano.sh/card.name"] == H200 else "h8"
            )
            state.upsert_pod(pod_record(obj))
        elif step[0] == "delete" and step[1] in pods:
            state.delete_pod(pods.pop(step[1])["metadata"]["uid"])
        for tally in [*state.tree.tallies.values(), *state.tree.subtree.values()]:
            assert tally.load == load_of(tally)
        for name in NAMES:
            assert same(
                recomputed(state, name),
                Tally()
                if name not in state.tree.tallies and name not in state.tree.subtree
                else _combined(state, name),
            )
    # Quotas only ever shrink through moves, never through admissions: with the tree as it ended,
    # what was admitted under the final tree fits it when nothing moved after the admissions.
    if all(step[0] != "parent" for step in steps):
        for name in NAMES:
            for card in (H200, H800):
                assert queue_usage(state, name).card(card).used <= units(quotas[name])
                assert tree_usage(state, name).card(card).used <= units(quotas[name])


def _combined(state: ClusterState, name: str) -> Tally:
    """What the state keeps for ``name``'s whole subtree: its subtree tally when it has children."""
    total = Tally()
    tally = state.tree.subtree.get(name) if name in state.tree.descendants else state.tree.tallies.get(name)
    if tally is not None:
        total.add(tally)
    return total


def quota_write(state: ClusterState, name: str, parent: str, quota: dict[str, int]) -> list[str]:
    (obj,) = tree((name, parent, quota))
    decision = admission.validate(
        state,
        request(obj, resource="queues", group="scheduling.volcano.sh", operation="UPDATE", old=obj),
        0.0,
    )
    assert isinstance(decision, Allowed)  # over-subscription is legal: a warning, never a denial
    return [w for w in decision.warnings if "parent" in w or "children" in w]


def test_quota_writes_warn_when_a_child_exceeds_its_parent_or_children_sum_above_it() -> None:
    state = cluster(*NODES, *tree(("org", "", {H200: 4}), ("a", "org", {H200: 3}), ("b", "org", {H200: 1})))
    assert quota_write(state, "b", "org", {H200: 1}) == []
    assert quota_write(state, "b", "org", {H200: 5}) == [
        'queue "b": NVIDIA-H200 quota 5 is above the 4 of its parent "org", which limits it',
        'the children of queue "org" have NVIDIA-H200 quotas summing to 8, above its 4; they compete for it',
    ]
    assert quota_write(state, "org", "", {H200: 3}) == [
        'the children of queue "org" have NVIDIA-H200 quotas summing to 4, above its 3; they compete for it'
    ]
    assert quota_write(state, "b", "org", {H800: 9}) == []  # the parent does not limit H800


def test_status_shows_the_tree_with_each_subtree_figures() -> None:
    from webhook.core.decide.report import cluster_status, status_table

    queues = tree(("org", "", {H200: 4}), ("a", "org", {H200: 3}), ("b", "org", {H200: 3}), ("c", "a", None))
    state = cluster(*NODES, *queues, running("a0", "a"), running("c0", "c"), running("b0", "b"))
    status = cluster_status(state)
    assert status["tree"] == {
        "a": {"parent": "org", "children": ["c"], "cards": {H200: {"quota": 3, "used": 2, "free": 1}}},
        "org": {"parent": "", "children": ["a", "b"], "cards": {H200: {"quota": 4, "used": 3, "free": 1}}},
    }
    table = status_table(status)
    assert "org (parent: -; children: a, b)" in table
    assert f"  {H200:<41} used     3  quota 4, free 1" in table


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries({"org": st.integers(0, 8), "a": st.integers(0, 8), "b": st.integers(0, 8)}),
    st.lists(
        st.tuples(
            st.sampled_from(["org", "a", "b"]),
            st.sampled_from([H200, H800, f"{H200}|{H800}"]),
            st.integers(1, 3),
        ),
        max_size=8,
    ),
    st.sampled_from([H200, H800, f"{H200}|{H800}"]),
    st.integers(1, 3),
)
def test_the_quick_room_check_never_admits_what_the_exact_check_refuses(
    quotas: dict[str, int], pending: list[tuple[str, str, int]], card: str, size: int
) -> None:
    from webhook.core.index.usage import tree_has_room
    from webhook.core.model.cards import parse_card_spec

    queues = tree(*((n, "" if n == "org" else "org", {H200: q, H800: q}) for n, q in quotas.items()))
    pods = [pod(f"p{i}", c, n, queue_name=q) for i, (q, c, n) in enumerate(pending)]
    state = cluster(*NODES, *queues, *pods)
    spec = parse_card_spec(card)
    if tree_has_room(state, "org", state.tree.queues["org"].quota or {}, spec, units(size)):
        assert tree_usage(state, "org").fits(spec, units(size), 1)


def test_a_volcano_job_that_could_never_run_under_its_parent_is_denied() -> None:
    from tests.builders import template, vcjob

    state = cluster(*NODES, *tree(("org", "", {H200: 2}), ("q", "org", {H200: 8})))
    job = vcjob("train", [(4, template(H200))])  # in queue "q", 4 pods of 1 H200, all needed
    decision = admission.validate(state, request(job, resource="jobs", group="batch.volcano.sh"), 0.0)
    assert isinstance(decision, Denied)
    assert decision.message == (
        'volcano job ns/train needs at least 4 NVIDIA-H200 but the whole quota of queue "org"'
        ' (above "q") is 2 NVIDIA-H200: it could never run'
    )
    fits = vcjob("train", [(2, template(H200))])
    assert isinstance(
        admission.validate(state, request(fits, resource="jobs", group="batch.volcano.sh"), 0.0), Allowed
    )


def test_the_cluster_wide_quota_sum_counts_a_tree_once_at_its_top() -> None:
    # 16 H200 in the cluster; the tree's top holds 10 of them and its children 8 + 8 share those 10.
    queues = tree(("org", "", {H200: 10}), ("a", "org", {H200: 8}), ("b", "org", {H200: 8}))
    state = cluster(*NODES, *queues, queue("solo", json.dumps({H200: 5})))
    warnings = quota_write(state, "b", "org", {H200: 8})
    assert warnings == [
        'the children of queue "org" have NVIDIA-H200 quotas summing to 16, above its 10; they compete for it'
    ]
    (obj,) = tree(("c", "", {H200: 2}))
    top_level = admission.validate(
        state, request(obj, resource="queues", group="scheduling.volcano.sh", operation="CREATE"), 0.0
    )
    assert isinstance(top_level, Allowed)
    assert top_level.warnings == (
        "NVIDIA-H200: all queues' quotas sum to 17 but the cluster has 16; queues will compete for the cards",
    )
    flat = cluster(
        *NODES, *queues, queue("solo", json.dumps({H200: 5})), policy=Policy(hierarchical_queues=False)
    )
    (warning,) = admission.validate(
        flat, request(obj, resource="queues", group="scheduling.volcano.sh", operation="CREATE"), 0.0
    ).warnings  # type: ignore[union-attr]
    assert "sum to 33" in warning
    assert flat.tree.ancestors == {name: () for name in flat.tree.queues}


FLEX = f"{H200}|{H800}"
QUOTAS = st.fixed_dictionaries({H200: st.integers(0, 4), H800: st.integers(0, 4)})
RUNNING = st.fixed_dictionaries({H200: st.integers(0, 2), H800: st.integers(0, 2)})


def child_under_org(
    child: dict[str, int], parent: dict[str, int], running_in_child: dict[str, int]
) -> list[dict[str, Any]]:
    """Queue a of quota ``child`` under org of quota ``parent``, a running ``running_in_child``."""
    objects: list[dict[str, Any]] = [*NODES, *tree(("org", "", parent), ("a", "org", child))]
    return objects + [
        running(f"run-{card[-4:]}-{i}", "a", card) for card, n in running_in_child.items() for i in range(n)
    ]


def flex_scale_up(
    child: dict[str, int], parent: dict[str, int], running_in_child: dict[str, int], more: int
) -> tuple[ClusterState, Allowed | Denied]:
    """An ``A|B`` Deployment web (1 replica, its pod not made yet) in child queue a under org, a
    running what ``running_in_child`` says; web scaled 1 -> 1 + ``more``: 1 + ``more`` pods to make."""
    objects = child_under_org(child, parent, running_in_child)
    objects += [
        deployment("web", 1, FLEX, queue_name="a"),
        replicaset("web-1", 1, "web", FLEX, queue_name="a"),
    ]
    state = cluster(*objects)
    scale = scale_request("web", 1, 1 + more)
    decision = admission.validate(state, scale, 0.0)
    admission.admit(state, scale, decision, 0.0)
    assert isinstance(decision, Allowed | Denied)
    return state, decision


def made(state: ClusterState, n: int) -> list[bool]:
    """web's ReplicaSet creates ``n`` pods one after another: whether each is admitted."""
    rs = owner("ReplicaSet", "web-1", "uid-rs-web-1")
    return [Created(state, pod(f"web-1-{i}", FLEX, queue_name="a", owner=rs)).allowed for i in range(n)]


def test_an_a_or_b_scale_up_is_checked_against_the_queue_and_its_parent_together() -> None:
    """a (4 H200, 2 H800) runs 1 H200 under org (2 H200, 8 H800): a has room for 3 + 2, org for
    1 + 8, but a pod needs its model free in both: 1 on H200, 2 on H800. A scale-up needing 4 pods is
    refused, naming what holds them; one needing 3 is admitted and each of its pods on create."""
    refused = flex_scale_up({H200: 4, H800: 2}, {H200: 2, H800: 8}, {H200: 1}, 3)[1]
    assert isinstance(refused, Denied), refused
    assert refused.message == (
        f'queue "a" and the queues above it hold 3 of the 4 more pods of scale-up of deployment ns/web'
        f" from 1 to 4 replicas ({FLEX}, 1 each): 1 on {H200}, 2 on {H800}"
    )
    (room,) = headroom.of_ref(
        flex_scale_up({H200: 4, H800: 2}, {H200: 2, H800: 8}, {H200: 1}, 0)[0], "deployment/ns/web", 0.0
    )
    assert (room.more, room.per_model) == (2, {H200: 1, H800: 2}), "headroom agrees: 1 -> 3 replicas"
    state, admitted = flex_scale_up({H200: 4, H800: 2}, {H200: 2, H800: 8}, {H200: 1}, 2)
    assert isinstance(admitted, Allowed), admitted
    assert made(state, 3) == [True, True, True]


@settings(max_examples=200, deadline=None)
@given(
    child=QUOTAS,
    parent=QUOTAS,
    running_in_child=RUNNING,
    more=st.integers(1, 6),
)
def test_every_pod_an_admitted_a_or_b_scale_up_allows_is_admitted_on_create(
    child: dict[str, int], parent: dict[str, int], running_in_child: dict[str, int], more: int
) -> None:
    """Exact across the tree: a scale-up admitted is one whose pods all get a model and are
    admitted, whatever the queue's and its parent's quotas."""
    state, decision = flex_scale_up(child, parent, running_in_child, more)
    if isinstance(decision, Allowed):
        assert made(state, 1 + more) == [True] * (1 + more), decision


JOB = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")


def flex_enqueue(
    child: dict[str, int], parent: dict[str, int], running_in_child: dict[str, int], n: int
) -> tuple[ClusterState, Allowed | Denied]:
    """A Volcano Job of one task of ``n`` ``A|B`` pods in child queue a under org, a running what
    ``running_in_child`` says; its PodGroup (the whole request) moved Pending -> Inqueue."""
    objects = child_under_org(child, parent, running_in_child)
    template = {"metadata": {"annotations": {keys.CARD_NAME: FLEX}}, "spec": {}}
    group = podgroup("pg", "Pending", json.dumps({FLEX: n}), queue_name="a", owner_ref=JOB, minMember=n)
    objects += [vcjob("train", [(n, template)], queue="a"), group]
    state = cluster(*objects)
    enqueued = copy.deepcopy(group)
    enqueued["status"]["phase"] = "Inqueue"
    review = request(
        enqueued, resource="podgroups", operation="UPDATE", old=group, group="scheduling.volcano.sh"
    )
    decision = admission.validate(state, review, 0.0)
    admission.admit(state, review, decision, 0.0)
    assert isinstance(decision, Allowed | Denied)
    if isinstance(decision, Allowed):
        ingest.upsert(state, enqueued)
    return state, decision


def task_pods(state: ClusterState, n: int) -> list[bool]:
    """The job's ``n`` task pods created one after another: whether each is admitted."""
    admitted = []
    for i in range(n):
        made = pod(f"train-t0-{i}", FLEX, queue_name="a", owner=JOB, group="pg")
        made["metadata"]["annotations"][keys.TASK_SPEC] = "t0"
        created = Created(state, made, uid=f"uid-t{i}")
        if created.allowed:
            ingest.upsert(state, created.obj)
        admitted.append(created.allowed)
    return admitted


def test_an_a_or_b_podgroup_is_enqueued_only_on_a_model_the_queue_and_its_parent_both_hold_whole() -> None:
    """a (4 H200, 2 H800) runs 1 H200 under org (3 H200, 8 H800): a holds 3 whole on H200 now, org
    8 on H800, no one model both (until the H200 frees): a 3-pod job is refused at enqueue and waits,
    each model's room in each named; a 2-pod job is enqueued on H800 and its 2 pods admitted."""
    refused = flex_enqueue({H200: 4, H800: 2}, {H200: 3, H800: 8}, {H200: 1}, 3)[1]
    assert isinstance(refused, Denied) and refused.join is not None, refused
    assert refused.message == (
        f"no one model of {FLEX} holds the 3 cards of podgroup ns/pg (volcano job ns/train) to be enqueued"
        f' in queue "a" and the queues above it: {H200} (queue "a": 3 left, "org": 2 left), {H800} (queue'
        f' "a": 2 left, "org": 8 left); it stays Pending, none of its pods created, and is enqueued the'
        " moment its cards free"
    )
    state, enqueued = flex_enqueue({H200: 4, H800: 2}, {H200: 3, H800: 8}, {H200: 1}, 2)
    assert isinstance(enqueued, Allowed), enqueued
    assert task_pods(state, 2) == [True, True]


@settings(max_examples=200, deadline=None)
@given(
    child=QUOTAS,
    parent=QUOTAS,
    running_in_child=RUNNING,
    n=st.integers(1, 5),
)
def test_every_pod_of_an_enqueued_a_or_b_job_is_admitted_on_create(
    child: dict[str, int], parent: dict[str, int], running_in_child: dict[str, int], n: int
) -> None:
    state, decision = flex_enqueue(child, parent, running_in_child, n)
    if isinstance(decision, Allowed):
        assert task_pods(state, n) == [True] * n, decision


def test_an_a_or_b_job_no_one_model_could_ever_hold_through_the_tree_is_refused_for_good() -> None:
    """a (4 H200, 2 H800) under org (1 H200, 8 H800), nothing running: 3 cards fit a alone on H200
    and org alone on H800, never one model in both. Waiting could not end: refused, in no line."""
    state, refused = flex_enqueue({H200: 4, H800: 2}, {H200: 1, H800: 8}, {}, 3)
    assert isinstance(refused, Denied) and refused.join is None, refused
    assert refused.message.startswith(f"no one model of {FLEX} holds the 3 cards of podgroup ns/pg"), refused
    assert "more than the whole quota of its queue (or of an ancestor) holds" in refused.message
    assert state.line.get("uid-pg-pg") is None

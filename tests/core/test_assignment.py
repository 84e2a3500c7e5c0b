"""SPEC §5b: the pod mutation gives every admitted multi-card pod one model, and the validation
decides on the pod as mutated. Table tests, then a Hypothesis property over random queues."""

import dataclasses
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.builders import (
    H200,
    H800,
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
    vcjob,
)
from webhook.core.decide import admission, calls
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model import keys
from webhook.core.model.cards import CardSpec, parse_card_spec, units
from webhook.core.model.verdicts import Allowed, Denied

FLEX = f"{R4090}|{R4090D}"
NODES = (node("r", R4090, 4), node("rd", R4090D, 4))


def quota(**cards: int) -> str:
    names = {"a": R4090, "b": R4090D, "h200": H200, "h800": H800}
    return json.dumps({names[k]: v for k, v in cards.items()})


class Created:
    """One pod create as the API server runs it: mutation, patch applied, validation."""

    def __init__(self, state: ClusterState, obj: dict[str, Any], uid: str = "", now: float = 0.0) -> None:
        mutate = request(obj)
        self.mutation = admission.mutate(state, mutate)
        admission.admit(state, mutate, self.mutation, now)
        assert isinstance(self.mutation, Allowed)
        self.obj = jsonpatch.apply_patch(obj, [dict(op) for op in self.mutation.patch])
        if uid:
            self.obj["metadata"]["uid"] = uid
        validate = request(self.obj)
        self.validation = admission.validate(state, validate, now)
        admission.admit(state, validate, self.validation, now)

    @property
    def card(self) -> str:
        return str(self.obj["metadata"]["annotations"][keys.CARD_NAME])

    @property
    def allowed(self) -> bool:
        return isinstance(self.validation, Allowed)

    def products(self) -> list[str]:
        terms = self.obj["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        return next(e["values"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"])


def bound(name: str, card: str, node_name: str, queue_name: str = "q", count: int = 1) -> dict[str, Any]:
    return pod(name, card, count, node_name=node_name, phase="Running", queue_name=queue_name)


@pytest.mark.parametrize(
    ("objects", "expected"),
    [
        pytest.param([queue("q", quota(a=1, b=2))], R4090, id="the first alternative when it has room"),
        pytest.param(
            [queue("q", quota(a=1, b=2)), bound("x", R4090, "r")],
            R4090D,
            id="the next when the first is used up",
        ),
        pytest.param(
            [queue("q", quota(a=1, b=2)), pod("big", FLEX, 2)],
            R4090,
            id="the model that keeps a pending flexible pod placeable (it needs 2 of 4090-D)",
        ),
        pytest.param(
            [
                queue("q", quota(a=2, b=2)),
                queue("other", quota(a=4)),
                *(bound(f"o{i}", R4090, "r", "other") for i in range(4)),
            ],
            R4090D,
            id="a model with a free card on a node now before the order of preference",
        ),
        pytest.param(
            [
                queue("q", quota(a=2, b=2)),
                queue("other", quota(a=4, b=4)),
                *(bound(f"o{i}", R4090, "r", "other") for i in range(4)),
                *(bound(f"d{i}", R4090D, "rd", "other") for i in range(4)),
            ],
            R4090,
            id="the order of preference when no node has a free card",
        ),
    ],
)
def test_a_multi_card_pod_is_assigned_the_model_the_rule_picks(objects: list[Any], expected: str) -> None:
    state = cluster(*NODES, *objects)
    made = Created(state, pod("p", FLEX, queue_name="q", uid=""))
    assert made.card == expected
    assert made.obj["metadata"]["annotations"][keys.CARD_SPEC] == FLEX
    assert made.products() == [expected]
    assert made.allowed, made.validation


def test_a_pod_whose_node_selector_names_one_model_is_assigned_that_model() -> None:
    state = cluster(*NODES, queue("q", quota(a=1, b=1)))
    made = Created(state, pod("p", FLEX, spec={"nodeSelector": {"nvidia.com/gpu.product": R4090D}}))
    assert made.card == R4090D
    assert made.allowed


def test_a_pod_no_model_can_hold_is_left_as_it_is_and_denied_naming_every_model() -> None:
    state = cluster(*NODES, queue("q", quota(a=1, b=1)), bound("x", R4090, "r"), bound("y", R4090D, "rd"))
    made = Created(state, pod("p", FLEX))
    assert made.card == FLEX
    assert isinstance(made.validation, Denied)
    assert made.validation.message == (
        f'none of {R4090} (0 left), {R4090D} (0 left) in queue "q" can hold pod ns/p needing 1'
    )
    assert len(state.ledger) == 0


def both_full_flex_replicaset() -> tuple[ClusterState, dict[str, Any]]:
    """Queue q (1 RTX-4090, 1 RTX-4090-D) full, and ReplicaSet web-1 of one pod of either (its owner
    reference returned)."""
    state = cluster(
        *NODES,
        queue("q", quota(a=1, b=1)),
        bound("x", R4090, "r"),
        bound("y", R4090D, "rd"),
        replicaset("web-1", 1, "web", FLEX),
    )
    return state, owner("ReplicaSet", "web-1", "uid-rs-web-1")


def test_a_pod_left_without_a_model_is_refused_when_cards_free_before_its_validation() -> None:
    """The mutation found no model with room; a card frees before the validation: admitted, the
    pod would run with no model (both alternatives in its affinity). It is refused, and its
    ReplicaSet waits in the line, which calls it at once."""
    state, rs_owner = both_full_flex_replicaset()
    obj = pod("p", FLEX, owner=rs_owner)
    mutate = request(obj)
    mutation = admission.mutate(state, mutate)
    assert isinstance(mutation, Allowed)
    mutated = jsonpatch.apply_patch(obj, [dict(op) for op in mutation.patch])
    assert mutated["metadata"]["annotations"][keys.CARD_NAME] == FLEX
    ingest.remove(state, bound("y", R4090D, "rd"))  # a card frees in between
    validation = admission.validate(state, request(mutated), 0.0)
    assert isinstance(validation, Denied)
    assert validation.message.startswith(
        f'pod ns/p asks for one of {FLEX} and was given no model: none had room in queue "q" when it'
        " was mutated; cards freed since, so a new create is given one; its controller waits 1st"
    )
    admission.admit(state, request(mutated), validation, 0.0)
    assert [w.what for w in state.line.line("q")] == ["replicaset ns/web-1"]
    assert Created(state, pod("p2", FLEX, owner=rs_owner)).card == R4090D


def test_a_pod_without_a_model_is_refused_though_the_line_called_its_workload() -> None:
    """A called ReplicaSet's cards are held for its next pod. One that reaches validation with no
    model (its mutation found none a moment before the call, or did not run) is refused all the
    same: admitted, the scheduler could bind it to a model past the quota (seen against stock
    Volcano: 4 NVIDIA-H800 bound at a quota of 3). Its next create is given the held model."""
    state, rs_owner = both_full_flex_replicaset()
    assert isinstance(Created(state, pod("p0", FLEX, owner=rs_owner), now=1.0).validation, Denied)
    ingest.remove(state, bound("y", R4090D, "rd"))
    assert [c.pods for c in calls.call_next(state, now=2.0)] == [1]
    unassigned = pod("p1", FLEX, owner=rs_owner)
    validation = admission.validate(state, request(unassigned), 2.5)
    assert isinstance(validation, Denied)
    assert validation.message == (
        f"pod ns/p1 asks for one of {FLEX} and was given no model, though its workload's scale-up"
        " holds cards for it: a new create is given one (its controller creates it again)"
    )
    again = Created(state, pod("p2", FLEX, owner=rs_owner), now=3.0)
    assert isinstance(again.validation, Allowed) and again.card == R4090D


def test_concurrent_creates_are_never_assigned_into_the_same_last_card() -> None:
    """Both mutations run before either validation (the API server interleaves requests)."""
    state = cluster(*NODES, queue("q", quota(a=1, b=1)))
    first = request(pod("p1", FLEX))
    second = dataclasses.replace(request(pod("p2", FLEX)), uid="uid-review-2")
    decisions = []
    for each in (first, second):
        decision = admission.mutate(state, each)
        admission.admit(state, each, decision, 0.0)
        decisions.append(decision)
    assert [d.card for d in decisions] == [R4090, R4090D]
    assert len(state.ledger) == 2


def test_the_validation_takes_over_the_assignment_and_releases_it_on_denial() -> None:
    state = cluster(*NODES, queue("q", quota(a=1, b=1)))
    made = Created(state, pod("p", FLEX))
    assert made.allowed
    held = state.ledger.get("uid-ns-p")
    assert held is not None and held.spec == CardSpec((parse_card_spec(R4090).cards[0],))
    assert state.ledger.assignment("q", parse_card_spec(R4090).cards[0], 1) == ""
    assert len(state.ledger) == 1
    # The same assigned pod again, now that the quota is gone: denied, and nothing stays held.
    ingest.upsert(
        state, {**made.obj, "status": {"phase": "Running"}, "spec": {**made.obj["spec"], "nodeName": "r"}}
    )
    again = dict(made.obj, metadata={**made.obj["metadata"], "name": "p2", "uid": "uid-ns-p2"})
    decision = admission.validate(state, request(again), 0.0)
    assert isinstance(decision, Denied)
    assert f"pod ns/p2 (assigned {R4090} of its {FLEX})" in decision.message


def test_a_second_mutation_pass_changes_nothing() -> None:
    state = cluster(*NODES, queue("q", quota(a=1, b=1)))
    made = Created(state, pod("p", FLEX))
    again = admission.mutate(state, request(made.obj))
    assert isinstance(again, Allowed) and again.patch == ()


def test_a_dry_run_mutation_holds_nothing() -> None:
    state = cluster(*NODES, queue("q", quota(a=1, b=1)))
    dry = request(pod("p", FLEX), dry_run=True)
    decision = admission.mutate(state, dry)
    admission.admit(state, dry, decision, 0.0)
    assert isinstance(decision, Allowed) and decision.patch
    assert len(state.ledger) == 0


def test_the_pods_of_a_scale_up_are_assigned_one_by_one_within_it() -> None:
    """A Deployment of A|B pods scaled 0 -> 3 over quota 1 + 2: the scale-up fits flexibly, and each
    pod it creates gets a model that keeps the rest of the scale-up placeable."""
    rs_owner = owner("ReplicaSet", "web-1", "uid-rs-web-1")
    state = cluster(
        *NODES,
        queue("q", quota(a=1, b=2)),
        deployment("web", 0, FLEX),
        replicaset("web-1", 0, "web", FLEX),
    )
    old, new = deployment("web", 0, FLEX), deployment("web", 3, FLEX)
    scale = request(new, resource="deployments", operation="UPDATE", old=old)
    decision = admission.validate(state, scale, 0.0)
    admission.admit(state, scale, decision, 0.0)
    assert isinstance(decision, Allowed)
    made = [Created(state, pod(f"web-{i}", FLEX, owner=rs_owner), uid=f"uid-web-{i}") for i in range(3)]
    assert [m.card for m in made] == [R4090, R4090D, R4090D]
    assert all(m.allowed for m in made)
    fourth = Created(state, pod("web-3", FLEX, owner=rs_owner))
    assert not fourth.allowed


JOB_REF = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")


def job_cluster(**limits: int) -> ClusterState:
    """A Volcano Job of one task of 2 A|B pods, its PodGroup Inqueue with the whole request."""
    job = vcjob("train", [(2, {"metadata": {"annotations": {keys.CARD_NAME: FLEX}}, "spec": {}})])
    group = podgroup("pg", "Inqueue", request=json.dumps({FLEX: 2}), owner_ref=JOB_REF)
    return cluster(*NODES, queue("q", quota(**limits)), job, group)


def task_pod(i: int) -> dict[str, Any]:
    made = pod(f"train-t0-{i}", FLEX, owner=JOB_REF, group="pg")
    made["metadata"]["annotations"][keys.TASK_SPEC] = "t0"
    return made


def test_the_pods_of_a_volcano_job_task_are_all_assigned_the_one_model_that_holds_the_whole_task() -> None:
    """The real scheduler treats the pods of one task as alike (a predicate failure of one is cached
    for all), and its plugin enqueued the whole request on one alternative: 4090-D, here."""
    state = job_cluster(a=1, b=2)
    made = [Created(state, task_pod(i), uid=f"uid-t{i}") for i in range(2)]
    assert [m.card for m in made] == [R4090D, R4090D]
    assert all(m.allowed for m in made), [m.validation for m in made]
    ingest.upsert(state, made[0].obj)  # the first arrives; a third pod of the task follows it
    ingest.upsert(state, made[1].obj)
    assert Created(state, task_pod(2), uid="uid-t2").card == R4090D


def test_a_task_pod_that_reaches_validation_with_no_model_is_refused_though_its_group_holds_cards() -> None:
    """Its mutation did not run (or did not see the reservation yet): admitted as A|B, the
    scheduler could bind it to either model, over the quota of one. Its controller creates it again."""
    state = job_cluster(a=1, b=2)
    decision = admission.validate(state, request(task_pod(0)), 0.0)
    assert isinstance(decision, Denied)
    assert decision.message == (
        f"pod ns/train-t0-0 asks for one of {FLEX} and was given no model, though its PodGroup holds"
        " cards for it: a new create is given one (its controller creates it again)"
    )
    assert Created(state, task_pod(0)).allowed


def test_pods_of_one_task_mutated_before_either_is_validated_get_the_same_model() -> None:
    state = job_cluster(a=2, b=2)
    cards = []
    for i in range(2):
        each = dataclasses.replace(request(task_pod(i)), uid=f"review-{i}")
        decision = admission.mutate(state, each)
        admission.admit(state, each, decision, 0.0)
        cards.append(decision.card)
    assert cards == [R4090, R4090]


def test_a_task_whose_podgroup_is_not_seen_enqueued_yet_is_given_a_model_that_holds_it_whole() -> None:
    """The first pod of a 3-pod task arrives before the cache sees its PodGroup enqueued: the model
    it is given (and its siblings follow) must hold all three, not just the one pod; 4090 holds one,
    so the task goes to 4090-D (as the plugin enqueued it)."""
    job = vcjob("train", [(3, {"metadata": {"annotations": {keys.CARD_NAME: FLEX}}, "spec": {}})])
    group = podgroup("pg", "Pending", request=json.dumps({FLEX: 3}), owner_ref=JOB_REF)
    state = cluster(*NODES, queue("q", quota(a=1, b=4)), job, group)
    first = Created(state, task_pod(0), uid="uid-t0")
    assert first.card == R4090D
    ingest.upsert(state, first.obj)
    ingest.upsert(state, podgroup("pg", "Inqueue", request=json.dumps({FLEX: 3}), owner_ref=JOB_REF))
    rest = [Created(state, task_pod(i), uid=f"uid-t{i}") for i in (1, 2)]
    assert [m.card for m in rest] == [R4090D, R4090D]
    assert all(m.allowed for m in (first, *rest)), [m.validation for m in (first, *rest)]


def test_a_task_whose_enqueue_was_admitted_but_not_seen_yet_is_given_a_model_that_holds_it_whole() -> None:
    """On stock Volcano our enqueue gate admits the PodGroup's move to Inqueue and holds its cards in
    flight; the job controller sees the move and creates the pods before the cache does. The first
    pod's model must hold the whole task beside all else but that hold, which the task's pods come
    out of: 4090 holds one of the two, so 4090-D. (The stock wait-mode soak, seed 4050932668: its
    first pod was given 4090 and admitted, and its second, which must follow it, was refused for
    ever.)"""
    job = vcjob("train", [(2, {"metadata": {"annotations": {keys.CARD_NAME: FLEX}}, "spec": {}})])
    pending = podgroup("pg", "Pending", request=json.dumps({FLEX: 2}), owner_ref=JOB_REF)
    inqueue = podgroup("pg", "Inqueue", request=json.dumps({FLEX: 2}), owner_ref=JOB_REF)
    state = cluster(*NODES, queue("q", quota(a=1, b=2)), job, pending)
    move = request(
        inqueue, resource="podgroups", operation="UPDATE", old=pending, group="scheduling.volcano.sh"
    )
    enqueued = admission.validate(state, move, 0.0)
    admission.admit(state, move, enqueued, 0.0)
    assert isinstance(enqueued, Allowed), enqueued
    early = Created(state, task_pod(0), uid="uid-t0")
    assert early.card == R4090D
    # Its validation counts it beside the enqueue's hold, not out of it (the hold is the group's 2
    # cards whole): refused, and its job controller creates it again. The server reads such a
    # PodGroup live first (tests/edges/test_server.py), so this is the case of a failed read.
    assert isinstance(early.validation, Denied)
    assert early.validation.message.startswith(f'queue "q" has 0 {R4090D} left (quota 2: 2 admitted')
    ingest.upsert(state, inqueue)  # the cache catches up: the group's reservation takes over
    made = [Created(state, task_pod(i), uid=f"uid-t{i}") for i in range(2)]
    assert [m.card for m in made] == [R4090D, R4090D]
    assert all(m.allowed for m in made), [m.validation for m in made]


def test_a_task_pod_given_a_model_its_quota_cannot_hold_is_refused_though_its_group_holds_cards() -> None:
    """Its PodGroup reserves 2 of A|B, which fit as 1 A + 1 B; its sibling is already charged on A
    (pending), the only A there is: a second pod pinned to A would leave the queue over its quota of
    A (the plugin enqueued the group on B; stock Volcano would bind it)."""
    state = job_cluster(a=1, b=2)
    sibling = task_pod(0)
    sibling["metadata"]["annotations"].update({keys.CARD_NAME: R4090, keys.CARD_SPEC: FLEX})
    sibling["metadata"]["uid"] = "uid-t0"
    ingest.upsert(state, sibling)
    second = task_pod(1)
    second["metadata"]["annotations"].update({keys.CARD_NAME: R4090, keys.CARD_SPEC: FLEX})
    decision = admission.validate(state, request(second), 0.0)
    assert isinstance(decision, Denied), decision
    assert decision.message == (
        f'queue "q" has 0 {R4090} left (quota 1: 1 pending); pod ns/train-t0-1 (assigned {R4090} of'
        f" its {FLEX}) needs 1, and its PodGroup's reservation holds cards of the spec it asked, not"
        " of this model"
    )
    third = Created(state, task_pod(2), uid="uid-t2")  # the mutation gives a sibling's model too
    assert third.card == R4090
    assert isinstance(third.validation, Denied)
    assert "ns/train-t0-2" in third.validation.message
    assert "its PodGroup's reservation holds cards of the spec it asked" in third.validation.message


def test_a_task_no_one_model_holds_whole_gets_the_model_that_holds_the_most_of_it() -> None:
    """3 pods of A|B (an elastic job: fewer may run) over quota 1 A + 2 B: no model holds all three;
    the first pod gets B, which holds two, and its siblings follow, the third refused on B's quota."""
    job = vcjob("train", [(3, {"metadata": {"annotations": {keys.CARD_NAME: FLEX}}, "spec": {}})])
    group = podgroup("pg", "Pending", request=json.dumps({FLEX: 3}), owner_ref=JOB_REF)
    state = cluster(*NODES, queue("q", quota(a=1, b=2)), job, group)
    made = [Created(state, task_pod(i), uid=f"uid-t{i}") for i in range(3)]
    assert [m.card for m in made] == [R4090D] * 3
    assert [m.allowed for m in made] == [True, True, False], [m.validation for m in made]


# ---- the property -----------------------------------------------------------------------------

CARDS = (R4090, R4090D, H200)
SPECS = [f"{R4090}|{R4090D}", f"{R4090D}|{R4090}", f"{R4090}|{R4090D}|{H200}", f"{H200}|{R4090}", R4090D]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, int], list[tuple[str, str, int]], list[tuple[str, int]]]:
    limits = {c: draw(st.integers(0, 4)) for c in CARDS}
    existing = draw(
        st.lists(
            st.tuples(st.sampled_from(SPECS), st.sampled_from(["", "bound"]), st.integers(1, 2)), max_size=4
        )
    )
    creates = draw(st.lists(st.tuples(st.sampled_from(SPECS), st.integers(1, 2)), min_size=1, max_size=8))
    return limits, existing, creates


def _placed_use(state: ClusterState) -> dict[str, int]:
    usage = queue_usage(state, "q")
    placement = usage.placement
    assert placement.complete, "the queue's demand has no placement within quota"
    return {card: usage.card(card, placement).used for card in CARDS}


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_assigned_models_never_put_a_model_over_quota_and_every_fitting_pod_is_assigned(
    scenario: tuple[dict[str, int], list[tuple[str, str, int]], list[tuple[str, int]]],
) -> None:
    limits, existing, creates = scenario
    nodes = (node("r", R4090, 8), node("rd", R4090D, 8), node("h", H200, 8))
    before: list[dict[str, Any]] = []
    for i, (spec, where, count) in enumerate(existing):
        first = spec.split("|")[0]
        target = {R4090: "r", R4090D: "rd", H200: "h"}[first]
        before.append(
            pod(
                f"e{i}",
                spec,
                count,
                node_name=target if where else "",
                phase="Running" if where else "Pending",
            )
        )
    state = cluster(*nodes, queue("q", json.dumps(limits)), *before)
    start = queue_usage(state, "q").placement
    usage = queue_usage(state, "q")
    assume(start.complete and all(usage.card(c, start).used <= units(limits[c]) for c in CARDS))
    for i, (spec, count) in enumerate(creates):
        fits = queue_usage(state, "q").fits(parse_card_spec(spec), units(count), 1)
        made = Created(state, pod(f"n{i}", spec, count), uid=f"uid-n{i}")
        assert made.allowed == fits, (spec, count, made.validation)
        if fits and "|" in spec:
            assert made.card in spec.split("|") and made.card != spec
        if made.allowed:
            ingest.upsert(state, made.obj)  # it arrives in the cache, pending on its model
        use = _placed_use(state)
        assert all(use[c] <= units(limits[c]) for c in CARDS), use
    assert len(state.ledger) == 0


def test_an_assignment_never_validated_stops_holding_its_card_after_ten_seconds() -> None:
    state = cluster(*NODES, queue("q", quota(a=1, b=1)))
    held = request(pod("p", FLEX))
    admission.admit(state, held, admission.mutate(state, held), 100.0)
    assert len(state.ledger) == 1
    state.expire(109.0)
    assert len(state.ledger) == 1
    state.expire(110.5)
    assert len(state.ledger) == 0

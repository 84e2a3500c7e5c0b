"""Lending and borrowing idle cards of a model in a cohort (decisions.md §33): pod creates and
Queue writes, each case beside its twin (the same shape without the room, or without the rule)."""

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import (
    H200,
    H800,
    R4090,
    claim_template,
    cluster,
    deployment,
    gpu_request,
    node,
    owner,
    pod,
    podgroup,
    queue,
    replicaset,
    request,
    scale_request,
    shared,
    statefulset,
    vcjob,
)
from tests.core.test_dra import dra_cluster, dra_pod
from tests.core.test_tidal import gang
from webhook.core.decide import admission, tidal
from webhook.core.index.cohorts import standings
from webhook.core.model import keys, reclaim
from webhook.core.model.cards import UNIT
from webhook.core.model.steps import done
from webhook.core.model.verdicts import Allowed, Denied
from webhook.tools import headroom, whatif

NODES = (node("h0", H200, 8), node("h8", H800, 8))


def lender(
    name: str, quota: dict[str, int], deserved: dict[str, int] | None = None, **kw: Any
) -> dict[str, Any]:
    """A queue with ``quota``; ``deserved``: it takes part in lending for those models;
    ``lendable``: how much of each it may lend; ``parent``: its place in the tree."""
    made = queue(name, json.dumps(quota), **({"parent": kw["parent"]} if "parent" in kw else {}))
    if deserved is not None:
        made["metadata"]["annotations"][keys.CARD_DESERVED] = json.dumps(deserved)
    if "lendable" in kw:
        made["metadata"]["annotations"][keys.CARD_LENDABLE] = json.dumps(kw["lendable"])
    return made


def running(name: str, queue_name: str, card: str = H200, count: int = 1) -> dict[str, Any]:
    return pod(
        name, card, count, queue_name=queue_name, node_name="h0" if card == H200 else "h8", phase="Running"
    )


def decide(objects: list[dict[str, Any]], new: dict[str, Any]) -> Allowed | Denied:
    """The pod through the mutation (an ``A|B`` pod is given a model) and the validation."""
    state = cluster(*NODES, *objects)
    mutation = admission.mutate(state, request(new), now=0.0)
    assert isinstance(mutation, Allowed), mutation
    new = jsonpatch.apply_patch(new, [dict(op) for op in mutation.patch])
    return admission.validate(state, request(new), 0.0)


A_B = [lender("a", {H200: 4}, {H200: 2}), lender("b", {H200: 2}, {H200: 2})]
A_USES_2 = [running("a0", "a"), running("a1", "a")]

CASES = [
    pytest.param(
        [*A_B, *A_USES_2],
        pod("a2", queue_name="a"),
        None,
        id="a borrows an idle H200 of b",
    ),
    pytest.param(
        [*A_B, *A_USES_2, running("b0", "b"), running("b1", "b")],
        pod("a2", queue_name="a"),
        'queue "a" has 0 NVIDIA-H200 left (deserved 2 and 0 idle in its cohort to borrow, quota 4: 2 running);'
        " pod ns/a2 needs 1",
        id="twin: b uses its deserved, nothing to borrow",
    ),
    pytest.param(
        [*A_B, *A_USES_2, running("a2", "a"), running("a3", "a")],
        pod("a4", queue_name="a"),
        'queue "a" has 0 NVIDIA-H200 left (deserved 2 and 2 idle in its cohort to borrow, quota 4: 4 running);'
        " pod ns/a4 needs 1",
        id="the quota stays the ceiling",
    ),
    pytest.param(
        [*A_B, *A_USES_2, running("a2", "a"), running("a3", "a")],
        pod("b0", queue_name="b"),
        None,
        id="a lender inside its deserved is admitted while its cards are lent",
    ),
    pytest.param(
        [lender("a", {H200: 4}, {H200: 2}), lender("b", {H200: 2}, {H200: 2}, lendable={H200: 0}), *A_USES_2],
        pod("a2", queue_name="a"),
        'queue "a" has 0 NVIDIA-H200 left (deserved 2 and 0 idle in its cohort to borrow',
        id="lendable 0 lends nothing",
    ),
    pytest.param(
        [lender("a", {H200: 4}, {H200: 2}), lender("b", {H200: 2}, {H200: 2}, lendable={H200: 1}), *A_USES_2],
        pod("a2", queue_name="a", count=2),
        'queue "a" has 1 NVIDIA-H200 left (deserved 2 and 1 idle in its cohort to borrow',
        id="lendable 1 lends one, not two",
    ),
    pytest.param(
        [lender("a", {H200: 4}, {H200: 2}), lender("b", {H200: 2}), *A_USES_2],
        pod("a2", queue_name="a"),
        'queue "a" has 0 NVIDIA-H200 left (deserved 2 and 0 idle in its cohort to borrow',
        id="a queue without card.deserved lends nothing",
    ),
    pytest.param(
        [lender("a", {H200: 4}), lender("b", {H200: 2}, {H200: 2}), *A_USES_2],
        pod("a2", queue_name="a", count=3),
        'queue "a" has 2 NVIDIA-H200 left (quota 4: 2 running); pod ns/a2 needs 3',
        id="a queue without card.deserved borrows nothing: its quota is a wall",
    ),
    pytest.param(
        [*A_B, lender("c", {H200: 4}, {H200: 1}), *A_USES_2, running("c0", "c"), running("c1", "c")],
        pod("a2", queue_name="a", count=2),
        'queue "a" has 1 NVIDIA-H200 left (deserved 2 and 1 idle in its cohort to borrow, quota 4: 2 running);'
        " pod ns/a2 needs 2",
        id="what another borrows already is not lent twice",
    ),
    pytest.param(
        [
            lender("p", {H200: 8}),
            lender("q", {H200: 8}),
            lender("a", {H200: 4}, {H200: 2}, parent="p"),
            lender("b", {H200: 2}, {H200: 2}, parent="q"),
            *A_USES_2,
        ],
        pod("a2", queue_name="a"),
        'queue "a" has 0 NVIDIA-H200 left (deserved 2 and 0 idle in its cohort to borrow',
        id="hierarchy: a queue under another parent is not of the cohort",
    ),
    pytest.param(
        [
            lender("p", {H200: 3}),
            lender("a", {H200: 4}, {H200: 2}, parent="p"),
            lender("b", {H200: 2}, {H200: 2}, parent="p"),
            *A_USES_2,
        ],
        pod("a2", queue_name="a", count=2),
        'queue "p" (above "a", counting all its queues) has 1 NVIDIA-H200 left',
        id="hierarchy: siblings lend, the parent's quota caps them all",
    ),
    pytest.param(
        [
            lender("p", {H200: 4}),
            lender("a", {H200: 4}, {H200: 2}, parent="p"),
            lender("b", {H200: 2}, {H200: 2}, parent="p"),
            *A_USES_2,
        ],
        pod("a2", queue_name="a", count=2),
        None,
        id="twin: the parent's quota holds them",
    ),
    pytest.param(
        [
            lender("a", {H200: 2, H800: 4}, {H200: 2, H800: 2}),
            lender("b", {H200: 2, H800: 2}, {H200: 2, H800: 2}),
            *A_USES_2,
            running("a8", "a", H800),
            running("a9", "a", H800),
            running("b8", "b", H800),
            running("b9", "b", H800),
        ],
        pod("a2", f"{H200}|{H800}", queue_name="a"),
        f'none of {H200} (0 left), {H800} (0 left) in queue "a" can hold pod ns/a2 needing 1',
        id="A|B: no model has a card to borrow (b uses its H800, H200 is a's whole quota)",
    ),
    pytest.param(
        [
            lender("a", {H200: 2, H800: 4}, {H200: 2, H800: 2}),
            lender("b", {H200: 2, H800: 2}, {H200: 2, H800: 2}),
            *A_USES_2,
            running("a8", "a", H800),
            running("a9", "a", H800),
        ],
        pod("a2", f"{H200}|{H800}", queue_name="a"),
        None,
        id="twin, A|B: an idle H800 of b is borrowed",
    ),
]


@pytest.mark.parametrize(("objects", "new", "refused"), CASES)
def test_a_pod_fits_its_deserved_or_what_its_cohort_lends_within_its_quota(
    objects: list[dict[str, Any]], new: dict[str, Any], refused: str | None
) -> None:
    decision = decide(objects, new)
    if refused is None:
        assert isinstance(decision, Allowed), decision.message
    else:
        assert isinstance(decision, Denied), decision
        assert refused in decision.message, decision.message


QUEUE_WRITES = [
    pytest.param({H200: 4}, {H200: 2}, None, None, id="deserved within the quota"),
    pytest.param({H200: 4}, {H200: 5}, None, "NVIDIA-H200 deserved 5 is above its card.quota 4", id="above"),
    pytest.param(
        {H200: 4}, {H800: 1}, None, "names NVIDIA-H800, which the queue's card.quota does not", id="other"
    ),
    pytest.param({H200: 4}, {H200: 2}, {H200: 1}, None, id="lendable within the deserved"),
    pytest.param(
        {H200: 4}, {H200: 2}, {H200: 3}, "NVIDIA-H200 lendable 3 is above its deserved 2", id="lend more"
    ),
    pytest.param(
        {H200: 4}, None, {H200: 1}, "has cardquota.volcano.sh/card.lendable but no", id="lend, no deserved"
    ),
    pytest.param(
        None,
        {H200: 1},
        None,
        "has cardquota.volcano.sh/card.deserved but no volcano.sh/card.quota",
        id="no quota",
    ),
    pytest.param({H200: 4}, "[1]", None, "must be a JSON object", id="malformed"),
]


@pytest.mark.parametrize(("quota", "deserved", "lendable", "refused"), QUEUE_WRITES)
def test_a_queue_write_with_deserved_and_lendable_is_checked(
    quota: dict[str, int] | None, deserved: Any, lendable: dict[str, int] | None, refused: str | None
) -> None:
    made = queue("team", json.dumps(quota) if quota is not None else None)
    annotations = made["metadata"].setdefault("annotations", {})
    if deserved is not None:
        annotations[keys.CARD_DESERVED] = deserved if isinstance(deserved, str) else json.dumps(deserved)
    if lendable is not None:
        annotations[keys.CARD_LENDABLE] = json.dumps(lendable)
    decision = admission.validate(
        cluster(*NODES), request(made, resource="queues", group="scheduling.volcano.sh"), 0.0
    )
    if refused is None:
        assert isinstance(decision, Allowed), decision.message
    else:
        assert isinstance(decision, Denied) and refused in decision.message, decision
        assert decision.message.startswith('queue "team" has '), decision.message


QUEUES = ("a", "b", "c")


@st.composite
def cohorts(draw: st.DrawFn) -> list[tuple[int, int | None, int | None]]:
    """Per queue of one cohort: its H200 quota, its deserved (None: a wall) and lendable."""
    out = []
    for _ in QUEUES:
        quota = draw(st.integers(0, 4))
        deserved = draw(st.none() | st.integers(0, quota))
        lendable = None if deserved is None else draw(st.none() | st.integers(0, deserved))
        out.append((quota, deserved, lendable))
    return out


@settings(max_examples=300, deadline=None)
@given(
    shapes=cohorts(),
    steps=st.lists(st.tuples(st.sampled_from(QUEUES), st.integers(1, 2), st.booleans()), max_size=16),
)
def test_admissions_keep_every_queue_within_its_quota_and_its_deserved_always_open(
    shapes: list[tuple[int, int | None, int | None]], steps: list[tuple[str, int, bool]]
) -> None:
    """Pods created (and some deleted) at random in one cohort, each decided by the webhook and
    checked against this test's own count from the pods: a pod is admitted exactly when its queue
    stays within its quota and within its deserved, or beyond it on cards the others lend idle
    (their deserved less their use, at most their lendable) and no one borrows already."""
    queues = []
    for name, (quota, deserved, lendable) in zip(QUEUES, shapes, strict=True):
        queues.append(
            lender(
                name,
                {H200: quota},
                None if deserved is None else {H200: deserved},
                **({} if lendable is None else {"lendable": {H200: lendable}}),
            )
        )
    pods: list[dict[str, Any]] = []
    for serial, (name, size, delete) in enumerate(steps):
        if delete and pods:
            pods.pop(serial % len(pods))
            continue
        used = {
            q: sum(int(p["metadata"]["annotations"]["size"]) for p in pods if queue_of(p) == q)
            for q in QUEUES
        }
        quota, deserved, _ = shapes[QUEUES.index(name)]
        after = used[name] + size
        if deserved is None or after <= deserved:
            expected = after <= quota
        else:
            lent = sum(
                min(lendable if lendable is not None else d, max(0, d - used[q]))
                for q, (_, d, lendable) in zip(QUEUES, shapes, strict=True)
                if q != name and d is not None
            )
            borrowed = sum(
                max(0, used[q] - d)
                for q, (_, d, _) in zip(QUEUES, shapes, strict=True)
                if q != name and d is not None
            )
            expected = after <= quota and after - deserved <= lent - borrowed
        new = running(f"p{serial}", name, count=size)
        new["metadata"]["annotations"]["size"] = str(size)
        new["spec"].pop("nodeName", None)
        new.pop("status", None)
        decision = decide([*queues, *pods], new)
        assert isinstance(decision, Allowed) is expected, (name, size, used, decision)
        if expected:
            pods.append(running(f"p{serial}", name, count=size))
            pods[-1]["metadata"]["annotations"]["size"] = str(size)
        assert after <= quota or not expected, "above its quota"


def queue_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["annotations"][keys.QUEUE_NAME])


def test_standings_lay_what_a_cohort_borrows_on_its_lenders_most_first() -> None:
    state = cluster(
        *NODES,
        lender("a", {H200: 4}, {H200: 1}),
        lender("b", {H200: 2}, {H200: 2}),
        lender("c", {H200: 3}, {H200: 3}, lendable={H200: 1}),
        lender("wall", {H200: 8}),
        *(running(f"a{i}", "a") for i in range(4)),
    )
    got = {
        name: tuple(n // UNIT for n in (s.deserved, s.used, s.borrowed, s.lendable, s.lent))
        for name, s in standings(state, H200).items()
    }
    assert got == {"a": (1, 4, 3, 0, 0), "b": (2, 0, 0, 2, 2), "c": (3, 0, 0, 1, 1)}


def test_a_pod_admitted_on_borrowed_cards_is_told_so_and_one_inside_its_deserved_is_not() -> None:
    state_objects = [*A_B, running("a0", "a")]
    inside = decide(state_objects, pod("a1", queue_name="a"))
    assert isinstance(inside, Allowed) and inside.warnings == ()
    beyond = decide([*state_objects, running("a1", "a")], pod("a2", queue_name="a", count=2))
    assert isinstance(beyond, Allowed)
    assert beyond.warnings == (
        'pod ns/a2 uses 2 NVIDIA-H200 borrowed from queue "b" (beyond its queue\'s deserved 2): they may be'
        " taken back when lenders need them",
    )


# ---- taking lent cards back: tidal reclaim's machinery, the lending reason -----------------------

R_NODES = (node("n1", R4090, 2), node("n2", R4090, 2))


def lent_out(
    b_deserved: dict[str, int] | None, a_deserved: int = 2, b_priority: int = 0
) -> list[dict[str, Any]]:
    """Queue a (quota 4, deserved ``a_deserved``) runs a 4-pod training gang on both nodes while
    queue b (quota 2, deserved ``b_deserved``) was idle; b's two pods (a batch Job's: training)
    are admitted inside its deserved and wait for a node."""
    a = lender("a", {R4090: 4}, {R4090: a_deserved})
    a["spec"].update(priority=10, reclaimable=False)  # neither tidal reason applies
    b = lender("b", {R4090: 2}, b_deserved)
    b["spec"].update(priority=b_priority)
    job = owner("Job", "b-job", "uid-b-job", api="batch/v1")
    return [
        *R_NODES,
        a,
        b,
        *gang("tj", ["n1", "n1", "n2", "n2"], queue_name="a"),
        *(pod(f"b-{i}", R4090, queue_name="b", owner=job) for i in range(2)),
    ]


@pytest.mark.parametrize(
    ("objects", "victims"),
    [
        pytest.param(lent_out({R4090: 2}), [["ns/tj"]], id="b takes back the cards a borrows"),
        pytest.param(lent_out(None), [], id="twin: b lends nothing, a borrows nothing of it"),
        pytest.param(lent_out({R4090: 2}, a_deserved=4), [], id="twin: a is inside its deserved"),
        pytest.param(lent_out({R4090: 2}, b_priority=-5), [["ns/tj"]], id="whatever the queues' priorities"),
    ],
)
def test_a_lender_inside_its_deserved_takes_back_its_cards_from_the_borrowing_gang_whole(
    objects: list[dict[str, Any]], victims: list[list[str]]
) -> None:
    state = cluster(*objects)
    plans = tidal.plan(state, lambda uid: True)
    assert [[g.key for g in p.victims or ()] for p in plans if p.victims] == victims
    if victims:
        (plan,) = plans
        assert (plan.queue, plan.card, plan.pods) == ("b", R4090, ("uid-ns-b-0", "uid-ns-b-1"))


@settings(max_examples=300, deadline=None)
@given(
    a_deserved=st.integers(0, 4),
    gangs=st.lists(st.integers(1, 2), min_size=1, max_size=4),
    waiting=st.integers(1, 2),
)
def test_no_lender_is_kept_from_its_deserved_once_reclaim_has_run(
    a_deserved: int, gangs: list[int], waiting: int
) -> None:
    """Queue a (quota 4) runs gangs of 1 or 2 one-card pods on the 4 cards of two nodes, each gang on
    one node as it fits; queue b (deserved 2) has ``waiting`` pods admitted inside its deserved. Once
    reclaim's plan has run (its victims gone), b's pods fit the free cards whenever a borrows (the
    cards are b's), and no gang is taken while a does not, nor from anyone but a."""
    placed: list[tuple[str, list[str]]] = []
    room = {"n1": 2 * UNIT, "n2": 2 * UNIT}  # free cards, in card units
    for i, size in enumerate(gangs):
        node_name = next((n for n, free in room.items() if free >= size * UNIT), None)
        if node_name is None:
            continue
        room[node_name] -= size * UNIT
        placed.append((f"g{i}", [node_name] * size))
    used = sum(len(nodes) for _, nodes in placed)
    a = lender("a", {R4090: 4}, {R4090: a_deserved})
    a["spec"].update(priority=10, reclaimable=False)
    b = lender("b", {R4090: 2}, {R4090: 2})
    job = owner("Job", "b-job", "uid-b-job", api="batch/v1")
    state = cluster(
        *R_NODES,
        a,
        b,
        *(o for name, nodes in placed for o in gang(name, nodes, queue_name="a")),
        *(pod(f"b-{i}", R4090, queue_name="b", owner=job) for i in range(waiting)),
    )
    plans = tidal.plan(state, lambda uid: True)
    victims = [g for p in plans for g in p.victims or ()]
    assert all(g.queue == "a" for g in victims)
    free = reclaim.freed(room, victims)
    borrows = used > a_deserved
    if sum(room.values()) >= waiting * UNIT:
        assert not victims, "nothing is taken while the free cards hold b's pods"
    elif borrows:
        assert reclaim.placeable(free, [UNIT] * waiting), (placed, victims, free)
    else:
        assert not victims, "a within its deserved gives nothing back"


def test_dra_pods_and_shared_gpus_borrow_and_are_refused_as_device_plugin_pods() -> None:
    """A DRA pod (a template of one H200) and a shared GPU (half an H200 of Volcano vGPU) borrow b's
    idle H200 as a device-plugin pod would; their twins, with b using its deserved, are refused."""
    lenders = [lender("a", {H200: 4}, {H200: 2}), lender("b", {H200: 2}, {H200: 2})]
    template = claim_template("one", gpu_request(device_class_name="h200", count=1))
    dra = dra_pod("dra", templates=("one",), queue_name="a")
    half = pod(
        "half",
        H200,
        None,
        queue_name="a",
        spec=shared(
            {
                "volcano.sh/vgpu-number": 1,
                "volcano.sh/vgpu-cores": 50,
                "volcano.sh/vgpu-memory-percentage": 50,
            }
        ),
    )
    for new in (dra, half):
        idle = dra_cluster(*lenders, template, *A_USES_2)
        assert isinstance(admission.validate(idle, request(new), 0.0), Allowed), new["metadata"]["name"]
        busy = dra_cluster(*lenders, template, *A_USES_2, running("b0", "b"), running("b1", "b"))
        refused = admission.validate(busy, request(new), 0.0)
        assert isinstance(refused, Denied), new["metadata"]["name"]
        assert (
            'queue "a" has 0 NVIDIA-H200 left (deserved 2 and 0 idle in its cohort to borrow'
            in refused.message
        )


STARTED = "2026-11-28T00:00:00Z"
T0 = 1_795_824_000.0  # STARTED in seconds since the epoch


@pytest.mark.parametrize(("ran", "taken"), [(60.0, False), (601.0, True)], ids=["1 min", "past 10 min"])
def test_a_borrowing_gang_runs_its_queues_minimum_run_time_before_its_cards_are_taken_back(
    ran: float, taken: bool
) -> None:
    """Queue a's ``reclaim-min-runtime`` of 10m: its gang that started 1 minute ago keeps the cards
    it borrows (b's pods are told why); once 10 minutes have passed, it gives them back."""
    objects = lent_out({R4090: 2})
    for made in objects:
        if made["kind"] == "Queue" and made["metadata"]["name"] == "a":
            made["metadata"]["annotations"][keys.RECLAIM_MIN_RUNTIME] = "10m"
        if made["kind"] == "Pod" and made["metadata"]["name"].startswith("tj-"):
            made["status"]["startTime"] = STARTED
    state = cluster(*objects)
    plans = tidal.solve_all(done(tidal.problems(state, lambda uid: True, now=T0 + ran)))
    victims = [g.key for p in plans for g in p.victims or ()]
    assert victims == (["ns/tj"] if taken else []), plans
    if not taken:
        (plan,) = plans
        assert plan.why == (
            '1 gang: it has run 1.0 min of queue "a"\'s minimum run time of 10.0 min'
            " (cardquota.volcano.sh/reclaim-min-runtime)"
        ), plan.why


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("10", None),
        ("m", None),
        ("", None),
        ("-5m", None),
        ("10 m", None),
    ],
)
@pytest.mark.parametrize("key", [keys.RECLAIM_MIN_RUNTIME, keys.RECLAIM_NOTICE])
def test_a_minimum_run_time_or_a_notice_is_a_duration(text: str, seconds: float | None, key: str) -> None:
    assert reclaim.parse_duration(text) == seconds
    made = lender("a", {R4090: 4}, {R4090: 2})
    made["metadata"]["annotations"][key] = text
    decision = admission.validate(
        cluster(*NODES), request(made, resource="queues", group="scheduling.volcano.sh"), 0.0
    )
    assert isinstance(decision, Allowed) is (seconds is not None), decision
    if isinstance(decision, Denied):
        assert decision.message.startswith(f'queue "a" has a malformed {key} '), decision.message


# ---- an A|B scale-up: whatif and headroom say what its admission does ----------------------------

AB = f"{H200}|{H800}"
AB_A = lender("a", {H200: 3, H800: 2}, {H200: 1, H800: 1})
AB_B = lender("b", {H200: 2, H800: 2}, {H200: 2, H800: 2})
B_BUSY = [running(f"b{i}", "b", card) for i, card in enumerate((H200, H200, H800, H800))]
LOOSE = pod("loose", AB, queue_name="a")  # an A|B pod no mutation gave a model: either, still


def ab_train(
    kind: str, *more: dict[str, Any], a: dict[str, Any] = AB_A, b: dict[str, Any] = AB_B
) -> list[dict[str, Any]]:
    """Queue a (quota 3 H200 and 2 H800, deserved 1 of each) and b (deserved its quota of 2 and 2);
    a's workload "train" of ``kind`` asks ``A|B``, its one pod assigned an H200 and running."""
    if kind == "statefulset":
        made = [statefulset("train", 1, AB, queue_name="a")]
        mine = owner("StatefulSet", "train", "uid-sts-train")
    else:
        made = [
            deployment("train", 1, AB, queue_name="a"),
            replicaset("train-1", 1, "train", AB, queue_name="a"),
        ]
        mine = owner("ReplicaSet", "train-1", "uid-rs-train-1")
    one = running("train-0", "a")
    one["metadata"]["ownerReferences"] = [mine]
    one["metadata"]["annotations"][keys.CARD_SPEC] = AB
    return [*NODES, a, b, *made, one, *more]


def scaled(objects: list[dict[str, Any]], kind: str, replicas: int) -> Allowed | Denied:
    """The review of ``train``'s scale from 1 to ``replicas`` (the HPA's write)."""
    decision = admission.validate(
        cluster(*objects), scale_request("train", 1, replicas, resource=f"{kind}s"), 0.0
    )
    assert isinstance(decision, Allowed | Denied)
    return decision


def given_models(objects: list[dict[str, Any]], kind: str, replicas: int) -> dict[str, int]:
    """The models ``train``'s new pods get when its scale from 1 to ``replicas`` is admitted and its
    controller creates them one by one (each through the mutation and the validation)."""
    state = cluster(*objects)
    scale = scale_request("train", 1, replicas, resource=f"{kind}s")
    decision = admission.validate(state, scale, 0.0)
    assert isinstance(decision, Allowed), decision.message
    admission.admit(state, scale, decision, 0.0)
    mine = (
        owner("StatefulSet", "train", "uid-sts-train")
        if kind == "statefulset"
        else owner("ReplicaSet", "train-1", "uid-rs-train-1")
    )
    models: dict[str, int] = {}
    for i in range(1, replicas):
        new = pod(f"train-{i}", AB, queue_name="a", owner=mine)
        mutation = admission.mutate(state, request(new), now=0.0)
        admission.admit(state, request(new), mutation, 0.0)
        new = jsonpatch.apply_patch(new, [dict(op) for op in mutation.patch])
        validation = admission.validate(state, request(new), 0.0)
        assert isinstance(validation, Allowed), validation.message
        admission.admit(state, request(new), validation, 0.0)
        card = new["metadata"]["annotations"][keys.CARD_NAME]
        models[card] = models.get(card, 0) + 1
    return models


def in_parent(made: dict[str, Any]) -> dict[str, Any]:
    made = json.loads(json.dumps(made))
    made["spec"]["parent"] = "p"
    return made


AB_SCALE_UPS = [
    pytest.param(
        ab_train("deployment"),
        "deployment",
        [(H200, 2, 0, 2), (H800, 1, 1, 0)],
        (4, {H200: 2, H800: 2}, {H200: (0, 2), H800: (1, 1)}),
        id="A|B 1 to 4: two borrow b's idle H200, the third takes a's own H800",
    ),
    pytest.param(
        ab_train("deployment", *B_BUSY),
        "deployment",
        None,
        (1, {H200: 0, H800: 1}, {H200: (0, 0), H800: (1, 0)}),
        id="twin, A|B: b uses its deserved, only a's own H800 is left",
    ),
    pytest.param(
        ab_train("statefulset"),
        "statefulset",
        [(H200, 2, 0, 2), (H800, 1, 1, 0)],
        (4, {H200: 2, H800: 2}, {H200: (0, 2), H800: (1, 1)}),
        id="A|B statefulset 1 to 4: as a deployment",
    ),
    pytest.param(
        ab_train("statefulset", *B_BUSY),
        "statefulset",
        None,
        (1, {H200: 0, H800: 1}, {H200: (0, 0), H800: (1, 0)}),
        id="twin, A|B statefulset: b uses its deserved",
    ),
    pytest.param(
        ab_train("deployment", LOOSE),
        "deployment",
        [(H200, 2, 0, 2), (H800, 1, 0, 1)],
        (3, {H200: 2, H800: 2}, {H200: (0, 2), H800: (0, 1)}),
        id="A|B beside an unassigned A|B pod: each model alone holds 2, both together 3, each pod on one",
    ),
    pytest.param(
        ab_train("deployment", LOOSE, *B_BUSY),
        "deployment",
        None,
        (0, {H200: 0, H800: 0}, {H200: (0, 0), H800: (0, 0)}),
        id="twin, A|B beside an unassigned A|B pod: b uses its deserved, the loose pod takes a's H800",
    ),
    pytest.param(
        [lender("p", {H200: 2, H800: 2}), *ab_train("deployment", a=in_parent(AB_A), b=in_parent(AB_B))],
        "deployment",
        [(H200, 1, 0, 1), (H800, 2, 1, 1)],
        (3, {H200: 1, H800: 2}, {H200: (0, 1), H800: (1, 1)}),
        id="hierarchy, A|B: the parent's H200 quota sends the second and third pods to H800",
    ),
    pytest.param(
        [lender("p", {H200: 1, H800: 1}), *ab_train("deployment", a=in_parent(AB_A), b=in_parent(AB_B))],
        "deployment",
        None,
        (1, {H200: 0, H800: 1}, {H200: (0, 0), H800: (1, 0)}),
        id="twin, hierarchy, A|B: the parent's quota leaves one H800",
    ),
]


@pytest.mark.parametrize(("objects", "kind", "split", "room"), AB_SCALE_UPS)
def test_an_a_or_b_scale_up_is_told_per_model_what_fits_within_its_deserved_and_what_it_borrows(
    objects: list[dict[str, Any]],
    kind: str,
    split: list[tuple[str, int, int, int]] | None,
    room: tuple[int, dict[str, int], dict[str, tuple[int, int]]],
) -> None:
    """``train`` scaled from 1 to 4: whatif answers as the review does and, admitted, says on which
    model each added pod goes (the models its pods are then given, one by one, by the mutation: the
    spec's order, one model a pod, the rest still fitting), how many of those within a's deserved
    and how many on what b lends. headroom's N more is the largest scale-up the review admits; its
    split per model adds up to N, each model's pods those the pods of that scale-up are given."""
    review = scaled(objects, kind, 4)
    manifest = next(copy.deepcopy(o) for o in objects if o["metadata"]["name"] == "train")
    manifest["spec"]["replicas"] = 4
    (answer,) = whatif.whatif(cluster(*objects), [("x", manifest)], now=0.0)
    assert answer.allowed is isinstance(review, Allowed), review.message
    got = [(n["card"], n["pods"], n["within_deserved"], n["borrowing"]) for n in answer.lending]
    assert got == (split or [])
    assert sum(pods for _, pods, _, _ in got) == (3 if split else 0), "each pod on one model"
    if split:
        assert given_models(objects, kind, 4) == {card: pods for card, pods, _, _ in got}
    assert all(n["lenders"] == (["b"] if n["borrowing"] else []) for n in answer.lending)
    warned = review.warnings if isinstance(review, Allowed) else ()
    assert sorted(warned) == sorted(
        f"scale-up of {kind} ns/train from 1 to 4 replicas uses {borrowing} {card} borrowed from queue"
        f' "b" (beyond its queue\'s deserved 1): they may be taken back when lenders need them'
        for card, _, _, borrowing in got
        if borrowing
    ), "the review warns of what each model borrows, as its pods will be given them"
    assert [line for line in whatif.table([answer]).splitlines() if line.startswith("  queue")] == [
        f"  queue 'a' on {card}: {pods} of the {AB} pods it adds {'goes' if pods == 1 else 'go'} on it,"
        f" {within} of them within its deserved, {borrowing} more with what its cohort lends now"
        + (" (lent by queue 'b')" if borrowing else "")
        for card, pods, within, borrowing in got
    ]
    more, per_model, per_card = room
    told = headroom.of_workload(cluster(*objects), f"{kind}/ns/train", 0.0)
    assert told.more == more
    assert isinstance(scaled(objects, kind, 1 + more + 1), Denied)
    assert more == 0 or isinstance(scaled(objects, kind, 1 + more), Allowed)
    assert told.per_model == per_model
    assert {card: (n["within_deserved"], n["borrowing"]) for card, n in told.lending.items()} == per_card
    assert sum(w + b for w, b in per_card.values()) == more, "each pod on one model"
    if more:
        placed = {card: w + b for card, (w, b) in per_card.items() if w + b}
        assert given_models(objects, kind, 1 + more) == placed


JOB_REF = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")


def ab_job(*more: dict[str, Any]) -> list[dict[str, Any]]:
    """Queues a and b as above; a's Volcano Job "train", one task t0 asking ``A|B``, its PodGroup
    running and its one pod assigned an H200."""
    template = {
        "metadata": {"annotations": {keys.CARD_NAME: AB, keys.QUEUE_NAME: "a"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    group = podgroup("pg", "Running", request=json.dumps({AB: 1}), owner_ref=JOB_REF, queue_name="a")
    return [*NODES, AB_A, AB_B, vcjob("train", [(1, template)], queue="a"), group, task_pod(0, H200), *more]


def task_pod(i: int, card: str = AB) -> dict[str, Any]:
    made = pod(f"train-t0-{i}", card, queue_name="a", owner=JOB_REF, group="pg")
    made["metadata"]["annotations"][keys.TASK_SPEC] = "t0"
    if card != AB:  # assigned, running
        made["metadata"]["annotations"][keys.CARD_SPEC] = AB
        made["spec"]["nodeName"], made["status"]["phase"] = "h0", "Running"
    return made


@pytest.mark.parametrize(
    ("objects", "more", "split"),
    [
        pytest.param(ab_job(), 2, (0, 2), id="A|B volcano job task: its pods follow its first's H200"),
        pytest.param(
            ab_job(*B_BUSY), 0, (0, 0), id="twin: b uses its deserved, H200 is full though H800 is not"
        ),
    ],
)
def test_an_a_or_b_volcano_job_task_is_told_what_fits_on_the_one_model_its_pods_are_given(
    objects: list[dict[str, Any]], more: int, split: tuple[int, int]
) -> None:
    """The pods of a task are all given the model its first was (the scheduler treats them alike):
    headroom's N more are those on that model, within a's deserved and on what b lends, and the
    task's next pods, created one by one, are admitted N times, on it, then refused."""
    (told,) = headroom.of_ref(cluster(*objects), "vcjob/ns/train", 0.0)
    assert told.more == more and told.per_model == {}
    assert {card: (n["within_deserved"], n["borrowing"]) for card, n in told.lending.items()} == {H200: split}
    state = cluster(*objects)
    given: list[str] = []
    for i in range(1, more + 2):
        new = task_pod(i)
        mutation = admission.mutate(state, request(new), now=0.0)
        admission.admit(state, request(new), mutation, 0.0)
        new = jsonpatch.apply_patch(new, [dict(op) for op in mutation.patch])
        validation = admission.validate(state, request(new), 0.0)
        if isinstance(validation, Denied):
            break
        admission.admit(state, request(new), validation, 0.0)
        given.append(new["metadata"]["annotations"][keys.CARD_NAME])
    assert given == [H200] * more

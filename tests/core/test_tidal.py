"""Tidal reclaim planned from the cache (SPEC §5e, decisions.md §26): who waits for cards of their
model that no node has free, and which whole training gangs give them back."""

import copy
import itertools
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from tests.builders import H200, R4090, cluster, node, owner, pod, podgroup, queue, request, template, vcjob
from webhook.core.decide import admission, reclaim_holds, tidal
from webhook.core.index.state import ClusterState
from webhook.core.model import keys, objects, placement
from webhook.core.model.cards import UNIT
from webhook.core.model.reclaim import Taken
from webhook.core.model.steps import done
from webhook.core.model.verdicts import Allowed, Decision, Denied

RS = owner("ReplicaSet", "web-1", "uid-rs-web-1")


def job_ref(name: str) -> dict[str, Any]:
    return owner("Job", name, f"uid-job-{name}", api="batch.volcano.sh/v1alpha1")


def train_queue(
    name: str = "train", priority: int = 20000, reclaimable: bool = True, ours: str = ""
) -> dict[str, Any]:
    """A training queue; ``ours``: our reclaimable annotation, overriding ``reclaimable``."""
    q = queue(name, json.dumps({R4090: 8, H200: 8}), priority=priority, reclaimable=reclaimable)
    if ours:
        q["metadata"]["annotations"]["cardquota.volcano.sh/reclaimable"] = ours
    return q


def serve_queue(quota: int = 2, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    q = queue("serve", json.dumps({R4090: quota, H200: quota}), priority=80000, reclaimable=False)
    q["metadata"]["annotations"].update(annotations or {})
    return q


def gang(
    name: str,
    placed: list[str],
    card: str = R4090,
    queue_name: str = "train",
    priority: int = 0,
    created: str = "2026-11-26T00:00:00Z",
    ref: dict[str, Any] | None = None,
    **kw: Any,
) -> list[dict[str, Any]]:
    """A training gang: its PodGroup (a Volcano Job's) and one running pod per node in ``placed``."""
    group = podgroup(name, "Running", queue_name=queue_name, owner_ref=ref or job_ref(name))
    group["metadata"]["creationTimestamp"] = created
    pods = [
        pod(
            f"{name}-{i}",
            card,
            node_name=where,
            phase="Running",
            queue_name=queue_name,
            group=name,
            owner=job_ref(name),
            spec={"priority": priority},
            **kw,
        )
        for i, where in enumerate(placed)
    ]
    return [group, *pods]


def inference(count: int, card: str = R4090, queue_name: str = "serve") -> list[dict[str, Any]]:
    group = podgroup("web", "Inqueue", queue_name=queue_name, owner_ref=RS)
    return [group] + [
        pod(f"web-{i}", card, queue_name=queue_name, group="web", owner=RS) for i in range(count)
    ]


NODES = (node("n1", R4090, 2), node("n2", R4090, 2), node("h", H200, 2))


def plans(state: ClusterState, leaving: tuple[str, ...] = ()) -> list[tidal.Plan]:
    return tidal.plan(state, lambda uid: True, leaving)


def victims(state: ClusterState, leaving: tuple[str, ...] = ()) -> list[list[str]]:
    return [[g.key for g in p.victims or ()] for p in plans(state, leaving)]


def test_inference_takes_back_a_whole_training_job_across_nodes() -> None:
    state = cluster(
        *NODES, train_queue(), serve_queue(), *gang("tj", ["n1", "n1", "n2", "n2"]), *inference(2)
    )
    [found] = plans(state)
    assert (found.card, found.queue, found.mode) == (R4090, "serve", "on")
    assert found.pods == ("uid-ns-web-0", "uid-ns-web-1")
    assert found.victims is not None
    [victim] = found.victims
    assert (
        victim.key == "ns/tj" and victim.cards == {"n1": 2 * UNIT, "n2": 2 * UNIT} and found.cards == 4 * UNIT
    )
    assert victim.pods == ("ns/tj-0", "ns/tj-1", "ns/tj-2", "ns/tj-3")


def test_the_lowest_priority_then_youngest_gang_goes_and_no_more_than_needed() -> None:
    state = cluster(
        *NODES,
        train_queue(),
        serve_queue(),
        *gang("old", ["n1"], created="2026-11-26T00:00:00Z"),
        *gang("young", ["n1"], created="2026-11-26T01:00:00Z"),
        *gang("high", ["n2", "n2"], priority=100),
        *inference(1),
    )
    assert victims(state) == [["ns/young"]]


def test_nothing_is_taken_while_a_card_is_free_or_freeing() -> None:
    free = cluster(*NODES, train_queue(), serve_queue(), *gang("tj", ["n1", "n1", "n2"]), *inference(1))
    assert plans(free) == []
    deleting = gang("tj", ["n1", "n1", "n2", "n2"])
    deleting[-1]["metadata"].update(deletionTimestamp="2026-11-26T00:00:00Z", deletionGracePeriodSeconds=30)
    assert plans(cluster(*NODES, train_queue(), serve_queue(), *deleting, *inference(1))) == []


def test_a_gang_already_evicted_is_not_taken_again_and_its_cards_count_as_freeing() -> None:
    state = cluster(
        *NODES,
        train_queue(),
        serve_queue(quota=4),
        *gang("a", ["n1", "n1"]),
        *gang("b", ["n2", "n2"]),
        *inference(3),
    )
    assert victims(state) == [["ns/a", "ns/b"]]
    # "a" is leaving already (an earlier pass evicted it for two of these pods): only "b" more.
    assert victims(state, leaving=("ns/a", "ns/a-0", "ns/a-1")) == [["ns/b"]]


def test_never_another_model_nor_inference_nor_a_protected_or_unreclaimable_one() -> None:
    state = cluster(
        *NODES,
        train_queue(),
        train_queue("high", priority=90000),
        train_queue("locked", ours="false"),
        serve_queue(),
        *gang("h200", ["h", "h"], card=H200),
        *gang("keep", ["n1"], annotations={"volcano.sh/preemptable": "false"}),
        *gang("web2", ["n1"], ref=owner("ReplicaSet", "other", "uid-rs-other")),
        *gang("above", ["n2"], queue_name="high"),
        *gang("lock", ["n2"], queue_name="locked"),
        *inference(1),
    )
    [found] = plans(state)
    assert found.victims is None
    assert found.why == (
        '1 gang: a pod of it is not preemptable (volcano.sh/preemptable); 1 gang: its queue "high" has'
        ' priority 90000, not below 80000; 1 gang: its queue "locked" is not reclaimable; 1 gang: its'
        " service type is inference, not training"
    )


def test_our_annotation_makes_a_queue_reclaimable_that_volcano_is_told_is_not() -> None:
    held = gang("tj", ["n1", "n1", "n2", "n2"])
    [refused] = plans(cluster(*NODES, train_queue(reclaimable=False), serve_queue(), *held, *inference(1)))
    assert refused.victims is None and refused.why == '1 gang: its queue "train" is not reclaimable'
    locked = train_queue(reclaimable=False, ours="true")
    state = cluster(*NODES, locked, serve_queue(), *gang("tj", ["n1", "n1", "n2", "n2"]), *inference(1))
    assert victims(state) == [["ns/tj"]]


def test_training_never_takes_back_and_a_queue_may_switch_reclaim_off_or_to_a_dry_run() -> None:
    training_waits = [
        *gang("tj", ["n1", "n1", "n2", "n2"], queue_name="low", priority=0),
        podgroup("t2", "Inqueue", queue_name="serve", owner_ref=job_ref("t2")),
        pod("t2-0", R4090, queue_name="serve", group="t2", owner=job_ref("t2")),
    ]
    assert plans(cluster(*NODES, train_queue("low", priority=0), serve_queue(), *training_waits)) == []
    off = serve_queue(annotations={"cardquota.volcano.sh/reclaim": "off"})
    held = gang("tj", ["n1", "n1", "n2", "n2"])
    assert plans(cluster(*NODES, train_queue(), off, *held, *inference(1))) == []
    dry = serve_queue(annotations={"cardquota.volcano.sh/reclaim": "dry-run"})
    [found] = plans(cluster(*NODES, train_queue(), dry, *held, *inference(1)))
    assert found.mode == "dry-run" and found.victims is not None


def test_a_queue_over_its_quota_takes_nothing_back() -> None:
    state = cluster(
        *NODES, train_queue(), serve_queue(quota=1), *gang("tj", ["n1", "n1", "n2", "n2"]), *inference(2)
    )
    assert plans(state) == []


def test_the_higher_priority_queue_is_served_first_and_each_card_is_taken_once() -> None:
    second = queue("serve2", json.dumps({R4090: 2}), priority=70000, reclaimable=False)
    other = [
        podgroup("api", "Inqueue", queue_name="serve2", owner_ref=owner("ReplicaSet", "api-1", "uid-rs-api")),
        pod(
            "api-0", R4090, queue_name="serve2", group="api", owner=owner("ReplicaSet", "api-1", "uid-rs-api")
        ),
    ]
    state = cluster(
        *NODES,
        train_queue(),
        serve_queue(),
        second,
        *gang("a", ["n1", "n1"]),
        *gang("b", ["n2", "n2"], priority=10),
        *inference(2),
        *other,
    )
    # serve (80000) takes "a" for its 2 pods; serve2 comes after them, so "a"'s cards are taken
    # already: it takes "b", never "a" again.
    found = [(p.queue, [g.key for g in p.victims or ()]) for p in plans(state)]
    assert found == [("serve", ["ns/a"]), ("serve2", ["ns/b"])]


# ---- a property over random clusters ----------------------------------------------------------

MODELS = (R4090, H200)
ROLES = (  # (queue, priority, reclaimable, owner kind of its gangs, preemptable mark)
    ("train", 20000, True, "Job", ""),
    ("batch", 10000, True, "Job", ""),
    ("locked", 20000, False, "Job", ""),
    ("high", 90000, True, "Job", ""),
    ("keep", 20000, True, "Job", "false"),
    ("api", 20000, True, "ReplicaSet", ""),
)


@dataclass(frozen=True)
class Held:
    """A gang as the test made it: one pod of one card on each of ``nodes``."""

    key: str
    card: str
    nodes: tuple[str, ...]
    role: str  # its queue, one of ROLES
    priority: int  # its pods' spec.priority
    hour: int  # its PodGroup made at that hour of 2026-11-26


@dataclass(frozen=True)
class World:
    """A cluster as the test made it; ``objects`` are what the product reads."""

    cards: dict[str, int]  # each RTX-4090 node's cards (and "h0" has 4 H200)
    free: dict[str, int]  # each RTX-4090 node's free cards
    gangs: list[Held]
    sizes: list[int]  # the cards of each waiting inference pod, first in line first

    def objects(self) -> list[dict[str, Any]]:
        made = [node(name, R4090, cards) for name, cards in self.cards.items()]
        made += [node("h0", H200, 4), serve_queue(quota=8)]
        for name, priority, reclaimable, _, _ in ROLES:
            made.append(
                queue(name, json.dumps({R4090: 16, H200: 16}), priority=priority, reclaimable=reclaimable)
            )
        for held in self.gangs:
            _, _, _, kind, mark = next(role for role in ROLES if role[0] == held.role)
            name = held.key.split("/")[1]
            made += gang(
                name,
                list(held.nodes),
                card=held.card,
                queue_name=held.role,
                priority=held.priority,
                created=f"2026-11-26T0{held.hour}:00:00Z",
                ref=job_ref(name) if kind == "Job" else owner("ReplicaSet", name, f"uid-rs-{name}"),
                annotations={"volcano.sh/preemptable": mark} if mark else None,
            )
        web = inference(len(self.sizes))
        for obj, size in zip(web[1:], self.sizes, strict=True):
            obj["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(size)
        return made + web


@st.composite
def clusters(draw: st.DrawFn) -> World:
    """Nodes of two models, their cards held by gangs of every role (a card or so left free), and
    up to four inference pods of queue "serve" (priority 80000, quota 8) waiting for RTX-4090, of
    1 to 3 cards each."""
    cards = {f"r{i}": draw(st.integers(2, 4)) for i in range(draw(st.integers(1, 3)))}
    count = draw(st.integers(2, 8))
    placed: dict[int, list[str]] = {}
    free: dict[str, int] = {}
    for name, has in [*cards.items(), ("h0", 4)]:
        held = has - draw(st.integers(0, 1))
        if name != "h0":
            free[name] = has - held
        for _ in range(held):
            g = draw(st.integers(0, count - 1)) * 2 + (1 if name == "h0" else 0)  # one model per gang
            placed.setdefault(g, []).append(name)
    gangs = [
        Held(
            f"ns/g{g}",
            H200 if g % 2 else R4090,
            tuple(where),
            draw(st.sampled_from([*ROLES, *ROLES[:2]]))[0],  # half of them may give
            draw(st.integers(0, 2)),
            draw(st.integers(0, 9)),
        )
        for g, where in sorted(placed.items())
    ]
    return World(cards, free, gangs, draw(st.lists(st.integers(1, 3), min_size=1, max_size=4)))


# ---- the test's own answer, by brute force -------------------------------------------------------


def fits(free: dict[str, int], sizes: list[int]) -> bool:
    """Whether some assignment of every pod, whole, to one node leaves no node short (tried
    exhaustively)."""
    for choice in itertools.product(free, repeat=len(sizes)):
        left = dict(free)
        for where, size in zip(choice, sizes, strict=True):
            left[where] -= size
        if min(left.values(), default=0) >= 0:
            return True
    return False


def without(free: dict[str, int], gone: Iterable[Held]) -> dict[str, int]:
    """Each node's free cards once the gangs ``gone`` have left."""
    left = dict(free)
    for held in gone:
        for where in held.nodes:
            left[where] += 1
    return left


def may_give(held: Held) -> bool:
    """SPEC §5e by ROLES: RTX-4090 training (a Job's) of a reclaimable queue below 80000, preemptable."""
    return held.card == R4090 and held.role in ("train", "batch")


def rank(held: Held) -> tuple[int, int, int, str]:
    """First out: lower PriorityClass, lower queue priority, younger (decisions.md §26)."""
    queue_priority = next(priority for name, priority, *_ in ROLES if name == held.role)
    return (held.priority, queue_priority, -held.hour, held.key)


def order(chosen: tuple[Held, ...]) -> tuple[Any, ...]:
    """decisions.md §26, smaller first: the highest-ranked victim as low as it can be, then the
    fewest gangs, then the fewest cards, then the ranks from the highest down."""
    ranks = sorted(map(rank, chosen), reverse=True)
    return (ranks[0], len(chosen), sum(len(g.nodes) for g in chosen), ranks)


def decided_by(sets: list[tuple[Held, ...]]) -> str:
    """Which part of ``order`` puts the cheapest set before the next one (for the statistics)."""
    if len(sets) < 2:
        return "the only set"
    first, second = sorted(map(order, sets))[:2]
    parts = ("highest rank", "gangs", "cards", "ranks")
    return next(part for part, a, b in zip(parts, first, second, strict=True) if a != b)


def expected(world: World) -> dict[str, Any]:
    """The plans by the test's own count: none when the pods fit what is free (or ask more than
    their queue's quota); else as many pods, first in line first, as every gang that may give,
    gone, lets fit (``served``), given the cheapest set of gangs that lets them fit (none taken when
    they fit already), and the rest told nothing frees enough for them."""
    free, sizes = world.free, world.sizes
    if sum(sizes) > 8 or fits(free, sizes):  # "serve" over its quota of 8 takes nothing (SPEC §5e)
        return {}
    eligible = [g for g in world.gangs if may_give(g)]
    served = max(k for k in range(len(sizes) + 1) if fits(without(free, eligible), sizes[:k]))
    uids = [f"uid-ns-web-{i}" for i in range(len(sizes))]
    out: dict[str, Any] = {}
    if served < len(sizes):
        out["blocked"] = tuple(uids[served:])
    if served and not fits(free, sizes[:served]):
        sets = [
            chosen
            for k in range(1, len(eligible) + 1)
            for chosen in itertools.combinations(eligible, k)
            if fits(without(free, chosen), sizes[:served])
        ]
        out["taking"] = (tuple(uids[:served]), {g.key for g in min(sets, key=order)})
        event(f"the victims decided by {decided_by(sets)}")
    return out


# g0 (the oldest) must go, with one more on r0 for the 3-card pod: g2 (the youngest, 2 cards) or
# g4 (1 card), the fewest cards deciding; g6 on r1 may not give.
@example(
    World(
        {"r0": 4, "r1": 4},
        {"r0": 0, "r1": 0},
        [
            Held("ns/g0", R4090, ("r0", "r0"), "train", 0, 0),
            Held("ns/g2", R4090, ("r0", "r1"), "train", 0, 9),
            Held("ns/g4", R4090, ("r0",), "train", 0, 5),
            Held("ns/g6", R4090, ("r1", "r1", "r1"), "locked", 0, 0),
        ],
        [3],
    )
)
@settings(max_examples=1000, deadline=None)
@given(clusters())
def test_the_plan_is_the_cheapest_set_of_whole_eligible_gangs_for_the_most_pods_first_in_line(
    world: World,
) -> None:
    """The product's plans from the cluster it reads are exactly the test's own (``expected``, by
    trying every assignment of pods to nodes and every set of gangs): which pods are served and
    which told nothing frees enough, and which gangs go, whole."""
    state = cluster(*world.objects())
    found = plans(state)
    made: dict[str, Any] = {}
    for p in found:
        assert (p.card, p.queue, p.mode) == (R4090, "serve", "on")
        kind = "blocked" if p.victims is None else "taking"
        assert kind not in made, found
        made[kind] = p.pods if p.victims is None else (p.pods, {g.key for g in p.victims})
    event(
        f"{len(made.get('taking', ((), ()))[1])} victims"
        + (", some pods not served" if "blocked" in made else "")
    )
    assert made == expected(world)
    by_key = {g.key: g for g in world.gangs}
    for p in found:
        for victim in p.victims or ():  # whole: every pod of it, its every card
            assert sorted(victim.pods) == sorted(
                f"{victim.key}-{i}" for i in range(len(by_key[victim.key].nodes))
            )
            assert victim.cards == {n: UNIT * k for n, k in Counter(by_key[victim.key].nodes).items()}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        '{"card": "x"}',
        '{"card":"x","cards":"many","queue":"q","pods":[],"until":"2026-11-26T00:00:00Z"}',
        '{"card":"x","cards":1,"queue":"q","pods":[],"until":"yesterday"}',
    ],
)
def test_an_odd_reclaim_mark_is_ignored(text: str) -> None:
    assert objects.reclaim_mark(text) is None


def test_a_reclaim_mark_reads_back_what_was_written() -> None:
    taken = Taken(R4090, 4 * UNIT, "serve", ("uid-a", "uid-b"), 1795651200.5)
    assert objects.reclaim_mark(objects.reclaim_text(taken)) == taken


# Go's strconv.ParseBool, as Volcano's GetPodPreemptable reads the mark: anything else is refused,
# and a refused value makes the pod not preemptable.
GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")
MARKS = [*GO_TRUE, *GO_FALSE, "yes", "no", "", " true", "tRuE", "2"]


@pytest.mark.parametrize("mark", MARKS)
@pytest.mark.parametrize("where", ["annotation", "label", "label under an annotation saying true"])
def test_preemptable_is_read_as_volcano_reads_it(mark: str, where: str) -> None:
    """A training gang one pod of which is marked ``mark`` is a victim only when Volcano would
    preempt the pod: the annotation first, else the label, each parsed as Go's ParseBool; a value
    it refuses is not preemptable."""
    extra: dict[str, Any] = {}
    if where == "annotation":
        extra["annotations"] = {"volcano.sh/preemptable": mark}
    else:
        extra["labels"] = {"volcano.sh/preemptable": mark}
    if where.endswith("saying true"):
        extra["annotations"] = {"volcano.sh/preemptable": "true"}
    marked = gang("tj", ["n1", "n1", "n2", "n2"])
    marked[1]["metadata"].setdefault("annotations", {}).update(extra.get("annotations", {}))
    if "labels" in extra:
        marked[1]["metadata"].setdefault("labels", {}).update(extra["labels"])
    state = cluster(*NODES, train_queue(), serve_queue(), *marked, *inference(2))
    expected = where.endswith("saying true") or mark in GO_TRUE
    assert victims(state) == ([["ns/tj"]] if expected else [[]]), (mark, where)


def test_only_the_live_pods_of_a_victim_are_evicted() -> None:
    """A finished pod of a training gang holds no card and keeps its logs and exit code: the plan
    evicts the gang's running pods only."""
    tj = gang("tj", ["n1", "n1", "n2", "n2", "n1", "n2"])
    tj[5]["status"]["phase"] = "Succeeded"
    tj[6]["status"]["phase"] = "Failed"
    state = cluster(*NODES, train_queue(), serve_queue(), *tj, *inference(2))
    [found] = plans(state)
    assert [g.pods for g in found.victims or ()] == [("ns/tj-0", "ns/tj-1", "ns/tj-2", "ns/tj-3")]


def test_a_training_job_annotated_inference_takes_nothing_from_others_training() -> None:
    """The service-type annotation is the tenant's to write: a Volcano Job's pods whose PodGroup says
    ``volcano.sh/service.type: inference`` wait like any training and evict nobody; the same pods
    of a Deployment's ReplicaSet (the operator's table says inference) do."""
    job = job_ref("sneaky")
    group = podgroup("sneaky", "Inqueue", queue_name="serve", owner_ref=job)
    group["metadata"].setdefault("annotations", {})["volcano.sh/service.type"] = "inference"
    waiting = [pod(f"sneaky-{i}", R4090, queue_name="serve", group="sneaky", owner=job) for i in range(2)]
    state = cluster(
        *NODES, train_queue(), serve_queue(), *gang("tj", ["n1", "n1", "n2", "n2"]), group, *waiting
    )
    assert victims(state) == []
    state = cluster(
        *NODES, train_queue(), serve_queue(), *gang("tj", ["n1", "n1", "n2", "n2"]), *inference(2)
    )
    assert victims(state) == [["ns/tj"]]


def test_a_pod_with_no_podgroup_is_never_a_victim() -> None:
    """A training pod the cache knows no PodGroup of (bare, or its group not seen) holds its cards:
    nothing could hold them for the pods they would be taken for (its controller re-creates it at
    once), so nothing is evicted and the waiting pods are told there is no gang."""
    bare = [
        pod(f"bare-{i}", R4090, 2, node_name=n, phase="Running", queue_name="train", owner=job_ref("bare"))
        for i, n in enumerate(["n1", "n2"])
    ]
    state = cluster(*NODES, train_queue(), serve_queue(), *bare, *inference(2))
    [found] = plans(state)
    assert found.victims is None and found.why == f"no running pod holds {R4090}"


def test_a_pod_whose_parent_queue_is_over_its_quota_takes_nothing() -> None:
    """SPEC §5e: the beneficiary's queue inside its quota, and every ancestor's that names the model.
    ``serve`` has room for its 2 pods, but its parent ``org`` (quota 1, which ``serve`` uses
    alone) would be over it: nothing is taken. With the parent's quota at 2, the gang goes."""
    for parent_quota, expected in ((1, []), (2, [["ns/tj"]])):
        org = queue("org", json.dumps({R4090: parent_quota, H200: 8}), priority=80000, reclaimable=False)
        serve = serve_queue()
        serve["spec"]["parent"] = "org"
        state = cluster(
            *NODES, train_queue(), org, serve, *gang("tj", ["n1", "n1", "n2", "n2"]), *inference(2)
        )
        assert victims(state) == expected, parent_quota


def _admit(state: ClusterState, obj: dict[str, Any], now: float) -> Decision:
    return admission.validate(state, request(obj), now)


def _enqueue(state: ClusterState, obj: dict[str, Any], now: float) -> Decision:
    new = copy.deepcopy(obj)
    new["status"]["phase"] = "Inqueue"
    review = request(new, resource="podgroups", operation="UPDATE", old=obj, group="scheduling.volcano.sh")
    return admission.validate(state, review, now)


@pytest.mark.parametrize("held_by", ["this replica", "a mark on a PodGroup"])
def test_while_freed_cards_are_held_no_queue_below_starts_anything_of_that_model(held_by: str) -> None:
    """Cards of R4090 taken back from train for serve (80000) are held while serve's two pods wait:
    batch (10000, a third queue) may neither create a pod of R4090 nor have a PodGroup asking it
    enqueued; H200, a queue above serve, and the time after serve's
    pods are bound are not held. A mark on a PodGroup, anyone's to write, holds that group only:
    a tenant cannot stop other queues with one."""
    now = 1795651200.0
    taken = Taken(R4090, 4 * UNIT, "serve", ("uid-ns-web-0", "uid-ns-web-1"), now + 300)
    tj = podgroup("tj", "Pending", queue_name="train", owner_ref=job_ref("tj"))
    if held_by == "this replica":
        marked = []
    else:
        tj["metadata"]["annotations"] = {keys.RECLAIMED: objects.reclaim_text(taken)}
        marked = [tj]
    state = cluster(
        *NODES,
        train_queue(),
        serve_queue(),
        queue("batch", json.dumps({R4090: 4, H200: 4}), priority=10000),
        queue("vip", json.dumps({R4090: 4}), priority=90000),
        *inference(2),
        *marked,
    )
    if held_by == "this replica":
        state.reclaims["ns/tj"] = taken
    later = pod("later", R4090, queue_name="batch")
    refused = _admit(state, later, now + 3)
    if held_by == "a mark on a PodGroup":
        assert isinstance(refused, Allowed), refused
        return
    assert isinstance(refused, Denied)
    assert refused.message == (
        'pod ns/later of queue "batch" waits for NVIDIA-GeForce-RTX-4090: 4 were taken back for queue'
        ' "serve", of higher priority (tidal reclaim), and are held while the 2 pods they were taken'
        " for wait to be bound (297 s at most); its controller creates it again after that"
    )
    job = podgroup("bj", "Pending", json.dumps({R4090: 2}), queue_name="batch", owner_ref=job_ref("bj"))
    state.upsert_podgroup(objects.podgroup_record(job))
    enqueued = _enqueue(state, job, now + 3)
    assert isinstance(enqueued, Denied) and enqueued.message.startswith(
        'podgroup ns/bj (volcano job ns/bj) of queue "batch" waits for NVIDIA-GeForce-RTX-4090'
    ), enqueued
    assert enqueued.message.endswith("it stays Pending, then is enqueued as its quota allows")
    assert isinstance(_admit(state, pod("other", H200, queue_name="batch"), now + 3), Allowed)
    assert isinstance(_admit(state, pod("above", R4090, queue_name="vip"), now + 3), Allowed)
    for name in ("web-0", "web-1"):  # serve's pods bound: the hold is over
        state.upsert_pod(
            objects.pod_record(
                pod(name, R4090, node_name="n1", phase="Running", queue_name="serve", group="web", owner=RS)
            )
        )
    assert isinstance(_admit(state, later, now + 4), Allowed)
    assert isinstance(_enqueue(state, job, now + 4), Allowed)


ABORT = {"event": "PodEvicted", "action": "AbortJob"}


@pytest.mark.parametrize(
    ("policies", "task_policies", "status", "why"),
    [
        ([], [], {}, ""),  # no policy: the job controller recreates the pods (SyncJob)
        ([{"event": "PodFailed", "action": "AbortJob"}], [], {}, ""),
        ([{"event": "PodEvicted", "action": "RestartJob"}], [], {"retryCount": 2}, ""),
        ([ABORT], [], {}, "its Volcano Job's policy ends it when a pod is evicted (PodEvicted: AbortJob)"),
        ([{"events": ["*"], "action": "TerminateJob"}], [], {}, "(PodEvicted: TerminateJob)"),
        ([], [{"event": "PodEvicted", "action": "CompleteJob"}], {}, "(PodEvicted: CompleteJob)"),
        (
            [{"event": "PodEvicted", "action": "RestartJob"}],
            [],
            {"retryCount": 3},
            "its Volcano Job has no retries left (RestartJob on PodEvicted: 3 of 3 used)",
        ),
    ],
)
def test_a_job_an_eviction_would_end_is_never_a_victim(
    policies: list[dict[str, Any]], task_policies: list[dict[str, Any]], status: dict[str, Any], why: str
) -> None:
    """A Volcano Job whose policy aborts, terminates or completes it when a pod is evicted, or that
    restarts with no retries left (maxRetry 3 when unset), would not come back after a reclaim:
    it is never a victim, and the waiting pods are told why. Any other job is."""
    job = vcjob("tj", [(4, template(R4090, queue_name="train"))], policies=policies, queue="train")
    job["spec"]["tasks"][0]["policies"] = task_policies
    job["status"] = status
    state = cluster(
        *NODES, train_queue(), serve_queue(), *gang("tj", ["n1", "n1", "n2", "n2"]), job, *inference(2)
    )
    [found] = plans(state)
    if not why:
        assert [g.key for g in found.victims or ()] == ["ns/tj"]
    else:
        assert found.victims is None and why in found.why, found.why


_KEYS = st.sampled_from(["policies", "tasks", "event", "events", "action", "maxRetry", "retryCount", "x"])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12) | st.sampled_from(["PodEvicted", "*"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, _JSON, max_size=4), _JSON)
def test_a_volcano_jobs_policies_in_any_shape_are_read_without_error(
    spec: dict[str, Any], status: Any
) -> None:
    assert isinstance(objects.evicted_ends(spec, status), str)


def test_a_hold_is_the_podgroups_it_was_taken_from_not_a_new_one_of_that_name() -> None:
    """The hold on a victim's PodGroup is keyed by its uid: a job deleted and made again under the
    same name (a new PodGroup) is not held back by the old one's reclaim."""
    now = 1795651200.0
    state = cluster(*NODES, train_queue(), serve_queue(), *inference(2))
    old = podgroup("tj", "Pending", queue_name="train", owner_ref=job_ref("tj"))
    state.upsert_podgroup(objects.podgroup_record(old))
    state.reclaims["ns/tj"] = Taken(R4090, 4 * UNIT, "serve", ("uid-ns-web-0",), now + 300, "uid-pg-tj")
    assert reclaim_holds.holding(state, "ns/tj", now) is not None
    again = copy.deepcopy(old)
    again["metadata"]["uid"] = "uid-pg-tj-again"
    state.delete_podgroup("ns/tj")
    state.upsert_podgroup(objects.podgroup_record(again))
    assert reclaim_holds.holding(state, "ns/tj", now) is None


def test_the_nodes_are_read_once_for_pods_that_ask_alike() -> None:
    """A Deployment's 200 waiting pods over 50 nodes of their model: the reclaimer hands one node
    test to all the pods that ask alike, and the nodes are read once for it (50 reads, not 10,000);
    pods with a test of their own still get their own nodes."""
    nodes = [node(f"n{i}", R4090, 1) for i in range(50)]
    gangs = [obj for i in range(50) for obj in gang(f"g{i}", [f"n{i}"])]
    state = cluster(*nodes, train_queue(), serve_queue(quota=200), *gangs, *inference(200))
    reads: list[str] = []

    def shared(name: str) -> bool:
        reads.append(name)
        return name != "n0"

    def only_n1(name: str) -> bool:
        return name == "n1"

    def usable(uid: str) -> Any:
        return only_n1 if uid == "uid-ns-web-7" else shared

    [problem] = done(tidal.problems(state, lambda uid: True, usable=usable))
    assert len(reads) == 50
    where = {w.nodes: w.uids for w in problem.queues}
    assert where[frozenset({"n1"})] == ("uid-ns-web-7",)
    assert len(where[frozenset(f"n{i}" for i in range(1, 50))]) == 199


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["cpu", "memory", "pods", "rdma/hca", "hugepages-2Mi", "x"]), JSON))
def test_a_node_whose_allocatable_is_anything_is_read_or_skipped_never_fatal(
    allocatable: dict[str, Any],
) -> None:
    """A Node watched with any JSON as its allocatable amounts (what tidal reclaim holds requests
    against): applied or skipped with a reason, never an exception; what is kept is whole units,
    never below zero."""
    from webhook.core.index import ingest

    state = cluster(*NODES)
    made = node("odd", R4090, 2)
    made["status"]["allocatable"] = allocatable
    read = placement.node_facts(made).allocatable  # read directly too, past the shape check
    assert all(isinstance(n, int) and n >= 0 for n in read.values()), read
    problem = ingest.upsert(state, made)
    facts = state.nodebook.facts.get("odd")
    if facts is None:
        assert problem, "a node neither kept nor skipped with a reason"
        return
    assert all(isinstance(n, int) and n >= 0 for n in facts.allocatable.values()), facts.allocatable
    assert not {"pods", "hugepages-2Mi"} & set(facts.allocatable)

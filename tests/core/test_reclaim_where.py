"""Tidal reclaim only where it helps (SPEC §5e, decisions.md §26), against the test's own count:
random nodes (cards, CPU, a pool label, a taint, a cordon, a pod of no gang using some of the
CPU), training gangs placed on them (some that may not give: not preemptable, or in a queue above
the inference one; some under PodDisruptionBudgets, which keep them out when their eviction as a
whole would be refused) and waiting inference pods (cards and CPU, a node selector, a toleration
or not). The budgets are objects the product judges (``budgets.refusal``) for each gang a plan
names, as the reclaimer does: a gang refused is left out and the plan made again. Whatever plan
the product ends with must name only victims the test's own rules allow, must let every pod it
names fit, each whole on one node it may use and within its CPU, once they leave, and must need
every one of its victims (no smaller set of them would do). Memory and other resources are read
the same way as CPU (``tidal.asks``), and not generated."""

import dataclasses
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.builders import GPU, R4090, cluster, node, owner, pod, podgroup, queue
from webhook.core.decide import tidal
from webhook.core.model import budgets, placement
from webhook.core.model.steps import done

RS = owner("ReplicaSet", "web", "uid-rs-web")
TAINT = {"key": "dedicated", "value": "training", "effect": "NoSchedule"}
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Node:
    name: str
    cards: int
    pool: str
    tainted: bool
    cordoned: bool
    cpu: int = 64  # allocatable, cores
    other: int = 0  # cores a pod of no gang requests there


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget over one gang's pods (its ``job`` label)."""

    allowed: int  # its status.disruptionsAllowed
    spares_unready: bool  # unhealthyPodEvictionPolicy AlwaysAllow: an unready pod takes none
    doubled: bool = False  # a second budget selects the same pods: none of them may be evicted


@dataclass(frozen=True)
class Gang:
    name: str
    pods: tuple[tuple[str, int, int], ...]  # (node, cards, cores) of each of its pods
    # "yes", or why not: "protected" (not preemptable), "above" (a queue above the inference one)
    may_give: str
    budget: Budget | None = None
    unready: int = 0  # its first pods not Ready

    @property
    def kept_by_budget(self) -> bool:
        """Whether its budgets refuse evicting every pod of it, one after another: a pod under two
        budgets is never evicted; each pod that takes a disruption takes one of those allowed."""
        if self.budget is None:
            return False
        if self.budget.doubled:
            return True
        spared = self.unready if self.budget.spares_unready else 0
        return len(self.pods) - spared > self.budget.allowed


@dataclass(frozen=True)
class Waiting:
    name: str
    cards: int
    pool: str | None  # its nodeSelector's pool, if any
    tolerates: bool
    cpu: int = 0  # cores

    @property
    def uid(self) -> str:
        return f"uid-ns-{self.name}"


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Node], list[Gang], list[Waiting]]:
    nodes = [
        Node(
            f"n{i}",
            draw(st.sampled_from([1, 2, 4])),
            draw(st.sampled_from(["a", "b"])),
            draw(st.sampled_from([False, False, True])),
            draw(st.sampled_from([False, False, False, True])),
            draw(st.sampled_from([4, 4, 8, 64])),
            draw(st.sampled_from([0, 0, 2, 3])),
        )
        for i in range(draw(st.integers(1, 4)))
    ]
    free = {n.name: n.cards for n in nodes}
    cores = {n.name: n.cpu - n.other for n in nodes}
    gangs = []
    for j in range(draw(st.integers(0, 8))):
        pods = []
        for _ in range(draw(st.integers(1, 3))):
            room = sorted(name for name, left in free.items() if left > 0 and cores[name] > 0)
            if not room:
                break
            where = draw(st.sampled_from(room))
            cards = draw(st.integers(1, free[where]))
            cpu = draw(st.integers(0, min(4, cores[where])))  # the scheduler placed it: it fits
            free[where] -= cards
            cores[where] -= cpu
            pods.append((where, cards, cpu))
        if pods:
            budget = None
            if draw(st.booleans()):
                budget = Budget(
                    draw(st.integers(0, 3)), draw(st.booleans()), draw(st.sampled_from([False] * 4 + [True]))
                )
            gangs.append(
                Gang(
                    f"g{j}",
                    tuple(pods),
                    draw(st.sampled_from(["yes", "yes", "yes", "yes", "protected", "above"])),
                    budget,
                    draw(st.integers(0, len(pods))),
                )
            )
    # One Deployment's pods: they share where they may land (pods of several node sets that compete
    # for the same nodes are planned group by group, and may get fewer victims than they need in one
    # pass: decisions.md §26).
    pool, tolerates = draw(st.sampled_from([None, "a", "b"])), draw(st.booleans())
    cpu = draw(st.sampled_from([0, 1, 2, 4]))
    waiting = [
        Waiting(f"w{k}", draw(st.integers(1, 2)), pool, tolerates, cpu)
        for k in range(draw(st.integers(1, 3)))
    ]
    return nodes, gangs, waiting


def objects(nodes: Sequence[Node], gangs: Sequence[Gang], waiting: Sequence[Waiting]) -> list[dict[str, Any]]:
    made: list[dict[str, Any]] = [
        queue("train", json.dumps({R4090: 16}), priority=20000, reclaimable=True),
        queue("high", json.dumps({R4090: 16}), priority=90000, reclaimable=True),
        queue("serve", json.dumps({R4090: 8}), priority=80000, reclaimable=False),
        podgroup("web", "Inqueue", queue_name="serve", owner_ref=RS),
    ]
    for n in nodes:
        obj = node(n.name, R4090, n.cards)
        obj["status"]["allocatable"]["cpu"] = str(n.cpu)
        obj["metadata"]["labels"]["pool"] = n.pool
        obj["spec"] = {"taints": [TAINT] if n.tainted else [], "unschedulable": n.cordoned}
        made.append(obj)
        if n.other:  # a pod of no PodGroup (a DaemonSet's, say): never a victim, its CPU stays taken
            made.append(
                pod(f"other-{n.name}", None, None, node_name=n.name, phase="Running", queue_name=None)
                | {"spec": {"nodeName": n.name, "containers": [container(None, 0, n.other)]}}
            )
    for g in gangs:
        where = "high" if g.may_give == "above" else "train"
        ref = owner("Job", g.name, f"uid-job-{g.name}", api="batch.volcano.sh/v1alpha1")
        made.append(podgroup(g.name, "Running", queue_name=where, owner_ref=ref))
        marks = {"volcano.sh/preemptable": "false"} if g.may_give == "protected" else {}
        for i, (on, cards, cpu) in enumerate(g.pods):
            made.append(
                pod(
                    f"{g.name}-{i}",
                    R4090,
                    cards,
                    node_name=on,
                    phase="Running",
                    queue_name=where,
                    group=g.name,
                    owner=ref,
                    annotations=marks,
                    spec={"containers": [container(GPU, cards, cpu)]},
                )
            )
            made[-1]["metadata"]["labels"] = {"job": g.name}
            ready = "False" if i < g.unready else "True"
            made[-1]["status"]["conditions"] = [{"type": "Ready", "status": ready}]
    return made + [waiting_pod(w) for w in waiting]


def budget_objects(gangs: Sequence[Gang]) -> list[dict[str, Any]]:
    """The namespace's PodDisruptionBudgets, as the API server shows them."""
    made = []
    for g in gangs:
        if g.budget is None:
            continue
        spec: dict[str, Any] = {
            "selector": {"matchLabels": {"job": g.name}},
            "maxUnavailable": g.budget.allowed,
        }
        if g.budget.spares_unready:
            spec["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
        status = {"disruptionsAllowed": g.budget.allowed, "observedGeneration": 1}
        names = [f"{g.name}-budget", *([f"{g.name}-again"] if g.budget.doubled else [])]
        made += [
            {"metadata": {"name": name, "namespace": "ns", "generation": 1}, "spec": spec, "status": status}
            for name in names
        ]
    return made


def container(resource: str | None, cards: int, cpu: int) -> dict[str, Any]:
    limits = {resource: str(cards)} if resource else {}
    requests = {"cpu": str(cpu)} if cpu else {}
    return {"name": "c", "image": "i", "resources": {"limits": limits, "requests": requests}}


def waiting_pod(w: Waiting) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "tolerations": [TOLERATION] if w.tolerates else [],
        "containers": [container(GPU, w.cards, w.cpu)],
    }
    if w.pool:
        spec["nodeSelector"] = {"pool": w.pool}
    return pod(w.name, R4090, w.cards, queue_name="serve", group="web", owner=RS, spec=spec)


# ---- the test's own rules ---------------------------------------------------------------------
def may_use(w: Waiting, n: Node) -> bool:
    return not n.cordoned and (w.pool is None or w.pool == n.pool) and (w.tolerates or not n.tainted)


def free_after(nodes: Sequence[Node], gangs: Sequence[Gang], gone: set[str]) -> dict[str, tuple[int, int]]:
    """Each node's free (cards, cores) once the gangs ``gone`` have left."""
    free = {n.name: [n.cards, n.cpu - n.other] for n in nodes}
    for g in gangs:
        if g.name not in gone:
            for on, cards, cpu in g.pods:
                free[on][0] -= cards
                free[on][1] -= cpu
    return {name: (cards, cpu) for name, (cards, cpu) in free.items()}


def all_fit(nodes: Sequence[Node], free: Mapping[str, tuple[int, int]], pods: Sequence[Waiting]) -> bool:
    """Some assignment of every pod, whole, to a node it may use, within its cards and its CPU
    (tried exhaustively)."""
    for choice in itertools.product(nodes, repeat=len(pods)):
        left = {name: list(room) for name, room in free.items()}
        for w, n in zip(pods, choice, strict=True):
            left[n.name][0] -= w.cards
            left[n.name][1] -= w.cpu
        if all(may_use(w, n) for w, n in zip(pods, choice, strict=True)) and all(
            cards >= 0 and cpu >= 0 for cards, cpu in left.values()
        ):
            return True
    return False


def plans(nodes: Sequence[Node], gangs: Sequence[Gang], waiting: Sequence[Waiting]) -> list[tidal.Plan]:
    return judged(nodes, gangs, waiting)[0]


def judged(
    nodes: Sequence[Node], gangs: Sequence[Gang], waiting: Sequence[Waiting]
) -> tuple[list[tidal.Plan], set[str]]:
    """The product's plans, each waiting pod's nodes read as the reclaimer reads them, and each
    gang a plan names judged by the budgets as the reclaimer judges it: the first refused is left
    out and the plans are made again, until no gang they name is refused; and the gangs left out."""
    made = objects(nodes, gangs, waiting)
    state = cluster(*made)
    places = {w.uid: placement.pod_place(waiting_pod(w)) for w in waiting}  # as read from the API server
    facts = state.nodebook.facts
    pods = {f"ns/{o['metadata']['name']}": o for o in made if o["kind"] == "Pod"}
    pdbs = budget_objects(gangs)

    def usable(uid: str) -> Any:
        return lambda name: placement.usable(facts[name], places[uid])

    excluded: set[str] = set()
    while True:
        found = tidal.solve_all(
            done(tidal.problems(state, lambda uid: True, excluded=excluded, usable=usable))
        )
        refused = next((key for p in found if (key := first_refused(p, pods, pdbs))), "")
        if not refused:
            return found, excluded
        assert refused not in excluded
        excluded.add(refused)


def first_refused(plan: tidal.Plan, pods: Mapping[str, Any], pdbs: list[dict[str, Any]]) -> str:
    """The first gang of ``plan`` its budgets refuse, each judged after those before it, or ""."""
    going: list[budgets.Member] = []
    for g in plan.victims or ():
        members = [budgets.member(key, pods[key]) for key in g.pods]
        if budgets.refusal(members, pdbs, going):
            return g.key
        going += members
    return ""


def test_a_pod_that_can_use_a_free_card_is_not_a_reason_to_evict_and_another_pods_nodes_are_its_own() -> None:
    """w0 may land anywhere and n1 has a free card; w1 may land only on n0 (pool b), which g0 holds.
    g0 goes for w1, not for w0; w0 is not refused for w1's selector either."""
    nodes = [Node("n0", 1, "b", False, False), Node("n1", 1, "a", False, False)]
    gangs = [Gang("g0", (("n0", 1, 0),), "yes")]
    waiting = [Waiting("w0", 1, None, False), Waiting("w1", 1, "b", False)]
    [plan] = plans(nodes, gangs, waiting)
    assert [g.key for g in plan.victims or ()] == ["ns/g0"] and plan.pods == ("uid-ns-w1",)


@settings(max_examples=1000, deadline=None)
@given(worlds())
def test_a_plan_evicts_only_what_its_pods_need_and_can_use(
    world: tuple[list[Node], list[Gang], list[Waiting]],
) -> None:
    nodes, gangs, waiting = world
    by_uid = {w.uid: w for w in waiting}
    made, refused = judged(nodes, gangs, waiting)
    event(f"gangs a budget refused: {min(len(refused), 2)}{' or more' if len(refused) > 1 else ''}")
    assert refused <= {f"ns/{g.name}" for g in gangs if g.kept_by_budget}, (refused, gangs)
    # And a plan whenever taking back helps (the pods share their nodes: one group, first in line
    # first): as many pods as every gang that may give, gone, lets fit, when that is more than fit
    # now; and CPU counted, so a plan for pods whose CPU the victims' leaving would not free is as
    # wrong as none for pods whose CPU it would.
    allowed = {g.name for g in gangs if g.may_give == "yes" and not g.kept_by_budget}

    def most(pods: Sequence[Waiting], gone: set[str]) -> int:
        return max(
            k for k in range(len(pods) + 1) if all_fit(nodes, free_after(nodes, gangs, gone), pods[:k])
        )

    now, best = most(waiting, set()), most(waiting, allowed)
    taking = [p for p in made if p.victims]
    event("victims help" if best > now else "victims do not help")
    cpu_free = [dataclasses.replace(w, cpu=0) for w in waiting]
    if (most(cpu_free, set()), most(cpu_free, allowed)) != (now, best):
        event("CPU decides")
    assert bool(taking) == (best > now), (now, best, made)
    if taking:
        assert taking[0].pods == tuple(w.uid for w in waiting[:best]), (now, best, taking)
    for plan in made:
        if not plan.victims:
            continue
        victims = {g.key.split("/")[1] for g in plan.victims}
        assert victims <= allowed, (victims, gangs)
        if any(g.budget is not None for g in gangs if g.name in victims):
            event("a gang its budget lets go is taken")
        named = [by_uid[uid] for uid in plan.pods]
        assert all_fit(nodes, free_after(nodes, gangs, victims), named), (victims, named)
        for one in victims:
            assert not all_fit(nodes, free_after(nodes, gangs, victims - {one}), named), (
                f"{sorted(victims)} for {[w.name for w in named]}: {one} is not needed"
            )

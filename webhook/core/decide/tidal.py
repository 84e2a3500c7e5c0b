"""Tidal reclaim, planned from the cache (SPEC §5e): which admitted pods wait for cards of their
model that no node has free, and which whole training gangs give them back.

``plan`` reads the state only: the serving replica evicts what it returns (``webhook.cluster.reclaimer``).
A beneficiary is a live pod of one card model, admitted (so counted) inside its queue's quota, that
no node holds yet, of service type inference, in a queue whose reclaim is not off; ``ready`` says
which have waited long enough. Per model, the queues are served highest priority first, each after
those before it: their pods all count in what must be placed, so cards already freeing (pods being
deleted, gangs evicted by an earlier pass) are never taken twice. Victims come from
``reclaim.victims``: whole gangs, same model, another reclaimable queue of lower priority, training.
"""

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TypeVar

from webhook.core.decide.reclaim_settings import min_runtime, mode_of, priority_of, reclaimable, service_of
from webhook.core.index import cohorts
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage, tree_usage
from webhook.core.model import keys, objects
from webhook.core.model.cards import CardName
from webhook.core.model.objects import PodTemplate
from webhook.core.model.reclaim import (
    INFERENCE,
    SEARCH_BUDGET,
    Budget,
    Gang,
    Size,
    card_count,
    freed,
    placeable,
    victims,
    why_not,
)
from webhook.core.model.steps import Steps, done
from webhook.core.model.values import value_class

T = TypeVar("T")
PASS_BUDGET = 200_000  # search steps of one pass over every model (``reclaim.Budget``)


@value_class
class Plan:
    """What one queue's pods waiting for ``card`` get: ``victims`` to evict (None: nothing that may
    be taken frees enough, ``why`` says so)."""

    card: CardName
    queue: str
    mode: str  # "on" or "dry-run"
    pods: tuple[str, ...]  # the beneficiaries, pod uids
    victims: tuple[Gang, ...] | None
    why: str = ""

    @property
    def cards(self) -> int:
        return sum(g.total for g in self.victims or ())


def lines(state: ClusterState) -> list[tuple[CardName, str]]:
    """The (model, queue) lines of unbound pods whose queue's reclaim is not off: read from the
    index of unbound pods by line, never by walking them."""
    modes: dict[str, str] = {}
    for _, queue in state.charged.unbound_lines.lines():
        if queue not in modes:
            modes[queue] = mode_of(state, queue)
    return sorted(line for line in state.charged.unbound_lines.lines() if modes[line[1]] != "off")


def newcomers(
    state: ClusterState, line: tuple[CardName, str], known: Container[str] = (), wanted: int | None = None
) -> list[str]:
    """Up to ``wanted`` pods of ``line`` not in ``known`` that may take back cards (live, of service
    type inference; any, when the line's queue takes back cards it lent), first in line first. A
    PodGroup's (or an owner's) pods are judged at once, so a line of training pods in front of a
    few inference pods costs a look per PodGroup."""
    out: list[str] = []
    # a lender inside its deserved whose lent cards are borrowed: any of its pods takes them back
    lent = bool(cohorts.reclaims_for(state, line[1], line[0]))
    for who, uids in state.charged.unbound_lines.line(line):
        # one look for a PodGroup's pods, or an owner's; a pod by pod look where the PodGroup they
        # name is not there (each then goes by its own owner)
        alike = lent or "/" not in who or who in state.podgroups
        if not lent and alike and _beneficiary(state, next(iter(uids))) != INFERENCE:
            continue
        for uid in uids:
            pod = state.pods.get(uid)
            if uid in known or pod is None or not pod.is_live:
                continue
            if not lent and not alike and _beneficiary(state, uid) != INFERENCE:
                continue
            out.append(uid)
            if wanted is not None and len(out) >= wanted:
                return out
    return out


def waiting(state: ClusterState, ready: Callable[[str], bool]) -> dict[CardName, dict[str, list[str]]]:
    """Per model and queue, every pod that may take back cards now (``ready``), first in line first."""
    out: dict[CardName, dict[str, list[str]]] = defaultdict(dict)
    for line in lines(state):
        uids = [uid for uid in newcomers(state, line) if ready(uid)]
        if uids:
            out[line[0]][line[1]] = uids
    return out


def _beneficiary(state: ClusterState, uid: str) -> str:
    """A waiting pod's service type as far as taking cards back goes: inference only when both its
    annotation (if any) and its owner's kind say so. The annotation is the tenant's to write; the
    kinds are the operator's table (``--service-types``), so a training job annotated inference
    takes nothing from others' training."""
    said = service_of(state, uid)
    return said if said != INFERENCE else service_of(state, uid, said_counts=False)


def may_take(state: ClusterState, queue: str) -> bool:
    """Whether any other queue could give cards back to ``queue``'s pods: reclaimable and of lower
    priority. When none is, nothing of its waiting pods is read or solved (no API reads, no search)."""
    if mode_of(state, queue) == "off":
        return False
    if cohorts.lends(state, queue):  # its pods may take back what its cohort borrows
        return True
    priority = priority_of(state, queue)
    return any(
        name != queue and info.record.priority < priority and reclaimable(state, name)
        for name, info in state.tree.queues.items()
    )


def inside_quota(state: ClusterState, queue: str, card: CardName) -> bool:
    """Whether the queue's use of ``card``, every pod counted, is within its quota, and its whole
    subtree's within each ancestor's quota that names ``card`` (SPEC §5e)."""
    info = state.tree.queues.get(queue)
    if info is None or info.quota is None or card not in info.quota:
        return False
    if queue_usage(state, queue).card(card).used > info.quota[card]:
        return False
    for ancestor in state.tree.ancestors.get(queue, ()):
        quota = state.tree.queues[ancestor].quota
        if quota and card in quota and tree_usage(state, ancestor).card(card).used > quota[card]:
            return False
    return True


def gangs(state: ClusterState, card: CardName, leaving: Collection[str]) -> list[Gang]:
    """The gangs holding bound cards of ``card`` that are not leaving already: a PodGroup's pods.
    A pod with no PodGroup the cache knows is never a victim (nothing would hold its cards for the
    pods they are taken for: its controller would re-create it at once), nor a gang holding other
    models too (evicting it whole would touch them)."""
    return done(_gangs(state, card, leaving, done(_nodes_of(state, card))))


def _gangs(
    state: ClusterState, card: CardName, leaving: Collection[str], nodes: Iterable[str]
) -> Steps[list[Gang]]:
    members: dict[str, set[str]] = defaultdict(set)
    for node in nodes:
        for uid in state.charged.on_node(node):
            charge, pod = state.charged.charge(uid), state.pods.get(uid)
            if charge is None or pod is None or charge.card != card or not charge.bound:
                continue
            key = charge.group
            if key and key in state.podgroups and key not in leaving and pod.is_live:
                members[key].add(uid)
        yield
    found: list[Gang] = []
    for key in list(members):
        held = members.pop(key)  # freed a step at a time, not all at the end
        uids = set(state.charged.in_group(key)) | held
        gang = _gang(state, key, uids, card)
        if gang is not None:
            found.append(gang)
        yield
    return found


def _nodes_of(state: ClusterState, card: CardName) -> Steps[dict[str, int]]:
    """Every node that has ``card``, and how many of it are free there (``FreeCards.nodes_of``)."""
    out: dict[str, int] = {}
    for node in state.free.nodes():
        free = state.free.free_of(node, card)
        if free is not None:
            out[node] = free
        yield
    return out


def _gang(state: ClusterState, key: str, uids: Iterable[str], card: CardName) -> Gang | None:
    cards: dict[str, int] = defaultdict(int)
    pods, priority, preemptable, queue, started = [], 0, True, "", 0.0
    for uid in sorted(uids):
        pod, charge = state.pods.get(uid), state.charged.charge(uid)
        if pod is None or not pod.is_live:  # a finished pod keeps its logs: never evicted
            continue
        pods.append(pod.key)
        priority = max(priority, pod.priority)
        started = max(started, pod.started)
        preemptable = preemptable and objects.preemptable(pod.template.annotations.get(keys.PREEMPTABLE))
        if charge is None:
            continue
        queue = queue or charge.queue
        if charge.bound and charge.card != card:
            return None  # it holds another model too
        if charge.bound:
            cards[pod.node_name] += charge.count
    group = state.podgroups.get(key)
    if group is not None:
        preemptable = preemptable and objects.preemptable(group.annotations.get(keys.PREEMPTABLE))
        queue = group.queue or queue
    first = next((uid for uid in sorted(uids) if uid in state.pods), None)
    if first is None:  # every pod of it gone since the reading saw it
        return None
    owner = state.workloads.by_uid.get(group.owner.uid) if group is not None and group.owner else None
    return Gang(
        ends=owner.evicted_ends if owner is not None else "",
        key=key,
        queue=queue,
        queue_priority=priority_of(state, queue),
        reclaimable=reclaimable(state, queue),
        service=service_of(state, first),
        preemptable=preemptable,
        priority=priority,
        created=group.created if group is not None else 0.0,
        card=card,
        cards=dict(cards),
        pods=tuple(pods),
        started=started,
        min_run=min_runtime(state, queue),
    )


def _freeing(
    state: ClusterState, card: CardName, leaving: Collection[str], nodes: Mapping[str, int]
) -> Steps[dict[str, int]]:
    """Each node's free cards of ``card``, counting those of pods being deleted and of the pods
    ``leaving`` (evicted, not yet seen going) as free already."""
    free: dict[str, int] = {}
    for node, count in nodes.items():  # ``nodes`` is the reading's own: nothing changes it
        for uid in state.charged.on_node(node):
            charge, pod = state.charged.charge(uid), state.pods.get(uid)
            if charge is None or pod is None or charge.card != card or not charge.bound:
                continue
            if pod.deletion_deadline is not None or pod.key in leaving:
                count += charge.count
        free[node] = count
        yield
    return free


@value_class
class Waiters:
    """One queue's pods waiting for a model, first in line first, and what each needs."""

    queue: str
    mode: str
    priority: int
    uids: tuple[str, ...]
    sizes: tuple[Size, ...]  # cards, or a room when other resources count (``Problem.free``)
    # the nodes of the model every one of them may land on; None: every node of the model
    nodes: frozenset[str] | None = None
    # the queues of its cohort borrowing the model while this one is inside its deserved: their
    # gangs give the lent cards back (decisions.md §33)
    borrowers: frozenset[str] = frozenset()


@value_class
class Problem:
    """One model's question, read from the state: everything ``solve`` needs, and nothing it has
    to ask the state for, so it can be answered off the thread that answers reviews."""

    card: CardName
    # each node's free cards, those already freeing counted; a room (cards, then each of ``asks``)
    # when a waiting pod asks other resources too
    free: Mapping[str, Size]
    candidates: tuple[Gang, ...]
    protected: int  # gangs a budget keeps out now
    queues: tuple[Waiters, ...]  # inside their quota, highest priority first
    now: float = math.inf  # when it was read (a gang's minimum run time is judged then)


def problems(
    state: ClusterState,
    ready: Callable[[str], bool],
    leaving: Collection[str] = (),
    excluded: Collection[str] = (),
    usable: Callable[[str], Callable[[str], bool]] | None = None,
    asking: Mapping[CardName, Mapping[str, list[str]]] | None = None,
    now: float = math.inf,
) -> Steps[list[Problem]]:
    """What to take back now, as questions, read in steps of a node, a gang or a pod each (the
    serving replica answers reviews between them). ``leaving``: the PodGroups (and pods,
    namespace/name) already evicted whose pods the cache may still show; ``excluded``: gangs not
    to take (a budget protects them); ``usable``: for a waiting pod (uid), which nodes it may be
    scheduled on (its nodeSelector, required affinity and tolerations against the node:
    ``placement.usable``); without it, every schedulable node; ``asking``: ``waiting``'s answer,
    read already (then ``ready`` only filters it). The state may change between two steps: each
    reads it afresh, so a question is as of its steps, as any plan is as of its reading."""
    out: list[Problem] = []
    if asking is None:
        asking = waiting(state, ready)
    else:
        asking = {c: {q: [u for u in us if ready(u)] for q, us in qs.items()} for c, qs in asking.items()}
    yield
    for card, queues in sorted(asking.items()):
        queues = {q: us for q, us in queues.items() if us}
        if not queues:
            continue
        nodes = yield from _nodes_of(state, card)
        every = yield from _gangs(state, card, leaving, nodes)
        kept: list[Gang] = []
        for some in _chunks(every):
            kept += [g for g in some if g.key not in excluded]
            yield
        candidates = tuple(kept)
        asked: list[Waiters] = []
        lenders = {q: cohorts.reclaims_for(state, q, card) for q in queues}
        for q in sorted(queues, key=lambda q: (-priority_of(state, q), q)):
            if not inside_quota(state, q, card):
                continue
            mode, priority = mode_of(state, q), priority_of(state, q)
            for where, uids in (yield from _alike(state, nodes, queues[q], usable)):
                sizes = tuple(_size(state, u) for u in uids)
                asked.append(Waiters(q, mode, priority, tuple(uids), sizes, where, lenders[q]))
                yield
        if asked:
            free: Mapping[str, Size] = yield from _freeing(state, card, leaving, nodes)
            free, candidates, roomed = yield from _with_rooms(state, free, candidates, tuple(asked), leaving)
            out.append(Problem(card, free, candidates, len(every) - len(candidates), roomed, now))
        del kept, candidates
        while every:  # the gangs read and not kept (replaced by their rooms' or left out) freed a few a step
            del every[-64:]
            yield
    return out


def asks(template: PodTemplate, cards: Collection[str]) -> dict[str, int]:
    """What a pod of ``template`` requests that a node must hold besides its cards: CPU
    (millicores), memory (bytes), and each resource not in ``cards`` (units, rounded up)."""
    resources = template.resources
    out = {name: n for name, n in (("cpu", resources.cpu), ("memory", resources.memory)) if n > 0}
    for name, value in resources.requests.items():
        if name not in cards and value > 0:
            out[name] = math.ceil(value)
    return out


def _with_rooms(
    state: ClusterState,
    free: Mapping[str, Size],
    candidates: tuple[Gang, ...],
    asked: tuple[Waiters, ...],
    leaving: Collection[str],
) -> Steps[tuple[Mapping[str, Size], tuple[Gang, ...], tuple[Waiters, ...]]]:
    """The problem as rooms when a waiting pod asks more than cards: each node's free cards, then
    what it has left of each such resource (allocatable less the requests of the live pods on it,
    those going already counted as gone), each gang with what its pods there give back, each pod
    with what it asks. As it was when none does."""
    card_resources = state.inventory.card_resources()
    pods = state.pods
    read: dict[int, dict[str, int]] = {}  # per template (pods of one controller share theirs)

    def asked_by(uid: str) -> dict[str, int]:
        pod = pods.get(uid)
        if pod is None:
            return {}
        found = read.get(id(pod.template))
        if found is None:
            found = read[id(pod.template)] = asks(pod.template, card_resources)
        return found

    for waiters in asked:  # the usual question is of cards alone: a loop with no call per pod
        for uid in waiters.uids:
            if (pod := pods.get(uid)) is not None and id(pod.template) not in read:
                read[id(pod.template)] = asks(pod.template, card_resources)
    names = sorted({name for each in read.values() for name in each})
    if not names:
        return free, candidates, asked
    yield
    wanted = {uid: asked_by(uid) for waiters in asked for uid in waiters.uids}
    gangs: set[str] = set()
    for some in _chunks(candidates):
        gangs.update(g.key for g in some)
        yield
    frees: dict[str, dict[str, list[int]]] = defaultdict(dict)
    rooms: dict[str, Size] = {}
    facts = state.nodebook.facts
    for node, cards in free.items():
        allocatable = facts[node].allocatable if node in facts else {}
        left = [allocatable.get(name, 0) for name in names]
        for uid in state.charged.on_node(node):
            pod = state.pods.get(uid)
            if pod is None or not pod.is_live or pod.key in leaving:
                continue
            group = f"{pod.namespace}/{pod.group_name}" if pod.group_name else ""
            if group in leaving:
                continue
            taken = asked_by(uid)
            used = [taken.get(name, 0) for name in names]
            left = [have - n for have, n in zip(left, used, strict=True)]
            if group in gangs:
                given = frees[group].setdefault(node, [0] * len(names))
                frees[group][node] = [have + n for have, n in zip(given, used, strict=True)]
        rooms[node] = (card_count(cards), *left)
        yield
    kept: list[Gang] = []
    for g in candidates:
        back = frees.pop(g.key, None)  # freed a step at a time, not all at the end
        kept.append(replace(g, frees={n: tuple(v) for n, v in back.items()}) if back is not None else g)
        yield
    sized: list[Waiters] = []
    for waiters in asked:
        sizes: list[Size] = []
        for pairs in _chunks(list(zip(waiters.uids, waiters.sizes, strict=True))):
            sizes += [(card_count(n), *(wanted[uid].get(name, 0) for name in names)) for uid, n in pairs]
            yield
        sized.append(replace(waiters, sizes=tuple(sizes)))
    return rooms, tuple(kept), tuple(sized)


def _alike(
    state: ClusterState,
    nodes: Mapping[str, int],
    uids: Sequence[str],
    usable: Callable[[str], Callable[[str], bool]] | None,
) -> Steps[list[tuple[frozenset[str] | None, list[str]]]]:
    """A queue's waiting pods grouped by the nodes they may land on (a Deployment's pods share
    them), in line order of each group's first pod: each group is placed on its own nodes, so a pod
    is never helped on a node only another may use, nor refused for another's constraints. The
    nodes are read once for each distinct test ``usable`` answers (pods of one template share one)."""
    facts = state.nodebook.facts
    schedulable: list[str] = []
    for some in _chunks(list(nodes)):
        schedulable += [n for n in some if (f := facts.get(n)) is None or f.schedulable]
        yield
    every = None if len(schedulable) == len(nodes) else frozenset(schedulable)
    if usable is None:
        return [(every, list(uids))] if uids else []
    read: dict[Callable[[str], bool], frozenset[str] | None] = {}  # keyed by the test itself
    groups: dict[frozenset[str] | None, list[str]] = {}
    for uid in uids:
        fits = usable(uid)
        if fits not in read:
            where: list[str] = []
            for some in _chunks(schedulable):
                where += [n for n in some if fits(n)]
                yield
            read[fits] = None if len(where) == len(nodes) else frozenset(where)
        groups.setdefault(read[fits], []).append(uid)
        yield
    return list(groups.items())


def _chunks(items: Sequence[T], size: int = 64) -> Iterable[Sequence[T]]:
    """``items`` a few at a time: a step of a reading tests a few nodes, not ten thousand."""
    return (items[i : i + size] for i in range(0, len(items), size))


def solve(problem: Problem, allowance: Budget | None = None) -> list[Plan]:
    """The plans of one model: per queue, highest priority first, each after those before it (their
    pods all count in what must be placed, so cards already freeing are never taken twice), as many
    of its pods as anything may free, first in line first. Every search spends ``allowance`` (the
    pass's); once it is spent, the queues left get no plan this pass."""
    allowance = allowance if allowance is not None else Budget(PASS_BUDGET)
    plans: list[Plan] = []
    chosen: list[Gang] = []
    needs: list[Size] = []
    card, free = problem.card, problem.free
    for asked in problem.queues:
        now_free = freed(free, chosen)
        before = needs if asked.nodes is None else []  # see ``_victims``
        if asked.nodes is None and placeable(now_free, [*needs, *asked.sizes]):
            needs += asked.sizes
            continue
        if asked.nodes is not None and placeable(_only(now_free, asked.nodes), asked.sizes):
            continue
        others = [g for g in problem.candidates if g not in chosen]

        if allowance.left <= 0:
            break
        search = partial(_victims, allowance, now_free, before, asked, others, card, problem.now)
        served, picked = _most(len(asked.uids), search)
        if served < len(asked.uids):  # the rest: nothing that may be taken frees enough for them
            rooms = any(not isinstance(size, int) for size in asked.sizes)
            why = _nothing(
                others,
                card,
                asked.queue,
                asked.priority,
                problem.protected,
                asked.nodes,
                rooms,
                asked.borrowers,
                problem.now,
            )
            plans.append(Plan(card, asked.queue, asked.mode, asked.uids[served:], None, why))
        if picked is not None:
            if asked.nodes is None:
                needs += asked.sizes[:served]
            chosen.extend(picked)
        if picked:
            plans.append(Plan(card, asked.queue, asked.mode, asked.uids[:served], picked))
    return plans


def _victims(
    allowance: Budget,
    free: Mapping[str, Size],
    needs: list[Size],
    asked: Waiters,
    others: list[Gang],
    card: CardName,
    now: float,
    count: int,
) -> tuple[Gang, ...] | None:
    """``reclaim.victims`` for the first ``count`` pods of ``asked`` besides ``needs``, its steps
    taken from ``allowance``. Pods that may land only on some nodes (``asked.nodes``) are placed
    there alone: the pods of the queues before them (placed anywhere) are not counted against those
    nodes, nor are those pods counted for later queues, so such a queue may get fewer victims than
    it needs this pass, never more (it is asked again the next)."""
    given = min(SEARCH_BUDGET, max(allowance.left, 0))
    budget = Budget(given)
    try:
        wanted = [*needs, *asked.sizes[:count]]
        return victims(
            free, wanted, others, card, asked.queue, asked.priority, budget, asked.nodes, asked.borrowers, now
        )
    finally:
        allowance.left -= given - max(budget.left, 0)


def _only(free: Mapping[str, Size], nodes: Collection[str]) -> dict[str, Size]:
    return {node: n for node, n in free.items() if node in nodes}


def _most(
    count: int, search: Callable[[int], tuple[Gang, ...] | None]
) -> tuple[int, tuple[Gang, ...] | None]:
    """The most pods, first in line first, that ``search`` finds victims for, and those victims
    (None: not even the first): by bisection, as helping ``n`` pods helps any fewer."""
    picked = search(count)
    if picked is not None:
        return count, picked
    low, high, best = 0, count - 1, None
    while low < high:
        middle = (low + high + 1) // 2
        found = search(middle)
        if found is not None:
            low, best = middle, found
        else:
            high = middle - 1
    return low, best if low > 0 else None


def plan(
    state: ClusterState,
    ready: Callable[[str], bool],
    leaving: Collection[str] = (),
    excluded: Collection[str] = (),
) -> list[Plan]:
    """What to take back now: ``problems`` read and solved at once."""
    return solve_all(done(problems(state, ready, leaving, excluded)))


def solve_all(asked: Iterable[Problem]) -> list[Plan]:
    """Every model's plans, on one pass's budget."""
    allowance = Budget(PASS_BUDGET)
    return [found for problem in asked for found in solve(problem, allowance)]


def _size(state: ClusterState, uid: str) -> int:
    charge = state.charged.charge(uid)
    return charge.count if charge is not None else 0


def _nothing(
    others: list[Gang],
    card: CardName,
    queue: str,
    priority: int,
    protected: int = 0,
    nodes: frozenset[str] | None = None,
    rooms: bool = False,
    borrowers: frozenset[str] = frozenset(),
    now: float = math.inf,
) -> str:
    """Why no gang frees the cards: each reason, with how many gangs it keeps out (``rooms``: the
    pods ask CPU, memory or other resources a node must hold too)."""
    if nodes is not None and not nodes:
        return (
            f"no node with {card} is one the pods may be scheduled on (cordoned, a taint they do not"
            " tolerate, or their nodeSelector or required node affinity)"
        )
    reasons = Counter(
        why_not(g, card, queue, priority, borrowers, now)
        or (
            "it holds no card on a node the pods may be scheduled on"
            if nodes is not None and not nodes & set(g.cards)
            else ""
        )
        or (
            "together they free too few cards, or too little of the CPU, memory or other resources"
            " the pods ask, on the nodes they may use"
            if rooms
            else "together they free too few"
        )
        for g in others
    )
    if protected:
        reasons["a PodDisruptionBudget forbids evicting it now"] += protected
    if not reasons:
        return f"no running pod holds {card}"
    return "; ".join(f"{n} gang{'s' if n > 1 else ''}: {why}" for why, n in sorted(reasons.items()))

"""Tidal reclaim (SPEC §5e): the edge of ``core.tidal``, run by the serving replica.

Every ``interval`` seconds, while this replica serves, it asks the core which admitted pods wait for
cards of their model that no node has free (for ``after`` seconds at least) and which whole training
gangs give them back. A gang is evicted whole or not at all: every pod of it is first evicted with
``dryRun`` (the API server answers as it would, PodDisruptionBudgets included), and only when none is
refused are they evicted for real, each with its own grace period. A gang a budget protects is
reported and left out for ``PROTECTED_FOR`` seconds; the next pass picks others.

A reclaim in flight is not repeated: its gang is "leaving" (its cards count as freeing) until its
pods are gone, and the state holds what was taken (``state.reclaims``), so the enqueue gate keeps
the evicted PodGroup Pending while the pods its cards went to wait unbound. Every reclaim is told
by an Event on the victim's PodGroup (and its Volcano Job) and on each beneficiary pod, and counted;
a dry run (the cluster's setting or the queue's) only reports, once a minute per queue and model.
"""

import asyncio
import gc
import json
import logging
import multiprocessing
import os
import pickle
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import replace
from itertools import islice, zip_longest
from typing import Any, TypeVar

from webhook.cluster import cache, events, workers
from webhook.core.decide import reclaim_holds, reclaim_settings, tidal
from webhook.core.index.state import ClusterState
from webhook.core.model import budgets, keys, placement
from webhook.core.model.cards import CardName, amount
from webhook.core.model.objects import eviction_notice, moment, reclaim_text
from webhook.core.model.reclaim import Gang, Taken
from webhook.core.model.steps import Steps
from webhook.core.model.values import value_class

log = logging.getLogger(__name__)
PODGROUPS = next(k for k in cache.KINDS if k.plural == "podgroups")
BUDGETS = cache.Kind("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets")  # read, never cached
RECLAIMED = "CardQuotaReclaimed"
NOTICE = "CardQuotaReclaimNotice"  # a gang told, its queue's notice before its eviction
DEFAULT_GRACE = 30.0  # seconds: a pod's terminationGracePeriodSeconds when it sets none
RECLAIMING = "CardQuotaReclaiming"
NOT_RECLAIMED = "CardQuotaNotReclaimed"
PROTECTED_FOR = 60.0  # seconds a gang a PodDisruptionBudget protects is left out
TELL_EVERY = 60.0  # seconds between two reports to one pod of a dry run or a blocked reclaim
HOLD_FOR = 300.0  # seconds at most the cards stay held for the beneficiaries (victims' grace included)
RETRY_EVERY = 2.0  # seconds between two tries of the pods of a begun gang not evicted yet
LEARN_EVERY = 10.0  # seconds a waiting pod's object, read from the API server, is trusted
LEARN_PER_PASS = 25  # waiting pods read from the API server in one pass at most
WINDOW = 500  # pods of one line (model and queue) a pass considers, first in line first
SLICE = 0.0001  # seconds of reading a pass's questions between two chances for reviews to be answered
MAX_HOLDS = 10_000  # gangs whose freed cards are held at once (each for 300 s at most)
BACK_OFF = 600.0  # seconds a pod the cards of a reclaim did not help waits before it may have more


T = TypeVar("T")
Solve = Callable[[list[tidal.Problem]], Awaitable[list[tidal.Plan]]]


async def in_thread(asked: list[tidal.Problem]) -> list[tidal.Plan]:
    """Solve a pass's questions in a worker thread: off the loop, but sharing the interpreter's
    lock with it (reviews wait up to its switch interval meanwhile)."""
    return await asyncio.to_thread(tidal.solve_all, asked)


class InProcess:
    """Solve a pass's questions in a process of its own, started at the first pass (spawned: it
    shares nothing with the serving process but the questions it is sent, and never the lock
    the loop that answers reviews and renews the Lease runs under). A worker that died is started
    again at the next pass."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def __call__(self, asked: list[tidal.Problem]) -> list[tidal.Plan]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_solver,
            )
        packed = [await _packed(problem) for problem in asked]
        try:
            solving = asyncio.get_running_loop().run_in_executor(self._pool, _solve_packed, packed)
            return await asyncio.wait_for(solving, SOLVE_DEADLINE)
        except BrokenProcessPool as exc:
            self._pool = None
            raise cache.Unavailable(f"the reclaim solver's process died: {exc}") from exc
        except TimeoutError as exc:  # its search is budgeted: a worker this late is stuck
            self.close()
            raise cache.Unavailable(f"the reclaim solver did not answer in {SOLVE_DEADLINE:g} s") from exc

    def close(self) -> None:
        """Stop the worker now, whatever it is solving (a worker left running would outlive this
        process's exit; one stuck would never end)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list((getattr(pool, "_processes", None) or {}).values()):  # none public before 3.14
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def _solver() -> None:
    """In the solver's process, first: background work (on a busy node the loop's thread goes
    first), and gone as soon as the server is."""
    os.nice(NICE)
    workers.die_with_parent()


Packed = tuple[bytes, list[bytes], list[bytes]]  # a question, its free cards and its gangs, pickled
NICE = 10  # the solver's process's niceness, added to the server's
SOLVE_DEADLINE = 30.0  # seconds a pass's search may take in its process (budgeted: under 5 s at 100,000 pods)
PIECE = 16  # gangs (or 25 times as many nodes) pickled at once on the loop


async def _packed(problem: tidal.Problem) -> Packed:
    """``problem`` pickled a piece at a time, giving the loop back between pieces: pickled whole,
    5,000 gangs and 10,000 nodes held the loop 30 ms (the pool's feeder thread would hold the
    interpreter's lock as long); pieces of bytes go to the worker as they are."""
    items = iter(problem.free.items())  # the question's own map: nothing changes it meanwhile
    frees: list[bytes] = []
    while piece := list(islice(items, PIECE * 25)):
        frees.append(pickle.dumps(piece))
        await asyncio.sleep(0)
    gangs: list[bytes] = []
    for i in range(0, len(problem.candidates), PIECE):
        gangs.append(pickle.dumps(problem.candidates[i : i + PIECE]))
        await asyncio.sleep(0)
    return pickle.dumps(replace(problem, free={}, candidates=())), frees, gangs


def _solve_packed(packed: list[Packed]) -> list[tidal.Plan]:
    """``tidal.solve_all`` of questions ``_packed`` (run in the worker)."""
    asked = [
        replace(
            pickle.loads(head),
            free=dict(pair for piece in frees for pair in pickle.loads(piece)),
            candidates=tuple(gang for piece in gangs for gang in pickle.loads(piece)),
        )
        for head, frees, gangs in packed
    ]
    return tidal.solve_all(asked)


@value_class
class Flight:
    """A gang being evicted: its pods (namespace/name) leave, its cards go to ``plan``'s pods."""

    gang: Gang
    plan: tidal.Plan
    since: float
    uids: frozenset[str]  # its pods when evicted


class Reclaimer:
    def __init__(
        self,
        state: ClusterState,
        transport: cache.Transport,
        serving: Callable[[], bool],
        interval: float = 0.5,
        after: float = 1.0,
        clock: Callable[[], float] = time.time,
        on_reclaim: Callable[[str, str, str, int], None] = lambda queue, card, outcome, cards: None,
        on_bound: Callable[[str, str, float], None] = lambda queue, card, seconds: None,
        solve: Solve = in_thread,
    ) -> None:
        self.state, self.transport, self.serving = state, transport, serving
        self.interval, self.after, self.clock = interval, after, clock
        self.on_reclaim, self.on_bound, self.solve = on_reclaim, on_bound, solve
        self.flights: dict[str, Flight] = {}  # gang key -> its eviction
        # per line (model, queue), the pods a pass considers, first in line first: uid -> first seen
        self._window: dict[tuple[CardName, str], dict[str, float]] = {}
        self._protected: dict[str, float] = {}  # gang key -> until when a budget keeps it out
        self._told: dict[tuple[str, str], float] = {}  # (pod uid, card) -> its last report
        self._done: list[str] = []  # PodGroups whose hold is over, their marks to remove
        # gang key -> its pods (namespace/name) not evicted yet, and when to try them again
        self._rest: dict[str, tuple[list[str], float]] = {}
        # waiting pod uid -> what the API server shows of it (the cache keeps none of it), until when
        self._learned: dict[str, tuple[placement.PodPlace, float]] = {}
        self._back: dict[str, float] = {}  # pod uid -> until when it backs off (a reclaim did not help)
        # pod uid -> until when the windows pass it over (it waits for something else, or backs off)
        self._passed: dict[str, float] = {}
        # PodGroup -> until when its gang, begun by an earlier leader (its mark), is finished here,
        # and the uids of its pods live at adoption (the pods of that gang; none made since)
        self._adopted: dict[str, tuple[float, frozenset[str]]] = {}
        self._tests: dict[str, Callable[[str], bool]] = {}  # ``_usable``'s node tests, for one pass
        self._graces: dict[str, float] = {}  # gang key -> its pods' longest grace period, as judged
        self._noticed: set[str] = set()  # gangs told of their eviction, not evicted yet
        self._called_off: list[str] = []  # gangs told, their eviction no longer wanted

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self.serving():
                try:
                    await self.once()
                except cache.Unavailable as exc:
                    log.warning("tidal reclaim: the API server is unavailable", extra={"error": str(exc)})
                except Exception:  # a bug must not stop reclaim for good, nor the cache beside it
                    log.exception("tidal reclaim: a pass failed; the next one starts afresh")

    async def once(self) -> None:
        now = self.clock()
        self._tests = {}
        self._land(now)
        while self._called_off:
            await self._call_off(self._called_off.pop())
        while self._done:  # holds over: their marks go
            await self._mark(self._done.pop(), None)
        self._adopted = {k: adopted for k, adopted in self._adopted.items() if now < adopted[0]}
        await self._finish(now)
        self._protected = {key: until for key, until in self._protected.items() if until > now}
        asking = self._asking(now)
        await asyncio.sleep(0)  # each piece of a pass gives the loop back: reviews wait for none whole
        await self._learn(asking, now)
        await asyncio.sleep(0)

        def ready(uid: str) -> bool:
            return uid in self._learned and self._learned[uid][0].unschedulable

        leaving: set[str] = set()
        for flight in self.flights.values():
            leaving.add(flight.gang.key)
            leaving.update(flight.gang.pods)
        for key in sorted(self.state.groups.marked):  # an earlier leader's reclaim, still held
            if (held := reclaim_holds.holding(self.state, key, now)) is not None:
                leaving.add(key)
                if key not in self.flights and key not in self._adopted:
                    self._adopt(key, held.until, now, held.evict)
        leaving.update(key for key in self._adopted if key in self._rest)  # being finished here
        with _collector_waits():
            reading = tidal.problems(
                self.state, ready, leaving, set(self._protected), self._usable, asking, now
            )
            asked = await _in_slices(reading)
            # The search runs beside the loop that answers reviews and renews the Lease; it reads
            # only the questions, never the state the cache keeps changing meanwhile.
            plans = await self.solve(asked) if asked else []
            await _let_go(asked)
        for plan in plans:
            if not self.serving():
                return  # another replica serves now: it plans afresh
            if plan.victims is None:
                await self._tell_blocked(plan, now)
            elif plan.mode == "dry-run":
                await self._tell_dry_run(plan, now)
            else:
                await self._reclaim(plan, now)

    def _asking(self, now: float) -> dict[CardName, dict[str, list[str]]]:
        """Per model and queue, the pods of its window that waited ``after`` seconds. A line's window
        keeps its pods until they are bound or gone, and takes newcomers up to ``WINDOW``: a pass
        reads a few hundred pods of a line, never every unbound pod. A pod read as not unschedulable
        (it waits for something else), or backing off, leaves the window until that ends, and the
        ones behind it take its place."""
        self._passed = {uid: until for uid, until in self._passed.items() if until > now}
        for uid, (place, until) in self._learned.items():
            if not place.unschedulable and until > now:
                self._passed[uid] = until
        for uid, until in self._back.items():  # only those not over (``_land`` keeps no other)
            self._passed[uid] = max(until, self._passed.get(uid, 0.0))
        windows: dict[tuple[CardName, str], dict[str, float]] = {}
        out: dict[CardName, dict[str, list[str]]] = {}
        takes: dict[str, bool] = {}
        for line in tidal.lines(self.state):
            card, queue = line
            if queue not in takes:
                takes[queue] = tidal.may_take(self.state, queue)
            if not takes[queue]:  # no other queue could give to it: nothing read, nothing solved
                continue
            kept = {
                uid: at
                for uid, at in self._window.get(line, {}).items()
                if uid not in self._passed and self._in_line(uid, line)
            }
            if len(kept) < WINDOW:
                known = kept.keys() | self._passed.keys()
                kept.update(
                    (uid, now) for uid in tidal.newcomers(self.state, line, known, WINDOW - len(kept))
                )
            windows[line] = kept
            ripe = [uid for uid, at in kept.items() if now - at >= self.after]
            if ripe:
                out.setdefault(card, {})[queue] = ripe
        self._window = windows
        return out

    def _in_line(self, uid: str, line: tuple[CardName, str]) -> bool:
        """Whether the pod ``uid`` still waits unbound in ``line`` (live, charged that model and queue)."""
        charge, pod = self.state.charged.charge(uid), self.state.pods.get(uid)
        return (
            charge is not None
            and pod is not None
            and pod.is_live
            and not charge.bound
            and (charge.card, charge.queue) == line
        )

    async def _learn(self, waiting: Mapping[Any, Mapping[str, list[str]]], now: float) -> None:
        """Read from the API server the waiting pods not read lately (at most ``LEARN_PER_PASS``, the
        lines in turn, each first in line first): whether the scheduler found no node for them, and
        where they may land."""
        lines = [pods for queues in waiting.values() for pods in queues.values()]
        self._learned = {uid: self._learned[uid] for pods in lines for uid in pods if uid in self._learned}
        due = [
            [uid for uid in pods if uid not in self._learned or self._learned[uid][1] <= now]
            for pods in lines
        ]
        turns = (uid for each in zip_longest(*due) for uid in each if uid is not None)  # a line each in turn
        for uid in islice(turns, LEARN_PER_PASS):
            pod = self.state.pods.get(uid)
            if pod is None:
                continue
            found = await self.transport.get(cache.PODS, pod.namespace, pod.name)
            if found is not None:
                self._learned[uid] = (placement.pod_place(found), now + LEARN_EVERY)

    def _usable(self, uid: str) -> Callable[[str], bool]:
        """Which nodes the waiting pod ``uid`` may land on, as the scheduler's filters read them:
        one test for all the pods that ask alike this pass (a Deployment's), so their nodes are
        read once."""
        if uid not in self._learned:
            return _anywhere
        place = self._learned[uid][0]
        key = json.dumps([place.selector, place.terms, place.tolerations], sort_keys=True, default=str)
        test = self._tests.get(key)
        if test is None:
            facts = self.state.nodebook.facts

            def test(node: str) -> bool:
                return (f := facts.get(node)) is None or placement.usable(f, place)

            self._tests[key] = test
        return test

    def _land(self, now: float) -> None:
        """Forget the flights whose gangs are gone, and the holds whose pods are bound or gone,
        timing each beneficiary from its first wait to its binding."""
        for key, flight in list(self.flights.items()):
            there = any(uid in self.state.pods and self.state.pods[uid].is_live for uid in flight.uids)
            if not there or now - flight.since > HOLD_FOR:
                del self.flights[key]
        for key, taken in list(self.state.reclaims.items()):
            if reclaim_holds.holding(self.state, key, now) is None:
                del self.state.reclaims[key]
                if key in self._noticed:  # its notice still running: the pods it was for need it no more
                    self._called_off.append(key)
                group = self.state.podgroups.get(key)
                if group is not None and group.uid == taken.group_uid:  # not a new group of that name
                    self._done.append(key)
                for uid in taken.for_pods:
                    pod = self.state.pods.get(uid)
                    window = next((w for w in self._window.values() if uid in w), None)
                    if pod is not None and pod.node_name and window is not None:
                        self.on_bound(taken.queue, taken.card, now - window.pop(uid))
                    elif pod is not None and not pod.node_name:  # the cards did not help it: back off
                        self._back[uid] = now + BACK_OFF
                        log.warning(
                            "tidal reclaim: a pod was not bound after a reclaim", extra={"pod": pod.key}
                        )
        self._back = {uid: until for uid, until in self._back.items() if until > now}

    async def _reclaim(self, plan: tidal.Plan, now: float) -> None:
        """Evict the plan's gangs, each whole: every gang is judged before any is touched, and one
        that would not go whole leaves the plan undone (the set no longer places its pods); the
        next pass plans without it."""
        assert plan.victims is not None
        if len(self.state.reclaims) + len(plan.victims) > MAX_HOLDS:
            log.warning("tidal reclaim: too many holds at once; this plan waits", extra={"queue": plan.queue})
            return
        going: list[
            budgets.Member
        ] = []  # the pods of the gangs judged so far: their budgets see them go first
        for gang in plan.victims:
            refused = await self._refusal(gang, going)
            if refused:
                self._protected[gang.key] = now + PROTECTED_FOR
                self.on_reclaim(plan.queue, plan.card, "protected", gang.total)
                message = (
                    f'not evicted for queue "{plan.queue}"\'s pods waiting for {plan.card}: {refused};'
                    f" it is left alone for {PROTECTED_FOR:g} s, none of its pods evicted"
                )
                log.warning("tidal reclaim: a gang is protected", extra={"gang": gang.key, "why": refused})
                await self._gang_event(gang.key, NOT_RECLAIMED, message, "Warning")
                return
        for gang in plan.victims:
            if not self.serving():
                return
            await self._evict(gang, plan, now)

    async def _mark(self, key: str, text: str | None) -> None:
        """Write (or with None remove) the reclaim mark on a PodGroup: the hold survives a failover."""
        group = self.state.podgroups.get(key)
        if group is None:
            return
        try:
            await self.transport.annotate(PODGROUPS, group.namespace, group.name, {keys.RECLAIMED: text})
        except cache.Unavailable as exc:
            log.warning("could not write a reclaim mark", extra={"podgroup": key, "error": str(exc)})

    async def _refusal(self, gang: Gang, going: list[budgets.Member]) -> str:
        """Why evicting ``gang`` whole would be refused now, or "": its namespace's
        PodDisruptionBudgets judged for every pod of it at once (each eviction alone would pass
        where the budget allows one), after the pods of the plan's gangs judged before it
        (``going``, to which its own are added when it passes: one budget over two gangs sees
        both go), then a dry run of each pod (anything else the API server would refuse)."""
        try:
            namespace = gang.pods[0].partition("/")[0] if gang.pods else ""
            found = [await self.transport.get(cache.PODS, *key.split("/", 1)) for key in gang.pods]
            members = [budgets.member(key, pod) for key, pod in zip(gang.pods, found, strict=True) if pod]
            self._graces[gang.key] = max((_grace(pod) for pod in found if pod), default=DEFAULT_GRACE)
            before = [m for m in going if m.key.partition("/")[0] == namespace]
            refused = budgets.refusal(members, await self.transport.list_in(BUDGETS, namespace), before)
            if refused:
                return refused
            for key in gang.pods:
                namespace, _, name = key.partition("/")
                refused = await self.transport.evict(namespace, name, dry_run=True)
                if refused:
                    return f"evicting pod {key} is refused: {refused}"
        except cache.Unavailable as exc:
            return f"the API server did not answer for it ({exc})"
        going.extend(members)
        return ""

    async def _evict(self, gang: Gang, plan: tidal.Plan, now: float) -> None:
        """Take ``gang`` for ``plan``: its hold mark first (a new leader holds it too), then the
        notice on each of its pods (when it is evicted, when killed), then its eviction: now, or
        once its queue's notice has run (``reclaim_settings.notice``), told by an Event meanwhile."""
        named = set(gang.pods)
        members = self.state.charged.in_group(gang.key) or self.state.pods
        uids = frozenset(
            uid for uid in members if uid in self.state.pods and self.state.pods[uid].key in named
        )
        notice = reclaim_settings.notice(self.state, gang.queue)
        evict = now + notice
        self.flights[gang.key] = Flight(gang, plan, evict, uids)
        group = self.state.podgroups.get(gang.key)
        uid = group.uid if group is not None else ""
        deadline = evict + self._graces.pop(gang.key, DEFAULT_GRACE)
        taken = Taken(
            plan.card,
            gang.total,
            plan.queue,
            plan.pods,
            evict + HOLD_FOR,
            uid,
            evict=evict,
            deadline=deadline,
        )
        self.state.reclaims[gang.key] = taken
        await self._mark(gang.key, reclaim_text(taken))  # first: a new leader holds it too
        told = eviction_notice(taken)
        for key in gang.pods:
            namespace, _, name = key.partition("/")
            try:
                await self.transport.annotate(cache.PODS, namespace, name, {keys.EVICTING: told})
            except cache.Unavailable as exc:
                log.warning("could not write an eviction notice", extra={"pod": key, "error": str(exc)})
        self._rest[gang.key] = (list(gang.pods), evict)
        if notice:
            self._noticed.add(gang.key)
            await self._gang_event(
                gang.key,
                NOTICE,
                f'{amount(gang.total)} {plan.card} are taken back for queue "{plan.queue}", whose pods'
                f" {self._names(plan)} wait for them: its {len(gang.pods)} pods are evicted at"
                f' {moment(evict)} (in {notice:g} s, queue "{gang.queue}"\'s {keys.RECLAIM_NOTICE}),'
                f" killed at {moment(deadline)} if still running",
                "Warning",
            )
            return
        await self._begin(gang.key, now)

    async def _call_off(self, key: str) -> None:
        """A gang told of its eviction whose cards are no longer wanted before it began (the pods
        they were for are bound or gone): it keeps running, its pods' notices removed, told so."""
        self._noticed.discard(key)
        self._rest.pop(key, None)
        flight = self.flights.pop(key, None)
        if flight is None:
            return
        for pod in flight.gang.pods:
            namespace, _, name = pod.partition("/")
            try:
                await self.transport.annotate(cache.PODS, namespace, name, {keys.EVICTING: None})
            except cache.Unavailable as exc:
                log.warning("could not remove an eviction notice", extra={"pod": pod, "error": str(exc)})
        log.info("tidal reclaim: an eviction called off", extra={"gang": key})
        await self._gang_event(
            key,
            NOTICE,
            f'its eviction is called off: the pods of queue "{flight.plan.queue}" it was for no longer'
            " wait for its cards",
        )

    async def _begin(self, key: str, now: float) -> None:
        """Evict the pods of the gang ``key`` whose notice has run, and tell both sides."""
        self._noticed.discard(key)
        if not await self._go_on(key, now):
            return  # another replica serves now; the mark tells it this gang goes
        flight, taken = self.flights.get(key), self.state.reclaims.get(key)
        if flight is None or taken is None:
            return  # an earlier leader's: it told them
        gang, plan = flight.gang, flight.plan
        self.on_reclaim(plan.queue, plan.card, "evicted", gang.total)
        beneficiaries = self._names(plan)
        nodes = ", ".join(sorted(gang.cards))
        priority = reclaim_settings.priority_of(self.state, plan.queue)
        log.info(
            "tidal reclaim: evicted a gang",
            extra={"gang": gang.key, "card": plan.card, "cards": gang.total, "for": beneficiaries},
        )
        await self._gang_event(
            gang.key,
            RECLAIMED,
            f'{amount(gang.total)} {plan.card} on {nodes} taken back for queue "{plan.queue}"'
            f" (priority {priority}), whose pods {beneficiaries} wait for"
            f" them: its {len(gang.pods)} pods are evicted whole (killed at {moment(taken.deadline)} if"
            f" still running); it is enqueued again once those are bound,"
            f' as queue "{gang.queue}"\'s quota allows',
            "Warning",
        )
        for uid in plan.pods:
            pod = self.state.pods.get(uid)
            if pod is None:
                continue
            involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
            message = (
                f'takes back {amount(gang.total)} {plan.card} from {_what(gang)} (queue "{gang.queue}",'
                f" priority {gang.queue_priority}): its {len(gang.pods)} pods are evicted"
            )
            await events.tell(self.transport, pod.namespace, involved, RECLAIMING, message)

    async def _go_on(self, key: str, now: float) -> bool:
        """Evict the pods of the begun gang ``key`` not evicted yet, one by one while this replica
        serves. A pod refused (a budget changed since the judgement, the API server throttling or
        failing) stays to be tried again in ``RETRY_EVERY`` seconds: a gang whose eviction began
        is finished, never left half. False when the replica stopped serving."""
        rest, _ = self._rest.pop(key, ([], now))
        left: list[str] = []
        for pod in rest:
            if not self.serving():
                log.warning("tidal reclaim: no longer serving mid-gang", extra={"gang": key})
                return False
            namespace, _, name = pod.partition("/")
            try:
                refused = await self.transport.evict(namespace, name)
            except cache.Unavailable as exc:
                refused = str(exc)
            if refused:
                log.warning(
                    "tidal reclaim: an eviction is to be tried again", extra={"pod": pod, "why": refused}
                )
                left.append(pod)
        if left:
            self._rest[key] = (left, now + RETRY_EVERY)
        return True

    def _adopt(self, key: str, until: float, now: float, evict: float = 0.0) -> None:
        """An earlier leader's reclaim, its mark on PodGroup ``key``: its gang's eviction began, so
        this replica finishes it, the pods of it still live, until the mark's hold ends (``until``)
        even once the pods it was for are bound (a gang is never left half), and holds what it
        took meanwhile."""
        live = [
            pod
            for uid in self.state.charged.in_group(key)
            if (pod := self.state.pods.get(uid)) is not None and pod.is_live
        ]
        self._adopted[key] = (until, frozenset(pod.uid for pod in live))
        rest = sorted(pod.key for pod in live)
        if rest:
            log.info(
                "tidal reclaim: finishing an earlier leader's reclaim", extra={"gang": key, "pods": rest}
            )
            self._rest[key] = (rest, max(now, evict))  # its notice runs out first

    async def _finish(self, now: float) -> None:
        """Try again the pods of begun gangs that are still there; report a gang its hold outlived."""
        for key, (rest, due) in list(self._rest.items()):
            adopted = self._adopted.get(key)
            live = {
                pod.key
                for uid in self.state.charged.in_group(key)
                if (pod := self.state.pods.get(uid)) is not None
                and pod.is_live
                and (adopted is None or uid in adopted[1])  # a pod made since is not of the gang
            }
            ours = key in self.flights or adopted is not None
            rest = [pod for pod in rest if pod in live]
            if not ours or not rest:
                del self._rest[key]
                if not ours and rest:
                    message = f"its pods {', '.join(rest)} could not be evicted before the hold ended"
                    log.warning("tidal reclaim: a gang left partly evicted", extra={"gang": key})
                    await self._gang_event(key, NOT_RECLAIMED, message, "Warning")
                continue
            self._rest[key] = (rest, due)
            if now >= due:
                await (self._begin(key, now) if key in self._noticed else self._go_on(key, now))

    async def _tell_blocked(self, plan: tidal.Plan, now: float) -> None:
        due = self._due(plan, now)
        if not due:
            return
        self.on_reclaim(plan.queue, plan.card, "nothing to take", 0)
        message = f"no card of {plan.card} can be taken back for it: {plan.why}"
        for uid in due:
            pod = self.state.pods.get(uid)
            if pod is not None:
                involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
                await events.tell(self.transport, pod.namespace, involved, NOT_RECLAIMED, message)

    async def _tell_dry_run(self, plan: tidal.Plan, now: float) -> None:
        due = self._due(plan, now)
        if not due:
            return
        self.on_reclaim(plan.queue, plan.card, "dry run", plan.cards)
        victims = ", ".join(f"{_what(g)} ({amount(g.total)} {plan.card})" for g in plan.victims or ())
        log.info("tidal reclaim (dry run): would evict", extra={"queue": plan.queue, "victims": victims})
        for uid in due:
            pod = self.state.pods.get(uid)
            if pod is not None:
                involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
                await events.tell(
                    self.transport, pod.namespace, involved, RECLAIMING, f"dry run: would take back {victims}"
                )

    def _due(self, plan: tidal.Plan, now: float) -> list[str]:
        """The pods of ``plan`` to tell now: each at most once a minute, a newcomer at once."""
        if len(self._told) > len(self.state.pods):  # the pods gone are forgotten
            self._told = {k: at for k, at in self._told.items() if now - at < TELL_EVERY}
        due = [uid for uid in plan.pods if now - self._told.get((uid, plan.card), -TELL_EVERY) >= TELL_EVERY]
        for uid in due:
            self._told[(uid, plan.card)] = now
        return due

    def _names(self, plan: tidal.Plan) -> str:
        names = [self.state.pods[uid].key for uid in plan.pods if uid in self.state.pods]
        return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")

    async def _gang_event(self, key: str, reason: str, message: str, kind: str = "Normal") -> None:
        group = self.state.podgroups.get(key)
        if group is not None:
            await events.tell_group(self.transport, group, reason, message, kind)


@contextmanager
def _collector_waits() -> Iterator[None]:
    """The garbage collector waits while a pass's questions are alive: tens of thousands of objects
    (a gang, its pods, its nodes) that live through the reading and die together by their reference
    counts when the pass has its plans. A collection meanwhile scans them all, again and again as
    they age (1 to 3 ms each, a review waiting that long: performance.md); after, they are gone."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


async def _let_go(asked: list[tidal.Problem]) -> None:
    """Free a pass's questions a few gangs at a time: dropped at once, 5,000 gangs and their pods
    and nodes took 4 ms to free, a review waiting as long."""
    gangs = [gang for problem in asked for gang in problem.candidates]
    asked.clear()
    while gangs:
        del gangs[-PIECE * 4 :]
        await asyncio.sleep(0)


async def _in_slices(steps: Steps[T]) -> T:
    """Take ``steps`` to their end, giving the loop back every ``SLICE`` seconds: a review that
    arrives meanwhile waits for one slice, not for the whole reading."""
    until = time.perf_counter() + SLICE
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]
        if time.perf_counter() >= until:
            await asyncio.sleep(0)
            until = time.perf_counter() + SLICE


def _grace(pod: Mapping[str, Any]) -> float:
    """A pod's grace period when evicted (seconds), as the API server reads it."""
    grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return (
        float(grace)
        if isinstance(grace, int | float) and not isinstance(grace, bool) and grace >= 0
        else DEFAULT_GRACE
    )


def _what(gang: Gang) -> str:
    return f"podgroup {gang.key}"


def _anywhere(node: str) -> bool:
    """A waiting pod not read yet: every node (it is not ready, so it is not placed anyway)."""
    return True

"""Where the state comes from: the seam between the server and whatever keeps the state current.

The server reads ``source.state`` and ``source.ready``; it never knows which source it has. The
snapshot source loads a directory once; the live source keeps one informer per kind (list+watch).
"""

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from webhook.cluster import cache, snapshot
from webhook.cluster.caller import LineCaller
from webhook.cluster.lease import LeaderElector, PodLabelClient, ServingLabel
from webhook.cluster.reclaimer import InProcess, Reclaimer
from webhook.cluster.selectors import Evaluator
from webhook.core.decide import report
from webhook.core.index.line import Waiter
from webhook.core.index.state import ClusterState
from webhook.core.model.claims import Selectors
from webhook.core.model.objects import OwnerRef
from webhook.core.model.policy import Policy


class StateSource(Protocol):
    @property
    def state(self) -> ClusterState | None: ...

    @property
    def ready(self) -> bool: ...

    async def run(self) -> None:
        """Bring the state up to date and keep it so; raise ``ConfigError`` if it cannot."""

    async def fetch(self, ref: OwnerRef, namespace: str) -> dict[str, Any] | None:
        """A live read of what a review needs and the cache lacks (a PodGroup's owner, a pod's
        claims, a PodGroup the cache shows behind), or None."""

    def not_ready_reason(self) -> str:
        """Why ``ready`` is false (this replica does not answer reviews): the 503 answer."""

    def readiness_reason(self) -> str:
        """Why /readyz is 503, "" when it is 200 (the same as ``not_ready_reason`` unless standbys
        stay ready and the leader is selected by its pod label)."""

    async def step_down(self) -> None:
        """A graceful stop: stop answering reviews and hand leadership over, if there is any."""

    def leader_address(self) -> str | None:
        """Where the replica that decides serves, when it is another one (forwarding); else None."""

    async def evaluated(self, readings: set[Selectors], timeout: float) -> None:
        """Until the DRA selectors of ``readings`` a decision deferred are worked out off the loop,
        or ``timeout`` seconds (at once when nothing works them out: the state defers nothing)."""


class SnapshotSource:
    """A snapshot directory, loaded once in a worker thread; ready when loaded. ``off_loop``: DRA
    selectors are then evaluated within a budget on the loop, the rest in a process of its own."""

    def __init__(self, directory: Path, policy: Policy, off_loop: bool = False) -> None:
        self.directory, self.policy, self.off_loop = directory, policy, off_loop
        self._state: ClusterState | None = None
        self.evaluator: Evaluator | None = None

    @property
    def state(self) -> ClusterState | None:
        return self._state

    @property
    def ready(self) -> bool:
        return self._state is not None

    async def fetch(self, ref: OwnerRef, namespace: str) -> dict[str, Any] | None:
        return None  # a snapshot holds all there is

    def not_ready_reason(self) -> str:
        return "the cluster state has not synced yet (the snapshot is loading)"

    def readiness_reason(self) -> str:
        return "" if self.ready else self.not_ready_reason()

    async def step_down(self) -> None:
        return None

    def leader_address(self) -> str | None:
        return None

    async def evaluated(self, readings: set[Selectors], timeout: float) -> None:
        if self.evaluator is not None:
            await self.evaluator.settled(readings, timeout)

    async def run(self) -> None:
        state = await asyncio.to_thread(snapshot.load_snapshot, self.directory, self.policy)
        settle_heap()
        if self.off_loop:
            self.evaluator = Evaluator(state)
        self._state = state
        if self.evaluator is not None:
            await self.evaluator.run()


def settle_heap() -> None:
    """Move everything alive now out of the garbage collector's sight.

    A loaded state is millions of long-lived objects; a full collection would walk them all and
    stall every review for tens of milliseconds at 100k pods (the p99 showed it). Frozen objects
    are never scanned; what dies later is still freed by reference counting.
    """
    gc.collect()
    gc.freeze()


log = logging.getLogger(__name__)
OVERCOMMITTED = "CardQuotaOvercommitted"
UNSENT = "CardQuotaResourceNotSent"  # a node's card resource the webhooks' filters never send
EVENT_INTERVAL = 600.0
BARRIER_KINDS = frozenset({"Pod", "PodGroup"})  # what an admission charges: listed again at a takeover


class LiveSource:
    """One informer per kind over one connection to the API server.

    Ready once every informer has synced, and not ready while any watch has been broken for
    longer than ``broken_after`` seconds (the cache may then be missing changes).
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[cache.Transport]],
        policy: Policy,
        broken_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        audit_seconds: float = 30.0,
        elect: Callable[[cache.Transport], LeaderElector] | None = None,
        label_pod: Callable[[cache.Transport], PodLabelClient] | None = None,
        call_seconds: float | None = None,
        on_served: Callable[[Waiter, float], None] = lambda waiter, waited: None,
        reclaim_after: float | None = None,
        on_reclaim: Callable[[str, str, str, int], None] = lambda queue, card, outcome, cards: None,
        on_bound: Callable[[str, str, float], None] = lambda queue, card, seconds: None,
        off_loop: bool = False,
    ) -> None:
        """``call_seconds``: how often the waiting lines are called while this replica serves;
        None for a source that only reads (``cardquota status``). ``reclaim_after``: how long an
        admitted pod waits for cards no node has free before tidal reclaim takes them back for it
        (None: no reclaim, a source that only reads). ``off_loop``: DRA selectors are evaluated
        within a budget on the loop, the rest in a process of its own (a source that serves)."""
        self.elect, self.label_pod = elect, label_pod
        self.call_seconds, self.on_served = call_seconds, on_served
        self.reclaim_after, self.on_reclaim, self.on_bound = reclaim_after, on_reclaim, on_bound
        self.elector: LeaderElector | None = None
        self.labeler: ServingLabel | None = None
        self.connect, self.broken_after, self.clock = connect, broken_after, clock
        self.audit_seconds = audit_seconds
        self._warned: dict[tuple[str, str], float] = {}  # (queue, card) -> when an Event was recorded
        self._state = ClusterState(policy)
        self.evaluator = Evaluator(self._state) if off_loop else None
        self.informers: list[cache.Informer] = []
        self._transport: cache.Transport | None = None
        self._term = 0  # the last term as leader (``elector.won``) whose takeover barrier has passed
        self._won = asyncio.Event()
        self.takeovers: list[float] = []  # seconds each takeover barrier took

    @property
    def state(self) -> ClusterState:
        return self._state

    @property
    def ready(self) -> bool:
        return not self.not_ready_reason()

    def not_ready_reason(self) -> str:
        """ "" when this replica answers reviews: every kind synced, no watch broken too long, and
        (with leader election) it holds the Lease."""
        why = self._sync_reason()
        if not why and self.elector is not None and not self.elector.is_leader:
            return f"another replica holds the lease {self.elector.namespace}/{self.elector.name} and serves"
        if not why and self.elector is not None and self._term != self.elector.won:
            return "this replica just took the lease and is catching up with the cluster"
        return why

    def leader_address(self) -> str | None:
        return self.elector.leader_address if self.elector is not None else None

    def readiness_reason(self) -> str:
        """With leader election every synced replica is ready: one that does not decide forwards
        to the one that does, so the Service may send a review to any of them."""
        if self.elect is None:
            return self.not_ready_reason()
        if self.label_pod is not None and (self.labeler is None or self.labeler.applied is None):
            return "this pod's serving label has not been cleared yet"
        return self._sync_reason()

    def _sync_reason(self) -> str:
        if not self.informers or not all(i.synced for i in self.informers):
            return "the cluster state has not synced yet"
        now, limit = self.clock(), self.broken_after
        if any(i.broken_since is not None and now - i.broken_since > limit for i in self.informers):
            return f"a watch has been broken for more than {limit:.0f} s"
        return ""

    async def step_down(self) -> None:
        if self.elector is not None:
            await self.elector.release()
        if self.labeler is not None:
            await self.labeler.sync()

    async def _first_list(self, informer: cache.Informer) -> None:
        while True:
            try:
                await informer.relist()
                return
            except (cache.Unavailable, cache.Expired) as exc:
                delay = informer.backoff.next()
                log.warning(
                    "first list failed, retrying",
                    extra={"kind": informer.kind.name, "error": str(exc), "retry_in": round(delay, 2)},
                )
                await asyncio.sleep(delay)

    async def _takeovers(self) -> None:
        """The takeover barrier: after winning the Lease, serve only once the kinds an admission
        charges have been listed again (after the win), so every pod the previous leader admitted
        is counted; the in-flight ledger starts empty from there."""
        assert self.elector is not None
        while True:
            await self._won.wait()
            self._won.clear()
            term, started = self.elector.won, self.clock()
            while not self.informers or not all(i.synced for i in self.informers):
                await asyncio.sleep(0.05)  # the first sync is a list taken after the win anyway
            await asyncio.gather(*(i.catch_up() for i in self.informers if i.kind.name in BARRIER_KINDS))
            self._state.ledger.clear()
            self._term = term
            self.takeovers.append(self.clock() - started)
            log.info("took over: serving", extra={"barrier_seconds": round(self.takeovers[-1], 3)})

    async def _audit(self, transport: cache.Transport) -> None:
        """Usage above quota (quota lowered, nodes lost, webhook bypassed) becomes a Warning Event on
        the Queue, at most one per queue and card every ``EVENT_INTERVAL`` seconds. Nothing is evicted.
        A node's card resource the webhooks' filters never send becomes one on the (first) node."""
        while True:
            await asyncio.sleep(self.audit_seconds)
            await self.audit_once(transport)

    async def audit_once(self, transport: cache.Transport) -> None:
        now = self.clock()
        for queue, card, _, message in report.overcommitted(self._state):
            if now - self._warned.get((queue, card), -EVENT_INTERVAL) < EVENT_INTERVAL:
                continue
            self._warned[(queue, card)] = now
            log.warning("queue over its card quota", extra={"queue": queue, "card": card, "detail": message})
            try:
                await transport.warn_queue(queue, OVERCOMMITTED, message)
            except cache.Unavailable as exc:
                log.warning("could not record an Event", extra={"queue": queue, "error": str(exc)})
        for resource, nodes, message in report.unsent(self._state):
            if now - self._warned.get(("", resource), -EVENT_INTERVAL) < EVENT_INTERVAL:
                continue
            self._warned[("", resource)] = now
            log.warning(
                "a card resource the filters never send", extra={"resource": resource, "detail": message}
            )
            try:
                await transport.warn_node(nodes[0], UNSENT, message)
            except cache.Unavailable as exc:
                log.warning("could not record an Event", extra={"node": nodes[0], "error": str(exc)})

    async def evaluated(self, readings: set[Selectors], timeout: float) -> None:
        if self.evaluator is not None:
            await self.evaluator.settled(readings, timeout)

    async def fetch(self, ref: OwnerRef, namespace: str) -> dict[str, Any] | None:
        kind = cache.kind_of(ref.kind, ref.api_version)
        if self._transport is None or kind is None:
            return None
        try:
            return await self._transport.get(kind, namespace, ref.name)
        except cache.Unavailable as exc:
            log.warning("live read failed", extra={"kind": ref.kind, "name": ref.name, "error": str(exc)})
            return None

    async def run(self) -> None:
        transport = self._transport = await self.connect()
        self.informers = [
            cache.Informer(kind, self._state, transport) for kind in cache.watched(self._state.policy)
        ]
        tasks: list[asyncio.Task[None]] = []
        closing: list[Callable[[], None]] = []
        if self.elect is not None:
            self.elector = self.elect(transport)
            self.elector.on_won = self._won.set
            tasks.append(asyncio.create_task(self.elector.run(), name="leader election"))
            tasks.append(asyncio.create_task(self._takeovers(), name="takeover barrier"))
            if self.label_pod is not None:
                self.labeler = ServingLabel(self.label_pod(transport), lambda: self.ready)
                tasks.append(asyncio.create_task(self.labeler.run(), name="serving label"))
        try:
            # The first lists run one kind after another, in dependency order (nodes and queues
            # before the pods that refer to them), so no pod is charged twice; then every kind
            # watches from its own list's version.
            gc.disable()
            try:
                for informer in self.informers:
                    await self._first_list(informer)
            finally:
                gc.enable()
            tasks += [
                asyncio.create_task(i.run(listed=True), name=f"informer {i.kind.plural}")
                for i in self.informers
            ]
            settle_heap()
            log.info("cache synced", extra={"pods": len(self._state.pods), "nodes": len(self._state.nodes)})
            tasks.append(asyncio.create_task(self._audit(transport), name="auditor"))
            if self.evaluator is not None:
                tasks.append(asyncio.create_task(self.evaluator.run(), name="selector evaluator"))
            if self.call_seconds is not None:
                caller = LineCaller(
                    self._state, transport, lambda: self.ready, self.call_seconds, on_served=self.on_served
                )
                tasks.append(asyncio.create_task(caller.run(), name="line caller"))
            if self.reclaim_after is not None:
                solver = InProcess()
                closing.append(solver.close)
                reclaimer = Reclaimer(
                    self._state,
                    transport,
                    lambda: self.ready,
                    after=self.reclaim_after,
                    on_reclaim=self.on_reclaim,
                    on_bound=self.on_bound,
                    solve=solver,
                )
                tasks.append(asyncio.create_task(reclaimer.run(), name="tidal reclaim"))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for done in closing:
                done()
            close = getattr(transport, "close", None)
            if close is not None:
                await close()

"""The serving replica calls the next in line (SPEC §5c): the edge of ``core.calls``.

Every ``interval`` seconds, while this replica serves, it asks the core whom the freed cards go to.
A called workload (deny mode) gets our ``called`` annotation, an update its controller reacts to at
once, so its refused creates are retried now instead of after its back-off, and an Event saying so;
a released pod (wait mode) has our scheduling gate removed (an ``A|B`` pod its model set) by one
JSON Patch that first tests the gate and the version it was read at, and an Event. The cards stay
held in the ledger meanwhile. Then the waiting marks are brought in line with the waiting line, so
that a restarted or new leader rebuilds the same line from the cluster; a pod that starts waiting
is told where it stands by an Event. A write that fails is logged and tried again on a later pass;
a call whose write fails gives its cards back at once.
"""

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from webhook.cluster import cache, events
from webhook.core.decide import calls, patches
from webhook.core.index.line import CALLED_KINDS, Waiter, ordinal
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.cards import amount, figure
from webhook.core.model.objects import PodRecord, WorkloadRecord, event_targets, moment
from webhook.core.model.verdicts import Borrowing

log = logging.getLogger(__name__)
PODGROUPS = next(k for k in cache.KINDS if k.plural == "podgroups")
CALLED = "CardQuotaCalled"
WAITING = "CardQuotaWaiting"
RELEASED = "CardQuotaReleased"
REFUSED = "CardQuotaEnqueueRefused"
WOULD_REFUSE = keys.WOULD_REFUSE_REASON  # admitted, its queue's quota only warning or auditing (§34)
BORROWING = "CardQuotaBorrowing"  # admitted on cards its queue's cohort lends (decisions.md §33)
UNFIT = "CardQuotaLeftLine"
TELL_EVERY = 60.0  # seconds between two Events about one PodGroup refused at enqueue, or would be
MARK_FOR = 30.0  # seconds a borrowing mark is tried on a pod or PodGroup not found
MARK_PATIENCE = 10.0  # seconds a written mark is trusted to reach the cache before it is written again


@dataclass
class _Untold:
    """The would-be refusals of one object (in one queue, card and mode) not told yet."""

    at: float  # when an Event last told them
    count: int = 0
    first: float = 0.0  # when the first of them was admitted
    message: str = ""  # the last one's


class LineCaller:
    def __init__(
        self,
        state: ClusterState,
        transport: cache.Transport,
        serving: Callable[[], bool],
        interval: float = 0.25,
        clock: Callable[[], float] = time.time,
        on_served: Callable[[Waiter, float], None] = lambda waiter, waited: None,
    ) -> None:
        self.state, self.transport, self.serving = state, transport, serving
        self.interval, self.clock, self.on_served = interval, clock, on_served
        self._written: dict[str, tuple[str | None, float]] = {}  # uid -> (mark, when written)
        self._standing: dict[str, Waiter] = {}  # the line at the last pass, by key
        self._told: dict[str, float] = {}  # PodGroup key -> when its refusal was last told
        self._started = clock()
        self._marking: dict[str, Borrowing] = {}  # "pod:"/"podgroup:" key -> its borrowing mark, not written
        self._would: dict[tuple[str, ...], _Untold] = {}  # (involved..., queue, card, mode) -> untold

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if self.serving():
                await self.once()
            else:
                self._standing = {}
                self.state.waiting.departed()  # the serving replica reports them

    async def once(self) -> None:
        now = self.clock()
        self._served(now)
        await self._tell_new()
        await self._tell_refusals(now)
        await self._tell_borrowings(now)
        await self._tell_would_refuse(now)
        for waiter in calls.unfit(self.state):
            self._standing.pop(waiter.key, None)  # it left unserved
            await self._tell_unfit(waiter)
        for call in calls.call_next(self.state, now):
            await (self._release(call, now) if call.waiter.pod else self._call(call, now))
        for mark in calls.marks(self.state):
            await self._mark(mark, now)

    def _served(self, now: float) -> None:
        """Report each waiter that left the line since the last pass with its workload still
        there: it has its pods, whether called or served by its controller's own retry (or it
        wants no more), even if it came and went between two passes. A deleted workload was not
        served, nor one that left because its quota can never hold it."""
        departed = self.state.waiting.departed()
        if departed:
            groups = {g.uid for g in self.state.podgroups.values()}
            for waiter in departed:
                key = waiter.key
                if key in self.state.workloads.by_uid or key in self.state.pods or key in groups:
                    self.on_served(waiter, max(0.0, now - waiter.since))
        standing = {waiter.key: waiter for waiter in self.state.line}
        self._new = [w for k, w in standing.items() if w.pod and k not in self._standing]
        self._standing = standing

    async def _tell_new(self) -> None:
        """An Event on each pod that started waiting under our gate since the last pass (a new
        leader does not repeat those its predecessor told)."""
        for waiter in self._new:
            pod = self.state.pods.get(waiter.key)
            if pod is None or waiter.since < self._started - MARK_PATIENCE:
                continue
            waiters = self.state.line.line(waiter.queue)
            place = waiters.index(waiter) + 1 if waiter in waiters else len(waiters) + 1
            message = (
                f'waits {ordinal(place)} in queue "{waiter.queue}"\'s line for {_cards(waiter)}, held'
                f" under the scheduling gate {keys.GATE}: the card-quota webhook releases it the moment"
                " its cards free"
            )
            await self._pod_event(pod, WAITING, message)

    async def _tell_refusals(self, now: float) -> None:
        """An Event on each PodGroup refused at enqueue, and on its Volcano Job (what ``kubectl
        describe vcjob`` shows), at most once a minute per group."""
        refusals, self.state.refusals = self.state.refusals, {}
        for key, message in refusals.items():
            group = self.state.podgroups.get(key)
            if group is None or now - self._told.get(key, -TELL_EVERY) < TELL_EVERY:
                continue
            self._told[key] = now
            await events.tell_group(self.transport, group, REFUSED, message)
        for key in [k for k, at in self._told.items() if now - at >= TELL_EVERY]:
            del self._told[key]

    async def _tell_borrowings(self, now: float) -> None:
        """An Event on each pod a controller made, and each PodGroup enqueued (and its Volcano Job),
        admitted on borrowed cards since the last pass (their admission warning reached no one);
        then the borrowing mark on each pod and PodGroup admitted so (decisions.md §33)."""
        fresh, self.state.borrowings = self.state.borrowings, {}
        for key, borrowing in fresh.items():
            self._marking[key] = borrowing
            if not borrowing.told:
                continue
            kind, _, name = key.partition(":")
            if kind == "podgroup" and (group := self.state.podgroups.get(name)) is not None:
                await events.tell_group(self.transport, group, BORROWING, borrowing.told)
            elif kind == "pod":
                namespace, _, pod = name.partition("/")
                involved = {"apiVersion": "v1", "kind": "Pod", "name": pod}
                await events.tell(self.transport, namespace, involved, BORROWING, borrowing.told, "Warning")
        await self._mark_borrowings(now)

    async def _mark_borrowings(self, now: float) -> None:
        """Write each borrowing mark not written yet. A pod is admitted before the API server
        stores it: one not there yet is marked at a later pass, for ``MARK_FOR`` seconds (its
        create may have failed after its admission)."""
        for key, borrowing in list(self._marking.items()):
            if now - borrowing.at > MARK_FOR:
                del self._marking[key]
                continue
            kind, _, name = key.partition(":")
            namespace, _, what = name.partition("/")
            text = borrowing_text(borrowing)
            try:
                done = await self.transport.annotate(
                    PODGROUPS if kind == "podgroup" else cache.PODS, namespace, what, {keys.BORROWING: text}
                )
            except cache.Unavailable as exc:
                log.warning("could not write a borrowing mark", extra={"object": key, "error": str(exc)})
                done = False
            if done:
                del self._marking[key]

    async def _tell_would_refuse(self, now: float) -> None:
        """An Event on each object admitted since the last pass that its queue's quota would have
        refused, it only warning or auditing (decisions.md §34); a PodGroup's on its Volcano Job too.
        At most one a minute per object, queue, card and mode: the Event's count says how many since
        the last, and its ``would-refuse`` annotation whose (``kubectl cardquota audit`` adds them up)."""
        fresh, self.state.would_refuse = self.state.would_refuse, []
        for would in fresh:
            assert would.involved is not None  # only those are kept
            untold = self._would.setdefault(
                (*would.involved, would.queue, would.card, would.mode), _Untold(-TELL_EVERY)
            )
            if not untold.count:
                untold.first = now
            untold.count += 1
            untold.message = would.message
        for key, untold in list(self._would.items()):
            if now - untold.at < TELL_EVERY:
                continue
            if not untold.count:
                del self._would[key]  # nothing more to tell
                continue
            await self._tell_would(key, untold)
            untold.at, untold.count = now, 0

    async def _tell_would(self, key: tuple[str, ...], untold: _Untold) -> None:
        api_version, kind, namespace, name, queue, card, mode = key
        times = f" {untold.count} times since {moment(untold.first)}, the last" if untold.count > 1 else ""
        message = f"would be refused ({mode} mode){times}: {untold.message}"
        group = self.state.podgroups.get(f"{namespace}/{name}") if kind == "PodGroup" else None
        targets = event_targets(group) if group else [{"apiVersion": api_version, "kind": kind, "name": name}]
        counted = {keys.WOULD_REFUSE: json.dumps({"queue": queue, "card": card, "mode": mode})}
        for n, target in enumerate(targets):  # counted once: on the PodGroup, not its Job
            more = {"annotations": counted} if n == 0 else {}
            await events.tell(
                self.transport,
                namespace,
                target,
                WOULD_REFUSE,
                message,
                "Warning",
                count=untold.count,
                since=untold.first,
                **more,
            )

    async def _tell_unfit(self, waiter: Waiter) -> None:
        """An Event on a waiter that left the line because its queue can no longer ever hold it."""
        message = calls.unfit_message(self.state, waiter)
        log.info("a waiter left the line", extra={"waiter": waiter.what, "queue": waiter.queue})
        if waiter.pod and (pod := self.state.pods.get(waiter.key)) is not None:
            await self._pod_event(pod, UNFIT, message)
        elif waiter.group:
            group = next((g for g in self.state.podgroups.values() if g.uid == waiter.key), None)
            if group is not None:
                await events.tell_group(self.transport, group, UNFIT, message)
        elif (workload := self.state.workloads.by_uid.get(waiter.key)) is not None:
            await self._event(workload, UNFIT, message)

    async def _call(self, call: calls.Call, now: float) -> None:
        waiter = call.waiter
        if waiter.group:  # the scheduler retries it every period: its cards are held until then
            log.info(
                "held cards for a PodGroup's next enqueue",
                extra={"podgroup": waiter.what, "queue": waiter.queue, "card": _cards(waiter)},
            )
            return
        workload = self.state.workloads.by_uid.get(waiter.key)
        kind = _kind(workload)
        if workload is None or kind is None:
            self.state.ledger.settle(waiter.hold, call.pods)
            return
        stamp = moment(now)
        try:
            found = await self.transport.annotate(
                kind, workload.namespace, workload.name, {keys.CALLED: stamp}
            )
        except cache.Unavailable as exc:
            found = False
            log.warning(
                "could not call a waiting workload", extra={"workload": waiter.what, "error": str(exc)}
            )
        if not found:
            self.state.ledger.settle(waiter.hold, call.pods)  # its cards go back to the line
            return
        waited = max(0.0, now - waiter.since)
        log.info(
            "called a waiting workload",
            extra={
                "workload": waiter.what,
                "queue": waiter.queue,
                "pods": call.pods,
                "waited_s": round(waited, 1),
            },
        )
        message = (
            f'cards freed in queue "{waiter.queue}": {call.pods} of its pods ({_cards(waiter)} each) may be'
            f" created now, held for it {self.state.policy.in_flight_ttl:g} s; it waited {_duration(waited)}"
        )
        await self._event(workload, CALLED, message)

    async def _release(self, call: calls.Call, now: float) -> None:
        waiter = call.waiter
        pod = self.state.pods.get(waiter.key)
        try:
            live = await self.transport.get(cache.PODS, pod.namespace, pod.name) if pod else None
            ops = patches.release_patch(self.state, live, call.card) if live else None
            done = ops is not None and await self.transport.patch(cache.PODS, pod.namespace, pod.name, ops)  # type: ignore[union-attr]
        except cache.Unavailable as exc:
            done = False
            log.warning("could not release a waiting pod", extra={"pod": waiter.what, "error": str(exc)})
        if not done or pod is None:
            self.state.ledger.settle(waiter.hold, call.pods)  # its cards go back to the line
            return
        waited = max(0.0, now - waiter.since)
        card = f"{amount(waiter.per_pod)} {call.card}" if call.card else _cards(waiter)
        log.info(
            "released a waiting pod",
            extra={"pod": waiter.what, "queue": waiter.queue, "card": card, "waited_s": round(waited, 1)},
        )
        message = (
            f'cards freed in queue "{waiter.queue}": released to run on {card}; it waited {_duration(waited)}'
        )
        await self._pod_event(pod, RELEASED, message)

    async def _mark(self, mark: calls.Mark, now: float) -> None:
        workload = self.state.workloads.get(mark.kind, mark.namespace, mark.name)
        kind = _kind(workload)
        if workload is None or kind is None:
            return
        written = self._written.get(workload.uid)
        if written is not None and written[0] == mark.text and now - written[1] < MARK_PATIENCE:
            return  # written already; the cache has not shown it yet
        try:
            await self.transport.annotate(kind, mark.namespace, mark.name, {keys.WAITING: mark.text})
        except cache.Unavailable as exc:
            log.warning("could not write a waiting mark", extra={"workload": mark.name, "error": str(exc)})
            return
        self._written[workload.uid] = (mark.text, now)

    async def _event(self, workload: WorkloadRecord, reason: str, message: str) -> None:
        kind = _kind(workload)
        involved = {
            "apiVersion": kind.api_version if kind else "apps/v1",
            "kind": kind.name if kind else workload.kind,
            "name": workload.name,
            "uid": workload.uid,
        }
        await events.tell(self.transport, workload.namespace, involved, reason, message)

    async def _pod_event(self, pod: PodRecord, reason: str, message: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
        await events.tell(self.transport, pod.namespace, involved, reason, message)


def _kind(workload: WorkloadRecord | None) -> cache.Kind | None:
    if workload is None:
        return None
    return next((k for k in cache.KINDS if k.record == workload.kind and k.record in CALLED_KINDS), None)


def _cards(waiter: Waiter) -> str:
    return f"{amount(waiter.per_pod)} {waiter.spec.text}"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


def borrowing_text(borrowing: Borrowing) -> str:
    """The borrowing mark: when it was admitted and, per model, its queue's use past its deserved
    with it counted, that deserved and the queues lending:
    {"since": "...", "cards": {"NVIDIA-H200": {"beyond": 2, "deserved": 2, "from": ["b"]}}}."""
    cards = {
        b.card: {"beyond": figure(b.beyond), "deserved": figure(b.deserved), "from": list(b.lenders)}
        for b in borrowing.borrowed
    }
    return json.dumps({"since": moment(borrowing.at), "cards": cards}, separators=(",", ":"))

"""Calling the next in line (SPEC §5c): when cards free, the waiters that fit now, in order.

Each queue's line is walked from its head. A waiter is called for as many of its pods as fit after
everything that still waits ahead of it (the same exact check an admission makes, the queue's
ancestors included), and those pods are held in the in-flight ledger under the waiter's hold key,
so no other create takes their cards while its controller retries (deny mode) or its pod is
released (wait mode). A waiter that does not fit keeps its place, and its demand still counts
ahead of everyone behind it: on its cards nobody overtakes it; on other cards they may go first.
"""

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from webhook.core.decide import decisions, reclaim_holds
from webhook.core.decide.fitting import fitting_now
from webhook.core.index.line import Waiter
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model.cards import CardName, CardSpec, amount
from webhook.core.model.demand import PodDemand, pod_demand
from webhook.core.model.feasibility import TooComplex
from webhook.core.model.ledger import Entry
from webhook.core.model.objects import mark_text
from webhook.core.model.values import value_class
from webhook.core.model.verdicts import Allowed, Decision, Denied


@value_class
class Call:
    """A waiter called for ``pods`` of its pods: their cards are held for it now. ``card``: the
    model a released ``A|B`` pod is given (its affinity narrowed to it), else None."""

    waiter: Waiter
    pods: int
    card: CardName | None = None


@value_class
class Mark:
    """A workload whose waiting mark must change: ``text`` to write, or None to remove it."""

    kind: str
    namespace: str
    name: str
    text: str | None


def unfit(state: ClusterState) -> tuple[Waiter, ...]:
    """The waiters whose missing pods the whole quota of their queue (or of an ancestor) can never
    hold, its quota cut below them, or their queue gone: they leave the line (waiting would be
    forever, and everyone behind them on those cards with them). A refused workload so keeps its
    place out of the line, ahead of no one, until its queue's quota changes (``Waiting.rewait``
    parks it the moment it happens); each is answered once, for its Event."""
    out = [
        waiter
        for waiter in state.line
        if waiter.queue not in state.tree.queues
        or not decisions.ever_fits(state, waiter.queue, waiter.spec, waiter.per_pod)
        or not decisions.ever_holds(state, waiter.queue, waiter.spec, waiter.per_pod, _wanted(state, waiter))
    ]
    for waiter in out:
        state.waiting.unfit(waiter)
    return (*out, *state.waiting.take_parked())


def _wanted(state: ClusterState, waiter: Waiter) -> int:
    """The pods a waiter waits for, at least one (a called one waits for none until seen)."""
    return max(1, state.waiting.waiting_pods(waiter))


def unfit_message(state: ClusterState, waiter: Waiter) -> str:
    """Why ``waiter`` left its queue's line (``unfit``), for its Event."""
    wanted = _wanted(state, waiter)
    one = "it" if waiter.group else ("one pod of it" if wanted == 1 else f"the {wanted} pods it still wants")
    if waiter.queue not in state.tree.queues:
        why = f'queue "{waiter.queue}" is gone'
    else:
        why = (
            f"{one} need{'s' if wanted == 1 else ''} {amount(waiter.per_pod * wanted)} {waiter.spec.text},"
            f' more than the whole quota of queue "{waiter.queue}" (or of a queue above it) holds now'
        )
    if state.waiting.parked_place(waiter.key) is not None:
        return (
            f'{waiter.what} left queue "{waiter.queue}"\'s line: {why}, so it waits out of the line, ahead'
            " of no one, until that quota changes; those behind it are called (lower its replicas, or"
            " raise the quota)"
        )
    return (
        f'{waiter.what} left queue "{waiter.queue}"\'s line: {why}, so waiting would be forever;'
        " those behind it are called (raise the quota, or ask for less)"
    )


def call_next(state: ClusterState, now: float) -> tuple[Call, ...]:
    """Call every waiter that fits now, head first, and hold what each is called for."""
    state.expire(now)
    calls: list[Call] = []
    for queue in state.line.queues():
        waiters = state.line.line(queue)
        for index, waiter in enumerate(waiters):
            wanted = state.waiting.waiting_pods(waiter)
            if wanted <= 0 or reclaim_holds.guarding(state, queue, waiter.spec.cards, now) is not None:
                continue  # served, or its model's freed cards are held for a queue above (reclaim)
            if waiter.pod:
                call = _release(state, waiter, waiters[:index], now)
                if call is not None:
                    calls.append(call)
                continue
            pods, _ = fitting_now(partial(_check, state, waiter, waiters[:index]), wanted)
            if pods > 0:
                _hold(state, waiter, pods, now)
                calls.append(Call(waiter, pods))
    return tuple(calls)


def _release(state: ClusterState, waiter: Waiter, ahead: Sequence[Waiter], now: float) -> Call | None:
    """A gated pod (wait mode) released when it fits after those ahead: an ``A|B`` pod on the first
    of its models that does (the one it is then confined to), held in the ledger under its uid
    until the cache sees it ungated."""
    pod = state.pods.get(waiter.key)
    demand = pod_demand(pod.template, state.inventory, state.policy) if pod is not None else None
    if not isinstance(demand, PodDemand):
        return None
    if not waiter.spec.is_multi:
        if isinstance(_check(state, waiter, ahead, 1), Denied):
            return None
        _hold(state, waiter, 1, now)
        return Call(waiter, 1)
    for card in waiter.spec.cards:
        one = replace(waiter, spec=CardSpec((card,)), per_pod=demand.count_on(card, state.inventory))
        if not isinstance(_check(state, one, ahead, 1), Denied):
            _hold(state, one, 1, now)
            return Call(waiter, 1, card)
    return None


def _check(state: ClusterState, waiter: Waiter, ahead: Sequence[Waiter], pods: int) -> Decision:
    """Whether ``pods`` more pods of ``waiter`` fit after what still waits ahead of it."""
    queue, spec, per_pod = waiter.queue, waiter.spec, waiter.per_pod
    if decisions.queue_refuses(state, queue, waiter.what, spec, per_pod) is not None:
        return Denied("its queue admits nothing now")
    usage = queue_usage(state, queue, ahead=ahead)
    try:
        if not usage.fits(spec, per_pod, pods):
            return Denied("no room")
    except TooComplex:
        return Denied("too complex to check")
    above = decisions.ancestors_refuse(state, queue, spec, per_pod, pods, waiter.what)
    return above if above is not None else Allowed()


def _hold(state: ClusterState, waiter: Waiter, pods: int, now: float) -> None:
    expires = now + state.policy.in_flight_ttl
    entry = state.ledger.get(waiter.hold)
    if entry is not None and entry.spec == waiter.spec and entry.per_pod == waiter.per_pod:
        entry.pods += pods
        entry.expires = max(entry.expires, expires)
        state.ledger.version += 1  # what it holds changed (what is read from it is cached by it)
    else:
        state.ledger.record(waiter.hold, Entry(waiter.queue, waiter.spec, waiter.per_pod, pods, expires))


def marks(state: ClusterState) -> tuple[Mark, ...]:
    """The waiting marks to write so the cluster says what the line holds: each waiting workload
    carries its place (so a new leader rebuilds the line), a parked one too, and none that left it
    keeps one."""
    out: list[Mark] = []
    for uid in state.waiting.marked():
        workload = state.workloads.by_uid.get(uid)
        waiter = state.line.get(uid)
        if workload is None:
            continue
        text = mark_text(waiter.since, waiter.priority) if waiter is not None and not waiter.pod else None
        if waiter is None and (parked := state.waiting.parked_place(uid)) is not None:
            text = mark_text(*parked)  # out of the line, it keeps its place (a new leader reads it)
        written = mark_text(*workload.waiting) if workload.waiting is not None else None
        if text != written:
            out.append(Mark(workload.kind, workload.namespace, workload.name, text))
    return tuple(out)

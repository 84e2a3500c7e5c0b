"""The cards a reclaim took back, held for the pods they went to (SPEC §5e): while those pods wait
unbound (and the hold has not run out), the evicted PodGroup is not enqueued again, and no queue of
lower priority than the one they went to is enqueued onto them. Read by the enqueue gate, the pod
decisions, the line and the reclaimer."""

from collections.abc import Iterable

from webhook.core.decide.reclaim_settings import priority_of
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.cards import CardName, figure
from webhook.core.model.objects import moment, reclaim_mark
from webhook.core.model.reclaim import Taken


def holding(state: ClusterState, group: str, now: float) -> Taken | None:
    """What was taken back from PodGroup ``group`` while the pods it went to still wait unbound
    (and its hold has not run out); None once they are bound or gone."""
    taken, record = state.reclaims.get(group), state.podgroups.get(group)
    if taken is not None and record is not None and taken.group_uid and taken.group_uid != record.uid:
        taken = None  # another PodGroup of that name since: the hold was the one deleted
    if taken is None and record is not None:
        taken = reclaim_mark(record.annotations.get(keys.RECLAIMED))  # written by an earlier leader
    if taken is None or now >= taken.until:
        return None
    return taken if any(uid in state.charged.unbound() for uid in taken.for_pods) else None


def guarding(state: ClusterState, queue: str, cards: Iterable[CardName], now: float) -> Taken | None:
    """A reclaim whose freed cards of one of ``cards`` are held for a queue of higher priority than
    ``queue`` while the pods they were taken for wait unbound: ``queue``'s new demand of that model
    waits too (SPEC §5e), so no third queue's job is enqueued onto them. Only the holds this replica
    made count: a mark on a PodGroup is anyone's to write, and would hold only that group. None on
    the common path (no reclaim held) without a look at anything else."""
    if not state.reclaims:
        return None
    wanted, priority = set(cards), priority_of(state, queue)
    for key in sorted(state.reclaims):
        taken = holding(state, key, now)
        if (
            taken is not None
            and taken.card in wanted
            and taken.queue != queue
            and priority_of(state, taken.queue) > priority
        ):
            return taken
    return None


def in_progress(state: ClusterState, now: float) -> list[dict[str, object]]:
    """The reclaims whose cards are still held: each evicted PodGroup, what it gave back, for which
    queue, and how many of those pods still wait unbound."""
    out: list[dict[str, object]] = []
    for key in sorted(set(state.reclaims) | state.groups.marked):
        taken = holding(state, key, now)
        if taken is not None:
            out.append(
                {
                    "podgroup": key,
                    "card": taken.card,
                    "cards": figure(taken.cards),
                    "for_queue": taken.queue,
                    "waiting_pods": unbound(state, taken),
                    "held_until": moment(taken.until),
                }
            )
    return out


def unbound(state: ClusterState, taken: Taken) -> int:
    """How many of the pods ``taken`` went to still wait unbound."""
    return sum(1 for uid in taken.for_pods if uid in state.charged.unbound())

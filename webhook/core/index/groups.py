"""The PodGroups, and what each reserves for the pods it has not created yet (SPEC §4b, §5d).

``PodGroups`` owns every PodGroup by key, the PodGroups of each owner, what the gated pods of each
group ask for (left out of its reservation as the capacity-card plugin leaves them out of its
queue's, ``DeductSchGatedResources``), and the reservations (``reservations.Reservations``). The
state tells it of every group, of a gated pod joining or leaving one, and of a group's pods being
charged again (``refresh``); the decisions ask what a group asks for and what it still lacks.
"""

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import replace

from webhook.core.index.charges import PodIndex
from webhook.core.index.line import Waiter
from webhook.core.index.queues import QueueTree
from webhook.core.index.reservations import RESERVING_PHASES, Reservations, asks_more
from webhook.core.model import keys
from webhook.core.model.cards import CardSpec
from webhook.core.model.ledger import Entry, Ledger
from webhook.core.model.objects import PodGroupRecord, PodRecord

# A PodGroup's annotations its reservation is read from (besides spec.minResources and spec.queue)
ENQUEUED_WITH = frozenset({keys.CARD_REQUEST, keys.CARD_NAME})


def enqueue_key(uid: str, index: int) -> str:
    """The ledger key of a PodGroup's enqueue: one per card spec it asks for (``index``)."""
    return f"enqueue:{uid}/{index}"


class PodGroups:
    def __init__(
        self,
        tree: QueueTree,
        pods: Mapping[str, PodRecord],
        charged: PodIndex,
        ledger: Ledger,
        request: Callable[[PodGroupRecord], dict[CardSpec, int]],
        refreshed: Callable[[str], None],
    ) -> None:
        """``request``: what a group asks for (its owner read from the workloads); ``refreshed``:
        told a group's uid when what it reserves may have changed."""
        self.by_key: dict[str, PodGroupRecord] = {}
        self.reserved = Reservations(tree)
        self.request = request
        self._pods, self._charged, self._ledger, self._refreshed = pods, charged, ledger, refreshed
        self._owners: defaultdict[str, set[str]] = defaultdict(set)  # owner uid -> PodGroup keys
        self._gated: defaultdict[str, Counter[CardSpec]] = defaultdict(Counter)
        self.marked: set[str] = set()  # keys of the groups carrying a tidal reclaim's hold mark

    def put(self, group: PodGroupRecord) -> bool:
        """Add or replace ``group``; True when its queue is new or moved (its pods' charges move)."""
        old = self.by_key.get(group.key)
        if old is not None and old.phase in RESERVING_PHASES and group.phase in RESERVING_PHASES:
            group = self._as_enqueued(old, group)
        if old is not None and old.owner is not None:
            self._owners[old.owner.uid].discard(group.key)
        self.by_key[group.key] = group
        if group.owner is not None:
            self._owners[group.owner.uid].add(group.key)
        if keys.RECLAIMED in group.annotations:
            self.marked.add(group.key)
        else:
            self.marked.discard(group.key)
        if group.phase in RESERVING_PHASES and (old is None or old.phase not in RESERVING_PHASES):
            self._settle_enqueue(group.uid)  # its reservation counts from now on
        self.refresh(group.key)
        return old is None or old.queue != group.queue

    def _as_enqueued(self, old: PodGroupRecord, group: PodGroupRecord) -> PodGroupRecord:
        """An enqueued group reserves at most what it was enqueued with, in the queue it was enqueued
        in (SPEC §4b): an edit asking more or elsewhere (refused by the webhook; one that got past
        it, or its job's sizes raised) keeps what it asked then; one asking less takes effect."""
        if not asks_more(self.request(old), self.request(group), group.queue != old.queue):
            return group
        annotations = {k: v for k, v in group.annotations.items() if k not in ENQUEUED_WITH}
        annotations |= {k: v for k, v in old.annotations.items() if k in ENQUEUED_WITH}
        return replace(group, queue=old.queue, annotations=annotations, min_resources=old.min_resources)

    def drop(self, key: str) -> PodGroupRecord | None:
        """Forget the group ``key``; answers it, if it was known."""
        group = self.by_key.pop(key, None)
        if group is None:
            return None
        if group.owner is not None:
            self._owners[group.owner.uid].discard(key)
        self.marked.discard(key)
        self._settle_enqueue(group.uid)
        self.refresh(key)
        return group

    def of_owner(self, uid: str) -> tuple[str, ...]:
        return tuple(self._owners.get(uid, ()))

    def enqueued(self, owner_uid: str) -> bool:
        """Whether one of ``owner_uid``'s PodGroups is Inqueue or Running."""
        return any(
            (g := self.by_key.get(key)) is not None and g.phase in RESERVING_PHASES
            for key in self._owners.get(owner_uid, ())
        )

    def unenqueued_pods(self, owner_uid: str) -> int:
        """How many live pods of ``owner_uid`` are not bound (gated, or released and pending) while
        none of its PodGroups is Inqueue or Running (0 once one is): their group is enqueued only
        when all of them fit."""
        if self.enqueued(owner_uid):
            return 0
        pods = self._pods
        return sum(
            1
            for uid in self._charged.owned_by(owner_uid)
            if (p := pods.get(uid)) and p.is_live and not p.node_name
        )

    def unreserved(self, group: PodGroupRecord) -> dict[CardSpec, int]:
        """What ``group`` asks for beyond what its pods (gated ones included) hold: what it reserves
        once enqueued, per card spec, in card units. Gated pods are taken off as the capacity-card
        plugin takes them off its queue's inqueue tally (``DeductSchGatedResources``,
        ``capacity_card_queue.go``)."""
        asked = self.request(group)
        held = self._held(group.key)
        return {spec: count - held.get(spec, 0) for spec, count in asked.items() if count > held.get(spec, 0)}

    def gate(self, pod: PodRecord, waiter: Waiter, sign: int) -> None:
        """A gated pod of a group joins (+1) or leaves (-1) the line."""
        if not pod.group_name:
            return
        key = f"{pod.namespace}/{pod.group_name}"
        self._gated[key][waiter.spec] += sign * waiter.per_pod
        if not +self._gated[key]:
            del self._gated[key]
        self.refresh(key)

    def enqueued_unseen(self, key: str) -> PodGroupRecord | None:
        """The group ``key`` when its move to Inqueue was admitted here (its enqueue hold is in the
        ledger) but the cache does not show it yet; else None. Its pods, created once it is, are
        counted against its reservation only once the cache shows it (SPEC §5d)."""
        group = self.by_key.get(key)
        if group is None or group.phase in RESERVING_PHASES:
            return None
        return group if self._ledger.get(enqueue_key(group.uid, 0)) is not None else None

    def enqueue_holds(self, uid: str) -> list[tuple[str, Entry]]:
        """The in-flight holds of the group ``uid``'s admitted enqueue, one per card spec, by key."""
        holds: list[tuple[str, Entry]] = []
        while (entry := self._ledger.get(key := enqueue_key(uid, len(holds)))) is not None:
            holds.append((key, entry))
        return holds

    def refresh(self, key: str) -> None:
        """Count again what the group ``key`` reserves: it, its owner or its pods changed."""
        group = self.by_key.get(key)
        asked = self.request(group) if group is not None else {}
        self.reserved.refresh(key, group, asked, self._held(key), self._charged.group_bound(key))
        if group is not None:
            self._refreshed(group.uid)

    def _held(self, key: str) -> Counter[CardSpec]:
        """What the group's pods charge, its gated pods' asks included."""
        existing = self._charged.group_demand(key)
        gated = self._gated.get(key)
        return existing + gated if gated else existing

    def _settle_enqueue(self, uid: str) -> None:
        """The cache shows the group enqueued (or gone): its enqueue holds are done."""
        index = 0
        while index == 0 or self._ledger.get(enqueue_key(uid, index)) is not None:
            self._ledger.drop(enqueue_key(uid, index))
            index += 1

"""What each live pod counts against its queue, and the indexes that find a pod's charge again.

``pod_charge`` works out a pod's ``Charge`` (pure). ``PodIndex`` owns every per-pod index: the
charges by pod uid, the pods of each PodGroup, node and owner, each PodGroup's existing demand, and
the CPU/memory check's charges. Adding a pod counts its charge in the queue tree and in its node's
free cards; removing it takes exactly that back. Both answer the PodGroup whose demand changed, so
the state can refresh that group's reservation.

Sets of uids are the keys of dicts (``Members``, ``Unbound``): in CPython a set of five strings
takes 730 bytes (its table is never more than three fifths full and grows fourfold), a dict of them
180, and a node holds a few pods; the 30,000 unbound pods of the 100,000 of ``tests.bench.memory``
take less than half a set's bytes in a dict.
"""

from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Set
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from webhook.core.index.freecards import FreeCards
from webhook.core.index.queues import QueueTree
from webhook.core.index.tally import Charge, ComputeCharge
from webhook.core.model import compact, keys
from webhook.core.model.cards import CardName, CardSpec
from webhook.core.model.demand import Demand, NotCardPod, PodDemand, pod_demand
from webhook.core.model.inventory import Inventory
from webhook.core.model.nodes import NodeCards
from webhook.core.model.objects import TERMINAL_PHASES, PodRecord, PodTemplate
from webhook.core.model.policy import Policy

NOTHING: dict[str, None] = {}  # never written: what ``Members.of`` answers for a key of no pods


class Members:
    """The pods of each node, PodGroup or owner, by uid; a key goes with its last pod."""

    __slots__ = ("_of",)

    def __init__(self) -> None:
        self._of: dict[str, dict[str, None]] = {}

    def add(self, key: str, uid: str) -> None:
        uids = self._of.get(key)
        if uids is None:
            uids = self._of[key] = {}
        uids[uid] = None

    def discard(self, key: str, uid: str) -> None:
        uids = self._of.get(key)
        if uids is not None:
            uids.pop(uid, None)
            if not uids:
                del self._of[key]

    def of(self, key: str) -> Set[str]:
        return self._of.get(key, NOTHING).keys()


class Unbound:
    """The live pods of one card model that no node holds yet (tidal reclaim's beneficiaries to
    be): by uid, and in one line per model and queue, each line by what its pods belong to (their
    PodGroup, else their owner, else "": pods of neither, no service type; one service type each),
    first seen first (an update of a pod puts it at the end of its PodGroup's). A pass reads a few
    of a line, never every unbound pod of the cluster."""

    __slots__ = ("_all", "_lines")

    def __init__(self) -> None:
        self._all: dict[str, None] = {}
        self._lines: dict[tuple[CardName, str], dict[str, dict[str, None]]] = {}

    def add(self, uid: str, line: tuple[CardName, str], who: str) -> None:
        self._all[uid] = None
        owners = self._lines.get(line)
        if owners is None:
            owners = self._lines[line] = {}
        uids = owners.get(who)
        if uids is None:
            uids = owners[who] = {}
        uids[uid] = None

    def discard(self, uid: str, line: tuple[CardName, str], who: str) -> None:
        self._all.pop(uid, None)
        owners = self._lines.get(line)
        if owners is None or who not in owners:
            return
        uids = owners[who]
        uids.pop(uid, None)
        if not uids:
            del owners[who]
            if not owners:
                del self._lines[line]

    def uids(self) -> Set[str]:
        return self._all.keys()

    def lines(self) -> Set[tuple[CardName, str]]:
        """The (model, queue) pairs some pod waits in."""
        return self._lines.keys()

    def line(self, line: tuple[CardName, str]) -> Iterator[tuple[str, Set[str]]]:
        """A line's pods, per what they belong to (a PodGroup's key, an owner's uid, or "")."""
        for who, uids in self._lines.get(line, {}).items():
            yield who, uids.keys()


def pod_charge(pod: PodRecord, demand: PodDemand, queue: str, node: NodeCards | None) -> Charge | None:
    """The card charge of a live pod: fixed to a card, or flexible over its ``A|B`` spec until it is
    bound (then charged to the alternative its node has); None for a finished pod, or one waiting
    under our scheduling gate (SPEC §5c: charged nothing while it waits)."""
    if pod.phase in TERMINAL_PHASES or pod.waiting is not None:
        return None
    group = f"{pod.namespace}/{pod.group_name}" if pod.group_name else ""
    card: CardName | None = demand.spec.cards[0] if not demand.spec.is_multi else None
    if pod.node_name and card is None:
        names = node.card_names() if node else frozenset()
        card = next((c for c in demand.spec.cards if c in names), None)
    bound = bool(pod.node_name) and card is not None
    return Charge(queue, bound, card, demand.asked, demand.count, group)


def charge_edits(old: PodRecord, new: PodRecord) -> list[str]:
    """The annotations a pod's charge is read from (``keys.CHARGED``) that ``new`` changes from
    ``old``, and its PodGroup's name once it had one (Volcano names it once, after the pod)."""
    was, now = old.template.annotations, new.template.annotations
    edited = [k for k in keys.CHARGED if was.get(k) != now.get(k)]
    if was.get(keys.GROUP_NAME) and was.get(keys.GROUP_NAME) != now.get(keys.GROUP_NAME):
        edited.append(keys.GROUP_NAME)
    return edited


def as_charged(old: PodRecord, new: PodRecord) -> PodRecord:
    """``new`` with the annotations its charge is read from (card, queue: ``keys.CHARGED``) as
    ``old``, the pod as it was charged, had them; its PodGroup's name too once it had one. An edit
    of them on a charged pod is refused by the webhook; one that got past it (a webhook down, a
    registration that lets it through) moves nothing it is charged (SPEC §4b). ``new`` itself when
    they are unchanged."""
    fixed = charge_edits(old, new)
    if not fixed:
        return new
    was, now = old.template.annotations, new.template.annotations
    annotations = dict(now)
    for key in fixed:
        if key in was:
            annotations[key] = was[key]
        else:
            annotations.pop(key, None)
    return replace(new, template=replace(new.template, annotations=annotations))


def admitted_as(pod: PodRecord, charged: tuple[tuple[str, str], ...]) -> PodRecord:
    """``pod`` with the annotations its charge is read from as it was admitted (``charged``)."""
    annotations = {k: v for k, v in pod.template.annotations.items() if k not in keys.CHARGED}
    return replace(pod, template=replace(pod.template, annotations=annotations | dict(charged)))


def compute_charged(template: PodTemplate, inventory: Inventory, policy: Policy) -> tuple[int, int] | None:
    """CPU (millicores) and memory (bytes) the CPU/memory check charges one pod of ``template``:
    None when the check is off, the pod is not Volcano's to schedule, requests neither, or uses
    cards while card pods are unlimited."""
    if not policy.cpu_memory_check or template.scheduler not in policy.volcano_schedulers:
        return None
    cpu, memory = template.resources.cpu, template.resources.memory
    if not cpu and not memory:
        return None
    if policy.card_unlimited_cpu_memory and not isinstance(
        pod_demand(template, inventory, policy), NotCardPod
    ):
        return None  # a pod that uses cards
    return cpu, memory


class PodIndex:
    """The live pods' charges, and the pods of each PodGroup, node and owner."""

    def __init__(self, tree: QueueTree, free: FreeCards) -> None:
        self._tree, self._free = tree, free
        self._charges: dict[str, Charge] = {}
        self._compute: dict[str, ComputeCharge] = {}
        self._compute_used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self._by_group, self._by_node, self._by_owner = Members(), Members(), Members()
        self._group_cards: dict[str, Counter[CardSpec]] = defaultdict(Counter)
        self._group_bound: Counter[str] = Counter()  # PodGroup key -> its bound live pods
        self._unbound = Unbound()

    def add(self, pod: PodRecord, charge: Charge | None, compute: ComputeCharge | None) -> str:
        """Index ``pod`` with its charges; returns its PodGroup's key when the group's demand
        changed, else ""."""
        if pod.group_name:
            self._by_group.add(f"{pod.namespace}/{pod.group_name}", pod.uid)
        if pod.node_name:
            self._by_node.add(pod.node_name, pod.uid)
        if pod.owner is not None:
            self._by_owner.add(pod.owner.uid, pod.uid)
        if compute is not None:
            self._compute[pod.uid] = compute
            used = self._compute_used[compute.queue]
            used[0] += compute.cpu
            used[1] += compute.memory
        if charge is None:
            return ""
        self._charges[pod.uid] = charge
        self._count(pod, charge, +1)
        return charge.group

    def remove(self, pod: PodRecord) -> str:
        """Take back everything ``add`` did for ``pod``; returns the PodGroup whose demand changed."""
        uid = pod.uid
        if pod.group_name:
            self._by_group.discard(f"{pod.namespace}/{pod.group_name}", uid)
        self._by_node.discard(pod.node_name, uid)
        if pod.owner is not None:
            self._by_owner.discard(pod.owner.uid, uid)
        compute = self._compute.pop(uid, None)
        if compute is not None:
            used = self._compute_used[compute.queue]
            used[0] -= compute.cpu
            used[1] -= compute.memory
        charge = self._charges.pop(uid, None)
        if charge is None:
            return ""
        self._count(pod, charge, -1)
        return charge.group

    def _count(self, pod: PodRecord, charge: Charge, sign: int) -> None:
        self._tree.count(charge.queue, charge=charge, sign=sign)
        if charge.bound and charge.card is not None:
            self._free.use(pod.node_name, charge.card, sign * charge.count)
        elif charge.card is not None and not pod.node_name:
            who = charge.group or (pod.owner.uid if pod.owner is not None else "")
            if sign > 0:
                self._unbound.add(pod.uid, (charge.card, charge.queue), who)
            else:
                self._unbound.discard(pod.uid, (charge.card, charge.queue), who)
        if charge.group:
            self._group_cards[charge.group][charge.spec] += sign * charge.count
            if charge.bound:
                self._group_bound[charge.group] += sign

    def charge(self, uid: str) -> Charge | None:
        return self._charges.get(uid)

    def compute_used(self, queue: str) -> tuple[int, int]:
        """CPU (millicores) and memory (bytes) the live pods of ``queue`` are charged."""
        used = self._compute_used.get(queue)
        return (used[0], used[1]) if used else (0, 0)

    def unbound(self) -> Set[str]:
        """The live pods of one card model that no node holds yet."""
        return self._unbound.uids()

    @property
    def unbound_lines(self) -> Unbound:
        """The same pods in lines per model and queue (``Unbound``)."""
        return self._unbound

    def in_group(self, key: str) -> Set[str]:
        return self._by_group.of(key)

    def on_node(self, node: str) -> Set[str]:
        return self._by_node.of(node)

    def owned_by(self, uid: str) -> Set[str]:
        return self._by_owner.of(uid)

    def group_demand(self, key: str) -> Counter[CardSpec]:
        """What a PodGroup's existing pods charge, per card spec."""
        return self._group_cards.get(key) or Counter()

    def group_bound(self, key: str) -> int:
        """How many of a PodGroup's live pods are bound to a node."""
        return self._group_bound.get(key, 0)


class Charger:
    """Works out each pod's card charge, pooled (equal charges are one object); while many pods are
    loaded at once (``batch``: nodes and queues do not change meanwhile), once per template."""

    def __init__(
        self, inventory: Inventory, policy: Policy, pool: compact.Pool, queue_of: Callable[[PodRecord], str]
    ) -> None:
        self._inventory, self._policy, self._pool, self._queue_of = inventory, policy, pool, queue_of
        self._memo: dict[Any, Any] | None = None

    @contextmanager
    def batch(self) -> Iterator[None]:
        self._memo = {}  # id(template) -> demand, (id(demand), queue, ...) -> charge: alive meanwhile
        try:
            yield
        finally:
            self._memo = None

    def card(self, pod: PodRecord, node: NodeCards | None, fixed: PodDemand | None = None) -> Charge | None:
        """``fixed``: the demand the pod was admitted or first charged with (a DRA pod's), else its
        demand is read from its template."""
        if pod.phase in TERMINAL_PHASES or pod.waiting is not None:
            return None
        memo = self._memo
        demand: Demand | None = fixed or (None if memo is None else memo.get(id(pod.template)))
        if demand is None:
            demand = pod_demand(pod.template, self._inventory, self._policy)
            if memo is not None:
                memo[id(pod.template)] = demand
        if not isinstance(demand, PodDemand):
            return None
        queue = self._queue_of(pod)
        if memo is None:
            charge = pod_charge(pod, demand, queue, node)
            return self._pool.share(charge) if charge is not None else None
        # What its card and bound depend on: an A|B pod's node, a one-model pod's being bound.
        where = pod.node_name if demand.spec.is_multi else bool(pod.node_name)
        key = (id(demand), queue, where, pod.namespace, pod.group_name)
        if (charge := memo.get(key)) is None:
            made = pod_charge(pod, demand, queue, node)
            charge = memo[key] = self._pool.share(made) if made is not None else None
        return charge

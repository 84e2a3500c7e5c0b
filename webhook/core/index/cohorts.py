"""Lending and borrowing idle cards of a model among the queues of a cohort (decisions.md §33).

A queue whose ``card.deserved`` names a model takes part for that model: it is entitled to its
deserved, lends what of it lies idle (at most its ``card.lendable``), and may use up to its
``card.quota`` (the ceiling, what the capacity-card plugin enforces) with cards the others of its
cohort lend. A queue or model without it is a wall, as before. The cohort is the queues of the same
nearest parent in the queue tree (the top-level queues are one cohort); a parent's own quota still
caps its whole subtree.

A queue's use of a model here is its load: every charge and reservation of it, each ``A|B`` pod
counted on each of its models, and what is admitted and not yet seen. So what a lender lends and
what a borrower borrows are never under-counted: no two queues are promised the same idle card.
"""

from collections.abc import Mapping

from webhook.core.index.state import ClusterState
from webhook.core.model.cards import CardName
from webhook.core.model.values import value_class


@value_class
class Share:
    """A taking-part queue's standing on one model: what it may use now and why."""

    quota: int  # the ceiling
    deserved: int
    borrowable: int  # idle cards of the model its cohort lends, less what others borrow already

    @property
    def cap(self) -> int:
        """What the queue may use of the model now: its deserved and what it may borrow, at most
        its quota."""
        return min(self.quota, self.deserved + self.borrowable)


def load(state: ClusterState, queue: str, card: CardName, exclude_ledger: str = "") -> int:
    """``queue``'s use of ``card``, every pod counted (``A|B`` on each model), in flight too."""
    tally = state.tree.tallies.get(queue)
    used = tally.load.get(card, 0) if tally is not None else 0
    if state.ledger:
        for (spec, per_pod), pods in state.ledger.held(queue, exclude_ledger).items():
            if card in spec.cards:
                used += per_pod * pods
    return used


@value_class
class Pool:
    """One cohort's lending of one model, worked out in one pass over its taking-part queues and
    kept while no queue, tally or hold changes (the tree's and the ledger's versions)."""

    used: Mapping[str, int]  # queue -> its load
    lends: Mapping[str, int]  # queue -> idle deserved it may lend now
    owes: Mapping[str, int]  # queue -> what it uses beyond its deserved
    lent: int  # the sum of ``lends``
    owed: int  # the sum of ``owes``


def pool(state: ClusterState, queue: str, card: CardName) -> Pool:
    """The lending of ``card`` in ``queue``'s cohort."""
    tree = state.tree
    at = (tree.version, state.ledger.version)
    if tree.pools_at != at:
        tree.pools.clear()
        tree.shares.clear()
        tree.pools_at = at
    chain = tree.ancestors.get(queue, ())
    key = (chain[0] if chain else "", card)
    found = tree.pools.get(key)
    if isinstance(found, Pool):
        return found
    used: dict[str, int] = {}
    lends: dict[str, int] = {}
    owes: dict[str, int] = {}
    for other in tree.cohort(queue):
        peer = tree.queues.get(other)
        if peer is None or peer.lending is None or card not in peer.lending.deserved:
            continue
        deserved, load_ = peer.lending.deserved[card], load(state, other, card)
        used[other] = load_
        lends[other] = min(peer.lending.lends(card), max(0, deserved - load_))
        owes[other] = max(0, load_ - deserved)
    made = Pool(used, lends, owes, sum(lends.values()), sum(owes.values()))
    tree.pools[key] = made
    return made


def share(state: ClusterState, queue: str, card: CardName) -> Share | None:
    """``queue``'s standing on ``card`` when it takes part in lending for it; None when its quota is
    a wall for that model (no ``card.deserved`` naming it)."""
    tree = state.tree
    if tree.pools_at == (tree.version, state.ledger.version):
        kept = tree.shares.get((queue, card))
        if isinstance(kept, Share):
            return kept
    info = tree.queues.get(queue)
    if info is None or info.lending is None or info.quota is None or card not in info.lending.deserved:
        return None
    lending = pool(state, queue, card)
    lent = lending.lent - lending.lends.get(queue, 0)
    owed = lending.owed - lending.owes.get(queue, 0)
    made = Share(info.quota.get(card, 0), info.lending.deserved[card], max(0, lent - owed))
    tree.shares[(queue, card)] = made
    return made


def caps(state: ClusterState, queue: str) -> dict[CardName, int] | None:
    """``queue``'s quota with each model it takes part for held to what it may use now; None
    without a card quota."""
    info = state.tree.queues.get(queue)
    if info is None or info.quota is None:
        return None
    if info.lending is None:
        return info.quota  # read only: nothing lent or borrowed, the quota as it is
    out = dict(info.quota)
    for card in info.lending.deserved:
        found = share(state, queue, card)
        if found is not None:
            out[card] = found.cap
    return out


def borrowing(state: ClusterState, queue: str, card: CardName, more: int) -> tuple[int, tuple[str, ...]]:
    """How many of ``more`` cards of ``card`` ``queue`` would use beyond its deserved, and from which
    queues of its cohort (those lending most first); (0, ()) inside its deserved or for a wall."""
    found = share(state, queue, card)
    if found is None:
        return 0, ()
    lending = pool(state, queue, card)
    used = lending.used.get(queue, 0)
    beyond = max(0, used + more - found.deserved) - max(0, used - found.deserved)
    return (beyond, lenders(state, queue, card)) if beyond else (0, ())


def beyond(state: ClusterState, queue: str, card: CardName, more: int = 0) -> int:
    """How much of ``card`` ``queue`` uses past its deserved with ``more`` cards counted in; 0 inside
    it, or for a queue that does not take part for the model."""
    found = share(state, queue, card)
    if found is None:
        return 0
    return max(0, pool(state, queue, card).used.get(queue, 0) + more - found.deserved)


def lenders(state: ClusterState, queue: str, card: CardName) -> tuple[str, ...]:
    """The queues of ``queue``'s cohort lending ``card`` now, those lending most first."""
    lending = pool(state, queue, card)
    return tuple(
        name for _, name in sorted((-n, name) for name, n in lending.lends.items() if n and name != queue)
    )


def needing(state: ClusterState, queue: str, card: CardName) -> tuple[str, ...]:
    """The other queues of ``queue``'s cohort taking part for ``card`` that use some of what they
    would lend and borrow none (their idle deserved is below their lendable): the queues whose cards
    a borrower above what it may use now still holds."""
    lending, out = pool(state, queue, card), []
    for other in sorted(lending.used):
        peer = state.tree.queues[other]
        assert peer.lending is not None  # the pool holds the taking-part queues only
        if other != queue and not lending.owes[other] and lending.lends[other] < peer.lending.lends(card):
            out.append(other)
    return tuple(out)


@value_class
class Standing:
    """A taking-part queue's figures on one model, for ``status`` and the metrics."""

    deserved: int
    used: int  # its load (see the module)
    borrowed: int  # beyond its deserved
    lendable: int  # idle deserved it may lend now
    lent: int  # of that, what others of its cohort borrow (the borrowing laid on lenders most first)


def standings(state: ClusterState, card: CardName) -> dict[str, Standing]:
    """Every queue taking part for ``card``, cohort by cohort: what each deserves, uses, borrows,
    may lend and lends. What a cohort borrows is laid on its lenders, those lending most first
    (then by name): the same order admission warnings name them in."""
    out: dict[str, Standing] = {}
    for members in state.tree.cohorts.values():
        lending = pool(state, next(iter(members)), card)
        owed = lending.owed
        for name in sorted(lending.used, key=lambda n: (-lending.lends[n], n)):
            lent = min(lending.lends[name], owed)
            owed -= lent
            peer = state.tree.queues[name].lending
            assert peer is not None  # the pool holds the taking-part queues only
            out[name] = Standing(
                peer.deserved[card], lending.used[name], lending.owes[name], lending.lends[name], lent
            )
    return out


def reclaims_for(state: ClusterState, queue: str, card: CardName) -> frozenset[str]:
    """The queues of ``queue``'s cohort borrowing ``card`` now, when ``queue`` takes part for it and
    is inside its deserved: their gangs give lent cards back to its pods that no node holds (one
    mechanism with tidal reclaim, another reason). Empty otherwise."""
    info = state.tree.queues.get(queue)
    if info is None or info.lending is None or card not in info.lending.deserved:
        return frozenset()
    lending = pool(state, queue, card)
    if lending.owes.get(queue, 0) or not lending.owed:
        return frozenset()
    return frozenset(name for name, owes in lending.owes.items() if owes)


def lends(state: ClusterState, queue: str) -> bool:
    """Whether ``queue`` takes part in lending for any model (its pods may take lent cards back)."""
    info = state.tree.queues.get(queue)
    return info is not None and info.lending is not None and bool(info.lending.deserved)

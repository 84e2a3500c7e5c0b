"""Tidal reclaim's victim choice (SPEC §5e): whole gangs of the same model only, lowest priority
first, never more than the waiting pods need. The oracle places pods by trying every assignment
and ranks every subset of gangs itself."""

from collections.abc import Mapping, Sequence
from itertools import combinations, product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.model import reclaim
from webhook.core.model.reclaim import INFERENCE, TRAINING, Gang, choose, victims, why_not

H200, R4090 = "NVIDIA-H200", "NVIDIA-GeForce-RTX-4090"
NODES = ("n0", "n1", "n2")


def gang(
    key: str,
    cards: Mapping[str, int],
    priority: int = 0,
    queue_priority: int = 20000,
    created: float = 0.0,
    **kw: object,
) -> Gang:
    fields: dict[str, object] = {
        "queue": "training",
        "reclaimable": True,
        "service": TRAINING,
        "preemptable": True,
        "card": H200,
    }
    fields.update(kw)
    return Gang(
        key=key,
        queue_priority=queue_priority,
        priority=priority,
        created=created,
        cards=dict(cards),
        pods=tuple(f"{key}-{i}" for i in range(sum(cards.values()))),
        **fields,  # type: ignore[arg-type]
    )


def fits(nodes: Mapping[str, int], needs: Sequence[int]) -> bool:
    """Every assignment of pods to nodes, tried: one where no node gives more than it has."""
    names = list(nodes)
    for where in product(range(len(names)), repeat=len(needs)):
        used = [0] * len(names)
        for pod, slot in zip(needs, where, strict=True):
            used[slot] += pod
        if all(used[i] <= max(nodes[n], 0) for i, n in enumerate(names)):
            return True
    return not needs


def after(free: Mapping[str, int], chosen: Sequence[Gang]) -> dict[str, int]:
    nodes = dict(free)
    for g in chosen:
        for node, n in g.cards.items():
            nodes[node] = nodes.get(node, 0) + n
    return nodes


def preference(chosen: Sequence[Gang]) -> tuple[object, ...]:
    """The test's own order of victim sets: highest (priority, queue priority, younger) first
    as low as possible, then fewer gangs, then fewer cards."""
    ranks = sorted(((g.priority, g.queue_priority, -g.created, g.key) for g in chosen), reverse=True)
    return (ranks[0] if ranks else (), len(chosen), sum(sum(g.cards.values()) for g in chosen), ranks)


def may_give(g: Gang, card: str, queue: str, priority: int) -> bool:
    return (
        g.card == card
        and g.queue != queue
        and g.service == TRAINING
        and g.reclaimable
        and g.queue_priority < priority
        and g.preemptable
    )


def test_free_cards_enough_take_nothing_and_too_few_in_all_take_nothing_either() -> None:
    big = gang("big", {"n0": 4})
    assert choose({"n0": 2}, [2], [big]) == ()
    assert choose({"n0": 0}, [8], [big]) is None
    assert (
        choose({"n0": 0, "n1": 0}, [3], [gang("a", {"n0": 2}), gang("b", {"n1": 2})]) is None
    )  # 3 on one node


def test_a_lower_priority_gang_goes_before_a_higher_one_even_when_it_frees_more() -> None:
    low = gang("low", {"n0": 4}, priority=10)
    high = gang("high", {"n0": 1}, priority=100)
    assert choose({"n0": 0}, [1], [high, low]) == (low,)


def test_among_equals_the_fewest_gangs_and_then_the_fewest_cards_and_the_youngest_first() -> None:
    one = gang("one", {"n0": 2}, created=1.0)
    two = gang("two", {"n0": 1}, created=2.0)
    three = gang("three", {"n0": 1}, created=3.0)
    # Same priority: the youngest goes first; its single card is not enough, and neither is the
    # next youngest's, so the set is the two youngest (highest rank: "two"), not "one".
    assert choose({"n0": 0}, [2], [one, two, three]) == (three, two)
    assert choose({"n0": 1}, [2], [one, two, three]) == (three,)  # never more


def test_victims_on_two_nodes_when_each_waiting_pod_needs_a_whole_node_worth() -> None:
    a, b, c = gang("a", {"n0": 4}), gang("b", {"n1": 4}), gang("c", {"n0": 2, "n1": 2})
    assert [g.key for g in choose({"n0": 0, "n1": 0}, [4, 4], [a, b, c]) or ()] == ["a", "b"]


def test_who_may_give_cards_back() -> None:
    ok = gang("ok", {"n0": 1}, queue_priority=20000)
    assert why_not(ok, H200, "inference", 80000) == ""
    cases = {
        "it holds NVIDIA-GeForce-RTX-4090, not NVIDIA-H200": gang("m", {"n0": 1}, card=R4090),
        "it is in the same queue": gang("q", {"n0": 1}, queue="inference"),
        "its service type is inference, not training": gang("i", {"n0": 1}, service=INFERENCE),
        'its queue "training" is not reclaimable': gang("r", {"n0": 1}, reclaimable=False),
        'its queue "training" has priority 80000, not below 80000': gang(
            "p", {"n0": 1}, queue_priority=80000
        ),
        "a pod of it is not preemptable (volcano.sh/preemptable)": gang("f", {"n0": 1}, preemptable=False),
    }
    for why, g in cases.items():
        assert why_not(g, H200, "inference", 80000) == why
        assert victims({"n0": 0}, [1], [g], H200, "inference", 80000) is None


def one_gang(keys: str, **attributes: st.SearchStrategy[object]) -> st.SearchStrategy[Gang]:
    fields: dict[str, st.SearchStrategy[object]] = {
        "cards": st.dictionaries(st.sampled_from(NODES), st.integers(1, 4), min_size=1, max_size=3),
        "priority": st.sampled_from([0, 10, 100]),
        "queue_priority": st.sampled_from([10000, 20000, 40000]),
        "created": st.integers(0, 5).map(float),
        **attributes,
    }
    return st.builds(gang, key=st.sampled_from(keys), **fields)


# Gangs that may give their cards back, and decoys that each break exactly one rule.
eligible_st = st.lists(one_gang("abcdef"), max_size=5, unique_by=lambda g: g.key)
decoys_st = st.lists(
    st.one_of(
        one_gang("uvwxyz", card=st.just(R4090)),
        one_gang("uvwxyz", service=st.sampled_from([INFERENCE, ""])),
        one_gang("uvwxyz", reclaimable=st.just(False)),
        one_gang("uvwxyz", preemptable=st.just(False)),
        one_gang("uvwxyz", queue=st.just("inference")),
        one_gang("uvwxyz", queue_priority=st.sampled_from([80000, 90000])),
    ),
    max_size=3,
    unique_by=lambda g: g.key,
)


@settings(max_examples=400, deadline=None)
@given(
    free=st.fixed_dictionaries({n: st.integers(0, 2) for n in NODES}),
    needs=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    eligible=eligible_st,
    decoys=decoys_st,
)
def test_victims_are_whole_gangs_of_the_model_only_the_smallest_set_by_priority_and_never_more(
    free: dict[str, int], needs: list[int], eligible: list[Gang], decoys: list[Gang]
) -> None:
    gangs = [*eligible, *decoys]
    chosen = victims(free, needs, gangs, H200, "inference", 80000)
    allowed = [g for g in gangs if may_give(g, H200, "inference", 80000)]
    sets = [
        s for k in range(len(allowed) + 1) for s in combinations(allowed, k) if fits(after(free, s), needs)
    ]
    if not sets:
        assert chosen is None
        return
    assert chosen is not None
    assert all(g in allowed for g in chosen)  # never another model, queue role or protected gang
    assert fits(after(free, chosen), needs)  # the waiting pods are placeable on real nodes
    for g in chosen:  # never more: without any one of them they are not
        assert not fits(after(free, [o for o in chosen if o is not g]), needs)
    assert preference(chosen) == min(preference(s) for s in sets)  # lowest priority first, fewest
    assert list(chosen) == sorted(chosen, key=lambda g: g.rank)  # evicted lowest first


def one_card_gangs(count: int) -> list[Gang]:
    return [gang(f"g{i:03}", {f"n{i:03}": 1}, created=float(i)) for i in range(count)]


def test_a_search_too_large_for_its_budget_stops_there_and_answers_the_greedy_set() -> None:
    """Twenty-two one-card pods and thirty-two one-card gangs, every node full: the smallest set is
    sought among millions of combinations. Every combination tried spends the budget (those that
    free too few too), so the search stops at it and the greedy answer comes instead: a set that
    places the pods, none of it unneeded."""
    gangs = one_card_gangs(32)
    free = {f"n{i:03}": 0 for i in range(32)}
    budget = reclaim.Budget(500)
    chosen = reclaim.choose(free, [1] * 22, gangs, budget)
    assert budget.left < 0  # spent: the search stopped at its budget
    assert chosen is not None and len(chosen) == 22
    assert fits_by_count(after(free, chosen), [1] * 22)
    assert all(not fits_by_count(after(free, [o for o in chosen if o is not g]), [1] * 22) for g in chosen)


def fits_by_count(nodes: Mapping[str, int], needs: Sequence[int]) -> bool:
    """One-card pods: they fit when the free cards are as many."""
    assert set(needs) == {1}
    return sum(max(n, 0) for n in nodes.values()) >= len(needs)


def test_placement_has_no_recursion_depth_and_answers_no_when_it_cannot_settle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The exact placement search walks without recursion: two thousand pods deep is no deeper for
    it (the recursive one failed at about a thousand). A question it cannot settle within its
    budget, asked alone, is answered no: nobody is evicted for pods not known to fit."""
    monkeypatch.setattr(reclaim, "_first_fit", lambda rooms, pods: False)  # the exact search, alone
    rooms = {f"n{i}": 3 for i in range(1000)}
    assert reclaim.placeable(rooms, [2] * 1000 + [1] * 1000)
    assert not reclaim.placeable(rooms, [2] * 1000 + [1] * 1001)  # one card too many: by the sum
    tens = {f"n{i}": 10 for i in range(12)}
    assert not reclaim.placeable(tens, [7] * 13, reclaim.Budget(10**6))  # thirteen 7s, twelve nodes
    feasible = [7] * 12 + [3] * 12
    assert reclaim.placeable(tens, feasible, reclaim.Budget(10**6))
    with pytest.raises(reclaim.Exhausted):
        reclaim.placeable(tens, feasible, reclaim.Budget(5))
    monkeypatch.setattr(reclaim, "PLACE_BUDGET", 5)
    assert not reclaim.placeable(tens, feasible)  # asked alone, unsettled: no


def fits_rooms(nodes: Mapping[str, tuple[int, ...]], needs: Sequence[tuple[int, ...]]) -> bool:
    """Every assignment of pods to nodes, tried: one where no node gives more of anything than it has."""
    names = list(nodes)
    for where in product(range(len(names)), repeat=len(needs)):
        used = [[0] * len(nodes[n]) for n in names]
        for pod, slot in zip(needs, where, strict=True):
            used[slot] = [u + p for u, p in zip(used[slot], pod, strict=True)]
        if all(all(u <= h for u, h in zip(used[i], nodes[n], strict=True)) for i, n in enumerate(names)):
            return True
    return not needs


ROOM = st.tuples(st.integers(0, 4), st.integers(0, 8))
POD = st.tuples(st.integers(1, 2), st.integers(0, 6))


@settings(max_examples=400, deadline=None)
@given(st.lists(ROOM, min_size=1, max_size=3), st.lists(POD, max_size=4), st.booleans())
def test_placement_over_cards_and_cpu_is_exact(
    rooms: list[tuple[int, int]], pods: list[tuple[int, int]], search_only: bool
) -> None:
    """With CPU beside the cards, a pod fits a node only where both hold it: the answer is the
    oracle's, by the quick paths or by the exact search alone."""
    nodes = {f"n{i}": room for i, room in enumerate(rooms)}
    if search_only:
        first_fit = reclaim._first_fit_rooms
        reclaim._first_fit_rooms = lambda rooms, pods: False  # type: ignore[assignment]
    try:
        assert reclaim.placeable(nodes, pods, reclaim.Budget(10**6)) == fits_rooms(nodes, pods)
    finally:
        if search_only:
            reclaim._first_fit_rooms = first_fit  # type: ignore[assignment]


def test_a_gang_that_frees_cards_but_not_the_cpu_the_pod_asks_is_not_a_victim() -> None:
    """n0's gang frees its card but the node keeps too little CPU for the pod (a pod of no gang
    holds the rest); n1's gang frees both: only n1's goes, and the free card alone decides nothing."""
    low = gang("low", {"n0": 1}, frees={"n0": (1000,)})
    high = gang("high", {"n1": 1}, priority=5, frees={"n1": (4000,)})
    free = {"n0": (0, 2000), "n1": (0, 0), "n2": (1, 1000)}
    assert choose(free, [(1, 4000)], [low, high]) == (high,)
    assert choose(free, [(1, 4000)], [low]) is None
    assert choose(free, [(1, 1000)], [low, high]) == ()  # n2's free card and CPU hold it

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.cards import CardName
from webhook.core.feasibility import Group, fits, place

A, B, C = CardName("A"), CardName("B"), CardName("C")


def greedy_fits(capacity: dict[CardName, int], groups: list[Group], request: Group) -> bool:
    """What a per-alternative greedy check does: flexible demand sits on its first choice."""
    left = dict(capacity)
    for group in groups:
        left[group.cards[0]] = left.get(group.cards[0], 0) - group.demand
    return any(left.get(card, 0) >= request.demand for card in request.cards)


@pytest.mark.parametrize(
    ("capacity", "groups", "request_", "expected"),
    [
        pytest.param(
            {A: 1, B: 1},
            [Group((A, B), 1, 1)],
            Group((A,), 1, 1),
            True,
            id="fits only by moving pending A|B to B",
        ),
        pytest.param(
            {A: 1, B: 1},
            [Group((A, B), 1, 2)],
            Group((A, B), 1, 1),
            False,
            id="N pending A|B never over-admit",
        ),
        pytest.param({A: 1, B: 1}, [], Group((A, B), 2, 1), False, id="a pod is never split across models"),
        pytest.param(
            {A: 4, B: 2}, [Group((A, B), 2, 2)], Group((A,), 1, 2), True, id="mixed sizes: exact search"
        ),
        pytest.param(
            {A: -2, B: 1}, [], Group((B,), 1, 1), True, id="over-use of one card does not block another"
        ),
        pytest.param(
            {A: 8},
            [Group((A,), 3, 3)],
            Group((A,), 1, 1),
            False,
            id="demand already waiting over quota comes first",
        ),
        pytest.param({A: 0}, [], Group((A,), 1, 1), False, id="no room"),
        pytest.param(
            {A: 3, B: 0, C: 2},
            [Group((A, C), 1, 3), Group((B, C), 1, 1)],
            Group((A, B, C), 1, 1),
            True,
            id="chain",
        ),
    ],
)
def test_exact_feasibility(
    capacity: dict[CardName, int], groups: list[Group], request_: Group, expected: bool
) -> None:
    assert fits(capacity, groups, request_) is expected


def test_the_reassignment_case_is_one_a_greedy_check_gets_wrong() -> None:
    capacity, groups, request_ = {A: 1, B: 1}, [Group((A, B), 1, 1)], Group((A,), 1, 1)
    assert fits(capacity, groups, request_) and not greedy_fits(capacity, groups, request_)


cards = st.sampled_from([A, B, C])
groups_st = st.builds(
    Group,
    st.lists(cards, min_size=1, max_size=3, unique=True).map(tuple),
    st.integers(1, 3),
    st.integers(0, 3),
)
capacity_st = st.fixed_dictionaries({A: st.integers(-2, 8), B: st.integers(-2, 8), C: st.integers(-2, 8)})


def brute_force(capacity: dict[CardName, int], groups: list[Group]) -> int:
    """Try every way of giving each pod one alternative or nothing."""
    pods = [(g.cards, g.per_pod) for g in groups for _ in range(g.pods)]
    best = 0
    for choice in itertools.product(*[[None, *alts] for alts, _ in pods]):
        used = {card: 0 for card in capacity}
        for (_, size), card in zip(pods, choice, strict=True):
            if card is not None:
                used[card] += size
        if all(used[c] <= max(0, capacity[c]) for c in capacity):
            best = max(
                best, sum(size for (_, size), card in zip(pods, choice, strict=True) if card is not None)
            )
    return best


@settings(max_examples=150, deadline=None)
@given(capacity_st, st.lists(groups_st, max_size=3))
def test_placement_is_the_true_optimum(capacity: dict[CardName, int], groups: list[Group]) -> None:
    assert place(capacity, groups).total == brute_force(capacity, groups)


@settings(max_examples=300, deadline=None)
@given(
    capacity_st,
    st.lists(groups_st, max_size=4),
    groups_st.filter(lambda g: g.pods > 0),
    cards,
    st.integers(1, 3),
)
def test_admitting_is_monotone_in_free_quota(
    capacity: dict[CardName, int], groups: list[Group], request_: Group, card: CardName, more: int
) -> None:
    if fits(capacity, groups, request_):
        assert fits({**capacity, card: capacity[card] + more}, groups, request_)


@given(capacity_st, st.lists(groups_st, max_size=4))
def test_placement_never_exceeds_capacity_or_demand(
    capacity: dict[CardName, int], groups: list[Group]
) -> None:
    placement = place(capacity, groups)
    for card in capacity:
        assert sum(n for (_, c), n in placement.placed.items() if c == card) <= max(0, capacity[card])
    for index, group in enumerate(groups):
        assert sum(n for (i, _), n in placement.placed.items() if i == index) <= group.demand

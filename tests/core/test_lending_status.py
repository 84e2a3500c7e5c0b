"""What ``status`` shows of idle cards lent and borrowed in a cohort (decisions.md §33): per queue
and model that takes part, what it deserves, may use now, borrows, may lend and lends; the quota
column stays the quota; and the warnings, each case beside its twin."""

from typing import Any

from tests.builders import H200, cluster
from tests.core.test_borrowing import NODES, lender, running
from webhook.core.decide.report import cluster_status, overcommitted, status_table
from webhook.core.index.state import ClusterState

HEAD = "QUEUE            CARD                                      DESERVED MAY USE BORROWED LENDABLE  LENT"


def cohort(a_runs: int, b_runs: int, *more: dict[str, Any]) -> ClusterState:
    """``a`` (quota 4, deserved 2) and ``b`` (quota 2, deserved 2) lend and borrow H200; ``w``
    (quota 2, no card.deserved) is a wall."""
    return cluster(
        *NODES,
        lender("a", {H200: 4}, {H200: 2}),
        lender("b", {H200: 2}, {H200: 2}),
        lender("w", {H200: 2}),
        *(running(f"a{i}", "a") for i in range(a_runs)),
        *(running(f"b{i}", "b") for i in range(b_runs)),
        *more,
    )


def row(queue: str, *figures: int) -> str:
    deserved, may_use, borrowed, lendable, lent = figures
    return f"{queue:<16} {H200:<41} {deserved:>8} {may_use:>7} {borrowed:>8} {lendable:>8} {lent:>5}"


def test_a_borrower_and_its_lender_show_deserved_may_use_borrowed_lendable_and_lent() -> None:
    status = cluster_status(cohort(3, 1, running("w0", "w")))
    figures = {"bound": 0, "pending": 0, "reserved": 0, "in_flight": 0}
    assert status["queues"]["a"][H200] == {
        **figures,
        "quota": 4,  # its quota, not the 3 it may use now
        "bound": 3,
        "free": 0,  # of what it may use now
        "deserved": 2,
        "may_use": 3,
        "borrowed": 1,
        "lendable": 0,
        "lent": 0,
    }
    assert status["queues"]["b"][H200] == {
        **figures,
        "quota": 2,
        "bound": 1,
        "free": 1,
        "deserved": 2,
        "may_use": 2,
        "borrowed": 0,
        "lendable": 1,
        "lent": 1,
    }
    table = status_table(status)
    assert f"a                {H200:<41}     4     3    0    0     0" in table
    lending = table.split(HEAD)[1].split("\n\n")[0].strip("\n").splitlines()
    assert lending == [row("a", 2, 3, 1, 0, 0), row("b", 2, 2, 0, 1, 1)]
    assert status["warnings"] == []


def test_twin_a_queue_without_card_deserved_shows_what_it_showed_before() -> None:
    status = cluster_status(cohort(3, 1, running("w0", "w")))
    assert status["queues"]["w"][H200] == {
        "quota": 2,
        "bound": 1,
        "pending": 0,
        "reserved": 0,
        "in_flight": 0,
        "free": 1,
    }
    table = status_table(status)
    assert f"w                {H200:<41}     2     1    0    0     1" in table
    assert "\nw " not in table.split(HEAD)[1]


def test_twin_no_queue_takes_part_no_lending_section() -> None:
    state = cluster(*NODES, lender("a", {H200: 4}), lender("b", {H200: 2}), running("a0", "a"))
    status = cluster_status(state)
    assert all(
        set(per_card[H200]) == {"quota", "bound", "pending", "reserved", "in_flight", "free"}
        for per_card in status["queues"].values()
    )
    assert "LENT AND BORROWED" not in status_table(status) and "DESERVED" not in status_table(status)


def test_a_borrower_whose_lender_came_back_is_warned_within_its_quota() -> None:
    """``a`` borrowed both idle H200 of ``b``; ``b`` now runs one of its own: ``a`` may use 3 and
    uses 4, within its quota of 4."""
    state = cohort(4, 1)
    status = cluster_status(state)
    assert status["queues"]["a"][H200]["quota"] == 4 and status["queues"]["a"][H200]["free"] == -1
    assert status["warnings"] == [
        f'queue "a" borrows 1 {H200} that queue "b" now needs (it uses 4, may use 3 now: deserved 2, quota 4):'
        f" pods of those queues that no node holds take them back from its gangs (tidal reclaim), and new pods"
        f' of queue "a" on {H200} wait until its use falls to 3'
    ]
    assert overcommitted(state) == []  # within its quota: not over it


def test_twin_above_its_quota_is_the_quota_warning_and_not_the_borrowing_one() -> None:
    state = cohort(5, 1)
    assert cluster_status(state)["warnings"] == [f'queue "a" uses 5 {H200}, above its quota of 4']
    ((queue, card, over, _),) = overcommitted(state)
    assert (queue, card, over) == ("a", H200, 1000)


def test_twin_the_lender_idle_again_no_warning() -> None:
    assert cluster_status(cohort(4, 0))["warnings"] == []


def test_the_warning_names_every_queue_that_needs_its_cards_and_none_when_none_does() -> None:
    c = lender("c", {H200: 1}, {H200: 1})  # runs its one: lends none
    both = cluster_status(cohort(4, 1, c, running("c0", "c")))["warnings"]
    assert f'queue "a" borrows 1 {H200} that queues "b" and "c" now need (it uses 4, may use 3' in both[0]
    lowered = cluster(
        *NODES,
        lender("a", {H200: 4}, {H200: 2}),
        lender("b", {H200: 2}, {H200: 2}, lendable={H200: 1}),
        *(running(f"a{i}", "a") for i in range(4)),
    )  # b lends one at most now: a borrows one it no longer lends, b uses none of it
    (told,) = cluster_status(lowered)["warnings"]
    assert told.startswith(f'queue "a" borrows 1 {H200} more than its cohort lends now (it uses 4, may use 3')

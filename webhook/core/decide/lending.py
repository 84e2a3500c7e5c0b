"""What ``status`` shows of the idle cards lent and borrowed in a cohort (decisions.md §33): per
queue and model it takes part for, what it deserves, may use now, borrows, may lend and lends; and
the warning for a queue that borrows more than its cohort lends now."""

from typing import Any

from webhook.core.index import cohorts
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import CardUse
from webhook.core.model import keys
from webhook.core.model.cards import CardName, amount, figure


class Standings:
    """Every taking-part queue's standing, per model, worked out once for one status."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._cards: dict[CardName, dict[str, cohorts.Standing]] = {}

    def figures(self, queue: str, card: CardName, use: CardUse) -> dict[str, int | float]:
        """``deserved``, ``may_use`` (its deserved and what it may borrow, at most its quota),
        ``borrowed``, ``lendable`` and ``lent``, in cards; nothing for a model it does not take
        part for."""
        if use.share is None:
            return {}
        if card not in self._cards:
            self._cards[card] = cohorts.standings(self._state, card)
        standing = self._cards[card].get(queue)
        if standing is None:
            return {}
        return {
            "deserved": figure(standing.deserved),
            "may_use": figure(use.share.cap),
            "borrowed": figure(standing.borrowed),
            "lendable": figure(standing.lendable),
            "lent": figure(standing.lent),
        }


def borrows_too_much(state: ClusterState, queue: str, card: CardName, use: CardUse) -> str | None:
    """The warning for a queue that uses more of ``card`` than it may now but no more than its
    quota: it borrows cards its cohort no longer lends (a lender uses its own again)."""
    if use.share is None or not use.quota < use.used <= use.ceiling:
        return None
    over = amount(use.used - use.quota)
    share = use.share
    figures = (
        f"it uses {amount(use.used)}, may use {amount(use.quota)} now:"
        f" deserved {amount(share.deserved)}, quota {amount(share.quota)}"
    )
    match cohorts.needing(state, queue, card):
        case ():
            head = f'queue "{queue}" borrows {over} {card} more than its cohort lends now'
        case (one,):
            head = f'queue "{queue}" borrows {over} {card} that queue "{one}" now needs'
        case (*many, last):
            names = ", ".join(f'"{name}"' for name in many)
            head = f'queue "{queue}" borrows {over} {card} that queues {names} and "{last}" now need'
    return (
        f"{head} ({figures}): pods of those queues that no node holds take them back from its gangs"
        f' (tidal reclaim), and new pods of queue "{queue}" on {card} wait until its use falls to'
        f" {amount(use.quota)}"
    )


def table(queues: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """The status table's section on lending, when any queue takes part."""
    rows = [
        f"{queue:<16} {card:<41} {n['deserved']:>8} {n['may_use']:>7} {n['borrowed']:>8}"
        f" {n['lendable']:>8} {n['lent']:>5}"
        for queue, per_card in queues.items()
        for card, n in per_card.items()
        if "deserved" in n
    ]
    if not rows:
        return []
    return [
        "",
        f"LENT AND BORROWED IN A COHORT (the models a queue's {keys.CARD_DESERVED} names)",
        f"{'QUEUE':<16} {'CARD':<41} DESERVED MAY USE BORROWED LENDABLE  LENT",
        *rows,
    ]

"""Free cards on nodes, per model: what the multi-card assignment prefers (SPEC §5b).

A node's free cards of a model are its allocatable count of that card minus what the card pods
bound to it use. The question the assignment asks, "has some node of model M at least n free
cards now?", is answered from a histogram per model (how many nodes have each number of free
cards), so it costs the number of distinct free counts, never the number of nodes. Kept lean: a
node's cards are the discovery's own tuple, and bound use one integer per node and model in use.
"""

from webhook.core.model.cards import CardName
from webhook.core.model.nodes import NodeCard, NodeCards


class FreeCards:
    def __init__(self) -> None:
        self._cards: dict[str, tuple[NodeCard, ...]] = {}  # node -> its cards (allocatable)
        self._used: dict[tuple[str, CardName], int] = {}  # (node, card) -> bound use
        self._nodes_with: dict[CardName, dict[int, int]] = {}  # card -> free count -> nodes

    def set_node(self, cards: NodeCards) -> None:
        """A node appeared or changed its cards (its bound use stays)."""
        self._count_node(cards.node, -1)
        self._cards[cards.node] = cards.cards
        self._count_node(cards.node, +1)

    def delete_node(self, node: str) -> None:
        self._count_node(node, -1)
        self._cards.pop(node, None)

    def use(self, node: str, card: CardName, count: int) -> None:
        """``count`` cards of ``card`` more (or fewer, negative) are used by pods bound to ``node``."""
        capacity = self._capacity(node, card)
        key = (node, card)
        used = self._used.get(key, 0)
        if capacity is not None:
            self._move(card, capacity - used, -1)
        if used + count:
            self._used[key] = used + count
        else:
            self._used.pop(key, None)
        if capacity is not None:
            self._move(card, capacity - used - count, +1)

    def has_free(self, card: CardName, count: int) -> bool:
        """Whether some node of ``card`` has ``count`` of it free now."""
        return any(free >= count for free in self._nodes_with.get(card, ()))

    def nodes_of(self, card: CardName) -> dict[str, int]:
        """Every node that has ``card``, and how many of it are free there."""
        return {node: free for node in self._cards if (free := self.free_of(node, card)) is not None}

    def nodes(self) -> list[str]:
        """Every node with cards, as a list of its own (a reading in steps walks it while the
        nodes change)."""
        return list(self._cards)

    def free_of(self, node: str, card: CardName) -> int | None:
        """The free cards of ``card`` on ``node``; None when the node has none of it."""
        capacity = self._capacity(node, card)
        return None if capacity is None else capacity - self._used.get((node, card), 0)

    def free_on(self, node: str, card: CardName) -> int:
        return (self._capacity(node, card) or 0) - self._used.get((node, card), 0)

    def _capacity(self, node: str, card: CardName) -> int | None:
        return next((c.count for c in self._cards.get(node, ()) if c.name == card), None)

    def _count_node(self, node: str, sign: int) -> None:
        for card in self._cards.get(node, ()):
            self._move(card.name, card.count - self._used.get((node, card.name), 0), sign)

    def _move(self, card: CardName, free: int, sign: int) -> None:
        nodes = self._nodes_with.setdefault(card, {})
        left = nodes.get(free, 0) + sign
        if left:
            nodes[free] = left
        else:
            nodes.pop(free, None)
            if not nodes:
                del self._nodes_with[card]

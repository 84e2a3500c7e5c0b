"""Free cards on nodes, per model: what the multi-card assignment prefers (SPEC §5b).

A node's free cards of a model are its allocatable count of that card minus what the card pods
bound to it use. The question the assignment asks, "has some node of model M at least n free
cards now?", is answered from a histogram per model (how many nodes have each number of free
cards), so it costs the number of distinct free counts, never the number of nodes.
"""

from collections import Counter

from webhook.core.cards import CardName
from webhook.core.nodes import NodeCards


class FreeCards:
    def __init__(self) -> None:
        self._capacity: dict[str, dict[CardName, int]] = {}  # node -> card -> allocatable
        self._used: dict[str, Counter[CardName]] = {}  # node -> card -> bound use
        self._nodes_with: dict[CardName, Counter[int]] = {}  # card -> free count -> nodes

    def set_node(self, cards: NodeCards) -> None:
        """A node appeared or changed its cards (its bound use stays)."""
        self._forget(cards.node)
        self._capacity[cards.node] = {card.name: card.count for card in cards.cards}
        self._remember(cards.node)

    def delete_node(self, node: str) -> None:
        self._forget(node)
        self._capacity.pop(node, None)

    def use(self, node: str, card: CardName, count: int) -> None:
        """``count`` cards of ``card`` more (or fewer, negative) are used by pods bound to ``node``."""
        capacity = self._capacity.get(node, {})
        if card in capacity:
            self._move(card, capacity[card] - self._used.get(node, Counter())[card], -1)
        used = self._used.setdefault(node, Counter())
        used[card] += count
        if not used[card]:
            del used[card]
            if not used:
                del self._used[node]
        if card in capacity:
            self._move(card, capacity[card] - used[card], +1)

    def has_free(self, card: CardName, count: int) -> bool:
        """Whether some node of ``card`` has ``count`` of it free now."""
        return any(free >= count for free in self._nodes_with.get(card, {}))

    def free_on(self, node: str, card: CardName) -> int:
        return self._capacity.get(node, {}).get(card, 0) - self._used.get(node, Counter())[card]

    def _forget(self, node: str) -> None:
        for card, count in self._capacity.get(node, {}).items():
            self._move(card, count - self._used.get(node, Counter())[card], -1)

    def _remember(self, node: str) -> None:
        for card, count in self._capacity.get(node, {}).items():
            self._move(card, count - self._used.get(node, Counter())[card], +1)

    def _move(self, card: CardName, free: int, sign: int) -> None:
        nodes = self._nodes_with.setdefault(card, Counter())
        nodes[free] += sign
        if not nodes[free]:
            del nodes[free]
            if not nodes:
                del self._nodes_with[card]

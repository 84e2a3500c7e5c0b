"""Every node's cards (SPEC §3, §4b): read from its labels and capacity, and from the
ResourceSlices its DRA driver publishes, with the free cards per node (``freecards.FreeCards``) and
the inventory's models kept current with them."""

from collections.abc import Iterable

from webhook.core.index.freecards import FreeCards
from webhook.core.model.cards import CardName
from webhook.core.model.devices import SliceRecord
from webhook.core.model.inventory import Inventory
from webhook.core.model.nodes import NodeCards, with_devices
from webhook.core.model.placement import NodeFacts


class NodeBook:
    def __init__(self, inventory: Inventory, default_resource: str) -> None:
        self.cards: dict[str, NodeCards] = {}
        self.free = FreeCards()  # free cards per node and model, for the multi-card assignment
        self._inventory, self._default = inventory, default_resource
        self._labelled: dict[str, NodeCards] = {}  # each node's cards from its labels (SPEC §3)
        self.facts: dict[str, NodeFacts] = {}  # what decides which pods may land on it (tidal reclaim)

    def put(self, cards: NodeCards) -> set[CardName] | None:
        """Add or replace a node's cards as its labels give them; None when nothing changes, else
        the models whose resource name moved (every pod is charged again: rare)."""
        self._labelled[cards.node] = cards
        cards = with_devices(cards, self._inventory.devices.node_cards(cards.node), self._default)
        if self.cards.get(cards.node) == cards:
            return None
        self.cards[cards.node] = cards
        self.free.set_node(cards)
        return self._inventory.put(cards)

    def drop(self, name: str) -> set[CardName] | None:
        self._labelled.pop(name, None)
        self.facts.pop(name, None)
        if self.cards.pop(name, None) is None:
            return None
        self.free.delete_node(name)
        return self._inventory.remove(name)

    def put_slice(self, record: SliceRecord) -> list[NodeCards]:
        """A ResourceSlice put: the nodes (as labelled) whose cards are to be read again."""
        return self._relabelled(self._inventory.devices.put_slice(record))

    def drop_slice(self, name: str) -> list[NodeCards]:
        return self._relabelled(self._inventory.devices.drop_slice(name))

    def _relabelled(self, names: Iterable[str]) -> list[NodeCards]:
        return [self._labelled[name] for name in names if name in self._labelled]

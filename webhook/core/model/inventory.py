"""The cluster's cards by model: which resource and label key name each card, how many there are
and on which nodes, kept up to date one node at a time."""

from collections.abc import Mapping
from typing import Any

from webhook.core.model.cards import CardName
from webhook.core.model.claims import Devices
from webhook.core.model.nodes import NodeCards
from webhook.core.model.values import value_class


@value_class
class CardTotal:
    """A card model across the cluster."""

    name: CardName
    resource: str
    label_key: str
    product: str
    total: int
    nodes: tuple[str, ...]


@value_class
class CardSource:
    """Where a card's resource name and label key come from: the first node that showed it."""

    node: str
    resource: str
    label_key: str
    product: str


class Inventory:
    """The discovered map ``card name -> (resource, label key, product, total, nodes)``.

    Updated one node at a time; what the hot path reads (a card's resource and label key) is a
    dictionary look-up, and totals are summed only when asked for.
    """

    def __init__(self, devices: Devices | None = None) -> None:
        self.devices = devices or Devices()  # DRA: classes, slices, claims, templates (SPEC §4b)
        self.by_node: dict[str, NodeCards] = {}
        self._holders: dict[CardName, dict[str, int]] = {}
        self._sources: dict[CardName, CardSource] = {}
        self._resources: frozenset[str] | None = None
        self._memory: dict[str, int] | None = None  # product -> MiB per card (the least of its nodes)

    def put(self, node: NodeCards) -> set[CardName]:
        """Add or replace a node; returns the cards whose resource name changed (or vanished)."""
        before = self._resource_map(node.node)
        self._drop(node.node)
        self.by_node[node.node] = node
        for card in node.cards:
            self._holders.setdefault(card.name, {})[node.node] = card.count
            if card.name not in self._sources:
                self._sources[card.name] = CardSource(node.node, card.resource, node.label_key, node.product)
        self._resources = self._memory = None
        return self._changed(before)

    def remove(self, name: str) -> set[CardName]:
        before = self._resource_map(name)
        self._drop(name)
        self.by_node.pop(name, None)
        self._resources = self._memory = None
        return self._changed(before)

    def _resource_map(self, node: str) -> dict[CardName, str]:
        old = self.by_node.get(node)
        return {c.name: self._sources[c.name].resource for c in old.cards} if old else {}

    def _changed(self, before: dict[CardName, str]) -> set[CardName]:
        return {c for c, res in before.items() if self.resource(c) != res}

    def _drop(self, name: str) -> None:
        old = self.by_node.get(name)
        for card in old.cards if old else ():
            holders = self._holders.get(card.name, {})
            holders.pop(name, None)
            if not holders:
                self._holders.pop(card.name, None)
                self._sources.pop(card.name, None)
            elif self._sources[card.name].node == name:
                heir = min(holders)
                found = next(c for c in self.by_node[heir].cards if c.name == card.name)
                info = self.by_node[heir]
                self._sources[card.name] = CardSource(heir, found.resource, info.label_key, info.product)

    def resource(self, card: CardName) -> str | None:
        source = self._sources.get(card)
        return source.resource if source else None

    def label_key(self, card: CardName) -> str | None:
        source = self._sources.get(card)
        return source.label_key if source and source.label_key else None

    def __contains__(self, card: object) -> bool:
        return card in self._sources

    def cards_of_resource(self, resource: str) -> list[CardName]:
        return sorted(card for card, source in self._sources.items() if source.resource == resource)

    def card_resources(self) -> frozenset[str]:
        if self._resources is None:
            self._resources = frozenset(source.resource for source in self._sources.values())
        return self._resources

    def total(self, card: CardName) -> CardTotal | None:
        source = self._sources.get(card)
        if source is None:
            return None
        holders = self._holders[card]
        return CardTotal(
            card,
            source.resource,
            source.label_key,
            source.product,
            sum(holders.values()),
            tuple(sorted(holders)),
        )

    @property
    def cards(self) -> dict[CardName, CardTotal]:
        """Every card with its total (sums over nodes: for status and warnings, not the hot path)."""
        return {card: total for card in sorted(self._sources) if (total := self.total(card)) is not None}

    def memory_mib(self, product: str) -> int | None:
        """MiB per card of a whole-card model: the least its nodes' labels say (a share is then
        never counted smaller than on the node it lands on)."""
        if self._memory is None:
            memory: dict[str, int] = {}
            for node in self.by_node.values():
                if node.product and node.memory_mib:
                    memory[node.product] = min(memory.get(node.product, node.memory_mib), node.memory_mib)
            self._memory = memory
        return self._memory.get(product)

    def shared(self) -> dict[str, dict[str, Any]]:
        """Per product, the nodes that share its cards, their cards (units) and sharing resources."""
        out: dict[str, dict[str, Any]] = {}
        for name in sorted(self.by_node):
            node = self.by_node[name]
            if not node.shared:
                continue
            entry = out.setdefault(node.product, {"nodes": 0, "cards": 0, "resources": {}})
            entry["nodes"] += 1
            entry["cards"] += node.shared_cards
            for resource, count in node.shared:
                entry["resources"][resource] = entry["resources"].get(resource, 0) + count
        return out

    def cluster_cards(self, card: CardName) -> int | None:
        """What the cluster has of ``card`` for the quota-sum warnings: the plugin's whole cards and
        the cards nodes share (units); None when no node carries it at all."""
        total = self.total(card)
        shared = sum(n.shared_cards for n in self.by_node.values() if n.shared and n.product == card)
        if total is None and not shared:
            return None
        return (total.total if total else 0) + shared

    def warnings(self) -> list[str]:
        return [w for node in sorted(self.by_node) for w in self.by_node[node].warnings]


def build_inventory(nodes: Mapping[str, NodeCards]) -> Inventory:
    inventory = Inventory()
    for name in sorted(nodes):
        inventory.put(nodes[name])
    return inventory

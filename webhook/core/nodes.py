"""Node card discovery: the very card names, resources and counts the capacity-card plugin derives.

Rules (SPEC §3), in the plugin's order:

1. Card info from labels: skip keys containing ``nvidia.com/mig-``; a key matching
   ``<vendor>/<type>.product`` whose ``.count`` and ``.memory`` siblings are non-empty gives
   the product, the resource prefix ``<vendor>`` and the affinity label key.
2. Card resources from ``status.allocatable`` (zero skipped, rounded up): ``nvidia.com/gpu.shared``
   is MPS, ``nvidia.com/mig-<p>`` is MIG, any other name starting with ``<vendor>`` is the
   whole card. A GPU-sharing resource (``volcano.sh/vgpu-number``, ``koordinator.sh/gpu-core``)
   is no card to the plugin; it is kept as the node's shared capacity of its product
   (``sharing``), for ``status``.
"""

import math
import re
from collections.abc import Mapping
from typing import Any

from webhook.core import keys
from webhook.core.cards import CardName, mig_card_name, mps_card_name, units
from webhook.core.quantity import QuantityError, ceil_quantity
from webhook.core.sharing import NODE_RESOURCES
from webhook.core.values import value_class

# The plugin's own pattern: lazy vendor up to the first '/', a word type, then '.product'.
_PRODUCT_LABEL = re.compile(r"^((.+?)/(\w+))\.product$")
_NVIDIA = "nvidia.com/"


@value_class
class NodeCard:
    """One card model on one node; ``count`` in card units."""

    name: CardName
    resource: str
    count: int


@value_class
class NodeCards:
    """What one node contributes: its product, the label key to select it, its cards."""

    node: str
    product: str = ""
    label_key: str = ""
    cards: tuple[NodeCard, ...] = ()
    warnings: tuple[str, ...] = ()
    memory_mib: int | None = None  # per card, from the ``<vendor>/<type>.memory`` label
    shared: tuple[tuple[str, int], ...] = ()  # GPU-sharing resources (Volcano vGPU, Koordinator)
    shared_cards: int = 0  # the physical cards behind them (the count label), in card units

    def card_names(self) -> frozenset[CardName]:
        return frozenset(card.name for card in self.cards)


@value_class
class _ProductInfo:
    product: str
    prefix: str
    label_key: str
    memory_mib: int | None
    count: int = 0  # the ``<vendor>/<type>.count`` label: physical cards


def round_half_away(value: float) -> int:
    """Go's math.Round: halves go away from zero (Python's round() goes to even)."""
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def mps_memory_gib(memory_mib: int) -> int:
    return round_half_away(memory_mib / 1024)


def _product_info(node: str, labels: Mapping[str, str], warnings: list[str]) -> _ProductInfo | None:
    found: list[_ProductInfo] = []
    for key in sorted(labels):
        if keys.MIG_PREFIX in key:
            continue
        match = _PRODUCT_LABEL.match(key)
        if not match:
            continue
        base, prefix = match[1], match[2]
        count, memory = labels.get(f"{base}.count", ""), labels.get(f"{base}.memory", "")
        if not count or not memory:
            continue
        memory_mib = int(memory) if memory.isdigit() else None
        if memory_mib is None:
            warnings.append(f"node {node}: label {base}.memory={memory!r} is not a whole number of MiB")
        found.append(_ProductInfo(labels[key], prefix, key, memory_mib, int(count) if count.isdigit() else 0))
    if len(found) > 1:
        chosen = ", ".join(info.label_key for info in found)
        warnings.append(
            f"node {node}: several product labels qualify ({chosen}); using {found[0].label_key}"
            " (the scheduler picks one at random: label the node with one card model)"
        )
    return found[0] if found else None


def discover_node_cards(node: str, labels: Mapping[str, str], allocatable: Mapping[str, object]) -> NodeCards:
    """The cards one node carries, by the plugin's rules; never raises on bad node data."""
    warnings: list[str] = []
    info = _product_info(node, labels, warnings)
    cards: dict[CardName, NodeCard] = {}
    shared: list[tuple[str, int]] = []
    for resource in sorted(allocatable):
        try:
            count = ceil_quantity(allocatable[resource])
        except QuantityError:
            warnings.append(
                f"node {node}: allocatable {resource}={allocatable[resource]!r} is not a quantity"
            )
            continue
        if count <= 0:
            continue
        if resource in NODE_RESOURCES:  # shares its cards: counted by the pods that share them
            if info is not None:
                shared.append((resource, count))
            continue
        card = _card_for_resource(node, resource, count, labels, info, warnings)
        if card is None:
            continue
        card = NodeCard(card.name, card.resource, units(count))
        if card.name in cards:
            warnings.append(
                f"node {node}: resources {cards[card.name].resource} and {resource} both map to"
                f" card {card.name}; counting {cards[card.name].resource}"
            )
            continue
        cards[card.name] = card
    if info is None and not cards:
        return NodeCards(node, warnings=tuple(warnings))
    if info is not None and not cards and not shared:
        warnings.append(f"node {node}: product {info.product} but no card resource in allocatable")
    return NodeCards(
        node,
        product=info.product if info else "",
        label_key=info.label_key if info else "",
        cards=tuple(cards.values()),
        warnings=tuple(warnings),
        memory_mib=info.memory_mib if info else None,
        shared=tuple(shared),
        shared_cards=units(info.count) if info and shared else 0,
    )


def _card_for_resource(
    node: str,
    resource: str,
    count: int,
    labels: Mapping[str, str],
    info: _ProductInfo | None,
    warnings: list[str],
) -> NodeCard | None:
    if resource == keys.MPS_RESOURCE:
        return _mps_card(node, resource, count, labels, info, warnings)
    if resource.startswith(keys.MIG_PREFIX):
        if info is None:
            warnings.append(f"node {node}: MIG resource {resource} but no product labels; not counted")
            return None
        return NodeCard(mig_card_name(info.product, resource.removeprefix(keys.MIG_PREFIX)), resource, count)
    if info is not None and resource.startswith(info.prefix):
        return NodeCard(CardName(info.product), resource, count)
    if info is None and resource.startswith(_NVIDIA):
        warnings.append(
            f"node {node}: {resource}={count} but no <vendor>/<type>.product label with non-empty"
            " .count and .memory siblings; not counted"
        )
    return None


def _mps_card(
    node: str,
    resource: str,
    count: int,
    labels: Mapping[str, str],
    info: _ProductInfo | None,
    warnings: list[str],
) -> NodeCard | None:
    replicas = labels.get(keys.MPS_REPLICAS_LABEL, "")
    if not replicas.isdigit() or int(replicas) <= 0:
        warnings.append(
            f"node {node}: {resource}={count} but label {keys.MPS_REPLICAS_LABEL}={replicas!r}"
            " is not a positive whole number; the shared cards count as nothing"
        )
        return None
    if info is None or info.memory_mib is None:
        warnings.append(f"node {node}: {resource}={count} but no usable product/memory labels; not counted")
        return None
    name = mps_card_name(info.product, mps_memory_gib(info.memory_mib), int(replicas))
    return NodeCard(name, resource, count)


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

    def __init__(self) -> None:
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

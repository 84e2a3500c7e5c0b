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
from dataclasses import replace

from webhook.core.model import keys
from webhook.core.model.cards import CardKind, CardName, mig_card_name, mps_card_name, parse_card_name, units
from webhook.core.model.quantity import QuantityError, ceil_quantity
from webhook.core.model.sharing import NODE_RESOURCES
from webhook.core.model.values import value_class

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
    devices: tuple[tuple[CardName, int], ...] = ()  # what its ResourceSlices publish (SPEC §4b), units

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


def with_devices(cards: NodeCards, devices: Mapping[CardName, int], default_resource: str) -> NodeCards:
    """The node's cards with the GPUs its ResourceSlices publish (whole cards, by card name). A GPU
    is counted once: a card both forms show counts the larger of the two (a node served by the
    device plugin and by DRA's extended-resource form shows the same GPUs twice). A card only DRA
    shows is requested through the resource the naming rules give it."""
    if not devices:
        return cards
    found = {card.name: card for card in cards.cards}
    for name in sorted(devices):
        count = units(devices[name])
        card = found.get(name)
        if card is None:
            parsed = parse_card_name(name)
            resource = (
                keys.MIG_PREFIX + parsed.mig_profile if parsed.kind is CardKind.MIG else default_resource
            )
            found[name] = NodeCard(name, resource, count)
        elif card.count < count:
            found[name] = NodeCard(name, card.resource, count)
    shown = tuple((name, units(devices[name])) for name in sorted(devices))
    return replace(cards, cards=tuple(found.values()), devices=shown)

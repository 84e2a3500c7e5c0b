"""A card pod's own placement constraints must not contradict its card spec (SPEC §4).

The scheduler charges a pod by its ``card.name``, not by the node it lands on, so a pod whose
nodeSelector, required node affinity or preset node picks another model would be charged for
one card and use another.
"""

from collections.abc import Mapping
from typing import Any

from webhook.core.index.state import ClusterState
from webhook.core.model.cards import CardName, CardSpec, product_of
from webhook.core.model.demand import label_key_of
from webhook.core.model.objects import PodTemplate


def _accepts(expression: Mapping[str, Any], product: str) -> bool:
    operator, values = expression.get("operator"), expression.get("values") or []
    if operator == "In":
        return product in values
    if operator == "NotIn":
        return product not in values
    return operator != "DoesNotExist"


def _describe(expression: Mapping[str, Any]) -> str:
    values = ",".join(str(v) for v in expression.get("values") or [])
    return f"{expression.get('key')} {expression.get('operator')} [{values}]".replace(" []", "")


def contradiction(
    state: ClusterState, template: PodTemplate, node_name: str, spec: CardSpec, what: str
) -> str:
    """A one-line explanation naming both sides, or "" when the constraints allow a model."""
    products = list(dict.fromkeys(product_of(card) for card in spec.cards))
    key = label_key_of(spec.cards[0], state.inventory, state.policy)
    selected = template.node_selector.get(key)
    if selected is not None and selected not in products:
        return f"{what} asks for card {spec.text} but its nodeSelector {key}={selected} selects another model"
    if template.required_terms:
        blocking: list[str] = []
        for term in template.required_terms:
            ours = [e for e in term.get("matchExpressions") or [] if e.get("key") == key]
            if any(all(_accepts(e, p) for e in ours) for p in products):
                break
            blocking.append(" and ".join(_describe(e) for e in ours))
        else:
            return (
                f"{what} asks for card {spec.text} but its required node affinity"
                f" ({' or '.join(blocking)}) selects no node of that model"
            )
    node = state.nodes.get(node_name) if node_name else None
    if node is not None and node.cards and not node.card_names() & set(spec.cards):
        carried = ", ".join(sorted(node.card_names()))
        return f"{what} asks for card {spec.text} but is preset to node {node_name}, which carries {carried}"
    return ""


def allowed_cards(
    state: ClusterState, template: PodTemplate, node_name: str, spec: CardSpec
) -> tuple[CardName, ...]:
    """The models of ``spec`` the pod's own nodeSelector, required node affinity and preset node
    let it land on, in the spec's order (what a multi-card pod may be assigned)."""
    if not template.node_selector and not template.required_terms and not node_name:
        return spec.cards
    key = label_key_of(spec.cards[0], state.inventory, state.policy)
    selected = template.node_selector.get(key)
    node = state.nodes.get(node_name) if node_name else None
    allowed: list[CardName] = []
    for card in spec.cards:
        product = product_of(card)
        if selected is not None and selected != product:
            continue
        if template.required_terms and not any(
            all(_accepts(e, product) for e in term.get("matchExpressions") or [] if e.get("key") == key)
            for term in template.required_terms
        ):
            continue
        if node is not None and node.cards and card not in node.card_names():
            continue
        allowed.append(card)
    return tuple(allowed)

"""The card demand of one pod (or one pod of a template): which cards, which resource, how many."""

from webhook.core.model import keys
from webhook.core.model.cards import (
    CardKind,
    CardName,
    CardNameError,
    CardSpec,
    parse_card_name,
    parse_card_spec,
    product_of,
    units,
)
from webhook.core.model.claims import IMPLICIT_PREFIX, ClaimDemand, Given, claims_demand, extended_requests
from webhook.core.model.devices import DeviceRequest
from webhook.core.model.inventory import Inventory
from webhook.core.model.objects import PodTemplate
from webhook.core.model.policy import Policy
from webhook.core.model.quantity import QuantityError, ceil_quantity
from webhook.core.model.sharing import Share, share_of, uses_sharing
from webhook.core.model.values import value_class


@value_class
class NotCardPod:
    """No ``card.name`` and no card resource: the webhook leaves it alone."""


@value_class
class UnnamedCardPod:
    """Requests a card resource but names no card: it would escape per-model quota."""

    resource: str
    count: int


@value_class
class PodDemand:
    """``count`` card units (``cards.UNIT`` a card) of one of ``spec``'s models, through
    ``resource``. ``origin``: the multi-card spec the pod asked for when the pod mutation assigned
    it the one model ``spec`` names (SPEC §5b); None otherwise."""

    spec: CardSpec
    resource: str
    count: int
    origin: CardSpec | None = None
    share: Share | None = None  # a shared GPU's request (Volcano vGPU, HAMi, Koordinator)
    claims: ClaimDemand | None = None  # the part asked through ResourceClaims (SPEC §4b)

    def count_on(self, card: CardName, inventory: Inventory) -> int:
        """The units of one pod on model ``card``: a byte share differs by model; ``count`` is the
        largest over the spec's models, what an unassigned pod is held at."""
        if self.claims is not None:
            return self.count - self.claims.count + self.claims.on(card)
        if self.share is None:
            return self.count
        units = self.share.units(inventory.memory_mib(product_of(card)))
        return units if isinstance(units, int) else self.count

    def asked_count(self, inventory: Inventory) -> int:
        """The units the workload's own template asks per pod (what its scale-up is held at): for a
        share assigned one model of an ``A|B`` spec, the largest over the spec's models."""
        if self.share is None or self.origin is None:
            return self.count
        return max(self.count_on(card, inventory) for card in self.origin.cards)

    @property
    def only_claims(self) -> bool:
        """Its GPUs all come through ResourceClaims: the claim holds the model, not the node (§6b)."""
        return self.claims is not None and self.count == self.claims.count

    @property
    def asked(self) -> CardSpec:
        """The spec the workload asked for: what scale-up holds and PodGroup requests are keyed by."""
        return self.origin or self.spec


@value_class
class BadDemand:
    """A card pod we must refuse; ``reason`` completes "pod X ..."."""

    reason: str


Demand = NotCardPod | UnnamedCardPod | PodDemand | BadDemand


def resource_of(card: CardName, inventory: Inventory, policy: Policy) -> str:
    """The resource name a card is requested through: discovered, else the naming rules."""
    if (resource := inventory.resource(card)) is not None:
        return resource
    parsed = parse_card_name(card)
    if parsed.kind is CardKind.MPS:
        return keys.MPS_RESOURCE
    if parsed.kind is CardKind.MIG:
        return keys.MIG_PREFIX + parsed.mig_profile
    return policy.default_resource


def label_key_of(card: CardName, inventory: Inventory, policy: Policy) -> str:
    return inventory.label_key(card) or policy.default_label_key


def is_card_resource(resource: str, inventory: Inventory, policy: Policy) -> bool:
    return (
        resource in inventory.card_resources()
        or resource in (policy.default_resource, keys.MPS_RESOURCE)
        or resource.startswith(keys.MIG_PREFIX)
    )


def quantity_of(template: PodTemplate, resource: str) -> int | None:
    """Limits first, then requests (the plugin's order), rounded up; None when neither has it."""
    for source in (template.resources.limits, template.resources.requests):
        if resource in source:
            try:
                return ceil_quantity(source[resource])
            except QuantityError:
                return 0
    return None


def spec_resource(spec: CardSpec, inventory: Inventory, policy: Policy) -> str | BadDemand:
    """The one resource all alternatives share, or why they do not."""
    if len(spec.cards) == 1:
        return resource_of(spec.cards[0], inventory, policy)
    resources = {card: resource_of(card, inventory, policy) for card in spec.cards}
    if len(set(resources.values())) > 1:
        listed = ", ".join(f"{card} is {res}" for card, res in resources.items())
        return BadDemand(
            f"names cards of different resources ({listed}): a device plugin would allocate all of"
            " them; split the workload into one per resource"
        )
    return next(iter(resources.values()))


def pod_demand(template: PodTemplate, inventory: Inventory, policy: Policy) -> Demand:
    """A pod's card demand: its extended resources (SPEC §4) and the GPUs its claims ask (§4b)."""
    plugin = _plugin_demand(template, inventory, policy)
    extended = _extended(template, inventory, policy)
    if not (template.claims or extended) or isinstance(plugin, BadDemand | UnnamedCardPod):
        return plugin
    named = plugin.spec if isinstance(plugin, PodDemand) else _named_spec(template)
    if isinstance(named, BadDemand):
        return named
    found = claims_demand(template.claims, template.namespace, inventory.devices, named, extended)
    if isinstance(found, str):
        return BadDemand(found)
    if found is None:
        if isinstance(plugin, PodDemand) and not plugin.count:
            return BadDemand(
                f"names card {plugin.spec.text} but requests 0 {plugin.resource} and its resource claims"
                f" ask no GPU: set resources.limits[{plugin.resource!r}], or claim the GPUs"
            )
        return plugin
    if isinstance(plugin, PodDemand):
        if plugin.count and plugin.spec != found.spec:
            return BadDemand(
                f"asks {plugin.spec.text} through {plugin.resource} and {found.spec.text} through"
                f" {found.told}: a pod's GPUs are one model"
            )
        count = plugin.count + found.count
        return PodDemand(found.spec, plugin.resource, count, plugin.origin, plugin.share, found)
    resource = spec_resource(found.spec, inventory, policy)
    resource = resource if isinstance(resource, str) else policy.default_resource
    return PodDemand(found.spec, resource, found.count, _origin(template, found.spec), None, found)


def allocated_demand(
    template: PodTemplate, inventory: Inventory, policy: Policy, given: Given, held: PodDemand | None
) -> PodDemand | None:
    """The demand of a pod whose claims are allocated (SPEC §4b; all of them, or, with nothing held,
    some): what they were ``given``, whatever their classes and templates say now, beside what it
    asks through its extended resources. ``held``: what it was admitted or first charged with, whose
    spec it keeps (its PodGroup's request is keyed by it) and whose device-plugin part it keeps;
    None: read from the pod now. None when it is charged for no GPU at all."""
    if held is not None:
        base: PodDemand | None = held
        plugin = held.count - (held.claims.count if held.claims is not None else 0)
    else:
        read = _plugin_demand(template, inventory, policy)
        base = read if isinstance(read, PodDemand) else None
        plugin = base.count if base is not None else 0
    if given.card is None or not given.count:  # its claims hold no GPU we count
        if base is None or not plugin:
            return None
        return PodDemand(base.spec, base.resource, plugin, base.origin, base.share)
    card = CardSpec((given.card,))
    claims = ClaimDemand(card, ((given.card, given.count),), given.named, (), given.told)
    if held is not None:
        return PodDemand(held.spec, held.resource, plugin + given.count, held.origin, held.share, claims)
    if base is not None and plugin:
        return PodDemand(card, base.resource, plugin + given.count, base.origin, base.share, claims)
    resource = spec_resource(card, inventory, policy)
    resource = resource if isinstance(resource, str) else policy.default_resource
    return PodDemand(card, resource, given.count, _origin(template, card), None, claims)


def known_card(template: PodTemplate, held: PodDemand | None) -> CardName | None:
    """The one model a claiming pod is known to be charged for without its allocation: what it was
    held at, else its own word; None when neither names one model."""
    spec = held.spec if held is not None else _named_spec(template)
    return spec.cards[0] if isinstance(spec, CardSpec) and not spec.is_multi else None


_CORE = frozenset({"cpu", "memory", "ephemeral-storage"})  # never a class's extended resource


def _extended(template: PodTemplate, inventory: Inventory, policy: Policy) -> tuple[DeviceRequest, ...]:
    """The pod's DRA extended resources (SPEC §4b): a class's implicit
    ``deviceclass.resource.kubernetes.io/<class>``, or its ``extendedResourceName`` where no device
    plugin serves that name (one a device plugin serves is read as before, once)."""
    devices = inventory.devices
    if not devices.drivers:
        return ()
    asked: dict[str, int] = {}
    classes = devices.classes
    for resource in {*template.resources.limits, *template.resources.requests}:
        if resource in _CORE or is_card_resource(resource, inventory, policy):
            continue
        if resource.startswith(IMPLICIT_PREFIX) or (
            classes and any(c.extended_resource == resource for c in classes.values())
        ):
            asked[resource] = quantity_of(template, resource) or 0
    return extended_requests(asked, devices) if asked else ()


def _named_spec(template: PodTemplate) -> CardSpec | BadDemand | None:
    """The model a pod names for claims that fix none: ours (``cardquota.volcano.sh/card``), which
    the capacity-card plugin does not read, else ``volcano.sh/card.name``."""
    for key in (keys.DRA_CARD, keys.CARD_NAME):
        raw = template.annotations.get(key)
        if raw is None:
            continue
        try:
            return parse_card_spec(raw)
        except CardNameError as exc:
            return BadDemand(f"has a malformed {key}: {exc}")
    return None


def _plugin_demand(template: PodTemplate, inventory: Inventory, policy: Policy) -> Demand:
    """The demand of the pod's extended resources alone."""
    raw = template.annotations.get(keys.CARD_NAME)
    if raw is None:
        return _unnamed(template, inventory, policy)
    try:
        spec = parse_card_spec(raw)
    except CardNameError as exc:
        return BadDemand(f"has a malformed {keys.CARD_NAME}: {exc}")
    resource = spec_resource(spec, inventory, policy)
    if isinstance(resource, BadDemand):
        return resource
    share = share_of(template.resources.limits, template.resources.requests, policy)
    if share is not None:
        return _shared(spec, resource, share, inventory, _origin(template, spec))
    count = quantity_of(template, resource)
    if count is not None and count < 0:
        return BadDemand(
            f"names card {spec.text} but requests {count} {resource}: a quantity is never negative; set"
            f" resources.limits[{resource!r}] to the number of cards per pod"
        )
    if not count and template.claims:
        return PodDemand(spec, resource, 0, _origin(template, spec))  # its claims may ask them
    if not count:
        return BadDemand(
            f"names card {spec.text} but requests {count or 0} {resource}: set"
            f" resources.limits[{resource!r}] to the number of cards per pod"
        )
    return PodDemand(spec, resource, units(count), _origin(template, spec))


def _shared(
    spec: CardSpec, resource: str, share: Share | str, inventory: Inventory, origin: CardSpec | None
) -> PodDemand | BadDemand:
    """A shared GPU's demand: per model, its share of one card of that model times its cards."""
    if isinstance(share, str):
        return BadDemand(share)
    counts = []
    for card in spec.cards:
        units = share.units(inventory.memory_mib(product_of(card)))
        if isinstance(units, str):
            return BadDemand(units if len(spec.cards) == 1 else f"{units} ({card})")
        counts.append(units)
    return PodDemand(spec, resource, max(counts), origin, share)


def _origin(template: PodTemplate, spec: CardSpec) -> CardSpec | None:
    """The multi-card spec an assigned pod asked for: our annotation, when it still holds the pod's
    one model; a stale or hand-written value that does not is ignored."""
    raw = template.annotations.get(keys.CARD_SPEC)
    if raw is None or spec.is_multi:
        return None
    try:
        origin = parse_card_spec(raw)
    except CardNameError:
        return None
    return origin if origin.is_multi and spec.cards[0] in origin.cards else None


def _unnamed(template: PodTemplate, inventory: Inventory, policy: Policy) -> Demand:
    for resource in sorted({*template.resources.limits, *template.resources.requests}):
        if is_card_resource(resource, inventory, policy) or uses_sharing((resource,)):
            count = quantity_of(template, resource) or 0
            if count > 0:
                return UnnamedCardPod(resource, count)
    return NotCardPod()

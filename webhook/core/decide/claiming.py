"""ResourceClaim CREATE (SPEC §4b, §6b): the claim made for a pod gets the model the pod was charged
for, and may not ask more than the pod was admitted with.

A claim made from a template (by the resource claim controller) or for an extended resource (by the
scheduler) is owned by its pod. The mutation adds to each GPU request whose class and selectors do
not fix the model a CEL selector admitting only the pod's card, and keeps of a ``firstAvailable``
request only the subrequests of that card: the claim's counterpart of the pod's node affinity. The
validation refuses a claim that asks another model, or more than its pod was admitted with (its
template replaced by a larger one meanwhile).
"""

from collections.abc import Mapping
from typing import Any

from webhook.core.decide.patches import pointer
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.cards import CardName, amount, parse_card_name
from webhook.core.model.claims import claim_demand, request_reading
from webhook.core.model.demand import PodDemand
from webhook.core.model.devices import POD_CLAIM_NAME, DeviceRequest, allocation, claim_record, named
from webhook.core.model.objects import PodRecord
from webhook.core.model.verdicts import Allowed, Decision, Denied, PatchOp, Request

Raw = Mapping[str, Any]


def _map(value: Any) -> Raw:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _pod_of(state: ClusterState, obj: Raw) -> PodRecord | None:
    for ref in _list(_map(obj.get("metadata")).get("ownerReferences")):
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and ref.get("controller") is True:
            return state.pods.get(str(ref.get("uid") or ""))
    return None


def _owner_name(obj: Raw) -> str:
    """The name of the pod that controls the claim, or ""."""
    for ref in _list(_map(obj.get("metadata")).get("ownerReferences")):
        if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and ref.get("controller") is True:
            return str(ref.get("name") or "?")
    return ""


def _one_model(state: ClusterState, pod: PodRecord) -> PodDemand | None:
    demand = state.demand_of(pod)
    return demand if isinstance(demand, PodDemand) and not demand.spec.is_multi else None


def _name(obj: Raw, request: Request) -> str:
    meta = _map(obj.get("metadata"))
    if meta.get("name") or not meta.get("generateName"):
        return f"{request.namespace}/{named(str(meta.get('name') or request.name or '?'))}"
    return f"{request.namespace}/{named(str(meta['generateName']))}…"  # named by the API server after


def claim_patch(state: ClusterState, request: Request) -> Allowed:
    obj = request.obj
    pod = _pod_of(state, obj)
    demand = _one_model(state, pod) if pod is not None else None
    if pod is None or demand is None:
        return Allowed("not the claim of a card pod the cache knows, or its model is not chosen yet")
    card = demand.spec.cards[0]
    named = any(k in pod.template.annotations for k in (keys.DRA_CARD, keys.CARD_NAME))
    record = claim_record(obj, state.policy.dra_drivers)
    raws = _list(_map(_map(obj.get("spec")).get("devices")).get("requests"))
    ops: list[PatchOp] = []
    for index, (parsed, raw) in enumerate(zip(record.requests, raws, strict=False)):
        if not isinstance(raw, Mapping):
            continue
        if parsed.alternatives:
            ops.extend(_keep_alternatives(state, parsed, raw, index, card))
        elif isinstance(raw.get("exactly"), Mapping):
            ops.extend(
                _pin(
                    state,
                    parsed,
                    raw["exactly"],
                    ("spec", "devices", "requests", index, "exactly"),
                    card,
                    named,
                )
            )
    if not ops:
        return Allowed("its GPU requests name their model already", card=card)
    return Allowed(f"pinned to {card}, the model its pod was charged for", patch=tuple(ops), card=card)


def _pin(
    state: ClusterState,
    request: DeviceRequest,
    raw: Raw,
    path: tuple[str | int, ...],
    card: CardName,
    named: bool,
) -> list[PatchOp]:
    """A selector of ``card`` added to a GPU request that its class and selectors do not confine to
    it: one several models can meet, or one whose model the pod named (``named``: what the slices
    publish now may not be all its class can select when the scheduler allocates)."""
    devices = state.inventory.devices
    read = request_reading(request, devices)
    if read is None or not read.gpu or read.problem or request.admin:
        return []  # no GPU of ours (or one it refuses)
    device_class = devices.classes.get(request.device_class)
    if read.cards == (card,) and (not named or (device_class is not None and device_class.card is not None)):
        return []  # its class and selectors allow only the pod's model
    driver = next(iter(read.drivers), None) or next(
        (d for d in devices.drivers if any(d in text for text in request.selectors)), devices.drivers[0]
    )
    expression = pin_expression(driver, card, devices.products(card))
    selector = {"cel": {"expression": expression}}
    if any(
        isinstance(s, Mapping) and (s.get("cel") or {}).get("expression") == expression
        for s in _list(raw.get("selectors"))
    ):
        return []  # pinned already (a second pass)
    if isinstance(raw.get("selectors"), list):
        return [{"op": "add", "path": pointer(*path, "selectors", "-"), "value": selector}]
    return [{"op": "add", "path": pointer(*path, "selectors"), "value": [selector]}]


def pin_expression(driver: str, card: CardName, products: tuple[str, ...]) -> str:
    """A CEL selector admitting only devices of ``card``: its ``productName`` as the devices of it
    spell it (as GPU feature discovery would, dashes for spaces, when none is known yet), and for
    MIG its profile."""
    parsed = parse_card_name(card)
    names = products or tuple(dict.fromkeys((parsed.product.replace("-", " "), parsed.product)))
    attributes = f"device.attributes['{driver}']"
    if len(names) == 1:
        expression = f"{attributes}.productName == '{names[0]}'"
    else:
        expression = f"{attributes}.productName in [{', '.join(repr(n) for n in names)}]"
    if parsed.mig_profile:
        expression += f" && {attributes}.profile == '{parsed.mig_profile}'"
    return expression


def _keep_alternatives(
    state: ClusterState, request: DeviceRequest, raw: Raw, index: int, card: CardName
) -> list[PatchOp]:
    subs = _list(raw.get("firstAvailable"))
    devices = state.inventory.devices
    keep = [
        sub
        for parsed, sub in zip(request.alternatives, subs, strict=False)
        if (read := request_reading(parsed, devices)) is not None and card in read.cards
    ]
    if not keep or len(keep) == len(subs):
        return []
    path = pointer("spec", "devices", "requests", index, "firstAvailable")
    return [{"op": "replace", "path": path, "value": keep}]


def decide_claim_create(state: ClusterState, request: Request) -> Decision:
    obj = request.obj
    pod = _pod_of(state, obj)
    if pod is None and (owner := _owner_name(obj)):
        return Denied(
            f"resourceclaim {_name(obj, request)} of pod {request.namespace}/{named(owner)}: the webhook does"
            " not know the pod yet (its live read found nothing, or timed out), so it cannot tell what the"
            " claim may ask; the resource claim controller makes it again"
        )
    demand = state.demand_of(pod) if pod is not None else None
    if pod is None or not isinstance(demand, PodDemand):
        return Allowed("not the claim of a card pod the cache knows")
    what = f"resourceclaim {_name(obj, request)} of pod {pod.key}"
    record = claim_record(obj, state.policy.dra_drivers)
    if record.problem:
        return Denied(f"{what} cannot be read: {record.problem}", card=demand.spec.text)
    found = claim_demand(record, state.inventory.devices, demand.spec)
    if found is None:
        return Allowed("asks no GPU of ours")
    if isinstance(found, str):
        return Denied(f"{what} {found}", card=demand.spec.text)
    if not set(found.spec.cards) <= set(demand.spec.cards):
        return Denied(
            f"{what} asks {found.spec.text}, but its pod was charged for {demand.spec.text}",
            card=demand.spec.text,
        )
    entry = str(_map(_map(obj.get("metadata")).get("annotations")).get(POD_CLAIM_NAME) or "")
    admitted = state.claims.admitted(pod.uid, entry) if entry else None
    if admitted is not None and found.count > admitted:
        template = next((r.template for r in pod.template.claims if r.name == entry), "")
        return Denied(
            f"{what} asks {amount(found.count)} {found.spec.text}, but the pod was admitted with"
            f" {amount(admitted)} for its claim {named(entry)}: its template {named(template)} asks more"
            " than when the pod was created; delete the pod to have it admitted again as the template"
            " is now",
            card=demand.spec.text,
        )
    return Allowed("within what its pod was admitted with", card=demand.spec.text)


def decide_allocation(state: ClusterState, request: Request) -> Decision:
    """ResourceClaim status UPDATE (SPEC §4b): the allocation the scheduler writes (or anyone else)
    is checked against what the pods it is reserved for were charged: every GPU it gives must be of
    a model they were charged for, and no more of it than they asked through their claims. The
    backstop behind the reading of classes and selectors: a refused write leaves the claim
    unallocated and the scheduler tries again."""
    obj = request.obj
    given = allocation(obj)
    if not given or given == allocation(request.old_obj):
        return Allowed("no new allocation")
    devices = state.inventory.devices
    name = _map(obj.get("metadata")).get("name") or request.name
    what = f"resourceclaim {request.namespace}/{named(str(name))}"
    units: dict[CardName, int] = {}
    for device in given:
        found = devices.given(device)
        if found is None:
            continue  # no GPU of ours
        card, taken = found
        if card is None:
            return Denied(
                f"{what}: its allocation gives device {device.where} of {device.driver}, which no"
                " ResourceSlice the webhook has seen publishes; the scheduler tries again once it is seen"
            )
        units[card] = units.get(card, 0) + taken
    if not units:
        return Allowed("it gives no GPU of ours")
    pods = [state.pods[uid] for uid in _reserved_for(obj) if uid in state.pods]
    if not pods:
        return Allowed("reserved for no pod the cache knows")
    for card, count in sorted(units.items()):
        charged = [(pod, _charged_on(state, pod, card)) for pod in pods]
        if any(allowed is not None and count <= allowed for _, allowed in charged):
            continue
        pod, allowed = charged[0]
        demand = state.demand_of(pod)
        asked = demand.spec.text if isinstance(demand, PodDemand) else "no GPU"
        had = f"{amount(allowed)} {card}" if allowed is not None else asked
        return Denied(
            f"{what}: its allocation gives {amount(count)} {card} to pod {pod.key}, which was charged for"
            f" {had}: refused, so that no pod holds more of a model than its queue was charged",
            card=card,
        )
    return Allowed("it gives what its pods were charged for", card=next(iter(units)))


def _reserved_for(obj: Raw) -> list[str]:
    reserved = _list(_map(obj.get("status")).get("reservedFor"))
    return [str(r.get("uid") or "") for r in map(_map, reserved) if r.get("resource") == "pods"]


def _charged_on(state: ClusterState, pod: PodRecord, card: CardName) -> int | None:
    """What ``pod`` is charged of ``card`` (its claims and its extended resources, which the
    scheduler may serve through a claim of its own); None when it was charged for no GPU of
    ``card`` at all."""
    demand = state.demand_of(pod)
    if not isinstance(demand, PodDemand) or card not in demand.spec.cards:
        return None
    charge = state.charged.charge(pod.uid)
    if charge is not None and charge.card is not None and charge.card != card:
        return None  # an A|B pod confined to another of its models
    return demand.count_on(card, state.inventory)  # a DRA-served nvidia.com/gpu is in its count

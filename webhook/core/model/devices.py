"""GPUs of Dynamic Resource Allocation (resource.k8s.io/v1): slices, classes, claims and templates as
slim records, and the card names their devices and requests stand for (SPEC §4b).

* A ResourceSlice device of a GPU driver (``Policy.dra_drivers``) is a card of its node: a whole GPU
  (attribute ``type`` ``gpu``, or none) is its ``productName`` with spaces as dashes, what GPU
  feature discovery writes into ``nvidia.com/gpu.product``; a MIG device (``type`` ``mig``) is
  ``<product>/mig-<profile>-mixed``. These are the names §3 gives the same hardware through the
  device plugin, so one quota key covers both forms.
* A class's and a request's CEL selectors are kept as their text; ``claims.Devices.reading``
  evaluates them (``cel``) against the devices the slices publish, each kept with everything a
  selector may read of it.

These kinds are new and their objects are read here without a shape check first: every reader takes
raw JSON and a field of the wrong type makes the record say why, never raises.
"""

import re
from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from webhook.core.model import keys
from webhook.core.model.cards import (
    CardName,
    CardNameError,
    CardSpec,
    mig_card_name,
    parse_card_name,
    parse_card_spec,
)
from webhook.core.model.cel import DeviceData
from webhook.core.model.quantity import QuantityError, parse_quantity
from webhook.core.model.quoting import shorten
from webhook.core.model.values import value_class

Raw = Mapping[str, Any]
API_GROUP = "resource.k8s.io"
# Ours, on a DeviceClass: the card spec its devices are (an operator's per-model class).
CLASS_CARD = keys.DRA_CARD
# The resource claim controller's annotation on a claim it made from a template: the pod's claim name.
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
NVIDIA_DRIVER = "gpu.nvidia.com"
HAMI_DRIVER = "hami-core-gpu.project-hami.io"
DEFAULT_DRIVERS = (NVIDIA_DRIVER, HAMI_DRIVER)
MAX_COUNT = 1 << 16  # more devices than this in one request is refused, not counted
EXACT, ALL = "ExactCount", "All"
WHOLE_TYPES = frozenset({"gpu", "hami-gpu"})  # the ``type`` attributes of a whole GPU (NVIDIA's, HAMi's)


_PLAIN = re.compile(r"^[a-z0-9A-Z][-a-zA-Z0-9_./#]{0,252}$")


def named(text: str) -> str:
    """An object's or a request's name as messages show it: as it is when it is a plain name (the
    API server allows no other), quoted and cut short when not (a snapshot's, say)."""
    return text if _PLAIN.match(text) else shorten(text)


def _map(value: Any) -> Raw:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# ---- slices: the inventory -------------------------------------------------------------------
@value_class
class SliceDevice:
    """One GPU of a slice: its card, and the capacities a share of it is a fraction of."""

    name: str
    card: CardName
    capacity: tuple[tuple[str, Fraction], ...] = ()
    product: str = ""  # its productName as the driver says it (spaces), for the claim's pin
    shared: bool = False  # allowMultipleAllocations: a capacity request takes a share, not all of it
    data: DeviceData | None = None  # what a CEL selector reads of it


@value_class
class SliceRecord:
    name: str
    driver: str
    pool: str
    node: str
    devices: tuple[SliceDevice, ...] = ()
    skipped: tuple[str, ...] = ()  # devices (or the whole slice) left out, and why


def _value(attribute: Any) -> str | None:
    """A device attribute's value as text (``{"string": ...}``, ``{"int": ...}``, ...)."""
    for kind in ("string", "version", "int", "bool"):
        value = _map(attribute).get(kind)
        if isinstance(value, str | int | bool):
            return str(value)
    return None


def _attributes(driver: str, raw: Any) -> dict[str, str]:
    """Attribute name -> value; ``<driver>/name`` is read as ``name``, another domain's is left."""
    out: dict[str, str] = {}
    for key, attribute in _map(raw).items():
        domain, _, name = str(key).rpartition("/")
        if domain and domain != driver:
            continue
        value = _value(attribute)
        if value is not None:
            out[name] = value
    return out


def product_card(product: str) -> str:
    """The whole card an NVML product name is: spaces as dashes (GPU feature discovery's label)."""
    return "-".join(product.split())


def device_card(attributes: Mapping[str, str]) -> tuple[CardName | None, str]:
    """The card of a GPU device from its attributes, or (None, why it has none)."""
    product = attributes.get("productName", "")
    kind = attributes.get("type", "gpu").lower()
    if not product:
        return None, "has no productName attribute"
    if kind in WHOLE_TYPES:
        kind = "gpu"
    if kind not in ("gpu", "mig"):
        return None, f"is of type {shorten(kind)}, neither a GPU nor a MIG device"
    profile = attributes.get("profile", "")
    if kind == "mig" and not profile:
        return None, "is a MIG device with no profile attribute"
    text = product_card(product) if kind == "gpu" else mig_card_name(product_card(product), profile)
    try:
        return parse_card_name(text).name, ""
    except CardNameError as exc:
        return None, f"makes no card name ({exc})"


def _capacity(raw: Any) -> tuple[tuple[str, Fraction], ...]:
    out = []
    for key, entry in _map(raw).items():
        try:
            out.append((str(key).rpartition("/")[2], parse_quantity(_map(entry).get("value"))))
        except QuantityError:
            continue
    return tuple(sorted(out))


def slice_record(obj: Raw, drivers: tuple[str, ...]) -> SliceRecord | None:
    """The GPUs of a ResourceSlice of one of ``drivers``; None for another driver's slice."""
    meta, spec = _map(obj.get("metadata")), _map(obj.get("spec"))
    driver = spec.get("driver")
    if not isinstance(driver, str) or driver not in drivers:
        return None
    node = spec.get("nodeName")
    record = SliceRecord(
        str(meta.get("name") or ""), driver, str(_map(spec.get("pool")).get("name") or ""), ""
    )
    if not isinstance(node, str) or not node:
        return replace(record, skipped=("its devices are no one node's (no spec.nodeName)",))
    devices, skipped = [], []
    raw_devices = spec.get("devices")
    if raw_devices is not None and not isinstance(raw_devices, list):
        skipped.append("spec.devices is not a list")
    for index, device in enumerate(_list(raw_devices)):
        name = _map(device).get("name")
        label = name if isinstance(name, str) and name else f"#{index}"
        attributes = _attributes(driver, _map(device).get("attributes"))
        card, why = device_card(attributes)
        if card is None:
            skipped.append(f"device {named(label)} {why}")
        else:
            raw = _map(device)
            shared = raw.get("allowMultipleAllocations") is True
            where = f"{record.pool}/{label}"  # as an allocation names it
            data = DeviceData(where, driver, _map(raw.get("attributes")), _map(raw.get("capacity")), shared)
            capacity = _capacity(raw.get("capacity"))
            devices.append(SliceDevice(label, card, capacity, attributes["productName"], shared, data))
    return replace(record, node=node, devices=tuple(devices), skipped=tuple(skipped))


# ---- CEL selectors -----------------------------------------------------------------------------
def _selectors(raw: Any) -> tuple[tuple[str, ...], str]:
    """The CEL expressions of a ``selectors`` list, and what makes it unreadable ("" when nothing)."""
    if raw is None:
        return (), ""
    if not isinstance(raw, list):
        return (), "its selectors are not a list"
    out = []
    for index, selector in enumerate(raw):
        expression = _map(_map(selector).get("cel")).get("expression")
        if not isinstance(expression, str):
            return (), f"its selector #{index} has no CEL expression"
        out.append(expression)
    return tuple(out), ""


# ---- classes -----------------------------------------------------------------------------------
@value_class
class ClassRecord:
    name: str
    selectors: tuple[str, ...] = ()  # its CEL expressions, all of which a device must meet
    card: CardSpec | None = None  # from our annotation
    problem: str = ""  # our annotation is there but malformed, or its selectors unreadable
    extended_resource: str = ""  # spec.extendedResourceName: plain requests of it are served by DRA


def class_record(obj: Raw, drivers: tuple[str, ...]) -> ClassRecord:
    meta, spec = _map(obj.get("metadata")), _map(obj.get("spec"))
    selectors, problem = _selectors(spec.get("selectors"))
    record = ClassRecord(str(meta.get("name") or ""), selectors, problem=problem)
    extended = spec.get("extendedResourceName")
    if isinstance(extended, str):
        record = replace(record, extended_resource=extended)
    raw = _map(meta.get("annotations")).get(CLASS_CARD)
    if raw is None:
        return record
    try:
        return replace(record, card=parse_card_spec(str(raw)))
    except CardNameError as exc:
        return replace(record, problem=f"its annotation {CLASS_CARD} is malformed: {exc}")


# ---- requests, claims and templates -----------------------------------------------------------
@value_class
class DeviceRequest:
    """One request of a claim, or one ``firstAvailable`` subrequest (``alternatives``)."""

    name: str
    device_class: str = ""
    selectors: tuple[str, ...] = ()  # its CEL expressions, besides its class's
    mode: str = EXACT
    count: int = 1
    admin: bool = False
    capacity: tuple[tuple[str, Fraction], ...] = ()  # consumable capacity asked per device
    alternatives: tuple["DeviceRequest", ...] = ()
    problem: str = ""


def _exact(name: str, raw: Raw, drivers: tuple[str, ...]) -> DeviceRequest:
    selectors, problem = _selectors(raw.get("selectors"))
    request = DeviceRequest(name, selectors=selectors)
    if problem:
        return replace(request, problem=f"request {named(name)}: {problem}")
    device_class, mode, count = (
        raw.get("deviceClassName"),
        raw.get("allocationMode", EXACT),
        raw.get("count", 1),
    )
    if not isinstance(device_class, str) or not device_class:
        return replace(request, problem=f"request {named(name)} names no deviceClassName")
    request = replace(request, device_class=device_class, admin=raw.get("adminAccess") is True)
    if mode not in (EXACT, ALL, None):
        return replace(request, problem=f"request {named(name)} has allocationMode {shorten(str(mode))}")
    if mode == ALL:
        return replace(request, mode=ALL)
    if count is None:
        count = 1
    if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_COUNT:
        return replace(
            request,
            problem=f"request {named(name)} asks {named(str(count))} devices (at most {MAX_COUNT})",
        )
    asked = []
    for key, value in _map(_map(raw.get("capacity")).get("requests")).items():
        try:
            asked.append((str(key).rpartition("/")[2], parse_quantity(value)))
        except QuantityError as exc:
            return replace(request, problem=f"request {named(name)} asks capacity {shorten(str(key))}: {exc}")
    return replace(request, count=count, capacity=tuple(sorted(asked)))


def _request(raw: Any, drivers: tuple[str, ...], index: int) -> DeviceRequest:
    name = _map(raw).get("name")
    name = name if isinstance(name, str) and name else f"#{index}"
    if not isinstance(raw, Mapping):
        return DeviceRequest(name, problem=f"request {named(name)} is not an object")
    if isinstance(raw.get("exactly"), Mapping):
        return _exact(name, raw["exactly"], drivers)
    if isinstance(raw.get("firstAvailable"), list) and raw["firstAvailable"]:
        subs = tuple(_request(sub, drivers, i) for i, sub in enumerate(raw["firstAvailable"]))
        subs = tuple(replace(sub, name=f"{name}/{sub.name}") for sub in subs)
        bad = next((sub.problem for sub in subs if sub.problem), "")
        return DeviceRequest(name, alternatives=subs, problem=bad)
    if "deviceClassName" in raw:  # a subrequest: the fields of ``exactly`` at its top
        return _exact(name, raw, drivers)
    return DeviceRequest(name, problem=f"request {named(name)} has neither exactly nor firstAvailable")


def claim_requests(spec: Any, drivers: tuple[str, ...]) -> tuple[tuple[DeviceRequest, ...], str]:
    """The requests of a claim's spec, and what makes the spec unreadable ("" when nothing)."""
    if spec is not None and not isinstance(spec, Mapping):
        return (), "its spec is not an object"
    devices = _map(spec).get("devices")
    if devices is None:
        return (), ""
    if not isinstance(devices, Mapping):
        return (), "spec.devices is not an object"
    raw = devices.get("requests")
    if raw is not None and not isinstance(raw, list):
        return (), "spec.devices.requests is not a list"
    requests = tuple(_request(r, drivers, i) for i, r in enumerate(_list(raw)))
    return requests, next((r.problem for r in requests if r.problem), "")


@value_class
class AllocatedDevice:
    """One result of a claim's ``status.allocation``: the device, as the scheduler names it, and the
    share of its capacity taken (``consumedCapacity``, empty: the whole device)."""

    request: str
    driver: str
    pool: str
    device: str
    consumed: tuple[tuple[str, str], ...] = ()
    admin: bool = False  # adminAccess: watching the device, not taking it

    @property
    def where(self) -> str:
        return f"{named(self.pool)}/{named(self.device)}"


@value_class
class ClaimRecord:
    """A ResourceClaim: its requests, the pod it was made for, what it was given."""

    namespace: str
    name: str
    uid: str = ""
    requests: tuple[DeviceRequest, ...] = ()
    problem: str = ""
    owner_pod: str = ""  # uid of the pod that controls it (a claim made from a template)
    pod_claim: str = ""  # the pod's name for it (``resource.kubernetes.io/pod-claim-name``)
    allocated: tuple[AllocatedDevice, ...] = ()  # the devices taken (an administrator's left out)
    is_allocated: bool = False  # status.allocation is written (even giving nothing we count)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@value_class
class TemplateRecord:
    namespace: str
    name: str
    requests: tuple[DeviceRequest, ...] = ()
    problem: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def claim_record(obj: Raw, drivers: tuple[str, ...]) -> ClaimRecord:
    meta, status = _map(obj.get("metadata")), _map(obj.get("status"))
    requests, problem = claim_requests(obj.get("spec"), drivers)
    owner = next(
        (
            str(ref.get("uid") or "")
            for ref in map(_map, _list(meta.get("ownerReferences")))
            if ref.get("kind") == "Pod" and ref.get("controller") is True
        ),
        "",
    )
    allocated = allocation(obj)
    return ClaimRecord(
        str(meta.get("namespace") or "default"),
        str(meta.get("name") or meta.get("generateName") or ""),
        str(meta.get("uid") or ""),
        requests,
        problem,
        owner,
        str(_map(meta.get("annotations")).get(POD_CLAIM_NAME) or ""),
        tuple(device for device in allocated if not device.admin),
        isinstance(status.get("allocation"), Mapping),
    )


def allocation(obj: Raw) -> tuple[AllocatedDevice, ...]:
    """Every device a claim's ``status.allocation`` gives (those given for administrative access
    too, marked)."""
    results = _list(_map(_map(_map(obj.get("status")).get("allocation")).get("devices")).get("results"))
    return tuple(
        AllocatedDevice(
            str(r.get("request") or ""),
            str(r.get("driver") or ""),
            str(r.get("pool") or ""),
            str(r.get("device") or ""),
            tuple(sorted((str(k), str(v)) for k, v in _map(r.get("consumedCapacity")).items())),
            r.get("adminAccess") is True,
        )
        for r in map(_map, results)
    )


def template_record(obj: Raw, drivers: tuple[str, ...]) -> TemplateRecord:
    meta = _map(obj.get("metadata"))
    spec = obj.get("spec")
    requests: tuple[DeviceRequest, ...] = ()
    if spec is not None and not isinstance(spec, Mapping):
        problem = "its spec is not an object"
    else:
        requests, problem = claim_requests(_map(spec).get("spec"), drivers)
    return TemplateRecord(
        str(meta.get("namespace") or "default"), str(meta.get("name") or ""), requests, problem
    )


# ---- a pod's references ------------------------------------------------------------------------
@value_class
class ClaimRef:
    """One entry of a pod's ``spec.resourceClaims``: a claim by name, or one made from a template
    (``generated``: the claim's name once the pod's status tells it)."""

    name: str
    claim: str = ""
    template: str = ""
    generated: str = ""


def claim_refs(spec: Raw, status: Raw | None = None) -> tuple[ClaimRef, ...]:
    """A pod spec's claims; what cannot be read is kept as a reference to nothing (refused later)."""
    raw = spec.get("resourceClaims")
    if not raw:
        return ()
    made = {
        str(s.get("name")): str(s.get("resourceClaimName") or "")
        for s in map(_map, _list(_map(status).get("resourceClaimStatuses")))
    }
    out = []
    for index, entry in enumerate(_list(raw) if isinstance(raw, list) else [None]):
        entry = _map(entry)
        name = str(entry.get("name") or f"#{index}")
        claim, template = entry.get("resourceClaimName"), entry.get("resourceClaimTemplateName")
        out.append(
            ClaimRef(
                name,
                claim if isinstance(claim, str) else "",
                template if isinstance(template, str) else "",
                made.get(name, ""),
            )
        )
    return tuple(out)

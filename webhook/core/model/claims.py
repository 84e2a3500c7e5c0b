"""The GPUs a pod asks through its ResourceClaims, as card demand (SPEC §4b), and the catalogue of
DRA objects that demand is read from.

:class:`Devices` holds the cluster's DeviceClasses, ResourceSlices, ResourceClaims and
ResourceClaimTemplates as slim records (``devices``). :func:`claims_demand` reads the claims a pod
references (a template until the claim made from it is seen, then that claim) and answers the card
spec and units per pod, or the reason the pod must be refused, or None when it asks no GPU of ours.

The models of a request are read once, by :meth:`Devices.reading`, for charging, for pinning the
claim made for a pod and for checking an allocation: the cards of the published GPUs that its
class's and its own CEL selectors select (evaluated as the scheduler evaluates them), or the card
spec an operator's class is annotated with. A request is a GPU request when its class is annotated,
when its selectors select a GPU, or when they name a GPU driver (then a model it cannot read is
refused, never taken for "no GPU").

Each selector's answer is kept per device. Offline every answer is worked out when it is asked for;
on a serving replica (``Devices.budget``) one turn (a review, a cache event) works out at most
``INLINE_UNITS`` of them on the spot, and a reading that needs more is deferred: it is "pending",
its evaluations are left for a process of their own (``take``, ``evaluate_selectors``, ``settle``),
and what asked for it is refused with the reason until they are done.
"""

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from webhook.core.model.cards import UNIT, CardName, CardSpec, amount
from webhook.core.model.cel import CelError, DeviceData, Program, Sketch, adopt, known, program
from webhook.core.model.celcost import MAX_COST
from webhook.core.model.devices import (
    ALL,
    CLASS_CARD,
    MAX_COUNT,
    AllocatedDevice,
    ClaimRecord,
    ClaimRef,
    ClassRecord,
    DeviceRequest,
    SliceRecord,
    TemplateRecord,
    named,
)
from webhook.core.model.quantity import QuantityError, parse_quantity
from webhook.core.model.quoting import shorten
from webhook.core.model.values import value_class

Answer = bool | str  # a selector's answer on a device: selected or not, or why it cannot be known
Selectors = tuple[str, ...]


@value_class
class ClaimDemand:
    """What one pod's claims ask: one of ``spec``'s models, ``per_card`` units of each (a
    ``firstAvailable`` alternative may ask another count), ``named``: the units that come from
    claims by name (``namespace/name``), which several pods may share and are charged once."""

    spec: CardSpec
    per_card: tuple[tuple[CardName, int], ...]
    named: tuple[tuple[str, int], ...] = ()
    # per entry of the pod's spec.resourceClaims made from a template and not seen made yet: its
    # units (what the claim the controller will make must not exceed, once admitted)
    from_templates: tuple[tuple[str, int], ...] = ()
    told: str = ""  # the claims and what each asks, for messages: "claim gpus (2 NVIDIA-H200)"

    @property
    def count(self) -> int:
        """The units an unassigned pod is held at: the largest over its models."""
        return max(units for _, units in self.per_card)

    def on(self, card: CardName) -> int:
        return dict(self.per_card).get(card, self.count)


class Devices:
    """The cluster's DRA objects, kept one at a time; each update answers whether it changed."""

    def __init__(self, drivers: Iterable[str] = ()) -> None:
        self.drivers = tuple(drivers)
        self.classes: dict[str, ClassRecord] = {}
        self.templates: dict[str, TemplateRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self.slices: dict[str, SliceRecord] = {}
        self._by_node: defaultdict[str, set[str]] = defaultdict(set)  # node -> slice names
        self._capacity: dict[CardName, dict[str, Fraction]] | None = None
        self._devices: dict[tuple[str, str, str], CardName] | None = None
        self._readings: dict[tuple[tuple[str, ...], tuple[str, ...]], Reading] = {}
        # selectors -> slice name -> (the slice read, the cards it selects there, or why not)
        self._selected: dict[tuple[str, ...], dict[str, tuple[SliceRecord, dict[CardName, bool], str]]] = {}
        # How many cost units (``EVALUATION_UNITS`` plus its bound, each evaluation) one turn may
        # spend evaluating selectors; None: no limit (offline, where nothing else waits)
        self.budget: int | None = None
        self._left = 0
        self.missed = 0  # readings deferred so far (one more each time a reading is pending)
        self._answers: dict[str, dict[object, Answer]] = {}  # selector -> ``Program.key`` -> answer
        self._kept = 0
        self._waiting: dict[Selectors, _Work] = {}  # deferred readings, taken from in turn
        self.deferred_now: set[Selectors] = set()  # the readings this turn deferred
        self._taken: dict[Selectors, int] = {}  # jobs being worked out off the loop

    def put_slice(self, record: SliceRecord) -> set[str]:
        """Add or replace a slice; returns the nodes whose cards changed."""
        old = self.slices.get(record.name)
        if old == record:
            return set()
        self.drop_slice(record.name)
        self.slices[record.name] = record
        if record.node:
            self._by_node[record.node].add(record.name)
        self._forget()
        return {record.node, *(old.node for old in [old] if old is not None)} - {""}

    def drop_slice(self, name: str) -> set[str]:
        old = self.slices.pop(name, None)
        if old is None:
            return set()
        self._by_node[old.node].discard(name)
        if not self._by_node[old.node]:
            del self._by_node[old.node]
        self._forget()
        return {old.node} - {""}

    def _forget(self) -> None:
        """The published devices changed: what was worked out from them is worked out again (a
        reading from the slices that changed only: ``_selected`` keeps each slice's part)."""
        self._capacity = self._devices = None
        self._readings = {}

    def reading(self, device_class: ClassRecord, request: DeviceRequest) -> "Reading":
        """What ``request`` of ``device_class`` may get, read once per selectors while the published
        devices stay the same."""
        key = (device_class.selectors, request.selectors)
        found = self._readings.get(key)
        if found is None:
            if len(self._readings) >= MAX_READINGS:
                self._readings, self._selected = {}, {}
            found = self._read(key[0] + key[1])
            if not found.pending:  # a pending reading is read again when asked for again
                self._readings[key] = found
        if device_class.card is not None:  # the operator's word: its devices are these models
            cards = tuple(c for c in found.cards if c in device_class.card.cards) or device_class.card.cards
            found = replace(found, cards=cards, gpu=True)
        return found

    def _read(self, selectors: tuple[str, ...]) -> "Reading":
        mentioned = any(driver in text for driver in self.drivers for text in selectors)
        if self.budget is not None:  # compiling is paid for too: a long text takes milliseconds
            at_hand = [known(text) for text in selectors]
            if problem := next((f for f in at_hand if isinstance(f, str)), ""):
                return Reading((), (), problem, mentioned)
            units = sum(len(t) * COMPILE_UNITS for t, f in zip(selectors, at_hand, strict=True) if f is None)
            if units > self._left:
                return self._defer(selectors, self._published(), None)
            self._left -= units
        try:
            programs = [program(text) for text in selectors]
        except CelError as error:
            return Reading((), (), str(error), mentioned)
        parts = self._selected.setdefault(selectors, {})
        for gone in parts.keys() - self.slices.keys():
            del parts[gone]
        stale = [
            (name, found)
            for name, found in self.slices.items()
            if (part := parts.get(name)) is None or part[0] is not found
        ]
        for at, (name, found) in enumerate(stale):
            try:
                parts[name] = (found, *self._select(found, programs))
            except _OverBudget as over:
                return self._defer(selectors, self._published(f for _, f in stale[at:]), over.dearest)
        cards: dict[CardName, bool] = {}  # card -> whether every device of it selected is shared
        drivers: dict[str, None] = {}
        for name, found in self.slices.items():
            _, selected, problem = parts[name]
            if problem:
                return Reading((), (), problem, True)
            for card, whole_shared in selected.items():
                cards[card] = cards.get(card, True) and whole_shared
                drivers[found.driver] = None
        chosen = tuple(sorted(cards))
        shared = frozenset(card for card, all_shared in cards.items() if all_shared)
        return Reading(chosen, tuple(drivers), "", mentioned or bool(cards), chosen, shared)

    # ---- evaluating selectors, on the loop within a budget, or deferred ------------------------
    def turn(self) -> None:
        """A new turn (a review, a cache event) may spend ``budget`` again."""
        self._left = self.budget or 0
        self.deferred_now = set()

    def answer(self, selector: Program, device: DeviceData) -> Answer:
        """``selector``'s answer on ``device``, worked out once for all devices alike in what it
        reads of them (``Program.key``); ``_OverBudget`` when working it out now would pass what
        is left of this turn's budget."""
        key = selector.key(device)
        known = self._answers.get(selector.text)
        found = known.get(key) if known is not None else None
        if found is None:
            if self.budget is not None:
                units = self._price(selector, device)
                if units > self._left:
                    raise _OverBudget((selector, device))
                self._left -= units
            found = selector.evaluate(device)
            self._remember(selector.text, key, found)
        return found

    @staticmethod
    def _price(selector: Program, device: DeviceData) -> int:
        """What working out ``selector`` on ``device`` costs the loop, in cost units: its bound and
        ``EVALUATION_UNITS`` (nothing past Kubernetes' limit: it is refused from its bound), and
        compiling it here if it was compiled elsewhere."""
        cost = selector.cost(device)
        if cost is None:
            return UNPRICED  # compiled elsewhere, and not told of this shape: left to be done there
        units = cost + EVALUATION_UNITS if cost <= MAX_COST else 0
        return units if selector.compiled else units + len(selector.text) * COMPILE_UNITS

    def _known(self, selector: Program, device: DeviceData) -> Answer | None:
        known = self._answers.get(selector.text)
        return known.get(selector.key(device)) if known is not None else None

    def _remember(self, text: str, key: object, answer: Answer) -> None:
        if self._kept >= MAX_ANSWERS:  # bounded: past it, each is worked out again as it is asked for
            self._answers, self._kept = {}, 0
        known = self._answers.setdefault(text, {})
        if key not in known:
            self._kept += 1
        known[key] = answer

    def _select(self, found: SliceRecord, programs: list[Program]) -> tuple[dict[CardName, bool], str]:
        """The cards of the devices of one slice every program selects (each with whether every such
        device is shared), or why a program cannot be evaluated on one of them (the programs in
        order, as the scheduler: the first that does not select a device ends it)."""
        cards: dict[CardName, bool] = {}
        counting = self.budget is not None
        for device in found.devices:
            if device.data is None:
                continue
            for selector in programs:
                if counting:  # looking an answer up is paid for too: a slice at a time
                    self._left -= LOOKUP_UNITS
                    if self._left < 0:
                        raise _OverBudget(None)
                answer = self.answer(selector, device.data)
                if isinstance(answer, str):
                    return {}, answer
                if not answer:
                    break
            else:
                cards[device.card] = cards.get(device.card, True) and device.shared
        return cards, ""

    def _published(self, slices: Iterable[SliceRecord] | None = None) -> list[DeviceData]:
        return [
            d.data
            for found in (self.slices.values() if slices is None else slices)
            for d in found.devices
            if d.data
        ]

    def _units(
        self, programs: list[Program], devices: list[DeviceData], most: float, counted: set[Any] | None = None
    ) -> int:
        """What answering ``programs`` on ``devices`` may cost (``_price``), each answer not known
        yet counted once for all devices alike, counting no further than past ``most``."""
        counted = set() if counted is None else counted
        units = 0
        for data in devices:
            for selector in programs:
                key = selector.key(data)
                known = self._answers.get(selector.text)
                if (known is not None and key in known) or (selector.text, key) in counted:
                    continue
                counted.add((selector.text, key))
                units += self._price(selector, data)
            if units > most:
                break
        return units

    def _defer(
        self, selectors: Selectors, devices: list[DeviceData], dearest: tuple[Program, DeviceData] | None
    ) -> "Reading":
        """The reading of ``selectors`` waits for work off the loop: pending."""
        self.missed += 1
        self.deferred_now.add(selectors)
        work = self._waiting.get(selectors)
        if work is None and selectors not in self._taken:
            work = self._waiting[selectors] = _Work(devices)
        if work is not None:
            work.asks += 1
        cost = ""
        if dearest is None:
            text = next((t for t in selectors if known(t) is None), selectors[-1])
        else:
            selector, device = dearest
            text = selector.text
            if (bound := selector.cost(device)) is not None:
                cost = (
                    f" ({bound:,} of cel-go's cost units on device {device.name}, of Kubernetes'"
                    f" limit of {MAX_COST:,})"
                )
        why = (
            f"its CEL selector {shorten(text)} is being evaluated, off the loop that answers reviews, on"
            f" {len(devices):,} devices the slices publish{cost}: try again in a few seconds"
        )
        return Reading((), (), why, True, pending=True)

    def deferred(self) -> bool:
        """Whether work waits to be taken."""
        return bool(self._waiting)

    def asks(self) -> dict[Selectors, int]:
        """How many times each waiting reading was asked for so far."""
        return {selectors: work.asks for selectors, work in self._waiting.items()}

    def drop(self, selectors: Selectors) -> None:
        """Work nobody asks for any more is dropped (what it worked out is kept): deferred anew when
        it is asked for again."""
        self._waiting.pop(selectors, None)

    def busy(self, selectors: Selectors) -> bool:
        """Whether work for the reading of ``selectors`` waits or is being worked out."""
        return selectors in self._waiting or selectors in self._taken

    def take(self, units: int) -> "Job | None":
        """The next work off the loop: devices of a deferred reading (each in turn), worth up to
        ``units`` (one at least, at most ``JOB_DEVICES``, and no more than ``SCAN`` devices looked at
        here), each with the answers known already; selectors not compiled here are compiled there
        first, on one device. None when nothing waits."""
        if not self._waiting:
            return None
        selectors, work = next(iter(self._waiting.items()))
        found = [known(text) for text in selectors]
        chosen: list[DeviceData] = []
        if any(isinstance(f, str) for f in found):
            work.at = len(work.devices)  # one does not compile: nothing to evaluate
        elif any(f is None for f in found):
            chosen = work.devices[work.at : work.at + 1]  # their sketches first, then the others
            work.at += len(chosen)
        else:
            programs = [f for f in found if isinstance(f, Program)]
            spent, end = 0, min(len(work.devices), work.at + SCAN)
            while work.at < end and (not chosen or spent < units) and len(chosen) < JOB_DEVICES:
                data = work.devices[work.at]
                work.at += 1
                cost = self._units(programs, [data], math.inf, work.counted)
                if cost:
                    chosen.append(data)
                    spent += cost
        del self._waiting[selectors]
        if work.at >= len(work.devices) and any(f is None for f in found):
            work.at = 0  # evaluated on their first device once compiled: looked at again then
        if work.at < len(work.devices):
            self._waiting[selectors] = work  # the others' turn first
        self._taken[selectors] = self._taken.get(selectors, 0) + 1
        answers = [
            tuple(self._known(f, data) if isinstance(f, Program) else None for f in found) for data in chosen
        ]
        return Job(
            selectors, chosen, answers, tuple(not isinstance(f, Program) or f.tree is None for f in found)
        )

    def settle(self, job: "Job", done: "Done") -> bool:
        """Keep what was worked out off the loop (``evaluate_selectors``); whether nothing of its
        selectors waits or is being worked out any more."""
        sketches, costs, answers = done
        for text, sketch, shapes in zip(job.selectors, sketches, costs, strict=True):
            if sketch is not None:
                adopt(text, sketch)
            if shapes and isinstance(found := known(text), Program):
                found.learn(shapes)
        for data, row in zip(job.devices, answers, strict=True):
            for text, answer in zip(job.selectors, row, strict=True):
                found = known(text)
                if answer is not None and isinstance(found, Program):
                    self._remember(text, found.key(data), answer)
        self._untake(job.selectors)
        return job.selectors not in self._taken and job.selectors not in self._waiting

    def give_back(self, job: "Job") -> None:
        """Work taken that will not be answered (its process died, or was stopped): the reading is
        deferred anew by what asks for it next."""
        self._untake(job.selectors)
        self._waiting.pop(job.selectors, None)

    def _untake(self, selectors: Selectors) -> None:
        left = self._taken.get(selectors, 1) - 1
        if left > 0:
            self._taken[selectors] = left
        else:
            self._taken.pop(selectors, None)

    def node_cards(self, node: str) -> Counter[CardName]:
        """The GPUs the slices of ``node`` publish, by card (each device once)."""
        seen: dict[tuple[str, str, str], CardName] = {}
        for name in self._by_node.get(node, ()):
            found = self.slices[name]
            for device in found.devices:
                seen[(found.driver, found.pool, device.name)] = device.card
        return Counter(seen.values())

    def nodes(self) -> list[str]:
        return sorted(self._by_node)

    def capacity(self, card: CardName) -> dict[str, Fraction]:
        """Per capacity name, the least one device of ``card`` has (a share is never counted smaller
        than on the device it gets)."""
        if self._capacity is None:
            least: dict[CardName, dict[str, Fraction]] = {}
            for found in self.slices.values():
                for device in found.devices:
                    mine = least.setdefault(device.card, {})
                    for name, value in device.capacity:
                        mine[name] = min(mine.get(name, value), value)
            self._capacity = least
        return self._capacity.get(card, {})

    def products(self, card: CardName) -> tuple[str, ...]:
        """The ``productName`` values the devices of ``card`` carry (the driver's own spelling)."""
        return tuple(
            sorted({d.product for found in self.slices.values() for d in found.devices if d.card == card})
        )

    def allocated(self, claim: ClaimRecord) -> frozenset[CardName]:
        """The cards of the GPUs allocated to ``claim`` that a slice publishes."""
        found = (self.given(device) for device in claim.allocated)
        return frozenset(given[0] for given in found if given is not None and given[0] is not None)

    def given(self, device: AllocatedDevice) -> tuple[CardName | None, int] | None:
        """What one allocated device is: its card (None when no slice the cache holds publishes it)
        and the units it takes (a whole card, or the share of it its consumed capacity is); None
        when it is no GPU of ours (another driver's, or watched with administrative access). The
        one reading of an allocation: its check and the charge of its pod both read it here."""
        if device.admin or device.driver not in self.drivers:
            return None
        if self._devices is None:
            self._devices = {
                (found.driver, found.pool, each.name): each.card
                for found in self.slices.values()
                for each in found.devices
            }
        card = self._devices.get((device.driver, device.pool, device.device))
        return card, UNIT if card is None else self._units_taken(card, device.consumed)

    def _units_taken(self, card: CardName, consumed: tuple[tuple[str, str], ...]) -> int:
        """A whole device, or the share of it a consumable-capacity allocation takes."""
        if not consumed:
            return UNIT
        has = self.capacity(card)
        share = Fraction(0)
        for name, value in consumed:
            try:
                taken = parse_quantity(value)
            except QuantityError:
                return UNIT
            total = has.get(name.rpartition("/")[2])
            if not total:
                return UNIT
            share = max(share, taken / total)
        return min(UNIT, math.ceil(share * UNIT))


MAX_READINGS = 10_000  # distinct selector sets read at once; past it, read anew as they come
SCAN = 2_000  # devices one ``take`` looks at, at most (it runs on the loop)
JOB_DEVICES = 256  # devices one job carries, at most (pickled on the loop)
MAX_ANSWERS = 200_000  # answers kept at once (about 100 bytes each); past it, worked out anew
# The budget of one turn on a serving replica, in cost units: each evaluation costs its bound
# (cel-go's units, about 50 ns each) and ``EVALUATION_UNITS`` besides (building its variable,
# about 25 us); 60,000 are about 3 ms of the loop.
EVALUATION_UNITS = 500
LOOKUP_UNITS = 10  # an answer looked up (known already) as a slice is read
UNPRICED = 1 << 40  # an evaluation whose cost is not known here: never worked out on the loop
COMPILE_UNITS = 150  # a character compiled (a text of 10 KiB: about 60 ms, with reading its tree)
INLINE_UNITS = 60_000


class _OverBudget(Exception):
    """Working out an answer now would pass the turn's budget: (the selector, the device); None:
    looking answers up would."""

    def __init__(self, dearest: tuple[Program, DeviceData] | None) -> None:
        self.dearest = dearest


class _Work:
    """A deferred reading's devices, looked at in order by ``take``."""

    __slots__ = ("asks", "at", "counted", "devices")

    def __init__(self, devices: list[DeviceData]) -> None:
        self.devices, self.at, self.asks = devices, 0, 0
        self.counted: set[Any] = set()  # (selector, key) taken already


@value_class
class Job:
    """Work for the process that evaluates off the loop: ``selectors`` on ``devices``, with the
    answers known already (None: to work out), and which selectors are not compiled here (their
    sketch and their costs on these devices are sent back)."""

    selectors: Selectors
    devices: list[DeviceData]
    known: list[tuple[Answer | None, ...]]
    sketch: tuple[bool, ...]


# What came back: each selector's sketch (or why it does not compile) and its costs by device
# shape, when asked for; each device's answers
Done = tuple[list[Sketch | str | None], list[dict[Any, int] | None], list[tuple[Answer | None, ...]]]


def evaluate_selectors(job: Job) -> Done:
    """Each device's answers to the job's selectors in order, as the scheduler evaluates them: up
    to the first that does not select it (None after it). What the process that evaluates off the
    loop runs."""
    programs: list[Program | None] = []
    sketches: list[Sketch | str | None] = []
    costs: list[dict[Any, int] | None] = []
    for text, wanted in zip(job.selectors, job.sketch, strict=True):
        try:
            found = program(text)
        except CelError as error:
            programs.append(None)
            sketches.append(str(error))
            costs.append(None)
            continue
        programs.append(found)
        sketches.append(found.sketch if wanted else None)
        costs.append(found.costs(job.devices) if wanted else None)
    if any(p is None for p in programs):
        return sketches, costs, [(None,) * len(programs) for _ in job.devices]
    out = []
    for data, had in zip(job.devices, job.known, strict=True):
        row: list[Answer | None] = []
        for selector, answer in zip(programs, had, strict=True):
            assert selector is not None
            if answer is None:
                answer = selector.evaluate(data)
            row.append(answer)
            if answer is not True:
                break
        out.append(tuple(row) + (None,) * (len(programs) - len(row)))
    return sketches, costs, out


@value_class
class Reading:
    """What one request (with its class) may get: ``cards``, the models of the published GPUs it
    selects (an annotated class's: those of its annotation), from ``drivers``; ``problem``: why
    its selectors cannot be evaluated; ``gpu``: whether it is a GPU request at all. ``selected``:
    the models the selectors themselves select (an annotated class's may differ)."""

    cards: tuple[CardName, ...]
    drivers: tuple[str, ...] = ()
    problem: str = ""
    gpu: bool = False
    selected: tuple[CardName, ...] = ()
    # the models every selected device of which allows several allocations: a capacity request
    # there takes a share of a device; elsewhere it takes whole devices (as the scheduler allocates)
    shared: frozenset[CardName] = frozenset()
    pending: bool = False  # its selectors are being evaluated off the loop: ``problem`` says so


# ---- demand ------------------------------------------------------------------------------------
class _Refused(Exception):
    """The text completes "pod X ..."."""


class _OtherModel(_Refused):
    """A request of another model than the pod's ``card.name``: an alternative left out."""


class _Unpublished(_Refused):
    """A request whose selectors select no GPU the slices publish: an alternative left out (the
    scheduler cannot allocate it either)."""


@value_class
class _Asked:
    cards: tuple[CardName, ...]
    per_card: tuple[tuple[CardName, int], ...]


IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"  # a class's implicit extended resource


def extended_requests(resources: Mapping[str, int], devices: Devices) -> tuple[DeviceRequest, ...]:
    """A pod's DRA extended resources (KEP-5004) as the device requests the scheduler makes of them:
    ``deviceclass.resource.kubernetes.io/<class>``, or a class's ``extendedResourceName`` (``count``
    devices of that class each). A name a device plugin serves as well is left to the device-plugin
    reading (one count, never two)."""
    out = []
    for resource, count in sorted(resources.items()):
        if resource.startswith(IMPLICIT_PREFIX):
            name = resource[len(IMPLICIT_PREFIX) :]
        else:
            name = next((c.name for c in devices.classes.values() if c.extended_resource == resource), "")
        if name and count > 0:
            out.append(DeviceRequest(resource, name, count=min(count, MAX_COUNT)))
    return tuple(out)


def claims_demand(
    refs: tuple[ClaimRef, ...],
    namespace: str,
    devices: Devices,
    named_spec: CardSpec | None,
    extended: tuple[DeviceRequest, ...] = (),
) -> ClaimDemand | str | None:
    """The card demand of a pod's claims (and of its DRA extended resources, ``extended``); a
    refusal's text; None when they ask no GPU we count. ``named_spec``: the pod's own
    ``volcano.sh/card.name``, the model of requests that fix none."""
    try:
        return _demand(refs, namespace, devices, named_spec, extended)
    except _Refused as refused:
        return str(refused)


def _demand(
    refs: tuple[ClaimRef, ...],
    namespace: str,
    devices: Devices,
    named_spec: CardSpec | None,
    extended: tuple[DeviceRequest, ...],
) -> ClaimDemand | None:
    cards: tuple[CardName, ...] | None = None
    total: Counter[CardName] = Counter()
    by_name: list[tuple[str, int]] = []
    made: list[tuple[str, int]] = []
    told: list[str] = []
    sources = [_source(ref, namespace, devices) for ref in refs]
    sources += [(f"extended resource {r.name}", (r,), False) for r in extended]
    _read_all([r for _, requests, _ in sources for r in requests], devices)
    for ref, (what, requests, templated) in zip([*refs, *([None] * len(extended))], sources, strict=True):
        asked = [a for r in requests if (a := _asked(r, what, devices, named_spec)) is not None]
        if not asked:
            continue
        mine: Counter[CardName] = Counter()
        for one in asked:
            if cards is not None and set(one.cards) != set(cards):
                raise _Refused(
                    f"asks GPUs of {'|'.join(cards)} and of {'|'.join(one.cards)} ({what}): a pod's GPUs"
                    " are one model; split it into one pod per model"
                )
            cards = cards or one.cards
            mine.update(dict(one.per_card))
        total.update(mine)
        units = max(mine.values())
        if ref is not None and ref.claim:
            by_name.append((f"{namespace}/{ref.claim}", units))
        elif ref is not None and templated:  # the template itself was read: its claim is still to be made
            made.append((ref.name, units))
        told.append(f"{what}: {amount(units)} {'|'.join(cards or ())}")
    if cards is None:
        return None
    return ClaimDemand(
        CardSpec(cards), tuple((c, total[c]) for c in cards), tuple(by_name), tuple(made), "; ".join(told)
    )


def _read_all(requests: Iterable[DeviceRequest], devices: Devices) -> None:
    """Read every request (each alternative) before any is judged: a reading that must be
    deferred is deferred now, with the others, not one review at a time."""
    for request in requests:
        for one in request.alternatives or (request,):
            device_class = devices.classes.get(one.device_class)
            if device_class is not None:
                devices.reading(device_class, one)


def _source(ref: ClaimRef, namespace: str, devices: Devices) -> tuple[str, tuple[DeviceRequest, ...], bool]:
    """The requests a reference stands for, and how messages name it."""
    if ref.claim:
        claim = devices.claims.get(f"{namespace}/{ref.claim}")
        what = f"claim {named(ref.claim)}"
        if claim is None:
            raise _Refused(f"uses ResourceClaim {namespace}/{named(ref.claim)}, which does not exist")
        if claim.problem:
            raise _Refused(f"uses ResourceClaim {namespace}/{named(ref.claim)}, whose {claim.problem}")
        if not claim.allocated:
            _one_model_each(claim, devices)
        return what, claim.requests, False
    if ref.template:
        made = devices.claims.get(f"{namespace}/{ref.generated}") if ref.generated else None
        if made is not None and not made.problem:
            return f"claim {made.name} from template {named(ref.template)}", made.requests, False
        template = devices.templates.get(f"{namespace}/{ref.template}")
        what = f"claim {named(ref.name)} from template {named(ref.template)}"
        if template is None:
            raise _Refused(
                f"uses ResourceClaimTemplate {namespace}/{named(ref.template)}, which does not exist"
            )
        if template.problem:
            raise _Refused(
                f"uses ResourceClaimTemplate {namespace}/{named(ref.template)}, whose {template.problem}"
            )
        return what, template.requests, True
    raise _Refused(f"has resource claim {named(ref.name)} naming neither a claim nor a template")


def _one_model_each(claim: ClaimRecord, devices: Devices) -> None:
    """A claim by name is never made for one pod, so never pinned to a pod's model: each of its
    GPU requests (each alternative) must select one model itself."""
    for request in claim.requests:
        for one in request.alternatives or (request,):
            read = request_reading(one, devices)
            if read is None or not read.gpu or read.problem or len(read.cards) == 1 or one.admin:
                continue  # what the demand reads of it refuses it, or it is one model, or no GPU
            which = "|".join(read.cards) if read.cards else "no model a ResourceSlice publishes"
            raise _Refused(
                f"uses ResourceClaim {claim.namespace}/{named(claim.name)}, whose request"
                f" {named(one.name)} may be given any of {which}: a claim by name is shared, never"
                " pinned to a pod's model; select one model in the claim (productName) or use a"
                f" DeviceClass annotated {CLASS_CARD}"
            )


def _asked(request: DeviceRequest, what: str, devices: Devices, named_spec: CardSpec | None) -> _Asked | None:
    """The cards one request may get and the units of each, or None when it asks no GPU of ours."""
    if request.alternatives:
        found: list[_Asked] = []
        other: _Refused | None = None
        unpublished = 0
        for sub in request.alternatives:
            try:
                if (one := _asked(sub, what, devices, named_spec)) is not None:
                    found.append(one)
            except _Unpublished as refused:  # a GPU no slice publishes: the scheduler skips it too
                other, unpublished = other or refused, unpublished + 1
            except _OtherModel as refused:  # the pod names another of its alternatives
                other = other or refused
        if not found and other is not None:
            raise other
        if not found:
            return None
        if named_spec is not None:
            return _merge(found)
        if len(found) + unpublished < len(request.alternatives):
            raise _Refused(
                f"has request {named(request.name)} ({what}) whose alternatives are not all GPUs of a"
                " card: its GPUs could not be counted"
            )
        return _merge(found)
    device_class = devices.classes.get(request.device_class)
    if device_class is None:
        if any(driver in text for driver in devices.drivers for text in request.selectors):
            raise _Refused(
                f"asks GPUs of DeviceClass {named(request.device_class)} ({what}), which does not exist"
            )
        return None
    label = f"request {named(request.name)} of {what}"
    if device_class.problem and (device_class.card is not None or not device_class.selectors):
        raise _Refused(f"asks GPUs of DeviceClass {device_class.name} ({label}), but {device_class.problem}")
    read = devices.reading(device_class, request)
    if not read.gpu:
        return None
    if request.admin:
        return None  # administrative access: watching a device, not taking it
    if read.pending:
        raise _Refused(f"asks GPUs ({label}) whose model is not known yet: {read.problem}")
    if device_class.problem or read.problem:
        why = (
            f"DeviceClass {device_class.name}: {device_class.problem}"
            if device_class.problem
            else read.problem
        )
        raise _Refused(f"asks GPUs ({label}) whose model cannot be read: {why}")
    if request.mode == ALL:
        raise _Refused(
            f"asks all the devices of DeviceClass {device_class.name} ({label}, allocationMode All):"
            " the count is unbounded; ask an exact count"
        )
    cards = _cards(device_class, read, label, named_spec)
    return _Asked(cards, tuple((card, _units(request, card, read, devices, label)) for card in cards))


def _merge(found: list[_Asked]) -> _Asked:
    """Alternatives as one choice: each card at the largest count any alternative of it asks (the
    scheduler takes the first it can satisfy, whichever that is)."""
    per_card: dict[CardName, int] = {}
    for one in found:
        for card, units in one.per_card:
            per_card[card] = max(per_card.get(card, 0), units)
    return _Asked(tuple(per_card), tuple(per_card.items()))


def _cards(
    device_class: ClassRecord, read: Reading, label: str, named_spec: CardSpec | None
) -> tuple[CardName, ...]:
    annotated = device_class.card
    if annotated is not None and read.selected and not set(read.selected) & set(annotated.cards):
        raise _Refused(
            f"asks {'|'.join(read.selected)} of DeviceClass {device_class.name}, whose devices are"
            f" {annotated.text} ({label})"
        )
    cards = read.cards
    if not cards:
        if named_spec is None:
            raise _Unpublished(
                f"asks GPUs of DeviceClass {device_class.name} ({label}) whose selectors select no GPU a"
                f" ResourceSlice publishes, so its model is not known: name it with the pod annotation"
                f" {CLASS_CARD}, or use a DeviceClass annotated {CLASS_CARD}"
            )
        return named_spec.cards
    if named_spec is None:
        return cards
    kept = tuple(card for card in named_spec.cards if card in cards)
    if not kept:
        raise _OtherModel(
            f"names card {named_spec.text} but asks {'|'.join(cards)} through {label}: name one model"
        )
    return kept


def _units(request: DeviceRequest, card: CardName, read: Reading, devices: Devices, label: str) -> int:
    """Units of ``request`` on ``card``: whole devices, or, on devices that allow several
    allocations, the share of a device's capacity."""
    if not request.capacity or card not in read.shared:
        return request.count * UNIT
    has = devices.capacity(card)
    share = Fraction(0)
    for name, value in request.capacity:
        if name not in has or has[name] <= 0:
            raise _Refused(
                f"asks {name} {value} of each {card} ({label}), but no device of {card} publishes"
                f" a capacity {name}"
            )
        if value > has[name]:
            raise _Refused(f"asks {name} {value} of each {card} ({label}), more than one has ({has[name]})")
        share = max(share, value / has[name])
    return request.count * math.ceil(share * UNIT)


def claim_demand(
    claim: ClaimRecord, devices: Devices, named_spec: CardSpec | None
) -> ClaimDemand | str | None:
    """What one claim asks, as :func:`claims_demand` reads it for a pod (a claim being created is not
    in the catalogue yet)."""
    _read_all(claim.requests, devices)
    try:
        asked = [a for r in claim.requests if (a := _asked(r, f"claim {claim.name}", devices, named_spec))]
    except _Refused as refused:
        return str(refused)
    if not asked:
        return None
    cards = asked[0].cards
    total: Counter[CardName] = Counter()
    for one in asked:
        if set(one.cards) != set(cards):
            return f"asks GPUs of {'|'.join(cards)} and of {'|'.join(one.cards)}: a pod's GPUs are one model"
        total.update(dict(one.per_card))
    return ClaimDemand(CardSpec(cards), tuple((c, total[c]) for c in cards))


def request_reading(request: DeviceRequest, devices: Devices) -> Reading | None:
    """What one request may get (its class's and its own selectors read against the published
    GPUs); None when its class is unknown."""
    device_class = devices.classes.get(request.device_class)
    return None if device_class is None else devices.reading(device_class, request)


# ---- what the claims were given ----------------------------------------------------------------
@value_class
class Given:
    """What every claim of a pod was allocated: ``count`` units of ``card`` (None: no GPU whose
    model is known); ``named``: the units of each claim by name (``namespace/name``), which several
    pods may share; ``unpublished``: (claim, device) of the GPUs of a driver of ours that no slice
    the cache holds publishes, counted on ``card`` when it is known, else not counted."""

    card: CardName | None
    count: int = 0
    named: tuple[tuple[str, int], ...] = ()
    unpublished: tuple[tuple[str, str], ...] = ()
    told: str = ""
    complete: bool = True  # every claim of the pod is allocated (else: those that are)


def claims_given(
    refs: tuple[ClaimRef, ...], namespace: str, devices: Devices, fallback: CardName | None
) -> Given | None:
    """What a pod's claims were given, read from their allocations alone (each device's card through
    the slices, as the allocation check reads it): whatever their classes say now, or whether they
    exist. ``complete`` once every claim of the pod is seen allocated; None while none is. A pod's
    GPUs are one model: devices of several (claims allocated before the webhook checked them) are
    all counted on ``fallback`` (the model the pod is known to be charged for otherwise) when it
    holds some of it, else on the one it holds most of. A device no slice publishes is counted on
    the model of the pod's other devices, else on ``fallback``, else not at all."""
    claims = []
    for ref in refs:
        name = ref.claim or (ref.generated if ref.template else "")
        claim = devices.claims.get(f"{namespace}/{name}") if name else None
        if claim is not None and claim.is_allocated:
            claims.append((ref, claim))
    if not claims:
        return None
    known: Counter[CardName] = Counter()
    read: list[tuple[ClaimRef, ClaimRecord, int, list[str]]] = []
    for ref, claim in claims:
        units, unknown = 0, []
        for device in claim.allocated:
            found = devices.given(device)
            if found is None:
                continue
            model, taken = found
            if model is None:
                unknown.append(f"{device.where} of {device.driver}")
            else:
                known[model] += taken
                units += taken
        read.append((ref, claim, units, unknown))
    card: CardName | None
    if len(known) > 1:  # claims allocated before the webhook checked them: all counted on one model
        card = fallback if fallback in known else max(sorted(known), key=known.__getitem__)
    else:
        card = next(iter(known), None) or fallback
    count, named_units, unpublished, told = 0, [], [], []
    for ref, claim, units, unknown in read:
        units += UNIT * len(unknown) if card is not None else 0
        unpublished += [(claim.key, device) for device in unknown]
        if ref.claim:
            named_units.append((claim.key, units))
        if units:
            told.append(f"claim {named(claim.name)} allocated: {amount(units)} {card}")
        count += units
    complete = len(claims) == len(refs)
    return Given(card, count, tuple(named_units), tuple(unpublished), "; ".join(told), complete)

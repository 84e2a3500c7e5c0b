"""DRA's CEL selectors, evaluated as the API server and kube-scheduler evaluate them (SPEC §4b).

A DeviceClass's and a request's ``selectors[].cel.expression`` are compiled by a real CEL
implementation (``cel-expr-python``, the CEL project's own runtime) and evaluated against each
device a ResourceSlice publishes, with the variable Kubernetes gives them
(``k8s.io/dynamic-resource-allocation/cel``):

* ``device.driver``; ``device.attributes[domain][name]``: each attribute under its domain, an
  unqualified name under the device's driver; int, bool, string, and version values as semvers;
  ``device.capacity[domain][name]``: quantities; ``device.allowMultipleAllocations``.
* A domain the device has no attribute of reads as an empty map (as Kubernetes' default), so
  ``device.attributes['other.com'].x`` is an error and ``'x' in device.attributes['other.com']`` is
  false.
* Kubernetes' quantity and semver libraries: ``quantity()``, ``isQuantity()``, ``semver()``,
  ``isSemver()``, ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``add``, ``sub``,
  ``asInteger``, ``asApproximateFloat``, ``isInteger``, ``sign``, ``major``, ``minor``, ``patch``;
  CEL's strings, optional and bindings extensions. A quantity or semver is a CEL map holding its
  exact value under a tag key (two equal quantities are equal maps), since the runtime keeps no
  foreign values.

An expression that does not compile, or that errors on a device, is an error with the reason, as
the scheduler treats it (an error aborts the claim's allocation): never "no match". The sets and
lists extensions of Kubernetes' CEL are not available; an expression using them does not compile.

Each evaluation is held to Kubernetes' cost limit (``celcost``): an expression whose cost on a device
may pass 1,000,000 units of cel-go's runtime cost is not evaluated there, and is an error with the
reason, as the scheduler aborts it past that limit.
"""

import functools
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Any, NamedTuple

from webhook.core.model import celcost
from webhook.core.model.celcost import MAX_COST
from webhook.core.model.quantity import QuantityError, parse_quantity
from webhook.core.model.quoting import shorten

Raw = Mapping[str, Any]
QUANTITY, SEMVER = "k8s.io/quantity", "k8s.io/semver"  # the tags of the two foreign kinds of value
MAX_LENGTH = 10 * 1024  # the API server's own limit on an expression's length


class CelError(Exception):
    """An expression that does not compile, or that errors on a device: the reason."""


# ---- Kubernetes' quantity and semver libraries --------------------------------------------------
def _quantity(text: str) -> dict[str, str]:
    value = parse_quantity(text)
    return {QUANTITY: f"{value.numerator}/{value.denominator}"}


def _is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_LOOSE = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)$")


def _semver_text(text: str, normalize: bool = False) -> str:
    if normalize:  # Kubernetes' normalization: a leading v, missing minor or patch, leading zeros
        loose = _LOOSE.match(text)
        if loose:
            text = ".".join(str(int(p or 0)) for p in loose.groups()[:3]) + loose[4]
    if not _SEMVER.match(text):
        raise ValueError(f"{shorten(text)} is not a semantic version")
    return text


def _semver(text: str, normalize: bool = False) -> dict[str, str]:
    return {SEMVER: _semver_text(text, normalize)}


def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        _semver_text(text, normalize)
    except ValueError:
        return False
    return True


def _q(value: Mapping[str, Any]) -> Fraction:
    if QUANTITY not in value:
        raise ValueError("not a quantity")
    return Fraction(str(value[QUANTITY]))


def _version_key(value: Mapping[str, Any]) -> tuple[Any, ...]:
    """Semver precedence: numbers, then a version without pre-release above one with it."""
    if SEMVER not in value:
        raise ValueError("not a semver")
    match = _SEMVER.match(str(value[SEMVER]))
    assert match is not None
    pre = match[4]
    fields = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")) if pre else ()
    return int(match[1]), int(match[2]), int(match[3]), not pre, fields


def _compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    if QUANTITY in a and QUANTITY in b:
        x, y = _q(a), _q(b)
        return (x > y) - (x < y)
    if SEMVER in a and SEMVER in b:
        k, m = _version_key(a), _version_key(b)
        return (k > m) - (k < m)
    raise ValueError("compareTo of values of two kinds")


def _as_quantity(value: Fraction) -> dict[str, str]:
    return {QUANTITY: f"{value.numerator}/{value.denominator}"}


def _as_integer(value: Mapping[str, Any]) -> int:
    q = _q(value)
    if q.denominator != 1 or not -(2**63) <= q < 2**63:
        raise ValueError("the quantity is not an int64")
    return int(q)


def _version_part(index: int) -> Callable[[Mapping[str, Any]], int]:
    def part(value: Mapping[str, Any]) -> int:
        key = _version_key(value)
        return int(key[index])

    return part


@functools.cache
def _runtime() -> Any:
    """The CEL runtime, loaded with the first selector compiled: a replica whose cluster has no
    DRA GPUs never loads it (9 MiB of memory)."""
    from cel_expr_python import cel

    return cel


def _functions(cel: Any) -> list[Any]:
    """Kubernetes' quantity and semver functions, declared to the runtime."""
    M = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
    S, B, N, D = cel.Type.STRING, cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE

    def _overload(
        name: str, result: Any, params: list[Any], impl: Callable[..., Any], member: bool = False
    ) -> Any:
        return cel.Overload(name, result, params, is_member=member, impl=impl)

    return [
        cel.FunctionDecl("quantity", [_overload("quantity_string", M, [S], _quantity)]),
        cel.FunctionDecl("isQuantity", [_overload("is_quantity_string", B, [S], _is_quantity)]),
        cel.FunctionDecl(
            "semver",
            [
                _overload("semver_string", M, [S], _semver),
                _overload("semver_string_bool", M, [S, B], _semver),
            ],
        ),
        cel.FunctionDecl(
            "isSemver",
            [
                _overload("is_semver_string", B, [S], _is_semver),
                _overload("is_semver_string_bool", B, [S, B], _is_semver),
            ],
        ),
        cel.FunctionDecl("compareTo", [_overload("k8s_compare_to", N, [M, M], _compare, True)]),
        cel.FunctionDecl(
            "isGreaterThan",
            [_overload("k8s_is_greater_than", B, [M, M], lambda a, b: _compare(a, b) > 0, True)],
        ),
        cel.FunctionDecl(
            "isLessThan", [_overload("k8s_is_less_than", B, [M, M], lambda a, b: _compare(a, b) < 0, True)]
        ),
        cel.FunctionDecl(
            "add",
            [
                _overload("quantity_add", M, [M, M], lambda a, b: _as_quantity(_q(a) + _q(b)), True),
                _overload("quantity_add_int", M, [M, N], lambda a, b: _as_quantity(_q(a) + b), True),
            ],
        ),
        cel.FunctionDecl(
            "sub",
            [
                _overload("quantity_sub", M, [M, M], lambda a, b: _as_quantity(_q(a) - _q(b)), True),
                _overload("quantity_sub_int", M, [M, N], lambda a, b: _as_quantity(_q(a) - b), True),
            ],
        ),
        cel.FunctionDecl("asInteger", [_overload("quantity_as_integer", N, [M], _as_integer, True)]),
        cel.FunctionDecl(
            "asApproximateFloat", [_overload("quantity_as_float", D, [M], lambda a: float(_q(a)), True)]
        ),
        cel.FunctionDecl(
            "isInteger", [_overload("quantity_is_integer", B, [M], lambda a: _q(a).denominator == 1, True)]
        ),
        cel.FunctionDecl(
            "sign", [_overload("quantity_sign", N, [M], lambda a: (_q(a) > 0) - (_q(a) < 0), True)]
        ),
        cel.FunctionDecl("major", [_overload("semver_major", N, [M], _version_part(0), True)]),
        cel.FunctionDecl("minor", [_overload("semver_minor", N, [M], _version_part(1), True)]),
        cel.FunctionDecl("patch", [_overload("semver_patch", N, [M], _version_part(2), True)]),
    ]


@functools.cache
def _env() -> Any:
    from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

    cel = _runtime()
    extensions = [ext_strings.ExtStrings(), ext_optional.ExtOptional(), ext_bindings.ExtBindings()]
    return cel.NewEnv(variables={"device": cel.Type.DYN}, functions=_functions(cel), extensions=extensions)


# ---- compiling and evaluating -------------------------------------------------------------------
_DOMAIN = re.compile(r"""(?:attributes|capacity)\s*\[\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')\s*\]""")


Paths = tuple[tuple[str, str, str], ...] | None  # (field, domain, name) of each value it reads


class Sketch(NamedTuple):
    """What is kept of a selector compiled in another process: the values it reads of a device
    (``Program.key``; None: it may read more)."""

    paths: Paths


def _field(path: tuple[str, ...]) -> tuple[str, str, str]:
    """``("device", "attributes", domain, name)`` as ``("attributes", domain, name)``, ``("device",
    "driver")`` as ``("driver", "", "")``."""
    rest = (*path[1:], "", "")
    return rest[0], rest[1], rest[2]


def _compile(text: str) -> Any:
    try:
        return _env().compile(text)
    except RuntimeError as exc:
        raise CelError(f"its CEL selector {shorten(text)} does not compile: {_reason(exc)}") from None


class Program:
    """One compiled selector, and the domains it names (read as empty maps on devices without
    them, as Kubernetes reads them). One known from a ``Sketch`` (compiled in another process) is
    compiled here only when it is first evaluated here; until then its cost is known on the shapes
    of devices that process told (``learn``)."""

    __slots__ = ("_costs", "_expression", "_paths", "domains", "text", "tree")

    def __init__(self, text: str, sketch: Sketch | None = None) -> None:
        if len(text) > MAX_LENGTH:
            raise CelError(f"its CEL selector is longer than {MAX_LENGTH} characters")
        self.text = text
        self.domains = frozenset(a or b for a, b in _DOMAIN.findall(text))
        self._expression: Any = None
        self.tree: celcost.Node | None = None
        self._costs: dict[Any, int] = {}  # the device's shape -> the bound of one evaluation on it
        if sketch is None:
            self._compile()
        else:
            self._paths = sketch.paths

    def _compile(self) -> None:
        self._expression = _compile(self.text)
        self.tree = celcost.checked(self._expression.serialize())
        reads = celcost.reads(self.tree)
        self._paths = None if reads is None else tuple(_field(path) for path in sorted(reads))

    @property
    def expression(self) -> Any:
        if self._expression is None:
            self._compile()
        return self._expression

    @property
    def compiled(self) -> bool:
        return self._expression is not None

    @property
    def sketch(self) -> "Sketch":
        return Sketch(self._paths)

    def learn(self, costs: Mapping[Any, int]) -> None:
        """Costs worked out elsewhere, by device shape."""
        if len(self._costs) + len(costs) > MAX_SHAPES:
            self._costs.clear()
        self._costs.update(costs)

    def key(self, device: "DeviceData") -> Any:
        """What this selector's answer on ``device`` depends on: the values it reads of it, when it
        reads only values at constant paths (devices alike in them are answered alike, as one);
        else the device itself."""
        paths = self._paths
        if paths is None:
            return device
        keys = device.keys
        found = keys.get(paths)
        if found is None:
            if len(keys) >= MAX_KEYS:
                keys.clear()
            data, values = device.data, []
            for field, domain, name in paths:
                if field in _MAPS:
                    value = data[field].get(domain, _EMPTY).get(name, _MISSING)
                else:
                    value = data.get(field, _MISSING)
                values.append(
                    (dict, tuple(value.items())) if isinstance(value, dict) else (value.__class__, value)
                )
            found = keys[paths] = tuple(values)
        return found

    def cost(self, device: "DeviceData") -> int | None:
        """The most one evaluation on ``device`` may cost cel-go (``celcost.bound``); None when it
        is not known here (compiled elsewhere, and not told of devices of this shape)."""
        shape = device.shape()
        found = self._costs.get(shape.key)
        if found is None and self.tree is not None:
            if len(self._costs) >= MAX_SHAPES:
                self._costs.clear()
            found = self._costs[shape.key] = celcost.bound(self.tree, shape)
        return found

    def costs(self, devices: "Iterable[DeviceData]") -> dict[Any, int]:
        """The bound of one evaluation on each shape of ``devices`` (to tell another process)."""
        out = {}
        for device in devices:
            key = device.shape().key
            if key not in out and (cost := self.cost(device)) is not None:
                out[key] = cost
        return out

    def over(self, device: "DeviceData") -> str:
        """Why ``device`` is not evaluated (its cost may pass Kubernetes' limit), or ""."""
        if not self.compiled:
            self._compile()  # compiled here: its bound is known on every device
        cost = self.cost(device)
        assert cost is not None
        if cost <= MAX_COST:
            return ""
        said = "cannot be bounded" if cost >= celcost.UNBOUNDED else f"may reach {cost:,}"
        return (
            f"its CEL selector {shorten(self.text)} is not evaluated on device {device.name}: its cost"
            f" {said}, past Kubernetes' limit of {MAX_COST:,} for one evaluation (the scheduler aborts a"
            " claim's allocation past it)"
        )

    def evaluate(self, device: "DeviceData") -> bool | str:
        """Whether ``device`` is selected, or why that cannot be known (the text of the error)."""
        try:
            return self.matches(device)
        except CelError as error:
            return str(error)

    def matches(self, device: "DeviceData") -> bool:
        """Whether ``device`` is selected; ``CelError`` when evaluating it errors or would cost more
        than Kubernetes allows."""
        if why := self.over(device):
            raise CelError(why)
        data = device.with_domains(self.domains)
        try:
            result = self.expression.eval(data={"device": data})
        except RuntimeError as exc:
            raise self._fails(device, _reason(exc)) from None
        value = result.value()
        if isinstance(value, bool):
            return value
        if result.type() == _runtime().Type.ERROR:
            raise self._fails(device, _reason(value))
        raise self._fails(device, f"its result is of type {result.type().name().lower()}, not bool")

    def _fails(self, device: "DeviceData", why: str) -> CelError:
        return CelError(f"its CEL selector {shorten(self.text)} fails on device {device.name}: {why}")


MAX_SHAPES = 256  # device shapes whose bound one program keeps
MAX_KEYS = 64  # the values of this many sets of paths one device keeps


def _reason(error: object) -> str:
    """The first line of a CEL error, without its status code."""
    text = re.sub(r"^[A-Z_]+: ", "", str(error).split("\n", 1)[0]).removesuffix(" [INVALID_ARGUMENT]")
    return text if len(text) <= 160 else text[:157] + "..."


_PROGRAMS: OrderedDict[str, Program | str] = OrderedDict()  # text -> its program, or why it does not compile
MAX_PROGRAMS = 1024  # bounded: a selector text is compiled once while it is used


def program(text: str) -> Program:
    """The compiled selector ``text``; ``CelError`` with the reason when it does not compile."""
    found = known(text)
    if found is None:
        try:
            found = Program(text)
        except CelError as error:
            found = str(error)
        _keep(text, found)
    if isinstance(found, str):
        raise CelError(found)
    return found


def known(text: str) -> Program | str | None:
    """The program of ``text`` (or why it does not compile) if it is at hand, without compiling."""
    found = _PROGRAMS.get(text)
    if found is not None:
        _PROGRAMS.move_to_end(text)
    return found


def adopt(text: str, sketch: Sketch | str) -> None:
    """What another process found of ``text``: its sketch, or why it does not compile."""
    if text not in _PROGRAMS:
        _keep(text, sketch if isinstance(sketch, str) else Program(text, sketch))


def _keep(text: str, found: Program | str) -> None:
    _PROGRAMS[text] = found
    if len(_PROGRAMS) > MAX_PROGRAMS:
        _PROGRAMS.popitem(last=False)


_MISSING = ("missing",)  # a value the device does not have
_EMPTY: dict[str, Any] = {}
_MAPS = ("attributes", "capacity")


class DeviceData:
    """A published device as the ``device`` variable of a selector."""

    __slots__ = ("_shape", "attributes", "capacity", "data", "keys", "name")

    def __init__(self, name: str, driver: str, attributes: Raw, capacity: Raw, multiple: bool) -> None:
        self.name = name
        self._shape: celcost.Shape | None = None
        self.keys: dict[Paths, Any] = {}  # what a selector reading these values reads (``Program.key``)
        self.attributes = _by_domain(driver, attributes, _attribute)
        self.capacity = _by_domain(driver, capacity, _capacity)
        self.data: dict[str, Any] = {
            "driver": driver,
            "attributes": self.attributes,
            "capacity": self.capacity,
            "allowMultipleAllocations": multiple,
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceData) and (self.name, self.data) == (other.name, other.data)

    def __hash__(self) -> int:
        return hash(self.name)

    def __getstate__(self) -> tuple[str, dict[str, Any]]:
        return self.name, self.data  # sent to the process that evaluates what the loop defers

    def __setstate__(self, state: tuple[str, dict[str, Any]]) -> None:
        self.name, self.data = state
        self.attributes, self.capacity = self.data["attributes"], self.data["capacity"]
        self._shape, self.keys = None, {}

    def shape(self) -> celcost.Shape:
        """The sizes a selector's cost depends on."""
        if self._shape is None:
            driver = self.data["driver"]
            self._shape = celcost.Shape(driver, {"attributes": self.attributes, "capacity": self.capacity})
        return self._shape

    def with_domains(self, domains: frozenset[str]) -> dict[str, Any]:
        missing = [d for d in domains if d not in self.attributes or d not in self.capacity]
        if not missing:
            return self.data
        empty: dict[str, dict[str, Any]] = {d: {} for d in missing}
        return {**self.data, "attributes": empty | self.attributes, "capacity": empty | self.capacity}


def _by_domain(driver: str, raw: Raw, read: Callable[[Any], Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in raw.items():
        domain, _, name = str(key).rpartition("/")
        found = read(value)
        if found is not None and name:
            out.setdefault(domain or driver, {})[name] = found
    return out


def _attribute(raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "int", "bool"):
        value = raw.get(kind)
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value if -(2**63) <= value < 2**63 else None
        if kind == "string" and isinstance(value, str):
            return value
        if kind == "bool" and isinstance(value, bool):
            return value
    version = raw.get("version")
    if isinstance(version, str) and _is_semver(version):
        return {SEMVER: version}
    return None


def _capacity(raw: Any) -> Any:
    try:
        value = parse_quantity(raw.get("value") if isinstance(raw, Mapping) else None)
    except QuantityError:
        return None
    return None if math.isinf(value) else _as_quantity(value)

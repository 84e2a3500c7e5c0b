"""What a DRA selector may cost the scheduler: cel-go's runtime cost of one evaluation, bounded from
the checked expression and the device's own sizes before it is evaluated (SPEC §4b).

Kubernetes limits each evaluation of a selector to ``CELSelectorExpressionMaxCost`` (1,000,000)
units of cel-go's runtime cost (``k8s.io/dynamic-resource-allocation/cel``: ``cel.CostLimit``), the
scheduler aborting the claim's allocation past it, and the API server refuses at its write a
selector whose estimate (cel-go's ``checker/cost.go`` over the largest device Kubernetes allows)
is past it. The CEL runtime used here counts no cost, so :func:`bound` counts it the way cel-go's
runtime tracker does (``interpreter/runtimecost.go``, with Kubernetes' function costs of
``k8s.io/apiserver/pkg/cel/library/cost.go``), over the checked tree the runtime compiled:

* a constant 0; an identifier, a field select, an index, a presence test 1; a list literal 10, a
  map literal 30, besides their elements;
* a call 1 besides its arguments, except ``&&``, ``||`` and ``?:`` (nothing of their own),
  equality and ordering (a tenth of the shorter operand's size, at least 1), ``in`` a list (its
  size), ``startsWith``/``endsWith`` (a tenth of the string), ``contains`` (a tenth of the string
  times a tenth of the substring), ``matches`` (a tenth of the string plus one, times a quarter of
  the pattern), string concatenation (a tenth of the result), ``lowerAscii``, ``upperAscii``,
  ``trim``, ``substring`` (a tenth of the string), ``replace``, ``split`` (a fifth), ``join`` (a
  fifth of the result), ``indexOf``/``lastIndexOf`` (a tenth), ``quantity``/``isQuantity`` (a tenth
  of the text);
* a comprehension (``all``, ``exists``, ``exists_one``, ``map``, ``filter``, ``cel.bind``): its
  range, its start and its result, plus, for every element of the range, its condition and step.

Sizes are the device's own (the length of its driver and of each attribute's text, the number of
its domains and of the attributes of each) or the literal's; every iteration is counted and both
sides of ``&&``, ``||`` and ``?:``, so the bound is never below what cel-go counts, and equal to it
for an expression without short cuts. A size that cannot be known makes the bound
``UNBOUNDED``, as cel-go's estimator makes it (the API server refuses such an expression).
"""

import math
import struct
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

MAX_COST = 1_000_000  # resource.k8s.io's CELSelectorExpressionMaxCost: the limit of one evaluation
UNBOUNDED = 1 << 64  # a cost or size nothing bounds (cel-go's math.MaxUint64)
SEMVER, QUANTITY = "k8s.io/semver", "k8s.io/quantity"  # cel.py's tags of Kubernetes' two kinds


# ---- the checked expression, read from the runtime's serialized cel.expr.CheckedExpr ----------
class Const(NamedTuple):
    value: Any


class Ident(NamedTuple):
    name: str


class Select(NamedTuple):
    operand: Any
    field: str
    test: bool


class Call(NamedTuple):
    function: str
    target: Any  # None for a global call
    args: tuple[Any, ...]


class ListOf(NamedTuple):
    elements: tuple[Any, ...]


class MapOf(NamedTuple):
    entries: tuple[tuple[Any, Any], ...]  # (key, value); a message's field keys are Const
    message: bool


class Unreadable(NamedTuple):
    """A checked expression this reader could not read (never expected: the runtime wrote it)."""

    why: str


class Loop(NamedTuple):
    var: str
    var2: str
    range: Any
    accu: str
    init: Any
    condition: Any
    step: Any
    result: Any


Node = Const | Ident | Select | Call | ListOf | MapOf | Loop | Unreadable


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """The (field number, wire type, value) of a protobuf message's wire form."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = data[at : at + size], at + size
        elif wire == 1:
            value, at = data[at : at + 8], at + 8
        elif wire == 5:
            value, at = data[at : at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def _message(data: bytes) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for number, _, value in _fields(data):
        out.setdefault(number, []).append(value)
    return out


def _one(message: dict[int, list[Any]], number: int, default: Any = b"") -> Any:
    found = message.get(number)
    return found[-1] if found else default


def _text(message: dict[int, list[Any]], number: int) -> str:
    return bytes(_one(message, number)).decode("utf-8", "replace")


def _constant(data: bytes) -> Const:
    message = _message(data)
    if 6 in message:
        return Const(_text(message, 6))
    if 7 in message:
        return Const(bytes(_one(message, 7)))
    if 2 in message:
        return Const(bool(_one(message, 2)))
    if 3 in message:
        value = _one(message, 3)
        return Const(value - (1 << 64) if value >= 1 << 63 else value)
    if 4 in message:
        return Const(_one(message, 4))
    if 5 in message:
        return Const(struct.unpack("<d", _one(message, 5))[0])
    return Const(None)


def _expr(data: bytes) -> Node:
    message = _message(data)
    if 3 in message:
        return _constant(_one(message, 3))
    if 4 in message:
        return Ident(_text(_message(_one(message, 4)), 1))
    if 5 in message:
        select = _message(_one(message, 5))
        return Select(_expr(_one(select, 1)), _text(select, 2), bool(_one(select, 3, 0)))
    if 6 in message:
        call = _message(_one(message, 6))
        target = _expr(_one(call, 1)) if 1 in call else None
        return Call(_text(call, 2), target, tuple(_expr(arg) for arg in call.get(3, ())))
    if 7 in message:
        return ListOf(tuple(_expr(e) for e in _message(_one(message, 7)).get(1, ())))
    if 8 in message:
        struct_ = _message(_one(message, 8))
        entries = []
        for raw in struct_.get(2, ()):
            entry = _message(raw)
            key = _expr(_one(entry, 3)) if 3 in entry else Const(_text(entry, 2))
            entries.append((key, _expr(_one(entry, 4))))
        return MapOf(tuple(entries), bool(_text(struct_, 1)))
    if 9 in message:
        loop = _message(_one(message, 9))
        return Loop(
            _text(loop, 1),
            _text(loop, 8),
            _expr(_one(loop, 2)),
            _text(loop, 3),
            _expr(_one(loop, 4)),
            _expr(_one(loop, 5)),
            _expr(_one(loop, 6)),
            _expr(_one(loop, 7)),
        )
    return Const(None)  # an expression the checker left unset: nothing to count


def checked(serialized: bytes) -> Node:
    """The tree of an expression the runtime compiled (``Expression.serialize()``: a
    ``google.protobuf.Any`` holding a ``cel.expr.CheckedExpr``); ``Unreadable``, whose cost is
    unbounded, if it cannot be read."""
    try:
        wrapped = _message(serialized)
        return _expr(_one(_message(_one(wrapped, 2)), 4))
    except (ValueError, IndexError, struct.error, RecursionError) as exc:
        return Unreadable(str(exc))


# ---- the device's sizes ------------------------------------------------------------------------
class Shape:
    """What the cost of a selector depends on in a device: the sizes of what it may read."""

    __slots__ = ("driver", "key", "maps")

    def __init__(self, driver: str, maps: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> None:
        self.driver = len(driver)
        self.maps = {
            kind: {domain: {name: _size(v) for name, v in values.items()} for domain, values in by.items()}
            for kind, by in maps.items()
        }
        self.key = (
            self.driver,
            tuple(
                (kind, tuple((d, tuple(sorted(v.items()))) for d, v in sorted(by.items())))
                for kind, by in sorted(self.maps.items())
            ),
        )


def _size(value: Any) -> tuple[int, str]:
    """A value's size as cel-go counts it (a string's characters; 1 for the others) and kind."""
    if isinstance(value, str):
        return len(value), "string"
    if isinstance(value, bool):
        return 1, "bool"
    if isinstance(value, int):
        return 1, "int"
    return 1, "other"  # a semver or a quantity: an object to cel-go


# ---- the bound ---------------------------------------------------------------------------------
class Est(NamedTuple):
    """One node's bound: its cost, the largest size of its value, its kind, where in ``device`` it
    is (a path, when it is the device or a part of it), and what its elements (a list's, or a
    map's values) and keys (a map's) are."""

    cost: int
    size: int = 1
    kind: str = "dyn"
    path: tuple[str, ...] | None = None
    elem: "Est | None" = None
    keys: "Est | None" = None


def _cap(value: int) -> int:
    return min(value, UNBOUNDED)


def _tenth(size: int, factor: float = 0.1) -> int:
    return _cap(math.ceil(size * factor)) if size < UNBOUNDED else UNBOUNDED


def _join(a: Est | None, b: Est | None) -> Est | None:
    """The larger of two values either of which a node may be."""
    if a is None or b is None:
        return a or b
    return Est(
        max(a.cost, b.cost),
        max(a.size, b.size),
        a.kind if a.kind == b.kind else "dyn",
        a.path if a.path == b.path else None,
        _join(a.elem, b.elem),
        _join(a.keys, b.keys),
    )


STRINGY = frozenset({"string", "bytes", "dyn"})
FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")


class _Bounder:
    def __init__(self, shape: Shape) -> None:
        self.shape = shape

    def device(self, path: tuple[str, ...]) -> Est:
        """The value at ``path`` of the device ("*": any key there)."""
        shape, depth = self.shape, len(path)
        if depth == 1:
            return Est(0, len(FIELDS), "map", path)
        field = path[1]
        if field == "driver" and depth == 2:
            return Est(0, shape.driver, "string")
        if field not in ("attributes", "capacity"):
            return Est(0, 1, "bool" if field == "allowMultipleAllocations" else "dyn")
        by = shape.maps.get(field, {})
        if depth == 2:
            names = Est(0, max((len(d) for d in by), default=0), "string")
            return Est(0, len(by), "map", path, self.device((*path, "*")), names)
        domains = list(by.values()) if path[2] == "*" else [by.get(path[2], {})]
        if depth == 3:
            names = Est(0, max((len(n) for d in domains for n in d), default=0), "string")
            entries = max((len(d) for d in domains), default=0)
            return Est(0, entries, "map", path, self.device((*path, "*")), names)
        if depth == 4:
            values = [v for d in domains for n, v in d.items() if path[3] in ("*", n)]
            kinds = {k for _, k in values}
            return Est(0, max((s for s, _ in values), default=0), kinds.pop() if len(kinds) == 1 else "dyn")
        return Est(0)  # a field of a semver or a quantity: an error to cel-go

    def bound(self, node: Node, scope: Mapping[str, Est]) -> Est:
        match node:
            case Const(value):
                if isinstance(value, str):
                    return Est(0, len(value), "string")
                if isinstance(value, bytes):
                    return Est(0, len(value), "bytes")
                return Est(0, 1, "bool" if isinstance(value, bool) else "other")
            case Ident(name):
                if name in scope:
                    return scope[name]._replace(cost=1)
                if name == "device":
                    return self.device(("device",))._replace(cost=1)
                return Est(1)
            case Select(operand, field, _):
                of = self.bound(operand, scope)
                return self._member(of, field)._replace(cost=_cap(of.cost + 1))
            case ListOf(elements):
                parts = [self.bound(e, scope) for e in elements]
                elem = None
                for part in parts:
                    elem = _join(elem, part._replace(cost=0))
                return Est(_cap(10 + sum(p.cost for p in parts)), len(parts), "list", None, elem)
            case MapOf(entries, message):
                keys = values = None
                cost = 40 if message else 30
                for key, value in entries:
                    k, v = self.bound(key, scope), self.bound(value, scope)
                    cost += k.cost + v.cost
                    keys, values = _join(keys, k._replace(cost=0)), _join(values, v._replace(cost=0))
                return Est(_cap(cost), len(entries), "map", None, values, keys)
            case Loop():
                return self._loop(node, scope)
            case Call():
                return self._call(node, scope)
        return Est(UNBOUNDED, UNBOUNDED)

    def _member(self, of: Est, key: str | None) -> Est:
        """What selecting (or indexing with) ``key`` (None: a key not known) of ``of`` gives."""
        if of.path is not None and of.path[0] == "device":
            if len(of.path) == 1 and key is not None and key not in FIELDS:
                return Est(0)  # no such field: an error
            if len(of.path) == 1 and key is None:
                return Est(0, UNBOUNDED, "dyn")
            return self.device((*of.path, "*" if key is None else key))
        if of.elem is not None:
            return of.elem
        if of.kind in ("list", "map", "dyn"):
            return Est(0, UNBOUNDED, "dyn")
        return Est(0)

    def _loop(self, loop: Loop, scope: Mapping[str, Est]) -> Est:
        over = self.bound(loop.range, scope)
        start = self.bound(loop.init, scope)
        count = over.size
        if over.kind == "map" or (over.keys is not None and over.kind != "list"):
            item = over.keys or Est(0, UNBOUNDED)
            second = over.elem or Est(0, UNBOUNDED)
        else:
            item = over.elem or Est(0, UNBOUNDED if over.kind in ("list", "dyn") else 1)
            item, second = (Est(0, 1, "int"), item) if loop.var2 else (item, Est(0))
        inner = {**scope, loop.var: item._replace(cost=0)}
        if loop.var2:
            inner[loop.var2] = second._replace(cost=0)
        accu = start._replace(cost=0)
        step = self.bound(loop.step, {**inner, loop.accu: accu})
        if count and step.kind == "list" and step.size > accu.size:  # map() and filter(): it grows
            grown = _cap(accu.size + count * (step.size - accu.size))
            accu = Est(0, grown, "list", None, _join(accu.elem, step.elem))
            step = self.bound(loop.step, {**inner, loop.accu: accu})
        condition = self.bound(loop.condition, {**inner, loop.accu: accu})
        result = self.bound(loop.result, {**scope, loop.accu: accu})
        each = _cap(condition.cost + step.cost)
        cost = _cap(over.cost + start.cost + result.cost + (_cap(count * each) if count else 0))
        return result._replace(cost=cost)

    def _call(self, call: Call, scope: Mapping[str, Est]) -> Est:
        name = call.function
        target = self.bound(call.target, scope) if call.target is not None else None
        args = [self.bound(a, scope) for a in call.args]
        operands = ([target] if target is not None else []) + args
        spent = _cap(sum(o.cost for o in operands))

        def cost(own: int, result: Est | None = None) -> Est:
            out = result if result is not None else Est(0, 1, "bool")
            return out._replace(cost=_cap(spent + own))

        sizes = [o.size for o in operands]
        if name in ("_&&_", "_||_"):
            return cost(0)
        if name == "_?_:_" and len(args) == 3:
            joined = _join(args[1], args[2])
            assert joined is not None
            return joined._replace(cost=_cap(args[0].cost + max(args[1].cost, args[2].cost)))
        if name in ("_[_]", "_[?_]", "_?._") and len(args) == 2:
            key = call.args[1]
            text = key.value if isinstance(key, Const) and isinstance(key.value, str) else None
            return cost(1, self._member(args[0], text))
        if name in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_") and len(sizes) == 2:
            return cost(max(1, _tenth(min(sizes))))
        if name == "@in" and len(sizes) == 2:
            return cost(max(1, sizes[1]))
        if name == "_+_" and len(operands) == 2:
            a, b = operands
            if "list" in (a.kind, b.kind):
                return cost(1, Est(0, _cap(a.size + b.size), "list", None, _join(a.elem, b.elem)))
            if a.kind in STRINGY and b.kind in STRINGY:
                total = _cap(a.size + b.size)
                return cost(max(1, _tenth(total)), Est(0, total, a.kind if a.kind == b.kind else "dyn"))
            return cost(1, Est(0, 1, a.kind))
        if name in ("startsWith", "endsWith"):
            return cost(max(1, _tenth(max(sizes))))
        if name == "contains" and len(sizes) == 2:
            return cost(max(1, _cap(_tenth(sizes[0]) * _tenth(sizes[1]))))
        if name == "matches" and len(sizes) == 2:
            return cost(max(1, _cap(_tenth(sizes[0] + 1) * _tenth(sizes[1], 0.25))))
        if name == "size":
            return cost(1, Est(0, 1, "int"))
        if name in ("lowerAscii", "upperAscii", "trim", "substring") and sizes:
            return cost(max(1, _tenth(sizes[0])), Est(0, sizes[0], "string"))
        if name == "replace" and len(operands) >= 3:
            whole, old, new = sizes[0], call.args[0], sizes[2]
            least = len(old.value) if isinstance(old, Const) and isinstance(old.value, str) else 0
            if least == 0:
                size = _cap((whole + 1) * new + whole)
            elif new <= least:
                size = whole
            else:
                size = _cap(math.ceil(whole / least) * new)
            return cost(max(1, _tenth(whole, 0.2)), Est(0, size, "string"))
        if name == "split" and sizes:
            parts = Est(0, sizes[0], "string")
            return cost(max(1, _tenth(sizes[0], 0.2)), Est(0, _cap(sizes[0] + 1), "list", None, parts))
        if name == "join" and target is not None:
            each = target.elem.size if target.elem is not None else UNBOUNDED
            separators = args[0].size if args else 0
            size = _cap(target.size * each + max(0, target.size - 1) * separators)
            return cost(max(1, _tenth(size, 0.2)), Est(0, size, "string"))
        if name in ("indexOf", "lastIndexOf") and sizes:
            return cost(max(1, _tenth(sizes[0])), Est(0, 1, "int"))
        if name in ("charAt", "reverse"):
            return cost(1, Est(0, 1 if name == "charAt" else sizes[0], "string"))
        if name == "strings.quote" and sizes:
            return cost(1, Est(0, _cap(6 * sizes[-1] + 2), "string"))
        if name == "format" and target is not None and args:
            listed = args[0]
            each = max(listed.elem.size if listed.elem is not None else UNBOUNDED, 32)
            return cost(1, Est(0, _cap(target.size + listed.size * each), "string"))
        if name in ("quantity", "isQuantity") and sizes:
            return cost(max(1, _tenth(sizes[-1])), Est(0, 1, "other"))
        if name == "string" and sizes:
            return cost(1, Est(0, max(sizes[-1], 32), "string"))
        if name == "bytes" and sizes:
            return cost(max(1, _tenth(sizes[-1])), Est(0, _cap(4 * sizes[-1]), "bytes"))
        if name in ("dyn", "optional.of", "optional.ofNonZeroValue", "value") and operands:
            return cost(1, operands[-1] if name != "value" else operands[0])
        if name in ("orValue", "or") and len(operands) == 2:
            joined = _join(operands[0], operands[1])
            assert joined is not None
            return cost(1, joined._replace(cost=0))
        return cost(1, Est(0, 1, "dyn"))  # every other function is O(1) to cel-go


def bound(tree: Node, shape: Shape) -> int:
    """Never less than the runtime cost cel-go counts for one evaluation of ``tree`` on a device
    of ``shape`` (``UNBOUNDED`` when a size cannot be known)."""
    try:
        return _Bounder(shape).bound(tree, {}).cost
    except RecursionError:
        return UNBOUNDED


# ---- what of the device an expression reads ---------------------------------------------------
class _Whole(Exception):
    """The expression may read more of the device than values at constant paths."""


LEAF = {"driver": 2, "allowMultipleAllocations": 2, "attributes": 4, "capacity": 4}
Path = tuple[str, ...] | None  # where in ``device`` a node is (None: not in it)


def reads(tree: Node) -> frozenset[tuple[str, ...]] | None:
    """The paths of the single values of ``device`` the expression reads (``("device",
    "attributes", domain, name)``, ``("device", "driver")``, ...), when it reads the device only
    through such paths of constant keys: its answer on a device is then a function of those
    values. None when it may read more (a map of the device iterated, measured, compared or
    indexed with a computed key)."""
    found: set[tuple[str, ...]] = set()
    try:
        _Reader(found).visit(tree, {})
    except (_Whole, RecursionError):
        return None
    return frozenset(found)


class _Reader:
    def __init__(self, found: set[tuple[str, ...]]) -> None:
        self.found = found

    def _extend(self, path: tuple[str, ...], key: str) -> tuple[str, ...] | None:
        """``path`` followed by ``key``: a value's path is recorded and the path returned while it
        leads to one; past a value, nothing more of the device is read."""
        if len(path) > 1 and len(path) >= LEAF.get(path[1], 2):
            return None  # a part of a value (a semver's, a quantity's): read with the value
        out = (*path, key)
        if len(out) >= LEAF.get(out[1], 2):
            self.found.add(out)
        return out

    def used(self, node: Node, scope: Mapping[str, Path]) -> None:
        """``node`` used as a value: a map of the device used so is read whole."""
        path = self.visit(node, scope)
        if path is not None and len(path) < LEAF.get(path[1] if len(path) > 1 else "", 2):
            raise _Whole

    def visit(self, node: Node, scope: Mapping[str, Path]) -> Path:
        """The path of the device ``node`` is (None: not the device, nor a part of it)."""
        match node:
            case Ident(name):
                if name in scope:
                    return scope[name]
                return ("device",) if name == "device" else None
            case Select(operand, field, test):
                path = self.visit(operand, scope)
                out = self._extend(path, field) if path is not None else None
                if test and out is not None and len(out) < LEAF.get(out[1], 2):
                    raise _Whole  # has() of a domain: its presence
                return None if test else out
            case Call(function, target, args):
                if function in ("_[_]", "_[?_]", "_?._") and len(args) == 2:
                    path = self.visit(args[0], scope)
                    key = args[1]
                    if path is None:
                        self.used(key, scope)
                        return None
                    if not (isinstance(key, Const) and isinstance(key.value, str)):
                        raise _Whole
                    return self._extend(path, key.value)
                if function == "@in" and len(args) == 2 and isinstance(args[0], Const):
                    path = self.visit(args[1], scope)
                    if path is not None and isinstance(args[0].value, str) and len(path) == 3:
                        self._extend(path, args[0].value)  # a name's presence: with its value
                        return None
                    if path is not None:
                        raise _Whole
                    return None
                for arg in ([target] if target is not None else []) + list(args):
                    self.used(arg, scope)
                return None
            case ListOf(elements):
                for element in elements:
                    self.used(element, scope)
                return None
            case MapOf(entries, _):
                for key, value in entries:
                    self.used(key, scope)
                    self.used(value, scope)
                return None
            case Loop():
                self.used(node.range, scope)
                inner: dict[str, Path] = {**scope, node.var: None, node.var2: None}
                start = self.visit(node.init, scope)
                if start is not None and node.step != Ident(node.accu):
                    raise _Whole
                inner[node.accu] = start  # cel.bind: the bound name stands for that part of the device
                self.used(node.condition, inner)
                self.used(node.step, inner)
                return self.visit(node.result, inner)
            case Const():
                return None
        raise _Whole

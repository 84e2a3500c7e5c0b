"""``@value_class``: how the core declares its values.

Immutable to the type checker (``mypy --strict`` rejects any assignment to a field, as for
``@dataclass(frozen=True)``), a plain slotted dataclass at run time, hashable by its fields. A
frozen dataclass sets each field through ``object.__setattr__`` in ``__init__``, about 0.3 µs a
field on this project's machines: about 16 µs of a multi-card pod's mutation, which builds some
fifty fields of records, verdicts and holds (docs/performance.md). The check moves to where it costs
nothing, the type checker run by ``make test``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")


@overload
def value_class(cls: type[T], /) -> type[T]: ...
@overload
def value_class(*, weakref_slot: bool = ...) -> Callable[[type[T]], type[T]]: ...
@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def value_class(cls: Any = None, /, *, weakref_slot: bool = False) -> Any:
    """``@value_class`` or ``@value_class(weakref_slot=True)``: as ``@dataclass(frozen=True,
    slots=True)`` to the type checker."""
    make = dataclass(slots=True, unsafe_hash=True, weakref_slot=weakref_slot)
    return make if cls is None else make(cls)

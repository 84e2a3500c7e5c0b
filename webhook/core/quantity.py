"""Kubernetes resource quantities, as far as counting cards needs them."""

import math
import re
from fractions import Fraction

_QUANTITY = re.compile(r"^([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": Fraction(1),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


class QuantityError(ValueError):
    """A quantity string Kubernetes would not accept."""


def parse_quantity(value: object) -> Fraction:
    """Exact value of a quantity such as ``2``, ``500m`` or ``1Ki``."""
    if isinstance(value, bool):
        raise QuantityError(f"quantity {value!r} is not a number")
    if isinstance(value, int | Fraction):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match or match[2] not in _SUFFIX:
        raise QuantityError(f"quantity {text!r} is not a Kubernetes quantity")
    number, suffix = match.groups()
    if suffix == "" and ("e" in number.lower()):
        return Fraction(number)
    return Fraction(number) * _SUFFIX[suffix]


def ceil_quantity(value: object) -> int:
    """Rounded up to a whole number, as ``resource.Quantity.Value()`` does."""
    return math.ceil(parse_quantity(value))

"""Kubernetes resource quantities, as far as counting cards needs them."""

import functools
import math
import re
from fractions import Fraction

from webhook.core.model.quoting import shorten

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


# Kubernetes keeps quantities as int64 (``Quantity.Value()``); anything larger is no real request,
# and bounding it keeps a hostile ``1e999999999`` from costing time or memory.
LIMIT = 2**63 - 1
_MAX_TEXT = 64


class QuantityError(ValueError):
    """A quantity string Kubernetes would not accept."""


def parse_quantity(value: object) -> Fraction:
    """Exact value of a quantity such as ``2``, ``500m`` or ``1Ki``."""
    if type(value) is str:  # nearly always: the same few texts over and over ("1", "8Gi", "500m")
        return _parse_text(value)
    if type(value) is Fraction:  # a sum of parsed amounts
        return _bounded(value, value)
    if isinstance(value, bool):
        raise QuantityError(f"quantity {value!r} is not a number")
    if isinstance(value, int | Fraction):
        return _bounded(Fraction(value), value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"quantity {value!r} is not a number")
        return _bounded(Fraction(str(value)), value)
    if not isinstance(value, str):
        raise QuantityError(f"quantity of type {type(value).__name__} is not a Kubernetes quantity")
    return _parse_text(str(value))


@functools.lru_cache(maxsize=4096)  # bounded: hostile texts can only push the common ones out
def _parse_text(value: str) -> Fraction:
    text = value.strip()
    if text.isascii() and text.isdigit() and len(text) < 19:  # "1", "8": nearly every card count
        return Fraction(int(text))
    match = _QUANTITY.match(text) if len(text) <= _MAX_TEXT else None
    if not match or match[2] not in _SUFFIX:
        raise QuantityError(f"quantity {shorten(text)} is not a Kubernetes quantity")
    number, suffix = match.groups()
    exponent = number.lower().partition("e")[2]
    if exponent and abs(int(exponent)) > 30:
        raise QuantityError(f"quantity {text!r} has an exponent out of range")
    return _bounded(Fraction(number) * _SUFFIX[suffix], text)


def _bounded(amount: Fraction, shown: object) -> Fraction:
    if abs(amount.numerator) > LIMIT * amount.denominator:  # whole numbers: no Fraction arithmetic
        raise QuantityError(f"quantity {shorten(str(shown))} is too large")
    return amount


def ceil_quantity(value: object) -> int:
    """Rounded up to a whole number, as ``resource.Quantity.Value()`` does."""
    amount = parse_quantity(value)
    return -(-amount.numerator // amount.denominator)

"""The JSON annotations: ``card.quota`` on Queues and ``card.request`` on jobs and PodGroups.

The scheduler plugin decodes them as Go ``map[string]int``; we accept exactly what it accepts
and say precisely what is wrong with anything else.
"""

import json
from collections.abc import Mapping
from typing import Any

from webhook.core.model.cards import (
    CardName,
    CardNameError,
    CardSpec,
    parse_card_name,
    parse_card_spec,
    units,
)
from webhook.core.model.quantity import LIMIT
from webhook.core.model.quoting import shorten
from webhook.core.model.values import value_class


class AnnotationError(ValueError):
    """A malformed card annotation; the text names the key and what is wrong."""


@value_class
class CardRequest:
    """``card.request``: total cards per spec a job needs, in card units."""

    counts: Mapping[CardSpec, int]


class _Pairs(list[tuple[str, Any]]):
    """A decoded JSON object, kept as pairs so duplicate keys can be seen."""


def _load_object(key: str, text: str) -> list[tuple[str, Any]]:
    def pairs(items: list[tuple[str, Any]]) -> _Pairs:
        return _Pairs(items)

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise AnnotationError(f"{key}: not JSON ({exc.msg} at column {exc.colno}): {shorten(text)}") from exc
    except (ValueError, RecursionError) as exc:  # a number over Python's digit limit, deep nesting
        raise AnnotationError(f"{key}: not a JSON object of counts: {shorten(text)}") from exc
    if not isinstance(value, _Pairs):
        raise AnnotationError(f'{key}: must be a JSON object like {{"NVIDIA-H200": 2}}, got {shorten(text)}')
    seen: set[str] = set()
    for name, _ in value:
        if name in seen:
            raise AnnotationError(f"{key}: names {shorten(name)} twice")
        seen.add(name)
    return value


def _count(key: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        shown = shorten(json.dumps(value)).strip("'")
        raise AnnotationError(f"{key}: count for {shorten(name)} must be a whole number, got {shown}")
    if value < minimum:
        raise AnnotationError(f"{key}: count for {shorten(name)} must be >= {minimum}, got {value}")
    if value > LIMIT:
        raise AnnotationError(f"{key}: count for {shorten(name)} is too large")
    return value


def parse_quota(key: str, text: str) -> dict[CardName, int]:
    """``{cardName: units >= 0}`` (whole cards as written, in card units); an ``A|B`` key is refused:
    quota is per model."""
    quota: dict[CardName, int] = {}
    for name, value in _load_object(key, text):
        if "|" in name:
            raise AnnotationError(
                f"{key}: {shorten(name)} names several cards;"
                " quota is per card model, give each its own count"
            )
        try:
            card = parse_card_name(name.strip())
        except CardNameError as exc:
            raise AnnotationError(f"{key}: {exc}") from exc
        if card.name != name:
            raise AnnotationError(f"{key}: {shorten(name)} has surrounding whitespace; write {card.name!r}")
        quota[card.name] = units(_count(key, name, value, 0))
    return quota


def parse_card_request(key: str, text: str) -> CardRequest:
    """``{cardSpec: int > 0}``, keys may be ``A|B`` specs."""
    counts: dict[CardSpec, int] = {}
    for name, value in _load_object(key, text):
        try:
            spec = parse_card_spec(name)
        except CardNameError as exc:
            raise AnnotationError(f"{key}: {exc}") from exc
        if spec in counts:
            raise AnnotationError(f"{key}: names {shorten(spec.text)} twice")
        counts[spec] = units(_count(key, name, value, 1))
    return CardRequest(counts)

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
    amount,
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


@value_class
class Lending:
    """A queue's ``card.deserved`` and ``card.lendable``: per model it names, what it is entitled
    to and how much of that it may lend (all of it where ``lendable`` does not name the model)."""

    deserved: Mapping[CardName, int]
    lendable: Mapping[CardName, int]

    def lends(self, card: CardName) -> int:
        """The most of ``card`` this queue may lend."""
        return min(self.lendable.get(card, self.deserved[card]), self.deserved[card])


def parse_lending(
    quota: Mapping[CardName, int], deserved_key: str, deserved: str, lendable_key: str, lendable: str | None
) -> Lending:
    """``deserved``: models of ``quota`` each at most its quota; ``lendable``: models of
    ``deserved`` each at most its deserved. One-line errors name the key, the model and both numbers."""
    wanted = parse_quota(deserved_key, deserved)
    for card, count in wanted.items():
        if card not in quota:
            raise AnnotationError(
                f"{deserved_key}: names {card}, which the queue's card.quota does not: a model is"
                " borrowed up to its quota, so give it one"
            )
        if count > quota[card]:
            raise AnnotationError(
                f"{deserved_key}: {card} deserved {amount(count)} is above its card.quota"
                f" {amount(quota[card])}: the quota is the ceiling"
            )
    limits = parse_quota(lendable_key, lendable) if lendable is not None else {}
    for card, count in limits.items():
        if card not in wanted:
            raise AnnotationError(
                f"{lendable_key}: names {card}, which {deserved_key} does not: only a deserved model is lent"
            )
        if count > wanted[card]:
            raise AnnotationError(
                f"{lendable_key}: {card} lendable {amount(count)} is above its deserved"
                f" {amount(wanted[card])}"
            )
    return Lending(wanted, limits)

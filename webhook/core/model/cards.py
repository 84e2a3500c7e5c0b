"""Card names and card specs: the grammar both the webhook and the scheduler plugin speak.

A *card name* is one model: a whole card (``NVIDIA-H200``), an MPS sub-card
(``NVIDIA-H800/mps-80g*1/2``) or a MIG sub-card (``NVIDIA-H200/mig-1g.18gb-mixed``).
A *card spec* is one or more alternatives in order of preference, ``A|B|C``.
Only :func:`parse_card_name` and :func:`parse_card_spec` make a :data:`CardName`.
"""

import enum
import functools
import re
from decimal import Decimal
from typing import NewType

from webhook.core.model.quoting import shorten
from webhook.core.model.values import value_class

CardName = NewType("CardName", str)

# A product is a Kubernetes label value: it is also the node-affinity value.
_PRODUCT = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
_MPS = re.compile(rf"^(?P<product>{_PRODUCT})/mps-(?P<mem>[0-9]+)g\*1/(?P<replicas>[0-9]+)$")
_MIG = re.compile(rf"^(?P<product>{_PRODUCT})/mig-(?P<profile>[A-Za-z0-9][A-Za-z0-9._-]*)-mixed$")
_WHOLE = re.compile(rf"^{_PRODUCT}$")
SEPARATOR = "|"

# The core counts cards in units of a thousandth of a card: a whole card is UNIT, a pod sharing a
# GPU takes the fraction it uses (decisions.md §21). Integers, so every sum stays exact.
UNIT = 1000


def units(cards: int) -> int:
    """Whole cards (a quota, a card request, a node's count) in the core's units."""
    return cards * UNIT


def amount(count: int) -> str:
    """Units as people read cards: ``2``, ``0.5``, ``0.334``, ``-1.25``."""
    if count % UNIT == 0:
        return str(count // UNIT)
    return str(Decimal(count) / UNIT)


def figure(count: int) -> int | float:
    """Units as a JSON number of cards: an integer when whole."""
    return count // UNIT if count % UNIT == 0 else count / UNIT


class CardKind(enum.Enum):
    WHOLE = "whole"
    MPS = "mps"
    MIG = "mig"


class CardNameError(ValueError):
    """A card name or spec that does not follow the grammar; the text says what and where."""


@value_class
class Card:
    """A parsed card name."""

    name: CardName
    kind: CardKind
    product: str
    mig_profile: str = ""


@value_class
class CardSpec:
    """Alternatives in order of preference; never empty, never repeated."""

    cards: tuple[CardName, ...]

    @property
    def text(self) -> str:
        return SEPARATOR.join(self.cards)

    @property
    def is_multi(self) -> bool:
        return len(self.cards) > 1

    def __str__(self) -> str:
        return self.text


def parse_card_name(text: str) -> Card:
    """Parse one card name (no ``|``); raise :class:`CardNameError` saying what is wrong."""
    if m := _MPS.match(text):
        if not m["replicas"].strip("0"):
            raise CardNameError(f"MPS card {text!r} has 0 replicas: expected <product>/mps-<G>g*1/<R>, R > 0")
        return Card(CardName(text), CardKind.MPS, m["product"])
    if m := _MIG.match(text):
        return Card(CardName(text), CardKind.MIG, m["product"], m["profile"])
    if _WHOLE.match(text):
        return Card(CardName(text), CardKind.WHOLE, text)
    raise CardNameError(f"{shorten(text)} is not a card name: {_explain(text)}")


def _explain(text: str) -> str:
    if not text:
        return "it is empty"
    if "/" not in text:
        return "a whole-card name is a node product label value (letters, digits, '-', '_', '.', at most 63)"
    product, _, rest = text.partition("/")
    if not _WHOLE.match(product):
        return f"product {shorten(product)} is not a valid label value"
    if rest.startswith("mps-"):
        return "an MPS card is <product>/mps-<memGiB>g*1/<replicas>, e.g. NVIDIA-H800/mps-80g*1/2"
    if rest.startswith("mig-"):
        return "a MIG card is <product>/mig-<profile>-mixed, e.g. NVIDIA-H200/mig-1g.18gb-mixed"
    return "after '/' expected mps-<G>g*1/<R> or mig-<profile>-mixed"


def parse_card_spec(text: str) -> CardSpec:
    """Parse ``A|B|C``; whitespace around names is tolerated and dropped.

    Every pod and template names its spec again and again: short texts are parsed once (errors are
    never cached, and long texts are not kept, so hostile input cannot fill the cache).
    """
    if len(text) <= _CACHED_TEXT:
        return _parse_card_spec_cached(text)
    return _parse_card_spec(text)


_CACHED_TEXT = 256


@functools.lru_cache(maxsize=4096)
def _parse_card_spec_cached(text: str) -> CardSpec:
    return _parse_card_spec(text)


def _parse_card_spec(text: str) -> CardSpec:
    parts = [part.strip() for part in text.split(SEPARATOR)]
    cards: list[CardName] = []
    for position, part in enumerate(parts, start=1):
        if not part:
            raise CardNameError(f"card spec {shorten(text)} has an empty alternative at position {position}")
        try:
            card = parse_card_name(part)
        except CardNameError as exc:
            where = f" (alternative {position})" if len(parts) > 1 else ""
            raise CardNameError(f"{exc}{where}") from exc
        if card.name in cards:
            raise CardNameError(f"card spec {shorten(text)} names {card.name} twice")
        cards.append(card.name)
    return CardSpec(tuple(cards))


def format_card_spec(spec: CardSpec) -> str:
    """The canonical text of a spec: what the scheduler plugin (which does not trim) reads."""
    return spec.text


def product_of(name: CardName) -> str:
    """The node product label value of a card: the part before the first ``/``."""
    return name.partition("/")[0]


def mps_card_name(product: str, memory_gib: int, replicas: int) -> CardName:
    return CardName(f"{product}/mps-{memory_gib}g*1/{replicas}")


def mig_card_name(product: str, profile: str) -> CardName:
    return CardName(f"{product}/mig-{profile}-mixed")

"""Shared GPUs: the fraction of a card a pod takes through Volcano vGPU, HAMi or Koordinator.

A pod that names its card (``volcano.sh/card.name``) and asks for a share of GPUs through one of
these systems is charged, per card it gets, the larger of its compute share and its memory share of
one card of its model, in card units (``cards.UNIT`` a card), rounded up (decisions.md §21). Memory
in MiB or bytes is divided by the model's memory per card (the node label GPU feature discovery
sets, ``nvidia.com/gpu.memory``, in MiB). A share that asks for neither compute nor memory takes what
its system gives by default: the whole card's memory for Volcano vGPU; the configured default for
HAMi (``Policy.hami_default_memory_mib``, 0 for the whole card, and ``hami_default_cores``);
Koordinator gives nothing without one, so the card is taken whole.

:func:`share_of` reads the pod's effective requests and limits (limits first, as the systems do);
it returns None for a pod that uses none of these systems, a :class:`Share`, or the reason the
request cannot be charged (a percentage over 100, memory above the model's card, a byte request on
a model whose memory is not known).
"""

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from webhook.core.model.cards import UNIT
from webhook.core.model.policy import Policy
from webhook.core.model.values import value_class

VGPU_NUMBER = "volcano.sh/vgpu-number"
VGPU_MEMORY = "volcano.sh/vgpu-memory"  # MiB per vGPU
VGPU_MEMORY_PERCENT = "volcano.sh/vgpu-memory-percentage"
VGPU_CORES = "volcano.sh/vgpu-cores"  # percent per vGPU

HAMI_GPU = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"  # MiB per vGPU
HAMI_MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"  # percent per vGPU

# Koordinator (seed 003): totals over the GPUs the pod gets; ``koordinator.sh/gpu.shared`` says how
# many. The seed's ``kubernetes.io/`` spellings are the same resources.
KOORD_PREFIXES = ("koordinator.sh/", "kubernetes.io/")
KOORD_SHARED = "gpu.shared"
KOORD_CORE = "gpu-core"  # percent of one card, 100 per whole card
KOORD_MEMORY_RATIO = "gpu-memory-ratio"  # the same for memory
KOORD_MEMORY = "gpu-memory"  # bytes
KOORD_GPU = "gpu"  # core and memory ratio at once

VOLCANO, HAMI, KOORDINATOR = "Volcano vGPU", "HAMi", "Koordinator"

# Every pod resource that makes a request a share (``nvidia.com/gpu`` alone is a whole card).
POD_RESOURCES = frozenset(
    {
        VGPU_NUMBER,
        VGPU_MEMORY,
        VGPU_MEMORY_PERCENT,
        VGPU_CORES,
        HAMI_MEMORY,
        HAMI_MEMORY_PERCENT,
        HAMI_CORES,
        *(
            prefix + name
            for prefix in KOORD_PREFIXES
            for name in (KOORD_SHARED, KOORD_CORE, KOORD_MEMORY_RATIO, KOORD_MEMORY, KOORD_GPU)
        ),
    }
)

# Node resources through which a node shares its cards, by system.
NODE_RESOURCES = {
    VGPU_NUMBER: VOLCANO,
    **{prefix + KOORD_CORE: KOORDINATOR for prefix in KOORD_PREFIXES},
}


@value_class
class Share:
    """``cards`` devices of one model, each taking the larger of ``cores`` percent of its compute and
    of its memory: ``memory_percent`` percent, or ``memory_mib`` MiB of the model's memory per card."""

    system: str
    cards: int
    cores: Fraction = Fraction(0)
    memory_percent: Fraction = Fraction(0)
    memory_mib: Fraction = Fraction(0)
    memory_field: str = ""  # the field the MiB came from, for messages

    def units(self, card_memory_mib: int | None) -> int | str:
        """Card units for a model with ``card_memory_mib`` MiB per card, or why it cannot be told."""
        share = max(self.cores, self.memory_percent) / 100
        if self.memory_mib:
            if not card_memory_mib:
                return (
                    f"asks {_number(self.memory_mib)} MiB through {self.memory_field}, but the memory of"
                    " its card model is not known (no node of it has the nvidia.com/gpu.memory label)"
                )
            if self.memory_mib > card_memory_mib:
                return (
                    f"asks {_number(self.memory_mib)} MiB per card through {self.memory_field}, more"
                    f" than the {card_memory_mib} MiB one card of its model has"
                )
            share = max(share, self.memory_mib / card_memory_mib)
        return self.cards * math.ceil(share * UNIT)


def share_of(limits: Mapping[str, Any], requests: Mapping[str, Any], policy: Policy) -> Share | str | None:
    """The pod's share through Volcano vGPU, HAMi or Koordinator; a reason string if it is malformed;
    None when it uses none of them. ``limits``/``requests``: the pod's effective parsed amounts."""
    if limits.keys().isdisjoint(POD_RESOURCES) and requests.keys().isdisjoint(POD_RESOURCES):
        return None  # nearly every pod: one look at its few resources
    merged = {**requests, **limits}  # limits first
    try:
        if VGPU_NUMBER in merged or VGPU_MEMORY in merged:
            return _volcano(merged)
        if HAMI_GPU in merged and any(k in merged for k in (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES)):
            return _hami(merged, policy)
        for prefix in KOORD_PREFIXES:
            names = (KOORD_SHARED, KOORD_CORE, KOORD_MEMORY_RATIO, KOORD_MEMORY, KOORD_GPU)
            if any(prefix + name in merged for name in names):
                return _koordinator(merged, prefix)
    except _Refused as refused:
        return str(refused)
    return None


def uses_sharing(resources: Iterable[str]) -> bool:
    """Whether any resource name is one of the sharing systems' (a pod that names no card)."""
    return not POD_RESOURCES.isdisjoint(resources)


class _Refused(Exception):
    """A request this module cannot charge; the text completes "pod X ..."."""


def _per_device(
    system: str,
    merged: Mapping[str, Any],
    number: tuple[str, Any],
    fields: tuple[str, str, str],
    cores: Fraction,
) -> Share:
    """Volcano vGPU and HAMi alike: ``number`` vGPUs, each asking (memory MiB, memory %, cores %)
    through ``fields``; ``cores`` when the pod asks none."""
    memory_field, percent_field, cores_field = fields
    return Share(
        system,
        _whole(*number),
        _percent(merged, cores_field) if cores_field in merged else cores,
        _percent(merged, percent_field),
        _amount(merged, memory_field),
        memory_field,
    )


def _volcano(merged: Mapping[str, Any]) -> Share:
    number = (VGPU_NUMBER, merged.get(VGPU_NUMBER, 1))  # vgpu-memory alone: one vGPU
    share = _per_device(VOLCANO, merged, number, (VGPU_MEMORY, VGPU_MEMORY_PERCENT, VGPU_CORES), Fraction(0))
    if not share.memory_mib and not share.memory_percent:  # the device plugin's default: the whole card
        share = replace(share, memory_percent=Fraction(100))
    return share


def _hami(merged: Mapping[str, Any], policy: Policy) -> Share:
    fields = (HAMI_MEMORY, HAMI_MEMORY_PERCENT, HAMI_CORES)
    share = _per_device(
        HAMI, merged, (HAMI_GPU, merged[HAMI_GPU]), fields, Fraction(policy.hami_default_cores)
    )
    if not share.memory_mib and not share.memory_percent:  # HAMi's scheduler.defaultMem; 0: the whole card
        default = policy.hami_default_memory_mib
        share = (
            replace(share, memory_mib=Fraction(default))
            if default
            else replace(share, memory_percent=Fraction(100))
        )
    return share


def _koordinator(merged: Mapping[str, Any], prefix: str) -> Share:
    core = merged.get(prefix + KOORD_CORE)
    ratio = merged.get(prefix + KOORD_MEMORY_RATIO)
    if prefix + KOORD_GPU in merged:  # the combined resource: core and memory ratio at once
        core = ratio = merged[prefix + KOORD_GPU]
    fields = [(prefix + KOORD_CORE, core), (prefix + KOORD_MEMORY_RATIO, ratio)]
    totals = []
    for field, value in fields:
        if value is not None and (value < 0 or (value > 100 and value % 100)):
            raise _Refused(
                f"asks {field}={_number(value)}: above 100 it must be a multiple of 100 (whole cards)"
            )
        totals.append(Fraction(value or 0))
    memory_bytes = _amount(merged, prefix + KOORD_MEMORY)
    shared = merged.get(prefix + KOORD_SHARED)
    cards = (
        _whole(prefix + KOORD_SHARED, shared) if shared is not None else max(1, math.ceil(max(totals) / 100))
    )
    core_each, ratio_each = (t / cards for t in totals)
    for (field, _), each in zip(fields, (core_each, ratio_each), strict=True):
        if each > 100:
            raise _Refused(
                f"asks {field}={_number(each * cards)} over {cards} GPU(s): more than 100 per card"
            )
    memory_mib = memory_bytes / (1024 * 1024) / cards
    if not core_each and not ratio_each and not memory_mib:
        ratio_each = Fraction(100)  # nothing asked: no share to count but the card
    return Share(KOORDINATOR, cards, core_each, ratio_each, memory_mib, prefix + KOORD_MEMORY)


def _whole(field: str, value: Any) -> int:
    if value != int(value) or value < 1:
        raise _Refused(
            f"asks {field}={_number(value)}: the number of GPUs must be a whole number of at least 1"
        )
    return int(value)


def _percent(merged: Mapping[str, Any], field: str) -> Fraction:
    value = merged.get(field, 0)
    if value < 0 or value > 100:
        raise _Refused(f"asks {field}={_number(value)}: a percentage of one card must be from 0 to 100")
    return Fraction(value)


def _amount(merged: Mapping[str, Any], field: str) -> Fraction:
    value = merged.get(field, 0)
    if value < 0:
        raise _Refused(f"asks {field}={_number(value)}: not a memory size")
    return Fraction(value)


def _number(value: Any) -> str:
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"

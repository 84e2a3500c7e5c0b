"""Shared, slimmed copies of what the state keeps for every pod: the cache costs bytes, not kilobytes.

Pods of one workload differ only in name and uid, so their templates, owners and charges are the
same values; the state keeps one instance of each, held weakly so it goes when its last pod goes.
A cached pod keeps only what decisions read about existing pods: the card, queue and PodGroup
annotations, the extended-resource amounts, the CPU and memory requests, the scheduler name and its
priority (tidal reclaim orders gangs by it; a workload's pods share it, so it costs nothing per pod);
its node selector and affinity matter only when it is admitted, and that reads the review's object.
"""

import sys
from collections.abc import Hashable, Mapping
from dataclasses import fields
from typing import Any, TypeVar
from weakref import WeakValueDictionary

from webhook.core.model import keys
from webhook.core.model.objects import OwnerRef, PodRecord, PodTemplate
from webhook.core.model.resources import Resources

KEPT_ANNOTATIONS = (
    keys.CARD_NAME,
    keys.DRA_CARD,  # a DRA pod's model where its claims fix none
    keys.QUEUE_NAME,
    keys.GROUP_NAME,
    keys.CARD_SPEC,
    keys.TASK_SPEC,
    keys.PREEMPTABLE,  # tidal reclaim: a pod marked "false" is never a victim
)
T = TypeVar("T")
_FIELDS: dict[type, tuple[str, ...]] = {}  # a dataclass's field names, looked up once


def _items(mapping: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(mapping.items()))


class Pool:
    """One shared instance per distinct value, for as long as something uses it."""

    def __init__(self) -> None:
        self._templates: WeakValueDictionary[Hashable, PodTemplate] = WeakValueDictionary()
        self._values: WeakValueDictionary[Hashable, Any] = WeakValueDictionary()

    def share(self, value: T) -> T:
        """The pooled instance equal to ``value`` (a frozen dataclass with a weakref slot).

        Keyed by the tuple of its fields, never by the value itself: a key is held strongly, and
        would keep the value alive for ever.
        """
        kind = type(value)
        names = _FIELDS.get(kind)
        if names is None:
            names = _FIELDS[kind] = tuple(f.name for f in fields(value))  # type: ignore[arg-type]
        key = (kind, *(getattr(value, name) for name in names))
        found = self._values.get(key)
        if found is None:
            self._values[key] = found = value
        return found

    def template(self, template: PodTemplate) -> PodTemplate:
        annotations = {
            k: sys.intern(template.annotations[k]) for k in KEPT_ANNOTATIONS if k in template.annotations
        }
        res = template.resources
        scheduler = sys.intern(template.scheduler)
        key = (
            _items(annotations),
            _items(res.requests),
            _items(res.limits),
            res.cpu,
            res.memory,
            scheduler,
            template.claims,
            template.namespace,
            template.priority,
        )
        found = self._templates.get(key)
        if found is None:
            resources = Resources(dict(res.requests), dict(res.limits), res.cpu, res.memory)
            found = PodTemplate(
                annotations,
                resources,
                scheduler=scheduler,
                claims=template.claims,
                namespace=sys.intern(template.namespace),
                priority=template.priority,
            )
            self._templates[key] = found
        return found

    def owner(self, owner: OwnerRef | None) -> OwnerRef | None:
        return None if owner is None else self.share(owner)

    def pod(self, pod: PodRecord) -> PodRecord:
        return PodRecord(  # built directly: dataclasses.replace costs more than the rest of this
            uid=pod.uid,
            namespace=sys.intern(pod.namespace),
            name=pod.name,
            template=self.template(pod.template),
            node_name=sys.intern(pod.node_name),
            phase=sys.intern(pod.phase),
            deletion_deadline=pod.deletion_deadline,
            owner=self.owner(pod.owner),
            waiting=pod.waiting,
            started=pod.started,
        )

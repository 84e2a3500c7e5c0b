"""Pages of a pod list decoded straight into slim records: the first sync's fast path.

A pod as the API server lists it is about 4 KB of JSON, of which the decisions read a few hundred
bytes. Here msgspec decodes a page against types that name only the fields ``core.shapes`` checks
for a pod, skipping everything else in C and checking those fields' types on the way; the values
are then read the way ``core.objects`` reads them, so a record built here equals
``objects.pod_record`` of the same object, pooled by the state.

These types are never looser than the shape checks: a page with any pod they do not fit (a wrong
type anywhere, a bad quantity or time) gives None, and the caller reads that page the ordinary way,
which skips and reports the odd pod exactly as a watch event would be. Containers' resources are
kept raw and read once per distinct text: the pods of a workload repeat the same few.
"""

import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any

import msgspec
import orjson

from webhook.core.model import keys, objects, shapes
from webhook.core.model.compact import KEPT_ANNOTATIONS, Pool
from webhook.core.model.devices import claim_refs
from webhook.core.model.objects import OwnerRef, PodRecord, PodTemplate
from webhook.core.model.resources import Resources, resources_of

NULL = msgspec.Raw(b"null")
# orjson refuses a whole page with an integer outside 64 bits: so does the fast path, for the fields
# it reads, and the page is then read the ordinary way.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Strings = dict[str, str | None] | None  # labels, annotations, nodeSelector: null values allowed


class _Struct(msgspec.Struct, gc=False):
    pass


class Owner(_Struct):
    kind: str | None = None
    name: str | None = None
    uid: str | None = None
    apiVersion: str | None = None
    controller: bool | None = None


class Meta(_Struct):
    name: str | None = None
    generateName: str | None = None
    namespace: str | None = None
    uid: str | None = None
    annotations: Strings = None
    labels: Strings = None
    ownerReferences: list[Owner] | None = None
    deletionTimestamp: str | None = None
    deletionGracePeriodSeconds: Int64 | None = None


class Container(_Struct):
    resources: msgspec.Raw = NULL  # read once per distinct text, by the shape check and core.objects
    restartPolicy: str | None = None


class Expression(_Struct):
    key: str | None = None
    operator: str | None = None
    values: list[str] | None = None


class Term(_Struct):
    matchExpressions: list[Expression] | None = None


class Selector(_Struct):
    nodeSelectorTerms: list[Term] | None = None


class NodeAffinity(_Struct, rename={"required": shapes.REQUIRED}):
    required: Selector | None = None


class Affinity(_Struct):
    nodeAffinity: NodeAffinity | None = None


class Gate(_Struct):
    name: str | None = None


class Spec(_Struct):
    containers: list[Container] | None = None
    initContainers: list[Container] | None = None
    overhead: msgspec.Raw = NULL
    resources: msgspec.Raw = NULL  # pod-level (KEP-2837), read with the containers'
    nodeSelector: Strings = None
    nodeName: str | None = None
    affinity: Affinity | None = None
    schedulerName: str | None = None
    schedulingGates: list[Gate] | None = None
    priority: int | None = None
    resourceClaims: msgspec.Raw = NULL  # rare: read the ordinary way (``devices.claim_refs``)


class Status(_Struct):
    phase: str | None = None
    startTime: str | None = None
    resourceClaimStatuses: msgspec.Raw = NULL


class Pod(_Struct):
    kind: str | msgspec.UnsetType = msgspec.UNSET  # list items carry none; null is not "Pod"
    metadata: Meta | None = None
    spec: Spec | None = None
    status: Status | None = None


class ListMeta(_Struct, rename={"cont": "continue"}):
    resourceVersion: str | None = None
    cont: str | None = None


class PodList(_Struct):
    metadata: ListMeta | None = None
    items: list[Pod] | None = None


_DECODER = msgspec.json.Decoder(PodList)
_NO_META, _NO_SPEC, _NO_STATUS = Meta(), Spec(), Status()
_NO_KEPT = (None,) * len(KEPT_ANNOTATIONS)


@dataclass(frozen=True, slots=True)
class Page:
    version: str
    cont: str
    pods: list[PodRecord]  # pooled; each with its namespace, name and uid (a watch names it by uid)


class PodReader:
    """Reads the pages of one list; remembers what the pods of a workload share across pages."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._resources: dict[Any, Resources | None] = {}  # None: the shape check refuses it
        self._templates: dict[Any, PodTemplate] = {}
        self._owners: dict[tuple[str, str, str, str], OwnerRef] = {}

    def page(self, body: bytes) -> Page | None:
        """The page's pods as pooled records, or None when any of them (or the page) is odd."""
        try:
            listed = _DECODER.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
        meta = listed.metadata or ListMeta()
        pods: list[PodRecord] = []
        add = pods.append
        intern = sys.intern
        for pod in listed.items or ():
            if pod.kind is not msgspec.UNSET and pod.kind != "Pod":
                return None
            m, spec = pod.metadata or _NO_META, pod.spec or _NO_SPEC
            if not (m.namespace and m.name and m.uid):
                return None  # never so from an API server; the ordinary reading names it as it can
            resources = self._resources_of(spec)
            if resources is None:
                return None
            deadline = None
            if m.deletionTimestamp:
                if shapes.timestamp(m.deletionTimestamp) is not None:
                    return None
                deadline = objects.deletion_deadline(m.deletionTimestamp, m.deletionGracePeriodSeconds)
            annotations = m.annotations  # volcano.sh/preemptable: the annotation, else the label
            label = m.labels.get(keys.PREEMPTABLE) if m.labels else None
            if label is not None and (annotations or {}).get(keys.PREEMPTABLE) is None:
                annotations = {**(annotations or {}), keys.PREEMPTABLE: label}
            template = self._template(annotations, resources, spec.schedulerName or "", spec.priority)
            if spec.resourceClaims is not NULL:
                claiming = self._claiming(template, m.namespace, spec, pod.status or _NO_STATUS)
                if claiming is None:
                    return None
                template = claiming
            record = PodRecord(
                m.uid,
                intern(m.namespace),
                m.name,
                template,
                intern(spec.nodeName or ""),
                intern((pod.status or _NO_STATUS).phase or "Pending"),
                deadline,
                self._owner(m.ownerReferences) if m.ownerReferences else None,
                _waiting(spec.schedulingGates, m.annotations) if spec.schedulingGates else None,
                started=objects.started((pod.status or _NO_STATUS).startTime),
            )
            add(record)
        return Page(meta.resourceVersion or "", meta.cont or "", pods)

    def _resources_of(self, spec: Spec) -> Resources | None:
        containers, init = spec.containers or (), spec.initContainers
        if init or spec.overhead is not NULL or spec.resources is not NULL:
            key: Any = (
                tuple(bytes(c.resources) for c in containers),
                tuple((bytes(c.resources), c.restartPolicy) for c in init or ()),
                bytes(spec.overhead),
                bytes(spec.resources),
            )
        elif len(containers) == 1:
            key = bytes(containers[0].resources)
        else:
            key = tuple(bytes(c.resources) for c in containers)
        try:
            return self._resources[key]
        except KeyError:
            pass
        found = self._resources[key] = _read_resources(containers, init or (), spec.overhead, spec.resources)
        return found

    def _template(
        self,
        annotations: Mapping[str, str | None] | None,
        resources: Resources,
        scheduler: str,
        priority: int | None,
    ) -> PodTemplate:
        kept = tuple(annotations.get(k) for k in KEPT_ANNOTATIONS) if annotations else _NO_KEPT
        key = (kept, id(resources), scheduler, priority)
        found = self._templates.get(key)
        if found is None:
            shown = {k: v for k, v in zip(KEPT_ANNOTATIONS, kept, strict=True) if v is not None}
            found = self._templates[key] = self.pool.template(
                PodTemplate(shown, resources, scheduler=scheduler, priority=objects.priority_of(priority))
            )
        return found

    def _claiming(
        self, template: PodTemplate, namespace: str, spec: Spec, status: Status
    ) -> PodTemplate | None:
        """``template`` with the pod's resource claims; None when they are not JSON."""
        try:
            claims = claim_refs(
                {"resourceClaims": orjson.loads(bytes(spec.resourceClaims))},
                {"resourceClaimStatuses": orjson.loads(bytes(status.resourceClaimStatuses))},
            )
        except orjson.JSONDecodeError:
            return None
        if not claims:
            return template
        return self.pool.template(replace(template, claims=claims, namespace=namespace))

    def _owner(self, refs: list[Owner]) -> OwnerRef | None:
        for ref in refs:
            if ref.controller:
                key = (ref.kind or "", ref.name or "", ref.uid or "", ref.apiVersion or "")
                found = self._owners.get(key)
                if found is None:
                    found = self._owners[key] = self.pool.share(OwnerRef(*key))
                return found
        return None


def _waiting(gates: list[Gate], annotations: Mapping[str, str | None] | None) -> tuple[float, int] | None:
    """``objects.pod_waiting`` of the fields read here."""
    if not any(g.name == keys.GATE for g in gates):
        return None
    return objects.waiting_mark((annotations or {}).get(keys.WAITING)) or objects.BEHIND


def _read_resources(
    containers: Any, init: Any, overhead: msgspec.Raw, pod_level: msgspec.Raw
) -> Resources | None:
    """The ordinary reading (shape check, then ``resources.resources_of``) of the fields kept raw."""
    try:
        spec = {
            "containers": [
                {"resources": orjson.loads(bytes(c.resources)), "restartPolicy": c.restartPolicy}
                for c in containers
            ],
            "initContainers": [
                {"resources": orjson.loads(bytes(c.resources)), "restartPolicy": c.restartPolicy}
                for c in init
            ],
            "overhead": orjson.loads(bytes(overhead)),
            "resources": orjson.loads(bytes(pod_level)),
        }
    except orjson.JSONDecodeError:
        return None
    if shapes.POD_SPEC(spec) is not None:
        return None
    return resources_of(spec)

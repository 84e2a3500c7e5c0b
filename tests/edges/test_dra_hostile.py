"""Hostile DRA objects (SPEC §4b) at the live cache: a DeviceClass, ResourceSlice, ResourceClaim or
ResourceClaimTemplate of the test's own cluster (modelled on examples/cluster/dra.yaml) with any field
replaced by any JSON value, listed with the rest of its kind or watched as a change of the object the
cache holds.

Every check can fail. The informer syncs and goes on (an object watched after the hostile one is
applied, with no reason kept for it). The hostile object is applied under the name it carries (its
record's problem, if any, is the reason kept for it in ``state.skipped``), or skipped with a one-line
reason kept under its key, or left out as another driver's or kind's. Where the test knows what a
replaced field means (its own reading of the field, ``predict``), it says which: a reason that must
be kept and the field it must name, or none; and what the decision of a pod that reads the object
then is: as with the object intact, as with no such object, a refusal that quotes the reason, or
"not a card pod". Whatever the replacement, a pod's refusal names the pod and quotes the problem of
the record it read, and an allowed pod is allowed for a known reason.
"""

import asyncio
import copy
import math
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.builders import claim_template, claiming, gpu_request, pod, request
from tests.edges.test_cache import End, Scripted, informer, run_script, versioned
from tests.edges.test_fuzz import json_values, paths, replaced
from webhook.cluster.cache import DRA_KINDS
from webhook.cluster.snapshot import build_state
from webhook.core.decide import admission
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Allowed, Decision, Denied

# The cluster the hostile objects come from and are read in: its own (modelled on the bundled
# examples/cluster/dra.yaml), so that what each reader is told does not move with the examples.
CLUSTER: list[dict[str, Any]] = yaml.safe_load(
    """
- {apiVersion: v1, kind: Node, metadata: {name: h200-dra-0}, status: {allocatable: {cpu: "96", memory: 1Ti}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: h200-dra-0-gpu.nvidia.com-abcde}
  spec:
    driver: gpu.nvidia.com
    pool: {name: h200-dra-0, generation: 1, resourceSliceCount: 1}
    nodeName: h200-dra-0
    devices:
    - {name: gpu-0, attributes: {type: {string: gpu}, productName: {string: NVIDIA H200}, uuid: {string: GPU-0a}}, capacity: {memory: {value: 141Gi}}}
- {apiVersion: v1, kind: Node, metadata: {name: h200-dra-1}, status: {allocatable: {cpu: "96", memory: 1Ti}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: h200-dra-1-gpu.nvidia.com-klmno}
  spec:
    driver: gpu.nvidia.com
    pool: {name: h200-dra-1, generation: 1, resourceSliceCount: 1}
    nodeName: h200-dra-1
    devices:
    - {name: gpu-0-mig-1g18gb-0, attributes: {type: {string: mig}, productName: {string: NVIDIA H200}, profile: {string: 1g.18gb}, uuid: {string: MIG-1a}}, capacity: {memory: {value: 18Gi}}}
    - {name: gpu-0-mig-1g18gb-1, attributes: {type: {string: mig}, productName: {string: NVIDIA H200}, profile: {string: 1g.18gb}, uuid: {string: MIG-1b}}, capacity: {memory: {value: 18Gi}}}
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: gpu.nvidia.com}
  spec:
    selectors:
    - cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}
    extendedResourceName: nvidia.com/gpu
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: mig.nvidia.com}
  spec:
    selectors:
    - cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata:
    name: h200.nvidia.com
    annotations: {cardquota.volcano.sh/card: NVIDIA-H200}
  spec:
    selectors:
    - cel: {expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: h200-x2, namespace: team-a}
  spec: {spec: {devices: {requests: [{name: gpus, exactly: {deviceClassName: h200.nvidia.com, count: 2}}]}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: any-gpu, namespace: team-a}
  spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 1}}]}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: every-gpu, namespace: team-a}
  spec: {spec: {devices: {requests: [{name: gpus, exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All}}]}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: mig-1g, namespace: team-a}
  spec:
    spec:
      devices:
        requests:
        - name: slice
          exactly:
            deviceClassName: mig.nvidia.com
            count: 1
            selectors:
            - cel: {expression: "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200' && device.attributes['gpu.nvidia.com'].profile == '1g.18gb'"}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: h200-or-4090, namespace: team-a}
  spec:
    spec:
      devices:
        requests:
        - name: gpu
          firstAvailable:
          - name: h200
            deviceClassName: gpu.nvidia.com
            count: 1
            selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"}}]
          - name: rtx4090
            deviceClassName: gpu.nvidia.com
            count: 1
            selectors: [{cel: {expression: "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA GeForce RTX 4090'"}}]
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaim
  metadata: {name: shared-h200, namespace: team-a}
  spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: h200.nvidia.com, count: 1}}]}}
- apiVersion: scheduling.volcano.sh/v1beta1
  kind: Queue
  metadata:
    name: cr-queue1
    annotations: {volcano.sh/card.quota: '{"NVIDIA-H200": 1, "NVIDIA-GeForce-RTX-4090": 0, "NVIDIA-H200/mig-1g.18gb-mixed": 1}'}
  spec: {weight: 1}
  status: {state: Open}
- {apiVersion: v1, kind: Node, metadata: {name: a100-hami-0}, status: {allocatable: {cpu: "64", memory: 512Gi}}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceSlice
  metadata: {name: a100-hami-0-hami-core-gpu.project-hami.io-x1}
  spec:
    driver: hami-core-gpu.project-hami.io
    pool: {name: a100-hami-0, generation: 1, resourceSliceCount: 1}
    nodeName: a100-hami-0
    devices:
    - name: hami-gpu-0
      attributes: {type: {string: hami-gpu}, productName: {string: NVIDIA A100-SXM4-80GB}}
      capacity: {cores: {value: "100"}, memory: {value: 80Gi}}
      allowMultipleAllocations: true
    - name: hami-gpu-1
      attributes: {type: {string: hami-gpu}, productName: {string: NVIDIA A100-SXM4-80GB}}
      capacity: {cores: {value: "100"}, memory: {value: 80Gi}}
      allowMultipleAllocations: true
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: hami-core-gpu.project-hami.io}
  spec:
    selectors:
    - cel: {expression: "device.driver == 'hami-core-gpu.project-hami.io' && device.attributes['hami-core-gpu.project-hami.io'].type == 'hami-gpu'"}
- apiVersion: scheduling.volcano.sh/v1beta1
  kind: Queue
  metadata:
    name: serving-dra
    annotations: {volcano.sh/card.quota: '{"NVIDIA-A100-SXM4-80GB": 1}'}
  spec: {weight: 1}
  status: {state: Open}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: a100-share, namespace: team-c}
  spec:
    spec:
      devices:
        requests:
        - name: gpu
          exactly:
            deviceClassName: hami-core-gpu.project-hami.io
            count: 1
            capacity: {requests: {cores: "30", memory: 8Gi}}
- apiVersion: resource.k8s.io/v1
  kind: ResourceClaimTemplate
  metadata: {name: any-a100, namespace: team-c}
  spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: hami-core-gpu.project-hami.io, count: 1}}]}}}
- apiVersion: v1
  kind: Pod
  metadata:
    name: tune-0
    namespace: team-c
    uid: uid-team-c-tune-0
    annotations: {scheduling.volcano.sh/queue-name: serving-dra, cardquota.volcano.sh/card: NVIDIA-A100-SXM4-80GB}
  spec:
    schedulerName: volcano
    resourceClaims: [{name: gpu, resourceClaimTemplateName: any-a100}]
    containers: [{name: main, image: registry.example/tune:1, resources: {claims: [{name: gpu}]}}]
  status: {phase: Pending}
"""
)
KIND = {k.name: k for k in DRA_KINDS}
BASES = [o for o in CLUSTER if o["kind"] in KIND]
DRIVERS = Policy().dra_drivers
H200, A100, R4090 = "NVIDIA-H200", "NVIDIA-A100-SXM4-80GB", "NVIDIA-GeForce-RTX-4090"
MIG = "NVIDIA-H200/mig-1g.18gb-mixed"
FITS, NOT_A_CARD_POD = "fits the queue's quota", "not a card pod"
CARD_CHARACTERS = re.compile(r"^[A-Za-z0-9._/|*-]+$")  # what a card spec may be written with


def ident(obj: dict[str, Any]) -> str:
    """How the state holds a DRA object: ``namespace/name``, or the name of a cluster-scoped one."""
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if "namespace" in meta else meta["name"]


def held(state: ClusterState, kind: str) -> dict[str, Any]:
    devices = state.inventory.devices
    kinds: dict[str, dict[str, Any]] = {
        "DeviceClass": devices.classes,
        "ResourceSlice": devices.slices,
        "ResourceClaimTemplate": devices.templates,
        "ResourceClaim": devices.claims,
    }
    return kinds[kind]


def problem_of(record: Any) -> str:
    """The reason the state keeps for a record it holds: its problem (a slice: what it left out)."""
    return "; ".join(record.skipped) if hasattr(record, "skipped") else str(record.problem)


# ---- the pod that reads each object ---------------------------------------------------------------
@dataclass(frozen=True)
class User:
    """A pod whose decision reads the object, the objects it needs besides the test's cluster, and
    the words of its decision with the object intact and with no such object."""

    obj: dict[str, Any]
    extra: tuple[dict[str, Any], ...]
    intact: tuple[str, ...]
    absent: tuple[str, ...]


def dra_pod(namespace: str, queue: str, card: str, **refs: tuple[str, ...]) -> dict[str, Any]:
    obj = pod("p", None, None, queue_name=queue, namespace=namespace, annotations={keys.DRA_CARD: card})
    return claiming(obj, **refs)


def user_of(base: dict[str, Any]) -> User:
    kind, name = base["kind"], base["metadata"]["name"]
    namespace = base["metadata"].get("namespace", "")
    team_c = namespace == "team-c" or "hami" in name
    queue, card = ("serving-dra", A100) if team_c else ("cr-queue1", H200)
    room = f'queue "{queue}" has 0 {A100} left (quota 1: 1 pending); pod team-c/p'
    if kind == "ResourceClaimTemplate":
        card = MIG if name == "mig-1g" else card
        intact = {
            "h200-x2": (
                f'queue "cr-queue1" has 1 {H200} left',
                f"(claim t0 from template h200-x2: 2 {H200}) needs 2",
            ),
            "every-gpu": (
                "pod team-a/p asks all the devices of DeviceClass gpu.nvidia.com",
                "allocationMode All",
            ),
            "a100-share": (room, f"(claim t0 from template a100-share: 0.3 {A100}) needs 0.3"),
            "any-a100": (room, f"(claim t0 from template any-a100: 1 {A100}) needs 1"),
        }.get(name, (FITS,))
        gone = f"pod {namespace}/p uses ResourceClaimTemplate {namespace}/{name}, which does not exist"
        return User(dra_pod(namespace, queue, card, templates=(name,)), (), intact, (gone,))
    if kind == "ResourceClaim":
        gone = f"pod {namespace}/p uses ResourceClaim {namespace}/{name}, which does not exist"
        return User(dra_pod(namespace, queue, card, claims=(name,)), (), (FITS,), (gone,))
    if kind == "DeviceClass":  # a template of its own, its request selecting the class's driver
        namespace, driver = ("team-c", name) if team_c else ("team-a", "gpu.nvidia.com")
        card = MIG if name.startswith("mig") else card
        asks = gpu_request("g", name, 1, selectors=(f"device.driver == '{driver}'",))
        uses = claim_template(f"uses-{name}", asks, namespace=namespace)
        intact = (room, f"(claim t0 from template uses-{name}: 1 {A100}) needs 1") if team_c else (FITS,)
        absent = (f"pod {namespace}/p asks GPUs of DeviceClass {name} (claim t0", "which does not exist")
        return User(dra_pod(namespace, queue, card, templates=(f"uses-{name}",)), (uses,), intact, absent)
    if team_c:  # HAMi's slice: a share of a card its devices let several claims have
        user = dra_pod("team-c", queue, card, templates=("a100-share",))
        intact = (room, f"(claim t0 from template a100-share: 0.3 {A100}) needs 0.3")
        return User(user, (), intact, (room, f"(claim t0 from template a100-share: 1 {A100}) needs 1"))
    # NVIDIA's slices: a device-plugin pod of another model preset to the slice's node
    node = base["spec"]["nodeName"]
    user = pod("p", R4090, 1, queue_name=queue, namespace="team-a", node_name=node)
    carries = MIG if node == "h200-dra-1" else H200
    intact = (f"pod team-a/p asks for card {R4090} but is preset to node {node}, which carries {carries}",)
    return User(user, (), intact, (f'queue "cr-queue1" has 0 {R4090} left (quota 0); pod team-a/p needs 1',))


def told(decision: Decision) -> str:
    return decision.message if isinstance(decision, Denied) else decision.reason


@pytest.mark.parametrize("base", BASES, ids=[f"{b['kind']}/{b['metadata']['name']}" for b in BASES])
def test_each_objects_reader_pod_is_told_what_it_reads(base: dict[str, Any]) -> None:
    """The users the property below relies on: with the object as it is, and with none."""
    user = user_of(base)
    everything = CLUSTER + list(user.extra)
    for objects, words in (
        (everything, user.intact),
        ([o for o in everything if o["kind"] != base["kind"] or ident(o) != ident(base)], user.absent),
    ):
        state = build_state([(f"object {i}", o) for i, o in enumerate(objects)])
        text = told(admission.validate(state, request(user.obj), 0.0))
        assert all(w in text for w in words), (words, text)


# ---- what the test knows a replaced field means -------------------------------------------------------
INTACT, ABSENT, UNREADABLE, NO_GPU = "as intact", "as absent", "refused, the reason quoted", "not a card pod"


@dataclass(frozen=True)
class Prediction:
    """``reason``: words a reason kept for the object must have (``()``: none may be kept; None: the
    test does not say). ``effect``: the decision of the object's reader when the object keeps its name
    (None: the test does not say)."""

    reason: tuple[str, ...] | None = None
    effect: str | None = None


UNKNOWN = Prediction()


def at(tree: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and orjson.dumps(a, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        b, option=orjson.OPT_SORT_KEYS
    )


def bad_count(value: Any) -> bool:
    return value is not None and (type(value) is not int or not 0 < value <= 1 << 16)


def no_quantity(value: Any) -> bool:
    """Not a Kubernetes quantity whatever the parser: not a string or a finite number."""
    return (
        value is None
        or isinstance(value, bool | list | dict)
        or (isinstance(value, float) and not math.isfinite(value))
    )


def text_of(attribute: Any) -> bool:
    """Whether a device attribute holds a value (``{"string": ...}``, ``{"int": ...}``, ...)."""
    return isinstance(attribute, dict) and any(
        isinstance(attribute.get(k), str | int | bool) for k in ("string", "version", "int", "bool")
    )


def selectors_problem(selectors: Any) -> str:
    """Why a ``selectors`` list cannot be read, by its schema (a list of ``{cel: {expression: <text>}}``);
    "" when it can (what its expressions select is CEL's to say)."""
    if selectors is None:
        return ""
    if not isinstance(selectors, list):
        return "its selectors are not a list"
    for index, selector in enumerate(selectors):
        cel = selector.get("cel") if isinstance(selector, dict) else None
        if not isinstance(cel, dict) or not isinstance(cel.get("expression"), str):
            return f"its selector #{index} has no CEL expression"
    return ""


def predict_selectors(hostile: Any, path: tuple[Any, ...]) -> Prediction:
    """A field at or under a ``selectors`` list: a reason when the list cannot be read."""
    problem = selectors_problem(at(hostile, path[: path.index("selectors") + 1]))
    return Prediction((problem,), UNREADABLE) if problem else UNKNOWN


def predict_request(request_: dict[str, Any], sub: tuple[Any, ...], value: Any) -> Prediction:
    """A field (``sub``) of one request of a claim's spec."""
    name = request_["name"]
    exactly: dict[str, Any] = request_.get("exactly") or {}
    if sub == ():
        return (
            Prediction(("request", "is not an object"), UNREADABLE)
            if not isinstance(value, dict)
            else UNKNOWN
        )
    if sub == ("name",) or (len(sub) == 3 and sub[0] == "firstAvailable" and sub[2] == "name"):
        # a name the decision quotes only when it refuses the request (an unbounded one)
        return Prediction(()) if exactly.get("allocationMode") == "All" else Prediction((), INTACT)
    if sub == ("exactly",):
        if not isinstance(value, dict):
            return Prediction((f"request {name} has neither exactly nor firstAvailable",), UNREADABLE)
        if selectors_problem(value.get("selectors")):
            return Prediction((f"request {name}: {selectors_problem(value.get('selectors'))}",), UNREADABLE)
        if not isinstance(value.get("deviceClassName"), str) or not value["deviceClassName"]:
            return Prediction((f"request {name} names no deviceClassName",), UNREADABLE)
        return UNKNOWN
    if sub == ("firstAvailable",):
        if not isinstance(value, list) or not value:
            return Prediction((f"request {name} has neither exactly nor firstAvailable",), UNREADABLE)
        return UNKNOWN
    if sub[0] == "firstAvailable" and len(sub) == 2:
        return Prediction(("is not an object",), UNREADABLE) if not isinstance(value, dict) else UNKNOWN
    one_field = (sub[0] == "exactly" and len(sub) == 2) or (sub[0] == "firstAvailable" and len(sub) == 3)
    field = sub[-1] if one_field else None
    if field == "deviceClassName":
        if not isinstance(value, str) or not value:
            return Prediction(("names no deviceClassName",), UNREADABLE)
        return Prediction(())  # another class, which does not exist: what that means is the reader's
    if field == "count":
        if sub[0] == "exactly" and exactly.get("allocationMode") == "All":
            return Prediction((), INTACT)  # an unbounded request's count is not read
        return Prediction(("devices (at most 65536)",), UNREADABLE) if bad_count(value) else Prediction(())
    if field == "allocationMode":
        ok = value is None or (isinstance(value, str) and value in ("ExactCount", "All"))
        return Prediction(()) if ok else Prediction(("allocationMode",), UNREADABLE)
    if sub[:3] == ("exactly", "capacity", "requests") and len(sub) == 4:
        return Prediction(("capacity",), UNREADABLE) if no_quantity(value) else UNKNOWN
    return UNKNOWN  # a capacity map replaced whole


def predict(base: dict[str, Any], hostile: Any, path: tuple[Any, ...]) -> Prediction:
    """What replacing ``path`` of ``base`` (giving ``hostile``) means, by the test's own reading of
    the field, for an object that keeps its kind and name (``landing`` says where it goes otherwise)."""
    value = at(hostile, path)  # as the informer reads it
    if same(at(base, path), value):
        return Prediction((), INTACT)
    kind = base["kind"]
    if path[:1] == ("metadata",) and path[1:2] in (("resourceVersion",), ("uid",)):
        return Prediction((), INTACT)
    if path[:1] != ("spec",):
        if kind == "DeviceClass" and path[:2] == ("metadata", "annotations"):
            return predict_class_card(path, value)
        return UNKNOWN  # kind, apiVersion, metadata, name: where it lands says
    if "selectors" in path and kind != "ResourceSlice":
        return predict_selectors(hostile, path)
    if kind in ("ResourceClaim", "ResourceClaimTemplate"):
        spec = ("spec", "spec") if kind == "ResourceClaimTemplate" else ("spec",)
        if path[: len(spec)] != spec or len(path) == len(spec):
            # the spec itself replaced (see test_a_claim_spec_that_is_not_an_object_is_a_reason)
            return UNKNOWN
        rel = path[len(spec) :]
        if rel == ("devices",):
            if value is None or (isinstance(value, dict) and value.get("requests") is None):
                return Prediction((), NO_GPU)
            return (
                Prediction(("spec.devices is not an object",), UNREADABLE)
                if not isinstance(value, dict)
                else UNKNOWN
            )
        if rel == ("devices", "requests"):
            if value is None or value == []:
                return Prediction((), NO_GPU)
            return (
                Prediction(("spec.devices.requests is not a list",), UNREADABLE)
                if not isinstance(value, list)
                else UNKNOWN
            )
        return predict_request(at(base, (*spec, "devices", "requests", rel[2])), rel[3:], value)
    if kind == "DeviceClass":
        # claims do not read a class's extendedResourceName; what its selectors select is CEL's
        return Prediction((), INTACT) if path == ("spec", "extendedResourceName") else UNKNOWN
    return predict_slice(base, path, value)


def predict_class_card(path: tuple[Any, ...], value: Any) -> Prediction:
    """The card annotation of the per-model class: gone, its selector names the same model."""
    if path == ("metadata", "annotations"):
        kept = isinstance(value, dict) and keys.DRA_CARD in value
        return UNKNOWN if kept else Prediction(None, INTACT)
    if value is None:
        return Prediction((), INTACT)
    malformed = isinstance(value, list | dict) or (
        isinstance(value, str) and not CARD_CHARACTERS.match(value)
    )
    return Prediction((f"its annotation {keys.DRA_CARD} is malformed",), UNREADABLE) if malformed else UNKNOWN


NO_DEVICES = "as with no devices"


def predict_slice(base: dict[str, Any], path: tuple[Any, ...], value: Any) -> Prediction:
    """A field of a slice: its reader (a pod preset to its node, or one asking a share of its cards)
    sees its devices as they were, or none; where the slice has two alike, one left is as good."""
    by_node = base["spec"]["driver"] == "gpu.nvidia.com"  # the reader is a pod of its node
    devices = base["spec"]["devices"]
    one_device = NO_DEVICES if len(devices) == 1 else INTACT
    if path == ("spec", "driver"):
        return Prediction((), NO_DEVICES) if isinstance(value, str) else Prediction(None, NO_DEVICES)
    if path == ("spec", "nodeName"):
        if not isinstance(value, str) or not value:
            return Prediction(("spec.nodeName",), NO_DEVICES)
        return Prediction((), NO_DEVICES if by_node else None)
    if path == ("spec", "devices"):
        if value is None:
            return Prediction((), NO_DEVICES)
        return (
            Prediction(("spec.devices is not a list",), NO_DEVICES)
            if not isinstance(value, list)
            else UNKNOWN
        )
    if path[:2] == ("spec", "pool"):
        return Prediction((), INTACT)
    if path[:2] != ("spec", "devices") or len(path) < 3:
        return UNKNOWN
    sub = path[3:]
    if sub == () or sub == ("attributes",):
        if not isinstance(value, dict):
            return Prediction(("productName",), one_device)
        return UNKNOWN
    if sub == ("name",) or sub[:2] == ("attributes", "uuid"):
        return Prediction((), INTACT)
    if sub[:1] == ("capacity",) and by_node:
        return Prediction((), INTACT)  # the node's pod takes no share of a device
    if sub == ("attributes", "productName"):
        return Prediction(("productName",), one_device) if not text_of(value) else UNKNOWN
    if sub == ("attributes", "productName", "string"):
        if not isinstance(value, str | int | bool) or value == "":
            return Prediction(("productName",), one_device)
        return UNKNOWN
    return UNKNOWN  # its type, profile or capacity: what the classes' selectors read of it


def landing(base: dict[str, Any], hostile: Any) -> str | None:
    """Where the state holds the hostile object, by the test's own reading: None when it is not one
    of this kind's, has no name, or is a slice of no driver of ours; a namespaced one that names no
    namespace in ``default``."""
    if not isinstance(hostile, dict):
        return None
    if hostile.get("kind") != base["kind"] or not str(hostile.get("apiVersion")).startswith(
        "resource.k8s.io/"
    ):
        return None
    meta = hostile.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return None
    if base["kind"] == "ResourceSlice":
        spec = hostile.get("spec")
        if not isinstance(spec, dict) or spec.get("driver") not in DRIVERS:
            return None
    if "namespace" in base["metadata"]:
        return f"{meta.get('namespace') or 'default'}/{meta['name']}"
    return str(meta["name"])


# ---- the property -----------------------------------------------------------------------------------------
def feed(
    base: dict[str, Any], hostile: Any, how: str, extra: tuple[dict[str, Any], ...]
) -> tuple[ClusterState, Any]:
    """The test's cluster but every object of ``base``'s kind, which its informer brings: the hostile
    object in its list ("list"), or as a change of ``base`` after the list ("watch"); then a good one."""
    others = [obj for obj in CLUSTER if obj["kind"] != base["kind"]] + list(extra)
    state = build_state([(f"object {i}", obj) for i, obj in enumerate(others)])
    listed = [versioned(o, 3) for o in CLUSTER if o["kind"] == base["kind"]]
    good = copy.deepcopy({**base, "metadata": {**base["metadata"], "name": "good-one"}})
    if base["kind"] == "ResourceSlice":  # no device a reader of the hostile one could see
        good["spec"] = {**good["spec"], "nodeName": "good-node", "devices": []}
    events: list[Any] = [] if how == "list" else [{"type": "MODIFIED", "object": hostile}]
    if how == "list":
        listed = [hostile if ident(o) == ident(base) else o for o in listed]
    # no resourceVersion: whatever version the hostile object claims, this one is not taken as stale
    events += [{"type": "ADDED", "object": good}, End]
    inf, _ = informer(KIND[base["kind"]], Scripted([listed], 3, [events]), state)
    asyncio.run(run_script(inf))
    assert inf.synced
    return state, good


@cache
def intact_decision(index: int) -> tuple[str, str]:
    base = BASES[index]
    user = user_of(base)
    state, _ = feed(base, versioned(base, 3), "list", user.extra)
    decision = admission.validate(state, request(user.obj), 0.0)
    return type(decision).__name__, told(decision)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=json_values, how=st.sampled_from(["list", "watch"]))
def test_a_dra_object_with_any_field_replaced_by_anything_is_applied_or_skipped_with_a_reason(
    data: st.DataObject, value: Any, how: str
) -> None:
    index = data.draw(st.sampled_from(range(len(BASES))), label="object")
    base = BASES[index]
    path = data.draw(st.sampled_from(list(paths(base))), label="path")
    hostile = replaced(versioned(base, 3 if how == "list" else 4), path, value)
    try:  # as JSON carries it to the informer (a NaN is null, say)
        hostile = orjson.loads(orjson.dumps(hostile))
    except TypeError:
        assume(False)  # beyond what an API server's JSON can carry to the informer's reader
    user = user_of(base)
    state, good = feed(base, hostile, how, user.extra)
    records = held(state, base["kind"])

    # the informer went on: the object watched after the hostile one is applied, with no reason kept
    assert ident(good) in records
    assert ingest.key(good) not in state.skipped
    # every reason kept is one line that says something
    for key, reason in state.skipped.items():
        assert isinstance(reason, str) and reason.strip() and "\n" not in reason and len(reason) <= 500, (
            key,
            reason,
        )

    # applied under the name it carries, its record's problem its reason; or skipped with a reason
    prediction = predict(base, hostile, path)
    lands = landing(base, hostile)
    as_read = (
        {"kind": base["kind"], "apiVersion": base["apiVersion"], **hostile}
        if isinstance(hostile, dict)
        else {}
    )
    key = ingest.key(as_read)
    reason = state.skipped.get(key, "")
    if lands is not None:
        assert lands in records, (lands, sorted(records))
        assert reason == problem_of(records[lands]), (reason, records[lands])
    elif (
        as_read
        and as_read["kind"] == base["kind"]
        and str(as_read["apiVersion"]).startswith("resource.k8s.io/")
    ):
        meta = as_read.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            assert reason == "metadata.name is missing or not a string", (key, reason)
    if prediction.reason == ():
        assert not reason, (path, value, reason)
    elif prediction.reason is not None:
        missing = [words for words in prediction.reason if words not in reason]
        assert reason and not missing, (path, value, reason, missing)

    # the pod that reads the object is told what it reads
    decision = admission.validate(state, request(user.obj), 0.0)
    text = told(decision)
    assert text and "\n" not in text
    if isinstance(decision, Denied):
        assert f"pod {user.obj['metadata']['namespace']}/p " in text, text
    else:
        assert text in (FITS, NOT_A_CARD_POD), text
    original = ident(base)
    if base["kind"] != "ResourceSlice" and original in records and problem_of(records[original]):
        assert isinstance(decision, Denied) and problem_of(records[original]) in text, (
            records[original],
            text,
        )
    effect = prediction.effect
    if base["kind"] == "ResourceSlice":
        if lands is None:  # nothing of it applied: the list has no such slice; a watched change of
            # the old one leaves it, but one to another driver (or none) deletes it
            meta = as_read.get("metadata")
            renamed = not isinstance(meta, dict) or meta.get("name") != base["metadata"]["name"]
            ours = as_read.get("kind") == base["kind"] and str(as_read.get("apiVersion")).startswith(
                "resource.k8s.io/"
            )
            effect = NO_DEVICES if how == "list" or (ours and not renamed) else INTACT
        elif path[:2] == ("metadata", "name"):
            effect = INTACT  # the same devices under another name
    elif lands != original:
        effect = ABSENT if how == "list" else INTACT
    if effect == INTACT:
        assert (type(decision).__name__, text) == intact_decision(index), (path, value, text)
    elif effect in (ABSENT, NO_DEVICES):
        assert all(words in text for words in user.absent), (path, value, text)
    elif effect == UNREADABLE:
        assert isinstance(decision, Denied) and reason and reason in text, (path, value, reason, text)
    elif effect == NO_GPU:
        assert isinstance(decision, Allowed) and text == NOT_A_CARD_POD, (path, value, text)


# ---- fields read silently: a reason the readers do not give yet --------------------------------------------
@pytest.mark.parametrize("kind", ["ResourceClaimTemplate", "ResourceClaim"])
def test_a_claim_spec_that_is_not_an_object_is_a_reason(kind: str) -> None:
    """``spec: 5`` (a template's ``spec.spec: 5``) is kept as a reason and refuses the pods that use
    it, as ``spec.devices: 5`` is (found once: read as a spec that asks no device, silently)."""
    base = next(o for o in CLUSTER if o["kind"] == kind and o["metadata"].get("namespace") == "team-a")
    hostile = versioned(base, 3)
    if kind == "ResourceClaimTemplate":
        hostile["spec"]["spec"] = 5
    else:
        hostile["spec"] = 5
    user = user_of(base)
    state, _ = feed(base, hostile, "list", user.extra)
    assert state.skipped.get(ingest.key(hostile))
    assert isinstance(admission.validate(state, request(user.obj), 0.0), Denied)


@pytest.mark.parametrize("kind", ["ResourceClaimTemplate", "ResourceClaim"])
def test_a_listed_object_with_no_namespace_is_kept_or_skipped_with_a_reason(kind: str) -> None:
    """A namespaced object listed with no ``metadata.namespace`` is applied as ``default/<name>``
    (``ingest`` reads a missing namespace as ``default``) and kept: the relist names it so too
    (it once read it as ``/<name>`` and removed, as gone, what it had just applied)."""
    base = next(o for o in CLUSTER if o["kind"] == kind and o["metadata"].get("namespace") == "team-a")
    hostile = versioned(base, 3)
    del hostile["metadata"]["namespace"]
    state, _ = feed(base, hostile, "list", ())
    assert f"default/{base['metadata']['name']}" in held(state, kind) or state.skipped.get(
        ingest.key(hostile)
    )

"""A property over the order in which a restarted webhook's informers bring the objects of DRA pods
(SPEC §4b, docs/decisions.md §27): pods, their claims (first unallocated, then allocated, or
allocated when first seen), the ResourceSlices, the DeviceClasses (there, never there, or deleted
after they arrive), the templates, the node and the queue arrive in any order, some of them twice
(a relist). Whatever the order, every pod ends charged what the test's own table says:

* a pod whose claims are all allocated, the devices allocated: each device's card as its slice
  publishes it, a device no slice publishes on the model of the pod's other devices;
* a claim several pods share, once, to one of them;
* a pod whose claim is not allocated, as before: what its template reads through the per-model
  class, if the cache ever held the class and the template (or the claim) with the pod; else
  nothing.

And where the classes do not change meanwhile, the same as a state built from the same objects at
once. Nothing in the table is computed by the product."""

import copy
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.builders import (
    GPU_CLASS_CEL,
    H200,
    R4090,
    claim_template,
    claiming,
    cluster,
    device_class,
    gpu_request,
    pod,
    queue,
    resource_claim,
    resource_slice,
)
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model import keys
from webhook.core.model.cards import UNIT, CardName

PER_MODEL, GENERIC = "per-model", "gpu.nvidia.com"
H200_ONLY = (
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"
)
DEVICES = {H200: [f"gpu-{i}" for i in range(16)], R4090: [f"gpu-{i}" for i in range(16, 22)]}
NOWHERE = "gpu-99"  # a device no slice publishes
# pod kinds: its claim from template "two" (2 H200 of the per-model class) allocated, the pod bound
# ("two") or not yet ("unbound"); from template "one" (1 GPU of the generic class, its model the
# pod's own word) allocated one of that model; the claim "shared" by name; its claim from "two" not
# allocated ("pending", made or not yet); from "two", allocated one H200 and a device no slice
# publishes ("unpublished"); made from "two" when it asked 1 H200, allocated 1 ("replaced": the
# template replaced by "two" since)
KINDS = ("two", "unbound", "generic", "shared", "pending", "unpublished", "replaced")


def node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "dra"},
        "status": {"allocatable": {"cpu": "64"}},
    }


def per_model_class() -> dict[str, Any]:
    return device_class(PER_MODEL, H200_ONLY, card=H200)


def generic_class() -> dict[str, Any]:
    return device_class(GENERIC, GPU_CLASS_CEL)


def allocated(*devices: str) -> tuple[tuple[str, str, str], ...]:
    return tuple(("gpus", "dra", d) for d in devices)


@dataclass
class Pod:
    """A pod of the world, what it is sent as, and what the table charges it."""

    name: str
    kind: str
    obj: dict[str, Any]
    claim: dict[str, Any] | None  # the claim made for it (its last version)
    first: dict[str, Any] | None  # that claim as first made, unallocated, when it arrives so first
    charged: tuple[str, str, int] | None  # the table's charge, "pending": when held


def make_pod(index: int, kind: str, model: str, made: bool, free: dict[str, list[str]]) -> Pod:
    name = f"p{index}"
    annotations = {keys.DRA_CARD: model} if kind == "generic" else {}
    template = "one" if kind == "generic" else "two"
    bound = kind not in ("unbound", "pending")
    obj = pod(name, None, None, node_name="dra" if bound else "", phase="Running" if bound else "Pending")
    obj["metadata"].setdefault("annotations", {}).update(annotations)
    if kind == "shared":
        return Pod(name, kind, claiming(obj, claims=("shared",)), None, None, ("q", H200, 1))
    claiming(obj, templates=(template,))
    if kind == "pending" and not made:
        return Pod(name, kind, obj, None, None, ("q", H200, 2))
    obj["status"]["resourceClaimStatuses"] = [{"name": "t0", "resourceClaimName": f"{name}-t0"}]
    request = gpu_request(
        "gpus", GENERIC if kind == "generic" else PER_MODEL, 1 if kind in ("generic", "replaced") else 2
    )
    owner = {"name": name, "uid": f"uid-ns-{name}"}

    def claim(*devices: str) -> dict[str, Any]:
        return resource_claim(
            f"{name}-t0", request, pod_owner=owner, pod_claim="t0", allocated=allocated(*devices)
        )

    if kind == "pending":
        return Pod(name, kind, obj, claim(), None, ("q", H200, 2))
    if kind == "generic":
        devices, charged = [free[model].pop()], ("q", model, 1)
    elif kind == "replaced":
        devices, charged = [free[H200].pop()], ("q", H200, 1)
    elif kind == "unpublished":
        devices, charged = [free[H200].pop(), NOWHERE], ("q", H200, 2)
    else:
        devices, charged = [free[H200].pop(), free[H200].pop()], ("q", H200, 2)
    return Pod(name, kind, obj, claim(*devices), claim(), charged)


def removal(obj: dict[str, Any]) -> dict[str, Any]:
    return {"remove": obj}


def apply(state: ClusterState, step: dict[str, Any]) -> None:
    if "remove" in step:
        ingest.remove(state, step["remove"])
    else:
        ingest.upsert(state, copy.deepcopy(step))


def used(state: ClusterState, card: str) -> int:
    use = queue_usage(state, "q").card(CardName(card)).used
    assert use % UNIT == 0
    return use // UNIT


def charge(state: ClusterState, name: str) -> tuple[str, str, int] | None:
    found = state.charged.charge(f"uid-ns-{name}")
    return None if found is None else (found.queue, str(found.card or found.spec.text), found.count // UNIT)


def identity(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"].get("uid") or obj["metadata"]["name"]


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Pod], str, bool, list[dict[str, Any]]]:
    """Pods, the per-model class's fate ("there", "never", "deleted" after it arrives), whether the
    generic class is there, and the events in the order the informers bring them."""
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
    free = {card: list(devices) for card, devices in DEVICES.items()}
    pods = [
        make_pod(i, kind, draw(st.sampled_from((H200, R4090))), draw(st.booleans()), free)
        for i, kind in enumerate(kinds)
    ]
    per_model = draw(st.sampled_from(("there", "never", "deleted")))
    generic = draw(st.booleans())
    objects: list[dict[str, Any]] = [
        node(),
        resource_slice("dra", "NVIDIA H200", 16),
        resource_slice("dra", "NVIDIA GeForce RTX 4090", 6, name="dra-4090", start=16),
        claim_template("two", gpu_request("gpus", PER_MODEL, 2)),
        claim_template("one", gpu_request("gpus", GENERIC, 1)),
        queue("q", f'{{"{H200}": 100, "{R4090}": 100}}'),
        *([per_model_class()] if per_model != "never" else []),
        *([generic_class()] if generic else []),
    ]
    if any(p.kind == "shared" for p in pods):
        objects.append(
            resource_claim("shared", gpu_request("gpus", PER_MODEL, 1), allocated=allocated(free[H200].pop()))
        )
    for p in pods:
        objects.append(p.obj)
        if p.claim is not None:
            objects.append(p.claim)
    order = draw(st.permutations(objects))
    events: list[dict[str, Any]] = list(order)
    # a claim first seen unallocated, before its allocation
    for p in pods:
        if p.first is not None and p.claim is not None and draw(st.booleans()):
            at = draw(st.integers(0, events.index(p.claim)))
            events.insert(at, p.first)
            event("a claim first seen unallocated")
    # the per-model class deleted after it arrived
    if per_model == "deleted":
        after = next(
            i
            for i, e in enumerate(events)
            if e.get("kind") == "DeviceClass" and e["metadata"]["name"] == PER_MODEL
        )
        events.insert(draw(st.integers(after + 1, len(events))), removal(per_model_class()))
    # some objects brought again (a relist), each later than it first came
    for again in draw(st.lists(st.sampled_from(objects), max_size=4)):
        first = next(i for i, e in enumerate(events) if e is again)
        events.insert(draw(st.integers(first + 1, len(events))), again)
    return pods, per_model, generic, events


def held_pending(pods: list[Pod], events: list[dict[str, Any]]) -> set[str]:
    """The pending pods the cache, at some moment, held with the per-model class and their template
    (or their claim): charged what they read then, while they live."""
    present: set[tuple[str, str]] = set()
    held: set[str] = set()
    for step in events:
        if "remove" in step:
            present.discard(identity(step["remove"]))
        else:
            present.add(identity(step))
        for p in pods:
            if p.kind != "pending":
                continue
            source = ("ResourceClaimTemplate", "two") in present or (
                p.claim is not None and identity(p.claim) in present
            )
            if identity(p.obj) in present and ("DeviceClass", PER_MODEL) in present and source:
                held.add(p.name)
    return held


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds())
def test_pods_first_seen_after_a_restart_are_charged_the_same_whatever_the_order(
    world: tuple[list[Pod], str, bool, list[dict[str, Any]]],
) -> None:
    pods, per_model, generic, events = world
    event(f"the per-model class {per_model}, the generic class {'there' if generic else 'never'}")
    state = ClusterState()
    for step in events:
        apply(state, step)
    held = held_pending(pods, events)
    want: dict[str, tuple[str, str, int] | None] = {}
    for p in pods:
        want[p.name] = p.charged if p.kind != "pending" or p.name in held else None
    sharers = [p.name for p in pods if p.kind == "shared"]
    got = {p.name: charge(state, p.name) for p in pods}
    for p in pods:
        if p.kind != "shared":
            assert got[p.name] == want[p.name], (p.name, p.kind, got[p.name], want[p.name])
    if sharers:  # once, to one of them
        paying = [name for name in sharers if got[name] is not None]
        assert len(paying) == 1 and got[paying[0]] == ("q", H200, 1), {n: got[n] for n in sharers}
    for card in (H200, R4090):
        total = sum(
            c[2] for name, c in want.items() if c is not None and c[1] == card and name not in sharers
        )
        total += 1 if sharers and card == H200 else 0
        assert used(state, card) == total, (card, used(state, card), total)
    if per_model != "deleted":  # the same as the objects read at once, in dependency order
        final: dict[tuple[str, str], dict[str, Any]] = {}
        for step in events:
            final[identity(step)] = step
        once = cluster(*final.values())
        assert {card: used(once, card) for card in (H200, R4090)} == {
            card: used(state, card) for card in (H200, R4090)
        }
        for p in pods:
            if p.kind != "shared":
                assert charge(once, p.name) == got[p.name], (p.name, charge(once, p.name), got[p.name])

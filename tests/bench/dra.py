"""``make bench``: what DRA (SPEC §4b) costs the webhook.

    python -m tests.bench.dra [--pods 10000] [--claims 10000] [--nodes 500] [--repeat 4000]

Four figures, each next to a reference measured in the same run:

* one admission decision for a pod whose GPUs come through a ResourceClaimTemplate (of a per-model
  class, and of the generic class with a CEL selector of the model), and the check of a claim's
  allocation (ResourceClaim status UPDATE), against one for a device-plugin pod of the same model,
  taking turns in one loop, in a cluster of ``--pods`` pods, ``--claims`` claims made from
  templates (allocated) and ``--nodes`` nodes of 8 GPUs each published in ResourceSlices;
* a CEL selector read anew (the published devices changed): evaluated against every device;
* the bytes the cache keeps per claim and per slice device (tracemalloc), next to the bytes of the
  same objects as parsed JSON (the bare list);
* the live cache's first sync of ``--claims`` claims from a loopback fake API server, against a bare
  paginated list of the same pages.
"""

import argparse
import asyncio
import gc
import statistics
import time
import tracemalloc
from dataclasses import replace
from typing import Any

import orjson

from tests.bench import synthetic
from tests.bench.sync import bare_list, live_sync, serving
from tests.builders import (
    H200,
    claim_template,
    claiming,
    cluster,
    device_class,
    gpu_request,
    pod,
    request,
    resource_claim,
    resource_slice,
)
from webhook.cluster import cache
from webhook.core.decide import admission
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Allowed

QUEUE = "q7"
SELECTOR = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'"


def dra_objects(claims: int, nodes: int) -> list[dict[str, Any]]:
    """Classes, ``nodes`` slices of 8 H200, a template, and ``claims`` claims made from it, each
    allocated one device."""
    out: list[dict[str, Any]] = [
        device_class("gpu.nvidia.com"),
        device_class("h200", card=H200),
        claim_template("one", gpu_request("g", "h200", 1), namespace="bench"),
        claim_template("selected", gpu_request("g", count=1, selectors=(SELECTOR,)), namespace="bench"),
    ]
    out += [resource_slice(f"dra-{i}", "NVIDIA H200", 8) for i in range(nodes)]
    for i in range(claims):
        owner = {"name": f"p{i}", "uid": f"uid-p{i}"}
        allocated = ((("g", f"dra-{i % nodes}", f"gpu-{i % 8}")),)
        out.append(
            resource_claim(
                f"p{i}-g-x",
                gpu_request("g", "h200", 1),
                namespace="bench",
                pod_owner=owner,
                pod_claim="t0",
                allocated=allocated,
            )
        )
    return out


def candidates() -> list[list[Any]]:
    """Reviews to decide on, one H200 each: pods through a per-model class's template, through the
    generic class with a selector, through nvidia.com/gpu; the allocation of a made claim."""

    def dra(name: str, template: str) -> Any:
        return request(
            claiming(pod(name, None, None, queue_name=QUEUE, namespace="bench"), templates=(template,))
        )

    per_model = [dra(f"dra-{i}", "one") for i in range(64)]
    selected = [dra(f"sel-{i}", "selected") for i in range(64)]
    plugin = [request(pod(f"dp-{i}", H200, 1, queue_name=QUEUE, namespace="bench")) for i in range(64)]
    allocations = []
    for i in range(64):
        claim = resource_claim(
            f"p{i}-g-x",
            gpu_request("g", "h200", 1),
            namespace="bench",
            pod_owner={"name": f"p{i}", "uid": f"uid-p{i}"},
        )
        result = {"request": "g", "driver": "gpu.nvidia.com", "pool": f"dra-{i}", "device": "gpu-0"}
        status = {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": f"uid-p{i}"}],
        }
        allocations.append(
            request(
                {**claim, "status": status},
                resource="resourceclaims",
                sub="status",
                operation="UPDATE",
                old=claim,
                group="resource.k8s.io",
            )
        )
    return [per_model, selected, allocations, plugin]


def time_decisions(state: ClusterState, repeat: int) -> list[float]:
    """Median µs of each kind of review of ``candidates`` (the device-plugin pod's last), taking
    turns."""
    kinds = candidates()
    for req in (r for kind in kinds[:2] + kinds[3:] for r in kind):
        assert isinstance(admission.validate(state, req, 0.0), Allowed), req.name
    samples: list[list[float]] = [[] for _ in kinds]
    gc.collect()
    gc.disable()
    try:
        for i in range(repeat):
            order = range(len(kinds)) if i % 2 else reversed(range(len(kinds)))
            for k in order:
                started = time.perf_counter_ns()
                admission.validate(state, kinds[k][i % 64], 0.0)
                samples[k].append((time.perf_counter_ns() - started) / 1000)
    finally:
        gc.enable()
    return [statistics.median(s) for s in samples]


def time_reading(state: ClusterState) -> tuple[float, float, int]:
    """Seconds to read a new selector against every published device, then to read it again after
    one slice changed (only that slice's devices are evaluated again), and how many devices."""
    devices = state.inventory.devices
    request_ = devices.templates["bench/selected"].requests[0]
    device_class = devices.classes[request_.device_class]
    first = again = float("inf")
    for round_ in range(3):
        fresh = replace(request_, selectors=(f"{SELECTOR} && {round_} == {round_}",))
        started = time.perf_counter()
        devices.reading(device_class, fresh)
        first = min(first, time.perf_counter() - started)
        ingest.upsert(state, resource_slice("dra-0", "NVIDIA H200", 8, start=round_ + 1))
        started = time.perf_counter()
        devices.reading(device_class, fresh)
        again = min(again, time.perf_counter() - started)
    return first, again, sum(len(s.devices) for s in devices.slices.values())


def bytes_kept(objects: list[dict[str, Any]], base: ClusterState) -> tuple[float, float]:
    """What the state keeps for ``objects`` (parsed from JSON, ingested, the JSON dropped), and
    what the same objects take as parsed JSON: both in bytes, in all."""
    dumped = orjson.dumps(objects)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    raw = orjson.loads(dumped)
    parsed = tracemalloc.get_traced_memory()[0] - before
    for obj in raw:
        ingest.upsert(base, obj)
    del raw
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return kept, parsed


async def sync_figures(claims: int, nodes: int) -> tuple[float, float]:
    by_plural: dict[str, list[bytes]] = {}
    for obj in dra_objects(claims, nodes):
        plural = {
            "DeviceClass": "deviceclasses",
            "ResourceSlice": "resourceslices",
            "ResourceClaimTemplate": "resourceclaimtemplates",
            "ResourceClaim": "resourceclaims",
        }[obj["kind"]]
        by_plural.setdefault(plural, []).append(orjson.dumps(obj))
    async with serving(by_plural) as (url, kubeconfig):
        listed = min([await bare_list(url, cache.watched(Policy())) for _ in range(3)])
        synced = min([(await live_sync(kubeconfig, trace=False))[0] for _ in range(3)])
    return listed, synced


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=4000)
    args = parser.parse_args()

    state = cluster(*synthetic.cluster_objects(args.pods), *dra_objects(args.claims, args.nodes))
    dra_us, selected_us, allocation_us, plugin_us = time_decisions(state, args.repeat)
    print(
        f"cluster: {args.pods:,} pods, {args.claims:,} claims, {args.nodes:,} nodes of 8 GPUs in ResourceSlices"
    )
    print(f"decision, device-plugin pod: {plugin_us:.1f} us median")
    print(
        f"decision, DRA pod (per-model class): {dra_us:.1f} us median ({dra_us / plugin_us:.2f}x, interleaved)"
    )
    print(
        f"decision, DRA pod (generic class, CEL selector): {selected_us:.1f} us median"
        f" ({selected_us / plugin_us:.2f}x)"
    )
    print(
        f"allocation check (claim status update): {allocation_us:.1f} us median ({allocation_us / plugin_us:.2f}x)"
    )
    first, again, devices = time_reading(state)
    print(
        f"a new CEL selector read: {first * 1000:.1f} ms for {devices:,} devices"
        f" ({first / devices * 1e6:.1f} us each); again after one slice of 8 changed: {again * 1000:.2f} ms"
    )

    base = cluster(*synthetic.cluster_objects(0))
    objects = dra_objects(args.claims, args.nodes)
    claims = [o for o in objects if o["kind"] != "ResourceClaim"]
    kept, parsed = bytes_kept(claims, base)  # classes, template, slices: per device
    devices = args.nodes * 8
    print(f"slices: {kept / devices:.0f} bytes kept per slice device (parsed JSON: {parsed / devices:.0f})")
    kept, parsed = bytes_kept([o for o in objects if o["kind"] == "ResourceClaim"], base)
    print(f"claims: {kept / args.claims:.0f} bytes kept per claim (parsed JSON: {parsed / args.claims:.0f})")

    listed, synced = asyncio.run(sync_figures(args.claims, args.nodes))
    print(
        f"cold sync of {args.claims:,} claims and {args.nodes:,} slices: bare list {listed:.2f} s,"
        f" live cache to ready {synced:.2f} s ({synced / listed:.1f}x)"
    )


if __name__ == "__main__":
    main()

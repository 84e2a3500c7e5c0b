"""The live cache's first sync against a fake API endpoint, next to a bare paginated list.

    python -m tests.bench.sync [--pods 100000] [--nodes 5000]

A loopback aiohttp server plays the API server: it serves every kind the cache watches as
paginated lists (500 a page, with ``continue``) from a synthetic cluster, and holds watches open.
In one process, first a bare client lists every page of every kind and parses it (the reference),
then ``LiveSource`` with the real ``KubeTransport`` syncs from the same endpoint. Printed: both
times and their ratio, and the memory the synced state keeps per pod (tracemalloc).
"""

import argparse
import asyncio
import contextlib
import gc
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web

from tests.bench import synthetic
from tests.builders import node
from webhook.cluster import cache
from webhook.cluster.kube import KubeTransport
from webhook.cluster.sources import LiveSource
from webhook.core.model.policy import Policy

PAGE = 500


def fake_api(objects: dict[str, list[bytes]]) -> web.Application:
    """``objects``: plural -> items already serialised (so serving costs the server little)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        plural = request.path.rstrip("/").rsplit("/", 1)[-1]
        if request.query.get("watch"):
            await asyncio.sleep(3600)
            return web.Response(text="")
        items = objects.get(plural, [])
        start = int(request.query.get("continue") or 0)
        end = min(len(items), start + int(request.query.get("limit") or PAGE))
        more = str(end) if end < len(items) else ""
        body = b'{"kind":"List","metadata":{"resourceVersion":"100","continue":"%s"},"items":[%s]}' % (
            more.encode(),
            b",".join(items[start:end]),
        )
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    return app


RECORDED = Path(__file__).parent / "recorded"


def dressed(obj: dict[str, Any], recorded: bytes) -> dict[str, Any]:
    """``obj`` (a synthetic pod or node) in the full shape the API server lists: the recorded
    object (managed fields, status, tolerations, ...) with ``obj``'s identity and every field the
    cache reads."""
    out = orjson.loads(recorded)
    meta, spec = out["metadata"], out["spec"]
    meta.update(obj["metadata"])
    if obj["kind"] == "Pod":
        meta["generateName"] = meta["name"].rstrip("0123456789")
        queue = meta.get("annotations", {}).get("scheduling.volcano.sh/queue-name", "")
        meta["ownerReferences"][0].update(name=f"{queue}-7f849979cc", uid=f"rs-{queue}")
        spec["containers"][0]["resources"] = obj["spec"]["containers"][0]["resources"]
        spec.pop("nodeName", None)
        spec.update({k: v for k, v in obj["spec"].items() if k != "containers"})
        out["status"]["phase"] = obj["status"]["phase"]
    else:
        out["status"]["capacity"] = out["status"]["allocatable"] = obj["status"]["allocatable"]
    return out


def dataset(pods: int, nodes: int, skeleton: bool = False) -> dict[str, list[bytes]]:
    """Every object serialised once; pods and nodes as the API server lists them (recorded from
    the local control plane), or with ``skeleton`` just the fields the cache reads."""
    shapes = {kind: (RECORDED / f"{kind.lower()}.json").read_bytes() for kind in ("Pod", "Node")}

    def serialised(obj: dict[str, Any]) -> bytes:
        return orjson.dumps(obj if skeleton else dressed(obj, shapes[obj["kind"]]))

    everything = synthetic.cluster_objects(pods)
    by_plural: dict[str, list[bytes]] = {"pods": [], "nodes": [], "queues": []}
    for obj in everything:
        if obj["kind"] == "Pod":
            by_plural["pods"].append(serialised(obj))
        elif obj["kind"] == "Queue":
            by_plural["queues"].append(orjson.dumps(obj))
    by_plural["nodes"] = [serialised(node(f"n{i}", synthetic.MODELS[i % 4], 8)) for i in range(nodes)]
    return by_plural


async def bare_list(url: str, kinds: tuple[cache.Kind, ...] = cache.KINDS) -> float:
    """Every page of every kind listed and parsed, as a plain client would: the reference."""
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        for kind in kinds:
            cont = ""
            while True:
                params = {"limit": str(PAGE), **({"continue": cont} if cont else {})}
                async with session.get(url + kind.path, params=params) as response:
                    page = orjson.loads(await response.read())
                cont = page["metadata"].get("continue", "")
                if not cont:
                    break
    return time.perf_counter() - started


async def live_sync(kubeconfig: Path, trace: bool) -> tuple[float, int]:
    gc.collect()
    if trace:
        tracemalloc.start()
    started = time.perf_counter()
    source = LiveSource(lambda: KubeTransport.connect(kubeconfig), Policy())
    task = asyncio.create_task(source.run())
    while not source.ready:
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    gc.collect()
    kept = 0
    if trace:  # what this file allocated is the fake API server's (its last page), not the cache's
        mine = tracemalloc.Filter(False, __file__)
        kept = sum(t.size for t in tracemalloc.take_snapshot().filter_traces([mine]).traces)
    tracemalloc.stop()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return elapsed, kept


@contextlib.asynccontextmanager
async def serving(objects: dict[str, list[bytes]]) -> AsyncIterator[tuple[str, Path]]:
    """The fake API server on a loopback port: its URL and a kubeconfig that reaches it."""
    runner = web.AppRunner(fake_api(objects), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    try:
        with kubeconfig_for(url) as kubeconfig:
            yield url, kubeconfig
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def kubeconfig_for(url: str) -> Iterator[Path]:
    """A kubeconfig that reaches ``url`` with a token, in a temporary directory."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "bench"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(config))
        yield kubeconfig


async def main_async(pods: int, nodes: int, skeleton: bool) -> None:
    objects = dataset(pods, nodes, skeleton)
    async with serving(objects) as (url, kubeconfig):
        listed = min([await bare_list(url) for _ in range(2)])
        synced, _ = await live_sync(kubeconfig, trace=False)
        _, kept = await live_sync(kubeconfig, trace=True)  # tracemalloc slows it: measured apart
    size = sum(map(len, objects["pods"])) // pods
    shape = "skeletons: only the fields the cache reads" if skeleton else "as the API server lists them"
    print(f"pods {pods:,} ({size:,} bytes each, {shape}), nodes {nodes:,}, pages of {PAGE}")
    print(f"bare paginated list and parse: {listed:.1f} s")
    print(f"live cache to ready:           {synced:.1f} s  ({synced / listed:.1f}x the bare list)")
    print(f"memory kept by the synced state: {kept / pods:.0f} bytes per pod (nodes and queues included)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument(
        "--skeleton", action="store_true", help="pods and nodes with only what the cache reads"
    )
    args = parser.parse_args()
    asyncio.run(main_async(args.pods, args.nodes, args.skeleton))


if __name__ == "__main__":
    main()

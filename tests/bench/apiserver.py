"""``make bench``: what the webhooks add where users feel it, a create through the real API server.

    python -m tests.bench.apiserver [--rounds 5] [--batch 200] [--concurrency 1,8] [--pods 0]

A local control plane (the same binaries as the end-to-end tests) and ``cardquota serve`` on its live
cache, both webhooks registered for one namespace (``on``); the same server with every decision a
constant ``Allowed`` (tests/bench/stubbed.py) registered the same way for a second (``stubbed``); the
floor handler (tests/bench/floor.py: parse the review, answer allowed) for a third (``floor``); and
nothing for a fourth (``off``). Each round sends, to each namespace in turn (each goes first in turn, so the
machine's noise falls on all alike): ``batch`` card pod creates (mutated, then validated, then stored), and ``batch`` scale-ups
of a Deployment (``deployments/scale`` from 0 to 1 as a server-side dry run: validated like any
scale-up, and nothing for the controllers to act on). At concurrency 1 the figures are latencies
per request; at the highest concurrency, the API server's throughput. Reported per kind: p50 and
p99 of each namespace, what our webhooks add (on - off), and the throughput ratio on / off; the
floor shows what any Python webhook pair adds on the same machine, the stubbed server what ours
adds around its decisions.
``--pods N`` first creates N card pods in a third namespace the webhook caches, so that the
decisions run on a cluster of that size.
"""

import argparse
import asyncio
import contextlib
import itertools
import json
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.cluster import ControlPlane, free_port, wait_for
from tests.e2e.conftest import serving_webhook
from tests.e2e.objects import SELECTOR, card_queue
from tests.e2e.registration import configurations
from tests.edges.serving import Process

H200 = "NVIDIA-H200"
QUEUE = "bench"
LABEL = "cardquota-bench"  # the namespaces of the stubbed and floor arms: their webhooks only
SERIAL = itertools.count()  # pod names, unique in the run


def card_pod(name: str) -> dict[str, Any]:
    """A pod of 1 H200 for a scheduler that does not exist: it stays Pending, nothing acts on it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {"volcano.sh/card.name": H200, "scheduling.volcano.sh/queue-name": QUEUE},
        },
        "spec": {
            "schedulerName": "bench-none",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/app:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def deployment(name: str) -> dict[str, Any]:
    template = card_pod(name)
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {**template["metadata"], "labels": labels}, "spec": template["spec"]},
        },
    }


class Client:
    """The API server over keep-alive TLS with the admin's client certificate."""

    def __init__(self, plane: ControlPlane, connections: int) -> None:
        context = ssl.create_default_context(cafile=str(plane.certs / "ca.crt"))
        context.load_cert_chain(str(plane.certs / "admin.crt"), str(plane.certs / "admin.key"))
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.http = httpx.AsyncClient(base_url=plane.server, verify=context, limits=limits, timeout=30)

    async def create_pod(self, namespace: str) -> float:
        body = json.dumps(card_pod(f"p{next(SERIAL)}")).encode()
        return await self._timed("POST", f"/api/v1/namespaces/{namespace}/pods", body, "application/json")

    async def scale_up(self, namespace: str) -> float:
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/chat/scale?dryRun=All"
        body = b'{"spec":{"replicas":1}}'
        return await self._timed("PATCH", path, body, "application/merge-patch+json")

    async def _timed(self, method: str, path: str, body: bytes, content_type: str) -> float:
        started = time.perf_counter()
        response = await self.http.request(method, path, content=body, headers={"Content-Type": content_type})
        took = time.perf_counter() - started
        if response.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return took


async def batch(send: Any, namespace: str, count: int, concurrency: int) -> tuple[list[float], float]:
    """``count`` requests, ``concurrency`` at a time: each one's latency, and the batch's wall time."""
    latencies: list[float] = []
    remaining = iter(range(count))

    async def worker() -> None:
        for _ in remaining:
            latencies.append(await send(namespace))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# our webhooks; the same server with its decisions stubbed out; the floor handler; none
ARMS = ("on", "stubbed", "floor", "off")


async def measure(
    plane: ControlPlane, rounds: int, size: int, concurrencies: list[int]
) -> list[dict[str, Any]]:
    rows = []
    for concurrency in concurrencies:
        client = Client(plane, concurrency)
        for kind, send in (("pod create", client.create_pod), ("scale-up (dry run)", client.scale_up)):
            figures: dict[str, dict[str, list[float]]] = {arm: {"lat": [], "wall": []} for arm in ARMS}
            for arm in ARMS:
                await batch(send, f"bench-{arm}", 20, concurrency)  # warm every path (connections, caches)
            for turn in range(rounds):
                for arm in ARMS[turn % len(ARMS) :] + ARMS[: turn % len(ARMS)]:  # each goes first in turn
                    latencies, wall = await batch(send, f"bench-{arm}", size, concurrency)
                    figures[arm]["lat"] += latencies
                    figures[arm]["wall"].append(wall)
            row: dict[str, Any] = {"kind": kind, "concurrency": concurrency, "requests": rounds * size}
            for arm in ARMS:
                row[f"p50_{arm}"] = percentile(figures[arm]["lat"], 0.50) * 1000
                row[f"p99_{arm}"] = percentile(figures[arm]["lat"], 0.99) * 1000
                row[f"rate_{arm}"] = rounds * size / sum(figures[arm]["wall"])
            rows.append(row)
        await client.http.aclose()
    return rows


async def populate(plane: ControlPlane, pods: int) -> None:
    client = Client(plane, 8)
    await batch(client.create_pod, "bench-fill", pods, 8)
    await client.http.aclose()


def table(rows: list[dict[str, Any]]) -> str:
    """Per request kind and concurrency: p50, p99 and rate without webhooks (off), with the floor
    handler, with our server whose decisions are stubbed out, and with ours (on); what ours adds to
    off, and the on/off throughput ratio."""
    cols = ("off", "floor", "stubbed", "on")
    head = f"{'request':<19}{'conc':>5}"
    for figure in ("p50", "p99", "/s"):
        head += (
            "  "
            + "".join(f"{f'{figure} {c}':>13}" for c in cols)
            + (f"{'added':>7}" if figure != "/s" else f"{'on/off':>7}")
        )
    lines = [head]
    for r in rows:
        line = f"{r['kind']:<19}{r['concurrency']:>5}"
        for figure in ("p50", "p99"):
            line += (
                "  "
                + "".join(f"{r[f'{figure}_{c}']:>13.2f}" for c in cols)
                + f"{r[f'{figure}_on'] - r[f'{figure}_off']:>7.2f}"
            )
        line += (
            "  " + "".join(f"{r[f'rate_{c}']:>13.0f}" for c in cols) + f"{r['rate_on'] / r['rate_off']:>7.2f}"
        )
        lines.append(line)
    return "\n".join(lines) + "\n(latencies in ms; /s: requests per second through the API server)"


@contextlib.contextmanager
def registered(plane: ControlPlane, url: str, ca: Path, arm: str) -> Iterator[None]:
    """Both webhook configurations, pointing at ``url``, for the namespace of ``arm`` only."""
    configs = configurations(url, ca, {LABEL: arm}, prefix=f"bench-{arm}")
    plane.apply(*configs)
    try:
        yield
    finally:
        for config in configs:
            plane.kubectl("delete", config["kind"].lower(), config["metadata"]["name"], check=False)


@contextlib.contextmanager
def floor_server(certs: Path, log: Path) -> Iterator[str]:
    """The floor handler (tests/bench/floor.py) on a free port; yields its URL."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.bench.floor", "--port", str(port), "--cert-dir", str(certs)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    def answers() -> bool:
        try:
            return httpx.get(f"https://127.0.0.1:{port}/readyz", verify=context).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for("the floor handler", answers, timeout=30)
        yield f"https://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def stubbed_server(plane: ControlPlane, tmp: Path) -> Iterator[Process]:
    """``cardquota serve`` on the live cache with every decision a constant ``Allowed``
    (tests/bench/stubbed.py): the server's own cost through the API server."""
    flags = ("--kubeconfig", str(plane.kubeconfig), "--drain-seconds", "0")
    program = (sys.executable, "-m", "tests.bench.stubbed")
    process = Process(tmp / "certs", tmp / "server.log", *flags, cluster=None, program=program)
    try:
        process.wait_ready(timeout=60)
        yield process
    finally:
        process.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument(
        "--pods", type=int, default=0, help="card pods created first, in a namespace of their own"
    )
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="cardquota-bench-") as tmp:
        plane = ControlPlane(Path(tmp) / "plane").start()
        try:
            plane.apply(card_queue(QUEUE, {H200: 10_000_000}))
            namespaces = [("bench-on", SELECTOR), ("bench-off", {}), ("bench-fill", SELECTOR)]
            namespaces += [(f"bench-{arm}", {LABEL: arm}) for arm in ("stubbed", "floor")]
            for name, labels in namespaces:
                plane.apply(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
                )
            for arm in ARMS:
                plane.apply(deployment("chat"), namespace=f"bench-{arm}")
            with (
                serving_webhook(plane, Path(tmp) / "webhook") as ours,
                stubbed_server(plane, Path(tmp) / "stubbed") as stubbed,
                registered(plane, stubbed.url, stubbed.certs / "ca.crt", "stubbed"),
                floor_server(ours.certs, Path(tmp) / "floor.log") as floor,
                registered(plane, floor, ours.certs / "ca.crt", "floor"),
            ):
                if args.pods:
                    asyncio.run(populate(plane, args.pods))
                time.sleep(2)  # the cache has seen the Deployments and pods
                print(f"webhook server pid {ours.proc.pid}", flush=True)
                print(
                    f"API server with and without the webhooks, {args.rounds} interleaved rounds of"
                    f" {args.batch} requests each ({args.pods} card pods created first)"
                )
                rows = asyncio.run(measure(plane, args.rounds, args.batch, concurrencies))
                print(table(rows))
        finally:
            plane.stop()


if __name__ == "__main__":
    main()

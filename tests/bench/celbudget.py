"""``make bench``: reviews answered while costly DRA selectors arrive, against none, in one run.

    python -m tests.bench.celbudget [--devices 1000] [--selectors 32] [--rounds 3] [--seconds 20] [--every 0.01]

Two ``cardquota serve`` processes, each on its live cache, sync from loopback fake API servers (this
process) that publish the same ``--devices`` H200 in ResourceSlices of 8, NVIDIA's classes, a node
of device-plugin H200 and a queue. For ``--rounds`` of ``--seconds``, this process sends both, over
keep-alive TLS, a device-plugin pod's create (validate, a dry run) every ``--every`` seconds, at the
same moments (which goes first alternates), each timed from when it was due to when it was
answered, so that the machine's noise falls on both alike. Meanwhile the first, and only it, takes
the load: every half second a ResourceClaimTemplate
arrives through its watch with ``--selectors`` selectors, each the issue's nested comprehension
(70,000 of cel-go's cost units, 3 ms an evaluation) reading the device's own uuid, so that no two
devices are answered as one (100 s of evaluation a template at 1,000 devices); a pod using it is
reviewed at once, and again every second, as its controller would retry.

Printed: each server's p50, p99 and worst review, the ratio of the p99s (and each round's), and
what the costly pods were answered.
"""

import argparse
import asyncio
import contextlib
import ssl
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from tests.bench.sync import kubeconfig_for
from tests.builders import H200, claim_template, device_class, gpu_request, node, pod, queue, resource_slice
from tests.core.test_cel_budget import NESTED
from tests.edges.serving import Process, client_context
from webhook.tools import devcerts

NAMESPACE = "bench"
KINDS = {
    "Node": "nodes",
    "Queue": "queues",
    "DeviceClass": "deviceclasses",
    "ResourceSlice": "resourceslices",
}
UUID = "device.attributes['gpu.nvidia.com'].uuid != ''"


def cluster(devices: int) -> dict[str, list[bytes]]:
    """What the fake API server lists, by plural, serialised once."""
    objects = [node("dp", H200, 64), queue("q", '{"NVIDIA-H200": 100000}'), device_class("gpu.nvidia.com")]
    for i in range(devices // 8):
        objects.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"dra-{i}"}, "status": {}})
        objects.append(resource_slice(f"dra-{i}", "NVIDIA H200", 8, name=f"dra-{i}"))
    out: dict[str, list[bytes]] = {}
    for obj in objects:
        out.setdefault(KINDS[obj["kind"]], []).append(orjson.dumps(obj))
    return out


class FakeApi:
    """Lists what ``cluster`` made; streams the templates pushed with ``add`` to every watch of them;
    holds every other watch open."""

    def __init__(self, listed: dict[str, list[bytes]]) -> None:
        self.listed, self.version, self.watchers = listed, 100, []  # type: ignore[var-annotated]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        plural = request.path.rstrip("/").rsplit("/", 1)[-1]
        if not request.query.get("watch"):
            items = b",".join(self.listed.get(plural, []))
            body = b'{"kind":"List","metadata":{"resourceVersion":"100"},"items":[%s]}' % items
            return web.Response(body=body, content_type="application/json")
        if plural != "resourceclaimtemplates":
            await asyncio.sleep(3600)
            return web.Response(text="")
        response = web.StreamResponse()
        await response.prepare(request)
        events: asyncio.Queue[bytes] = asyncio.Queue()
        self.watchers.append(events)
        try:
            while True:
                await response.write(await events.get())
        finally:
            self.watchers.remove(events)

    def add(self, template: dict[str, Any]) -> None:
        self.version += 1
        template["metadata"]["resourceVersion"] = str(self.version)
        line = orjson.dumps({"type": "ADDED", "object": template}) + b"\n"
        for events in self.watchers:
            events.put_nowait(line)


def review(uid: str, obj: dict[str, Any]) -> bytes:
    meta = obj["metadata"]
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "object": obj,
                "dryRun": True,
                "userInfo": {"username": "bench"},
            },
        }
    )


UNRELATED = review("unrelated", pod("dp-new", H200, 1, queue_name="q", namespace=NAMESPACE, phase=None))


def costly_template(n: int, selectors: int) -> dict[str, Any]:
    texts = tuple(f"{UUID} && {NESTED.replace('>= 0', f'>= -{n * selectors + i}')}" for i in range(selectors))
    return claim_template(f"costly-{n}", gpu_request(count=1, selectors=texts), namespace=NAMESPACE)


def costly_pod(n: int) -> bytes:
    made = pod(f"tenant-{n}", None, None, queue_name="q", namespace=NAMESPACE, phase=None)
    made["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": f"costly-{n}"}]
    made["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return review(f"tenant-{n}", made)


class Bench:
    def __init__(self, url: str, context: ssl.SSLContext, api: FakeApi, selectors: int) -> None:
        self.url, self.context, self.api, self.selectors = url, context, api, selectors
        self.templates = 0
        self.answers: list[str] = []

    async def tenant(self, session: aiohttp.ClientSession, seconds: float) -> None:
        """A costly template every half second, its pod reviewed at once and every second after."""
        loop = asyncio.get_running_loop()
        end, pods = loop.time() + seconds, []

        async def retry(n: int) -> None:
            while loop.time() < end:
                tried = loop.time()
                async with session.post(f"{self.url}/validate", data=costly_pod(n)) as answer:
                    got = (await answer.json())["response"]
                self.answers.append("allowed" if got["allowed"] else got["status"]["message"])
                await asyncio.sleep(max(0.0, tried + 1.0 - loop.time()))

        while loop.time() < end:
            n = self.templates = self.templates + 1
            self.api.add(costly_template(n, self.selectors))
            pods.append(asyncio.create_task(retry(n)))
            await asyncio.sleep(0.5)
        await asyncio.gather(*pods)


async def unrelated(
    session: aiohttp.ClientSession, urls: list[str], seconds: float, every: float
) -> list[list[float]]:
    """A review due at each of ``urls`` every ``every`` seconds for ``seconds``, sent to each in
    turn (which goes first alternates): each one's time from due to answered, by server."""
    loop = asyncio.get_running_loop()
    start, tasks = loop.time(), []
    out: list[list[float]] = [[] for _ in urls]

    async def one(url: str, due: float, into: list[float]) -> None:
        async with session.post(f"{url}/validate", data=UNRELATED) as answer:
            assert (await answer.json())["response"]["allowed"], await answer.text()
        into.append(loop.time() - due)

    for i in range(int(seconds / every)):
        due = start + i * every
        await asyncio.sleep(max(0.0, due - loop.time()))
        order = range(len(urls)) if i % 2 == 0 else reversed(range(len(urls)))
        tasks += [asyncio.create_task(one(urls[k], due, out[k])) for k in order]
    await asyncio.gather(*tasks)
    return out


@contextlib.asynccontextmanager
async def fake_api(listed: dict[str, list[bytes]]) -> AsyncIterator[tuple[FakeApi, Path]]:
    api = FakeApi(listed)
    runner = web.AppRunner(api.app(), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        with kubeconfig_for(f"http://127.0.0.1:{port}") as kubeconfig:
            yield api, kubeconfig
    finally:
        await runner.cleanup()


async def ready(process: Process, context: ssl.SSLContext, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        while time.monotonic() < deadline:
            assert process.proc.poll() is None, process.log()
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"{process.url}/readyz") as answer:
                    if answer.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the server was not ready in {timeout} s:\n{process.log()}")


def figures(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99)] * 1000, ordered[-1] * 1000


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        certs = devcerts.ensure_dev_certs(Path(tmp) / "certs")
        context = client_context(certs)
        listed = cluster(args.devices)
        async with fake_api(listed) as (api, loaded), fake_api(listed) as (_, quiet):
            servers = [
                Process(
                    certs,
                    Path(tmp) / f"{name}.log",
                    "--kubeconfig",
                    str(config),
                    "--drain-seconds",
                    "0",
                    cluster=None,
                )
                for name, config in (("loaded", loaded), ("quiet", quiet))
            ]
            try:
                for server in servers:
                    await ready(server, context)
                bench = Bench(servers[0].url, context, api, args.selectors)
                connector = aiohttp.TCPConnector(ssl=context, limit=64)
                async with (
                    aiohttp.ClientSession(connector=connector) as session,
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as tenants,
                ):
                    await unrelated(session, [s.url for s in servers], 1.0, args.every)  # warm
                    samples: list[list[float]] = [[], []]
                    ratios = []
                    for _ in range(args.rounds):
                        load = asyncio.create_task(bench.tenant(tenants, args.seconds))
                        got = await unrelated(session, [s.url for s in servers], args.seconds, args.every)
                        await load
                        ratios.append(figures(got[0])[1] / figures(got[1])[1])
                        for into, more in zip(samples, got, strict=True):
                            into += more
            finally:
                for server in servers:
                    server.stop()
    (l50, l99, lmax), (q50, q99, qmax) = figures(samples[0]), figures(samples[1])
    print(
        f"{args.devices:,} devices; {len(samples[0]):,} reviews to each server, due every"
        f" {args.every * 1000:g} ms for {args.rounds} rounds of {args.seconds:g} s"
    )
    print(
        f"under the load: p50 {l50:.2f} ms, p99 {l99:.2f} ms, worst {lmax:.1f} ms ({bench.templates} templates"
        f" of {args.selectors} selectors arrived)"
    )
    print(f"none:           p50 {q50:.2f} ms, p99 {q99:.2f} ms, worst {qmax:.1f} ms")
    print(
        f"p99 under the load / none: {l99 / q99:.2f}x (each round's: {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    allowed = sum(1 for a in bench.answers if a == "allowed")
    waiting = sum(1 for a in bench.answers if "is being evaluated, off the loop" in a)
    print(
        f"the costly pods' {len(bench.answers)} reviews: {waiting} refused while evaluated, {allowed} allowed"
    )
    others = [a for a in bench.answers if a != "allowed" and "is being evaluated, off the loop" not in a]
    if others:
        print(f"  and {len(others)} otherwise, e.g. {others[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--selectors", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=0.01)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()

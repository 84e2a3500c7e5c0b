"""DRA selectors worked out off the loop (``cluster.selectors``), through the real server: a review
whose selectors are costly waits for them while the loop answers the others."""

import asyncio
import statistics
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.builders import H200, claim_template, gpu_request, pod, request, resource_slice
from tests.core.test_cel_budget import CHEAP, NESTED, NVIDIA
from tests.core.test_dra import dra_cluster, dra_pod
from tests.edges.serving import ROOT
from webhook.cluster.selectors import Evaluator
from webhook.core.index.state import ClusterState
from webhook.serve import server
from webhook.serve.metrics import Metrics

# each reads the device's own uuid (no two devices answered as one): 3 ms of evaluation a device
COSTLY = tuple(
    f"device.attributes['{NVIDIA}'].uuid != '' && {CHEAP} && {NESTED} && {i} == {i}" for i in range(3)
)


class Served:
    """A ready source over ``state``, its selectors worked out off the loop by ``evaluator``."""

    ready = True

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.evaluator = Evaluator(state)

    async def run(self) -> None:
        await self.evaluator.run()

    async def fetch(self, ref: Any, namespace: str) -> dict[str, Any] | None:
        return None

    def not_ready_reason(self) -> str:
        return ""

    def readiness_reason(self) -> str:
        return ""

    async def step_down(self) -> None:
        return None

    def leader_address(self) -> str | None:
        return None

    async def evaluated(self, readings: set[Any], timeout: float) -> None:
        await self.evaluator.settled(readings, timeout)


def review(obj: dict[str, Any]) -> bytes:
    asked = request(obj)
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": asked.uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": asked.namespace,
                "name": asked.name,
                "object": obj,
                "userInfo": {"username": "tester"},
            },
        }
    )


async def serving(source: Served) -> tuple[web.AppRunner, str, asyncio.Task[None]]:
    app = server.make_app(source, Metrics(), server.Health(), 7 * 2**20)  # type: ignore[arg-type]
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}", asyncio.create_task(source.run())


def costly_cluster(slices: int) -> ClusterState:
    return dra_cluster(
        *(resource_slice(f"s{i}", "NVIDIA H200", 8, name=f"s{i}") for i in range(slices)),
        claim_template("costly", gpu_request(count=1, selectors=COSTLY)),
        quota='{"NVIDIA-H200": 100}',
    )


def test_a_review_waits_for_its_costly_selectors_while_the_loop_answers_the_others() -> None:
    """3 selectors of 3 ms a device on 300 devices: about 3 s of evaluation. On the loop, every
    review would wait that long; off it, the others are answered meanwhile, and the pod is answered
    once its selectors are (refused saying so, and retried, while they take longer than a review
    may wait)."""
    source = Served(costly_cluster(37))
    unrelated = review(pod("dp", H200, 1, queue_name="q", namespace="ns"))
    costly = review(dra_pod("p", templates=("costly",)))

    async def scenario() -> tuple[list[float], list[str]]:
        runner, url, task = await serving(source)
        latencies: list[float] = []
        answers: list[str] = []
        try:
            async with aiohttp.ClientSession() as session:

                async def post(body: bytes) -> dict[str, Any]:
                    async with session.post(f"{url}/validate", data=body) as answer:
                        return dict((await answer.json())["response"])

                async def others() -> None:
                    """One due every 10 ms, timed from when it was due (the client shares the loop:
                    a loop held by a review delays the next ones due)."""
                    start, sent = time.perf_counter(), []

                    async def one(due: float) -> None:
                        assert (await post(unrelated))["allowed"]
                        latencies.append(time.perf_counter() - due)

                    while not answers or not answers[-1].startswith("allowed"):
                        due = start + len(sent) * 0.01
                        await asyncio.sleep(max(0.0, due - time.perf_counter()))
                        sent.append(asyncio.create_task(one(due)))
                    await asyncio.gather(*sent)

                async def the_pod() -> None:
                    for _ in range(30):
                        got = await post(costly)
                        answers.append("allowed" if got["allowed"] else got["status"]["message"])
                        if got["allowed"]:
                            return

                await asyncio.wait_for(asyncio.gather(others(), the_pod()), 120)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await runner.cleanup()
        return latencies, answers

    latencies, answers = asyncio.run(scenario())
    assert len(latencies) > 20 and max(latencies) < 0.5, (statistics.median(latencies), max(latencies))
    assert answers[-1] == "allowed", answers
    assert all("is being evaluated, off the loop that answers reviews" in a for a in answers[:-1]), answers
    assert source.evaluator.jobs >= 3 and source.evaluator.seconds > 1.0  # worked out off the loop


def test_work_whose_process_died_is_done_again(monkeypatch: pytest.MonkeyPatch) -> None:
    state = costly_cluster(1)
    evaluator = Evaluator(state)
    real, failed = Evaluator._work, []

    async def dies_once(self: Evaluator, job: Any) -> Any:
        if not failed:
            failed.append(job)
            raise BrokenProcessPool("killed")
        return await real(self, job)

    monkeypatch.setattr(Evaluator, "_work", dies_once)

    async def scenario() -> Any:
        task = asyncio.create_task(evaluator.run())
        try:
            for _ in range(600):
                state.inventory.devices.turn()
                found = state.asked(state_pod_template())
                if not state.inventory.devices.deferred_now:
                    return found
                await evaluator.settled(set(state.inventory.devices.deferred_now), 1.0)
            raise AssertionError("never evaluated")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    found = asyncio.run(scenario())
    assert failed and found.spec.text == H200, found


def state_pod_template() -> Any:
    from webhook.core.model.objects import pod_template_of

    return pod_template_of(dra_pod("p", templates=("costly",)))


def test_deferred_work_nobody_asks_for_any_more_is_dropped_and_a_pending_pod_keeps_asking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A template deleted, a controller that gave up: its reading's work is dropped once nobody
    asked for it in ``ABANDON_SECONDS`` (what was worked out is kept). A pod the cache charged
    while its reading was deferred asks again every ``RECHARGE_SECONDS``: its work stays."""
    from webhook.cluster import selectors
    from webhook.core.index import ingest

    monkeypatch.setattr(selectors, "ABANDON_SECONDS", 0.0)
    monkeypatch.setattr(selectors, "RECHARGE_SECONDS", 0.0)
    state = costly_cluster(1)
    evaluator = Evaluator(state)
    devices = state.inventory.devices
    state.asked(state_pod_template())  # a review's: nobody asks again
    assert devices.deferred()
    evaluator._abandon()  # seen
    time.sleep(0.01)
    evaluator._abandon()  # not asked since: dropped
    assert not devices.deferred() and evaluator.dropped == 1
    ingest.upsert(state, dra_pod("p", templates=("costly",), queue_name="q"))  # the cache's: it asks again
    assert state.pending and devices.deferred()
    for _ in range(3):
        evaluator._abandon()
        time.sleep(0.01)
    assert devices.deferred() and evaluator.dropped == 1


def test_the_process_that_evaluates_is_gone_when_the_server_is_killed(tmp_path: Any) -> None:
    """A server killed (OOM, SIGKILL) closes nothing: its process must not outlive it."""
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "serve.py"
    script.write_text(
        "import asyncio, sys\n"
        "from tests.edges.test_selectors import costly_cluster, state_pod_template\n"
        "from webhook.cluster.selectors import Evaluator\n"
        "async def main():\n"
        "    state = costly_cluster(1)\n"
        "    evaluator = Evaluator(state)\n"
        "    state.asked(state_pod_template())\n"
        "    job = state.inventory.devices.take(1)\n"
        "    await evaluator._work(job)\n"
        "    print(*[p.pid for p in evaluator._pool._processes.values()], flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n"
    )
    server = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert server.stdout is not None
        child = int(server.stdout.readline())
        os.kill(child, 0)  # alive
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        for _ in range(100):
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the process outlived its server")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()

"""``make bench``: one tidal reclaim pass at scale, and what it costs the reviews answered meanwhile.

    python -m tests.bench.reclaim [--nodes 10000] [--gangs 5000] [--pending 100000] [--reviews 3000] [--cpu]
                                  [--serving-reviews 5000] [--serving-only]

A cluster of ``--nodes`` nodes of 8 RTX-4090 each, every card held by ``--gangs`` two-pod training
gangs of a low-priority queue, and ``--pending`` one-card inference pods of a high-priority queue
waiting unbound inside its quota (``--cpu``: every pod also requests a core, so each node's room
counts its CPU beside its cards). Timed: a pass's reading of its questions for every one of the
pending pods (``tidal.problems``) and their solving (``tidal.solve_all``). Then the same pod-create
validation is answered ``--reviews`` times on the event loop as if they arrived every millisecond:
alone, while passes are solved in a thread, and while they are solved in a process of their own;
and, last, alone and beside the serving replica's own tidal reclaim (``Reclaimer.run``: its window
of each line, its reads of the waiting pods from a scripted API that shows them unschedulable, its
reading in slices, its solver in a process of its own), every pass planning for the pods it has read
(in dry run: each pass plans the same, nothing changes), turn by turn; printed: the p50 and p99 of
each review's time from its arrival to its answer, and their ratios.
"""

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

from tests.builders import R4090, cluster, node, owner, pod, podgroup, queue, request
from webhook.cluster.reclaimer import WINDOW, InProcess, Reclaimer
from webhook.cluster.sources import settle_heap
from webhook.core.decide import admission, tidal
from webhook.core.model.policy import Policy
from webhook.core.model.steps import done

RS = owner("ReplicaSet", "web-1", "uid-rs-web-1")


def world(nodes: int, gangs: int, pending: int, cpu: bool = False) -> Any:
    objects: list[dict[str, Any]] = [node(f"n{i}", R4090, 8) for i in range(nodes)]
    objects += [
        queue("train", f'{{"{R4090}": {nodes * 8}}}', priority=100, reclaimable=True),
        queue("serve", f'{{"{R4090}": {pending + 10}}}', priority=80000, reclaimable=False),
        podgroup("web", "Inqueue", queue_name="serve", owner_ref=RS),
    ]
    for g in range(gangs):  # each gang: two pods of 8 cards, on two nodes of its own
        job = owner("Job", f"t{g}", f"uid-job-t{g}", api="batch.volcano.sh/v1alpha1")
        objects.append(podgroup(f"t{g}", "Running", queue_name="train", owner_ref=job))
        objects += [
            pod(
                f"t{g}-{i}",
                R4090,
                8,
                node_name=f"n{(2 * g + i) % nodes}",
                phase="Running",
                queue_name="train",
                group=f"t{g}",
                owner=job,
            )
            for i in range(2)
        ]
    objects += [pod(f"web-{i}", R4090, 1, queue_name="serve", group="web", owner=RS) for i in range(pending)]
    if cpu:
        for made in objects:
            if made["kind"] == "Pod":
                made["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1"}
    return cluster(*objects, policy=Policy(reclaim="dry-run"))


class Api:
    """What the serving replica's reclaim asks of the API server: a waiting pod, read, is Pending
    and the scheduler found no node for it; Events are dropped. Each call gives the loop back once,
    as a request to the API server would."""

    def __init__(self) -> None:
        self.read = 0

    async def get(self, kind: Any, namespace: str, name: str) -> dict[str, Any]:
        self.read += 1
        await asyncio.sleep(0)
        return {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {},
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
            },
        }

    async def record_event(self, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0)

    async def annotate(self, *args: Any, **kwargs: Any) -> bool:
        await asyncio.sleep(0)
        return True

    async def list_in(self, *args: Any) -> list[Any]:
        await asyncio.sleep(0)
        return []

    async def evict(self, *args: Any, **kwargs: Any) -> str:
        await asyncio.sleep(0)
        return ""


def review() -> Any:
    return request(pod("probe", R4090, 1, queue_name="serve", uid="uid-probe"))


async def latencies(state: Any, count: int, every: float = 0.001) -> list[float]:
    """Answer ``count`` reviews arriving every ``every`` seconds: each one's time from its arrival
    to its answer (a review waits while the loop, or the interpreter's lock, is busy elsewhere)."""
    asked, out = review(), []
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(count):
        arrival = start + i * every
        await asyncio.sleep(max(0.0, arrival - loop.time()))
        admission.validate(state, asked, 0.0)
        out.append((loop.time() - arrival) * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gangs", type=int, default=5_000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--reviews", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--serving-only", action="store_true", help="only the serving replica's passes")
    parser.add_argument(
        "--serving-reviews", type=int, default=5_000, help="reviews per turn beside its passes"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    state = world(args.nodes, args.gangs, args.pending, args.cpu)
    settle_heap()  # as the server does once its cache is synced: the state out of the collector's sight
    print(
        f"built {args.nodes} nodes, {args.gangs} gangs, {args.pending} pending pods in {time.perf_counter() - started:.0f} s"
    )
    if args.serving_only:
        asyncio.run(serving(state, args.serving_reviews, args.rounds))
        return
    reads, solves = [], []
    for _ in range(args.rounds):
        started = time.perf_counter()
        asked = done(tidal.problems(state, lambda uid: True))
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        plans = tidal.solve_all(asked)
        solves.append(time.perf_counter() - started)
    victims = sum(len(p.victims or ()) for p in plans)
    print(
        f"a pass: reading {statistics.median(reads) * 1000:.0f} ms on the loop, solving"
        f" {statistics.median(solves) * 1000:.0f} ms in the thread ({len(plans)} plans, {victims} victims)"
    )

    stop = threading.Event()

    def passes() -> None:
        while not stop.is_set():
            tidal.solve_all(asked)

    async def beside_process() -> list[float]:
        solver = InProcess()
        await solver(asked)  # started, and warm
        done = asyncio.Event()

        async def passes_in_process() -> None:
            while not done.is_set():
                await solver(asked)

        task = asyncio.create_task(passes_in_process())
        try:
            return await latencies(state, args.reviews)
        finally:
            done.set()
            await task
            solver.close()

    alone: list[float] = []
    threaded: list[float] = []
    processed: list[float] = []
    for _ in range(args.rounds):
        alone += asyncio.run(latencies(state, args.reviews))
        worker = threading.Thread(target=passes)
        stop.clear()
        worker.start()
        threaded += asyncio.run(latencies(state, args.reviews))
        stop.set()
        worker.join()
        processed += asyncio.run(beside_process())
    print("pod-create validation, arrival to answer, µs            p50      p99")
    print(f"  alone                                        {p(alone, 0.5):8.1f} {p(alone, 0.99):8.1f}")
    for arm, during in (("in a thread", threaded), ("in a process", processed)):
        ratios = f"ratio {p(during, 0.5) / p(alone, 0.5):.2f} {p(during, 0.99) / p(alone, 0.99):.2f}"
        print(
            f"  while passes are solved {arm:13}        {p(during, 0.5):8.1f} {p(during, 0.99):8.1f}  {ratios}"
        )
    asyncio.run(serving(state, args.serving_reviews, args.rounds))


def p(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))]


async def serving(state: Any, reviews: int, rounds: int) -> None:
    """The reviews alone and beside the serving replica's own passes, turn by turn in one loop."""
    api, solver = Api(), InProcess()
    timed: list[float] = []

    class Timed(Reclaimer):
        async def once(self) -> None:
            started = time.perf_counter()
            await super().once()
            timed.append(time.perf_counter() - started)

    reclaimer = Timed(state, api, lambda: True, solve=solver)  # type: ignore[arg-type]
    started = time.perf_counter()
    while api.read < WINDOW:  # its window read: every pass now plans for all of it
        await reclaimer.once()
        await asyncio.sleep(0.05)
    print(f"serving replica: its window of {WINDOW} pods read in {time.perf_counter() - started:.0f} s")
    timed.clear()
    alone: list[float] = []
    beside: list[float] = []
    try:
        for _ in range(rounds):
            alone += await latencies(state, reviews)
            task = asyncio.create_task(reclaimer.run())
            beside += await latencies(state, reviews)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        solver.close()
    print(
        f"  its passes: {len(timed)}, each {statistics.median(timed) * 1000:.0f} ms from start to end"
        f" (median; reading in slices, solving in its process), {api.read} pods read in all"
    )
    print(f"  alone                                        {p(alone, 0.5):8.1f} {p(alone, 0.99):8.1f}")
    ratios = f"ratio {p(beside, 0.5) / p(alone, 0.5):.2f} {p(beside, 0.99) / p(alone, 0.99):.2f}"
    print(
        f"  beside the serving replica's passes          {p(beside, 0.5):8.1f} {p(beside, 0.99):8.1f}  {ratios}"
    )


if __name__ == "__main__":
    main()

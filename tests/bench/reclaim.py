"""``make bench``: one tidal reclaim pass at scale, and what it costs the reviews answered meanwhile.

    python -m tests.bench.reclaim [--nodes 10000] [--gangs 5000] [--pending 100000] [--reviews 3000] [--cpu]

A cluster of ``--nodes`` nodes of 8 RTX-4090 each, every card held by ``--gangs`` two-pod training
gangs of a low-priority queue, and ``--pending`` one-card inference pods of a high-priority queue
waiting unbound inside its quota (``--cpu``: every pod also requests a core, so each node's room
counts its CPU beside its cards). Timed: the pass's reading of its questions on the event loop
(``tidal.problems``) and their solving (``tidal.solve_all``). Then the same pod-create validation
is answered ``--reviews`` times on the event loop as if they arrived every millisecond: alone,
while passes are solved in a thread, and while they are solved in a process of their own (as the
serving replica does), turn by turn; printed: the p50 and p99 of each review's time from its
arrival to its answer, and their ratios.
"""

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

from tests.builders import R4090, cluster, node, owner, pod, podgroup, queue, request
from webhook.cluster.reclaimer import InProcess
from webhook.core.decide import admission, tidal

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
    return cluster(*objects)


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
    args = parser.parse_args()
    started = time.perf_counter()
    state = world(args.nodes, args.gangs, args.pending, args.cpu)
    print(
        f"built {args.nodes} nodes, {args.gangs} gangs, {args.pending} pending pods in {time.perf_counter() - started:.0f} s"
    )
    reads, solves = [], []
    for _ in range(args.rounds):
        started = time.perf_counter()
        asked = tidal.problems(state, lambda uid: True)
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

    def p(values: list[float], q: float) -> float:
        return sorted(values)[int(q * (len(values) - 1))]

    print("pod-create validation, arrival to answer, µs            p50      p99")
    print(f"  alone                                        {p(alone, 0.5):8.1f} {p(alone, 0.99):8.1f}")
    for arm, during in (("in a thread", threaded), ("in a process", processed)):
        ratios = f"ratio {p(during, 0.5) / p(alone, 0.5):.2f} {p(during, 0.99) / p(alone, 0.99):.2f}"
        print(
            f"  while passes are solved {arm:13}        {p(during, 0.5):8.1f} {p(during, 0.99):8.1f}  {ratios}"
        )


if __name__ == "__main__":
    main()

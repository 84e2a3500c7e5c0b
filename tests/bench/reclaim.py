"""``make bench``: one tidal reclaim pass at scale, and what it costs the reviews answered meanwhile.

    python -m tests.bench.reclaim [--nodes 10000] [--gangs 5000] [--pending 100000] [--reviews 3000] [--cpu]
                                  [--serving-reviews 5000] [--serving-only] [--reason tidal|borrowing|both]
                                  [--passes-only]

A cluster of ``--nodes`` nodes of 8 RTX-4090 each, every card held by ``--gangs`` two-pod training
gangs of a low-priority queue, and ``--pending`` one-card inference pods of a high-priority queue
waiting unbound inside its quota (``--cpu``: every pod also requests a core, so each node's room
counts its CPU beside its cards). The same pod-create validation is answered ``--reviews`` times on
the event loop as if they arrived every millisecond: alone, while a pass's questions for every one of
the pending pods are solved in a thread, and while they are solved in a process of their own; then
alone and beside the serving replica's own tidal reclaim (``Reclaimer.run``: its window of each
line, its reads of the waiting pods from a scripted API that shows them unschedulable, its reading in
slices, its solver in a process of its own), every pass planning for the pods it has read (in dry
run: each pass plans the same, nothing changes), turn by turn; printed: the p50 and p99 of each
review's time from its arrival to its answer, and their ratios. Last, timed: a pass's reading of its
questions for every one of the pending pods (``tidal.problems``) and their solving
(``tidal.solve_all``), in each shape ``--reason`` names, a round of each in turn, with their ratios
(borrowing / tidal).

The borrowing shape (decisions.md §33) is the same cluster, gangs and pods, but the two queues are
of one priority and the training queue is not reclaimable: the gangs' queue deserves 8 cards and
borrows the rest up to its quota, the waiting pods' queue is inside a deserved that covers all of it,
so the gangs give their cards back only because they are lent. The bench stops if a pass of either
shape plans no victim, or if the borrowing one takes a gang the tidal reason alone would take. The
reviews' arms run on the first shape named (tidal, with ``both``, the default), the borrowing state
built once they are done, so they run on the heap they always did.
"""

import argparse
import asyncio
import json
import statistics
import threading
import time
from typing import Any

from tests.builders import R4090, cluster, node, owner, pod, podgroup, queue, request
from webhook.cluster.reclaimer import WINDOW, InProcess, Reclaimer
from webhook.cluster.sources import settle_heap
from webhook.core.decide import admission, tidal
from webhook.core.model import keys
from webhook.core.model.policy import Policy
from webhook.core.model.reclaim import why_not
from webhook.core.model.steps import done

RS = owner("ReplicaSet", "web-1", "uid-rs-web-1")
SHAPES = ("tidal", "borrowing")
LENT_TO_TRAIN = 8  # the borrowing shape: what the gangs' queue deserves; all else it uses is lent


def world(nodes: int, gangs: int, pending: int, cpu: bool = False, reason: str = "tidal") -> Any:
    objects: list[dict[str, Any]] = [node(f"n{i}", R4090, 8) for i in range(nodes)]
    if reason == "tidal":
        queues = [
            queue("train", f'{{"{R4090}": {nodes * 8}}}', priority=100, reclaimable=True),
            queue("serve", f'{{"{R4090}": {pending + 10}}}', priority=80000, reclaimable=False),
        ]
    else:  # one priority, the gangs' queue not reclaimable: only its borrowing gives cards back
        queues = [
            queue("train", f'{{"{R4090}": {nodes * 8}}}', priority=100, reclaimable=False),
            queue("serve", f'{{"{R4090}": {pending + 10}}}', priority=100, reclaimable=False),
        ]
        for made, deserved in zip(queues, (LENT_TO_TRAIN, pending + 10), strict=True):
            made["metadata"]["annotations"][keys.CARD_DESERVED] = json.dumps({R4090: deserved})
    objects += [*queues, podgroup("web", "Inqueue", queue_name="serve", owner_ref=RS)]
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
    parser.add_argument(
        "--reason", choices=(*SHAPES, "both"), default="both", help="the shape of the pass timed (see above)"
    )
    parser.add_argument("--passes-only", action="store_true", help="only the passes timed, no reviews")
    args = parser.parse_args()
    shapes = SHAPES if args.reason == "both" else (args.reason,)
    if args.passes_only:
        timed_passes({shape: built(args, shape) for shape in shapes}, args.rounds)
        return
    state = built(args, shapes[0])
    if args.serving_only:
        asyncio.run(serving(state, args.serving_reviews, args.rounds))
        return
    asked = done(tidal.problems(state, lambda uid: True))  # the reviews' arms first, on one shape

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
    # then the passes timed, every shape in turn (its state built once the arms are done, so that
    # they run on the heap they always did)
    timed_passes({shapes[0]: state, **{shape: built(args, shape) for shape in shapes[1:]}}, args.rounds)


def built(args: argparse.Namespace, shape: str) -> Any:
    started = time.perf_counter()
    state = world(args.nodes, args.gangs, args.pending, args.cpu, shape)
    settle_heap()  # as the server does once its cache is synced: the state out of the collector's sight
    print(
        f"built {args.nodes} nodes, {args.gangs} gangs, {args.pending} pending pods ({shape})"
        f" in {time.perf_counter() - started:.0f} s"
    )
    return state


def timed_passes(states: dict[str, Any], rounds: int) -> None:
    """A pass of each shape, read and solved, ``rounds`` times in turn (the machine's noise falls on
    all alike): the median of each printed, then each shape's over the first's."""
    reads: dict[str, list[float]] = {shape: [] for shape in states}
    solves: dict[str, list[float]] = {shape: [] for shape in states}
    asked: dict[str, list[Any]] = {}
    plans: dict[str, list[tidal.Plan]] = {}
    for _ in range(rounds):
        for shape, state in states.items():
            started = time.perf_counter()
            asked[shape] = done(tidal.problems(state, lambda uid: True))
            reads[shape].append(time.perf_counter() - started)
            started = time.perf_counter()
            plans[shape] = tidal.solve_all(asked[shape])
            solves[shape].append(time.perf_counter() - started)
    for shape in states:
        check(shape, asked[shape], plans[shape])
        victims = sum(len(p.victims or ()) for p in plans[shape])
        print(
            f"a pass ({shape}): reading {statistics.median(reads[shape]) * 1000:.0f} ms on the loop, solving"
            f" {statistics.median(solves[shape]) * 1000:.0f} ms in the thread"
            f" ({len(plans[shape])} plans, {victims} victims)"
        )
    first, *others = states
    for shape in others:
        print(
            f"  {shape} / {first}: reading {statistics.median(reads[shape]) / statistics.median(reads[first]):.2f},"
            f" solving {statistics.median(solves[shape]) / statistics.median(solves[first]):.2f}"
        )


def check(shape: str, asked: list[Any], plans: list[tidal.Plan]) -> None:
    """Stop unless the pass plans victims, the gangs of the training queue for the waiting pods,
    and, in the borrowing shape, for the lending reason alone: every question names the training
    queue a borrower, and no gang it takes would the tidal reason take."""
    taken = [g for p in plans for g in p.victims or ()]
    wrong = []
    if not taken:
        wrong.append("no victims")
    if any(p.queue != "serve" for p in plans) or any(g.queue != "train" for g in taken):
        wrong.append("plans for another queue, or victims of another")
    if shape == "borrowing":
        if any(w.borrowers != {"train"} for problem in asked for w in problem.queues):
            wrong.append('a question without "train" as its borrower')
        priorities = {w.priority for problem in asked for w in problem.queues}
        if any(not why_not(g, g.card, "serve", priority) for priority in priorities for g in taken):
            wrong.append("a victim the tidal reason alone would take")
    if wrong:
        raise SystemExit(f"the {shape} pass measures nothing it should: {'; '.join(wrong)}")


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

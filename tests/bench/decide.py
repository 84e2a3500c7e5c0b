"""``make bench``: the cost of one admission decision with 1,000 and 100,000 pods in the cluster.

Run with ``python -m tests.bench.decide [--pods 1000,100000] [--repeat 6000]``. Prints one table;
the figures in docs/performance.md come from it. For each cluster size the flat queues, the
three-level tree, the flat queues with half the one-model pods sharing GPUs, the flat queues
during a burst (``IN_FLIGHT`` pods of the other queues admitted, not yet seen by the cache), and the
flat queues as one cohort lending and borrowing every model (decisions.md §33) are timed
turn by turn in the same loop, and their ratios to the flat queues printed.
"""

import argparse
import gc
import resource
import statistics
import time
import tracemalloc

from tests.bench import synthetic
from tests.bench.synthetic import MODELS
from tests.builders import R4090, R4090D, cluster, pod, request
from webhook.core.decide import admission
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.cards import UNIT, CardName, CardSpec
from webhook.core.model.ledger import Entry
from webhook.core.model.verdicts import Allowed

IN_FLIGHT = 1000  # the burst: pods admitted in other queues than the one decided, not yet in the cache
OTHERS = [f"q{n}" for n in range(50) if n != 7]  # every timed decision is in q7


def build(
    pods: int, tree: bool = False, sharing: bool = False, burst: bool = False, lending: bool = False
) -> ClusterState:
    state = cluster(*synthetic.cluster_objects(pods, tree, sharing, lending))
    for i in range(IN_FLIGHT if burst else 0):  # one pod of one card each
        entry = Entry(OTHERS[i % len(OTHERS)], CardSpec((CardName(MODELS[i % 2]),)), UNIT, 1, 1e12)
        state.ledger.record(f"burst-{i}", entry)
    return state


def _candidate(i: int) -> dict[str, object]:
    """A pod create as validated: two in three of one model, one in three ``A|B`` as its mutation
    left it (assigned one model, the spec it asked noted beside it)."""
    if i % 3:
        return pod(f"new-{i}", MODELS[i % 2], 1, queue_name="q7")
    return pod(f"new-{i}", R4090D, 1, queue_name="q7", annotations={keys.CARD_SPEC: f"{R4090}|{R4090D}"})


def time_decisions(states: list[ClusterState], repeat: int) -> list[tuple[float, float, float]]:
    """Median, p99 and max (µs) of one decision in each state, the states taking turns request by
    request (in alternating order), so the machine's noise falls on all of them alike."""
    candidates = [request(_candidate(i)) for i in range(64)]
    for state in states:  # warm up
        for req in candidates:
            admission.validate(state, req, 0.0)
    samples: list[list[float]] = [[] for _ in states]
    order = list(range(len(states)))
    gc.collect()
    gc.disable()
    try:
        for i in range(repeat):
            req = candidates[i % len(candidates)]
            for k in order if i % 2 else reversed(order):
                started = time.perf_counter_ns()
                decision = admission.validate(states[k], req, 0.0)
                samples[k].append((time.perf_counter_ns() - started) / 1000)
                assert isinstance(decision, Allowed)
    finally:
        gc.enable()
    out = []
    for taken in samples:
        taken.sort()
        out.append((statistics.median(taken), taken[int(len(taken) * 0.99)], taken[-1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", default="1000,100000")
    parser.add_argument("--repeat", type=int, default=6000)
    args = parser.parse_args()
    print(
        f"{'queues':>6} {'pods':>8} {'build s':>8} {'state MiB':>10} {'median us':>10} {'p99 us':>8} {'max us':>8}"
    )
    for pods in (int(n) for n in args.pods.split(",")):
        states, built = [], []
        for tree, sharing, burst, lending in (
            (False, False, False, False),
            (True, False, False, False),
            (False, True, False, False),
            (False, False, True, False),
            (False, False, False, True),
        ):
            gc.collect()
            tracemalloc.start()
            started = time.perf_counter()
            states.append(build(pods, tree, sharing, burst, lending))
            built.append((time.perf_counter() - started, tracemalloc.get_traced_memory()[0] / 2**20))
            tracemalloc.stop()
        timed = time_decisions(states, args.repeat)
        shapes = ("flat", "tree", "shared", "burst", "lent")
        for shape, (seconds, size), (median, p99, worst) in zip(shapes, built, timed, strict=True):
            print(
                f"{shape:>6} {pods:>8} {seconds:>8.1f} {size:>10.1f} {median:>10.1f} {p99:>8.1f} {worst:>8.1f}"
            )
        print(f"{'':>6} {pods:>8} tree/flat median: {timed[1][0] / timed[0][0]:.3f} (interleaved, same run)")
        print(
            f"{'':>6} {pods:>8} shared/flat median: {timed[2][0] / timed[0][0]:.3f},"
            f" p99: {timed[2][1] / timed[0][1]:.3f} (half the one-model pods share GPUs)"
        )
        print(
            f"{'':>6} {pods:>8} burst/flat median: {timed[3][0] / timed[0][0]:.3f},"
            f" p99: {timed[3][1] / timed[0][1]:.3f} ({IN_FLIGHT:,} pods of other queues in flight)"
        )
        print(
            f"{'':>6} {pods:>8} lent/flat median: {timed[4][0] / timed[0][0]:.3f},"
            f" p99: {timed[4][1] / timed[0][1]:.3f} (the 100 queues one cohort lending every model)"
        )
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()

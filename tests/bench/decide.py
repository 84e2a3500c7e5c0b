"""``make bench``: the cost of one admission decision with 1,000 and 100,000 pods in the cluster.

Run with ``python -m tests.bench.decide [--pods 1000,100000] [--repeat 3000]``. Prints one table;
the figures in docs/performance.md come from it.
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
from webhook.core import admission
from webhook.core.state import ClusterState
from webhook.core.verdicts import Allowed


def build(pods: int, tree: bool = False) -> ClusterState:
    return cluster(*synthetic.cluster_objects(pods, tree))


def time_decisions(state: ClusterState, repeat: int) -> tuple[float, float, float]:
    candidates = [
        request(pod(f"new-{i}", MODELS[i % 2] if i % 3 else f"{R4090}|{R4090D}", 1, queue_name="q7"))
        for i in range(64)
    ]
    for req in candidates:  # warm up
        admission.validate(state, req, 0.0)
    samples = []
    for i in range(repeat):
        req = candidates[i % len(candidates)]
        started = time.perf_counter_ns()
        decision = admission.validate(state, req, 0.0)
        samples.append((time.perf_counter_ns() - started) / 1000)
        assert isinstance(decision, Allowed)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99)], samples[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", default="1000,100000")
    parser.add_argument("--repeat", type=int, default=3000)
    args = parser.parse_args()
    print(
        f"{'queues':>6} {'pods':>8} {'build s':>8} {'state MiB':>10} {'median us':>10} {'p99 us':>8} {'max us':>8}"
    )
    for pods, tree in ((int(n), tree) for n in args.pods.split(",") for tree in (False, True)):
        gc.collect()
        tracemalloc.start()
        started = time.perf_counter()
        state = build(pods, tree)
        built = time.perf_counter() - started
        size = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
        median, p99, worst = time_decisions(state, args.repeat)
        shape = "tree" if tree else "flat"
        print(f"{shape:>6} {pods:>8} {built:>8.1f} {size:>10.1f} {median:>10.1f} {p99:>8.1f} {worst:>8.1f}")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()

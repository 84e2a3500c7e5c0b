"""``make bench``: what the enqueue gate costs with 100 Volcano Jobs waiting.

Run with ``python -m tests.bench.enqueue [--pods 10000] [--jobs 100] [--repeat 4000]``. Stock Volcano
retries every Pending job's enqueue once a scheduling period (1 s), so 100 jobs that do not fit send
the webhook 100 PodGroup UPDATEs a second, each denied. Printed, from one run: the cost of one such
review (median, p99, µs) and the share of one core 100 a second take; and the pod create's
validation (median, p99, µs) with those 100 jobs waiting in its queue's line, against the same
cluster with none waiting, the two states taking turns request by request so that the machine's
noise falls on both alike; for a pod in the jobs' queue (it stands behind them, and is refused) and
in another queue (untouched).
"""

import argparse
import copy
import gc
import statistics
import time
from typing import Any

from tests.bench import synthetic
from tests.builders import H200, node, owner, pod, podgroup, queue, request
from webhook.cluster.snapshot import build_state
from webhook.core.decide import admission
from webhook.core.index.state import ClusterState
from webhook.core.model.verdicts import Allowed, Denied

FULL = "jobs"  # the queue the jobs wait in: its 8 H200 all in use


def build(pods: int, jobs: int) -> tuple[ClusterState, list[Any]]:
    objects = synthetic.cluster_objects(pods)
    objects += [node("jobs-node", H200, 8), queue(FULL, f'{{"{H200}": 8}}')]
    objects += [
        pod(f"busy-{i}", H200, 1, queue_name=FULL, node_name="jobs-node", phase="Running") for i in range(8)
    ]
    groups = []
    for i in range(jobs):
        ref = owner("Job", f"train-{i}", f"uid-job-{i}", api="batch.volcano.sh/v1alpha1")
        groups.append(
            podgroup(f"train-{i}", "Pending", f'{{"{H200}": 2}}', queue_name=FULL, owner_ref=ref, minMember=2)
        )
    state = build_state(((f"object {i}", o) for i, o in enumerate([*objects, *groups])), None)
    reviews = []
    for group in groups:
        new = copy.deepcopy(group)
        new["status"]["phase"] = "Inqueue"
        reviews.append(
            request(new, resource="podgroups", operation="UPDATE", old=group, group="scheduling.volcano.sh")
        )
    return state, reviews


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=4000)
    args = parser.parse_args()
    waiting, reviews = build(args.pods, args.jobs)
    idle, _ = build(args.pods, 0)
    now = 1000.0
    for review in reviews:  # the first period: every job refused, each takes its place in line
        admission.admit(waiting, review, admission.validate(waiting, review, now), now)
    assert len(waiting.line) == args.jobs, len(waiting.line)

    gate: list[float] = []
    pods: dict[str, list[list[float]]] = {FULL: [[], []], "q7": [[], []]}
    candidates = {q: [request(pod(f"new-{i}", H200, 1, queue_name=q)) for i in range(32)] for q in pods}
    gc.collect()
    gc.disable()
    try:
        for i in range(args.repeat):
            now += 0.01
            review = reviews[i % len(reviews)]  # the scheduler's retries, spread over the period
            started = time.perf_counter_ns()
            decision = admission.validate(waiting, review, now)
            admission.admit(waiting, review, decision, now)
            gate.append((time.perf_counter_ns() - started) / 1000)
            assert isinstance(decision, Denied)
            for name, (with_jobs, without) in pods.items():
                req = candidates[name][i % 32]
                for state, samples in (
                    ((waiting, with_jobs), (idle, without))
                    if i % 2
                    else ((idle, without), (waiting, with_jobs))
                ):
                    started = time.perf_counter_ns()
                    admission.validate(state, req, now)
                    samples.append((time.perf_counter_ns() - started) / 1000)
    finally:
        gc.enable()
    median, p99 = percentiles(gate)
    print(
        f"enqueue gate, {args.pods} pods, {args.jobs} jobs waiting in queue {FULL!r} (each retried once a second)"
    )
    print(f"  a refused PodGroup UPDATE: median {median:.1f} µs, p99 {p99:.1f} µs;")
    print(f"  {args.jobs} a second take {args.jobs * statistics.mean(gate) / 1e4:.2f} % of one core")
    print(f"  {'pod create in':<28}{'with jobs waiting':>24}{'none waiting':>20}{'ratio p50 / p99':>20}")
    for name, (with_jobs, without) in pods.items():
        (a50, a99), (b50, b99) = percentiles(with_jobs), percentiles(without)
        where = "their queue (refused)" if name == FULL else "another queue"
        print(
            f"  {where:<28}{a50:>10.1f} / {a99:>7.1f} µs{b50:>9.1f} / {b99:>6.1f} µs{a50 / b50:>11.2f} / {a99 / b99:.2f}"
        )
    ok = admission.validate(idle, candidates["q7"][0], now)
    assert isinstance(ok, Allowed)


if __name__ == "__main__":
    main()

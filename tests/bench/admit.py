"""``make bench``: a pod create as the API server runs it (the pod mutation, then the validation of
the mutated pod) against the same code of a reference commit, turn by turn in the same run.

Run with ``python -m tests.bench.admit [--reference REV] [--pods 1000,100000] [--rounds 6]``. The
reference is checked out into a temporary git worktree; each side is timed in its own process, the
two taking turns round by round, so the machine's noise falls on both alike. Printed: the median
and p99 (µs) of the mutation and of the validation of one pod, two in three single-model and one in
three ``A|B`` (which the current code assigns a model; the decision benchmark's mix), and the
current/reference ratios.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import gc, json, sys, time
import jsonpatch
from tests.bench import synthetic
from tests.bench.synthetic import MODELS
from tests.builders import R4090, R4090D, cluster, pod, request
try:
    from webhook.core.decide import admission
except ImportError:  # the reference commit, before the package by layer
    from webhook.core import admission

pods, repeat = int(sys.argv[1]), int(sys.argv[2])
state = cluster(*synthetic.cluster_objects(pods))
specs = [f"{R4090}|{R4090D}", MODELS[1], MODELS[0]]  # the decision benchmark's mix: a third A|B
mutations, validations = [], []
gc.collect()
gc.disable()
for i in range(repeat):
    obj = pod(f"new-{i}", specs[i % 3], 1, queue_name="q7", uid="")
    req = request(obj)
    started = time.perf_counter_ns()
    mutation = admission.mutate(state, req)
    admission.admit(state, req, mutation, 0.0)
    mutations.append((time.perf_counter_ns() - started) / 1000)
    patched = jsonpatch.apply_patch(obj, [dict(op) for op in mutation.patch])
    patched["metadata"]["uid"] = f"uid-new-{i}"
    valid = request(patched)
    started = time.perf_counter_ns()
    decision = admission.validate(state, valid, 0.0)
    admission.admit(state, valid, decision, 0.0)
    validations.append((time.perf_counter_ns() - started) / 1000)
    assert type(decision).__name__ == "Allowed", decision
    state.ledger.__init__()  # the pod never arrives: start the next one from the same state
gc.enable()
print(json.dumps({"mutate": mutations, "validate": validations}))
"""


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """``rev`` checked out into a temporary git worktree, removed on the way out."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "reference"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True, capture_output=True
        )
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def _run(tree: Path, pods: int, repeat: int) -> dict[str, list[float]]:
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(pods), str(repeat)],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout))


def _stats(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples), samples[int(len(samples) * 0.99)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", default="d024bc7", help="the commit before multi-card assignment")
    parser.add_argument("--pods", default="1000,100000")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    with worktree(args.reference) as reference:
        print(f"reference: {args.reference}; {args.rounds} rounds of {args.repeat} pod creates, turn by turn")
        print(
            f"{'pods':>8} {'step':>9} {'median us':>10} {'ref':>8} {'ratio':>6} {'p99 us':>8} {'ref':>8} {'ratio':>6}"
        )
        for pods in (int(n) for n in args.pods.split(",")):
            mine: dict[str, list[float]] = {"mutate": [], "validate": []}
            theirs: dict[str, list[float]] = {"mutate": [], "validate": []}
            for round_ in range(args.rounds):
                sides = [(ROOT, mine), (reference, theirs)]
                for tree, into in sides if round_ % 2 else reversed(sides):
                    for step, samples in _run(tree, pods, args.repeat).items():
                        into[step] += samples
            for step in ("mutate", "validate"):
                (m50, m99), (r50, r99) = _stats(mine[step]), _stats(theirs[step])
                print(
                    f"{pods:>8} {step:>9} {m50:>10.1f} {r50:>8.1f} {m50 / r50:>6.2f} {m99:>8.1f} {r99:>8.1f} {m99 / r99:>6.2f}"
                )


if __name__ == "__main__":
    main()

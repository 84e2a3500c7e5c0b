"""``make bench``: the exact multi-card check of one decision on generated queue states.

Run with ``python -m tests.bench.feasibility [--states 5000] [--reference OLD.py]``. Three cases:

* ``uniform``: every group of a state wants one pod size (1, 2, 4 or 8): the common case;
* ``adversarial``: up to 30 flexible groups, 2-4 alternatives each, sizes from {1, 2, 3, 4, 8}, over
  up to 8 models. The demand already admitted has a placement within quota (the webhook admitted it),
  half the models have no card left and the others 1-8, and the request is one pod (70 %) or a
  scale-up of 2-4 pods, of any size over 1-4 of the models: the queue at its quota's edge;
* ``edge``: the same groups with quota drawn around a placement (±3 per model), so the demand already
  there may itself not fit: states admission should rarely meet, reported for the worst case.

Each state is timed three times and the fastest run kept (the work is fixed; the slower runs only
measure pauses of the machine); the check's caches are emptied before every run.

``in units`` is the same check on the same states counted in card units, as the core holds them
since shared GPUs (decisions.md §21): its figures must match the plain ones.

``--reference`` times another implementation of ``fits`` (a file defining it, e.g. an earlier
``webhook/core/model/feasibility.py``) on the same states, for a before/after figure in one run: the two
take turns state by state, each with its own caches emptied before every run.
"""

import argparse
import gc
import importlib.util
import random
import time
from collections.abc import Callable, Sequence
from types import ModuleType

from webhook.core.model.cards import UNIT, CardName
from webhook.core.model.feasibility import GUARD, Group, TooComplex, clear_caches, fits

SIZES = (1, 2, 3, 4, 8)
REPEATS = 3
MODELS = [CardName(f"MODEL-{n}") for n in range(8)]
State = tuple[dict[CardName, int], list[Group], Group]


def queue_state(rng: random.Random, sizes: Sequence[int], planted: bool) -> State:
    models = MODELS[: rng.randint(2, 8)]
    groups, used = [], dict.fromkeys(models, 0)
    for _ in range(rng.randint(0, 29)):
        alternatives = tuple(rng.sample(models, rng.randint(2, min(4, len(models)))))
        size, pods = rng.choice(sizes), rng.randint(1, 12)
        groups.append(Group(alternatives, size, pods))
        for _ in range(pods):
            used[rng.choice(alternatives)] += size
    if planted:
        capacity = {m: n + (0 if rng.random() < 0.5 else rng.randint(1, 8)) for m, n in used.items()}
    else:
        capacity = {m: max(0, n + rng.randint(-3, 3)) for m, n in used.items()}
    alternatives = tuple(rng.sample(models, rng.randint(1, min(4, len(models)))))
    pods = 1 if rng.random() < 0.7 else rng.randint(2, 4)
    return capacity, groups, Group(alternatives, rng.choice(sizes), pods, "request")


def states(case: str, count: int, seed: int) -> list[State]:
    rng = random.Random(seed)
    if case == "uniform":
        return [queue_state(rng, [rng.choice((1, 2, 4, 8))], planted=True) for _ in range(count)]
    return [queue_state(rng, SIZES, planted=case == "adversarial") for _ in range(count)]


Check = Callable[[dict[CardName, int], list[Group], Group], bool]


def time_fits(
    checks: dict[str, tuple[Check, Callable[[], None]]], cases: list[State]
) -> dict[str, dict[str, float]]:
    """Each check (with the function that empties its caches) on every state, taking turns state by
    state so the machine's slow spells fall on all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in checks}
    fitting, guarded = dict.fromkeys(checks, 0), dict.fromkeys(checks, 0)
    gc.collect()
    gc.freeze()  # as the server does once its cache is built: collections skip the states
    for capacity, groups, request in cases:
        for name, (check, clear) in checks.items():
            # The work for one state is fixed, so the fastest of a few runs is its cost: the others
            # only add pauses of this shared machine. Caches are emptied before each run.
            fastest = float("inf")
            for _ in range(REPEATS):
                clear()
                started = time.perf_counter_ns()
                try:
                    answer = check(capacity, groups, request)
                except TooComplex:
                    answer = None
                fastest = min(fastest, (time.perf_counter_ns() - started) / 1e6)
            fitting[name] += answer is True
            guarded[name] += answer is None
            samples[name].append(fastest)
    results = {}
    for name, times in samples.items():
        times.sort()
        results[name] = {
            "fit": 100 * fitting[name] / len(cases),
            "p50": times[len(times) // 2],
            "p99": times[int(len(times) * 0.99)],
            "max": times[-1],
            "guarded": guarded[name],
        }
    return results


def fits_in_units(capacity: dict[CardName, int], groups: list[Group], request: Group) -> bool:
    """The same state as the core holds it since shared GPUs: every count in card units (``UNIT``
    a card). The scaling itself is inside the timing (a few microseconds)."""
    scaled = [Group(g.cards, g.per_pod * UNIT, g.pods, g.origin) for g in groups]
    wanted = Group(request.cards, request.per_pod * UNIT, request.pods, request.origin)
    return fits({card: n * UNIT for card, n in capacity.items()}, scaled, wanted)


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_feasibility", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--states", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--reference", help="a file defining fits(capacity, groups, request) to compare")
    args = parser.parse_args()
    checks: dict[str, tuple[Check, Callable[[], None]]] = {
        "exact check": (fits, clear_caches),
        "in units": (fits_in_units, clear_caches),
    }
    if args.reference:
        reference = load(args.reference)
        checks["reference"] = (reference.fits, getattr(reference, "clear_caches", lambda: None))
    print(f"one decision's multi-card check, {args.states} states per case (guard: {GUARD} search steps)")
    print(f"{'case':<12} {'check':<12} {'fit %':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'guarded':>8}")
    for case in ("uniform", "adversarial", "edge"):
        generated = states(case, args.states, args.seed)
        # an exponential reference takes hours on the edge states
        timed = {name: c for name, c in checks.items() if name != "reference" or case != "edge"}
        for name, r in time_fits(timed, generated).items():
            print(
                f"{case:<12} {name:<12} {r['fit']:>6.1f} {r['p50']:>8.3f} {r['p99']:>8.3f} {r['max']:>8.2f}"
                f" {r['guarded']:>8}"
            )


if __name__ == "__main__":
    main()

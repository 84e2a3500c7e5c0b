"""``make bench``: the chart's own filters over generated pods and workloads.

Run with ``python -m tests.bench.filters [--pods 20000] [--seed 1]``. Every pod asks one to three
resources the code counts (``tests/core/test_sent_resources.py``'s list, and a vendor resource
under each prefix the chart sends), in limits or requests, of a container or an init container,
beside CPU, memory and unrelated extended resources; every control pod asks none of them. Each is
evaluated against the ``matchConditions`` of the chart's pod webhooks (validating and mutating) and
its workload filter (the same spec as a Deployment's template), as ``helm template`` renders them,
by a CEL runtime: the figures are how many card pods each keeps out (must be 0) and how many control
pods it sends (must be 0), and the time one evaluation takes.
"""

import argparse
import random
import sys
import time

from tests.e2e.test_filters import CORE, COUNTED, POD_HOOKS, UNRELATED, VENDORS, sent, spec_with


def generated(rng: random.Random, names: list[str], most: int) -> list[tuple[str, str, bool]]:
    return [
        (rng.choice(names), rng.choice(["limits", "requests"]), rng.random() < 0.3)
        for _ in range(rng.randint(1, most))
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counted = COUNTED + VENDORS
    kept_out = sent_controls = evaluations = 0
    started = time.perf_counter()
    for _ in range(args.pods):
        noise = generated(rng, CORE + UNRELATED, 3) if rng.random() < 0.7 else []
        card = spec_with(noise + generated(rng, counted, 3))
        control = spec_with(generated(rng, CORE + UNRELATED, 4))
        for spec, is_card in ((card, True), (control, False)):
            pod = {"metadata": {"name": "p"}, "spec": spec}
            workload = {"metadata": {"name": "w"}, "spec": {"template": {"metadata": {}, "spec": spec}}}
            verdicts = [sent(hook, pod) for hook in POD_HOOKS]
            verdicts.append(
                sent("validate.cardquota.volcano.sh", workload, group="apps", resource="deployments")
            )
            evaluations += len(verdicts)
            if is_card:
                kept_out += verdicts.count(False)
            else:
                sent_controls += verdicts.count(True)
    took = time.perf_counter() - started
    print(f"chart filters over {args.pods} card pods and {args.pods} control pods (seed {args.seed}),")
    print("each as a pod to both pod webhooks and as a Deployment's template:")
    print(f"  card pods kept out:     {kept_out}")
    print(f"  control pods sent:      {sent_controls}")
    print(f"  evaluations:            {evaluations} in {took:.1f} s ({took / evaluations * 1e6:.0f} µs each)")
    return 1 if kept_out or sent_controls else 0


if __name__ == "__main__":
    sys.exit(main())

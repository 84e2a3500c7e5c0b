"""``make bench``: seconds from an inference scale-up to its pods bound, with tidal reclaim and with
the partners alone, in one run against each REAL partner (the fork, then stock v1.15.1).

    python -m tests.bench.tidal [--rounds 3] [--cap 60]

One control plane per partner, its recommended scheduler configuration, two L40S nodes of 2 cards;
a ``cardquota serve`` on its live cache, reclaim on (the default), then another with ``--reclaim
off`` (one at a time: a serving replica takes cards back for every pod its cache holds). Each round is the
seed-002 setup (docs/decisions.md §26): a training Volcano Job of 4 pods (3 s grace) holds every
L40S; an inference Deployment of 0 replicas is scaled to 2 (as an HPA does) and timed until both
pods are bound. The arms take turns on the same nodes. Reported per partner and arm: every round,
and a figure past ``--cap`` as such (the partners alone never bind them: nothing takes the cards
back).
Skipped, with the reason, for a partner whose source is not beside the repository.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.bench.line import server
from tests.e2e.build import ensure_volcano, no_volcano
from tests.e2e.cluster import ControlPlane, wait_for
from tests.e2e.test_tidal_reclaim import Seed002, prepared

LABEL = "cardquota-bench-tidal"


def one_round(plane: ControlPlane, arm: str, cap: float) -> float | None:
    seed = Seed002(plane, {LABEL: arm})
    try:
        seed.training("train", 4)
        wait_for("the training job to hold every L40S", lambda: len(seed.running("train-")) == 4, timeout=90)
        seed.inference("web", 0)
        started = time.monotonic()
        seed.plane.kubectl("scale", "deployment/web", "--replicas=2", "-n", seed.ns)
        while time.monotonic() - started < cap:
            if len(seed.running("web-")) == 2:
                return time.monotonic() - started
            time.sleep(0.1)
        return None
    finally:
        seed.delete()


def shown(figures: list[float | None], cap: float) -> str:
    done = [f for f in figures if f is not None]
    each = ", ".join(f"{f:.1f}" if f is not None else f"> {cap:.0f}" for f in figures)
    if len(done) < len(figures):
        return f"not bound within {cap:.0f} s in {len(figures) - len(done)} of {len(figures)} ({each})"
    return f"median {statistics.median(done):.1f} s, max {max(done):.1f} s ({each})"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds with reclaim, per partner")
    parser.add_argument("--cap", type=float, default=60.0, help="seconds to wait for the pods at most")
    args = parser.parse_args()
    results: dict[tuple[str, str], list[float | None]] = {}
    for partner in ("fork", "stock"):
        built = ensure_volcano(partner)
        if built is None:
            print(f"tests.bench.tidal: {partner} skipped: {no_volcano(partner)}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            plane = ControlPlane(Path(tmp) / "plane", volcano=built, partner=partner).start()
            try:
                prepared(plane)
                # One server at a time: a serving replica reclaims for every pod its cache holds.
                for arm, rounds, flags in (("on", args.rounds, ()), ("off", 1, ("--reclaim", "off"))):
                    with server(plane, Path(tmp) / arm, arm, *flags, label=LABEL):
                        results[(partner, arm)] = [one_round(plane, arm, args.cap) for _ in range(rounds)]
                    print(f"{partner} {arm}: {shown(results[(partner, arm)], args.cap)}", flush=True)
            finally:
                plane.stop()
    print(
        "\nseconds from an inference scale-up (0 -> 2 pods) to both pods bound, training holding every card:"
    )
    print(f"{'partner':<8} {'tidal reclaim':<48} {'the partner alone'}")
    for partner in ("fork", "stock"):
        if (partner, "on") in results:
            on, off = results[(partner, "on")], results[(partner, "off")]
            print(f"{partner:<8} {shown(on, args.cap):<48} {shown(off, args.cap)}")


if __name__ == "__main__":
    main()

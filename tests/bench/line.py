"""``make bench``: how long a refused workload stays down after its cards free, with the waiting line
(deny mode, then wait mode) and without it (the behaviour before the line), in one run against the
REAL Volcano scheduler.

    python -m tests.bench.line [--refused 180] [--cap 420]

One control plane with the capacity-card scheduler; two ``cardquota serve`` on its live cache: the
line on (the default) for namespaces labelled ``cardquota-bench-line=on``, ``--no-waiting-line`` for
those labelled ``off``. In each arm, three full queues whose Deployment ``web`` is refused for
``--refused`` seconds (its ReplicaSet's back-off grows meanwhile), then freed by a quota raise, by
deleting another workload's pod, and by another pod finishing; and a rolling update (default
strategy) of a Deployment of 4 one-card pods that uses its queue's whole quota, its pods taking 20 s
to stop (with fewer than 4 replicas the default strategy's maxUnavailable rounds down to 0, and no
rollout at a full quota can ever start its first new pod). Then the same again in wait mode (the
kwok nodes have too few cards for a third arm at once): the pods held under the gate instead of
refused. Reported: seconds from the freeing write to the missing pods existing (deny, off) or
released and bound (wait), and each rollout's length (a figure past ``--cap`` seconds is reported
as such).
Skipped, with the reason, when the scheduler's source is not beside the repository.
"""

import argparse
import contextlib
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.e2e.agreement import (
    H200,
    H800,
    R4090,
    R4090D,
    Case,
    Tenant,
    app,
    hog_deployment,
    hog_pod,
    roll,
    rolled_out,
)
from tests.e2e.build import NO_VOLCANO, ensure_volcano
from tests.e2e.cluster import SHUTDOWN, ControlPlane
from tests.e2e.registration import configurations
from tests.edges.serving import Process

LABEL = "cardquota-bench-line"
MPS = "NVIDIA-H800/mps-80g*1/2"  # the kwok nodes' cards are few: each case on cards of its own


@contextlib.contextmanager
def server(plane: ControlPlane, tmp: Path, arm: str, *flags: str, label: str = LABEL) -> Iterator[Process]:
    """A webhook on ``plane`` for the namespaces labelled ``label``: ``arm``, with ``flags``."""
    process = Process(
        tmp / "certs", tmp / "server.log", "--kubeconfig", str(plane.kubeconfig), *flags, cluster=None
    )
    configs = configurations(process.url, process.certs / "ca.crt", {label: arm}, prefix=f"{label}-{arm}")
    try:
        process.wait_ready(timeout=60)
        plane.apply(*configs)
        time.sleep(2)  # the API server picks the configurations up
        yield process
    finally:
        for config in configs:
            plane.kubectl("delete", config["kind"].lower(), config["metadata"]["name"], check=False)
        process.stop()


class Arm:
    """One arm's cases: three refused workloads and two rollouts, on cards of their own."""

    def __init__(self, plane: ControlPlane, arm: str, cards: dict[str, str], mode: str = "deny") -> None:
        def tenant() -> Tenant:
            return Tenant(plane, {LABEL: "off" if arm == "off" else "on"}, mode=mode)

        self.arm = arm
        self.cases = {
            "quota raised": Case(tenant(), cards["raised"], hog_deployment(cards["raised"]), web=1),
            "a pod of another workload deleted": Case(
                tenant(), cards["deleted"], hog_deployment(cards["deleted"])
            ),
            "a pod finished": Case(tenant(), cards["finished"], hog_pod(cards["finished"])),
        }
        self.rollout = tenant()
        self.rollout.set_quota({cards["rollout"]: 4})
        self.rollout.plane.apply(
            app("serve", 4, cards["rollout"], self.rollout, **{SHUTDOWN: "20s"}), namespace=self.rollout.ns
        )
        self.cards = cards

    def free(self) -> dict[str, float]:
        """Free every case's cards; when each write started."""
        started: dict[str, float] = {}
        raised, deleted, finished = self.cases.values()
        started["quota raised"] = time.monotonic()
        raised.t.set_quota({self.cards["raised"]: 2})
        started["a pod of another workload deleted"] = time.monotonic()
        deleted.t.plane.kubectl("delete", "-n", deleted.t.ns, "deployment/hog", "--wait=false")
        started["a pod finished"] = time.monotonic()
        done = json.dumps({"status": {"phase": "Succeeded"}})
        finished.t.plane.kubectl(
            "patch", "-n", finished.t.ns, "pod/hog", "--subresource=status", "--type=merge", "-p", done
        )
        return started

    def delete(self) -> None:
        for t in [c.t for c in self.cases.values()] + [self.rollout]:
            t.delete()


def until(
    checks: dict[str, Callable[[], bool]], started: dict[str, float], cap: float
) -> dict[str, float | None]:
    """Seconds from each start until its check holds; None past ``cap``."""
    out: dict[str, float | None] = {}
    while len(out) < len(checks):
        now = time.monotonic()
        for name, check in checks.items():
            if name in out:
                continue
            if check():
                out[name] = time.monotonic() - started[name]
            elif now - started[name] > cap:
                out[name] = None
        time.sleep(0.1)
    return out


def measure(arms: list[Arm], cap: float) -> dict[str, float | None]:
    """Free every arm's cards and roll its Deployment; how long each took."""
    started: dict[str, float] = {}
    checks: dict[str, Callable[[], bool]] = {}
    for arm in arms:
        for name, when in arm.free().items():
            started[f"{arm.arm}: {name}"] = when
            checks[f"{arm.arm}: {name}"] = arm.cases[name].ready
        started[f"{arm.arm}: rollout"] = time.monotonic()
        roll(arm.rollout, "serve")
        checks[f"{arm.arm}: rollout"] = (lambda t: lambda: rolled_out(t, "serve"))(arm.rollout)
    return until(checks, started, cap)


def shown(seconds: float | None, cap: float) -> str:
    return f"> {cap:.0f} s (not yet)" if seconds is None else f"{seconds:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--refused", type=float, default=180.0, help="seconds the workloads are refused first"
    )
    parser.add_argument("--cap", type=float, default=420.0, help="seconds to wait for any one figure at most")
    args = parser.parse_args()
    built = ensure_volcano()
    if built is None:
        print(f"tests.bench.line skipped: {NO_VOLCANO}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        plane = ControlPlane(Path(tmp) / "plane", volcano=built).start()
        try:
            with (
                server(plane, Path(tmp) / "on", "on"),
                server(plane, Path(tmp) / "off", "off", "--no-waiting-line"),
            ):
                took: dict[str, float | None] = {}
                phases: list[Callable[[], list[Arm]]] = [
                    lambda: [
                        Arm(
                            plane, "on", {"raised": H200, "deleted": H800, "finished": R4090, "rollout": H200}
                        ),
                        Arm(
                            plane,
                            "off",
                            {"raised": MPS, "deleted": R4090, "finished": R4090D, "rollout": H800},
                        ),
                    ],
                    lambda: [
                        Arm(
                            plane,
                            "wait",
                            {"raised": H200, "deleted": H800, "finished": R4090, "rollout": H200},
                            mode="wait",
                        )
                    ],
                ]
                for phase in phases:
                    arms = phase()
                    print(f"refusing (or holding) for {args.refused:.0f} s ...", flush=True)
                    time.sleep(args.refused)
                    took |= measure(arms, args.cap)
                    for arm in arms:
                        arm.delete()
                print(
                    f"\nrefused or held for {args.refused:.0f} s; seconds from the freeing write to the"
                    " missing pods existing (deny, off) or released and bound (wait):"
                )
                print(f"{'freed by':<44} {'deny':>10} {'wait':>10} {'line off':>20}")
                for name in (
                    "quota raised",
                    "a pod of another workload deleted",
                    "a pod finished",
                    "rollout",
                ):
                    label = name if name != "rollout" else "rollout at a full quota (4 pods, 20 s stop)"
                    figures = [shown(took[f"{arm}: {name}"], args.cap) for arm in ("on", "wait", "off")]
                    print(f"{label:<44} {figures[0]:>10} {figures[1]:>10} {figures[2]:>20}")
        finally:
            plane.stop()


if __name__ == "__main__":
    main()

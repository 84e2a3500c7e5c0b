"""The waiting line (SPEC §5c, decisions.md §23) in front of the REAL Volcano controller-manager and
capacity-card scheduler: a workload refused for minutes gets its pods within 2 s of its cards
freeing, however they free; a rolling update at a full quota completes; waiters are served by
priority, then arrival; a scale-up does not overtake them. Skipped, with the reason, when the
scheduler's source is not beside the repository."""

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agreement import (
    H200,
    H800,
    R4090,
    R4090D,
    Case,
    Tenant,
    app,
    gated,
    hog_deployment,
    hog_pod,
    pods_of,
    refused,
    roll,
    rolled_out,
)
from tests.e2e.cluster import SHUTDOWN, ControlPlane, wait_for
from tests.edges.serving import Process

# How long the workloads are refused before their cards free: long enough for the ReplicaSet
# controller's back-off to pass two minutes (it doubles from 5 ms per refusal, up to 1000 s).
REFUSED_SECONDS = float(os.environ.get("CARDQUOTA_E2E_REFUSED_SECONDS", "180"))
WITHIN = 2.0  # seconds from the cards freeing to the missing pods existing
JOB_CARD = {"deny": R4090D, "wait": H800}


@pytest.fixture
def tenants(volcano: ControlPlane, front: Process) -> Iterator[Callable[..., Tenant]]:
    made: list[Tenant] = []

    def make(mode: str = "deny") -> Tenant:
        made.append(Tenant(volcano, mode=mode))
        return made[-1]

    yield make
    for tenant in made:
        tenant.delete()


def seconds_until(check: Callable[[], bool], free: Callable[[], Any], timeout: float = 30.0) -> float:
    """Seconds from the write that frees the cards (``free``) being accepted, when its kubectl
    returns, until ``check`` holds, polled as fast as kubectl answers (each poll takes about 0.1 s).
    The kubectl's own start-up before it sends the write (seconds on a loaded machine) is the
    client's, not the webhook's, and is not counted."""
    free()
    started = time.monotonic()
    wait_for("the waiting pods", check, timeout=timeout, every=0.05)
    return time.monotonic() - started


def test_a_workload_refused_or_held_for_minutes_gets_its_pods_within_2s_of_its_cards_freeing(
    tenants: Callable[..., Tenant],
) -> None:
    """Both modes side by side: deny (its missing pods exist) and wait (its held pods are released
    and bound), each freed by a quota raised, a pod of another workload deleted, a pod finished; and
    a batch Job's, freed by a quota raised (its controller's back-off is capped at 60 s, its call
    answered after the Job controller's 1 s batching of updates)."""
    cases = {
        mode: {
            "quota raised": Case(tenants(mode), H200, hog_deployment(H200), web=2),
            "a pod of another workload deleted": Case(tenants(mode), H800, hog_deployment(H800)),
            "a pod finished": Case(tenants(mode), R4090, hog_pod(R4090)),
            # the nodes' last whole cards: the rtx4090d node's 2, the h800 node's 6th and 5th
            "quota raised (a batch Job)": Case(
                tenants(mode), JOB_CARD[mode], hog_deployment(JOB_CARD[mode]), job=True
            ),
        }
        for mode in ("deny", "wait")
    }
    time.sleep(REFUSED_SECONDS)  # the ReplicaSets' back-off grows meanwhile
    for mode, by in cases.items():
        for case in by.values():
            assert not case.has_its_pods(), (
                f"{mode}: web of {case.t.ns} got its pods while its cards were taken"
            )

    done = json.dumps({"status": {"phase": "Succeeded"}})
    frees: dict[str, Callable[[Tenant], Any]] = {
        "quota raised": lambda t: t.set_quota({H200: 3}, wait=False),
        "quota raised (a batch Job)": lambda t: t.set_quota({JOB_CARD[t.mode]: 2}, wait=False),
        "a pod of another workload deleted": lambda t: t.plane.kubectl(
            "delete", "-n", t.ns, "deployment/hog", "--wait=false"
        ),
        "a pod finished": lambda t: t.plane.kubectl(
            "patch", "-n", t.ns, "pod/hog", "--subresource=status", "--type=merge", "-p", done
        ),
    }
    took = {
        mode: {
            how: seconds_until(case.ready, lambda c=case, h=how: frees[h](c.t)) for how, case in by.items()
        }  # type: ignore[misc]
        for mode, by in cases.items()
    }
    print(f"held or refused for {REFUSED_SECONDS:.0f} s, then ready after: {took}")
    assert all(seconds <= WITHIN for by in took.values() for seconds in by.values()), took
    for mode, by in cases.items():
        for case in by.values():
            wait_for(f"web of {case.t.ns} to be bound", case.bound, timeout=30)
            case.t.check_agreement()
            reasons = {
                (e["reason"], e["involvedObject"]["kind"])
                for e in case.t.plane.get("events", namespace=case.t.ns)["items"]
            }
            if mode == "deny":
                called = "Job" if case.job else "ReplicaSet"
                assert ("CardQuotaCalled", called) in reasons, reasons
            else:
                assert {("CardQuotaWaiting", "Pod"), ("CardQuotaReleased", "Pod")} <= reasons, reasons


def rollout_seconds(t: Tenant, name: str) -> float:
    """Change the Deployment's template and time its rollout to the end."""
    started = time.monotonic()
    roll(t, name)
    wait_for(f"the rollout of {t.ns}/{name}", lambda: rolled_out(t, name), timeout=600, every=0.5)
    return time.monotonic() - started


STEP_SLACK = (
    1.0  # seconds a step of a rollout may add: the line's tick, the controller, the scheduler's period
)


@pytest.mark.parametrize("mode", ["deny", "wait"])
def test_a_rolling_update_at_a_full_quota_completes_within_twice_one_with_room(
    tenants: Callable[..., Tenant], mode: str
) -> None:
    """The same Deployment (4 pods of one H200, a 20 s shutdown, the default strategy) rolled out in
    a queue it fills and in a queue with one H200 of room. With room the old pods' shutdowns run two
    at a time, at a full quota one after another: twice as long is the floor, and what the line may
    add is a second per pod, no more."""
    full, roomy = tenants(mode), tenants(mode)
    full.set_quota({H200: 4})
    roomy.set_quota({H200: 5})
    timings = {}
    for t in (full, roomy):  # one after the other: the nodes have 7 H200
        t.plane.apply(app("serve", 4, H200, t, **{SHUTDOWN: "20s"}), namespace=t.ns)
        t.wait_settled(4, timeout=60)
        timings[t.ns] = rollout_seconds(t, "serve")
        t.wait_settled(4, timeout=60)
        t.check_agreement()
        t.plane.kubectl("delete", "-n", t.ns, "deployment/serve", "--wait=false")
        wait_for(f"the pods of {t.ns} to go", lambda t=t: not t.pods(), timeout=60)  # type: ignore[misc]
    at_full, with_room = timings[full.ns], timings[roomy.ns]
    print(
        f"{mode} mode: rollout of 4 pods with a 20 s shutdown: {at_full:.1f} s at a full quota,"
        f" {with_room:.1f} s with room"
    )
    assert at_full <= 2 * with_room + 4 * STEP_SLACK, (at_full, with_room)


def listed_line(t: Tenant) -> list[str]:
    """The tenant's line as ``kubectl cardquota waiting -n NS`` lists it: the Deployments' names
    (of the waiting ReplicaSets, or of the waiting pods)."""
    plugin = Path(sys.executable).parent / "kubectl-cardquota"
    args = [str(plugin), "waiting", "--kubeconfig", str(t.plane.kubeconfig), "-n", t.ns, "-o", "json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    entries = json.loads(done.stdout).get(t.queue, [])
    suffixes = 1 if t.mode == "deny" else 2  # web-<template hash>, web-<template hash>-<random>
    return [entry["workload"].split("/")[1].rsplit("-", suffixes)[0] for entry in entries]


def waits(t: Tenant, name: str) -> bool:
    """Deny mode: ``name``'s controller was refused; wait mode: its pod is held under our gate."""
    return refused(t, name) if t.mode == "deny" else any(gated(p) for p in pods_of(t, name))


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


@pytest.mark.parametrize("mode", ["deny", "wait"])
def test_waiters_are_served_by_priority_then_arrival_and_a_scale_up_does_not_overtake_them(
    tenants: Callable[..., Tenant], mode: str
) -> None:
    t = tenants(mode)
    t.set_quota({H200: 3})
    high = f"cardquota-e2e-high-{t.ns}"
    t.plane.apply(priority_class(high, 1000))
    try:
        t.plane.apply(app("hog", 3, H200, t), namespace=t.ns)
        t.wait_settled(3, timeout=60)
        for name, priority in (("first", ""), ("second", ""), ("urgent", high)):
            workload = app(name, 1, H200, t)
            if priority:
                workload["spec"]["template"]["spec"]["priorityClassName"] = priority
            t.plane.apply(workload, namespace=t.ns)
            wait_for(f"{name} to wait", lambda n=name: waits(t, n), timeout=30)  # type: ignore[misc]
            time.sleep(1.1)  # arrivals a second apart
        names = ("first", "second", "urgent")
        # A fresh process sees the line only through the marks on the ReplicaSets: as a new leader would.
        wait_for(
            "kubectl cardquota waiting to list the line",
            lambda: listed_line(t) == ["urgent", "first", "second"],
            timeout=15,
        )
        order: list[str] = []

        def served(name: str) -> bool:
            return any(not gated(p) for p in pods_of(t, name))

        for hogs in (2, 1, 0):  # one card frees at a time
            t.plane.kubectl("scale", "-n", t.ns, "deployment/hog", f"--replicas={hogs}")
            want = len(order) + 1
            wait_for(
                "the next in line to get its pod",
                lambda want=want: len([x for x in names if served(x)]) == want,  # type: ignore[misc]
                timeout=15,
                every=0.1,
            )
            order += [x for x in names if served(x) and x not in order]
            if hogs == 1:  # "second" still waits: a scale-up of "urgent" may not take what it waits for
                denied = t.plane.kubectl(
                    "scale", "-n", t.ns, "deployment/urgent", "--replicas=2", check=False
                )
                assert denied.returncode != 0
                first = "replicaset" if mode == "deny" else "pod"
                ahead = rf"1 waits ahead of it in the queue's line \(first: {first} \S+/second-"
                assert re.search(ahead, denied.stderr), denied.stderr
        assert order == ["urgent", "first", "second"]
        t.wait_settled(3, timeout=30)
        t.check_agreement()
    finally:
        t.plane.kubectl("delete", "priorityclass", high, check=False)

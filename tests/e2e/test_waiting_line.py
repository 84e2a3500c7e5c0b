"""The waiting line (SPEC §5c, decisions.md §23) in front of the REAL Volcano controller-manager and
capacity-card scheduler: a workload refused for minutes gets its pods within 2 s of its cards
freeing, however they free; a rolling update at a full quota completes; waiters are served by
priority, then arrival; a scale-up does not overtake them. Skipped, with the reason, when the
scheduler's source is not beside the repository."""

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.agreement import H200, H800, R4090, Tenant, card_template
from tests.e2e.cluster import SHUTDOWN, ControlPlane, wait_for
from tests.e2e.conftest import serving_webhook
from tests.e2e.objects import deployment_of
from tests.edges.serving import Process

# How long the workloads are refused before their cards free: long enough for the ReplicaSet
# controller's back-off to pass two minutes (it doubles from 5 ms per refusal, up to 1000 s).
REFUSED_SECONDS = float(os.environ.get("CARDQUOTA_E2E_REFUSED_SECONDS", "180"))
WITHIN = 2.0  # seconds from the cards freeing to the missing pods existing


@pytest.fixture(scope="module")
def front(volcano: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    with serving_webhook(volcano, tmp_path_factory.mktemp("webhook")) as process:
        yield process


@pytest.fixture
def tenants(volcano: ControlPlane, front: Process) -> Iterator[Callable[[], Tenant]]:
    made: list[Tenant] = []

    def make() -> Tenant:
        made.append(Tenant(volcano))
        return made[-1]

    yield make
    for tenant in made:
        tenant.delete()


def app(name: str, replicas: int, card: str, t: Tenant, **annotations: str) -> dict[str, Any]:
    template = card_template(card, t.queue)
    template["metadata"]["annotations"].update(annotations)
    return deployment_of(name, replicas, template)


def pods_of(t: Tenant, name: str) -> list[dict[str, Any]]:
    return [p for p in t.pods() if p["metadata"]["name"].startswith(f"{name}-")]


def refused(t: Tenant, name: str) -> bool:
    return any(name in message and t.queue in message for message in t.denials())


def seconds_until(check: Callable[[], bool], timeout: float = 30.0) -> float:
    """Seconds from now until ``check`` holds (polled as fast as kubectl answers)."""
    started = time.monotonic()
    wait_for("the waiting pods", check, timeout=timeout, every=0.05)
    return time.monotonic() - started


class Case:
    """A queue of one card, full: a hog holds it, and the Deployment ``web`` is refused."""

    def __init__(self, t: Tenant, card: str, hog: Callable[[Tenant], dict[str, Any]], web: int = 1) -> None:
        self.t, self.web = t, web
        t.set_quota({card: 1})
        t.plane.apply(hog(t), namespace=t.ns)
        wait_for(f"the hog of {t.ns} to be bound", lambda: t.settled(1), timeout=60)
        t.plane.apply(app("web", web, card, t), namespace=t.ns)
        wait_for(f"web of {t.ns} to be refused", lambda: refused(t, "web"), timeout=30)

    def has_its_pods(self) -> bool:
        return len(pods_of(self.t, "web")) == self.web


def hog_pod(card: str) -> Callable[[Tenant], dict[str, Any]]:
    def make(t: Tenant) -> dict[str, Any]:
        template = card_template(card, t.queue)
        template["spec"]["restartPolicy"] = "Never"
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hog", **template["metadata"]},
            **template,
        }

    return make


def hog_deployment(card: str) -> Callable[[Tenant], dict[str, Any]]:
    return lambda t: app("hog", 1, card, t)


def test_a_workload_refused_for_minutes_gets_its_pods_within_2s_of_its_cards_freeing(
    tenants: Callable[[], Tenant],
) -> None:
    raised = Case(tenants(), H200, hog_deployment(H200), web=2)
    deleted = Case(tenants(), H800, hog_deployment(H800))
    finished = Case(tenants(), R4090, hog_pod(R4090))
    time.sleep(REFUSED_SECONDS)  # the ReplicaSets' back-off grows meanwhile
    for case in (raised, deleted, finished):
        assert not case.has_its_pods(), f"web of {case.t.ns} got its pods while its cards were taken"

    raised.t.set_quota({H200: 3})
    took = {"quota raised": seconds_until(raised.has_its_pods)}
    deleted.t.plane.kubectl("delete", "-n", deleted.t.ns, "deployment/hog", "--wait=false")
    took["a pod of another workload deleted"] = seconds_until(deleted.has_its_pods)
    done = json.dumps({"status": {"phase": "Succeeded"}})
    finished.t.plane.kubectl(
        "patch", "-n", finished.t.ns, "pod/hog", "--subresource=status", "--type=merge", "-p", done
    )
    took["a pod finished"] = seconds_until(finished.has_its_pods)
    print(f"refused for {REFUSED_SECONDS:.0f} s, then its pods existed after: {took}")
    assert all(seconds <= WITHIN for seconds in took.values()), took
    for case in (raised, deleted, finished):
        case.t.wait_settled(case.web, timeout=30)
        case.t.check_agreement()
        called = [
            e
            for e in case.t.plane.get("events", namespace=case.t.ns)["items"]
            if e["reason"] == "CardQuotaCalled"
        ]
        assert called and called[0]["involvedObject"]["kind"] == "ReplicaSet"


def rollout_seconds(t: Tenant, name: str) -> float:
    """Change the Deployment's template and time ``kubectl rollout status`` to its end."""
    patch = {"spec": {"template": {"metadata": {"annotations": {"example.com/revision": "2"}}}}}
    started = time.monotonic()
    t.plane.kubectl("patch", "-n", t.ns, f"deployment/{name}", "--type=merge", "-p", json.dumps(patch))
    t.plane.kubectl("rollout", "status", "-n", t.ns, f"deployment/{name}", "--timeout=300s")
    return time.monotonic() - started


def test_a_rolling_update_at_a_full_quota_completes_within_twice_one_with_room(
    tenants: Callable[[], Tenant],
) -> None:
    full, roomy = tenants(), tenants()
    full.set_quota({H200: 4})
    roomy.set_quota({H800: 5})
    for t, card in ((full, H200), (roomy, H800)):
        t.plane.apply(app("serve", 4, card, t, **{SHUTDOWN: "20s"}), namespace=t.ns)
        t.wait_settled(4, timeout=60)
    at_full = rollout_seconds(full, "serve")
    with_room = rollout_seconds(roomy, "serve")
    print(
        f"rollout of 4 pods with a 20 s shutdown: {at_full:.1f} s at a full quota, {with_room:.1f} s with room"
    )
    assert at_full <= 2 * with_room, (at_full, with_room)
    full.wait_settled(4, timeout=60)
    full.check_agreement()


def priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def test_waiters_are_served_by_priority_then_arrival_and_a_scale_up_does_not_overtake_them(
    tenants: Callable[[], Tenant],
) -> None:
    t = tenants()
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
            wait_for(f"{name} to be refused", lambda n=name: refused(t, n), timeout=30)  # type: ignore[misc]
            time.sleep(1.1)  # arrivals a second apart
        names = ("first", "second", "urgent")
        order: list[str] = []
        for hogs in (2, 1, 0):  # one card frees at a time
            t.plane.kubectl("scale", "-n", t.ns, "deployment/hog", f"--replicas={hogs}")
            want = len(order) + 1
            wait_for(
                "the next in line to get its pod",
                lambda want=want: len([x for x in names if pods_of(t, x)]) == want,  # type: ignore[misc]
                timeout=15,
                every=0.1,
            )
            order += [x for x in names if pods_of(t, x) and x not in order]
            if hogs == 1:  # "second" still waits: a scale-up of "urgent" may not take what it waits for
                denied = t.plane.kubectl(
                    "scale", "-n", t.ns, "deployment/urgent", "--replicas=2", check=False
                )
                assert denied.returncode != 0
                ahead = r"1 waits ahead of it in the queue's line \(first: replicaset \S+/second-"
                assert re.search(ahead, denied.stderr), denied.stderr
        assert order == ["urgent", "first", "second"]
        t.wait_settled(3, timeout=30)
        t.check_agreement()
    finally:
        t.plane.kubectl("delete", "priorityclass", high, check=False)

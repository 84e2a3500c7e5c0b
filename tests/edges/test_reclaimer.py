"""The serving replica's tidal reclaim against a scripted API: a whole gang evicted (dry run first,
then each pod), Events on both sides, nothing evicted twice, a gang a budget protects left whole,
a dry run that only reports, and the enqueue gate holding the evicted PodGroup while its cards'
new pods wait."""

import asyncio
import json
import logging
import time
from collections.abc import Generator
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import H200, R4090, cluster, node, pod, podgroup, request
from tests.core.test_tidal import NODES, RS, gang, inference, job_ref, serve_queue, train_queue
from webhook.cluster import cache
from webhook.cluster import reclaimer as reclaimer_module
from webhook.cluster.reclaimer import InProcess, Reclaimer
from webhook.core.decide import admission, reclaim_holds, report, tidal
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.steps import done
from webhook.core.model.verdicts import Allowed, Denied
from webhook.serve.metrics import Metrics


class Api:
    """Records evictions (dry runs apart) and Events; ``protect``: pods a budget keeps."""

    def __init__(
        self, protect: frozenset[str] = frozenset(), budgets: list[dict[str, Any]] | None = None
    ) -> None:
        self.protect = protect
        self.budgets = budgets or []  # the namespace's PodDisruptionBudgets
        self.gone: set[str] = set()  # pods (namespace/name) the API server no longer has
        self.read: list[str] = []  # pods read (namespace/name)
        self.selector: dict[str, str] = {}  # the inference pods' nodeSelector
        self.reason = "Unschedulable"  # why the inference pods are not scheduled
        self.elsewhere: set[str] = set()  # inference pods (names) that wait for something else
        self.tolerations: list[dict[str, str]] = []  # the inference pods' tolerations
        self.dry: list[str] = []
        self.evicted: list[str] = []
        self.events: list[tuple[str, str, str]] = []  # (involved kind/name, reason, message)
        self.marks: list[tuple[str, str | None]] = []  # (podgroup, its reclaim mark)
        self.notices: list[tuple[str, str | None]] = []  # (pod namespace/name, its eviction notice)
        self.grace: float | None = None  # the training pods' terminationGracePeriodSeconds

    async def annotate(
        self, kind: Any, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> bool:
        if kind.plural == "pods":
            self.notices.append((f"{namespace}/{name}", annotations[keys.EVICTING]))
        else:
            self.marks.append((f"{kind.plural}/{namespace}/{name}", annotations[keys.RECLAIMED]))
        return True

    async def get(self, kind: Any, namespace: str, name: str) -> dict[str, Any] | None:
        """A training pod running and ready, labelled with its job's name (``tj-0`` of job ``tj``);
        an inference pod (``web-*``) Pending, the scheduler having found no node for it
        (``selector``: their nodeSelector)."""
        self.read.append(f"{namespace}/{name}")
        if f"{namespace}/{name}" in self.gone:
            return None
        if name.startswith("web"):
            return {
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"nodeSelector": self.selector, "tolerations": self.tolerations},
                "status": {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "SchedulingGated" if name in self.elsewhere else self.reason,
                        }
                    ],
                },
            }
        return {
            "metadata": {"name": name, "namespace": namespace, "labels": {"job": name.rsplit("-", 1)[0]}},
            "spec": {} if self.grace is None else {"terminationGracePeriodSeconds": self.grace},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }

    async def list_in(self, kind: Any, namespace: str) -> list[dict[str, Any]]:
        return [b for b in self.budgets if b["metadata"]["namespace"] == namespace]

    async def evict(self, namespace: str, name: str, dry_run: bool = False) -> str:
        if name in self.protect:
            return "Cannot evict pod as it would violate the pod's disruption budget."
        (self.dry if dry_run else self.evicted).append(f"{namespace}/{name}")
        return ""

    async def record_event(
        self, namespace: str, involved: dict[str, str], reason: str, message: str, kind: str = "Normal"
    ) -> None:
        self.events.append((f"{involved['kind']}/{involved['name']}", reason, message))


def seed_002(*extra: dict[str, Any]) -> ClusterState:
    return cluster(*NODES, train_queue(), serve_queue(), *gang("tj", ["n1", "n1", "n2", "n2"]), *extra)


def run(reclaimer: Reclaimer) -> None:
    asyncio.run(reclaimer.once())


TJ = ["ns/tj-0", "ns/tj-1", "ns/tj-2", "ns/tj-3"]


def test_a_whole_gang_is_evicted_once_told_on_both_sides_and_held_from_enqueue() -> None:
    state, api, clock = seed_002(*inference(2)), Api(), [100.0]
    reclaimer = Reclaimer(state, api, lambda: True, after=1.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(reclaimer)
    assert api.evicted == []  # first seen now: not yet waited long enough
    clock[0] = 101.5
    run(reclaimer)
    assert api.dry == TJ and api.evicted == TJ
    reasons = {(who, reason) for who, reason, _ in api.events}
    assert reasons == {
        ("PodGroup/tj", "CardQuotaReclaimed"),
        ("Job/tj", "CardQuotaReclaimed"),
        ("Pod/web-0", "CardQuotaReclaiming"),
        ("Pod/web-1", "CardQuotaReclaiming"),
    }
    told = dict(((who, reason), message) for who, reason, message in api.events)
    assert told[("Job/tj", "CardQuotaReclaimed")] == (
        f'4 {R4090} on n1, n2 taken back for queue "serve" (priority 80000), whose pods ns/web-0, ns/web-1'
        " wait for them: its 4 pods are evicted whole (killed at 1970-01-01T00:02:11.500Z if still"
        ' running); it is enqueued again once those are bound, as queue "train"\'s quota allows'
    )
    # Each pod was told before its eviction: when it goes, when it is killed (its grace, 30 s unset).
    assert [pod for pod, _ in api.notices] == TJ
    assert json.loads(api.notices[0][1] or "") == {
        "evict": "1970-01-01T00:01:41.500Z",
        "deadline": "1970-01-01T00:02:11.500Z",
        "for": "serve",
        "card": R4090,
        "cards": 4,
    }
    assert told[("Pod/web-0", "CardQuotaReclaiming")] == (
        f'takes back 4 {R4090} from podgroup ns/tj (queue "train", priority 20000): its 4 pods are evicted'
    )
    # The next pass, the cache still showing the pods running: nothing evicted again.
    clock[0] = 102.0
    told = list(api.events)
    run(reclaimer)
    assert api.evicted == TJ and api.dry == TJ and api.events == told
    # The evicted group's move back to Inqueue is refused while web waits unbound.
    enqueue = enqueue_of_tj()
    decision = admission.validate(state, enqueue, 103.0)
    assert isinstance(decision, Denied)
    assert decision.message.startswith(
        f'podgroup ns/tj (volcano job ns/tj) gave 4 {R4090} back to queue "serve" (tidal reclaim): it stays'
        " Pending while the 2 pods they were taken for wait to be bound"
    )
    # The hold is written on the PodGroup: a new leader, whose cache reads it, holds it as well, and
    # kubectl cardquota status lists it.
    [(where, mark)] = api.marks
    assert where == "podgroups/ns/tj" and mark is not None
    assert json.loads(mark) == {
        "card": R4090,
        "cards": 4000,
        "queue": "serve",
        "pods": ["uid-ns-web-0", "uid-ns-web-1"],
        "until": "1970-01-01T00:06:41.500Z",
        "evict": "1970-01-01T00:01:41.500Z",
        "deadline": "1970-01-01T00:02:11.500Z",
    }
    group = next(o for o in gang("tj", ["n1", "n1", "n2", "n2"]) if o["kind"] == "PodGroup")
    group["metadata"]["annotations"] = {keys.RECLAIMED: mark}
    successor = seed_002(*inference(2))
    ingest.upsert(successor, group)
    assert isinstance(admission.validate(successor, enqueue_of_tj(), 103.0), Denied)
    status = report.cluster_status(successor, 103.0)
    assert status["reclaims"] == [
        {
            "podgroup": "ns/tj",
            "card": R4090,
            "cards": 4,
            "for_queue": "serve",
            "waiting_pods": 2,
            "held_until": "1970-01-01T00:06:41.500Z",
        }
    ]
    assert "ns/tj" in report.status_table(status)
    # Its Volcano Job's controller re-creating a pod meanwhile is refused too.
    again = gang("tj", ["n1"])[1]
    again["metadata"].update(name="tj-new", uid="uid-tj-new")
    again["spec"].pop("nodeName")
    recreate = admission.validate(state, request(again), 103.0)
    assert isinstance(recreate, Denied)
    assert recreate.message == (
        f'pod ns/tj-new of podgroup ns/tj gave 4 {R4090} back to queue "serve" (tidal reclaim): its pods'
        " are not created again while the 2 pods they were taken for wait to be bound (298 s at most)"
    )
    # Once they are bound, the hold goes and the group is judged by its quota alone.
    for i, where in enumerate(["n1", "n2"]):
        web = json.loads(json.dumps(inference(2)[1 + i]))
        web["spec"]["nodeName"] = where
        ingest.upsert(state, web)
    assert isinstance(admission.validate(state, enqueue, 104.0), Allowed)
    assert isinstance(admission.validate(state, request(again), 104.0), Allowed)
    # The hold has a term of its own: past it, the group is judged by its quota even with web waiting.
    waiting = seed_002(*inference(2))
    ingest.upsert(waiting, group)
    assert isinstance(admission.validate(waiting, enqueue_of_tj(), 401.0), Denied)
    assert isinstance(admission.validate(waiting, enqueue_of_tj(), 401.5), Allowed)
    run(reclaimer)  # the next pass sees the hold over and removes the mark
    assert api.marks[-1] == ("podgroups/ns/tj", None)


def with_notice(notice: str) -> ClusterState:
    """Seed 002, web's 2 pods waiting, and the training queue's cardquota.volcano.sh/reclaim-notice."""
    train = train_queue()
    train["metadata"]["annotations"][keys.RECLAIM_NOTICE] = notice
    return cluster(*NODES, train, serve_queue(), *gang("tj", ["n1", "n1", "n2", "n2"]), *inference(2))


def test_a_gang_is_told_its_queues_notice_before_it_is_evicted_then_evicted_whole() -> None:
    """train's notice is 1 min: the pass that takes tj's cards writes each pod's notice (evicted at
    +60 s, killed at +60 s and its 45 s grace) and tells the gang, evicting nothing; the pass after
    the minute evicts it whole and tells both sides, as without a notice."""
    state, api, clock = with_notice("1m"), Api(), [100.0]
    api.grace = 45
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(reclaimer)
    assert api.dry == TJ and api.evicted == []
    assert [pod for pod, _ in api.notices] == TJ
    assert json.loads(api.notices[0][1] or "")["evict"] == "1970-01-01T00:02:40.000Z"
    assert json.loads(api.notices[0][1] or "")["deadline"] == "1970-01-01T00:03:25.000Z"
    [(_, mark)] = api.marks
    assert json.loads(mark or "")["evict"] == "1970-01-01T00:02:40.000Z"
    told = {(who, reason): message for who, reason, message in api.events}
    assert set(told) == {("PodGroup/tj", "CardQuotaReclaimNotice"), ("Job/tj", "CardQuotaReclaimNotice")}
    assert told[("PodGroup/tj", "CardQuotaReclaimNotice")] == (
        f'4 {R4090} are taken back for queue "serve", whose pods ns/web-0, ns/web-1 wait for them: its 4'
        ' pods are evicted at 1970-01-01T00:02:40.000Z (in 60 s, queue "train"\'s'
        " cardquota.volcano.sh/reclaim-notice), killed at 1970-01-01T00:03:25.000Z if still running"
    )
    # Meanwhile its cards are leaving: no pass takes another gang for the same pods, none evicts it.
    for clock[0] in (130.0, 159.9):
        run(reclaimer)
    assert api.evicted == [] and len(api.dry) == 4
    clock[0] = 160.0
    run(reclaimer)
    assert api.evicted == TJ
    assert ("PodGroup/tj", "CardQuotaReclaimed") in {(who, reason) for who, reason, _ in api.events}
    # Held back from enqueue as any reclaimed gang, while web waits.
    assert isinstance(admission.validate(state, enqueue_of_tj(), 161.0), Denied)


def test_a_gang_whose_cards_are_no_longer_wanted_before_its_notice_ran_out_keeps_running() -> None:
    """web is bound on cards freed otherwise while tj's notice runs: tj is not evicted, its pods'
    notices are removed, and it is told."""
    state, api, clock = with_notice("1m"), Api(), [100.0]
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(reclaimer)
    assert api.evicted == [] and len(api.notices) == 4
    for i in range(2):
        ingest.upsert(
            state, pod(f"web-{i}", R4090, queue_name="serve", group="web", node_name="n1", owner=RS)
        )
    clock[0] = 110.0
    run(reclaimer)
    clock[0] = 170.0
    run(reclaimer)
    assert api.evicted == []
    assert api.notices[4:] == [(p, None) for p in TJ]
    assert api.marks[-1] == ("podgroups/ns/tj", None)
    assert any(
        reason == "CardQuotaReclaimNotice" and message.startswith("its eviction is called off")
        for _, reason, message in api.events
    ), api.events


def test_a_new_leader_waits_for_the_notice_of_a_gang_its_predecessor_told() -> None:
    state, api, clock = with_notice("1m"), Api(), [100.0]
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: clock[0]))  # type: ignore[arg-type]
    [(_, mark)] = api.marks
    successor = with_notice("1m")
    group = next(o for o in gang("tj", ["n1", "n1", "n2", "n2"]) if o["kind"] == "PodGroup")
    group["metadata"]["annotations"] = {keys.RECLAIMED: mark}
    ingest.upsert(successor, group)
    fresh = Api()
    leader = Reclaimer(successor, fresh, lambda: True, after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    for clock[0] in (101.0, 159.0):
        run(leader)
    assert fresh.evicted == [] and fresh.dry == [], "its notice runs still; nothing else is taken"
    clock[0] = 160.0
    run(leader)
    assert fresh.evicted == TJ


def enqueue_of_tj() -> Any:
    return request(
        _podgroup("tj", "Inqueue"),
        resource="podgroups",
        operation="UPDATE",
        old=_podgroup("tj", "Pending"),
        group="scheduling.volcano.sh",
    )


def _podgroup(name: str, phase: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-pg-{name}",
            "annotations": {"volcano.sh/card.request": json.dumps({R4090: 4})},
            "ownerReferences": [job_ref(name)],
        },
        "spec": {"queue": "train", "minMember": 4},
        "status": {"phase": phase},
    }


def test_a_gang_a_budget_protects_is_left_whole_and_reported() -> None:
    state, api = seed_002(*inference(1)), Api(protect=frozenset({"tj-2"}))
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0)  # type: ignore[arg-type]
    run(reclaimer)
    assert api.evicted == []
    [(_, reason, message)] = [e for e in api.events if e[0] == "Job/tj"]
    assert reason == "CardQuotaNotReclaimed"
    assert "evicting pod ns/tj-2 is refused: Cannot evict pod as it would violate" in message
    assert "none of its pods evicted" in message
    run(reclaimer)  # the next pass leaves it out, and tells the waiting pod why nothing is taken
    assert api.evicted == []
    assert ("Pod/web-0", "CardQuotaNotReclaimed") in {(who, reason) for who, reason, _ in api.events}
    told = next(m for who, reason, m in api.events if who == "Pod/web-0")
    assert (
        told
        == f"no card of {R4090} can be taken back for it: 1 gang: a PodDisruptionBudget forbids evicting it now"
    )


def test_a_dry_run_only_reports_and_nothing_happens_while_not_serving() -> None:
    dry = serve_queue(annotations={"cardquota.volcano.sh/reclaim": "dry-run"})
    state = cluster(*NODES, train_queue(), dry, *gang("tj", ["n1", "n1", "n2", "n2"]), *inference(1))
    api, clock = Api(), [100.0]
    dry_run = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    for at in (100.0, 101.0, 159.0):  # told once a minute, not every pass
        clock[0] = at
        run(dry_run)
    assert api.dry == [] and api.evicted == [] and api.marks == [] and not state.reclaims
    assert [e[1:] for e in api.events] == [
        ("CardQuotaReclaiming", f"dry run: would take back podgroup ns/tj (4 {R4090})")
    ]
    clock[0] = 160.0
    run(dry_run)
    assert len(api.events) == 2
    idle, quiet = seed_002(*inference(1)), Api()
    reclaimer = Reclaimer(idle, quiet, lambda: False, interval=0.01, after=0.0)  # type: ignore[arg-type]

    async def briefly() -> None:
        task = asyncio.create_task(reclaimer.run())
        await asyncio.sleep(0.05)
        task.cancel()

    asyncio.run(briefly())
    assert quiet.evicted == [] and quiet.events == []


def test_a_pass_that_fails_is_logged_and_the_next_one_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state, api = seed_002(*inference(1)), Api()
    calls: list[int] = []

    def problems(*args: Any, **kwargs: Any) -> Generator[None, None, list[Any]]:
        calls.append(1)
        yield
        if len(calls) == 1:
            raise KeyError("an object in a shape nobody expected")
        return []

    monkeypatch.setattr(tidal, "problems", problems)
    reclaimer = Reclaimer(state, api, lambda: True, interval=0.01)  # type: ignore[arg-type]

    async def briefly() -> None:
        task = asyncio.create_task(reclaimer.run())
        for _ in range(500):  # up to 5 s on a loaded machine
            await asyncio.sleep(0.01)
            if len(calls) >= 2 or task.done():
                break
        assert not task.done(), "the loop stopped"
        task.cancel()

    with caplog.at_level(logging.ERROR):
        asyncio.run(briefly())
    assert len(calls) >= 2
    assert "tidal reclaim: a pass failed" in caplog.text


def test_a_replica_that_stops_serving_mid_gang_evicts_no_more_and_a_new_leader_leaves_the_marked_gang() -> (
    None
):
    """Two replicas never evict at once: the one that loses the Lease between two pods of a gang
    stops there. The gang's mark, written before its first eviction, tells the new leader it is
    leaving: the new leader plans nothing more from it, and evicts nobody for the same pods."""
    state, api, clock = seed_002(*inference(2)), Api(), [100.0]
    serving = [True]
    evicted_before = api.evict

    async def evict(namespace: str, name: str, dry_run: bool = False) -> str:
        answer = await evicted_before(namespace, name, dry_run)
        if not dry_run:
            serving[0] = False  # the Lease is lost right after the first real eviction
        return answer

    api.evict = evict  # type: ignore[method-assign]
    reclaimer = Reclaimer(state, api, lambda: serving[0], after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(reclaimer)
    assert api.evicted == TJ[:1]
    [(where, mark)] = api.marks
    assert where == "podgroups/ns/tj" and mark is not None
    # The new leader's cache shows the mark on the PodGroup, and three pods of it still running.
    successor = seed_002(*inference(2))
    group = next(o for o in gang("tj", ["n1", "n1", "n2", "n2"]) if o["kind"] == "PodGroup")
    group["metadata"]["annotations"] = {keys.RECLAIMED: mark}
    ingest.upsert(successor, group)
    successor.delete_pod("uid-ns-tj-0")  # the evicted pod is gone from its cache
    fresh = Api()
    leader = Reclaimer(successor, fresh, lambda: True, after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(leader)  # it adopts the reclaim its mark tells of: plans nothing new from it
    clock[0] += 0.5
    run(leader)  # and finishes it: the three pods still running are evicted, nothing else
    assert fresh.dry == [] and fresh.evicted == TJ[1:]


def test_a_new_leader_finishes_the_gang_it_adopted_after_its_beneficiaries_are_bound_and_no_pod_made_since() -> (
    None
):
    """A gang whose eviction an earlier leader began is finished by the new leader even once the
    pods it was taken for are bound (the cards the first pods freed were enough): never left half.
    Only the pods live when it adopted the gang are its: one made since under the same name is not."""
    state, api, clock = seed_002(*inference(2)), Api(), [100.0]
    serving = [True]
    evicted_before = api.evict

    async def evict(namespace: str, name: str, dry_run: bool = False) -> str:
        answer = await evicted_before(namespace, name, dry_run)
        if not dry_run and name == "tj-1":
            serving[0] = False  # the Lease is lost after the second real eviction
        return answer

    api.evict = evict  # type: ignore[method-assign]
    reclaimer = Reclaimer(state, api, lambda: serving[0], after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(reclaimer)
    assert api.evicted == TJ[:2]
    [(_, mark)] = api.marks
    successor = seed_002(*inference(2))
    group = next(o for o in gang("tj", ["n1", "n1", "n2", "n2"]) if o["kind"] == "PodGroup")
    group["metadata"]["annotations"] = {keys.RECLAIMED: mark}
    ingest.upsert(successor, group)
    for uid in ("uid-ns-tj-0", "uid-ns-tj-1"):
        successor.delete_pod(uid)
    fresh = Api(protect=frozenset({"tj-2", "tj-3"}))  # refused for now (a budget): tried again later
    leader = Reclaimer(successor, fresh, lambda: True, after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(leader)  # adopts the gang
    run(leader)  # and tries its pods
    assert fresh.evicted == []
    fresh.protect = frozenset()
    for i in range(2):  # the cards tj-0 and tj-1 freed were enough: web is bound
        ingest.upsert(successor, pod(f"web-{i}", R4090, queue_name="serve", group="web", node_name="n1"))
    assert reclaim_holds.holding(successor, "ns/tj", clock[0]) is None
    successor.delete_pod("uid-ns-tj-3")  # tj-3 went, and one of that name was made since
    remade = pod("tj-3", R4090, node_name="n2", phase="Running", queue_name="train", group="tj")
    remade["metadata"]["uid"] = "uid-ns-tj-3-again"
    ingest.upsert(successor, remade)
    clock[0] += reclaimer_module.RETRY_EVERY
    run(leader)
    assert fresh.evicted == ["ns/tj-2"], (
        "the adopted gang finished, never left half; a pod made since not of it"
    )


def budget(name: str, selector: Any, allowed: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "generation": 1},
        "spec": {"selector": selector, **spec},
        "status": {"disruptionsAllowed": allowed, "observedGeneration": 1},
    }


def test_a_budget_that_allows_fewer_disruptions_than_the_gang_has_pods_keeps_it_whole() -> None:
    """A PodDisruptionBudget ``minAvailable: 3`` over the four pods allows one disruption: each
    pod's eviction alone (and each dry run) would pass, the second real one not. The gang is judged
    whole against it: not one pod evicted, and the Job is told which budget keeps it."""
    pdb = budget("train", {"matchLabels": {"job": "tj"}}, 1, minAvailable=3)
    state, api = seed_002(*inference(1)), Api(budgets=[pdb])
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert api.evicted == [] and api.marks == []
    [(_, reason, message)] = [e for e in api.events if e[0] == "Job/tj"]
    assert reason == "CardQuotaNotReclaimed"
    assert (
        "PodDisruptionBudget ns/train (minAvailable 3) allows 1 disruption now; the gang would take 4"
        in message
    )
    # The same budget allowing four: the gang goes, whole.
    roomy = budget("train", {"matchLabels": {"job": "tj"}}, 4, minAvailable=0)
    state, api = seed_002(*inference(1)), Api(budgets=[roomy])
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert api.evicted == TJ


def test_a_gang_a_budget_protected_is_left_out_for_a_minute_then_judged_again() -> None:
    """A budget refuses the gang at 100 s and allows four disruptions a moment later: for 60 s the
    passes leave the gang out (none of its pods read, nothing evicted, the waiting pod told a budget
    forbids it), and the first pass at 160 s judges it again and evicts it whole."""
    pdb = budget("train", {"matchLabels": {"job": "tj"}}, 1, minAvailable=3)
    state, api, clock = seed_002(*inference(1)), Api(budgets=[pdb]), [100.0]
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(reclaimer)
    assert api.evicted == [] and [e[1] for e in api.events if e[0] == "Job/tj"] == ["CardQuotaNotReclaimed"]
    pdb["status"]["disruptionsAllowed"] = 4
    for at in (100.5, 130.0, 159.9):
        clock[0] = at
        api.read.clear()
        run(reclaimer)
        assert api.evicted == [] and api.dry == [] and not set(api.read) & set(TJ), at
    assert blocked_message(api).endswith("1 gang: a PodDisruptionBudget forbids evicting it now")
    assert len([e for e in api.events if e[0] == "Job/tj"]) == 1  # judged once in the minute
    clock[0] = 160.0
    run(reclaimer)
    assert api.dry == TJ and api.evicted == TJ


def two_gangs() -> ClusterState:
    """Two 2-pod gangs on full nodes; three inference pods wait: both gangs are needed."""
    return cluster(
        *NODES,
        train_queue(),
        serve_queue(quota=3),
        *gang("ta", ["n1", "n1"], created="2026-11-26T00:00:00Z"),
        *gang("tb", ["n2", "n2"], created="2026-11-26T00:00:01Z"),
        *inference(3),
    )


def test_every_gang_of_a_plan_is_judged_before_any_is_touched() -> None:
    """Three pods need both gangs; a budget keeps the second whole. The first is not evicted
    either: without the second the pods would not all fit, and it would go for nothing."""
    pdb = budget("keep-tb", {"matchLabels": {"job": "tb"}}, 0, maxUnavailable=0)
    state, api = two_gangs(), Api(budgets=[pdb])
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert api.evicted == []
    state, api = two_gangs(), Api()
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert sorted(api.evicted) == ["ns/ta-0", "ns/ta-1", "ns/tb-0", "ns/tb-1"]


def test_one_budget_over_two_gangs_of_a_plan_counts_the_pods_of_both() -> None:
    """A budget over every pod of the namespace allows three disruptions; the plan needs both
    2-pod gangs. Each alone would pass, the fourth eviction not: neither is evicted, and the second
    judged is told why. Allowing four, both go."""
    pdb = budget("team", {}, 3, maxUnavailable=3)
    state, api = two_gangs(), Api(budgets=[pdb])
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert api.evicted == []
    [(_, _, message)] = [e for e in api.events if e[0] == "Job/ta"]
    assert (
        "PodDisruptionBudget ns/team (maxUnavailable 3) allows 3 disruptions now; the gang would take 2"
        " after the 2 of the gangs evicted before it (ns/ta-0, ns/ta-1)" in message
    )
    state, api = two_gangs(), Api(budgets=[budget("team", {}, 4, maxUnavailable=4)])
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert sorted(api.evicted) == ["ns/ta-0", "ns/ta-1", "ns/tb-0", "ns/tb-1"]


def test_a_begun_gang_is_finished_when_an_eviction_fails_and_the_pass_goes_on() -> None:
    """The API server fails the second eviction (a 5xx, a throttle): the pass is not ended, the
    pod is tried again a few seconds later, and the gang ends up evicted whole."""
    state, api, clock = seed_002(*inference(2)), Api(), [100.0]
    evict, failures = api.evict, [1]

    async def flaky(namespace: str, name: str, dry_run: bool = False) -> str:
        if not dry_run and name == "tj-1" and failures:
            failures.pop()
            raise cache.Unavailable("/api/v1/namespaces/ns/pods/tj-1/eviction: HTTP 503: busy")
        return await evict(namespace, name, dry_run)

    api.evict = flaky  # type: ignore[method-assign]
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(reclaimer)
    assert api.evicted == ["ns/tj-0", "ns/tj-2", "ns/tj-3"]
    clock[0] = 100.5  # before the retry is due: nothing
    run(reclaimer)
    assert api.evicted == ["ns/tj-0", "ns/tj-2", "ns/tj-3"]
    clock[0] = 102.5
    run(reclaimer)
    assert api.evicted == ["ns/tj-0", "ns/tj-2", "ns/tj-3", "ns/tj-1"]


def blocked_message(api: Api) -> str:
    return next(
        m for who, reason, m in api.events if who == "Pod/web-0" and reason == "CardQuotaNotReclaimed"
    )


def test_nobody_is_evicted_for_a_pod_that_waits_for_something_else_than_cards() -> None:
    """An inference pod whose nodeSelector no node of its model matches, or that waits for its
    scheduling gate (the scheduler has not looked at it), or that the scheduler has not called
    unschedulable yet, gets no eviction: the cards would free nothing it can use. The one that
    waits for a label is told why."""
    state, api = seed_002(*inference(1)), Api()
    api.selector = {"zone": "nowhere"}
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0)  # type: ignore[arg-type]
    run(reclaimer)
    run(reclaimer)
    assert api.dry == [] and api.evicted == []
    assert blocked_message(api) == (
        f"no card of {R4090} can be taken back for it: no node with {R4090} is one the pods may be"
        " scheduled on (cordoned, a taint they do not tolerate, or their nodeSelector or required node"
        " affinity)"
    )
    for reason in ("SchedulingGated", ""):
        state, api = seed_002(*inference(1)), Api()
        api.reason = reason
        run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
        assert api.evicted == [] and api.events == [], reason


def tainted(name: str, *taints: dict[str, str], cordoned: bool = False) -> dict[str, Any]:
    made = node(name, R4090, 2)
    made["spec"] = {"taints": list(taints), **({"unschedulable": True} if cordoned else {})}
    return made


def test_cards_on_a_cordoned_node_or_one_whose_taint_the_pod_does_not_tolerate_are_not_taken() -> None:
    """The training gang holds n1 (tainted) and n2 (cordoned, then not): only a gang on a node the
    pod may use is taken, and a toleration of the taint makes n1 one."""
    taint = {"key": "gpu", "value": "train", "effect": "NoSchedule"}

    def world(cordoned: bool) -> ClusterState:
        nodes = (tainted("n1", taint), tainted("n2", cordoned=cordoned), node("h", H200, 2))
        return cluster(
            *nodes,
            train_queue(),
            serve_queue(),
            *gang("t1", ["n1", "n1"]),
            *gang("t2", ["n2", "n2"], created="2026-11-26T00:00:01Z"),
            *inference(1),
        )

    state, api = world(cordoned=True), Api()
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert api.evicted == []
    assert "no node with NVIDIA-GeForce-RTX-4090 is one the pods may be scheduled on" in blocked_message(api)
    state, api = world(cordoned=False), Api()
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert api.evicted == ["ns/t2-0", "ns/t2-1"]  # the younger gang, on the node it may use
    state, api = world(cordoned=True), Api()
    api.tolerations = [{"key": "gpu", "operator": "Equal", "value": "train", "effect": "NoSchedule"}]
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert api.evicted == ["ns/t1-0", "ns/t1-1"]


def test_a_pod_the_reclaimed_cards_did_not_help_backs_off() -> None:
    """The hold ends with the pod still unbound: its reclaim helped nothing, and it takes no more
    cards for ten minutes, however long it waits."""
    state, api, clock = seed_002(*inference(2)), Api(), [100.0]
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: clock[0])  # type: ignore[arg-type]
    run(reclaimer)
    assert api.evicted == TJ
    for pod_key in TJ:  # the gang's pods are gone; another training gang takes the cards
        state.delete_pod(f"uid-{pod_key.replace('/', '-')}")
    for obj in gang("tj2", ["n1", "n1", "n2", "n2"]):
        ingest.upsert(state, obj)
    clock[0] = 100.0 + 301  # the hold is over, web-0 and web-1 never bound
    run(reclaimer)
    assert api.evicted == TJ
    clock[0] = 100.0 + 301 + 599
    run(reclaimer)
    assert api.evicted == TJ
    clock[0] = 100.0 + 301 + 601
    run(reclaimer)
    assert api.evicted[4:] == ["ns/tj2-0", "ns/tj2-1", "ns/tj2-2", "ns/tj2-3"]


def test_the_serving_replicas_solver_answers_in_a_process_of_its_own_as_in_this_one() -> None:
    """The questions go to a spawned process and come back as the plans solved here; a worker
    that died is reported as the API server's unavailability is (the pass is retried), and a new
    one is started for the next pass."""
    state = seed_002(*inference(2))
    asked = done(tidal.problems(state, lambda uid: True))

    async def twice() -> tuple[list[tidal.Plan], list[tidal.Plan]]:
        solver = InProcess()
        try:
            first = await solver(asked)
            pool = solver._pool
            assert pool is not None
            for worker in list(pool._processes.values()):  # the worker dies between two passes
                worker.kill()
                worker.join()
            with pytest.raises(cache.Unavailable, match="the reclaim solver's process died"):
                await solver(asked)
            again = await solver(asked)
            return first, again
        finally:
            solver.close()

    first, again = asyncio.run(twice())
    assert first == again == tidal.solve_all(asked)
    assert [g.key for p in first for g in p.victims or ()] == ["ns/tj"]


def test_a_queue_no_other_queue_can_give_to_costs_the_api_server_nothing() -> None:
    """Pods of the only queue (or of one no reclaimable lower-priority queue could give cards to)
    wait for cards as anywhere: none is read from the API server and nothing is solved for them."""
    state, api = cluster(*NODES, serve_queue(), *inference(2)), Api()
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0)  # type: ignore[arg-type]
    run(reclaimer)
    run(reclaimer)
    assert api.read == [] and api.events == [] and api.evicted == []
    state, api = seed_002(*inference(2)), Api()  # a training queue of lower priority: read
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert "ns/web-0" in api.read and "ns/web-1" in api.read


def test_a_pass_reads_the_first_pods_of_a_long_line_and_the_next_as_those_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass considers a window of each line (model and queue), first in line first (as the pods
    came, whatever their uids), not every unbound pod of the cluster: only those are read from the
    API server; one that goes, or that is read waiting for something else, makes room for the next."""
    monkeypatch.setattr(reclaimer_module, "WINDOW", 3)
    group = podgroup("web", "Inqueue", queue_name="serve", owner_ref=RS)
    waiting = [  # uids in the opposite order to the line's
        pod(f"web-{i}", R4090, queue_name="serve", group="web", owner=RS, uid=f"uid-{9 - i}")
        for i in range(6)
    ]
    state, api = seed_002(group, *waiting), Api()
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0)  # type: ignore[arg-type]
    run(reclaimer)
    run(reclaimer)
    assert sorted(set(r for r in api.read if "web" in r)) == ["ns/web-0", "ns/web-1", "ns/web-2"]
    ingest.remove(state, waiting[0])  # web-0 is deleted
    api.read.clear()
    run(reclaimer)
    assert [r for r in api.read if "web" in r] == ["ns/web-3"]
    state, api = seed_002(group, *waiting), Api()
    api.elsewhere = {"web-0"}  # gated: the scheduler has not looked at it
    reclaimer = Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0)  # type: ignore[arg-type]
    run(reclaimer)
    api.read.clear()
    run(reclaimer)
    assert [r for r in api.read if "web" in r] == ["ns/web-3"]


def test_the_lines_are_read_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two lines with more waiting pods than a pass reads: both are read in the first pass."""
    monkeypatch.setattr(reclaimer_module, "LEARN_PER_PASS", 2)
    h200 = [pod(f"web-h{i}", H200, queue_name="serve", group="web", owner=RS) for i in range(3)]
    state, api = seed_002(*gang("th", ["h"], card=H200), *inference(3), *h200), Api()
    run(Reclaimer(state, api, lambda: True, after=0.0, clock=lambda: 100.0))  # type: ignore[arg-type]
    assert sorted(api.read) == ["ns/web-0", "ns/web-h0"]


def test_the_reading_of_a_pass_gives_the_loop_back_between_its_slices() -> None:
    """A review that arrives while a pass reads its questions waits for one slice, not for the
    whole reading: the loop runs others between the slices; and steps far shorter than a slice are
    taken many to a slice (a turn of the loop after each would cost more than the step)."""

    def reading(steps: int, each: float) -> Generator[None, None, str]:
        for _ in range(steps):
            until = time.perf_counter() + each
            while time.perf_counter() < until:  # a step this long
                pass
            yield
        return "read"

    async def beside(steps: int, each: float) -> tuple[str, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        read = await reclaimer_module._in_slices(reading(steps, each))
        task.cancel()
        return read, ticks

    read, ticks = asyncio.run(beside(100, reclaimer_module.SLICE))  # steps as long as a slice
    assert read == "read" and ticks >= 50
    read, ticks = asyncio.run(beside(2000, reclaimer_module.SLICE / 50))  # 2,000 short steps
    assert read == "read" and 10 <= ticks < 1000


def _stuck(packed: Any) -> list[tidal.Plan]:
    """A solver that never answers in time (run in the worker)."""
    time.sleep(60)
    return []


def test_a_solver_that_does_not_answer_in_time_is_stopped_and_the_pass_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its search is budgeted; a worker that takes longer than the deadline is stuck: it is
    stopped (not left running), the pass ends as an unavailable API server's does, and the next
    pass starts a new one."""
    monkeypatch.setattr(reclaimer_module, "SOLVE_DEADLINE", 2.0)
    monkeypatch.setattr(reclaimer_module, "_solve_packed", _stuck)
    asked = done(tidal.problems(seed_002(*inference(2)), lambda uid: True))

    async def stuck() -> list[Any]:
        solver = InProcess()
        task = asyncio.create_task(solver(asked))
        while solver._pool is None or not solver._pool._processes:
            await asyncio.sleep(0.05)
        workers = list(solver._pool._processes.values())
        with pytest.raises(cache.Unavailable, match="the reclaim solver did not answer in 2 s"):
            await task
        assert solver._pool is None
        return workers

    for worker in asyncio.run(stuck()):
        worker.join(5)
        assert not worker.is_alive()


def test_reclaims_and_their_latency_are_counted_per_queue_taking_back_and_card() -> None:
    """serve takes 4 RTX-4090 back from tj: one eviction of 4 cards, and each of web's 2 pods
    bound on them is timed from its first wait, all under serve's queue and the model."""
    metrics = Metrics()
    state, api, clock = seed_002(*inference(2)), Api(), [100.0]
    reclaimer = Reclaimer(
        state,
        api,  # type: ignore[arg-type]
        lambda: True,
        after=0.0,
        clock=lambda: clock[0],
        on_reclaim=metrics.observe_reclaim,
        on_bound=metrics.observe_reclaim_bound,
    )
    run(reclaimer)
    assert api.evicted == TJ
    for i in range(2):
        ingest.upsert(
            state, pod(f"web-{i}", R4090, queue_name="serve", group="web", node_name="n1", owner=RS)
        )
    clock[0] = 103.0
    run(reclaimer)
    text = generate_latest(metrics.registry).decode()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("cardquota_reclaim")
    }
    serve = frozenset({("card", R4090), ("queue", "serve")})
    assert samples[("cardquota_reclaims_total", serve | {("outcome", "evicted")})] == 1.0
    assert samples[("cardquota_reclaimed_cards_total", serve)] == 4.0
    assert samples[("cardquota_reclaim_bound_seconds_count", serve)] == 2.0
    assert samples[("cardquota_reclaim_bound_seconds_sum", serve)] == 6.0

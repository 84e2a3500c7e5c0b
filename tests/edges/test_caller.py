"""The serving replica's line caller against a scripted API: a called workload gets our annotation
and an Event, its cards stay held; a write that fails gives them back; the waiting marks follow the
line; nothing is written while the replica does not serve."""

import asyncio
import copy
import json
from typing import Any

import pytest

from tests.builders import (
    H200,
    batch_job,
    cluster,
    deployment,
    node,
    owner,
    pod,
    podgroup,
    queue,
    replicaset,
    request,
    scale_request,
)
from webhook.cluster.cache import Kind, Unavailable
from webhook.cluster.caller import LineCaller
from webhook.core.decide import admission, calls
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.objects import pod_record, queue_record
from webhook.core.model.verdicts import Allowed, Denied


def mark(annotations: dict[str, str | None]) -> Any:
    """The borrowing mark of an annotate call, read."""
    text = annotations[keys.BORROWING]
    assert text is not None
    return json.loads(text)


class Api:
    """Records annotate and record_event calls; ``fail`` makes annotate raise, ``gone`` 404."""

    def __init__(self, fail: bool = False, gone: bool = False, objects: dict[str, Any] | None = None) -> None:
        self.fail, self.gone, self.objects = fail, gone, objects or {}
        self.annotated: list[tuple[str, str, str, dict[str, str | None]]] = []
        self.events: list[tuple[str, dict[str, str], str, str]] = []
        self.more: list[dict[str, Any]] = []  # each Event's count, since and annotations
        self.patched: list[tuple[str, str, list[Any]]] = []

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        return None if self.gone else self.objects.get(name)

    async def patch(self, kind: Kind, namespace: str, name: str, ops: list[Any]) -> bool:
        if self.fail:
            raise Unavailable("HTTP 422: the test operation failed")
        self.patched.append((kind.plural, name, list(ops)))
        return not self.gone

    async def annotate(
        self, kind: Kind, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> bool:
        if self.fail:
            raise Unavailable("connection refused")
        self.annotated.append((kind.plural, namespace, name, annotations))
        return not self.gone

    async def record_event(
        self,
        namespace: str,
        involved: dict[str, str],
        reason: str,
        message: str,
        kind: str = "Normal",
        **more: Any,
    ) -> None:
        self.events.append((namespace, involved, reason, message))
        self.more.append(more)


def waiting_state(free: bool = True) -> ClusterState:
    """A full queue of 1 H200 whose ReplicaSet web was refused at t=100, then (``free``) the
    card freed."""
    state = cluster(
        node("h200", H200),
        queue("q", f'{{"{H200}": 1}}'),
        pod("occupant", node_name="h200", phase="Running"),
        replicaset("web", 1, "web"),
    )
    refused = pod("web-0", owner=owner("ReplicaSet", "web", "uid-rs-web"))
    review = request(refused)
    decision = admission.validate(state, review, 100.0)
    admission.admit(state, review, decision, 100.0)
    assert isinstance(decision, Denied)
    if free:
        state.delete_pod("uid-ns-occupant")
    return state


def run(caller: LineCaller) -> None:
    asyncio.run(caller.once())


def test_a_called_workload_is_annotated_told_by_an_event_and_its_cards_held() -> None:
    state, api = waiting_state(), Api()
    run(LineCaller(state, api, lambda: True, clock=lambda: 130.0))  # type: ignore[arg-type]
    assert api.annotated[0] == (
        "replicasets",
        "ns",
        "web",
        {keys.CALLED: "1970-01-01T00:02:10.000Z"},
    )
    namespace, involved, reason, message = api.events[0]
    assert (namespace, involved["kind"], involved["name"], reason) == (
        "ns",
        "ReplicaSet",
        "web",
        "CardQuotaCalled",
    )
    assert message == (
        'cards freed in queue "q": 1 of its pods (1 NVIDIA-H200 each) may be created now, held for it 30 s;'
        " it waited 30s"
    )
    entry = state.ledger.get("scale:Deployment/ns/web") or state.ledger.get("scale:ReplicaSet/ns/web")
    assert entry is not None and entry.pods == 1


def test_a_called_batch_job_is_annotated_as_a_batch_v1_job() -> None:
    state = cluster(
        node("h200", H200),
        queue("q", f'{{"{H200}": 1}}'),
        pod("occupant", node_name="h200", phase="Running"),
        batch_job("train", 1, completions=1),
    )
    refused = request(pod("train-0", owner=owner("Job", "train", "uid-batch-train", api="batch/v1")))
    admission.admit(state, refused, admission.validate(state, refused, 100.0), 100.0)
    state.delete_pod("uid-ns-occupant")
    api = Api()
    run(LineCaller(state, api, lambda: True, clock=lambda: 101.0))  # type: ignore[arg-type]
    assert api.annotated[0] == ("jobs", "ns", "train", {keys.CALLED: "1970-01-01T00:01:41.000Z"})
    [(namespace, involved, _, _)] = [e for e in api.events if e[2] == "CardQuotaCalled"]
    assert namespace == "ns" and (involved["apiVersion"], involved["kind"], involved["name"]) == (
        "batch/v1",
        "Job",
        "train",
    )


def test_a_podgroup_refused_at_enqueue_is_told_on_it_and_its_job_once_a_minute() -> None:
    job = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")
    group = podgroup("train", "Pending", f'{{"{H200}": 2}}', owner_ref=job, minMember=2)
    state = cluster(
        node("h200", H200), queue("q", f'{{"{H200}": 2}}'), pod("occupant", node_name="h200"), group
    )
    new = copy.deepcopy(group)
    new["status"]["phase"] = "Inqueue"
    review = request(new, resource="podgroups", operation="UPDATE", old=group, group="scheduling.volcano.sh")
    api, clock = Api(), [100.0]
    caller = LineCaller(state, api, lambda: True, clock=lambda: clock[0])  # type: ignore[arg-type]
    for now in (100.0, 101.0, 161.0):  # the scheduler retries every period
        clock[0] = now
        admission.admit(state, review, admission.validate(state, review, now), now)
        run(caller)
    told = [(e[1]["kind"], e[1]["name"], e[2]) for e in api.events]
    assert (
        told
        == [("PodGroup", "train", "CardQuotaEnqueueRefused"), ("Job", "train", "CardQuotaEnqueueRefused")] * 2
    )
    assert api.events[0][3].startswith(
        'queue "q" has 1 NVIDIA-H200 left (quota 2: 1 running); podgroup ns/train'
    )


def test_a_waiter_is_reported_served_once_it_has_its_pods_called_or_not() -> None:
    """The wait-time histogram counts a workload whose controller's own retry got its pod before
    any call, each waiter once, and not a workload deleted while it waited."""
    waited: list[tuple[str, float]] = []
    now = [0.0]
    for freed in (False, True):
        state, now[0] = waiting_state(free=False), 101.0
        caller = LineCaller(
            state,
            Api(),  # type: ignore[arg-type]
            lambda: True,
            clock=lambda: now[0],
            on_served=lambda w, s: waited.append((w.what, s)),
        )
        run(caller)
        now[0] = 112.5
        if freed:  # e.g. the quota raised, and its controller's retry came first
            state.upsert_pod(pod_record(pod("web-0", owner=owner("ReplicaSet", "web", "uid-rs-web"))))
        else:
            state.delete_workload("ReplicaSet", "ns/web")
        run(caller)
        run(caller)
    assert waited == [("replicaset ns/web", 12.5)]


def gated_state(free: bool = True) -> tuple[ClusterState, dict[str, Any]]:
    """A full wait-mode queue of 1 H200 whose ReplicaSet's pod web-0 waits under our gate since
    t=100, then (``free``) the card freed."""
    waiting = queue("q", f'{{"{H200}": 1}}')
    waiting["metadata"]["annotations"][keys.OVER_QUOTA] = "wait"
    gated = pod("web-0", owner=owner("ReplicaSet", "web", "uid-rs-web"), gated=100.0)
    gated["metadata"]["resourceVersion"] = "42"
    state = cluster(node("h200", H200), waiting, pod("occupant", node_name="h200", phase="Running"), gated)
    if free:
        state.delete_pod("uid-ns-occupant")
    return state, gated


def test_a_released_pod_loses_our_gate_by_a_tested_patch_and_is_told_by_an_event() -> None:
    state, gated = gated_state()
    api = Api(objects={"web-0": gated})
    run(LineCaller(state, api, lambda: True, clock=lambda: 130.0))  # type: ignore[arg-type]
    assert api.patched == [
        (
            "pods",
            "web-0",
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "test", "path": "/spec/schedulingGates/0/name", "value": keys.GATE},
                {"op": "remove", "path": "/spec/schedulingGates/0"},
            ],
        )
    ]
    [(namespace, involved, reason, message)] = api.events
    assert (namespace, involved["kind"], involved["name"], reason) == (
        "ns",
        "Pod",
        "web-0",
        "CardQuotaReleased",
    )
    assert message == 'cards freed in queue "q": released to run on 1 NVIDIA-H200; it waited 30s'
    assert state.ledger.get("uid-ns-web-0") is not None  # held until the cache sees it released


@pytest.mark.parametrize("api", [Api(fail=True), Api(gone=True)], ids=["the patch fails", "the pod is gone"])
def test_a_release_whose_patch_fails_gives_its_card_back(api: Api) -> None:
    state, gated = gated_state()
    api.objects = {"web-0": gated}
    run(LineCaller(state, api, lambda: True, clock=lambda: 130.0))  # type: ignore[arg-type]
    assert len(state.ledger) == 0 and [e for e in api.events if e[2] == "CardQuotaReleased"] == []


def test_a_pod_that_starts_waiting_is_told_where_it_stands_once() -> None:
    state, gated = gated_state(free=False)
    api = Api(objects={"web-0": gated})
    caller = LineCaller(state, api, lambda: True, clock=lambda: 101.0)  # type: ignore[arg-type]
    run(caller)
    run(caller)
    assert [(e[1]["name"], e[2], e[3]) for e in api.events] == [
        (
            "web-0",
            "CardQuotaWaiting",
            'waits 1st in queue "q"\'s line for 1 NVIDIA-H200, held under the scheduling gate'
            " cardquota.volcano.sh/waiting: the card-quota webhook releases it the moment its cards free",
        )
    ]


def test_the_waiting_mark_is_written_once_and_not_again_while_the_cache_catches_up() -> None:
    state, api = waiting_state(), Api()
    caller = LineCaller(state, api, lambda: True, clock=lambda: 130.0)  # type: ignore[arg-type]
    run(caller)
    run(caller)
    marks = [a for a in api.annotated if keys.WAITING in a[3]]
    assert marks == [
        ("replicasets", "ns", "web", {keys.WAITING: '{"since":"1970-01-01T00:01:40.000Z","priority":0}'})
    ]


@pytest.mark.parametrize(
    "api", [Api(fail=True), Api(gone=True)], ids=["the API fails", "the workload is gone"]
)
def test_a_call_whose_write_fails_gives_its_cards_back(api: Api) -> None:
    state = waiting_state()
    run(LineCaller(state, api, lambda: True, clock=lambda: 130.0))  # type: ignore[arg-type]
    assert len(state.ledger) == 0
    assert api.events == []


def test_nothing_is_called_or_written_while_the_replica_does_not_serve() -> None:
    state, api = waiting_state(), Api()
    caller = LineCaller(state, api, lambda: False, interval=0.01)  # type: ignore[arg-type]

    async def briefly() -> None:
        task = asyncio.create_task(caller.run())
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(briefly())
    assert api.annotated == [] and len(state.ledger) == 0


def test_a_waiter_its_quota_can_no_longer_hold_is_told_why_it_left_and_not_counted_served() -> None:
    waited: list[tuple[str, float]] = []
    state, api = waiting_state(free=False), Api()
    caller = LineCaller(
        state,
        api,  # type: ignore[arg-type]
        lambda: True,
        clock=lambda: 101.0,
        on_served=lambda w, s: waited.append((w.what, s)),
    )
    run(caller)
    state.upsert_queue(queue_record(queue("q", f'{{"{H200}": 0}}')))
    run(caller)
    run(caller)
    ((namespace, involved, reason, message),) = api.events
    assert (namespace, involved["kind"], involved["name"], reason) == (
        "ns",
        "ReplicaSet",
        "web",
        "CardQuotaLeftLine",
    )
    assert message.startswith(
        'replicaset ns/web left queue "q"\'s line: one pod of it needs 1 NVIDIA-H200, more than the whole'
        ' quota of queue "q"'
    )
    assert not state.line.line("q") and waited == []


def test_a_waiter_that_came_and_went_between_two_passes_is_reported_served() -> None:
    """Refused, then served by its controller's own retry before the caller's next pass: the
    wait-time histogram still counts it (the refusal and the retry can be milliseconds apart)."""
    waited: list[tuple[str, float]] = []
    state = waiting_state(free=False)
    caller = LineCaller(
        state,
        Api(),  # type: ignore[arg-type]
        lambda: True,
        clock=lambda: 100.5,
        on_served=lambda w, s: waited.append((w.what, s)),
    )
    state.upsert_pod(pod_record(pod("web-0", owner=owner("ReplicaSet", "web", "uid-rs-web"))))
    assert not state.line.line("q")
    run(caller)
    run(caller)
    assert waited == [("replicaset ns/web", 0.5)]


def lending_queues(deserved_a: int = 1, quota_a: int = 2) -> list[dict[str, Any]]:
    """Queue q (quota ``quota_a``, deserved ``deserved_a``) and queue lender (deserved 2), one cohort."""
    q = queue("q", f'{{"{H200}": {quota_a}}}')
    q["metadata"]["annotations"][keys.CARD_DESERVED] = f'{{"{H200}": {deserved_a}}}'
    lender = queue("lender", f'{{"{H200}": 2}}')
    lender["metadata"]["annotations"][keys.CARD_DESERVED] = f'{{"{H200}": 2}}'
    return [q, lender]


@pytest.mark.parametrize("deserved", [1, 2], ids=["borrowing", "twin: within its deserved"])
def test_a_podgroup_enqueued_and_a_controllers_pod_admitted_on_borrowed_cards_are_told_by_an_event(
    deserved: int,
) -> None:
    job = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")
    group = podgroup("train", "Pending", f'{{"{H200}": 2}}', owner_ref=job, minMember=2)
    state = cluster(node("h200", H200, 4), *lending_queues(deserved), group)
    new = copy.deepcopy(group)
    new["status"]["phase"] = "Inqueue"
    enqueue = request(new, resource="podgroups", operation="UPDATE", old=group, group="scheduling.volcano.sh")
    admission.admit(state, enqueue, admission.validate(state, enqueue, 1.0), 1.0)
    api = Api()
    run(LineCaller(state, api, lambda: True, clock=lambda: 1.0))  # type: ignore[arg-type]
    told = [(e[1]["kind"], e[1]["name"], e[2]) for e in api.events]
    if deserved == 2:
        assert told == [] and api.annotated == []
        return
    assert told == [("PodGroup", "train", "CardQuotaBorrowing"), ("Job", "train", "CardQuotaBorrowing")]
    ((plural, namespace, name, annotations),) = api.annotated
    assert (plural, namespace, name) == ("podgroups", "ns", "train")
    assert mark(annotations) == {
        "since": "1970-01-01T00:00:01.000Z",
        "cards": {H200: {"beyond": 1, "deserved": 1, "from": ["lender"]}},
    }
    assert api.events[0][3] == (
        f'podgroup ns/train (volcano job ns/train) uses 1 {H200} borrowed from queue "lender"'
        " (beyond its queue's deserved 1):"
        " they may be taken back when lenders need them"
    )


@pytest.mark.parametrize("deserved", [1, 2], ids=["borrowing", "twin: within its deserved"])
def test_a_users_pod_admitted_on_borrowed_cards_is_marked_once_the_api_server_has_it(deserved: int) -> None:
    """Its user's kubectl printed the warning (no Event); the mark waits for the pod to be stored,
    tried at each pass for 30 s, then given up (its create failed after its admission)."""
    state = cluster(
        node("h200", H200, 4),
        *lending_queues(deserved, quota_a=3),
        pod("first", node_name="h200", phase="Running"),
    )
    review = request(pod("second"))
    decision = admission.validate(state, review, 1.0)
    admission.admit(state, review, decision, 1.0)
    assert isinstance(decision, Allowed), decision
    clock = [1.0]
    api = Api(gone=True)
    caller = LineCaller(state, api, lambda: True, clock=lambda: clock[0])  # type: ignore[arg-type]
    for clock[0] in (1.0, 2.0, 31.0):
        run(caller)
    assert api.events == []
    if deserved == 2:
        assert api.annotated == []
        return
    assert [a[:3] for a in api.annotated] == [("pods", "ns", "second")] * 3
    assert mark(api.annotated[0][3])["cards"] == {H200: {"beyond": 1, "deserved": 1, "from": ["lender"]}}
    clock[0] = 32.0
    run(caller)
    assert len(api.annotated) == 3, "a mark past its 30 s is given up"
    api.gone = False
    state.upsert_pod(pod_record(pod("second", node_name="h200", phase="Running")))  # stored at last
    review = request(pod("third"))
    admission.admit(state, review, admission.validate(state, review, 40.0), 40.0)
    clock[0] = 40.0
    run(caller)
    run(caller)
    assert [a[2] for a in api.annotated[3:]] == ["third"], "a mark written is written once"
    third = mark(api.annotated[3][3])["cards"][H200]
    assert third["beyond"] == 2, "the queue's use past its deserved, this pod counted"


@pytest.mark.parametrize("deserved", [1, 3], ids=["borrowing", "twin: within its deserved"])
def test_the_pods_of_a_scale_up_on_borrowed_cards_are_marked_with_the_queues_use_past_its_deserved(
    deserved: int,
) -> None:
    """chat runs 1 pod in q (deserved 1 of its quota 3) and is scaled to 3: its 2 new pods, admitted
    under the scale-up, are each marked with q's use past its deserved, the scale-up counted (2)."""
    rs = owner("ReplicaSet", "chat-1", "uid-rs-chat-1")
    state = cluster(
        node("h200", H200, 4),
        *lending_queues(deserved, quota_a=3),
        deployment("chat", 1),
        replicaset("chat-1", 1, "chat"),
        pod("chat-1-0", owner=rs, node_name="h200", phase="Running"),
    )
    up = scale_request("chat", 1, 3)
    admission.admit(state, up, admission.validate(state, up, 1.0), 1.0)
    for name in ("chat-1-a", "chat-1-b"):
        review = request(pod(name, owner=rs))
        decision = admission.validate(state, review, 1.5)
        assert isinstance(decision, Allowed) and decision.reason == "admitted under its workload's scale-up"
        admission.admit(state, review, decision, 1.5)
    api = Api()
    run(LineCaller(state, api, lambda: True, clock=lambda: 2.0))  # type: ignore[arg-type]
    if deserved == 3:
        assert api.annotated == []
        return
    assert sorted(a[2] for a in api.annotated) == ["chat-1-a", "chat-1-b"]
    assert {json.dumps(mark(a[3])["cards"]) for a in api.annotated} == {
        json.dumps({H200: {"beyond": 2, "deserved": 1, "from": ["lender"]}})
    }


def test_a_waiter_whose_pod_was_admitted_but_not_seen_yet_is_not_called_for_it() -> None:
    """web's controller waits in the line for its one pod; two cards free and its own retry's pod
    is admitted before any call: until the cache sees that pod, the line must not call web again
    for the card still free (it would hold it for a pod its controller never makes, keeping it
    from those behind)."""
    state = cluster(
        node("h200", H200, 2),
        queue("q", f'{{"{H200}": 2}}'),
        pod("occupant-0", node_name="h200", phase="Running"),
        pod("occupant-1", node_name="h200", phase="Running"),
        replicaset("web", 1, "web"),
    )
    refused = request(pod("web-0", owner=owner("ReplicaSet", "web", "uid-rs-web")))
    admission.admit(state, refused, admission.validate(state, refused, 100.0), 100.0)
    assert state.line.get("uid-rs-web") is not None
    for name in ("occupant-0", "occupant-1"):
        state.delete_pod(f"uid-ns-{name}")
    retry = pod("web-1", owner=owner("ReplicaSet", "web", "uid-rs-web"))
    review = request(retry)
    decision = admission.validate(state, review, 101.0)
    admission.admit(state, review, decision, 101.0)
    assert decision.reason == "fits the queue's quota", decision  # type: ignore[union-attr]
    assert calls.call_next(state, 101.5) == ()
    state.upsert_pod(pod_record(retry))  # the cache sees it: web leaves the line, nothing held
    assert calls.call_next(state, 102.0) == () and state.line.get("uid-rs-web") is None


@pytest.mark.parametrize("mode", ["warn", "audit"])
def test_what_a_quota_that_warns_or_audits_would_refuse_is_told_by_an_event_on_what_was_admitted(
    mode: str,
) -> None:
    """q's H200 are all used; chat's scale-up and train's enqueue are admitted (decisions.md §34)
    and each told, on the Deployment, and on the PodGroup and its Volcano Job."""
    q = queue("q", f'{{"{H200}": 1}}')
    q["metadata"]["annotations"][keys.ENFORCEMENT] = mode
    job = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")
    group = podgroup("train", "Pending", f'{{"{H200}": 1}}', owner_ref=job, minMember=1)
    state = cluster(
        node("h200", H200, 1),
        q,
        deployment("chat", 1),
        replicaset("chat-1", 1, "chat"),
        pod("run-0", node_name="h200", phase="Running"),
        group,
    )
    new = copy.deepcopy(group)
    new["status"]["phase"] = "Inqueue"
    enqueue = request(new, resource="podgroups", operation="UPDATE", old=group, group="scheduling.volcano.sh")
    for review in (scale_request("chat", 1, 2), enqueue):
        decision = admission.validate(state, review, 1.0)
        assert isinstance(decision, Allowed) and decision.would is not None, decision
        admission.admit(state, review, decision, 1.0)
    api = Api()
    run(LineCaller(state, api, lambda: True, clock=lambda: 1.0))  # type: ignore[arg-type]
    told = [(e[1]["kind"], e[1]["name"], e[2]) for e in api.events]
    assert told == [
        ("Deployment", "chat", "CardQuotaWouldRefuse"),
        ("PodGroup", "train", "CardQuotaWouldRefuse"),
        ("Job", "train", "CardQuotaWouldRefuse"),
    ]
    assert api.events[0][3].startswith(
        f"would be refused ({mode} mode): scale-up of deployment ns/chat from 1"
    )
    run(LineCaller(state, api, lambda: True, clock=lambda: 2.0))  # type: ignore[arg-type]
    assert len(api.events) == 3, "told once"


def test_would_be_refusals_are_told_at_most_once_a_minute_per_object_each_event_counting_them() -> None:
    """chat's scale-ups past q's quota (warn): the first is told at once; the four after it within
    the minute by one Event at its end, counting 4 since the first of them. Each Event carries the
    annotation ``kubectl cardquota audit`` adds up; nothing more is told once they stop."""
    q = queue("q", f'{{"{H200}": 1}}')
    q["metadata"]["annotations"][keys.ENFORCEMENT] = "warn"
    state = cluster(
        node("h200", H200, 1),
        q,
        deployment("chat", 1),
        replicaset("chat-1", 1, "chat"),
        pod("run-0", node_name="h200", phase="Running"),
    )
    api, clock = Api(), [0.0]
    caller = LineCaller(state, api, lambda: True, clock=lambda: clock[0])  # type: ignore[arg-type]

    def scale_up(at: float) -> None:
        review = scale_request("chat", 1, 2)
        decision = admission.validate(state, review, at)
        assert isinstance(decision, Allowed) and decision.would is not None
        admission.admit(state, review, decision, at)

    for now in (1.0, 10.0, 20.0, 30.0, 40.0, 50.0):
        clock[0] = now
        if now != 30.0:
            scale_up(now)
        asyncio.run(caller.once())
    assert [e[3].split(":")[0] for e in api.events] == ["would be refused (warn mode)"]
    for clock[0] in (61.0, 130.0, 200.0):
        asyncio.run(caller.once())
    assert len(api.events) == 2, api.events
    counted = {"queue": "q", "card": H200, "mode": "warn"}
    assert [(m["count"], json.loads(m["annotations"][keys.WOULD_REFUSE])) for m in api.more] == [
        (1, counted),
        (4, counted),
    ]
    assert api.more[1]["since"] == 10.0
    assert api.events[1][3].startswith(
        "would be refused (warn mode) 4 times since 1970-01-01T00:00:10.000Z, the last: scale-up of"
    )


def test_a_podgroups_would_be_refusal_is_counted_on_the_podgroup_not_twice() -> None:
    """Its Volcano Job is told too, without the annotation: ``audit`` counts each refusal once."""
    q = queue("q", f'{{"{H200}": 1}}')
    q["metadata"]["annotations"][keys.ENFORCEMENT] = "audit"
    job = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")
    group = podgroup("train", "Pending", f'{{"{H200}": 2}}', owner_ref=job, minMember=1)
    state = cluster(node("h200", H200, 1), q, pod("run-0", node_name="h200", phase="Running"), group)
    new = copy.deepcopy(group)
    new["status"]["phase"] = "Inqueue"
    enqueue = request(new, resource="podgroups", operation="UPDATE", old=group, group="scheduling.volcano.sh")
    decision = admission.validate(state, enqueue, 1.0)
    assert isinstance(decision, Allowed) and decision.would is not None, decision
    admission.admit(state, enqueue, decision, 1.0)
    api = Api()
    run(LineCaller(state, api, lambda: True, clock=lambda: 1.0))  # type: ignore[arg-type]
    assert [
        (e[1]["kind"], keys.WOULD_REFUSE in m.get("annotations", {}))
        for e, m in zip(api.events, api.more, strict=True)
    ] == [
        ("PodGroup", True),
        ("Job", False),
    ]


def test_a_controllers_pods_would_be_refusals_are_told_on_the_controller_one_event_for_all() -> None:
    """q's one H200 is used and it warns: web's ReplicaSet re-creates 3 pods past it in a minute;
    one Event on the ReplicaSet tells the first, one the 2 after it; none is on a pod."""
    q = queue("q", f'{{"{H200}": 1}}')
    q["metadata"]["annotations"][keys.ENFORCEMENT] = "warn"
    state = cluster(
        node("h200", H200), q, pod("occupant", node_name="h200", phase="Running"), replicaset("web", 3, "web")
    )
    api, clock = Api(), [0.0]
    caller = LineCaller(state, api, lambda: True, clock=lambda: clock[0])  # type: ignore[arg-type]
    for n, clock[0] in enumerate((1.0, 2.0, 3.0, 70.0)):
        if n < 3:
            review = request(pod(f"web-{n}", owner=owner("ReplicaSet", "web", "uid-rs-web")))
            decision = admission.validate(state, review, clock[0])
            assert isinstance(decision, Allowed) and decision.would is not None, decision
            admission.admit(state, review, decision, clock[0])
        asyncio.run(caller.once())
    told = [(e[1]["kind"], e[1]["name"], e[2], m["count"]) for e, m in zip(api.events, api.more, strict=True)]
    assert told == [
        ("ReplicaSet", "web", "CardQuotaWouldRefuse", 1),
        ("ReplicaSet", "web", "CardQuotaWouldRefuse", 2),
    ]

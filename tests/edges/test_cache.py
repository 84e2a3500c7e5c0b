"""The informer against scripted list+watch streams: pagination, events, bookmarks, 410 Gone,
broken connections, duplicates and stale events, odd shapes; and a stateful property: whatever the
stream does, the usage the cache computes equals a from-scratch computation over the truth."""

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prometheus_client import generate_latest

from tests.builders import H200, H800, batch_job, node, pod, queue
from tests.edges.test_fuzz import json_values, paths, replaced
from webhook.cluster.cache import KINDS, Backoff, Expired, Informer, Kind, Unavailable, kind_of
from webhook.cluster.snapshot import build_state
from webhook.cluster.sources import LiveSource
from webhook.core.decide.report import cluster_status, unsent
from webhook.core.index.state import ClusterState
from webhook.core.model.cards import units
from webhook.core.model.policy import Policy
from webhook.errors import ConfigError
from webhook.serve.metrics import Metrics

POD = next(k for k in KINDS if k.name == "Pod")
QUEUE = next(k for k in KINDS if k.name == "Queue")
BATCH_JOBS = kind_of("Job", "batch/v1")
Raw = dict[str, Any]
End = object()  # a watch stream that ends normally (the server's timeout)


def versioned(obj: Raw, version: int) -> Raw:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(version)
    return out


class Scripted:
    """Pages for list, and one script per watch call: events, exceptions, or End."""

    def __init__(self, pages: list[list[Raw]], version: int, watches: list[list[Any]]) -> None:
        self.pages, self.version, self.watches = pages, version, watches
        self.watched_from: list[str] = []
        self.lists = 0

    async def list(self, kind: Kind, limit: int, cont: str) -> bytes:
        index = int(cont or 0)
        self.lists += index == 0
        more = index + 1 < len(self.pages)
        meta = {"resourceVersion": str(self.version), "continue": str(index + 1) if more else ""}
        return orjson.dumps({"kind": f"{kind.name}List", "items": self.pages[index], "metadata": meta})

    async def watch(self, kind: Kind, version: str) -> AsyncIterator[Raw]:
        self.watched_from.append(version)
        if not self.watches:
            raise asyncio.CancelledError  # the script is over: stop the informer
        for step in self.watches.pop(0):
            if isinstance(step, BaseException):
                raise step
            if step is End:
                return
            yield copy.deepcopy(step)


class FakeSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def informer(
    kind: Kind, transport: Scripted, state: ClusterState | None = None
) -> tuple[Informer, FakeSleep]:
    sleep = FakeSleep()
    backoff = Backoff(first=1, cap=8, jitter=lambda top: top)
    return Informer(
        kind, state or ClusterState(), transport, page_size=2, backoff=backoff, sleep=sleep
    ), sleep


async def run_script(inf: Informer) -> None:
    with pytest.raises(asyncio.CancelledError):
        await inf.run()


def pods_of(state: ClusterState) -> set[str]:
    return {p.name for p in state.pods.values()}


def test_a_paginated_list_syncs_every_page_and_remembers_the_version() -> None:
    pages = [[versioned(pod(f"p{i}", H200), 10 + i) for i in range(j, j + 2)] for j in (0, 2, 4)]
    inf, _ = informer(POD, Scripted(pages, 42, []))
    asyncio.run(run_script(inf))
    assert inf.synced and inf.version == "42" and pods_of(inf.state) == {f"p{i}" for i in range(6)}


def test_watch_events_add_modify_and_delete_and_bookmarks_only_move_the_version() -> None:
    p0, p1 = pod("p0", H200), pod("p1", H200)
    bound = versioned({**p1, "spec": {**p1["spec"], "nodeName": "h0"}, "status": {"phase": "Running"}}, 13)
    script = [
        {"type": "ADDED", "object": versioned(p1, 11)},
        {"type": "MODIFIED", "object": bound},
        {"type": "DELETED", "object": versioned(p0, 14)},
        {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "20"}}},
        End,
    ]
    transport = Scripted([[versioned(p0, 5)]], 10, [script])
    state = build_state([("n", node("h0", H200)), ("q", queue("q", '{"NVIDIA-H200": 4}'))])
    inf, _ = informer(POD, transport, state)
    asyncio.run(run_script(inf))
    assert pods_of(state) == {"p1"} and state.pods["uid-ns-p1"].node_name == "h0"
    assert state.tree.tallies["q"].bound["NVIDIA-H200"] == units(1) and not state.tree.tallies["q"].pending
    assert transport.watched_from == ["10", "20"]  # resumed from the bookmark after the stream ended


def test_410_gone_relists_and_what_vanished_meanwhile_is_removed() -> None:
    transport = Scripted([[versioned(pod("a", H200), 1), versioned(pod("b", H200), 2)]], 5, [])
    transport.watches = [[{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}]]
    inf, _ = informer(POD, transport)

    async def scenario() -> None:
        original = transport.list

        async def second_list(kind: Kind, limit: int, cont: str) -> Raw:
            if transport.lists >= 1 and not cont:
                transport.pages, transport.version = [[versioned(pod("b", H200), 2)]], 9
            return await original(kind, limit, cont)

        transport.list = second_list  # type: ignore[method-assign]
        await run_script(inf)

    asyncio.run(scenario())
    assert inf.relists == 2 and pods_of(inf.state) == {"b"} and transport.watched_from == ["5", "9"]


def test_a_broken_connection_backs_off_and_resumes_from_the_last_version_without_relisting() -> None:
    script_1 = [{"type": "ADDED", "object": versioned(pod("a", H200), 6)}, Unavailable("connection reset")]
    script_2 = [Unavailable("refused")]
    script_3 = [{"type": "ADDED", "object": versioned(pod("b", H200), 7)}, End]
    transport = Scripted([[]], 5, [script_1, script_2, script_3])
    inf, sleep = informer(POD, transport)
    asyncio.run(run_script(inf))
    assert transport.lists == 1 and transport.watched_from == ["5", "6", "6", "7"]
    assert sleep.delays == [1, 2]  # capped exponential; reset once events flow again
    assert pods_of(inf.state) == {"a", "b"} and inf.broken_since is None


def test_duplicate_and_stale_events_change_nothing() -> None:
    running = versioned({**pod("a", H200, node_name="h0"), "status": {"phase": "Running"}}, 8)
    pending = versioned(pod("a", H200), 7)
    script = [
        {"type": "MODIFIED", "object": running},
        {"type": "MODIFIED", "object": running},
        {"type": "MODIFIED", "object": pending},  # older than what the cache holds
        End,
    ]
    state = build_state([("n", node("h0", H200)), ("q", queue("q", '{"NVIDIA-H200": 4}'))])
    inf, _ = informer(POD, Scripted([[pending]], 7, [script]), state)
    asyncio.run(run_script(inf))
    assert state.pods["uid-ns-a"].node_name == "h0" and state.tree.tallies["q"].bound["NVIDIA-H200"] == units(
        1
    )


def test_an_object_in_an_odd_shape_is_skipped_reported_and_the_informer_goes_on() -> None:
    odd = versioned(queue("odd", '{"NVIDIA-H200": 1}'), 3)
    odd["spec"] = "not an object"
    script = [{"type": "ADDED", "object": versioned(queue("good", '{"NVIDIA-H200": 2}'), 4)}, End]
    inf, _ = informer(QUEUE, Scripted([[odd]], 3, [script]))
    asyncio.run(run_script(inf))
    assert set(inf.state.tree.queues) == {"good"}
    notes = cluster_status(inf.state)["notes"]
    assert notes == ["Queue/odd: skipped, spec must be an object, got a string"]
    metrics = Metrics()
    metrics.watch_state(lambda: inf.state)
    scraped = generate_latest(metrics.registry).decode()
    assert 'cardquota_objects_skipped{kind="Queue"} 1.0' in scraped


def test_batch_jobs_and_volcano_jobs_are_watched_apart() -> None:
    assert BATCH_JOBS is not None and BATCH_JOBS.path == "/apis/batch/v1/jobs"
    volcano = kind_of("Job", "batch.volcano.sh/v1alpha1")
    assert volcano is not None and volcano.path == "/apis/batch.volcano.sh/v1alpha1/jobs"
    assert kind_of("Job", "batch/v2") == BATCH_JOBS  # an owner reference may name another version
    assert kind_of("Job", "apps/v1") is None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=json_values)
def test_a_batch_job_with_any_field_replaced_by_anything_is_read_or_skipped_never_fatal(
    data: st.DataObject, value: Any
) -> None:
    """A batch Job is listed with one node replaced by any JSON value, then another is watched:
    the informer never dies, and what it holds wants a count of pods >= 0."""
    base = versioned(batch_job("train", 2, completions=4, succeeded=1), 3)
    hostile = replaced(base, data.draw(st.sampled_from(list(paths(base)))), value)
    try:
        orjson.dumps(hostile)
    except TypeError:
        assume(False)  # beyond what an API server's JSON can carry to the informer's reader
    good = versioned(batch_job("other", 1), 4)
    assert BATCH_JOBS is not None
    inf, _ = informer(BATCH_JOBS, Scripted([[hostile]], 3, [[{"type": "ADDED", "object": good}, End]]))
    asyncio.run(run_script(inf))
    held = {w.name: w for w in inf.state.workloads.by_uid.values()}
    assert held["other"].replicas == 1 and held["other"].kind == "Job.batch"
    assert all(w.replicas >= 0 for w in held.values())


def test_a_watch_error_that_is_not_410_is_retried_like_a_broken_connection() -> None:
    script = [{"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "etcd hiccup"}}]
    transport = Scripted([[]], 5, [script, [End]])
    inf, sleep = informer(POD, transport)
    asyncio.run(run_script(inf))
    assert sleep.delays == [1] and transport.lists == 1


# ---- the stateful property ------------------------------------------------------------------

NODES = [node("h0", H200, 8), node("h8", H800, 8)]
QUEUES = [queue("q", '{"NVIDIA-H200": 4, "NVIDIA-H800": 4}')]
SPECS = [H200, H800, f"{H200}|{H800}"]


class Watched(RuleBasedStateMachine):
    """The cluster (truth) changes; the informer sees it through a stream that may repeat events,
    replay stale ones, break, or expire. After each delivery, usage must equal a recomputation."""

    def __init__(self) -> None:
        super().__init__()
        self.truth: dict[str, Raw] = {}
        self.version = 1
        self.pending: list[Raw] = []
        self.history: list[Raw] = []
        state = build_state([(f"o{i}", o) for i, o in enumerate([*NODES, *QUEUES])])
        self.transport = Scripted([[]], 1, [])
        self.informer, _ = informer(POD, self.transport, state)
        asyncio.run(self.informer.relist())

    def _event(self, kind: str, obj: Raw) -> None:
        self.version += 1
        event = {"type": kind, "object": versioned(obj, self.version)}
        self.pending.append(event)
        self.history.append(event)

    @rule(
        name=st.sampled_from([f"p{i}" for i in range(6)]),
        spec=st.sampled_from(SPECS),
        count=st.integers(1, 2),
    )
    def create_or_replace(self, name: str, spec: str, count: int) -> None:
        """A pod created, or deleted and created anew under its name (a new uid: what a pod is
        charged is fixed while it lives, so an edit of its card is no replacement)."""
        if name in self.truth:
            self._event("DELETED", self.truth[name])
        obj = pod(name, spec, count, uid=f"uid-{name}-{self.version}")
        self._event("ADDED", obj)
        self.truth[name] = obj

    @precondition(lambda self: self.truth)
    @rule(data=st.data(), phase=st.sampled_from(["Running", "Succeeded", "Failed"]))
    def bind(self, data: st.DataObject, phase: str) -> None:
        name = data.draw(st.sampled_from(sorted(self.truth)))
        obj = copy.deepcopy(self.truth[name])
        spec = obj["metadata"]["annotations"]["volcano.sh/card.name"]
        obj["spec"]["nodeName"] = "h8" if spec == H800 else "h0"
        obj["status"] = {"phase": phase}
        self.truth[name] = obj
        self._event("MODIFIED", obj)

    @precondition(lambda self: self.truth)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.truth)))
        self._event("DELETED", self.truth.pop(name))

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def replay_an_old_event(self, data: st.DataObject) -> None:
        self.pending.append(data.draw(st.sampled_from(self.history)))

    @rule()
    def bookmark(self) -> None:
        self.pending.append(
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.version)}}}
        )

    @rule(how=st.sampled_from(["deliver", "break", "expire"]), data=st.data())
    def deliver(self, how: str, data: st.DataObject) -> None:
        """All pending events; or a prefix and a broken connection (the rest comes on the next
        watch); or a prefix and 410 Gone, after which only a relist of the truth can catch up."""
        cut = data.draw(st.integers(0, len(self.pending)))
        if how == "deliver":
            script: list[Any] = [*self.pending, End]
            self.pending = []
        elif how == "break":
            script, self.pending = [*self.pending[:cut], Unavailable("reset")], self.pending[cut:]
        else:
            gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
            script, self.pending = [*self.pending[:cut], gone], []
        self.transport.watches = [script]
        try:
            asyncio.run(self._once())
        except Unavailable:
            return
        except Expired:
            self.transport.pages = [list(self.truth.values())]
            self.transport.version = self.version
            asyncio.run(self.informer.relist())

    async def _once(self) -> None:
        async for _ in _drain(self.informer):
            pass

    @invariant()
    def usage_equals_a_recomputation_once_everything_is_delivered(self) -> None:
        if self.pending:
            return
        fresh = build_state([(f"o{i}", o) for i, o in enumerate([*NODES, *QUEUES, *self.truth.values()])])
        assert cluster_status(self.informer.state)["queues"] == cluster_status(fresh)["queues"]
        assert {p.name for p in self.informer.state.pods.values()} == set(self.truth)


async def _drain(inf: Informer) -> AsyncIterator[None]:
    await inf._watch()
    yield None


Watched.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
test_the_cache_always_agrees_with_a_recomputation = Watched.TestCase


def test_the_live_source_is_ready_once_every_kind_synced_and_not_while_a_watch_is_broken_too_long() -> None:
    now = [100.0]
    source = LiveSource(lambda: None, Policy(), broken_after=60, clock=lambda: now[0])  # type: ignore[arg-type,return-value]
    assert not source.ready  # nothing listed yet
    source.informers = [informer(kind, Scripted([[]], 1, []))[0] for kind in KINDS]
    for inf in source.informers[:-1]:
        asyncio.run(inf.relist())
    assert not source.ready  # pods not synced yet
    asyncio.run(source.informers[-1].relist())
    assert source.ready
    source.informers[0].broken_since = 50.0
    assert source.ready  # broken for 50 s: within the bound
    now[0] = 111.0
    assert not source.ready  # broken for 61 s
    source.informers[0].broken_since = None
    assert source.ready


class Warnings:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str]] = []

    async def warn_queue(self, queue: str, reason: str, message: str) -> None:
        self.sent.append((queue, reason, message))

    async def warn_node(self, node: str, reason: str, message: str) -> None:
        self.sent.append((f"node/{node}", reason, message))


def test_the_auditor_warns_once_per_interval_about_a_queue_above_its_quota() -> None:
    now = [0.0]
    source = LiveSource(lambda: None, Policy(), clock=lambda: now[0])  # type: ignore[arg-type,return-value]
    objects = [node("h0", H200), queue("q", '{"NVIDIA-H200": 1}')]
    objects += [{**pod(f"p{i}", H200, node_name="h0"), "status": {"phase": "Running"}} for i in range(2)]
    source._state = build_state([(f"o{i}", o) for i, o in enumerate(objects)])
    events = Warnings()
    asyncio.run(source.audit_once(events))  # type: ignore[arg-type]
    now[0] = 300.0
    asyncio.run(source.audit_once(events))  # type: ignore[arg-type]
    assert events.sent == [
        (
            "q",
            "CardQuotaOvercommitted",
            'queue "q" uses 2 NVIDIA-H200, above its quota (quota 1: 2 running); nothing is evicted, new pods wait until use falls below it',
        )
    ]
    now[0] = 601.0
    asyncio.run(source.audit_once(events))  # type: ignore[arg-type]
    assert len(events.sent) == 2


class Lagging(Scripted):
    """A watch that has delivered nothing of what the server holds now (a takeover right after
    the previous leader admitted a pod): it stays silent until cancelled."""

    def __init__(self, pages: list[list[Raw]], version: int) -> None:
        super().__init__(pages, version, [])

    async def watch(self, kind: Kind, version: str) -> AsyncIterator[Raw]:
        self.watched_from.append(version)
        await asyncio.Event().wait()
        yield {}


def test_catch_up_lists_again_while_the_watch_is_silent_and_resumes_from_that_list() -> None:
    async def scenario() -> tuple[set[str], set[str], list[str], int]:
        transport = Lagging([[versioned(pod("a", H200), 1)]], 5)
        inf, _ = informer(POD, transport)
        task = asyncio.create_task(inf.run())
        while not transport.watched_from:
            await asyncio.sleep(0)
        before = pods_of(inf.state)
        # The previous leader admitted b and a vanished; the watch has shown neither yet.
        transport.pages, transport.version = [[versioned(pod("b", H200), 7)]], 9
        await asyncio.wait_for(inf.catch_up(), 5)
        after = pods_of(inf.state)
        while len(transport.watched_from) < 2:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return before, after, transport.watched_from, transport.lists

    before, after, watched_from, lists = asyncio.run(scenario())
    assert before == {"a"} and after == {"b"}
    assert watched_from == ["5", "9"] and lists == 2


def vendor_node(name: str, vendor: str, resource: str) -> dict[str, Any]:
    """A node whose card another vendor's device plugin advertises, with its product labels."""
    labels = {f"{vendor}/gpu.product": "MI300X", f"{vendor}/gpu.count": "8", f"{vendor}/gpu.memory": "196608"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": "64", resource: "8"}},
    }


@pytest.mark.parametrize(
    ("prefixes", "warned"),
    [
        pytest.param(("nvidia.com/",), True, id="a vendor the filters leave out"),
        pytest.param(("nvidia.com/", "acme.io/"), False, id="its prefix sent"),
    ],
)
def test_a_node_card_resource_the_filters_never_send_is_warned_of_on_the_node(
    prefixes: tuple[str, ...], warned: bool
) -> None:
    now = [0.0]
    policy = Policy(sent_resource_prefixes=prefixes)
    source = LiveSource(lambda: None, policy, clock=lambda: now[0])  # type: ignore[arg-type,return-value]
    objects = [
        node("h0", H200),
        vendor_node("m0", "acme.io", "acme.io/gpu"),
        vendor_node("m1", "acme.io", "acme.io/gpu"),
    ]
    source._state = build_state([(f"o{i}", o) for i, o in enumerate(objects)], policy)
    events = Warnings()
    asyncio.run(source.audit_once(events))  # type: ignore[arg-type]
    asyncio.run(source.audit_once(events))  # type: ignore[arg-type]
    expected = (
        "nodes m0 and 1 more advertise card resource acme.io/gpu, which the webhooks' filters never send"
        " (webhook.cardResourcePrefixes): a pod asking it without volcano.sh/card.name is never checked;"
        " add its prefix to that list"
    )
    assert events.sent == ([("node/m0", "CardQuotaResourceNotSent", expected)] if warned else [])
    assert (expected in cluster_status(source._state)["warnings"]) is warned
    metrics = Metrics()
    metrics.watch_state(lambda: source._state)
    scraped = generate_latest(metrics.registry).decode()
    assert ('cardquota_unsent_card_resource_nodes{resource="acme.io/gpu"} 2.0' in scraped) is warned


NAMESPACES = next(k for k in KINDS if k.name == "Namespace")


def namespace(name: str, default: str | None) -> Raw:
    meta: Raw = {"name": name, "uid": f"uid-ns-{name}"}
    if default is not None:
        meta["annotations"] = {"scheduling.volcano.sh/queue-name": default}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def test_the_namespace_informer_keeps_each_default_queue_and_moves_the_pods_it_decides() -> None:
    """decisions.md §30: a pod of no PodGroup runs in its namespace's default queue; the list keeps
    only the namespaces carrying one, an edit or a delete moves their pods' charges."""
    listed = [namespace("ns", "team"), namespace("plain", None)]
    script = [
        {"type": "MODIFIED", "object": versioned(namespace("ns", "other"), 11)},
        {"type": "DELETED", "object": versioned(namespace("ns", "other"), 12)},
        End,
    ]
    state = build_state(
        [
            ("n", node("h0", H200)),
            *((q, queue(q, '{"NVIDIA-H200": 4}')) for q in ("team", "other", "default")),
            ("p", pod("p0", H200, queue_name=None, node_name="h0", phase="Running")),
        ]
    )
    seen: list[tuple[dict[str, str], str]] = []

    class Watching(Scripted):
        async def watch(self, kind: Kind, version: str) -> AsyncIterator[Raw]:
            async for event in super().watch(kind, version):
                yield event
                seen.append((dict(state.namespace_queues), state.charged.charge("uid-ns-p0").queue))  # type: ignore[union-attr]

    inf, _ = informer(NAMESPACES, Watching([listed], 10, [script]), state)
    asyncio.run(run_script(inf))
    assert seen == [({"ns": "other"}, "other"), ({}, "default")]
    assert state.charged.charge("uid-ns-p0").queue == "default"  # type: ignore[union-attr]


def test_a_relist_forgets_a_namespaces_default_queue_removed_while_not_watching() -> None:
    state = build_state([("ns", namespace("ns", "team")), ("q", queue("team", '{"NVIDIA-H200": 1}'))])
    assert state.namespace_queues == {"ns": "team"}
    inf, _ = informer(NAMESPACES, Scripted([[namespace("ns", None)]], 10, []), state)
    asyncio.run(run_script(inf))
    assert state.namespace_queues == {}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=json_values)
def test_a_namespace_with_any_field_replaced_by_anything_is_read_or_skipped_never_fatal(
    data: st.DataObject, value: Any
) -> None:
    """A Namespace is listed with one node replaced by any JSON value, then another is watched: the
    informer never dies, it keeps the second's default queue, and every default queue it keeps is
    text (an empty one too: Volcano's PodGroup mutation puts even that in place of ``default``,
    ``runqueue.namespace_default``)."""
    base = versioned(namespace("odd", "team"), 3)
    hostile = replaced(base, data.draw(st.sampled_from(list(paths(base)))), value)
    try:
        orjson.dumps(hostile)
    except TypeError:
        assume(False)  # beyond what an API server's JSON can carry to the informer's reader
    good = versioned(namespace("ns", "other"), 4)
    state = build_state([("q", queue("other", '{"NVIDIA-H200": 1}'))])
    inf, _ = informer(NAMESPACES, Scripted([[hostile]], 3, [[{"type": "ADDED", "object": good}, End]]), state)
    asyncio.run(run_script(inf))
    assert state.namespace_queues["ns"] == "other"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in state.namespace_queues.items())


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(max_size=60)
    | st.lists(
        st.sampled_from(["nvidia.com/", "acme.io/", "acme.io/g", " acme.io/x ", ""]) | st.text(max_size=8)
    ).map(",".join),
    resources=st.lists(st.sampled_from(["gpu", "x", "xpu"]) | st.text(min_size=1, max_size=20), max_size=4),
)
def test_any_sent_resource_prefixes_are_read_and_warn_of_exactly_the_resources_they_leave_out(
    text: str, resources: list[str]
) -> None:
    """``--sent-resource-prefixes`` / ``CARDQUOTA_SENT_RESOURCE_PREFIXES`` given any text: read as
    its comma-separated, trimmed, non-empty parts; the nodes' card resources outside them, and only
    those, are warned of."""
    from webhook import settings as loading

    try:
        policy = loading.load_policy(type("Args", (), {"sent_resource_prefixes": text})())  # type: ignore[arg-type]
    except ConfigError as exc:  # a text pydantic will not take (none here): a clear error, never a crash
        assert "setting sent_resource_prefixes" in str(exc)
        return
    prefixes = tuple(p.strip() for p in text.split(",") if p.strip())
    assert policy.sent_resource_prefixes == prefixes
    nodes = [vendor_node(f"m{i}", "acme.io", f"acme.io/{r}") for i, r in enumerate(resources)]
    state = build_state([(f"o{i}", o) for i, o in enumerate([node("h0", H200), *nodes])], policy)
    advertised = {
        resource
        for cards in state.inventory.by_node.values()
        for resource in {c.resource for c in cards.cards} | {s for s, _ in cards.shared}
    }
    assert "nvidia.com/gpu" in advertised
    assert {resource for resource, _, _ in unsent(state)} == {
        r for r in advertised if not r.startswith(prefixes)
    }

"""Tidal reclaim's reading at scale (decisions.md §26): the unbound pods kept in lines per model and
queue as they come and go, so a pass never walks them all; and the questions read in steps that
stay sound however the cache changes between two of them."""

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import H200, R4090, cluster, node, owner, pod, podgroup
from tests.core.test_tidal import NODES, RS, gang, inference, job_ref, serve_queue, train_queue
from webhook.core.decide import reclaim_settings, tidal
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model.cards import UNIT
from webhook.core.model.steps import done

NAMES = [f"p{i}" for i in range(6)]
QUEUES = ["serve", "train", "nowhere"]
# what a pod belongs to: the inference Deployment's PodGroup, a training job's, its ReplicaSet
# alone, or nothing
KINDS = ["web", "tj", "rs", "bare"]

# what was there before the changes: a training gang's pods, the inference pods, PodGroups, nodes
THERE = ["tj-0", "tj-1", "tj-2", "tk-0", "web-0", "web-1", "web-2", "group tj", "group web", "node n1"]
changes = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["create", "bind", "delete", "deleting", "finish"]),
            st.sampled_from(NAMES),
            st.sampled_from([R4090, H200]),
            st.sampled_from(QUEUES),
            st.sampled_from(KINDS),
        ),
        st.tuples(st.just("gone"), st.sampled_from(THERE), st.just(""), st.just(""), st.just("")),
    ),
    max_size=30,
)


def made(name: str, card: str, queue: str, kind: str, **kw: Any) -> dict[str, Any]:
    belongs: dict[str, Any] = {
        "web": {"group": "web", "owner": RS},
        "tj": {"group": "tj", "owner": job_ref("tj")},
        "rs": {"owner": owner("ReplicaSet", "other", "uid-rs-other")},
        "bare": {},
    }[kind]
    return pod(name, card, queue_name=queue, **belongs, **kw)


def apply(state: ClusterState, change: tuple[str, str, str, str, str], bodies: dict[str, Any]) -> None:
    """One change of a pod as the cache sees it: created unbound, bound to a node of its model,
    being deleted, finished or gone (a change to a pod not there creates it); or something there
    before (``THERE``) gone."""
    op, name, card, queue, kind = change
    if op == "gone":
        what, _, called = name.rpartition(" ")
        gone = {"group": podgroup(called, "Running"), "node": node(called, R4090, 2)}.get(what, pod(called))
        ingest.remove(state, gone)
        return
    if name not in bodies or op == "create":
        bodies[name] = made(name, card, queue, kind)
    elif op == "bind":
        bodies[name]["spec"]["nodeName"] = (
            "n1" if bodies[name]["metadata"]["annotations"]["volcano.sh/card.name"] == R4090 else "h"
        )
        bodies[name]["status"]["phase"] = "Running"
    elif op == "deleting":
        bodies[name]["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
        bodies[name]["metadata"]["deletionGracePeriodSeconds"] = 30
    elif op == "finish":
        bodies[name]["status"]["phase"] = "Succeeded"
    else:
        ingest.remove(state, bodies.pop(name))
        return
    ingest.upsert(state, json.loads(json.dumps(bodies[name])))


def world() -> ClusterState:
    return cluster(*NODES, train_queue(), serve_queue(quota=8), *gang("tj", ["n2", "n2"]), *inference(0))


@settings(max_examples=300, deadline=None)
@given(changes)
def test_the_lines_of_unbound_pods_are_the_pods_walked_one_by_one_after_any_changes(
    ops: list[tuple[str, str, str, str, str]],
) -> None:
    """Kept as pods come and go, the lines answer what walking every pod answers: per model and
    queue, the live unbound pods that may take back cards (inference: the Deployment's PodGroup or
    a ReplicaSet's pod), none bound, finished, being deleted or gone."""
    state, bodies = world(), {}
    for change in ops:
        apply(state, change, bodies)
    walked: dict[tuple[str, str], set[str]] = {}
    for uid, record in state.pods.items():
        charge = state.charged.charge(uid)
        if charge is None or charge.card is None or record.node_name or not record.is_live:
            continue
        if reclaim_settings.service_of(state, uid) == "inference":
            walked.setdefault((charge.card, charge.queue), set()).add(uid)
    read = tidal.waiting(state, lambda uid: True)
    assert {(card, q): set(uids) for card, queues in read.items() for q, uids in queues.items()} == walked
    lines = state.charged.unbound_lines
    kept = {(line, uid) for line in lines.lines() for _, uids in lines.line(line) for uid in uids}
    unbound = {  # every pod charged a model and on no node, live or being deleted
        ((charge.card, charge.queue), uid)
        for uid, record in state.pods.items()
        if (charge := state.charged.charge(uid)) is not None
        and charge.card is not None
        and not record.node_name
    }
    assert kept == unbound and {uid for _, uid in kept} == set(state.charged.unbound())
    assert all(any(uids for _, uids in lines.line(line)) for line in lines.lines())


@settings(max_examples=200, deadline=None)
@given(changes, st.integers(0, 40))
def test_the_questions_read_in_steps_survive_any_change_between_two_steps(
    ops: list[tuple[str, str, str, str, str]], start: int
) -> None:
    """The cache changes the state between two steps of a reading (the loop answers its events
    meanwhile; here one change after each step from the ``start``-th on, pods, PodGroups and nodes
    gone among them): the reading never fails, names only gangs with pods, and with no change
    between its steps it reads what it reads at once."""
    bodies: dict[str, Any] = {}
    state = cluster(
        *NODES,
        train_queue(),
        serve_queue(quota=8),
        *gang("tj", ["n1", "n1", "n2"]),
        *gang("tk", ["n2"]),
        *inference(3),
    )
    at_once = done(tidal.problems(state, lambda uid: True))
    [problem] = at_once  # the world unchanged: every card held, the gangs, the three pods waiting
    assert problem.card == R4090 and dict(problem.free) == {"n1": 0, "n2": 0} and problem.protected == 0
    assert [(g.key, g.cards) for g in problem.candidates] == [
        ("ns/tj", {"n1": 2 * UNIT, "n2": UNIT}),
        ("ns/tk", {"n2": UNIT}),
    ]
    assert [w.uids for w in problem.queues] == [("uid-ns-web-0", "uid-ns-web-1", "uid-ns-web-2")]
    steps = tidal.problems(state, lambda uid: True)
    changing = iter(ops)
    taken = 0
    try:
        while True:
            next(steps)
            taken += 1
            if taken >= start and (change := next(changing, None)) is not None:
                apply(state, change, bodies)
    except StopIteration as end:
        asked = end.value
    if start > taken or not ops:  # nothing changed between its steps: what it reads at once
        assert asked == at_once
    for problem in asked:
        assert set(problem.free) <= {"n1", "n2", "h"}
        for g in problem.candidates:
            assert g.card == problem.card and g.pods and g.key in ("ns/tj", "ns/tk", "ns/web")
    assert taken > 3  # it did go in steps

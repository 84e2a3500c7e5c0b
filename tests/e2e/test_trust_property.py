"""Nothing a tenant writes moves the count (decisions.md §29): generated writes by a user who is not
the webhook, to every tenant-writable field of the trust table, each run through the admission
chain the chart registers (its webhooks' filters, its policies, the webhook's own answers) and, when
the chain lets it through, seen by the cache. After every write: every live pod is charged what it
was, every queue's line keeps its order with nobody new ahead, and no queue holds more of a card
than its quota."""

import copy
import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import H200, R4090, cluster, node, owner, pod, podgroup, queue, replicaset
from tests.e2e.chain import write
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model import keys
from webhook.core.model.cards import CardName

QUOTAS = {"q": {H200: 2, R4090: 2}, "other": {H200: 1}}
MARK = '{"since":"1970-01-01T00:00:00Z","priority":2147483647}'
JOB = owner("Job", "train", "uid-job-train", api="batch.volcano.sh/v1alpha1")
TENANT_OWNER = owner("ConfigMap", "anything", "uid-cm", api="v1")


def world() -> tuple[ClusterState, dict[str, dict[str, Any]]]:
    """Queue q full of H200 (web's two pods), web and api waiting in its line for one H200 each,
    a Volcano Job's PodGroup Inqueue reserving 2 RTX 4090, and a pod of queue other."""
    objects: dict[str, dict[str, Any]] = {
        "web": replicaset("web", 3, "web"),
        "api": replicaset("api", 1, "api"),
        "idle": replicaset("idle", 1, "idle"),
        "pg-train": podgroup("pg-train", "Inqueue", json.dumps({R4090: 2}), owner_ref=JOB, minMember=2),
    }
    for index in range(2):
        ref = owner("ReplicaSet", "web", "uid-rs-web")
        objects[f"web-{index}"] = pod(f"web-{index}", owner=ref, node_name="h200", phase="Running")
    objects["solo"] = pod("solo", queue_name="other", node_name="h200", phase="Running")
    queues = [queue(name, json.dumps(quota)) for name, quota in QUOTAS.items()]
    state = cluster(node("h200", H200), node("r4090", R4090), *queues, *objects.values())
    for at, name in enumerate(("web", "api")):
        refused = pod(f"{name}-new", owner=owner("ReplicaSet", name, f"uid-rs-{name}"))
        assert not write(state, "pods", "CREATE", refused, now=1.0 + at).allowed
    assert [w.what for w in state.line.line("q")] == ["replicaset ns/web", "replicaset ns/api"]
    return state, objects


def annotated(obj: dict[str, Any], key: str, value: str | None) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    annotations = new["metadata"].setdefault("annotations", {})
    if value is None:
        annotations.pop(key, None)
    else:
        annotations[key] = value
    return new


POD_KEYS = [*keys.CHARGED, keys.GROUP_NAME, keys.WAITING, "team"]
VALUES = [None, "", "q", "other", H200, R4090, f"{H200}|{R4090}", "pg-train", MARK]


def pod_edit() -> st.SearchStrategy[tuple[str, ...]]:
    return st.tuples(
        st.just("pod"),
        st.sampled_from(["web-0", "web-1", "solo"]),
        st.sampled_from(POD_KEYS),
        st.sampled_from(VALUES),
    )


def group_edit() -> st.SearchStrategy[tuple[str, ...]]:
    fields = st.sampled_from(
        ["phase", keys.CARD_REQUEST, keys.CARD_NAME, "queue", "minResources", "minMember"]
    )
    values = st.sampled_from(
        [
            "Pending",
            "Inqueue",
            "Running",
            "Completed",
            json.dumps({R4090: 4}),
            json.dumps({H200: 2}),
            "",
            None,
            "other",
            "5",
        ]
    )
    return st.tuples(st.just("podgroup"), fields, values)


def group_create() -> st.SearchStrategy[tuple[str, ...]]:
    return st.tuples(
        st.just("new podgroup"),
        st.sampled_from(["", "Pending", "Inqueue", "Running"]),
        st.integers(1, 4),
        st.sampled_from(["q", "other"]),
    )


def workload_edit() -> st.SearchStrategy[tuple[str, ...]]:
    where = st.sampled_from(["metadata", "template"])
    key = st.sampled_from([keys.WAITING, keys.CALLED, keys.RECLAIMED, "gate", "team"])
    return st.tuples(
        st.just("replicaset"),
        st.sampled_from(["web", "api", "idle"]),
        where,
        key,
        st.sampled_from([MARK, "now", None]),
    )


def pod_create() -> st.SearchStrategy[tuple[str, ...]]:
    return st.tuples(
        st.just("new pod"),
        st.sampled_from(["api", "squat", "tenant"]),
        st.booleans(),  # carrying a forged waiting mark and our gate
        st.sampled_from(["", "pg-train", "squat-group"]),
    )


WRITES = st.lists(
    st.one_of(pod_edit(), group_edit(), group_create(), workload_edit(), pod_create()), min_size=1, max_size=8
)


class Tenant:
    def __init__(self) -> None:
        self.state, self.objects = world()
        self.serial = 0

    def apply(self, action: tuple[Any, ...], now: float) -> None:
        state, objects = self.state, self.objects
        kind = action[0]
        if kind == "pod":
            _, name, key, value = action
            old = objects[name]
            new = annotated(old, key, value)
            done = write(state, "pods", "UPDATE", new, old, now=now)
        elif kind == "podgroup":
            _, field, value = action
            old = objects["pg-train"]
            new = copy.deepcopy(old)
            if field == "phase":
                new["status"]["phase"] = value or "Pending"
            elif field == "queue":
                new["spec"]["queue"] = value or "q"
            elif field == "minResources":
                new["spec"]["minResources"] = {"nvidia.com/gpu": value or "1"}
            elif field == "minMember":
                new["spec"]["minMember"] = int(value) if value and value.isdigit() else 1
            else:
                new = annotated(old, field, value)
            done = write(state, "podgroups", "UPDATE", new, old, now=now)
        elif kind == "new podgroup":
            _, phase, ask, queue_name = action
            if "squat-group" in objects:
                return  # AlreadyExists
            group = podgroup(
                "squat-group",
                phase or "Pending",
                json.dumps({R4090: ask}),
                queue_name=queue_name,
                owner_ref=TENANT_OWNER,
                minMember=ask,
            )
            if not phase:
                del group["status"]
            done = write(state, "podgroups", "CREATE", group, now=now)
            name = "squat-group"
        elif kind == "replicaset":
            _, name, where, key, value = action
            old = objects[name]
            new = copy.deepcopy(old)
            target = new if where == "metadata" else new["spec"]["template"]
            if key == "gate":
                target.setdefault("spec", {})["schedulingGates"] = (
                    [] if value is None else [{"name": keys.GATE}]
                )
            else:
                new_target = annotated(target, key, value)
                target.clear()
                target.update(new_target)
            done = write(state, "replicasets", "UPDATE", new, old, now=now)
        else:
            _, owner_name, forged, group = action
            self.serial += 1
            ref = (
                TENANT_OWNER
                if owner_name == "tenant"
                else owner("ReplicaSet", owner_name, f"uid-rs-{owner_name}")
            )
            if owner_name == "squat" and "squat" not in objects:
                squat = replicaset("squat", 1000, "squat")
                assert write(state, "replicasets", "CREATE", squat, now=now).allowed
                objects["squat"] = squat
                ingest.upsert(state, squat)
            made = pod(f"{owner_name}-{self.serial}", owner=ref, group=group, card=R4090 if group else H200)
            made["metadata"]["uid"] = f"uid-new-{self.serial}"
            if forged:
                made["metadata"]["annotations"][keys.WAITING] = MARK
                made["spec"]["schedulingGates"] = [{"name": keys.GATE}]
            done = write(state, "pods", "CREATE", made, now=now)
            name = made["metadata"]["name"]
        if done.allowed:
            target = done.obj
            if kind == "podgroup":
                name = "pg-train"
            elif kind in ("pod", "replicaset"):
                name = action[1]
            objects[name] = target
            ingest.upsert(state, target)


def charges(state: ClusterState) -> dict[str, Any]:
    return {
        uid: (c.queue, c.card, c.spec, c.count)
        for uid in state.pods
        if (c := state.charged.charge(uid)) is not None
    }


def lines(state: ClusterState) -> dict[str, list[str]]:
    return {q: [w.what for w in state.line.line(q)] for q in QUOTAS}


@settings(
    max_examples=int(os.environ.get("CARDQUOTA_TRUST_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(writes=WRITES)
def test_no_write_of_a_tenant_moves_a_charge_reorders_a_line_or_passes_a_quota(
    writes: list[tuple[Any, ...]],
) -> None:
    tenant = Tenant()
    for step, action in enumerate(writes):
        before_charges, before_lines = charges(tenant.state), lines(tenant.state)
        tenant.apply(action, now=10.0 + step)
        after = charges(tenant.state)
        for uid, charge in before_charges.items():
            assert after.get(uid) == charge, f"{action} moved the charge of {uid}"
        for name, line in lines(tenant.state).items():
            was = before_lines[name]
            kept = [w for w in line if w in was]
            assert kept == [w for w in was if w in line], f"{action}: line {name} reordered: {was} -> {line}"
            newcomers = [i for i, w in enumerate(line) if w not in was]
            assert all(i >= len(kept) for i in newcomers), f"{action}: line {name} jumped: {was} -> {line}"
        for name, quota in QUOTAS.items():
            usage = queue_usage(tenant.state, name)
            for card, limit in quota.items():
                used = usage.card(CardName(card)).used
                assert used <= limit * 1000, f"{action}: queue {name} holds {used / 1000} {card} of {limit}"

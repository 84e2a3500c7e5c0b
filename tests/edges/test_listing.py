"""The pod list's fast path against the ordinary reading of the same JSON.

Whatever a page holds, the fast path either gives up (None: the page is read the ordinary way) or
gives, pod for pod, the very records the ordinary reading gives, and only for pods the shape check
accepts. Pages come from real pods (one recorded from the local control plane, and builder pods
with init containers, overhead, pod-level resources, deletion times, owners) with any node, or any
field the core reads, replaced by hostile JSON.
"""

import asyncio
import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import H200, H800, owner, pod
from tests.edges.test_cache import POD, Scripted, informer, run_script, versioned
from tests.edges.test_fuzz import json_values, paths, replaced
from webhook.cluster import listing
from webhook.core.index import ingest
from webhook.core.model import keys, objects, shapes
from webhook.core.model.compact import Pool

RECORDED = orjson.loads((Path(__file__).parents[1] / "bench" / "recorded" / "pod.json").read_bytes())
SIDECAR = {"name": "s", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
INIT = {"name": "i", "resources": {"requests": {"nvidia.com/gpu": "2", "cpu": "1"}}}
PODS = [
    RECORDED,
    pod("plain", H200, 2, owner=owner("ReplicaSet", "rs", "rs-1")),
    pod("bound", f"{H200}|{H800}", 1, node_name="n1", phase="Running", group="pg"),
    pod("init", H800, 1, spec={"initContainers": [INIT, SIDECAR], "overhead": {"nvidia.com/gpu": "1"}}),
    pod("pod-level", None, None, spec={"resources": {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}}}),
    pod(
        "two",
        None,
        1,
        spec={"containers": [{"name": "a"}, {"name": "b", "resources": {"requests": {"cpu": "500m"}}}]},
    ),
    {
        **pod("going", H200, 1, phase="Running", node_name="n2"),
        "metadata": {
            "name": "going",
            "namespace": "ns",
            "uid": "u-going",
            "deletionTimestamp": "2026-11-23T10:00:00Z",
            "deletionGracePeriodSeconds": 30,
            "annotations": {"volcano.sh/card.name": H200, "scheduling.k8s.io/group-name": None},
        },
    },
    pod(
        "gated",
        H200,
        1,
        owner=owner("ReplicaSet", "rs", "rs-1"),
        annotations={keys.WAITING: '{"since":"2026-11-24T18:00:00.123Z","priority":7}'},
        spec={"schedulingGates": [{"name": "other"}, {"name": keys.GATE}]},
    ),
    {  # Volcano reads volcano.sh/preemptable from the label when no annotation says it
        **pod("labelled", H200, 1, phase="Running", node_name="n2"),
        "metadata": {
            "name": "labelled",
            "namespace": "ns",
            "uid": "u-labelled",
            "labels": {keys.PREEMPTABLE: "F"},
        },
    },
]
# Where the core reads, including fields these pods do not have.
READ = [
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "uid"),
    ("metadata", "annotations", "volcano.sh/card.name"),
    ("metadata", "labels", "app"),
    ("metadata", "labels", keys.PREEMPTABLE),
    ("metadata", "annotations", keys.PREEMPTABLE),
    ("metadata", "ownerReferences", 0, "controller"),
    ("metadata", "ownerReferences", 0, "uid"),
    ("metadata", "deletionTimestamp"),
    ("metadata", "deletionGracePeriodSeconds"),
    ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"),
    ("spec", "containers", 0, "resources", "requests", "cpu"),
    ("spec", "containers", 0, "restartPolicy"),
    ("spec", "initContainers"),
    ("spec", "overhead", "nvidia.com/gpu"),
    ("spec", "resources", "requests", "cpu"),
    ("spec", "resources", "limits"),
    ("spec", "nodeSelector", "x"),
    ("spec", "nodeName"),
    ("spec", "affinity", "nodeAffinity", shapes.REQUIRED, "nodeSelectorTerms", 0, "matchExpressions"),
    ("spec", "schedulerName"),
    ("spec", "schedulingGates", 1, "name"),
    ("metadata", "annotations", keys.WAITING),
    ("status", "phase"),
    ("status", "startTime"),
    ("kind",),
]
hostile = json_values | st.sampled_from(
    ["NaN", "1e400", "-1", "0.5", "", "2026-13-45", "1Ki", 1, 1.5, True, [], {}]
)


def page_of(items: list[Any]) -> bytes:
    body = {"kind": "PodList", "metadata": {"resourceVersion": "7", "continue": ""}, "items": items}
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


def ordinary(item: Any, pool: Pool) -> objects.PodRecord | None:
    """What the ordinary reading keeps of a list item: None when it is skipped."""
    if not isinstance(item, dict):
        return None
    item = {**item}
    item.setdefault("kind", "Pod")
    if ingest.bucket(item) != "Pod" or shapes.problem("pods", "", item):
        return None
    return pool.pod(objects.pod_record(item))


def agrees(body: bytes) -> listing.Page | None:
    fast = listing.PodReader(Pool()).page(body)
    if fast is None:
        return None
    items = orjson.loads(body)["items"]  # the fast path never takes what orjson cannot read
    pool = Pool()
    assert fast.pods == [ordinary(item, pool) for item in items]
    assert [p.uid for p in fast.pods] == [ingest.identity(item, "Pod") for item in items]
    return fast


def test_real_pods_take_the_fast_path_and_give_the_ordinary_records() -> None:
    fast = agrees(page_of(PODS))
    assert fast is not None and fast.version == "7" and len(fast.pods) == len(PODS)
    going, gated, labelled = fast.pods[-3:]
    (level,) = [p for p in fast.pods if p.name == "pod-level"]
    assert (level.template.resources.cpu, level.template.resources.memory) == (2000, 2**30)
    assert labelled.template.annotations == {keys.PREEMPTABLE: "F"}  # the label, as Volcano reads it
    assert gated.waiting == (objects.waiting_mark('{"since":"2026-11-24T18:00:00.123Z"}')[0], 7)  # type: ignore[index]
    assert (
        going.waiting is None
        and going.deletion_deadline is not None
        and going.template.annotations == {"volcano.sh/card.name": H200}
    )


def test_pods_of_one_workload_share_one_template_and_owner() -> None:
    replicas = [pod(f"r{i}", H200, 1, owner=owner("ReplicaSet", "rs", "rs-1")) for i in range(3)]
    fast = listing.PodReader(Pool()).page(page_of(replicas))
    assert fast is not None
    assert len({id(p.template) for p in fast.pods}) == 1 and len({id(p.owner) for p in fast.pods}) == 1


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=hostile)
def test_any_node_or_read_field_replaced_by_anything_fast_or_ordinary_agree(
    data: st.DataObject, value: Any
) -> None:
    base = data.draw(st.sampled_from(PODS))
    path = data.draw(st.sampled_from(READ) | st.sampled_from(list(paths(base))))
    items = [copy.deepcopy(PODS[1]), replaced(base, path, value)]
    with contextlib.suppress(orjson.JSONDecodeError):  # orjson cannot read it, msgspec could (big numbers)
        agrees(page_of(items))


def test_an_odd_pod_sends_its_page_the_ordinary_way_where_it_is_skipped_and_the_rest_applied() -> None:
    odd = versioned(pod("odd", H200), 3)
    odd["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "NaN"
    fine = [versioned(pod(f"p{i}", H200), 4 + i) for i in range(3)]
    inf, _ = informer(POD, Scripted([fine[:2], [fine[2], odd]], 9, [[]]))
    asyncio.run(run_script(inf))
    assert {p.name for p in inf.state.pods.values()} == {"p0", "p1", "p2"}
    assert list(inf.state.skipped) == ["Pod/ns/odd"]
    assert "quantity 'NaN' is not a Kubernetes quantity" in inf.state.skipped["Pod/ns/odd"]

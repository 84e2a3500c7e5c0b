"""The state keeps one shared template, owner and charge for pods that only differ in name and uid,
and its indexes of pods keep no key once its last pod is gone."""

import gc
from typing import Any

from tests.builders import H200, cluster, node, pod, queue
from webhook.core.model import objects
from webhook.core.model.cards import units


def replica(i: int, **extra: object) -> objects.PodRecord:
    owner = {"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "apiVersion": "apps/v1", "controller": True}
    raw = pod(f"web-{i}", H200, 1, owner=owner, node_name="h0", phase="Running", **extra)  # type: ignore[arg-type]
    raw["metadata"]["annotations"]["cni.example/pod-ip"] = f"10.0.0.{i}"  # per-pod noise is not kept
    return objects.pod_record(raw)


def test_replicas_share_one_template_owner_and_charge_and_keep_only_what_decisions_read() -> None:
    state = cluster(node("h0", H200), queue("q", '{"NVIDIA-H200": 8}'))
    for i in range(3):
        state.upsert_pod(replica(i))
    first, second = (state.pods[f"uid-ns-web-{i}"] for i in (0, 1))
    assert first.template is second.template and first.owner is second.owner
    assert state.charged.charge(first.uid) is state.charged.charge(second.uid)
    assert set(first.template.annotations) == {"volcano.sh/card.name", "scheduling.volcano.sh/queue-name"}
    assert state.tree.tallies["q"].bound["NVIDIA-H200"] == units(3)


def test_a_shared_value_goes_when_its_last_pod_goes() -> None:
    state = cluster(node("h0", H200), queue("q", '{"NVIDIA-H200": 8}'))
    state.upsert_pod(replica(0))
    pool = state.pool
    assert len(pool._templates) == 1 and len(pool._values) == 2  # the owner and the charge
    state.delete_pod("uid-ns-web-0")
    gc.collect()
    assert len(pool._templates) == 0 and len(pool._values) == 0 and state.tree.tallies["q"].bound == {}


def test_a_node_podgroup_or_owner_is_forgotten_with_its_last_pod() -> None:
    state = cluster(node("h0", H200), queue("q", '{"NVIDIA-H200": 8}'))
    state.upsert_pod(replica(0, group="pg"))
    rs = {"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "apiVersion": "apps/v1", "controller": True}
    state.upsert_pod(objects.pod_record(pod("wait", H200, 1, owner=rs)))
    charged, both = state.charged, {"uid-ns-web-0", "uid-ns-wait"}
    assert set(charged.on_node("h0")) == set(charged.in_group("ns/pg")) == {"uid-ns-web-0"}
    assert set(charged.owned_by("rs-uid")) == both and set(charged.unbound()) == {"uid-ns-wait"}
    state.upsert_pod(objects.pod_record(pod("wait", H200, 1, owner=rs, node_name="h0", phase="Running")))
    assert set(charged.on_node("h0")) == both and not charged.unbound()
    for uid in both:
        state.delete_pod(uid)
    assert not charged.on_node("h0") and not charged.in_group("ns/pg") and not charged.owned_by("rs-uid")
    assert charged._by_node._of == charged._by_group._of == charged._by_owner._of == {}


def test_a_pods_priority_is_read_into_its_template_and_an_odd_one_is_0() -> None:
    def priority(value: Any) -> int:
        return objects.pod_record(pod("p", H200, spec={"priority": value})).priority

    assert priority(1000) == 1000 and priority(-5) == -5 and priority(2**40) == 2**31
    assert priority("1000") == priority(True) == priority(1.5) == priority(None) == priority([]) == 0
    assert objects.pod_record(pod("p", H200, spec={"priority": 7})).template.priority == 7


def test_a_cached_pod_keeps_its_priority_through_the_pool_and_the_list_fast_path() -> None:
    """Tidal reclaim orders victim gangs by their pods' PriorityClass: the cache must keep it."""
    import orjson

    from webhook.cluster.listing import PodReader

    obj = pod("p", H200, spec={"priority": 1000})
    state = cluster(obj)
    assert state.pods["uid-ns-p"].priority == 1000
    page = PodReader(state.pool).page(orjson.dumps({"items": [obj], "metadata": {}}))
    assert page is not None and page.pods[0].priority == 1000

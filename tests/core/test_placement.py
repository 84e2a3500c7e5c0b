"""Which nodes a pod may be scheduled on, as kube-scheduler's NodeUnschedulable, TaintToleration and
NodeAffinity filters read them (the rules written out from the Kubernetes API reference)."""

from typing import Any

import pytest

from webhook.core.model import placement

NODE = {
    "metadata": {"name": "gpu-7", "labels": {"zone": "a", "gen": "9", "pool": "infer"}},
    "spec": {
        "taints": [
            {"key": "gpu", "value": "train", "effect": "NoSchedule"},
            {"key": "soft", "value": "x", "effect": "PreferNoSchedule"},  # a preference: never blocks
        ]
    },
}
TOLERATES = [{"key": "gpu", "operator": "Equal", "value": "train", "effect": "NoSchedule"}]


def pod(
    selector: dict[str, str] | None = None,
    terms: list[Any] | None = None,
    tolerations: list[Any] | None = None,
    **status: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": selector or {},
        "tolerations": TOLERATES if tolerations is None else tolerations,
    }
    if terms is not None:
        spec["affinity"] = {"nodeAffinity": {placement.REQUIRED: {"nodeSelectorTerms": terms}}}
    return {"spec": spec, "status": status}


def may(obj: dict[str, Any], node: dict[str, Any] = NODE) -> bool:
    return placement.usable(placement.node_facts(node), placement.pod_place(obj))


@pytest.mark.parametrize(
    ("tolerations", "allowed"),
    [
        ([], False),
        (TOLERATES, True),
        ([{"key": "gpu", "operator": "Exists"}], True),  # any value, any effect
        ([{"operator": "Exists"}], True),  # no key with Exists: every taint
        ([{"key": "gpu", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}], False),
        ([{"key": "gpu", "value": "train"}], True),  # Equal is the default operator; any effect
        ([{"key": "gpu", "operator": "Equal", "value": "train", "effect": "NoExecute"}], False),
        ([{"key": "other", "operator": "Exists"}], False),
    ],
)
def test_a_node_is_usable_only_when_every_blocking_taint_is_tolerated(
    tolerations: list[Any], allowed: bool
) -> None:
    assert may(pod(tolerations=tolerations)) is allowed


@pytest.mark.parametrize(
    ("selector", "terms", "allowed"),
    [
        ({"zone": "a"}, None, True),
        ({"zone": "b"}, None, False),
        ({"missing": "x"}, None, False),
        (None, [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}], True),
        (None, [{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}], False),
        (None, [{"matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["a"]}]}], True),
        (None, [{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}], True),
        (None, [{"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}], False),
        (None, [{"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["8"]}]}], True),
        (None, [{"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["8"]}]}], False),
        (None, [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}], True),
        (None, [{}], False),  # an empty term selects no node
        (None, [], False),  # no term at all: none either
        (  # terms are ORed, the expressions of one term ANDed
            None,
            [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                {
                    "matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["a"]},
                        {"key": "pool", "operator": "In", "values": ["infer"]},
                    ]
                },
            ],
            True,
        ),
    ],
)
def test_node_selector_and_required_affinity(
    selector: dict[str, str] | None, terms: list[Any] | None, allowed: bool
) -> None:
    assert may(pod(selector, terms)) is allowed


def test_a_cordoned_node_is_usable_by_no_pod() -> None:
    cordoned = {**NODE, "spec": {**NODE["spec"], "unschedulable": True}}
    assert may(pod()) and not may(pod(), cordoned)


def test_the_scheduler_must_have_found_no_node_and_no_gate_must_hold_the_pod() -> None:
    said = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    assert placement.pod_place(pod(**said)).unschedulable
    gated = pod(**said)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    assert not placement.pod_place(gated).unschedulable
    waiting = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    assert not placement.pod_place(pod(**waiting)).unschedulable
    assert not placement.pod_place(pod()).unschedulable


@pytest.mark.parametrize(
    "junk", [None, 1, "x", [], {"spec": []}, {"spec": {"affinity": 3, "tolerations": {}}}]
)
def test_any_shape_reads_without_an_exception(junk: Any) -> None:
    obj = junk if isinstance(junk, dict) else {"spec": junk, "metadata": junk}
    placement.usable(placement.node_facts(obj), placement.pod_place(obj))

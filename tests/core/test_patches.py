"""SPEC §6b: RFC 6902 patches that never overwrite what the user set and change nothing twice."""

import json
from typing import Any

import jsonpatch
import pytest

from tests.builders import (
    H200,
    R4090,
    R4090D,
    ascend_node,
    cluster,
    deployment,
    node,
    owner,
    pod,
    podgroup,
    replicaset,
    request,
    statefulset,
    template,
    vcjob,
)
from webhook.core.decide import admission
from webhook.core.index.state import ClusterState
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Allowed

KEY = "nvidia.com/gpu.product"
REQ = "requiredDuringSchedulingIgnoredDuringExecution"


def mutated(
    state: ClusterState, obj: dict[str, Any], resource: str = "pods", group: str = ""
) -> dict[str, Any]:
    decision = admission.mutate(state, request(obj, resource=resource, group=group))
    assert isinstance(decision, Allowed)
    return jsonpatch.apply_patch(obj, [dict(op) for op in decision.patch])


def terms(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"]


OURS = {"key": KEY, "operator": "In", "values": [R4090, R4090D]}
ZONE_A = {"key": "zone", "operator": "In", "values": ["a"]}


@pytest.mark.parametrize(
    ("spec", "expected_terms"),
    [
        pytest.param({}, [{"matchExpressions": [OURS]}], id="no affinity"),
        pytest.param(
            {"affinity": {"podAntiAffinity": {}}}, [{"matchExpressions": [OURS]}], id="other affinity kept"
        ),
        pytest.param(
            {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
            [{"matchExpressions": [OURS]}],
            id="only preferred",
        ),
        pytest.param(
            {"affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": []}}}},
            [{"matchExpressions": [OURS]}],
            id="empty terms",
        ),
        pytest.param(
            {
                "affinity": {
                    "nodeAffinity": {
                        REQ: {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [ZONE_A]},
                                {
                                    "matchFields": [
                                        {"key": "metadata.name", "operator": "In", "values": ["n1"]}
                                    ]
                                },
                            ]
                        }
                    }
                }
            },
            [
                {"matchExpressions": [ZONE_A, OURS]},
                {
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
                    "matchExpressions": [OURS],
                },
            ],
            id="ANDed into every term",
        ),
    ],
)
def test_card_pods_get_required_affinity_for_their_models(
    spec: dict[str, Any], expected_terms: list[dict[str, Any]]
) -> None:
    state = cluster(node("r", R4090))
    out = mutated(state, pod("p", f"{R4090}|{R4090D}", spec=spec))
    assert terms(out) == expected_terms
    for key, value in spec.get("affinity", {}).items():
        if key != "nodeAffinity":
            assert out["spec"]["affinity"][key] == value


def test_a_second_pass_changes_nothing() -> None:
    state = cluster(node("r", R4090))
    once = mutated(state, pod("p", f" {R4090} | {R4090D} "))
    assert admission.mutate(state, request(once)) == Allowed(
        "card pod confined to its models", card=f"{R4090}|{R4090D}"
    )
    assert mutated(state, once) == once


def test_the_card_name_is_rewritten_to_the_canonical_form_the_scheduler_reads() -> None:
    out = mutated(cluster(), pod("p", f" {R4090} |{R4090D}"))
    assert out["metadata"]["annotations"]["volcano.sh/card.name"] == f"{R4090}|{R4090D}"


def test_the_label_key_comes_from_discovery() -> None:
    ascend = ascend_node()
    out = mutated(cluster(ascend), pod("p", "Ascend-910B", resource="huawei.com/Ascend910"))
    assert terms(out) == [
        {"matchExpressions": [{"key": "huawei.com/npu.product", "operator": "In", "values": ["Ascend-910B"]}]}
    ]


def test_sub_cards_are_confined_to_their_product() -> None:
    out = mutated(cluster(), pod("p", "NVIDIA-H200/mig-1g.18gb-mixed", resource="nvidia.com/mig-1g.18gb"))
    assert terms(out)[0]["matchExpressions"] == [{"key": KEY, "operator": "In", "values": [H200]}]


def test_non_card_pods_are_untouched() -> None:
    decision = admission.mutate(cluster(), request(pod("web", card=None, count=None)))
    assert isinstance(decision, Allowed) and decision.patch == ()


RS = owner("ReplicaSet", "chat-1", "uid-rs-chat-1")
JOB = owner("Job", "train", "uid-job-train", "batch.volcano.sh/v1alpha1")
PG = dict(resource="podgroups", group="scheduling.volcano.sh")


def annotations_after(state: ClusterState, group: dict[str, Any]) -> dict[str, str]:
    return mutated(state, group, **PG)["metadata"].get("annotations", {})


def test_podgroups_of_a_replicaset_get_card_name_and_a_derived_request() -> None:
    state = cluster(deployment("chat", 3, count=2), replicaset("chat-1", 3, "chat", count=2))
    out = annotations_after(state, podgroup("pg", "Pending", owner_ref=RS, minMember=3))
    assert out == {
        "volcano.sh/card.name": H200,
        "volcano.sh/card.request": json.dumps({H200: 6}, separators=(",", ":")),
    }


def test_podgroups_of_a_volcano_job_sum_their_tasks_by_card_spec() -> None:
    job = vcjob("train", [(2, template(H200)), (3, template(f"{R4090}|{R4090D}")), (1, template(H200, 2))])
    out = annotations_after(cluster(job), podgroup("pg", "Pending", owner_ref=JOB, minMember=6))
    assert "volcano.sh/card.name" not in out  # tasks use different specs
    assert json.loads(out["volcano.sh/card.request"]) == {H200: 4, f"{R4090}|{R4090D}": 3}


def test_podgroup_annotations_the_user_set_are_never_overwritten() -> None:
    state = cluster(deployment("chat", 3), replicaset("chat-1", 3, "chat"))
    group = podgroup("pg", "Pending", '{"NVIDIA-H200": 1}', owner_ref=RS, minMember=3)
    out = annotations_after(state, group)
    assert out["volcano.sh/card.request"] == '{"NVIDIA-H200": 1}' and out["volcano.sh/card.name"] == H200
    assert mutated(state, mutated(state, group, **PG), **PG) == mutated(state, group, **PG)


def test_service_type_and_preemptable_follow_the_owner_kind_when_enabled() -> None:
    policy = Policy(service_type=True)
    state = cluster(
        deployment("chat", 1),
        replicaset("chat-1", 1, "chat"),
        vcjob("train", [(1, template(H200))]),
        policy=policy,
    )
    inference = annotations_after(state, podgroup("a", "Pending", owner_ref=RS, minMember=1))
    training = annotations_after(state, podgroup("b", "Pending", owner_ref=JOB, minMember=1))
    assert (inference["volcano.sh/service.type"], inference["volcano.sh/preemptable"]) == (
        "inference",
        "false",
    )
    assert (training["volcano.sh/service.type"], training["volcano.sh/preemptable"]) == ("training", "true")


STS = owner("StatefulSet", "db", "uid-sts-db")
BATCH = owner("Job", "etl", "uid-batch-etl", "batch/v1")


@pytest.mark.parametrize(
    ("policy", "owner_ref", "preset", "expected"),
    [
        pytest.param(Policy(), RS, {}, {}, id="off by default"),
        pytest.param(
            Policy(service_type=True),
            RS,
            {},
            {"volcano.sh/service.type": "inference", "volcano.sh/preemptable": "false"},
            id="replicaset",
        ),
        pytest.param(
            Policy(service_type=True),
            STS,
            {},
            {"volcano.sh/service.type": "inference", "volcano.sh/preemptable": "false"},
            id="statefulset",
        ),
        pytest.param(
            Policy(service_type=True),
            JOB,
            {},
            {"volcano.sh/service.type": "training", "volcano.sh/preemptable": "true"},
            id="volcano job",
        ),
        pytest.param(
            Policy(service_type=True),
            BATCH,
            {},
            {"volcano.sh/service.type": "training", "volcano.sh/preemptable": "true"},
            id="batch job",
        ),
        pytest.param(
            Policy(service_type=True),
            RS,
            {"volcano.sh/service.type": "training"},
            {"volcano.sh/service.type": "training", "volcano.sh/preemptable": "true"},
            id="the user's service type kept, preemptable follows it",
        ),
        pytest.param(
            Policy(service_type=True),
            RS,
            {"volcano.sh/preemptable": "true"},
            {"volcano.sh/service.type": "inference", "volcano.sh/preemptable": "true"},
            id="the user's preemptable kept",
        ),
        pytest.param(
            Policy(service_type=True, service_type_by_kind={"StatefulSet": "training"}),
            STS,
            {},
            {"volcano.sh/service.type": "training", "volcano.sh/preemptable": "true"},
            id="mapping configured",
        ),
        pytest.param(
            Policy(service_type=True, service_type_by_kind={"StatefulSet": "training"}),
            RS,
            {},
            {},
            id="a kind left out of the mapping gets nothing",
        ),
        pytest.param(
            Policy(service_type=True, preemptable_by_service_type={"training": "false"}),
            RS,
            {},
            {"volcano.sh/service.type": "inference"},
            id="a service type left out of the preemptable mapping gets no preemptable",
        ),
    ],
)
def test_service_type_and_preemptable_rules(
    policy: Policy, owner_ref: dict[str, Any], preset: dict[str, str], expected: dict[str, str]
) -> None:
    state = cluster(
        deployment("chat", 1),
        replicaset("chat-1", 1, "chat"),
        statefulset("db", 1),
        pod("etl-0", owner=BATCH),  # a batch Job is known by its pods
        vcjob("train", [(1, template(H200))]),
        policy=policy,
    )
    group = podgroup("pg", "Pending", owner_ref=owner_ref, minMember=1)
    group["metadata"]["annotations"] = dict(preset)
    out = annotations_after(state, group)
    assert {k: out[k] for k in ("volcano.sh/service.type", "volcano.sh/preemptable") if k in out} == expected
    assert mutated(state, mutated(state, group, **PG), **PG) == mutated(state, group, **PG)  # idempotent


def test_a_bare_pod_podgroup_reads_the_pod_itself() -> None:
    bare = pod("solo", count=2)
    state = cluster(bare)
    group = podgroup(
        "podgroup-solo", "Pending", owner_ref=owner("Pod", "solo", "uid-ns-solo", "v1"), minMember=1
    )
    assert annotations_after(state, group)["volcano.sh/card.request"] == '{"NVIDIA-H200":2}'


def test_an_owner_missing_from_the_cache_leaves_the_podgroup_unchanged() -> None:
    decision = admission.mutate(cluster(), request(podgroup("pg", "Pending", owner_ref=RS), **PG))
    assert isinstance(decision, Allowed) and decision.patch == () and "not found" in decision.reason


def test_a_podgroup_created_without_its_annotations_gets_them_when_it_is_enqueued() -> None:
    """The PodGroup mutation's policy is Ignore: a create it could not answer leaves the PodGroup
    bare, and the enqueue gate only sees card PodGroups. The update that moves it to Inqueue adds
    what the create would have (and changes nothing on one that has them)."""
    state = cluster(deployment("chat", 2), replicaset("chat-1", 2, "chat"))
    bare = podgroup("pg", "Pending", owner_ref=RS, minMember=1)
    enqueued = podgroup("pg", "Inqueue", owner_ref=RS, minMember=1)
    decision = admission.mutate(state, request(enqueued, operation="UPDATE", old=bare, **PG))
    assert isinstance(decision, Allowed)
    out = jsonpatch.apply_patch(enqueued, [dict(op) for op in decision.patch])
    assert out["metadata"]["annotations"] == {
        "volcano.sh/card.name": H200,
        "volcano.sh/card.request": json.dumps({H200: 1}, separators=(",", ":")),
    }
    again = admission.mutate(state, request(out, operation="UPDATE", old=bare, **PG))
    assert isinstance(again, Allowed) and again.patch == ()
    status = admission.mutate(state, request(enqueued, operation="UPDATE", old=bare, sub="status", **PG))
    assert isinstance(status, Allowed) and status.patch == ()

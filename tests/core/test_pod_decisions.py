"""SPEC §4–§6 for pod creates: table-driven over small clusters built in memory."""

from typing import Any

import pytest

from tests.builders import (
    GPU,
    H200,
    H800,
    R4090,
    R4090D,
    cluster,
    deployment,
    expression,
    node,
    owner,
    pod,
    podgroup,
    queue,
    replicaset,
    request,
    required_affinity,
)
from webhook.core.decide import admission
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model.cards import UNIT
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Allowed, Denied

NODES = (node("h200", H200), node("h800", H800), node("r", R4090, 4), node("rd", R4090D, 2))


def decide(state: ClusterState, obj: dict[str, Any], now: float = 0.0) -> Allowed | Denied:
    return admission.validate(state, request(obj), now)


def flex(n: int = 1) -> str:
    return f"{R4090}|{R4090D}"


CASES = [
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 3}'), pod("run", node_name="h200", phase="Running"), pod("wait")],
        pod("new", count=1),
        None,
        id="fits: 1 left, needs 1",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 3}'), pod("run", node_name="h200", phase="Running"), pod("wait")],
        pod("trainer-0", count=2),
        'queue "q" has 1 NVIDIA-H200 left (quota 3: 1 running, 1 pending); pod ns/trainer-0 needs 2',
        id="over quota names queue, card, numbers and pod",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 1}'), pod("done", phase="Succeeded"), pod("failed", phase="Failed")],
        pod("new"),
        None,
        id="terminal pods free their cards",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H800": 2}')],
        pod("new"),
        'queue "q" has no NVIDIA-H200 quota; pod ns/new needs 1',
        id="card missing from the quota",
    ),
    pytest.param(
        [queue("q")],
        pod("new"),
        'queue "q" has no card quota (no volcano.sh/card.quota annotation)',
        id="queue without any quota",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 3}', state="Closed")],
        pod("new"),
        'queue "q" is Closed',
        id="closed queue",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 3}', state="Closing")],
        pod("new"),
        'queue "q" is Closing',
        id="closing queue",
    ),
    pytest.param([], pod("new"), 'queue "q" does not exist', id="missing queue"),
    pytest.param(
        [queue("default", '{"NVIDIA-H200": 1}')],
        pod("new", queue_name=None),
        None,
        id="queue defaults to default",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-GeForce-RTX-4090": 1, "NVIDIA-GeForce-RTX-4090-D": 1}'), pod("f", flex())],
        pod("solo", R4090),
        None,
        id="multi-card: fits by moving the pending A|B pod to B",
    ),
    pytest.param(
        [
            queue("q", '{"NVIDIA-GeForce-RTX-4090": 1, "NVIDIA-GeForce-RTX-4090-D": 1}'),
            pod("f1", flex()),
            pod("f2", flex()),
        ],
        pod("third", flex()),
        'none of NVIDIA-GeForce-RTX-4090 (0 left), NVIDIA-GeForce-RTX-4090-D (0 left) in queue "q" can hold pod ns/third needing 1',
        id="multi-card: N pending A|B pods do not over-admit",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-GeForce-RTX-4090": 1, "NVIDIA-GeForce-RTX-4090-D": 1}')],
        pod("two", flex(), 2),
        "can hold pod ns/two needing 2",
        id="multi-card: one pod is not split across models",
    ),
    pytest.param(
        [
            queue("q", '{"NVIDIA-GeForce-RTX-4090": 1, "NVIDIA-GeForce-RTX-4090-D": 1}'),
            pod("b", flex(), node_name="rd", phase="Running"),
        ],
        pod("solo", R4090D),
        'queue "q" has 0 NVIDIA-GeForce-RTX-4090-D left (quota 1: 1 running)',
        id="multi-card: a bound pod is charged to its node's model",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 4}')],
        pod("mixed", "NVIDIA-GeForce-RTX-4090|NVIDIA-H20/mig-1g.24gb-mixed"),
        "different resources (NVIDIA-GeForce-RTX-4090 is nvidia.com/gpu, NVIDIA-H20/mig-1g.24gb-mixed is nvidia.com/mig-1g.24gb)",
        id="mixed-resource multi-card spec",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 4}')], pod("zero", count=0), "requests 0 nvidia.com/gpu", id="count 0"
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 4}')],
        pod("none", count=None),
        "requests 0 nvidia.com/gpu",
        id="no resource",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 4}')],
        pod("sneaky", card=None),
        "requests 1 nvidia.com/gpu but has no volcano.sh/card.name annotation",
        id="card resource without card name",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 4}')], pod("cpu", card=None, count=None), None, id="not a card pod"
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 4}')],
        pod("sel", spec={"nodeSelector": {"nvidia.com/gpu.product": H800}}),
        "nodeSelector nvidia.com/gpu.product=NVIDIA-H800 selects another model",
        id="nodeSelector contradicts the card",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 4}')],
        pod("aff", spec=required_affinity([expression("NotIn", H200)])),
        "required node affinity (nvidia.com/gpu.product NotIn [NVIDIA-H200]) selects no node of that model",
        id="required affinity contradicts the card",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 4}')],
        pod("aff-ok", spec=required_affinity([expression("In", H800)], [expression("In", H200)])),
        None,
        id="one satisfiable term is enough",
    ),
    pytest.param(
        [queue("q", '{"NVIDIA-H200": 4}')],
        pod("pinned", node_name="h800"),
        "is preset to node h800, which carries NVIDIA-H800",
        id="preset node of another model",
    ),
]


@pytest.mark.parametrize(("objects", "new_pod", "denial"), CASES)
def test_pod_create(objects: list[dict[str, Any]], new_pod: dict[str, Any], denial: str | None) -> None:
    decision = decide(cluster(*NODES, *objects), new_pod)
    if denial is None:
        assert isinstance(decision, Allowed), decision
    else:
        assert isinstance(decision, Denied) and denial in decision.message, decision


def test_unnamed_card_pods_can_be_allowed_with_a_warning_for_migration() -> None:
    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 4}'), policy=Policy(unnamed_card_pods="warn"))
    decision = decide(state, pod("legacy", card=None))
    assert isinstance(decision, Allowed) and "no volcano.sh/card.name" in decision.warnings[0]


JOB = owner("Job", "train", "uid-job-train", "batch.volcano.sh/v1alpha1")


@pytest.mark.parametrize(
    ("group", "new_pod", "allowed"),
    [
        pytest.param(
            podgroup("pg", "Inqueue", '{"NVIDIA-H200": 2}', owner_ref=JOB),
            pod("w0", owner=JOB, group="pg"),
            True,
            id="gated by its PodGroup",
        ),
        pytest.param(
            podgroup("pg", "Pending", '{"NVIDIA-H200": 2}', owner_ref=JOB),
            pod("w0", owner=JOB, group="pg"),
            False,
            id="PodGroup not enqueued yet",
        ),
        pytest.param(
            podgroup("pg", "Inqueue", '{"NVIDIA-H200": 2}', owner_ref=JOB),
            pod("thief", group="pg"),
            False,
            id="another workload cannot borrow it",
        ),
        pytest.param(
            podgroup("pg", "Inqueue", '{"NVIDIA-H200": 1}', owner_ref=JOB),
            pod("w0", count=2, owner=JOB, group="pg"),
            False,
            id="beyond the reservation",
        ),
        pytest.param(
            podgroup("pg", "Running", None, owner_ref=JOB, minResources={GPU: "2"}),
            pod("w0", owner=JOB, group="pg"),
            True,
            id="minResources without card.request",
        ),
    ],
)
def test_volcano_job_pods_are_gated_by_their_podgroup(
    group: dict[str, Any], new_pod: dict[str, Any], allowed: bool
) -> None:
    from tests.builders import template, vcjob

    job = vcjob("train", [(2, template(H200))])
    full = pod("other", count=2, node_name="h200", phase="Running")
    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 2}'), job, group, full)
    assert isinstance(decide(state, new_pod), Allowed) is allowed


def test_a_podgroup_reservation_counts_against_other_pods() -> None:
    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 3}'), podgroup("pg", "Inqueue", '{"NVIDIA-H200": 2}'))
    decision = decide(state, pod("bare", count=2))
    assert isinstance(decision, Denied)
    assert "has 1 NVIDIA-H200 left (quota 3: 2 reserved by PodGroups)" in decision.message


@pytest.mark.parametrize(
    ("phase", "min_member", "pods", "reserved"),
    [
        pytest.param("Inqueue", 2, [], 2, id="inqueue, no pods yet: all it asks"),
        pytest.param("Running", 1, ["Running"], 1, id="running at its minimum, one more pod to come"),
        pytest.param("Running", 1, ["Succeeded"], 0, id="running, its only pod finished: nothing"),
        pytest.param("Running", 2, ["Running", "Failed"], 0, id="running below its minimum: nothing"),
    ],
)
def test_a_podgroup_reserves_as_the_plugin_counts_it(
    phase: str, min_member: int, pods: list[str], reserved: int
) -> None:
    """A Running group reserves only while at least minMember of its pods are bound
    (``capacity_card_queue.go``), so a finished pod's card frees at once, not when Volcano moves
    its group on."""
    members = [
        pod(f"m-{i}", node_name="h200", phase=state, group="pg", queue_name="q")
        for i, state in enumerate(pods)
    ]
    group = podgroup("pg", phase, '{"NVIDIA-H200": 2}', minMember=min_member)
    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 4}'), group, *members)
    assert queue_usage(state, "q").fixed.get(H200, {}).get("reserved", 0) // UNIT == reserved


def test_a_rollout_surge_pod_at_full_quota_says_its_replicaset_waits_in_line() -> None:
    state = cluster(
        *NODES,
        queue("q", '{"NVIDIA-H200": 2}'),
        deployment("web", 2),
        replicaset("web-old", 2, "web"),
        replicaset("web-new", 1, "web"),
        *[
            pod(
                f"web-old-{i}",
                owner=owner("ReplicaSet", "web-old", "uid-rs-web-old"),
                node_name="h200",
                phase="Running",
            )
            for i in range(2)
        ],
    )
    decision = decide(state, pod("web-new-0", owner=owner("ReplicaSet", "web-new", "uid-rs-web-new")))
    assert isinstance(decision, Denied)
    assert decision.message.endswith(
        "; it is a rolling-update surge pod of deployment ns/web: its ReplicaSet waits 1st in the"
        " queue's line and creates it the moment an old pod frees its card"
    )


def test_concurrent_creates_against_r_remaining_admit_exactly_r() -> None:
    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 3}'), pod("run", node_name="h200", phase="Running"))
    outcomes = []
    for i in range(6):
        req = request(pod(f"burst-{i}"))
        decision = admission.validate(state, req, 0.0)
        admission.admit(state, req, decision, 0.0)
        outcomes.append(isinstance(decision, Allowed))
    assert outcomes == [True, True, False, False, False, False]


def test_in_flight_admissions_expire_when_the_pod_never_arrives() -> None:
    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 1}'))
    first = request(pod("a"))
    admission.admit(state, first, admission.validate(state, first, 0.0), 0.0)
    assert isinstance(admission.validate(state, request(pod("b")), 1.0), Denied)
    assert isinstance(admission.validate(state, request(pod("b")), 31.0), Allowed)


def test_an_arriving_pod_replaces_its_in_flight_entry_without_double_counting() -> None:
    from webhook.core.model.objects import pod_record

    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 2}'))
    first = request(pod("a"))
    admission.admit(state, first, admission.validate(state, first, 0.0), 0.0)
    state.upsert_pod(pod_record(pod("a")))
    assert len(state.ledger) == 0
    assert isinstance(admission.validate(state, request(pod("b")), 1.0), Allowed)


def test_dry_run_admissions_leave_no_trace() -> None:
    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 1}'))
    dry = request(pod("a"), dry_run=True)
    admission.admit(state, dry, admission.validate(state, dry, 0.0), 0.0)
    assert len(state.ledger) == 0


def test_deletes_are_always_allowed() -> None:
    state = cluster(*NODES)
    assert isinstance(
        admission.validate(state, request(None, operation="DELETE", old=pod("x")), 0.0), Allowed
    )


def test_pods_past_their_deletion_grace_period_no_longer_count() -> None:
    leaving = pod("leaving", node_name="h200", phase="Running")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    leaving["metadata"]["deletionGracePeriodSeconds"] = 30
    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 1}'), leaving)
    from datetime import datetime

    deadline = datetime.fromisoformat("2026-01-01T00:00:30+00:00").timestamp()
    assert isinstance(decide(state, pod("next"), deadline - 1), Denied)
    assert isinstance(decide(state, pod("next"), deadline + 1), Allowed)

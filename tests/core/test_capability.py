"""The optional CPU/memory check: a queue's spec.capability limits the CPU and memory requests of its
Volcano-scheduled pods (the capacity-card plugin's semantics, cardUnlimitedCpuMemory included)."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import H200, cluster, deployment, node, pod, queue, request, scale_request
from webhook.core.decide import admission
from webhook.core.decide.capability import cpu_text, memory_text
from webhook.core.decide.report import cluster_status, status_table
from webhook.core.index.state import ClusterState
from webhook.core.model.objects import pod_record
from webhook.core.model.policy import Policy
from webhook.core.model.resources import compute_requests
from webhook.core.model.verdicts import Allowed, Denied

CHECK = Policy(cpu_memory_check=True)
UNLIMITED = Policy(cpu_memory_check=True, card_unlimited_cpu_memory=True)
CAPABILITY = {"cpu": "4", "memory": "8Gi"}


def cpu_pod(
    name: str,
    cpu: str = "1",
    memory: str = "1Gi",
    *,
    card: str | None = None,
    queue_name: str = "q",
    scheduler: str = "volcano",
    phase: str = "Pending",
    node_name: str = "",
) -> dict[str, Any]:
    obj = pod(name, card, 1 if card else None, queue_name=queue_name, phase=phase, node_name=node_name)
    container = obj["spec"]["containers"][0]
    resources = container.setdefault("resources", {})
    resources["requests"] = {"cpu": cpu, "memory": memory}
    obj["spec"]["schedulerName"] = scheduler
    return obj


def state_with(*objects: dict[str, Any], policy: Policy = CHECK, **capability: str) -> ClusterState:
    q = queue("q", '{"NVIDIA-H200": 8}', capability=capability or CAPABILITY)
    return cluster(node("h0", H200, 8), q, queue("bare", '{"NVIDIA-H200": 8}'), *objects, policy=policy)


def decide(state: ClusterState, obj: dict[str, Any], *, dry_run: bool = False) -> Allowed | Denied:
    req = request(obj, dry_run=dry_run)
    decision = admission.validate(state, req, 0.0)
    admission.admit(state, req, decision, 0.0)
    assert isinstance(decision, Allowed | Denied)
    return decision


RUNNING = [cpu_pod(f"r{i}", "1", "2Gi", phase="Running", node_name="c0") for i in range(3)]


@pytest.mark.parametrize(
    ("policy", "obj", "message"),
    [
        pytest.param(Policy(), cpu_pod("x", "3"), None, id="check off: nothing counted"),
        pytest.param(CHECK, cpu_pod("x", "1"), None, id="1 of 1 cpu left fits"),
        pytest.param(
            CHECK,
            cpu_pod("x", "1500m"),
            'queue "q" has 1 cpu left (capability 4: 3 requested by its pods); pod ns/x needs 1.5 cpu',
            id="cpu over",
        ),
        pytest.param(
            CHECK,
            cpu_pod("x", "100m", "3Gi"),
            'queue "q" has 2Gi memory left (capability 8Gi: 6Gi requested by its pods); pod ns/x needs'
            " 3Gi memory",
            id="memory over",
        ),
        pytest.param(CHECK, cpu_pod("x", "3", scheduler="default-scheduler"), None, id="not Volcano's pod"),
        pytest.param(
            CHECK,
            cpu_pod("x", "2", card=H200),
            'queue "q" has 1 cpu left (capability 4: 3 requested by its pods); pod ns/x needs 2 cpu',
            id="a card pod is charged",
        ),
        pytest.param(UNLIMITED, cpu_pod("x", "2", card=H200), None, id="cardUnlimitedCpuMemory"),
        pytest.param(
            UNLIMITED,
            cpu_pod("x", "2"),
            'queue "q" has 1 cpu left (capability 4: 3 requested by its pods); pod ns/x needs 2 cpu',
            id="unlimited spares only card pods",
        ),
        pytest.param(
            CHECK,
            cpu_pod("x", "250m", queue_name="bare"),
            'queue "bare" sets no cpu in spec.capability, so it admits no pod that requests cpu (the'
            " CPU/memory check counts a missing resource as 0); pod ns/x needs 250m cpu",
            id="no capability is 0",
        ),
        pytest.param(CHECK, cpu_pod("x", "0", "0", queue_name="bare"), None, id="requests nothing"),
    ],
)
def test_the_cpu_memory_check(policy: Policy, obj: dict[str, Any], message: str | None) -> None:
    decision = decide(state_with(*RUNNING, policy=policy), obj)
    if message is None:
        assert isinstance(decision, Allowed), decision
    else:
        assert isinstance(decision, Denied) and decision.message == message
        assert decision.queue == obj["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"]


def test_a_card_pod_over_its_card_quota_hears_about_cards_first() -> None:
    state = state_with(*RUNNING, cpu="3")
    over_both = cpu_pod("x", "2", card=H200)
    over_both["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "9"}
    decision = decide(state, over_both)
    assert isinstance(decision, Denied) and "NVIDIA-H200" in decision.message


def test_finished_pods_free_their_cpu_and_admitted_pods_hold_it_until_seen() -> None:
    done = [cpu_pod(f"d{i}", "1", phase="Succeeded") for i in range(4)]
    state = state_with(*done)
    assert isinstance(decide(state, cpu_pod("a", "2")), Allowed)
    assert isinstance(decide(state, cpu_pod("b", "1")), Allowed)
    third = decide(state, cpu_pod("c", "2"))
    assert isinstance(third, Denied)
    assert third.message == (
        'queue "q" has 1 cpu left (capability 4: 3 admitted, not yet seen); pod ns/c needs 2 cpu'
    )


def test_a_dry_run_holds_nothing() -> None:
    state = state_with()
    for _ in range(3):
        assert isinstance(decide(state, cpu_pod("a", "4"), dry_run=True), Allowed)


def test_a_scale_up_of_a_cpu_deployment_is_checked_per_pod() -> None:
    dep = deployment("web", 1, card=None)
    template = dep["spec"]["template"]
    template["spec"]["schedulerName"] = "volcano"
    template["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}}
    running = cpu_pod("web-0", "1", phase="Running")
    running["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "web",
            "uid": "uid-dep-web",
            "controller": True,
        }
    ]
    state = state_with(dep, running)
    assert isinstance(admission.validate(state, scale_request("web", 1, 4), 0.0), Allowed)
    denied = admission.validate(state, scale_request("web", 1, 5), 0.0)
    assert isinstance(denied, Denied)
    assert denied.message == (
        'queue "q" has 3 cpu left (capability 4: 1 requested by its pods); scale-up of deployment ns/web'
        " from 1 to 5 replicas needs 4 cpu (1 per pod)"
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"containers": [{"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]}, (2000, 2**30)),
        (
            {
                "containers": [
                    {"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}},
                    {"resources": {"requests": {"cpu": "250m", "memory": "100Mi"}}},
                ]
            },
            (750, 100 * 2**20),
        ),
        (
            {
                "initContainers": [{"resources": {"requests": {"cpu": "3"}}}],
                "containers": [{"resources": {"requests": {"cpu": "1"}}}],
                "overhead": {"cpu": "100m", "memory": "64Mi"},
            },
            (3100, 64 * 2**20),
        ),
        ({"containers": [{"resources": {"requests": {"cpu": "0.0001"}}}]}, (1, 0)),
        ({"containers": [{}]}, (0, 0)),
    ],
    ids=[
        "limits stand in for requests",
        "requests win, containers add",
        "init max and overhead",
        "rounded up",
        "none",
    ],
)
def test_effective_cpu_and_memory_requests(spec: dict[str, Any], expected: tuple[int, int]) -> None:
    assert compute_requests(spec) == expected


@pytest.mark.parametrize(
    ("value", "cpu", "memory"),
    [
        (4000, "4", "4000"),
        (1500, "1.5", "1500"),
        (250, "250m", "250"),
        (500, "500m", "500"),
        (2**33, "8589934592m", "8Gi"),
        (1536 * 2**20, "1610612736m", "1536Mi"),
    ],
)
def test_amounts_read_as_kubectl_users_write_them(value: int, cpu: str, memory: str) -> None:
    assert (cpu_text(value), memory_text(value)) == (cpu, memory)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("pod"),
                st.integers(0, 20),
                st.sampled_from(["250m", "500m", "1", "2"]),
                st.sampled_from(["256Mi", "1Gi", "3Gi"]),
                st.booleans(),
            ),
            st.tuples(st.sampled_from(["seen", "bind", "finish", "delete"]), st.integers(0, 20)),
        ),
        max_size=40,
    ),
    st.sampled_from([CHECK, UNLIMITED]),
)
def test_admissions_never_take_a_queue_past_its_capability_and_the_sums_stay_exact(
    steps: list[tuple[Any, ...]], policy: Policy
) -> None:
    state = state_with(policy=policy)
    admitted: dict[int, dict[str, Any]] = {}
    for index, step in enumerate(steps):
        if step[0] == "pod" and step[1] not in admitted:
            _, number, cpu, memory, card = step
            obj = cpu_pod(f"p{number}", cpu, memory, card=H200 if card else None)
            obj["metadata"]["uid"] = f"uid-{index}"  # a pod made again under an old name is a new pod
            if isinstance(decide(state, obj), Allowed):
                admitted[number] = obj
        elif step[0] in ("seen", "bind") and step[1] in admitted:
            obj = admitted[step[1]]
            if step[0] == "bind":
                obj["spec"]["nodeName"], obj["status"]["phase"] = "h0", "Running"
            state.upsert_pod(pod_record(obj))
        elif step[0] in ("finish", "delete") and step[1] in admitted:
            obj = admitted.pop(step[1])
            if step[0] == "finish":
                obj["status"]["phase"] = "Succeeded"
                state.upsert_pod(pod_record(obj))
            else:
                state.delete_pod(obj["metadata"]["uid"])
        live = [pod_record(o) for o in admitted.values()]
        charged = [c for c in (state.compute_charged(p.template) for p in live) if c is not None]
        assert sum(c[0] for c in charged) <= 4000 and sum(c[1] for c in charged) <= 8 * 2**30
        seen = [p for p in live if p.uid in state.pods and state.pods[p.uid].phase != "Succeeded"]
        expected = [c for c in (state.compute_charged(p.template) for p in seen) if c is not None]
        assert list(state.charged.compute_used("q")) == [
            sum(c[0] for c in expected),
            sum(c[1] for c in expected),
        ]


def test_status_shows_each_queues_cpu_and_memory_and_warns_where_pods_exceed_it() -> None:
    state = state_with(*RUNNING, cpu_pod("stray", "1", queue_name="bare", phase="Running", node_name="c0"))
    decide(state, cpu_pod("new", "500m", "512Mi"))
    status = cluster_status(state)
    assert status["capability"]["q"] == {
        "cpu": {"capability": 4000, "used": 3000, "in_flight": 500},
        "memory": {"capability": 8 * 2**30, "used": 6 * 2**30, "in_flight": 512 * 2**20},
    }
    assert status["capability"]["bare"]["cpu"] == {"capability": None, "used": 1000, "in_flight": 0}
    assert (
        'queue "bare": its pods request 1 cpu, above its capability (none set, so 0); nothing is evicted,'
        " new pods that request cpu are refused"
    ) in status["warnings"]
    assert "q                3.5 / 4                    6656Mi / 8Gi" in status_table(status)
    assert "capability" not in cluster_status(state_with(policy=Policy()))


QUANTITY = st.sampled_from(["0", "1", "250m", "1.5", "2", "100Mi", "1Gi", "1e3", "0.0001"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "requests": st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), QUANTITY),
                "limits": st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), QUANTITY),
            },
        ),
        max_size=4,
    )
)
def test_the_quick_sum_over_containers_is_the_general_rule(resources: list[dict[str, Any]]) -> None:
    spec = {"containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(resources)]}
    # An init container asking nothing changes nothing, and sends the pod down the general path.
    assert compute_requests(spec) == compute_requests({**spec, "initContainers": [{"name": "noop"}]})

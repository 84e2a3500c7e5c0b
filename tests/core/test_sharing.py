"""Shared GPUs (Volcano vGPU, HAMi, Koordinator) count against the per-model quota in card units."""

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import GPU, H200, H800, cluster, node, owner, pod, queue, request, shared
from webhook.core.decide import admission
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model.cards import UNIT, amount
from webhook.core.model.demand import BadDemand, PodDemand, pod_demand
from webhook.core.model.objects import pod_template_of
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Allowed, Denied

# H200 nodes with 141 GiB cards, H800 with 80 GiB (the label is MiB per card).
NODES = (node("h200", H200, 8, memory=144384), node("h800", H800, 8, memory=81920))


def units_of(limits: dict[str, Any], card: str = H800, policy: Policy | None = None) -> int | str:
    state = cluster(*NODES, policy=policy)
    demand = pod_demand(
        pod_template_of(pod("p", card, None, spec=shared(limits))), state.inventory, state.policy
    )
    if isinstance(demand, BadDemand):
        return demand.reason
    assert isinstance(demand, PodDemand)
    return demand.count


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # Volcano vGPU: per vGPU, the larger of cores and memory (MiB or percent); default: whole memory.
        pytest.param(
            {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 50},
            1000,
            id="vgpu cores only: whole memory",
        ),
        pytest.param(
            {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 20480}, 250, id="vgpu 20 of 80 GiB"
        ),
        pytest.param(
            {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 20480, "volcano.sh/vgpu-cores": 30},
            300,
            id="vgpu cores above memory",
        ),
        pytest.param(
            {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory-percentage": 25},
            500,
            id="vgpu two quarters",
        ),
        pytest.param({"volcano.sh/vgpu-memory": 8192}, 100, id="vgpu memory alone is one vGPU"),
        pytest.param({"volcano.sh/vgpu-number": 1}, 1000, id="vgpu number alone: whole card"),
        pytest.param(
            {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 27307}, 334, id="vgpu a third rounds up"
        ),
        # HAMi: nvidia.com/gpu with gpumem / gpumem-percentage / gpucores.
        pytest.param({GPU: 1, "nvidia.com/gpumem": 40960}, 500, id="hami half the memory"),
        pytest.param(
            {GPU: 1, "nvidia.com/gpumem-percentage": 30, "nvidia.com/gpucores": 40}, 400, id="hami cores"
        ),
        pytest.param({GPU: 2, "nvidia.com/gpumem-percentage": 10}, 200, id="hami two tenths"),
        pytest.param(
            {GPU: 1, "nvidia.com/gpucores": 20}, 1000, id="hami cores only: default memory is the card"
        ),
        # Koordinator: totals over gpu.shared cards, or the combined gpu resource.
        pytest.param(
            {
                "koordinator.sh/gpu.shared": 1,
                "koordinator.sh/gpu-core": 50,
                "koordinator.sh/gpu-memory-ratio": 50,
            },
            500,
            id="koordinator half",
        ),
        pytest.param({"koordinator.sh/gpu": 25}, 250, id="koordinator combined quarter"),
        pytest.param(
            {
                "koordinator.sh/gpu.shared": 2,
                "koordinator.sh/gpu-core": 100,
                "koordinator.sh/gpu-memory-ratio": 60,
            },
            1000,
            id="koordinator two halves",
        ),
        pytest.param(
            {"koordinator.sh/gpu-core": 200, "koordinator.sh/gpu-memory-ratio": 200},
            2000,
            id="koordinator two whole",
        ),
        pytest.param({"koordinator.sh/gpu-memory": "4Gi"}, 50, id="koordinator bytes"),
        pytest.param({"kubernetes.io/gpu": 50}, 500, id="seed spelling"),
        pytest.param(
            {"kubernetes.io/gpu-core": 60, "kubernetes.io/gpu-memory": "4Gi"}, 600, id="seed core and bytes"
        ),
        # Whole cards are still whole cards.
        pytest.param({GPU: 2}, 2000, id="two whole cards"),
    ],
)
def test_a_shared_gpu_is_charged_its_share_of_one_card_of_its_model(
    limits: dict[str, Any], expected: int
) -> None:
    assert units_of(limits) == expected


def test_a_byte_share_depends_on_the_model_and_a_multi_card_spec_is_held_at_the_largest() -> None:
    limits = {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 20480}
    assert units_of(limits, H200) == 142  # 20 GiB of 141 GiB, rounded up
    assert units_of(limits, f"{H200}|{H800}") == 250


def test_hami_defaults_come_from_the_policy() -> None:
    policy = Policy(hami_default_memory_mib=8192, hami_default_cores=25)
    assert units_of({GPU: 1, "nvidia.com/gpucores": 10}, policy=policy) == 100
    assert units_of({GPU: 1, "nvidia.com/gpumem": 4096}, policy=policy) == 250


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        pytest.param(
            {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 150},
            "volcano.sh/vgpu-cores=150: a percentage",
            id="cores over 100",
        ),
        pytest.param(
            {GPU: 1, "nvidia.com/gpumem-percentage": 120},
            "nvidia.com/gpumem-percentage=120",
            id="memory percent over 100",
        ),
        pytest.param(
            {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 90000},
            "asks 90000 MiB per card through volcano.sh/vgpu-memory, more than the 81920 MiB",
            id="memory above the card",
        ),
        pytest.param(
            {"koordinator.sh/gpu-core": 150},
            "koordinator.sh/gpu-core=150: above 100 it must be a multiple of 100",
            id="koordinator 150",
        ),
        pytest.param(
            {"koordinator.sh/gpu.shared": 1, "koordinator.sh/gpu-core": 200},
            "koordinator.sh/gpu-core=200 over 1 GPU(s): more than 100 per card",
            id="koordinator more than its cards",
        ),
        pytest.param(
            {"volcano.sh/vgpu-number": "1500m"},
            "volcano.sh/vgpu-number=1.5: the number of GPUs",
            id="a fraction of a vGPU",
        ),
    ],
)
def test_a_malformed_share_is_refused_naming_the_field_and_value(limits: dict[str, Any], says: str) -> None:
    reason = units_of(limits)
    assert isinstance(reason, str) and says in reason, reason


def test_a_byte_share_of_a_model_whose_memory_is_unknown_is_refused() -> None:
    reason = units_of({"volcano.sh/vgpu-memory": 1024}, "NVIDIA-A100")
    assert isinstance(reason, str) and "memory of its card model is not known" in reason


def test_a_share_without_a_card_name_is_an_unnamed_card_pod() -> None:
    state = cluster(*NODES, queue("q", '{"NVIDIA-H800": 2}'))
    decision = admission.validate(
        state, request(pod("p", None, None, spec=shared({"volcano.sh/vgpu-number": 1}))), 0.0
    )
    assert (
        isinstance(decision, Denied)
        and "requests 1 volcano.sh/vgpu-number but has no volcano.sh/card.name" in decision.message
    )


def third(name: str, **kw: Any) -> dict[str, Any]:
    return pod(
        name,
        H800,
        None,
        spec=shared(
            {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 33, "volcano.sh/vgpu-memory": 20480}
        ),
        **kw,
    )


def test_six_thirds_fit_two_cards_and_the_seventh_is_denied_with_the_fraction_named() -> None:
    state = cluster(*NODES, queue("q", '{"NVIDIA-H800": 2}'))
    for i in range(6):
        obj = third(f"p{i}")
        decision = admission.validate(state, request(obj), 0.0)
        assert isinstance(decision, Allowed), decision
        ingest.upsert(state, obj)
    denied = admission.validate(state, request(third("p6")), 0.0)
    assert isinstance(denied, Denied)
    assert (
        denied.message == 'queue "q" has 0.02 NVIDIA-H800 left (quota 2: 1.98 pending); pod ns/p6 needs 0.33'
    )


def _recount(state: ClusterState) -> Counter[str]:
    """What the queue uses, counted from scratch from the pods the state holds."""
    used: Counter[str] = Counter()
    for record in state.pods.values():
        if record.phase in ("Succeeded", "Failed"):
            continue
        demand = pod_demand(record.template, state.inventory, state.policy)
        if isinstance(demand, PodDemand):
            used[demand.spec.cards[0]] += demand.count
    return +used


SHARES = st.sampled_from(
    [
        {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 33, "volcano.sh/vgpu-memory": 1024},
        {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 27307},
        {"volcano.sh/vgpu-memory-percentage": 10, "volcano.sh/vgpu-number": 1},
        {GPU: 1, "nvidia.com/gpumem": 12345},
        {GPU: 1, "nvidia.com/gpucores": 17, "nvidia.com/gpumem-percentage": 3},
        {"koordinator.sh/gpu": 7},
        {
            "koordinator.sh/gpu.shared": 2,
            "koordinator.sh/gpu-core": 150,
            "koordinator.sh/gpu-memory-ratio": 90,
        },
        {"kubernetes.io/gpu-memory": "5Gi"},
        {GPU: 1},
    ]
)
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["create", "bind", "finish", "delete"]),
        st.integers(0, 11),
        st.sampled_from([H200, H800]),
        SHARES,
    ),
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(quota=st.integers(0, 3), steps=STEPS)
def test_shared_tallies_stay_exact_and_never_pass_a_quota(
    quota: int, steps: list[tuple[str, int, str, dict[str, Any]]]
) -> None:
    state = cluster(*NODES, queue("q", f'{{"{H200}": {quota}, "{H800}": {quota}}}'))
    live: dict[int, dict[str, Any]] = {}
    for made, (action, i, card, limits) in enumerate(steps):
        if action == "create" and i not in live:  # a new pod: a uid of its own (a finished one stays)
            obj = pod(f"p{i}", card, None, spec=shared(limits), uid=f"uid-ns-p{i}-{made}")
            decision = admission.validate(state, request(obj), 0.0)
            if isinstance(decision, Allowed):
                ingest.upsert(state, obj)
                live[i] = obj
        elif action == "bind" and i in live and not live[i]["spec"].get("nodeName"):
            live[i] = {
                **live[i],
                "spec": {
                    **live[i]["spec"],
                    "nodeName": "h200"
                    if live[i]["metadata"]["annotations"]["volcano.sh/card.name"] == H200
                    else "h800",
                },
                "status": {"phase": "Running"},
            }
            ingest.upsert(state, live[i])
        elif action == "finish" and i in live:
            ingest.upsert(state, {**live.pop(i), "status": {"phase": "Succeeded"}})
        elif action == "delete" and i in live:
            state.delete_pod(live.pop(i)["metadata"]["uid"])
        usage = queue_usage(state, "q")
        tallied = Counter({card: usage.card(card).used for card in (H200, H800)})
        assert +tallied == _recount(state)  # no drift after any sequence
        for card in (H200, H800):
            assert usage.card(card).used <= quota * UNIT, (card, amount(usage.card(card).used))


def test_status_shows_nodes_that_share_their_cards_and_queues_in_fractions() -> None:
    from webhook.core.decide.report import cluster_status, status_table

    vgpu = node(
        "v0", H800, 4, memory=81920, **{"volcano.sh/vgpu-number": "40", "volcano.sh/vgpu-memory": "327680"}
    )
    koord = node("k0", H200, 2, memory=144384, **{"koordinator.sh/gpu-core": "200"})
    state = cluster(*NODES, vgpu, koord, queue("q", '{"NVIDIA-H800": 2}'), third("a"))
    status = cluster_status(state)
    assert status["shared"] == {
        H200: {"nodes": 1, "cards": 2, "resources": {"koordinator.sh/gpu-core": 200}},
        H800: {"nodes": 1, "cards": 4, "resources": {"volcano.sh/vgpu-number": 40}},
    }
    assert status["queues"]["q"][H800] == {
        "quota": 2,
        "bound": 0,
        "pending": 0.33,
        "reserved": 0,
        "in_flight": 0,
        "free": 1.67,
    }
    assert status["cards"][H800]["total"] == 8  # the plugin's whole cards: shared nodes are not among them
    assert (
        "NVIDIA-H800                               4 more shared on 1 node(s): volcano.sh/vgpu-number 40"
        in status_table(status)
    )


def test_headroom_of_a_shared_deployment_counts_its_fraction() -> None:
    import time

    from tests.builders import deployment, replicaset
    from webhook.tools import headroom

    limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "33", "volcano.sh/vgpu-memory": "20480"}
    dep = deployment("embed", 3, card=H800)
    dep["spec"]["template"]["spec"] = shared(limits)
    rs = replicaset("embed-1", 3, "embed", card=H800)
    rs["spec"]["template"]["spec"] = shared(limits)
    running = [
        third(
            f"embed-1-{i}",
            node_name="h800",
            phase="Running",
            owner=owner("ReplicaSet", "embed-1", "uid-rs-embed-1"),
        )
        for i in range(3)
    ]
    state = cluster(*NODES, queue("q", '{"NVIDIA-H800": 2}'), dep, rs, *running)
    answer = headroom.of_workload(state, "deployment/ns/embed", time.time())
    assert answer.more == 3, answer.reason  # 2 - 3 x 0.33 = 1.01 left: 3 more of 0.33
    assert "needs 1.32 NVIDIA-H800 (0.33 per pod)" in answer.reason and "1.01 left" in answer.reason, (
        answer.reason
    )


SHARING_NAMES = [
    "volcano.sh/vgpu-number",
    "volcano.sh/vgpu-memory",
    "volcano.sh/vgpu-memory-percentage",
    "volcano.sh/vgpu-cores",
    GPU,
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "koordinator.sh/gpu.shared",
    "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory-ratio",
    "koordinator.sh/gpu-memory",
    "koordinator.sh/gpu",
    "kubernetes.io/gpu",
]
QUANTITIES = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.sampled_from(["0", "1500m", "1e3", "0.5", "-1", "9223372036854775807", "1Ki", "1e30", "abc", ""]),
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(SHARING_NAMES), QUANTITIES, max_size=6),
    st.sampled_from([H800, f"{H200}|{H800}", "NVIDIA-A100"]),
)
def test_any_sharing_request_is_charged_or_refused_with_a_reason_never_a_crash(
    limits: dict[str, str], card: str
) -> None:
    state = cluster(*NODES, queue("q", '{"NVIDIA-H800": 2, "NVIDIA-H200": 2}'))
    obj = pod("p", card, None, spec=shared(limits))
    mutation = admission.mutate(state, request(obj))
    assert isinstance(mutation, Allowed | Denied)
    decision = admission.validate(state, request(obj), 0.0)
    assert isinstance(decision, Allowed | Denied)
    if isinstance(decision, Denied):
        assert decision.message and "\n" not in decision.message


def test_a_shared_pod_is_confined_to_its_model_and_an_a_or_b_share_is_assigned_the_model_with_room() -> None:
    state = cluster(
        *NODES, queue("q", '{"NVIDIA-H200": 1, "NVIDIA-H800": 1}'), third("a"), third("b"), third("c")
    )
    one = admission.mutate(state, request(third("d")))
    assert isinstance(one, Allowed)
    affinity = [op for op in one.patch if op["path"] == "/spec/affinity"]
    assert affinity[0]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [H800]}]}
        ]
    }
    # H800 has 0.01 left: an H800|H200 third goes to H200, charged its share of an H200 there.
    limits = {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 33, "volcano.sh/vgpu-memory": 20480}
    flexible = pod("e", f"{H800}|{H200}", None, spec=shared(limits))
    mutation = admission.mutate(state, request(flexible))
    assert isinstance(mutation, Allowed) and mutation.card == H200 and mutation.hold is not None
    assert mutation.hold.per_pod == 330  # 33 % of the compute, above 20 of 141 GiB
    admission.admit(state, request(flexible), mutation, 0.0)
    assert queue_usage(state, "q").card(H200).in_flight == 330


def test_a_pod_of_a_shared_a_or_b_scale_up_takes_the_scale_ups_hold_over_on_the_model_it_gets() -> None:
    import jsonpatch

    from tests.builders import deployment, replicaset, scale_request

    limits = {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 40960}  # H200 0.284, H800 0.5
    spec = f"{H200}|{H800}"
    dep, rs = deployment("emb", 0, card=spec), replicaset("emb-1", 0, "emb", card=spec)
    for workload in (dep, rs):
        workload["spec"]["template"]["spec"] = shared(limits)
    state = cluster(*NODES, queue("q", '{"NVIDIA-H200": 1, "NVIDIA-H800": 1}'), dep, rs)
    scale = scale_request("emb", 0, 1)
    decision = admission.validate(state, scale, 0.0)
    assert isinstance(decision, Allowed), decision
    admission.admit(state, scale, decision, 0.0)
    obj = pod("emb-1-x", spec, None, spec=shared(limits), owner=owner("ReplicaSet", "emb-1", "uid-rs-emb-1"))
    mutation = admission.mutate(state, request(obj))
    assert isinstance(mutation, Allowed) and mutation.card == H200
    admission.admit(state, request(obj), mutation, 0.0)
    patched = jsonpatch.apply_patch(obj, [dict(op) for op in mutation.patch])
    validation = admission.validate(state, request(patched), 0.0)
    assert isinstance(validation, Allowed), validation
    admission.admit(state, request(patched), validation, 0.0)
    usage = queue_usage(state, "q")
    assert sum(g.pods for g in usage.groups if g.origin == "in flight") == 0  # the scale-up's pod is this one
    assert usage.card(H200).in_flight == 284 and usage.card(H800).in_flight == 0

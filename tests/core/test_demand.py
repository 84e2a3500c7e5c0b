from typing import Any

import pytest

from tests.builders import H200, R4090
from webhook.core.model.cards import units
from webhook.core.model.demand import BadDemand, NotCardPod, PodDemand, UnnamedCardPod, pod_demand
from webhook.core.model.inventory import Inventory
from webhook.core.model.objects import pod_template_of
from webhook.core.model.policy import Policy


def demand_of(annotations: dict[str, str], spec: dict[str, Any]) -> object:
    template = pod_template_of({"metadata": {"annotations": annotations}, "spec": spec})
    return pod_demand(template, Inventory(), Policy())


def containers(*resources: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {
        "containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(resources)],
        "initContainers": [{"name": f"i{i}", **r} for i, r in enumerate(init)],
    }


NAMED = {"volcano.sh/card.name": H200}


@pytest.mark.parametrize(
    ("spec", "count"),
    [
        pytest.param(containers({"limits": {"nvidia.com/gpu": 2}}), 2, id="one container"),
        pytest.param(
            containers({"limits": {"nvidia.com/gpu": 1}}, {"limits": {"nvidia.com/gpu": 2}}),
            3,
            id="containers add up",
        ),
        pytest.param(
            containers(
                {"limits": {"nvidia.com/gpu": 1}}, init=({"resources": {"limits": {"nvidia.com/gpu": 4}}},)
            ),
            4,
            id="an init container can need more",
        ),
        pytest.param(
            containers(
                {"limits": {"nvidia.com/gpu": 1}},
                init=({"restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": 1}}},),
            ),
            2,
            id="a sidecar runs alongside",
        ),
        pytest.param(containers({"requests": {"nvidia.com/gpu": 2}}), 2, id="requests when no limits"),
        pytest.param(
            containers({"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 3}}),
            1,
            id="limits first",
        ),
        pytest.param(containers({"limits": {"nvidia.com/gpu": "1500m"}}), 2, id="rounded up"),
    ],
)
def test_count_follows_kubernetes_effective_request_rules(spec: dict[str, Any], count: int) -> None:
    demand = demand_of(NAMED, spec)
    assert (
        isinstance(demand, PodDemand) and demand.count == units(count) and demand.resource == "nvidia.com/gpu"
    )


def test_a_pod_without_card_name_or_card_resource_is_not_a_card_pod() -> None:
    assert demand_of({}, containers({"limits": {"cpu": "2", "memory": "1Gi", "rdma/hca": 1}})) == NotCardPod()


@pytest.mark.parametrize(
    "resource",
    [
        pytest.param("nvidia.com/gpu", id="whole"),
        pytest.param("nvidia.com/gpu.shared", id="mps"),
        pytest.param("nvidia.com/mig-1g.10gb", id="mig"),
    ],
)
def test_a_card_resource_without_card_name_is_flagged(resource: str) -> None:
    assert demand_of({}, containers({"limits": {resource: 1}})) == UnnamedCardPod(resource, 1)


@pytest.mark.parametrize(
    ("annotations", "spec", "says"),
    [
        pytest.param(NAMED, containers({"limits": {"cpu": 1}}), "requests 0 nvidia.com/gpu", id="zero count"),
        pytest.param(
            NAMED,
            containers({"limits": {"nvidia.com/gpu": "-1"}}),
            "requests -1 nvidia.com/gpu: a quantity is never negative",
            id="negative count (the exact check once shifted by it)",
        ),
        pytest.param(
            {"volcano.sh/card.name": f"{R4090}|NVIDIA-H20/mig-1g.24gb-mixed"},
            containers({"limits": {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.24gb": 1}}),
            "different resources",
            id="whole and mig alternatives",
        ),
        pytest.param(
            {"volcano.sh/card.name": "H200|"},
            containers({"limits": {"nvidia.com/gpu": 1}}),
            "empty alternative",
            id="bad spec",
        ),
    ],
)
def test_card_pods_that_must_be_refused_say_why(
    annotations: dict[str, str], spec: dict[str, Any], says: str
) -> None:
    demand = demand_of(annotations, spec)
    assert isinstance(demand, BadDemand) and says in demand.reason


def test_mixed_vendors_are_refused_once_nodes_show_their_resources() -> None:
    from tests.builders import ascend_node, cluster, node

    state = cluster(
        node("h", H200),
        ascend_node(),
    )
    template = pod_template_of(
        {
            "metadata": {"annotations": {"volcano.sh/card.name": f"{H200}|Ascend-910B"}},
            "spec": containers({"limits": {"nvidia.com/gpu": 1}}),
        }
    )
    demand = pod_demand(template, state.inventory, state.policy)
    assert isinstance(demand, BadDemand) and "Ascend-910B is huawei.com/Ascend910" in demand.reason

"""Discovery must give exactly the names, resources and counts of the capacity-card plugin."""

from typing import Any

import pytest

from webhook.core.model.cards import UNIT, units
from webhook.core.model.inventory import build_inventory
from webhook.core.model.nodes import discover_node_cards, mps_memory_gib

GPU_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-H800",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81920",
}


def cards_of(labels: dict[str, str], allocatable: dict[str, Any]) -> dict[str, tuple[str, int]]:
    found = discover_node_cards("n", labels, allocatable)
    return {card.name: (card.resource, card.count // UNIT) for card in found.cards}  # in whole cards


@pytest.mark.parametrize(
    ("mib", "gib"),
    [
        pytest.param(81920, 80, id="81920 MiB is 80"),
        pytest.param(97871, 96, id="97871 MiB rounds to 96"),
        pytest.param(32768, 32, id="32768 MiB is 32"),
        pytest.param(1536, 2, id="half rounds away from zero like Go"),
        pytest.param(2560, 3, id="2.5 rounds up, not to even"),
        pytest.param(512, 1, id="0.5 rounds up"),
    ],
)
def test_mps_memory_rounds_half_away_from_zero(mib: int, gib: int) -> None:
    assert mps_memory_gib(mib) == gib


@pytest.mark.parametrize(
    ("labels", "allocatable", "expected"),
    [
        pytest.param(
            GPU_LABELS,
            {"cpu": "64", "nvidia.com/gpu": "8"},
            {"NVIDIA-H800": ("nvidia.com/gpu", 8)},
            id="whole cards",
        ),
        pytest.param(
            {**GPU_LABELS, "nvidia.com/gpu.replicas": "2"},
            {"nvidia.com/gpu": "6", "nvidia.com/gpu.shared": "4"},
            {"NVIDIA-H800": ("nvidia.com/gpu", 6), "NVIDIA-H800/mps-80g*1/2": ("nvidia.com/gpu.shared", 4)},
            id="whole and mps side by side",
        ),
        pytest.param(
            {**GPU_LABELS, "nvidia.com/mig-1g.10gb.count": "3", "nvidia.com/mig-1g.10gb.product": "X"},
            {"nvidia.com/gpu": "7", "nvidia.com/mig-1g.10gb": "3", "nvidia.com/mig-3g.40gb": "1"},
            {
                "NVIDIA-H800": ("nvidia.com/gpu", 7),
                "NVIDIA-H800/mig-1g.10gb-mixed": ("nvidia.com/mig-1g.10gb", 3),
                "NVIDIA-H800/mig-3g.40gb-mixed": ("nvidia.com/mig-3g.40gb", 1),
            },
            id="mig profiles, mig label keys skipped",
        ),
        pytest.param(GPU_LABELS, {"nvidia.com/gpu": "0"}, {}, id="zero quantity ignored"),
        pytest.param(
            GPU_LABELS, {"nvidia.com/gpu": "1500m"}, {"NVIDIA-H800": ("nvidia.com/gpu", 2)}, id="rounded up"
        ),
        pytest.param(
            GPU_LABELS,
            {"rdma/hca": "1", "hugepages-1Gi": "2Gi", "amd.com/gpu": "1"},
            {},
            id="other resources",
        ),
        pytest.param(
            {
                "huawei.com/npu.product": "Ascend-910B",
                "huawei.com/npu.count": "8",
                "huawei.com/npu.memory": "65536",
            },
            {"huawei.com/Ascend910": "8"},
            {"Ascend-910B": ("huawei.com/Ascend910", 8)},
            id="any vendor prefix",
        ),
        pytest.param(
            {**GPU_LABELS, "nvidia.com/gpu.memory": ""}, {"nvidia.com/gpu": "8"}, {}, id="empty memory label"
        ),
        pytest.param({**GPU_LABELS}, {"nvidia.com/gpu.shared": "4"}, {}, id="mps without replicas label"),
        pytest.param(
            {**GPU_LABELS, "nvidia.com/gpu.replicas": "two"},
            {"nvidia.com/gpu.shared": "4"},
            {},
            id="mps bad replicas",
        ),
    ],
)
def test_node_cards_match_the_scheduler_plugin(
    labels: dict[str, str], allocatable: dict[str, Any], expected: dict[str, tuple[str, int]]
) -> None:
    assert cards_of(labels, allocatable) == expected


def test_problems_are_reported_as_warnings_not_errors() -> None:
    found = discover_node_cards(
        "gpu-9", {"nvidia.com/gpu.product": "X"}, {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.5gb": "2"}
    )
    assert found.cards == ()
    text = " ".join(found.warnings)
    assert "gpu-9" in text and "MIG resource nvidia.com/mig-1g.5gb" in text and "nvidia.com/gpu=8" in text


def test_several_product_labels_pick_the_first_sorted_and_warn() -> None:
    labels = {
        **GPU_LABELS,
        "amd.com/gpu.product": "MI300X",
        "amd.com/gpu.count": "8",
        "amd.com/gpu.memory": "196608",
    }
    found = discover_node_cards("n", labels, {"amd.com/gpu": "8", "nvidia.com/gpu": "8"})
    assert found.product == "MI300X" and found.label_key == "amd.com/gpu.product"
    assert [c.name for c in found.cards] == ["MI300X"]
    assert any("several product labels" in w for w in found.warnings)


def test_bad_allocatable_quantities_never_raise() -> None:
    found = discover_node_cards("n", GPU_LABELS, {"nvidia.com/gpu": "lots"})
    assert found.cards == () and any("not a quantity" in w for w in found.warnings)


def test_inventory_sums_cards_across_nodes_and_keeps_the_label_key() -> None:
    a = discover_node_cards("a", GPU_LABELS, {"nvidia.com/gpu": "8"})
    b = discover_node_cards("b", GPU_LABELS, {"nvidia.com/gpu": "4"})
    total = build_inventory({"a": a, "b": b}).cards["NVIDIA-H800"]
    assert (total.total, total.nodes, total.label_key, total.resource) == (
        units(12),
        ("a", "b"),
        "nvidia.com/gpu.product",
        "nvidia.com/gpu",
    )


def test_the_inventory_kept_node_by_node_equals_one_built_from_scratch() -> None:
    from webhook.core.model.inventory import Inventory

    h800 = {
        n: discover_node_cards(n, GPU_LABELS, {"nvidia.com/gpu": str(i + 1)})
        for i, n in enumerate(["a", "b", "c"])
    }
    other = discover_node_cards(
        "b", {**GPU_LABELS, "nvidia.com/gpu.product": "NVIDIA-H200"}, {"nvidia.com/gpu": "4"}
    )
    live = Inventory()
    for cards in h800.values():
        live.put(cards)
    live.put(other)  # node b changes model
    live.remove("a")
    assert live.cards == build_inventory({"b": other, "c": h800["c"]}).cards
    assert live.total("NVIDIA-H800").total == units(3) and live.total("NVIDIA-H200").nodes == ("b",)  # type: ignore[union-attr]
    assert live.remove("c") == {"NVIDIA-H800"} and "NVIDIA-H800" not in live  # gone counts as changed

"""The per-queue gauges of idle cards lent and borrowed in a cohort (decisions.md §33), as Prometheus
scrapes them, beside the quota and over-quota gauges they must not disturb."""

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import H200, cluster
from tests.core.test_borrowing import NODES, lender, running
from webhook.serve.metrics import Metrics


def scraped(*objects: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(metric, queue) -> value of every per-queue H200 gauge."""
    state = cluster(*NODES, *objects)
    metrics = Metrics()
    metrics.watch_state(lambda: state)
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, sample.labels["queue"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("card") == H200 and "queue" in sample.labels
    }


A_B_W = (lender("a", {H200: 4}, {H200: 2}), lender("b", {H200: 2}, {H200: 2}), lender("w", {H200: 2}))


def test_deserved_borrowed_and_lent_per_queue_and_card_in_cards() -> None:
    """``a`` borrows 2 of ``b``'s H200; ``b`` now runs 1 of its own, so ``a`` may use 3, not 4."""
    got = scraped(*A_B_W, *(running(f"a{i}", "a") for i in range(4)), running("b0", "b"))
    lending = {key: value for key, value in got.items() if key[0].startswith("cardquota_queue_card_")}
    assert lending == {
        ("cardquota_queue_card_deserved", "a"): 2.0,
        ("cardquota_queue_card_deserved", "b"): 2.0,
        ("cardquota_queue_card_borrowed", "a"): 2.0,
        ("cardquota_queue_card_borrowed", "b"): 0.0,
        ("cardquota_queue_card_lent", "a"): 0.0,
        ("cardquota_queue_card_lent", "b"): 1.0,
    }
    assert got[("cardquota_queue_quota_cards", "a")] == 4.0  # the quota, not what it may use now
    assert got[("cardquota_queue_used_cards", "a")] == 4.0
    assert got[("cardquota_queue_free_cards", "a")] == -1.0  # of what it may use now
    assert ("cardquota_queue_overcommitted_cards", "a") not in got  # within its quota


def test_twin_a_queue_without_card_deserved_has_no_lending_series_and_is_over_its_quota_as_before() -> None:
    got = scraped(*A_B_W, *(running(f"w{i}", "w") for i in range(3)))
    assert not [key for key in got if key[1] == "w" and key[0].startswith("cardquota_queue_card_")]
    assert (
        got[("cardquota_queue_quota_cards", "w")] == 2.0 and got[("cardquota_queue_used_cards", "w")] == 3.0
    )
    assert got[("cardquota_queue_overcommitted_cards", "w")] == 1.0

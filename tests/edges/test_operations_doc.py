"""docs/operations.md stays true: every setting and every metric the server has is documented."""

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import H200, cluster, node, pod, queue
from webhook.serve.metrics import Metrics
from webhook.settings import ServeSettings

DOC = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()


@pytest.mark.parametrize("name", list(ServeSettings.model_fields))
def test_every_setting_is_documented_with_its_flag_and_environment_variable(name: str) -> None:
    assert f"`--{name.replace('_', '-')}" in DOC and f"`CARDQUOTA_{name.upper()}`" in DOC


def test_every_metric_is_documented() -> None:
    metrics = Metrics()
    state = cluster(node("h0", H200), queue("q", '{"NVIDIA-H200": 2}'), pod("p", H200, 1, node_name="h0"))
    metrics.watch_state(lambda: state)
    metrics.reviews.labels("validate", "Pod", "CREATE", "allowed").inc()
    metrics.latency.labels("validate").observe(0.001)
    metrics.rejected.labels("400").inc()
    from prometheus_client import generate_latest

    names = {
        family.name for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
    }
    assert "cardquota_queue_quota_cards" in names
    for name in names:
        documented = f"`{name}`" in DOC or f"`{name}_total`" in DOC
        assert documented, f"{name} is not in docs/operations.md"

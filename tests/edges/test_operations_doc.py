"""docs/operations.md stays true: every setting and every metric the server has is documented."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
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
    names = {
        family.name for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
    }
    assert "cardquota_queue_quota_cards" in names
    for name in names:
        documented = f"`{name}`" in DOC or f"`{name}_total`" in DOC
        assert documented, f"{name} is not in docs/operations.md"


DASHBOARD = (
    Path(__file__).resolve().parents[2] / "charts" / "card-quota-webhook" / "dashboards" / "card-quota.json"
)
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def test_every_metric_the_dashboard_queries_is_one_the_server_exports() -> None:
    """The fast half of tests/e2e/test_dashboard.py: no panel asks for a metric name that is not
    there (a typo, a renamed gauge); whether each query returns data is the end-to-end test's."""
    metrics = Metrics()
    state = cluster(node("h0", H200), queue("q", '{"NVIDIA-H200": 2}'))
    metrics.watch_state(lambda: state)
    exported = {
        family.name for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
    }
    text = DASHBOARD.read_text()
    asked = set(re.findall(r"\bcardquota_[a-z_]+", "\n".join(_exprs(json.loads(text)))))
    assert "cardquota_queue_card_lent" in asked
    unknown = {
        name
        for name in asked
        if name not in exported
        and not any(name.endswith(s) and name[: -len(s)] in exported for s in SUFFIXES)
    }
    assert not unknown, unknown


def _exprs(dashboard: Any) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' (rows' too) and its query variables'."""
    panels = [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]
    exprs = [str(t["expr"]) for p in panels for t in p.get("targets", [])]
    return exprs + [str(v["query"]["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]

"""The chart's Grafana dashboard against a real Prometheus (Debian's package) scraping the webhook
while the control plane sends it reviews: every query on every panel, and the queue and card
variables, return data."""

import json
import math
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e import build
from tests.e2e.cluster import ROOT, ControlPlane, free_port, wait_for
from tests.e2e.objects import H200, queued_deployment
from tests.e2e.test_webhook import Quota, events
from tests.edges.serving import REVIEWS, Process, client_context

DASHBOARD = ROOT / "charts" / "card-quota-webhook" / "dashboards" / "card-quota.json"
RATE_INTERVAL = "30s"
DESERVED = "cardquota.volcano.sh/card.deserved"
# The reclaim and would-be-refusal panels' metrics (a histogram's family without its _bucket): no
# reclaim runs here, and every quota here refuses.
UNSEEN_METRIC = re.compile(r"\b(cardquota_(?:reclaim|would_refuse)\w*?)(?:_bucket)?\{")


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows included."""
    panels = [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def variable_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """The query variables as PromQL: Grafana's ``label_values(SELECTOR, label)`` asks for the label
    values of SELECTOR's series, which ``group by (label) (SELECTOR)`` returns too."""
    found = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"]).groups()  # type: ignore[union-attr]
            found[var["name"]] = f"group by ({label}) ({selector})"
    return found


def as_grafana_would(expr: str, queue: str) -> str:
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$queue", queue)  # Kubernetes names hold no regex syntax but "." (matches itself)
        .replace("$card", ".*")
    )


class Prometheus:
    """Debian's prometheus, scraping the webhook's /metrics every second over TLS."""

    def __init__(self, workdir: Path, target: Process) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "cardquota",
                    "scheme": "https",
                    "tls_config": {"ca_file": str(target.certs / "ca.crt"), "server_name": "127.0.0.1"},
                    "static_configs": [{"targets": [f"127.0.0.1:{target.port}"]}],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                str(build.ensure_binaries() / build.PROMETHEUS),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert body["status"] == "success", f"{expr}: {body}"
        return list(body["data"]["result"])

    def knows(self, metric: str) -> bool:
        """Whether a scrape declared ``metric`` (its HELP and TYPE), samples or none."""
        answer = httpx.get(f"{self.url}/api/v1/metadata", params={"metric": metric}, timeout=10)
        return bool(answer.json()["data"].get(metric))

    def scraping(self) -> bool:
        try:
            targets = httpx.get(f"{self.url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        except httpx.HTTPError:
            return False
        return any(t["health"] == "up" for t in targets)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def prometheus(webhook: Process, tmp_path: Path) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path / "prometheus", webhook)
    try:
        wait_for("Prometheus scraping the webhook", server.scraping, timeout=60)
        yield server
    finally:
        server.stop()


class Reviews:
    """Reviews posted straight to the webhook in a loop, so latency and rates have samples."""

    def __init__(self, webhook: Process) -> None:
        self.webhook = webhook
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = (REVIEWS / "pod-cpu-only.json").read_bytes()
        with httpx.Client(verify=client_context(self.webhook.certs), timeout=10) as client:
            while not self._stop.wait(0.05):
                client.post(f"{self.webhook.url}/validate", content=body)

    def __enter__(self) -> "Reviews":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    control_plane: ControlPlane,
    webhook: Process,
    prometheus: Prometheus,
    namespace: str,
    card_quota: Quota,
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queue_name = card_quota({H200: 2})
    control_plane.apply(queued_deployment("train", 3, queue_name), namespace=namespace)
    wait_for("a FailedCreate event", lambda: events(control_plane, namespace, "FailedCreate"), timeout=60)
    # Room for the refused pod: its ReplicaSet leaves the line with its 3 pods (the wait-time
    # panel), whether it was called or its controller's own retry came first. The queue takes part
    # in lending H200 from here (the deserved, borrowed and lent panel), deserving all of its quota.
    queue = control_plane.get("queue", queue_name)
    queue["metadata"]["annotations"]["volcano.sh/card.quota"] = json.dumps({H200: 3})
    queue["metadata"]["annotations"][DESERVED] = json.dumps({H200: 3})
    control_plane.kubectl("replace", "-f", "-", stdin=json.dumps(queue))
    wait_for(
        "the third pod", lambda: len(control_plane.get("pods", namespace=namespace)["items"]) == 3, timeout=30
    )
    with httpx.Client(verify=client_context(webhook.certs), timeout=10) as client:
        assert client.post(f"{webhook.url}/validate", content=b"not a review").status_code == 400
    # Lower the quota under the running pods: the over-quota panel has something to show.
    queue = control_plane.get("queue", queue_name)
    queue["metadata"]["annotations"]["volcano.sh/card.quota"] = json.dumps({H200: 2})  # 3 run
    queue["metadata"]["annotations"][DESERVED] = json.dumps({H200: 2})  # 1 borrowed beyond it
    control_plane.kubectl("replace", "-f", "-", stdin=json.dumps(queue))
    with Reviews(webhook):
        for name, query in variable_queries(dashboard).items():
            values = wait_for(
                f"values for ${name}",
                lambda q=query: [r["metric"] for r in prometheus.query(as_grafana_would(q, queue_name))],
                timeout=60,
            )
            assert values, name
        assert {"queue": queue_name} in [
            r["metric"] for r in prometheus.query(variable_queries(dashboard)["queue"])
        ]
        for title, expr in expressions(dashboard):
            query = as_grafana_would(expr, queue_name)
            unseen = UNSEEN_METRIC.search(expr)
            if unseen is None:
                wait_for(
                    f"data for {title!r}: {query}", lambda q=query: finite(prometheus.query(q)), timeout=60
                )
                continue
            # No reclaim runs here and no quota only warns (tests/edges/test_reclaimer.py and
            # test_server.py count their series): the query is valid PromQL over a metric exposed.
            prometheus.query(query)
            assert prometheus.knows(unseen.group(1)), f"{title!r}: {unseen.group(1)} is not exposed"
    over = prometheus.query(f'cardquota_queue_overcommitted_cards{{queue="{queue_name}"}}')
    assert [float(r["value"][1]) for r in over] == [1.0]

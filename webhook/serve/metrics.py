"""Prometheus metrics: review counters and latency on the hot path, cluster gauges at scrape time.

The per-queue, per-card gauges are computed from the state when Prometheus scrapes, so a review
never pays for them.
"""

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from webhook.core.decide.report import cluster_status, unsent
from webhook.core.index.line import Waiter
from webhook.core.index.state import ClusterState
from webhook.core.model.cards import UNIT

WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 4 * 3600.0)
LATENCY_BUCKETS = (0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
KINDS = frozenset({"Pod", "Scale", "Deployment", "StatefulSet", "ReplicaSet", "Job", "Queue", "PodGroup"})
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
QUEUE_FIGURES = {
    "quota": "card quota of the queue",
    "running": "cards of bound, running pods",
    "pending": "cards of pods not bound yet",
    "reserved": "cards PodGroups reserve for pods not created yet",
    "in_flight": "cards admitted by this replica that its cache has not seen yet",
    "used": "running + pending + reserved + in flight",
    "free": "quota - used (negative when over quota); a lent and borrowed model: may use now - used",
}
LENDING_FIGURES = {  # a model the queue's card.deserved names (lent and borrowed in its cohort)
    "deserved": "cards of the model the queue is entitled to (card.deserved)",
    "borrowed": "cards the queue uses beyond its deserved, lent by others of its cohort",
    "lent": "cards of the queue's idle deserved that others of its cohort borrow",
}


class Metrics:
    def __init__(self) -> None:
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created noise
        self.registry = CollectorRegistry()
        self.reviews = Counter(
            "cardquota_reviews",
            "AdmissionReviews answered, by webhook, kind, operation and decision",
            ["webhook", "kind", "operation", "decision"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "cardquota_review_duration_seconds",
            "time to answer one AdmissionReview, from body read to response",
            ["webhook"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rejected = Counter(
            "cardquota_rejected_requests",
            "requests answered without a decision, by HTTP status (400 bad review, 503 not ready, 500 bug)",
            ["status"],
            registry=self.registry,
        )
        self.ready = Gauge(
            "cardquota_ready",
            "1 when /readyz answers 200 (synced, not draining; with leader election and a serving "
            "label, standbys too)",
            registry=self.registry,
        )
        self.serving = Gauge(
            "cardquota_serving",
            "1 when this replica answers reviews (synced, not draining, and the Lease holder if elected)",
            registry=self.registry,
        )
        self.cert_expiry = Gauge(
            "cardquota_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use",
            registry=self.registry,
        )
        self.too_complex = Counter(
            "cardquota_feasibility_too_complex",
            "denials because the exact multi-card check gave up at its guard (failed closed)",
            ["webhook"],
            registry=self.registry,
        )
        self.waited = Histogram(
            "cardquota_line_wait_seconds",
            "how long a waiter stood in its queue's line until it had its pods (called or by its own retry)",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.forwarded = Counter(
            "cardquota_forwarded_reviews",
            "reviews this replica forwarded to the Lease holder, by the holder's HTTP status",
            ["status"],
            registry=self.registry,
        )
        self.cert_reloads = Counter(
            "cardquota_certificate_reloads", "serving certificate reloads", registry=self.registry
        )
        self.would_refuse = Counter(
            "cardquota_would_refuse",
            "requests admitted that their queue's quota would have refused, it only warning or auditing"
            " (cardquota.volcano.sh/enforcement), by the queue whose quota has no room, card, kind and mode",
            ["queue", "card", "kind", "mode"],
            registry=self.registry,
        )
        self.reclaims = Counter(
            "cardquota_reclaims",
            "reclaim decisions (tidal, or a lender taking back what its cohort borrows), by the queue"
            " taking back, card and outcome (evicted, protected, dry run, nothing to take)",
            ["queue", "card", "outcome"],
            registry=self.registry,
        )
        self.reclaimed_cards = Counter(
            "cardquota_reclaimed_cards",
            "cards taken back by evicting whole gangs, by the queue taking back and card",
            ["queue", "card"],
            registry=self.registry,
        )
        self.reclaim_bound = Histogram(
            "cardquota_reclaim_bound_seconds",
            "from an admitted pod's first wait for cards no node had free to its binding, when they "
            "were taken back for it, by its queue and card",
            ["queue", "card"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )

        # Known label values start at 0, so rates and alerts see a series before the first event.
        for status in ("400", "503", "500"):
            self.rejected.labels(status)
        for webhook in ("validate", "mutate"):
            self.too_complex.labels(webhook)

        self._children: dict[tuple[str, str, str, str], tuple[Any, Any]] = {}

    def observe(self, webhook: str, kind: str, operation: str, decision: str, seconds: float) -> None:
        """Count one review and its latency (label children are looked up once per combination)."""
        key = (webhook, kind, operation, decision)
        children = self._children.get(key)
        if children is None:
            # Label values come from requests: anything unexpected is "other", so no client can
            # make the series (and this cache) grow without bound.
            kind = kind if kind in KINDS else "other"
            operation = operation if operation in OPERATIONS else "other"
            children = (self.reviews.labels(webhook, kind, operation, decision), self.latency.labels(webhook))
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def observe_would_refuse(self, queue: str, card: str, kind: str, mode: str) -> None:
        """An admission its queue's quota would have refused, in ``mode`` ("warn" or "audit")."""
        self.would_refuse.labels(queue, card, kind if kind in KINDS else "other", mode).inc()

    def observe_reclaim(self, queue: str, card: str, outcome: str, cards: int) -> None:
        """One reclaim decision for ``queue``'s pods; ``cards``: what an eviction took back (units
        of a card)."""
        self.reclaims.labels(queue, card, outcome).inc()
        if outcome == "evicted":
            self.reclaimed_cards.labels(queue, card).inc(cards / UNIT)

    def observe_reclaim_bound(self, queue: str, card: str, seconds: float) -> None:
        """A pod of ``queue`` bound on cards of ``card`` taken back for it, ``seconds`` after it
        first waited."""
        self.reclaim_bound.labels(queue, card).observe(seconds)

    def observe_served(self, waiter: Waiter, waited: float) -> None:
        self.waited.labels(waiter.queue).observe(waited)

    def watch_state(self, state: Callable[[], ClusterState | None]) -> None:
        self.registry.register(_StateCollector(state))


class _StateCollector(Collector):
    def __init__(self, state: Callable[[], ClusterState | None]) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state()
        if state is None:
            return
        status = cluster_status(state)
        families = {
            figure: GaugeMetricFamily(f"cardquota_queue_{figure}_cards", help_text, labels=["queue", "card"])
            for figure, help_text in QUEUE_FIGURES.items()
        }
        lending = {
            figure: GaugeMetricFamily(f"cardquota_queue_card_{figure}", help_text, labels=["queue", "card"])
            for figure, help_text in LENDING_FIGURES.items()
        }
        over = GaugeMetricFamily(
            "cardquota_queue_overcommitted_cards", "cards used above the quota", labels=["queue", "card"]
        )
        for queue, per_card in status["queues"].items():  # the same figures as status, placed once
            for card, n in per_card.items():
                used = n.get("may_use", n["quota"]) - n["free"]  # free is of what it may use now
                values = {**n, "running": n["bound"], "used": used}
                for figure, family in families.items():
                    family.add_metric([queue, card], values[figure])
                if "deserved" in n:
                    for figure, family in lending.items():
                        family.add_metric([queue, card], n[figure])
                excess = used - n["quota"] if "may_use" in n else -n["free"]
                if excess > 0:
                    over.add_metric([queue, card], excess)
        yield from families.values()
        yield from lending.values()
        cards = GaugeMetricFamily("cardquota_cluster_cards", "cards discovered on nodes", labels=["card"])
        for card, info in status["cards"].items():
            cards.add_metric([card], info["total"])
        yield cards
        yield over
        skipped = sum(1 for node in state.nodes.values() if node.warnings and not node.cards)
        yield GaugeMetricFamily(
            "cardquota_nodes_skipped", "nodes whose card labels or resources are unusable", value=skipped
        )
        yield GaugeMetricFamily(
            "cardquota_in_flight_holds", "in-flight ledger entries", value=len(state.ledger)
        )
        unsent_resources = GaugeMetricFamily(
            "cardquota_unsent_card_resource_nodes",
            "nodes advertising a card resource the webhooks' filters never send",
            labels=["resource"],
        )
        for resource, nodes, _ in unsent(state):
            unsent_resources.add_metric([resource], len(nodes))
        yield unsent_resources
        off_model = GaugeMetricFamily(
            "cardquota_claims_off_model",
            "resource claims allocated another GPU model than their pod was charged for, by model allocated",
            labels=["card"],
        )
        for card, n in sorted(
            Tally(entry["allocated"] for entry in status.get("claims_off_model", ())).items()
        ):
            off_model.add_metric([card], n)
        yield off_model
        yield from _line_families(state, time.time())
        objects = GaugeMetricFamily(
            "cardquota_objects_skipped",
            "objects the cluster holds in a shape that cannot be read (see cardquota status)",
            labels=["kind"],
        )
        for kind, n in sorted(Tally(key.split("/", 1)[0] for key in state.skipped).items()):
            objects.add_metric([kind], n)
        yield objects


def _line_families(state: ClusterState, now: float) -> Iterator[GaugeMetricFamily]:
    """Per queue: what waits in its line (workloads or pods, and their pods) and the oldest wait."""
    waiters = GaugeMetricFamily("cardquota_line_waiters", "waiters in the queue's line", labels=["queue"])
    pods = GaugeMetricFamily(
        "cardquota_line_waiting_pods", "pods the queue's waiters still wait for", labels=["queue"]
    )
    oldest = GaugeMetricFamily(
        "cardquota_line_oldest_wait_seconds",
        "how long the queue's longest waiter has waited",
        labels=["queue"],
    )
    for queue in sorted(set(state.tree.queues) | set(state.line.queues())):  # 0 where nothing waits
        line = state.line.line(queue)
        waiters.add_metric([queue], len(line))
        pods.add_metric([queue], sum(state.waiting.waiting_pods(w) for w in line))
        oldest.add_metric([queue], max(0.0, now - min(w.since for w in line)) if line else 0.0)
    yield from (waiters, pods, oldest)

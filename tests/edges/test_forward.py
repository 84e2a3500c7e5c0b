"""A replica that does not decide forwards each review to the one that does, over real TLS: the
answer is the leader's, a forwarded review is never forwarded again, and a review waits for a
leader through a handover instead of failing."""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from tests.edges.serving import CLUSTER, REVIEWS, client_context, free_port, serve_in_thread
from tests.edges.test_server import FakeSource
from webhook.cluster import snapshot
from webhook.core.index.state import ClusterState
from webhook.serve import review
from webhook.serve.forward import FORWARDED_HEADER, Forwarder, Unreachable
from webhook.serve.metrics import Metrics
from webhook.tools import devcerts


class Leader(FakeSource):
    def __init__(self) -> None:
        self.state: ClusterState | None = snapshot.load_snapshot(CLUSTER)


class Standby(FakeSource):
    """Synced, but another replica holds the Lease at whatever ``where()`` says."""

    ready = False

    def __init__(self, where: Callable[[], str | None]) -> None:
        self.where = where
        self.state: ClusterState | None = snapshot.load_snapshot(CLUSTER)

    def not_ready_reason(self) -> str:
        return "another replica holds the lease ns/cardquota and serves"

    def leader_address(self) -> str | None:
        return self.where()


def forwarder(certs: Path) -> Forwarder:
    devcerts.ensure_dev_certs(certs)
    return Forwarder(certs / "tls.crt", certs / "tls.key", None, present_cert=False)


def post(url: str, certs: Path, name: str, **headers: str) -> httpx.Response:
    with httpx.Client(verify=client_context(certs), timeout=30) as client:
        body = (REVIEWS / name).read_bytes()
        return client.post(
            f"{url}/validate", content=body, headers={"Content-Type": "application/json", **headers}
        )


def test_a_standby_answers_with_the_leaders_decision_and_counts_it(tmp_path: Path) -> None:
    metrics = Metrics()
    with serve_in_thread(Leader(), tmp_path) as leader:
        address = leader.removeprefix("https://")
        with serve_in_thread(
            Standby(lambda: address), tmp_path, forwarder=forwarder(tmp_path), metrics=metrics
        ) as standby:
            expected_state = snapshot.load_snapshot(CLUSTER)  # the leader's holds, kept alike
            for name in ("pod-fits.json", "pod-over-quota.json"):
                answer = post(standby, tmp_path, name)
                expected = review.answer(
                    expected_state, (REVIEWS / name).read_bytes(), "validate", time.time()
                )
                assert answer.status_code == 200 and answer.json() == expected, name
    text = generate_latest(metrics.registry).decode()
    assert 'cardquota_forwarded_reviews_total{status="200"} 2.0' in text


def test_a_forwarded_review_is_never_forwarded_again(tmp_path: Path) -> None:
    with serve_in_thread(Leader(), tmp_path) as leader:
        address = leader.removeprefix("https://")
        with serve_in_thread(Standby(lambda: address), tmp_path, forwarder=forwarder(tmp_path)) as standby:
            answer = post(standby, tmp_path, "pod-fits.json", **{FORWARDED_HEADER: "1"})
    assert answer.status_code == 503 and "another replica holds the lease" in answer.json()["error"]


def test_with_no_leader_a_review_waits_then_fails_with_the_reason(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # the Lease names a replica that is gone
    for where, reason in (
        (lambda: None, "no replica holds the lease"),
        (lambda: dead, f"the leader at {dead}"),
    ):
        with serve_in_thread(
            Standby(where), tmp_path, forwarder=forwarder(tmp_path), forward_wait=0.3
        ) as standby:
            started = time.monotonic()
            answer = post(standby, tmp_path, "pod-fits.json")
            waited = time.monotonic() - started
        assert answer.status_code == 503, answer.text
        assert (
            "no leader answered within 0.3 s" in answer.json()["error"] and reason in answer.json()["error"]
        )
        assert 0.3 <= waited < 5, waited


def test_a_review_that_arrives_during_a_handover_is_answered_by_the_new_leader(tmp_path: Path) -> None:
    with serve_in_thread(Leader(), tmp_path) as leader:
        address, since = leader.removeprefix("https://"), time.monotonic()
        # Nobody holds the Lease for the first 0.5 s, then the new leader does.
        where = lambda: address if time.monotonic() - since > 0.5 else None  # noqa: E731
        with serve_in_thread(
            Standby(where), tmp_path, forwarder=forwarder(tmp_path), forward_wait=4
        ) as standby:
            answer = post(standby, tmp_path, "pod-fits.json")
    assert answer.status_code == 200 and answer.json()["response"]["allowed"] is True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=40))
def test_whatever_address_the_lease_carries_a_forward_fails_cleanly(tmp_path: Path, address: str) -> None:
    """The address comes from an object anyone with write access to the Lease may edit."""

    async def attempt() -> str:
        relay = forwarder(tmp_path)
        try:
            await relay.send(address, "/validate", b"{}", 0.2)
        except Unreachable as exc:
            return str(exc)
        finally:
            await relay.close()
        return "answered"

    outcome = asyncio.run(attempt())
    assert outcome == "answered" or outcome.startswith(f"{address}: ")

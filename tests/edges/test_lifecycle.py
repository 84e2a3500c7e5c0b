"""The server's life as a cluster lives it: certificate rotation and rolling restarts under load."""

import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.edges.serving import (
    REVIEWS,
    Process,
    client_context,
    mount_like_kubelet,
    serve_process,
    served_serial,
)
from webhook.tools import devcerts

GOOD = (REVIEWS / "pod-cpu-only.json").read_bytes()


class Load:
    """Threads sending reviews until stopped; every answer that is not a 200 review is a failure."""

    def __init__(self, url: str, certs: Path, fresh_connections: bool) -> None:
        self.url, self.certs, self.fresh = url, certs, fresh_connections
        self.sent, self.failures = 0, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _once(self, client: httpx.Client) -> None:
        try:
            answer = client.post(f"{self.url}/validate", content=GOOD)
            if answer.status_code != 200 or answer.json()["response"]["allowed"] is not True:
                self.failures.append(f"{answer.status_code}: {answer.text[:200]}")
        except httpx.HTTPError as exc:
            self.failures.append(repr(exc))
        self.sent += 1

    def _run(self) -> None:
        context = client_context(self.certs)
        with httpx.Client(verify=context, timeout=10) as client:
            while not self._stop.is_set():
                if self.fresh:
                    with httpx.Client(verify=context, timeout=10) as once:
                        self._once(once)
                else:
                    self._once(client)

    def __enter__(self) -> "Load":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize("fresh_connections", [True, False], ids=["new connections", "keep-alive"])
def test_a_rotated_certificate_is_served_without_restart_and_no_review_fails(
    tmp_path: Path, fresh_connections: bool
) -> None:
    ca_dir = devcerts.ensure_dev_certs(tmp_path / "ca")
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), None)
    mounted = tmp_path / "mounted"

    def issue() -> dict[str, bytes]:
        cert, key = devcerts.issue(ca, ca_key, devcerts.name("rotating"), names=devcerts.DEFAULT_NAMES)  # type: ignore[arg-type]
        return {"tls.crt": cert, "tls.key": key, "ca.crt": (ca_dir / "ca.crt").read_bytes()}

    mount_like_kubelet(mounted, "1", issue())
    flags = ("--cert-poll-seconds", "0.2")
    with serve_process(mounted, tmp_path / "server.log", *flags, make_certs=False) as served:
        before = served_serial(served.port, mounted)
        with Load(served.url, mounted, fresh_connections) as load:
            time.sleep(0.5)
            mount_like_kubelet(mounted, "2", issue())
            wait_for(lambda: served_serial(served.port, mounted) != before, timeout=10)
            time.sleep(0.5)
        assert load.sent > 20 and load.failures == []
        assert '"msg":"certificate reloaded"' in served.log()
        with served.client() as client:
            assert "cardquota_certificate_reloads_total 1.0" in client.get("/metrics").text


def test_a_half_written_rotation_keeps_the_previous_certificate(tmp_path: Path) -> None:
    with serve_process(tmp_path / "certs", tmp_path / "server.log", "--cert-poll-seconds", "0.1") as served:
        before = served_serial(served.port, served.certs)
        (served.certs / "tls.key").write_bytes(b"not a key")  # a key that does not match (yet)
        time.sleep(0.5)
        assert served_serial(served.port, served.certs) == before
        assert "certificate reload skipped" in served.log()


def test_sigterm_turns_unready_keeps_answering_through_the_drain_then_exits_cleanly(tmp_path: Path) -> None:
    process = Process(tmp_path / "certs", tmp_path / "server.log", "--drain-seconds", "2")
    try:
        process.wait_ready()
        with Load(process.url, process.certs, fresh_connections=False) as load, process.client() as probe:
            time.sleep(0.3)
            process.terminate()
            terminated = time.monotonic()
            wait_for(lambda: probe.get("/readyz").status_code == 503, timeout=5)
            assert "draining" in probe.get("/readyz").text
            time.sleep(max(0.0, 1.5 - (time.monotonic() - terminated)))  # inside the drain period
            assert process.proc.poll() is None
            sent_in_drain = load.sent
        assert load.failures == [] and sent_in_drain > 20
        assert process.proc.wait(timeout=15) == 0
        assert time.monotonic() - terminated >= 2
    finally:
        process.stop()


def test_client_certificates_are_required_when_a_client_ca_is_set(tmp_path: Path) -> None:
    certs = devcerts.ensure_dev_certs(tmp_path / "certs")
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), None)
    cert, key = devcerts.issue(ca, ca_key, devcerts.name("kube-apiserver"), client=True)  # type: ignore[arg-type]
    (tmp_path / "client.crt").write_bytes(cert)
    (tmp_path / "client.key").write_bytes(key)
    flags = ("--client-ca", str(certs / "ca.crt"))
    process = Process(certs, tmp_path / "server.log", *flags)
    try:
        with_cert = client_context(certs, (tmp_path / "client.crt", tmp_path / "client.key"))
        url = process.url

        def ready() -> bool:  # ready, not just alive: before the state is loaded reviews get 503
            try:
                return httpx.get(f"{url}/readyz", verify=with_cert).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, timeout=30)
        assert httpx.post(f"{url}/validate", content=GOOD, verify=with_cert).status_code == 200
        with pytest.raises((httpx.TransportError, ssl.SSLError)):
            httpx.get(f"{url}/healthz", verify=client_context(certs))
    finally:
        process.stop()


def test_a_missing_certificate_fails_at_start_with_a_clear_message(tmp_path: Path) -> None:
    process = Process(tmp_path, tmp_path / "server.log", make_certs=False)
    assert process.proc.wait(timeout=30) == 2
    assert "cardquota: cannot read certificate files" in process.log()
    process.stop()

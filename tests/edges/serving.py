"""Run the real server for tests: as a ``cardquota serve`` process, or in a thread with a test source."""

import asyncio
import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from cryptography import x509

from webhook.cluster.sources import StateSource
from webhook.serve import server
from webhook.serve.forward import Forwarder
from webhook.serve.metrics import Metrics
from webhook.serve.tls import CertStore
from webhook.tools import devcerts

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"
REVIEWS = ROOT / "examples" / "reviews"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def queue_figure(client: httpx.Client, figure: str, queue: str, card: str) -> float | None:
    """The ``cardquota_queue_<figure>_cards`` gauge of ``queue`` and ``card`` read through ``client``
    (None when the webhook shows none: a queue or card it does not know)."""
    wanted = f'cardquota_queue_{figure}_cards{{card="{card}",queue="{queue}"}} '
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    return None


def client_context(certs: Path, client_cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if client_cert:
        context.load_cert_chain(*client_cert)
    return context


def served_serial(port: int, certs: Path) -> int:
    context = client_context(certs)
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def mount_like_kubelet(directory: Path, version: str, files: dict[str, bytes]) -> None:
    """Lay files out as a mounted Secret: ``..<version>/`` dirs, ``..data`` swapped atomically."""
    target = directory / f"..{version}"
    target.mkdir(parents=True)
    for name, data in files.items():
        (target / name).write_bytes(data)
        if not (directory / name).exists():
            (directory / name).symlink_to(Path("..data") / name)
    (directory / "..data_tmp").symlink_to(target.name)
    os.replace(directory / "..data_tmp", directory / "..data")


class Process:
    """``cardquota serve`` on a free loopback port, with its log kept for assertions."""

    def __init__(
        self,
        certs: Path,
        log: Path,
        *flags: str,
        cluster: Path | None = CLUSTER,
        make_certs: bool = True,
        program: tuple[str, ...] = (sys.executable, "-m", "webhook"),
        cwd: Path = ROOT,
        user: int | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.certs, self.log_path = devcerts.ensure_dev_certs(certs) if make_certs else certs, log
        self.port = port or free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        source = ["--cluster", str(cluster)] if cluster is not None else []
        command = [*program, "serve", *source, "--cert-dir", str(certs)]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *flags]
        self._log = log.open("wb")
        environment = (
            {
                k: v
                for k, v in os.environ.items()
                if not k.startswith("CARDQUOTA_") and k != "KUBERNETES_SERVICE_HOST"
            }
            | {"PYTHONUNBUFFERED": "1"}
            | (env or {})
        )  # a failed test's copy of the log is whole
        as_user = {} if user is None else {"user": user, "group": user, "extra_groups": []}
        self.proc = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd, env=environment, **as_user
        )

    def ready_now(self) -> bool:
        """Whether it is alive and answers ``/readyz`` with 200 now. Read with the standard
        library's client, which closes its socket whatever breaks: httpx leaves a TLS socket
        unclosed when the server dies mid-request (a ResourceWarning, an error here)."""
        if self.proc.poll() is not None:
            return False
        connection = http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=client_context(self.certs), timeout=10
        )
        try:
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=client_context(self.certs), timeout=10, **kwargs)

    def figure(self, figure: str, queue: str, card: str) -> float | None:
        """The ``cardquota_queue_<figure>_cards`` gauge of ``queue`` and ``card`` (None when absent)."""
        with self.client() as client:
            return queue_figure(client, figure, queue, card)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, self.log()
                try:
                    if client.get("/readyz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise AssertionError(f"server not ready in {timeout} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait(timeout=30)
        self._log.close()
        return code


@contextmanager
def serve_process(
    certs: Path, log: Path, *flags: str, cluster: Path = CLUSTER, make_certs: bool = True
) -> Iterator[Process]:
    process = Process(certs, log, *flags, cluster=cluster, make_certs=make_certs)
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@contextmanager
def serve_in_thread(
    source: StateSource,
    certs: Path,
    max_body_bytes: int = 7 * 2**20,
    forwarder: Forwarder | None = None,
    forward_wait: float = 4.0,
    metrics: Metrics | None = None,
    port: int | None = None,
) -> Iterator[str]:
    """The app factory over real TLS in a background event loop, for sources a process cannot have."""
    devcerts.ensure_dev_certs(certs)
    store = CertStore(certs)
    loop = asyncio.new_event_loop()
    app = server.make_app(
        source, metrics or Metrics(), server.Health(), max_body_bytes, forwarder, forward_wait
    )
    runner = server.web.AppRunner(app, access_log=None)
    port = port or free_port()

    async def start() -> None:
        await runner.setup()
        await server.web.TCPSite(runner, "127.0.0.1", port, ssl_context=store.listening).start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        if forwarder is not None:
            asyncio.run_coroutine_threadsafe(forwarder.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()

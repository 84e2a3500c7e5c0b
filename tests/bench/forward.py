"""``make bench``: what a forwarded review costs against a direct one, and the Lease's API load.

Run with ``python -m tests.bench.forward [--repeat 2000]``. A leader (``cardquota serve`` on the
bundled example cluster) and a standby that forwards every review to it (the same server with a
source that does not decide, in its own process) run side by side on loopback TLS. One client sends
the same AdmissionReview (a pod that fits) straight to the leader and through the standby, taking
turns request by request so that the machine's noise falls on both alike. Printed: median and p99
(ms) of each and their ratio. Then three replicas' Lease loops run for ``--lease-seconds`` at the
default timings against an in-memory Lease: writes and reads per second, the load leading adds to
the API server.
"""

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.edges.serving import CLUSTER, REVIEWS, client_context, free_port, serve_process
from tests.edges.test_lease import Client, Store
from webhook.cluster.lease import LeaderElector
from webhook.settings import ServeSettings
from webhook.tools import devcerts

BODY = (REVIEWS / "pod-fits.json").read_bytes()
HEADERS = {"Content-Type": "application/json"}


def standby(leader: str, port: int, certs: Path) -> None:
    """The standby's process: a server whose source never decides and names ``leader``."""
    from tests.edges.serving import serve_in_thread
    from tests.edges.test_forward import Standby
    from webhook.serve.forward import Forwarder

    forwarder = Forwarder(certs / "tls.crt", certs / "tls.key", None, present_cert=False)
    with serve_in_thread(Standby(lambda: leader), certs, forwarder=forwarder, port=port):
        while True:
            time.sleep(3600)


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99)]


async def lease_load(seconds: float) -> tuple[float, float, ServeSettings]:
    defaults = ServeSettings()
    store = Store()
    electors = [
        LeaderElector(
            Client(store),
            f"replica-{i}",
            "cardquota",
            "ns",
            duration=defaults.lease_duration_seconds,
            renew_deadline=defaults.lease_renew_deadline_seconds,
            renew_every=defaults.lease_retry_seconds,
        )
        for i in range(3)
    ]
    tasks = [asyncio.create_task(e.run()) for e in electors]
    await asyncio.sleep(1)
    reads, writes = store.reads, store.version
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return (store.version - writes) / seconds, (store.reads - reads) / seconds, defaults


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--lease-seconds", type=float, default=10.0)
    parser.add_argument("--standby", nargs=3, metavar=("LEADER", "PORT", "CERTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.standby:
        standby(args.standby[0], int(args.standby[1]), Path(args.standby[2]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        certs = devcerts.ensure_dev_certs(Path(tmp) / "certs")
        with serve_process(certs, Path(tmp) / "leader.log", cluster=CLUSTER) as leader:
            port = free_port()
            command = [sys.executable, "-m", "tests.bench.forward", "--standby", f"127.0.0.1:{leader.port}"]
            child = subprocess.Popen([*command, str(port), str(certs)])
            try:
                direct, forwarded = [], []
                with httpx.Client(verify=client_context(certs), timeout=10) as client:
                    wait_up(client, f"https://127.0.0.1:{port}/validate")
                    for url in (leader.url, f"https://127.0.0.1:{port}"):  # warm both connections
                        for _ in range(50):
                            client.post(f"{url}/validate", content=BODY, headers=HEADERS)
                    for _ in range(args.repeat):
                        for url, samples in ((leader.url, direct), (f"https://127.0.0.1:{port}", forwarded)):
                            started = time.perf_counter()
                            answer = client.post(f"{url}/validate", content=BODY, headers=HEADERS)
                            samples.append((time.perf_counter() - started) * 1000)
                            assert answer.status_code == 200, answer.text
            finally:
                child.kill()
                child.wait()
    (d50, d99), (f50, f99) = percentiles(direct), percentiles(forwarded)
    print(f"review straight to the leader: {d50:.2f} ms median, {d99:.2f} ms p99 ({args.repeat} requests)")
    print(f"review through a standby:      {f50:.2f} ms median, {f99:.2f} ms p99")
    print(f"forwarded / direct: {f50 / d50:.2f}x median, {f99 / d99:.2f}x p99")
    writes, reads, timings = asyncio.run(lease_load(args.lease_seconds))
    print(
        f"Lease at {timings.lease_duration_seconds} s / {timings.lease_renew_deadline_seconds} s /"
        f" {timings.lease_retry_seconds} s, three replicas: {writes:.1f} writes/s (the leader's renewals),"
        f" {reads:.1f} reads/s (all three)"
    )


def wait_up(client: httpx.Client, url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if client.post(url, content=BODY, headers=HEADERS).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


if __name__ == "__main__":
    main()

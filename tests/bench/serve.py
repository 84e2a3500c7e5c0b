"""``make bench``: the webhook over TLS under wrk, next to the floor handler, measured in one run.

    python -m tests.bench.serve [--pods 1000,10000,100000] [--seconds 5] [--rounds 3] [--connections 1,16]

wrk (Debian's package) sends a realistic mix, in turn: a card pod create (validate), a
``deployments/scale`` scale-up (validate) and a PodGroup create (mutate), over keep-alive TLS
connections. All servers run at once: the floor (tests/bench/floor.py), the webhook on a synthetic
snapshot of each size, and at the smallest size the webhook on the standard asyncio loop. Every
server is then measured at 1 and at 16 connections, ``rounds`` times, interleaved, so that the
machine's noise falls on all of them alike; the table shows the median of each figure. Also
printed: each server's RSS, its time to ready, and bytes per cached pod (tests/bench/memory.py).

    python -m tests.bench.serve --reference REV [--pods ...] [--seconds 5] [--rounds 3] [--connections 1,16]

(make bench: ``--reference cc74f51 --pods 1000,100000 --rounds 10 --seconds 2 --connections 1``)
instead times one card pod create (a device-plugin pod of one H200, validation and mutation apart) on the
server of commit REV, checked out into a temporary git worktree (tests/bench/admit.py), and on the
current one, both serving the same snapshot; each wrk run goes to one of them, the two taking turns
(each going first in alternate rounds). Printed: the median over the rounds of each side's p50 and
p99, and of the server's CPU time per review (user and system, from /proc: less swayed than latency
by the machine's other load), and the current/reference ratios.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.bench import memory, synthetic
from tests.bench.admit import worktree
from tests.builders import H200, pod
from tests.edges.serving import client_context, free_port
from webhook.tools import devcerts

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "out" / "bench"
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def _review(uid: str, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, **request},
    }


def _deployment(replicas: int) -> dict[str, Any]:
    template = pod("chat", H200, 1, queue_name="q7", namespace="bench")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "bench", "uid": "dep-chat"},
        "spec": {
            "replicas": replicas,
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }


def workloads() -> list[dict[str, Any]]:
    rs = _deployment(2) | {
        "kind": "ReplicaSet",
        "metadata": {"name": "chat-rs", "namespace": "bench", "uid": "rs-chat"},
    }
    return [_deployment(2), rs]


def _scale(replicas: int) -> dict[str, Any]:
    meta = {"name": "chat", "namespace": "bench"}
    return {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": meta, "spec": {"replicas": replicas}}


PODS = ("", "v1", "Pod", "pods")
STEPS = ("validate", "mutate")  # a pod create, timed each on its own (the API server mutates first)


def pod_create() -> dict[str, Any]:
    """The AdmissionReview of a device-plugin card pod's create: one H200 in queue q7."""
    new_pod = pod("bench-new", H200, 1, queue_name="q7", namespace="bench", phase=None)
    return _admission("bench-pod", PODS, operation="CREATE", object=new_pod)


def reviews() -> list[tuple[str, dict[str, Any]]]:
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "chat-rs",
        "uid": "rs-chat",
        "controller": True,
    }
    podgroup = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "chat-rs", "namespace": "bench", "ownerReferences": [owner]},
        "spec": {"minMember": 1, "queue": "q7"},
    }
    scale = ("autoscaling", "v1", "Scale", "deployments")
    groups = ("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups")
    return [
        ("/validate", pod_create()),
        (
            "/validate",
            _admission(
                "bench-scale",
                scale,
                subResource="scale",
                name="chat",
                operation="UPDATE",
                object=_scale(3),
                oldObject=_scale(2),
            ),
        ),
        ("/mutate", _admission("bench-podgroup", groups, operation="CREATE", object=podgroup)),
    ]


def _admission(uid: str, what: tuple[str, str, str, str], **fields: Any) -> dict[str, Any]:
    group, version, kind, resource = what
    resource_group = "apps" if kind == "Scale" else group
    return _review(
        uid,
        {
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": resource_group, "version": version, "resource": resource},
            "namespace": "bench",
            **fields,
        },
    )


def lua_script(path: Path, requests: list[tuple[str, dict[str, Any]]] | None = None) -> Path:
    """wrk sends ``requests`` (default: the realistic mix) in turn."""
    lines = ["local requests = {}"]
    for i, (target, body) in enumerate(reviews() if requests is None else requests, start=1):
        text = json.dumps(body)
        lines.append(
            f'requests[{i}] = wrk.format("POST", "{target}", {{["Host"] = "127.0.0.1", ["Content-Type"] = "application/json"}}, [==[{text}]==])'
        )
    lines += ["local i = 0", "request = function()", "  i = i % #requests + 1", "  return requests[i]", "end"]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Figures:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def wrk(url: str, connections: int, seconds: int, script: Path) -> Figures:
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout

    def latency(percent: str) -> float:
        value, unit = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()  # type: ignore[union-attr]
        return float(value) * UNITS[unit]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    failed = int(errors.group(1)) if errors else 0
    failed += sum(int(n) for n in socket_errors.groups()) if socket_errors else 0
    return Figures(rps, latency("50"), latency("99"), failed)


def start(command: list[str], url: str, certs: Path, log: Path, tree: Path = ROOT) -> subprocess.Popen[bytes]:
    """``command`` run in ``tree``, importing its ``webhook``, and ready."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(command, cwd=tree, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    with httpx.Client(verify=client_context(certs), timeout=5) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"{command[3]} exited: {log.read_text()[-2000:]}")
            try:
                if client.get(f"{url}/readyz").status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    raise SystemExit(f"not ready in time: {command}")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    ready_s: float


def launch(name: str, command: list[str], port: int, certs: Path, tree: Path = ROOT) -> Server:
    url = f"https://127.0.0.1:{port}"
    started = time.monotonic()
    proc = start(command, url, certs, WORK / f"{name.replace(' ', '-').replace(',', '')}.log", tree)
    return Server(name, url, proc, time.monotonic() - started)


def serve_command(snapshot: Path, certs: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "webhook",
        "serve",
        "--cluster",
        str(snapshot),
        "--cert-dir",
        str(certs),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--drain-seconds",
        "0",
        *extra,
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", default="1000,10000,100000", type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--connections", default="1,16", type=lambda s: [int(n) for n in s.split(",")])
    parser.add_argument("--seconds", type=int, default=5, help="length of one wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per server and connection count")
    parser.add_argument("--reference", help="instead: a pod create on this commit's server against today's")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk (make bench does it)")
    WORK.mkdir(parents=True, exist_ok=True)
    certs = devcerts.ensure_dev_certs(WORK / "certs")
    if args.reference:
        with worktree(args.reference) as reference:
            against(reference, args, certs)
        return
    script = lua_script(WORK / "reviews.lua")
    servers: list[Server] = []
    try:
        port = free_port()
        floor = [sys.executable, "-m", "tests.bench.floor", "--port", str(port), "--cert-dir", str(certs)]
        servers.append(launch("floor", floor, port, certs))
        for pods in args.pods:
            snapshot = synthetic.write_snapshot(WORK / "snapshots", pods)
            items = {"apiVersion": "v1", "kind": "List", "items": workloads()}
            (snapshot / "workloads.json").write_text(json.dumps(items))
            port = free_port()
            servers.append(
                launch(f"cardquota {pods:,} pods", serve_command(snapshot, certs, port), port, certs)
            )
            if pods == min(args.pods):
                port = free_port()
                command = serve_command(snapshot, certs, port, "--no-uvloop")
                servers.append(launch(f"cardquota {pods:,} pods, asyncio loop", command, port, certs))
                port = free_port()
                command = serve_command(snapshot, certs, port)
                command[command.index("webhook")] = "tests.bench.stubbed"
                servers.append(launch(f"cardquota {pods:,} pods, decision stubbed", command, port, certs))
        report(servers, args, script)
    finally:
        for server in servers:
            server.proc.terminate()
            server.proc.wait(timeout=60)
    for pods in (min(args.pods), max(args.pods)):
        print(f"bytes per cached pod at {pods:,} pods: {memory.bytes_per_pod(pods):.0f}")


def against(reference: Path, args: argparse.Namespace, certs: Path) -> None:
    """The pod create on the reference's server and the current one, same snapshot, turn by turn."""
    steps = {step: lua_script(WORK / f"pod-{step}.lua", [(f"/{step}", pod_create())]) for step in STEPS}
    print(
        f"reference: {args.reference}; {args.rounds} rounds of {args.seconds} s per side, step and"
        " connection count, turn by turn; p50 and p99 in ms, medians over the rounds"
    )
    print(
        "| pods | step | connections | p50 | reference | ratio | p99 | reference | ratio"
        " | CPU µs per review | reference | ratio | errors |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes = []
    for pods in args.pods:
        snapshot = synthetic.write_snapshot(WORK / "snapshots", pods)
        items = {"apiVersion": "v1", "kind": "List", "items": workloads()}
        (snapshot / "workloads.json").write_text(json.dumps(items))
        sides: list[Server] = []
        try:
            for name, tree in ((f"current {pods}", ROOT), (f"reference {pods}", reference)):
                port = free_port()
                sides.append(launch(name, serve_command(snapshot, certs, port), port, certs, tree))
            answers = [_answers(server, certs) for server in sides]
            if answers[0] != answers[1]:
                print(f"the answers differ: {answers[0]} against {answers[1]}")
            for server in sides:
                for script in steps.values():
                    wrk(server.url, 1, 2, script)  # warm up
            runs: dict[tuple[str, str, int], list[Figures]] = {}
            cpu: dict[tuple[str, str, int], list[float]] = {}
            for round_ in range(args.rounds):
                for step, script in steps.items():
                    for connections in args.connections:
                        for server in sides if round_ % 2 == 0 else reversed(sides):
                            used = cpu_seconds(server.proc.pid)
                            figures = wrk(server.url, connections, args.seconds, script)
                            used = cpu_seconds(server.proc.pid) - used
                            runs.setdefault((server.name, step, connections), []).append(figures)
                            per_review = used / (figures.rps * args.seconds) * 1e6
                            cpu.setdefault((server.name, step, connections), []).append(per_review)
            notes += [
                f"{s.name} pods: RSS {rss_mib(s.proc.pid):.0f} MiB, ready in {s.ready_s:.1f} s" for s in sides
            ]
        finally:
            for server in sides:
                server.proc.terminate()
                server.proc.wait(timeout=60)
        for step in STEPS:
            for connections in args.connections:
                mine, theirs = (runs[(server.name, step, connections)] for server in sides)
                m50, r50 = (statistics.median(f.p50_ms for f in side) for side in (mine, theirs))
                m99, r99 = (statistics.median(f.p99_ms for f in side) for side in (mine, theirs))
                mcpu, rcpu = (statistics.median(cpu[(server.name, step, connections)]) for server in sides)
                errors = sum(f.errors for f in mine + theirs)
                print(
                    f"| {pods:,} | {step} | {connections} | {m50:.3f} | {r50:.3f} | {m50 / r50:.2f}"
                    f" | {m99:.3f} | {r99:.3f} | {m99 / r99:.2f} | {mcpu:.0f} | {rcpu:.0f} | {mcpu / rcpu:.2f}"
                    f" | {errors} |",
                    flush=True,
                )
    print("\n".join(notes))


def _answers(server: Server, certs: Path) -> list[dict[str, Any]]:
    """Each side must allow the pod and patch it at the mutation: both do a pod create's work."""
    answers = []
    with httpx.Client(verify=client_context(certs), timeout=5) as client:
        for step in STEPS:
            response = client.post(f"{server.url}/{step}", json=pod_create()).json()["response"]
            if not response["allowed"] or (step == "mutate") != ("patch" in response):
                raise SystemExit(f"{server.name} /{step} answered {response}")
            answers.append(response)
    return answers


def report(servers: list[Server], args: argparse.Namespace, script: Path) -> None:
    """Every server, every connection count, ``rounds`` times, interleaved; the median of each figure."""
    for server in servers:
        wrk(server.url, 4, 2, script)  # warm up
    runs: dict[tuple[str, int], list[Figures]] = {}
    for _ in range(args.rounds):
        for server in servers:
            for connections in args.connections:
                runs.setdefault((server.name, connections), []).append(
                    wrk(server.url, connections, args.seconds, script)
                )
    print("| server | connections | requests/s | p50 ms | p99 ms | errors | RSS MiB | ready s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for server in servers:
        for connections in args.connections:
            figures = runs[(server.name, connections)]
            rps = statistics.median(f.rps for f in figures)
            p50 = statistics.median(f.p50_ms for f in figures)
            p99 = statistics.median(f.p99_ms for f in figures)
            errors = sum(f.errors for f in figures)
            print(
                f"| {server.name} | {connections} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {errors}"
                f" | {rss_mib(server.proc.pid):.0f} | {server.ready_s:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

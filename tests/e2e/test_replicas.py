"""Several replicas with --leader-elect on the real API server: one serves, and when it dies another
takes over within the Lease's duration."""

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.cluster import ControlPlane, free_port, wait_for
from tests.e2e.objects import H200, SELECTOR, card_queue, queued_deployment
from tests.e2e.registration import configurations
from tests.e2e.test_webhook import gated_pods
from tests.edges.serving import REVIEWS, Process

# How the API server ends its message when the webhook's connection ended without an answer.
TRANSPORT_ERRORS = (": EOF", "connection reset by peer", "connection refused", "broken pipe")


@pytest.fixture
def replicas(control_plane: ControlPlane, tmp_path: Path) -> Iterator[list[Process]]:
    lease = f"cardquota-e2e-{int(time.time() * 1000) % 100000}"
    flags = ("--kubeconfig", str(control_plane.webhook_kubeconfig), "--drain-seconds", "0", "--leader-elect")
    flags += ("--lease-name", lease, "--lease-namespace", control_plane.release_namespace)
    started = [
        Process(tmp_path / "certs", tmp_path / f"replica-{i}.log", *flags, cluster=None) for i in range(3)
    ]
    try:
        yield started
        for process in started:
            control_plane.assert_no_rbac_refusal(process.log())
    finally:
        for process in started:
            process.stop()


def test_one_replica_decides_the_others_forward_and_another_takes_over_when_it_dies(
    replicas: list[Process],
) -> None:
    wait_for("one serving replica", lambda: [p for p in replicas if serving(p)], timeout=60)
    wait_for("every replica ready", lambda: all(p.ready_now() for p in replicas), timeout=60)
    time.sleep(1)  # a second leader would have had time to appear
    leaders = [p for p in replicas if serving(p)]
    assert len(leaders) == 1
    others = [p for p in replicas if p is not leaders[0]]
    review = (REVIEWS / "pod-fits.json").read_bytes()
    with others[0].client() as client:  # a standby answers with the leader's decision
        answer = client.post("/validate", content=review, headers={"Content-Type": "application/json"})
        assert answer.status_code == 200 and answer.json()["response"]["uid"] == "review-pod-fits"
        assert 'cardquota_forwarded_reviews_total{status="200"} 1.0' in client.get("/metrics").text
    leaders[0].proc.kill()
    died = time.monotonic()
    successor = wait_for(
        "another replica to take over", lambda: [p for p in others if serving(p)], timeout=20, every=0.05
    )
    gap = time.monotonic() - died
    assert len(successor) == 1 and gap < 3, gap
    print(f"failover gap: {gap:.2f} s")


class Balancer:
    """A TCP balancer on loopback that, like a Service, sends connections only to ready replicas."""

    def __init__(self, backends: list[Process]) -> None:
        self.backends = backends
        self.ready: list[Process] = []
        self.loop = asyncio.new_event_loop()
        self.port = free_port()
        self._turn = 0
        self._open: set[asyncio.StreamWriter] = set()  # every connection, closed at stop
        # Per replica: connections it refused (dead, not yet seen so by the health check), and
        # connections it closed before the API server did (open when it died, or it drained).
        self.refused: Counter[Process] = Counter()
        self.dropped: Counter[Process] = Counter()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=10)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        self.server = await asyncio.start_server(self._connect, "127.0.0.1", self.port)
        self.health = asyncio.create_task(self._check())

    async def _check(self) -> None:
        while True:
            self.ready = [p for p in self.backends if await asyncio.to_thread(p.ready_now)]
            await asyncio.sleep(0.2)

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.ready:
            writer.close()
            return
        self._turn += 1
        backend = self.ready[self._turn % len(self.ready)]
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend.port)
        except OSError:
            self.refused[backend] += 1
            writer.close()
            return
        self._open |= {writer, up_writer}
        ended: list[str] = []  # which side closed first

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, side: str) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                data = await source.read(65536)
                while data:
                    sink.write(data)
                    await sink.drain()
                    data = await source.read(65536)
            ended.append(side)
            sink.close()

        await asyncio.gather(pipe(reader, up_writer, "client"), pipe(up_reader, writer, "replica"))
        self._open -= {writer, up_writer}
        if ended[0] == "replica":  # a replica closes a connection only when it dies or drains
            self.dropped[backend] += 1

    def lost(self, replica: Process) -> int:
        """How many reviews at most went unanswered because ``replica`` died: one on each
        connection it dropped or refused (the API server sends one request at a time on each)."""
        return self.dropped[replica] + self.refused[replica]

    def stop(self) -> None:
        async def close() -> None:
            self.health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.health
            self.server.close()
            for writer in list(self._open):  # kept alive by the API server: close them before the loop
                writer.close()
                with contextlib.suppress(OSError, ConnectionError):
                    await writer.wait_closed()
            await asyncio.sleep(0.1)  # the pipes see their ends and finish
            await self.loop.shutdown_default_executor()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@contextlib.contextmanager
def behind_balancer(plane: ControlPlane, replicas: list[Process], namespace: str) -> Iterator[Balancer]:
    """The replicas behind a readiness-aware balancer, registered for the test namespaces."""
    wait_for("one ready replica", lambda: [p for p in replicas if p.ready_now()], timeout=60)
    balancer = Balancer(replicas)
    registered = configurations(
        balancer.url, replicas[0].certs / "ca.crt", SELECTOR, f"cq-{namespace}", plane.webhook_user
    )
    try:
        plane.apply(*registered)
        yield balancer
    finally:
        for config in registered:
            plane.kubectl("delete", config["kind"].lower(), config["metadata"]["name"], check=False)
        balancer.stop()


class Answer(NamedTuple):
    status: int  # 0: no answer at all (a timeout, a reset)
    message: str  # the API server's message, "" for a created pod


def tally(answers: list[Answer]) -> str:
    """``answers`` counted by status, with the first message of each status that is neither a
    created pod nor a refusal."""
    counts = Counter(a.status for a in answers)
    odd = {a.status: a.message for a in reversed(answers) if a.status not in (201, 403)}
    return ", ".join(
        f"{status}: {count}" + (f" ({odd[status][:400]})" if status in odd else "")
        for status, count in sorted(counts.items())
    )


def burst(
    plane: ControlPlane, namespace: str, queue_name: str, count: int, prefix: str, during: Any = None
) -> list[Answer]:
    context = ssl.create_default_context(cafile=str(plane.certs / "ca.crt"))
    context.load_cert_chain(plane.certs / "admin.crt", plane.certs / "admin.key")
    url = f"{plane.server}/api/v1/namespaces/{namespace}/pods"
    annotations = {"volcano.sh/card.name": H200, "scheduling.volcano.sh/queue-name": queue_name}
    container = {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    spec = {"containers": [container], "nodeSelector": {"cardquota-e2e/nowhere": "true"}}

    def create(i: int) -> Answer:
        if during is not None and i == count // 4:
            during()
        meta = {"name": f"{prefix}-{i}", "annotations": annotations}
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        try:
            response = client.post(url, json=body)
        except httpx.TransportError as exc:
            return Answer(0, repr(exc))
        if response.status_code == 201:
            return Answer(201, "")
        try:
            return Answer(response.status_code, str(response.json()["message"]))
        except (ValueError, KeyError, TypeError):
            return Answer(response.status_code, response.text)

    with httpx.Client(verify=context, timeout=30) as client, ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(create, range(count)))


def test_three_replicas_behind_a_balancer_admit_exactly_fifty_of_two_hundred_even_when_the_leader_dies(
    control_plane: ControlPlane, replicas: list[Process], namespace: str, card_quota: Any
) -> None:
    """Exactly 50 created, and every other create refused, with the leader SIGKILLed a quarter of
    the way into the second burst: the standbys hold what reaches them for the next leader. Only a
    review the API server had sent to the killed replica itself fails (as operations.md says), and
    the balancer counts those: an answer that is neither 201 nor 403 beyond them fails the test."""
    with behind_balancer(control_plane, replicas, namespace) as balancer:
        queue_name = card_quota({H200: 50})
        wait_for(
            "the webhook answering",
            lambda: (
                burst(control_plane, namespace, queue_name, 1, f"probe{time.monotonic_ns()}")[0].status == 201
            ),
        )
        answers = burst(control_plane, namespace, queue_name, 199, "a")
        statuses = Counter(a.status for a in answers)
        assert statuses[201] == 49 and statuses[403] == 150, tally(answers)
        # A second burst on a fresh quota, the leader killed a quarter of the way in.
        other = f"{queue_name}-b"
        control_plane.apply(card_queue(other, {H200: 50}))
        leader = the_one_serving(control_plane, replicas)
        answers = burst(control_plane, namespace, other, 200, "b", during=leader.proc.kill)
        assert leader.proc.poll() is not None, "the leader was not killed during the burst"
        # A review the API server had sent to the killed leader itself gets no answer (the
        # failurePolicy applies): at most one on each connection that was open to it when it died,
        # or that the balancer sent it before it saw it dead.
        lost = balancer.lost(leader)
        failed = [a for a in answers if a.status not in (201, 403)]
        why = f"with the leader killed: {tally(answers)}; {lost} connections to the killed leader"
        assert Counter(a.status for a in answers)[201] == 50, why
        unexplained = [a for a in failed if a.status != 500 or not a.message.endswith(TRANSPORT_ERRORS)]
        assert not unexplained and len(failed) <= lost, why
        successor = the_one_serving(control_plane, [p for p in replicas if p is not leader])
        print(f"leader {identity(leader)} killed mid-burst, {identity(successor)} serves; {why}")
        pods = control_plane.get("pods", namespace=namespace)["items"]
        in_other = [
            p for p in pods if p["metadata"]["annotations"].get("scheduling.volcano.sh/queue-name") == other
        ]
        assert len(in_other) == 50
        control_plane.kubectl("delete", "queue", other, check=False)


def serving(process: Process) -> bool:
    if process.proc.poll() is not None:
        return False
    try:
        with process.client() as client:
            return "cardquota_serving 1.0" in client.get("/metrics").text
    except httpx.TransportError:
        return False


def pod_refusals(process: Process) -> float:
    """How many pod creates ``process`` has refused, from its metrics."""
    with process.client() as client:
        text = client.get("/metrics").text
    wanted = {"webhook": "validate", "kind": "Pod", "operation": "CREATE", "decision": "denied"}
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cardquota_reviews_total" and sample.labels == wanted
    )


def identity(process: Process) -> str:
    """The Lease holder's name for ``process``: the webhook holds it as ``hostname-pid``."""
    return f"{socket.gethostname()}-{process.proc.pid}"


def flag(process: Process, name: str) -> str:
    args = list(process.proc.args)
    return str(args[args.index(name) + 1])


def holder(plane: ControlPlane, process: Process) -> str:
    """Who holds the Lease ``process`` elects with, as the API server has it."""
    lease = plane.get("lease", flag(process, "--lease-name"), namespace=flag(process, "--lease-namespace"))
    return str(lease["spec"].get("holderIdentity") or "")


def the_one_serving(plane: ControlPlane, replicas: list[Process], timeout: float = 40) -> Process:
    """The replica that decides, once one of ``replicas`` does: the only one whose
    ``cardquota_serving`` is 1, and the Lease's holder."""
    found = wait_for("a serving replica", lambda: [p for p in replicas if serving(p)], timeout=timeout)
    assert len(found) == 1, f"{len(found)} replicas serve at once: {[identity(p) for p in found]}"
    (leader,) = found
    assert holder(plane, leader) == identity(leader), (holder(plane, leader), identity(leader))
    return leader


def test_with_a_pod_label_every_replica_is_ready_the_leader_is_labelled_and_a_sigterm_hands_over_in_seconds(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """What the chart runs: the Service selects the pod labelled serving=true, the PDB sees 3 ready.
    As installed, the replicas' pods and their Lease are in the release namespace, where the chart's
    Role lets its ServiceAccount label its own pod."""
    label = "cardquota.volcano.sh/serving"
    release = control_plane.release_namespace
    names = [f"replica-{i}-{namespace}" for i in range(3)]
    for name in names:
        stale = {label: "true"} if name == names[2] else {}  # left by an earlier run of that pod
        control_plane.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "cardquota", **stale}},
                "spec": {"nodeName": "rtx4090-0", "containers": [{"name": "c", "image": "i"}]},
            },
            namespace=release,
        )
    flags = ("--kubeconfig", str(control_plane.webhook_kubeconfig), "--drain-seconds", "1", "--leader-elect")
    flags += ("--label-leader-pod", "--lease-name", f"cardquota-{namespace}", "--lease-namespace", release)
    started = [
        Process(
            tmp_path / "certs",
            tmp_path / f"{name}.log",
            *flags,
            cluster=None,
            env={"POD_NAME": name, "POD_NAMESPACE": release},
        )
        for name in names
    ]

    def labelled() -> set[str]:
        pods = control_plane.get("pods", namespace=release)["items"]
        return {
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["name"] in names and p["metadata"].get("labels", {}).get(label) == "true"
        }

    try:
        wait_for("every replica ready", lambda: all(p.ready_now() for p in started), timeout=60)
        (leader,) = wait_for("one serving replica", lambda: [p for p in started if serving(p)], timeout=30)
        wait_for("only the leader labelled", lambda: labelled() == {names[started.index(leader)]}, timeout=10)
        standby = next(p for p in started if p is not leader)
        with standby.client() as client:
            answer = client.post("/validate", content=(REVIEWS / "pod-cpu-only.json").read_bytes())
            assert answer.status_code == 200, answer.text  # forwarded to the leader
        leader.terminate()  # SIGTERM: a rolling update or a drain
        stopped = time.monotonic()
        others = [p for p in started if p is not leader]
        (successor,) = wait_for("a standby serving", lambda: [p for p in others if serving(p)], timeout=30)
        wanted = {names[started.index(successor)]}
        wait_for("the label moved", lambda: labelled() == wanted, timeout=10, every=0.1)
        gap = time.monotonic() - stopped
        assert gap < 3, gap  # the next round of a standby and its barrier, not the Lease's duration
        print(f"graceful handover: {gap:.2f} s")
        assert leader.proc.wait(timeout=30) == 0
        for process in started:
            control_plane.assert_no_rbac_refusal(process.log())
    finally:
        for process in started:
            process.stop()
        control_plane.kubectl("delete", "pods", "-n", release, *names, "--wait=false", check=False)
        lease = f"lease/cardquota-{namespace}"
        control_plane.kubectl("delete", "-n", release, lease, "--ignore-not-found", check=False)


def test_a_leader_killed_while_a_workload_waits_leaves_the_line_to_the_next_one_which_calls_it_once(
    control_plane: ControlPlane, replicas: list[Process], namespace: str, card_quota: Any
) -> None:
    with behind_balancer(control_plane, replicas, namespace):
        queue_name = card_quota({H200: 1})
        control_plane.apply(queued_deployment("hog", 1, queue_name), namespace=namespace)
        wait_for("the hog's pod", lambda: pods_named(control_plane, namespace, "hog"), timeout=60)
        control_plane.apply(queued_deployment("web", 1, queue_name), namespace=namespace)

        def marked() -> bool:  # the leader's mark: the line, kept in the cluster
            sets = control_plane.get("replicasets", namespace=namespace)["items"]
            return any(
                rs["metadata"]["name"].startswith("web-")
                and "cardquota.volcano.sh/waiting" in (rs["metadata"].get("annotations") or {})
                for rs in sets
            )

        wait_for("web to be refused and marked as waiting", marked, timeout=30)
        served = lambda: pods_named(control_plane, namespace, "web")  # noqa: E731
        kill_the_leader_then_free_the_card(
            control_plane, replicas, namespace, served, "CardQuotaCalled", retried=True
        )
        wait_for("the mark removed", lambda: not marked(), timeout=15)


def test_a_leader_killed_while_a_pod_waits_under_the_gate_leaves_it_to_the_next_one_which_releases_it_once(
    control_plane: ControlPlane, replicas: list[Process], namespace: str, card_quota: Any
) -> None:
    with behind_balancer(control_plane, replicas, namespace):
        queue_name = card_quota({H200: 1})
        control_plane.kubectl("annotate", "queue", queue_name, "cardquota.volcano.sh/over-quota=wait")
        control_plane.apply(queued_deployment("hog", 1, queue_name), namespace=namespace)
        wait_for("the hog's pod", lambda: pods_named(control_plane, namespace, "hog"), timeout=60)
        control_plane.apply(queued_deployment("web", 1, queue_name), namespace=namespace)
        wait_for("web's pod under the gate", lambda: gated_pods(control_plane, namespace, "web"), timeout=30)

        def served() -> bool:
            return bool(pods_named(control_plane, namespace, "web")) and not gated_pods(
                control_plane, namespace, "web"
            )

        kill_the_leader_then_free_the_card(control_plane, replicas, namespace, served, "CardQuotaReleased")


def kill_the_leader_then_free_the_card(
    control_plane: ControlPlane,
    replicas: list[Process],
    namespace: str,
    served: Callable[[], Any],
    reason: str,
    retried: bool = False,
) -> None:
    """SIGKILL the leader while web waits; once another leads, the hog goes: web is served by the
    new leader exactly once (one Event ``reason``) and has one pod. ``retried``: web's ReplicaSet
    retries on its own back-off (doubling from 5 ms), so the hog goes right after a refusal by the
    new leader that came at least 2 s after the one before it: the next retry is then 4 s or more
    away, longer than the hog's deletion takes (the garbage collector's, 0.6 s in run 59, when the
    retry then 0.6 s away came first and got web's pod with no call) and the caller's next pass."""
    leader = the_one_serving(control_plane, replicas)
    leader.proc.kill()
    others = [p for p in replicas if p is not leader]
    successor = the_one_serving(control_plane, others)  # another replica decides before the card frees
    print(f"leader {identity(leader)} killed while web waits; {identity(successor)} took over")
    last = None
    while retried:
        seen = pod_refusals(successor)
        wait_for(
            "web's ReplicaSet refused by the new leader",
            lambda seen=seen: pod_refusals(successor) > seen,
            timeout=60,
            every=0.1,  # the refusal seen soon after it came: the next retry's distance is known
        )
        refused, last = last, time.monotonic()
        retried = refused is None or last - refused < 2.0
    control_plane.kubectl("delete", "-n", namespace, "deployment/hog", "--wait=false")
    wait_for("web served by the new leader", served, timeout=30)
    time.sleep(3)  # a second call or release would have come by now
    events = [e for e in control_plane.get("events", namespace=namespace)["items"] if e["reason"] == reason]
    assert len(events) == 1, [e["message"] for e in events]
    assert len(pods_named(control_plane, namespace, "web")) == 1


def pods_named(plane: ControlPlane, namespace: str, prefix: str) -> list[dict[str, Any]]:
    pods = plane.get("pods", namespace=namespace)["items"]
    return [
        p
        for p in pods
        if p["metadata"]["name"].startswith(f"{prefix}-") and not p["metadata"].get("deletionTimestamp")
    ]

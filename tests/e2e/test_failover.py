"""The fault soak: three replicas behind a balancer that, like a Service, sends to every ready
replica, under a steady load of card pod creates, Deployment scale-ups and deletions that keeps each
queue at its quota, while every replica is replaced one by one (an upgrade), the leader is killed
several times, and the API server restarts (every watch breaks; those older than its new watch cache
expire and relist). No queue may hold more cards than its quota after any change to its pods (a
watch started before the load, every event replayed in resourceVersion order), each queue must
reach its quota, and each fault must see the load answered and refused at least once (the quota's
edge was exercised in it); the webhook's figures must equal a recount afterwards, and the reviews
that failed are reported per fault: none across the upgrade. A killed leader must be replaced
within 3 s in each of the 12 kills: the bound is the slowest of 12, not a percentile.

Seeded (``CARDQUOTA_FAULT_SEED``), bounded (a fixed plan of faults) and stopping by itself.
"""

import json
import os
import random
import ssl
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import ControlPlane, soak_seed, wait_for
from tests.e2e.objects import H200, SELECTOR, card_queue, queued_deployment
from tests.e2e.registration import configurations
from tests.e2e.test_replicas import Balancer, serving
from tests.edges.serving import Process

QUOTA = 12  # H200 per queue
QUEUES = 2
KILLS = int(os.environ.get("CARDQUOTA_FAULT_KILLS", "12"))
WEBHOOK_FAILED = "failed calling webhook"
REFUSED = "denied the request"  # the API server's words for a webhook's denial


@dataclass
class Outcome:
    at: float
    what: str
    status: int
    failed: bool  # the API server could not get an answer from the webhook
    refused: bool  # the webhook answered no (quota)


@dataclass
class Load:
    """A thread that keeps creating card pods, scaling Deployments and deleting pods: more cards
    asked than freed, so each queue sits at its quota and a freed card is raced for."""

    plane: ControlPlane
    namespace: str
    queues: list[str]
    rng: random.Random
    outcomes: list[Outcome] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # what ended the thread early

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.plane.server, verify=admin_context(self.plane), timeout=30)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.made = 0

    def start(self) -> "Load":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)
        self.client.close()

    def _record(self, what: str, response: httpx.Response | None) -> None:
        if response is None:  # the API server itself was down: no review was asked for
            return
        failed = response.status_code >= 500 or WEBHOOK_FAILED in response.text
        refused = response.status_code == 403 and REFUSED in response.text
        self.outcomes.append(Outcome(time.monotonic(), what, response.status_code, failed, refused))

    def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response | None:
        try:
            return self.client.request(method, url, **kwargs)
        except httpx.TransportError:
            return None

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                self._step()
                time.sleep(0.05)
        except BaseException as exc:  # the test fails on it, with the exception
            self.error = exc

    def _step(self) -> None:
        pods = f"/api/v1/namespaces/{self.namespace}/pods"
        roll, queue = self.rng.random(), self.rng.choice(self.queues)
        if roll < 0.6:
            self.made += 1
            meta = {
                "name": f"p{self.made}",
                "annotations": {"volcano.sh/card.name": H200, "scheduling.volcano.sh/queue-name": queue},
            }
            container = {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            spec = {"containers": [container], "nodeSelector": {"cardquota-e2e/nowhere": "true"}}
            body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
            self._record("pod create", self._call("POST", pods, json=body))
        elif roll < 0.85:
            name = f"web-{self.queues.index(queue)}"
            scale = {"spec": {"replicas": self.rng.randint(0, 6)}}
            url = f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}/scale"
            headers = {"Content-Type": "application/merge-patch+json"}
            self._record("scale", self._call("PATCH", url, json=scale, headers=headers))
        else:  # one card freed about every 0.7 s, raced for by the creates of both queues
            listed = self._call("GET", pods)
            if listed is not None and listed.status_code == 200:
                bare = [p for p in listed.json()["items"] if not p["metadata"].get("ownerReferences")]
                for pod in self.rng.sample(bare, min(len(bare), 1)):
                    self._call("DELETE", f"{pods}/{pod['metadata']['name']}")


def admin_context(plane: ControlPlane) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(plane.certs / "ca.crt"))
    context.load_cert_chain(plane.certs / "admin.crt", plane.certs / "admin.key")
    return context


def version(pod: dict[str, Any] | None) -> str | None:
    return None if pod is None else str(pod["metadata"]["resourceVersion"])


class Expired(Exception):
    """The API server no longer has the events after our resourceVersion (410)."""


class PodWatch:
    """Every change to one namespace's pods, in resourceVersion order, replayed into each queue's
    cards: a watch started before the load and resumed from its last resourceVersion whenever it
    ends or breaks (the API server restarting). When the API server no longer has the events after
    that resourceVersion (410: its watch cache begins later), the revisions in between are read back
    one by one as exact-revision lists (from etcd, which keeps them), so no change goes unseen."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        timeout = httpx.Timeout(10, read=30)
        self.client = httpx.Client(base_url=plane.server, verify=admin_context(plane), timeout=timeout)
        self.url = f"/api/v1/namespaces/{namespace}/pods"
        self.pods: dict[str, dict[str, Any]] = {}
        self.revision = 0  # the last resourceVersion applied (or announced by a bookmark)
        self.events = 0  # changes applied, from the watch or read back
        self.read_back = 0  # revisions read back as lists after a 410
        self.peaks: Counter[str] = Counter()  # most cards a queue held after any change
        self.over: list[str] = []  # every change that left a queue above its quota
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "PodWatch":
        listed = self._list()
        for pod in listed["items"]:
            self._apply("ADDED", pod, None)
        self.revision = int(listed["metadata"]["resourceVersion"])
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)
        self.client.close()

    def caught_up(self) -> bool:
        """The replayed pods are the API server's pods now (names and resourceVersions)."""
        listed = {p["metadata"]["name"]: version(p) for p in self._list()["items"]}
        return listed == {name: version(pod) for name, pod in self.pods.items()}

    def _list(self, revision: int | None = None) -> dict[str, Any]:
        params = (
            {} if revision is None else {"resourceVersion": str(revision), "resourceVersionMatch": "Exact"}
        )
        while True:
            response = self.client.get(self.url, params=params)
            if response.status_code == 200:
                return dict(response.json())
            if response.status_code not in (429, 503):  # 429, 503: the API server is starting
                raise AssertionError(f"pods at {revision}: {response.status_code} {response.text[:300]}")
            time.sleep(0.05)

    def _apply(self, kind: str, pod: dict[str, Any], revision: int | None) -> None:
        if revision is not None:
            assert revision > self.revision, f"event at {revision} after {self.revision}: out of order"
            self.revision = revision
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self.pods.pop(name, None)
        else:
            self.pods[name] = pod
        self.events += 1
        for queue, cards in use(list(self.pods.values())).items():
            self.peaks[queue] = max(self.peaks[queue], cards)
            if cards > QUOTA:
                self.over.append(f"{queue}: {cards} after {kind} {name} at resourceVersion {revision}")

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self._watch()
                except Expired:
                    self._read_back()
                except (httpx.TransportError, ConnectionError):
                    time.sleep(0.05)  # the API server is down: again from the same resourceVersion
        except BaseException as exc:  # the test fails on it, with the exception
            self.error = exc

    def _watch(self) -> None:
        params = {"watch": "1", "resourceVersion": str(self.revision), "allowWatchBookmarks": "true"}
        params["timeoutSeconds"] = "2"  # ends by itself: the loop sees stopping and resumes
        with self.client.stream("GET", self.url, params=params) as response:
            if response.status_code == 410:
                raise Expired
            if response.status_code != 200:
                raise ConnectionError(f"watch: {response.status_code}")
            for line in response.iter_lines():
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired
                    raise ConnectionError(f"watch: {obj}")
                revision = int(obj["metadata"]["resourceVersion"])
                if kind == "BOOKMARK":
                    self.revision = max(self.revision, revision)
                else:
                    self._apply(kind, obj, revision)

    def _read_back(self) -> None:
        """Every revision after the last one applied up to now, as a list: a revision changes at
        most one object, so consecutive lists differ by at most one pod, in order."""
        latest = int(self._list()["metadata"]["resourceVersion"])
        for revision in range(self.revision + 1, latest + 1):
            listed = {p["metadata"]["name"]: p for p in self._list(revision)["items"]}
            changed = [
                n
                for n in listed.keys() | self.pods.keys()
                if version(listed.get(n)) != version(self.pods.get(n))
            ]
            assert len(changed) <= 1, f"revision {revision} changed {changed}"
            for name in changed:
                if name not in listed:
                    self._apply("DELETED", self.pods[name], revision)
                else:
                    self._apply("MODIFIED" if name in self.pods else "ADDED", listed[name], revision)
            self.read_back += 1
        self.revision = max(self.revision, latest)


def use(pods: list[dict[str, Any]]) -> Counter[str]:
    """H200 cards per queue of the pods that count (not finished, not being deleted)."""
    counted: Counter[str] = Counter()
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") or pod.get("status", {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            continue
        queue = (pod["metadata"].get("annotations") or {}).get("scheduling.volcano.sh/queue-name")
        if queue:
            counted[queue] += sum(
                int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                for c in pod["spec"]["containers"]
            )
    return counted


def figures(process: Process, name: str) -> dict[str, float]:
    """The ``cardquota_queue_<name>_cards`` gauge of ``process``, per queue."""
    with process.client() as client:
        text = client.get("/metrics").text
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(f"cardquota_queue_{name}_cards{{"):
            labels, value = line.rsplit(" ", 1)
            queue = labels.split('queue="', 1)[1].split('"', 1)[0]
            found[queue] = found.get(queue, 0.0) + float(value)
    return found


class Fleet:
    """The replicas as a Deployment keeps them: replaced, killed and restarted on new ports."""

    def __init__(self, plane: ControlPlane, tmp: Path) -> None:
        self.plane, self.tmp, self.made = plane, tmp, 0
        self.lease = f"cardquota-fault-{int(time.time() * 1000) % 100000}"
        self.replicas: list[Process] = []
        self.gone: list[Process] = []

    def start(self) -> Process:
        self.made += 1
        flags = ("--kubeconfig", str(self.plane.webhook_kubeconfig), "--drain-seconds", "2", "--leader-elect")
        flags += ("--lease-name", self.lease, "--lease-namespace", self.plane.release_namespace)
        process = Process(self.tmp / "certs", self.tmp / f"replica-{self.made}.log", *flags, cluster=None)
        self.replicas.append(process)
        return process

    def leader(self) -> Process:
        (leader,) = wait_for(
            "one serving replica", lambda: [p for p in self.replicas if serving(p)], timeout=30
        )
        return leader

    def retire(self, process: Process) -> None:
        self.replicas.remove(process)
        self.gone.append(process)

    def stop(self) -> None:
        for process in self.replicas + self.gone:
            process.stop()


@pytest.fixture
def fleet(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(control_plane, tmp_path)
    try:
        yield made
        for process in made.replicas + made.gone:
            control_plane.assert_no_rbac_refusal(process.log())
    finally:
        made.stop()


def between(load: Load, start: float, end: float) -> tuple[int, int, int]:
    """Reviews that failed, that were refused, and all that were answered in ``[start, end]``."""
    window = [o for o in load.outcomes if start <= o.at <= end]
    return sum(o.failed for o in window), sum(o.refused for o in window), len(window)


def test_upgrades_kills_and_api_server_restarts_under_load_lose_no_review_at_an_upgrade_and_admit_nothing_over(
    control_plane: ControlPlane, fleet: Fleet, namespace: str, request: pytest.FixtureRequest
) -> None:
    seed = soak_seed(request.node, "CARDQUOTA_FAULT_SEED")
    print(f"fault soak seed {seed} (replay: CARDQUOTA_FAULT_SEED={seed})")
    rng = random.Random(seed)
    queues = [f"q-{namespace}-{i}" for i in range(QUEUES)]
    control_plane.apply(*(card_queue(q, {H200: QUOTA}) for q in queues))
    for _ in range(3):
        fleet.start()

    def all_ready() -> bool:
        return all(p.ready_now() for p in fleet.replicas)

    wait_for("three ready replicas", all_ready, timeout=60)
    balancer = Balancer(fleet.replicas)  # reads the list as it changes
    ca = fleet.replicas[0].certs / "ca.crt"
    registered = configurations(balancer.url, ca, SELECTOR, f"cq-{namespace}", control_plane.webhook_user)
    report: list[str] = []
    faults: list[tuple[str, int, int]] = []  # each fault's window: (what, refused, answered)
    unexplained: list[str] = []  # kills with more failed reviews than were sent to the dead leader
    watch = PodWatch(control_plane, namespace)
    try:
        control_plane.apply(*registered)
        control_plane.apply(
            *(queued_deployment(f"web-{i}", 1, q) for i, q in enumerate(queues)), namespace=namespace
        )
        watch.start()  # before the load: it sees every change
        load = Load(control_plane, namespace, queues, rng).start()
        try:
            time.sleep(5)

            # An upgrade: a new replica first (maxSurge 1, maxUnavailable 0), then an old one stops.
            started = time.monotonic()
            for old in list(fleet.replicas):
                new = fleet.start()
                wait_for("the new replica ready", lambda new=new: new.ready_now(), timeout=60, every=0.1)
                old.terminate()
                assert old.proc.wait(timeout=30) == 0
                fleet.retire(old)
                time.sleep(1)
            failed, refused, asked = between(load, started, time.monotonic())
            report.append(
                f"rolling restart of 3 replicas: {failed} of {asked} reviews failed, {refused} refused"
            )
            faults.append(("rolling restart", refused, asked))
            assert failed == 0, report

            # Killed leaders: each back to serving (another replica decides) within seconds.
            gaps = []
            for kill in range(1, KILLS + 1):
                time.sleep(rng.uniform(1, 3))
                wait_for("three ready replicas", all_ready, timeout=60, every=0.1)
                leader = fleet.leader()
                started = time.monotonic()
                leader.proc.kill()
                wait_for(
                    "another replica serving",
                    lambda leader=leader: [p for p in fleet.replicas if p is not leader and serving(p)],
                    timeout=20,
                    every=0.02,
                )
                gaps.append(time.monotonic() - started)
                fleet.retire(leader)
                time.sleep(1)
                failed, refused, asked = between(load, started, time.monotonic())
                report.append(
                    f"leader killed: serving again after {gaps[-1]:.2f} s; {failed} of {asked} failed"
                    f" (connections to the killed leader: {balancer.lost(leader)}), {refused} refused"
                )
                faults.append((f"leader kill {kill}", refused, asked))
                if failed > balancer.lost(leader):  # only what was sent to the dead replica may fail
                    unexplained.append(report[-1])
                fleet.start()  # the kubelet restarts it; ready before the next kill
            wait_for("three ready replicas", all_ready, timeout=60, every=0.1)
            report.append(
                f"killed leader to serving over {len(gaps)} kills: median {statistics.median(gaps):.2f} s,"
                f" max {max(gaps):.2f} s"
            )
            assert max(gaps) <= 3, f"the slowest of {len(gaps)} kills took over 3 s: {report}"

            # The API server restarts: every watch breaks, old ones expire (410) and relist.
            started = time.monotonic()
            control_plane.restart_apiserver()
            wait_for(
                "a serving replica after the restart", lambda: [p for p in fleet.replicas if serving(p)], 60
            )
            time.sleep(3)
            failed, refused, asked = between(load, started, time.monotonic())
            report.append(f"API server restart: {failed} of {asked} reviews failed, {refused} refused")
            faults.append(("API server restart", refused, asked))
            time.sleep(3)
            alive = {"load": load.thread.is_alive(), "pod watch": watch.thread.is_alive()}
        finally:
            load.stop()
        print("\n".join(report))
        assert watch.error is None, f"the pod watch failed: {watch.error!r}"
        wait_for("the pod watch to catch up with the API server", watch.caught_up, timeout=30)
        watch.stop()
        print(
            f"pod watch: {watch.events} changes replayed ({watch.read_back} revisions read back after"
            f" a 410); peaks {dict(watch.peaks)}"
        )
        assert load.error is None, f"the load stopped early: {load.error!r}"
        assert all(alive.values()), f"threads that died before the end: {alive}"
        assert not unexplained, f"reviews failed that were not sent to the killed leader: {unexplained}"
        idle = [what for what, _, asked in faults if not asked]
        assert not idle, f"no review answered in {idle}: the load was not running; {report}"
        # The quota's edge must be crossed during each upgrade and API server restart, and during
        # nearly every kill: a kill's window is about 2 s and a few reviews (6 once, under load on
        # two cores), which can fall between two crossings of the edge.
        unrefused = [what for what, refused, _ in faults if not refused]
        kills = [what for what in unrefused if what.startswith("leader kill")]
        assert len(kills) <= 2 and unrefused == kills, (
            f"nothing refused in {unrefused}: the quota's edge went untested; {report}"
        )

        # Every change to the pods, in order: no queue ever above its quota, each at it some time.
        assert not watch.over, f"over quota at some moment: {watch.over[:5]}; {report}"
        assert all(watch.peaks[q] == QUOTA for q in queues), f"a queue never reached its quota: {watch.peaks}"

        # After it: the leader's figures equal a recount, and its ledger is empty.
        leader = fleet.leader()

        def agree() -> bool:
            recount = use(control_plane.get("pods", namespace=namespace)["items"])
            used, flight = figures(leader, "used"), figures(leader, "in_flight")
            return all(used.get(q, 0) == recount.get(q, 0) for q in queues) and not any(flight.values())

        wait_for("the leader's figures to equal a recount, its ledger empty", agree, timeout=45)
        assert not any(figures(leader, "overcommitted").values())
        relisted = sum(p.log().count("watch expired, relisting") for p in fleet.replicas)
        print(f"watches that expired and relisted after the restart: {relisted}")
        assert relisted > 0, "the API server restart expired no watch: the 410 path went untested"
    finally:
        watch.stop()
        for config in registered:
            control_plane.kubectl("delete", config["kind"].lower(), config["metadata"]["name"], check=False)
        balancer.stop()
        for q in queues:
            control_plane.kubectl("delete", "queue", q, check=False)

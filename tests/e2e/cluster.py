"""A real control plane as plain processes on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok with fake GPU nodes, plus the project's minimal Volcano CRDs.

Used by the pytest fixtures (``tests/e2e/conftest.py``) and by ``make cluster`` / ``make cluster-down``
(``python -m tests.e2e.cluster up|down``).
"""

import base64
import datetime
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.api import NotServed, Reader
from tests.e2e.build import PARTNERS, ensure_binaries, ensure_volcano, no_volcano
from tests.e2e.pki import ensure_pki

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHART = ROOT / "charts" / "card-quota-webhook"
# The chart's identity every webhook process runs as: its ServiceAccount, ClusterRole, Roles and
# bindings, rendered for the release operations.md installs ("card-quota" in namespace "card-quota").
RELEASE = "card-quota"
IDENTITY_TEMPLATES = ("templates/serviceaccount.yaml", "templates/rbac.yaml", "templates/policy.yaml")
TOKEN_DURATION = "8760h"  # outlives any test session and a long-lived `make cluster`
# How the API server words its refusal of one of the webhook's own writes, as the webhook logs it (the
# API server's Status body inside the ``error`` of a JSON line, its quotes escaped once or twice):
# RBAC's ("... is forbidden: User "system:serviceaccount:..." cannot patch resource "podgroups" in
# API group ..."); a ValidatingAdmissionPolicy's, such as the chart's own-writes policy
# (``ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>``, or
# without the binding, in k8s.io/apiserver's validating policy dispatcher); and an admission webhook's,
# ours refusing the webhook's own edit of a pod included (``admission webhook "<name>" denied the
# request: <message>``, or ``... denied the request without explanation``, in its ToStatusErr). A
# write to a terminating namespace is also a 403, but worded otherwise.
REFUSALS = {
    "RBAC": re.compile(r"cannot [a-z]+ resource"),
    "an admission policy": re.compile(
        r"ValidatingAdmissionPolicy '[^']*'(?: with binding '[^']*')? denied request"
    ),
    "an admission webhook": re.compile(r"admission webhook \S+ denied the request"),
}
CONTROLLERS = (
    "deployment-controller,replicaset-controller,job-controller,horizontal-pod-autoscaler-controller,"
    "garbage-collector-controller,namespace-controller,disruption-controller,"  # PDB status: evictions
    "resourceclaim-controller"  # DRA: a pod's ResourceClaimTemplate made its ResourceClaim
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


KWOK_DELETE_DELAY = """  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.annotations["pod-delete.stage.kwok.x-k8s.io/delay"]'
"""
SHUTDOWN = "pod-delete.stage.kwok.x-k8s.io/delay"  # a pod annotated "20s" takes 20 s to stop on kwok
KWOK_COMPLETE_DELAY = KWOK_DELETE_DELAY.replace("pod-delete", "pod-complete")
RUNS_FOR = "pod-complete.stage.kwok.x-k8s.io/delay"  # a Job's pod annotated "1h" runs that long on kwok


class ComponentDied(RuntimeError):
    """A control-plane process exited: waiting longer cannot help."""


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, every: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except ComponentDied:
            raise
        except Exception as exc:  # polling: keep the last error for the timeout message
            last = exc
        time.sleep(every)
    raise TimeoutError(
        f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last})" if last else "")
    )


def soak_seed(item: Any, variable: str = "CARDQUOTA_SOAK_SEED") -> int:
    """A seeded soak's seed: ``variable`` to replay one, else a fresh one. Kept on the test ``item``
    (``request.node``) as its "soak seed" property: the run's summary lists them all."""
    seed = int(os.environ.get(variable, random.randrange(1 << 32)))
    item.user_properties.append(("soak seed", seed))
    return seed


def holds_for(what: str, check: Callable[[], Any], seconds: float, every: float = 0.25) -> None:
    """Assert ``check`` holds throughout ``seconds``: a window for something that must not arrive,
    sized by the caller to what could arrive in it."""
    deadline = time.monotonic() + seconds
    while True:
        assert check(), f"{what} stopped holding"
        if time.monotonic() >= deadline:
            return
        time.sleep(every)


def headroom(plane: "ControlPlane", ref: str) -> dict[str, Any]:
    """``cardquota headroom REF -o json`` against the control plane, as a user runs it."""
    command = ["headroom", ref, "--kubeconfig", str(plane.kubeconfig), "--output", "json"]
    done = subprocess.run(
        [sys.executable, "-m", "webhook", *command], capture_output=True, check=True, timeout=120
    )
    return dict(json.loads(done.stdout))


def recommended(conf: str) -> str:
    """The scheduler configuration docs/operations.md recommends beside the webhook ("Tidal
    reclaim"): no ``reclaim`` or ``preempt`` action. The fork's release enables both; they evict
    single pods (a training gang left half-running), blind to card models and queue priorities,
    and would fight the webhook's whole-gang reclaim. Stock v1.15.1's release has neither."""
    lines = []
    for line in conf.splitlines():
        if line.startswith("actions:"):
            kept = [a.strip() for a in line.split(":", 1)[1].strip().strip('"').split(",")]
            line = 'actions: "' + ", ".join(a for a in kept if a not in ("reclaim", "preempt")) + '"'
        lines.append(line)
    return "\n".join(lines) + "\n"


def gpu_nodes() -> list[dict[str, Any]]:
    """The example cluster's GPU nodes as kwok nodes: labels as the NVIDIA GPU operator sets them."""
    docs = yaml.safe_load((ROOT / "examples" / "cluster" / "nodes.yaml").read_text())["items"]
    nodes = []
    for doc in docs:
        name = doc["metadata"]["name"]
        if name in ("h200-mig-0", "h800-mps-0", "rtx4090-0", "rtx4090d-0", "h800-vgpu-0", "h200-koord-0"):
            allocatable = {**doc["status"]["allocatable"], "pods": "110"}
            if "volcano.sh/vgpu-number" in allocatable:
                # kube-scheduler checks every extended resource a pod asks; Volcano's deviceshare,
                # which places vGPU pods for real, ignores vgpu-cores. So the kwok node offers them.
                allocatable["volcano.sh/vgpu-cores"] = "400"
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": {
                            **doc["metadata"]["labels"],
                            "type": "kwok",
                            "kubernetes.io/hostname": name,
                        },
                        "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    },
                    "spec": {"taints": []},
                    "status": {"allocatable": allocatable, "capacity": allocatable},
                }
            )
    return nodes


# The API server's audit log: the writes the validating webhook admits a quota would refuse carry its
# audit annotations (decisions.md §34); metadata only, for the kinds it counts, nothing else logged.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["create", "update", "patch"],
            "resources": [
                {"group": "apps", "resources": ["deployments", "deployments/scale", "statefulsets/scale"]},
                {"group": "", "resources": ["pods"]},
                {"group": "scheduling.volcano.sh", "resources": ["podgroups"]},
            ],
        },
        {"level": "None"},
    ],
}


class ControlPlane:
    """Start, use and stop one control plane under ``workdir``; component logs in ``workdir/logs``."""

    def __init__(
        self,
        workdir: Path,
        certs: Path | None = None,
        volcano: Path | None = None,
        partner: str = "fork",
        conf: str = "",
    ) -> None:
        """``volcano``: the directory of the real Volcano binaries (``build.ensure_volcano``); with it
        the control plane runs the real CRDs, vc-controller-manager and vc-scheduler (capacity-card)."""
        self.workdir = workdir
        self.volcano, self.partner = volcano, partner
        self.conf = conf  # the scheduler's configuration, when not the one built beside it
        self.logs = workdir / "logs"
        self.certs = ensure_pki(certs or ROOT / "certs")
        self.bin = ensure_binaries()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[Any] = []
        self.api_port = free_port()
        self.kubeconfig = workdir / "kubeconfig"  # cluster-admin: the tests' own kubectl calls
        # The chart's ServiceAccount: every webhook process the tests start runs as it (``identity``).
        self.release_namespace, self.webhook_account = RELEASE, RELEASE
        self.webhook_kubeconfig = workdir / "kubeconfig-webhook"
        # When the API server was down or starting again (restart_apiserver), in time.time(): it
        # serves before its RBAC authorizer has read the roles, and refuses everyone meanwhile.
        self.restarts: list[tuple[float, float]] = []
        self.reader = Reader(self.api_port, self.certs)
        self._reaping: list[tuple[str, list[str]]] = []  # (namespace, its queues), see reap_queues
        self._reaper: threading.Thread | None = None
        self._reap_lock = threading.Lock()
        self._stopping = threading.Event()

    # ---- processes -------------------------------------------------------------------
    def _start(self, name: str, args: Sequence[str], bin_dir: Path | None = None) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        self.procs[name] = subprocess.Popen(
            [str((bin_dir or self.bin) / name.split("#")[0]), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise ComponentDied(f"{name} exited with {proc.returncode}:\n{tail}")

    def start(self) -> "ControlPlane":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._etcd()
        self._apiserver()
        self._write_kubeconfig()
        wait_for("kube-apiserver /readyz", self._ready, timeout=120)
        kcm = [
            "--kubeconfig",
            str(self.kubeconfig),
            "--leader-elect=false",
            "--secure-port=0",
            f"--controllers={CONTROLLERS}",
        ]
        kcm += ["--horizontal-pod-autoscaler-sync-period=1s", "--use-service-account-credentials=true"]
        kcm += [
            f"--root-ca-file={self.certs / 'ca.crt'}",
            f"--service-account-private-key-file={self.certs / 'sa.key'}",
            "--v=1",
        ]
        self._start("kube-controller-manager", kcm)
        self._start(
            "kube-scheduler",
            ["--kubeconfig", str(self.kubeconfig), "--leader-elect=false", "--secure-port=0", "--v=1"],
        )
        self._start(
            "kwok",
            [
                "--kubeconfig",
                str(self.kubeconfig),
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--config={self._stages()}",
            ],
        )
        if self.volcano is None:
            self.apply_file(HERE / "manifests" / "volcano-crds.yaml")
        else:  # the real CRDs, before the scheduler starts (it dies on a missing informer type)
            self.kubectl("apply", "--server-side", "-f", str(self.volcano / "crds"))
        self.identity()
        self.apply(*gpu_nodes())
        wait_for("kwok to mark the GPU nodes Ready", self._nodes_ready, timeout=60)
        wait_for(
            "the Volcano CRDs to be served",
            lambda: (
                self.kubectl(
                    "get",
                    "queues.scheduling.volcano.sh,podgroups.scheduling.volcano.sh,jobs.batch.volcano.sh",
                    "-A",
                    check=False,
                ).returncode
                == 0
            ),
        )
        if self.volcano is not None:
            self._start_volcano(self.volcano)
        return self

    def _start_volcano(self, bin_dir: Path) -> None:
        """The real Volcano controller-manager and capacity-card scheduler, on loopback ports."""
        kubeconfig = ["--kubeconfig", str(self.kubeconfig), "--leader-elect=false"]
        ports = [f"127.0.0.1:{free_port()}" for _ in range(4)]
        controllers = "job-controller,pg-controller,queue-controller,gc-controller"
        self._start(
            "vc-controller-manager",
            [
                *kubeconfig,
                f"--listen-address={ports[0]}",
                f"--healthz-address={ports[1]}",
                f"--controllers={controllers}",
                "--v=2",
            ],
            bin_dir,
        )
        # --enable-metrics: without it the predicates plugin panics on a nil gauge.
        self._start(
            "vc-scheduler",
            [
                *kubeconfig,
                "--enable-metrics",
                f"--scheduler-conf={self._scheduler_conf(bin_dir)}",
                f"--listen-address={ports[2]}",
                f"--healthz-address={ports[3]}",
                # HAMi's DRA driver shares a GPU by consumable capacity, which needs this gate (its
                # documentation asks it of the cluster); without it such a claim is never allocated.
                "--feature-gates=DRAConsumableCapacity=true",
                "--v=3",
            ],
            bin_dir,
        )
        time.sleep(2)
        self._check_alive()

    def _scheduler_conf(self, bin_dir: Path) -> Path:
        """``conf`` if given, else the release's made ``recommended``."""
        path = self.workdir / "scheduler.conf"
        path.write_text(self.conf or recommended((bin_dir / "scheduler.conf").read_text()))
        return path

    def _stages(self) -> Path:
        """kwok's stages, with a shutdown time: a pod annotated ``pod-delete.stage.kwok.x-k8s.io/delay:
        "20s"`` stays Terminating (holding its card) that long after its deletion, as a real pod with a
        20 s shutdown does; others go at once, as before. Likewise a Job's pod annotated
        ``pod-complete.stage.kwok.x-k8s.io/delay: "1h"`` runs that long before it succeeds."""
        documents = (self.bin / "kwok-stages.yaml").read_text().split("\n---\n")
        for index, document in enumerate(documents):
            if "name: pod-delete" in document:
                documents[index] = document.replace("\nspec:\n", "\nspec:\n" + KWOK_DELETE_DELAY, 1)
            if "name: pod-complete" in document:
                documents[index] = document.replace("\nspec:\n", "\nspec:\n" + KWOK_COMPLETE_DELAY, 1)
        target = self.workdir / "kwok-stages.yaml"
        target.write_text("\n---\n".join(documents))
        return target

    def _etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        data = self.workdir / "etcd"
        self._start(
            "etcd",
            [
                f"--data-dir={data}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

    def _apiserver(self) -> None:
        c = self.certs
        self.audit_log = self.logs / "audit.log"
        policy = self.workdir / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        self._start(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                f"--secure-port={self.api_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--tls-cert-file={c / 'apiserver.crt'}",
                f"--tls-private-key-file={c / 'apiserver.key'}",
                f"--client-ca-file={c / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={c / 'sa.pub'}",
                f"--service-account-signing-key-file={c / 'sa.key'}",
                "--authorization-mode=Node,RBAC",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-maxsize=50",
                "--audit-log-maxbackup=1",
                "--v=1",
            ],
        )

    def _write_kubeconfig(self) -> None:
        def b64(name: str) -> str:
            return base64.b64encode((self.certs / name).read_bytes()).decode()

        user = {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")}
        self._kubeconfig(self.kubeconfig, "admin", user)

    def _kubeconfig(self, path: Path, name: str, user: dict[str, str]) -> Path:
        """A kubeconfig for this API server (its CA) as ``user``, its only and current context."""
        ca = base64.b64encode((self.certs / "ca.crt").read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "cardquota-e2e",
                    "cluster": {"server": self.server, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": "cardquota-e2e", "context": {"cluster": "cardquota-e2e", "user": name}}],
            "current-context": "cardquota-e2e",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def token_kubeconfig(self, namespace: str, account: str, path: Path, duration: str = "1h") -> Path:
        """A kubeconfig that authenticates as the ServiceAccount ``namespace/account`` with a token
        from the TokenRequest API (what a pod's projected token gives it)."""
        token = self.kubectl("create", "token", account, "-n", namespace, f"--duration={duration}")
        return self._kubeconfig(path, account, {"token": token.stdout.strip()})

    def render_identity(
        self, *flags: str, templates: Sequence[str] = IDENTITY_TEMPLATES
    ) -> list[dict[str, Any]]:
        """The chart's ServiceAccount and RBAC (or other ``templates``) as ``helm template`` renders
        them for ``RELEASE`` in ``release_namespace`` (``flags``: extra values)."""
        shown = [arg for template in templates for arg in ("--show-only", template)]
        args = ["template", RELEASE, str(CHART), "-n", self.release_namespace, *shown, *flags]
        done = subprocess.run([str(self.bin / "helm"), *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    def identity(self) -> None:
        """Install the chart's own identity, once per plane: its release namespace, ServiceAccount,
        ClusterRole, Roles and bindings as the chart renders them, and ``webhook_kubeconfig`` with
        a token of that ServiceAccount. Every webhook process the tests start runs with it, so a
        right the chart lacks fails where the product needs it; the tests' kubectl stays admin."""
        objects = self.render_identity()
        (account,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
        self.webhook_account = account
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.release_namespace}}
        listed = {"apiVersion": "v1", "kind": "List", "items": [namespace, *objects]}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(listed))
        self.token_kubeconfig(self.release_namespace, account, self.webhook_kubeconfig, TOKEN_DURATION)

    @property
    def webhook_user(self) -> str:
        """The user name the API server gives the webhook (what its ``matchConditions`` name)."""
        return f"system:serviceaccount:{self.release_namespace}:{self.webhook_account}"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def _ready(self) -> bool:
        self._check_alive()
        context = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        conn = http.client.HTTPSConnection("127.0.0.1", self.api_port, context=context, timeout=5)
        try:
            conn.request("GET", "/readyz")
            return conn.getresponse().status == 200
        finally:
            conn.close()

    def _nodes_ready(self) -> bool:
        self._check_alive()
        nodes = self.get("nodes")["items"]
        ready = [
            n
            for n in nodes
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        ]
        return len(ready) == len(gpu_nodes())

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port and etcd: watches break."""
        proc = self.procs["kube-apiserver"]
        down = time.time()
        os.killpg(proc.pid, signal.SIGKILL)  # a crash: long watches get no goodbye
        proc.wait(timeout=30)
        self._apiserver()
        wait_for("kube-apiserver /readyz after a restart", self._ready, timeout=120)
        self.restarts.append((down, time.time()))

    def assert_no_rbac_refusal(self, log: str) -> None:
        """Fail when a webhook's ``log`` shows the API server refusing one of its own writes
        (``REFUSALS``): a right its RBAC lacks (it runs as the chart's ServiceAccount), a write the
        chart's ValidatingAdmissionPolicy (or any other) denies, or one an admission webhook denies.
        The webhook logs such a write and goes on, so nothing else would fail. Refusals while the API
        server was starting again (``restarts``, and a second after it was ready) are the API
        server's, not the chart's."""

        def starting(line: str) -> bool:
            try:
                stamp = json.loads(line)["time"]
                at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            except (ValueError, KeyError, TypeError):
                return False
            return any(down <= at <= ready + 1.0 for down, ready in self.restarts)

        refused = [
            f"{by}: {line}"
            for line in log.splitlines()
            for by, words in REFUSALS.items()
            if words.search(line) and not starting(line)
        ]
        assert not refused, "the API server refused a write of the webhook:\n" + "\n".join(refused[:5])

    def reap_queues(self, namespace: str, queues: list[str]) -> None:
        """Delete ``queues`` (in that order) once ``namespace`` is gone, in the background: the real
        scheduler dies on a PodGroup (even of a finished job) whose queue is gone, and the namespace
        controller keeps a deleted namespace for its pods' grace period after they are gone."""
        with self._reap_lock:
            self._reaping.append((namespace, list(queues)))
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="queue-reaper", daemon=True)
                self._reaper.start()

    def _reap(self) -> None:
        while not self._stopping.wait(1.0):
            with self._reap_lock:
                pending = list(self._reaping)
            for namespace, queues in pending:  # in order: a parent queue after its children
                try:
                    if self.reader.exists("namespace", namespace):
                        break
                except (OSError, RuntimeError, http.client.HTTPException):
                    break  # the API server restarting: next round
                for queue in queues:
                    self.kubectl("delete", "queue", queue, "--ignore-not-found", "--wait=false", check=False)
                with self._reap_lock:
                    self._reaping.remove((namespace, queues))

    def stop(self) -> None:
        self._stopping.set()
        if self._reaper is not None:
            self._reaper.join(timeout=70)
        for proc in reversed(list(self.procs.values())):  # newest first: etcd after the API server,
            if proc.poll() is None:  # which otherwise waits 15 s for an etcd that is gone
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in self._logs:
            log.close()
        self.reader.close()

    # ---- kubectl -----------------------------------------------------------------------
    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def apply(self, *objects: dict[str, Any], namespace: str | None = None) -> None:
        args = ["create", "-f", "-"] + (["-n", namespace] if namespace else [])
        self.kubectl(*args, stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))

    def apply_file(self, path: Path) -> None:
        self.kubectl("apply", "-f", str(path))

    def get(self, *what: str, namespace: str | None = None) -> Any:
        """What ``kubectl get WHAT -o json`` prints; read over the plane's keep-alive connection
        (``api.Reader``) when WHAT is ``KIND``, ``KIND NAME`` or ``KIND -l SELECTOR``."""
        simple = len(what) == 1 or (len(what) == 2 and not what[1].startswith("-"))
        labelled = len(what) == 3 and what[1] in ("-l", "--selector")
        if (simple or labelled) and "," not in what[0] and "/" not in what[0]:
            name = what[1] if simple and len(what) == 2 else ""
            try:
                return self.reader.get(what[0], name, namespace or "", what[2] if labelled else "")
            except NotServed:
                pass  # kubectl says what it says of an unknown kind
        args = ["get", *what, "-o", "json"] + (["-n", namespace] if namespace else [])
        return json.loads(self.kubectl(*args).stdout)

    def exists(self, kind: str, name: str, namespace: str = "") -> bool:
        return self.reader.exists(kind, name, namespace)


STATE = Path(os.environ.get("CARDQUOTA_E2E_CACHE", Path.home() / ".cache" / "cardquota" / "e2e")) / "cluster"


def up() -> None:
    """The control plane, and the webhook serving from its live cache, registered by URL."""
    if (STATE / "pids.json").exists():
        raise SystemExit(f"a cluster is already up (state in {STATE}); run make cluster-down first")
    partner = os.environ.get("VOLCANO") or "fork"
    if partner not in PARTNERS:
        raise SystemExit(f"VOLCANO={partner}: say fork (the capacity-card plugin) or stock (v1.15.1)")
    volcano = ensure_volcano(partner)
    plane = ControlPlane(STATE, volcano=volcano, partner=partner).start()
    webhook = _serve_webhook(plane)
    pids = {name: p.pid for name, p in plane.procs.items()} | {"cardquota": webhook.pid}
    (STATE / "pids.json").write_text(json.dumps(pids))
    demo = ROOT / "examples" / "try"
    print(
        f"\nThe real Volcano controller-manager and scheduler of {PARTNERS[partner].what} run beside it:"
        " pods with schedulerName: volcano are scheduled for real (VOLCANO=fork|stock chooses)."
        if volcano
        else f"\nNo Volcano scheduler runs: {no_volcano(partner)}."
    )
    print(
        f"\nThe control plane and the webhook are up (logs in {plane.logs}); the webhook runs as the"
        f" chart's ServiceAccount {plane.release_namespace}/{plane.webhook_account}, with its RBAC.\n\n"
        f"  export KUBECONFIG={plane.kubeconfig}\n"
        f"  export PATH={plane.bin}:$PATH    # kubectl and helm matching this control plane\n\n"
        "Three things to try:\n\n"
        f"  kubectl apply -f {demo}/queue.yaml        # a queue with 2 NVIDIA-H200 (edit it to -1: refused)\n"
        f"  kubectl apply -f {demo}/deployment.yaml   # 3 replicas of 1 H200: the third is refused\n"
        "  kubectl get events --field-selector reason=FailedCreate   # ...with the webhook's message\n\n"
        "Stop it with: make cluster-down"
    )


def _serve_webhook(plane: ControlPlane) -> subprocess.Popen[bytes]:
    from tests.e2e.registration import configurations
    from webhook.tools import devcerts

    certs = devcerts.ensure_dev_certs(STATE / "webhook-certs")
    port = free_port()
    log = open(plane.logs / "cardquota.log", "ab")  # noqa: SIM115 - the process outlives this call
    command = [sys.executable, "-m", "webhook", "serve", "--kubeconfig", str(plane.webhook_kubeconfig)]
    command += ["--cert-dir", str(certs), "--host", "127.0.0.1", "--port", str(port), "--drain-seconds", "0"]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))

    def ready() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"the webhook exited; see {plane.logs}/cardquota.log")
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}/readyz", context=context, timeout=2
            ) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    wait_for("the webhook's cache to sync", ready, timeout=60)
    plane.apply(
        *configurations(f"https://127.0.0.1:{port}", certs / "ca.crt", None, identity=plane.webhook_user)
    )
    return proc


def down() -> None:
    """Stop what ``up`` started, newest first (the API server before etcd), then forget it."""
    pids = json.loads((STATE / "pids.json").read_text()) if (STATE / "pids.json").exists() else {}
    for name, pid in reversed(list(pids.items())):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        print(f"stopped {name}")
    shutil.rmtree(STATE, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    {"up": up, "down": down}[sys.argv[1] if len(sys.argv) > 1 else "up"]()

"""The Helm chart: lint, render every certificate mode, every object accepted by the real API server
(server-side dry run, cert-manager's CRDs read from its Go module), the schema refusing typos, and the
webhook configurations doing what they say: a CPU-only pod and a pod in the release namespace never
reach the webhook."""

import base64
import json
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from tests.e2e import build
from tests.e2e.cluster import ROOT, ControlPlane, wait_for
from tests.e2e.objects import H200, deployment_of, hpa, queued_deployment
from tests.e2e.recorder import Recorder
from tests.e2e.test_webhook import events
from tests.edges.serving import Process, free_port, mount_like_kubelet, served_serial
from webhook.settings import ServeSettings

CHART = ROOT / "charts" / "card-quota-webhook"
CERT_MANAGER_CRDS = ("certificates", "certificaterequests", "issuers", "clusterissuers")
MODES = {
    "cert-manager": [],
    "self-signed": ["--set", "certs.mode=self-signed"],
    "provided": [
        "--set",
        "certs.mode=provided",
        "--set",
        "certs.secretName=tls",
        "--set",
        "certs.caBundle=Zm9v",
    ],
    "by url, one replica, fail open": [
        "--set",
        "webhook.url=https://192.0.2.10:8443",
        "--set",
        "certs.extraIPAddresses={192.0.2.10}",
        "--set",
        "replicas=1",
        "--set",
        "webhook.failurePolicy.validate=Ignore",
        "--set",
        "metrics.serviceMonitor.enabled=false",
    ],
}


def helm(plane: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(plane.bin / "helm"), *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done


def render(plane: ControlPlane, namespace: str, *flags: str, release: str = "cq") -> list[dict[str, Any]]:
    out = helm(plane, "template", release, str(CHART), "-n", namespace, *flags).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


@pytest.fixture(scope="module")
def cert_manager_crds(control_plane: ControlPlane) -> None:
    """cert-manager's CRDs, read from its Go module (downloaded by the Go module proxy, never copied)."""
    crds = build.cert_manager_crds()
    for name in CERT_MANAGER_CRDS:
        control_plane.kubectl("apply", "--server-side", "-f", str(crds / f"cert-manager.io_{name}.yaml"))


@pytest.fixture(scope="module")
def cert_manager(
    control_plane: ControlPlane, cert_manager_crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """cert-manager's certificate controllers and CA injector running against the control plane."""
    log = tmp_path_factory.mktemp("cert-manager") / "cert-manager.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(control_plane.bin / build.CERT_MANAGER), f"--cluster-kubeconfig={control_plane.kubeconfig}"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield log
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_the_chart_lints_clean(control_plane: ControlPlane) -> None:
    lint = helm(control_plane, "lint", "--strict", str(CHART), check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("mode", MODES)
def test_every_rendered_object_is_accepted_by_the_api_server(
    control_plane: ControlPlane, cert_manager_crds: None, namespace: str, mode: str
) -> None:
    objects = render(control_plane, namespace, *MODES[mode], release=f"cq-{uuid.uuid4().hex[:6]}")
    applied = control_plane.kubectl(
        "apply",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )
    assert len(json.loads(applied.stdout)["items"]) == len(objects)


def test_a_misspelt_or_mistyped_value_is_refused_before_anything_is_created(
    control_plane: ControlPlane,
) -> None:
    typo = helm(
        control_plane,
        "template",
        "cq",
        str(CHART),
        "--set",
        "webhook.failurPolicy.validate=Fail",
        check=False,
    )
    assert typo.returncode != 0 and "failurPolicy" in typo.stderr
    wrong = helm(control_plane, "template", "cq", str(CHART), "--set", "replicas=three", check=False)
    assert wrong.returncode != 0 and "replicas" in wrong.stderr
    mode = helm(control_plane, "template", "cq", str(CHART), "--set", "certs.mode=vault", check=False)
    assert mode.returncode != 0 and "mode" in mode.stderr


def test_the_webhooks_register_exactly_the_rules_and_policies_the_design_needs(
    control_plane: ControlPlane,
) -> None:
    objects = render(control_plane, "card-quota")
    validating = of_kind(objects, "ValidatingWebhookConfiguration")
    mutating = of_kind(objects, "MutatingWebhookConfiguration")
    validate, gates, enqueue, claims, allocations = validating["webhooks"]
    rules = {
        (r["apiGroups"][0], res, tuple(r["operations"])) for r in validate["rules"] for res in r["resources"]
    }
    assert rules == {
        ("", "pods", ("CREATE",)),
        *{("apps", f"{w}/scale", ("UPDATE",)) for w in ("deployments", "statefulsets", "replicasets")},
        *{("apps", w, ("CREATE", "UPDATE")) for w in ("deployments", "statefulsets", "replicasets")},
        ("scheduling.volcano.sh", "queues", ("CREATE", "UPDATE")),
        ("scheduling.volcano.sh", "podgroups", ("CREATE",)),
        ("batch.volcano.sh", "jobs", ("CREATE", "UPDATE")),
    }
    # Wait mode: a pod update reaches the webhook only when someone but the webhook removes its gate.
    assert [(r["resources"], r["operations"]) for r in gates["rules"]] == [(["pods"], ["UPDATE"])]
    conditions = {c["name"]: c["expression"] for c in gates["matchConditions"]}
    assert conditions["not-by-the-webhook"] == (
        "request.userInfo.username != 'system:serviceaccount:card-quota:cq'"
    )
    # ... or edits a pod's card or queue annotations (tests/e2e/test_filters.py evaluates them)
    assert (
        "'volcano.sh/card.name' in object.metadata.annotations"
        in conditions["our-gate-removed-or-charge-edited"]
    )
    lenient = render(control_plane, "card-quota", "--set", "webhook.refuseChargeEdits=false")
    gates_only = of_kind(lenient, "ValidatingWebhookConfiguration")["webhooks"][1]["matchConditions"]
    assert "volcano.sh/card.name" not in {c["name"]: c["expression"] for c in gates_only}["our-gate-removed"]
    # The enqueue gate: only a card PodGroup's move into Inqueue or Running is sent.
    assert [(r["resources"], r["operations"]) for r in enqueue["rules"]] == [(["podgroups"], ["UPDATE"])]
    conditions = {c["name"]: c["expression"] for c in enqueue["matchConditions"]}
    assert "oldObject.status.phase in ['Inqueue', 'Running']" in conditions["enqueued-or-request-edited"]
    assert "'volcano.sh/card.request' in oldObject.metadata.annotations" in conditions["card-podgroups-only"]
    assert (enqueue["failurePolicy"], enqueue["sideEffects"]) == ("Fail", "NoneOnDryRun")
    # DRA: the claim made for a pod (its controlling owner) is checked and pinned to its model.
    pins = mutating["webhooks"][2]
    for hook in (claims, pins):
        assert [(r["apiGroups"], r["resources"], r["operations"]) for r in hook["rules"]] == [
            (["resource.k8s.io"], ["resourceclaims"], ["CREATE"])
        ]
        (owned,) = hook["matchConditions"]
        assert "r.kind == 'Pod' && has(r.controller) && r.controller" in owned["expression"]
    assert (claims["failurePolicy"], pins["failurePolicy"], pins["reinvocationPolicy"]) == (
        "Fail",
        "Fail",
        "IfNeeded",
    )
    # The allocation checked: only a new allocation of a GPU driver's devices, as the live tests register it.
    assert [(r["resources"], r["operations"]) for r in allocations["rules"]] == [
        (["resourceclaims/status"], ["UPDATE"])
    ]
    (gpu,) = allocations["matchConditions"]
    assert "r.driver in" in gpu["expression"] and allocations["failurePolicy"] == "Fail"
    # A pod whose GPUs come through resource claims reaches both pod webhooks.
    for hook in (validate, mutating["webhooks"][0]):
        assert "has(object.spec.resourceClaims)" in " ".join(c["expression"] for c in hook["matchConditions"])
    pods, podgroups, _ = mutating["webhooks"]
    assert [r["resources"] for r in pods["rules"]] == [["pods"]]
    assert [(r["resources"], r["operations"]) for r in podgroups["rules"]] == [
        (["podgroups"], ["CREATE", "UPDATE"])
    ]
    (bare,) = podgroups["matchConditions"]
    assert (
        bare["expression"].startswith("request.operation == 'CREATE' || (")
        and "!(has(object" in bare["expression"]
    )
    assert pods["reinvocationPolicy"] == "IfNeeded"
    assert (validate["failurePolicy"], pods["failurePolicy"], podgroups["failurePolicy"]) == (
        "Fail",
        "Fail",
        "Ignore",
    )
    for hook in (validate, gates, enqueue, claims, pods, podgroups, pins):
        assert hook["admissionReviewVersions"] == ["v1"] and hook["matchPolicy"] == "Equivalent"
        assert hook["timeoutSeconds"] <= 10 and hook["clientConfig"]["service"]["namespace"] == "card-quota"
        (selector,) = hook["namespaceSelector"]["matchExpressions"]
        assert selector["operator"] == "NotIn"
        assert {"card-quota", "kube-system", "kube-node-lease"} <= set(selector["values"])
    for configuration in (validating, mutating):
        assert (
            configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            == "card-quota/cq-serving"
        )


def test_rbac_grants_reads_of_what_the_cache_watches_and_writes_only_leases_events_the_line_and_reclaim(
    control_plane: ControlPlane,
) -> None:
    rendered = render(control_plane, "card-quota")
    hooks = [o for o in rendered if "helm.sh/hook" in o["metadata"].get("annotations", {})]
    objects = [o for o in rendered if o not in hooks]
    writes = {"create", "update", "patch", "delete", "deletecollection", "*"}
    # helm test's probe account exists only while the test runs and may only create Queues (dry run).
    assert {o["metadata"]["annotations"]["helm.sh/hook"] for o in hooks} == {"test"}
    assert of_kind(hooks, "ClusterRole")["rules"] == [
        {"apiGroups": ["scheduling.volcano.sh"], "resources": ["queues"], "verbs": ["create"]}
    ]
    for role in (o for o in objects if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            written = writes & set(rule["verbs"])
            if not written:
                continue
            if role["kind"] == "ClusterRole":  # the waiting line: marks, calls, releases and Events
                assert (rule["resources"], written) in (
                    (["statefulsets", "replicasets"], {"patch"}),
                    (["jobs"], {"patch"}),  # batch Jobs (deny mode's line)
                    (["pods"], {"patch"}),
                    (["events"], {"create"}),
                    (["pods/eviction"], {"create"}),  # tidal reclaim
                    (["podgroups"], {"patch"}),  # tidal reclaim's hold mark
                ), rule
                continue
            allowed = ((["leases"], "Role"), (["events"], "Role"), (["pods"], "Role"))
            assert (rule["resources"], role["kind"]) in allowed, rule
            assert written <= ({"patch"} if rule["resources"] == ["pods"] else {"create", "update", "patch"})
    cluster_role = of_kind(objects, "ClusterRole")
    readable = {
        res for rule in cluster_role["rules"] if "watch" in rule["verbs"] for res in rule["resources"]
    }
    assert readable == {
        "nodes",
        "pods",
        "namespaces",  # their default queue (decisions.md §30)
        "deployments",
        "statefulsets",
        "replicasets",
        "queues",
        "podgroups",
        "jobs",
        "deviceclasses",
        "resourceslices",
        "resourceclaims",
        "resourceclaimtemplates",
    }


def test_the_deployment_is_hardened_and_outlives_its_drain(control_plane: ControlPlane) -> None:
    deployment = of_kind(render(control_plane, "card-quota"), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 3 and pod["priorityClassName"] == "system-cluster-critical"
    assert (
        pod["securityContext"]["runAsNonRoot"]
        and pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    )
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "cpu" not in container["resources"].get("limits", {})
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), names
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["CARDQUOTA_LEADER_ELECT"] == "true" and env["CARDQUOTA_LABEL_LEADER_POD"] == "true"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert pod["terminationGracePeriodSeconds"] > int(env["CARDQUOTA_DRAIN_SECONDS"]) + 5
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_decision_values_reach_the_server_as_settings_it_accepts(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = ["--set", "podGroups.serviceType=true", "--set", "podGroups.serviceTypes.StatefulSet=training"]
    flags += ["--set", "podGroups.preemptable.training=false", "--set", "hierarchicalQueues=false"]
    flags += ["--set", "cpuMemoryCheck.enabled=true", "--set", "cpuMemoryCheck.cardUnlimitedCpuMemory=true"]
    flags += ["--set", "cpuMemoryCheck.schedulerNames={volcano,kai}", "--set", "overQuota=wait"]
    flags += ["--set", "enforcement=audit"]
    (container,) = of_kind(render(control_plane, "ops", *flags), "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    for entry in container["env"]:
        if entry["name"].startswith("CARDQUOTA_") and "value" in entry:
            monkeypatch.setenv(entry["name"], entry["value"])
    policy = ServeSettings().policy()
    assert policy.service_type is True
    assert policy.service_type_by_kind["StatefulSet"] == "training"
    assert policy.service_type_by_kind["ReplicaSet"] == "inference"
    assert dict(policy.preemptable_by_service_type) == {"inference": "false", "training": "false"}
    assert not policy.hierarchical_queues
    assert policy.over_quota == "wait"
    assert policy.enforcement == "audit"
    assert policy.cpu_memory_check and policy.card_unlimited_cpu_memory
    assert policy.volcano_schedulers == {"volcano", "kai"}
    wrong = helm(
        control_plane, "template", "cq", str(CHART), "--set", "podGroups.preemptable.x=maybe", check=False
    )
    assert wrong.returncode != 0 and "preemptable" in wrong.stderr


def test_the_service_selects_every_replica_and_an_upgrade_never_leaves_the_leader_without_a_successor(
    control_plane: ControlPlane,
) -> None:
    def services(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
        return {o["metadata"]["name"]: o["spec"]["selector"] for o in objects if o["kind"] == "Service"}

    three = render(control_plane, "card-quota")
    deployment = of_kind(three, "Deployment")
    pods = deployment["spec"]["selector"]["matchLabels"]
    assert services(three) == {"cq": pods, "cq-metrics": pods}  # standbys forward to the leader
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},  # a new replica is ready first
    }
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert of_kind(three, "PodDisruptionBudget")["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": pods},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    one = render(control_plane, "card-quota", "--set", "replicas=1")
    assert services(one) == {"cq": pods, "cq-metrics": pods}


def test_the_grafana_dashboard_ships_as_a_configmap_for_the_sidecar(control_plane: ControlPlane) -> None:
    dashboard = of_kind(render(control_plane, "ops"), "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard["data"]["card-quota.json"])
    assert shipped == json.loads((CHART / "dashboards" / "card-quota.json").read_text())
    assert {p["title"] for p in shipped["panels"]} >= {
        "Quota, used, pending and free",
        "Denials by kind",
        "Review latency",
    }
    moved = render(control_plane, "ops", "--set", "metrics.dashboard.namespace=monitoring")
    assert of_kind(moved, "ConfigMap")["metadata"]["namespace"] == "monitoring"
    off = render(control_plane, "ops", "--set", "metrics.dashboard.enabled=false")
    assert [o for o in off if o["kind"] == "ConfigMap"] == []


@pytest.fixture
def chart_hooks(
    control_plane: ControlPlane, request: pytest.FixtureRequest
) -> Iterator[tuple[Recorder, str]]:
    """The chart's two webhook configurations, registered by URL at a recorder, for a release in its own
    namespace; they fail open and are removed afterwards, so other tests never depend on them.
    Parametrised indirectly, the parameter is a list of extra ``helm`` flags."""
    recorder = Recorder(control_plane.certs).start()
    release_namespace = f"cq-release-{uuid.uuid4().hex[:6]}"
    control_plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release_namespace}})
    base = recorder.url.removesuffix("/review")
    flags = ["--set", "certs.mode=provided", "--set", "certs.secretName=tls"]
    flags += ["--set", f"certs.caBundle={recorder.ca_bundle}", "--set", f"webhook.url={base}"]
    for policy in ("validate", "mutatePods", "mutatePodGroups"):
        flags += ["--set", f"webhook.failurePolicy.{policy}=Ignore"]
    flags += getattr(request, "param", [])
    release = f"cq-{uuid.uuid4().hex[:6]}"
    objects = render(control_plane, release_namespace, *flags, release=release)
    hooks = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    control_plane.apply(*hooks)
    try:
        yield recorder, release_namespace
    finally:
        for hook in hooks:
            control_plane.kubectl("delete", hook["kind"].lower(), hook["metadata"]["name"], check=False)
        control_plane.kubectl("delete", "namespace", release_namespace, "--wait=false", check=False)
        recorder.stop()


def pod(
    name: str,
    annotations: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    scheduler: str = "",
) -> str:
    container: dict[str, Any] = {"name": "c", "image": "i"}
    if requests:
        container["resources"] = {"requests": requests, "limits": requests}
    metadata: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
    spec: dict[str, Any] = {"containers": [container], **({"schedulerName": scheduler} if scheduler else {})}
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})


def test_cpu_only_pods_and_the_release_namespace_never_reach_the_webhook(
    control_plane: ControlPlane, chart_hooks: tuple[Recorder, str], namespace: str
) -> None:
    recorder, release_namespace = chart_hooks

    def create(space: str, body: str) -> None:
        control_plane.kubectl("create", "--dry-run=server", "-n", space, "-f", "-", stdin=body)

    card = pod("card", {"volcano.sh/card.name": "NVIDIA-H200"}, {"nvidia.com/gpu": "1"})

    def seen(name: str, space: str) -> int:
        return sum(
            1
            for review in recorder.matching("pods", "CREATE", namespace=space)
            if review["object"]["metadata"]["name"] == name
        )

    def card_pod_arrives() -> bool:
        create(namespace, card)
        return seen("card", namespace) >= 2  # validated and mutated

    wait_for("the chart's webhooks to be called for a card pod", card_pod_arrives, timeout=30)
    create(namespace, pod("unnamed", requests={"nvidia.com/gpu": "1"}))  # a card resource, no name: sent
    create(namespace, pod("cpu-only", requests={"cpu": "1"}))
    create(release_namespace, card.replace('"card"', '"in-release"', 1))
    create(namespace, card.replace('"card"', '"after"', 1))
    wait_for("a later card pod to arrive", lambda: seen("after", namespace) >= 2, timeout=30)
    assert seen("unnamed", namespace) == 2
    assert seen("cpu-only", namespace) == 0
    assert seen("in-release", release_namespace) == 0


@pytest.mark.parametrize(
    "chart_hooks",
    [["--set", "cpuMemoryCheck.enabled=true", "--set", "cpuMemoryCheck.schedulerNames={volcano,kai}"]],
    indirect=True,
)
def test_with_the_cpu_memory_check_on_pods_of_the_volcano_schedulers_reach_validation(
    control_plane: ControlPlane, chart_hooks: tuple[Recorder, str], namespace: str
) -> None:
    recorder, _ = chart_hooks

    def seen(name: str, operation: str = "CREATE", resource: str = "pods") -> list[str]:
        return [
            review["uid"]
            for review in recorder.matching(resource, operation, namespace=namespace)
            if (review.get("object") or {}).get("metadata", {}).get("name") == name
        ]

    def create(body: str) -> None:
        control_plane.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", stdin=body)

    def volcano_pod_arrives() -> bool:
        create(pod("batch", requests={"cpu": "1"}, scheduler="volcano"))
        return bool(seen("batch"))

    wait_for("a Volcano cpu pod to reach the chart's webhook", volcano_pod_arrives, timeout=30)
    create(pod("other-scheduler", requests={"cpu": "1"}, scheduler="kai"))
    create(pod("default-scheduler", requests={"cpu": "1"}))
    create(pod("after", requests={"cpu": "1"}, scheduler="volcano"))
    wait_for("a later Volcano pod to arrive", lambda: bool(seen("after")), timeout=30)
    assert len(seen("after")) == 1  # validated only: the mutation stays for card pods
    assert seen("other-scheduler") and not seen("default-scheduler")
    template = {"spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "i"}]}}
    web = deployment_of("web", 1, template)
    control_plane.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(web))
    control_plane.kubectl("patch", "-n", namespace, "deployment/web", "-p", '{"spec": {"replicas": 2}}')
    wait_for(
        "the Deployment's update to arrive", lambda: bool(seen("web", "UPDATE", "deployments")), timeout=30
    )


def test_in_cert_manager_mode_cert_manager_issues_the_certificate_and_injects_its_ca(
    control_plane: ControlPlane, cert_manager: Path, namespace: str
) -> None:
    release = f"cq-{uuid.uuid4().hex[:6]}"
    flags = [f"--set=webhook.failurePolicy.{p}=Ignore" for p in ("validate", "mutatePods", "mutatePodGroups")]
    helm_ns = [f"--kubeconfig={control_plane.kubeconfig}", "-n", namespace]
    try:  # a failed install may leave webhook configurations behind: uninstall whatever happens
        helm(control_plane, "install", release, str(CHART), *helm_ns, *flags, "--set=replicas=1")

        def issued() -> dict[str, str] | None:
            found = control_plane.kubectl(
                "get", "secret", f"{release}-tls", "-n", namespace, "-o", "json", check=False
            )
            data = json.loads(found.stdout).get("data", {}) if found.returncode == 0 else {}
            return data if {"tls.crt", "tls.key", "ca.crt"} <= set(data) else None

        wait_for("cert-manager to issue the serving certificate", lambda: issued() is not None, timeout=60)
        secret = issued()
        assert secret is not None

        def bundles() -> list[str]:
            kinds = ("validatingwebhookconfiguration", "mutatingwebhookconfiguration")
            configurations = [control_plane.get(kind, release) for kind in kinds]
            return [
                hook["clientConfig"].get("caBundle", "") for c in configurations for hook in c["webhooks"]
            ]

        def trusted() -> bool:
            """Every caBundle (validate, gates, enqueue, claims and allocations validate, pods, podgroups
            and claims mutate) the
            same, holding the CA that signed the serving certificate now in the Secret. The bundle
            may hold more than that CA: cert-manager can issue the self-signed CA twice in its
            first second, and the injector then keeps both (seen once)."""
            now, found = issued(), bundles()
            if now is None or len(found) != 8 or len(set(found)) != 1 or not found[0]:
                return False
            served = x509.load_pem_x509_certificate(base64.b64decode(now["tls.crt"]))
            for ca in x509.load_pem_x509_certificates(base64.b64decode(found[0])):
                try:
                    served.verify_directly_issued_by(ca)
                    return True
                except (ValueError, TypeError, InvalidSignature):
                    continue
            return False

        wait_for(
            "the CA injector to fill every caBundle with the serving certificate's CA", trusted, timeout=60
        )
        secret = issued()
        assert secret is not None
        (ca,) = x509.load_pem_x509_certificates(base64.b64decode(secret["ca.crt"]))
        injected = x509.load_pem_x509_certificates(base64.b64decode(bundles()[0]))
        assert ca in injected, (ca.subject, [c.serial_number for c in injected])
        certificate = x509.load_pem_x509_certificate(base64.b64decode(secret["tls.crt"]))
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"{release}.{namespace}.svc" in names.get_values_for_type(x509.DNSName)
    finally:
        helm(control_plane, "uninstall", release, *helm_ns, check=False)


QUEUE = "scheduling.volcano.sh/queue-name"


def injected(plane: ControlPlane, release: str) -> list[str]:
    """The caBundle of every webhook in the release's two configurations."""
    return [
        hook["clientConfig"].get("caBundle", "")
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration")
        for hook in plane.get(kind, release)["webhooks"]
    ]


def force_renewal(plane: ControlPlane, namespace: str, certificate: str) -> None:
    """What ``cmctl renew`` does: set the Certificate's Issuing condition; cert-manager reissues."""
    found = plane.get("certificate", certificate, namespace=namespace)
    conditions = [c for c in found["status"].get("conditions", []) if c["type"] != "Issuing"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions.append(
        {
            "type": "Issuing",
            "status": "True",
            "reason": "ManuallyTriggered",
            "message": "Certificate re-issuance manually triggered",
            "lastTransitionTime": now,
            "observedGeneration": found["metadata"]["generation"],
        }
    )
    patch = json.dumps({"status": {"conditions": conditions}})
    plane.kubectl(
        "patch",
        "certificate",
        certificate,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        patch,
    )


class ApiLoad:
    """A thread creating one card pod with dryRun=All through the API server, over and over: every
    answer must come from the webhook (allowed, or denied by it); any other answer is a failure."""

    def __init__(self, plane: ControlPlane, namespace: str, body: str) -> None:
        self.url = f"{plane.server}/api/v1/namespaces/{namespace}/pods?dryRun=All"
        self.certs, self.body = plane.certs, body
        self.answered, self.failures = 0, []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        client_cert = (str(self.certs / "admin.crt"), str(self.certs / "admin.key"))
        verify = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        verify.load_cert_chain(*client_cert)
        with httpx.Client(verify=verify, timeout=15, headers={"Content-Type": "application/json"}) as client:
            while not self._stop.is_set():
                try:
                    answer = client.post(self.url, content=self.body)
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                by_webhook = answer.status_code == 403 and "denied the request" in answer.text
                if answer.status_code == 201 or by_webhook:
                    self.answered += 1
                else:
                    self.failures.append(f"{answer.status_code}: {answer.text[:300]}")

    def __enter__(self) -> "ApiLoad":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def run_test_hook(
    plane: ControlPlane, release: str, namespace: str, flags: list[str], tmp: Path, timeout: str = "60"
) -> subprocess.CompletedProcess[str]:
    """Create the ``helm test`` hook's account and RBAC, and run its pod's command here with that
    account's token (the local control plane's nodes run no containers)."""
    rendered = helm(
        plane, "template", release, str(CHART), *flags, "--show-only", "templates/tests/probe.yaml"
    )
    objects = [o for o in yaml.safe_load_all(rendered.stdout) if o]
    (pod_spec,) = [o["spec"] for o in objects if o["kind"] == "Pod"]
    plane.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [o for o in objects if o["kind"] != "Pod"]}
        ),
    )
    kubeconfig = plane.token_kubeconfig(namespace, pod_spec["serviceAccountName"], tmp / "probe-sa")
    args = list(pod_spec["containers"][0]["args"])
    args[args.index("--timeout") + 1] = timeout
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )


@pytest.mark.parametrize("mode", ["cert-manager", "self-signed"])
def test_installed_it_serves_with_the_chart_secret_as_its_service_account_and_denies(
    control_plane: ControlPlane,
    cert_manager: Path,
    namespace: str,
    card_quota: Any,
    tmp_path: Path,
    mode: str,
) -> None:
    release_namespace = f"cq-release-{uuid.uuid4().hex[:6]}"
    control_plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": release_namespace}})
    release, port = f"cq-{uuid.uuid4().hex[:6]}", free_port()
    helm_ns = [f"--kubeconfig={control_plane.kubeconfig}", "-n", release_namespace]
    flags = [f"--set=webhook.url=https://127.0.0.1:{port}", "--set=certs.extraIPAddresses={127.0.0.1}"]
    flags += ["--set=replicas=1", "--set=webhook.failurePolicy.validate=Fail", f"--set=certs.mode={mode}"]
    process = None
    try:  # a failed install may leave webhook configurations behind: uninstall whatever happens
        helm(control_plane, "install", release, str(CHART), *helm_ns, *flags)
        # One cluster, one webhook that writes the line's marks: the plane's own. This release's
        # server leaves the line and reclaim off (below), and its marks policy, which would refuse
        # the plane's webhook its marks in this test's namespace, is unbound.
        control_plane.kubectl("delete", "validatingadmissionpolicybinding", f"{release}-marks")

        def issued() -> dict[str, str] | None:
            found = control_plane.kubectl(
                "get", "secret", f"{release}-tls", "-n", release_namespace, "-o", "json", check=False
            )
            data = json.loads(found.stdout).get("data", {}) if found.returncode == 0 else {}
            return data if {"tls.crt", "tls.key", "ca.crt"} <= set(data) else None

        secret = wait_for("the serving certificate", issued, timeout=60)
        mounted = tmp_path / "tls"
        mount_like_kubelet(mounted, "1", {k: base64.b64decode(v) for k, v in secret.items()})
        kubeconfig = control_plane.token_kubeconfig(release_namespace, release, tmp_path / "sa")
        wait_for(
            "the CA injected",
            lambda: control_plane.get("validatingwebhookconfiguration", release)["webhooks"][0][
                "clientConfig"
            ].get("caBundle"),
            timeout=60,
        )
        process = Process(
            mounted,
            tmp_path / "server.log",
            "--kubeconfig",
            str(kubeconfig),
            "--drain-seconds",
            "0",
            "--cert-poll-seconds",
            "0.5",
            "--no-waiting-line",
            "--reclaim",
            "off",
            cluster=None,
            make_certs=False,
            port=port,
        )
        process.wait_ready(timeout=60)
        queue_name = card_quota({H200: 2})
        control_plane.apply(queued_deployment("train", 3, queue_name), namespace=namespace)
        failed = wait_for(
            "a FailedCreate event", lambda: events(control_plane, namespace, "FailedCreate"), timeout=60
        )
        assert f'queue "{queue_name}" has 0 NVIDIA-H200 left (quota 2: ' in failed[0]["message"]
        control_plane.apply(queued_deployment("chat", 1, queue_name), namespace=namespace)
        control_plane.apply(hpa("chat", 2, 3), namespace=namespace)  # the HPA does not scale from 0
        rescale = wait_for(
            "a FailedRescale event", lambda: events(control_plane, namespace, "FailedRescale"), timeout=90
        )
        assert f"scale-up of deployment {namespace}/chat from 1 to 2 replicas needs" in rescale[0]["message"]

        # A forced renewal, under load through the API server: no review may fail.
        ca_bundles = injected(control_plane, release)
        before = served_serial(port, mounted)
        card_pod = pod("load", {QUEUE: queue_name, "volcano.sh/card.name": H200}, {"nvidia.com/gpu": "1"})
        with ApiLoad(control_plane, namespace, card_pod) as load:
            wait_for("reviews answered under load", lambda: load.answered >= 5, timeout=30)
            if mode == "cert-manager":
                force_renewal(control_plane, release_namespace, f"{release}-serving")
            else:
                helm(control_plane, "upgrade", release, str(CHART), *helm_ns, "--reuse-values")
            renewed = wait_for(
                "the renewed certificate in the Secret",
                lambda: (data := issued()) and data["tls.crt"] != secret["tls.crt"] and data,
                timeout=60,
            )
            mount_like_kubelet(mounted, "2", {k: base64.b64decode(v) for k, v in renewed.items()})
            wait_for(
                "the renewed certificate served", lambda: served_serial(port, mounted) != before, timeout=30
            )
            answered = load.answered
            wait_for("reviews answered after the renewal", lambda: load.answered >= answered + 5, timeout=30)
        assert load.failures == [], load.failures[:3]
        assert injected(control_plane, release) == ca_bundles  # the CA did not move
        assert '"msg":"certificate reloaded"' in process.log()
        # No right refused (an Event into a namespace being deleted is a 403 too, and is not RBAC's).
        control_plane.assert_no_rbac_refusal(process.log())
        assert "Traceback" not in process.log()

        # helm test's probe, as its pod would run it: under its own account, through the API server.
        probe = run_test_hook(control_plane, release, release_namespace, helm_ns + flags, tmp_path)
        assert probe.returncode == 0, probe.stderr
        answered = (
            'the webhook answered: admission webhook "validate.cardquota.volcano.sh" denied the request: '
        )
        assert probe.stdout.startswith(
            answered + 'queue "cardquota-probe" has a malformed volcano.sh/card.quota'
        )
        process.stop()
        process = None
        down = run_test_hook(
            control_plane, release, release_namespace, helm_ns + flags, tmp_path, timeout="3"
        )
        assert down.returncode == 1
        assert "the webhook did not answer a dry-run review within 3 s: HTTP 500" in down.stderr
        assert "failed calling webhook" in down.stderr
    finally:
        helm(control_plane, "uninstall", release, *helm_ns, check=False)
        control_plane.kubectl("delete", "namespace", release_namespace, "--wait=false", check=False)
        if process is not None:
            process.stop()

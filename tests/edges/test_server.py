"""The HTTPS server as the API server meets it: real TLS, golden AdmissionReviews, bad input, metrics."""

import asyncio
import base64
import json
import ssl
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.builders import H200, H800, R4090, R4090D, cluster, node, pod, podgroup, queue, vcjob
from tests.edges.serving import CLUSTER, REVIEWS, Process, client_context, serve_in_thread, serve_process
from webhook.cluster import snapshot
from webhook.core.index.state import ClusterState
from webhook.core.model import feasibility
from webhook.errors import ConfigError
from webhook.serve import review
from webhook.serve.tls import CertStore
from webhook.settings import ServeSettings
from webhook.tools import devcerts
from webhook.tools.cli import example_files


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    tmp = tmp_path_factory.mktemp("served")
    with serve_process(tmp / "certs", tmp / "server.log") as process:
        yield process


@pytest.fixture
def client(served: Process) -> Iterator[httpx.Client]:
    with served.client() as c:
        yield c


def post(client: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return client.post(path, content=body, headers={"Content-Type": "application/json"})


def body_of(name: str) -> bytes:
    return (REVIEWS / name).read_bytes()


def test_every_example_is_answered_over_https_exactly_as_the_core_answers_it(served: Process) -> None:
    # The same sequence through the server and in process: holds recorded by earlier admissions
    # affect later ones the same way in both, so the answers must be equal byte for byte.
    state = snapshot.load_snapshot(CLUSTER)
    with served.client() as client:
        for path, webhook, flags in example_files(REVIEWS.parent):
            if flags:
                continue  # answered under other settings than the server's defaults
            answer = post(client, f"/{webhook}", path.read_bytes())
            assert answer.status_code == 200, (path.name, answer.text)
            expected = review.answer(state, path.read_bytes(), webhook, time.time())
            assert answer.json() == expected, path.name


def test_a_denial_is_a_403_with_the_one_line_message_and_the_request_uid(client: httpx.Client) -> None:
    answer = post(client, "/validate", body_of("scale-deployment-over-quota.json"))
    assert answer.status_code == 200
    out = answer.json()
    assert (out["apiVersion"], out["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    assert out["response"]["uid"] == "review-scale-deployment-over-quota"
    assert out["response"]["allowed"] is False
    assert out["response"]["status"] == {
        "code": 403,
        "reason": "Forbidden",
        "message": 'scale-up of deployment team-a/chat from 2 to 5 replicas needs 3 NVIDIA-H200 (1 per pod); queue "inference" has 1 left (quota 8: 6 running, 1 pending)',
    }


def test_a_pod_mutation_is_a_base64_json_patch_that_pins_the_models(client: httpx.Client) -> None:
    out = post(client, "/mutate", body_of("pod-affinity-new.mutate.json")).json()["response"]
    assert out["allowed"] is True and out["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(out["patch"]))
    expression = patch[-1]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert expression["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"] == "In"


def test_quota_warnings_reach_the_response(client: httpx.Client) -> None:
    out = post(client, "/validate", body_of("queue-overcommit-warning.json")).json()["response"]
    assert out["allowed"] is True
    assert any("queues will compete for the cards" in w for w in out["warnings"])


def review_with(request: dict[str, Any]) -> bytes:
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


GOOD_REQUEST = json.loads(body_of("pod-fits.json"))["request"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        pytest.param(b"", "not JSON", id="empty body"),
        pytest.param(b"{not json", "not JSON", id="not JSON"),
        pytest.param(b'{"apiVersion": "admission.k8s.io/v1"', "not JSON", id="truncated JSON"),
        pytest.param(b"[1, 2]", "must be a JSON object", id="a list"),
        pytest.param(
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}',
            "expected apiVersion admission.k8s.io/v1",
            id="wrong apiVersion",
        ),
        pytest.param(
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}', "kind AdmissionReview", id="not a review"
        ),
        pytest.param(
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request", id="no request"
        ),
        pytest.param(review_with({k: v for k, v in GOOD_REQUEST.items() if k != "uid"}), "uid", id="no uid"),
        pytest.param(review_with({**GOOD_REQUEST, "uid": ""}), "uid", id="empty uid"),
        pytest.param(review_with({**GOOD_REQUEST, "object": "x"}), "object", id="object not an object"),
        pytest.param(review_with({**GOOD_REQUEST, "operation": 7}), "operation", id="operation a number"),
        pytest.param(b'{"x": ' + b"[" * 2000 + b"]" * 2000 + b"}", "not JSON", id="nested 2000 deep"),
        pytest.param(b'{"x": NaN}', "not JSON", id="NaN"),
        pytest.param(b'{"x": 1e400}', "not JSON", id="number out of range"),
        pytest.param(b'{"x": "\\ud800"}', "not JSON", id="lone surrogate"),
    ],
)
def test_unanswerable_input_is_a_400_with_a_short_reason(
    client: httpx.Client, body: bytes, says: str
) -> None:
    answer = post(client, "/validate", body)
    assert answer.status_code == 400
    reason = answer.json()["error"]
    assert says in reason and len(reason) < 300


def test_a_body_over_the_limit_is_a_400_and_the_server_goes_on(client: httpx.Client) -> None:
    answer = post(client, "/validate", b'{"a": "' + b"x" * (8 * 2**20) + b'"}')
    assert answer.status_code == 400 and "limit" in answer.json()["error"]
    assert post(client, "/validate", body_of("pod-cpu-only.json")).json()["response"]["allowed"] is True


def pod_review(**pod_changes: Any) -> bytes:
    request = json.loads(body_of("pod-fits.json"))["request"]
    request["object"] = {**request["object"], **pod_changes}
    return review_with(request)


CONTAINER = json.loads(body_of("pod-fits.json"))["request"]["object"]["spec"]["containers"][0]


def with_limit(value: Any) -> dict[str, Any]:
    return {"containers": [{**CONTAINER, "resources": {"limits": {"nvidia.com/gpu": value}}}]}


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        pytest.param(
            {"spec": "x"},
            "pod team-a/trainer-1 is malformed: spec must be an object, got a string",
            id="spec a string",
        ),
        pytest.param(
            {"spec": {"containers": {}}},
            "spec.containers must be a list, got an object",
            id="containers an object",
        ),
        pytest.param(
            {"spec": with_limit("1e400")},
            "spec.containers[0].resources.limits['nvidia.com/gpu']: quantity '1e400' has an exponent out of range",
            id="quantity 1e400",
        ),
        pytest.param(
            {"spec": with_limit("NaN")},
            "spec.containers[0].resources.limits['nvidia.com/gpu']: quantity 'NaN' is not a Kubernetes quantity",
            id="quantity NaN",
        ),
        pytest.param({"spec": with_limit(True)}, "quantity True is not a number", id="quantity true"),
        pytest.param(
            {"metadata": {"name": "p", "annotations": {"volcano.sh/card.name": ["NVIDIA-H200"]}}},
            "metadata.annotations['volcano.sh/card.name'] must be a string, got a list",
            id="annotation a list",
        ),
        pytest.param(
            {"metadata": {"name": "p", "ownerReferences": "me"}},
            "metadata.ownerReferences must be a list, got a string",
            id="ownerReferences a string",
        ),
    ],
)
def test_a_well_formed_review_of_a_nonsense_object_is_denied_saying_what_is_wrong(
    client: httpx.Client, changes: dict[str, Any], says: str
) -> None:
    for webhook in ("validate", "mutate"):
        answer = post(client, f"/{webhook}", pod_review(**changes))
        assert answer.status_code == 200
        response = answer.json()["response"]
        assert response["allowed"] is False and says in response["status"]["message"]


def test_the_log_has_one_structured_line_per_review(served: Process, client: httpx.Client) -> None:
    post(client, "/validate", body_of("pod-over-quota.json"))
    deadline = time.monotonic() + 5  # review lines are flushed at least every half second
    while '"uid":"review-pod-over-quota"' not in served.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [json.loads(line) for line in served.log().splitlines() if '"msg":"review"' in line]
    line = next(entry for entry in lines if entry["uid"] == "review-pod-over-quota")
    assert {
        k: line[k] for k in ("webhook", "kind", "object", "operation", "dry_run", "decision", "queue", "card")
    } == {
        "webhook": "validate",
        "kind": "Pod",
        "object": "team-a/trainer-0",
        "operation": "CREATE",
        "dry_run": False,
        "decision": "denied",
        "queue": "cr-queue1",
        "card": "NVIDIA-H200",
    }
    assert line["duration_ms"] >= 0


def metric(text: str, name: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert len(values) == 1, f"{name} not exposed exactly once"
    return values[0]


def test_metrics_expose_reviews_latency_readiness_and_per_queue_cards(client: httpx.Client) -> None:
    post(client, "/validate", body_of("pod-over-quota.json"))
    post(client, "/validate", b"junk")
    answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    text = answer.text
    denied = 'cardquota_reviews_total{decision="denied",kind="Pod",operation="CREATE",webhook="validate"}'
    assert metric(text, denied) >= 1
    assert metric(text, 'cardquota_rejected_requests_total{status="400"}') >= 1
    assert metric(text, 'cardquota_review_duration_seconds_bucket{le="0.00025",webhook="validate"}') >= 0
    assert metric(text, "cardquota_ready") == 1
    assert metric(text, 'cardquota_queue_quota_cards{card="NVIDIA-H200",queue="cr-queue1"}') == 3
    assert metric(text, 'cardquota_queue_running_cards{card="NVIDIA-H200",queue="cr-queue1"}') == 1
    assert metric(text, 'cardquota_queue_pending_cards{card="NVIDIA-H200",queue="cr-queue1"}') == 1
    assert metric(text, "cardquota_nodes_skipped") == 1  # examples/cluster's unlabelled GPU node
    assert metric(text, "cardquota_certificate_expiry_timestamp_seconds") > time.time()
    assert "_created" not in text


def test_health_and_readiness_answer_plainly(client: httpx.Client) -> None:
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").text == "ready"
    assert client.get("/nothing-here").status_code == 404
    assert client.get("/validate").status_code == 405


class FakeSource:
    """A ``StateSource`` that is ready, never fetches and has no leader to step down from."""

    ready = True
    state: ClusterState | None = None

    async def run(self) -> None:
        return None

    async def fetch(self, ref: Any, namespace: str) -> dict[str, Any] | None:
        return None

    def not_ready_reason(self) -> str:
        return ""

    def readiness_reason(self) -> str:
        return "" if self.ready else self.not_ready_reason()

    async def step_down(self) -> None:
        return None

    def leader_address(self) -> str | None:
        return None

    async def evaluated(self, readings: set[Any], timeout: float) -> None:
        return None


class Unsynced(FakeSource):
    """A state source that has not synced: what the live cache is before its first list."""

    ready = False

    def not_ready_reason(self) -> str:
        return "the cluster state has not synced yet"


def test_before_the_state_has_synced_reviews_get_503_and_readyz_is_false(tmp_path: Path) -> None:
    with (
        serve_in_thread(Unsynced(), tmp_path) as url,
        httpx.Client(verify=client_context(tmp_path)) as client,
    ):
        assert client.get(f"{url}/healthz").status_code == 200
        ready = client.get(f"{url}/readyz")
        assert ready.status_code == 503 and "not synced" in ready.text
        answer = client.post(f"{url}/validate", content=body_of("pod-fits.json"))
        assert answer.status_code == 503 and "cache not ready" in answer.json()["error"]
        assert "cardquota_ready 0.0" in client.get(f"{url}/metrics").text


class Broken(FakeSource):
    """A state that makes the core fail: stands for a bug in a handler."""

    @property  # type: ignore[override]
    def state(self) -> ClusterState:
        return "not a state"  # type: ignore[return-value]


def test_a_bug_is_a_500_logged_with_the_review_uid(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with serve_in_thread(Broken(), tmp_path) as url, httpx.Client(verify=client_context(tmp_path)) as client:
        answer = client.post(f"{url}/validate", content=body_of("pod-fits.json"))
        assert answer.status_code == 500 and "failurePolicy" in answer.json()["error"]
        assert client.get(f"{url}/healthz").status_code == 200
    bug = next(r for r in caplog.records if r.getMessage() == "bug while answering a review")
    assert bug.uid == "review-pod-fits" and bug.exc_info is not None  # type: ignore[attr-defined]


def test_the_serving_context_refuses_anything_older_than_tls_1_2(tmp_path: Path) -> None:
    store = CertStore(devcerts.ensure_dev_certs(tmp_path))
    assert store.listening.minimum_version == ssl.TLSVersion.TLSv1_2


def test_settings_refuse_nonsense_and_keep_alive_outlasts_the_api_servers_idle_timeout() -> None:
    assert ServeSettings().keepalive_seconds > 90
    assert ServeSettings().max_body_bytes == 7 * 2**20
    with pytest.raises(Exception, match="port"):
        ServeSettings(port=0)
    from webhook import settings

    class Args:
        port = "x"

    with pytest.raises(ConfigError, match="setting port"):
        settings.load(Args())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"service_types": "StatefulSet=training,Job=training"}, None),
        ({"service_types": " ReplicaSet = inference , "}, None),
        ({"service_types": "ReplicaSet"}, "setting service_types: .*key=value"),
        ({"service_types": "=inference"}, "setting service_types"),
        ({"preemptable": "inference=maybe"}, "setting preemptable: .*true or false"),
        ({"preemptable": "inference=true,training=false"}, None),
    ],
)
def test_the_service_type_mappings_are_read_from_their_settings(
    given: dict[str, str], error: str | None
) -> None:
    from webhook import settings

    args = type("Args", (), given)()
    if error is not None:
        with pytest.raises(ConfigError, match=error):
            settings.load(args)
        return
    policy = settings.load(args).policy()
    if "service_types" in given:
        pairs = [part.split("=") for part in given["service_types"].split(",") if part.strip()]
        assert dict(policy.service_type_by_kind) == {k.strip(): v.strip() for k, v in pairs}
    else:
        assert dict(policy.preemptable_by_service_type) == {"inference": "true", "training": "false"}


class Loaded(FakeSource):
    """The example cluster, loaded fresh: a state no other test has admitted anything into."""

    def __init__(self) -> None:
        self.state = snapshot.load_snapshot(CLUSTER)


def pod_create(uid: str, name: str, *, dry_run: bool) -> bytes:
    review = json.loads(body_of("pod-fits.json"))
    review["request"]["uid"], review["request"]["dryRun"] = uid, dry_run
    meta = review["request"]["object"]["metadata"]
    meta["name"], meta["uid"] = name, f"uid-{name}"
    return json.dumps(review).encode()


def test_dry_runs_hold_nothing_so_the_last_card_still_goes_to_a_real_create(tmp_path: Path) -> None:
    # cr-queue1 has 1 NVIDIA-H200 left; five dry runs for it all pass and leave it free.
    with (
        serve_in_thread(Loaded(), tmp_path) as url,
        httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
    ):
        for i in range(5):
            dry = post(client, "/validate", pod_create(f"dry-{i}", f"dry-{i}", dry_run=True)).json()[
                "response"
            ]
            assert dry["allowed"] is True
        assert (
            post(client, "/validate", pod_create("real-1", "real-1", dry_run=False)).json()["response"][
                "allowed"
            ]
            is True
        )
        second = post(client, "/validate", pod_create("real-2", "real-2", dry_run=False)).json()["response"]
        assert second["allowed"] is False
        assert second["status"]["message"].startswith('queue "cr-queue1" has 0 NVIDIA-H200 left')
        metrics = client.get("/metrics").text
        assert "cardquota_in_flight_holds 1.0" in metrics


def test_hostile_kinds_and_operations_cannot_grow_the_metric_series(client: httpx.Client) -> None:
    for i in range(50):
        request = {**GOOD_REQUEST, "uid": f"odd-{i}", "kind": {"kind": f"Kind{i}"}, "operation": f"OP{i}"}
        assert post(client, "/validate", review_with(request)).status_code == 200
    text = client.get("/metrics").text
    assert "Kind7" not in text and "OP7" not in text
    assert 'kind="other",operation="other"' in text


class OwnerNotCached(Loaded):
    """The cache has not seen the PodGroup's owner yet; a live read returns it (or hangs)."""

    def __init__(self, owner: dict[str, Any] | None, hang: bool = False) -> None:
        super().__init__()
        self.owner, self.hang, self.reads = owner, hang, 0

    async def fetch(self, ref: Any, namespace: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.hang:
            await asyncio.sleep(30)
        return self.owner


def podgroup_for_new_pod() -> tuple[bytes, dict[str, Any]]:
    pod = json.loads(body_of("pod-fits.json"))["request"]["object"]
    pod["metadata"].update(name="fresh", uid="uid-fresh")
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "fresh", "uid": "uid-fresh", "controller": True}
    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "podgroup-uid-fresh", "namespace": "team-a", "ownerReferences": [owner]},
        "spec": {"minMember": 1, "queue": "cr-queue1"},
    }
    request = {
        "uid": "review-podgroup-fresh",
        "kind": {"group": "scheduling.volcano.sh", "version": "v1beta1", "kind": "PodGroup"},
        "resource": {"group": "scheduling.volcano.sh", "version": "v1beta1", "resource": "podgroups"},
        "namespace": "team-a",
        "operation": "CREATE",
        "object": group,
    }
    return review_with(request), pod


def test_a_podgroup_whose_owner_is_not_cached_yet_is_annotated_from_one_live_read(tmp_path: Path) -> None:
    body, pod = podgroup_for_new_pod()
    source = OwnerNotCached(pod)
    with (
        serve_in_thread(source, tmp_path) as url,
        httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
    ):
        out = post(client, "/mutate", body).json()["response"]
    patch = json.loads(base64.b64decode(out["patch"]))
    assert patch[0]["value"] == {
        "volcano.sh/card.name": "NVIDIA-H200",
        "volcano.sh/card.request": '{"NVIDIA-H200":1}',
    }
    assert source.reads == 1


def test_a_live_read_that_hangs_leaves_the_podgroup_unchanged_within_the_timeout(tmp_path: Path) -> None:
    body, pod = podgroup_for_new_pod()
    with (
        serve_in_thread(OwnerNotCached(pod, hang=True), tmp_path) as url,
        httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
    ):
        started = time.monotonic()
        out = post(client, "/mutate", body).json()["response"]
        assert time.monotonic() - started < 3
    assert out == {"uid": "review-podgroup-fresh", "allowed": True}


def test_a_live_read_of_another_object_with_the_same_name_is_not_used(tmp_path: Path) -> None:
    body, pod = podgroup_for_new_pod()
    pod["metadata"]["uid"] = "uid-someone-else"
    with (
        serve_in_thread(OwnerNotCached(pod), tmp_path) as url,
        httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
    ):
        out = post(client, "/mutate", body).json()["response"]
    assert "patch" not in out


class Tangled(FakeSource):
    """A queue whose flexible demand only the exact search can place (3+3 and 2+2, with a pod
    assigned 2 H800, into 6 and 6)."""

    def __init__(self) -> None:
        flex = f"{H200}|{H800}"
        self.state = cluster(
            node("h200", H200),
            node("h800", H800),
            queue("q", f'{{"{H200}": 6, "{H800}": 6}}'),
            pod("a", flex, 3),
            pod("b", flex, 3),
            pod("c", flex, 2),
            pod("d", flex, 2),
        )


def test_a_check_past_its_guard_is_denied_to_be_safe_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    review = json.loads(body_of("pod-fits.json"))
    # A pod the mutation assigned H800 of its H200|H800: the flexible pods around it need the search.
    assigned = pod("new", H800, 2, annotations={"cardquota.volcano.sh/card.spec": f"{H200}|{H800}"})
    review["request"].update(namespace="ns", name="new", object=assigned)
    with (
        serve_in_thread(Tangled(), tmp_path) as url,
        httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
    ):
        dry = {**review, "request": {**review["request"], "dryRun": True}}
        assert post(client, "/validate", json.dumps(dry).encode()).json()["response"]["allowed"] is True
        monkeypatch.setattr(feasibility, "GUARD", 0)
        answer = post(client, "/validate", json.dumps(review).encode()).json()["response"]
        assert answer["allowed"] is False and answer["status"]["code"] == 403
        assert (
            "is too tangled to check exactly in time, so it is denied to be safe"
            in answer["status"]["message"]
        )
        metrics = client.get("/metrics").text
        assert metric(metrics, 'cardquota_feasibility_too_complex_total{webhook="validate"}') == 1.0


class DraNotCached(Loaded):
    """The cache lacks a DRA object a review needs; a live read returns it (by kind and name)."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
        super().__init__()
        self.objects, self.reads = objects, []

    async def fetch(self, ref: Any, namespace: str) -> dict[str, Any] | None:
        self.reads.append((ref.kind, ref.name))
        return self.objects.get((ref.kind, ref.name))


def test_a_pods_claim_template_the_cache_lacks_is_read_live_and_counted(tmp_path: Path) -> None:
    """SPEC §4b: a template created together with its pod may reach the webhook before the watch."""
    body = json.loads(body_of("pod-dra-per-model-class-over-quota.json"))
    pod = body["request"]["object"]
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "fresh-x2"}]
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "fresh-x2", "namespace": "team-a"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "g", "exactly": {"deviceClassName": "h200.nvidia.com", "count": 2}}]
                }
            }
        },
    }
    for objects, says in (
        (
            {("ResourceClaimTemplate", "fresh-x2"): template},
            "has 1 NVIDIA-H200 left (quota 3: 1 running, 1 pending); pod team-a/trainer-dra-0 (claim gpus from template fresh-x2: 2 NVIDIA-H200) needs 2",
        ),
        ({}, "ResourceClaimTemplate team-a/fresh-x2, which does not exist"),
    ):
        source = DraNotCached(objects)
        with (
            serve_in_thread(source, tmp_path) as url,
            httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
        ):
            out = post(client, "/validate", json.dumps(body).encode()).json()["response"]
        assert says in out["status"]["message"], out
        assert source.reads == [("ResourceClaimTemplate", "fresh-x2")]


def test_a_claim_whose_pod_the_cache_lacks_reads_the_pod_live_and_is_pinned(tmp_path: Path) -> None:
    body = json.loads(body_of("resourceclaim-pinned.mutate.json"))
    owner = body["request"]["object"]["metadata"]["ownerReferences"][0]
    owner.update(name="tune-9", uid="uid-team-c-tune-9")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "tune-9",
            "namespace": "team-c",
            "uid": "uid-team-c-tune-9",
            "annotations": {
                "scheduling.volcano.sh/queue-name": "serving-dra",
                "cardquota.volcano.sh/card": "NVIDIA-A100-SXM4-80GB",
            },
        },
        "spec": {
            "schedulerName": "volcano",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "any-a100"}],
            "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    for read, pinned in ((pod, True), ({**pod, "metadata": {**pod["metadata"], "uid": "another"}}, False)):
        source = DraNotCached({("Pod", "tune-9"): read})
        with (
            serve_in_thread(source, tmp_path) as url,
            httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
        ):
            out = post(client, "/mutate", json.dumps(body).encode()).json()["response"]
        assert ("patch" in out) == pinned, out
        assert source.reads == [("Pod", "tune-9")]


class Behind(FakeSource):
    """A cache that does not show a PodGroup enqueued yet; a live read returns it as the API server
    has it (enqueued, or gone)."""

    def __init__(self, state: ClusterState, group: dict[str, Any] | None) -> None:
        self.state, self.group = state, group
        self.reads: list[tuple[str, str, str]] = []

    async def fetch(self, ref: Any, namespace: str) -> dict[str, Any] | None:
        self.reads.append((ref.kind, namespace, ref.name))
        return self.group


FLEX = f"{R4090}|{R4090D}"


class Enqueued:
    """A Volcano Job of one task of 2 ``A|B`` pods in queue ``q`` (1 4090, 2 4090-D), its PodGroup
    ``pg`` Pending in a fresh cache; the reviews of its move to Inqueue and of its first pod."""

    def __init__(self) -> None:
        ref: dict[str, Any] = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train"}
        ref.update(uid="uid-job-train", controller=True)
        self.job = vcjob(
            "train", [(2, {"metadata": {"annotations": {"volcano.sh/card.name": FLEX}}, "spec": {}})]
        )
        self.pending = podgroup("pg", "Pending", request=json.dumps({FLEX: 2}), owner_ref=ref)
        self.inqueue = podgroup("pg", "Inqueue", request=json.dumps({FLEX: 2}), owner_ref=ref)
        self.pod = pod("train-t0-0", FLEX, owner=ref, group="pg", uid="")
        self.pod["metadata"]["annotations"]["volcano.sh/task-spec"] = "t0"
        self.move = {
            "uid": "enqueue",
            "kind": {"group": "scheduling.volcano.sh", "version": "v1beta1", "kind": "PodGroup"},
            "resource": {"group": "scheduling.volcano.sh", "version": "v1beta1", "resource": "podgroups"},
            "namespace": "ns",
            "operation": "UPDATE",
            "object": self.inqueue,
            "oldObject": self.pending,
        }
        self.created = {
            "uid": "create",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ns",
            "operation": "CREATE",
            "object": self.pod,
        }

    def state(self) -> ClusterState:
        return cluster(
            node("r", R4090, 4),
            node("rd", R4090D, 4),
            queue("q", json.dumps({R4090: 1, R4090D: 2})),
            self.job,
            self.pending,
        )


def test_a_pod_of_a_podgroup_enqueued_here_but_not_seen_yet_reads_it_live_and_comes_out_of_it(
    tmp_path: Path,
) -> None:
    """SPEC §5d: on stock Volcano our enqueue gate admits a PodGroup's move to Inqueue; the job
    controller sees it and creates the pods before the cache does. The pod's review reads the
    PodGroup live, so the pod is counted out of its reservation: admitted, given the model that
    holds its whole task (4090-D: 4090's quota holds one of its two pods). A read that finds
    nothing leaves the pod counted beside the enqueue's hold: refused, its controller retries."""
    scenario = Enqueued()
    move, created, made, flex = scenario.move, scenario.created, scenario.pod, FLEX
    for live, allowed in ((scenario.inqueue, True), (None, False)):
        state = scenario.state()
        source = Behind(state, live)
        with (
            serve_in_thread(source, tmp_path) as url,
            httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
        ):
            assert post(client, "/validate", review_with(move)).json()["response"]["allowed"]
            mutation = post(client, "/mutate", review_with(created)).json()["response"]
            patch = json.loads(base64.b64decode(mutation["patch"]))
            assert {
                "op": "replace",
                "path": "/metadata/annotations/volcano.sh~1card.name",
                "value": R4090D,
            } in patch
            assigned = json.loads(json.dumps(made))
            assigned["metadata"]["annotations"]["volcano.sh/card.name"] = R4090D
            assigned["metadata"]["annotations"]["cardquota.volcano.sh/card.spec"] = flex
            assigned["metadata"]["uid"] = "uid-t0"
            out = post(client, "/validate", review_with({**created, "object": assigned})).json()["response"]
        assert out["allowed"] is allowed, out
        assert source.reads[0] == ("PodGroup", "ns", "pg")


def test_a_pod_naming_a_podgroup_the_cache_lacks_reads_it_live_and_is_refused_naming_its_queue(
    tmp_path: Path,
) -> None:
    """decisions.md §30: a PodGroup made just before its pods (kubectl apply of both) may not have
    reached the watch: the pod's review reads it live, so a pod naming q2 in a group of q1 is refused
    naming both. A read that finds nothing leaves the pod where it names (its group does not exist,
    so Volcano runs it nowhere yet): admitted."""
    group = podgroup("pg", "Pending", queue_name="q1")
    made = pod("a", H200, queue_name="q2", group="pg")
    created = {
        "uid": "create",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "ns",
        "operation": "CREATE",
        "object": made,
    }
    for live, allowed in ((group, False), (None, True)):
        state = cluster(node("h", H200), queue("q1", '{"NVIDIA-H200": 1}'), queue("q2", '{"NVIDIA-H200": 1}'))
        source = Behind(state, live)
        with (
            serve_in_thread(source, tmp_path) as url,
            httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
        ):
            out = post(client, "/validate", review_with(created)).json()["response"]
        assert out["allowed"] is allowed, out
        assert source.reads == [("PodGroup", "ns", "pg")]
        if not allowed:
            assert out["status"]["message"].startswith(
                'pod ns/a names queue "q2" but its podgroup ns/pg is in queue "q1", where Volcano schedules it'
            )


class Relaxed(Loaded):
    """The example cluster, its quotas warning instead of refusing (decisions.md §34)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        assert self.state is not None
        self.state.policy = replace(self.state.policy, enforcement=mode)


@pytest.mark.parametrize("mode", ["warn", "audit"])
def test_a_quota_that_warns_or_audits_is_answered_allowed_with_the_refusal_it_would_be(
    tmp_path: Path, mode: str
) -> None:
    """cr-queue1's last H200 goes to real-1; real-2, past it, is admitted: kubectl prints the
    refusal as a warning (warn), the audit log keeps it (both), the metric counts it (a dry run not)."""
    with (
        serve_in_thread(Relaxed(mode), tmp_path) as url,
        httpx.Client(base_url=url, verify=client_context(tmp_path)) as client,
    ):
        assert post(client, "/validate", pod_create("real-1", "real-1", dry_run=False)).json()["response"][
            "allowed"
        ]
        post(client, "/validate", pod_create("dry", "dry", dry_run=True))
        second = post(client, "/validate", pod_create("real-2", "real-2", dry_run=False)).json()["response"]
        assert second["allowed"] is True
        would = second["auditAnnotations"]["would-refuse"]
        assert would.startswith('queue "cr-queue1" has 0 NVIDIA-H200 left') and "pod " in would
        assert second["auditAnnotations"]["enforcement"] == mode
        assert second.get("warnings", []) == ([would] if mode == "warn" else [])
        text = client.get("/metrics").text
        series = (
            f'cardquota_would_refuse_total{{card="NVIDIA-H200",kind="Pod",mode="{mode}",queue="cr-queue1"}}'
        )
        assert metric(text, series) == 1.0

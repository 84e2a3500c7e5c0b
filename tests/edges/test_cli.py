"""The ``cardquota`` command-line contract other tools rely on, exercised as a real process."""

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"
REVIEWS = ROOT / "examples" / "reviews"


def cardquota(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def review(name: str, webhook: str = "validate") -> dict[str, Any]:
    done = cardquota(
        "review", "--cluster", str(CLUSTER), "--webhook", webhook, stdin=(REVIEWS / name).read_bytes()
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["apiVersion"], out["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    return out["response"]


def test_a_denial_carries_uid_code_and_the_one_line_message() -> None:
    response = review("pod-over-quota.json")
    assert response["uid"] == "review-pod-over-quota" and response["allowed"] is False
    assert response["status"]["code"] == 403
    assert (
        response["status"]["message"]
        == 'queue "cr-queue1" has 1 NVIDIA-H200 left (quota 3: 1 running, 1 pending); pod team-a/trainer-0 needs 2'
    )


def test_an_allowed_review_has_no_status() -> None:
    response = review("pod-fits.json")
    assert response == {"uid": "review-pod-fits", "allowed": True}


def test_a_mutation_answers_with_a_base64_json_patch() -> None:
    response = review("pod-affinity-new.mutate.json", "mutate")
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert patch[0]["op"] == "add" and patch[0]["path"] == "/spec/affinity"


def test_warnings_reach_the_response() -> None:
    response = review("queue-overcommit-warning.json")
    assert response["allowed"] is True and any(
        "NVIDIA-H200: all queues' quotas sum to" in w for w in response["warnings"]
    )


def test_the_default_webhook_is_validate() -> None:
    done = cardquota(
        "review", "--cluster", str(CLUSTER), stdin=(REVIEWS / "pod-over-quota.json").read_bytes()
    )
    assert json.loads(done.stdout)["response"]["allowed"] is False


@pytest.mark.parametrize(
    ("stdin", "says"),
    [
        pytest.param(b"not json", "not JSON", id="not JSON"),
        pytest.param(
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "request", id="no request"
        ),
        pytest.param(
            b'{"kind": "Pod", "request": {"uid": "u", "kind": {}, "resource": {}, "operation": "CREATE"}}',
            "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview",
            id="wrong kind",
        ),
    ],
)
def test_input_that_cannot_be_answered_exits_2_with_a_clear_message(stdin: bytes, says: str) -> None:
    done = cardquota("review", "--cluster", str(CLUSTER), stdin=stdin)
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().startswith("cardquota: ") and says in done.stderr.decode()


def test_a_missing_cluster_directory_exits_2() -> None:
    done = cardquota("review", "--cluster", "/no/such/dir", stdin=(REVIEWS / "pod-fits.json").read_bytes())
    assert done.returncode == 2 and "not a directory" in done.stderr.decode()


def test_status_json_has_the_documented_keys() -> None:
    done = cardquota("status", "--cluster", str(CLUSTER), "--output", "json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["cards"]["NVIDIA-H200"] == {
        "resource": "nvidia.com/gpu",
        "label_key": "nvidia.com/gpu.product",
        "product": "NVIDIA-H200",
        "nodes": 3,
        "total": 16,
        "dra": {"devices": 1, "nodes": ["h200-dra-0"]},  # examples/cluster/dra.yaml
    }
    assert status["cards"]["NVIDIA-H800/mps-80g*1/2"]["resource"] == "nvidia.com/gpu.shared"
    assert status["queues"]["cr-queue1"]["NVIDIA-H200"] == {
        "quota": 3,
        "bound": 1,
        "pending": 1,
        "reserved": 0,
        "in_flight": 0,
        "free": 1,
    }
    assert status["queues"]["cr-queue1"]["NVIDIA-H800"]["reserved"] == 2
    assert any("unlabelled-gpu-0" in w for w in status["warnings"])


def test_status_table_lists_cards_queues_and_warnings() -> None:
    done = cardquota("status", "--cluster", str(CLUSTER))
    text = done.stdout.decode()
    assert (
        done.returncode == 0
        and "NVIDIA-H200/mig-1g.18gb-mixed" in text
        and "cr-queue1" in text
        and "WARNINGS" in text
    )


def test_examples_reviews_every_bundled_review() -> None:
    done = cardquota("examples", "examples")
    text = done.stdout.decode()
    assert done.returncode == 0
    assert text.count("# examples/reviews/") == len(list(REVIEWS.glob("*.json")))

"""Enforcement in steps on both partners (decisions.md §34): a queue already running 3 L40S whose new
quota is 2. In ``warn`` a scale-up of its Deployment is admitted, ``kubectl scale`` printing our
warning, and told by an Event; in ``audit`` it is admitted silently, the refusal in the API server's
audit log and the metric; ``kubectl cardquota audit`` names the queue and the Deployment, and counts
the would-be refusal admitted in audit from our Event; switched to
``deny``, the next scale-up is refused and the 3 pods running before keep running."""

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import ControlPlane, holds_for, wait_for
from tests.e2e.conftest import partner_plane
from tests.e2e.test_tidal_reclaim import L40S, Seed002, prepared, uids
from tests.edges.serving import Process, client_context
from tests.edges.test_server import metric

ENFORCEMENT = "cardquota.volcano.sh/enforcement"


@pytest.fixture(scope="module", params=["fork", "stock"])
def volcano(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    with partner_plane(request.param, tmp_path_factory) as plane:
        yield prepared(plane)


@pytest.fixture
def seed(volcano: ControlPlane, front: Process) -> Iterator[Seed002]:
    made = Seed002(volcano)
    yield made
    made.delete()


def audited(plane: ControlPlane, namespace: str, name: str) -> list[dict[str, str]]:
    """The audit annotations of the API server's log of writes to ``name``'s scale in ``namespace``."""
    found = []
    for line in plane.audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (
            ref.get("namespace") == namespace
            and ref.get("name") == name
            and ref.get("subresource") == "scale"
        ):
            found.append(event.get("annotations") or {})
    return found


def cardquota_audit(plane: ControlPlane) -> dict[str, Any]:
    run = "from webhook.tools.plugin import main; raise SystemExit(main())"
    done = subprocess.run(
        [sys.executable, "-c", run, "audit", "--kubeconfig", str(plane.kubeconfig), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_queue_past_its_new_quota_warns_then_audits_then_denies_and_evicts_nothing(
    seed: Seed002, front: Process
) -> None:
    plane, ns = seed.plane, seed.ns
    q = f"q-{ns}"
    seed.queue(q, {L40S: 3}, 100, False)
    seed.inference("chat", 3, queue=q)
    wait_for("chat's 3 pods bound", lambda: len(seed.running("chat-")) == 3, timeout=90)
    before = uids(seed.running("chat-"))
    quota = json.dumps({L40S: 2})
    plane.kubectl(
        "annotate", "queue", q, f"volcano.sh/card.quota={quota}", f"{ENFORCEMENT}=warn", "--overwrite"
    )

    warned = plane.kubectl("scale", "deployment/chat", "--replicas=4", "-n", ns, check=False)
    assert warned.returncode == 0, warned.stderr
    refusal = f'queue "{q}" has 0 {L40S} left (quota 2: 3 running)'
    assert "Warning:" in warned.stderr and refusal in warned.stderr, warned.stderr
    wait_for(
        "the Deployment told by an Event",
        lambda: [
            e
            for e in seed.events("CardQuotaWouldRefuse")
            if e["involvedObject"]["kind"] == "Deployment" and refusal in e["message"]
        ],
        timeout=30,
    )

    plane.kubectl("annotate", "queue", q, f"{ENFORCEMENT}=audit", "--overwrite")
    silent = plane.kubectl("scale", "deployment/chat", "--replicas=5", "-n", ns, check=False)
    assert silent.returncode == 0 and "Warning:" not in silent.stderr, silent.stderr
    wait_for(
        "the audit log to keep the refusal",
        lambda: [
            a
            for a in audited(plane, ns, "chat")
            if any(k.endswith("/enforcement") and v == "audit" for k, v in a.items())
            and any(k.endswith("/would-refuse") and "scale-up of deployment" in v for k, v in a.items())
        ],
        timeout=30,
    )
    with httpx.Client(verify=client_context(front.certs), timeout=10) as client:
        text = client.get(f"{front.url}/metrics").text
    series = f'cardquota_would_refuse_total{{card="{L40S}",kind="Scale",mode="audit",queue="{q}"}}'
    assert metric(text, series) == 1.0

    def counting() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        report = cardquota_audit(plane)
        counted = [w for w in report["would_refuse"] if w["queue"] == q]
        return (report, counted) if counted else None

    report, counted = wait_for("the report to count the scale-up admitted in audit", counting, timeout=30)
    assert [(w["queue"], w["card"], w["mode"], w["refusals"]) for w in counted] == [(q, L40S, "audit", 1)], (
        "the warn mode's refusal is not counted once the queue audits"
    )
    (row,) = [r for r in report["queues"] if r["queue"] == q]
    assert (row["enforcement"], row["quota"], row["over"]) == ("audit", 2, row["used"] - 2) and row[
        "over"
    ] >= 1
    (chat,) = [w for w in report["workloads"] if w["workload"] == f"deployment {ns}/chat"]
    assert chat["queue"] == q and chat["next_scale_up"] == "refused" and chat["pod_recreated"] == "refused"

    plane.kubectl("annotate", "queue", q, f"{ENFORCEMENT}=deny", "--overwrite")
    refused = plane.kubectl("scale", "deployment/chat", "--replicas=6", "-n", ns, check=False)
    assert refused.returncode != 0 and f'queue "{q}" has 0 {L40S} left' in refused.stderr, refused.stderr
    assert before <= uids(seed.running("chat-")), "a pod running before the switch was evicted"


@pytest.mark.parametrize("mode", ["warn", "deny"])
def test_a_job_past_its_queues_quota_is_enqueued_in_warn_on_stock_and_held_by_the_forks_own_ceiling(
    seed: Seed002, mode: str
) -> None:
    """q (quota 2 L40S) runs 1 of chat's pods; a 2-pod job fits the quota, not now. On stock Volcano
    the enqueue gate is ours: in warn the job is enqueued and bound, its PodGroup and Volcano Job
    told; its twin in deny waits Pending, told. On the fork the capacity-card plugin enqueues by its
    own card quota, the ceiling (decisions.md §33): the job waits in either mode, whatever ours says."""
    q = f"q-{seed.ns}"
    seed.queue(q, {L40S: 2}, 100, False, **{ENFORCEMENT: mode})
    seed.inference("chat", 1, queue=q)
    wait_for("chat's pod bound", lambda: len(seed.running("chat-")) == 1, timeout=90)
    seed.training("big", 2, queue=q)
    if seed.plane.partner == "fork":
        holds_for("the job held by the plugin's ceiling", lambda: not seed.running("big-"), 10)
    elif mode == "warn":
        wait_for("the job's 2 pods bound", lambda: len(seed.running("big-")) == 2, timeout=90)
        told = seed.events("CardQuotaWouldRefuse")
        kinds = {e["involvedObject"]["kind"] for e in told if "to be enqueued" in e["message"]}
        assert kinds == {"PodGroup", "Job"}, told
    else:
        wait_for("the enqueue refusal told", lambda: seed.events("CardQuotaEnqueueRefused"), timeout=60)
        assert not seed.pods("big-") and not seed.events("CardQuotaWouldRefuse")

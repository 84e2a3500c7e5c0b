"""``cardquota whatif``: what the webhooks would say to a manifest, without recording anything."""

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import H200, H800, cluster, deployment
from tests.core.test_borrowing import NODES, lender, running
from tests.edges.serving import CLUSTER, REVIEWS, ROOT
from webhook.cluster import snapshot
from webhook.core.model.verdicts import Denied
from webhook.errors import SnapshotError
from webhook.serve import review
from webhook.tools import whatif
from webhook.tools.cli import example_files, policy_of

FLAGS = {path: flags for path, _, flags in example_files(REVIEWS.parent)}


def example_state(path: Path) -> snapshot.ClusterState:
    """The example cluster under the settings this example is answered with."""
    return snapshot.load_snapshot(CLUSTER, policy_of(FLAGS[path]))


def sent_as_manifest(path: Path) -> dict[str, Any] | None:
    """The review's object when ``whatif`` would send that very request: a CREATE or UPDATE of a
    kind it knows, no subresource, the same operation as the cluster implies, not a dry run."""
    request = json.loads(path.read_text())["request"]
    obj = request.get("object")
    if request.get("subResource") or request.get("dryRun") or not isinstance(obj, dict):
        return None
    group = request["kind"]["group"]
    if (group, request["kind"]["kind"]) not in whatif.RESOURCES:
        return None
    state = example_state(path)
    meta = obj.get("metadata") or {}
    namespace = request.get("namespace") or meta.get("namespace") or "default"
    obj = {
        **obj,
        "metadata": {**meta, "namespace": namespace, "name": request.get("name") or meta.get("name")},
    }
    (answer,) = whatif.whatif(state, [("x", obj)])
    return obj if answer.operation == request["operation"] else None


VALIDATED = [
    p for p in sorted(REVIEWS.glob("*.json")) if not p.name.endswith(".mutate.json") and sent_as_manifest(p)
]


def test_most_example_reviews_can_be_asked_as_manifests() -> None:
    assert len(VALIDATED) >= 20, [p.name for p in VALIDATED]


@pytest.mark.parametrize("path", VALIDATED, ids=lambda p: p.stem)
def test_whatif_and_the_validating_webhook_agree_on_every_example(path: Path) -> None:
    obj = sent_as_manifest(path)
    assert obj is not None
    _, decision = review.decide(example_state(path), path.read_bytes(), "validate", time.time())
    (answer,) = whatif.whatif(example_state(path), [("x", obj)])
    assert answer.allowed == (not isinstance(decision, Denied))
    if isinstance(decision, Denied):
        assert answer.message == decision.message
    else:
        assert set(decision.warnings) <= set(answer.warnings)


def card_pod(name: str, queue: str = "cr-queue1", cards: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "annotations": {"volcano.sh/card.name": "NVIDIA-H200", "scheduling.volcano.sh/queue-name": queue},
        },
        "spec": {
            "containers": [
                {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": str(cards)}}}
            ]
        },
    }


def test_a_manifest_is_answered_in_order_as_if_applied_and_nothing_outlives_the_run() -> None:
    state = snapshot.load_snapshot(CLUSTER)
    answers = whatif.whatif(state, [("1", card_pod("a")), ("2", card_pod("b"))])
    assert [a.allowed for a in answers] == [True, False]  # cr-queue1 has 1 H200 left
    assert answers[0].patch and answers[0].patch[0]["path"] == "/spec/affinity"
    assert "1 admitted, not yet seen" in answers[1].message and "pod team-a/b needs 1" in answers[1].message
    fresh = snapshot.load_snapshot(CLUSTER)
    assert [a.allowed for a in whatif.whatif(fresh, [("1", card_pod("b"))])] == [True]


def test_whatif_shows_the_model_a_multi_card_pod_is_assigned_and_validates_the_pod_as_mutated() -> None:
    """Queue q has 1 RTX-4090 and 1 RTX-4090-D and a pending A|B pod: the first new A|B pod gets the
    4090 (the pending one can take the 4090-D), and the second has no model left."""
    spec = "NVIDIA-GeForce-RTX-4090|NVIDIA-GeForce-RTX-4090-D"
    pods = []
    for name in ("flex-a", "flex-b"):
        made = card_pod(name, queue="q")
        made["metadata"]["namespace"] = "team-d"
        made["metadata"]["annotations"]["volcano.sh/card.name"] = spec
        pods.append((name, made))
    first, second = whatif.whatif(snapshot.load_snapshot(CLUSTER), pods)
    assert first.allowed and first.message.startswith(f"assigned NVIDIA-GeForce-RTX-4090 of {spec}")
    assert {
        "op": "replace",
        "path": "/metadata/annotations/volcano.sh~1card.name",
        "value": "NVIDIA-GeForce-RTX-4090",
    } in first.patch
    assert {
        "op": "add",
        "path": "/metadata/annotations/cardquota.volcano.sh~1card.spec",
        "value": spec,
    } in first.patch
    assert not second.allowed
    assert second.message.startswith(
        'none of NVIDIA-GeForce-RTX-4090 (0 left), NVIDIA-GeForce-RTX-4090-D (0 left) in queue "q"'
    )


def test_a_workload_the_cluster_holds_is_an_update_from_its_replicas() -> None:
    state = snapshot.load_snapshot(CLUSTER)
    (found,) = [w for w in state.workloads.by_key.values() if w.kind == "Deployment" and w.replicas > 0][:1]
    raw = json.loads((REVIEWS / "deployment-replicas-raised.json").read_text())["request"]["object"]
    raw["metadata"].update(name=found.name, namespace=found.namespace)
    raw["spec"]["replicas"] = found.replicas
    (same,) = whatif.whatif(state, [("x", raw)])
    assert same.operation == "UPDATE" and same.allowed and "not a scale-up" in same.message


def running_trainer(**annotations: str) -> dict[str, Any]:
    """The example cluster's running H200 pod team-a/trainer-a-0 as a manifest would write it: no
    uid, node or status (the server's), its annotations as given."""
    pod = card_pod("trainer-a-0")
    pod["metadata"]["annotations"] = annotations
    pod["spec"]["schedulerName"] = "volcano"
    return pod


def test_an_edit_of_a_running_pods_charge_is_an_update_refused_and_the_same_pod_unedited_passes() -> None:
    state = snapshot.load_snapshot(CLUSTER)
    queue = {"scheduling.volcano.sh/queue-name": "cr-queue1"}
    same, moved, stripped = whatif.whatif(
        state,
        [
            ("1", running_trainer(**queue, **{"volcano.sh/card.name": "NVIDIA-H200"})),
            (
                "2",
                running_trainer(
                    **{"volcano.sh/card.name": "NVIDIA-H200"},
                    **{"scheduling.volcano.sh/queue-name": "inference"},
                ),
            ),
            ("3", running_trainer(**queue)),
        ],
    )
    assert [a.operation for a in (same, moved, stripped)] == ["UPDATE"] * 3
    assert same.allowed and "no annotation the count reads is edited" in same.message
    assert not moved.allowed and not stripped.allowed
    assert moved.message.startswith('pod team-a/trainer-a-0 is charged 1 NVIDIA-H200 to queue "cr-queue1"')
    assert "scheduling.volcano.sh/queue-name" in moved.message
    assert "volcano.sh/card.name" in stripped.message


def test_an_enqueued_podgroup_asking_more_is_refused_and_asking_less_passes() -> None:
    raw = json.loads((REVIEWS / "podgroup-enqueued-request-raised.json").read_text())["request"]["object"]
    for drop in ("uid",):
        raw["metadata"].pop(drop)
    raw.pop("status")
    raised = copy.deepcopy(raw)
    lowered = copy.deepcopy(raw)
    lowered["metadata"]["annotations"]["volcano.sh/card.request"] = '{"NVIDIA-H800":1}'
    moved = copy.deepcopy(raw)
    moved["metadata"]["annotations"]["volcano.sh/card.request"] = '{"NVIDIA-H800":2}'
    moved["spec"]["queue"] = "inference"
    answers = whatif.whatif(snapshot.load_snapshot(CLUSTER), [("1", raised), ("2", lowered), ("3", moved)])
    assert [(a.operation, a.allowed) for a in answers] == [
        ("UPDATE", False),
        ("UPDATE", True),
        ("UPDATE", False),
    ]
    assert answers[0].message.startswith("podgroup team-b/cr-job-uid-vcjob-cr-job")
    assert (
        'enqueued in queue "cr-queue1" with 2 NVIDIA-H800: it cannot ask 3 NVIDIA-H800' in answers[0].message
    )
    assert 'in queue "cr-queue1"' in answers[2].message


def test_the_cli_reads_stdin_and_answers_in_json() -> None:
    manifest = yaml.safe_dump_all(
        [card_pod("a"), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}]
    )
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "whatif", "-f", "-", "--cluster", str(CLUSTER), "--output", "json"],
        input=manifest.encode(),
        capture_output=True,
        cwd=ROOT,
        check=True,
    )
    answers = json.loads(done.stdout)
    assert [(a["object"], a["allowed"], a["sent"]) for a in answers] == [
        ("pod team-a/a", True, True),
        ("configmap default/x", True, False),
    ]


def test_a_manifest_that_is_not_one_says_where() -> None:
    with pytest.raises(SnapshotError, match="stdin document 2: expected a Kubernetes object, got list"):
        whatif.read_manifest("-", b"kind: Pod\nmetadata: {name: a}\n---\n- 1\n")


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
        max_leaves=20,
    ),
    st.sampled_from(sorted(whatif.RESOURCES)),
)
def test_any_object_of_a_sent_kind_gets_an_answer_never_an_exception(
    body: Any, kind: tuple[str, str]
) -> None:
    group, name = kind
    obj = {
        "apiVersion": f"{group}/v1" if group else "v1",
        "kind": name,
        "metadata": {"name": "x", "namespace": "team-a"},
        "spec": body,
    }
    (answer,) = whatif.whatif(snapshot.load_snapshot(CLUSTER), [("x", obj)])
    assert answer.sent and answer.message


def lending_cohort(*more: dict[str, Any]) -> snapshot.ClusterState:
    """``a`` (quota 6 H200 and 2 H800, deserved 3 and 1, running 1 H200) and ``b`` (deserved its
    quota of 3 and 2, idle) lend and borrow both models; ``w`` (quota 2 H200) is a wall."""
    return cluster(
        *NODES,
        lender("a", {H200: 6, H800: 2}, {H200: 3, H800: 1}),
        lender("b", {H200: 3, H800: 2}, {H200: 3, H800: 2}),
        lender("w", {H200: 2}),
        running("a0", "a"),
        *more,
    )


def lending_pod(name: str, queue: str, cards: int = 1, spec: str = H200) -> dict[str, Any]:
    made = card_pod(name, queue, cards)
    made["metadata"]["annotations"]["volcano.sh/card.name"] = spec
    return made


def test_whatif_tells_the_pods_within_the_deserved_from_those_that_take_what_the_cohort_lends() -> None:
    pods = [lending_pod("p1", "a", 2), lending_pod("p2", "a"), lending_pod("p3", "a", 3)]
    answers = whatif.whatif(lending_cohort(), [(made["metadata"]["name"], made) for made in pods])
    # a may use 6 (its deserved 3 and the 3 b leaves idle): with 4 used, 3 more do not fit
    assert [a.allowed for a in answers] == [True, True, False]
    assert [a.lending for a in answers] == [
        [{"queue": "a", "card": H200, "pods": 1, "within_deserved": 1, "borrowing": 0, "lenders": []}],
        [{"queue": "a", "card": H200, "pods": 1, "within_deserved": 0, "borrowing": 1, "lenders": ["b"]}],
        [],
    ]
    lines = [line for line in whatif.table(answers).splitlines() if line.startswith("  queue")]
    assert lines == [
        f"  queue 'a' on {H200}: the pod fits within its deserved",
        f"  queue 'a' on {H200}: the pod takes what its cohort lends now (lent by queue 'b')",
    ]
    assert (
        "has 2 NVIDIA-H200 left (deserved 3 and 3 idle in its cohort to borrow, quota 6" in answers[2].message
    )


def test_whatif_splits_a_scale_up_between_the_deserved_and_what_the_cohort_lends() -> None:
    state = lending_cohort(deployment("train", 0, queue_name="a"))
    (answer,) = whatif.whatif(state, [("x", deployment("train", 4, queue_name="a"))])
    assert answer.allowed and answer.operation == "UPDATE"
    assert whatif.table([answer]).splitlines()[-1] == (
        f"  queue 'a' on {H200}: 2 of the 4 pods it adds fit within its deserved,"
        " 2 more with what its cohort lends now (lent by queue 'b')"
    )
    assert json.loads(whatif.as_json([answer]))[0]["lending"][0]["borrowing"] == 2


def test_twin_whatif_in_a_queue_without_card_deserved_says_nothing_of_lending() -> None:
    answers = whatif.whatif(lending_cohort(), [("p", lending_pod("p", "w")), ("q", lending_pod("q", "w"))])
    assert [a.allowed for a in answers] == [True, True] and [a.lending for a in answers] == [[], []]
    assert "deserved" not in whatif.table(answers) and "lends" not in whatif.table(answers)


def test_whatif_of_a_multi_card_pod_tells_the_model_it_is_assigned() -> None:
    """a runs 2 H200: 1 left of its deserved 3. The pod's model, held since its mutation, is not
    counted twice: the pod fits within its deserved."""
    (answer,) = whatif.whatif(
        lending_cohort(running("a1", "a")), [("p", lending_pod("p", "a", spec=f"{H200}|{H800}"))]
    )
    assert answer.allowed and answer.message.startswith(f"assigned {H200} of {H200}|{H800}")
    assert [(n["card"], n["within_deserved"], n["borrowing"]) for n in answer.lending] == [(H200, 1, 0)]

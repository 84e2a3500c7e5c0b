from pathlib import Path

import pytest

from webhook.cluster.snapshot import load_snapshot
from webhook.core.model.cards import units
from webhook.errors import SnapshotError

NODE = """
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {nvidia.com/gpu.product: NVIDIA-H200, nvidia.com/gpu.count: "8", nvidia.com/gpu.memory: "143771"}}
status: {allocatable: {nvidia.com/gpu: "8"}}
"""


def write(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)


def test_multi_document_files_lists_and_json_all_load(tmp_path: Path) -> None:
    write(tmp_path, "nodes.yaml", NODE + "---\n" + NODE.replace("n1", "n2"))
    write(
        tmp_path,
        "queues.json",
        '{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"}}]}',
    )
    (tmp_path / "sub").mkdir()
    write(
        tmp_path / "sub",
        "pods.yml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nspec: {containers: []}\n",
    )
    state = load_snapshot(tmp_path)
    assert sorted(state.nodes) == ["n1", "n2"] and "q" in state.tree.queues and len(state.pods) == 1
    assert state.inventory.cards["NVIDIA-H200"].total == units(16)


def test_a_namespace_after_its_pods_in_the_files_still_gives_them_its_default_queue(tmp_path: Path) -> None:
    """decisions.md §30: Namespaces are applied before pods, whatever the files' order; one without
    the annotation is not kept."""
    pod = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-f, uid: u1, annotations:"
        " {volcano.sh/card.name: NVIDIA-H200}}\nspec: {containers: [{name: c, resources: {limits:"
        ' {nvidia.com/gpu: "1"}}}]}\n'
    )
    namespaces = (
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-f, annotations:"
        " {scheduling.volcano.sh/queue-name: inference}}\n---\napiVersion: v1\nkind: Namespace\n"
        "metadata: {name: plain}\n"
    )
    write(tmp_path, "a-pods.yaml", NODE + "---\n" + pod)
    write(tmp_path, "z-namespaces.yaml", namespaces)
    state = load_snapshot(tmp_path)
    assert state.namespace_queues == {"team-f": "inference"} and not state.notes
    assert state.charged.charge("u1").queue == "inference"  # type: ignore[union-attr]


def test_unknown_kinds_are_skipped_with_a_note(tmp_path: Path) -> None:
    write(
        tmp_path,
        "misc.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: batch/v1\nkind: CronJob\nmetadata: {name: j}\n",
    )
    state = load_snapshot(tmp_path)
    assert len(state.notes) == 2 and "document 1: skipped v1 ConfigMap" in state.notes[0]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("kind: [unclosed", "bad.yaml: not YAML/JSON", id="broken YAML"),
        pytest.param(
            NODE + "---\n- just\n- a list\n",
            "bad.yaml document 2: expected a Kubernetes object, got list",
            id="not an object",
        ),
        pytest.param(
            "apiVersion: v1\nkind: List\nitems:\n- {metadata: {name: x}}\n",
            "bad.yaml document 1 item 0: object without a kind",
            id="item without kind",
        ),
        pytest.param(
            "apiVersion: v1\nkind: List\nitems: 3\n", "items must be a list", id="List items not a list"
        ),
        pytest.param(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: 5}\n",
            "bad.yaml document 1: malformed Pod",
            id="malformed pod",
        ),
    ],
)
def test_malformed_files_name_the_file_and_document(tmp_path: Path, text: str, says: str) -> None:
    write(tmp_path, "bad.yaml", text)
    with pytest.raises(SnapshotError) as caught:
        load_snapshot(tmp_path)
    assert says in str(caught.value)


def test_status_shows_skipped_objects_as_notes(tmp_path: Path) -> None:
    from webhook.core.decide.report import cluster_status, status_table

    write(tmp_path, "misc.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    assert "skipped v1 ConfigMap" in status_table(cluster_status(load_snapshot(tmp_path)))

"""``kubectl cardquota`` without a cluster: its kubeconfig reading against hostile files, its help."""

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.errors import ConfigError
from webhook.tools import plugin

GOOD = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {}}],
    "contexts": [
        {"name": "lab", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
        {"name": "other", "context": {"cluster": "c", "user": "u"}},
    ],
    "current-context": "lab",
}


def test_the_namespace_is_the_current_contexts_or_the_named_ones_or_default(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(GOOD))
    assert plugin.context_namespace(str(path), None) == "team-a"
    assert plugin.context_namespace(str(path), "other") == "default"
    assert plugin.context_namespace(f"{tmp_path / 'absent'}:{path}", None) == "team-a"  # a KUBECONFIG list
    with pytest.raises(ConfigError, match='context "nowhere" is not in kubeconfig'):
        plugin.context_namespace(str(path), "nowhere")
    with pytest.raises(ConfigError, match="no kubeconfig file at"):
        plugin.context_namespace(str(tmp_path / "absent"), None)


YAMLISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from([*GOOD, "name", "context", "namespace"]), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    document=YAMLISH | st.builds(lambda k, v: {**GOOD, k: v}, st.sampled_from(list(GOOD)), YAMLISH),
    raw=st.binary(max_size=40),
)
def test_any_kubeconfig_file_gives_a_namespace_or_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, document: object, raw: bytes
) -> None:
    path = tmp_path_factory.mktemp("kc") / "config"
    for content in (yaml.safe_dump(document).encode(), raw):
        path.write_bytes(content)
        for context in (None, "lab"):
            try:
                namespace = plugin.context_namespace(str(path), context)
            except ConfigError:
                continue
            assert isinstance(namespace, str) and namespace


def test_help_shows_examples_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        plugin.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "kubectl cardquota headroom deployment/chat -n team-a" in text
    assert "3  the cluster did not answer in time" in text


@pytest.fixture
def example_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The plugin on the bundled example cluster instead of a live one; returns a kubeconfig whose
    current context's namespace is team-a."""
    from webhook import main as main_module
    from webhook.cluster import snapshot

    def example(kubeconfig: object, policy: object, timeout: float, context: str | None = None) -> object:
        CONTEXTS.append(context)
        return snapshot.load_snapshot(ROOT / "examples" / "cluster", policy)  # type: ignore[arg-type]

    monkeypatch.setattr(main_module, "live_state", example)
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(GOOD))
    return path


ROOT = Path(__file__).resolve().parents[2]
CONTEXTS: list[str | None] = []  # the contexts the plugin asked the cluster for
POD = """apiVersion: v1
kind: Pod
metadata: {name: eval-%d, annotations: {volcano.sh/card.name: NVIDIA-H200, scheduling.volcano.sh/queue-name: cr-queue1}}
spec: {containers: [{name: c, image: i, resources: {limits: {nvidia.com/gpu: "1"}}}]}
"""


def test_whatif_exits_1_when_something_would_be_denied_and_puts_names_in_the_contexts_namespace(
    example_cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text(POD % 0)
    two.write_text(POD % 0 + "---\n" + POD % 1)  # cr-queue1 has 1 NVIDIA-H200 left
    assert plugin.main(["whatif", "-f", str(one), "--kubeconfig", str(example_cluster)]) == 0
    assert "pod team-a/eval-0 (CREATE): ALLOWED" in capsys.readouterr().out
    assert (
        plugin.main(
            ["whatif", "-f", str(two), "--kubeconfig", str(example_cluster), "-n", "team-b", "-o", "yaml"]
        )
        == 1
    )
    answers = yaml.safe_load(capsys.readouterr().out)
    assert [(a["object"], a["allowed"]) for a in answers] == [
        ("pod team-b/eval-0", True),
        ("pod team-b/eval-1", False),
    ]


def test_headroom_and_status_answer_with_the_exit_codes_documented(
    example_cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kc = ["--kubeconfig", str(example_cluster)]
    assert plugin.main(["headroom", "deployment/chat", *kc, "-o", "json"]) == 0  # team-a, from the context
    assert '"workload": "deployment team-a/chat"' in capsys.readouterr().out
    assert plugin.main(["headroom", "deployment/chat", *kc, "-n", "nowhere"]) == 2
    assert "deployment nowhere/chat is not in the cluster" in capsys.readouterr().err
    assert plugin.main(["headroom", "chat", *kc]) == 2
    assert "expected KIND/NAME" in capsys.readouterr().err
    assert plugin.main(["status", *kc, "--context", "other"]) == 0
    assert "cr-queue1" in capsys.readouterr().out
    assert CONTEXTS[-1] == "other"


def test_status_shows_deserved_borrowed_and_lent_in_every_output(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``a`` borrows one of the two H200 ``b`` leaves idle; ``w`` has no card.deserved."""
    from tests.builders import H200, cluster
    from tests.core.test_borrowing import NODES, lender, running
    from webhook import main as main_module

    state = cluster(
        *NODES,
        lender("a", {H200: 4}, {H200: 2}),
        lender("b", {H200: 2}, {H200: 2}),
        lender("w", {H200: 2}),
        *(running(f"a{i}", "a") for i in range(3)),
    )
    monkeypatch.setattr(main_module, "live_state", lambda *_, **__: state)
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(GOOD))
    assert plugin.main(["status", "--kubeconfig", str(path), "-o", "yaml"]) == 0
    queues = yaml.safe_load(capsys.readouterr().out)["queues"]
    lent = ("quota", "free", "deserved", "may_use", "borrowed", "lendable", "lent")
    assert [queues["a"][H200][key] for key in lent] == [4, 1, 2, 4, 1, 0, 0]
    assert [queues["b"][H200][key] for key in lent] == [2, 2, 2, 2, 0, 2, 1]
    assert "deserved" not in queues["w"][H200]
    assert plugin.main(["status", "--kubeconfig", str(path)]) == 0
    table = capsys.readouterr().out
    assert (
        "QUEUE            CARD                                      DESERVED MAY USE BORROWED LENDABLE  LENT"
        in table
    )
    assert f"a                {H200:<41}        2       4        1        0     0" in table
    assert f"b                {H200:<41}        2       2        0        2     1" in table


def test_events_that_cannot_be_read_are_a_reason_not_an_error(tmp_path: Path) -> None:
    """The audit report's Events from a cluster that does not answer, or a kubeconfig that is no
    kubeconfig: why they are missing, so the rest of the report is answered."""
    from webhook import main

    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(GOOD))
    why = main.live_events(str(path), "CardQuotaWouldRefuse", timeout=5.0)
    assert isinstance(why, str) and why.startswith("the CardQuotaWouldRefuse Events could not be read: "), why
    (tmp_path / "junk").write_text("clusters: 7")
    why = main.live_events(str(tmp_path / "junk"), "CardQuotaWouldRefuse", timeout=5.0)
    assert isinstance(why, str) and "could not be read" in why, why


def test_cardquota_on_a_kubeconfig_that_is_no_kubeconfig_says_so_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from webhook.tools import cli

    (tmp_path / "junk").write_text("clusters: 7")
    for command in ("status", "audit"):
        assert cli.main([command, "--kubeconfig", str(tmp_path / "junk")]) == 2
        assert "not a kubeconfig" in capsys.readouterr().err

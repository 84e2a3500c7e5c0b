"""``kubectl cardquota`` without a cluster: its kubeconfig reading against hostile files, its help."""

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook import plugin
from webhook.errors import ConfigError

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

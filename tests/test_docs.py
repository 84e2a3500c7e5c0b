"""docs/decisions.md and the README quote real answers: every quoted example review and every quoted
``$ cardquota ...`` command must print what the code answers now."""

import re
import shlex
from pathlib import Path

import pytest

from webhook.tools.cli import example_files, example_header, main, review_example

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DOC = (ROOT / "docs" / "decisions.md").read_text()
BLOCK = re.compile(r"```text\n(# examples/reviews/(\S+) \((validate|mutate)[^)]*\))\n(.*?)\n```", re.S)
QUOTED = BLOCK.findall(DOC)
BUNDLED = {path.name: (path, webhook, flags) for path, webhook, flags in example_files(EXAMPLES)}


@pytest.mark.parametrize(("header", "name", "text"), [pytest.param(h, n, t, id=n) for h, n, _, t in QUOTED])
def test_a_quoted_example_is_what_the_webhook_answers_under_the_settings_it_names(
    header: str, name: str, text: str
) -> None:
    path, webhook, flags = BUNDLED[name]
    assert header == example_header(path.relative_to(ROOT), webhook, flags)
    assert review_example(EXAMPLES, path, webhook, flags) == text


def test_every_bundled_review_is_explained_in_the_decisions_doc() -> None:
    quoted = {name for _, name, _, _ in QUOTED}
    assert set(BUNDLED) <= quoted


COMMAND = re.compile(r"```text\n\$ cardquota (.+?)\n(.*?)\n```", re.S)
COMMANDS = [
    pytest.param(args, out, id=f"{doc}: {args[:60]}")
    for doc in ("docs/decisions.md", "README.md")
    for args, out in COMMAND.findall((ROOT / doc).read_text())
]


def test_the_docs_quote_commands() -> None:
    assert len(COMMANDS) >= 6


@pytest.mark.parametrize(("args", "out"), COMMANDS)
def test_a_quoted_command_prints_what_is_quoted(
    args: str, out: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(shlex.split(args)) == 0
    assert capsys.readouterr().out.rstrip("\n") == out

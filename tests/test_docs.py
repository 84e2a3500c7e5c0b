"""docs/decisions.md quotes real decisions: every quoted block must be what the code answers now."""

import re
from pathlib import Path

import pytest

from webhook.cli import example_files, review_example

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DOC = (ROOT / "docs" / "decisions.md").read_text()
BLOCK = re.compile(r"```text\n# examples/reviews/(\S+) \((validate|mutate)\)\n(.*?)\n```", re.S)
QUOTED = BLOCK.findall(DOC)


@pytest.mark.parametrize(("name", "webhook", "text"), [pytest.param(*q, id=q[0]) for q in QUOTED])
def test_a_quoted_example_is_what_the_webhook_answers(name: str, webhook: str, text: str) -> None:
    assert review_example(EXAMPLES, EXAMPLES / "reviews" / name, webhook) == text  # type: ignore[arg-type]


def test_every_bundled_review_is_explained_in_the_decisions_doc() -> None:
    quoted = {name for name, _, _ in QUOTED}
    assert {path.name for path, _ in example_files(EXAMPLES)} <= quoted

"""Core values are immutable to the type checker and hashable by their fields (webhook/core/model/values.py)."""

from mypy import api

from webhook.core.model.cards import CardSpec
from webhook.core.model.verdicts import Hold

SNIPPET = """
from webhook.core.model.cards import CardSpec
from webhook.core.model.verdicts import Hold

hold = Hold("k", "q", CardSpec(("A",)), 1, 1)
hold.pods = 2
"""


def test_assigning_a_field_is_a_type_error(tmp_path):
    source = tmp_path / "assign.py"
    source.write_text(SNIPPET)
    out, _, status = api.run(["--no-incremental", "--follow-imports=silent", str(source)])
    assert status == 1, out
    assert 'Property "pods" defined in "Hold" is read-only' in out


def test_equal_values_hash_alike():
    one = Hold("k", "q", CardSpec(("A",)), 1, 1)
    assert one == Hold("k", "q", CardSpec(("A",)), 1, 1)
    assert len({one, Hold("k", "q", CardSpec(("A",)), 1, 1), Hold("k", "q", CardSpec(("B",)), 1, 1)}) == 2

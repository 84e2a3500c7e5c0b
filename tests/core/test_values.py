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


def test_a_request_with_its_template_keeps_every_other_field():
    """``Request.with_template`` builds the request field by field (cheaper than ``replace``): a field
    added to ``Request`` and forgotten there would be dropped from every pod review."""
    import dataclasses

    from webhook.core.model.objects import pod_template_of
    from webhook.core.model.verdicts import Request

    values = {f.name: f"value-{f.name}" for f in dataclasses.fields(Request)}
    values.update(obj={"a": 1}, old_obj={"b": 2}, dry_run=True, template=None)
    request = Request(**values)
    template = pod_template_of({"metadata": {"name": "p", "annotations": {"a": "b"}}})
    assert request.with_template(template) == dataclasses.replace(request, template=template)

import pytest

from webhook.core.model.cards import units
from webhook.core.model.quota import AnnotationError, parse_card_request, parse_quota

KEY = "volcano.sh/card.quota"


def test_a_quota_maps_each_card_model_to_a_count() -> None:
    text = '{"NVIDIA-H200":3,"NVIDIA-H800/mps-80g*1/2":2,"NVIDIA-H200/mig-1g.18gb-mixed":0}'
    assert parse_quota(KEY, text) == {  # in card units
        "NVIDIA-H200": units(3),
        "NVIDIA-H800/mps-80g*1/2": units(2),
        "NVIDIA-H200/mig-1g.18gb-mixed": 0,
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("NVIDIA-H200=3", "not JSON", id="not json"),
        pytest.param("[1, 2]", "must be a JSON object", id="not an object"),
        pytest.param('"3"', "must be a JSON object", id="a string"),
        pytest.param('{"NVIDIA-H200": "3"}', 'whole number, got "3"', id="string count"),
        pytest.param('{"NVIDIA-H200": 2.0}', "whole number, got 2.0", id="float count"),
        pytest.param('{"NVIDIA-H200": true}', "whole number, got true", id="bool count"),
        pytest.param('{"NVIDIA-H200": -1}', ">= 0, got -1", id="negative"),
        pytest.param('{"A|B": 2}', "quota is per card model", id="multi-card key"),
        pytest.param('{"NVIDIA-H800/mps-80g": 2}', "MPS card is", id="malformed card name"),
        pytest.param('{"NVIDIA-H200": 1, "NVIDIA-H200": 2}', "twice", id="duplicate key"),
        pytest.param('{" NVIDIA-H200": 1}', "whitespace", id="padded key"),
    ],
)
def test_malformed_quotas_are_refused_with_the_reason(text: str, says: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        parse_quota(KEY, text)
    assert says in str(caught.value) and str(caught.value).startswith(KEY)


def test_a_card_request_accepts_multi_card_specs_but_not_zero() -> None:
    request = parse_card_request("volcano.sh/card.request", '{"A|B": 2, "C": 1}')
    assert {spec.text: n for spec, n in request.counts.items()} == {"A|B": units(2), "C": units(1)}
    with pytest.raises(AnnotationError, match="must be >= 1"):
        parse_card_request("volcano.sh/card.request", '{"A": 0}')

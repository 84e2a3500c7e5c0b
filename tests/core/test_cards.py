import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.core.model.cards import (
    CardKind,
    CardNameError,
    format_card_spec,
    mig_card_name,
    mps_card_name,
    parse_card_name,
    parse_card_spec,
)


@pytest.mark.parametrize(
    ("text", "kind", "product"),
    [
        pytest.param("NVIDIA-H200", CardKind.WHOLE, "NVIDIA-H200", id="whole card"),
        pytest.param("NVIDIA-H800/mps-80g*1/2", CardKind.MPS, "NVIDIA-H800", id="mps sub-card"),
        pytest.param("NVIDIA-H200/mig-1g.18gb-mixed", CardKind.MIG, "NVIDIA-H200", id="mig sub-card"),
        pytest.param("Ascend-910B", CardKind.WHOLE, "Ascend-910B", id="another vendor"),
    ],
)
def test_card_names_are_parsed_into_kind_and_product(text: str, kind: CardKind, product: str) -> None:
    card = parse_card_name(text)
    assert (card.name, card.kind, card.product) == (text, kind, product)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param("NVIDIA H200", "label value", id="space inside"),
        pytest.param("NVIDIA-H800/mps-80g/2", "mps-<memGiB>g*1/<replicas>", id="mps without *1"),
        pytest.param("NVIDIA-H800/mps-80g*1/0", "0 replicas", id="mps zero replicas"),
        pytest.param("NVIDIA-H200/mig-1g.18gb", "mig-<profile>-mixed", id="mig without -mixed"),
        pytest.param("NVIDIA-H200/other", "after '/'", id="unknown sub-card"),
        pytest.param("-bad/mig-1g-mixed", "not a valid label value", id="bad product"),
    ],
)
def test_malformed_card_names_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(CardNameError, match=None) as caught:
        parse_card_name(text)
    assert says in str(caught.value)


def test_multi_card_specs_keep_the_order_of_preference_and_drop_whitespace() -> None:
    spec = parse_card_spec(" NVIDIA-GeForce-RTX-4090 |NVIDIA-GeForce-RTX-4090-D ")
    assert spec.cards == ("NVIDIA-GeForce-RTX-4090", "NVIDIA-GeForce-RTX-4090-D")
    assert format_card_spec(spec) == "NVIDIA-GeForce-RTX-4090|NVIDIA-GeForce-RTX-4090-D"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("A||B", "empty alternative at position 2", id="empty alternative"),
        pytest.param("A|A", "twice", id="repeated card"),
        pytest.param("A|B/mps-1g", "(alternative 2)", id="names the bad alternative"),
    ],
)
def test_malformed_specs_name_the_position(text: str, says: str) -> None:
    with pytest.raises(CardNameError) as caught:
        parse_card_spec(text)
    assert says in str(caught.value)


_products = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,20}[A-Za-z0-9])?", fullmatch=True)
_cards = st.one_of(
    _products,
    st.builds(mps_card_name, _products, st.integers(0, 200), st.integers(1, 16)),
    st.builds(mig_card_name, _products, st.from_regex(r"[1-7]g\.[0-9]{1,3}gb", fullmatch=True)),
)


@given(
    st.lists(_cards, min_size=1, max_size=4, unique=True),
    st.lists(st.sampled_from(["", " ", "  "]), min_size=8, max_size=8),
)
def test_parsing_a_formatted_spec_gives_it_back_whatever_the_whitespace(
    names: list[str], pads: list[str]
) -> None:
    text = "|".join(f"{pads[i % 8]}{name}{pads[(i + 1) % 8]}" for i, name in enumerate(names))
    spec = parse_card_spec(text)
    assert list(spec.cards) == names
    assert parse_card_spec(format_card_spec(spec)) == spec

"""Free cards per node and model: the histogram always agrees with counting node by node."""

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.index.freecards import FreeCards
from webhook.core.model.cards import CardName
from webhook.core.model.nodes import NodeCard, NodeCards

A, B = CardName("NVIDIA-H200"), CardName("NVIDIA-H800")
NODES = ["n0", "n1", "n2"]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("node"), st.sampled_from(NODES), st.sampled_from([A, B]), st.integers(0, 8)),
        st.tuples(st.just("gone"), st.sampled_from(NODES), st.just(A), st.just(0)),
        st.tuples(st.just("use"), st.sampled_from(NODES), st.sampled_from([A, B]), st.integers(-3, 4)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_histogram_answers_as_counting_node_by_node_after_any_changes(
    ops: list[tuple[str, str, CardName, int]],
) -> None:
    free = FreeCards()
    capacity: dict[str, tuple[CardName, int]] = {}
    used: dict[tuple[str, CardName], int] = {}
    for op, node, card, n in ops:
        if op == "node":
            free.set_node(NodeCards(node, card, "k", (NodeCard(card, "nvidia.com/gpu", n),)))
            capacity[node] = (card, n)
        elif op == "gone":
            free.delete_node(node)
            capacity.pop(node, None)
        else:
            free.use(node, card, n)
            used[(node, card)] = used.get((node, card), 0) + n
    for card in (A, B):
        for count in range(1, 9):
            expected = any(
                c == card and total - used.get((node, c), 0) >= count for node, (c, total) in capacity.items()
            )
            assert free.has_free(card, count) == expected
        for node in NODES:
            total = capacity[node][1] if node in capacity and capacity[node][0] == card else 0
            assert free.free_on(node, card) == total - used.get((node, card), 0)


def test_a_node_of_the_model_with_room_is_found_and_a_full_one_is_not() -> None:
    free = FreeCards()
    free.set_node(NodeCards("n0", A, "k", (NodeCard(A, "nvidia.com/gpu", 2),)))
    assert free.has_free(A, 2) and not free.has_free(B, 1)
    free.use("n0", A, 1)
    assert free.has_free(A, 1) and not free.has_free(A, 2)

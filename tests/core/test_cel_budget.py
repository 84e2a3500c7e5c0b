"""SPEC §4b, decisions.md §30: a DRA selector is held to Kubernetes' cost limit, and evaluating one
never holds the loop that answers reviews.

The cost of one evaluation is bounded the way cel-go's runtime counts it (``celcost``): the
figures below are counted by hand from ``interpreter/runtimecost.go`` and Kubernetes'
``library/cost.go`` (the operation, then its operands)."""

import pytest

from tests.builders import claim_template, gpu_request, resource_slice
from tests.core.test_dra import PRODUCT_IS, decide, dra_cluster, dra_pod
from webhook.core.model import celcost
from webhook.core.model.cel import DeviceData, program
from webhook.core.model.celcost import MAX_COST
from webhook.core.model.devices import slice_record
from webhook.core.model.verdicts import Allowed, Denied

NVIDIA = "gpu.nvidia.com"
NINETY_NINE = "[" + ", ".join(str(i) for i in range(99)) + "]"
# The selector: inside the runtime's iteration budget (99 x 99 + 99 of 10,000) and inside
# Kubernetes' cost limit, which the API server's check accepts: 3 ms of evaluation a device.
NESTED = f"{NINETY_NINE}.all(x, {NINETY_NINE}.all(y, x + y >= 0))"
# The same nesting with a body a hundred times dearer: past Kubernetes' limit.
HUNDRED = "'" + "a" * 100 + "'"
PAST_LIMIT = f"{NINETY_NINE}.all(x, {NINETY_NINE}.all(y, {HUNDRED}.contains({HUNDRED})))"
CHEAP = PRODUCT_IS.format("NVIDIA H200")


def a_device(product: str = "NVIDIA H200") -> DeviceData:
    found = slice_record(resource_slice("n", product, 1), (NVIDIA,))
    assert found is not None and found.devices[0].data is not None
    return found.devices[0].data


@pytest.mark.parametrize(
    ("text", "cost"),
    [
        # device 1, .attributes 1, ['gpu.nvidia.com'] 1, .productName 1; == a tenth of 11 chars: 2
        pytest.param(CHEAP, 6, id="a product name"),
        pytest.param(f"device.driver == '{NVIDIA}'", 4, id="the driver"),
        # the bound list [] 10, its start 3; the result: 4 + 3
        pytest.param(
            f"cel.bind(d, device.attributes['{NVIDIA}'], d.productName == 'NVIDIA H200' && d.type == 'gpu')",
            20,
            id="cel.bind",
        ),
        # over the 3 attributes: start 3, result 1, each: !@result 2 + not_strictly_false 1, @result 1
        # + k 1 + startsWith a tenth of 11 chars: 2
        pytest.param(f"device.attributes['{NVIDIA}'].exists(k, k.startsWith('prod'))", 25, id="exists"),
        pytest.param(
            f"device.capacity['{NVIDIA}'].memory.compareTo(quantity('40Gi')) >= 0", 7, id="a quantity"
        ),
        # two lists of 99: 10 each; inner: 10 + 1 + 99 x 7; outer: 10 + 1 + 99 x (2 + 1 + 704)
        pytest.param(NESTED, 70_004, id="the nested comprehension"),
        pytest.param(PAST_LIMIT, 1_010_900, id="past the limit"),
    ],
)
def test_one_evaluation_is_bounded_as_cel_go_counts_it(text: str, cost: int) -> None:
    assert program(text).cost(a_device()) == cost


def test_a_selector_past_the_cost_limit_is_refused_naming_it_and_its_cheap_twin_is_allowed() -> None:
    assert program(PAST_LIMIT).cost(a_device()) > MAX_COST >= program(NESTED).cost(a_device())
    costly = dra_cluster(claim_template("costly", gpu_request(count=1, selectors=(PAST_LIMIT,))))
    refused = decide(costly, dra_pod("p", templates=("costly",)))
    assert isinstance(refused, Denied), refused
    assert refused.message == (
        "pod ns/p asks GPUs (request gpu of claim t0 from template costly) whose model cannot be read:"
        " its CEL selector '[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 2'"
        "... (1005 characters) is not evaluated on device dra/gpu-0: its cost may reach 1,010,900, past"
        " Kubernetes' limit of 1,000,000 for one evaluation (the scheduler aborts a claim's allocation past"
        " it)"
    )
    twin = dra_cluster(claim_template("cheap", gpu_request(count=1, selectors=(CHEAP,))))
    assert isinstance(decide(twin, dra_pod("p", templates=("cheap",))), Allowed)


def test_a_selector_past_the_limit_is_never_evaluated() -> None:
    """Refused from its bound alone: the runtime never runs it (it would take seconds)."""
    device = a_device()
    assert program(PAST_LIMIT).evaluate(device) == program(PAST_LIMIT).over(device)
    assert program(NESTED).evaluate(device) is True


def test_an_expression_the_reader_cannot_read_is_unbounded() -> None:
    assert celcost.bound(celcost.checked(b"\x12\xff"), a_device().shape()) == celcost.UNBOUNDED

"""SPEC §4b, decisions.md §32: a DRA selector is held to Kubernetes' cost limit, and evaluating one
never holds the loop that answers reviews.

The cost of one evaluation is bounded the way cel-go's runtime counts it (``celcost``): the
figures below are counted by hand from ``interpreter/runtimecost.go`` and Kubernetes'
``library/cost.go`` (the operation, then its operands)."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import claim_template, gpu_request, resource_slice
from tests.core.test_cel_property import selectors
from tests.core.test_dra import PRODUCT_IS, decide, dra_cluster, dra_pod, pending
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model import celcost
from webhook.core.model.cel import DeviceData, Program, known, program
from webhook.core.model.celcost import MAX_COST
from webhook.core.model.claims import INLINE_UNITS, evaluate_selectors
from webhook.core.model.devices import slice_record
from webhook.core.model.verdicts import Allowed, Decision, Denied

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


# ---- on a serving replica: the loop works out what fits a turn's budget, the rest is deferred ---
SLICES = 125  # of 8 H200 each: 1,000 devices, besides the 4 H200 and 2 RTX 4090 of dra_cluster
QUOTA = '{"NVIDIA-H200": 100, "NVIDIA-GeForce-RTX-4090": 100}'
BOUND = 0.05  # seconds one call may take: the budget is about 3 ms of evaluation (a loaded machine)
PIECE = 2_000_000  # cost units of one job of the process that works off the loop


def nested(i: int, reads_uuid: bool = False) -> str:
    """The issue's selector, made distinct (``-i``); ``reads_uuid``: it reads each device's own
    value, so no two devices are answered as one."""
    text = f"{CHEAP} && {NESTED.replace('>= 0', f'>= -{i}')}"
    return f"device.attributes['{NVIDIA}'].uuid != '' && {text}" if reads_uuid else text


def gpus(*objects: Any, serving: bool = True) -> ClusterState:
    """``dra_cluster`` with 1,000 more H200 published; ``serving``: as a serving replica keeps it."""
    state = dra_cluster(
        *(resource_slice(f"s{i}", "NVIDIA H200", 8, name=f"s{i}") for i in range(SLICES)),
        *objects,
        quota=QUOTA,
    )
    if serving:
        state.inventory.devices.budget = INLINE_UNITS
    return state


def work_off_the_loop(state: ClusterState, jobs: int | None = None) -> int:
    """What the process that works off the loop does (``cluster.selectors``), here: each job taken,
    worked out and settled, up to ``jobs``; how many."""
    done = 0
    while (jobs is None or done < jobs) and (job := state.inventory.devices.take(PIECE)) is not None:
        state.selectors_evaluated(job, evaluate_selectors(job))
        done += 1
    return done


def as_served(state: ClusterState, obj: dict[str, Any]) -> Decision:
    """As the server answers: a decision that deferred work is taken again once it is done."""
    devices = state.inventory.devices
    for _ in range(1000):
        missed = devices.missed
        decision = decide(state, obj)
        if devices.missed == missed:
            return decision
        work_off_the_loop(state)
    raise AssertionError("never decided")


@contextmanager
def at_most(evaluations: int) -> Iterator[list[int]]:
    """Fails fast when more selectors than ``evaluations`` are evaluated in one call (a guard: the
    loop evaluating what it should defer would take minutes here)."""
    count = [0]
    real = Program.evaluate

    def counted(self: Program, device: DeviceData) -> bool | str:
        count[0] += 1
        assert count[0] <= evaluations, f"{count[0]} evaluations in one call"
        return real(self, device)

    Program.evaluate = counted  # type: ignore[method-assign]
    try:
        yield count
    finally:
        Program.evaluate = real  # type: ignore[method-assign]


@pytest.mark.parametrize("reads_uuid", [False, True], ids=["alike devices", "each device its own"])
def test_the_costly_template_at_1000_devices_never_holds_one_call_longer_than_the_bound(
    reads_uuid: bool,
) -> None:
    """32 selectors of 70,000 cost units each (3 ms a device): evaluated on the loop, one pod's
    review would hold it 0.1 s (devices alike) or 100 s (each its own); here every call returns
    within the bound, refused with the reason while the work goes on off the loop."""
    selectors = tuple(nested(i, reads_uuid) for i in range(32))
    state = gpus(claim_template("costly", gpu_request(count=1, selectors=selectors)))
    slowest, rounds = 0.0, 0
    while rounds < 8:
        with at_most(32):
            started = time.perf_counter()
            decision = decide(state, dra_pod("p", templates=("costly",)))
            slowest = max(slowest, time.perf_counter() - started)
        if isinstance(decision, Allowed):
            break
        assert isinstance(decision, Denied), decision
        assert "whose model is not known yet: its CEL selector" in decision.message, decision.message
        assert decision.message.endswith(": try again in a few seconds"), decision.message
        work_off_the_loop(state, jobs=1)
        rounds += 1
    assert slowest < BOUND, slowest
    assert (rounds == 8) is reads_uuid  # devices alike: 32 evaluations off the loop (0.1 s), then answered


def test_a_cheap_selector_at_1000_devices_is_answered_on_the_spot() -> None:
    state = gpus(claim_template("cheap", gpu_request(count=1, selectors=(CHEAP,))))
    missed = state.inventory.devices.missed
    with at_most(8):  # its class's and its own, once for all devices alike
        assert isinstance(decide(state, dra_pod("p", templates=("cheap",))), Allowed)
    assert state.inventory.devices.missed == missed


def test_a_long_selector_is_compiled_off_the_loop() -> None:
    """32 selectors of 8 KiB each: compiling them is 40 ms each; the loop compiles none."""
    long = [f"{CHEAP} && [{', '.join(['1'] * 2700)}].size() > {i}" for i in range(32)]
    assert all(8_000 < len(text) < 10 * 1024 for text in long)
    state = gpus(claim_template("long", gpu_request(count=1, selectors=tuple(long))))
    started = time.perf_counter()
    refused = decide(state, dra_pod("p", templates=("long",)))
    assert time.perf_counter() - started < BOUND
    assert isinstance(refused, Denied) and "is being evaluated, off the loop" in refused.message
    assert all(known(text) is None for text in long)
    assert isinstance(as_served(state, dra_pod("p", templates=("long",))), Allowed)


def test_a_pod_charged_while_its_selectors_were_deferred_is_charged_once_they_are_done() -> None:
    state = gpus(claim_template("costly", gpu_request(count=1, selectors=(nested(0),))))
    ingest.upsert(state, dra_pod("p", templates=("costly",), queue_name="q"))  # as the watch brings it
    assert state.pending == {"uid-ns-p"}
    assert pending(state) == 0
    work_off_the_loop(state)
    assert state.pending == set()
    assert pending(state) == 1


def test_work_taken_and_never_answered_is_deferred_anew() -> None:
    state = gpus(claim_template("costly", gpu_request(count=1, selectors=(nested(0),))))
    assert isinstance(decide(state, dra_pod("p", templates=("costly",))), Denied)
    job = state.inventory.devices.take(PIECE)
    assert job is not None
    state.inventory.devices.give_back(job)  # its process died
    assert not state.inventory.devices.deferred()
    assert isinstance(as_served(state, dra_pod("p", templates=("costly",))), Allowed)


# Cheap selectors of the CEL property test's grammar, over its devices' kinds of values: on the loop
# at 1,000 devices they are answered on the spot, as offline, never deferred nor refused for cost.
GRAMMAR_SLICE = resource_slice("g", "NVIDIA H200", 0, name="g")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=selectors(), kind=st.sampled_from(["gpu", "hami-gpu"]))
def test_cheap_generated_selectors_are_never_deferred_nor_refused_for_their_cost(
    drawn: tuple[Any, str], kind: str
) -> None:
    _, text = drawn
    template = claim_template("t", gpu_request(count=1, selectors=(text,)))
    served, offline = gpus(template), gpus(template, serving=False)
    assert all(program(text).cost(d) <= 1_000 for d in served.inventory.devices._published())
    missed = served.inventory.devices.missed
    answer = decide(served, dra_pod("p", templates=("t",)))
    assert served.inventory.devices.missed == missed, answer
    assert answer == decide(offline, dra_pod("p", templates=("t",)))
    assert "cost" not in getattr(answer, "message", "")

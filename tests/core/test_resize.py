"""In-place resize (``pods/resize``, GA in Kubernetes 1.35) under the CPU/memory check: what a
resize adds to a pod's CPU and memory requests must fit its queue's capability, as ResourceQuota
checks a resize (the new requests less the old); a resize that lowers or keeps them passes. What
an admitted resize adds is held until the cache sees the pod resized, and from then the cache
charges the pod its new requests (its card charge stays fixed: SPEC §4b)."""

import copy
from typing import Any

import pytest

from tests.builders import H200, request
from tests.core.test_capability import CHECK, UNLIMITED, cpu_pod, decide, state_with
from webhook.core.decide import admission
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model.cards import UNIT, CardName
from webhook.core.model.objects import pod_record
from webhook.core.model.policy import Policy
from webhook.core.model.verdicts import Allowed, Denied

GiB = 2**30


def running(name: str, cpu: str = "1", memory: str = "2Gi", card: str | None = None) -> dict[str, Any]:
    return cpu_pod(name, cpu, memory, card=card, phase="Running", node_name="h0" if card else "c0")


RUNNING = [running(f"r{i}") for i in range(3)]  # 3 of the 4 cpu, 6Gi of the 8Gi


def resized(obj: dict[str, Any], cpu: str | None = None, memory: str | None = None) -> dict[str, Any]:
    """``obj`` as a resize leaves it: its container asks ``cpu`` and ``memory`` instead."""
    out = copy.deepcopy(obj)
    asked = out["spec"]["containers"][0]["resources"]["requests"]
    asked.update({k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None})
    return out


def resize(
    state: ClusterState, old: dict[str, Any], new: dict[str, Any], *, dry_run: bool = False
) -> Allowed | Denied:
    req = request(new, operation="UPDATE", old=old, sub="resize", dry_run=dry_run)
    decision = admission.validate(state, req, 0.0)
    admission.admit(state, req, decision, 0.0)
    assert isinstance(decision, Allowed | Denied)
    return decision


@pytest.mark.parametrize(
    ("policy", "capability", "cpu", "memory", "message"),
    [
        pytest.param(
            CHECK,
            {},
            "3",
            None,
            'queue "q" has 1 cpu left (capability 4: 3 requested by its pods); resize of pod ns/r0 from 1'
            " to 3 cpu needs 2 cpu more",
            id="cpu over the capability",
        ),
        pytest.param(CHECK, {}, "2", None, None, id="cpu up to the capability"),
        pytest.param(
            CHECK,
            {},
            None,
            "5Gi",
            'queue "q" has 2Gi memory left (capability 8Gi: 6Gi requested by its pods); resize of pod'
            " ns/r0 from 2Gi to 5Gi memory needs 3Gi memory more",
            id="memory over the capability",
        ),
        pytest.param(CHECK, {}, None, "4Gi", None, id="memory up to the capability"),
        pytest.param(CHECK, {"cpu": "2", "memory": "8Gi"}, "500m", None, None, id="lowered in a queue over"),
        pytest.param(
            CHECK,
            {"cpu": "2", "memory": "8Gi"},
            "1500m",
            None,
            'queue "q" has 0 cpu left (capability 2: 3 requested by its pods); resize of pod ns/r0 from 1'
            " to 1.5 cpu needs 500m cpu more",
            id="raised in a queue over",
        ),
        pytest.param(CHECK, {}, "1", "2Gi", None, id="kept"),
        pytest.param(
            CHECK,
            {},
            "500m",
            "5Gi",
            'queue "q" has 2Gi memory left (capability 8Gi: 6Gi requested by its pods); resize of pod'
            " ns/r0 from 2Gi to 5Gi memory needs 3Gi memory more",
            id="cpu lowered, memory raised past",
        ),
        pytest.param(Policy(), {}, "3", "5Gi", None, id="check off: not counted"),
        pytest.param(
            CHECK,
            {"memory": "8Gi"},
            "2",
            None,
            'queue "q" sets no cpu in spec.capability, so it admits no pod that requests cpu (the'
            " CPU/memory check counts a missing resource as 0); resize of pod ns/r0 from 1 to 2 cpu"
            " needs 1 cpu more",
            id="a capability without cpu",
        ),
    ],
)
def test_a_resize_is_checked_for_what_it_adds(
    policy: Policy, capability: dict[str, str], cpu: str | None, memory: str | None, message: str | None
) -> None:
    state = state_with(*RUNNING, policy=policy, **capability)
    decision = resize(state, RUNNING[0], resized(RUNNING[0], cpu, memory))
    if message is None:
        assert isinstance(decision, Allowed), decision
    else:
        assert isinstance(decision, Denied) and decision.message == message
        assert decision.queue == "q"


@pytest.mark.parametrize(
    ("policy", "card", "refused"),
    [
        pytest.param(CHECK, None, True, id="a CPU pod"),
        pytest.param(CHECK, H200, True, id="a card pod is charged"),
        pytest.param(UNLIMITED, H200, False, id="cardUnlimitedCpuMemory: a card pod is not"),
        pytest.param(UNLIMITED, None, True, id="cardUnlimitedCpuMemory spares only card pods"),
    ],
)
def test_a_resize_is_counted_as_the_pod_is(policy: Policy, card: str | None, refused: bool) -> None:
    pod = running("p", card=card)
    state = state_with(*RUNNING[:2], pod, policy=policy)
    assert isinstance(resize(state, pod, resized(pod, "4")), Denied if refused else Allowed)
    assert isinstance(resize(state, pod, resized(pod, "2")), Allowed)


def test_another_schedulers_pod_is_never_counted() -> None:
    pod = cpu_pod("other", "1", scheduler="default-scheduler", phase="Running", node_name="c0")
    state = state_with(*RUNNING, pod)
    assert isinstance(resize(state, pod, resized(pod, "8")), Allowed)


def test_what_a_resize_adds_is_held_until_the_cache_sees_the_pod_resized() -> None:
    state = state_with(*RUNNING)
    grown = resized(RUNNING[0], "1500m")
    assert isinstance(resize(state, RUNNING[0], grown), Allowed)
    refused = decide(state, cpu_pod("x", "1"))
    assert isinstance(refused, Denied) and refused.message == (
        'queue "q" has 500m cpu left (capability 4: 3 requested by its pods, 500m admitted, not yet'
        " seen); pod ns/x needs 1 cpu"
    )
    state.upsert_pod(pod_record(grown))  # the cache sees it: its new request counts, the hold goes
    assert state.charged.compute_used("q") == (3500, 6 * GiB)
    assert state.ledger.held_compute("q") == (0, 0)
    refused = decide(state, cpu_pod("x", "1"))
    assert isinstance(refused, Denied) and "(capability 4: 3.5 requested by its pods)" in refused.message
    assert isinstance(decide(state, cpu_pod("y", "500m")), Allowed)


def test_two_resizes_the_cache_has_not_seen_both_count() -> None:
    state = state_with(*RUNNING)
    once = resized(RUNNING[0], "1500m")
    assert isinstance(resize(state, RUNNING[0], once), Allowed)
    assert isinstance(resize(state, once, resized(once, "2")), Allowed)
    assert state.ledger.held_compute("q") == (1000, 0)
    assert isinstance(resize(state, RUNNING[1], resized(RUNNING[1], "1100m")), Denied)


def test_a_dry_run_resize_holds_nothing() -> None:
    state = state_with(*RUNNING)
    for _ in range(3):
        assert isinstance(resize(state, RUNNING[0], resized(RUNNING[0], "2"), dry_run=True), Allowed)
    assert state.ledger.held_compute("q") == (0, 0)


def test_the_cache_charges_a_resized_pod_its_new_requests_and_keeps_its_card_charge() -> None:
    card_pod = running("g", "1", "1Gi", card=H200)
    state = state_with(card_pod)
    assert state.charged.compute_used("q") == (1000, GiB)
    state.upsert_pod(pod_record(resized(card_pod, "3", "4Gi")))
    assert state.charged.compute_used("q") == (3000, 4 * GiB)
    assert queue_usage(state, "q").card(CardName(H200)).used // UNIT == 1
    state.upsert_pod(pod_record(resized(card_pod, "250m")))
    assert state.charged.compute_used("q") == (250, GiB)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(
            "NaN",
            "pods/resize ns/r0 is malformed: spec.containers[0].resources.requests.cpu: quantity 'NaN' is"
            " not a Kubernetes quantity",
            id="not a quantity",
        ),
        pytest.param("2", None, id="a quantity"),
    ],
)
def test_a_resize_in_an_odd_shape_is_a_clear_denial(value: str, message: str | None) -> None:
    state = state_with(*RUNNING)
    decision = resize(state, RUNNING[0], resized(RUNNING[0], value))
    if message is None:
        assert isinstance(decision, Allowed)
    else:
        assert isinstance(decision, Denied) and decision.message == message

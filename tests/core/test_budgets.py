"""PodDisruptionBudgets judged for a gang evicted whole, against the API server's procedure played
one eviction at a time (``pkg/registry/core/pod/storage/eviction.go``)."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.model import budgets
from webhook.core.model.budgets import Member

APPS = ("a", "b", "c")


def pdb(name: str, selector: Any, allowed: int, stale: bool = False, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "generation": 2},
        "spec": {"selector": selector, **spec},
        "status": {"disruptionsAllowed": allowed, "observedGeneration": 1 if stale else 2},
    }


def one_by_one(members: list[Member], objects: list[dict[str, Any]]) -> bool:
    """The API server's procedure, eviction after eviction, each taking one of its budget's
    disruptions (only matchLabels selectors here: the test's own matching)."""
    left = {o["metadata"]["name"]: o["status"]["disruptionsAllowed"] for o in objects}
    for pod in members:
        if pod.phase != "Running" or pod.deleting:
            continue  # Pending, finished or being deleted: budgets are not asked
        covering = [
            o
            for o in objects
            if all(pod.labels.get(k) == v for k, v in o["spec"]["selector"]["matchLabels"].items())
        ]
        if len(covering) > 1:
            return False
        if not covering:
            continue
        name = covering[0]["metadata"]["name"]
        if covering[0]["status"]["observedGeneration"] < covering[0]["metadata"]["generation"]:
            return False
        if not pod.ready and covering[0]["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            continue
        if left[name] <= 0:
            return False
        left[name] -= 1
    return True


members_st = st.lists(
    st.builds(
        Member,
        key=st.sampled_from([f"ns/p{i}" for i in range(8)]),
        labels=st.fixed_dictionaries(
            {"app": st.sampled_from(APPS)}, optional={"tier": st.sampled_from("xy")}
        ),
        phase=st.sampled_from(["Running", "Running", "Running", "Pending", "Succeeded"]),
        ready=st.booleans(),
        deleting=st.booleans().map(lambda b: b and False),
    ),
    max_size=8,
)
budgets_st = st.lists(
    st.builds(
        pdb,
        name=st.sampled_from(["x", "y", "z"]),
        selector=st.fixed_dictionaries(
            {
                "matchLabels": st.fixed_dictionaries(
                    {}, optional={"app": st.sampled_from(APPS), "tier": st.just("x")}
                )
            }
        ),
        allowed=st.integers(0, 5),
        stale=st.booleans().map(lambda b: b and False),
        unhealthyPodEvictionPolicy=st.sampled_from(["AlwaysAllow", "IfHealthyBudget"]),
    ),
    max_size=3,
    unique_by=lambda o: o["metadata"]["name"],
)


@settings(max_examples=500, deadline=None)
@given(members=members_st, objects=budgets_st)
def test_the_gang_passes_exactly_when_every_eviction_one_by_one_would(
    members: list[Member], objects: list[dict[str, Any]]
) -> None:
    said = budgets.refusal(members, objects)
    assert (said == "") == one_by_one(members, objects), said


def running(name: str, ready: bool = True, **labels: str) -> Member:
    return Member(f"ns/{name}", labels, "Running", ready, False)


GANG = [running(f"tj-{i}", job="tj") for i in range(4)]


def test_min_available_three_over_four_pods_refuses_the_gang_and_says_which_budget() -> None:
    said = budgets.refusal(GANG, [pdb("train", {"matchLabels": {"job": "tj"}}, 1, minAvailable=3)])
    assert said == (
        "PodDisruptionBudget ns/train (minAvailable 3) allows 1 disruption now; the gang would take 4"
        " (ns/tj-0, ns/tj-1, ns/tj-2, ns/tj-3)"
    )
    assert budgets.refusal(GANG, [pdb("train", {"matchLabels": {"job": "tj"}}, 4, minAvailable=0)]) == ""


def test_a_budget_not_yet_processed_and_a_pod_under_two_budgets_refuse() -> None:
    stale = pdb("train", {"matchLabels": {"job": "tj"}}, 9, stale=True)
    assert (
        budgets.refusal(GANG, [stale])
        == "PodDisruptionBudget ns/train is not yet processed by its controller"
    )
    both = [pdb("one", {"matchLabels": {"job": "tj"}}, 9), pdb("two", {}, 9)]  # {} selects every pod
    assert budgets.refusal(GANG, both).startswith(
        "pod ns/tj-0 is covered by more than one PodDisruptionBudget (ns/one, ns/two)"
    )


def test_an_unready_pod_takes_no_disruption_when_the_budget_spares_unhealthy_pods() -> None:
    gang = [running("tj-0", job="tj"), running("tj-1", ready=False, job="tj")]
    spares = pdb("train", {"matchLabels": {"job": "tj"}}, 1, unhealthyPodEvictionPolicy="AlwaysAllow")
    assert budgets.refusal(gang, [spares]) == ""
    strict = pdb("train", {"matchLabels": {"job": "tj"}}, 1)
    assert budgets.refusal(gang, [strict]) != ""
    healthy = {**strict, "status": {**strict["status"], "currentHealthy": 3, "desiredHealthy": 3}}
    assert budgets.refusal(gang, [healthy]) == ""


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        (None, {"job": "tj"}, False),  # no selector: none
        ({}, {"job": "tj"}, True),  # policy/v1: an empty selector selects every pod
        ({"matchLabels": {"job": "tj"}}, {"job": "tj", "x": "1"}, True),
        ({"matchLabels": {"job": "tj"}}, {"job": "other"}, False),
        (
            {"matchExpressions": [{"key": "job", "operator": "In", "values": ["tj", "tk"]}]},
            {"job": "tk"},
            True,
        ),
        ({"matchExpressions": [{"key": "job", "operator": "NotIn", "values": ["tj"]}]}, {"job": "tj"}, False),
        ({"matchExpressions": [{"key": "job", "operator": "NotIn", "values": ["tj"]}]}, {}, True),
        ({"matchExpressions": [{"key": "job", "operator": "Exists"}]}, {"job": ""}, True),
        ({"matchExpressions": [{"key": "job", "operator": "DoesNotExist"}]}, {"job": "tj"}, False),
        ({"matchExpressions": [{"key": "job", "operator": "In", "values": []}]}, {"job": "tj"}, None),
        ({"matchExpressions": [{"key": "job", "operator": "Near"}]}, {"job": "tj"}, None),
        ({"matchLabels": "job=tj"}, {"job": "tj"}, None),
    ],
)
def test_selectors_read_as_the_api_server_reads_them(
    selector: Any, labels: dict[str, str], selected: bool | None
) -> None:
    """None: invalid, which the API server skips (it covers nothing)."""
    assert budgets.selects(selector, labels) is selected


def test_a_budget_whose_unconfirmed_evictions_would_pass_two_thousand_refuses() -> None:
    """The API server refuses an eviction while the budget lists more than 2,000 evictions its
    controller has not seen go (``disruptedPods``), and each eviction it passes adds its pod: 1,999
    listed let two pods of the gang go and refuse the third."""
    roomy = pdb("train", {"matchLabels": {"job": "tj"}}, 9, maxUnavailable=9)
    roomy["status"]["disruptedPods"] = {f"gone-{i}": "2026-11-26T00:00:00Z" for i in range(1999)}
    assert budgets.refusal(GANG[:2], [roomy]) == ""
    assert budgets.refusal(GANG[:3], [roomy]) == (
        "PodDisruptionBudget ns/train would have more than 2,000 evictions not yet confirmed by its controller"
    )
    roomy["status"]["disruptedPods"]["gone-1999"] = "2026-11-26T00:00:00Z"
    assert budgets.refusal(GANG[:2], [roomy]) != ""
    roomy["status"]["disruptedPods"]["tj-0"] = roomy["status"]["disruptedPods"].pop("gone-1999")
    assert budgets.refusal(GANG[:2], [roomy]) == ""  # tj-0 listed already: its eviction adds none

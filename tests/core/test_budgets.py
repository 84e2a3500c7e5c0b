"""PodDisruptionBudgets judged for a gang evicted whole, against the API server's procedure played
one eviction at a time (``pkg/registry/core/pod/storage/eviction.go``)."""

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
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
    """The API server's procedure (``EvictionREST.Create``), eviction after eviction, in its order:
    a pod Pending, finished or being deleted is deleted without a look at budgets; a pod under more
    than one budget is refused; under none, evicted; an unready pod is evicted without taking a
    disruption when its budget says ``AlwaysAllow``, or (``IfHealthyBudget``, the default) when
    ``currentHealthy >= desiredHealthy > 0``; then ``checkAndDecrement``: a budget not yet
    processed (``observedGeneration < generation``) refuses, a negative ``disruptionsAllowed``
    refuses, more than 2,000 ``disruptedPods`` refuse, none allowed refuses; else one disruption
    is taken and the pod's name joins ``disruptedPods``. Only the selectors the test makes (none,
    ``{}``, ``matchLabels``) are matched, by the test's own reading."""
    left = {o["metadata"]["name"]: o["status"]["disruptionsAllowed"] for o in objects}
    disrupted = {o["metadata"]["name"]: set(o["status"].get("disruptedPods", {})) for o in objects}
    for pod in members:
        if pod.phase in ("Pending", "Succeeded", "Failed") or pod.deleting:
            continue
        covering = [o for o in objects if matches(o["spec"]["selector"], pod.labels)]
        if len(covering) > 1:
            return False
        if not covering:
            continue
        budget = covering[0]
        name, spec, status = budget["metadata"]["name"], budget["spec"], budget["status"]
        if not pod.ready:
            if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
                continue
            healthy, desired = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
            if healthy >= desired and desired > 0:
                continue
        if status.get("observedGeneration", 0) < budget["metadata"]["generation"]:
            return False
        if left[name] < 0 or len(disrupted[name]) > 2000 or left[name] == 0:
            return False
        left[name] -= 1
        disrupted[name].add(pod.key.split("/")[1])
    return True


def matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """policy/v1: no selector selects no pod; ``{}`` (or an empty ``matchLabels``) every pod."""
    if selector is None:
        return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


members_st = st.lists(
    st.builds(
        Member,
        key=st.sampled_from([f"ns/p{i}" for i in range(8)]),
        labels=st.fixed_dictionaries(
            {"app": st.sampled_from(APPS)}, optional={"tier": st.sampled_from("xy")}
        ),
        phase=st.sampled_from(["Running", "Running", "Running", "Unknown", "Pending", "Succeeded", "Failed"]),
        ready=st.booleans(),
        deleting=st.sampled_from([False, False, False, True]),
    ),
    max_size=8,
    unique_by=lambda m: m.key,
)


class Disrupted(Mapping[str, str]):
    """A budget's ``status.disruptedPods``: ``backlog`` pods evicted elsewhere and the gang's pods
    ``seen`` (their names), each as evicted now; shown short when an example is printed."""

    def __init__(self, backlog: int, seen: tuple[str, ...]) -> None:
        self.backlog, self.seen = backlog, seen
        self.pods = dict.fromkeys([*(f"gone-{i}" for i in range(backlog)), *seen], "2026-11-26T00:00:00Z")

    def __getitem__(self, key: str) -> str:
        return self.pods[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.pods)

    def __len__(self) -> int:
        return len(self.pods)

    def __repr__(self) -> str:
        return f"Disrupted({self.backlog}, {self.seen})"


@st.composite
def budget_objects(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A PodDisruptionBudget as the API server shows it: its selector (none, ``{}`` or labels), its
    policy for unready pods (unset, ``IfHealthyBudget``, ``AlwaysAllow``), its status processed or
    not yet, the disruptions it allows (negative too), its healthy counts (or none yet) and the
    evictions it has not yet seen go (about 2,000 of them at times, a gang pod's name among them)."""
    selector = draw(
        st.one_of(
            st.none(),
            st.just({}),
            st.fixed_dictionaries(
                {
                    "matchLabels": st.fixed_dictionaries(
                        {}, optional={"app": st.sampled_from(APPS), "tier": st.just("x")}
                    )
                }
            ),
        )
    )
    spec: dict[str, Any] = {}
    policy = draw(st.sampled_from([None, "IfHealthyBudget", "AlwaysAllow"]))
    if policy is not None:
        spec["unhealthyPodEvictionPolicy"] = policy
    made = pdb(name, selector, draw(st.integers(-1, 4)), stale=draw(st.booleans()), **spec)
    status = made["status"]
    if draw(st.booleans()):
        status["currentHealthy"], status["desiredHealthy"] = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    backlog = draw(st.sampled_from([0, 0, 0, 1999, 2000, 2001]))
    if backlog or draw(st.booleans()):
        seen = draw(st.lists(st.sampled_from([f"p{i}" for i in range(8)]), max_size=3, unique=True))
        status["disruptedPods"] = Disrupted(backlog, tuple(seen))
    return made


budgets_st = st.lists(st.sampled_from("xyz"), max_size=3, unique=True).flatmap(
    lambda names: st.tuples(*(budget_objects(n) for n in names)).map(list)
)


@example(  # one budget over two gangs allowing one disruption: the first goes, the second not
    members=[
        Member("ns/p0", {"app": "a"}, "Running", True, False),
        Member("ns/p1", {"app": "a"}, "Running", True, False),
    ],
    objects=[pdb("x", {}, 1)],
    split=1,
)
@settings(max_examples=1000, deadline=None)
@given(members=members_st, objects=budgets_st, split=st.integers(0, 8))
def test_the_gang_passes_exactly_when_every_eviction_one_by_one_would(
    members: list[Member], objects: list[dict[str, Any]], split: int
) -> None:
    """The gang is ``members[split:]``; the pods before it are another gang of the same reclaim,
    judged already (and passed), whose evictions go first."""
    going, gang = members[:split], members[split:]
    assume(one_by_one(going, objects))
    said = budgets.refusal(gang, objects, going)
    assert (said == "") == one_by_one(going + gang, objects), said


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
    # Spared before the budget's status is asked: an unready pod goes under a budget not yet
    # processed, a ready one does not.
    stale = pdb(
        "train", {"matchLabels": {"job": "tj"}}, 1, stale=True, unhealthyPodEvictionPolicy="AlwaysAllow"
    )
    assert budgets.refusal(gang[1:], [stale]) == ""
    assert budgets.refusal(gang, [stale]) != ""


def test_a_pod_being_deleted_or_finished_asks_no_budget() -> None:
    going = Member("ns/tj-0", {"job": "tj"}, "Running", True, deleting=True)
    failed = Member("ns/tj-1", {"job": "tj"}, "Failed", False, False)
    closed = pdb("train", {"matchLabels": {"job": "tj"}}, 0, stale=True)
    assert budgets.refusal([going, failed], [closed, pdb("again", {}, 0)]) == ""
    assert budgets.refusal([going, failed, running("tj-2", job="tj")], [closed]) != ""


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

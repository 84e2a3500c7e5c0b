"""Who may use a queue (decisions.md §31): a Queue's ``cardquota.volcano.sh/namespaces`` selects the
namespaces that may charge it; every write that would charge it from another is refused naming the
queue, the rule and the namespace, and its twin from a selected namespace passes."""

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.builders import H200, cluster, deployment, node, pod, podgroup, queue, request, statefulset, vcjob
from webhook.core.decide import admission, report
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.selector import SelectorError, parse_selector
from webhook.core.model.verdicts import Allowed, Denied

RULE = "team in (ml,vision),!sandbox"


def restricted(rule: str = RULE) -> dict[str, Any]:
    obj = queue("q", json.dumps({H200: 4}))
    obj["metadata"]["annotations"][keys.NAMESPACES] = rule
    return obj


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def state_with(*extra: dict[str, Any]) -> ClusterState:
    return cluster(
        node("h200", H200),
        restricted(),
        namespace("ns", team="ml"),
        namespace("other", team="web"),
        namespace("sandbox", team="ml", sandbox="yes"),
        *extra,
    )


def in_ns(obj: dict[str, Any], where: str) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["namespace"] = where
    obj["metadata"]["uid"] = f"{obj['metadata'].get('uid', 'uid')}-{where}"
    return obj


WHY = f"its {keys.NAMESPACES} ('{RULE}') does not select namespace"


@pytest.mark.parametrize("where", ["other", "sandbox", "unseen"])
def test_a_pod_from_a_namespace_the_queue_does_not_select_is_refused_naming_all(where: str) -> None:
    decision = admission.validate(state_with(), request(in_ns(pod("p"), where)), 0.0)
    assert isinstance(decision, Denied)
    assert decision.message == (
        f'queue "q" may not be used from namespace {where}: {WHY} {where}; pod {where}/p needs 1 {H200}'
        " (name a queue your namespace may use)"
    )


def test_its_twin_from_a_selected_namespace_fits() -> None:
    assert isinstance(admission.validate(state_with(), request(pod("p")), 0.0), Allowed)


def test_a_namespace_the_cache_has_not_seen_is_judged_by_its_name() -> None:
    state = cluster(node("h200", H200), restricted("kubernetes.io/metadata.name in (fresh)"))
    assert isinstance(admission.validate(state, request(in_ns(pod("p"), "fresh")), 0.0), Allowed)
    assert isinstance(admission.validate(state, request(in_ns(pod("p"), "stale")), 0.0), Denied)


def test_a_namespace_relabelled_out_of_the_rule_is_refused_from_then_on() -> None:
    state = state_with()
    ingest.upsert(state, namespace("ns", team="web"))
    assert isinstance(admission.validate(state, request(pod("p")), 0.0), Denied)


def scale(name: str, where: str, old: int, new: int) -> Any:
    def of(replicas: int) -> dict[str, Any]:
        return {
            "kind": "Scale",
            "metadata": {"name": name, "namespace": where},
            "spec": {"replicas": replicas},
        }

    return request(
        of(new), resource="statefulsets", operation="UPDATE", old=of(old), sub="scale", group="apps"
    )


@pytest.mark.parametrize(("where", "allowed"), [("ns", True), ("other", False)])
def test_workloads_scale_ups_podgroups_and_volcano_jobs_from_elsewhere_are_refused(
    where: str, allowed: bool
) -> None:
    state = state_with(in_ns(statefulset("api", 1), where))
    made = admission.validate(
        state, request(in_ns(deployment("web", 2), where), resource="deployments", group="apps"), 0.0
    )
    group = in_ns(podgroup("train", "Pending", json.dumps({H200: 2})), where)
    created = admission.validate(
        state, request(group, resource="podgroups", group="scheduling.volcano.sh"), 0.0
    )
    job = in_ns(vcjob("train", [(2, pod("t"))]), where)
    written = admission.validate(state, request(job, resource="jobs", group="batch.volcano.sh"), 0.0)
    scaled = admission.validate(state, scale("api", where, 1, 2), 0.0)
    for decision in (made, created, written, scaled):
        assert isinstance(decision, Allowed) is allowed, decision
        if not allowed:
            assert (
                isinstance(decision, Denied) and f"may not be used from namespace {where}" in decision.message
            )


def test_a_queue_whose_rule_does_not_parse_is_refused_at_its_write_and_its_twin_passes() -> None:
    state = state_with()
    bad = admission.validate(
        state, request(restricted("team in (ml"), resource="queues", group="scheduling.volcano.sh"), 0.0
    )
    assert isinstance(bad, Denied) and "has a malformed cardquota.volcano.sh/namespaces" in bad.message
    good = admission.validate(
        state, request(restricted(), resource="queues", group="scheduling.volcano.sh"), 0.0
    )
    assert isinstance(good, Allowed)


def test_status_says_which_queues_are_restricted_and_that_the_others_are_open_to_all() -> None:
    state = cluster(node("h200", H200), restricted(), queue("open", json.dumps({H200: 1})))
    status = report.cluster_status(state)
    assert status["namespaces"] == {"open": "all namespaces", "q": RULE}
    table = report.status_table(status)
    assert f"q                {RULE}" in table and "every other queue: open to all namespaces" in table


# ---- the selector, against an oracle of its own ------------------------------------------------
KEYS = ["team", "env", "example.com/tier"]
VALUES = ["a", "b", "c"]


def oracle(requirements: list[tuple[str, str, list[str]]], labels: dict[str, str]) -> bool:
    for key, op, values in requirements:
        present = key in labels
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
        if op in ("=", "in") and labels.get(key) not in values:
            return False
        if op in ("!=", "notin") and labels.get(key) in values:
            return False
    return True


def written(key: str, op: str, values: list[str]) -> str:
    if op == "exists":
        return key
    if op == "!":
        return f"!{key}"
    if op in ("=", "!="):
        return f"{key} {op} {values[0]}"
    return f"{key} {op} ({', '.join(values)})"


requirement = st.tuples(
    st.sampled_from(KEYS),
    st.sampled_from(["exists", "!", "=", "!=", "in", "notin"]),
    st.lists(st.sampled_from(VALUES), min_size=1, max_size=3, unique=True),
)


@given(
    requirements=st.lists(requirement, min_size=1, max_size=4),
    labels=st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES)),
)
def test_a_selector_selects_exactly_what_its_requirements_say(
    requirements: list[Any], labels: dict[str, str]
) -> None:
    requirements = [(k, op, vs[:1] if op in ("=", "!=") else vs) for k, op, vs in requirements]
    text = ",".join(written(*r) for r in requirements)
    assert parse_selector(text).selects(labels) == oracle(requirements, labels)


@pytest.mark.parametrize(
    "text", ["", " ", "team in (a", "team in ()", "a,,b", "team in (a,)", "-bad", "t=a b", "team notin a"]
)
def test_a_malformed_selector_says_why(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_selector(text)

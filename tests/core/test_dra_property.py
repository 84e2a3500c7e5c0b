"""A property over random mixes of device-plugin and DRA pods (SPEC §4b): pods of templates, of a
claim several pods share and of ``nvidia.com/gpu``, in two queues, created through the validating
decision as the API server would, some deleted, quotas changed. After every step: no admission left
a model of a queue over its quota, and the tallies kept step by step equal a recount of the objects
from scratch."""

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import (
    H200,
    R4090,
    claim_template,
    claiming,
    cluster,
    device_class,
    gpu_request,
    node,
    pod,
    queue,
    request,
    resource_claim,
    resource_slice,
)
from webhook.core.decide import admission
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model.cards import UNIT, CardName
from webhook.core.model.verdicts import Allowed

QUEUES = ("a", "b")
CARDS = (H200, R4090)
BASE = [
    node("dp", H200, 4),
    {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "dra"},
        "status": {"allocatable": {"cpu": "8"}},
    },
    resource_slice("dra", "NVIDIA H200", 4),
    resource_slice("dra", "NVIDIA GeForce RTX 4090", 4, name="dra-4090"),
    device_class("gpu.nvidia.com"),
    device_class("h200", card=H200),
    claim_template("one", gpu_request(count=1)),
    claim_template("two-h200", gpu_request("g", "h200", 2)),
    resource_claim("shared-a", gpu_request("g", "h200", 1)),
    resource_claim("shared-b", gpu_request("g", "h200", 2)),
]

kinds = st.sampled_from(["plugin", "template", "per-model", "shared-a", "shared-b"])
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("create"), kinds, st.sampled_from(QUEUES), st.sampled_from(CARDS), st.integers(1, 3)
        ),
        st.tuples(st.just("delete"), st.integers(0, 40)),
        st.tuples(st.just("quota"), st.sampled_from(QUEUES), st.integers(0, 6), st.integers(0, 4)),
    ),
    min_size=1,
    max_size=30,
)


def quota(h200: int, r4090: int) -> str:
    return f'{{"{H200}": {h200}, "{R4090}": {r4090}}}'


def new_pod(n: int, kind: str, queue_name: str, card: str, count: int) -> dict[str, Any]:
    name = f"p{n}"
    if kind == "plugin":
        return pod(name, card, count, queue_name=queue_name)
    if kind == "template":
        return claiming(pod(name, card, None, queue_name=queue_name), templates=("one",))
    if kind == "per-model":
        return claiming(pod(name, None, None, queue_name=queue_name), templates=("two-h200",))
    return claiming(pod(name, None, None, queue_name=queue_name), claims=(kind,))


def used(state: ClusterState, queue_name: str, card: str) -> int:
    return queue_usage(state, queue_name).card(CardName(card)).used


def tallies(state: ClusterState) -> dict[tuple[str, str], tuple[int, int]]:
    out = {}
    for q in QUEUES:
        for card in CARDS:
            use = queue_usage(state, q).card(CardName(card))
            out[(q, card)] = (use.bound + use.pending, use.quota)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_no_admission_puts_a_model_over_quota_and_tallies_equal_a_recount(steps: list[Any]) -> None:
    queues = {q: queue(q, quota(3, 2)) for q in QUEUES}
    state = cluster(*BASE, *queues.values())
    pods: list[dict[str, Any]] = []
    for n, step in enumerate(steps):
        if step[0] == "create":
            obj = new_pod(n, *step[1:])
            before = {(q, c): used(state, q, c) for q in QUEUES for c in CARDS}
            if isinstance(admission.validate(state, request(obj), float(n)), Allowed):
                ingest.upsert(state, obj)
                pods.append(obj)
                for q in QUEUES:
                    for card in CARDS:
                        if used(state, q, card) > before[(q, card)]:  # it took cards: within the quota
                            assert used(state, q, card) <= queue_usage(state, q).card(CardName(card)).quota
        elif step[0] == "delete" and pods:
            obj = pods.pop(step[1] % len(pods))
            ingest.remove(state, obj)
        elif step[0] == "quota":
            queues[step[1]] = queue(step[1], quota(step[2], step[3]))
            ingest.upsert(state, queues[step[1]])
        state.ledger.expire(float("inf"))  # the cache has seen every admitted pod
        recount = cluster(*BASE, *queues.values(), *copy.deepcopy(pods))
        assert tallies(state) == tallies(recount)
    # a claim shared by pods of a queue is charged once
    for claim, units in (("shared-a", 1), ("shared-b", 2)):
        users = [
            p
            for p in pods
            if any(r.get("resourceClaimName") == claim for r in p["spec"].get("resourceClaims", []))
        ]
        if users:
            assert state.claim_payer(f"ns/{claim}") is not None
            assert {p["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] for p in users} == {
                state.queue_of_pod(state.claim_payer(f"ns/{claim}"))  # type: ignore[arg-type]
            }
            assert units * UNIT <= sum(used(state, q, H200) for q in QUEUES)

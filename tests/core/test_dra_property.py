"""A property over random mixes of device-plugin and DRA pods (SPEC §4b), checked against the test's
own count: pods of ``nvidia.com/gpu``, of claim templates (a generic class with the pod's model, a
per-model class of 2) and of two claims several pods share, in two queues, admitted through the
validating decision and recorded in flight as the server does, arriving in the cache later, some
deleted, quotas changed, the generic template replaced by a larger one.

The test keeps its own table of what each admitted pod costs: its cards; a template's count as it
was when the pod was admitted; a shared claim once, to the queue of its first pod, while any of its
pods lives. After every step: a create was admitted exactly when that table says it fits (and a pod
naming a claim another queue holds was refused), and the webhook's usage of every queue and model
equals the table, in flight or not."""

from dataclasses import dataclass, field
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
SHARED = {"shared-a": 1, "shared-b": 2}  # claim -> H200 it holds
BASE = [
    node("dp", H200, 8),
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
    claim_template("two-h200", gpu_request("g", "h200", 2)),
    *(resource_claim(name, gpu_request("g", "h200", n)) for name, n in SHARED.items()),
]
KINDS = ("plugin", "template", "per-model", *SHARED)

steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("create"),
            st.sampled_from(KINDS),
            st.sampled_from(QUEUES),
            st.sampled_from(CARDS),
            st.integers(1, 3),
        ),
        st.tuples(st.just("arrive"), st.integers(0, 40)),
        st.tuples(st.just("delete"), st.integers(0, 40)),
        st.tuples(st.just("quota"), st.sampled_from(QUEUES), st.integers(0, 6), st.integers(0, 4)),
        st.tuples(st.just("template"), st.integers(1, 2)),
    ),
    min_size=1,
    max_size=30,
)


@dataclass
class Admitted:
    obj: dict[str, Any]
    queue: str
    card: str
    cards: int  # what it costs on its own (a shared claim's pods: 0, the claim is counted apart)
    claim: str = ""  # the shared claim it names
    arrived: bool = False


@dataclass
class Table:
    """The test's own count of what every admitted pod costs."""

    pods: dict[str, Admitted] = field(default_factory=dict)

    def claim_queue(self, claim: str) -> str | None:
        """The queue a shared claim is charged to: its first pod's, while any lives."""
        return next((p.queue for p in self.pods.values() if p.claim == claim), None)

    def used(self, q: str, card: str) -> int:
        mine = sum(p.cards for p in self.pods.values() if p.queue == q and p.card == card)
        shared = sum(n for claim, n in SHARED.items() if card == H200 and self.claim_queue(claim) == q)
        return mine + shared


def quota_text(h200: int, r4090: int) -> str:
    return f'{{"{H200}": {h200}, "{R4090}": {r4090}}}'


def template(count: int) -> dict[str, Any]:
    return claim_template("one", gpu_request(count=count))


def new_pod(n: int, kind: str, q: str, card: str, count: int, one: int) -> tuple[dict[str, Any], Admitted]:
    name = f"p{n}"
    if kind == "plugin":
        return pod(name, card, count, queue_name=q), Admitted({}, q, card, count)
    if kind == "template":
        obj = claiming(
            pod(name, None, None, queue_name=q, annotations={"cardquota.volcano.sh/card": card}),
            templates=("one",),
        )
        return obj, Admitted({}, q, card, one)
    if kind == "per-model":
        return claiming(pod(name, None, None, queue_name=q), templates=("two-h200",)), Admitted(
            {}, q, H200, 2
        )
    return claiming(pod(name, None, None, queue_name=q), claims=(kind,)), Admitted({}, q, H200, 0, claim=kind)


def webhook_used(state: ClusterState, q: str, card: str) -> int:
    use = queue_usage(state, q).card(CardName(card))
    assert use.used % UNIT == 0
    return use.used // UNIT


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_admissions_and_usage_follow_the_tests_own_count(steps: list[Any]) -> None:
    quotas = {q: (3, 2) for q in QUEUES}
    one = 1  # the generic template's count now
    state = cluster(*BASE, template(one), *(queue(q, quota_text(*quotas[q])) for q in QUEUES))
    table = Table()
    for n, step in enumerate(steps):
        now = float(n)
        if step[0] == "create":
            obj, cost = new_pod(n, *step[1:], one)
            ask = cost.cards + (
                SHARED[cost.claim] if cost.claim and table.claim_queue(cost.claim) is None else 0
            )
            other = cost.claim and table.claim_queue(cost.claim) not in (None, cost.queue)
            limit = quotas[cost.queue][CARDS.index(cost.card)]
            # a pod that adds nothing (its claim is its queue's already) fits even over the quota
            fits = not other and (ask == 0 or table.used(cost.queue, cost.card) + ask <= limit)
            req = request(obj)
            decision = admission.validate(state, req, now)
            admission.admit(state, req, decision, now)
            assert isinstance(decision, Allowed) == fits, (
                step,
                decision,
                table.used(cost.queue, cost.card),
                limit,
            )
            if isinstance(decision, Allowed):
                cost.obj = obj
                if cost.claim and table.claim_queue(cost.claim) is not None:
                    # Not its claim's payer: it holds nothing in flight, so the cache is to see it
                    # before the payer may go (the window left open: docs/decisions.md §27).
                    ingest.upsert(state, obj)
                    cost.arrived = True
                table.pods[obj["metadata"]["name"]] = cost
        elif step[0] == "arrive" and (waiting := [p for p in table.pods.values() if not p.arrived]):
            p = waiting[step[1] % len(waiting)]
            ingest.upsert(state, p.obj)
            p.arrived = True
        elif step[0] == "delete" and (here := [p for p in table.pods.values() if p.arrived]):
            p = here[step[1] % len(here)]
            ingest.remove(state, p.obj)
            del table.pods[p.obj["metadata"]["name"]]
        elif step[0] == "quota":
            quotas[step[1]] = (step[2], step[3])
            ingest.upsert(state, queue(step[1], quota_text(step[2], step[3])))
        elif step[0] == "template" and all(p.arrived for p in table.pods.values()):
            one = step[1]  # pods charged for the template before keep what they were admitted with
            ingest.upsert(state, template(one))
        for q in QUEUES:
            for card in CARDS:
                assert webhook_used(state, q, card) == table.used(q, card), (q, card, step)

"""``cardquota headroom``: how many more replicas of a workload fit now, and what stops the next one.

The answer is the validating webhook's own: N is the largest scale-up the webhook admits now (the
HPA's ``deployments/scale`` write from the current replicas to current + N), found by doubling then
bisecting, so N is admitted and N + 1 is denied by the same decision a scale-up would get; the
denial at N + 1 says what holds it back. Nothing is recorded. A workload not created yet is asked as
a Deployment scaled from 0 (``--queue Q --card SPEC --per-pod N``); so is each card task of a
Volcano Job (how many more of its pods fit beyond what the job holds; an ``A|B`` task's, once a pod
of it is given a model, on that model alone, as all its pods are). For an ``A|B`` spec the
answer also says how many would fit on each model alone. On a model its queue lends and borrows in
its cohort (``card.deserved``), it says how many of those fit within the queue's deserved and how
many more with what its cohort lends now; for an ``A|B`` spec, of the pods the pod mutation would
give that model, each pod on one model, never two.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import orjson

from webhook.core.decide import admission, assignment
from webhook.core.decide.report import cluster_status
from webhook.core.index import cohorts
from webhook.core.index.state import ClusterState
from webhook.core.model.cards import CardName
from webhook.core.model.demand import PodDemand, pod_demand
from webhook.core.model.objects import PodTemplate, pod_template_of
from webhook.core.model.verdicts import Allowed, Denied, Request
from webhook.errors import ConfigError

KINDS = {
    "deployment": ("deployments", "Deployment"),
    "statefulset": ("statefulsets", "StatefulSet"),
    "replicaset": ("replicasets", "ReplicaSet"),
}
VOLCANO_JOB = ("job", "vcjob", "volcanojob")
REF = "deployment|statefulset|replicaset|vcjob/NAMESPACE/NAME"
CAP = 100_000  # more than any queue's quota holds; reached only by a workload without card demand


@dataclass
class Headroom:
    target: str
    replicas: int
    more: int | None  # None: card quota does not limit it
    reason: str  # the denial at more + 1, or why nothing limits it
    limited_by: str = ""  # the queue that denies one more: its own, or an ancestor
    cards: dict[str, dict[str, int]] = field(default_factory=dict)  # the queue's figures per card
    per_model: dict[str, int | None] = field(default_factory=dict)  # A|B: how many on each model alone
    lending: dict[str, dict[str, Any]] = field(default_factory=dict)  # a model lent and borrowed: see _lent
    # its queue's enforcement (decisions.md §34): the figures are what deny admits; past them a
    # queue that warns or audits admits too, telling it
    enforcement: str = "deny"

    def as_json(self) -> dict[str, Any]:
        return {
            "workload": self.target,
            "replicas": self.replicas,
            "more": self.more,
            "reason": self.reason,
            "limited_by": self.limited_by,
            "cards": self.cards,
            "per_model": self.per_model,
            "lending": self.lending,
            "enforcement": self.enforcement,
        }


def of_ref(state: ClusterState, ref: str, now: float) -> list[Headroom]:
    """``KIND/NAMESPACE/NAME``: one answer for a Deployment, StatefulSet or ReplicaSet, one per card
    task for a Volcano Job."""
    kind_text, _, rest = ref.partition("/")
    namespace, _, name = rest.partition("/")
    if kind_text.lower() in VOLCANO_JOB and namespace and name:
        return of_job(state, namespace, name, now)
    return [of_workload(state, ref, now)]


def of_job(state: ClusterState, namespace: str, name: str, now: float) -> list[Headroom]:
    job = state.workloads.get("Job", namespace, name)
    if job is None:
        raise ConfigError(f"volcano job {namespace}/{name} is not in the cluster")
    answers = []
    queue = state.template_queue(job).queue  # every task runs in the job's PodGroup's queue
    for task in job.tasks:
        demand = pod_demand(task.template, state.inventory, state.policy)
        if not isinstance(demand, PodDemand):
            continue
        target = f"volcano job {namespace}/{name} task {task.name or '-'}"
        limits = _limits(task.template)
        spec = demand.spec.text
        model = (
            assignment.task_model(state, job.uid, f"{job.uid}/{task.name}", demand)
            if demand.spec.is_multi
            else None
        )
        if model is not None:  # an A|B task's pods all follow the model its first was given
            spec, target = model, f"{target} (its pods on {model})"
        answer = of_new(state, queue, spec, 1, now, target=target, limits=limits)
        answer.replicas = task.replicas
        answers.append(answer)
    if not answers:
        raise ConfigError(f"volcano job {namespace}/{name} has no task that uses cards")
    return answers


def of_workload(state: ClusterState, ref: str, now: float) -> Headroom:
    """``KIND/NAMESPACE/NAME`` of a Deployment, StatefulSet or ReplicaSet the state holds."""
    kind_text, _, rest = ref.partition("/")
    namespace, _, name = rest.partition("/")
    if kind_text.lower() not in KINDS or not namespace or not name:
        raise ConfigError(f"expected {REF}, got {ref!r}")
    resource, kind = KINDS[kind_text.lower()]
    workload = state.workloads.get(kind, namespace, name)
    if workload is None:
        raise ConfigError(f"{kind.lower()} {namespace}/{name} is not in the cluster")
    if kind == "ReplicaSet" and workload.owner is not None and workload.owner.kind == "Deployment":
        raise ConfigError(
            f"replicaset {namespace}/{name} belongs to deployment {namespace}/{workload.owner.name}: "
            "ask for the deployment"
        )

    def scale(more: int) -> Request:
        replicas = workload.replicas + more
        return Request(
            uid="headroom",
            kind="Scale",
            group="autoscaling",
            resource=resource,
            sub_resource="scale",
            operation="UPDATE",
            namespace=namespace,
            name=name,
            dry_run=True,
            obj={
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": replicas},
            },
            old_obj={
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": workload.replicas},
            },
        )

    annotations = workload.tasks[0].template.annotations
    queue = state.template_queue(workload).queue
    target = f"{kind.lower()} {namespace}/{name}"
    mode = state.enforcement(queue)
    with state.enforcing():
        answer = _search(state, target, workload.replicas, scale, queue, now)
        answer.enforcement = mode
        demand = pod_demand(workload.tasks[0].template, state.inventory, state.policy)
        if isinstance(demand, PodDemand):
            limits = _limits(workload.tasks[0].template)
            answer.per_model = _per_model(state, queue, demand.spec.cards, now, limits)
            _lent(state, queue, workload.tasks[0].template, demand, answer)
    return _only(answer, annotations.get("volcano.sh/card.name", ""))


def _lent(
    state: ClusterState, queue: str, template: PodTemplate, demand: PodDemand, answer: Headroom
) -> None:
    """For each model of ``demand`` that ``queue`` lends and borrows in its cohort: how many of the
    pods that fit (for an ``A|B`` spec, those of them the pod mutation would give that model, each
    pod one: ``assignment.spread``) fit within its deserved, and how many more with what its cohort
    lends now, and which queues lend it then (most first)."""
    if answer.more is None:
        return
    placed = {demand.spec.cards[0]: answer.more}
    if demand.spec.is_multi:
        placed = assignment.spread(state, queue, template, demand, answer.more)
    for card, more in placed.items():
        found = cohorts.share(state, queue, card)
        if found is None:
            continue
        per_pod = demand.count_on(card, state.inventory)
        room = max(0, found.deserved - cohorts.load(state, queue, card))
        within = min(more, room // per_pod) if per_pod else more
        answer.lending[card] = {
            "within_deserved": within,
            "borrowing": more - within,
            "lenders": list(cohorts.lenders(state, queue, card)) if more > within else [],
        }


def _limits(template: PodTemplate) -> dict[str, str]:
    """A template's card and sharing requests again as quantities (limits over requests)."""
    parsed = {**template.resources.requests, **template.resources.limits}
    return {name: _quantity(value) for name, value in parsed.items()}


def _quantity(value: Fraction | int) -> str:
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{math.ceil(value * 1000)}m"


def _per_model(
    state: ClusterState, queue: str, cards: tuple[CardName, ...], now: float, limits: dict[str, str]
) -> dict[str, int | None]:
    """For a multi-card spec: how many more pods would fit on each model alone."""
    if len(cards) < 2:
        return {}
    return {card: of_new(state, queue, card, 1, now, per_model=False, limits=limits).more for card in cards}


def of_new(
    state: ClusterState,
    queue: str,
    card: str,
    per_pod: int,
    now: float,
    target: str = "",
    per_model: bool = True,
    limits: dict[str, str] | None = None,
) -> Headroom:
    """A Deployment not created yet: pods of ``per_pod`` cards ``card`` in ``queue`` (or pods asking
    ``limits``: a Volcano Job task's, a shared GPU's)."""
    if per_pod < 1:
        raise ConfigError(f"--per-pod must be at least 1, got {per_pod}")
    first = card.split("|")[0].strip()
    resource = state.inventory.resource(CardName(first)) or state.policy.default_resource
    template = {
        "metadata": {
            "annotations": {"volcano.sh/card.name": card, "scheduling.volcano.sh/queue-name": queue}
        },
        "spec": {
            "containers": [
                {"name": "c", "image": "i", "resources": {"limits": limits or {resource: str(per_pod)}}}
            ]
        },
    }

    def deployment(replicas: int) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "headroom", "namespace": "headroom"},
            "spec": {"replicas": replicas, "template": template},
        }

    def scale(more: int) -> Request:
        return Request(
            uid="headroom",
            kind="Deployment",
            group="apps",
            resource="deployments",
            sub_resource="",
            operation="UPDATE",
            namespace="headroom",
            name="headroom",
            dry_run=True,
            obj=deployment(more),
            old_obj=deployment(0),
        )

    target = target or f"a new workload of {per_pod} {card} per pod in queue {queue!r}"
    mode = state.enforcement(queue)
    with state.enforcing():  # what deny admits; the mode is told beside it
        answer = _search(state, target, 0, scale, queue, now)
        answer.enforcement = mode
        if answer.more is not None:  # the asking Deployment is a device: say "N more pods"
            n = answer.more + 1
            asked = f"scale-up of deployment headroom/headroom from 0 to {n} replicas"
            answer.reason = answer.reason.replace(asked, f"{n} more pod{'s' if n > 1 else ''}")
        if per_model:
            models = tuple(CardName(part.strip()) for part in card.split("|"))
            answer.per_model = _per_model(state, queue, models, now, limits or {resource: str(per_pod)})
            made = pod_template_of(template, "headroom")
            demand = pod_demand(made, state.inventory, state.policy)
            if isinstance(demand, PodDemand):
                _lent(state, queue, made, demand, answer)
    return _only(answer, card)


def _search(
    state: ClusterState, target: str, replicas: int, scale: Callable[[int], Request], queue: str, now: float
) -> Headroom:
    def admitted(more: int) -> Allowed | Denied:
        decision = admission.validate(state, scale(more), now)
        assert isinstance(decision, Allowed | Denied)
        return decision

    first = admitted(1)
    if isinstance(first, Denied):
        return _with_cards(state, Headroom(target, replicas, 0, first.message, first.queue), queue)
    low, high = 1, 2
    while high <= CAP and isinstance(admitted(high), Allowed):
        low, high = high, high * 2
    if high > CAP:
        return _with_cards(state, Headroom(target, replicas, None, first.reason), queue)
    while high - low > 1:  # admitted at low, denied at high
        middle = (low + high) // 2
        low, high = (middle, high) if isinstance(admitted(middle), Allowed) else (low, middle)
    denied = admitted(high)
    assert isinstance(denied, Denied)
    return _with_cards(state, Headroom(target, replicas, low, denied.message, denied.queue), queue)


def _with_cards(state: ClusterState, answer: Headroom, queue: str) -> Headroom:
    answer.cards = cluster_status(state)["queues"].get(queue, {})
    return answer


def _only(answer: Headroom, spec: str) -> Headroom:
    """Keep the figures of the cards the workload can use (every card of an ``A|B`` spec)."""
    wanted = {part.strip() for part in spec.split("|")} & set(answer.cards)
    if wanted:
        answer.cards = {card: n for card, n in answer.cards.items() if card in wanted}
    return answer


def table(answer: Headroom) -> str:
    if answer.more is None:
        head = f"{answer.target} ({answer.replicas} replicas): not limited by card quota ({answer.reason})"
    else:
        head = f"{answer.target} ({answer.replicas} replicas): {answer.more} more fit now"
        head += f"\n  one more: {answer.reason}"
    if answer.limited_by:
        head += f"\n  held back by queue {answer.limited_by!r}"
    if answer.enforcement != "deny":
        head += (
            f"\n  its queue's quota only {answer.enforcement}s (cardquota.volcano.sh/enforcement): past"
            " these, it admits and tells it; these are what deny would admit"
        )
    rows = [
        f"  {card}: quota {n['quota']}{_deserved(n)}, free {n['free']} (running {n['bound']}, "
        f"pending {n['pending']}, reserved {n['reserved']}, in flight {n['in_flight']})"
        for card, n in answer.cards.items()
    ]
    models = [
        f"  on {card} alone: {'not limited' if more is None else more}"
        for card, more in answer.per_model.items()
    ]
    lent = [
        f"  {card}: {n['within_deserved']} more fit within its deserved, {n['borrowing']} more with what"
        f" its cohort lends now{_from(n['lenders'])}"
        for card, n in answer.lending.items()
    ]
    return "\n".join([head, *rows, *models, *lent])


def _deserved(figures: dict[str, Any]) -> str:
    """``, deserved 2, may use 3 now`` for a model the queue lends and borrows in its cohort."""
    if "deserved" not in figures:
        return ""
    return f", deserved {figures['deserved']}, may use {figures['may_use']} now"


def _from(lenders: list[str]) -> str:
    if not lenders:
        return ""
    return f" (lent by queue{'s' if len(lenders) > 1 else ''} {', '.join(repr(q) for q in lenders)})"


def tables(answers: list[Headroom]) -> str:
    return "\n\n".join(table(answer) for answer in answers)


def as_json(answers: list[Headroom]) -> bytes:
    """One object for a workload; a list, one per card task, for a Volcano Job."""
    body: Any = [a.as_json() for a in answers]
    return orjson.dumps(
        body[0] if len(body) == 1 and "task " not in answers[0].target else body, option=orjson.OPT_INDENT_2
    )

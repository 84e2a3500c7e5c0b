"""Validation of quota and job writes: Queue and Volcano Job CREATE/UPDATE (SPEC §6)."""

import math
from collections import Counter
from collections.abc import Mapping
from contextlib import ExitStack
from functools import partial
from typing import Any

from webhook.core.decide import fitting, messages
from webhook.core.decide.decisions import annotation_problem
from webhook.core.decide.messages import breakdown
from webhook.core.decide.scaling import check_pods
from webhook.core.index.queues import quota_sums
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.model import keys
from webhook.core.model.cards import UNIT, CardName, CardSpec, amount
from webhook.core.model.demand import NotCardPod, PodDemand, pod_demand
from webhook.core.model.feasibility import Group, TooComplex, assign
from webhook.core.model.ledger import Entry
from webhook.core.model.objects import Task, WorkloadRecord, queue_record, workload_record
from webhook.core.model.quota import AnnotationError, parse_card_request, parse_lending, parse_quota
from webhook.core.model.quoting import shorten
from webhook.core.model.reclaim import parse_duration
from webhook.core.model.runqueue import RunQueue, misnamed
from webhook.core.model.selector import SelectorError, parse_selector
from webhook.core.model.verdicts import Allowed, Decision, Denied, Request


def decide_queue(state: ClusterState, request: Request) -> Decision:
    record = queue_record(request.obj)
    name = record.name or request.name
    allowed = record.annotations.get(keys.NAMESPACES)
    if allowed is not None:
        try:
            parse_selector(allowed)
        except SelectorError as exc:
            return Denied(
                f'queue "{name}" has a malformed {keys.NAMESPACES} {shorten(allowed)}: {exc}', queue=name
            )
    mode = record.annotations.get(keys.ENFORCEMENT)
    if mode is not None and mode not in keys.ENFORCEMENTS:
        return Denied(
            f'queue "{name}" has a malformed {keys.ENFORCEMENT} {shorten(mode)}: one of'
            f" {', '.join(keys.ENFORCEMENTS)}",
            queue=name,
        )
    for key in (keys.RECLAIM_MIN_RUNTIME, keys.RECLAIM_NOTICE):
        duration = record.annotations.get(key)
        if duration is not None and parse_duration(duration) is None:
            return Denied(
                f'queue "{name}" has a malformed {key} {shorten(duration)}: a duration'
                ' such as "90s", "10m" or "1h30m"',
                queue=name,
            )
    text = record.annotations.get(keys.CARD_QUOTA)
    deserved, lendable = (
        record.annotations.get(keys.CARD_DESERVED),
        record.annotations.get(keys.CARD_LENDABLE),
    )
    if text is None:
        if deserved is not None or lendable is not None:
            given = keys.CARD_DESERVED if deserved is not None else keys.CARD_LENDABLE
            return Denied(
                f'queue "{name}" has {given} but no {keys.CARD_QUOTA}: the quota is the ceiling a'
                " lent model is borrowed up to; give the queue one",
                queue=name,
            )
        return Allowed("no card quota: the queue may use no card")
    try:
        quota = parse_quota(keys.CARD_QUOTA, text)
    except AnnotationError as exc:
        return Denied(f'queue "{name}" has a malformed {exc}', queue=name)
    if deserved is None and lendable is not None:
        return Denied(
            f'queue "{name}" has {keys.CARD_LENDABLE} but no {keys.CARD_DESERVED}: only a deserved model is'
            " lent",
            queue=name,
        )
    if deserved is not None:
        try:
            parse_lending(quota, keys.CARD_DESERVED, deserved, keys.CARD_LENDABLE, lendable)
        except AnnotationError as exc:
            return Denied(f'queue "{name}" has a malformed {exc}', queue=name)
    parent = record.parent if state.policy.hierarchical_queues else ""
    warnings = _quota_warnings(state, name, parent, quota)
    if parent or name in state.tree.descendants:
        warnings += _tree_warnings(state, name, parent, quota)
    warnings += _device_class_limits(request.obj, name)
    return Allowed("well-formed quota", warnings=tuple(warnings), queue=name)


def _raised(was: list[Any], now: list[Any]) -> str:
    """What ``now`` asks beyond ``was`` (minimum demands per card spec), said for people; ""."""

    def total(groups: list[Any]) -> Counter[str]:
        out: Counter[str] = Counter()
        for group in groups:
            out["|".join(group.cards)] += group.demand
        return out

    before, after = total(was), total(now)
    return ", ".join(
        f"{amount(after[spec])} {spec} where it asked {amount(before.get(spec, 0))}"
        for spec in sorted(after)
        if after[spec] > before.get(spec, 0)
    )


DEVICE_CLASS_KEY = "deviceclass/"  # stock Volcano v1.15's capacity plugin: claims counted per class


def _device_class_limits(obj: Any, name: str) -> list[str]:
    """A queue limiting DRA devices per DeviceClass (stock Volcano's ``deviceclass/<class>`` keys)
    beside its card quota: two limits on the same GPUs, which the operator should know of."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    found: set[str] = set()
    for field in ("capability", "deserved", "guarantee"):
        values = spec.get(field) if isinstance(spec, Mapping) else None
        if field == "guarantee" and isinstance(values, Mapping):
            values = values.get("resource")
        if isinstance(values, Mapping):
            found |= {f"{field} {k}" for k in values if isinstance(k, str) and k.startswith(DEVICE_CLASS_KEY)}
    if not found:
        return []
    return [
        f'queue "{name}" limits DRA devices by DeviceClass ({", ".join(sorted(found))}) as well as by its'
        f" {keys.CARD_QUOTA}: two limits on the same GPUs (Volcano's capacity plugin holds it to the"
        " first, the card-quota webhook to the second) and its pods run only within both; keep one"
    ]


def _tree_warnings(state: ClusterState, name: str, parent: str, quota: dict[CardName, int]) -> list[str]:
    """Hierarchical queues: legal over-subscription, said out loud. A child's quota above its
    parent's for a card, and children whose quotas for a card sum above their parent's."""
    warnings: list[str] = []
    above = state.tree.queues.get(parent) if parent else None
    if above is not None and above.quota:
        for card, count in sorted(quota.items()):
            if card in above.quota and count > above.quota[card]:
                warnings.append(
                    f'queue "{name}": {card} quota {amount(count)} is above the {amount(above.quota[card])}'
                    f" of its parent"
                    f' "{parent}", which limits it'
                )
        warnings += _children_sum(state, parent, above.quota, {name: quota})
    warnings += _children_sum(state, name, quota, {})
    return warnings


def _children_sum(
    state: ClusterState, parent: str, limit: dict[CardName, int], changed: dict[str, dict[CardName, int]]
) -> list[str]:
    quotas = {
        q: dict(info.quota or {}) for q, info in state.tree.queues.items() if info.record.parent == parent
    }
    quotas.update(changed)
    warnings = []
    for card, count in sorted(limit.items()):
        total = sum(q.get(card, 0) for q in quotas.values())
        if total > count:
            warnings.append(
                f'the children of queue "{parent}" have {card} quotas summing to {amount(total)}, above'
                f" its {amount(count)};"
                " they compete for it"
            )
    return warnings


def _quota_warnings(state: ClusterState, name: str, parent: str, quota: dict[CardName, int]) -> list[str]:
    warnings: list[str] = []
    quotas = {q: info.quota for q, info in state.tree.queues.items() if info.quota and q != name}
    quotas[name] = quota
    chains = {**state.tree.ancestors, name: (parent, *state.tree.ancestors.get(parent, ())) if parent else ()}
    totals = quota_sums(quotas, chains)
    for card, count in quota.items():
        cluster = state.inventory.cluster_cards(card)
        if cluster is None:
            if count:
                warnings.append(
                    f"{card} is on no node yet: the quota of {amount(count)} cannot be used until one joins"
                )
        elif totals[card] > cluster:
            warnings.append(
                f"{card}: all queues' quotas sum to {amount(totals[card])} but the cluster has"
                f" {amount(cluster)};"
                " queues will compete for the cards"
            )
    if name in state.tree.queues:
        usage = queue_usage(state, name)
        placement = usage.placement
        for card in sorted(set(usage.fixed) | {c for (_, c) in placement.placed}):
            use = usage.card(card, placement)
            if use.used > quota.get(card, 0):
                detail = breakdown(use).partition(": ")[2]
                warnings.append(
                    f'queue "{name}": new {card} quota {amount(quota.get(card, 0))} is below its current'
                    f" use {amount(use.used)} ({detail}); nothing is evicted, new pods wait until use falls"
                    " below it"
                )
    return warnings


def decide_volcano_job(state: ClusterState, request: Request) -> Decision:
    job = workload_record({**request.obj, "kind": "Job"})
    what = f"volcano job {request.namespace}/{job.name or request.name}"
    problem = annotation_problem(state, job.annotations, [t.template for t in job.tasks], what)
    if problem:
        return Denied(problem)
    runs = state.template_queue(job, request.namespace)
    queue = runs.queue
    if (refused := _misnamed_task(state, request, job, runs, what)) is not None:
        return refused
    info = state.tree.queues.get(queue)
    if info is None or info.quota is None:
        return Allowed("queue unknown or without card quota: Volcano decides")
    groups = _minimum_demand(state, job.annotations.get(keys.CARD_REQUEST), job.tasks, job.min_available)
    if request.operation == "UPDATE" and request.old_obj and job.uid and state.groups.enqueued(job.uid):
        old = workload_record({**request.old_obj, "kind": "Job"})
        was = _minimum_demand(state, old.annotations.get(keys.CARD_REQUEST), old.tasks, old.min_available)
        raised = _raised(was, groups)
        if raised:
            return Denied(
                f"{what} is enqueued (its PodGroup reserves what it was enqueued with) and cannot ask more"
                f" now: {raised}; lower it, or delete the job and create it anew",
                queue=queue,
            )
    if not groups:
        return Allowed("no card demand")
    if why := state.queue_refuses_namespace(queue, request.namespace):
        needs = f"needs at least {amount(sum(g.demand for g in groups))} {'|'.join(groups[0].cards)}"
        return Denied(messages.closed_to(queue, request.namespace, why, what, needs), queue=queue)
    never = _never_enqueued(info.quota, groups)
    if never is not None:
        spec, need = never
        whole = ", ".join(f"{amount(info.quota.get(c, 0))} {c}" for c in spec.cards)
        if spec.is_multi:
            return Denied(
                f"{what} needs {amount(need)} {spec.text}, and Volcano enqueues a multi-card request whole"
                f" on one model, but no model of it holds {amount(need)} in the whole quota of queue"
                f' "{queue}" ({whole}): it could never run; split the request per model',
                queue=queue,
                card=spec.text,
                quota=True,
            )
        total = sum(g.demand for g in groups)
        named = list(dict.fromkeys(c for g in groups for c in g.cards))
        whole = ", ".join(f"{amount(info.quota.get(c, 0))} {c}" for c in named)
        return Denied(
            f'{what} needs at least {amount(total)} {"|".join(named)} but the whole quota of queue "{queue}"'
            f" is {whole}: it could never run",
            queue=queue,
            card="|".join(named),
            quota=True,
        )
    for ancestor in state.tree.ancestors.get(queue, ()):
        limit = state.tree.queues[ancestor].quota
        limited = [g for g in groups if limit and all(c in limit for c in g.cards)]
        if not limit or not limited:
            continue
        try:
            beyond = assign(dict(limit), limited) is None
        except TooComplex:
            continue  # the job's own queue was checked exactly; an ancestor only adds a remark
        if beyond:
            named = list(dict.fromkeys(c for g in limited for c in g.cards))
            whole = ", ".join(f"{amount(limit.get(c, 0))} {c}" for c in named)
            need = sum(g.demand for g in limited)
            return Denied(
                f"{what} needs at least {amount(need)} {'|'.join(named)} but the whole quota of queue"
                f' "{ancestor}" (above "{queue}") is {whole}: it could never run',
                queue=ancestor,
                card="|".join(named),
                quota=True,
            )
    warnings = _unfit_tasks(state, job, queue, what) if request.operation == "CREATE" else ()
    return Allowed(
        "can run within the queue's whole quota; queueing is Volcano's job", warnings=warnings, queue=queue
    )


def _misnamed_task(
    state: ClusterState, request: Request, job: WorkloadRecord, runs: RunQueue, what: str
) -> Denied | None:
    """A card task whose pod template names another queue than the job's PodGroup is in, where its
    pods run (decisions.md §30: the controller gives every pod the job's PodGroup), written so:
    created, or that task's queue edited."""
    was: dict[str, str | None] = {}
    if request.operation == "UPDATE" and request.old_obj:
        old = workload_record({**request.old_obj, "kind": "Job"})
        was = {t.name: t.template.annotations.get(keys.QUEUE_NAME) for t in old.tasks}
    for task in job.tasks:
        named = misnamed(task.template.annotations, runs)
        if not named or was.get(task.name) == named:
            continue
        if isinstance(pod_demand(task.template, state.inventory, state.policy), NotCardPod):
            continue
        named_task = f"{what} task {task.name or '-'}"
        return Denied(messages.misnamed_queue(named_task, named, runs, template=True), queue=runs.queue)
    return None


def _unfit_tasks(state: ClusterState, job: WorkloadRecord, queue: str, what: str) -> tuple[str, ...]:
    """Warnings when the job's pods do not all fit now. Without its own ``card.request`` the job's
    PodGroup gets one counting every replica (§12), and the capacity-card plugin enqueues it whole:
    nothing is created until all fit, and one warning says the job waits. With its own, each card
    task whose pods do not all fit gets a warning, counted after the pods of the tasks before it
    that fit (the controller creates them all at once)."""
    whole = keys.CARD_REQUEST not in job.annotations
    total = sum(task.replicas for task in job.tasks)
    fits, warnings, first = total, [], None
    with ExitStack() as held:
        for task in job.tasks:
            demand = pod_demand(task.template, state.inventory, state.policy)
            if not isinstance(demand, PodDemand) or task.replicas <= 0:
                continue
            key = f"fitting:{job.key}/{task.name}"
            named = f"{what} task {task.name or '-'}" if len(job.tasks) > 1 else what
            check = partial(check_pods, state, key, queue, task.template, demand, what=named)
            fit, refusal = fitting.fitting_now(check, task.replicas)
            fits -= task.replicas - fit
            if refusal is not None:
                if first is None:
                    short = fitting.limit_of(state, queue, demand, fit, refusal)[1]
                    first = (refusal, queue, demand.spec, short)
                warnings.append(
                    fitting.warning(state, named, queue, demand, task.replicas, task.replicas, fit, refusal)
                )
            cpu, memory = state.compute_charged(task.template) or (0, 0)
            entry = Entry(queue, demand.spec, demand.count, fit, math.inf, cpu, memory)
            held.enter_context(fitting.holding(state, key, entry))
    if whole and first is not None:
        refusal, queue, spec, short = first  # figures without the job's own pods held
        text = fitting.figures(state, refusal.queue, queue, spec) if short else refusal.message
        return (fitting.whole_job_waits(what, total, fits, text, short),)
    return tuple(warnings)


def _never_enqueued(quota: dict[CardName, int], groups: list[Group]) -> tuple[CardSpec, int] | None:
    """A key of the job's minimum demand the capacity-card plugin could never enqueue, even in an
    empty queue, with what it needs: a model's own demand above its quota, or a multi-card key that
    fits no single alternative on top of the job's own demand for that model (the plugin tries
    each alternative alone, for the whole key)."""
    fixed: Counter[CardName] = Counter()
    multi: Counter[tuple[CardName, ...]] = Counter()
    for group in groups:
        if len(group.cards) == 1:
            fixed[group.cards[0]] += group.demand
        else:
            multi[group.cards] += group.demand
    for card, need in fixed.items():
        if need > quota.get(card, 0):
            return CardSpec((card,)), need
    for cards, need in multi.items():
        if all(fixed[card] + need > quota.get(card, 0) for card in cards):
            return CardSpec(cards), need
    return None


def _minimum_demand(
    state: ClusterState, request_text: str | None, tasks: tuple[Task, ...], min_available: int
) -> list[Group]:
    if request_text:
        counts = parse_card_request(keys.CARD_REQUEST, request_text).counts
        return [Group(spec.cards, UNIT, -(-n // UNIT)) for spec, n in counts.items()]
    per_task: list[tuple[int, CardSpec]] = []
    for task in tasks:
        demand = pod_demand(task.template, state.inventory, state.policy)
        if isinstance(demand, PodDemand):
            per_task.extend([(demand.count, demand.spec)] * task.replicas)
    total_pods = sum(task.replicas for task in tasks)
    needed = min_available if 0 < min_available < total_pods else total_pods
    # The cheapest `needed` pods are a lower bound: if even they exceed the whole quota, it never runs.
    cheapest = sorted(per_task, key=lambda item: item[0])[: max(0, needed - (total_pods - len(per_task)))]
    grouped: Counter[tuple[CardSpec, int]] = Counter((spec, count) for count, spec in cheapest)
    return [Group(spec.cards, count, pods) for (spec, count), pods in grouped.items()]

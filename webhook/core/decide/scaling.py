"""Deployment, StatefulSet and ReplicaSet writes (SPEC §6): a scale-up is denied when its pods do
not fit; a create or an update that leaves replicas unfit is admitted with a warning saying how many
fit now (``fitting``)."""

from dataclasses import replace
from functools import partial

from webhook.core.decide import assignment, capability, fitting, messages
from webhook.core.decide.decisions import (
    ancestors_refuse,
    annotation_problem,
    borrows,
    compute_only,
    queue_refuses,
    too_complex,
)
from webhook.core.index.line import LAST
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage
from webhook.core.index.waiting import scale_key
from webhook.core.model import keys
from webhook.core.model.cards import CardSpec, amount
from webhook.core.model.demand import BadDemand, NotCardPod, PodDemand, pod_demand
from webhook.core.model.feasibility import TooComplex
from webhook.core.model.objects import PodTemplate, WorkloadRecord, workload_record
from webhook.core.model.runqueue import misnamed
from webhook.core.model.verdicts import Allowed, Decision, Denied, Hold, Request

SCALABLE = {"deployments": "Deployment", "statefulsets": "StatefulSet", "replicasets": "ReplicaSet"}


def decide_scale(state: ClusterState, request: Request) -> Decision:
    kind = SCALABLE[request.resource]
    # A Scale leaves out replicas 0 (omitempty); a workload without replicas has 1.
    absent = 0 if request.sub_resource == "scale" else 1
    new = _replicas(request.obj, absent)
    old = _replicas(request.old_obj, absent)
    if request.sub_resource == "scale":
        workload = state.workloads.get(kind, request.namespace, request.name)
        if workload is None:
            return Allowed(
                f"{kind.lower()} {request.target} not in cache yet; its pods are checked one by one"
            )
    else:
        workload = _written(state, request, kind)
    if new is None or old is None or new <= old:
        if request.sub_resource == "scale":
            return Allowed("not a scale-up")
        return _unfit_warning(state, workload, new, Allowed("not a scale-up"))
    if workload.kind == "ReplicaSet" and workload.owner is not None and workload.owner.kind == "Deployment":
        return Allowed(
            f"replicas of deployment {workload.namespace}/{workload.owner.name} are checked on the deployment"
        )
    pods = new - max(old, 0)
    pods = max(pods, new - state.live_pods_of(workload))
    if pods <= 0:
        return Allowed("enough live pods already")
    template = workload.tasks[0].template
    demand = pod_demand(template, state.inventory, state.policy)
    what = f"scale-up of {kind.lower()} {workload.key} from {old} to {new} replicas"
    queue = state.template_queue(workload, request.namespace).queue
    if not isinstance(demand, PodDemand):
        if isinstance(demand, BadDemand):
            return Denied(f"{what}: its pod template {demand.reason}")
        return compute_only(state, template, queue, what, scale_key(workload), pods, "not a card workload")
    namespace = workload.namespace or request.namespace
    return check_pods(state, scale_key(workload), queue, template, demand, pods, what, namespace)


def check_pods(
    state: ClusterState,
    key: str,
    queue: str,
    template: PodTemplate,
    demand: PodDemand,
    pods: int,
    what: str,
    namespace: str = "",
) -> Decision:
    """Whether ``pods`` more pods of ``template`` fit ``queue`` and every queue above it now (their
    quota, then the optional CPU/memory check); admitted, they are held under ``key``. ``namespace``:
    the workload's, which the queue may not admit."""
    refused = queue_refuses(state, queue, what, demand.spec, demand.count * pods, namespace)
    if refused is not None:
        return refused
    ahead = state.line.ahead(queue, LAST, skip_hold=key)  # every waiter comes before a new scale-up
    usage = queue_usage(state, queue, exclude_ledger=key, ahead=ahead)
    cpu, memory = state.compute_charged(template) or (0, 0)
    hold = Hold(key, queue, demand.spec, demand.count, pods, cpu=cpu, memory=memory)
    try:
        fits = usage.fits(demand.spec, demand.count, pods)
    except TooComplex as error:
        return too_complex(queue, what, demand.spec, demand.count, pods, error)
    if fits:
        above = ancestors_refuse(state, queue, demand.spec, demand.count, pods, what, key)
        if above is not None:
            return replace(above, hold=hold)
        spread = assignment.spread(state, queue, template, demand, pods, key) if demand.spec.is_multi else {}
        if spread and sum(spread.values()) < pods:
            # Each fits alone, not together: a pod needs its model free in the queue and in every
            # queue above it whose quota names it (the mutation gives it one only then).
            message = messages.not_together(
                queue, state.tree.ancestors.get(queue, ()), spread, demand, pods, what
            )
            return Denied(message, queue=queue, card=demand.spec.text, quota=True, hold=hold)
        over = capability.refuses(state, queue, what, cpu, memory, pods, key)
        if over is not None:
            return replace(over, card=demand.spec.text)
        if demand.spec.is_multi:  # told per model, as its pods will be given them
            warned = tuple(
                w
                for card, n in spread.items()
                if n
                for w in borrows(
                    state, queue, CardSpec((card,)), demand.count_on(card, state.inventory) * n, what
                )
            )
        else:
            warned = borrows(state, queue, demand.spec, demand.count * pods, what)
        return Allowed("fits the queue's quota", warned, hold=hold, queue=queue, card=demand.spec.text)
    message = messages.no_room(usage, demand.spec, what, demand.count, pods) + messages.ahead_in_line(ahead)
    return Denied(message, queue=queue, card=demand.spec.text, quota=True, hold=hold)


def _replicas(obj: object, absent: int) -> int | None:
    if not isinstance(obj, dict) or not obj:
        return None
    value = (obj.get("spec") or {}).get("replicas", absent)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def validate_workload(state: ClusterState, request: Request) -> Decision:
    """Deployment / StatefulSet / ReplicaSet writes: well-formed card annotations, then scale-ups."""
    kind = SCALABLE[request.resource]
    what = f"{kind.lower()} {request.target}"
    workload = workload_record({**request.obj, "kind": kind})
    problem = annotation_problem(state, workload.annotations, [t.template for t in workload.tasks], what)
    if problem:
        return Denied(problem)
    if (refused := _misnamed(state, request, workload, what)) is not None:
        return refused
    if (refused := _closed(state, request, workload, what)) is not None:
        return refused
    if request.operation == "UPDATE":
        return decide_scale(state, request)
    return _unfit_warning(
        state, _written(state, request, kind), _replicas(request.obj, 1), Allowed("well-formed")
    )


def _misnamed(state: ClusterState, request: Request, workload: WorkloadRecord, what: str) -> Denied | None:
    """A card workload whose pod template names another queue than the one its pods run in
    (decisions.md §30), written so: created, or its template's queue edited. A ReplicaSet of a
    Deployment is checked on the Deployment."""
    if not workload.tasks or _checked_on_deployment(workload):
        return None
    template = workload.tasks[0].template
    runs = state.template_queue(workload, request.namespace)
    named = misnamed(template.annotations, runs)
    if not named or isinstance(pod_demand(template, state.inventory, state.policy), NotCardPod):
        return None
    if request.operation == "UPDATE" and request.old_obj:
        was = workload_record({**request.old_obj, "kind": workload.kind}).tasks
        if was and was[0].template.annotations.get(keys.QUEUE_NAME) == named:
            return None  # written so before: its pods are charged where they run
    return Denied(messages.misnamed_queue(what, named, runs, template=True), queue=runs.queue)


def _closed(state: ClusterState, request: Request, workload: WorkloadRecord, what: str) -> Denied | None:
    """A card workload whose pods would run in a queue its namespace may not use (the queue's
    ``cardquota.volcano.sh/namespaces``), refused at its create and at every update."""
    if not workload.tasks or _checked_on_deployment(workload):
        return None
    template = workload.tasks[0].template
    demand = pod_demand(template, state.inventory, state.policy)
    if not isinstance(demand, PodDemand):
        return None
    queue = state.template_queue(workload, request.namespace).queue
    why = state.queue_refuses_namespace(queue, request.namespace)
    if not why:
        return None
    needs = f"would charge it {amount(demand.count)} {demand.spec.text} a pod"
    return Denied(
        messages.closed_to(queue, request.namespace, why, what, needs), queue=queue, card=demand.spec.text
    )


def _written(state: ClusterState, request: Request, kind: str) -> WorkloadRecord:
    """The workload as written, with the uid the cache knows it by."""
    workload = workload_record({**request.obj, "kind": kind})
    workload = replace(workload, namespace=workload.namespace or request.namespace)
    cached = state.workloads.get(kind, request.namespace, request.name)
    return replace(workload, uid=cached.uid) if cached else workload


def _checked_on_deployment(workload: WorkloadRecord) -> bool:
    return (
        workload.kind == "ReplicaSet" and workload.owner is not None and workload.owner.kind == "Deployment"
    )


def _unfit_warning(
    state: ClusterState, workload: WorkloadRecord, replicas: int | None, allowed: Allowed
) -> Allowed:
    """``allowed``, with a warning when the replicas without a live pod do not all fit now."""
    if replicas is None or replicas <= 0 or _checked_on_deployment(workload) or not workload.tasks:
        return allowed
    missing = replicas - (state.live_pods_of(workload) if workload.uid else 0)
    template = workload.tasks[0].template
    demand = pod_demand(template, state.inventory, state.policy)
    if missing <= 0 or not isinstance(demand, PodDemand):
        return allowed
    queue = state.template_queue(workload).queue
    what = f"{workload.kind.lower()} {workload.key}"

    check = partial(check_pods, state, scale_key(workload), queue, template, demand, what=what)
    _, warning = fitting.unfit(state, what, queue, demand, replicas, missing, check)
    return replace(allowed, warnings=(*allowed.warnings, warning)) if warning else allowed

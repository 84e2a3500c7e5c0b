"""How many of a workload's replicas fit now, said as an admission warning when not all do.

kubectl prints an AdmissionResponse's warnings at ``kubectl apply``, so the user learns at once
what a trail of FailedCreate events would tell later. The count is the validating webhook's own:
the most pods the scale-up check admits together now (bisected: the check is monotone in the
number of pods), and its refusal of one more names the queue, or the ancestor, that limits them.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from webhook.core.decide.decisions import queue_refuses
from webhook.core.decide.messages import left_of
from webhook.core.index.state import ClusterState
from webhook.core.index.usage import queue_usage, tree_usage
from webhook.core.model.cards import CardSpec, amount
from webhook.core.model.demand import PodDemand
from webhook.core.model.feasibility import TooComplex
from webhook.core.model.ledger import Entry
from webhook.core.model.verdicts import Decision, Denied

Check = Callable[[int], Decision]  # pods -> the decision on that many more pods now


def fitting_now(check: Check, wanted: int) -> tuple[int, Denied | None]:
    """The most of ``wanted`` pods ``check`` admits together, and its refusal of one more (None
    when all fit)."""
    first = check(wanted)
    if not isinstance(first, Denied):
        return wanted, None
    low, high, refusal = 0, wanted, first  # low pods are admitted (none trivially), high refused
    while high - low > 1:
        middle = (low + high) // 2
        decision = check(middle)
        if isinstance(decision, Denied):
            high, refusal = middle, decision
        else:
            low = middle
    return low, refusal


def unfit(
    state: ClusterState, what: str, queue: str, demand: PodDemand, replicas: int, missing: int, check: Check
) -> tuple[int, str]:
    """How many of ``what``'s ``missing`` replicas (of ``replicas``) without a pod fit now, and the
    warning saying so and what limits them ("" when all fit). Its pods' controller (a ReplicaSet or
    StatefulSet) waits in the queue's line for the rest in deny mode."""
    fit, refusal = fitting_now(check, missing)
    return fit, warning(state, what, queue, demand, replicas, missing, fit, refusal, lines_up=True)


def warning(
    state: ClusterState,
    what: str,
    queue: str,
    demand: PodDemand,
    replicas: int,
    missing: int,
    fit: int,
    refusal: Denied | None,
    lines_up: bool = False,
) -> str:
    """The warning for ``fit`` of ``missing`` replicas fitting now, ``refusal`` refusing one more;
    ``lines_up``: the pods' controller waits in the queue's line when refused (deny mode)."""
    if refusal is None:
        return ""
    each = f"{amount(demand.count)} {demand.spec.text}"
    lead = f"{what} asks {replicas} replica{'s' if replicas != 1 else ''} of {each} each"
    more = ""
    if missing < replicas:
        lead += f" ({replicas - missing} have pods)"
        more = " more"
    never = whole_quota_room(state, queue, demand.spec, demand.count)
    if never is not None and never[1] < replicas:
        limit, most = never
        quota = state.tree.queues[limit].quota or {}
        whole = ", ".join(f"{amount(quota.get(card, 0))} {card}" for card in demand.spec.cards)
        return (
            f'{lead}, but the whole quota of queue "{limit}" ({whole}) holds at most {most} of them:'
            f" {replicas - most} can never run; {_fits(fit, more)} now"
        )
    limit, short = limit_of(state, queue, demand, fit, refusal)
    line = short and lines_up and state.policy.waiting_line
    if line and state.waiting.over_quota(queue) == "wait":
        rest = (
            f"the other {missing - fit} will be created under a scheduling gate and wait in the"
            " queue's line, each released the moment its cards free"
        )
    else:
        rest = f"the other {missing - fit} will be refused" + (" until cards free up" if short else "")
        if line:
            rest += ", then created at once (its controller waits in the queue's line)"
    return f"{lead}; {_fits(fit, more, 'only ')} now: {limit}; {rest}"


def whole_job_waits(what: str, pods: int, fit: int, text: str, short: bool) -> str:
    """A Volcano Job enqueued whole (its PodGroup's ``card.request`` counts every replica) that does
    not fit now: nothing is refused, the job waits; ``text``: what stops its first unfit task."""
    until = " until cards free up" if short else ""
    return (
        f"{what} needs all {pods} of its pods at once (its card.request counts every replica, and"
        f" Volcano enqueues the job whole); {_fits(fit, '', 'only ')} now: {text}; it waits in the"
        f" queue with none of its pods created{until}"
    )


def _fits(fit: int, more: str, only: str = "") -> str:
    return "none fit" if fit == 0 else f"{only}{fit}{more} fit" + ("s" if fit == 1 else "")


def limit_of(
    state: ClusterState, queue: str, demand: PodDemand, fit: int, refusal: Denied
) -> tuple[str, bool]:
    """What stops one more pod, and whether it is a shortage of cards: the limiting queue's figures
    per model, else the refusal's own words (a closed queue, no quota, the CPU/memory check)."""
    limit, spec = refusal.queue, demand.spec
    if not limit or refusal.cause or queue_refuses(state, queue, "", spec, demand.count) is not None:
        return refusal.message, False
    usage = queue_usage(state, limit) if limit == queue else tree_usage(state, limit)
    try:
        short = not usage.fits(spec, demand.count, fit + 1)
    except TooComplex:
        short = False
    if not short:
        return refusal.message, False
    return figures(state, limit, queue, spec), True


def figures(state: ClusterState, limit: str, queue: str, spec: CardSpec) -> str:
    """``queue "q" has 1 NVIDIA-H200 left (quota 3: ...)``, per model of ``spec``, for ``limit``
    (``queue`` itself, or an ancestor, counting its whole subtree)."""
    usage = queue_usage(state, limit) if limit == queue else tree_usage(state, limit)
    name = f'queue "{limit}"'
    if limit != queue:
        name += f' (above "{queue}", counting all its queues)'
    return f"{name} has " + " and ".join(left_of(usage, card) for card in spec.cards)


def whole_quota_room(state: ClusterState, queue: str, spec: CardSpec, per_pod: int) -> tuple[str, int] | None:
    """The queue whose whole quota holds the fewest pods of ``per_pod`` cards of ``spec`` (the
    queue's own, or an ancestor's that names all the cards), with that number; None when no quota
    names them. A pod takes one model, so ``A|B`` pods fit ``sum(quota // per_pod)`` over models."""
    best: tuple[str, int] | None = None
    for name in (queue, *state.tree.ancestors.get(queue, ())):
        info = state.tree.queues.get(name)
        quota = info.quota if info is not None else None
        if not quota or (name != queue and not all(card in quota for card in spec.cards)):
            continue
        most = sum(quota.get(card, 0) // per_pod for card in spec.cards)
        if best is None or most < best[1]:
            best = (name, most)
    return best


@contextmanager
def holding(state: ClusterState, key: str, entry: Entry) -> Iterator[None]:
    """Hold ``entry`` in the ledger while the block asks what else fits (a Volcano Job's earlier
    tasks), and take it back after: nothing outlives the decision."""
    state.ledger.record(key, entry)
    try:
        yield
    finally:
        state.ledger.drop(key)

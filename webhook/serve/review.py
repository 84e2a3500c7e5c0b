"""One AdmissionReview in, one AdmissionReview response out: the glue every front shares."""

import time
from typing import Any, Literal

import orjson

from webhook.core.decide import admission, patches
from webhook.core.index.state import ClusterState
from webhook.core.model import keys, shapes
from webhook.core.model.objects import OwnerRef
from webhook.core.model.verdicts import Allowed, Decision, Denied, Request
from webhook.serve import logs, wire

Webhook = Literal["validate", "mutate"]


def decide(state: ClusterState, body: bytes | str, webhook: Webhook, now: float) -> tuple[str, Decision]:
    """Parse, decide and (unless dry-run) record; raises ``BadReview`` for unanswerable input."""
    raw = wire.parse_review(body)
    return raw.uid, decide_request(state, wire.to_request(raw), webhook, now)


def owner_to_fetch(state: ClusterState, request: Request, webhook: Webhook) -> tuple[OwnerRef, str] | None:
    """For a PodGroup mutation whose owner the cache lacks: the owner to read live, and its namespace."""
    mutated = request.operation in ("CREATE", "UPDATE") and not request.sub_resource
    if webhook != "mutate" or not mutated or request.resource != "podgroups":
        return None
    if shapes.problem("podgroups", "", request.obj):
        return None
    ref = patches.owner_to_fetch(state, request.obj)
    return None if ref is None else (ref, request.namespace)


def to_fetch(state: ClusterState, request: Request) -> list[OwnerRef]:
    """What a create needs that the cache lacks or has not caught up on, to read live (nearly never)."""
    return dra_to_fetch(state, request) + group_to_fetch(state, request)


def group_to_fetch(state: ClusterState, request: Request) -> list[OwnerRef]:
    """The PodGroup a pod create names, when the cache lacks it (decisions.md §30: its queue is where
    the pod runs, and a PodGroup made just before its pod may not have reached the watch yet), or
    when its move to Inqueue was admitted here but the cache does not show it enqueued yet (SPEC
    §5d: the job controller, which creates the pods, saw it first), so the pod is counted out of its
    reservation, not beside the enqueue's hold."""
    template = request.template
    name = template.annotations.get(keys.GROUP_NAME) if template is not None else None
    if not name or request.operation != "CREATE":
        return []
    api = f"{admission.VOLCANO_SCHEDULING}/v1beta1"
    key = f"{request.namespace}/{name}"
    if key not in state.podgroups:
        return [OwnerRef("PodGroup", name, "", api)]
    group = state.groups.enqueued_unseen(key)
    if group is None:
        return []
    return [OwnerRef("PodGroup", group.name, group.uid, api)]


def dra_to_fetch(state: ClusterState, request: Request) -> list[OwnerRef]:
    """SPEC §4b: what a create needs the cache lacks, to read live: a pod's claims and claim
    templates, a claim's pod (the resource claim controller makes it right after the pod)."""
    if request.operation != "CREATE" or request.sub_resource or not state.policy.dra_drivers:
        return []
    obj, namespace = request.obj, request.namespace
    devices = state.inventory.devices
    api = "resource.k8s.io/v1"
    if request.template is not None:
        out = []
        for ref in request.template.claims:
            if ref.claim and f"{namespace}/{ref.claim}" not in devices.claims:
                out.append(OwnerRef("ResourceClaim", ref.claim, "", api))
            elif (
                ref.template and not ref.generated and f"{namespace}/{ref.template}" not in devices.templates
            ):
                out.append(OwnerRef("ResourceClaimTemplate", ref.template, "", api))
        return out
    if request.resource == "resourceclaims" and request.group == "resource.k8s.io":
        meta = obj.get("metadata")
        owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
        for owner in owners if isinstance(owners, list) else []:  # odd shapes: nothing to read
            if isinstance(owner, dict) and owner.get("kind") == "Pod" and owner.get("controller") is True:
                uid, name = owner.get("uid") or "", owner.get("name") or ""
                if not (isinstance(uid, str) and isinstance(name, str)):
                    return []
                return [OwnerRef("Pod", name, uid, "v1")] if uid not in state.pods and name else []
    return []


def owner_from(ref: OwnerRef, body: dict[str, Any] | None) -> patches.Owner | None:
    return patches.owner_from(ref, body) if isinstance(body, dict) else None  # a read of no object: none


def decide_request(
    state: ClusterState,
    request: Request,
    webhook: Webhook,
    now: float,
    owner: patches.Owner | None = None,
) -> Decision:
    """Decide a read review and log one line for it."""
    started = time.perf_counter()
    return _record(state, request, webhook, now, _decide(state, request, webhook, now, owner), started)


def try_request(
    state: ClusterState,
    request: Request,
    webhook: Webhook,
    now: float,
    owner: patches.Owner | None = None,
) -> Decision | None:
    """``decide_request``, or None (nothing recorded, nothing logged) when the decision deferred
    DRA selectors to be worked out off the loop (``Devices.deferred_now``): it is taken again
    once they are."""
    started = time.perf_counter()
    missed = state.inventory.devices.missed
    decision = _decide(state, request, webhook, now, owner)
    if state.inventory.devices.missed != missed:
        return None
    return _record(state, request, webhook, now, decision, started)


def _decide(
    state: ClusterState, request: Request, webhook: Webhook, now: float, owner: patches.Owner | None
) -> Decision:
    if webhook == "validate":
        return admission.validate(state, request, now)
    return admission.mutate(state, request, owner, now)


def _record(
    state: ClusterState, request: Request, webhook: Webhook, now: float, decision: Decision, started: float
) -> Decision:
    admission.admit(state, request, decision, now)  # a mutation's: a multi-card pod's assigned model
    logs.review(
        {
            "uid": request.uid,
            "webhook": webhook,
            "kind": request.kind,
            "object": request.target,
            "operation": request.operation,
            "dry_run": request.dry_run,
            "decision": _outcome(decision),
            "queue": decision.queue,
            "card": decision.card,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
        }
    )
    return decision


def _outcome(decision: Decision) -> str:
    """``allowed``, ``denied``, or ``would refuse (warn)``/``(audit)``: admitted, its quota relaxed."""
    if isinstance(decision, Denied):
        return "denied"
    return f"would refuse ({decision.would.mode})" if decision.would is not None else "allowed"


def answer(state: ClusterState, body: bytes | str, webhook: Webhook, now: float) -> dict[str, Any]:
    uid, decision = decide(state, body, webhook, now)
    return wire.response(uid, decision)


def summary(decision: Decision) -> str:
    """One line for people: ``DENIED 403: ...`` / ``ALLOWED (+2 patch ops): ...``."""
    match decision:
        case Denied(message=message, code=code):
            return f"DENIED {code}: {message}"
        case Allowed(reason=reason, patch=patch, warnings=warnings, would=would):
            extra = "".join(f"\n  warning: {w}" for w in warnings)
            extra += f"\n  would refuse ({would.mode}): {would.message}" if would and not warnings else ""
            extra += "".join(f"\n  patch: {orjson.dumps(dict(op)).decode()}" for op in patch)
            return f"ALLOWED: {reason}{extra}"

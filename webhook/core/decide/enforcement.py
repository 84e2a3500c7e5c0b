"""Enforcement in steps (decisions.md §34): a queue whose quota only warns or audits admits what it
would refuse, and says so.

Only a refusal for want of room in a quota (``Denied.quota``: a pod create, a scale-up, an enqueue,
a Volcano Job its queue could never hold) is subject to its queue's mode, the queue whose quota has
no room (an ancestor's, when it is the one); refusals of a malformed or forged object, of a queue a
namespace may not use, and of a check that gave up always refuse. The admitted request carries the
refusal's own message (a warning ``kubectl`` prints in ``warn``; an audit annotation in both) and
its hold (it is counted as any admission), and joins no line.
"""

from webhook.core.index.state import ClusterState
from webhook.core.model.objects import controller_of
from webhook.core.model.verdicts import Allowed, Decision, Denied, Request, Would

# resource (group) -> the apiVersion and kind an Event about the object is on
INVOLVED = {
    ("pods", ""): ("v1", "Pod"),
    ("deployments", "apps"): ("apps/v1", "Deployment"),
    ("replicasets", "apps"): ("apps/v1", "ReplicaSet"),
    ("statefulsets", "apps"): ("apps/v1", "StatefulSet"),
    ("podgroups", "scheduling.volcano.sh"): ("scheduling.volcano.sh/v1beta1", "PodGroup"),
    ("jobs", "batch.volcano.sh"): ("batch.volcano.sh/v1alpha1", "Job"),
    ("jobs", "batch"): ("batch/v1", "Job"),
}


def enforce(state: ClusterState, request: Request, decision: Decision) -> Decision:
    """``decision`` as its queue enforces it: a quota's refusal stays one in ``deny``; in ``warn`` or
    ``audit`` it is admitted, carrying what it would have been."""
    if not isinstance(decision, Denied) or not decision.quota:
        return decision
    mode = state.enforcement(decision.queue)
    if mode == "deny":
        return decision
    api_version, kind = INVOLVED.get((request.resource, request.group), ("", ""))
    involved = (api_version, kind, request.namespace, request.name) if kind else None
    owner = controller_of(request.obj) if kind == "Pod" else None
    if owner is not None and owner.api_version and owner.kind and owner.name:
        # a controller's pod: told on the controller (what its user reads), once a minute for all
        involved = (owner.api_version, owner.kind, request.namespace, owner.name)
    return Allowed(
        f"its quota would refuse it ({mode} mode)",
        (decision.message,) if mode == "warn" else (),
        hold=decision.hold,
        queue=decision.queue,
        card=decision.card,
        would=Would(mode, decision.message, involved, decision.queue, decision.card),
    )

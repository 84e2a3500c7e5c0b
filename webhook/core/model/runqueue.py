"""The queue a pod runs in: the one Volcano schedules it in, and so the one it is charged to.

Volcano's scheduler reads a pod's queue from one place only: the ``spec.queue`` of the PodGroup its
``scheduling.k8s.io/group-name`` names (``getJobID``, ``pkg/scheduler/api/job_info.go``); a pod
naming none waits until the pg-controller makes it one. The pod's own ``scheduling.volcano.sh/
queue-name`` (and the ``volcano.sh/queue-name`` a Volcano Job's controller writes) counts only in
so far as a PodGroup is made from it. The rules here are Volcano v1.15.1's, the capacity-card
fork's alike (decisions.md §30); ``ClusterState.run_queue`` applies them to what the cache holds.
"""

from collections.abc import Mapping

from webhook.core.model import keys
from webhook.core.model.values import value_class

PODGROUP = "podgroup"  # the PodGroup the pod names, as the cache holds it
JOB = "job"  # the PodGroup of the pod's Volcano Job, not seen yet: made from the job's spec.queue
CREATED = "created"  # the PodGroup the pg-controller makes for a pod naming none (or one not seen yet)


@value_class
class RunQueue:
    """Where a pod (or a pod template) runs: ``queue``, and what says so (``source``, one of the
    three above, and ``key``: the PodGroup's or the Volcano Job's namespace/name, else the pod's
    namespace). ``defaulted``: the queue is its namespace's default, put in place of ``default``."""

    queue: str
    source: str
    key: str
    defaulted: bool = False


def namespace_default(queue: str, namespace_queue: str | None) -> tuple[str, bool]:
    """The queue a PodGroup created in ``queue`` ends up in, and whether the namespace's default
    put it there. Volcano's PodGroup mutation (``createPodGroupPatch``,
    ``pkg/webhooks/admission/podgroups/mutate/mutate_podgroup.go``), on CREATE only: a group whose
    ``spec.queue`` is exactly ``default`` gets the value of its Namespace's
    ``scheduling.volcano.sh/queue-name`` annotation, whenever the Namespace carries it (any value,
    even empty); any other queue is left alone. ``namespace_queue``: None when it carries none."""
    if queue == keys.DEFAULT_QUEUE and namespace_queue is not None:
        return namespace_queue, namespace_queue != queue
    return queue, False


def created_queue(annotations: Mapping[str, str]) -> str:
    """The ``spec.queue`` the pg-controller writes into the PodGroup it makes for a pod naming none
    (``buildPodGroupFromPod``, ``pkg/controllers/podgroup/pg_controller_handler.go``): the pod's own
    ``scheduling.volcano.sh/queue-name``; without it (or empty: the field is then left out) the CRD's
    default, ``default``. Its owner's annotations are copied only under ``volcano.sh/``, so an
    owner's queue annotation never reaches it."""
    return annotations.get(keys.QUEUE_NAME) or keys.DEFAULT_QUEUE


def misnamed(annotations: Mapping[str, str], runs: RunQueue) -> str:
    """The queue a pod (template) names in ``scheduling.volcano.sh/queue-name`` when it is not the
    one it runs in; "" when it names none, or that one."""
    named = annotations.get(keys.QUEUE_NAME) or ""
    return named if named and named != runs.queue else ""

"""decisions.md §30, the queue a pod runs in: a pod is charged to the queue Volcano schedules it in
(its PodGroup's ``spec.queue``; for a pod of none, the PodGroup Volcano's pg-controller makes for
it, moved to its namespace's default queue where Volcano's PodGroup mutation moves it), and a pod,
workload or Volcano Job task whose own queue annotation names another is refused, naming both."""

from typing import Any

import pytest

from tests.builders import (
    H200,
    cluster,
    deployment,
    node,
    owner,
    pod,
    podgroup,
    queue,
    replicaset,
    request,
    template,
    vcjob,
)
from webhook.core.decide import admission
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model import keys
from webhook.core.model.cards import units
from webhook.core.model.objects import OwnerRef
from webhook.core.model.runqueue import CREATED, JOB, PODGROUP, created_queue, namespace_default
from webhook.core.model.verdicts import Allowed, Denied

QUEUES = (
    queue("q1", '{"NVIDIA-H200": 2}'),
    queue("q2", '{"NVIDIA-H200": 2}'),
    queue("team", '{"NVIDIA-H200": 1}'),
    queue("default", '{"NVIDIA-H200": 2}'),
)
JOB_API = "batch.volcano.sh/v1alpha1"


def namespace(name: str = "ns", default: str | None = "team") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if default is not None:
        meta["annotations"] = {keys.QUEUE_NAME: default}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def state_of(*objects: dict[str, Any]) -> ClusterState:
    return cluster(node("h", H200), *QUEUES, *objects)


def charged(state: ClusterState, name: str, namespace_name: str = "ns") -> str:
    charge = state.charged.charge(f"uid-{namespace_name}-{name}")
    assert charge is not None
    return charge.queue


def used(state: ClusterState, queue_name: str) -> int:
    tally = state.tree.tallies.get(queue_name)
    return 0 if tally is None else (tally.bound[H200] + tally.pending[H200]) // units(1)


def create(state: ClusterState, obj: dict[str, Any], **kw: Any) -> Allowed | Denied:
    decision = admission.validate(state, request(obj, **kw), 0.0)
    assert isinstance(decision, Allowed | Denied)
    return decision


def running(name: str, **kw: Any) -> dict[str, Any]:
    return pod(name, H200, 1, node_name="h", phase="Running", **kw)


# ---- Volcano's rules, as read in its source ------------------------------------------------------
@pytest.mark.parametrize(
    ("queue_name", "annotated", "runs"),
    [
        ("default", "team", ("team", True)),
        ("default", None, ("default", False)),
        ("default", "default", ("default", False)),
        ("default", "", ("", True)),  # any value, as createPodGroupPatch applies it
        ("q1", "team", ("q1", False)),  # only a group of queue "default" is moved
    ],
)
def test_the_podgroup_mutation_moves_only_queue_default_to_the_namespaces_queue(
    queue_name: str, annotated: str | None, runs: tuple[str, bool]
) -> None:
    assert namespace_default(queue_name, annotated) == runs


@pytest.mark.parametrize(
    ("annotations", "made"),
    [({}, "default"), ({keys.QUEUE_NAME: ""}, "default"), ({keys.QUEUE_NAME: "q2"}, "q2")],
)
def test_the_pg_controller_makes_a_pods_group_in_the_queue_it_names(
    annotations: dict[str, str], made: str
) -> None:
    assert created_queue(annotations) == made


# ---- the charge: where the pod runs ---------------------------------------------------------------
def test_a_pod_naming_another_queue_than_its_podgroup_is_charged_to_the_podgroups() -> None:
    # the shape: a PodGroup in q1 whose pods name q2; q1 runs them, q2 was charged
    state = state_of(podgroup("pg", "Running", queue_name="q1"), running("a", queue_name="q2", group="pg"))
    assert charged(state, "a") == "q1"
    assert (used(state, "q1"), used(state, "q2")) == (1, 0)
    assert state.run_queue("ns", state.pods["uid-ns-a"].template.annotations).source == PODGROUP


def test_a_podgroup_arriving_after_its_pods_takes_their_charges() -> None:
    state = state_of(running("a", queue_name=None, group="pg"))
    assert charged(state, "a") == "default"  # not seen yet: the pod's own queue, else default
    ingest.upsert(state, podgroup("pg", "Running", queue_name="q1"))
    assert charged(state, "a") == "q1" and (used(state, "q1"), used(state, "default")) == (1, 0)
    ingest.remove(state, podgroup("pg", "Running", queue_name="q1"))
    assert charged(state, "a") == "default" and used(state, "q1") == 0


def test_a_pending_podgroups_queue_moved_moves_its_pods_charges() -> None:
    state = state_of(podgroup("pg", "Pending", queue_name="q1"), pod("a", H200, queue_name=None, group="pg"))
    assert charged(state, "a") == "q1"
    ingest.upsert(state, podgroup("pg", "Pending", queue_name="q2"))
    assert charged(state, "a") == "q2" and (used(state, "q1"), used(state, "q2")) == (0, 1)


def test_an_enqueued_podgroups_queue_moved_keeps_its_pods_where_it_was_enqueued() -> None:
    # SPEC §4b: an enqueued group reserves where it was enqueued (the move is refused at the write)
    state = state_of(podgroup("pg", "Running", queue_name="q1"), running("a", queue_name=None, group="pg"))
    ingest.upsert(state, podgroup("pg", "Running", queue_name="q2"))
    assert charged(state, "a") == "q1"


def test_a_pod_of_no_podgroup_is_charged_to_its_namespaces_default_queue() -> None:
    state = state_of(namespace(), running("a", queue_name=None))
    assert charged(state, "a") == "team"
    runs = state.run_queue("ns", {})
    assert (runs.queue, runs.source, runs.defaulted) == ("team", CREATED, True)


def test_a_pod_naming_a_queue_other_than_default_keeps_it_in_an_annotated_namespace() -> None:
    state = state_of(namespace(), running("a", queue_name="q1"))
    assert charged(state, "a") == "q1"


def test_the_namespaces_default_arriving_or_changing_moves_the_pods_without_a_podgroup_only() -> None:
    state = state_of(
        podgroup("pg", "Running", queue_name="default"),
        running("grouped", queue_name=None, group="pg"),
        running("bare", queue_name=None),
        running("elsewhere", queue_name=None, namespace="other"),
    )
    assert {charged(state, "grouped"), charged(state, "bare")} == {"default"}
    ingest.upsert(state, namespace())
    assert (charged(state, "grouped"), charged(state, "bare")) == ("default", "team")
    assert charged(state, "elsewhere", "other") == "default"
    ingest.upsert(state, namespace(default="q2"))
    assert charged(state, "bare") == "q2"
    ingest.remove(state, namespace(default="q2"))
    assert charged(state, "bare") == "default" and used(state, "q2") == 0


def task(queue_name: str | None = None) -> dict[str, Any]:
    """A Volcano Job task's pod template of 1 H200, naming ``queue_name`` (None: no queue)."""
    out = template(H200)
    if queue_name is None:
        del out["metadata"]["annotations"][keys.QUEUE_NAME]
    else:
        out["metadata"]["annotations"][keys.QUEUE_NAME] = queue_name
    return out


JOB_REF = owner("Job", "train", "uid-job-train", api=JOB_API)


def job_pod(index: int = 0, queue_name: str | None = None, job_queue: str = "default") -> dict[str, Any]:
    """A pod of Volcano Job ns/train's task t0, as its controller makes it: its template's
    annotations, its PodGroup's name and the job's queue under volcano.sh/queue-name."""
    made = pod(f"train-t0-{index}", H200, queue_name=queue_name, group="train-uid-job-train", owner=JOB_REF)
    made["metadata"]["annotations"]["volcano.sh/queue-name"] = job_queue
    return made


def test_a_volcano_job_pod_runs_in_its_jobs_podgroup_whatever_its_volcano_sh_queue_name_says() -> None:
    # the job controller writes volcano.sh/queue-name = spec.queue ("default"); Volcano's PodGroup
    # mutation puts the job's PodGroup in the namespace's queue: the pod runs there, and passes
    state = state_of(namespace(), vcjob("train", [(1, task())], queue="default"))
    made = job_pod()
    runs = state.run_queue(
        "ns", made["metadata"]["annotations"], OwnerRef("Job", "train", "uid-job-train", JOB_API)
    )
    assert (runs.queue, runs.source, runs.key, runs.defaulted) == ("team", JOB, "ns/train", True)
    decision = create(state, made)
    assert isinstance(decision, Allowed) and decision.queue == "team"
    ingest.upsert(state, podgroup("train-uid-job-train", "Inqueue", queue_name="team", owner_ref=JOB_REF))
    assert state.run_queue("ns", made["metadata"]["annotations"]).source == PODGROUP


# ---- refused: a queue named that is not where the pod runs ----------------------------------------
MISNAMED = (
    'pod ns/a names queue "q2" but its podgroup ns/pg is in queue "q1", where Volcano schedules it: its'
    ' cards would count there, not in the queue named; name queue "q1" in scheduling.volcano.sh/queue-name,'
    " or none"
)


def test_a_pod_create_naming_another_queue_than_its_podgroups_is_refused_naming_both() -> None:
    state = state_of(podgroup("pg", "Pending", queue_name="q1"))
    decision = create(state, pod("a", H200, queue_name="q2", group="pg"))
    assert isinstance(decision, Denied) and decision.message == MISNAMED


@pytest.mark.parametrize("queue_name", ["q1", None], ids=["names its podgroup's queue", "names none"])
def test_a_pod_create_naming_its_podgroups_queue_or_none_passes_and_is_held_there(
    queue_name: str | None,
) -> None:
    state = state_of(podgroup("pg", "Pending", queue_name="q1"))
    decision = create(state, pod("a", H200, queue_name=queue_name, group="pg"))
    assert isinstance(decision, Allowed) and decision.hold is not None and decision.hold.queue == "q1"


def test_a_pod_is_checked_against_the_quota_of_the_queue_it_runs_in() -> None:
    # team has 1 H200, used: a pod of no queue in its namespace is refused there, not let into default
    state = state_of(namespace(), running("a", queue_name=None))
    decision = create(state, pod("b", H200, queue_name=None))
    assert isinstance(decision, Denied) and decision.message.startswith('queue "team" has 0 NVIDIA-H200 left')


def test_a_pod_naming_default_in_a_namespace_with_a_default_queue_is_refused() -> None:
    state = state_of(namespace())
    decision = create(state, pod("a", H200, queue_name="default"))
    assert isinstance(decision, Denied)
    assert decision.message == (
        'pod ns/a names queue "default" but the podgroup Volcano makes for it is in queue "team", where'
        ' Volcano schedules it (a podgroup created in queue "default" goes to the queue namespace ns names'
        " in its scheduling.volcano.sh/queue-name annotation): its cards would count there, not in the"
        ' queue named; name queue "team" in scheduling.volcano.sh/queue-name, or none'
    )
    assert isinstance(create(state, pod("b", H200, queue_name="team")), Allowed)
    assert isinstance(create(state_of(), pod("c", H200, queue_name="default")), Allowed)  # no default


def test_a_volcano_job_pod_whose_task_names_another_queue_is_refused() -> None:
    state = state_of(vcjob("train", [(1, task("q2"))], queue="q1"))
    refused = create(state, job_pod(queue_name="q2", job_queue="q1"))
    assert isinstance(refused, Denied)
    assert refused.message.startswith(
        'pod ns/train-t0-0 names queue "q2" but its volcano job ns/train is in queue "q1", where Volcano'
        " schedules it"
    )
    assert isinstance(create(state, job_pod(queue_name="q1", job_queue="q1")), Allowed)


def test_a_non_card_pod_naming_another_queue_is_let_be() -> None:
    state = state_of(podgroup("pg", "Pending", queue_name="q1"))
    decision = create(state, pod("a", None, None, queue_name="q2", group="pg"))
    assert isinstance(decision, Allowed) and decision.reason == "not a card pod"


def test_a_volcano_job_whose_task_names_another_queue_is_refused_and_its_twin_passes() -> None:
    state = state_of()
    job = vcjob("train", [(1, task()), (1, task("q2"))], queue="q1")
    decision = create(state, job, resource="jobs", group="batch.volcano.sh")
    assert isinstance(decision, Denied)
    assert decision.message == (
        'volcano job ns/train task t1\'s pod template names queue "q2" but the job is in queue "q1", where'
        " Volcano schedules its pods: their cards would count there, not in the queue named; name queue"
        ' "q1" in scheduling.volcano.sh/queue-name, or none'
    )
    twin = vcjob("train", [(1, task()), (1, task("q1"))], queue="q1")
    assert isinstance(create(state, twin, resource="jobs", group="batch.volcano.sh"), Allowed)


def test_a_volcano_job_of_queue_default_is_checked_in_its_namespaces_queue() -> None:
    # team's whole quota is 1 H200: a job needing 2 could never run there, where Volcano puts it
    job = vcjob("train", [(2, task())], queue="default")
    decision = create(state_of(namespace()), job, resource="jobs", group="batch.volcano.sh")
    assert isinstance(decision, Denied) and 'whole quota of queue "team" is 1 NVIDIA-H200' in decision.message
    assert isinstance(create(state_of(), job, resource="jobs", group="batch.volcano.sh"), Allowed)


def test_a_volcano_job_edit_leaving_a_tasks_queue_as_it_was_passes() -> None:
    job = vcjob("train", [(1, task("q2"))], queue="q1")
    raised = vcjob("train", [(2, task("q2"))], queue="q1")
    decision = create(
        state_of(), raised, resource="jobs", group="batch.volcano.sh", operation="UPDATE", old=job
    )
    assert isinstance(decision, Allowed)


def test_a_deployment_naming_default_in_a_namespace_with_a_default_queue_is_refused() -> None:
    state = state_of(namespace())
    decision = create(state, deployment("web", 1, queue_name="default"), resource="deployments", group="apps")
    assert isinstance(decision, Denied)
    assert decision.message.startswith(
        'deployment ns/web\'s pod template names queue "default" but the podgroup Volcano makes for its'
        ' pods is in queue "team", where Volcano schedules its pods'
    )
    twin = deployment("web", 1, queue_name="team")
    assert isinstance(create(state, twin, resource="deployments", group="apps"), Allowed)


def test_a_deployment_written_before_its_namespace_had_a_default_scales_in_the_queue_it_runs_in() -> None:
    web = deployment("web", 1, queue_name="default")
    state = state_of(
        namespace(), web, running("web-0", queue_name="default", owner=owner("ReplicaSet", "web-1", "rs"))
    )
    more = {**web, "spec": {**web["spec"], "replicas": 3}}
    decision = create(state, more, resource="deployments", group="apps", operation="UPDATE", old=web)
    assert isinstance(decision, Denied)  # not refused for its name: written so before; counted in team
    assert decision.message.endswith('queue "team" has 0 left (quota 1: 1 running)')


def test_a_refused_replicaset_of_a_namespace_with_a_default_queue_waits_in_that_queues_line() -> None:
    rs = replicaset("web-1", 2, "web", queue_name="")
    ref = owner("ReplicaSet", "web-1", "uid-rs-web-1")
    state = state_of(namespace(), rs, running("web-1-a", queue_name=None, owner=ref))
    review = request(pod("web-1-b", H200, queue_name=None, owner=ref))
    decision = admission.validate(state, review, 10.0)
    admission.admit(state, review, decision, 10.0)
    assert isinstance(decision, Denied) and decision.message.startswith('queue "team" has 0 NVIDIA-H200 left')
    assert [(w.queue, w.what) for w in state.line.line("team")] == [("team", "replicaset ns/web-1")]
    ingest.upsert(state, namespace(default="q2"))  # the namespace's default moved: so does its place
    assert not state.line.line("team") and [w.queue for w in state.line.line("q2")] == ["q2"]

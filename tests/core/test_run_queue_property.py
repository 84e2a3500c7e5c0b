"""decisions.md §30 as a property: whatever order the pods, PodGroups, Volcano Jobs and Namespaces
arrive in (each object's own versions in order, as one watch delivers them), every live card pod
is charged to the queue its PodGroup says, else the one Volcano's controllers would make its
PodGroup in (its Volcano Job's, else its own annotation's), ``default`` moved to its namespace's
default queue; and the queues' tallies are those of a state loaded from the end result at once.

The expected queue is worked out here from the raw objects, apart from the state's rule."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import H200, cluster, node, owner, pod, podgroup, queue, template, vcjob
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model import keys

QUEUES = ("q1", "q2", "team", "default")
NAMESPACES = ("na", "nb")
JOB_API = "batch.volcano.sh/v1alpha1"
GONE = "gone"  # a version that is a deletion

queue_names = st.sampled_from(QUEUES)
maybe_queue = st.none() | queue_names


def namespace(name: str, default: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if default is not None:
        meta["annotations"] = {keys.QUEUE_NAME: default}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def in_namespace(obj: dict[str, Any], where: str) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "namespace": where}}


def group(name: str, where: str, queue_name: str, job: str = "") -> dict[str, Any]:
    ref = owner("Job", job, f"uid-job-{where}-{job}", api=JOB_API) if job else None
    made = in_namespace(podgroup(name, "Pending", queue_name=queue_name, owner_ref=ref), where)
    made["metadata"]["uid"] = f"uid-pg-{where}-{name}"
    return made


def job(name: str, where: str, queue_name: str) -> dict[str, Any]:
    made = in_namespace(vcjob(name, [(1, template(H200))], queue=queue_name), where)
    made["metadata"]["uid"] = f"uid-job-{where}-{name}"
    return made


@st.composite
def worlds(draw: st.DrawFn) -> tuple[dict[str, list[dict[str, Any] | str]], list[str]]:
    """Each object's versions (a raw object, or ``GONE``), by id; and the order their events come in."""
    versions: dict[str, list[dict[str, Any] | str]] = {}
    for name in NAMESPACES:
        count = draw(st.integers(0, 3))
        versions[f"ns/{name}"] = [
            namespace(name, v) if v != GONE else GONE
            for v in draw(st.lists(maybe_queue | st.just(GONE), min_size=count, max_size=count))
        ]
    for where in NAMESPACES:
        for name in ("g0", "g1"):
            queues = draw(st.lists(queue_names | st.just(GONE), max_size=3))
            versions[f"pg/{where}/{name}"] = [group(name, where, q) if q != GONE else GONE for q in queues]
        job_queue = draw(maybe_queue)  # None: no Volcano Job here; its queue is fixed once made
        versions[f"job/{where}/j"] = [job("j", where, job_queue)] if job_queue else []
        if job_queue and draw(st.booleans()):  # its PodGroup: in the job's queue, or the default's
            in_queue = draw(st.sampled_from([job_queue, *QUEUES]))
            versions[f"pg/{where}/j"] = [group(f"j-uid-job-{where}-j", where, in_queue, job="j")]
    for i in range(draw(st.integers(1, 6))):
        where = draw(st.sampled_from(NAMESPACES))
        named = draw(maybe_queue)
        grouped = draw(st.sampled_from(["", "g0", "g1", "never", "job"]))
        ref = owner("Job", "j", f"uid-job-{where}-j", api=JOB_API) if grouped == "job" else None
        name = f"j-uid-job-{where}-j" if grouped == "job" else grouped
        bound = draw(st.booleans())
        raw = pod(
            f"p{i}",
            H200,
            1,
            queue_name=named,
            namespace=where,
            group=name,
            owner=ref,
            node_name="h" if bound else "",
            phase="Running" if bound else "Pending",
        )
        if ref is not None:
            raw["metadata"]["annotations"]["volcano.sh/queue-name"] = "default"  # its job controller's
        versions[f"pod/{i}"] = [raw]
    tokens = [key for key, seen in versions.items() for _ in seen]
    return versions, draw(st.permutations(tokens))


def final(versions: dict[str, list[dict[str, Any] | str]]) -> dict[str, dict[str, Any]]:
    return {key: seen[-1] for key, seen in versions.items() if seen and seen[-1] != GONE}  # type: ignore[misc]


def expected_queue(raw: dict[str, Any], objects: dict[str, dict[str, Any]]) -> str:
    meta = raw["metadata"]
    where, annotations = meta["namespace"], meta.get("annotations", {})
    ns = objects.get(f"ns/{where}")
    default = (ns["metadata"].get("annotations") or {}).get(keys.QUEUE_NAME) if ns else None
    name = annotations.get(keys.GROUP_NAME, "")
    groups = {o["metadata"]["name"]: o for k, o in objects.items() if k.startswith(f"pg/{where}/")}
    if name in groups:
        return str(groups[name]["spec"]["queue"])  # a PodGroup keeps the queue it holds
    made = annotations.get(keys.QUEUE_NAME) or "default"
    if name and meta.get("ownerReferences") and f"job/{where}/j" in objects:
        made = objects[f"job/{where}/j"]["spec"]["queue"] or "default"
    return default if made == "default" and default is not None else made


def base() -> list[dict[str, Any]]:
    return [node("h", H200, 64), *(queue(q, '{"NVIDIA-H200": 64}') for q in QUEUES)]


def apply(state: ClusterState, versions: dict[str, list[Any]], order: list[str]) -> None:
    at: dict[str, int] = {}
    last: dict[str, dict[str, Any]] = {}
    for key in order:
        index = at[key] = at.get(key, -1) + 1
        version = versions[key][index]
        if version == GONE:
            if key in last:
                ingest.remove(state, last.pop(key))
        else:
            assert ingest.upsert(state, version) == ""
            last[key] = version


def tallies(state: ClusterState) -> dict[str, Any]:
    out = {}
    for name, tally in state.tree.tallies.items():
        bound, pending = (
            {k: v for k, v in tally.bound.items() if v},
            {k: v for k, v in tally.pending.items() if v},
        )
        if bound or pending:
            out[name] = (bound, pending)
    return out


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_every_pod_is_charged_where_volcano_runs_it_whatever_the_order_of_events(
    world: tuple[dict[str, list[dict[str, Any] | str]], list[str]],
) -> None:
    versions, order = world
    state = cluster(*base())
    apply(state, versions, order)
    objects = final(versions)
    for key, raw in objects.items():
        if key.startswith("pod/"):
            charge = state.charged.charge(raw["metadata"]["uid"])
            assert charge is not None and charge.queue == expected_queue(raw, objects), key
            held = state.pods[raw["metadata"]["uid"]]
            runs = state.run_queue(held.namespace, held.template.annotations, held.owner)
            assert runs.queue == state.queue_of_pod(held) == charge.queue, key
    at_once = cluster(*base(), *objects.values())
    assert tallies(state) == tallies(at_once)

"""The enqueue gate (SPEC §5d, decisions.md §24) in front of stock Volcano v1.15.1, which has no card
plugin: a Volcano Job beyond what is left of its queue's card quota stays Pending with none of its
pods and says why on the job, and is enqueued within 2 s of its cards freeing; two jobs racing for
the last cards: exactly one runs; an ``A|B`` job; a Deployment and a Volcano Job in one queue; pods
of no queue in a namespace with a default queue, under Volcano's own PodGroup mutation (decisions.md
§30). Skipped, with the reason, when stock Volcano's source is not beside the repository."""

import json
import tarfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.agreement import H200, H800, Tenant, app, card_template, hog_deployment, long_job
from tests.e2e.build import PARTNERS
from tests.e2e.cluster import ControlPlane, holds_for, wait_for
from tests.e2e.conftest import partner_plane, serving_webhook
from tests.e2e.objects import card_queue, deployment_of
from tests.edges.serving import Process

WITHIN = 2.0  # seconds from the cards freeing to the job's PodGroup enqueued
FLEX = f"{H200}|{H800}"
PODGROUP_MUTATION = "installer/helm/chart/volcano/policy/podgroups-mutating.yaml"


@pytest.fixture(scope="module")
def volcano(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's partner: stock Volcano."""
    with partner_plane("stock", tmp_path_factory) as plane:
        yield plane


def hierarchical(conf: str) -> str:
    """The release's configuration with the ``capacity`` plugin, hierarchy on, in place of
    ``proportion``: how stock Volcano runs hierarchical queues."""
    return conf.replace("  - name: proportion", "  - name: capacity\n    enableHierarchy: true")


@pytest.fixture(scope="module")
def stock_hierarchy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Process]]:
    with (
        partner_plane("stock", tmp_path_factory, hierarchical) as plane,
        serving_webhook(plane, tmp_path_factory.mktemp("webhook-hierarchy")) as process,
    ):
        yield plane, process


def phase(t: Tenant, job: str) -> str:
    """The phase of the Volcano Job ``job``'s PodGroup ("Pending" until the scheduler writes one;
    "" while it has none)."""
    for group in t.plane.get("podgroups", namespace=t.ns)["items"]:
        refs = group["metadata"].get("ownerReferences") or []
        if any(r.get("kind") == "Job" and r.get("name") == job for r in refs):
            return str((group.get("status") or {}).get("phase") or "Pending")
    return ""


def job_pods(t: Tenant, job: str) -> list[dict[str, Any]]:
    return [p for p in t.pods(finished=True) if p["metadata"]["name"].startswith(f"{job}-")]


def told(t: Tenant) -> set[tuple[str, str]]:
    """(kind, name) of what our enqueue refusal Events are about."""
    events = t.plane.get("events", namespace=t.ns)["items"]
    return {
        (e["involvedObject"]["kind"], e["involvedObject"]["name"])
        for e in events
        if e.get("reason") == "CardQuotaEnqueueRefused"
    }


def seconds_until(check: Callable[[], bool], free: Callable[[], Any]) -> float:
    started = time.monotonic()
    free()
    wait_for("the job to be enqueued", check, timeout=30, every=0.05)
    return time.monotonic() - started


def test_a_job_beyond_what_is_left_waits_with_no_pod_says_why_and_is_enqueued_within_2s(
    tenant: Tenant,
) -> None:
    tenant.set_quota({H200: 2})
    tenant.plane.apply(hog_deployment(H200)(tenant), namespace=tenant.ns)
    wait_for("the hog to be bound", lambda: tenant.settled(1), timeout=60)
    tenant.plane.apply(long_job("train", 2, H200, tenant.queue), namespace=tenant.ns)
    wait_for("the job's PodGroup", lambda: phase(tenant, "train") == "Pending", timeout=30)
    wait_for("the refusal told on the PodGroup and the job", lambda: ("Job", "train") in told(tenant))
    assert any(kind == "PodGroup" for kind, _ in told(tenant))
    holds_for(  # stock Volcano retries every second: three tries, each refused
        "the job Pending with no pod",
        lambda: phase(tenant, "train") == "Pending" and job_pods(tenant, "train") == [],
        3.0,
    )
    took = seconds_until(
        lambda: phase(tenant, "train") in ("Inqueue", "Running"),
        lambda: tenant.plane.kubectl("delete", "-n", tenant.ns, "deployment/hog", "--wait=false"),
    )
    print(f"enqueued {took:.2f} s after its cards freed")
    assert took <= WITHIN
    tenant.wait_settled(2)
    tenant.check_agreement()


def test_two_jobs_racing_for_the_last_cards_exactly_one_runs(tenant: Tenant) -> None:
    tenant.set_quota({H200: 2})
    for name in ("a", "b"):
        tenant.plane.apply(long_job(name, 2, H200, tenant.queue), namespace=tenant.ns)

    def one_runs() -> bool:
        phases = sorted(phase(tenant, name) for name in ("a", "b"))
        return phases[0] == "Pending" and phases[1] in ("Inqueue", "Running") and tenant.settled(2)

    wait_for("one job to run, the other Pending", one_runs, timeout=60)
    # Stock Volcano's sessions run every second: three had every chance to enqueue the other.
    holds_for("exactly one job enqueued, its 2 pods bound", one_runs, 3.0)
    tenant.check_agreement()


def test_an_a_or_b_job_runs_whole_on_the_model_that_has_room(tenant: Tenant) -> None:
    tenant.set_quota({H200: 1, H800: 2})
    tenant.plane.apply(long_job("train", 2, FLEX, tenant.queue), namespace=tenant.ns)
    tenant.wait_settled(2)
    tenant.check_agreement()
    cards = {p["metadata"]["annotations"]["volcano.sh/card.name"] for p in tenant.pods()}
    assert cards == {H800}


def test_a_deployment_and_a_volcano_job_in_one_queue_stay_within_its_quota(tenant: Tenant) -> None:
    tenant.set_quota({H200: 3})
    tenant.plane.apply(app("web", 2, H200, tenant), namespace=tenant.ns)
    tenant.wait_settled(2)
    tenant.plane.apply(long_job("train", 2, H200, tenant.queue), namespace=tenant.ns)
    wait_for("the job refused at enqueue", lambda: ("Job", "train") in told(tenant))
    assert job_pods(tenant, "train") == []
    tenant.plane.kubectl("scale", "-n", tenant.ns, "deployment/web", "--replicas=1")
    wait_for("the job to run", lambda: len(job_pods(tenant, "train")) == 2, timeout=30)
    tenant.wait_settled(3)
    tenant.check_agreement()


def volcano_podgroup_mutation(namespace: str) -> list[dict[str, Any]]:
    """Volcano's own PodGroup mutation, as its chart installs it with ``custom.map_enable``
    (``installer/helm/chart/volcano/policy/podgroups-mutating.yaml``, read from stock's source): a
    PodGroup created in queue ``default`` gets its namespace's ``scheduling.volcano.sh/queue-name``
    (the webhook-manager's ``/podgroups/mutate`` does the same; the harness runs no webhook-manager).
    Served as ``admissionregistration.k8s.io/v1`` (GA in Kubernetes 1.36), named and bound for
    ``namespace`` alone so no other test's PodGroups are touched."""
    with tarfile.open(PARTNERS["stock"].source) as tar:
        member = next(m for m in tar if m.name.removeprefix("./") == PODGROUP_MUTATION)
        data = tar.extractfile(member)
        assert data is not None
        policy, binding = [doc for doc in yaml.safe_load_all(data.read()) if doc]
    for doc in (policy, binding):
        doc["apiVersion"] = "admissionregistration.k8s.io/v1"
        doc["metadata"]["name"] += f"-{namespace}"
    binding["spec"]["policyName"] = policy["metadata"]["name"]
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    binding["spec"]["matchResources"]["namespaceSelector"] = selector
    return [policy, binding]


def test_a_pod_of_no_queue_is_charged_where_volcano_puts_it_its_namespaces_default_queue(
    tenant: Tenant,
) -> None:
    """decisions.md §30: with the namespace annotated, the PodGroup the pg-controller makes (queue
    ``default``) is put in the namespace's queue, and its pods are scheduled there: so they are
    charged and checked there. A pod naming ``default`` is refused (it would run in the namespace's
    queue); a Deployment naming no queue gets what that queue's quota holds, its PodGroups in it."""
    tenant.set_quota({H200: 1})
    mutation = volcano_podgroup_mutation(tenant.ns)
    listed = {"apiVersion": "v1", "kind": "List", "items": mutation}
    tenant.plane.kubectl("apply", "-f", "-", stdin=json.dumps(listed))
    try:
        tenant.plane.kubectl(
            "annotate", "namespace", tenant.ns, f"scheduling.volcano.sh/queue-name={tenant.queue}"
        )
        named = card_template(H200, "default")
        bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", **named["metadata"]}}
        bare["spec"] = named["spec"]

        def refusal() -> str:
            args = ("create", "--dry-run=server", "-n", tenant.ns, "-f", "-")
            done = tenant.plane.kubectl(*args, stdin=json.dumps(bare), check=False)
            return done.stderr if done.returncode else ""

        says = (
            f'pod {tenant.ns}/bare names queue "default" but the podgroup Volcano makes for it is in queue'
            f' "{tenant.queue}", where Volcano schedules it'
        )
        wait_for("the webhook to read the namespace's default queue", lambda: says in refusal(), timeout=30)
        probe = {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "probe"},
            "spec": {"queue": "default", "minMember": 1},
        }

        def moved() -> bool:
            args = ("create", "--dry-run=server", "-o", "json", "-n", tenant.ns, "-f", "-")
            made = json.loads(tenant.plane.kubectl(*args, stdin=json.dumps(probe)).stdout)
            return made["spec"]["queue"] == tenant.queue

        # The API server loads a new admission policy a moment after it is written: until then the
        # pg-controller's PodGroups would stay in ``default`` (and be refused there).
        wait_for("Volcano's PodGroup mutation to be in force", moved, timeout=30)
        unnamed = card_template(H200, "")
        del unnamed["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"]
        tenant.plane.apply(deployment_of("web", 2, unnamed), namespace=tenant.ns)
        tenant.wait_settled(1, refused="web")
        tenant.check_agreement()
        assert any(f'queue "{tenant.queue}" has 0 {H200} left' in m for m in tenant.denials()), (
            tenant.denials()
        )
        groups = tenant.plane.get("podgroups", namespace=tenant.ns)["items"]
        assert groups and {g["spec"]["queue"] for g in groups} == {tenant.queue}
    finally:
        for doc in mutation:
            tenant.plane.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], check=False)


def test_a_job_in_a_child_queue_whose_parent_is_full_waits_until_the_parent_has_room(
    stock_hierarchy: tuple[ControlPlane, Process],
) -> None:
    """Stock ``capacity`` plugin with hierarchy: the parent's card quota limits its children."""
    plane, _ = stock_hierarchy
    child, sibling = Tenant(plane), Tenant(plane)
    parent = f"{child.queue}-parent"
    child.queues.append(parent)
    try:
        plane.kubectl("apply", "-f", "-", stdin=json.dumps(card_queue(parent, {H200: 2})))
        child.set_quota({H200: 2}, parent=parent)
        sibling.set_quota({H200: 2}, parent=parent)
        sibling.plane.apply(app("busy", 2, H200, sibling), namespace=sibling.ns)
        sibling.wait_settled(2)
        child.plane.apply(long_job("train", 1, H200, child.queue), namespace=child.ns)
        wait_for("the refusal told on the job", lambda: ("Job", "train") in told(child))
        events = child.plane.get("events", namespace=child.ns)["items"]
        message = next(e["message"] for e in events if e.get("reason") == "CardQuotaEnqueueRefused")
        assert message.startswith(f'queue "{parent}" (above "{child.queue}", counting all its queues)'), (
            message
        )
        assert phase(child, "train") == "Pending" and job_pods(child, "train") == []
        plane.kubectl("scale", "-n", sibling.ns, "deployment/busy", "--replicas=1")
        child.wait_settled(1)
        child.check_agreement()
    finally:
        sibling.delete()
        child.delete()

"""The rights the webhook uses, against the chart's RBAC.

``WRITES`` lists every write the code makes (and ``READS`` what it reads beyond its informers' lists
and watches), one row per RBAC right, each with the code that makes it. On the control plane, whose
harness installs the chart's ServiceAccount and RBAC (``ControlPlane.identity``, the identity every
webhook process of the suite runs as), each row must be allowed by ``kubectl auth can-i ... --as``
that ServiceAccount, and the rights in ``DENIED`` must not be. Offline, the write sites are found
in ``webhook/`` (every call of a transport's or a Lease client's write method, and every HTTP
method but GET in ``webhook/cluster/kube.py``): a write without a row, or a row whose code is gone,
fails here.
"""

import ast
import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

from tests.e2e.cluster import RELEASE, ROOT, ControlPlane, wait_for
from webhook.cluster import cache
from webhook.core.index.line import CALLED_KINDS
from webhook.core.model.policy import Policy

PACKAGE = ROOT / "webhook"
TENANT = "a-tenant"  # any workload's namespace (the ClusterRole's rights hold in every one)
RELEASE_NS = "(release)"  # the release namespace: the Lease and the replicas' own pods
CLUSTER = "(cluster)"  # a cluster-scoped resource, or every namespace at once
WEBHOOK, PROBE = "the webhook", "helm test's probe"


class Right(NamedTuple):
    verb: str
    resource: str
    subresource: str
    group: str  # "" for the core group
    where: str  # TENANT, RELEASE_NS, "default" or CLUSTER
    sites: tuple[str, ...]  # the code making the call: "<file under webhook/> <function> <method>"
    account: str = WEBHOOK

    def __str__(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.verb} {self.resource}{sub}.{self.group or 'core'} in {self.where}"


# The line's mark and call: a merge patch of one annotation on the refused workload
# (cardquota.volcano.sh/waiting, cardquota.volcano.sh/called), of the kinds the line calls.
LINE = ("cluster/caller.py LineCaller._call annotate", "cluster/caller.py LineCaller._mark annotate")
# The Events a user reads: the line's (CardQuotaCalled, CardQuotaReleased, CardQuotaUnfit on a
# workload, a pod, a PodGroup and its Volcano Job), lending's (CardQuotaBorrowing on a pod or a
# PodGroup and its Volcano Job), enforcement's (CardQuotaWouldRefuse on a pod, a workload, a PodGroup
# and its Volcano Job) and tidal reclaim's (CardQuotaReclaimed, CardQuotaReclaiming,
# CardQuotaNotReclaimed), in the namespace of what they are about.
EVENTS = ("cluster/events.py tell record_event",)

WRITES = (
    # deny mode's line on a refused ReplicaSet (a Deployment's), StatefulSet or batch Job
    Right("patch", "replicasets", "", "apps", TENANT, LINE),
    Right("patch", "statefulsets", "", "apps", TENANT, LINE),
    Right("patch", "jobs", "", "batch", TENANT, LINE),
    # wait mode's release: a JSON patch removing the webhook's scheduling gate from a pod (and
    # narrowing an A|B pod's affinity to the model it was released on); lending's borrowing mark;
    # tidal reclaim's eviction notice on each pod of a gang it evicts, removed when called off
    Right(
        "patch",
        "pods",
        "",
        "",
        TENANT,
        (
            "cluster/caller.py LineCaller._release patch",
            "cluster/caller.py LineCaller._mark_borrowings annotate",
            "cluster/reclaimer.py Reclaimer._evict annotate",
            "cluster/reclaimer.py Reclaimer._call_off annotate",
        ),
    ),
    Right("create", "events", "", "", TENANT, EVENTS),
    # the auditor's CardQuotaOvercommitted on a Queue (cluster-scoped: its Events live in default)
    # and its CardQuotaResourceNotSent on a Node whose card resource the filters never send
    Right(
        "create",
        "events",
        "",
        "",
        "default",
        (
            "cluster/sources.py LiveSource.audit_once warn_queue",
            "cluster/sources.py LiveSource.audit_once warn_node",
        ),
    ),
    # tidal reclaim: a dry run of each pod of a training gang (once its budgets allow the gang whole),
    # then each pod evicted, tried again until the whole gang is gone
    Right(
        "create",
        "pods",
        "eviction",
        "",
        TENANT,
        ("cluster/reclaimer.py Reclaimer._refusal evict", "cluster/reclaimer.py Reclaimer._go_on evict"),
    ),
    # tidal reclaim's hold: cardquota.volcano.sh/reclaimed on the victim's PodGroup, written before
    # the evictions (a new leader holds the cards too) and removed when the hold is over; lending's
    # cardquota.volcano.sh/borrowing on a pod or PodGroup admitted on borrowed cards
    Right(
        "patch",
        "podgroups",
        "",
        "scheduling.volcano.sh",
        TENANT,
        (
            "cluster/reclaimer.py Reclaimer._mark annotate",
            "cluster/caller.py LineCaller._mark_borrowings annotate",
        ),
    ),
    # leader election (--leader-elect): the Lease created, renewed, and released at SIGTERM
    Right(
        "create",
        "leases",
        "",
        "coordination.k8s.io",
        RELEASE_NS,
        ("cluster/lease.py LeaderElector._write create",),
    ),
    Right(
        "update",
        "leases",
        "",
        "coordination.k8s.io",
        RELEASE_NS,
        ("cluster/lease.py LeaderElector._write replace", "cluster/lease.py LeaderElector.release replace"),
    ),
    # --label-leader-pod: the Lease holder labels its own pod cardquota.volcano.sh/serving=true
    Right("patch", "pods", "", "", RELEASE_NS, ("cluster/lease.py ServingLabel.sync label",)),
    # helm test's probe (`cardquota probe`), under its own account: a Queue created with dryRun=All
    Right(
        "create",
        "queues",
        "",
        "scheduling.volcano.sh",
        CLUSTER,
        ("serve/probe.py run.go dry_run_create",),
        PROBE,
    ),
)

READS = (
    # the Lease, read every round and before the release
    Right(
        "get",
        "leases",
        "",
        "coordination.k8s.io",
        RELEASE_NS,
        (
            "cluster/lease.py LeaderElector.try_acquire_or_renew get",
            "cluster/lease.py LeaderElector.release get",
        ),
    ),
    # wait mode reads the pod live before it releases it (the patch is made against what is there);
    # tidal reclaim reads a beneficiary live (did the scheduler call it Unschedulable?) and a gang's
    # pods (to judge them against their budgets)
    Right(
        "get",
        "pods",
        "",
        "",
        TENANT,
        (
            "cluster/caller.py LineCaller._release get",
            "cluster/reclaimer.py Reclaimer._learn get",
            "cluster/reclaimer.py Reclaimer._refusal get",
        ),
    ),
    # tidal reclaim judges a gang whole against its namespace's PodDisruptionBudgets (read, never cached)
    Right(
        "list",
        "poddisruptionbudgets",
        "",
        "policy",
        TENANT,
        ("cluster/reclaimer.py Reclaimer._refusal list_in",),
    ),
)
# What a review needs read live when the cache lacks it or shows it behind (a PodGroup's owner, a
# pod's claims and templates, a claim's pod, a pod's PodGroup): any kind the informers watch
# (cache.kind_of), whose get is checked with their list and watch below.
OWNER_READ = "cluster/sources.py LiveSource.fetch get"

# Rights the webhook must not have: it never creates, deletes or replaces a workload or a pod,
# writes no spec but a pod's own gate, reads no Secret, and writes its Lease only where it lives.
DENIED = (
    Right("create", "pods", "", "", TENANT, ()),
    Right("delete", "pods", "", "", TENANT, ()),
    Right("update", "pods", "", "", TENANT, ()),
    Right("patch", "pods", "status", "", TENANT, ()),
    Right("get", "secrets", "", "", TENANT, ()),
    Right("list", "secrets", "", "", CLUSTER, ()),
    Right("update", "secrets", "", "", RELEASE_NS, ()),
    Right("patch", "deployments", "", "apps", TENANT, ()),
    Right("update", "replicasets", "", "apps", TENANT, ()),
    Right("delete", "replicasets", "", "apps", TENANT, ()),
    Right("delete", "jobs", "", "batch", TENANT, ()),
    Right("patch", "queues", "", "scheduling.volcano.sh", CLUSTER, ()),
    Right("create", "queues", "", "scheduling.volcano.sh", CLUSTER, ()),
    Right("create", "podgroups", "", "scheduling.volcano.sh", TENANT, ()),
    Right("update", "podgroups", "", "scheduling.volcano.sh", TENANT, ()),
    Right("delete", "podgroups", "", "scheduling.volcano.sh", TENANT, ()),
    Right("patch", "jobs", "", "batch.volcano.sh", TENANT, ()),
    Right("patch", "events", "", "", TENANT, ()),
    Right("create", "leases", "", "coordination.k8s.io", TENANT, ()),
    Right("update", "leases", "", "coordination.k8s.io", "kube-system", ()),
    Right("delete", "leases", "", "coordination.k8s.io", RELEASE_NS, ()),
    Right("patch", "resourceclaims", "", "resource.k8s.io", TENANT, ()),
    Right("delete", "poddisruptionbudgets", "", "policy", TENANT, ()),
    Right("create", "clusterrolebindings", "", "rbac.authorization.k8s.io", CLUSTER, ()),
    Right("impersonate", "users", "", "", CLUSTER, ()),
)

# What each method a write site calls sends (webhook/cluster/kube.py), and so the RBAC verb.
SENDS = {
    "annotate": ("KubeTransport.annotate", "patch"),
    "patch": ("KubeTransport.patch", "patch"),
    "evict": ("KubeTransport.evict", "create"),
    "record_event": ("KubeTransport.record_event", "create"),
    "warn_queue": ("KubeTransport.record_event", "create"),  # through record_event, in default
    "warn_node": ("KubeTransport.record_event", "create"),  # through record_event, in default
    "dry_run_create": ("KubeTransport.dry_run_create", "create"),
    "create": ("KubeLeaseClient.create", "create"),
    "replace": ("KubeLeaseClient.replace", "update"),
    "label": ("KubePodLabel.label", "patch"),
    "get": ("", "get"),
    "list_in": ("", "list"),
}
HTTP_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
RECEIVER = re.compile(r"(transport|client)$")  # self.transport, self._transport, self.client, transport


def sites() -> set[str]:
    """Every call in ``webhook/`` of a method of ``SENDS`` on a transport or a Lease client."""
    found: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        calls(ast.parse(path.read_text(), str(path)), [path.relative_to(PACKAGE).as_posix()], found)
    return found


def calls(node: ast.AST, scope: list[str], found: set[str]) -> None:
    """Add to ``found`` each such call under ``node`` as "<file> <function> <method>"; ``scope``:
    the file, then the classes and functions ``node`` is in."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            calls(child, [*scope, child.name], found)
            continue
        if (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Attribute)
            and child.func.attr in SENDS
            and RECEIVER.search(ast.unparse(child.func.value))
        ):
            found.add(f"{scope[0]} {'.'.join(scope[1:])} {child.func.attr}")
        calls(child, scope, found)


def kube_writes() -> dict[str, str]:
    """The functions of ``webhook/cluster/kube.py`` that name an HTTP method other than GET, with it."""
    tree = ast.parse((PACKAGE / "cluster" / "kube.py").read_text())
    found: dict[str, str] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for function in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                if isinstance(node, ast.Constant) and node.value in HTTP_VERBS:
                    found[f"{cls.name}.{function.name}"] = str(node.value)
    return found


def test_every_write_site_in_the_code_has_its_row_and_every_row_its_code() -> None:
    tabled = {site for row in (*WRITES, *READS) for site in row.sites} | {OWNER_READ}
    found = sites()
    assert found - tabled == set(), "a write (or live read) without a row in WRITES or READS: add one"
    assert tabled - found == set(), "a row whose code is gone: remove or rename it"


def test_every_write_method_of_the_transport_is_the_verb_the_rows_name() -> None:
    writes = kube_writes()
    sent = {method for method, _ in SENDS.values() if method}
    assert set(writes) == sent, "a new write method in kube.py: add it to SENDS and its calls to WRITES"
    for row in WRITES + READS:
        for site in row.sites:
            method, verb = SENDS[site.rsplit(" ", 1)[1]]
            assert verb == row.verb, (str(row), site)
            assert not method or HTTP_VERBS[writes[method]] == verb, (str(row), site, writes[method])


def test_the_line_marks_and_calls_exactly_the_kinds_it_calls() -> None:
    called = {(k.api_version.rpartition("/")[0], k.plural) for k in cache.KINDS if k.record in CALLED_KINDS}
    assert {(row.group, row.resource) for row in WRITES if row.sites == LINE} == called


def can_i(plane: ControlPlane, right: Right, user: str) -> bool:
    """``kubectl auth can-i`` as ``user``, the tests' admin impersonating it."""
    resource = f"{right.resource}.{right.group}" if right.group else right.resource
    args = ["auth", "can-i", right.verb, resource, f"--as={user}"]
    if right.subresource:
        args.append(f"--subresource={right.subresource}")
    where = {RELEASE_NS: plane.release_namespace, TENANT: TENANT}.get(right.where, right.where)
    args += ["--all-namespaces"] if where == CLUSTER else ["-n", where]
    done = plane.kubectl(*args, check=False)
    assert done.stdout.strip() in ("yes", "no"), done.stdout + done.stderr
    return done.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def probe_account(control_plane: ControlPlane) -> Iterator[str]:
    """helm test's probe account and its RBAC, as the chart renders them (its pod left out): what
    exists while ``helm test`` runs."""
    rendered = control_plane.render_identity(templates=["templates/tests/probe.yaml"])
    objects = [o for o in rendered if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    (account,) = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    control_plane.apply(*objects, namespace=control_plane.release_namespace)
    try:
        yield f"system:serviceaccount:{control_plane.release_namespace}:{account}"
    finally:
        for o in objects:
            args = [o["kind"].lower(), o["metadata"]["name"], "-n", control_plane.release_namespace]
            control_plane.kubectl("delete", *args, "--ignore-not-found", check=False)


def test_the_webhook_processes_run_as_the_charts_service_account(control_plane: ControlPlane) -> None:
    kubectl = [str(control_plane.bin / "kubectl"), f"--kubeconfig={control_plane.webhook_kubeconfig}"]
    done = subprocess.run(
        [*kubectl, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == control_plane.webhook_user
    assert control_plane.webhook_user == f"system:serviceaccount:{RELEASE}:{RELEASE}"


@pytest.mark.parametrize("right", [*WRITES, *READS], ids=str)
def test_the_chart_grants_every_write_and_live_read_the_code_makes(
    control_plane: ControlPlane, probe_account: str, right: Right
) -> None:
    user = probe_account if right.account == PROBE else control_plane.webhook_user
    assert can_i(control_plane, right, user), f"{right.account} may not {right}: needed by {right.sites}"


@pytest.mark.parametrize("kind", cache.watched(Policy()), ids=lambda k: f"{k.plural}.{k.api_version}")
def test_the_chart_lets_the_webhook_list_watch_and_get_every_kind_its_cache_watches(
    control_plane: ControlPlane, kind: cache.Kind
) -> None:
    group = kind.api_version.rpartition("/")[0]
    for verb in ("list", "watch", "get"):
        right = Right(verb, kind.plural, "", group, CLUSTER, ())
        assert can_i(control_plane, right, control_plane.webhook_user), str(right)


@pytest.mark.parametrize("right", DENIED, ids=str)
def test_the_chart_denies_what_the_webhook_never_does(control_plane: ControlPlane, right: Right) -> None:
    assert not can_i(control_plane, right, control_plane.webhook_user), f"the webhook may {right}"


def rules(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every rule of the rendered ClusterRole."""
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_with_reclaim_off_the_chart_grants_no_eviction_or_budget_read(
    control_plane: ControlPlane,
) -> None:
    reclaim = {("", "pods/eviction", "create"), ("policy", "poddisruptionbudgets", "list")}
    # the PodGroup's patch stays: lending's borrowing mark is written whatever reclaim's mode
    assert ("scheduling.volcano.sh", "podgroups", "patch") in rules(
        control_plane.render_identity("--set", "reclaim.mode=off")
    )
    assert reclaim <= rules(control_plane.render_identity())
    # dry-run: a Queue's cardquota.volcano.sh/reclaim annotation may still turn it on for that queue
    assert reclaim <= rules(control_plane.render_identity("--set", "reclaim.mode=dry-run"))
    assert not reclaim & rules(control_plane.render_identity("--set", "reclaim.mode=off"))


OWN = "cardquota-own-writes"  # the namespace the tests below write in as the webhook's account


@pytest.fixture(scope="module")
def own_writes(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """A namespace no webhook applies to, with a pod under our gate and another's, a ReplicaSet of
    no pods, a PodGroup; and a pod in the release namespace (which the webhooks exclude)."""
    plane = control_plane
    plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OWN}})
    gates = [{"name": "cardquota.volcano.sh/waiting"}, {"name": "example.com/other"}]
    container = {"name": "main", "image": "registry.example/app:1"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "p"}},
        "spec": {"containers": [container], "schedulingGates": gates},
    }
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "r"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "r"}},
            "template": {"metadata": {"labels": {"app": "r"}}, "spec": {"containers": [container]}},
        },
    }
    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "g"},
        "spec": {"minMember": 1, "queue": "default"},
    }
    plane.apply(pod, replicaset, group, namespace=OWN)
    plane.apply({**pod, "spec": {"containers": [container]}}, namespace=plane.release_namespace)

    def in_force() -> bool:  # the API server applies a new policy once its informer has it
        refused = as_webhook(plane, "annotate", "rs", "r", "probe=x", "-n", OWN)
        marks = plane.kubectl(
            "annotate", "rs", "r", "cardquota.volcano.sh/called=probe", "-n", OWN, check=False
        )
        return all(r.returncode != 0 and "ValidatingAdmissionPolicy" in r.stderr for r in (refused, marks))

    try:
        wait_for("the chart's admission policy to be in force", in_force, timeout=30)
        yield plane
    finally:
        plane.kubectl("delete", "namespace", OWN, "--wait=false", check=False)
        plane.kubectl("delete", "pod", "p", "-n", plane.release_namespace, "--wait=false", check=False)


def as_webhook(plane: ControlPlane, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``kubectl`` with the webhook's own ServiceAccount token."""
    return subprocess.run(
        [str(plane.bin / "kubectl"), f"--kubeconfig={plane.webhook_kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def answered(what: str, done: subprocess.CompletedProcess[str], refused: str) -> None:
    """A write went through (``refused`` empty), or was refused by one of the chart's policies
    saying ``refused``."""
    if refused:
        assert done.returncode != 0, f"{what}: {done.stdout}"
        assert "ValidatingAdmissionPolicy" in done.stderr and refused in done.stderr, done.stderr
    else:
        assert done.returncode == 0, f"{what}: {done.stderr}"


GATES_BUT_OURS = '[{"op":"remove","path":"/spec/schedulingGates/1"}]'
OWN_WRITES = [
    # (what, kubectl args, refused with, or "" when allowed)
    ("its card annotation on a pod", ["annotate", "pod", "p", "cardquota.volcano.sh/card.spec=x"], ""),
    ("another annotation on a pod", ["annotate", "pod", "p", "team=x"], "only its own annotations of a pods"),
    ("another label on a pod", ["label", "pod", "p", "app=q", "--overwrite"], "no label of a pods"),
    ("its serving label on a pod", ["label", "pod", "p", "cardquota.volcano.sh/serving=true"], ""),
    (
        "another's scheduling gate",
        ["patch", "pod", "p", "--type", "json", "-p", GATES_BUT_OURS],
        "only its own scheduling gate",
    ),
    ("its call on a ReplicaSet", ["annotate", "rs", "r", "cardquota.volcano.sh/called=now"], ""),
    (
        "a ReplicaSet's card",
        ["annotate", "rs", "r", "volcano.sh/card.name=NVIDIA-H200"],
        "only its own annotations of a replicasets",
    ),
    (
        "a ReplicaSet's replicas",
        ["patch", "rs", "r", "--type", "merge", "-p", '{"spec":{"replicas":3}}'],
        "nothing of a replicasets but its own annotations",
    ),
    ("its hold mark on a PodGroup", ["annotate", "podgroup", "g", "cardquota.volcano.sh/reclaimed=x"], ""),
    (
        "its borrowing mark on a PodGroup",
        ["annotate", "podgroup", "g", "cardquota.volcano.sh/borrowing=x"],
        "",
    ),
    ("its borrowing mark on a pod", ["annotate", "pod", "p", "cardquota.volcano.sh/borrowing=x"], ""),
    ("its eviction notice on a pod", ["annotate", "pod", "p", "cardquota.volcano.sh/evicting=x"], ""),
    (
        "a PodGroup's request",
        ["annotate", "podgroup", "g", 'volcano.sh/card.request={"NVIDIA-H200":1}'],
        "only its own annotations of a podgroups",
    ),
    (
        "a PodGroup's size",
        ["patch", "podgroup", "g", "--type", "merge", "-p", '{"spec":{"minMember":2}}'],
        "nothing of a podgroups but its own annotations",
    ),
]


@pytest.mark.parametrize(("what", "args", "refused"), OWN_WRITES, ids=[w[0] for w in OWN_WRITES])
def test_the_charts_policy_lets_the_webhooks_account_write_only_what_it_argues_for(
    own_writes: ControlPlane, what: str, args: list[str], refused: str
) -> None:
    """The chart's ValidatingAdmissionPolicy confines the account's writes, which its RBAC grants on
    whole resources: each write it needs goes through, each other one is refused, saying why."""
    answered(what, as_webhook(own_writes, *args, "-n", OWN), refused)


def test_the_charts_policy_lets_the_webhooks_account_evict_no_pod_in_an_excluded_namespace(
    own_writes: ControlPlane,
) -> None:
    namespace = own_writes.release_namespace
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "p", "namespace": namespace},
    }
    path = f"/api/v1/namespaces/{namespace}/pods/p/eviction"
    done = as_webhook(own_writes, "create", "--raw", path, "-f", "-", stdin=json.dumps(eviction))
    assert done.returncode != 0 and f"evicts no pod in namespace {namespace}" in done.stderr, done.stderr
    assert own_writes.get("pod", "p", namespace=namespace)["metadata"].get("deletionTimestamp") is None


MARK = '{"since":"1970-01-01T00:00:00Z","priority":2147483647}'
MARKS_REFUSED = "only the card-quota webhook sets, changes or removes its marks"


def as_tenant(plane: ControlPlane, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``kubectl`` as anyone but the webhook (the tests' admin: every right a tenant could have)."""
    return plane.kubectl(*args, "-n", OWN, stdin=stdin, check=False)


TENANT_MARKS = [
    # (what, kubectl args, refused with, or "" when allowed)
    (
        "the line's mark on a ReplicaSet",
        ["annotate", "rs", "r", f"cardquota.volcano.sh/waiting={MARK}", "--overwrite"],
        MARKS_REFUSED,
    ),
    (
        "the line's call on a ReplicaSet",
        ["annotate", "rs", "r", "cardquota.volcano.sh/called=by-a-tenant", "--overwrite"],
        MARKS_REFUSED,
    ),
    (
        "reclaim's hold mark on a PodGroup",
        ["annotate", "podgroup", "g", "cardquota.volcano.sh/reclaimed={}", "--overwrite"],
        MARKS_REFUSED,
    ),
    (
        "lending's mark on a PodGroup",
        ["annotate", "podgroup", "g", "cardquota.volcano.sh/borrowing={}", "--overwrite"],
        MARKS_REFUSED,
    ),
    (
        "lending's mark on a pod",
        ["annotate", "pod", "p", "cardquota.volcano.sh/borrowing={}", "--overwrite"],
        MARKS_REFUSED,
    ),
    ("another annotation on a ReplicaSet", ["annotate", "rs", "r", "team=a", "--overwrite"], ""),
    (
        "reclaim's eviction notice on a pod",
        ["annotate", "pod", "p", "cardquota.volcano.sh/evicting={}", "--overwrite"],
        MARKS_REFUSED,
    ),
    ("another annotation on a pod", ["annotate", "pod", "p", "team=a", "--overwrite"], ""),
    ("another annotation on a PodGroup", ["annotate", "podgroup", "g", "team=a", "--overwrite"], ""),
]


@pytest.mark.parametrize(("what", "args", "refused"), TENANT_MARKS, ids=[w[0] for w in TENANT_MARKS])
def test_the_charts_policy_keeps_the_webhooks_marks_from_everyone_else(
    own_writes: ControlPlane, what: str, args: list[str], refused: str
) -> None:
    """The line's and reclaim's marks decide who is called and who is held back: a tenant who could
    set them would head any queue's line (decisions.md §29)."""
    answered(what, as_tenant(own_writes, *args), refused)


def test_a_mark_the_webhook_wrote_cannot_be_removed_or_changed_by_anyone_else(
    own_writes: ControlPlane,
) -> None:
    made = as_webhook(
        own_writes, "annotate", "rs", "r", "cardquota.volcano.sh/called=then", "--overwrite", "-n", OWN
    )
    assert made.returncode == 0, made.stderr
    for args in (["cardquota.volcano.sh/called-"], ["cardquota.volcano.sh/called=later", "--overwrite"]):
        done = as_tenant(own_writes, "annotate", "rs", "r", *args)
        assert done.returncode != 0 and MARKS_REFUSED in done.stderr, done.stderr
    annotations = own_writes.get("rs", "r", namespace=OWN)["metadata"]["annotations"]
    assert annotations["cardquota.volcano.sh/called"] == "then"


@pytest.mark.parametrize(
    ("annotations", "refused"),
    [
        pytest.param({"cardquota.volcano.sh/borrowing": "{}"}, True, id="the borrowing mark"),
        pytest.param({"cardquota.volcano.sh/evicting": "{}"}, True, id="the eviction notice"),
        pytest.param({"team": "a"}, False, id="its twin: another annotation"),
    ],
)
def test_no_pod_is_created_with_the_borrowing_mark_or_eviction_notice_but_by_the_webhook(
    own_writes: ControlPlane, annotations: dict[str, str], refused: bool
) -> None:
    """The mark says a pod runs on cards its queue borrows, the notice when reclaim evicts it: only
    the webhook says either."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"m-{uuid.uuid4().hex[:6]}", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "registry.example/app:1"}]},
    }
    done = as_tenant(own_writes, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    answered("a pod created with " + ", ".join(annotations), done, MARKS_REFUSED if refused else "")


@pytest.mark.parametrize(
    ("template", "refused"),
    [
        pytest.param({"annotations": {"cardquota.volcano.sh/waiting": MARK}}, True, id="the waiting mark"),
        pytest.param({"gates": True}, True, id="the waiting gate"),
        pytest.param(
            {"annotations": {"cardquota.volcano.sh/borrowing": "{}"}}, True, id="the borrowing mark"
        ),
        pytest.param(
            {"annotations": {"cardquota.volcano.sh/evicting": "{}"}}, True, id="the eviction notice"
        ),
        pytest.param({"annotations": {"team": "a"}}, False, id="its twin: another annotation"),
    ],
)
def test_no_workload_template_may_carry_the_webhooks_marks_or_gate(
    own_writes: ControlPlane, template: dict[str, Any], refused: bool
) -> None:
    meta: dict[str, Any] = {"labels": {"app": "t"}, "annotations": template.get("annotations", {})}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.example/app:1"}]}
    if template.get("gates"):
        spec["schedulingGates"] = [{"name": "cardquota.volcano.sh/waiting"}]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"t-{uuid.uuid4().hex[:6]}"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "t"}},
            "template": {"metadata": meta, "spec": spec},
        },
    }
    done = as_tenant(own_writes, "create", "--dry-run=server", "-f", "-", stdin=json.dumps(deployment))
    if refused:
        assert done.returncode != 0 and "its pod template carries the" in done.stderr, done.stderr
        ours = {"cardquota.volcano.sh/borrowing", "cardquota.volcano.sh/evicting"} & meta[
            "annotations"
        ].keys()
        said = "the borrowing mark or the eviction notice" if ours else "the waiting mark or scheduling gate"
        assert said in done.stderr, done.stderr
    else:
        assert done.returncode == 0, done.stderr

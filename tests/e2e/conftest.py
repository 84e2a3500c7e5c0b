"""Fixtures for end-to-end tests against a real control plane (one per session, one namespace per
test). When a test fails, every component's log is copied to ``out/e2e/<test>/`` and the tails are
attached to the report."""

import contextlib
import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agreement import Tenant
from tests.e2e.build import ensure_volcano, no_volcano, partners_required
from tests.e2e.cluster import ROOT, ControlPlane, recommended, wait_for
from tests.e2e.objects import SELECTOR, card_queue
from tests.e2e.recorder import Recorder
from tests.e2e.registration import configurations
from tests.edges.serving import Process

OUT = ROOT / "out" / "e2e"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    try:
        yield plane.start()
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def recorder(control_plane: ControlPlane) -> Iterator[Recorder]:
    hook = Recorder(control_plane.certs).start()
    control_plane.apply(hook.configuration("cardquota-e2e-recorder", SELECTOR))
    probe = f"webhook-probe-{uuid.uuid4().hex[:6]}"
    control_plane.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": probe, "labels": SELECTOR}}
    )

    def answered() -> bool:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe"},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }
        control_plane.kubectl("create", "--dry-run=server", "-n", probe, "-f", "-", stdin=json.dumps(pod))
        return bool(hook.matching("pods", "CREATE", namespace=probe))

    wait_for("the API server to call the registered webhook", answered, timeout=30)
    try:
        yield hook
    finally:
        control_plane.kubectl(
            "delete",
            "validatingwebhookconfiguration",
            "cardquota-e2e-recorder",
            "--ignore-not-found",
            check=False,
        )
        hook.stop()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    control_plane.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": SELECTOR}}
    )
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    args = getattr(item, "funcargs", {})
    plane = next((a for a in args.values() if isinstance(a, ControlPlane)), None)
    if report.failed and plane is not None and plane.logs.exists():
        target = OUT / item.name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(plane.logs, target)
        for log in sorted(Path(target).glob("*.log")):
            report.sections.append(
                (
                    f"{log.stem} (last lines; whole log in {log})",
                    "\n".join(log.read_text(errors="replace").splitlines()[-40:]),
                )
            )
    return report


@pytest.fixture
def card_quota(control_plane: ControlPlane, namespace: str) -> Iterator[Callable[[dict[str, int]], str]]:
    """Makes the test's queue ``q-<namespace>`` with a card quota, and removes it afterwards."""
    made: list[str] = []

    def make(quota: dict[str, int]) -> str:
        name = f"q-{namespace}"
        control_plane.apply(card_queue(name, quota))
        made.append(name)
        return name

    yield make
    for name in made:
        control_plane.kubectl("delete", "queue", name, check=False)


@contextlib.contextmanager
def serving_webhook(plane: ControlPlane, tmp: Path, *extra: str) -> Iterator[Process]:
    """The webhook on ``plane``'s live cache, run as the chart's ServiceAccount and registered by URL
    for the test namespaces; its log beside the plane's (a failed test's report carries them all).
    It fails when the API server refused it a right."""
    flags = ("--kubeconfig", str(plane.webhook_kubeconfig), "--drain-seconds", "0", *extra)
    prefix = f"cardquota-e2e-{uuid.uuid4().hex[:6]}"
    process = Process(tmp / "certs", plane.logs / f"{prefix}.log", *flags, cluster=None)
    registered = configurations(process.url, process.certs / "ca.crt", SELECTOR, prefix, plane.webhook_user)
    try:
        process.wait_ready(timeout=60)
        plane.apply(*registered)

        def answers() -> bool:
            done = plane.kubectl(
                "create",
                "--dry-run=server",
                "-f",
                "-",
                stdin=json.dumps(card_queue("probe", "x")),
                check=False,
            )
            return "malformed volcano.sh/card.quota" in done.stderr

        wait_for("the API server to call the webhook", answers, timeout=30)
        yield process
        plane.assert_no_rbac_refusal(process.log())
    finally:
        for config in registered:
            plane.kubectl("delete", config["kind"].lower(), config["metadata"]["name"], check=False)
        process.stop()


@contextlib.contextmanager
def partner_plane(
    partner: str, tmp_path_factory: pytest.TempPathFactory, conf: Callable[[str], str] = str
) -> Iterator[ControlPlane]:
    """A control plane with ``partner``'s real Volcano scheduler and controller ("fork": the
    capacity-card plugin; "stock": released v1.15.1); skipped, with the reason, without its source
    (failed under ``CI=true``).
    ``conf``: how the scheduler configuration its release ships, made ``recommended``, is changed
    for this plane."""
    built = ensure_volcano(partner)
    if built is None:
        if partners_required():
            pytest.fail(f"CI=true: {no_volcano(partner)}")
        pytest.skip(no_volcano(partner))
    changed = conf(recommended((built / "scheduler.conf").read_text()))
    workdir = tmp_path_factory.mktemp(f"volcano-{partner}")
    plane = ControlPlane(workdir, volcano=built, partner=partner, conf=changed)
    try:
        yield plane.start()
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def volcano(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The real-scheduler control plane (the fork's; a module may override it with another)."""
    with partner_plane("fork", tmp_path_factory) as plane:
        yield plane


@pytest.fixture(scope="module")
def front(volcano: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The webhook in front of the module's real-scheduler control plane."""
    with serving_webhook(volcano, tmp_path_factory.mktemp("webhook")) as process:
        yield process


@pytest.fixture
def tenant(volcano: ControlPlane, front: Process) -> Iterator[Tenant]:
    """One test's namespace and queue on it, deleted afterwards."""
    made = Tenant(volcano)
    yield made
    made.delete()


@pytest.fixture(scope="module")
def webhook(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    with serving_webhook(control_plane, tmp_path_factory.mktemp("webhook"), "--service-type") as process:
        yield process

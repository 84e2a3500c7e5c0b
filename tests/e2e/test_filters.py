"""The chart's own filters, evaluated: every webhook's ``matchConditions`` as ``helm template``
renders them, run by a CEL runtime over generated objects. What must reach the webhook does (a pod
or workload asking any resource the code counts, a PodGroup edit that strips its card annotations)
and what must not does not (CPU-only pods, unrelated extended resources, a PodGroup without cards).
The live tests register these very configurations (tests/e2e/registration.py)."""

import functools
from typing import Any

import pytest
from cel_expr_python import cel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.test_sent_resources import COUNTED
from tests.e2e.registration import render
from webhook.core.model.policy import SENT_RESOURCE_PREFIXES

CORE = ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi"]
UNRELATED = ["example.com/fpga", "rdma/hca", "smarter-devices/fuse"]
# a vendor's own resource under each prefix the filters send (node discovery reads any vendor)
VENDORS = [p + "gpu" if p.endswith("/") else p for p in SENT_RESOURCE_PREFIXES]


@functools.cache
def _env() -> Any:
    return cel.NewEnv(variables={name: cel.Type.DYN for name in ("object", "oldObject", "request")})


@functools.cache
def hooks(*flags: str) -> dict[str, list[tuple[str, Any]]]:
    """Each webhook's name -> its compiled matchConditions, as the chart renders them."""
    found: dict[str, list[tuple[str, Any]]] = {}
    for config in render(flags):
        for hook in config["webhooks"]:
            found[hook["name"]] = [
                (c["name"], _env().compile(c["expression"])) for c in hook.get("matchConditions", [])
            ]
    return found


def sent(
    hook: str,
    obj: Any,
    old: Any = None,
    *,
    group: str = "",
    resource: str = "pods",
    operation: str = "CREATE",
    flags: tuple[str, ...] = (),
) -> bool:
    """Whether the API server sends this request to ``hook``: every matchCondition true."""
    request = {
        "resource": {"group": group, "version": "v1", "resource": resource},
        "subResource": "",
        "operation": operation,
        "userInfo": {"username": "alice"},
    }
    results = []
    for name, program in hooks(*flags)[hook]:
        value = program.eval(data={"object": obj, "oldObject": old, "request": request}).value()
        assert isinstance(value, bool), f"{hook}: {name} gave {value!r}"
        results.append(value)
    return all(results)


def spec_with(resources: list[tuple[str, str, bool]]) -> dict[str, Any]:
    """A pod spec whose containers ask ``(resource, limits|requests, in an init container)``."""
    containers: list[dict[str, Any]] = [{"name": "main", "image": "x", "resources": {}}]
    init: list[dict[str, Any]] = []
    for resource, where, is_init in resources:
        target = init if is_init else containers
        if is_init and not init:
            init.append({"name": "setup", "image": "x", "resources": {}})
        target[-1]["resources"].setdefault(where, {})[resource] = "1"
    spec: dict[str, Any] = {"containers": containers}
    if init:
        spec["initContainers"] = init
    return spec


def asked(names: list[str]) -> st.SearchStrategy[list[tuple[str, str, bool]]]:
    one = st.tuples(st.sampled_from(names), st.sampled_from(["limits", "requests"]), st.booleans())
    return st.lists(one, min_size=1, max_size=3)


POD_HOOKS = ("validate.cardquota.volcano.sh", "pods.mutate.cardquota.volcano.sh")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    card=asked(COUNTED + VENDORS),
    noise=st.lists(
        st.tuples(st.sampled_from(CORE + UNRELATED), st.sampled_from(["limits", "requests"]), st.booleans()),
        max_size=3,
    ),
)
def test_a_pod_or_workload_asking_any_resource_the_code_counts_is_sent(
    card: list[tuple[str, str, bool]], noise: list[tuple[str, str, bool]]
) -> None:
    spec = spec_with(noise + card)
    pod = {"metadata": {"name": "p"}, "spec": spec}
    for hook in POD_HOOKS:
        assert sent(hook, pod), f"{hook} keeps out a pod asking {card}"
    workload = {
        "metadata": {"name": "w"},
        "spec": {"replicas": 1, "template": {"metadata": {}, "spec": spec}},
    }
    assert sent("validate.cardquota.volcano.sh", workload, group="apps", resource="deployments")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    other=st.lists(
        st.tuples(st.sampled_from(CORE + UNRELATED), st.sampled_from(["limits", "requests"]), st.booleans()),
        max_size=4,
    )
)
def test_a_pod_or_workload_asking_no_card_is_kept_out(other: list[tuple[str, str, bool]]) -> None:
    spec = spec_with(other)
    pod = {"metadata": {"name": "p", "annotations": {"team": "a"}}, "spec": spec}
    for hook in POD_HOOKS:
        assert not sent(hook, pod)
    workload = {
        "metadata": {"name": "w"},
        "spec": {"replicas": 1, "template": {"metadata": {}, "spec": spec}},
    }
    assert not sent("validate.cardquota.volcano.sh", workload, group="apps", resource="deployments")


def test_a_pod_naming_a_card_or_claiming_a_device_is_sent_whatever_it_asks() -> None:
    named = {"metadata": {"annotations": {"volcano.sh/card.name": "NVIDIA-H200"}}, "spec": spec_with([])}
    claims = {"metadata": {}, "spec": {**spec_with([]), "resourceClaims": [{"name": "gpu"}]}}
    for hook in POD_HOOKS:
        assert sent(hook, named) and sent(hook, claims)


def podgroup(phase: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "pg", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"queue": "q", "minMember": 1, **spec}, "status": {"phase": phase}}


REQUEST = {"volcano.sh/card.request": '{"NVIDIA-H200": 2}'}
GATE = "enqueue.validate.cardquota.volcano.sh"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(
            podgroup("Pending", REQUEST), podgroup("Inqueue", REQUEST), True, id="a card group enqueued"
        ),
        pytest.param(podgroup("Pending"), podgroup("Inqueue"), False, id="a group without cards enqueued"),
        pytest.param(
            podgroup("Inqueue", REQUEST), podgroup("Inqueue"), True, id="an enqueued group stripped"
        ),
        pytest.param(
            podgroup("Running", REQUEST), podgroup("Running", {}), True, id="a running group stripped"
        ),
        pytest.param(podgroup("Pending", REQUEST), podgroup("Pending"), False, id="a pending group stripped"),
        pytest.param(
            podgroup("Pending", REQUEST),
            {**podgroup("Pending", REQUEST), "spec": {"queue": "other"}},
            True,
            id="a pending group moved",
        ),
        pytest.param(
            podgroup(
                "Inqueue", {"volcano.sh/card.name": "NVIDIA-H200"}, minResources={"nvidia.com/gpu": "1"}
            ),
            podgroup(
                "Inqueue", {"volcano.sh/card.name": "NVIDIA-H200"}, minResources={"nvidia.com/gpu": "4"}
            ),
            True,
            id="an enqueued group's minResources raised",
        ),
        pytest.param(
            podgroup("Inqueue", REQUEST),
            podgroup("Inqueue", {**REQUEST, "team": "a"}),
            False,
            id="another annotation",
        ),
    ],
)
def test_the_enqueue_gate_is_sent_every_edit_of_what_a_reservation_reads(
    old: dict[str, Any], new: dict[str, Any], expected: bool
) -> None:
    assert (
        sent(GATE, new, old, group="scheduling.volcano.sh", resource="podgroups", operation="UPDATE")
        is expected
    )


@pytest.mark.parametrize("phase", ["Inqueue", "Running", "Pending"])
def test_every_podgroup_create_is_sent_to_validation(phase: str) -> None:
    assert sent(
        "validate.cardquota.volcano.sh", podgroup(phase), group="scheduling.volcano.sh", resource="podgroups"
    )


@pytest.mark.parametrize("check", [True, False], ids=["CPU/memory check on", "off"])
def test_an_in_place_resize_is_sent_only_with_the_cpu_memory_check_on(check: bool) -> None:
    flags = ["--set", f"cpuMemoryCheck.enabled={str(check).lower()}"]
    (validating,) = [c for c in render(flags) if c["kind"] == "ValidatingWebhookConfiguration"]
    (validate,) = [h for h in validating["webhooks"] if h["name"] == "validate.cardquota.volcano.sh"]
    resized = [r for r in validate["rules"] if "pods/resize" in r["resources"]]
    assert (resized == [{**resized[0], "operations": ["UPDATE"]}]) if check else not resized


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param({}, {"scheduling.k8s.io/group-name": "pg"}, True, id="its PodGroup named"),
        pytest.param(
            {"scheduling.k8s.io/group-name": "pg"},
            {"scheduling.k8s.io/group-name": "pg2"},
            True,
            id="renamed",
        ),
        pytest.param({}, {"team": "a"}, False, id="another annotation"),
    ],
)
def test_a_pod_update_naming_its_podgroup_is_sent(
    old: dict[str, str], new: dict[str, str], expected: bool
) -> None:
    def pod(annotations: dict[str, str]) -> dict[str, Any]:
        return {"metadata": {"name": "p", "annotations": annotations}, "spec": spec_with([])}

    assert sent("gates.validate.cardquota.volcano.sh", pod(new), pod(old), operation="UPDATE") is expected


@pytest.mark.parametrize(
    ("writers", "user", "checked"),
    [
        pytest.param((), "system:serviceaccount:card-quota:cq", False, id="the webhook's own account"),
        pytest.param((), "alice", True, id="a tenant"),
        pytest.param(("ops:breakglass",), "ops:breakglass", False, id="a listed marks writer"),
        pytest.param(("ops:breakglass",), "system:serviceaccount:card-quota:cq", False, id="and the webhook"),
        pytest.param(("ops:breakglass",), "ops:other", True, id="anyone else"),
    ],
)
def test_the_marks_policy_checks_everyone_but_the_webhook_and_the_listed_writers(
    writers: tuple[str, ...], user: str, checked: bool
) -> None:
    """``webhook.marksWriters`` adds users to the webhook's own account, whose writes of the marks
    the chart's ``-marks`` ValidatingAdmissionPolicy lets through (its matchConditions)."""
    flags = [arg for i, w in enumerate(writers) for arg in ("--set", f"webhook.marksWriters[{i}]={w}")]
    (policy,) = [
        p
        for p in render(flags, ("templates/policy.yaml",))
        if p["kind"] == "ValidatingAdmissionPolicy" and p["metadata"]["name"].endswith("-marks")
    ]
    request = {"userInfo": {"username": user}}
    data = {"object": {}, "oldObject": None, "request": request}
    results = [
        _env().compile(c["expression"]).eval(data=data).plain_value()
        for c in policy["spec"]["matchConditions"]
    ]
    assert all(results) is checked, results

"""Pod-level resources (KEP-2837, ``spec.resources``): a pod's CPU and memory requests are what
Kubernetes makes them. A pod-level request is the pod's request; a pod-level limit stands in for a
missing one only when no container names that resource (the API server's ``defaultPodRequests``);
the overhead is added either way. The CPU/memory check charges and refuses by that."""

from typing import Any

import pytest

from tests.builders import H200, pod, request
from tests.core.test_capability import RUNNING, decide, state_with
from webhook.core.decide import admission
from webhook.core.model.objects import pod_record
from webhook.core.model.resources import compute_requests
from webhook.core.model.verdicts import Allowed, Denied

GiB = 2**30


def pod_level(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"resources": {k: v for k, v in (("requests", requests), ("limits", limits)) if v is not None}}


def container(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "c", **pod_level(requests, limits)}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {"containers": [{"name": "c"}], **pod_level({"cpu": "2", "memory": "1Gi"})},
            (2000, GiB),
            id="pod-level requests alone",
        ),
        pytest.param(
            {"containers": [{"name": "c"}], **pod_level(limits={"cpu": "3", "memory": "2Gi"})},
            (3000, 2 * GiB),
            id="pod-level limits alone stand in for requests",
        ),
        pytest.param(
            {
                "containers": [container({"cpu": "500m"}), container({"cpu": "250m", "memory": "1Gi"})],
                **pod_level({"cpu": "2"}),
            },
            (2000, GiB),
            id="a pod-level request wins over its containers', resource by resource",
        ),
        pytest.param(
            {"containers": [container({"cpu": "1"})], **pod_level(limits={"cpu": "4", "memory": "3Gi"})},
            (1000, 3 * GiB),
            id="a pod-level limit gives way to the containers' requests of that resource",
        ),
        pytest.param(
            {"containers": [container(limits={"cpu": "2"})], **pod_level(limits={"cpu": "4"})},
            (2000, 0),
            id="a container's limit is its request, so the pod-level limit gives way",
        ),
        pytest.param(
            {
                "initContainers": [container({"cpu": "3"})],
                "containers": [container({"cpu": "1"})],
                "overhead": {"cpu": "100m", "memory": "64Mi"},
                **pod_level({"cpu": "2", "memory": "1Gi"}),
            },
            (2100, GiB + 64 * 2**20),
            id="pod-level requests plus overhead, init containers aside",
        ),
        pytest.param(
            {"containers": [container({"cpu": "1"})], "resources": {}},
            (1000, 0),
            id="empty pod-level resources change nothing",
        ),
    ],
)
def test_pod_level_cpu_and_memory_requests(spec: dict[str, Any], expected: tuple[int, int]) -> None:
    assert compute_requests(spec) == expected
    assert pod_record({"metadata": {"name": "p"}, "spec": spec}).template.resources.cpu == expected[0]


def level_pod(
    name: str, requests: dict[str, str], containers: dict[str, str] | None = None
) -> dict[str, Any]:
    """A Volcano pod of queue "q" with these pod-level requests, its container asking ``containers``."""
    obj = pod(name, None, None)
    obj["spec"]["schedulerName"] = "volcano"
    obj["spec"]["resources"] = {"requests": requests}
    if containers is not None:
        obj["spec"]["containers"][0]["resources"] = {"requests": containers}
    return obj


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        pytest.param(
            level_pod("x", {"cpu": "2", "memory": "1Gi"}),
            'queue "q" has 1 cpu left (capability 4: 3 requested by its pods); pod ns/x needs 2 cpu',
            id="only pod-level requests, over",
        ),
        pytest.param(level_pod("x", {"cpu": "1", "memory": "2Gi"}), None, id="only pod-level requests, fits"),
        pytest.param(
            level_pod("x", {"memory": "3Gi"}, {"cpu": "100m", "memory": "1Gi"}),
            'queue "q" has 2Gi memory left (capability 8Gi: 6Gi requested by its pods); pod ns/x needs'
            " 3Gi memory",
            id="pod-level over where its containers fit",
        ),
        pytest.param(
            level_pod("x", {"memory": "2Gi"}, {"cpu": "100m", "memory": "1Gi"}),
            None,
            id="pod-level and containers, fits",
        ),
    ],
)
def test_the_cpu_memory_check_reads_pod_level_requests(obj: dict[str, Any], message: str | None) -> None:
    decision = decide(state_with(*RUNNING), obj)
    if message is None:
        assert isinstance(decision, Allowed) and decision.hold is not None, decision
    else:
        assert isinstance(decision, Denied) and decision.message == message


def test_a_running_pod_is_charged_its_pod_level_requests() -> None:
    running = level_pod("big", {"cpu": "3", "memory": "1Gi"}, {"cpu": "1"})
    running["spec"]["nodeName"], running["status"] = "c0", {"phase": "Running"}
    state = state_with(running)
    assert state.charged.compute_used("q") == (3000, GiB)
    refused = decide(state, level_pod("x", {"cpu": "2"}))
    assert isinstance(refused, Denied) and "has 1 cpu left (capability 4: 3 requested by its pods)" in (
        refused.message
    )
    assert isinstance(decide(state, level_pod("y", {"cpu": "1"})), Allowed)


@pytest.mark.parametrize(
    ("resources", "problem"),
    [
        pytest.param("2", "spec.resources must be an object, got a string", id="not an object"),
        pytest.param(
            {"requests": {"cpu": "NaN"}},
            "spec.resources.requests.cpu: quantity 'NaN' is not a Kubernetes quantity",
            id="not a quantity",
        ),
        pytest.param(
            {"limits": ["cpu"]},
            "spec.resources.limits must be an object of quantities, got a list",
            id="limits a list",
        ),
        pytest.param({"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}, None, id="readable"),
    ],
)
def test_pod_level_resources_in_an_odd_shape_are_a_clear_denial(resources: Any, problem: str | None) -> None:
    obj = pod("x", H200, 1)
    obj["spec"]["resources"] = resources
    decision = admission.validate(state_with(), request(obj), 0.0)
    if problem is None:
        assert isinstance(decision, Allowed), decision
    else:
        assert isinstance(decision, Denied) and decision.message == f"pod ns/x is malformed: {problem}"

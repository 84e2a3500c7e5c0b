"""Hostile input at the running server: only 200 or 400 answers, never a 500 or a hang.

Seven generators, 9,100 bodies in all: valid reviews with any node replaced by any JSON value, sent
to both webhooks of a ``cardquota serve`` process and of a server whose live reads find whatever
they ask for (what runs before the decision, the owner and DRA reads, takes them too); live reads
that return anything (a PodGroup's owner, a PodGroup the cache shows behind); hostile quantities
and card annotations where the core reads them; a pod's in-place resize under the CPU/memory
check; truncated and corrupted bytes; deep nesting. Afterwards the same server still answers good
reviews exactly as the core does.
"""

import copy
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.edges.serving import CLUSTER, REVIEWS, Process, client_context, serve_in_thread, serve_process
from tests.edges.test_server import (
    Behind,
    Enqueued,
    Loaded,
    OwnerNotCached,
    podgroup_for_new_pod,
    review_with,
)
from webhook.cluster import snapshot
from webhook.core.model.objects import OwnerRef
from webhook.core.model.policy import Policy
from webhook.serve import review
from webhook.tools.cli import example_files

EXAMPLES = [
    (path.name, webhook, json.loads(path.read_bytes())) for path, webhook, _ in example_files(REVIEWS.parent)
]
BUNDLED: dict[str, dict[str, Any]] = {}  # the first bundled object of each kind: what live reads find
for yaml_path in sorted(CLUSTER.glob("*.yaml")):
    for _, obj in snapshot.objects_of(str(yaml_path), yaml_path.read_bytes()):
        BUNDLED.setdefault(obj["kind"], obj)


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, **FUZZ)


FUZZ: dict[str, Any] = dict(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    tmp = tmp_path_factory.mktemp("fuzz")
    with serve_process(tmp / "certs", tmp / "server.log") as process:
        yield process
        assert process.proc.poll() is None, "the server died under fuzzing"
        assert "bug while answering" not in process.log()


@pytest.fixture(scope="module")
def client(served: Process) -> Iterator[httpx.Client]:
    with served.client() as c:
        yield c


class FindsAnything(Loaded):
    """The bundled cluster, whose live reads (a PodGroup's owner, a pod's claims and templates, a
    claim's pod) find a bundled object of the kind asked under the name and uid asked."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def fetch(self, ref: OwnerRef, namespace: str) -> dict[str, Any] | None:
        self.reads += 1
        found = copy.deepcopy(BUNDLED.get(ref.kind))
        if found is not None:
            found["metadata"].update(name=ref.name, uid=ref.uid, namespace=namespace)
        return found


@pytest.fixture(scope="module")
def live_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    certs, source = tmp_path_factory.mktemp("live"), FindsAnything()
    with (
        serve_in_thread(source, certs) as url,
        httpx.Client(base_url=url, verify=client_context(certs), timeout=10) as c,
    ):
        yield c
    assert source.reads, "no review was read live: the fuzzing missed what runs before the decision"


def send(client: httpx.Client, webhook: str, body: bytes) -> httpx.Response:
    answer = client.post(f"/{webhook}", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code in (200, 400), (answer.status_code, answer.text[:500], body[:500])
    if answer.status_code == 200:
        out = answer.json()
        assert out["kind"] == "AdmissionReview" and isinstance(out["response"]["allowed"], bool)
    else:
        assert answer.json()["error"]
    return answer


odd_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=()) | st.sampled_from('\x00\u202e\ufeff|/*"\\'),
    max_size=40,
)
giant_text = st.builds(
    lambda char, n: char * n, st.sampled_from(["x", "|", "9", "é", "{"]), st.integers(0, 200_000)
)
numbers = (
    st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, -1, 2**63, 2**64, 10**400, 1e308])
)
scalars = st.none() | st.booleans() | numbers | odd_text | giant_text
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(odd_text, inner, max_size=4),
    max_leaves=12,
)


def dump(value: Any) -> bytes:
    """Standard-library JSON: big integers, NaN and Infinity pass, as a hostile client would send them."""
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, child in node.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from paths(child, (*prefix, index))


def replaced(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(tree)
    parent = out
    for part in path[:-1]:
        if isinstance(parent, dict) and not isinstance(parent.get(part), dict | list):
            parent[part] = {}  # make the way to a field the example does not have
        parent = parent[part]
    parent[path[-1]] = value
    return out


TREES = {name: tree for name, _, tree in EXAMPLES}
nodes = st.sampled_from(sorted(TREES)).flatmap(
    lambda name: st.tuples(st.just(name), st.sampled_from(list(paths(TREES[name]))))
)
OWNERS = ("request", "object", "metadata", "ownerReferences")


@pytest.mark.parametrize("server", ["client", "live_client"], ids=["snapshot", "live-reads"])
@fuzz(1000)
@given(node=nodes, value=json_values)
@example(node=("resourceclaim-larger-than-admitted.json", OWNERS), value=-1)
@example(node=("resourceclaim-pinned.mutate.json", (*OWNERS, 0, "uid")), value="not-cached")
def test_any_node_of_a_valid_review_replaced_by_anything(
    request: pytest.FixtureRequest, server: str, node: tuple[str, tuple[Any, ...]], value: Any
) -> None:
    client: httpx.Client = request.getfixturevalue(server)
    name, path = node
    body = dump(replaced(TREES[name], path, value))
    for webhook in ("validate", "mutate"):
        send(client, webhook, body)


GPU_LIMIT = ("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu")
hostile_quantities = (
    st.sampled_from(
        [
            "1e400",
            "NaN",
            "Infinity",
            "-1",
            "1.5",
            "0",
            "",
            " 1 ",
            "0x10",
            "1Ei",
            "+.5e-3m",
            "1e-999999",
            "9" * 5000,
            "٣",
        ]
    )
    | numbers
    | odd_text
)
hostile_cards = (
    st.sampled_from(
        [
            "|",
            "A||B",
            "NVIDIA-H200|NVIDIA-H200",
            "NVIDIA-H200/mps-80g*1/0000",
            "NVIDIA-H200/mps-80g*1/" + "9" * 5000,
            "NVIDIA-H200/mig--mixed",
            " NVIDIA-H200 | Ascend-910B ",
            "NVIDIA-H200\n",
        ]
    )
    | odd_text
    | giant_text
)
hostile_json = (
    st.sampled_from(
        [
            '{"NVIDIA-H200": 1, "NVIDIA-H200": 2}',
            '{"NVIDIA-H200": 1e3}',
            "[" * 50000,
            '{"a|b": 1}',
            "null",
            '{"NVIDIA-H200": ' + "9" * 5000 + "}",
            '{"NVIDIA-H200": -1}',
            '{"NVIDIA-H200": true}',
        ]
    )
    | json_values.map(json.dumps)
    | giant_text
)


@fuzz(3000)
@given(data=st.data())
def test_hostile_quantities_and_card_annotations(client: httpx.Client, data: st.DataObject) -> None:
    _, webhook, tree = data.draw(st.sampled_from(EXAMPLES))
    kind = tree["request"]["kind"]["kind"]
    obj = tree["request"].get("object") or {}
    key = {
        "Queue": "volcano.sh/card.quota",
        "Job": "volcano.sh/card.request",
        "PodGroup": "volcano.sh/card.request",
    }
    if kind == "Pod" and (obj.get("spec") or {}).get("containers"):
        where = data.draw(st.sampled_from(["quantity", "annotation"]))
        if where == "quantity":
            tree = replaced(tree, ("request", "object", *GPU_LIMIT), data.draw(hostile_quantities))
        else:
            tree = replaced(
                tree,
                ("request", "object", "metadata", "annotations"),
                {"volcano.sh/card.name": data.draw(hostile_cards)},
            )
    elif kind in key:
        tree = replaced(
            tree, ("request", "object", "metadata", "annotations"), {key[kind]: data.draw(hostile_json)}
        )
    else:
        tree = replaced(tree, ("request", "object", "spec", "replicas"), data.draw(numbers))
    send(client, webhook, dump(tree))


@fuzz(2000)
@given(data=st.data())
def test_truncated_and_corrupted_bodies(client: httpx.Client, data: st.DataObject) -> None:
    name, webhook, _ = data.draw(st.sampled_from(EXAMPLES))
    body = bytearray((REVIEWS / name).read_bytes())
    body = body[: data.draw(st.integers(0, len(body)))]
    for _ in range(data.draw(st.integers(0, 3))):
        if body:
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    send(client, webhook, bytes(body))


@fuzz(1000)
@given(
    depth=st.integers(0, 5000),
    opener=st.sampled_from(["[", '{"a":']),
    webhook=st.sampled_from(["validate", "mutate"]),
)
def test_deep_nesting(client: httpx.Client, depth: int, opener: str, webhook: str) -> None:
    closer = "]" if opener == "[" else "}"
    nested = opener * depth + "1" + closer * depth
    tree = json.loads(json.dumps(EXAMPLES[0][2]))
    text = json.dumps(tree).replace('"object": {', f'"object": {{"deep": {nested}, ', 1)
    send(client, webhook, text.encode())


@pytest.mark.parametrize(
    "name",
    # Reviews whose answer holds nothing: an A|B pod's mutation would see the fuzz's own held
    # assignments (legitimately: each valid fuzzed A|B pod was assigned a model), so it is not here.
    [
        "pod-missing-queue.json",
        "queue-malformed-quota.json",
        "pod-cpu-only.json",
        "pod-affinity-new.mutate.json",
    ],
)
def test_after_the_fuzzing_good_reviews_are_still_answered_exactly(client: httpx.Client, name: str) -> None:
    webhook = "mutate" if name.endswith(".mutate.json") else "validate"
    body = (REVIEWS / name).read_bytes()
    expected = review.answer(snapshot.load_snapshot(CLUSTER), body, webhook, time.time())  # type: ignore[arg-type]
    assert send(client, webhook, body).json() == expected


@pytest.fixture(scope="module")
def behind() -> Iterator[tuple[httpx.Client, Behind]]:
    certs = Path(tempfile.mkdtemp())
    source = Behind(Enqueued().state(), None)
    with (
        serve_in_thread(source, certs) as url,
        httpx.Client(base_url=url, verify=client_context(certs), timeout=10) as c,
    ):
        yield c, source


SCENARIO = Enqueued()


@fuzz(300)
@given(path=st.sampled_from(list(paths(SCENARIO.inqueue))), value=json_values)
def test_a_podgroup_read_live_in_any_shape_is_answered(
    behind: tuple[httpx.Client, Behind], path: tuple[Any, ...], value: Any
) -> None:
    """A pod of a PodGroup enqueued here but not seen yet reads the PodGroup live (SPEC §5d): what
    the read returns, any node of it replaced by anything, gets a 200 or a 400, never a 500."""
    client, source = behind
    source.state, source.group = SCENARIO.state(), replaced(SCENARIO.inqueue, path, value)
    send(client, "validate", review_with(SCENARIO.move))  # the enqueue admitted: its hold in flight
    reads = len(source.reads)
    for webhook in ("mutate", "validate"):
        send(client, webhook, review_with(SCENARIO.created))
    assert len(source.reads) > reads, "the PodGroup was not read live"


@pytest.fixture(scope="module")
def owner_behind() -> Iterator[tuple[httpx.Client, OwnerNotCached]]:
    certs = Path(tempfile.mkdtemp())
    source = OwnerNotCached(None)
    with (
        serve_in_thread(source, certs) as url,
        httpx.Client(base_url=url, verify=client_context(certs), timeout=10) as c,
    ):
        yield c, source


OWNED = podgroup_for_new_pod()


@fuzz(300)
@given(path=st.sampled_from(list(paths(OWNED[1]))), value=json_values)
def test_a_podgroups_owner_read_live_in_any_shape_is_answered(
    owner_behind: tuple[httpx.Client, OwnerNotCached], path: tuple[Any, ...], value: Any
) -> None:
    """A PodGroup whose owner the cache lacks reads it live (SPEC §7): what the read returns, any
    node of the owner replaced by anything, gets a 200 or a 400, never a 500."""
    client, source = owner_behind
    source.owner = replaced(OWNED[1], path, value)
    reads = source.reads
    send(client, "mutate", OWNED[0])
    assert source.reads > reads, "the owner was not read live"


class CpuChecked(Loaded):
    """The bundled cluster under the CPU/memory check: a resize review reaches its decision."""

    def __init__(self) -> None:
        self.state = snapshot.load_snapshot(CLUSTER, Policy(cpu_memory_check=True))


@pytest.fixture(scope="module")
def checking_client() -> Iterator[httpx.Client]:
    certs = Path(tempfile.mkdtemp())
    with (
        serve_in_thread(CpuChecked(), certs) as url,
        httpx.Client(base_url=url, verify=client_context(certs), timeout=10) as c,
    ):
        yield c


RESIZE = TREES["pod-resize-over-capability.json"]
RESIZED = [  # where the resize's requests are read, including fields the example does not have
    (*side, *where, name)
    for side in (("request", "object"), ("request", "oldObject"))
    for where in (("spec", "containers", 0, "resources", "requests"), ("spec", "resources", "requests"))
    for name in ("cpu", "memory")
] + [("request", "object", "spec", "resources", "limits"), ("request", "object", "spec", "resources")]


@fuzz(500)
@given(
    path=st.sampled_from(RESIZED) | st.sampled_from(list(paths(RESIZE))),
    value=json_values | hostile_quantities,
)
@example(path=("request", "oldObject"), value=None)
def test_a_resize_review_in_any_shape_is_answered(
    checking_client: httpx.Client, path: tuple[Any, ...], value: Any
) -> None:
    """A pod's in-place resize (``pods/resize`` UPDATE) with the CPU/memory check on: any node of
    the review, or any request it is read from, replaced by anything, gets a 200 or a 400."""
    body = dump(replaced(RESIZE, path, value))
    for webhook in ("validate", "mutate"):
        send(checking_client, webhook, body)


def test_after_the_fuzzing_a_resize_past_the_capability_is_still_refused(
    checking_client: httpx.Client,
) -> None:
    answer = send(checking_client, "validate", dump(RESIZE)).json()["response"]
    assert answer["allowed"] is False
    assert answer["status"]["message"].endswith(
        "resize of pod team-c/vllm-6f7c9-a from 1 to 4 cpu needs 3 cpu more"
    )

"""Hostile DRA objects (SPEC §4b) at the live cache: a DeviceClass, ResourceSlice, ResourceClaim or
ResourceClaimTemplate with any field replaced by any JSON value is read or skipped with a reason,
never fatal to its informer; afterwards a pod that uses it is answered (allowed or refused with a
message that names the pod), never an exception."""

import asyncio
from pathlib import Path
from typing import Any

import orjson
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.builders import claiming, pod, request
from tests.edges.test_cache import End, Scripted, informer, run_script, versioned
from tests.edges.test_fuzz import json_values, paths, replaced
from webhook.cluster.cache import DRA_KINDS
from webhook.cluster.snapshot import build_state, objects_of
from webhook.core.decide import admission
from webhook.core.model.verdicts import Allowed, Denied

ROOT = Path(__file__).resolve().parents[2]
DRA = yaml.safe_load((ROOT / "examples" / "cluster" / "dra.yaml").read_text())["items"]
KIND = {k.name: k for k in DRA_KINDS}
BASES = [o for o in DRA if o["kind"] in KIND]


CLUSTER = [
    item
    for path in sorted((ROOT / "examples" / "cluster").glob("*.yaml"))
    for item in objects_of(str(path), path.read_bytes())
]


def cluster_without(kind: str) -> Any:
    """The bundled cluster but every object of ``kind``: the informer under test brings those."""
    return build_state([(where, obj) for where, obj in CLUSTER if obj["kind"] != kind])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=json_values)
def test_a_dra_object_with_any_field_replaced_by_anything_is_read_or_skipped_never_fatal(
    data: st.DataObject, value: Any
) -> None:
    base = data.draw(st.sampled_from(BASES))
    hostile = replaced(versioned(base, 3), data.draw(st.sampled_from(list(paths(base)))), value)
    try:
        orjson.dumps(hostile)
    except TypeError:
        assume(False)  # beyond what an API server's JSON can carry to the informer's reader
    good = versioned({**base, "metadata": {**base["metadata"], "name": "good-one"}}, 4)
    state = cluster_without(base["kind"])
    inf, _ = informer(
        KIND[base["kind"]], Scripted([[hostile]], 3, [[{"type": "ADDED", "object": good}, End]]), state
    )
    asyncio.run(run_script(inf))
    assert inf.synced
    for refs in ({"templates": ("h200-x2", "any-gpu", "mig-1g")}, {"claims": ("shared-h200",)}):
        obj = claiming(pod("p", "NVIDIA-H200", None, queue_name="cr-queue1", namespace="team-a"), **refs)
        decision = admission.validate(state, request(obj), 0.0)
        assert isinstance(decision, Allowed | Denied)
        if isinstance(decision, Denied):
            assert "team-a/p" in decision.message

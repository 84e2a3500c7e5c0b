"""Hostile DRA objects (SPEC §4b) at the live cache: a DeviceClass, ResourceSlice, ResourceClaim or
ResourceClaimTemplate with any field replaced by any JSON value is read or skipped with a reason,
never fatal to its informer; afterwards a pod that uses it is answered (allowed or refused with a
message that names the pod), never an exception."""

import asyncio
import json
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


def user_of(base: dict[str, Any]) -> tuple[str, dict[str, tuple[str, ...]]] | None:
    """A pod's namespace and claims that make its decision read ``base``."""
    name, kind = base["metadata"]["name"], base["kind"]
    if kind == "ResourceClaimTemplate":
        return base["metadata"]["namespace"], {"templates": (name,)}
    if kind == "ResourceClaim":
        return base["metadata"]["namespace"], {"claims": (name,)}
    if kind == "ResourceSlice":
        hami = base["spec"]["driver"].startswith("hami")
        return ("team-c", {"templates": ("a100-share",)}) if hami else ("team-a", {"templates": ("h200-x2",)})
    for template in (o for o in DRA if o["kind"] == "ResourceClaimTemplate"):
        if name in json.dumps(template["spec"]):
            return template["metadata"]["namespace"], {"templates": (template["metadata"]["name"],)}
    return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=json_values)
def test_a_dra_object_with_any_field_replaced_by_anything_is_read_or_skipped_never_fatal(
    data: st.DataObject, value: Any
) -> None:
    """Listed with the rest of its kind, the hostile object is read or skipped with a reason; the
    informer goes on (an object watched after it is kept); a pod whose decision reads it is answered,
    never an exception."""
    base = data.draw(st.sampled_from(BASES))
    hostile = replaced(versioned(base, 3), data.draw(st.sampled_from(list(paths(base)))), value)
    try:
        orjson.dumps(hostile)
    except TypeError:
        assume(False)  # beyond what an API server's JSON can carry to the informer's reader
    listed = [hostile if o is base else versioned(o, 3) for o in DRA if o["kind"] == base["kind"]]
    good = versioned({**base, "metadata": {**base["metadata"], "name": "good-one"}}, 4)
    state = cluster_without(base["kind"])
    inf, _ = informer(
        KIND[base["kind"]], Scripted([listed], 3, [[{"type": "ADDED", "object": good}, End]]), state
    )
    asyncio.run(run_script(inf))
    assert inf.synced
    devices = state.inventory.devices
    held = {
        "DeviceClass": devices.classes,
        "ResourceSlice": devices.slices,
        "ResourceClaimTemplate": devices.templates,
        "ResourceClaim": devices.claims,
    }[base["kind"]]
    namespace = base["metadata"].get("namespace")
    assert (f"{namespace}/good-one" if namespace else "good-one") in held
    if (user := user_of(base)) is None:
        return
    namespace, refs = user
    annotations = {"cardquota.volcano.sh/card": "NVIDIA-H200"}
    obj = claiming(
        pod("p", None, None, queue_name="cr-queue1", namespace=namespace, annotations=annotations), **refs
    )
    decision = admission.validate(state, request(obj), 0.0)
    assert isinstance(decision, Allowed | Denied)
    if isinstance(decision, Denied):
        assert f"{namespace}/p" in decision.message

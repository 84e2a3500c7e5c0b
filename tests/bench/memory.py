"""Bytes of state per cached pod: what the slim records and the indexes cost, nothing else.

Nodes and queues are loaded first; then, under tracemalloc, pods are parsed from JSON (as a list
or a watch would deliver them), upserted, and the raw objects dropped. What stays allocated is what
the cache keeps per pod.
"""

import gc
import tracemalloc

import orjson

from tests.bench import synthetic
from webhook.cluster.snapshot import build_state
from webhook.core.model import objects


def bytes_per_pod(pods: int) -> float:
    everything = synthetic.cluster_objects(pods)
    rest = [o for o in everything if o["kind"] != "Pod"]
    dumped = orjson.dumps([o for o in everything if o["kind"] == "Pod"])
    del everything
    state = build_state((f"object {i}", o) for i, o in enumerate(rest))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    raw = orjson.loads(dumped)
    for pod in raw:
        state.upsert_pod(objects.pod_record(pod))
    del raw, pod
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(state.pods) == pods
    return kept / pods


if __name__ == "__main__":
    for n in (1000, 100_000):
        print(f"{n:>8} pods: {bytes_per_pod(n):.0f} bytes per cached pod")

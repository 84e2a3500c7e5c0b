"""Synthetic clusters for the benchmarks: N pods over 100 queues and 4 card models, N/8 nodes.

A third of the pods are pending, every tenth is a multi-card ``A|B`` pod, sizes 1 and 2. With
``shared``, every other one-model pod shares its GPUs instead (Volcano vGPU or HAMi, a fraction of a
card each).
``write_snapshot`` puts one as a ``kind: List`` JSON file, the way ``kubectl get -o json`` dumps.
"""

from pathlib import Path
from typing import Any

import orjson

from tests.builders import GPU, R4090, R4090D, node, pod, queue, shared

SHARES = [
    {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 30, "volcano.sh/vgpu-memory": 20480},
    {GPU: 1, "nvidia.com/gpumem-percentage": 45},
]

MODELS = ["NVIDIA-H200", "NVIDIA-H800", R4090, R4090D]
QUEUES = 100


def cluster_objects(
    pods: int, tree: bool = False, sharing: bool = False, lending: bool = False
) -> list[dict[str, Any]]:
    """With ``tree``, the queues sit in a three-level tree: q<i> under dept<i % 10> under org, every
    level with a card quota, so a decision also checks two ancestors. With ``lending``, every queue
    deserves half its quota of each model: the 100 queues are one cohort lending and borrowing."""
    nodes = [node(f"n{i}", MODELS[i % len(MODELS)], 8) for i in range(max(8, pods // 8))]
    quota = "{" + ", ".join(f'"{m}": {pods}' for m in MODELS) + "}"
    queues = [queue(f"q{i}", quota, **({"parent": f"dept{i % 10}"} if tree else {})) for i in range(QUEUES)]
    if lending:
        deserved = "{" + ", ".join(f'"{m}": {pods // 2}' for m in MODELS) + "}"
        for made in queues:
            made["metadata"]["annotations"]["cardquota.volcano.sh/card.deserved"] = deserved
    if tree:
        queues += [queue(f"dept{j}", quota, parent="org") for j in range(10)] + [queue("org", quota)]
    objects: list[dict[str, Any]] = [*nodes, *queues]
    for i in range(pods):
        model = MODELS[i % len(MODELS)]
        spec = f"{R4090}|{R4090D}" if i % 10 == 0 else model
        bound = i % 3 != 0 and "|" not in spec
        node_name = f"n{(i % len(nodes)) // len(MODELS) * len(MODELS) + MODELS.index(model)}" if bound else ""
        share = sharing and "|" not in spec and i % 2 == 0
        objects.append(
            pod(
                f"p{i}",
                spec,
                None if share else 1 + i % 2,
                queue_name=f"q{i % QUEUES}",
                node_name=node_name,
                phase="Running" if bound else "Pending",
                uid=f"{i:08d}-5f0e-4c1a-9a57-{i:012d}",
                spec=shared(SHARES[i // 2 % 2]) if share else None,
            )
        )
    return objects


def write_snapshot(directory: Path, pods: int) -> Path:
    """``directory/cluster-<pods>/objects.json``, reused when it is there."""
    target = directory / f"cluster-{pods}"
    path = target / "objects.json"
    if not path.exists():
        target.mkdir(parents=True, exist_ok=True)
        body = {"apiVersion": "v1", "kind": "List", "items": cluster_objects(pods)}
        path.write_bytes(orjson.dumps(body))
    return target

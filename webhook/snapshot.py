"""Offline cluster snapshots: a directory of YAML/JSON files becomes a :class:`ClusterState`.

Multi-document files and ``kind: List`` are accepted. Unknown kinds are skipped with a note;
a malformed file or document raises :class:`SnapshotError` naming the file and document.
"""

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from webhook.core import ingest
from webhook.core.policy import Policy
from webhook.core.state import ClusterState
from webhook.errors import SnapshotError

SUFFIXES = (".yaml", ".yml", ".json")


def _documents(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        if (
            path.suffix == ".json"
        ):  # one JSON document: orjson reads a large dump in a fraction of YAML's time
            yield 1, orjson.loads(path.read_bytes())
            return
        text = path.read_text(encoding="utf-8")
        yield from enumerate(yaml.safe_load_all(text), start=1)
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{path}: cannot read: {exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise SnapshotError(f"{path}: not JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        raise SnapshotError(f"{path}: not YAML/JSON: {exc}") from exc


def _objects(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for index, doc in _documents(path):
        where = f"{path} document {index}"
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise SnapshotError(f"{where}: expected a Kubernetes object, got {type(doc).__name__}")
        items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else [doc]
        if not isinstance(items, list):
            raise SnapshotError(f"{where}: a List's items must be a list")
        for position, obj in enumerate(items):
            label = where if len(items) == 1 and obj is doc else f"{where} item {position}"
            if not isinstance(obj, dict) or not obj.get("kind"):
                raise SnapshotError(f"{label}: object without a kind")
            yield label, obj


def load_snapshot(directory: Path | str, policy: Policy | None = None) -> ClusterState:
    """Load every file under ``directory`` (recursively, in name order)."""
    root = Path(directory)
    if not root.is_dir():
        raise SnapshotError(f"{root}: not a directory")
    labelled = [
        item
        for path in sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        for item in _objects(path)
    ]
    return build_state(labelled, policy)


def build_state(labelled: Iterable[tuple[str, dict[str, Any]]], policy: Policy | None = None) -> ClusterState:
    """Apply ``(where, object)`` pairs in dependency order; ``where`` names them in errors."""
    buckets: dict[str, list[tuple[str, dict[str, Any]]]] = {name: [] for name in ingest.ORDER}
    state = ClusterState(policy)
    for label, obj in labelled:
        bucket = ingest.bucket(obj)
        if bucket is None:
            state.notes.append(f"{label}: skipped {obj.get('apiVersion', '')} {obj['kind']}: not used")
            continue
        buckets[bucket].append((label, obj))
    for bucket in ingest.ORDER:
        for label, obj in buckets[bucket]:
            problem = ingest.upsert(state, obj)
            if problem:  # a snapshot is the operator's own input: say where, and stop
                raise SnapshotError(f"{label}: malformed {obj['kind']}: {problem}")
    return state

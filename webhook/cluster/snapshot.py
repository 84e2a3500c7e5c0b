"""Offline cluster snapshots: a directory of YAML/JSON files becomes a :class:`ClusterState`.

Multi-document files and ``kind: List`` are accepted. Unknown kinds are skipped with a note;
a malformed file or document raises :class:`SnapshotError` naming the file and document.
"""

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model.policy import Policy
from webhook.errors import SnapshotError

SUFFIXES = (".yaml", ".yml", ".json")


def _documents(where: str, data: bytes, json_only: bool) -> Iterator[tuple[int, Any]]:
    try:
        if json_only:  # one JSON document: orjson reads a large dump in a fraction of YAML's time
            yield 1, orjson.loads(data)
            return
        yield from enumerate(yaml.safe_load_all(data.decode("utf-8")), start=1)
    except UnicodeDecodeError as exc:
        raise SnapshotError(f"{where}: cannot read: {exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise SnapshotError(f"{where}: not JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        raise SnapshotError(f"{where}: not YAML/JSON: {exc}") from exc


def objects_of(where: str, data: bytes, json_only: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """The objects of one YAML/JSON text (multi-document, ``kind: *List`` unrolled), each labelled
    with where it is; a document that is not an object raises ``SnapshotError`` naming it."""
    for index, doc in _documents(where, data, json_only):
        place = f"{where} document {index}"
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise SnapshotError(f"{place}: expected a Kubernetes object, got {type(doc).__name__}")
        items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else [doc]
        if not isinstance(items, list):
            raise SnapshotError(f"{place}: a List's items must be a list")
        for position, obj in enumerate(items):
            label = place if len(items) == 1 and obj is doc else f"{place} item {position}"
            if not isinstance(obj, dict) or not obj.get("kind"):
                raise SnapshotError(f"{label}: object without a kind")
            yield label, obj


def _objects(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read: {exc}") from exc
    yield from objects_of(str(path), data, json_only=path.suffix == ".json")


def load_snapshot(directory: Path | str, policy: Policy | None = None) -> ClusterState:
    """Load every file under ``directory`` (recursively, in name order)."""
    return build_state([item for path in _files(directory) for item in _objects(path)], policy)


def load_kind(directory: Path | str, kind: str) -> list[dict[str, Any]]:
    """The objects of ``kind`` under ``directory`` (those ``load_snapshot`` skips: Events)."""
    return [obj for path in _files(directory) for _, obj in _objects(path) if obj.get("kind") == kind]


def _files(directory: Path | str) -> list[Path]:
    """Every YAML/JSON file under ``directory``, recursively, in name order."""
    root = Path(directory)
    if not root.is_dir():
        raise SnapshotError(f"{root}: not a directory")
    return sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())


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

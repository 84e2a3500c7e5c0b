"""The workloads the decisions read: Deployments, StatefulSets, ReplicaSets, batch Jobs and Volcano
Jobs, found by kind and name or by uid, with each owner's children (a Deployment's ReplicaSets)."""

from collections import defaultdict
from collections.abc import Iterator, Mapping, Set

from webhook.core.model.objects import WorkloadRecord

NOTHING: Set[str] = frozenset()


class Workloads:
    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], WorkloadRecord] = {}  # (kind, ns/name)
        self._by_uid: dict[str, WorkloadRecord] = {}
        self._children: dict[str, set[str]] = defaultdict(set)  # owner uid -> workload uids

    @property
    def by_key(self) -> Mapping[tuple[str, str], WorkloadRecord]:
        return self._by_key

    @property
    def by_uid(self) -> Mapping[str, WorkloadRecord]:
        return self._by_uid

    def put(self, workload: WorkloadRecord) -> None:
        """Add or replace ``workload`` (its owner may have changed)."""
        old = self._by_uid.get(workload.uid)
        if old is not None:
            self._by_key.pop((old.kind, old.key), None)
            if old.owner is not None:
                self._children[old.owner.uid].discard(old.uid)
        if workload.owner is not None:
            self._children[workload.owner.uid].add(workload.uid)
        self._by_key[(workload.kind, workload.key)] = workload
        self._by_uid[workload.uid] = workload

    def remove(self, kind: str, key: str) -> WorkloadRecord | None:
        workload = self._by_key.pop((kind, key), None)
        if workload is not None:
            self._by_uid.pop(workload.uid, None)
            if workload.owner is not None:
                self._children[workload.owner.uid].discard(workload.uid)
        return workload

    def get(self, kind: str, namespace: str, name: str) -> WorkloadRecord | None:
        return self._by_key.get((kind, f"{namespace}/{name}"))

    def children(self, uid: str) -> Set[str]:
        return self._children.get(uid, NOTHING)

    def scalable(self, workload: WorkloadRecord) -> WorkloadRecord:
        """The workload whose replicas a user scales: a ReplicaSet's Deployment when it has one."""
        if workload.kind == "ReplicaSet" and workload.owner is not None:
            return self._by_uid.get(workload.owner.uid, workload)
        return workload

    def __iter__(self) -> Iterator[WorkloadRecord]:
        return iter(list(self._by_uid.values()))

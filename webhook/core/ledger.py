"""In-flight ledger: demand admitted but not yet seen in the cache (SPEC §7).

An entry is keyed by pod UID (a pod create) or by workload (a scale-up, holding a number of
pods). It leaves when the cache shows the pod, when the workload's pods arrive, or at its TTL.
Time is always passed in; nothing here reads a clock.
"""

from collections import Counter
from dataclasses import dataclass

from webhook.core.cards import CardSpec


@dataclass(slots=True)
class Entry:
    queue: str
    spec: CardSpec | None  # None: only CPU/memory is held (a pod that uses no card)
    per_pod: int
    pods: int
    expires: float
    cpu: int = 0  # millicores per pod, when the CPU/memory check charges them
    memory: int = 0  # bytes per pod


class Ledger:
    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, key: str, entry: Entry) -> None:
        self._entries[key] = entry

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def settle(self, key: str, pods: int = 1) -> None:
        """The cache now shows ``pods`` of this entry: stop holding them."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.pods -= pods
        if entry.pods <= 0:
            del self._entries[key]

    def expire(self, now: float) -> None:
        for key in [k for k, e in self._entries.items() if e.expires <= now]:
            del self._entries[key]

    def held(self, queue: str, exclude: str = "") -> Counter[tuple[CardSpec, int]]:
        """Pods held per (spec, per-pod count) for one queue, leaving out entry ``exclude``."""
        return self.held_in(frozenset((queue,)), exclude)

    def held_in(self, queues: frozenset[str], exclude: str = "") -> Counter[tuple[CardSpec, int]]:
        """The same for a set of queues (an ancestor and its descendants)."""
        held: Counter[tuple[CardSpec, int]] = Counter()
        for key, entry in self._entries.items():
            if entry.queue in queues and entry.pods > 0 and entry.spec is not None and key != exclude:
                held[(entry.spec, entry.per_pod)] += entry.pods
        return held

    def held_compute(self, queue: str, exclude: str = "") -> tuple[int, int]:
        """CPU (millicores) and memory (bytes) held for ``queue``, leaving out entry ``exclude``."""
        cpu = memory = 0
        for key, entry in self._entries.items():
            if entry.queue == queue and entry.pods > 0 and key != exclude:
                cpu += entry.cpu * entry.pods
                memory += entry.memory * entry.pods
        return cpu, memory

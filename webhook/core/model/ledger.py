"""In-flight ledger: demand admitted but not yet seen in the cache (SPEC §7).

An entry is keyed by pod UID (a pod create), by workload (a scale-up, holding a number of
pods) or by ``resize:`` and a pod UID (the CPU and memory an in-place resize adds). It leaves when
the cache shows the pod (resized), when the workload's pods arrive, or at its TTL.
A multi-card pod's assignment (SPEC §5b) is held from its mutation, when the pod has no UID yet,
until its validation: assignments of one queue, model and size are interchangeable, so the
validation takes any one of them over. Time is always passed in; nothing here reads a clock.
"""

import heapq
from collections import Counter
from dataclasses import dataclass

from webhook.core.model.cards import CardName, CardSpec
from webhook.core.model.demand import PodDemand
from webhook.core.model.values import value_class

Slot = tuple[str, CardName, int]  # queue, model, cards per pod


def resize_key(uid: str) -> str:
    """The ledger key of a pod's admitted resize: what it adds, until the cache sees the pod resized."""
    return f"resize:{uid}"


@value_class
class Cover:
    """Part of a queue's flexible demand that already holds a pod's cards: ``pods`` pods of
    ``per_pod`` cards of ``spec`` from ``origin`` ("reserved" by its PodGroup, or "in flight" in its
    workload's scale-up held under ``key``). An entry that covers it takes that part over."""

    spec: CardSpec
    per_pod: int
    pods: int
    origin: str
    key: str = ""


@dataclass(slots=True)
class Entry:
    queue: str
    spec: CardSpec | None  # None: only CPU/memory is held (a pod that uses no card)
    per_pod: int
    pods: int
    expires: float
    cpu: int = 0  # millicores per pod, when the CPU/memory check charges them
    memory: int = 0  # bytes per pod
    covers: Cover | None = None  # the flexible demand this entry's (assigned) pod comes out of
    task: str = ""  # a Volcano Job task's pods all get one model: "<job uid>/<task>"
    demand: PodDemand | None = None  # a DRA pod's demand as admitted: what it is charged at arrival
    charged: tuple[tuple[str, str], ...] | None = None  # its card and queue annotations as admitted
    came_from: str = ""  # the workload's scale-up hold its cards came out of, until the cache sees it


class Ledger:
    """The entries by key, and by queue (a review reads its queue's, not every one: a burst of
    admitted pods the cache has not seen yet costs the other queues' reviews nothing); their
    deadlines in a heap (a review expires those due, not a scan of all)."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._queues: dict[str, dict[str, Entry]] = {}
        self._deadlines: list[tuple[float, str]] = []  # an entry's, or earlier: looked at again when due
        self._assignments: dict[Slot, list[str]] = {}  # oldest first; keys leave lazily
        self.version = 0  # moves at every change of what is held (what is read from it is cached by it)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every hold: a replica that takes the Lease starts from what its cache counts."""
        for kept in (self._entries, self._queues, self._assignments):
            kept.clear()
        self._deadlines.clear()
        self.version += 1

    def record(self, key: str, entry: Entry) -> None:
        self._remove(key)
        self.version += 1
        self._entries[key] = entry
        self._queues.setdefault(entry.queue, {})[key] = entry
        heapq.heappush(self._deadlines, (entry.expires, key))

    def record_assignment(self, key: str, entry: Entry) -> None:
        """Hold a multi-card pod's assigned model (``entry.spec``: that one model) until its validation."""
        assert entry.spec is not None and not entry.spec.is_multi
        self.record(key, entry)
        self._assignments.setdefault((entry.queue, entry.spec.cards[0], entry.per_pod), []).append(key)

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.version += 1
            held = self._queues[entry.queue]
            del held[key]
            if not held:
                del self._queues[entry.queue]

    def assignment(self, queue: str, card: CardName, per_pod: int) -> str:
        """The key of the oldest assignment still held for this queue, model and size, or ""."""
        keys = self._assignments.get((queue, card, per_pod))
        while keys:
            if keys[0] in self._entries:
                return keys[0]
            keys.pop(0)
        self._assignments.pop((queue, card, per_pod), None)
        return ""

    def drop(self, key: str) -> None:
        """Stop holding an entry at once, whatever it still holds."""
        self._remove(key)

    def get(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def admitted_from(self, key: str) -> int:
        """The pods admitted out of the scale-up hold ``key`` that the cache does not show yet: its
        workload has them, though its controller's count does not say so yet."""
        return sum(e.pods for e in self._entries.values() if e.came_from == key) if key else 0

    def settle(self, key: str, pods: int = 1) -> None:
        """The cache now shows ``pods`` of this entry: stop holding them."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.pods -= pods
        self.version += 1
        if entry.pods <= 0:
            self._remove(key)

    def expire(self, now: float) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            due, key = heapq.heappop(deadlines)
            entry = self._entries.get(key)
            if entry is None:
                continue
            if entry.expires <= now:
                self._remove(key)
            elif entry.expires != due:  # held longer since (a call), or replaced: due later
                heapq.heappush(deadlines, (entry.expires, key))
        if self._assignments:
            entries = self._entries
            for slot in [s for s, keys in self._assignments.items() if not any(k in entries for k in keys)]:
                del self._assignments[slot]

    def held(self, queue: str, exclude: str = "") -> Counter[tuple[CardSpec, int]]:
        """Pods held per (spec, per-pod count) for one queue, leaving out entry ``exclude``."""
        return self.held_in(frozenset((queue,)), exclude)

    def held_in(self, queues: frozenset[str], exclude: str = "") -> Counter[tuple[CardSpec, int]]:
        """The same for a set of queues (an ancestor and its descendants)."""
        held: Counter[tuple[CardSpec, int]] = Counter()
        for queue in queues:
            for key, entry in self._queues.get(queue, {}).items():
                if entry.pods > 0 and entry.spec is not None and key != exclude:
                    held[(entry.spec, entry.per_pod)] += entry.pods
        return held

    def task_model(self, task: str) -> CardName | None:
        """The model a held pod of this Volcano Job task was assigned, if any."""
        for entry in self._entries.values():
            if entry.task == task and entry.spec is not None and entry.pods > 0:
                return entry.spec.cards[0]
        return None

    def covers_in(self, queues: frozenset[str], exclude: str = "") -> list[Cover]:
        """What the held entries of these queues take over from flexible demand counted elsewhere."""
        return [
            e.covers
            for queue in queues
            for key, e in self._queues.get(queue, {}).items()
            if e.covers is not None and e.pods > 0 and key != exclude
        ]

    def held_compute(self, queue: str, exclude: str = "") -> tuple[int, int]:
        """CPU (millicores) and memory (bytes) held for ``queue``, leaving out entry ``exclude``."""
        cpu = memory = 0
        for key, entry in self._queues.get(queue, {}).items():
            if entry.pods > 0 and key != exclude:
                cpu += entry.cpu * entry.pods
                memory += entry.memory * entry.pods
        return cpu, memory

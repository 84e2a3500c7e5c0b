"""One serving replica among several: a coordination.k8s.io Lease, and readiness tied to holding it.

Only the holder decides, so its in-flight holds see every admission; the others forward what
reaches them to the address the holder writes into the Lease (``ADDRESS_ANNOTATION``). The holder
renews every ``renew_every`` seconds and stops counting itself the leader ``renew_deadline`` after
its last successful renewal began; another replica takes the Lease only when it has seen the same
record unchanged for ``duration`` seconds by its own clock (as client-go does, so clock skew between
nodes does not matter). Because ``renew_deadline < duration``, two replicas never both consider
themselves the leader. Updates use the Lease's resourceVersion: a conflict means someone else wrote
first, and this round is lost. After ``release`` a replica keeps reading the Lease (never writing
it), so it still knows whom to forward to while it drains.
"""

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)
ADDRESS_ANNOTATION = "cardquota.volcano.sh/address"


class LeaseConflict(Exception):
    """The Lease changed since it was read (HTTP 409)."""


class LeaseUnavailable(Exception):
    """The API server could not be asked; this round is lost, the deadline still runs."""


class LeaseClient(Protocol):
    async def get(self) -> dict[str, Any] | None:
        """The Lease, or None when there is none."""

    async def create(self, lease: dict[str, Any]) -> None:
        """Create it; ``LeaseConflict`` when someone else just did."""

    async def replace(self, lease: dict[str, Any]) -> None:
        """Write it back with its resourceVersion; ``LeaseConflict`` when it changed meanwhile."""


def _now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    client: LeaseClient
    identity: str
    name: str
    namespace: str
    duration: int = 2
    renew_deadline: float = 1.5
    renew_every: float = 0.25
    clock: Callable[[], float] = time.monotonic
    address: str = ""  # host:port the other replicas reach this one at; "" when nobody forwards
    on_won: Callable[[], None] = lambda: None  # called when this replica takes the Lease

    def __post_init__(self) -> None:
        self._held_until = 0.0
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._released = False
        self._leader_address: str | None = None
        self.won = 0  # how many times this replica has taken the Lease (a takeover barrier each)
        self.writes = 0  # Lease writes that succeeded (the API load of leading)

    @property
    def is_leader(self) -> bool:
        return self.clock() < self._held_until

    @property
    def leader_address(self) -> str | None:
        """Where the current holder serves, as this replica last read the Lease: None when it
        leads itself, nobody holds a live Lease, or the holder wrote no address."""
        if self.is_leader:
            return None
        return self._leader_address

    def _view(self, address: str | None) -> None:
        self._leader_address = address

    async def release(self) -> None:
        """Give the Lease up (a graceful stop): stop renewing, and clear the holder so a standby
        takes over at its next round instead of waiting for the Lease to expire."""
        was_leader, self._released, self._held_until = self.is_leader, True, 0.0
        if not was_leader:
            return
        try:
            lease = await self.client.get()
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != self.identity:
                return
            now = _now_micro()
            lease["spec"] = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": now}
            annotations = (lease.get("metadata") or {}).get("annotations") or {}
            annotations.pop(ADDRESS_ANNOTATION, None)
            await self.client.replace(lease)
            self._view(None)
            log.info("lease released", extra={"lease": self.name, "identity": self.identity})
        except (LeaseConflict, LeaseUnavailable) as exc:
            extra = {"lease": self.name, "error": str(exc)}
            log.warning("could not release the lease; it expires", extra=extra)

    async def run(self) -> None:
        while True:
            try:
                await self.try_acquire_or_renew()
            except LeaseUnavailable as exc:
                log.warning("lease round failed", extra={"lease": self.name, "error": str(exc)})
            await asyncio.sleep(self.renew_every)

    async def try_acquire_or_renew(self) -> bool:
        """One round: renew or take the Lease if this replica may; after ``release`` only read it."""
        started = self.clock()
        lease = await self.client.get()
        if lease is None:
            self._view(None)
            return False if self._released else await self._write(self._fresh(), started, create=True)
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        holder = spec.get("holderIdentity")
        expired = self.clock() - self._observed_at > float(spec.get("leaseDurationSeconds") or self.duration)
        if holder and holder != self.identity and not expired:
            self._held_until = 0.0
            address = ((lease.get("metadata") or {}).get("annotations") or {}).get(ADDRESS_ANNOTATION)
            self._view(address if isinstance(address, str) and address else None)
            return False
        self._view(None)
        if self._released:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        now = _now_micro()
        lease["spec"] = {
            **spec,
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration),
            "renewTime": now,
            "acquireTime": spec.get("acquireTime") if holder == self.identity else now,
            "leaseTransitions": transitions,
        }
        self._annotate(lease)
        return await self._write(lease, started, create=False)

    def _annotate(self, lease: dict[str, Any]) -> None:
        meta = lease.setdefault("metadata", {})
        annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
        if self.address:
            annotations[ADDRESS_ANNOTATION] = self.address
        else:
            annotations.pop(ADDRESS_ANNOTATION, None)
        meta["annotations"] = annotations

    def _fresh(self) -> dict[str, Any]:
        now = _now_micro()
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        self._annotate(lease)
        return lease

    async def _write(self, lease: dict[str, Any], started: float, *, create: bool) -> bool:
        was_leader = self.is_leader
        try:
            await (self.client.create(lease) if create else self.client.replace(lease))
        except LeaseConflict:
            self._held_until = 0.0
            return False
        self.writes += 1
        if self._released:  # released while this round was under way: the next leader may be chosen
            return False
        # Counted from before the read: the deadline can only be early, never late.
        self._held_until = started + self.renew_deadline
        if not was_leader:
            self.won += 1
            self.on_won()
            log.info(
                "leading: this replica serves reviews", extra={"lease": self.name, "identity": self.identity}
            )
        return True


SERVING_LABEL = "cardquota.volcano.sh/serving"


class PodLabelClient(Protocol):
    async def label(self, value: str | None) -> None:
        """Set (or, with None, remove) ``SERVING_LABEL`` on this replica's own pod; raise
        ``LeaseUnavailable`` when the API server cannot be reached."""


@dataclass
class ServingLabel:
    """Keeps this pod's ``SERVING_LABEL`` equal to "holds the Lease": the Service selects it, so
    reviews go to the leader while every synced replica stays ready (a PodDisruptionBudget can then
    count standbys as available, and draining the leader's node is never blocked). Removed at
    start, before the replica is ready; a failed patch is retried every ``every`` seconds."""

    client: PodLabelClient
    leading: Callable[[], bool]
    every: float = 0.5

    def __post_init__(self) -> None:
        self.applied: bool | None = None  # unknown until the first patch succeeds

    async def sync(self) -> None:
        wanted = self.leading()
        if wanted == self.applied:
            return
        try:
            await self.client.label("true" if wanted else None)
        except LeaseUnavailable as exc:
            log.warning("could not label this pod", extra={"serving": wanted, "error": str(exc)})
            return
        self.applied = wanted
        log.info("pod label set", extra={"label": SERVING_LABEL, "serving": wanted})

    async def run(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(self.every)

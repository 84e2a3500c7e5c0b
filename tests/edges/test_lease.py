"""Leader election over a Lease with optimistic concurrency: never two leaders, and a dead leader
is replaced once its Lease has gone unrenewed for its duration."""

import asyncio
import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.cluster.lease import LeaderElector, LeaseConflict, LeaseUnavailable, ServingLabel


class Store:
    """One Lease in an API server: writes must carry the resourceVersion they read."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0  # also the number of writes
        self.reads = 0


class Client:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def get(self) -> dict[str, Any] | None:
        self.store.reads += 1
        return copy.deepcopy(self.store.lease)

    async def create(self, lease: dict[str, Any]) -> None:
        if self.store.lease is not None:
            raise LeaseConflict("exists")
        self._put(lease)

    async def replace(self, lease: dict[str, Any]) -> None:
        assert self.store.lease is not None
        if lease["metadata"].get("resourceVersion") != self.store.lease["metadata"]["resourceVersion"]:
            raise LeaseConflict("changed")
        self._put(lease)

    def _put(self, lease: dict[str, Any]) -> None:
        self.store.version += 1
        self.store.lease = copy.deepcopy(lease)
        self.store.lease["metadata"]["resourceVersion"] = str(self.store.version)


def electors(n: int, now: list[float], duration: int = 15, deadline: float = 10.0) -> list[LeaderElector]:
    """``n`` replicas on one Lease; client-go's timings unless told (the defaults are a webhook's)."""
    store = Store()
    return [
        LeaderElector(
            Client(store),
            f"replica-{i}",
            "cardquota",
            "ns",
            duration=duration,
            renew_deadline=deadline,
            clock=lambda: now[0],
            address=f"10.0.0.{i}:8443",
        )
        for i in range(n)
    ]


def test_one_replica_leads_and_a_dead_leader_is_replaced_after_the_lease_duration() -> None:
    now = [0.0]
    a, b = electors(2, now)
    asyncio.run(a.try_acquire_or_renew())
    asyncio.run(b.try_acquire_or_renew())
    assert a.is_leader and not b.is_leader
    while now[0] < 10:  # a renews, b watches
        now[0] += 2
        asyncio.run(a.try_acquire_or_renew())
        asyncio.run(b.try_acquire_or_renew())
        assert a.is_leader and not b.is_leader
    took_over = None
    while took_over is None:  # a is dead from now on
        now[0] += 1
        assert not (a.is_leader and b.is_leader)
        if asyncio.run(b.try_acquire_or_renew()):
            took_over = now[0]
    assert not a.is_leader and b.is_leader
    assert 10 + 15 <= took_over <= 10 + 15 + 3  # the duration, after b last saw a's record change


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0.1, 4.0), st.booleans()), min_size=1, max_size=80))
def test_never_two_leaders_whatever_the_schedule(schedule: list[tuple[int, float, bool]]) -> None:
    now = [0.0]
    replicas = electors(3, now)
    for who, wait, acts in schedule:  # a replica that does not act this step is slow, partitioned or dead
        now[0] += wait
        if acts:
            asyncio.run(replicas[who].try_acquire_or_renew())
        assert sum(r.is_leader for r in replicas) <= 1


def test_a_released_lease_is_taken_at_the_next_round_and_the_old_leader_never_leads_again() -> None:
    now = [0.0]
    a, b = electors(2, now)
    asyncio.run(a.try_acquire_or_renew())
    now[0] = 1.0
    asyncio.run(b.try_acquire_or_renew())
    assert a.is_leader and not b.is_leader
    asyncio.run(a.release())
    assert not a.is_leader
    now[0] = 2.0  # long before the 15 s the Lease would have run for
    assert asyncio.run(b.try_acquire_or_renew()) and b.is_leader
    assert not asyncio.run(a.try_acquire_or_renew()) and not a.is_leader


def test_the_standbys_know_where_the_leader_serves_until_it_lets_go_and_a_released_one_keeps_watching() -> (
    None
):
    now = [0.0]
    a, b, c = electors(3, now, duration=2, deadline=1.5)
    won: list[str] = []
    for replica in (a, b, c):
        replica.on_won = lambda name=replica.identity: won.append(name)
    for replica in (a, b, c):
        asyncio.run(replica.try_acquire_or_renew())
    assert a.is_leader and a.leader_address is None  # the leader decides itself
    assert b.leader_address == c.leader_address == "10.0.0.0:8443" and won == ["replica-0"]
    asyncio.run(a.release())  # a graceful stop: the Lease is handed over
    assert a.leader_address is None
    now[0] = 0.25
    assert asyncio.run(b.try_acquire_or_renew()) and won == ["replica-0", "replica-1"]
    asyncio.run(a.try_acquire_or_renew())  # released: a only reads now, and forwards to b
    assert not a.is_leader and a.leader_address == "10.0.0.1:8443"
    asyncio.run(c.try_acquire_or_renew())
    assert c.leader_address == "10.0.0.1:8443"
    now[0] = 0.25 + 2.01  # b died: once its record has stood unchanged for the duration, nobody leads
    asyncio.run(a.try_acquire_or_renew())
    assert a.leader_address is None and not a.is_leader
    assert asyncio.run(c.try_acquire_or_renew()) and c.is_leader  # ...and c takes the Lease
    assert won == ["replica-0", "replica-1", "replica-2"]


def test_at_the_default_timings_a_dead_leader_is_replaced_within_two_and_a_half_seconds() -> None:
    now = [0.0]
    a, b = (
        LeaderElector(Client(store), name, "cardquota", "ns", clock=lambda: now[0])
        for store in [Store()]
        for name in ("a", "b")
    )
    while now[0] < 5:  # both run their rounds every renew_every; a leads
        asyncio.run(a.try_acquire_or_renew())
        asyncio.run(b.try_acquire_or_renew())
        now[0] += a.renew_every
    died = now[0]
    while not asyncio.run(b.try_acquire_or_renew()):
        now[0] += b.renew_every
    assert b.is_leader and a.duration - a.renew_every <= now[0] - died <= a.duration + b.renew_every


def test_a_standby_releasing_leaves_the_leaders_lease_alone() -> None:
    now = [0.0]
    a, b = electors(2, now)
    asyncio.run(a.try_acquire_or_renew())
    asyncio.run(b.try_acquire_or_renew())
    asyncio.run(b.release())
    now[0] = 1.0
    assert asyncio.run(a.try_acquire_or_renew()) and a.is_leader


class Pod:
    """A pod's serving label in an API server that can be down."""

    def __init__(self) -> None:
        self.label: str | None = "true"  # left behind by a previous run of this replica
        self.down = False
        self.patches = 0

    async def label_(self, value: str | None) -> None:
        self.patches += 1
        if self.down:
            raise LeaseUnavailable("connection refused")
        self.label = value


def test_the_serving_label_follows_leadership_and_is_retried_until_it_lands() -> None:
    pod, leading = Pod(), [False]
    client = type("C", (), {"label": lambda self, v: pod.label_(v)})()
    labeler = ServingLabel(client, lambda: leading[0])
    assert labeler.applied is None
    asyncio.run(labeler.sync())  # at start: a stale label is removed before the replica is ready
    assert pod.label is None and labeler.applied is False
    leading[0] = True
    asyncio.run(labeler.sync())
    assert pod.label == "true"
    asyncio.run(labeler.sync())
    assert pod.patches == 2  # nothing to do: no API call
    leading[0], pod.down = False, True
    asyncio.run(labeler.sync())
    assert pod.label == "true" and labeler.applied is True  # failed: tried again next round
    pod.down = False
    asyncio.run(labeler.sync())
    assert pod.label is None and labeler.applied is False

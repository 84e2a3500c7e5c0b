"""The live cache: list+watch per kind, raw JSON in, the same ClusterState the snapshot fills.

Each kind has an ``Informer``: a paginated list, then a watch from the list's resourceVersion with
bookmarks; 410 Gone relists; a broken connection resumes the watch from the last version seen,
after a capped exponential backoff with jitter; a periodic relist repairs any drift. Events are
applied through ``core.ingest``, so an object in an odd shape is skipped and reported, never fatal.
Within a watch, resourceVersions only grow: an event at or below the last version seen is a
duplicate or a stale replay, and changes nothing.

The ``Transport`` is the seam: the Kubernetes API in production, scripted streams in tests.
"""

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from webhook.cluster import listing
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model import objects
from webhook.core.model.policy import Policy

log = logging.getLogger(__name__)
Raw = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Kind:
    name: str  # the object kind, e.g. "Pod"
    api_version: str  # e.g. "v1", "apps/v1"
    plural: str  # e.g. "pods"

    @property
    def record(self) -> str:
        """The kind the state holds its objects under (a batch/v1 Job is ``Job.batch``)."""
        return objects.record_kind(self.name, self.api_version)

    @property
    def path(self) -> str:
        return f"{self._base}/{self.plural}"

    def object_path(self, namespace: str, name: str) -> str:
        return f"{self._base}/namespaces/{namespace}/{self.plural}/{name}"

    def namespace_path(self, namespace: str) -> str:
        return f"{self._base}/namespaces/{namespace}/{self.plural}"

    @property
    def _base(self) -> str:
        return "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"


# The kinds the decisions read, in the order a first sync applies them.
KINDS = (
    Kind("Node", "v1", "nodes"),
    Kind("Queue", "scheduling.volcano.sh/v1beta1", "queues"),
    # each one's default queue (``scheduling.volcano.sh/queue-name``): where a PodGroup made there in
    # queue ``default`` goes, before the pods and PodGroups whose queue it decides
    Kind("Namespace", "v1", "namespaces"),
    Kind("Deployment", "apps/v1", "deployments"),
    Kind("StatefulSet", "apps/v1", "statefulsets"),
    Kind("ReplicaSet", "apps/v1", "replicasets"),
    Kind("Job", "batch.volcano.sh/v1alpha1", "jobs"),
    Kind("Job", "batch/v1", "jobs"),
    Kind("PodGroup", "scheduling.volcano.sh/v1beta1", "podgroups"),
    Kind("Pod", "v1", "pods"),
)
PODS = KINDS[-1]
EVENTS = Kind("Event", "v1", "events")  # written, and read by ``kubectl cardquota audit``; not cached
# Dynamic Resource Allocation's (SPEC §4b), watched when GPU drivers are configured; applied after
# the nodes and before the pods that use them.
DRA_KINDS = (
    Kind("DeviceClass", "resource.k8s.io/v1", "deviceclasses"),
    Kind("ResourceSlice", "resource.k8s.io/v1", "resourceslices"),
    Kind("ResourceClaimTemplate", "resource.k8s.io/v1", "resourceclaimtemplates"),
    Kind("ResourceClaim", "resource.k8s.io/v1", "resourceclaims"),
)


def watched(policy: Policy) -> tuple[Kind, ...]:
    """The kinds a live cache lists and watches, in the order a first sync applies them."""
    return (KINDS[0], *(DRA_KINDS if policy.dra_drivers else ()), *KINDS[1:])


def kind_of(name: str, api_version: str) -> Kind | None:
    """The watched kind an owner reference names (its API group told apart: two kinds are Jobs)."""
    group = api_version.rpartition("/")[0]
    found = (k for k in (*KINDS, *DRA_KINDS) if k.name == name and k.api_version.rpartition("/")[0] == group)
    return next(found, None)


class Expired(Exception):
    """410 Gone: the version asked for is no longer in the API server's history; relist."""


class Unavailable(Exception):
    """The API server could not be reached or broke the connection; retry after a backoff."""


class Transport(Protocol):
    async def list(self, kind: Kind, limit: int, cont: str) -> bytes:
        """One page of ``kind`` across namespaces, as sent: a JSON List with ``items`` and ``metadata``."""

    def watch(self, kind: Kind, version: str) -> AsyncIterator[Raw]:
        """Watch events from ``version`` on (bookmarks allowed) until the server ends the stream."""

    async def get(self, kind: Kind, namespace: str, name: str) -> Raw | None:
        """One object, or None when it does not exist."""

    async def list_in(self, kind: Kind, namespace: str) -> Sequence[Raw]:
        """Every object of ``kind`` in ``namespace``, read now (not cached: tidal reclaim's
        PodDisruptionBudgets, read before a gang is evicted)."""

    async def warn_queue(self, queue: str, reason: str, message: str) -> None:
        """Record a Warning Event on a Queue."""

    async def warn_node(self, node: str, reason: str, message: str) -> None:
        """Record a Warning Event on a Node."""

    async def record_event(
        self,
        namespace: str,
        involved: dict[str, str],
        reason: str,
        message: str,
        kind: str = "Normal",
        *,
        count: int = 1,
        since: float | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Record an Event about ``involved`` (apiVersion, kind, name, uid) in ``namespace``:
        ``count`` occurrences, the first at ``since`` (default: now), with ``annotations``."""

    async def annotate(
        self, kind: Kind, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> bool:
        """Merge ``annotations`` into one object's (None removes one); False when it does not exist."""

    async def patch(self, kind: Kind, namespace: str, name: str, ops: Sequence[Mapping[str, Any]]) -> bool:
        """Apply a JSON Patch (RFC 6902) to one object; False when it does not exist; Unavailable
        when it fails (a ``test`` op that no longer holds among them)."""

    async def evict(self, namespace: str, name: str, dry_run: bool = False) -> str:
        """Evict one pod through the Eviction API (its PodDisruptionBudgets honoured, its grace
        period kept): "" when done (or the pod is gone), else why it was refused (HTTP 429)."""


@dataclass
class Backoff:
    """Capped exponential backoff with full jitter."""

    first: float = 0.5
    cap: float = 30.0
    attempt: int = 0
    jitter: Callable[[float], float] = field(default=lambda top: random.uniform(0, top))

    def next(self) -> float:
        top = min(self.cap, self.first * 2**self.attempt)
        self.attempt += 1
        return self.jitter(top)

    def reset(self) -> None:
        self.attempt = 0


def _page(kind: Kind, body: bytes) -> Raw:
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Unavailable(f"{kind.plural}: unreadable list: {exc}") from exc
    if not isinstance(page, dict):
        raise Unavailable(f"{kind.plural}: the list is not a JSON object")
    return page


def _version(obj: Raw) -> int | None:
    meta = obj.get("metadata")
    return _number(meta.get("resourceVersion") if isinstance(meta, dict) else None)


def _number(text: object) -> int | None:
    """A resourceVersion as a number: etcd's revisions are; anything else is not compared."""
    return (
        int(text) if isinstance(text, str) and text.isascii() and text.isdigit() and len(text) < 20 else None
    )


class Informer:
    """Keeps one kind of the state equal to what the API server holds."""

    def __init__(
        self,
        kind: Kind,
        state: ClusterState,
        transport: Transport,
        *,
        page_size: int = 500,
        resync_seconds: float = 600.0,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kind, self.state, self.transport = kind, state, transport
        self.page_size, self.resync_seconds = page_size, resync_seconds
        self.backoff = backoff or Backoff()
        self.sleep, self.clock = sleep, clock
        self.synced = False
        self.version = ""
        self.broken_since: float | None = None
        self.relists = 0
        self.skipped_events = 0
        self._resync = asyncio.Event()
        self._caught_up: list[asyncio.Future[None]] = []

    async def catch_up(self) -> None:
        """Return once a list taken after this call has been applied (the takeover barrier): the
        watch stops, the kind is listed again, and the watch resumes from that list."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._caught_up.append(done)
        self._resync.set()
        await done

    async def run(self, listed: bool = False) -> None:
        """Keep watching for ever; ``listed``: the first list is already done."""
        relist = not listed
        listed_at = self.clock()
        while True:
            try:
                if relist or self._resync.is_set() or self.clock() - listed_at >= self.resync_seconds:
                    waiting, self._caught_up = self._caught_up, []
                    self._resync.clear()
                    try:
                        await self.relist()
                    except BaseException:
                        self._caught_up += waiting
                        raise
                    for done in waiting:
                        if not done.done():
                            done.set_result(None)
                    listed_at, relist = self.clock(), False
                await self._watch_until_resync()
            except Expired:
                log.info("watch expired, relisting", extra={"kind": self.kind.name})
                relist = True
            except Unavailable as exc:
                if self.broken_since is None:
                    self.broken_since = self.clock()
                delay = self.backoff.next()
                log.warning(
                    "API server unavailable, retrying",
                    extra={"kind": self.kind.name, "error": str(exc), "retry_in": round(delay, 2)},
                )
                await self.sleep(delay)

    async def relist(self) -> None:
        """Read every page, applying each as it comes (reviews are served between pages), then
        remove what vanished: the state then holds exactly what was listed.

        Pods take the fast path (``listing``); any page it does not fit, and every other kind, is
        read as JSON and applied object by object through ``ingest``.
        """
        reader = listing.PodReader(self.state.pool) if self.kind.name == "Pod" else None
        seen: set[str] = set()
        ordinary: set[str] = set()  # ingest.key of what was read the ordinary way (odd ones included)
        cont, version = "", ""
        while True:
            body = await self.transport.list(self.kind, self.page_size, cont)
            fast = reader.page(body) if reader is not None else None
            if fast is not None:
                seen.update(pod.uid for pod in fast.pods)
                self.state.upsert_pods(fast.pods)
                version, cont = fast.version or version, fast.cont
            else:
                page = _page(self.kind, body)
                meta = page.get("metadata")
                meta = meta if isinstance(meta, dict) else {}
                for obj in page.get("items") or []:
                    if isinstance(obj, dict):
                        obj.setdefault("kind", self.kind.name)  # list items carry no kind
                        obj.setdefault("apiVersion", self.kind.api_version)
                        seen.add(ingest.identity(obj, self.kind.name))
                        ordinary.add(ingest.key(obj))
                        ingest.upsert(self.state, obj)
                version = str(meta.get("resourceVersion") or version)
                cont = str(meta.get("continue") or "")
            if not cont:
                break
        held = ingest.identities(self.state, self.kind.name, self.kind.api_version, exclude=seen)
        for stub in held.values():  # deleted while we were not watching
            ingest.remove(self.state, stub)
        prefix = f"{self.kind.name}/"
        for key in [k for k in self.state.skipped if k.startswith(prefix) and k not in ordinary]:
            self.state.skip(key, "")  # gone, or fine now (the fast path takes no odd object)
        self.version, self.synced = version, True
        self.relists += 1
        self._healthy()

    async def _watch_until_resync(self) -> None:
        """Watch until the stream ends, fails (raised here) or ``catch_up`` asks for a list."""
        watch = asyncio.create_task(self._watch())
        resync = asyncio.create_task(self._resync.wait())
        try:
            done, _ = await asyncio.wait({watch, resync}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            for task in (watch, resync):
                task.cancel()
            await asyncio.gather(watch, resync, return_exceptions=True)
            raise
        resync.cancel()
        if watch not in done:
            watch.cancel()
        await asyncio.gather(watch, resync, return_exceptions=True)
        if watch in done:
            watch.result()  # the stream ended, or its error (or cancellation) goes on up

    async def _watch(self) -> None:
        async for event in self.transport.watch(self.kind, self.version):
            self._healthy()
            kind, obj = event.get("type"), event.get("object")
            if not isinstance(obj, dict):
                self.skipped_events += 1
                continue
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Expired(str(obj.get("message", "")))
                raise Unavailable(f"watch error: {obj.get('message', obj)}")
            version = _version(obj)
            seen = _number(self.version)
            if version is not None and seen is not None and version <= seen:
                self.skipped_events += 1  # a duplicate, or older than what the cache holds
                continue
            if kind == "BOOKMARK":
                self.version = str(version) if version is not None else self.version
                continue
            obj.setdefault("kind", self.kind.name)
            obj.setdefault("apiVersion", self.kind.api_version)
            if kind in ("ADDED", "MODIFIED"):
                ingest.upsert(self.state, obj)
            elif kind == "DELETED":
                ingest.remove(self.state, obj)
            else:
                self.skipped_events += 1
                continue
            if version is not None:
                self.version = str(version)

    def _healthy(self) -> None:
        self.broken_since = None
        self.backoff.reset()

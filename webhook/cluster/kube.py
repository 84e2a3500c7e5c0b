"""The Kubernetes API as the cache's ``Transport``: raw JSON lists and watch streams.

kubernetes-asyncio provides the connection (kubeconfig or in-cluster service account, TLS, token
refresh); its model classes are never used: lists and watch events are read as raw JSON with orjson
and handed to the informers as dicts. HTTP failures become the cache's ``Expired`` (410 Gone) or
``Unavailable`` (everything else), so the informer decides what to do.
"""

import datetime
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client, config

from webhook.cluster.cache import Expired, Kind, Unavailable
from webhook.cluster.lease import SERVING_LABEL, LeaseConflict, LeaseUnavailable
from webhook.errors import ConfigError

LIST_TIMEOUT = 60.0
WRITE_TIMEOUT = 5.0  # an Event, a mark or a call: small writes off the review path
EVENT_NAMESPACE = "default"  # Events about cluster-scoped objects (Queues, Nodes) live here
WATCH_SECONDS = 300  # the server ends each watch after this; the informer resumes it


class KubeTransport:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    @classmethod
    async def connect(cls, kubeconfig: Path | str | None, context: str | None = None) -> "KubeTransport":
        """From a kubeconfig file (or a ``KUBECONFIG``-style list of them) and its current context or
        ``context``, else from the pod's service account (in-cluster)."""
        try:
            if kubeconfig is not None:
                configuration = client.Configuration()
                await config.load_kube_config(
                    config_file=str(kubeconfig), context=context, client_configuration=configuration
                )
            else:
                configuration = client.Configuration()
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError, ValueError) as exc:
            raise ConfigError(f"cannot configure the Kubernetes client: {exc}") from exc
        except (AssertionError, TypeError, AttributeError, KeyError, IndexError) as exc:
            # the client library reads the kubeconfig without checking its shape first
            raise ConfigError(f"cannot configure the Kubernetes client: not a kubeconfig ({exc!r})") from exc
        return cls(client.ApiClient(configuration))

    async def close(self) -> None:
        await self.api.close()

    async def _get(self, kind: Kind, query: list[tuple[str, Any]], timeout: aiohttp.ClientTimeout) -> Any:
        try:
            response = await self.api.call_api(
                kind.path,
                "GET",
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise Unavailable(f"{kind.plural}: {exc!r}") from exc
        if response.status == 410:
            response.release()
            raise Expired(f"{kind.plural}: 410 Gone")
        if response.status != 200:
            text = (await response.read())[:300].decode(errors="replace")
            hint = " (is the CRD installed?)" if response.status == 404 and "/apis/" in kind.path else ""
            raise Unavailable(f"{kind.plural}: HTTP {response.status}{hint}: {text}")
        return response

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        body = await self._read(kind.object_path(namespace, name), missing_ok=True)
        return body if isinstance(body, dict) else None

    async def list_in(self, kind: Kind, namespace: str) -> list[dict[str, Any]]:
        body = await self._read(kind.namespace_path(namespace))
        items = body.get("items") if isinstance(body, dict) else None
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    async def list_selected(self, kind: Kind, field_selector: str, limit: int = 500) -> list[dict[str, Any]]:
        """Every object of ``kind`` in every namespace that ``field_selector`` selects, page by page."""
        found: list[dict[str, Any]] = []
        cont = ""
        while True:
            try:
                body = orjson.loads(await self.list(kind, limit, cont, field_selector))
            except orjson.JSONDecodeError as exc:
                raise Unavailable(f"{kind.plural}: unreadable list: {exc!r}") from exc
            body = body if isinstance(body, dict) else {}
            items = body.get("items")
            found += [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []
            meta = body.get("metadata")
            cont = str(meta.get("continue") or "") if isinstance(meta, dict) else ""
            if not cont:
                return found

    async def _read(self, path: str, missing_ok: bool = False) -> Any:
        """GET ``path`` as JSON; None when it does not exist and ``missing_ok``; ``Unavailable``
        when the API server cannot answer."""
        try:
            response = await self.api.call_api(
                path,
                "GET",
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=LIST_TIMEOUT),
            )
            if response.status == 404 and missing_ok:
                response.release()
                return None
            if response.status != 200:
                text = (await response.read())[:300].decode(errors="replace")
                raise Unavailable(f"{path}: HTTP {response.status}: {text}")
            return orjson.loads(await response.read())
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError) as exc:
            raise Unavailable(f"{path}: {exc!r}") from exc

    async def dry_run_create(self, collection: str, body: dict[str, Any]) -> tuple[int, str]:
        """POST ``body`` to ``collection`` with ``dryRun=All``: the API server's status and answer."""
        try:
            response = await self.api.call_api(
                collection,
                "POST",
                query_params=[("dryRun", "All")],
                body=body,
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=LIST_TIMEOUT),
            )
            return response.status, (await response.read())[:4096].decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(f"{collection}: {exc!r}") from exc

    async def warn_queue(self, queue: str, reason: str, message: str) -> None:
        involved = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "name": queue}
        await self.record_event(EVENT_NAMESPACE, involved, reason, message, "Warning")

    async def warn_node(self, node: str, reason: str, message: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Node", "name": node}
        await self.record_event(EVENT_NAMESPACE, involved, reason, message, "Warning")

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
        """An Event about ``involved`` (apiVersion, kind, name, and uid where known) in ``namespace``;
        ``count`` occurrences, the first at ``since`` (default: now)."""
        now = _stamp(datetime.datetime.now(datetime.UTC))
        first = now if since is None else _stamp(datetime.datetime.fromtimestamp(since, datetime.UTC))
        metadata: dict[str, Any] = {"generateName": f"{involved['name']}.", "namespace": namespace}
        if annotations:
            metadata["annotations"] = dict(annotations)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": metadata,
            "involvedObject": {**involved, "namespace": namespace}
            if namespace != EVENT_NAMESPACE
            else involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "cardquota"},
            "reportingComponent": "cardquota",
            "reportingInstance": socket.gethostname(),
            "firstTimestamp": first,
            "lastTimestamp": now,
            "count": count,
        }
        await self._send("POST", f"/api/v1/namespaces/{namespace}/events", event, "application/json")

    async def annotate(
        self, kind: Kind, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> bool:
        """Merge ``annotations`` into an object's (None removes one); False when it is gone."""
        body = {"metadata": {"annotations": annotations}}
        path = kind.object_path(namespace, name)
        return await self._send("PATCH", path, body, "application/merge-patch+json")

    async def patch(self, kind: Kind, namespace: str, name: str, ops: Sequence[Mapping[str, Any]]) -> bool:
        """Apply a JSON Patch to one object; False when it is gone."""
        return await self._send(
            "PATCH", kind.object_path(namespace, name), ops, "application/json-patch+json"
        )

    async def evict(self, namespace: str, name: str, dry_run: bool = False) -> str:
        """POST an Eviction (policy/v1) for one pod: "" when done or the pod is gone; the API
        server's message when a PodDisruptionBudget forbids it now (429)."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if dry_run:
            body["deleteOptions"] = {"dryRun": ["All"]}
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
        try:
            response = await self.api.call_api(
                path,
                "POST",
                body=body,
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=WRITE_TIMEOUT),
            )
            status = int(response.status)
            text = str((await response.read())[:2048].decode(errors="replace"))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(f"{path}: {exc!r}") from exc
        if status in (200, 201, 404):
            return ""
        if status == 429:
            try:
                said = orjson.loads(text)
            except orjson.JSONDecodeError:
                return text
            return str(said.get("message") or text) if isinstance(said, dict) else text
        raise Unavailable(f"{path}: HTTP {status}: {text[:300]}")

    async def _send(self, method: str, path: str, body: Any, content_type: str) -> bool:
        try:
            response = await self.api.call_api(
                path,
                method,
                body=body,
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=WRITE_TIMEOUT),
            )
            status, text = response.status, (await response.read())[:300].decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(f"{path}: {exc!r}") from exc
        if status == 404:
            return False
        if status not in (200, 201):
            raise Unavailable(f"{path}: HTTP {status}: {text}")
        return True

    async def list(self, kind: Kind, limit: int, cont: str, field_selector: str = "") -> bytes:
        query: list[tuple[str, Any]] = [("limit", limit)]
        if cont:
            query.append(("continue", cont))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        response = await self._get(kind, query, aiohttp.ClientTimeout(total=LIST_TIMEOUT))
        try:
            body: bytes = await response.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise Unavailable(f"{kind.plural}: unreadable list: {exc!r}") from exc
        finally:
            vars(self.api).pop("last_response", None)  # the client keeps it, body and all: megabytes
        return body

    async def watch(self, kind: Kind, version: str) -> AsyncIterator[dict[str, Any]]:
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", WATCH_SECONDS),
        ]
        if version:
            query.append(("resourceVersion", version))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=WATCH_SECONDS + 30)
        response = await self._get(kind, query, timeout)
        try:
            async for line in _lines(response.content):
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise Unavailable(f"{kind.plural}: unreadable watch event: {exc}") from exc
                if isinstance(event, dict):
                    yield event
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise Unavailable(f"{kind.plural}: watch broken: {exc!r}") from exc
        finally:
            response.release()


MAX_EVENT_BYTES = 64 * 2**20


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-delimited events of any size (aiohttp's own readline stops at 64 KiB)."""
    pending = bytearray()
    async for chunk in stream.iter_any():
        start = len(pending)
        pending += chunk
        while (end := pending.find(b"\n", start)) >= 0:
            line, pending, start = bytes(pending[:end]), pending[end + 1 :], 0
            if line.strip():
                yield line
        if len(pending) > MAX_EVENT_BYTES:
            raise Unavailable(f"a watch event over {MAX_EVENT_BYTES} bytes")
    if pending.strip():
        yield bytes(pending)


class KubeLeaseClient:
    """The Lease ``namespace/name`` through the same connection, for ``lease.LeaderElector``."""

    def __init__(self, transport: KubeTransport, namespace: str, name: str, timeout: float = 5.0) -> None:
        self.transport, self.name, self.timeout = transport, name, timeout
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        try:
            response = await self.transport.api.call_api(
                path,
                method,
                body=body,
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=self.timeout),
            )
            return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise LeaseUnavailable(f"{path}: {exc!r}") from exc

    async def get(self) -> dict[str, Any] | None:
        status, body = await self._call("GET", f"{self.collection}/{self.name}")
        if status == 404:
            return None
        if status != 200:
            raise LeaseUnavailable(f"lease {self.name}: HTTP {status}")
        lease = orjson.loads(body)
        return lease if isinstance(lease, dict) else None

    async def create(self, lease: dict[str, Any]) -> None:
        self._check(*await self._call("POST", self.collection, lease))

    async def replace(self, lease: dict[str, Any]) -> None:
        self._check(*await self._call("PUT", f"{self.collection}/{self.name}", lease))

    def _check(self, status: int, body: bytes) -> None:
        if status == 409:
            raise LeaseConflict(f"lease {self.name} changed meanwhile")
        if status not in (200, 201):
            raise LeaseUnavailable(f"lease {self.name}: HTTP {status}: {body[:200].decode(errors='replace')}")


class KubePodLabel:
    """``lease.PodLabelClient`` for the pod ``namespace/name`` (this replica's own, from the
    downward API), through the same connection."""

    def __init__(self, transport: KubeTransport, namespace: str, name: str) -> None:
        self.transport, self.path = transport, f"/api/v1/namespaces/{namespace}/pods/{name}"

    async def label(self, value: str | None) -> None:
        patch = {"metadata": {"labels": {SERVING_LABEL: value}}}
        try:
            response = await self.transport.api.call_api(
                self.path,
                "PATCH",
                body=patch,
                header_params={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=5),
            )
            status, text = response.status, (await response.read())[:300].decode(errors="replace")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise LeaseUnavailable(f"{self.path}: {exc!r}") from exc
        if status != 200:
            raise LeaseUnavailable(f"{self.path}: HTTP {status}: {text}")


def _stamp(moment: datetime.datetime) -> str:
    """An Event's time, as the API server keeps it (RFC 3339, to the second)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")

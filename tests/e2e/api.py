"""Reads from a test control plane's API server without a ``kubectl`` process per poll.

``kubectl get KIND [NAME] -o json`` costs a process start and a discovery-cache read (about 0.1 s of
CPU on this machine); a wait loop polling every half second spends a good part of a core on it.
:class:`Reader` answers the same reads over one keep-alive HTTPS connection per thread, with the
plane's admin certificate, and returns what ``kubectl get -o json`` prints: the object, or a
``List`` whose items carry their ``apiVersion`` and ``kind``, without ``managedFields``. Names resolve as kubectl resolves
them (plural, singular, short name, ``plural.group``; the built-in groups first), from the API
server's discovery, read once and again when a name is not known (a CRD applied later).
"""

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class NotServed(LookupError):
    """The API server serves no resource of that name (even after a fresh discovery)."""


@dataclass(frozen=True)
class Resource:
    prefix: str  # /api/v1 or /apis/<group>/<version>
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return self.prefix.removeprefix("/apis/").removeprefix("/api/")


class Reader:
    def __init__(self, port: int, certs: Path) -> None:
        self.port = port
        self.context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        self.context.load_cert_chain(certs / "admin.crt", certs / "admin.key")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: list[http.client.HTTPSConnection] = []  # every thread's, closed by close()
        self._resources: dict[str, Resource] = {}
        self._discovered = 0.0

    # ---- transport ---------------------------------------------------------------------
    def request(self, path: str) -> tuple[int, bytes]:
        """GET ``path``; a connection broken by an API server restart is opened again once."""
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=30)
                self._local.conn = conn
                with self._lock:
                    self._open.append(conn)
            try:
                conn.request("GET", path, headers={"Accept": "application/json"})
                answer = conn.getresponse()
                return answer.status, answer.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close every thread's connection (a thread that reads again opens a new one)."""
        with self._lock:
            opened, self._open = self._open, []
        for conn in opened:
            conn.close()

    def _json(self, path: str) -> Any:
        status, body = self.request(path)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {body[:300]!r}")
        return json.loads(body)

    # ---- names -------------------------------------------------------------------------
    def _discover(self) -> None:
        found: dict[str, Resource] = {}
        prefixes = ["/api/v1"]
        for group in self._json("/apis")["groups"]:
            prefixes.append(f"/apis/{group['preferredVersion']['groupVersion']}")
        for prefix in prefixes:
            group = prefix.split("/")[2] if prefix.startswith("/apis/") else ""
            status, body = self.request(prefix)
            if status != 200:  # an aggregated API that is not up: kubectl skips it too
                continue
            for entry in json.loads(body)["resources"]:
                if "/" in entry["name"]:
                    continue  # a subresource
                resource = Resource(prefix, entry["name"], entry["kind"], entry["namespaced"])
                names = {entry["name"], entry.get("singularName") or "", entry["kind"].lower()}
                names |= set(entry.get("shortNames") or [])
                if group:
                    names |= {f"{name}.{group}" for name in list(names) if name}
                for name in names - {""}:
                    found.setdefault(name, resource)  # the built-in groups come first, as for kubectl
        with self._lock:
            self._resources = found
            self._discovered = time.monotonic()

    def resource(self, name: str) -> Resource:
        with self._lock:
            known = self._resources.get(name.lower())
            fresh = time.monotonic() - self._discovered < 2
        if known is None and not fresh:
            self._discover()
            with self._lock:
                known = self._resources.get(name.lower())
        if known is None:
            raise NotServed(name)
        return known

    # ---- reads -------------------------------------------------------------------------
    def get(self, kind: str, name: str = "", namespace: str = "", selector: str = "") -> Any:
        """What ``kubectl get kind [name] [-n namespace] [-l selector] -o json`` prints; a missing
        object raises the error kubectl would (``NotFound`` in its text)."""
        resource = self.resource(kind)
        path = resource.prefix
        if resource.namespaced:
            path += f"/namespaces/{namespace or 'default'}"
        path += f"/{resource.plural}"
        if name:
            path += f"/{urllib.parse.quote(name)}"
        elif selector:
            path += "?" + urllib.parse.urlencode({"labelSelector": selector})
        status, body = self.request(path)
        if status == 404 and name:
            raise RuntimeError(
                f'Error from server (NotFound): {resource.plural} "{name}" not found'
                + (f' in namespace "{namespace}"' if namespace and resource.namespaced else "")
            )
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {body[:300]!r}")
        found = json.loads(body)
        if name:
            found["metadata"].pop("managedFields", None)  # kubectl leaves them out too
            return found
        for item in found["items"]:
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.kind)
            item["metadata"].pop("managedFields", None)
        return {
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": ""},
            "items": found["items"],
        }

    def exists(self, kind: str, name: str, namespace: str = "") -> bool:
        resource = self.resource(kind)
        path = resource.prefix + (f"/namespaces/{namespace}" if resource.namespaced else "")
        status, _ = self.request(f"{path}/{resource.plural}/{urllib.parse.quote(name)}")
        if status not in (200, 404):
            raise RuntimeError(f"GET {path}/{resource.plural}/{name}: {status}")
        return status == 200

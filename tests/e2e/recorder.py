"""A tiny HTTPS admission webhook that records every AdmissionReview and allows it: enough to prove
the API server calls a webhook registered by URL with a caBundle."""

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class Recorder:
    def __init__(self, certs: Path) -> None:
        self.reviews: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with recorder._lock:
                    recorder.reviews.append(body)
                answer = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {"uid": body["request"]["uid"], "allowed": True},
                }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certs / "webhook.crt", certs / "webhook.key")
        # The handshake in each connection's own thread, on its first read: done in accept(), one
        # slow handshake held every other connection back (a burst of 200 creates once waited
        # past the API server's 5 s and failed closed).
        self.server.socket = context.wrap_socket(
            self.server.socket, server_side=True, do_handshake_on_connect=False
        )
        self.ca_bundle = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/review"

    def start(self) -> "Recorder":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def matching(
        self, resource: str, operation: str, sub_resource: str = "", namespace: str | None = None
    ) -> list[dict[str, Any]]:
        with self._lock:
            found = list(self.reviews)
        return [
            r["request"]
            for r in found
            if r["request"]["resource"]["resource"] == resource
            and r["request"]["operation"] == operation
            and r["request"].get("subResource", "") == sub_resource
            and (namespace is None or r["request"].get("namespace") == namespace)
        ]

    def configuration(self, name: str, selector: dict[str, str]) -> dict[str, Any]:
        """A ValidatingWebhookConfiguration for pod creates, deployments/scale and PodGroup creates."""
        rules = [
            {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]},
            {
                "apiGroups": ["apps"],
                "apiVersions": ["v1"],
                "resources": ["deployments/scale"],
                "operations": ["UPDATE"],
            },
            {
                "apiGroups": ["scheduling.volcano.sh"],
                "apiVersions": ["v1beta1"],
                "resources": ["podgroups"],
                "operations": ["CREATE"],
            },
        ]
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "recorder.e2e.cardquota.dev",
                    "clientConfig": {"url": self.url, "caBundle": self.ca_bundle},
                    "rules": rules,
                    "namespaceSelector": {"matchLabels": selector},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        }

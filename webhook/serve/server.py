"""The HTTPS edge: AdmissionReviews over aiohttp, answered from whatever state source it is given.

    POST /validate   POST /mutate   GET /healthz   GET /readyz   GET /metrics

Errors become HTTP statuses here and nowhere else (``_errors``): a review we cannot answer is a 400
with a reason, a state that is not ready a 503, a bug a logged 500 (the API server's
``failurePolicy`` then decides). A denial is a 200 whose response says ``allowed: false``.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webhook.cluster.sources import StateSource
from webhook.core.index import ingest
from webhook.core.index.state import ClusterState
from webhook.core.model.objects import OwnerRef
from webhook.core.model.verdicts import TOO_COMPLEX, Allowed, Decision, Denied, Request
from webhook.errors import BadReview, NotReady
from webhook.serve import forward, review, wire
from webhook.serve.metrics import Metrics

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Health:
    """Draining starts at SIGTERM: the server turns unready but keeps answering."""

    draining: bool = False


SOURCE = web.AppKey("source", StateSource)
METRICS = web.AppKey("metrics", Metrics)
HEALTH = web.AppKey("health", Health)
BODY_LIMIT = web.AppKey("body_limit", int)
FORWARDER = web.AppKey("forwarder", forward.Forwarder)
FORWARD_WAIT = web.AppKey("forward_wait", float)
OWNER_READ_SECONDS = 1.0
EVALUATION_SECONDS = 2.0  # how long a review waits for the DRA selectors it deferred (timeout: 5 s)
UID = web.RequestKey("uid", str)  # the review uid, once parsed, for the bug log line


def make_app(
    source: StateSource,
    metrics: Metrics,
    health: Health,
    max_body_bytes: int,
    forwarder: forward.Forwarder | None = None,
    forward_wait: float = 4.0,
) -> web.Application:
    """``forwarder``: a replica that does not decide sends each review to the one that does."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_errors])
    app[SOURCE], app[METRICS], app[HEALTH], app[BODY_LIMIT] = source, metrics, health, max_body_bytes
    app[FORWARD_WAIT] = forward_wait
    if forwarder is not None:
        app[FORWARDER] = forwarder
    metrics.ready.set_function(lambda: float(not health.draining and not source.readiness_reason()))
    metrics.serving.set_function(lambda: float(is_ready(app)))
    metrics.watch_state(lambda: source.state)
    app.router.add_post("/validate", _validate)
    app.router.add_post("/mutate", _mutate)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    return app


def is_ready(app: web.Application) -> bool:
    return app[SOURCE].ready and not app[HEALTH].draining


def _answer(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status, dumps=lambda v: orjson.dumps(v).decode())


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadReview as exc:
        request.app[METRICS].rejected.labels("400").inc()
        return _answer(400, str(exc))
    except NotReady as exc:
        request.app[METRICS].rejected.labels("503").inc()
        return _answer(503, str(exc))
    except web.HTTPException:
        raise
    except Exception:
        request.app[METRICS].rejected.labels("500").inc()
        log.exception(
            "bug while answering a review", extra={"uid": request.get(UID, ""), "path": request.path}
        )
        return _answer(500, "internal error; the API server's failurePolicy applies")


async def _body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        limit = request.app[BODY_LIMIT]
        raise BadReview(f"body over the {limit} byte limit (--max-body-bytes)") from exc


async def _review(request: web.Request, webhook: review.Webhook) -> web.Response:
    response = await _answer_review(request, webhook)
    if request.app[HEALTH].draining:
        response.force_close()  # the API server's next review opens a connection to a ready replica
    return response


async def _answer_review(request: web.Request, webhook: review.Webhook) -> web.Response:
    started = time.perf_counter()
    body = await _body(request)
    source, forwarder = request.app[SOURCE], request.app.get(FORWARDER)
    if forwarder is not None and not source.ready and forward.FORWARDED_HEADER not in request.headers:
        relayed = await forward.relay(
            forwarder,
            lambda: source.ready,
            source.leader_address,
            request.path,
            body,
            request.app[FORWARD_WAIT],
        )
        if relayed is not None:
            request.app[METRICS].forwarded.labels(str(relayed[0])).inc()
            return web.Response(status=relayed[0], body=relayed[1], content_type="application/json")
    raw = wire.parse_review(body)
    request[UID] = raw.uid
    state = source.state
    if not source.ready or state is None:
        raise NotReady(f"cache not ready: {source.not_ready_reason()}")
    read = wire.to_request(raw)
    if lacking := review.to_fetch(state, read):  # what the cache lacks: read live (nearly never)
        await _live_read(source, state, read, lacking)
    owner = None
    if (wanted := review.owner_to_fetch(state, read, webhook)) is not None:
        owner = await _live_owner(source, read, *wanted)
    decision = await _decision(source, state, read, webhook, owner)
    payload = orjson.dumps(wire.response(raw.uid, decision))
    outcome = "allowed" if isinstance(decision, Allowed) else "denied"
    elapsed = time.perf_counter() - started
    metrics = request.app[METRICS]
    metrics.observe(webhook, raw.kind.kind, raw.operation, outcome, elapsed)
    if isinstance(decision, Allowed) and decision.would is not None and not read.dry_run:
        metrics.observe_would_refuse(decision.queue, decision.card, raw.kind.kind, decision.would.mode)
    if isinstance(decision, Denied) and decision.cause == TOO_COMPLEX:
        metrics.too_complex.labels(webhook).inc()
    return web.Response(body=payload, content_type="application/json")


async def _decision(
    source: StateSource, state: ClusterState, read: Request, webhook: review.Webhook, owner: Any
) -> Decision:
    """The review's decision. One that deferred DRA selectors to be worked out off the loop waits
    for them (the loop answers other reviews meanwhile) and is taken again, for up to
    ``EVALUATION_SECONDS``; then it is what it is (a refusal saying they are being evaluated)."""
    deadline = time.monotonic() + EVALUATION_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        decision = review.try_request(state, read, webhook, time.time(), owner)
        if decision is not None:
            return decision
        await source.evaluated(set(state.inventory.devices.deferred_now), left)
    return review.decide_request(state, read, webhook, time.time(), owner)


async def _live_owner(source: StateSource, request: Request, ref: OwnerRef, namespace: str) -> Any:
    """SPEC §7: the PodGroup's owner, read live under a short timeout when the cache lacks it."""
    try:
        body = await asyncio.wait_for(source.fetch(ref, namespace), OWNER_READ_SECONDS)
    except TimeoutError:
        log.warning(
            "live read of a PodGroup's owner timed out", extra={"uid": request.uid, "owner": ref.name}
        )
        return None
    return review.owner_from(ref, body)


async def _live_read(
    source: StateSource, state: ClusterState, request: Request, wanted: list[OwnerRef]
) -> None:
    """SPEC §4b, §5d: a pod's claims or templates, a claim's pod, or a pod's PodGroup the cache
    lacks or shows behind, read live under the same short timeout and put into the state as the
    watch will bring them; what cannot be read is left out, and the decision says so."""
    namespace = request.namespace
    try:
        bodies = await asyncio.wait_for(
            asyncio.gather(*(source.fetch(ref, namespace) for ref in wanted)), OWNER_READ_SECONDS
        )
    except TimeoutError:
        log.warning("live read for a review timed out", extra={"uid": request.uid})
        return
    for ref, body in zip(wanted, bodies, strict=True):
        if not isinstance(body, dict) or not isinstance(meta := body.get("metadata"), dict):
            continue  # gone, or no object at all
        if ref.uid and meta.get("uid") != ref.uid:
            continue  # another object of that name
        ingest.upsert(state, {**body, "kind": ref.kind, "apiVersion": ref.api_version})


async def _validate(request: web.Request) -> web.Response:
    return await _review(request, "validate")


async def _mutate(request: web.Request) -> web.Response:
    return await _review(request, "mutate")


async def _healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    if request.app[HEALTH].draining:
        return web.Response(text="not ready: draining", status=503)
    why = request.app[SOURCE].readiness_reason()
    return web.Response(text=f"not ready: {why}" if why else "ready", status=503 if why else 200)


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

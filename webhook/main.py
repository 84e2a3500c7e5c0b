"""The composition root: settings, TLS, state source, metrics and the server meet here and only here.

``serve`` runs until SIGTERM or SIGINT, then drains: ``/readyz`` turns 503 so the Service stops
sending new reviews, reviews keep being answered for ``drain_seconds``, and only then does the
server close, waiting up to ``shutdown_timeout_seconds`` for requests in progress.
"""

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from webhook.cluster.lease import LeaderElector
from webhook.cluster.sources import LiveSource, SnapshotSource, StateSource
from webhook.core.index.state import ClusterState
from webhook.core.model.policy import Policy
from webhook.errors import ConfigError, NotReady
from webhook.serve import logs, server
from webhook.serve.forward import Forwarder
from webhook.serve.metrics import Metrics
from webhook.serve.tls import CertStore
from webhook.settings import ServeSettings

if TYPE_CHECKING:
    from webhook.cluster.kube import KubePodLabel

log = logging.getLogger(__name__)


def build_source(settings: ServeSettings, metrics: Metrics | None = None) -> StateSource:
    """The snapshot directory if given; else the cluster from a kubeconfig or, in a pod, in-cluster."""
    if settings.cluster is not None:
        return SnapshotSource(settings.cluster, settings.policy(), off_loop=True)
    if settings.kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise ConfigError("no state source: pass --cluster DIR (a snapshot) or --kubeconfig PATH")
    # The Kubernetes client library (about 37 MiB) is loaded only for a cluster, never for a snapshot.
    from webhook.cluster.kube import KubeTransport

    kubeconfig = settings.kubeconfig
    return LiveSource(
        lambda: KubeTransport.connect(kubeconfig),
        settings.policy(),
        broken_after=settings.watch_broken_seconds,
        audit_seconds=settings.audit_seconds,
        elect=_elector(settings) if settings.leader_elect else None,
        label_pod=_pod_label() if settings.leader_elect and settings.label_leader_pod else None,
        call_seconds=settings.call_seconds if settings.waiting_line else None,
        on_served=metrics.observe_served if metrics is not None else lambda waiter, waited: None,
        reclaim_after=settings.reclaim_after_seconds if settings.reclaim != "off" else None,
        on_reclaim=metrics.observe_reclaim
        if metrics is not None
        else lambda queue, card, outcome, cards: None,
        on_bound=metrics.observe_reclaim_bound if metrics is not None else lambda queue, card, seconds: None,
        off_loop=True,
    )


def _pod_label() -> Callable[[Any], "KubePodLabel"]:
    from webhook.cluster.kube import KubePodLabel

    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not name or not namespace:
        raise ConfigError("--label-leader-pod needs POD_NAME and POD_NAMESPACE (the downward API)")
    return lambda transport: KubePodLabel(transport, namespace, name)


def _elector(settings: ServeSettings) -> Callable[[Any], LeaderElector]:
    namespace = settings.lease_namespace or os.environ.get("POD_NAMESPACE") or "default"
    identity = f"{socket.gethostname()}-{os.getpid()}"

    from webhook.cluster.kube import KubeLeaseClient

    def elect(transport: Any) -> LeaderElector:
        # A Lease call that takes longer than the renew deadline is of no use to the round.
        client = KubeLeaseClient(
            transport, namespace, settings.lease_name, settings.lease_renew_deadline_seconds
        )
        return LeaderElector(
            client,
            identity,
            settings.lease_name,
            namespace,
            duration=settings.lease_duration_seconds,
            renew_deadline=settings.lease_renew_deadline_seconds,
            renew_every=settings.lease_retry_seconds,
            address=advertised(settings),
        )

    return elect


def advertised(settings: ServeSettings) -> str:
    """host:port the other replicas forward to: ``--advertise-address``, else the pod's IP (the
    downward API's POD_IP), else loopback (replicas on one machine), with ``--port``."""
    if settings.advertise_address:
        return settings.advertise_address
    host = os.environ.get("POD_IP") or "127.0.0.1"
    return f"[{host}]:{settings.port}" if ":" in host else f"{host}:{settings.port}"


def _forwarder(settings: ServeSettings) -> Forwarder | None:
    if not settings.leader_elect or settings.cluster is not None:
        return None
    cert = settings.cert_dir / "tls.crt"
    return Forwarder(cert, settings.cert_dir / "tls.key", settings.forward_ca, settings.client_ca is not None)


def live_state(
    kubeconfig: Path | str | None, policy: Policy, timeout: float = 60.0, context: str | None = None
) -> ClusterState:
    """List every kind once from the cluster (``cardquota status --kubeconfig``, ``kubectl
    cardquota``) and stop; ``context``: a kubeconfig context other than the current one."""

    from webhook.cluster.kube import KubeTransport

    async def sync() -> ClusterState:
        source = LiveSource(lambda: KubeTransport.connect(kubeconfig, context), policy)
        task = asyncio.create_task(source.run())
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            while not source.ready:
                if task.done():
                    task.result()
                if asyncio.get_running_loop().time() > deadline:
                    raise NotReady(f"the cluster's objects were not all listed within {timeout:g} s")
                await asyncio.sleep(0.1)
            return source.state
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    return asyncio.run(sync())


def live_events(
    kubeconfig: Path | str | None, reason: str, timeout: float = 60.0, context: str | None = None
) -> list[dict[str, Any]] | str:
    """Every Event of ``reason`` in the cluster, read once (``kubectl cardquota audit``); when they
    cannot be read (no right to list Events, no answer), why, so the rest is answered all the same."""

    from webhook.cluster.cache import EVENTS, Unavailable
    from webhook.cluster.kube import KubeTransport

    async def read() -> list[dict[str, Any]] | str:
        try:
            transport = await KubeTransport.connect(kubeconfig, context)
        except ConfigError as exc:
            return f"the {reason} Events could not be read: {exc}"
        try:
            return await asyncio.wait_for(transport.list_selected(EVENTS, f"reason={reason}"), timeout)
        except (Unavailable, TimeoutError) as exc:
            return f"the {reason} Events could not be read: {exc or 'timed out'}"
        finally:
            await transport.close()

    return asyncio.run(read())


def run(settings: ServeSettings) -> int:
    logs.configure(settings.log_level)
    if settings.uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            return uvloop.run(serve(settings))
    return asyncio.run(serve(settings))


def _background(
    name: str, make: Callable[[], Coroutine[Any, Any, None]], failed: asyncio.Future[int]
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup_ctx entry: run ``make()`` for the app's life; a crash stops the server."""

    async def context(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(make(), name=name)

        def done(finished: asyncio.Task[None]) -> None:
            if finished.cancelled() or failed.done():
                return
            error = finished.exception()
            if error is not None:
                log.error("%s failed: %s", name, error, exc_info=error)
                failed.set_result(2 if isinstance(error, ConfigError) else 1)

        task.add_done_callback(done)
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return context


async def serve(settings: ServeSettings) -> int:
    metrics, health = Metrics(), server.Health()
    store = CertStore(settings.cert_dir, settings.client_ca, on_reload=metrics.cert_reloads.inc)
    source = build_source(settings, metrics)
    metrics.cert_expiry.set_function(lambda: store.expires)
    stopped: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    forwarder = _forwarder(settings)
    app = server.make_app(
        source, metrics, health, settings.max_body_bytes, forwarder, settings.forward_wait_seconds
    )
    app.cleanup_ctx.append(_background("log flusher", logs.flush_periodically, stopped))
    app.cleanup_ctx.append(_background("state source", source.run, stopped))
    app.cleanup_ctx.append(
        _background("certificate watcher", lambda: store.watch(settings.cert_poll_seconds), stopped)
    )
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=settings.keepalive_seconds,
        shutdown_timeout=settings.shutdown_timeout_seconds,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=store.listening)
    await site.start()
    loop = asyncio.get_running_loop()

    def stop() -> None:
        if not stopped.done():
            stopped.set_result(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    log.info("serving", extra={"address": f"https://{settings.host}:{settings.port}"})
    code = await stopped
    if code == 0:
        health.draining = True
        # With leader election: the Lease is handed over first (a standby takes it at its next
        # round, not at expiry); what still reaches this replica is forwarded to the new holder.
        await source.step_down()
        log.info("draining", extra={"seconds": settings.drain_seconds})
        await asyncio.sleep(settings.drain_seconds)
    await runner.cleanup()
    if forwarder is not None:
        await forwarder.close()
    log.info("stopped")
    logs.flush()
    return code

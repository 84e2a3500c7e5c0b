"""``cardquota probe``: does the API server reach the webhook and get its answer?

It sends what any client would: a server-side dry-run create of a Queue whose card quota is not JSON.
A webhook that is registered, trusted (caBundle) and serving denies it with its own message; a dry
run is never stored and holds nothing. Any other outcome (the API server cannot call the webhook,
the Queue kind is missing, the probe is admitted because no webhook was asked) is retried until the
deadline, then reported with the last answer. ``helm test`` runs it in a pod.
"""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

from webhook.cluster.cache import Unavailable
from webhook.errors import CardquotaError

QUEUES = "/apis/scheduling.volcano.sh/v1beta1/queues"
PROBE_NAME = "cardquota-probe"
PROBE = {
    "apiVersion": "scheduling.volcano.sh/v1beta1",
    "kind": "Queue",
    "metadata": {"name": PROBE_NAME, "annotations": {"volcano.sh/card.quota": "probe: not JSON"}},
    "spec": {"weight": 1},
}
OUR_DENIAL = "malformed volcano.sh/card.quota"


class ProbeFailed(CardquotaError):
    """The webhook did not answer the probe before the deadline."""


@dataclass(frozen=True)
class Outcome:
    answered: bool
    detail: str


def judge(status: int, text: str) -> Outcome:
    """What one answer of the API server to the probe says about the webhook."""
    if status == 403 and "denied the request" in text and OUR_DENIAL in text:
        return Outcome(True, _message(text))
    if status in (200, 201):
        return Outcome(False, "the probe was admitted without our denial: is the webhook registered?")
    hint = " (are Volcano's CRDs installed?)" if status == 404 else ""
    return Outcome(False, f"HTTP {status}{hint}: {_message(text)}")


def _message(text: str) -> str:
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text[:300]
    return str(body.get("message", text))[:300] if isinstance(body, dict) else text[:300]


async def probe(
    send: Callable[[], Awaitable[tuple[int, str]]],
    timeout: float,
    every: float = 2.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> str:
    """Send the probe until the webhook answers; its message, or ``ProbeFailed`` after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline, last = loop.time() + timeout, "no answer yet"
    while True:
        try:
            outcome = judge(*await send())
        except Unavailable as exc:
            outcome = Outcome(False, str(exc))
        if outcome.answered:
            return outcome.detail
        last = outcome.detail
        if loop.time() + every > deadline:
            raise ProbeFailed(f"the webhook did not answer a dry-run review within {timeout:.0f} s: {last}")
        await sleep(every)


def run(kubeconfig: Path | None, timeout: float) -> str:
    async def go() -> str:
        from webhook.cluster.kube import KubeTransport  # the client library: loaded only when it is needed

        transport = await KubeTransport.connect(kubeconfig)
        try:
            return await probe(lambda: transport.dry_run_create(QUEUES, PROBE), timeout)
        finally:
            await transport.close()

    return asyncio.run(go())

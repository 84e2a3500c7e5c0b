"""``cardquota probe``: what counts as the webhook's answer, and how long it keeps asking."""

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.cluster.cache import Unavailable
from webhook.serve.probe import ProbeFailed, judge, probe

OURS = json.dumps(
    {
        "kind": "Status",
        "status": "Failure",
        "code": 403,
        "message": 'admission webhook "validate.cardquota.volcano.sh" denied the request: queue '
        "\"cardquota-probe\" has a malformed volcano.sh/card.quota: not JSON (Expecting value at column 1): 'x'",
    }
)
UNREACHABLE = json.dumps(
    {
        "kind": "Status",
        "code": 500,
        "message": 'Internal error occurred: failed calling webhook "validate.cardquota.volcano.sh": '
        "connection refused",
    }
)


def test_only_the_webhooks_own_denial_counts_as_an_answer() -> None:
    assert judge(403, OURS).answered
    assert judge(403, OURS).detail.startswith('admission webhook "validate.cardquota.volcano.sh" denied')
    assert not judge(201, "{}").answered and "is the webhook registered?" in judge(201, "{}").detail
    assert not judge(500, UNREACHABLE).answered
    assert judge(500, UNREACHABLE).detail.startswith("HTTP 500: Internal error occurred: failed calling")
    assert "are Volcano's CRDs installed?" in judge(404, "404 page not found").detail
    other = json.dumps({"code": 403, "message": 'queues is forbidden: User "x" cannot create'})
    assert not judge(403, other).answered


@given(st.integers(min_value=0, max_value=999), st.text(max_size=500))
def test_any_answer_is_judged_without_raising(status: int, text: str) -> None:
    outcome = judge(status, text)
    assert len(outcome.detail) <= 400


def sequence(*answers: tuple[int, str] | Exception):  # type: ignore[no-untyped-def]
    pending = list(answers)

    async def send() -> tuple[int, str]:
        answer = pending.pop(0) if len(pending) > 1 else pending[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return send


async def no_wait(_: float) -> None:
    await asyncio.sleep(0)


def test_it_keeps_asking_until_the_webhook_answers() -> None:
    send = sequence(Unavailable("connection refused"), (500, UNREACHABLE), (403, OURS))
    answered = asyncio.run(probe(send, timeout=60, every=0.01, sleep=no_wait))
    assert "has a malformed volcano.sh/card.quota" in answered


def test_it_gives_up_at_the_deadline_with_the_last_answer() -> None:
    with pytest.raises(ProbeFailed, match=r"within 0 s: HTTP 500: Internal error occurred: failed calling"):
        asyncio.run(probe(sequence((500, UNREACHABLE)), timeout=0.05, every=0.01))

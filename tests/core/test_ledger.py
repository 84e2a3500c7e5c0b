"""The in-flight ledger's indexes (by queue, deadlines in a heap) answer as a scan of every entry
would, whatever was recorded, settled, dropped, held longer or expired before."""

from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import H200, R4090, R4090D
from webhook.core.model.cards import UNIT, CardSpec
from webhook.core.model.ledger import Cover, Entry, Ledger

QUEUES = ("a", "b", "c")
KEYS = ("k0", "k1", "k2")
SPECS = (CardSpec((H200,)), CardSpec((R4090, R4090D)), None)

entries = st.builds(
    Entry,
    queue=st.sampled_from(QUEUES),
    spec=st.sampled_from(SPECS),
    per_pod=st.sampled_from((UNIT, 2 * UNIT)),
    pods=st.integers(1, 3),
    expires=st.integers(1, 8).map(float),
    cpu=st.integers(0, 2),
    memory=st.integers(0, 2),
    covers=st.sampled_from((None, Cover(CardSpec((R4090, R4090D)), UNIT, 1, "reserved"))),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.sampled_from(KEYS), entries),
        st.tuples(st.just("settle"), st.sampled_from(KEYS), st.integers(1, 2)),
        st.tuples(st.just("drop"), st.sampled_from(KEYS)),
        st.tuples(st.just("longer"), st.sampled_from(KEYS), st.integers(1, 4)),  # a call holds it longer
        st.tuples(st.just("expire"), st.integers(0, 12).map(float)),
        st.tuples(st.just("clear")),
    ),
    max_size=40,
)


def _apply(ledger: Ledger, oracle: dict[str, Entry], op: tuple[Any, ...]) -> None:
    """``op`` on the ledger, and on ``oracle``: copies of its entries by key, kept by hand."""
    match op:
        case ("record", key, entry):
            ledger.record(key, entry)
            oracle[key] = replace(entry)
        case ("settle", key, pods):
            ledger.settle(key, pods)
            if key in oracle:
                oracle[key].pods -= pods
                if oracle[key].pods <= 0:
                    del oracle[key]
        case ("drop", key):
            ledger.drop(key)
            oracle.pop(key, None)
        case ("longer", key, seconds):
            if (entry := ledger.get(key)) is not None:  # as a call does (``calls._hold``)
                entry.expires += seconds
                oracle[key].expires += seconds
        case ("expire", now):
            ledger.expire(now)
            for key in [k for k, e in oracle.items() if e.expires <= now]:
                del oracle[key]
        case ("clear",):
            ledger.clear()
            oracle.clear()


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_ledgers_answers_are_a_scan_of_its_entries(ops: list[tuple[Any, ...]]) -> None:
    ledger, oracle = Ledger(), {}
    for op in [*ops, ("expire", 1e9)]:  # in the end every entry is past its time
        op = (*op[:2], replace(op[2])) if op[0] == "record" else op  # each record its own entry
        _apply(ledger, oracle, op)
        assert len(ledger) == len(oracle)
        assert all(ledger.get(key) == entry for key, entry in oracle.items())
        for queues in (frozenset(("a",)), frozenset(("a", "b")), frozenset(QUEUES)):
            for exclude in ("", "k0"):
                live = [
                    (k, e) for k, e in oracle.items() if e.queue in queues and e.pods > 0 and k != exclude
                ]
                held: Counter[tuple[CardSpec, int]] = Counter()
                for _, entry in live:
                    if entry.spec is not None:
                        held[(entry.spec, entry.per_pod)] += entry.pods
                assert ledger.held_in(queues, exclude) == held
                assert Counter(ledger.covers_in(queues, exclude)) == Counter(
                    e.covers for _, e in live if e.covers is not None
                )
        for queue in QUEUES:
            live = [e for k, e in oracle.items() if e.queue == queue and e.pods > 0 and k != "k1"]
            assert ledger.held_compute(queue, "k1") == (
                sum(e.cpu * e.pods for e in live),
                sum(e.memory * e.pods for e in live),
            )


def test_an_entry_held_longer_expires_at_its_new_time_not_before_and_not_never() -> None:
    ledger = Ledger()
    entry = Entry("a", CardSpec((H200,)), UNIT, 1, expires=5.0)
    ledger.record("k", entry)
    entry.expires = 9.0  # a call holds it longer (``calls._hold``)
    ledger.expire(6.0)
    assert ledger.get("k") is entry
    ledger.expire(9.0)
    assert ledger.get("k") is None and not ledger.held_in(frozenset(("a",)))


def test_an_entry_recorded_again_under_its_key_is_held_in_its_new_queue_until_its_new_time() -> None:
    ledger = Ledger()
    ledger.record("k", Entry("a", CardSpec((H200,)), UNIT, 1, expires=5.0))
    ledger.record("k", Entry("b", CardSpec((H200,)), UNIT, 2, expires=9.0))
    ledger.expire(6.0)
    assert ledger.held_in(frozenset(("a",))) == Counter()
    assert ledger.held_in(frozenset(("b",))) == Counter({(CardSpec((H200,)), UNIT): 2})
    ledger.expire(9.0)
    assert len(ledger) == 0

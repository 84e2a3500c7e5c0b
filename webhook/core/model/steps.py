"""Work done in steps: a generator that yields between two pieces of a long reading of the state,
so whoever drives it may do other things in between (the serving replica answers reviews between
the steps of tidal reclaim's reading: ``webhook.cluster.reclaimer``). A step reads the state
afresh: nothing it holds across a ``yield`` is a view the state may change meanwhile, only its own
copies. ``done`` runs the steps to their end at once."""

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")
Steps = Generator[None, None, T]


def done(steps: Steps[T]) -> T:
    """What ``steps`` return, every step taken at once."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]

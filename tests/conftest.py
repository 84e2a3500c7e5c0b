"""Lanes: how ``make test`` runs the suite in parallel (pytest-xdist, ``--dist loadgroup``).

Each end-to-end module that starts a control plane of its own is a lane: a worker runs all of its
tests, so the plane starts once, and lanes that mostly wait (the waiting line's 3-minute refusal,
20-second pod shutdowns, scheduler periods) overlap with lanes that work. The agreement and tidal
reclaim modules are split by partner: the fork's cases and stock Volcano's cases each start only
their own plane. The
modules on the shared plain control plane form one lane, so it starts once. The core and edge tests
have no lane: they fill whichever worker is free.

The development certificates every control plane uses are made here, once, before any worker starts.
"""

from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWN_PLANE = {
    "test_scheduler_agreement",
    "test_stock_volcano",
    "test_waiting_line",
    "test_tidal_reclaim",
    "test_dra",
}


def lane(item: pytest.Item) -> str | None:
    """The lane of an end-to-end test; None for the others."""
    path = Path(str(item.fspath))
    if path.parent.name != "e2e":
        return None
    if path.stem not in OWN_PLANE:
        return "plain control plane"
    partner = getattr(item, "callspec", None) and item.callspec.params.get("volcano")
    # No "]" in a lane's name: xdist takes the group from an "@" only after the last "]".
    return f"{path.stem}-{partner}" if partner else path.stem


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the main process: before any worker starts a plane
        from tests.e2e.pki import ensure_pki

        ensure_pki(ROOT / "certs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = lane(item)
        if name is not None:
            item.add_marker(pytest.mark.xdist_group(name))


SEED = "soak seed"  # a seeded soak's user property (``tests.e2e.cluster.soak_seed``)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Every seeded soak's seed, passed or not: a run's record names what it tried."""
    seeds = [
        (report.nodeid, value)
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        if getattr(report, "when", "") == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == SEED
    ]
    if seeds:
        terminalreporter.section("soak seeds")
        for nodeid, value in sorted(seeds):
            terminalreporter.line(f"{value}  {nodeid}")

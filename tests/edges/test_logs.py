"""The log's lines: the time each carries, and their order when review lines are buffered."""

import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.serve import logs


def _formatted(created: float) -> str:
    """The time as a line shows it, formatted from scratch."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created * 1000) % 1000:03d}Z"


@given(st.lists(st.floats(min_value=0, max_value=4e9, allow_nan=False), min_size=1, max_size=30))
def test_a_line_carries_its_own_second_whatever_came_before(stamps: list[float]) -> None:
    # the formatted second is kept from line to line: never for a line of another second
    for stamp in [*stamps, stamps[0] + 1, stamps[0] + 0.001, stamps[0]]:
        assert logs._time(stamp) == _formatted(stamp)


@pytest.fixture
def log_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "log"
    with path.open("w") as stderr:
        monkeypatch.setattr(sys, "stderr", stderr)
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        try:
            logs.configure("INFO")
            yield path
        finally:
            logs.flush()
            root.handlers[:] = handlers
            root.setLevel(level)
            monkeypatch.setattr(logs, "_handler", None)


def test_lines_are_written_in_the_order_they_were_logged(log_file: Path) -> None:
    logging.getLogger(logs.BUFFERED_LOGGER).info("first, held in the buffer")
    logs.review({"uid": "second"})
    logging.getLogger("webhook").warning("third, written at once")
    logs.flush()
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert [line.get("uid") or line["msg"] for line in lines] == [
        "first, held in the buffer",
        "second",
        "third, written at once",
    ]
    assert lines[1]["level"] == "info" and lines[1]["logger"] == logs.BUFFERED_LOGGER

"""One JSON object per log line, with the fields a review log line carries (uid, decision, ...).

Review lines are the bulk: they go through a 64 KiB buffer that is flushed at least every
``FLUSH_SECONDS`` (a background task) and whenever anything else is logged, so a review costs no
write system call of its own. Every other line, and every warning, is written at once.
"""

import asyncio
import atexit
import contextlib
import io
import logging
import sys
import time

import orjson

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "taskName"}
BUFFERED_LOGGER = "webhook.serve.review"
FLUSH_SECONDS = 0.5


_second: tuple[int, str] = (-1, "")  # the last second formatted, and its text: most lines share one


def _time(created: float) -> str:
    global _second
    second, text = _second  # read once: another thread may format the next second meanwhile
    if second != int(created):
        second, text = _second = int(created), time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{text}.{int(created * 1000) % 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": _time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = record.__dict__.get("fields")  # the review line passes its fields as one dict
        if isinstance(fields, dict):
            line.update(fields)
        else:
            line.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes review lines into the buffer, flushes for everything else."""

    def emit(self, record: logging.LogRecord) -> None:
        self._hold = record.name == BUFFERED_LOGGER and record.levelno < logging.WARNING
        super().emit(record)

    def flush(self) -> None:
        if not getattr(self, "_hold", False):
            super().flush()

    def flush_now(self) -> None:
        self._hold = False
        self.flush()


_handler: _Handler | None = None
_REVIEWS = logging.getLogger(BUFFERED_LOGGER)


def configure(level: str) -> None:
    global _handler
    raw = io.FileIO(sys.stderr.fileno(), "w", closefd=False)
    # write_through: the text layer keeps nothing back, so a review line written as bytes into the
    # buffer below it stays in order with the lines written as text
    stream = io.TextIOWrapper(
        io.BufferedWriter(raw, 65536), encoding="utf-8", errors="replace", write_through=True
    )
    _handler = _Handler(stream)
    _handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level, handlers=[_handler], force=True)
    logging.getLogger("aiohttp.access").disabled = True
    # What the lines never show is not gathered either (the logging HOWTO's "Optimization"): the
    # caller's file and line, thread and process. 8-15 % of a review's time in the server.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    atexit.register(flush)


def review(fields: dict[str, object]) -> None:
    """The line every review logs: once logging is configured, written straight into the buffer in
    the format ``JsonFormatter`` gives it, without the LogRecord, lookups and handler chain a
    logging call costs (a fifth of a review's time in the server)."""
    if _handler is None or not _REVIEWS.isEnabledFor(logging.INFO):
        _REVIEWS.info("review", extra={"fields": fields})
        return
    line = {"time": _time(time.time()), "level": "info", "logger": BUFFERED_LOGGER, "msg": "review", **fields}
    data = orjson.dumps(line, default=str, option=orjson.OPT_APPEND_NEWLINE)
    with _handler.lock or contextlib.nullcontext():
        _handler.stream.buffer.write(data)


def flush() -> None:
    if _handler is not None:
        _handler.flush_now()


async def flush_periodically(seconds: float = FLUSH_SECONDS) -> None:
    try:
        while True:
            await asyncio.sleep(seconds)
            flush()
    finally:
        flush()

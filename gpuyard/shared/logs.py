"""structlog set-up: JSON lines with the cluster, the service and the (virtual) time bound."""

from __future__ import annotations

import json
import logging
import sys
from typing import TextIO

import structlog

LIBRARY_LEVELS = {"nats": logging.WARNING, "asyncio": logging.ERROR}
"""The libraries that log through `logging`, and from what level their records are kept: nats-py
reports a connection's trouble (a drain that timed out while services stop); asyncio's warnings
are notes such as "returning true from eof_received() has no effect when using ssl" at each TLS
peer that hangs up, its errors a task's exception that nobody retrieved."""


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """JSON lines to `stream` (stderr by default), the libraries' records too
    (`LIBRARY_LEVELS`). Services bind `service` and `cluster`; handlers bind `now` (virtual or
    wall time) through contextvars."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.WriteLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = _LibraryLines(stream or sys.stderr)
    for name, kept in LIBRARY_LEVELS.items():
        library = logging.getLogger(name)
        # (configured again, as tests and benchmarks do: the new stream replaces the last)
        library.handlers = [h for h in library.handlers if not isinstance(h, _LibraryLines)]
        library.addHandler(handler)
        library.setLevel(kept)
        library.propagate = False


class _LibraryLines(logging.StreamHandler):  # type: ignore[type-arg]
    """A library's log records as JSON lines, like structlog's."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"event": record.getMessage(), "logger": record.name, "level": record.levelname}
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = repr(record.exc_info[1])
        return json.dumps(entry)

"""Every line a service logs is JSON, the libraries' records too (nats-py's, asyncio's), and
asyncio's notes at each TLS peer that hangs up are left out."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gpuyard.shared.logs import LIBRARY_LEVELS, configure_logging


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    """The libraries' loggers as they were (logging is the process's)."""
    kept = {
        name: (lg.handlers[:], lg.level, lg.propagate)
        for name in LIBRARY_LEVELS
        for lg in [logging.getLogger(name)]
    }
    yield
    for name, (handlers, level, propagate) in kept.items():
        lg = logging.getLogger(name)
        lg.handlers, lg.level, lg.propagate = handlers, level, propagate


def test_the_libraries_records_are_json_lines_in_the_services_log() -> None:
    first, log = io.StringIO(), io.StringIO()
    configure_logging("info", first)
    configure_logging("info", log)  # (again: the new stream replaces the first, no second copy)
    logging.getLogger("asyncio").warning("returning true from eof_received() has no effect")
    logging.getLogger("asyncio").error("Task exception was never retrieved")
    logging.getLogger("nats").warning("nats: encountered error")
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert lines == [
        {"event": "Task exception was never retrieved", "logger": "asyncio", "level": "ERROR"},
        {"event": "nats: encountered error", "logger": "nats", "level": "WARNING"},
    ]
    assert first.getvalue() == ""

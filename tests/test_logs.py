"""Every line a service logs is JSON, the libraries' records too (nats-py's, asyncio's), and
asyncio's notes at each TLS peer that hangs up are left out; a clean stop is no warning."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Awaitable, Callable, Iterator

import pytest
import structlog

from gpuyard.run.embedded import EmbeddedNats
from gpuyard.shared.connection import connect
from gpuyard.shared.logs import LIBRARY_LEVELS, configure_logging


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    """structlog and the libraries' loggers as they were (both are the process's: a later test in
    this process reads what is logged where it was)."""
    kept = {
        name: (lg.handlers[:], lg.level, lg.propagate)
        for name in LIBRARY_LEVELS
        for lg in [logging.getLogger(name)]
    }
    kept_structlog = structlog.get_config()
    yield
    structlog.configure(**kept_structlog)
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


async def test_a_connection_closed_on_purpose_is_not_told_as_lost() -> None:
    """`disconnected_cb` (a service's "nats.disconnected" warning) hears of a server gone, not
    of every clean stop: nats-py calls it at `close` and `drain` too."""
    lost: list[str] = []

    def counting(name: str) -> Callable[[], Awaitable[None]]:
        async def disconnected() -> None:
            lost.append(name)

        return disconnected

    server = EmbeddedNats()
    url = await server.__aenter__()
    try:
        closed = await connect(url, name="closed", disconnected_cb=counting("closed"))
        drained = await connect(url, name="drained", disconnected_cb=counting("drained"))
        cut_off = await connect(url, name="cut-off", disconnected_cb=counting("cut-off"))
        await closed.close()
        await drained.drain()
    finally:
        await server.__aexit__(None, None, None)
    for _ in range(100):
        if lost:
            break
        await asyncio.sleep(0.05)
    await cut_off.close()
    assert lost == ["cut-off"]

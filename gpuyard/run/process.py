"""What a process that runs simulations sets up: the signals that stop its work, and the logs of
the libraries it uses, into its own log."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def stop_on_signals(work: Coroutine[Any, Any, T]) -> T:
    """Ctrl-C and `kill` stop a run the same way: the run is cancelled, writes what it got to and
    shuts its services down. (Off the main thread, as in tests, signals are left alone.)"""
    task = asyncio.current_task()
    assert task is not None
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
    return await work


class JsonLines(logging.Formatter):
    """Standard-library log records as JSON lines, like structlog's."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"event": record.getMessage(), "logger": record.name, "level": record.levelname}
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = repr(record.exc_info[1])
        return json.dumps(entry)


def library_logs_to(stream: Any) -> None:
    """nats-py reports a connection's trouble (e.g. a drain that timed out while services stop)
    through `logging`: into the run's log, not onto the terminal."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines())
    nats_log = logging.getLogger("nats")
    nats_log.addHandler(handler)
    nats_log.propagate = False

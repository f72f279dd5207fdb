"""What a process that runs simulations sets up: the signals that stop its work."""

from __future__ import annotations

import asyncio
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

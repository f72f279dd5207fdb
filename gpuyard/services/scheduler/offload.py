"""Where a policy's decisions run: in the service's own thread while they are quick, in a worker
thread while they are slow, so that the event loop goes on answering meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

A = TypeVar("A")
R = TypeVar("R")

INLINE_AGAIN_AFTER = 50
"""Quick decisions in a row after which a policy that was slow decides in the service's thread
again: one slow decision (a pause of the whole process) does not send every later one through a
thread, which costs each a handover."""


class Offload:
    """Runs each decision inline until one takes longer than `limit_ms`, then in a worker thread
    until `INLINE_AGAIN_AFTER` in a row took less."""

    def __init__(self, limit_ms: float) -> None:
        self.limit_s = limit_ms / 1000
        self.slow = False
        self.quick_in_a_row = 0

    async def run(self, decide: Callable[[A], R], inp: A) -> tuple[R, float]:
        """`decide(inp)`, and the seconds it took."""
        started = time.perf_counter()
        result = await asyncio.to_thread(decide, inp) if self.slow else decide(inp)
        took = time.perf_counter() - started
        if took > self.limit_s:
            self.slow, self.quick_in_a_row = True, 0
        elif self.slow:
            self.quick_in_a_row += 1
            self.slow = self.quick_in_a_row < INLINE_AGAIN_AFTER
        return result, took

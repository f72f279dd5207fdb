"""Helpers the end-to-end tests share: a free loopback port, and polling until something holds."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def stop_processes(procs: Iterable[subprocess.Popen[Any]], within_s: float = 15.0) -> None:
    """SIGTERM each process still running, then wait for each, killing one that outlasts
    `within_s`."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            p.kill()


def run_gpuyard(
    *args: str, cwd: Path, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`gpuyard ARGS` in `cwd`; with `check`, a non-zero status fails the test with its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args], capture_output=True, text=True,
        timeout=timeout, cwd=cwd,
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"gpuyard {' '.join(args)}: {result.returncode}\n{result.stderr}")
    return result


def alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(
    check: Callable[[], T | None], what: str, within_s: float = 60.0, every_s: float = 0.2
) -> T:
    """Poll `check` until it returns something truthy, and return that; fail naming `what` after
    `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {what} ({within_s:.0f} s; last: {value!r})"
            )
        time.sleep(every_s)


async def until_async(
    check: Callable[[], Awaitable[T | None]], what: str, within_s: float = 30.0,
    every_s: float = 0.05,
) -> T:  # fmt: skip
    """`until` for a coroutine `check`, without blocking the event loop."""
    deadline = time.monotonic() + within_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out waiting for {what} ({within_s:.0f} s; last: {value!r})"
            )
        await asyncio.sleep(every_s)

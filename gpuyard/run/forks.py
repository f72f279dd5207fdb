"""Functions run in processes forked from a fork server that imported gpuyard's simulation
stack once for all of them: a comparison's runs, a sweep's local workers. A process started
afresh imports it again (1.5-2 CPU-s on a 2-core machine); the fork server, started before its
first process is needed, imports it while its starter does other work (a sweep plans its runs)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

from gpuyard.run.embedded import die_with_parent

PRELOADED = [
    "gpuyard.run.forks", "gpuyard.run.single", "gpuyard.run.simulate", "gpuyard.report",
    "gpuyard.workloads", "uvloop", "gpuyard.sweep.worker",
    "gpuyard.services.admission.service", "gpuyard.services.scheduler.service",
    "gpuyard.services.placement.service", "gpuyard.services.nodeagent.service",
    "gpuyard.policies.gavel.policies",  # (OR-Tools: the dearest import of the policies)
]  # fmt: skip
"""What the fork server imports, once, for every process forked from it."""
PLOTTING = ["gpuyard.run.compare"]
"""And for processes that draw figures (a comparison's runs; not a sweep's): matplotlib."""


def default_parallel() -> int:
    """Processes at once on this machine by default: one per CPU it may use."""
    return max(1, len(os.sched_getaffinity(0)))


def cpu_slots(count: int) -> list[int]:
    """A CPU for each of `count` processes: the CPUs this process may use, in turn (`taskset`
    chooses them)."""
    cpus = sorted(os.sched_getaffinity(0))
    return [cpus[i % len(cpus)] for i in range(count)]


def fork_server(*, plots: bool = True) -> ForkServerContext:
    """The fork server's context, the server started if it was not: it imports `PRELOADED` (and
    `PLOTTING` when its processes draw figures: `plots`, as the first call says) in the
    background; the first process started waits for that."""
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(PRELOADED + PLOTTING if plots else PRELOADED)
    forkserver.ensure_running()
    return forks


class Forked:
    """`target(*args)` in a process forked from the fork server, its exit status what `target`
    returns; its stdout to nowhere, its stderr to `log` (appended to with `append`). Its own
    process group: a Ctrl-C reaches its starter alone, which stops it in order. Sent SIGTERM when
    its starter ends, however that ends: its parent is the fork server, not the starter
    (`die_with_parent`). `target` is a module's function; it and `args` are pickled.

    `cpu`: it runs on that CPU alone, and so does every process it starts. A simulation and the
    private server it starts then share one CPU: each message between them passes the CPU from
    one to the other, where across two CPUs it wakes the other one up: a request costs about half
    the CPU time, and a run ends sooner."""

    def __init__(self, target: Callable[..., int], args: tuple[Any, ...], log: Path, *,
                 append: bool = False, cpu: int | None = None) -> None:  # fmt: skip
        forks = multiprocessing.get_context("forkserver")
        # The process holds the read end; nothing is ever written: it reads end-of-file once this
        # object (and so its starter) is gone, and stops.
        self._starter_lives, self._writer = forks.Pipe(duplex=False)
        self.process = forks.Process(
            target=_run, args=(target, args, str(log), append, cpu, self._starter_lives)
        )

    async def start(self) -> None:
        """Fork it (off the loop: the fork server may have to start, and the first process
        waits for its imports)."""

        def fork() -> None:
            fork_server()
            self.process.start()

        await asyncio.to_thread(fork)

    @property
    def returncode(self) -> int | None:
        """Its exit code once it ended (-N: killed by signal N), None while it runs."""
        return self.process.exitcode

    def signal(self, number: int) -> None:
        if self.process.pid is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, number)

    async def wait(self) -> int:
        """Wait, without blocking the loop, for it to end; its exit code."""
        loop = asyncio.get_running_loop()
        ended = loop.create_future()

        def end() -> None:
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(self.process.sentinel, end)
        try:
            await ended
        finally:
            loop.remove_reader(self.process.sentinel)
        self.process.join()
        assert self.process.exitcode is not None
        return self.process.exitcode


def _run(target: Callable[..., int], args: tuple[Any, ...], log: str, append: bool,
         cpu: int | None, starter_lives: Connection) -> None:  # fmt: skip
    """A forked process's body (`Forked`): its simulations run the services in it."""
    from gpuyard.shared.service import collect_cycles_rarely

    die_with_parent()  # (its parent: the fork server)
    collect_cycles_rarely()
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    threading.Thread(target=_stop_with, args=(starter_lives,), daemon=True).start()
    mode = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    for fd, path, flags in ((1, os.devnull, os.O_WRONLY), (2, log, mode)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    code = target(*args)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def _stop_with(starter_lives: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        starter_lives.recv()  # (nothing is ever sent)
    os.kill(os.getpid(), signal.SIGTERM)

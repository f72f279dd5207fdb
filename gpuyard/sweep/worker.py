"""`gpuyard worker`: take runs from the sweep queue, one at a time, and simulate each in this
process on a private server started for it (as `gpuyard sim` does), in a cluster namespace of its
own; store the result files in the bucket, publish the result, then acknowledge the run.

The queue's server carries the queue and the results alone: a run's messages, chains of small
requests one at a time, stay on this machine's loopback beside it, on the CPU it runs on when it
is pinned to one (`gpuyard.run.forks.Forked`), and a sweep of many workers puts none of its runs'
traffic through one server.

A run that fails (a bad trace line, a policy's error, its timeout) is a result too, with its
error. A worker that dies mid-run has acknowledged nothing: the run goes to another worker once
the redelivery time has passed; SIGTERM or Ctrl-C hands the run back at once."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import structlog

from gpuyard.run.embedded import EmbeddedNats
from gpuyard.run.process import stop_on_signals
from gpuyard.shared.connection import NatsAuth, connect, raise_dropped_cancellation, redact
from gpuyard.sweep.config import code_digest
from gpuyard.sweep.queue import (
    BUCKET,
    ORDER_DECODER,
    RESULT_DECODER,
    RESULTS_STREAM,
    RUNS_STREAM,
    WORKERS,
    Refusals,
    RunOrder,
    RunResult,
    describe_failure,
    ensure_queue,
    fetch_input,
    pack_results,
    result_subject,
    results_key,
)

log = structlog.get_logger("gpuyard.worker")

EXPECTED = (ValueError, OSError, RuntimeError, msgspec.ValidationError)
"""A run's failures that explain themselves (bad input, a policy's or simulation's error)."""


class Worker:
    def __init__(self, url: str, *, auth: NatsAuth | None = None, cache: Path | None = None,
                 idle_exit_s: float | None = None) -> None:  # fmt: skip
        self.url = url
        self.auth = auth
        self.cache = cache or Path(tempfile.gettempdir()) / "gpuyard-sweep-inputs"
        self.idle_exit_s = idle_exit_s
        """Stop after this long with nothing to do (None: wait for runs for ever)."""
        self.name = f"{socket.gethostname()}-{secrets.token_hex(3)}"
        self.runs = 0

    async def serve(self) -> int:
        refusals = Refusals("gpuyard worker")
        nc = await connect(self.url, name=f"gpuyard-worker-{self.name}", auth=self.auth,
                           error_cb=refusals.on_error)  # fmt: skip
        try:
            return await self._serve(nc)
        except (TimeoutError, nats.errors.Error):
            refusals.check()
            raise
        finally:
            with contextlib.suppress(Exception):
                await nc.drain()

    async def _serve(self, nc: Any) -> int:
        """Take runs from the queue, one at a time, until idle long enough."""
        js = nc.jetstream()
        await ensure_queue(js)
        sub = await js.pull_subscribe_bind(durable=WORKERS, stream=RUNS_STREAM)
        log.info("worker.ready", worker=self.name, server=redact(self.url))
        idle_since = time.monotonic()
        try:
            while True:
                raise_dropped_cancellation()
                try:
                    msgs = await sub.fetch(1, timeout=2)
                except (nats.errors.TimeoutError, TimeoutError):
                    if (
                        self.idle_exit_s is not None
                        and time.monotonic() - idle_since > self.idle_exit_s
                    ):
                        return 0
                    continue
                await self.take(js, msgs[0])
                idle_since = time.monotonic()
        finally:
            # Stopped while it asked for a run, the connection's drain would wait its whole
            # timeout (5 s) for the answer to a pull request that no longer has a taker.
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def take(self, js: Any, msg: Any) -> None:
        order = ORDER_DECODER.decode(msg.data)
        attempt = msg.metadata.num_delivered
        if await self._done_already(js, order):
            await msg.ack()  # another worker stored it: the queue held the run twice
            return
        if attempt > order.max_attempts:
            result = self._result(order, attempt, 0.0, f"abandoned: its worker stopped "
                                  f"{attempt - 1} times before it ended")  # fmt: skip
        else:
            wait = (await js.consumer_info(RUNS_STREAM, WORKERS)).config.ack_wait or 60.0
            beat = asyncio.create_task(_heartbeat(msg, wait / 3))
            try:
                raise_dropped_cancellation()  # (stopped as the run or the calls above came)
                result = await self.execute(js, order, attempt)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await msg.nak()  # stopped: someone else takes it now
                raise
            finally:
                beat.cancel()
        await js.publish(
            result_subject(order.sweep, order.run_id), msgspec.json.encode(result),
            stream=RESULTS_STREAM,
        )  # fmt: skip
        await msg.ack_sync()
        self.runs += 1
        log.info("run.done", run=order.name, run_id=order.run_id, ok=result.ok,
                 error=result.error, attempt=attempt, wall_s=result.wall_s)  # fmt: skip

    async def _done_already(self, js: Any, order: RunOrder) -> bool:
        try:
            last = await js.get_last_msg(RESULTS_STREAM, result_subject(order.sweep, order.run_id))
        except nats.js.errors.NotFoundError:
            return False
        previous = RESULT_DECODER.decode(last.data)
        return previous.ok or previous.order == order.order

    def _result(self, order: RunOrder, attempt: int, wall: float, error: str | None,
                summary: dict[str, Any] | None = None) -> RunResult:  # fmt: skip
        return RunResult(
            sweep=order.sweep, run_id=order.run_id, name=order.name, ok=error is None,
            error=error, summary=summary or {}, attempt=attempt, worker=self.name,
            wall_s=round(wall, 3), order=order.order, code=code_digest(order.spec),
        )  # fmt: skip

    async def execute(self, js: Any, order: RunOrder, attempt: int) -> RunResult:
        """Simulate the run; its result, failed with the error in one line if it failed."""
        from gpuyard.run.build import build
        from gpuyard.run.simulate import simulate

        started = time.perf_counter()
        # Its own namespace, new at every attempt: a worker taken for dead may still run.
        cluster = f"sweep-{order.run_id}-{self.name.rsplit('-', 1)[1]}-{attempt}"
        paths: dict[str, str] = {}
        with tempfile.TemporaryDirectory(prefix="gpuyard-run-") as tmp:
            folder = Path(tmp)
            try:
                paths = {i.field: str(await fetch_input(js, i, self.cache)) for i in order.inputs}
                spec = msgspec.structs.replace(order.spec, **paths)
                options, workload, described = await asyncio.to_thread(build, spec, folder)
                # Its events are published, not stored: the stream goes with the run anyway, and
                # storing them costs about 3% of a sweep's CPU (`gpuyard tail --follow` shows them).
                options = msgspec.structs.replace(options, event_storage="none")
                async with EmbeddedNats(runs=1) as server, asyncio.timeout(order.timeout_s):
                    log.info("run.started", run=order.name, run_id=order.run_id,
                             attempt=attempt, cluster=cluster, server=server)  # fmt: skip
                    result = await simulate(
                        options, workload.jobs, folder, nats_url=server, cluster_name=cluster,
                        workload=described, log_level="warning", plots=False, keep_jobs=False,
                    )  # fmt: skip
                data = await asyncio.to_thread(pack_results, folder)
                store = await js.object_store(BUCKET)
                await store.put(results_key(order.sweep, order.run_id), data)
            except TimeoutError:
                error = f"timed out after {order.timeout_s:g} s (sweep.timeout_s)"
                return self._result(order, attempt, time.perf_counter() - started, error)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure of a run is its result, not the worker's end
                log.warning("run.failed", run=order.name, exc_info=True)
                error = str(exc) if isinstance(exc, EXPECTED) else f"{type(exc).__name__}: {exc}"
                for item in order.inputs:  # the file as the sweep named it, not our copy
                    error = error.replace(paths.get(item.field, item.path), item.path)
                return self._result(order, attempt, time.perf_counter() - started,
                                    error.splitlines()[0] if error else type(exc).__name__)  # fmt: skip
        return self._result(order, attempt, time.perf_counter() - started, None, result.summary)


async def _heartbeat(msg: Any, every_s: float) -> None:
    """Tell the server the run is still at work, so that it is not given to another worker."""
    while True:
        await asyncio.sleep(every_s)
        with contextlib.suppress(Exception):
            await msg.in_progress()


async def run_worker(worker: Worker) -> int:
    """Serve until SIGTERM or Ctrl-C (which hand the run in hand back), or idle long enough."""
    try:
        return await stop_on_signals(worker.serve())
    except asyncio.CancelledError:
        log.info("worker.stopped", worker=worker.name, runs=worker.runs)
        return 0


def work(worker: Worker, log_level: str = "info") -> int:
    """`gpuyard worker`'s work, its log on stderr: `worker` serves until stopped; the exit status
    (1, with one line on stderr, if its server failed it)."""
    import uvloop

    from gpuyard.shared.logs import configure_logging

    configure_logging(log_level, sys.stderr)
    try:
        return uvloop.run(run_worker(worker))
    except (OSError, RuntimeError, TimeoutError, nats.errors.Error) as exc:
        print(f"gpuyard worker: {describe_failure(exc)}", file=sys.stderr)
        return 1


def work_locally(url: str, auth: NatsAuth) -> int:
    """A sweep's local worker (`LocalWorkers`, in a forked process): `work` on `url`."""
    return work(Worker(url, auth=auth))

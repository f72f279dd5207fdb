"""`gpuyard sweep`: publish a sweep's runs to the queue, have them run (by workers started here,
and any elsewhere), gather their results into `OUT/runs/<name>/` and one results table.

Without a server URL, a private one is started for the sweep and `parallel` workers run on this
machine. With `--nats URL`, the runs go to that server's queue; workers on any machine take them
(`gpuyard worker --nats URL`), and `--workers N` starts N here too. Either way results come back
through the server, and a sweep run again skips the runs whose results it already has (in `OUT`
or on the server): a run's identity is the hash of its inputs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import numpy as np
import pandas as pd

from gpuyard.run.embedded import EmbeddedNats
from gpuyard.run.forks import Forked, cpu_slots
from gpuyard.run.spec import RunSpec
from gpuyard.shared.connection import NatsAuth, connect
from gpuyard.sweep.config import PARAM_FIELDS, Run, Sweep, code_digest
from gpuyard.sweep.queue import (
    BUCKET,
    RESULT_DECODER,
    RESULTS_STREAM,
    Refusals,
    RunOrder,
    RunResult,
    ensure_queue,
    result_subject,
    results_key,
    run_subject,
    unpack_results,
    upload_inputs,
)

RESULT_FILE = "result.json"
"""In each run's folder: its RunResult (the run id, whether it succeeded, its error)."""


class SweepProgress:
    """One line for the whole sweep, redrawn in place on a terminal; a line every few seconds
    otherwise."""

    def __init__(self, name: str, total: int, skipped: int, stream: Any = sys.stderr) -> None:
        self.name = name
        self.total = total
        self.done = skipped
        self.failed = 0
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.skipped = skipped
        self.last = 0.0
        self.shown = -1
        """How many runs were done at the last line printed (none is printed twice)."""

    def update(self, result: RunResult | None = None, *, force: bool = False) -> None:
        if result is not None:
            self.done += 1
            self.failed += not result.ok
        now = time.monotonic()
        due = self.tty or now - self.last >= 5 or self.done == self.total
        if not (force or due) or self.shown == self.done:
            return
        self.last = now
        self.shown = self.done
        elapsed = now - self.started
        ran = self.done - self.skipped
        left = self.total - self.done
        eta = f", about {left * elapsed / ran:,.0f} s left" if ran and left else ""
        bar = "#" * int(30 * self.done / self.total) if self.total else ""
        failed = f" ({self.failed} failed)" if self.failed else ""
        line = (f"sweep {self.name} [{bar:<30}] {self.done}/{self.total} runs{failed}  "
                f"{elapsed:,.0f} s{eta}")  # fmt: skip
        end = "\r" if self.tty and left else "\n"
        print(line, end=end, file=self.stream, flush=True)


def finished_here(sweep: Sweep, out: Path, retry_failed: bool) -> dict[str, RunResult]:
    """The runs whose results are already in `out` (a failed one too, unless `retry_failed`)."""
    out.mkdir(parents=True, exist_ok=True)
    found = {}
    for run in sweep.runs:
        path = out / "runs" / run.name / RESULT_FILE
        if path.exists():
            result = RESULT_DECODER.decode(path.read_bytes())
            if result.run_id == run.run_id and (result.ok or not retry_failed):
                found[run.run_id] = result
    return found


async def run_sweep(
    sweep: Sweep, out: Path, *, nats_url: str | None, workers: int,
    auth: NatsAuth | None = None, retry_failed: bool = False,
    redeliver_after_s: float | None = None, pin: bool = True,
) -> dict[str, RunResult]:  # fmt: skip
    """Run what `out` lacks; every run's result (by run id), its files in `out/runs/<name>/`.
    `pin`: each local worker on a CPU of its own (`LocalWorkers`).

    Cancelled (Ctrl-C), it stops waiting: what has come back is kept, the runs still queued stay
    queued on a given server (a later `gpuyard sweep` collects them), local workers stop."""
    results = await asyncio.to_thread(finished_here, sweep, out, retry_failed)
    await asyncio.to_thread(shutil.copyfile, sweep.source, out / "sweep.toml")
    if len(results) == len(sweep.runs):
        return results
    refusals = Refusals("gpuyard sweep")
    try:
        return await _run_sweep(sweep, out, results, nats_url=nats_url, workers=workers, auth=auth,
                                retry_failed=retry_failed, redeliver_after_s=redeliver_after_s,
                                refusals=refusals, pin=pin)  # fmt: skip
    except (TimeoutError, nats.errors.Error):
        refusals.check()  # what timed out was refused: say so rather than "no answer in time"
        raise


async def _run_sweep(
    sweep: Sweep, out: Path, results: dict[str, RunResult], *, nats_url: str | None, workers: int,
    auth: NatsAuth | None, retry_failed: bool, redeliver_after_s: float | None, refusals: Refusals,
    pin: bool,
) -> dict[str, RunResult]:  # fmt: skip
    order = secrets.token_hex(4)
    bar = SweepProgress(sweep.name, len(sweep.runs), len(results))
    async with contextlib.AsyncExitStack() as stack:
        # (The queue's traffic alone: each run is simulated on a server of its own.)
        url = nats_url if nats_url else await stack.enter_async_context(EmbeddedNats(runs=1))
        nc = await connect(url, name=f"gpuyard-sweep-{sweep.name}", auth=auth if nats_url else None,
                           error_cb=refusals.on_error)  # fmt: skip
        stack.push_async_callback(nc.drain)
        js = nc.jetstream()
        await ensure_queue(js, redeliver_after_s)
        store = await js.object_store(BUCKET)
        by_id = {run.run_id: run for run in sweep.runs}
        arrived: asyncio.Queue[RunResult] = asyncio.Queue()

        async def on_result(msg: Any) -> None:
            result = RESULT_DECODER.decode(msg.data)
            wanted = result.ok or result.order == order or not retry_failed
            if wanted and result.run_id in by_id and result.run_id not in results:
                arrived.put_nowait(result)

        # Every stored result of this sweep, then new ones: runs done before are not sent again.
        sub = await js.subscribe(
            result_subject(sweep.name, "*"), cb=on_result, ordered_consumer=True
        )
        stack.push_async_callback(sub.unsubscribe)
        stored = await js.stream_info(
            RESULTS_STREAM, subjects_filter=result_subject(sweep.name, "*")
        )
        known = set((stored.state.subjects or {}).keys())
        pending = [r for r in sweep.runs if r.run_id not in results
                   and (retry_failed or result_subject(sweep.name, r.run_id) not in known)]  # fmt: skip
        await upload_inputs(js, [i for run in pending for i in run.inputs])
        for run in pending:
            await js.publish(
                run_subject(sweep.name), msgspec.json.encode(_order(sweep, run, order)),
                headers={"Nats-Msg-Id": f"{sweep.name}.{run.run_id}.{order}"},
            )  # fmt: skip
        local = LocalWorkers(url, workers, out / "workers", auth if nats_url else None, pin=pin)
        if workers:
            await stack.enter_async_context(local)
        bar.update(force=True)
        while len(results) < len(sweep.runs):
            try:  # (not `wait_for`: on Python 3.11 it may swallow a Ctrl-C's cancellation)
                async with asyncio.timeout(2):
                    result = await arrived.get()
            except TimeoutError:
                await local.restart_stopped()
                continue
            if result.run_id in results:
                continue  # the same run done twice: its first result stands
            run = by_id[result.run_id]
            data = None
            if result.ok:
                data = (await store.get(results_key(sweep.name, run.run_id))).data or b""
            await asyncio.to_thread(keep_result, out / "runs" / run.name, result, data)
            results[result.run_id] = result
            bar.update(result)
    other = [
        r.worker for r in results.values() if r.code and r.code != code_digest(by_id[r.run_id].spec)
    ]
    if other:
        print(f"gpuyard sweep: {len(other)} runs ran on workers whose code differs from this one's "
              f"({', '.join(sorted(set(other))[:3])}): their results may differ (column `code`)",
              file=sys.stderr)  # fmt: skip
    return results


def keep_result(folder: Path, result: RunResult, files: bytes | None) -> None:
    """A run's result files (`files`: their tar.gz) and `result.json` in its folder (whatever
    was there before, from another run of that name, goes)."""
    if folder.exists():
        shutil.rmtree(folder)
    if files is not None:
        unpack_results(files, folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RESULT_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(result)))


def _order(sweep: Sweep, run: Run, order: str) -> RunOrder:
    return RunOrder(
        sweep=sweep.name, run_id=run.run_id, name=run.name, spec=run.spec, inputs=run.inputs,
        timeout_s=sweep.settings.timeout_s, max_attempts=sweep.settings.max_attempts, order=order,
        code=code_digest(run.spec),
    )  # fmt: skip


class LocalWorkers:
    """`async with LocalWorkers(url, n, logs, auth):` n workers (`gpuyard worker`'s work) on this
    machine, each in a process forked from the fork server (`gpuyard.run.forks`), connecting as
    `auth` (the sweep's own identity: handed over through the fork server's pipe, in no
    command line or environment). `pin`: each on a CPU of its own, the CPUs this
    process may use in turn, with the private servers of its runs (`Forked`'s `cpu`)."""

    def __init__(self, url: str, count: int, logs: Path, auth: NatsAuth | None = None, *,
                 pin: bool = True) -> None:  # fmt: skip
        self.url = url
        self.auth = auth or NatsAuth()
        self.count = count
        self.logs = logs
        self.cpus: list[int | None] = [*cpu_slots(count)] if pin else [None] * count
        self.procs: list[Forked] = []
        self.restarts = 0

    async def __aenter__(self) -> LocalWorkers:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs = [await self._start(i) for i in range(self.count)]
        return self

    async def _start(self, i: int) -> Forked:
        from gpuyard.sweep.worker import work_locally

        proc = Forked(work_locally, (self.url, self.auth), self.logs / f"worker-{i}.log",
                      append=True, cpu=self.cpus[i])  # fmt: skip
        await proc.start()
        return proc

    async def restart_stopped(self) -> None:
        """Start again a worker that stopped (its run goes to another after the redelivery
        time); RuntimeError once they have stopped more than twice each."""
        for i, proc in enumerate(self.procs):
            if proc.returncode is None:
                continue
            self.restarts += 1
            if self.restarts > 2 * self.count:
                raise RuntimeError(f"the local workers keep stopping: see {self.logs}/")
            print(f"gpuyard sweep: worker {i} stopped (exit {proc.returncode}, see "
                  f"{self.logs / f'worker-{i}.log'}); starting it again", file=sys.stderr)  # fmt: skip
            self.procs[i] = await self._start(i)

    async def __aexit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGTERM)  # a run in hand goes back to the queue
        for proc in self.procs:
            try:
                async with asyncio.timeout(20):
                    await proc.wait()
            except TimeoutError:
                proc.signal(signal.SIGKILL)
                await proc.wait()


# --------------------------------------------------------------------------- the results table


def _cell(value: Any) -> Any:
    """Dicts and lists as JSON text: one type per column, for Parquet."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value


def measured(jobs: pd.DataFrame, window: str | None) -> pd.DataFrame:
    """A run's jobs, or with a measurement window (`FIRST:END`) the jobs it measured: FIRST to
    END - 1 in arrival order, as the simulation counts them."""
    if not window:
        return jobs
    first, end = (int(v) for v in window.split(":"))
    return jobs.sort_values("arrival", kind="stable").iloc[first:end]


def fairness(jobs: pd.DataFrame) -> dict[str, float | None]:
    """Finish-time fairness of a run's completed jobs: rho = JCT / the time the job ran (its JCT
    had it never waited nor been preempted); the mean and the worst rho, and Jain's index of
    1/rho (1: every job slowed down alike)."""
    done = jobs[(jobs["state"] == "completed") & (jobs["executed_time"] > 0)]
    if done.empty:
        return {"rho_mean": None, "rho_max": None, "rho_jain": None}
    rho = done["jct"].to_numpy(dtype=float) / done["executed_time"].to_numpy(dtype=float)
    speed = 1 / rho
    return {
        "rho_mean": float(rho.mean()),
        "rho_max": float(rho.max()),
        "rho_jain": float(speed.sum() ** 2 / (len(speed) * (speed**2).sum())),
    }


SPEC_DEFAULTS = {f.name: getattr(RunSpec(), f.name) for f in msgspec.structs.fields(RunSpec)}
RAN = ("policy", "admission", "placement", *PARAM_FIELDS, "window", "round_s", "mode")
"""Summary fields that are also inputs: in the table as `ran_<field>` (what the services ran)."""


def results_table(sweep: Sweep, out: Path, results: dict[str, RunResult]) -> pd.DataFrame:
    """One row per run, in the sweep's order: its id, name, status and error, every input, and
    its summary (every metric, plus finish-time fairness from its jobs)."""
    rows = []
    for run in sweep.runs:
        result = results.get(run.run_id)
        spec = {k: _cell(v) for k, v in msgspec.to_builtins(run.spec).items()}
        row: dict[str, Any] = {
            "sweep": sweep.name, "run_id": run.run_id, "name": run.name,
            "scheme": run.spec.scheme,
            "status": "missing" if result is None else "ok" if result.ok else "failed",
            "error": None if result is None else result.error,
            "attempt": None if result is None else result.attempt,
            "worker": None if result is None else result.worker,
            "code": None if result is None else result.code,
            **{k: _cell(v) for k, v in SPEC_DEFAULTS.items()},
            **spec,
        }  # fmt: skip
        if result is not None and result.ok:
            for key, value in result.summary.items():
                row[f"ran_{key}" if key in RAN else key] = _cell(value)
            jobs_path = out / "runs" / run.name / "jobs.csv"
            if jobs_path.exists():
                row |= fairness(measured(pd.read_csv(jobs_path), run.spec.window))
        rows.append(row)
    return pd.DataFrame(rows)


def write_table(table: pd.DataFrame, out: Path) -> list[Path]:
    table.to_csv(out / "results.csv", index=False)
    table.to_parquet(out / "results.parquet", index=False)
    return [out / "results.parquet", out / "results.csv"]


def format_results(table: pd.DataFrame) -> str:
    """The table for people: one row per run, hours and percentages."""

    def hours(column: str) -> Any:
        return (table[column] / 3600).round(2) if column in table else np.nan

    shown = pd.DataFrame({
        "run": table["name"],
        "status": table["status"],
        "mean JCT (h)": hours("mean_jct"),
        "p95 JCT (h)": hours("p95_jct"),
        "makespan (h)": hours("makespan"),
        "util (%)": (100 * table["utilization"]).round(1) if "utilization" in table else np.nan,
    })  # fmt: skip
    if (
        "deadline_satisfactory_ratio" in table
        and table["deadline_satisfactory_ratio"].notna().any()
    ):
        shown["deadlines met (%)"] = (100 * table["deadline_satisfactory_ratio"]).round(1)
    text = shown.to_string(index=False)
    failed = table[table["status"] == "failed"]
    for _, row in failed.iterrows():
        text += f"\nFAILED {row['name']}: {row['error']}"
    return text

"""The job side of gpuyard: a tiny client for training scripts (standard library only, no NATS).

The node agent starts every process of a job with these environment variables:

- `GPUYARD_JOB_ID`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT` (and Blox's
  `job_id`, `dist_rank`, `world_size`, `master_ip_address`, `local_gpu_id`, `local_accessible_gpu`);
- `GPUYARD_CHECKPOINT_DIR`: a folder keyed by job id under a root shared by all nodes, so a job
  resumed on another node finds its checkpoint;
- `GPUYARD_ATTEMPT`: how often the job was stopped before (0 on its first run);
- `GPUYARD_PROGRESS_FILE`: where `report()` writes progress; the agent forwards it in heartbeats;
- `GPUYARD_GRACE_S`: the agents' grace period between SIGTERM and SIGKILL;
- `GPUYARD_GPU_TYPE`: the type of the node's GPUs the process runs on (`job.gpu_type`; a job may
  tune itself to it). A heterogeneity-aware policy moves a job between types, each run on one.
- `GPUYARD_BATCH_SIZE`, `GPUYARD_LOCAL_BATCH_SIZE`, `GPUYARD_ACCUM_STEPS`: an adaptive job's
  batch for this run (`job.batch_size`, `job.local_batch_size`, `job.accum_steps`; None, None
  and 0 otherwise): each GPU computes `local_batch_size` samples at a time, and the optimizer steps
  after `accum_steps + 1` of them, so `batch_size` = GPUs x local_batch_size x (accum_steps + 1).
  Only a job submitted with `adaptive_batch` limits gets them (`gpuyard.shared.model.BatchLimits`);
- `NNODES`: the nodes the job runs on (`job.num_nodes`).

Adaptive batch sizes (Pollux, AdaptDL): at each (re)start the scheduler gives an adaptive job the
batch that maximises its goodput (throughput x statistical efficiency) on the GPUs it got,
from the model it fits to what the job measured. The job measures its step times and its
gradient statistics and reports them; `report()` carries them to the scheduler (rank 0's stand
for the job: its ranks step together). Until it has reported both, it keeps its initial batch::

    local, accum = job.local_batch_size or 32, job.accum_steps
    started = time.perf_counter()
    ...  # accum_steps micro-batches of `local` samples without the all-reduce, then one with it
    job.profile_step(time.perf_counter() - started, sync_s=waited_for_allreduce)
    job.report_gradients(grad_sqr, grad_var)  # e.g. from the micro-batches' gradients

`profile_step` takes the seconds of one optimizer step (the all-reduce and the update included;
`accumulation=True`: of one accumulation micro-step without them), aggregated per configuration
(nodes, GPUs, local batch: at most 32, the latest). `report_gradients` takes AdaptDL's
statistics: `grad_sqr`, the squared norm of the true gradient, and `grad_var`, the variance
(trace of the covariance) of the gradient averaged over the job's total batch, both
estimated from gradients over parts of the batch (micro-batches or replicas: with n parts of the
same size, g_i each, G their mean, `grad_sqr` = (n |G|^2 - mean |g_i|^2) / (n - 1) and `grad_var`
= (mean |g_i|^2 - |G|^2) / (n - 1)); they are smoothed here (an exponential moving average).

The node agent measures each run's rate from the reports (steps per second by the job's own clock,
from the run's first report on): on a real cluster that is how the scheduler learns how fast each
job type runs on each GPU type.

Resizes: an elastic job given another GPU count is stopped like a preemption (it checkpoints) and
started again with the new `WORLD_SIZE`. `job.world_size` is the new size; `job.previous_world_size`
is the size of the run that wrote the last checkpoint, and `job.resized` says they differ. After a
resize `load_checkpoint()` returns rank 0's checkpoint to every rank (a new rank has none of its
own, and a rank's own may be older than the runs in between), as to a rank that has none of its
own: data-parallel ranks hold the same state, and rank 0 always exists.

A restarted job may start before its previous run has finished checkpointing (on another node, a
resize or a move launches the new processes while the old ones still write). So every process
marks itself running in the checkpoint folder (`.runs/`, removed at exit), and a later run's
`load_checkpoint()` first waits until the earlier runs' processes are gone (at most the grace
period: by then the agent has killed them).

Preemption: the agent sends SIGTERM, waits a grace period (30 s by default), then SIGKILL.
`JobClient` turns SIGTERM into a flag; the loop checks it, checkpoints and exits::

    job = JobClient.from_env()
    if job.finished:  # an earlier run did all the work: do not do it (or its ending) again
        sys.exit(0)
    state = job.load_checkpoint() or {"step": 0}
    while state["step"] < total:
        train_one_step()
        state["step"] += 1
        job.report(iterations=state["step"])
        if job.preempted:
            job.save_checkpoint(state)
            job.exit_preempted()
    job.save_checkpoint(state)
    save_the_model()
    job.finish()  # last: later runs find the job finished

A job may be launched again after a run that finished: that run's end can be lost (killed on its
way out: a SIGTERM once Python has dropped its handlers, a SIGKILL after the grace period) or
reach the scheduler only after it relaunched the job (an exit reported while the scheduler
restarts). `finish()` marks the work done beside the checkpoint (and ignores SIGTERM from then
on), and the run that finds it (`finished`) exits 0 at once: the job's work and its ending are done
once.

Outside gpuyard (no variables) it works too: rank 0 of 1, checkpoints in `./checkpoints/<job>`.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

FINISHED = "finished.json"
"""Beside a rank's checkpoint once a run finished (`finish()`): which run it was."""
PROFILE_MAX_CONFIGS = 32
"""The most configurations `profile_step` keeps (the latest): a progress file stays small."""
GRADIENT_SMOOTHING = 0.1
"""The weight of each new estimate in `report_gradients`' moving averages."""


class JobClient:
    """One process of a job, as the node agent started it."""

    def __init__(
        self, job_id: str, rank: int, world_size: int, local_rank: int, attempt: int,
        checkpoint_dir: Path, progress_file: Path | None, *, handle_sigterm: bool = True,
        report_every_s: float = 0.5, grace_s: float = 30.0, gpu_type: str = "",
        batch_size: int | None = None, local_batch_size: int | None = None, accum_steps: int = 0,
        num_nodes: int = 1,
    ) -> None:  # fmt: skip
        self.job_id = job_id
        self.gpu_type = gpu_type
        """The GPU type this run got ("" outside gpuyard or where the agent does not know it)."""
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.attempt = attempt
        """How often this job was stopped before (preemptions, lost nodes); 0 on its first run."""
        self.num_nodes = num_nodes
        self.batch_size = batch_size
        """An adaptive job's total batch this run (GPUs x local x (accum + 1)); None: not told."""
        self.local_batch_size = local_batch_size
        """An adaptive job's per-GPU batch of one (micro-)step this run; None: not told."""
        self.accum_steps = accum_steps
        """Accumulation steps before each optimizer step this run (0: none)."""
        self._step_times: dict[tuple[int, int, int], list[float]] = {}
        """(nodes, GPUs, local batch) -> [optim seconds, sync seconds, optim steps, accumulation
        seconds, accumulation steps], summed."""
        self._gradients: list[float] = [0.0, 0.0, 0.0, 0.0]
        """Moving averages of grad_sqr and grad_var, their weight so far, the batch size."""
        self._warned = False
        self.checkpoint_dir = checkpoint_dir
        self.progress_file = progress_file
        self.report_every_s = report_every_s
        self.preempted = False
        """Set by SIGTERM: checkpoint and exit soon (before the grace period ends)."""
        self._last_report = 0.0
        self._handles_sigterm = handle_sigterm
        self.grace_s = grace_s
        """How long a process of an earlier run may still be writing its checkpoint."""
        self._settled = False
        self._previous_world_size: int | None = None
        self._mark = self.checkpoint_dir / RUNS / f"a{attempt}.r{rank}"
        _write_atomically(self._mark, f"{socket.gethostname()} {os.getpid()}".encode())
        atexit.register(self._mark.unlink, missing_ok=True)
        if handle_sigterm:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **options: Any) -> JobClient:
        env = dict(os.environ) if env is None else env
        job_id = env.get("GPUYARD_JOB_ID") or env.get("job_id") or "local"
        progress = env.get("GPUYARD_PROGRESS_FILE")
        if env.get("GPUYARD_GRACE_S"):
            options = {"grace_s": float(env["GPUYARD_GRACE_S"]), **options}
        return cls(
            job_id=job_id,
            rank=int(env.get("RANK") or env.get("dist_rank") or 0),
            world_size=int(env.get("WORLD_SIZE") or env.get("world_size") or 1),
            local_rank=int(env.get("LOCAL_RANK") or 0),
            attempt=int(env.get("GPUYARD_ATTEMPT") or 0),
            checkpoint_dir=Path(env.get("GPUYARD_CHECKPOINT_DIR") or Path("checkpoints") / job_id),
            progress_file=Path(progress) if progress else None,
            gpu_type=env.get("GPUYARD_GPU_TYPE", ""),
            batch_size=_positive(env.get("GPUYARD_BATCH_SIZE")),
            local_batch_size=_positive(env.get("GPUYARD_LOCAL_BATCH_SIZE")),
            accum_steps=_positive(env.get("GPUYARD_ACCUM_STEPS"), 0) or 0,
            num_nodes=_positive(env.get("NNODES")) or 1,
            **options,
        )

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.preempted = True

    @property
    def finished(self) -> bool:
        """An earlier run of this rank finished (`finish()`): the work is done, and this run
        should exit 0 at once."""
        return self.checkpoint_path(FINISHED).exists()

    @property
    def previous_world_size(self) -> int | None:
        """The world size of the run that wrote the last checkpoint (None: no checkpoint yet)."""
        self._settle()
        return self._previous_world_size

    @property
    def resized(self) -> bool:
        """This run has another world size than the one that wrote the last checkpoint."""
        return self.previous_world_size not in (None, self.world_size)

    @property
    def resumed(self) -> bool:
        """A restart after a preemption or a lost node, or a checkpoint is there to resume from."""
        return self.attempt > 0 or self.checkpoint_path().exists()

    # ------------------------------------------------------------------ progress

    def report(self, *, iterations: int = 0, samples: int = 0, force: bool = False,
               **metrics: float) -> None:  # fmt: skip
        """Record progress (cheap: written at most every `report_every_s`, atomically)."""
        now = time.time()
        if self.progress_file is None or (
            not force and now - self._last_report < self.report_every_s
        ):
            return
        self._last_report = now
        record = {
            "job_id": self.job_id, "rank": self.rank, "iterations": iterations, "samples": samples,
            "metrics": {k: float(v) for k, v in metrics.items()}, "attempt": self.attempt,
            "time": now,
        }  # fmt: skip
        if self.rank == 0 and (goodput := self._goodput()):
            record["goodput"] = goodput
        _write_atomically(self.progress_file, json.dumps(record).encode())

    def profile_step(
        self, seconds: float, *, sync_s: float = 0.0, accumulation: bool = False,
        local_bsz: int | None = None,
    ) -> None:  # fmt: skip
        """Record one step's seconds (module docstring): an optimizer step's, of which `sync_s`
        waiting for the all-reduce, or (`accumulation`) an accumulation micro-step's. At
        `local_bsz` samples per GPU (default `local_batch_size`), on this run's nodes and GPUs.
        Values that are not finite, or negative, are left out (said once, on stderr)."""
        local = local_bsz if local_bsz is not None else self.local_batch_size
        if local is None:
            raise ValueError("profile_step needs local_bsz where GPUYARD_LOCAL_BATCH_SIZE is unset")
        if not (_finite(seconds) and _finite(sync_s) and seconds > 0 and 0 <= sync_s < seconds):
            self._warn(f"step time {seconds!r} s (sync {sync_s!r} s) left out")
            return
        key = (self.num_nodes, max(self.num_nodes, self.world_size), int(local))
        sums = self._step_times.pop(key, None) or [0.0, 0.0, 0.0, 0.0, 0.0]
        self._step_times[key] = sums  # (the latest last)
        if accumulation:
            sums[3] += seconds
            sums[4] += 1
        else:
            sums[0] += seconds
            sums[1] += sync_s
            sums[2] += 1
        while len(self._step_times) > PROFILE_MAX_CONFIGS:
            del self._step_times[next(iter(self._step_times))]

    def report_gradients(
        self, grad_sqr: float, grad_var: float, *, batch_size: int | None = None
    ) -> None:
        """Record an estimate of the gradient statistics (module docstring) at the total batch
        `batch_size` (default `batch_size`); the next `report()` carries their moving averages.
        Values that are not finite are left out (said once, on stderr)."""
        batch = batch_size if batch_size is not None else self.batch_size
        if batch is None:
            raise ValueError("report_gradients needs batch_size where GPUYARD_BATCH_SIZE is unset")
        if not (_finite(grad_sqr) and _finite(grad_var)):
            self._warn(f"gradient statistics {grad_sqr!r}, {grad_var!r} left out")
            return
        averages = self._gradients
        keep = 1.0 - GRADIENT_SMOOTHING
        averages[0] = keep * averages[0] + GRADIENT_SMOOTHING * float(grad_sqr)
        averages[1] = keep * averages[1] + GRADIENT_SMOOTHING * float(grad_var)
        averages[2] = keep * averages[2] + GRADIENT_SMOOTHING
        averages[3] = float(batch)

    def _goodput(self) -> dict[str, Any] | None:
        """What `profile_step` and `report_gradients` gathered, as the progress file carries it
        (`gpuyard.shared.model.GoodputProfile`); None: nothing yet."""
        times = [
            [*key, sums[0] / sums[2], sums[1] / sums[2], int(sums[2]),
             sums[3] / sums[4] if sums[4] else 0.0, int(sums[4])]
            for key, sums in self._step_times.items() if sums[2]
        ]  # fmt: skip
        sqr, var, weight, batch = self._gradients
        if not times and not weight:
            return None
        goodput: dict[str, Any] = {"times": times}
        if weight:  # (bias-corrected: the averages start from 0)
            goodput |= {
                "grad_sqr": sqr / weight,
                "grad_var": var / weight,
                "batch_size": int(batch),
            }
        return goodput

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            print(f"gpuyard.jobclient: {what} (not finite or out of range)", file=sys.stderr)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_path(self, name: str = "state.json", *, rank: int | None = None) -> Path:
        """`<checkpoint dir>/rank<r>/<name>` (each rank its own, so ranks never race)."""
        return self.checkpoint_dir / f"rank{self.rank if rank is None else rank}" / name

    def save_checkpoint(self, state: dict[str, Any], name: str = "state.json") -> Path:
        """Write a JSON-able state atomically (a crash mid-write keeps the previous one). Rank 0
        also records the world size it was saved at (after the state: see `load_checkpoint`)."""
        path = self.checkpoint_path(name)
        _write_atomically(path, json.dumps(state).encode())
        if self.rank == 0:
            record = {"world_size": self.world_size, "attempt": self.attempt}
            _write_atomically(self._world_path(), json.dumps(record).encode())
        return path

    def finish(self) -> None:
        """The work is done, and whatever ends it (the last checkpoint, results, messages): later
        runs of the job find it `finished`. Call it last (a SIGTERM meanwhile only sets the flag);
        from then on SIGTERM is ignored (if we handle it), so a preemption that lands while the
        process exits (when Python has dropped its handlers) does not make the run look stopped."""
        done = {"attempt": self.attempt, "time": time.time()}
        _write_atomically(self.checkpoint_path(FINISHED), json.dumps(done).encode())
        if self._handles_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def load_checkpoint(self, name: str = "state.json") -> dict[str, Any] | None:
        """This rank's last checkpoint; after a resize, or for a rank without one, rank 0's
        (module docstring). None when there is none. Waits for an earlier run still writing."""
        self._settle()
        own = self.checkpoint_path(name)
        path = self.checkpoint_path(name, rank=0) if self.resized or not own.exists() else own
        try:
            state: dict[str, Any] = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        return state

    def _world_path(self) -> Path:
        return self.checkpoint_dir / "world.json"

    def _settle(self) -> None:
        """Once: wait for the earlier runs' processes to exit (their checkpoints are written), at
        most `grace_s`, then read the world size the last checkpoint was saved at."""
        if self._settled:
            return
        self._settled = True
        deadline = time.monotonic() + self.grace_s
        while (earlier := self._earlier_runs()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for mark in earlier:  # killed (SIGKILL leaves its mark): gone by now
            mark.unlink(missing_ok=True)
        try:
            saved = json.loads(self._world_path().read_bytes())["world_size"]
            self._previous_world_size = int(saved)
        except (OSError, ValueError, KeyError, TypeError):
            self._previous_world_size = None

    def _earlier_runs(self) -> list[Path]:
        """The marks of processes of earlier runs (of this job) that have not exited; a mark of a
        process of this host that is gone (killed) does not count."""
        marks = []
        host = socket.gethostname()
        for mark in self._mark.parent.glob("a*.r*"):
            attempt = mark.name[1:].split(".", 1)[0]
            if not attempt.isdigit() or int(attempt) >= self.attempt:
                continue
            try:
                where, pid = mark.read_text().split()
            except (OSError, ValueError):
                continue
            if where == host and not _alive(int(pid)):
                mark.unlink(missing_ok=True)
                continue
            marks.append(mark)
        return marks

    def exit_preempted(self) -> None:
        """Exit after a preemption's checkpoint (128 + SIGTERM, as if the signal had killed us)."""
        sys.stdout.flush()
        sys.exit(128 + signal.SIGTERM)


RUNS = ".runs"
"""The checkpoint folder's marks of the processes running (`a<attempt>.r<rank>`: host and pid)."""


def _positive(text: str | None, least: int = 1) -> int | None:
    """An environment variable's whole number of at least `least`; None: unset or not one."""
    try:
        value = int(text) if text else None
    except ValueError:
        return None
    return value if value is not None and value >= least else None


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)

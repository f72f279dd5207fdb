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
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

FINISHED = "finished.json"
"""Beside a rank's checkpoint once a run finished (`finish()`): which run it was."""


class JobClient:
    """One process of a job, as the node agent started it."""

    def __init__(
        self, job_id: str, rank: int, world_size: int, local_rank: int, attempt: int,
        checkpoint_dir: Path, progress_file: Path | None, *, handle_sigterm: bool = True,
        report_every_s: float = 0.5, grace_s: float = 30.0, gpu_type: str = "",
    ) -> None:  # fmt: skip
        self.job_id = job_id
        self.gpu_type = gpu_type
        """The GPU type this run got ("" outside gpuyard or where the agent does not know it)."""
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.attempt = attempt
        """How often this job was stopped before (preemptions, lost nodes); 0 on its first run."""
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
        _write_atomically(self.progress_file, json.dumps(record).encode())

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

"""`gpuyard jobs` as Slurm users read it: one row per job with its state under Slurm's names, the
reason that holds now, its user, nodes, elapsed time and progress.

The scheduler owns admitted jobs (their `JobRecord`s); jobs admission held or rejected never
reach it, so they come from admission's events (`job.held`, `job.rejected`). The states and
reasons are documented in one table in docs/cli.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gpuyard.shared.contract import Event
from gpuyard.shared.durations import slurm_duration
from gpuyard.shared.model import JobRecord, JobState

JOB_STATES = {
    "PENDING": "queued, never started (or held: by admission, or by `gpuyard hold`)",
    "REQUEUED": "queued again after it ran (preempted, or its node was lost)",
    "RUNNING": "running",
    "COMPLETED": "ended: every process exited 0",
    "FAILED": "ended: a process failed, or its launch did",
    "CANCELLED": "ended: cancelled",
    "TIMEOUT": "ended: stopped at its time limit",
    "REJECTED": "refused by admission: never queued",
}
"""The states `gpuyard jobs` shows (and `--state` takes, in any case), as Slurm names them."""


SCHEDULER_STATES: dict[str, JobState] = {
    "PENDING": "queued", "REQUEUED": "queued", "RUNNING": "running", "COMPLETED": "completed",
    "FAILED": "failed", "CANCELLED": "cancelled", "TIMEOUT": "timeout",
}  # fmt: skip
"""The scheduler's state of the jobs in each state `gpuyard jobs` shows (REJECTED: none, they
never reach it)."""


def parse_states(values: Iterable[str]) -> set[str]:
    """`--state running,PENDING --state Completed` -> {"RUNNING", "PENDING", "REQUEUED",
    "COMPLETED"}: PENDING takes the requeued jobs too (they wait as well, as in Slurm's
    `squeue --states PENDING`); REQUEUED takes those alone."""
    states: set[str] = set()
    for value in values:
        for name in value.split(","):
            state = name.strip().upper()
            if state not in JOB_STATES:
                raise ValueError(
                    f"--state {name.strip()!r} is not a job state; states: "
                    f"{', '.join(JOB_STATES)} (any case)"
                )
            states.add(state)
    if "PENDING" in states:
        states.add("REQUEUED")
    return states


@dataclass(frozen=True)
class NotAdmitted:
    """A job admission held or rejected, as its last event says."""

    job_id: str
    held: bool
    reason: str
    user: str
    time: float

    @classmethod
    def latest(cls, events: Iterable[Event]) -> dict[str, NotAdmitted]:
        """Each job's last `job.held` / `job.rejected` event (in stream order)."""
        out: dict[str, NotAdmitted] = {}
        for e in events:
            if e.job_id is not None and e.type in ("job.held", "job.rejected"):
                first = out.get(e.job_id)
                out[e.job_id] = cls(
                    job_id=e.job_id, held=e.type == "job.held", reason=e.reason, user=e.user,
                    time=first.time if first is not None else e.now,
                )  # fmt: skip
        return out


def slurm_state(record: JobRecord) -> str:
    if record.state == "queued":
        return "REQUEUED" if record.attempt > 0 else "PENDING"
    return record.state.upper()


def current_reason(record: JobRecord) -> str:
    """Why the job is in its state now: a running job has none, a waiting one waits for GPUs
    unless it was stopped (then the stop's reason), an ended one says how it ended."""
    if record.state == "running":
        return ""
    if record.state == "queued" and record.attempt == 0:
        return record.reason or "Resources"
    return record.reason


def elapsed_s(record: JobRecord, now: float) -> float:
    """Seconds it has run, over all its runs (Slurm's TIME)."""
    running = now - record.run_start if record.state == "running" else 0.0
    return record.executed_time + max(running, 0.0)


def progress(record: JobRecord) -> dict[str, Any]:
    """Steps done as last reported (node agents' heartbeats, preemptions, exits) and of how many."""
    done = record.steps_done
    if record.state == "completed" and record.total_steps is not None:
        done = record.total_steps
    fraction = None
    if record.total_steps and done is not None:
        fraction = min(done / record.total_steps, 1.0)
    return {"steps_done": done, "total_steps": record.total_steps, "fraction": fraction}


def job_row(record: JobRecord, now: float) -> dict[str, Any]:
    """A job as `gpuyard jobs --json` prints it: its record, plus what the table shows (under
    names the record does not use): `job_state` and `state_reason` as in the table, `user`,
    `name`, `num_gpus` (held, or asked for while it waits), `node_list`, `elapsed_s`,
    `progress`."""
    nodes = record.nodes if record.state == "running" else record.ran_on
    fields: dict[str, Any] = msgspec.to_builtins(record)
    return fields | {
        "job_state": slurm_state(record),
        "state_reason": current_reason(record),
        "user": record.spec.user,
        "name": record.spec.name or " ".join(record.spec.command),
        "num_gpus": record.gpus if record.state == "running" else record.spec.num_gpus,
        "node_list": list(nodes),
        "elapsed_s": elapsed_s(record, now),
        "progress": progress(record),
    }


def not_admitted_row(job: NotAdmitted) -> dict[str, Any]:
    """A job admission held or rejected, with the fields of `job_row` that it has."""
    return {
        "job_id": job.job_id,
        "state": "held" if job.held else "rejected",
        "submit_time": job.time,
        "first_start": None,
        "end_time": None,
        "preemptions": 0,
        "job_state": "PENDING" if job.held else "REJECTED",
        "state_reason": f"held by admission: {job.reason}" if job.held else job.reason,
        "user": job.user,
        "name": "",
        "num_gpus": None,
        "node_list": [],
        "elapsed_s": 0.0,
        "progress": {"steps_done": None, "total_steps": None, "fraction": None},
    }


def clock(t: float | None, now: float) -> str:
    """A time of day; with the date when it is not today."""
    if t is None:
        return "-"
    same_day = time.localtime(t)[:3] == time.localtime(now)[:3]
    return time.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M", time.localtime(t))


def _progress_text(p: dict[str, Any]) -> str:
    done, total, fraction = p["steps_done"], p["total_steps"], p["fraction"]
    if fraction is not None:
        return f"{100 * fraction:.0f}% ({done:,.0f}/{total:,.0f})"
    return f"{done:,.0f} steps" if done else "-"


def _gpus_text(row: dict[str, Any]) -> str:
    """GPUs held or asked for; a share of one GPU as its fraction (0.25)."""
    share = (row.get("spec") or {}).get("gpu_milli")
    if share is not None:
        return f"{share / 1000:g}"
    return "-" if row["num_gpus"] is None else str(row["num_gpus"])


def format_jobs(rows: list[dict[str, Any]], now: float) -> str:
    header = ("JOBID", "NAME", "USER", "STATE", "GPUS", "NODES", "ELAPSED", "PROGRESS",
              "SUBMIT", "START", "END", "PREEMPT", "REASON")  # fmt: skip
    table = [header]
    for r in rows:
        table.append(
            (
                r["job_id"], r["name"][:24] or "-", r["user"] or "-", r["job_state"],
                _gpus_text(r),
                ",".join(r["node_list"]) or "-", slurm_duration(r["elapsed_s"]),
                _progress_text(r["progress"]), clock(r["submit_time"], now),
                clock(r["first_start"], now),
                clock(r["end_time"], now), str(r["preemptions"]), r["state_reason"] or "-",
            )
        )  # fmt: skip
    return text_table(table)


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, a header row first: every table a command prints."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )

"""Results of a run as files a researcher loads with pandas in one line: the per-job table
(`jobs.csv`), the cluster timeline (`timeline.csv`), `summary.json`, and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd

from gpuyard.shared.contract import JobRecord, TimelinePoint

matplotlib.use("Agg")
import matplotlib.pyplot as plt

JOB_COLUMNS = [
    "job_id", "state", "num_gpus", "gpu_type", "priority", "user", "arrival", "start", "end",
    "jct", "queueing_delay", "preemptions", "gpu_seconds", "executed_time", "deadline",
    "deadline_met", "reason",
]  # fmt: skip


def jobs_frame(records: list[JobRecord]) -> pd.DataFrame:
    rows = []
    for r in records:
        end = r.end_time
        deadline = r.spec.deadline
        rows.append(
            {
                "job_id": r.job_id,
                "state": r.state,
                "num_gpus": r.spec.num_gpus,
                "gpu_type": r.spec.gpu_type,
                "priority": r.spec.priority,
                "user": r.spec.user,
                "arrival": r.submit_time,
                "start": r.first_start,
                "end": end,
                "jct": None if end is None else end - r.submit_time,
                "queueing_delay": None if r.first_start is None else r.first_start - r.submit_time,
                "preemptions": r.preemptions,
                "gpu_seconds": r.gpu_seconds,
                "executed_time": r.executed_time,
                "deadline": deadline,
                "deadline_met": None if deadline is None else (end is not None and end <= deadline),
                "reason": r.reason,
            }
        )
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def timeline_frame(points: list[TimelinePoint]) -> pd.DataFrame:
    return pd.DataFrame(
        [(p.time, p.busy_gpus, p.queued, p.running, p.gpus) for p in points],
        columns=["time", "busy_gpus", "queued", "running", "gpus"],
    )


def summarize(jobs: pd.DataFrame, timeline: pd.DataFrame) -> dict[str, Any]:
    done = jobs[jobs["state"] == "completed"]
    jct = done["jct"].to_numpy(dtype=float)
    start = float(jobs["arrival"].min()) if len(jobs) else 0.0
    end = float(done["end"].max()) if len(done) else start
    makespan = end - start
    # Busy GPU-seconds: the timeline is a step function, each point holding until the next.
    times = timeline["time"].to_numpy(dtype=float)
    busy = timeline["busy_gpus"].to_numpy(dtype=float)
    gpus = timeline["gpus"].to_numpy(dtype=float)
    busy_gpu_seconds = float(np.sum(busy[:-1] * np.diff(times))) if len(times) > 1 else 0.0
    # Against the GPUs actually present (nodes may come and go), over the same span.
    gpu_seconds = float(np.sum(gpus[:-1] * np.diff(times))) if len(times) > 1 else 0.0
    with_deadline = jobs[jobs["deadline"].notna()]

    def q(p: float) -> float | None:
        return float(np.percentile(jct, p)) if len(jct) else None

    # Jain's index over JCT slowdown-free shares is not defined without isolated times; report
    # Jain's fairness of JCT itself as a coarse spread measure.
    jain = float(jct.sum() ** 2 / (len(jct) * (jct**2).sum())) if len(jct) else None
    return {
        "jobs": len(jobs),
        "completed": len(done),
        "failed": int((jobs["state"] == "failed").sum()),
        "mean_jct": float(jct.mean()) if len(jct) else None,
        "p50_jct": q(50),
        "p95_jct": q(95),
        "p99_jct": q(99),
        "mean_queueing_delay": float(done["queueing_delay"].mean()) if len(done) else None,
        "makespan": makespan,
        "utilization": busy_gpu_seconds / gpu_seconds if gpu_seconds > 0 else 0.0,
        "preemptions": int(jobs["preemptions"].sum()),
        "deadline_jobs": len(with_deadline),
        "deadline_satisfaction": (
            float(with_deadline["deadline_met"].astype(bool).mean()) if len(with_deadline) else None
        ),
        "jct_jain_fairness": jain,
    }


def plot(jobs: pd.DataFrame, timeline: pd.DataFrame, out: Path) -> list[Path]:
    paths = []
    jct = np.sort(jobs.loc[jobs["state"] == "completed", "jct"].to_numpy(dtype=float))
    fig, ax = plt.subplots(figsize=(6, 4))
    if len(jct):
        ax.plot(jct / 3600, np.arange(1, len(jct) + 1) / len(jct))
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    paths.append(out / "jct_cdf.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    hours = timeline["time"].to_numpy(dtype=float) / 3600
    top.step(hours, timeline["busy_gpus"] / timeline["gpus"].clip(lower=1), where="post")
    top.set_ylabel("GPU utilisation")
    top.set_ylim(0, 1.05)
    bottom.step(hours, timeline["queued"], where="post", color="tab:orange")
    bottom.set_ylabel("queued jobs")
    bottom.set_xlabel("time (hours)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    paths.append(out / "timeline.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def write_results(
    records: list[JobRecord], points: list[TimelinePoint], out: Path,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Write every result file into `out` and return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = jobs_frame(records)
    timeline = timeline_frame(points)
    jobs.to_csv(out / "jobs.csv", index=False)
    timeline.to_csv(out / "timeline.csv", index=False)
    summary = {**(extra or {}), **summarize(jobs, timeline)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(jobs, timeline, out)
    return summary


def plot_workload(jobs: pd.DataFrame, out: Path, stem: str) -> list[Path]:
    """Arrivals over time, the duration CDF and the GPU-demand histogram of a workload."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    arrivals = np.sort(jobs["submit_time"].to_numpy(dtype=float)) / 3600
    axes[0].plot(arrivals, np.arange(1, len(arrivals) + 1))
    axes[0].set_xlabel("time (hours)")
    axes[0].set_ylabel("jobs arrived")
    axes[0].set_title("arrivals")
    durations = np.sort(jobs["duration"].dropna().to_numpy(dtype=float))
    if len(durations):
        axes[1].plot(durations / 3600, np.arange(1, len(durations) + 1) / len(durations))
        axes[1].set_xscale("log")
    axes[1].set_xlabel("duration (hours)")
    axes[1].set_ylabel("fraction of jobs")
    axes[1].set_title("duration CDF" if len(durations) else "duration CDF (no durations)")
    counts = jobs["num_gpus"].value_counts().sort_index()
    axes[2].bar([str(k) for k in counts.index], counts.to_numpy())
    axes[2].set_xlabel("GPUs requested")
    axes[2].set_ylabel("jobs")
    axes[2].set_title("GPU demand")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = out / f"{stem}_workload.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]

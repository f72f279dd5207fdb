"""Results of a run as files a researcher loads with pandas in one line: the per-job table
(`jobs.csv`), the cluster timeline (`timeline.csv`), `summary.json`, and PNG plots.

Deadlines (ElasticFlow's metrics): every job of the workload has a row, those admission declined
too (`admission`: accepted, declined or best-effort; a declined job never meets its deadline).
The deadline-satisfactory ratio is the jobs that finished by their deadline over all jobs with a
deadline that are not best-effort. Cluster efficiency, when the runs of the jobs are given
(`efficiency.csv`), is ElasticFlow's: the sum over running jobs of throughput(n GPUs) /
throughput(1 GPU), over the cluster's GPUs, at every instant it changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd

from gpuyard.shared.contract import JobRecord, TimelinePoint
from gpuyard.shared.model import GpuRef, JobSpec
from gpuyard.shared.throughput import ThroughputModel

matplotlib.use("Agg")
import matplotlib.pyplot as plt

JOB_COLUMNS = [
    "job_id", "state", "num_gpus", "gpu_type", "priority", "user", "arrival", "start", "end",
    "jct", "queueing_delay", "preemptions", "gpu_seconds", "executed_time", "deadline",
    "deadline_met", "admission", "reason",
]  # fmt: skip


def jobs_frame(
    records: list[JobRecord], workload: list[JobSpec] | None = None,
    declined: dict[str, str] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """One row per job: the admitted ones from their records, and, given the `workload`, the jobs
    admission declined (with the reasons in `declined`, where known)."""
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
                "admission": "best-effort" if r.spec.best_effort else "accepted",
                "reason": r.reason,
            }
        )
    seen = {r.job_id for r in records}
    for spec in workload or []:
        if spec.job_id in seen:
            continue
        rows.append(
            {
                "job_id": spec.job_id, "state": "declined", "num_gpus": spec.num_gpus,
                "gpu_type": spec.gpu_type, "priority": spec.priority, "user": spec.user,
                "arrival": spec.submit_time, "start": None, "end": None, "jct": None,
                "queueing_delay": None, "preemptions": 0, "gpu_seconds": 0.0,
                "executed_time": 0.0, "deadline": spec.deadline,
                "deadline_met": None if spec.deadline is None else False,
                "admission": "declined",
                "reason": (declined or {}).get(spec.job_id or "", "declined by admission"),
            }
        )  # fmt: skip
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


JobRun = tuple[float, str, list[GpuRef]]
"""(time, job, the GPUs it runs on from then on: empty when it stops)."""


def efficiency_frame(
    runs: list[JobRun], job_types: dict[str, str], model: ThroughputModel,
    node_types: dict[str, str], total_gpus: int,
) -> pd.DataFrame:  # fmt: skip
    """ElasticFlow's cluster efficiency at every instant it changes: the sum over running jobs of
    throughput(n) / throughput(1) on their GPU type, over the cluster's GPUs."""
    current: dict[str, float] = {}
    rows: list[tuple[float, float]] = []
    for time, job_id, gpus in sorted(runs, key=lambda r: r[0]):
        if gpus:
            gpu_type = node_types.get(gpus[0].node_id, model.reference_gpu_type)
            job_type = job_types.get(job_id, "default")
            one = model.throughput(job_type, gpu_type, 1)
            current[job_id] = model.throughput(job_type, gpu_type, len(gpus)) / one if one > 0 else 0.0
        else:
            current.pop(job_id, None)
        value = sum(current.values()) / total_gpus if total_gpus else 0.0
        if rows and rows[-1][0] == time:
            rows[-1] = (time, value)
        else:
            rows.append((time, value))
    return pd.DataFrame(rows, columns=["time", "efficiency"])


def _time_mean(frame: pd.DataFrame, column: str, until: float) -> float | None:
    """Time-weighted mean of a step function from its first point to `until`."""
    if frame.empty:
        return None
    times = np.append(frame["time"].to_numpy(dtype=float), max(until, float(frame["time"].iloc[-1])))
    span = times[-1] - times[0]
    if span <= 0:
        return None
    return float(np.sum(frame[column].to_numpy(dtype=float) * np.diff(times)) / span)


def timeline_frame(points: list[TimelinePoint]) -> pd.DataFrame:
    return pd.DataFrame(
        [(p.time, p.busy_gpus, p.queued, p.running, p.gpus) for p in points],
        columns=["time", "busy_gpus", "queued", "running", "gpus"],
    )


def summarize(
    jobs: pd.DataFrame, timeline: pd.DataFrame, efficiency: pd.DataFrame | None = None
) -> dict[str, Any]:
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
    counted = with_deadline[with_deadline["admission"] != "best-effort"]
    met = int(counted["deadline_met"].astype(bool).sum())

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
        "deadline_satisfactory_ratio": met / len(counted) if len(counted) else None,
        "deadline_met": met,
        "accepted": int((jobs["admission"] == "accepted").sum()),
        "declined": int((jobs["admission"] == "declined").sum()),
        "best_effort": int((jobs["admission"] == "best-effort").sum()),
        "mean_cluster_efficiency": (
            _time_mean(efficiency, "efficiency", end) if efficiency is not None else None
        ),
        "jct_jain_fairness": jain,
    }


def plot(
    jobs: pd.DataFrame, timeline: pd.DataFrame, out: Path,
    efficiency: pd.DataFrame | None = None, title: str = "",
) -> list[Path]:  # fmt: skip
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
    if jobs["deadline"].notna().any():
        paths.append(plot_deadlines(jobs, efficiency, out / "deadlines.png", title))
    return paths


def plot_deadlines(
    jobs: pd.DataFrame, efficiency: pd.DataFrame | None, path: Path, title: str = ""
) -> Path:
    """Deadline outcomes (met, missed, declined, best-effort) and, if known, cluster efficiency
    over time."""
    panels = 2 if efficiency is not None and not efficiency.empty else 1
    fig, axes = plt.subplots(1, panels, figsize=(5 + 6 * (panels - 1), 4), squeeze=False)
    counted = jobs[jobs["admission"] != "best-effort"]
    admitted = counted[counted["admission"] == "accepted"]
    met = admitted["deadline_met"].astype(bool)
    outcomes = {
        "met": int(met.sum()),
        "missed": int((~met).sum()),
        "declined": int((counted["admission"] == "declined").sum()),
        "best-effort": int((jobs["admission"] == "best-effort").sum()),
    }
    ax = axes[0][0]
    bars = ax.bar(list(outcomes), list(outcomes.values()),
                  color=["tab:green", "tab:red", "tab:gray", "tab:blue"])  # fmt: skip
    ax.bar_label(bars)
    ax.set_ylim(0, max(outcomes.values(), default=0) * 1.15 + 1)
    ratio = outcomes["met"] / len(counted) if len(counted) else float("nan")
    ax.set_title(f"deadlines: {ratio:.1%} of {len(counted)} jobs met")
    ax.set_ylabel("jobs")
    if panels == 2:
        assert efficiency is not None
        ax = axes[0][1]
        ax.step(efficiency["time"] / 3600, efficiency["efficiency"], where="post")
        ax.set_xlabel("time (hours)")
        ax.set_ylabel("cluster efficiency")
        ax.set_ylim(0, 1.05)
        ax.set_title("sum of throughput(n) / throughput(1) over GPUs")
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_results(
    records: list[JobRecord], points: list[TimelinePoint], out: Path,
    extra: dict[str, Any] | None = None, *, workload: list[JobSpec] | None = None,
    declined: dict[str, str] | None = None, efficiency: pd.DataFrame | None = None,
    title: str = "",
) -> dict[str, Any]:  # fmt: skip
    """Write every result file into `out` and return the summary. With the `workload`, the jobs
    admission declined get rows too; with `efficiency` (`efficiency_frame`), `efficiency.csv`."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = jobs_frame(records, workload, declined)
    timeline = timeline_frame(points)
    jobs.to_csv(out / "jobs.csv", index=False)
    timeline.to_csv(out / "timeline.csv", index=False)
    if efficiency is not None:
        efficiency.to_csv(out / "efficiency.csv", index=False)
    summary = {**(extra or {}), **summarize(jobs, timeline, efficiency)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(jobs, timeline, out, efficiency, title)
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

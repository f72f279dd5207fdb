"""Results of a run as files a researcher loads with pandas in one line: the per-job table
(`jobs.csv`), the cluster timeline (`timeline.csv`), `summary.json`, and PNG plots."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd

from gpuyard.shared.contract import JobRecord, TimelinePoint

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_PYPLOT = threading.Lock()
"""pyplot is not thread-safe: simulations in one process write their results one at a time."""

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


def summarize(
    jobs: pd.DataFrame, timeline: pd.DataFrame, until: float | None = None
) -> dict[str, Any]:
    """Figures of a run. Utilisation counts up to `until` (an interrupted run: where it got to),
    by default up to the last job's end (instants after it, such as a policy's late wake-up,
    are idle time that is not the workload's)."""
    done = jobs[jobs["state"] == "completed"]
    jct = done["jct"].to_numpy(dtype=float)
    start = float(jobs["arrival"].min()) if len(jobs) else 0.0
    end = float(done["end"].max()) if len(done) else start
    makespan = end - start
    if until is None and jobs["end"].notna().any():
        until = float(jobs["end"].max())
    # Busy GPU-seconds: the timeline is a step function, each point holding until the next.
    times = timeline["time"].to_numpy(dtype=float)
    if until is not None:
        times = np.minimum(times, until)
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


def save_figure(fig: Any, path: Path, caption: str, *, title: str = "", dpi: int = 120) -> Path:
    """Save a plot that says what ran: `caption` in small print under the axes (the layout leaves
    room for it) and in the PNG's `Description` text, `title` above; then close it."""
    if title:
        fig.suptitle(title, fontsize=11)
    height = 0.0
    if caption:
        lines = caption.count("\n") + 1
        height = (lines * 9 + 6) / (fig.get_figheight() * 72)  # 9 pt per line of 7 pt text
        fig.text(0.01, 0.01, caption, fontsize=7, ha="left", va="bottom", color="0.25")
    fig.tight_layout(rect=(0, height, 1, 1))
    fig.savefig(path, dpi=dpi, metadata={"Title": title, "Description": caption})
    plt.close(fig)
    return path


def plot(
    jobs: pd.DataFrame, timeline: pd.DataFrame, out: Path, caption: str = "",
    total: int | None = None,
) -> list[Path]:  # fmt: skip
    """`jct_cdf.png` and `timeline.png`, each captioned with `caption` (what ran); `total`: the
    workload's jobs, when `jobs` holds only some (an interrupted run)."""
    paths = []
    done = jobs["state"] == "completed"
    jct = np.sort(jobs.loc[done, "jct"].to_numpy(dtype=float))
    fig, ax = plt.subplots(figsize=(7, 4.8))
    if len(jct):
        ax.plot(jct / 3600, np.arange(1, len(jct) + 1) / len(jct))
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no job completed", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of completed jobs")
    ax.set_title(f"JCT CDF: {len(jct):,} of {total or len(jobs):,} jobs completed")
    ax.grid(True, alpha=0.3)
    paths.append(save_figure(fig, out / "jct_cdf.png", caption))

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.8), sharex=True)
    hours = timeline["time"].to_numpy(dtype=float) / 3600
    top.step(hours, timeline["busy_gpus"] / timeline["gpus"].clip(lower=1), where="post")
    top.set_ylabel("GPU utilisation")
    top.set_ylim(0, 1.05)
    top.set_title("cluster timeline")
    bottom.step(hours, timeline["queued"], where="post", color="tab:orange")
    bottom.set_ylabel("queued jobs")
    bottom.set_xlabel("simulated time (hours)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    paths.append(save_figure(fig, out / "timeline.png", caption))
    return paths


def write_results(
    records: list[JobRecord], points: list[TimelinePoint], out: Path,
    extra: dict[str, Any] | None = None, caption: str = "", until: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Write every result file into `out` and return the summary; `caption` says what ran on
    every plot; `until`: an interrupted run's last instant (see `summarize`)."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = jobs_frame(records)
    timeline = timeline_frame(points)
    jobs.to_csv(out / "jobs.csv", index=False)
    timeline.to_csv(out / "timeline.csv", index=False)
    summary = {**(extra or {}), **summarize(jobs, timeline, until)}
    compute = summary.get("compute_gpu_s")
    if compute is not None and len(timeline):
        # Gavel's utilisation: the GPUs' compute time over the whole run, from t = 0 to its end.
        total = float(timeline["gpus"].max()) * float(summary["simulated_s"])
        summary["utilization"] = compute / total if total > 0 else 0.0
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    with _PYPLOT:
        plot(jobs, timeline, out, caption, summary.get("jobs_in_workload"))
    return summary


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:,.2f} h"


def format_summary(summary: dict[str, Any]) -> str:
    """The summary for people: what ran, job counts, JCT in hours, utilisation in percent."""
    lines = []
    if summary.get("partial"):
        lines.append(
            f"PARTIAL RESULTS: interrupted at t = {_hours(summary.get('simulated_s'))}; only jobs "
            "that had ended by then are counted"
        )
    if "policy" in summary:
        params = " ".join(f"{k}={v}" for k, v in (summary.get("policy_params") or {}).items())
        lines.append(f"policy       {summary['policy']} {params}".rstrip())
        for other in ("admission", "placement"):
            if other in summary:
                params = " ".join(
                    f"{k}={v}" for k, v in (summary.get(f"{other}_params") or {}).items()
                )
                lines.append(f"{other:<12} {summary[other]} {params}".rstrip())
    for key in ("workload", "cluster"):
        if key in summary:
            lines.append(f"{key:<12} {summary[key]}")
    total = summary.get("jobs_in_workload", summary["jobs"])
    counts = f"{summary['completed']:,} completed, {summary['failed']:,} failed"
    lines.append(f"jobs         {counts} of {total:,}")
    lines.append(
        f"JCT          mean {_hours(summary['mean_jct'])}, p50 {_hours(summary['p50_jct'])}, "
        f"p95 {_hours(summary['p95_jct'])}, p99 {_hours(summary['p99_jct'])}"
    )
    lines.append(f"queueing     mean {_hours(summary['mean_queueing_delay'])} before first start")
    lines.append(f"makespan     {_hours(summary['makespan'])}")
    lines.append(f"utilisation  {100 * summary['utilization']:.1f}% of GPU time")
    lines.append(f"preemptions  {summary['preemptions']:,}")
    if summary.get("deadline_jobs"):
        lines.append(
            f"deadlines    {100 * summary['deadline_satisfaction']:.1f}% met "
            f"({summary['deadline_jobs']:,} jobs with one)"
        )
    if summary.get("jct_jain_fairness") is not None:
        lines.append(f"fairness     Jain's index of JCT {summary['jct_jain_fairness']:.3f}")
    if "simulated_s" in summary and "wall_s" in summary:
        lines.append(
            f"time         {_hours(summary['simulated_s'])} simulated in "
            f"{summary['wall_s']:,.1f} s wall"
        )
    return "\n".join(lines)


def plot_workload(
    jobs: pd.DataFrame, out: Path, stem: str, info: dict[str, Any] | None = None
) -> list[Path]:
    """Arrivals over time, the duration CDF and the GPU-demand histogram of a workload, titled
    with what it is (`info`: the trace and format, or the generator); every bar shows its count,
    on a log scale when the counts span more than two orders of magnitude."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6))
    arrivals = np.sort(jobs["submit_time"].to_numpy(dtype=float)) / 3600
    axes[0].plot(arrivals, np.arange(1, len(arrivals) + 1))
    axes[0].set_xlabel("submit time (hours)")
    axes[0].set_ylabel("jobs submitted so far")
    axes[0].set_title("arrivals")
    durations = np.sort(jobs["duration"].dropna().to_numpy(dtype=float))
    if len(durations):
        axes[1].plot(durations / 3600, np.arange(1, len(durations) + 1) / len(durations))
        axes[1].set_xscale("log")
        axes[1].set_title(f"duration CDF ({len(durations):,} jobs with a duration)")
    else:
        axes[1].set_title("duration CDF (no durations: the jobs give steps)")
    axes[1].set_xlabel("duration (hours, log scale)")
    axes[1].set_ylabel("fraction of jobs")
    counts = jobs["num_gpus"].value_counts().sort_index()
    bars = axes[2].bar([str(k) for k in counts.index], counts.to_numpy(), color="tab:blue")
    axes[2].bar_label(bars, labels=[f"{c:,}" for c in counts.to_numpy()], fontsize=8)
    if len(counts) and counts.max() > 100 * counts.min():
        axes[2].set_yscale("log")
        axes[2].set_ylabel("jobs (log scale)")
    else:
        axes[2].set_ylabel("jobs")
    axes[2].set_xlabel("GPUs requested")
    axes[2].set_title("GPU demand")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    title = f"workload {_workload_title(stem, len(jobs), info)}"
    return [save_figure(fig, out / f"{stem}_workload.png", "", title=title, dpi=110)]


def _workload_title(stem: str, n: int, info: dict[str, Any] | None) -> str:
    if info and "trace" in info:
        how = info["format"]
        if "philly_reading" in info:
            how += f", {info['philly_reading']} reading"
        return f"{Path(info['trace']).name} ({how}): {n:,} jobs"
    return f"{stem}: {n:,} jobs"

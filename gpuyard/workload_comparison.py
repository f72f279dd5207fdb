"""`gpuyard trace describe --against`: a workload beside a real trace or a cluster's published
statistics (AcmeTrace's `cluster_summary.csv`, as the calibrated generators hold them), as a
table of statistics and one figure."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuyard.report import save_figure, subplots, thinned_ranks, workload_title

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes

STATISTICS: dict[str, str] = {
    "jobs": "jobs",
    "jobs_per_day": "jobs per day",
    "gpus_mean": "GPUs per job, mean",
    "gpus_median": "GPUs per job, median",
    "gpus_max": "GPUs per job, max",
    "run_time_mean_s": "run time, mean",
    "run_time_median_s": "run time, median",
    "run_time_max_s": "run time, max",
    "completed_share": "completed share",
    "cancelled_share": "cancelled share",
    "failed_share": "failed share",
}
"""The statistics compared, by key, with their labels (the keys of `cluster_summary.csv`'s GPU
columns a workload can be measured on)."""
WITHIN = 0.10
"""A statistic this close to the real one (relative difference) is marked `within 10%`."""


def workload_gpus(jobs: pd.DataFrame) -> pd.Series:
    """GPUs per job: the drawn fraction of a GPU where the jobs carry one (`gpu_request`, PAI's
    generator: `num_gpus` rounds it up, which would double PAI's published median of 0.5)."""
    if "gpu_request" in jobs.columns and jobs["gpu_request"].notna().all():
        return jobs["gpu_request"].astype(float)
    return jobs["num_gpus"].astype(float)


def workload_statistics(jobs: pd.DataFrame) -> dict[str, float | None]:
    """The statistics of `STATISTICS` a workload has (None: it has none): jobs per day over its
    span (first to last submission, as the mean gap gives it), GPUs per job, run times of the
    jobs with a duration, and outcome shares when some job carries an outcome (None in the
    `outcome` column is a completed job)."""
    n = len(jobs)
    arrival = np.sort(jobs["submit_time"].to_numpy(dtype=float))
    span = float(arrival[-1] - arrival[0]) if n > 1 else 0.0
    gpus = workload_gpus(jobs)
    run = jobs["duration"].astype(float).dropna()
    stats: dict[str, float | None] = {
        "jobs": float(n),
        "jobs_per_day": (n - 1) * 86400.0 / span if span > 0 else None,
        "gpus_mean": float(gpus.mean()) if n else None,
        "gpus_median": float(gpus.median()) if n else None,
        "gpus_max": float(gpus.max()) if n else None,
        "run_time_mean_s": float(run.mean()) if len(run) else None,
        "run_time_median_s": float(run.median()) if len(run) else None,
        "run_time_max_s": float(run.max()) if len(run) else None,
    }
    outcome = jobs["outcome"] if "outcome" in jobs.columns else None
    if n and outcome is not None and outcome.notna().any():
        ends = outcome.fillna("completed")
        for end in ("completed", "cancelled", "failed"):
            stats[f"{end}_share"] = float((ends == end).sum()) / n
    return stats


def published_statistics(stats: Any) -> dict[str, float | None]:
    """A cluster's published statistics (a `calibrated.ClusterStatistics`) by `STATISTICS` key;
    its job count is left out (a generator draws as many jobs as asked)."""
    out: dict[str, float | None] = {
        "jobs_per_day": stats.jobs_per_day,
        "gpus_mean": stats.mean_gpus,
        "gpus_median": stats.median_gpus,
        "gpus_max": stats.max_gpus,
        "run_time_mean_s": stats.mean_run_s,
        "run_time_median_s": stats.median_run_s,
        "run_time_max_s": stats.max_run_s,
    }
    if stats.outcome_shares is not None:
        for end, share in zip(
            ("completed", "cancelled", "failed"), stats.outcome_shares, strict=True
        ):
            out[f"{end}_share"] = share
    return out


def compare_statistics(
    ours: dict[str, float | None], theirs: dict[str, float | None]
) -> dict[str, dict[str, Any]]:
    """Each statistic both sides have, in `STATISTICS` order: both values, their ratio (ours /
    theirs), the relative difference (ratio - 1) and whether it is within `WITHIN`."""
    rows: dict[str, dict[str, Any]] = {}
    for key in STATISTICS:
        mine, real = ours.get(key), theirs.get(key)
        if mine is None or real is None:
            continue
        ratio = mine / real if real else None
        rows[key] = {
            "workload": mine,
            "real": real,
            "ratio": ratio,
            "relative_difference": None if ratio is None else ratio - 1,
            "within_10pct": ratio is not None and abs(ratio - 1) <= WITHIN,
        }
    return rows


def _value(key: str, value: float) -> str:
    """A statistic's value as a reader takes it in: shares in %, run times in s, h or days."""
    if key.endswith("_share"):
        return f"{100 * value:.1f}%"
    if key.startswith("run_time"):
        if value < 3600:
            return f"{value:,.0f} s"
        return f"{value / 3600:,.1f} h" if value < 4 * 86400 else f"{value / 86400:,.1f} d"
    if key == "jobs":
        return f"{value:,.0f}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def comparison_lines(rows: dict[str, dict[str, Any]], ours: str, theirs: str) -> list[str]:
    """The comparison as an aligned table: each statistic, both values, the relative difference,
    and `within 10%` where it is."""
    width = max([len(STATISTICS[k]) for k in rows] + [len("statistic")])
    a, b = max(len(ours), 10), max(len(theirs), 10)
    lines = [f"{'statistic':<{width}}  {ours:>{a}}  {theirs:>{b}}  {'difference':>10}"]
    for key, row in rows.items():
        diff = row["relative_difference"]
        shown = "-" if diff is None else f"{100 * diff:+.1f}%"
        mark = "  within 10%" if row["within_10pct"] else ""
        lines.append(
            f"{STATISTICS[key]:<{width}}  {_value(key, row['workload']):>{a}}  "
            f"{_value(key, row['real']):>{b}}  {shown:>10}{mark}"
        )
    return lines


def _cdf(ax: Axes, values: np.ndarray, label: str, **kw: Any) -> None:
    """The empirical CDF of `values` as steps (thinned to `PLOTTED_POINTS`)."""
    ranked = np.sort(values)
    if not len(ranked):
        return
    keep = thinned_ranks(len(ranked))
    ax.step(ranked[keep], (keep + 1) / len(ranked), where="post", label=label, **kw)


def _gpu_axis(ax: Axes) -> None:
    """GPUs per job on a log2 axis labelled with plain numbers (1, 2, 4 ... not 2^k)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("GPUs per job (log scale)")
    ax.set_ylabel("fraction of jobs")


def _hourly_rate(jobs: pd.DataFrame, info: dict[str, Any] | None) -> tuple[np.ndarray, bool]:
    """Jobs submitted per hour in each hour of the day, over the hours the workload spans (first
    to last submission; NaN for an hour of the day it spans less than a quarter of), so that a
    workload of a few hours and one of weeks compare; and whether the clock is known: a cluster
    log's first submission (`first_submit`, local time) sets it, otherwise time 0 is taken as
    midnight, as gpuyard's generators draw it."""
    from datetime import datetime

    offset, known = 0.0, False
    first = (info or {}).get("first_submit")
    if isinstance(first, str):
        try:
            at = datetime.fromisoformat(first)
            offset, known = at.hour * 3600.0 + at.minute * 60.0 + at.second, True
        except ValueError:
            pass
    seconds = jobs["submit_time"].to_numpy(dtype=float) + offset
    if not len(seconds):
        return np.full(24, np.nan), known
    counts = np.bincount((seconds % 86400.0 // 3600.0).astype(int), minlength=24)[:24]
    begin, end = float(seconds.min()), float(seconds.max())
    days = np.arange(math.floor(begin / 86400.0), math.floor(end / 86400.0) + 1) * 86400.0
    starts = days[:, None] + np.arange(24)[None, :] * 3600.0  # each day's hours
    covered = np.clip(np.minimum(starts + 3600.0, end) - np.maximum(starts, begin), 0, None)
    hours = covered.sum(axis=0) / 3600.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(hours >= 0.25, counts / hours, np.nan), known


def span_note(name: str, jobs: pd.DataFrame) -> str:
    """How long `name`'s submissions span, with a warning under a day (its jobs per day then
    depend on which hours of the daily cycle it covers)."""
    arrival = jobs["submit_time"].to_numpy(dtype=float)
    span = float(arrival.max() - arrival.min()) if len(arrival) > 1 else 0.0
    text = f"{name}'s submissions span {span / 3600:,.1f} h"
    if span < 86400:
        text += " (under a day: its jobs per day depend on the hours of the day it covers)"
    return text


def plot_against_trace(
    jobs: pd.DataFrame, real: pd.DataFrame, out: Path, stem: str, real_stem: str,
    info: dict[str, Any] | None = None, real_info: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    """`<stem>_vs_<real_stem>.png`: the CDFs of GPUs per job and of durations of both workloads
    overlaid, and the share of each one's jobs submitted in each hour of the day; the job counts
    in the legends."""
    fig, axes = subplots(1, 3, figsize=(16, 4.8))
    sides = [(jobs, stem, info, "tab:blue", "-"), (real, real_stem, real_info, "tab:orange", "--")]
    names = [Path(i["trace"]).name if i and "trace" in i else s for _, s, i, _, _ in sides]
    known_clock = True
    for (frame, _, side_info, color, style), name in zip(sides, names, strict=True):
        n = len(frame)
        _cdf(axes[0], workload_gpus(frame).to_numpy(), f"{name} ({n:,} jobs)", color=color,
             linestyle=style)  # fmt: skip
        run = frame["duration"].astype(float).dropna().to_numpy()
        _cdf(axes[1], run / 3600, f"{name} ({len(run):,} jobs with a duration)", color=color,
             linestyle=style)  # fmt: skip
        rate, known = _hourly_rate(frame, side_info)
        known_clock &= known
        axes[2].step(np.arange(25), np.append(rate, rate[-1]), where="post",
                     color=color, linestyle=style, label=f"{name} ({n:,} jobs)")  # fmt: skip
    _gpu_axis(axes[0])
    axes[0].set_title("GPUs per job (CDF)")
    from matplotlib.ticker import NullFormatter

    axes[1].set_xscale("log")
    axes[1].xaxis.set_minor_formatter(NullFormatter())
    axes[1].set_xlabel("duration (hours, log scale)")
    axes[1].set_ylabel("fraction of jobs")
    axes[1].set_title("duration CDF")
    axes[2].set_xlim(0, 24)
    axes[2].set_xticks(range(0, 25, 3))
    clock = "hour of day" if known_clock else "hour of day (time 0 taken as midnight)"
    axes[2].set_xlabel(clock)
    axes[2].set_ylabel("jobs submitted per hour")
    axes[2].set_ylim(bottom=0)
    axes[2].set_title("arrivals per hour of day (over the hours each spans)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right" if ax is not axes[2] else "best")
    title = f"{workload_title(stem, len(jobs), info)}  vs  {workload_title(real_stem, len(real), real_info)}"
    path = out / f"{stem}_vs_{real_stem}.png"
    caption = f"{span_note(names[0], jobs)}; {span_note(names[1], real)}."
    return save_figure(fig, path, caption, title=title, dpi=110)


def plot_against_published(
    jobs: pd.DataFrame, stats: Any, name: str, out: Path, stem: str,
    info: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    """`<stem>_vs_<name>.png`: each statistic the workload shares with a cluster's published
    ones (`stats`, a `calibrated.ClusterStatistics`) as a pair of bars on a log scale, each
    labelled with its value (the workload's with its ratio to the published), and the
    workload's CDFs of GPUs per job and of durations with the published median and mean."""
    rows = compare_statistics(workload_statistics(jobs), published_statistics(stats))
    mine = Path(info["trace"]).name if info and "trace" in info else stem
    fig, axes = subplots(2, 2, figsize=(16, 9.5), gridspec_kw={"height_ratios": [1.15, 1]})
    grid = axes[0, 0].get_gridspec()
    for ax in axes[0]:
        ax.remove()
    bars_ax = fig.add_subplot(grid[0, :])
    x = np.arange(len(rows))
    width = 0.38
    published = f"{stats.csv_id} (published)"
    for offset, side, label, color in (
        (-width / 2, "workload", f"{mine} ({len(jobs):,} jobs)", "tab:blue"),
        (width / 2, "real", published, "tab:orange"),
    ):
        values = np.array([row[side] for row in rows.values()], dtype=float)
        bars = bars_ax.bar(x + offset, np.where(values > 0, values, np.nan), width,
                           label=label, color=color)  # fmt: skip
        texts = []
        for key, row in rows.items():
            text = _value(key, row[side])
            if side == "workload" and row["ratio"] is not None:
                text += f"\n\u00d7{row['ratio']:.2f}"
            texts.append(text)
        bars_ax.bar_label(bars, labels=texts, fontsize=7, padding=2)
    bars_ax.set_yscale("log")
    low, high = bars_ax.get_ylim()
    bars_ax.set_ylim(low, high * 8)  # room above the tallest bar for its two-line label
    ticks = [STATISTICS[k].replace(", ", "\n").replace(" share", "\nshare") for k in rows]
    bars_ax.set_xticks(x, ticks, fontsize=8)
    bars_ax.set_ylabel("value (log scale; units as labelled)")
    bars_ax.set_title(
        f"workload vs {stats.csv_id}'s published statistics (\u00d7: workload / published)"
    )
    bars_ax.legend(fontsize=8, loc="upper left")
    bars_ax.grid(True, axis="y", alpha=0.3)
    gpus_ax, run_ax = axes[1]
    _cdf(gpus_ax, workload_gpus(jobs).to_numpy(), f"{mine} ({len(jobs):,} jobs)")
    _gpu_axis(gpus_ax)
    gpus_ax.set_title("GPUs per job (CDF)")
    run = jobs["duration"].astype(float).dropna().to_numpy()
    _cdf(run_ax, run / 3600, f"{mine} ({len(run):,} jobs with a duration)")
    from matplotlib.ticker import NullFormatter

    run_ax.set_xscale("log")
    run_ax.xaxis.set_minor_formatter(NullFormatter())
    run_ax.set_xlabel("run time (hours, log scale)")
    run_ax.set_ylabel("fraction of jobs")
    run_ax.set_title("run time CDF")
    for ax, median, mean, unit in (
        (gpus_ax, stats.median_gpus, stats.mean_gpus, 1.0),
        (run_ax, stats.median_run_s, stats.mean_run_s, 3600.0),
    ):
        shown = "run_time_median_s" if ax is run_ax else "gpus_median"
        ax.axvline(median / unit, color="tab:orange", linestyle="--",
                   label=f"{stats.csv_id} median {_value(shown, median)}")  # fmt: skip
        ax.axvline(mean / unit, color="tab:red", linestyle=":",
                   label=f"{stats.csv_id} mean {_value(shown, mean)}")  # fmt: skip
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    caption = (
        f"Published: row {stats.csv_id} of AcmeTrace's data/cluster_summary.csv (GPU jobs: "
        f"{stats.gpu_jobs:,}); its jobs per day are those over {stats.span_days:g} days "
        f"({stats.span_source}). The workload's jobs per day are over its span, first to last "
        f"submission ({span_note(mine, jobs)}); its outcome shares count a job without an "
        "outcome as completed."
    )
    if "gpu_request" in jobs.columns and jobs["gpu_request"].notna().all():
        caption += " GPUs per job: the jobs' gpu_request (fractions of a GPU), not num_gpus."
    title = f"{workload_title(stem, len(jobs), info)}  vs  {stats.csv_id} (published statistics)"
    return save_figure(fig, out / f"{stem}_vs_{name}.png", caption, title=title, dpi=110)


def against_published(
    jobs: pd.DataFrame, trace: Path, name: str, stats: Any, out: Path,
    info: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str], Path]:  # fmt: skip
    """`trace describe --against NAME`: the comparison with cluster NAME's published `stats`
    (for the JSON), its table, and the figure (`plot_against_published`)."""
    rows = compare_statistics(workload_statistics(jobs), published_statistics(stats))
    path = plot_against_published(jobs, stats, name, out, trace.stem, info)
    table = [f"{trace.name} against {stats.csv_id} (published, cluster_summary.csv):"]
    table += comparison_lines(rows, trace.name, f"{stats.csv_id} (published)")
    table.append(span_note(trace.name, jobs))
    head = {"published": stats.csv_id, "gpu_jobs": stats.gpu_jobs}
    return head | {"statistics": rows, "figure": str(path)}, table, path


def against_trace(
    jobs: pd.DataFrame, trace: Path, real: pd.DataFrame, real_trace: Path, out: Path,
    info: dict[str, Any] | None = None, real_info: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str], Path]:  # fmt: skip
    """`trace describe --against OTHER`: the comparison with the jobs of trace OTHER (for the
    JSON), its table, and the figure (`plot_against_trace`)."""
    rows = compare_statistics(workload_statistics(jobs), workload_statistics(real))
    path = plot_against_trace(jobs, real, out, trace.stem, real_trace.stem, info, real_info)
    table = [f"{trace.name} against {real_trace.name}:"]
    table += comparison_lines(rows, trace.name, real_trace.name)
    table += [span_note(trace.name, jobs), span_note(real_trace.name, real)]
    fmt = (real_info or {}).get("format")
    head = {"trace": str(real_trace), "format": fmt, "jobs": len(real)}
    return head | {"statistics": rows, "figure": str(path)}, table, path

"""Results of a run as files a researcher loads with pandas in one line: the per-job table
(`jobs.csv`), the cluster timeline (`timeline.csv`), `summary.json`, and PNG plots.

Deadlines (ElasticFlow's metrics): every job of the workload has a row, those admission declined
too (`admission`: accepted, declined or best-effort; a declined job never meets its deadline).
The deadline-satisfactory ratio is the jobs that finished by their deadline over all jobs with a
deadline that are not best-effort. Cluster efficiency, when the runs of the jobs are given
(`efficiency.csv`), is ElasticFlow's: the sum over running jobs of throughput(n GPUs) /
throughput(1 GPU), over the cluster's GPUs, at every instant it changes."""

from __future__ import annotations

import functools
import json
import sys
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuyard.results import JobRows, Table, TimelineRows
from gpuyard.services.simclock.config import QueueMap
from gpuyard.shared.model import NEVER_FITS
from gpuyard.shared.throughput import ThroughputModel
from gpuyard.sharing import (
    AllocationSeries,
    JobRun,
    allocation_series,
    allocation_summary,
    draw_allocation,
)

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from gpuyard.plotter import Plotter


_DRAWING = threading.Lock()
"""matplotlib is not thread-safe (its text parser is shared): simulations in one process draw
their plots one at a time."""


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float],
             **kw: Any) -> tuple[Figure, Any]:  # fmt: skip
    """A figure and its axes, as `pyplot.subplots` makes them, without pyplot: a figure of its
    own (drawn by Agg when saved, safe in any thread, no global state to close it from), and
    pyplot's import (a third of a small run's plotting) never made."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def efficiency_frame(
    runs: list[JobRun], job_types: dict[str, str], model: ThroughputModel,
    node_types: dict[str, str], total_gpus: int,
) -> Table:  # fmt: skip
    """ElasticFlow's cluster efficiency at every instant it changes: the sum over running jobs of
    throughput(n) / throughput(1) on their GPU type, over the cluster's GPUs."""
    current: dict[str, float] = {}
    rows: list[tuple[float, float]] = []
    for time, job_id, gpus in sorted(runs, key=lambda r: r[0]):
        if gpus:
            gpu_type = node_types.get(gpus[0].node_id, model.reference_gpu_type)
            job_type = job_types.get(job_id, "default")
            one = model.throughput(job_type, gpu_type, 1)
            current[job_id] = (
                model.throughput(job_type, gpu_type, len(gpus)) / one if one > 0 else 0.0
            )
        else:
            current.pop(job_id, None)
        value = sum(current.values()) / total_gpus if total_gpus else 0.0
        if rows and rows[-1][0] == time:
            rows[-1] = (time, value)
        else:
            rows.append((time, value))
    times, values = zip(*rows, strict=True) if rows else ((), ())
    return Table({"time": np.array(times, dtype=np.float64),
                  "efficiency": np.array(values, dtype=np.float64)})  # fmt: skip


def _time_mean(frame: Table, column: str, until: float) -> float | None:
    """Time-weighted mean of a step function from its first point to `until`."""
    if not len(frame):
        return None
    times = np.append(frame["time"], max(until, float(frame["time"][-1])))
    span = times[-1] - times[0]
    if span <= 0:
        return None
    return float(np.sum(frame[column].astype(float) * np.diff(times)) / span)


def _mean(values: np.ndarray) -> float:
    """The mean of the values there are (NaN: none), summed as pandas sums them (NaN as 0.0),
    so that figures stay those pandas gave, to the last bit."""
    missing = np.isnan(values)
    if missing.any():
        values = np.where(missing, 0.0, values)
    return float(values.sum() / float(len(values) - int(missing.sum())))


def _min(values: np.ndarray) -> float:
    """The least of the values there are (NaN: none), as pandas' `min`."""
    present = values[~np.isnan(values)]
    return float(present.min()) if len(present) else np.nan


def _max(values: np.ndarray) -> float:
    present = values[~np.isnan(values)]
    return float(present.max()) if len(present) else np.nan


def summarize(
    jobs: Table, timeline: Table, until: float | None = None,
    efficiency: Table | None = None, measured: set[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Figures of a run. Utilisation counts up to `until` (an interrupted run: where it got to),
    by default up to the last job's end (instants after it, such as a policy's late wake-up,
    are idle time that is not the workload's). With `measured` (Gavel's measurement window),
    the JCT and queueing figures are over those jobs only (`measured_jobs` of them)."""
    done = jobs.where(jobs["state"] == "completed")
    timed = done
    if measured is not None:
        timed = done.where(np.fromiter((j in measured for j in done["job_id"]), bool, len(done)))
    jct = timed["jct"]
    start = _min(jobs["arrival"]) if len(jobs) else 0.0
    end = _max(done["end"]) if len(done) else start
    makespan = end - start
    if until is None and (~np.isnan(jobs["end"])).any():
        until = _max(jobs["end"])
    # Busy GPU-seconds: the timeline is a step function, each point holding until the next.
    times = timeline["time"]
    if until is not None:
        times = np.minimum(times, until)
    busy = timeline["busy_gpus"].astype(float)
    gpus = timeline["gpus"].astype(float)
    busy_gpu_seconds = float(np.sum(busy[:-1] * np.diff(times))) if len(times) > 1 else 0.0
    # Against the GPUs actually present (nodes may come and go), over the same span.
    gpu_seconds = float(np.sum(gpus[:-1] * np.diff(times))) if len(times) > 1 else 0.0
    with_deadline = jobs.where(~np.isnan(jobs["deadline"]))
    counted = with_deadline.where(with_deadline["admission"] != "best-effort")
    met = int(np.count_nonzero(counted["deadline_met"] == True))  # noqa: E712 (None is not)

    def q(p: float) -> float | None:
        return float(np.percentile(jct, p)) if len(jct) else None

    # Jain's index over JCT slowdown-free shares is not defined without isolated times; report
    # Jain's fairness of JCT itself as a coarse spread measure.
    jain = float(jct.sum() ** 2 / (len(jct) * (jct**2).sum())) if len(jct) else None
    return {
        "jobs": len(jobs),
        "completed": len(done),
        "failed": int(np.count_nonzero(jobs["state"] == "failed")),
        "cancelled": int(np.count_nonzero(jobs["state"] == "cancelled")),
        "timeout": int(np.count_nonzero(jobs["state"] == "timeout")),
        "mean_jct": float(jct.mean()) if len(jct) else None,
        "p50_jct": q(50),
        "p95_jct": q(95),
        "p99_jct": q(99),
        "mean_queueing_delay": _mean(timed["queueing_delay"]) if len(timed) else None,
        "makespan": makespan,
        "utilization": busy_gpu_seconds / gpu_seconds if gpu_seconds > 0 else 0.0,
        "preemptions": int(jobs["preemptions"].sum()),
        "deadline_jobs": len(with_deadline),
        "deadline_satisfaction": (
            float(np.count_nonzero(with_deadline["deadline_met"] == True)) / len(with_deadline)  # noqa: E712
            if len(with_deadline)
            else None
        ),
        "deadline_satisfactory_ratio": met / len(counted) if len(counted) else None,
        "deadline_met": met,
        "accepted": int(np.count_nonzero(jobs["admission"] == "accepted")),
        "declined": int(np.count_nonzero(jobs["admission"] == "declined")),
        "never_fits": sum(  # (jobs no node of the cluster can hold: admission says why)
            str(reason).startswith(NEVER_FITS)
            for reason in jobs["reason"][jobs["admission"] == "declined"]
        ),
        "best_effort": int(np.count_nonzero(jobs["admission"] == "best-effort")),
        "mean_cluster_efficiency": (
            _time_mean(efficiency, "efficiency", end) if efficiency is not None else None
        ),
        "jct_jain_fairness": jain,
        **({"measured_jobs": len(timed)} if measured is not None else {}),
        **by_user(jobs),
    }


def by_user(jobs: Table) -> dict[str, Any]:
    """With jobs of two users or more: each user's figures (`users`: see `by_group`) and how
    evenly the users fared (`users_jain_slowdown`: Jain's index of the users' mean slowdown, 1
    when every user's jobs waited alike in proportion to their length, whatever each asked for)."""
    users, jain = by_group(jobs, "user")
    if len(users) < 2:
        return {}
    return {"users": users, "users_jain_slowdown": jain}


def by_group(
    jobs: Table, column: str, names: list[str] | None = None
) -> tuple[dict[str, dict[str, Any]], float | None]:
    """The jobs grouped by `column` (a user, a queue): each group's jobs, completed, mean JCT and
    queueing delay of the completed, GPU-hours and their share of all the groups'; and Jain's
    index of the groups' mean slowdown (None: no job completed). The groups are `names`, in
    that order, each whether or not it has jobs (a job of none is left out), or else those the
    jobs name, sorted (a blank name is none). Grouped once (a million jobs of a thousand
    groups: one pass)."""
    values = np.asarray(jobs[column], dtype=object)
    if names is None:
        named = np.fromiter((bool(v) for v in values), bool, len(values))
        keys, index = np.unique(values[named].astype(str), return_inverse=True)
    else:
        keys = np.asarray(names, dtype=object)
        index, named = group_index(values, names)
    n = len(keys)
    mine = jobs.where(named)
    done = mine["state"] == "completed"

    def per_group(values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        m = np.ones(len(index), bool) if mask is None else mask
        return np.bincount(index[m], weights=np.asarray(values, float)[m], minlength=n)

    counts, completed = np.bincount(index, minlength=n), per_group(np.ones(len(index)), done)
    gpu_s = per_group(np.nan_to_num(mine["gpu_seconds"]))
    total_gpu_s = float(gpu_s.sum())

    def mean(column: str) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return per_group(mine[column], done) / completed

    jct, wait, slowdown = mean("jct"), mean("queueing_delay"), mean("slowdown")
    groups = {
        str(name): {
            "jobs": int(counts[i]), "completed": int(completed[i]),
            "mean_jct": float(jct[i]) if completed[i] else None,
            "mean_queueing_delay": float(wait[i]) if completed[i] else None,
            "gpu_hours": float(gpu_s[i]) / 3600,
            "gpu_share": float(gpu_s[i]) / total_gpu_s if total_gpu_s > 0 else None,
        }
        for i, name in enumerate(keys)
    }  # fmt: skip
    fared = slowdown[completed > 0]
    jain = float(fared.sum() ** 2 / (len(fared) * (fared**2).sum())) if len(fared) else None
    return groups, jain


def group_index(values: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each of `values` as its index in `names`, for those there (and which those are)."""
    keys = np.asarray(names, dtype=str)
    order = np.argsort(keys, kind="stable")
    ranked = keys[order]
    text = np.asarray(values, dtype=object).astype(str)
    at = np.minimum(np.searchsorted(ranked, text), max(len(ranked) - 1, 0))
    found = ranked[at] == text if len(ranked) else np.zeros(len(text), bool)
    return order[at[found]], found


@dataclass(frozen=True)
class QueueLayout:
    """A run's queues as its results show them (the `kueue` policy's queues file)."""

    queues: QueueMap
    """Their names (in the file's order) and whose jobs go to which."""
    cohorts: list[str]
    """Each queue's cohort ("": none)."""
    quotas: list[int]
    """Each queue's nominal quota: GPUs, summed over their types."""
    file: str = ""
    """The queues file's name ("": not known)."""

    def queue_column(self, users: np.ndarray) -> np.ndarray:
        """Each job's queue by its user ("": none), looked up once per user."""
        names, index = np.unique(np.asarray(users, dtype=object).astype(str), return_inverse=True)
        of = np.array([sys.intern(self.queues.queue_of(u)) for u in names.tolist()], dtype=object)
        return of[index] if len(names) else np.empty(0, dtype=object)


def with_queues(jobs: Table, layout: QueueLayout) -> Table:
    """`jobs` with each job's queue (`queue`, after `user`)."""
    columns: dict[str, np.ndarray] = {}
    for name, column in jobs.columns.items():
        columns[name] = column
        if name == "user":
            columns["queue"] = layout.queue_column(column)
    return Table(columns)


def queue_gpu_seconds(
    rows: Table, layout: QueueLayout, start: float, end: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each queue's GPU-seconds held from `start` to `end`, and those held above its quota
    (borrowed), from its rows of `queues.csv` (each a step: none held before its first)."""
    n = len(layout.quotas)
    queue, known = group_index(rows["queue"], layout.queues.names)
    if not len(queue):
        return np.zeros(n), np.zeros(n)
    time, gpus = rows["time"][known], rows["gpus"][known].astype(float)
    order = np.lexsort((time, queue))  # each queue's rows in time order
    queue, time, gpus = queue[order], time[order], gpus[order]
    last = np.r_[queue[1:] != queue[:-1], True]  # each queue's last row holds until the end
    until = np.where(last, end, np.r_[time[1:], end])
    spans = np.clip(until, start, end) - np.clip(time, start, end)
    above = np.maximum(gpus - np.asarray(layout.quotas, float)[queue], 0.0)
    return (np.bincount(queue, weights=gpus * spans, minlength=n),
            np.bincount(queue, weights=above * spans, minlength=n))  # fmt: skip


def by_queue(
    jobs: Table, timeline: Table, rows: Table, layout: QueueLayout, until: float | None
) -> dict[str, Any]:
    """Each queue's figures (`queues`: `by_group`'s, its cohort and quota, `borrowed_gpu_hours`
    held above its quota, `mean_usage` the GPUs it held on average), over the span utilisation
    counts (see `summarize`), and `queues_jain_slowdown`: Jain's index of the queues' mean
    slowdown."""
    groups, jain = by_group(jobs, "queue", layout.queues.names)
    start, end = _span(jobs, timeline, until)
    held, borrowed = queue_gpu_seconds(rows, layout, start, end)
    for i, figures in enumerate(groups.values()):
        figures |= {
            "cohort": layout.cohorts[i],
            "quota": layout.quotas[i],
            "borrowed_gpu_hours": float(borrowed[i]) / 3600,
            "mean_usage": float(held[i]) / (end - start) if end > start else None,
        }
    return {"queues": groups, "queues_jain_slowdown": jain}


def _span(jobs: Table, timeline: Table, until: float | None) -> tuple[float, float]:
    """The span of the timeline utilisation counts (`summarize`): from its first instant to
    `until` (by default the last job's end), or to its last instant if sooner."""
    times = timeline["time"]
    if not len(times):
        return 0.0, 0.0
    if until is None and (~np.isnan(jobs["end"])).any():
        until = _max(jobs["end"])
    last = float(times[-1]) if until is None else min(float(times[-1]), until)
    return float(times[0]), max(last, float(times[0]))


THRASHING = 0.5
"""A run thrashes when its preemptions' cost could take more than this share of the time its
jobs ran: it preempts more than it progresses."""


def preemption_overhead(jobs: Table, cost_s: float | None) -> dict[str, Any]:
    """`preemption_overhead`: the share of the time jobs ran that their preemptions could cost
    (each preemption at most `cost_s`, a checkpoint's lost progress plus a restore), and
    `thrashing` when that is over `THRASHING`. None and False with no preemption cost."""
    ran = float(np.where(np.isnan(jobs["executed_time"]), 0.0, jobs["executed_time"]).sum())
    if not cost_s or not len(jobs):
        return {"preemption_overhead": None, "thrashing": False}
    cost = float(jobs["preemptions"].sum()) * cost_s
    overhead = min(cost / ran, 1.0) if ran > 0 else (1.0 if cost else 0.0)
    return {"preemption_overhead": overhead, "thrashing": overhead > THRASHING}


def thrashing_line(summary: dict[str, Any]) -> str:
    """One line for people about a run that thrashes ('' if it does not)."""
    if not summary.get("thrashing"):
        return ""
    per_job = summary["preemptions"] / max(summary["completed"], 1)
    return (
        f"thrashing: {summary['preemptions']:,} preemptions ({per_job:,.0f} per completed job) "
        f"could cost {100 * summary['preemption_overhead']:.0f}% of the time jobs ran "
        f"({summary['preemption_cost_s']:g} s each to checkpoint and restore); a minimum run "
        "time between preemptions bounds it (gpuyard sim --min-run-s S)"
    )


def save_figure(
    fig: Any, path: Path, caption: str, *, title: str = "", dpi: int = 120, svg: bool = False
) -> Path:
    """Save a plot that says what ran: `caption` in small print under the axes (the layout leaves
    room for it) and in the PNG's `Description` text, `title` above (`svg`: an SVG beside the
    PNG too); then close it."""
    if title:
        fig.suptitle(title, fontsize=11)
    height = 0.0
    drawn = caption
    if caption:  # wrapped to the figure's width (7 pt text: about 4.3 pt a character)
        width = max(int(fig.get_figwidth() * 72 / 4.3), 40)
        drawn = "\n".join(
            textwrap.fill(line, width, subsequent_indent="  ") for line in caption.split("\n")
        )
        lines = drawn.count("\n") + 1
        height = (lines * 9 + 6) / (fig.get_figheight() * 72)  # 9 pt per line of 7 pt text
        fig.text(0.01, 0.01, drawn, fontsize=7, ha="left", va="bottom", color="0.25")
    fig.tight_layout(rect=(0, height, 1, 1))
    fig.savefig(path, dpi=dpi, metadata={"Title": title, "Description": caption})
    if svg:
        fig.savefig(path.with_suffix(".svg"), metadata={"Title": title, "Description": caption})
    return path


@dataclass
class Figures:
    """What a run's plots show, reduced to the points they draw (a few hundred KB, whatever the
    run's size): drawn here (`draw`) or by a `gpuyard.plotter.Plotter` process."""

    out: Path
    caption: str
    jct_hours: np.ndarray
    """Completed jobs' JCTs, sorted (thinned: `thinned_ranks`), in hours."""
    jct_fraction: np.ndarray
    """The fraction of completed jobs at or below each."""
    completed: int
    total: int
    hours: np.ndarray
    """The timeline's instants (thinned: `thinned_steps`), in hours."""
    busy_share: np.ndarray
    queued: np.ndarray
    deadlines: dict[str, int] | None = None
    """Deadline outcomes (met, missed, declined, best-effort) when jobs have deadlines."""
    deadline_jobs: int = 0
    """The jobs whose deadlines count (not best-effort)."""
    efficiency: tuple[np.ndarray, np.ndarray] | None = None
    """Cluster efficiency over time (hours, efficiency)."""
    churn: NodeChurn | None = None
    queues: QueueSeries | None = None
    allocation: AllocationSeries | None = None


@dataclass
class QueueSeries:
    """A run with queues: each queue's GPUs held over time (thinned), its cohort and quota."""

    title: str
    names: list[str]
    cohorts: list[str]
    quotas: list[int]
    borrowed_gpu_hours: list[float]
    hours: list[np.ndarray]
    """Each queue's instants of change, from the run's first to its last (hours)."""
    gpus: list[np.ndarray]
    """The GPUs it holds from each on."""


@dataclass
class NodeChurn:
    """A node-availability replay's idle nodes and their use, over time (thinned)."""

    hours: np.ndarray
    nodes: np.ndarray
    busy: np.ndarray
    running: np.ndarray
    queued: np.ndarray
    share: float | None
    """The idle node-time used (`idle_node_utilization`)."""
    xmax_hours: float | None


def figures(
    jobs: Table, timeline: Table, out: Path, caption: str = "", total: int | None = None,
    efficiency: Table | None = None, summary: dict[str, Any] | None = None,
    node_churn: bool = False, queues: tuple[QueueLayout, Table] | None = None,
) -> Figures:  # fmt: skip
    """The plots of a run's `jobs` and `timeline` into `out`, each captioned with `caption`
    (what ran); `total`: the workload's jobs, when `jobs` holds only some (an interrupted run);
    deadline outcomes when jobs have deadlines; `node_churn`: the idle nodes of the timeline;
    `queues`: the run's queues and their rows of `queues.csv`."""
    jct = np.sort(jobs["jct"][jobs["state"] == "completed"])
    ranks = thinned_ranks(len(jct))
    busy = timeline["busy_gpus"] / timeline["gpus"].clip(min=1)
    queued = timeline["queued"].astype(float)
    kept = thinned_steps(timeline["time"], [busy, queued])
    made = Figures(
        out=out, caption=caption, jct_hours=jct[ranks] / 3600,
        jct_fraction=(ranks + 1) / max(len(jct), 1), completed=len(jct),
        total=total or len(jobs), hours=timeline["time"][kept] / 3600, busy_share=busy[kept],
        queued=queued[kept],
    )  # fmt: skip
    if (~np.isnan(jobs["deadline"])).any():
        counted = jobs.where(jobs["admission"] != "best-effort")
        admitted = counted.where(counted["admission"] == "accepted")
        met = int(np.count_nonzero(admitted["deadline_met"] == True))  # noqa: E712 (None is not)
        made.deadlines = {
            "met": met,
            "missed": len(admitted) - met,
            "declined": int(np.count_nonzero(counted["admission"] == "declined")),
            "best-effort": int(np.count_nonzero(jobs["admission"] == "best-effort")),
        }
        made.deadline_jobs = len(counted)
        if efficiency is not None and len(efficiency):
            made.efficiency = (efficiency["time"] / 3600, efficiency["efficiency"])
    if node_churn:
        nodes, busy_nodes, running, waiting = (
            timeline[c].astype(float) for c in ("gpus", "busy_gpus", "running", "queued")
        )
        kept = thinned_steps(timeline["time"], [nodes, busy_nodes, running, waiting])
        told = summary or {}
        end = told.get("makespan")
        made.churn = NodeChurn(
            hours=timeline["time"][kept] / 3600, nodes=nodes[kept], busy=busy_nodes[kept],
            running=running[kept], queued=waiting[kept], share=told.get("idle_node_utilization"),
            xmax_hours=float(told.get("simulated_s") or end) / 3600 if end else None,
        )  # fmt: skip
    if queues is not None:
        made.queues = queue_series(*queues, timeline, summary or {})
    return made


def queue_series(
    layout: QueueLayout, rows: Table, timeline: Table, summary: dict[str, Any]
) -> QueueSeries:
    """What `queues.png` draws: each queue's steps from the timeline's first instant (none held)
    to its last, thinned."""
    times = timeline["time"]
    start, end = (float(times[0]), float(times[-1])) if len(times) else (0.0, 0.0)
    names = layout.queues.names
    queue, known = group_index(rows["queue"], names)
    order = np.argsort(queue, kind="stable")  # (by time within each queue, as the rows come)
    queue, time, gpus = queue[order], rows["time"][known][order], rows["gpus"][known][order]
    bounds = np.searchsorted(queue, np.arange(len(names) + 1))
    most = max(PLOTTED_POINTS // max(len(names), 1), 500)
    hours, held = [], []
    for i in range(len(names)):  # (a loop over queues, not jobs: their rows are split once)
        t, g = time[bounds[i] : bounds[i + 1]], gpus[bounds[i] : bounds[i + 1]]
        x = np.r_[start, t, max(end, t[-1] if len(t) else end)]
        y = np.r_[0, g, g[-1] if len(g) else 0].astype(float)
        kept = thinned_steps(x, [y], most)
        hours.append(x[kept] / 3600)
        held.append(y[kept])
    figures = summary.get("queues") or {}
    borrowed = [float((figures.get(n) or {}).get("borrowed_gpu_hours") or 0.0) for n in names]
    what = f"{summary.get('policy', 'queues')}" + (f" with {layout.file}" if layout.file else "")
    workload = f"; {summary['workload']}" if "workload" in summary else ""
    title = (f"GPUs held per queue: {what}{workload}\n"
             "solid: GPUs held; dashed: quota; shaded: held above quota (borrowed)")  # fmt: skip
    return QueueSeries(
        title=title, names=list(names), cohorts=list(layout.cohorts), quotas=list(layout.quotas),
        borrowed_gpu_hours=borrowed, hours=hours, gpus=held,
    )  # fmt: skip


def draw(made: Figures) -> list[Path]:
    """`jct_cdf.png` and `timeline.png`; `deadlines.png` with deadline outcomes, `idle_nodes.png`
    with node churn."""
    return [drawing() for drawing in drawings(made)]


def drawings(made: Figures) -> list[Callable[[], Path]]:
    """`draw`'s figures, each drawn (and its path returned) when called: independent of one
    another, so that they can be drawn in parallel."""
    out, caption = made.out, made.caption
    pending: list[Callable[[], Path]] = [
        functools.partial(draw_jct_cdf, made, out / "jct_cdf.png"),
        functools.partial(draw_timeline, made, out / "timeline.png"),
    ]
    if made.deadlines is not None:
        pending.append(functools.partial(draw_deadlines, made, out / "deadlines.png"))
    if made.churn is not None:
        churn = made.churn
        pending.append(functools.partial(draw_node_churn, churn, out / "idle_nodes.png", caption))
    if made.queues is not None:
        queues = made.queues
        pending.append(functools.partial(draw_queues, queues, out / "queues.png", caption))
    if made.allocation is not None:
        allocation = made.allocation
        pending.append(
            functools.partial(draw_allocation, allocation, out / "allocation.png", caption)
        )
    return pending


def draw_jct_cdf(made: Figures, path: Path) -> Path:
    fig, ax = subplots(figsize=(7, 4.8))
    if made.completed:
        ax.plot(made.jct_hours, made.jct_fraction)
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no job completed", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of completed jobs")
    ax.set_title(f"JCT CDF: {made.completed:,} of {made.total:,} jobs completed")
    ax.grid(True, alpha=0.3)
    return save_figure(fig, path, made.caption)


def draw_timeline(made: Figures, path: Path) -> Path:
    fig, (top, bottom) = subplots(2, 1, figsize=(8, 5.8), sharex=True)
    top.step(made.hours, made.busy_share, where="post")
    top.set_ylabel("GPU utilisation")
    top.set_ylim(0, 1.05)
    top.set_title("cluster timeline")
    bottom.step(made.hours, made.queued, where="post", color="tab:orange")
    bottom.set_ylabel("queued jobs")
    bottom.set_xlabel("simulated time (hours)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    return save_figure(fig, path, made.caption)


def draw_queues(series: QueueSeries, path: Path, caption: str) -> Path:
    """A panel per cohort (the queues of none together, last): each queue's GPUs held over time
    in a colour of its own, its quota dashed in that colour (queues of one quota take turns
    along the line), what it holds above it shaded."""
    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    cohorts = list(dict.fromkeys(c for c in series.cohorts if c))
    if "" in series.cohorts:
        cohorts.append("")
    fig, axes = subplots(len(cohorts) or 1, 1, figsize=(11, 1.4 + 2.4 * max(len(cohorts), 1)),
                         sharex=True, squeeze=False)  # fmt: skip
    for ax, cohort in zip(axes[:, 0], cohorts, strict=False):
        members = [i for i, c in enumerate(series.cohorts) if c == cohort]
        colours = colormaps["tab10" if len(members) <= 10 else "tab20"]
        alike = {quota: [i for i in members if series.quotas[i] == quota]
                 for quota in {series.quotas[i] for i in members}}  # fmt: skip
        for k, i in enumerate(members):
            colour = colours(k % colours.N)
            x, y, quota = series.hours[i], series.gpus[i], series.quotas[i]
            borrowed = series.borrowed_gpu_hours[i]
            label = f"{series.names[i]} (quota {quota}" + (
                f", {_gpu_hours(borrowed)} GPU-h borrowed)" if borrowed else ")"
            )
            ax.step(x, y, where="post", color=colour, lw=1.0, label=label)
            ax.hlines(quota, x[0], x[-1], colors=[colour], lw=1.0,
                      linestyles=[_dashes(alike[quota].index(i), len(alike[quota]))])  # fmt: skip
            ax.fill_between(x, quota, np.maximum(y, quota), step="post", color=colour,
                            alpha=0.3, lw=0)  # fmt: skip
        quota = sum(series.quotas[i] for i in members)
        borrowed = sum(series.borrowed_gpu_hours[i] for i in members)
        name = f"cohort {cohort}" if cohort else "no cohort"
        queues = f"{len(members)} queue{'s' if len(members) > 1 else ''}"
        ax.set_title(f"{name}: {queues}, quota {quota:,} GPUs, {_gpu_hours(borrowed)} GPU-h "
                     "borrowed", fontsize=9)  # fmt: skip
        ax.set_ylabel("GPUs held")
        top = max(
            [series.quotas[i] for i in members] + [float(series.gpus[i].max()) for i in members]
        )
        ax.set_ylim(-0.02 * max(top, 1), max(top, 1) * 1.08)  # (a line at 0 clear of the axis)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False,
                  ncol=1 if len(members) <= 12 else 2)  # fmt: skip
    axes[-1][0].set_xlabel("simulated time (hours)")
    return save_figure(fig, path, caption, title=series.title)


def _dashes(turn: int, of: int) -> tuple[float, tuple[float, float]]:
    """The dash pattern of the `turn`th of `of` dashed lines drawn over one another: each its
    dashes in turn, so that every colour shows."""
    dash, gap = 4.0, 2.0
    return (turn * (dash + gap), (dash, of * (dash + gap) - dash))


def _gpu_hours(value: float) -> str:
    return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"


PLOTTED_POINTS = 20_000
"""About how many points of a series a plot draws: a million-job replay's timeline has millions,
which no figure's pixels tell apart, and drawing them takes some 800 MB."""


def thinned_ranks(n: int, most: int = PLOTTED_POINTS) -> np.ndarray:
    """Indices of at most `most` of `n` sorted values, evenly by rank, first and last kept (a
    CDF drawn through them is the CDF drawn through all)."""
    if n <= most:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, most).round().astype(np.int64))


def thinned_steps(x: np.ndarray, ys: list[np.ndarray], most: int = PLOTTED_POINTS) -> np.ndarray:
    """Indices of the points of step series over increasing `x` that a plot needs: all of them
    when there are at most `most`; else, in each of as many spans of `x` as leave at most `most`,
    its first and last point and each series' lowest and highest (the envelope the pixels show)."""
    n = len(x)
    if n <= most:
        return np.arange(n)
    count = max(most // (2 + 2 * len(ys)), 1)
    spans = np.minimum(((x - x[0]) / max(x[-1] - x[0], 1e-300) * count).astype(np.int64), count - 1)
    first = np.flatnonzero(np.r_[True, spans[1:] != spans[:-1]])
    last = np.r_[first[1:] - 1, n - 1]
    keep = np.zeros(n, dtype=bool)
    keep[first] = keep[last] = True
    for y in ys:
        order = np.lexsort((y, spans))  # (each span's points stay where they are, by value)
        keep[order[first]] = keep[order[last]] = True
    return np.flatnonzero(keep)


def draw_deadlines(made: Figures, path: Path) -> Path:
    """Deadline outcomes (met, missed, declined, best-effort) and, if known, cluster efficiency
    over time."""
    outcomes, efficiency = made.deadlines or {}, made.efficiency
    panels = 2 if efficiency is not None else 1
    fig, axes = subplots(1, panels, figsize=(5 + 6 * (panels - 1), 4), squeeze=False)
    ax = axes[0][0]
    bars = ax.bar(list(outcomes), list(outcomes.values()),
                  color=["tab:green", "tab:red", "tab:gray", "tab:blue"])  # fmt: skip
    ax.bar_label(bars)
    ax.set_ylim(0, max(outcomes.values(), default=0) * 1.15 + 1)
    counted = made.deadline_jobs
    ratio = outcomes["met"] / counted if counted else float("nan")
    ax.set_title(f"deadlines: {ratio:.1%} of {counted} jobs met")
    ax.set_ylabel("jobs")
    if efficiency is not None:
        ax = axes[0][1]
        ax.step(*efficiency, where="post")
        ax.set_xlabel("time (hours)")
        ax.set_ylabel("cluster efficiency")
        ax.set_ylim(0, 1.05)
        ax.set_title("sum of throughput(n) / throughput(1) over GPUs")
        ax.grid(True, alpha=0.3)
    return save_figure(fig, path, made.caption)


def write_results(
    rows: JobRows, points: TimelineRows, out: Path,
    extra: dict[str, Any] | None = None, caption: str = "", until: float | None = None, *,
    efficiency: Table | None = None, measured: set[str] | None = None,
    plots: bool = True, node_churn: bool = False, plotter: Plotter | None = None,
    on_summary: Callable[[dict[str, Any]], object] | None = None,
    queues: QueueLayout | None = None, allocation: tuple[Table, int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Write every result file into `out` and return the summary: `rows` are the jobs' (and
    `points` the timeline's); `caption` says what ran on every plot (`plots=False`: no plots, as
    in a sweep, whose report draws its own); `until`: an interrupted run's last instant (the jobs
    that ended by then are counted: see `summarize`). With `efficiency` (`efficiency_frame`),
    `efficiency.csv`; with `measured` (a measurement window), JCT figures are those jobs' (see
    `summarize`); with `node_churn` (nodes came and went: BFTrainer's idle nodes),
    `idle_node_utilization` and `idle_nodes.png`; `plotter`: the process that draws the plots
    (else they are drawn here). `on_summary` is given the summary once
    `summary.json` is written, before the other files (a million jobs' take seconds more).
    With `queues` (a run with queues), each job's queue in `jobs.csv`, each queue's figures in
    the summary (`by_queue`), the GPUs each held over time in `queues.csv`, and `queues.png`.
    With `allocation` (jobs share GPUs: `gpuyard.sharing`'s frame and the cluster's GPUs in
    thousandths), its means in the summary, `allocation.csv` and `allocation.png`."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = rows.table(ended_by=until)
    if queues is not None:
        jobs = with_queues(jobs, queues)
    timeline = points.table()
    summary = {**(extra or {}), **summarize(jobs, timeline, until, efficiency, measured)}
    shown: tuple[QueueLayout, Table] | None = None  # (the queues and their rows)
    if queues is not None:
        shown = (queues, points.queue_table())
        summary |= by_queue(jobs, timeline, shown[1], queues, until)
    compute = summary.get("compute_gpu_s")
    if compute is not None and len(timeline):
        # Gavel's utilisation: the GPUs' compute time over the whole run, from t = 0 to its end.
        total = float(timeline["gpus"].max()) * float(summary["simulated_s"])
        summary["utilization"] = compute / total if total > 0 else 0.0
    summary |= preemption_overhead(jobs, summary.get("preemption_cost_s"))
    if node_churn:
        summary["idle_node_utilization"] = idle_node_utilization(timeline, until, jobs)
    if allocation is not None:
        summary |= allocation_summary(*allocation, _max(jobs["end"]) if len(jobs) else None)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if on_summary is not None:
        on_summary(summary)
    jobs.write_csv(out / "jobs.csv")
    timeline.write_csv(out / "timeline.csv")
    if efficiency is not None:
        efficiency.write_csv(out / "efficiency.csv")
    if shown is not None:
        shown[1].write_csv(out / "queues.csv")
    if allocation is not None:
        allocation[0].write_csv(out / "allocation.csv")
    if plots:
        made = figures(jobs, timeline, out, caption, summary.get("jobs_in_workload"), efficiency,
                       summary, node_churn, shown)  # fmt: skip
        if allocation is not None:
            made.allocation = allocation_series(*allocation, summary)
        if plotter is not None:
            plotter.draw(made)
        else:
            with _DRAWING:
                draw(made)
    return summary


def idle_node_utilization(timeline: Table, until: float | None, jobs: Table) -> float | None:
    """Node-time in use over the node-time present (idle nodes, in BFTrainer's replays), from time
    0 (the replay's start) to `until`, by default the last job's end."""
    if until is None and (~np.isnan(jobs["end"])).any():
        until = _max(jobs["end"])
    if until is None or not len(timeline) or until <= 0:
        return None
    times = np.minimum(np.append(timeline["time"], until), until)
    times = np.maximum(times, 0.0)
    spans = np.diff(times)
    present = float(np.sum(timeline["gpus"].astype(float) * spans))
    used = float(np.sum(timeline["busy_gpus"].astype(float) * spans))
    return used / present if present > 0 else None


def draw_node_churn(churn: NodeChurn, path: Path, caption: str) -> Path:
    """Idle nodes and the nodes jobs use, over time; below, running and queued jobs."""
    fig, (top, bottom) = subplots(2, 1, figsize=(9, 6), sharex=True,
                                           gridspec_kw={"height_ratios": [2, 1]})  # fmt: skip
    hours = churn.hours
    top.fill_between(hours, churn.nodes, step="post", color="0.85", label="idle nodes")
    top.step(hours, churn.busy, where="post", color="tab:blue", lw=0.8, label="nodes in use")
    used = "" if churn.share is None else f": {churn.share:.1%} of idle node-time used"
    top.set_title(f"idle nodes and their use{used}")
    top.set_ylabel("nodes")
    top.legend(loc="upper right", fontsize=8)
    bottom.step(hours, churn.running, where="post", color="tab:green", label="running")
    bottom.step(hours, churn.queued, where="post", color="tab:orange", label="queued")
    bottom.set_ylabel("jobs")
    from matplotlib.ticker import MaxNLocator

    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_xlabel("time since the replay's start (hours)")
    bottom.legend(loc="upper right", fontsize=8)
    if churn.xmax_hours:
        top.set_xlim(0, churn.xmax_hours)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    return save_figure(fig, path, caption)


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
        params = " ".join(
            f"{k}={v}"
            for k, v in (summary.get("policy_params") or {}).items()
            if not (k == "queue" and "queues" in summary)  # (the queues' table says them)
        )
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
    if summary.get("cancelled"):
        counts += f", {summary['cancelled']:,} cancelled"
    if summary.get("timeout"):
        counts += f", {summary['timeout']:,} stopped at their time limit"
    if summary.get("declined"):
        counts += f", {summary['declined']:,} declined by admission"
    lines.append(f"jobs         {counts} of {total:,}")
    if "window" in summary:
        first, end = summary["window"]
        lines.append(
            f"window       jobs {first:,} to {end - 1:,} in arrival order: the JCT and queueing "
            f"figures are theirs ({summary.get('measured_jobs', 0):,} completed)"
        )
    lines.append(
        f"JCT          mean {_hours(summary['mean_jct'])}, p50 {_hours(summary['p50_jct'])}, "
        f"p95 {_hours(summary['p95_jct'])}, p99 {_hours(summary['p99_jct'])}"
    )
    lines.append(f"queueing     mean {_hours(summary['mean_queueing_delay'])} before first start")
    lines.append(f"makespan     {_hours(summary['makespan'])}")
    lines.append(f"utilisation  {100 * summary['utilization']:.1f}% of GPU time")
    overhead = summary.get("preemption_overhead")
    lines.append(
        f"preemptions  {summary['preemptions']:,}"
        + (f" (could cost {100 * overhead:.0f}% of the time jobs ran)" if overhead else "")
        + ("; THRASHING" if summary.get("thrashing") else "")
    )
    if summary.get("deadline_jobs"):
        ratio = summary.get("deadline_satisfactory_ratio")
        met = f"{100 * ratio:.1f}%" if ratio is not None else "-"
        lines.append(
            f"deadlines    {met} met ({summary['deadline_met']:,} of {summary['deadline_jobs']:,} "
            f"jobs with one; {summary['declined']:,} declined by admission, "
            f"{summary['best_effort']:,} best-effort)"
        )
    if summary.get("mean_cluster_efficiency") is not None:
        lines.append(
            f"efficiency   {summary['mean_cluster_efficiency']:.3f} mean cluster efficiency "
            "(throughput(n) / throughput(1) per GPU)"
        )
    if summary.get("gpu_allocation") is not None:
        line = f"allocation   {100 * summary['gpu_allocation']:.1f}% of GPUs (shares as fractions)"
        if summary.get("stranded_gpu_share") is not None:
            line += (
                f"; while jobs waited ({_hours(summary['waiting_s'])}): "
                f"{100 * summary['gpu_allocation_while_waiting']:.1f}%, "
                f"{100 * summary['stranded_gpu_share']:.1f}% stranded"
            )
        lines.append(line)
    if summary.get("jct_jain_fairness") is not None:
        lines.append(f"fairness     Jain's index of JCT {summary['jct_jain_fairness']:.3f}")
    if summary.get("users_jain_slowdown") is not None:
        lines.append(
            f"users        {len(summary['users'])}: Jain's index of their mean slowdown "
            f"{summary['users_jain_slowdown']:.3f}"
        )
    if summary.get("queues"):
        lines += queue_lines(summary)
    if "simulated_s" in summary and "wall_s" in summary:
        lines.append(
            f"time         {_hours(summary['simulated_s'])} simulated in "
            f"{summary['wall_s']:,.1f} s wall"
        )
    return "\n".join(lines)


def queue_lines(summary: dict[str, Any]) -> list[str]:
    """The queues' figures for people: a line, then a row per queue."""
    queues: dict[str, dict[str, Any]] = summary["queues"]
    cohorts = {q["cohort"] for q in queues.values() if q["cohort"]}
    jain = summary.get("queues_jain_slowdown")
    fairness = f": Jain's index of their mean slowdown {jain:.3f}" if jain is not None else ""
    plural = "" if len(cohorts) == 1 else "s"
    lines = [f"queues       {len(queues)} in {len(cohorts)} cohort{plural}{fairness}"]
    width = max(len("queue"), *(len(name) for name in queues))
    cohort_width = max(len("cohort"), *(len(q["cohort"]) for q in queues.values()))
    lines.append(
        f"  {'queue':<{width}}  {'cohort':<{cohort_width}}  quota    jobs  completed  "
        "mean JCT  queueing     GPU-h   share  mean GPUs  borrowed GPU-h"
    )
    for name, q in queues.items():
        share = "-" if q["gpu_share"] is None else f"{100 * q['gpu_share']:.1f}%"
        usage = "-" if q["mean_usage"] is None else f"{q['mean_usage']:,.1f}"
        lines.append(
            f"  {name:<{width}}  {q['cohort'] or '-':<{cohort_width}}  {q['quota']:>5,}  "
            f"{q['jobs']:>6,}  {q['completed']:>9,}  {_hours(q['mean_jct']):>8}  "
            f"{_hours(q['mean_queueing_delay']):>8}  {_gpu_hours(q['gpu_hours']):>8}  "
            f"{share:>6}  {usage:>9}  {_gpu_hours(q['borrowed_gpu_hours']):>14}"
        )
    return lines


def plot_workload(
    jobs: pd.DataFrame, out: Path, stem: str, info: dict[str, Any] | None = None
) -> list[Path]:
    """Arrivals over time, the duration CDF and the GPU-demand histogram of a workload, titled
    with what it is (`info`: the trace and format, or the generator); every bar shows its count,
    on a log scale when the counts span more than two orders of magnitude."""
    fig, axes = subplots(1, 3, figsize=(14, 4.6))
    arrivals = np.sort(jobs["submit_time"].to_numpy(dtype=float)) / 3600
    axes[0].plot(arrivals, np.arange(1, len(arrivals) + 1))
    axes[0].set_xlabel("submit time (hours)")
    axes[0].set_ylabel("jobs submitted so far")
    axes[0].set_title("arrivals")
    plot_lengths(axes[1], jobs)
    plot_gpu_demand(axes[2], jobs["num_gpus"])
    for ax in axes:
        ax.grid(True, alpha=0.3)
    title = f"workload {workload_title(stem, len(jobs), info)}"
    return [save_figure(fig, out / f"{stem}_workload.png", "", title=title, dpi=110)]


def plot_lengths(ax: Axes, jobs: pd.DataFrame) -> None:
    """The CDF of the jobs' durations or, for jobs given in steps (Gavel's traces: their time is
    their GPU's), of their steps."""
    from matplotlib.ticker import NullFormatter

    durations = np.sort(jobs["duration"].dropna().to_numpy(dtype=float))
    steps = np.sort(jobs["total_steps"].dropna().to_numpy(dtype=float))
    if len(durations):
        ax.plot(durations / 3600, np.arange(1, len(durations) + 1) / len(durations))
        ax.set_xscale("log")
        ax.set_title(f"duration CDF ({len(durations):,} jobs with a duration)")
        ax.set_xlabel("duration (hours, log scale)")
    elif len(steps):  # (Gavel's traces: a job's length is its steps; its time, its GPU's)
        ax.plot(steps, np.arange(1, len(steps) + 1) / len(steps))
        ax.set_xscale("log")
        ax.set_title(f"length CDF ({len(steps):,} jobs given in steps, not time)")
        ax.set_xlabel("total steps (log scale)")
    else:
        ax.set_title("duration CDF (the jobs give neither durations nor steps)")
    ax.xaxis.set_minor_formatter(NullFormatter())  # (a narrow span labels each, overlapping)
    ax.set_ylabel("fraction of jobs")


def plot_gpu_demand(ax: Axes, num_gpus: pd.Series) -> None:
    """The histogram of GPUs requested: each bar labelled with its count, and a log scale when the
    counts span more than two orders of magnitude, so that a handful of 8-GPU jobs among
    thousands of 1-GPU jobs is still visible (on a linear scale its bar is a line of one pixel)."""
    counts = num_gpus.value_counts().sort_index()
    bars = ax.bar([str(k) for k in counts.index], counts.to_numpy(), color="tab:blue")
    ax.bar_label(bars, labels=[f"{c:,}" for c in counts.to_numpy()], fontsize=8)
    if len(counts) and counts.max() > 100 * counts.min():
        ax.set_yscale("log")
        ax.set_ylabel("jobs (log scale)")
    else:
        ax.set_ylabel("jobs")
    ax.set_xlabel("GPUs requested")
    ax.set_title("GPU demand")


def workload_title(stem: str, n: int, info: dict[str, Any] | None) -> str:
    if info and "trace" in info:
        how = info["format"]
        if "philly_reading" in info:
            how += f", {info['philly_reading']} reading"
        return f"{Path(info['trace']).name} ({how}): {n:,} jobs"
    return f"{stem}: {n:,} jobs"

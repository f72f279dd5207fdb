"""GPU allocation and stranded GPUs of a run whose jobs share GPUs: the fragmentation measures of
the FGD paper (Weng et al., ATC '23) over a simulation's time.

- **GPU allocation**: the thousandths of GPUs jobs hold (a share as its fraction of one GPU,
  not rounded up as `utilization` counts it), over the cluster's.
- **Stranded**: while jobs wait, the free thousandths of each GPU type on which some waiting
  job, asking no more than that type has free in all, could run: capacity the job would fit in
  were it in one place, left idle because it is split over GPUs and nodes (or held back by the
  order the scheduler keeps). The FGD paper's "unallocated GPUs a pending task cannot use",
  counted over every waiting job instead of the one task being placed.

Both come from the jobs' runs (when each started on which GPUs, and stopped), their requests
and arrivals: a job waits from its arrival until it first starts, and between a stop and its
next start."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuyard.results import Table
from gpuyard.shared.model import ANY_GPU, GpuRef, JobSpec

MILLI = 1000

JobRun = tuple[float, str, list[GpuRef]]
"""(time, job, the GPUs it runs on from then on: empty when it stops)."""


@dataclass(frozen=True)
class Ask:
    """What a waiting job needs: thousandths of GPUs, of one of `types`."""

    milli: int
    types: tuple[str, ...]


def ask_of(spec: JobSpec, types: Iterable[str]) -> Ask:
    """A job's request on a cluster of these GPU types (its smallest size, for an elastic job)."""
    if spec.gpu_type != ANY_GPU:
        allowed: tuple[str, ...] = (spec.gpu_type,)
    else:
        allowed = tuple(t for t in types if spec.allows(t))
    return Ask(spec.milli(spec.gpu_range[0]), allowed)


def allocation_frame(
    runs: list[JobRun], asks: Mapping[str, Ask], arrivals: Mapping[str, float],
    milli: Mapping[str, int | None], node_types: Mapping[str, str], capacity: Mapping[str, int],
) -> Table:  # fmt: skip
    """At every instant something changes: GPU thousandths allocated, stranded (see the module),
    jobs waiting, and thousandths asked for by the jobs arrived so far (the FGD paper's arrived
    workload). `asks`: the jobs' requests (those without one never wait here); `milli`:
    a job's share of one GPU (None: whole GPUs); `capacity`: each GPU type's GPUs."""
    changes: list[tuple[float, int, str, list[GpuRef]]] = [
        (t, 1, job, []) for job, t in arrivals.items() if job in asks
    ]  # (arrivals after the runs of the same instant: a job that starts at once never waits)
    changes += [(t, 0, job, gpus) for t, job, gpus in runs]
    changes.sort(key=lambda c: (c[0], c[1]))
    types = sorted(capacity)
    free = {t: MILLI * capacity[t] for t in types}
    total = sum(free.values())
    held: dict[str, dict[str, int]] = {}  # running job -> type -> thousandths
    waiting: dict[str, Ask] = {}
    smallest = {t: _Smallest() for t in types}  # the waiting jobs' asks each type could host
    started: set[str] = set()
    again = _stops_before_a_start(runs)
    rows: list[tuple[float, int, int, int, int]] = []
    arrived = 0
    for time, kind, job, gpus in changes:
        if kind == 1:
            arrived += asks[job].milli
            if job not in started and job not in waiting:
                _wait(job, asks[job], waiting, smallest)
        elif gpus:
            for t, amount in held.pop(job, {}).items():
                free[t] += amount
            share = milli.get(job)
            now: dict[str, int] = {}
            for g in gpus:
                on = node_types.get(g.node_id)
                if on is not None:
                    now[on] = now.get(on, 0) + (share if share is not None else MILLI)
            for t, amount in now.items():
                free[t] -= amount
            held[job] = now
            started.add(job)
            ask = waiting.pop(job, None)
            if ask is not None:
                for t in ask.types:
                    if t in smallest:
                        smallest[t].remove(ask.milli)
        else:  # stopped: ended, or preempted (it waits again if it starts later)
            for t, amount in held.pop(job, {}).items():
                free[t] += amount
            if (time, job) in again and job in asks:
                _wait(job, asks[job], waiting, smallest)
        stranded = sum(free[t] for t in types if smallest[t].fits(free[t]))
        row = (time, total - sum(free.values()), stranded, len(waiting), arrived)
        if rows and rows[-1][0] == time:
            rows[-1] = row
        else:
            rows.append(row)
    columns = list(zip(*rows, strict=True)) if rows else [(), (), (), (), ()]
    return Table({
        "time": np.asarray(columns[0], dtype=np.float64),
        "allocated_milli": np.asarray(columns[1], dtype=np.int64),
        "stranded_milli": np.asarray(columns[2], dtype=np.int64),
        "waiting": np.asarray(columns[3], dtype=np.int64),
        "arrived_milli": np.asarray(columns[4], dtype=np.int64),
    })  # fmt: skip


def _wait(job: str, ask: Ask, waiting: dict[str, Ask], smallest: dict[str, _Smallest]) -> None:
    waiting[job] = ask
    for t in ask.types:
        if t in smallest:
            smallest[t].add(ask.milli)


def _stops_before_a_start(runs: list[JobRun]) -> set[tuple[float, str]]:
    """The stops after which the job starts again (a preemption: it waits in between)."""
    last_stop: dict[str, float] = {}
    found: set[tuple[float, str]] = set()
    for time, job, gpus in sorted(runs, key=lambda r: r[0]):
        if gpus:
            stop = last_stop.pop(job, None)
            if stop is not None:
                found.add((stop, job))
        else:
            last_stop[job] = time
    return found


class _Smallest:
    """A multiset of asks (thousandths) and its least: asks are few distinct sizes."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}

    def add(self, milli: int) -> None:
        self.counts[milli] = self.counts.get(milli, 0) + 1

    def remove(self, milli: int) -> None:
        left = self.counts[milli] - 1
        if left:
            self.counts[milli] = left
        else:
            del self.counts[milli]

    def fits(self, free: int) -> bool:
        """Whether some ask is at most `free` (and `free` is not nothing)."""
        return free > 0 and any(milli <= free for milli in self.counts)


def allocation_summary(frame: Table, capacity_milli: int, until: float | None) -> dict[str, float]:
    """Time-weighted means from the first change to `until` (the last job's end): the GPU
    allocation, and while jobs wait, the allocation and the stranded share of the cluster."""
    if not len(frame) or capacity_milli <= 0:
        return {}
    times = frame["time"]
    end = max(float(until if until is not None else times[-1]), float(times[-1]))
    spans = np.diff(np.append(times, end))
    allocated = frame["allocated_milli"] / capacity_milli
    stranded = frame["stranded_milli"] / capacity_milli
    waiting = frame["waiting"] > 0
    span, waited = float(spans.sum()), float(spans[waiting].sum())
    found = {"gpu_allocation": float(allocated @ spans / span) if span > 0 else 0.0,
             "waiting_s": waited}  # fmt: skip
    if waited > 0:
        found["gpu_allocation_while_waiting"] = float(allocated[waiting] @ spans[waiting] / waited)
        found["stranded_gpu_share"] = float(stranded[waiting] @ spans[waiting] / waited)
    return found


@dataclass
class AllocationSeries:
    """What `allocation.png` draws (thinned): allocation and stranded share, jobs waiting."""

    hours: np.ndarray
    allocated: np.ndarray
    stranded: np.ndarray
    waiting: np.ndarray
    arrived: np.ndarray
    """The arrived workload at each point (a share of the cluster's GPUs)."""
    figures: dict[str, float]


def allocation_series(
    frame: Table, capacity_milli: int, figures: dict[str, float]
) -> AllocationSeries:
    from gpuyard.report import thinned_steps

    allocated = frame["allocated_milli"] / max(capacity_milli, 1)
    stranded = frame["stranded_milli"] / max(capacity_milli, 1)
    waiting = frame["waiting"].astype(float)
    arrived = frame["arrived_milli"] / max(capacity_milli, 1)
    kept = thinned_steps(frame["time"], [allocated, stranded, waiting])
    return AllocationSeries(
        hours=frame["time"][kept] / 3600, allocated=allocated[kept], stranded=stranded[kept],
        waiting=waiting[kept], arrived=arrived[kept], figures=figures,
    )  # fmt: skip


def draw_allocation(series: AllocationSeries, path: Path, caption: str) -> Path:
    """GPU allocation with the stranded share stacked on it, and the jobs waiting, over time."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from gpuyard.report import save_figure

    fig = Figure(figsize=(13, 6))
    grid = fig.add_gridspec(2, 2, width_ratios=(2, 1))
    top = fig.add_subplot(grid[0, 0])
    bottom = fig.add_subplot(grid[1, 0], sharex=top)
    against = fig.add_subplot(grid[:, 1])
    hours, allocated = series.hours, series.allocated
    top.step(hours, 100 * allocated, where="post", label="allocated (shares as fractions)")
    top.fill_between(hours, 100 * allocated, 100 * (allocated + series.stranded), step="post",
                     color="tab:red", alpha=0.35,
                     label="stranded: free GPUs a waiting job would fit in by number but cannot "
                           "use where they are")  # fmt: skip
    top.set_ylabel("% of the cluster's GPUs")
    top.set_ylim(0, 125)
    top.set_yticks(range(0, 101, 20))
    top.legend(loc="upper left", fontsize=8, framealpha=0.9)
    f = series.figures
    told = [f"mean allocation {100 * f.get('gpu_allocation', 0.0):.1f}%"]
    if "stranded_gpu_share" in f:
        told += [f"while jobs wait: allocation {100 * f['gpu_allocation_while_waiting']:.1f}%, "
                 f"stranded {100 * f['stranded_gpu_share']:.1f}%"]  # fmt: skip
    top.set_title("GPU allocation and stranded GPUs: " + "; ".join(told), fontsize=10)
    bottom.step(hours, series.waiting, where="post", color="tab:orange")
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("jobs waiting")
    bottom.set_xlabel("simulated time (hours)")
    against.plot(100 * series.arrived, 100 * allocated, drawstyle="steps-post")
    against.set_xlabel("arrived workload (% of the cluster's GPUs, cumulative)")
    against.set_ylabel("GPUs allocated (%)")
    against.set_title("allocation as the arrived workload grows", fontsize=10)
    against.set_ylim(0, 105)
    for ax in (top, bottom, against):
        ax.grid(True, alpha=0.3)
    return save_figure(fig, path, caption)

"""From jobs as policies see them to what the planner needs: the GPU type, levels and deadlines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from gpuyard.shared.model import JobSpec
from gpuyard.shared.policy import ClusterView, JobView
from gpuyard.shared.throughput import ThroughputModel

from .planner import NO_DEADLINE, Demand

MaxLevel = Literal["peak", "largest"]
"""How high a job may scale: `peak`, the smallest count at which its throughput is highest (what
ElasticFlow's `get_max_gpu` hard-codes per model for the A100 tables: more GPUs would only slow it
down); `largest`, every count it can run at (ElasticFlow's EDF and the other baselines)."""

MAX_TABLE_GPUS = 64
"""ElasticFlow's tables stop at 64 GPUs, and its jobs never use more."""


def main_type(cluster: ClusterView) -> tuple[str, int]:
    """The GPU type the ElasticFlow policies use and its GPUs. ElasticFlow schedules one GPU type;
    on a mixed cluster the type with the most GPUs is used (ties: the first in type order)."""
    types = cluster.types
    if not types:
        return "", 0
    best = max(types, key=lambda t: cluster.capacity[t])
    return best, cluster.capacity[best]


def deadline_of(spec: JobSpec) -> float:
    """The job's absolute deadline; `NO_DEADLINE` for a best-effort job or one without."""
    if spec.best_effort or spec.deadline is None:
        return NO_DEADLINE
    return spec.deadline


def candidate_counts(spec: JobSpec, total: int) -> list[int]:
    """The GPU counts a job may be given: powers of two within its [min, max] range (and its
    minimum, when that is not one), at most `total` and ElasticFlow's 64."""
    low, high = spec.gpu_range
    high = min(high, total, MAX_TABLE_GPUS) if low <= MAX_TABLE_GPUS else min(high, total)
    counts = {low} if low <= high else set()
    n = 1
    while n <= high:
        if n >= low:
            counts.add(n)
        n *= 2
    return sorted(counts)


def levels(
    spec: JobSpec, rate: Callable[[int], float], total: int, max_level: MaxLevel
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The job's levels (GPU counts with a throughput) and its rate at each, capped as
    `max_level` says."""
    counts = [(n, r) for n in candidate_counts(spec, total) if (r := rate(n)) > 0]
    if max_level == "peak" and counts:
        best = max(r for _, r in counts)
        peak = next(n for n, r in counts if r == best)
        counts = [(n, r) for n, r in counts if n <= peak]
    return tuple(n for n, _ in counts), tuple(r for _, r in counts)


LevelCache = dict[tuple[str, str, int, int, int, str], tuple[tuple[int, ...], tuple[float, ...]]]
"""Levels and rates by (job type, GPU type, cluster GPUs, min, max, max_level)."""


class Levels:
    """A policy's `LevelCache`, valid for one state of one throughput model: a model that learns
    from the jobs' progress (real clusters: `LearnedThroughputs.version`) empties it when it has
    learned something since."""

    def __init__(self) -> None:
        self.cache: LevelCache = {}
        self.model: tuple[int, int] | None = None

    def of(self, model: ThroughputModel) -> LevelCache:
        key = (id(model), getattr(model, "version", 0))
        if key != self.model:
            self.cache, self.model = {}, key
        return self.cache


def job_demand(
    job: JobView, gpu_type: str, total: int, max_level: MaxLevel, *, at: float | None = None,
    cache: LevelCache | None = None,
) -> Demand | None:  # fmt: skip
    """What the planner needs of `job` (None if it cannot run on `gpu_type` at all). Its remaining
    steps are projected to `at` (later than the view's time) at its current rate. A job whose work
    is unknown plans as a best-effort job of one step: it runs on what is left over."""
    spec = job.spec
    low, high = spec.gpu_range
    key = (spec.job_type, gpu_type, total, low, high, max_level)
    found = cache.get(key) if cache is not None else None
    if found is None:
        found = levels(spec, lambda n: job.rate(gpu_type, n), total, max_level)
        if cache is not None:
            cache[key] = found
    lv, rates = found
    if not lv:
        return None
    left = job.remaining_steps
    deadline = deadline_of(job.spec)
    if left is None:
        left, deadline = 1.0, NO_DEADLINE
    elif at is not None and job.running and at > job.now:
        left -= job.rate(job.gpu_type or gpu_type, job.gpus) * (at - job.now)
    return Demand(max(left, 1e-9), deadline, lv, rates)


def by_deadline(jobs: Sequence[JobView]) -> list[JobView]:
    """Deadline order (ElasticFlow's), ties in admission order."""
    return sorted(jobs, key=lambda j: (deadline_of(j.spec), j.seq))

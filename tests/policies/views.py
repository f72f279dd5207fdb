"""Views built by hand for policy unit tests: no scheduler, no NATS."""

from __future__ import annotations

import itertools
from typing import Any

from gpuyard.shared.model import Allocation, JobSpec
from gpuyard.shared.policy import ClusterView, JobView, SchedulingInput
from gpuyard.shared.throughput import ThroughputModel

_seq = itertools.count()


def job(
    job_id: str,
    gpus: int = 1,
    *,
    running: bool = False,
    submit: float = 0.0,
    gpu_type: str = "gpu",
    spec: dict[str, Any] | None = None,
    attained_service: float = 0.0,
    remaining_time: float | None = None,
    **record: Any,
) -> JobView:
    """A job as a policy sees it at the input's `now`: `attained_service` and `executed_time` are
    the totals at that time; `remaining_time` (seconds at its current or requested GPUs) becomes
    work in steps under the linear model (a GPU does one step a second)."""
    s = JobSpec(num_gpus=gpus, job_id=job_id, **(spec or {}))
    if running:
        record.setdefault("gpus", gpus)
        record.setdefault("gpu_type", gpu_type)
        record.setdefault("rate", float(record["gpus"]))
    else:
        record.setdefault("queued_since", submit)
    if remaining_time is not None:
        record["total_steps"] = remaining_time * (record["gpus"] if running else gpus)
    return JobView(
        job_id=job_id, seq=record.pop("seq", next(_seq)), spec=s,
        state="running" if running else "queued", submit_time=submit,
        gpu_seconds=attained_service, **record,
    )  # fmt: skip


def inp(
    jobs: list[JobView], gpus: int | dict[str, int] = 4, now: float = 0.0, round_s: float = 300.0,
    model: ThroughputModel | None = None,
) -> SchedulingInput:  # fmt: skip
    """The input at `now`: each running job's current run is taken to start now, so its counters
    are the ones it was built with."""
    capacity = gpus if isinstance(gpus, dict) else {"gpu": gpus}
    for j in jobs:
        if j.running:
            j.record.run_start = j.record.progress_at = now
    cluster = ClusterView(capacity=capacity, round_s=round_s)
    if model is not None:
        cluster.throughputs = model
    views = [JobView(j.record) for j in jobs]  # unbound: the input gives them its time
    return SchedulingInput(now=now, jobs=views, cluster=cluster)


def ids(allocs: list[Allocation] | Any) -> list[str]:
    allocations = allocs.allocations if hasattr(allocs, "allocations") else allocs
    return [a.job_id for a in allocations]

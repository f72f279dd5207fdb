"""EASY backfill in a simulation (a real nats-server, the services, the clock): on Slurm's classic
case, a workload of wide and narrow jobs with time limits, no backfilled job delays the reserved
start of the job at the head of the queue, checked job by job from the results against the
reservation the limits give at every instant it waited at the head. FIFO's greedy backfill, on the
same workload, does delay some; EASY still starts jobs out of order, and waits less than FIFO
without backfill."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.model import ClusterSpec, JobRecord, JobSpec

GPUS = 8


def workload(n: int, seed: int) -> list[JobSpec]:
    """Jobs of 1 to 8 GPUs (a wide one every few), each running 0.5 to 1 times its limit."""
    rng = np.random.default_rng(seed)
    arrival, jobs = 0.0, []
    for i in range(n):
        arrival += float(rng.exponential(40.0))
        gpus = int(rng.choice([1, 2, 4, 8], p=[0.4, 0.25, 0.2, 0.15]))
        limit = float(rng.integers(10, 60)) * 10.0
        duration = round(limit * float(rng.uniform(0.5, 1.0)), 1)
        jobs.append(JobSpec(job_id=f"j{i}", num_gpus=gpus, duration=duration, submit_time=arrival,
                            time_limit_s=limit))  # fmt: skip
    return jobs


def reservation(head: JobRecord, now: float, jobs: list[JobRecord]) -> float:
    """When `head` could start at the latest by the limits of the jobs running at `now` (those
    started then after it in the order are the backfilled ones: left out)."""
    running = [
        r for r in jobs
        if r.first_start is not None and r.end_time is not None and r.first_start <= now < r.end_time
        and not (r.first_start == now and r.seq > head.seq)
    ]  # fmt: skip
    free = GPUS - sum(r.spec.num_gpus for r in running)
    for end, gpus in sorted((r.first_start + (r.spec.time_limit_s or math.inf), r.spec.num_gpus)
                            for r in running if r.first_start is not None):  # fmt: skip
        if free >= head.spec.num_gpus:
            break
        free += gpus
        now = end
    return now if free >= head.spec.num_gpus else math.inf


def delayed_heads(jobs: list[JobRecord]) -> list[tuple[str, float, float]]:
    """(job, reserved start, start) of every job that started after a reservation it had at an
    instant it waited at the head of the queue (FIFO order: all priorities equal)."""
    instants = sorted({t for r in jobs for t in (r.submit_time, r.end_time) if t is not None})
    order = sorted(jobs, key=lambda r: (r.submit_time, r.seq))
    late: dict[str, tuple[str, float, float]] = {}
    for now in instants:
        head = next((r for r in order if r.submit_time <= now and (r.first_start or math.inf) > now),
                    None)  # fmt: skip
        if head is None or head.first_start is None:
            continue
        reserved = reservation(head, now, jobs)
        if head.first_start > reserved + 1e-6 and head.job_id not in late:
            late[head.job_id] = (head.job_id, reserved, head.first_start)
    return list(late.values())


@pytest.mark.slow
async def test_no_backfilled_job_delays_the_reserved_start_of_the_head(
    tmp_path: Path, nats_url: str
) -> None:
    jobs = workload(120, seed=7)
    cluster = ClusterSpec.parse(f"1x{GPUS}")
    runs = {
        name: await simulate(
            SimOptions(cluster=cluster, policy=policy, policy_params=params), jobs,
            tmp_path / name, nats_url=nats_url, cluster_name=name,
        )
        for name, policy, params in [("easy", "easy-backfill", {}),
                                     ("greedy", "fifo", {"backfill": True}),
                                     ("fifo", "fifo", {})]
    }  # fmt: skip
    records = {name: run.jobs for name, run in runs.items()}
    for name in runs:
        assert all(r.state == "completed" for r in records[name]), name
    assert delayed_heads(records["easy"]) == []
    assert delayed_heads(records["greedy"])  # (the check can fail: greedy backfill delays some)

    def out_of_order(rs: list[JobRecord]) -> int:
        started = sorted(rs, key=lambda r: (r.first_start or 0.0, r.seq))
        return sum(a.seq > b.seq for a, b in itertools.pairwise(started))

    def mean_wait(rs: list[JobRecord]) -> float:
        return float(np.mean([(r.first_start or 0.0) - r.submit_time for r in rs]))

    assert out_of_order(records["easy"]) > 0 and out_of_order(records["fifo"]) == 0
    assert mean_wait(records["easy"]) < mean_wait(records["fifo"])

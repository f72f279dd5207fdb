"""EASY backfill (Lifka's, as Slurm's backfill scheduler does it with one reservation): jobs start
in priority order while they fit; the first that does not is given a reservation, the earliest
time enough GPUs of a type it can use are free by the time limits of the jobs running there (its
shadow time); a later job starts ahead of it only if it fits now and does not delay that
reservation: it ends by the shadow time (by its own limit), or it uses GPUs the reserved job will
not need then (the extra GPUs). Running jobs are never preempted.

A job's time limit is `JobSpec.time_limit_s` (counting its runs together, as the node agents and
the clock do); a job without one has `default_limit_s`, or none (it never ends by a limit: it is
backfilled only onto extra GPUs, and its GPUs never count as freed for a reservation). Only the
first job that does not fit gets a reservation (EASY's aggressiveness, Slurm's
`bf_max_job_test=1`); the others wait behind it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated

from msgspec import Meta, Struct

from gpuyard.policies.toolkit.ordering import agnostic_types, runnable_types
from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import JobView, SchedulingInput, SchedulingPolicy


class EasyParams(Struct, forbid_unknown_fields=True):
    default_limit_s: Annotated[float, Meta(gt=0)] | None = None
    """The time limit of a job that has none (Slurm's partition `DefaultTime`); None: such a job
    has no limit."""


@dataclass(frozen=True)
class Reservation:
    """The reserved job's start: when (`at`, the shadow time), on which GPU type, and the GPUs of
    that type free then beyond what it needs (`extra`)."""

    job_id: str
    gpu_type: str
    at: float
    extra: int


class EasyBackfill(SchedulingPolicy):
    """EASY backfill over (priority, submit time) order. Registry name `easy-backfill`."""

    Params = EasyParams

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        cluster, now = inp.cluster, inp.now
        free = dict(cluster.capacity)
        ends: dict[str, list[tuple[float, int]]] = {}  # per type: (end by its limit, GPUs)
        allocations: list[Allocation] = []
        waiting: list[JobView] = []
        for job in inp.jobs:
            r = job.record
            if r.state == "running" and r.gpus > 0 and r.gpu_type in free:
                free[r.gpu_type] -= r.gpus
                ends.setdefault(r.gpu_type, []).append((self.end(job, r.run_start), r.gpus))
                allocations.append(Allocation(r.job_id, r.gpus, r.gpu_type))
            elif r.state != "running":
                waiting.append(job)
        waiting.sort(key=lambda j: (-j.spec.priority, j.submit_time, j.seq))
        reserved: Reservation | None = None
        for job in waiting:
            need = job.spec.num_gpus
            types = runnable_types(job, cluster, need)
            fits = [t for t in agnostic_types(job, types, need) if free.get(t, 0) >= need]
            if reserved is not None:
                fits = [t for t in fits if self.leaves_reservation(job, t, now, reserved)]
            if fits:
                t = fits[0]
                free[t] -= need
                ends.setdefault(t, []).append((self.end(job, now), need))
                allocations.append(Allocation(job.job_id, need, t))
                on_reserved_type = reserved is not None and t == reserved.gpu_type
                if (
                    reserved is not None
                    and on_reserved_type
                    and not self.ends_by(job, now, reserved.at)
                ):
                    reserved = dataclasses.replace(reserved, extra=reserved.extra - need)
            elif reserved is None and types:
                reserved = reserve(job, types, need, now, free, ends)
        return allocations

    def limit(self, job: JobView) -> float | None:
        limit = job.spec.time_limit_s
        return limit if limit is not None else self.params.default_limit_s

    def end(self, job: JobView, start: float) -> float:
        """When a run of `job` started at `start` ends by its limit at the latest (inf: never)."""
        limit = self.limit(job)
        if limit is None:
            return math.inf
        return start + max(limit - job.record.executed_time, 0.0)

    def ends_by(self, job: JobView, now: float, at: float) -> bool:
        """Whether `job`, started now, ends by `at` by its limit (one without never does)."""
        end = self.end(job, now)
        return end <= at and end != math.inf

    def leaves_reservation(self, job: JobView, gpu_type: str, now: float, r: Reservation) -> bool:
        """Whether `job`, started now on `gpu_type`, leaves the reserved start as it is."""
        if gpu_type != r.gpu_type:
            return True
        return self.ends_by(job, now, r.at) or job.spec.num_gpus <= r.extra


def reserve(
    job: JobView, types: list[str], need: int, now: float, free: dict[str, int],
    ends: dict[str, list[tuple[float, int]]],
) -> Reservation:  # fmt: skip
    """The earliest start of `job` over the types it can use, by the limits of the jobs running
    there (ties: type order): the first time enough GPUs of a type are free (inf: never, by the
    limits known), with the GPUs free then beyond its need."""
    best: Reservation | None = None
    for t in types:
        available, at = free.get(t, 0), now
        for end, gpus in sorted(ends.get(t, [])):
            if available >= need and end > at:
                break  # (the jobs that end at the same time free their GPUs too: extra)
            available += gpus
            at = end
        if available < need:
            at = math.inf
        extra = max(available - need, 0)
        if best is None or at < best.at:
            best = Reservation(job.job_id, t, at, extra)
    assert best is not None
    return best

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

The order is by priority, then submission. A job's priority is its own (`JobSpec.priority`) plus,
with their weights, Slurm's multifactor terms: its age (time waited over `max_age_s`, at most 1)
and its user's fair-share factor, 2^(-U/S) with U the user's share of all users' usage decayed
with `half_life_s` and S their share of the `shares` (classic fair share). All weights 0 (the
default): FIFO by priority.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated

from msgspec import Meta, Struct

from gpuyard.policies.toolkit.ordering import agnostic_types, runnable_types
from gpuyard.policies.toolkit.usage import Usage, account, decayed, mean_life
from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import JobView, Needs, SchedulingInput, SchedulingPolicy

Positive = Annotated[float, Meta(gt=0)]
Weight = Annotated[float, Meta(ge=0)]
WEEK_S = 7 * 24 * 3600.0


class EasyParams(Struct, forbid_unknown_fields=True, kw_only=True):
    default_limit_s: Positive | None = None
    """The time limit of a job that has none (Slurm's partition `DefaultTime`); None: such a job
    has no limit."""
    weight_age: Weight = 0.0
    """Slurm's `PriorityWeightAge`: the priority a job gains by waiting `max_age_s`."""
    max_age_s: Positive = WEEK_S
    """`PriorityMaxAge`: the age that counts in full."""
    weight_fairshare: Weight = 0.0
    """`PriorityWeightFairshare`: the priority of a user who used nothing."""
    half_life_s: Positive = WEEK_S
    """`PriorityDecayHalfLife`: usage counts half after this long."""
    shares: dict[str, Positive] = {}
    """Each user's shares (a user not named: 1)."""


class SlurmState(Struct):
    """The users' decayed usage (fair share)."""

    users: dict[str, Usage] = {}


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
    State = SlurmState

    def __init__(self, params: EasyParams | None = None) -> None:
        super().__init__(params)
        p: EasyParams = self.params
        self.tau = mean_life(p.half_life_s)
        self.usage = SlurmState()
        if p.weight_fairshare > 0:  # (usage counted to each exit, not to the next decision)
            self.needs = Needs(decide_on_exit=True)

    def snapshot(self) -> SlurmState | None:
        return self.usage if self.params.weight_fairshare > 0 else None

    def restore(self, state: SlurmState) -> None:
        self.usage = state

    def priority(self, job: JobView, now: float, fairshare: dict[str, float]) -> float:
        """The job's multifactor priority."""
        p: EasyParams = self.params
        age = min(max(now - job.submit_time, 0.0) / p.max_age_s, 1.0)
        fair = fairshare.get(job.spec.user, 1.0)
        return job.spec.priority + p.weight_age * age + p.weight_fairshare * fair

    def fairshare(self, now: float, users: set[str]) -> dict[str, float]:
        """Each user's classic fair-share factor, 2^(-U/S): U their share of the users' decayed
        usage, S their share of the shares (of the users named in `shares`, seen, or waiting)."""
        p: EasyParams = self.params
        usage = {u: decayed(self.usage.users, u, now, self.tau)
                 for u in sorted(users | self.usage.users.keys())}  # fmt: skip
        shares = {u: p.shares.get(u, 1.0) for u in sorted(usage.keys() | p.shares.keys())}
        used, held = sum(usage.values()), sum(shares.values())
        return {
            u: 2.0 ** (-(usage.get(u, 0.0) / used) / (shares[u] / held)) if used > 0 else 1.0
            for u in shares
        }

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
        p: EasyParams = self.params
        if p.weight_age > 0 or p.weight_fairshare > 0:
            shares = (self.fairshare(now, {j.spec.user for j in waiting})
                      if p.weight_fairshare > 0 else {})  # fmt: skip
            waiting.sort(key=lambda j: (-self.priority(j, now, shares), j.submit_time, j.seq))
        else:
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
        if p.weight_fairshare > 0:
            users = {j.job_id: j.spec.user for j in inp.jobs}
            held: dict[str, int] = {}
            for a in allocations:
                held[users[a.job_id]] = held.get(users[a.job_id], 0) + a.num_gpus
            account(self.usage.users, held, now, self.tau)
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

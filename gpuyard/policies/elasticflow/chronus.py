"""Chronus (SoCC 2021) as ElasticFlow compares against it: leases, SLO admission and a MILP that
picks the jobs that hold the next lease.

Time is cut into leases (240 s). A job of r GPUs (its requested count, rigid) needs L leases
(its run time inflated for checkpoints, divided by the lease, rounded up) before its deadline,
i.e. within its first M leases from now. When a job arrives Chronus checks that every accepted
job can still get its leases if this one is added (a greedy packing: largest jobs first, each
taking the latest leases with room before its deadline); if so its SLO is accepted, otherwise it
runs as an unaccepted (best-effort) job.

At each lease boundary a mixed-integer program chooses which accepted jobs hold the coming lease:
binary z_j (holds this lease) and s_j (gets all its leases), integer y_jk (leases in the k-th
stretch of future leases between consecutive deadlines), z_j + sum_k y_jk = L_j s_j, at most the
cluster's GPUs in this lease and on average in each future stretch; it maximises the SLOs kept
(10 each) plus or minus the GPUs used now ("adaptive": use as many now while no job is
unaccepted, as few while some wait, so that they can run). Accepted jobs the program drops become
unaccepted. The GPUs the lease leaves free go to the unaccepted and best-effort jobs, least
remaining work first (jobs that can no longer make their deadline last). Between boundaries
nothing changes: GPUs a job frees wait for the next lease (ElasticFlow's Chronus fills them only
at odd seconds, i.e. never).

Differences from the reference (Chronus as shipped in ElasticFlow's artifact, on Gurobi): future
leases are grouped into stretches between deadlines with the cluster's capacity summed over each
stretch (the reference has a variable per job and lease and caches plans between leases); SCIP
or CP-SAT from OR-Tools solve it, no licence needed.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from msgspec import Meta, Struct

from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import JobView, Needs, SchedulingInput, SchedulingPolicy

from .demand import deadline_of, main_type
from .planner import NO_DEADLINE

LOWEST, ACCEPTED, UNACCEPTED, BEST_EFFORT = -1, 0, 1, 2
"""Chronus's queue priorities: an accepted SLO, an unaccepted one, a best-effort job, and a job
that can no longer make its deadline."""

CHECKPOINT_S, RESUME_S = 0.1, 0.4
"""What Chronus charges a job per resume, per (1 + log2 GPUs), in its estimates."""


class ChronusParams(Struct, forbid_unknown_fields=True):
    lease_s: Annotated[float, Meta(gt=0)] = 240.0
    """Lease length (a multiple of the scheduler's round)."""
    slo_value: Annotated[float, Meta(gt=0)] = 10.0
    """What keeping one job's SLO is worth in the objective."""
    objective: Literal["adaptive", "maximize", "minimize"] = "adaptive"
    """The GPUs used in the coming lease: as many as possible, as few, or as many while no job
    is unaccepted and as few while some are (Chronus's `adaptive`)."""
    solver: Literal["scip", "cp_sat"] = "cp_sat"
    """OR-Tools solver for the MILP (CP-SAT: a pure integer model, about 5x faster than SCIP here)."""
    time_limit_s: Annotated[float, Meta(gt=0)] = 5.0


class ChronusState(Struct, kw_only=True):
    priority: dict[str, int] = {}
    """Each job's queue priority, from when it was first seen."""


class _Job:
    """A job in lease terms: `leases` it still needs within its first `slack` leases from now;
    `left`: seconds of work left (true), `estimate_left`: as Chronus estimates them."""

    __slots__ = ("deadline", "estimate_left", "gpus", "leases", "left", "slack", "view")

    def __init__(
        self, view: JobView, gpus: int, leases: int, slack: int, left: float, estimate_left: float
    ) -> None:
        self.view, self.gpus, self.leases, self.slack = view, gpus, leases, slack
        self.left, self.estimate_left = left, estimate_left
        self.deadline = deadline_of(view.spec)

    def next_lease(self, holds: bool) -> _Job:
        """The job as seen from the next lease (one fewer to wait, one fewer to get if it holds
        this one)."""
        return _Job(self.view, self.gpus, self.leases - holds, self.slack - 1, self.left,
                    self.estimate_left)  # fmt: skip


class Chronus(SchedulingPolicy):
    """Chronus's lease-based scheduling (module docstring). Registry name `chronus`."""

    Params = ChronusParams
    State = ChronusState
    needs = Needs(throughputs=True)
    params: ChronusParams

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.priority: dict[str, int] = {}

    def snapshot(self) -> ChronusState:
        return ChronusState(priority=dict(self.priority))

    def restore(self, state: ChronusState) -> None:
        self.priority = dict(state.priority)

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        lease = self.params.lease_s
        index = round(inp.now / lease)
        if abs(inp.now - index * lease) > 1e-6:  # mid-lease: nothing changes
            return [
                Allocation(j.job_id, j.gpus, j.gpu_type or "any") for j in inp.jobs if j.running
            ]
        gpu_type, total = main_type(inp.cluster)
        jobs = self._jobs(inp, gpu_type, total, index)
        live = {j.view.job_id for j in jobs}
        self.priority = {k: v for k, v in self.priority.items() if k in live}
        known = [j for j in jobs if j.view.job_id in self.priority]
        guaranteed = self._select(known, total)
        # Arrivals: their SLO is checked after the lease is handed out, from the next one on.
        ahead = [j.next_lease(j in guaranteed) for j in known]
        for j in jobs:
            if j.view.job_id not in self.priority:
                later = j.next_lease(False)
                self.priority[j.view.job_id] = self._admit(later, ahead, total)
                ahead.append(later)  # (counted only if accepted: `_admit` looks at priorities)
        free = total - sum(j.gpus for j in guaranteed)
        for j in jobs:
            hopeless = j.deadline < inp.now + j.left
            if hopeless and j not in guaranteed and self.priority[j.view.job_id] != BEST_EFFORT:
                self.priority[j.view.job_id] = LOWEST
        chosen = list(guaranteed)
        for j in sorted(
            (j for j in jobs if j not in guaranteed and self.priority[j.view.job_id] != ACCEPTED),
            key=lambda j: self._urgency(j, inp.now),
        ):
            if j.gpus <= free:
                chosen.append(j)
                free -= j.gpus
        return [Allocation(j.view.job_id, j.gpus, gpu_type) for j in chosen]

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        if not inp.jobs:
            return None
        lease = self.params.lease_s
        return (math.floor(inp.now / lease + 1e-9) + 1) * lease

    # ------------------------------------------------------------------ pieces

    def _jobs(self, inp: SchedulingInput, gpu_type: str, total: int, index: int) -> list[_Job]:
        lease = self.params.lease_s
        jobs = []
        for view in inp.jobs:
            gpus = view.spec.num_gpus
            rate = view.rate(gpu_type, gpus)
            done = view.steps_done
            left_steps = view.remaining_steps
            if rate <= 0 or left_steps is None or gpus > total:
                continue
            duration = (done + left_steps) / rate
            coef = 1 + (1 + math.log2(gpus)) * (RESUME_S + CHECKPOINT_S) / lease
            estimate = duration * coef * 1.1
            executed = done / rate
            leases = max(math.ceil((estimate - executed) / lease), 0)
            deadline = deadline_of(view.spec)
            slack = math.floor(deadline / lease) - index if deadline != NO_DEADLINE else 10**9
            jobs.append(_Job(view, gpus, leases, slack, left_steps / rate, estimate - executed))
        return jobs

    def _admit(self, job: _Job, known: list[_Job], total: int) -> int:
        if job.view.spec.best_effort or job.deadline == NO_DEADLINE:
            return BEST_EFFORT
        accepted = [j for j in known if self.priority.get(j.view.job_id) == ACCEPTED]
        return ACCEPTED if _packable([*accepted, job], total) else UNACCEPTED

    def _select(self, known: list[_Job], total: int) -> list[_Job]:
        """The accepted jobs that hold the coming lease (the MILP); drops those it cannot keep."""
        accepted = [j for j in known if self.priority[j.view.job_id] == ACCEPTED and j.leases > 0]
        for j in accepted:
            if j.slack < j.leases:
                self.priority[j.view.job_id] = UNACCEPTED
        accepted = [j for j in accepted if j.slack >= j.leases]
        if not accepted:
            return []
        objective = self.params.objective
        if objective == "adaptive":
            waiting = any(p == UNACCEPTED for p in self.priority.values())
            objective = "minimize" if waiting else "maximize"
        hold, keep = _lease_program(
            accepted, total, self.params.slo_value, objective, self.params.solver,
            self.params.time_limit_s,
        )  # fmt: skip
        for j, kept in zip(accepted, keep, strict=True):
            if not kept:
                self.priority[j.view.job_id] = UNACCEPTED
        return [j for j, h in zip(accepted, hold, strict=True) if h]

    def _urgency(self, job: _Job, now: float) -> tuple[float, ...]:
        """Chronus's order for the GPUs left: unaccepted and best-effort jobs first, least work
        left first, then older; jobs that cannot make their deadline last."""
        p = self.priority[job.view.job_id]
        return (
            -min(p, UNACCEPTED),
            job.estimate_left * job.gpus,
            job.view.submit_time,
            job.view.seq,
        )


def _packable(jobs: list[_Job], total: int) -> bool:
    """Chronus's fast check: largest jobs first (then least slack), each takes the latest leases
    before its deadline that still have room for it."""
    horizon = max((min(j.slack, 10**6) for j in jobs), default=0)
    room = np.full(max(horizon, 0), total)
    for j in sorted(jobs, key=lambda j: (-j.gpus, j.slack - j.leases, -j.slack)):
        need = j.leases
        for t in range(min(j.slack, horizon) - 1, -1, -1):
            if need == 0:
                break
            if room[t] >= j.gpus:
                room[t] -= j.gpus
                need -= 1
        if need > 0:
            return False
    return True


def _lease_program(
    jobs: list[_Job],
    total: int,
    value: float,
    objective: str,
    solver: Literal["scip", "cp_sat"],
    time_limit: float,
) -> tuple[list[bool], list[bool]]:
    """Solve the lease MILP (module docstring): (holds the coming lease, keeps its SLO) per job."""
    from gpuyard.policies.toolkit.lp import LinearProgram, SolveError

    n = len(jobs)
    gpus = np.array([j.gpus for j in jobs], dtype=float)
    need = np.array([j.leases for j in jobs], dtype=float)
    slack = np.array([min(j.slack, 10**6) for j in jobs])
    ends = np.unique(slack[slack > 1])  # future stretches: leases [1, e1), [e1, e2), ...
    starts = np.concatenate([[1], ends[:-1]]) if ends.size else np.zeros(0)
    lengths = ends - starts
    lp = LinearProgram()
    hold = lp.add_variables(n, ub=1.0, integer=True)
    keep = lp.add_variables(n, ub=1.0, integer=True)
    usable = ends[None, :] <= slack[:, None]  # stretch k lies before job j's deadline
    later = lp.add_variables(
        (n, ends.size), ub=np.where(usable, lengths[None, :], 0.0), integer=True
    )
    rows = np.arange(n)
    # hold_j + sum_k later_jk - need_j keep_j = 0
    lp.add_constraints(
        np.concatenate([rows, np.repeat(rows, ends.size), rows]),
        np.concatenate([hold, later.ravel(), keep]),
        np.concatenate([np.ones(n), np.ones(n * ends.size), -need]),
        lb=0.0, ub=0.0, num_rows=n,
    )  # fmt: skip
    lp.add_constraints(np.zeros(n, dtype=np.int64), hold, gpus, ub=float(total), num_rows=1)
    if ends.size:
        lp.add_constraints(
            np.tile(np.arange(ends.size), n), later.ravel(), np.repeat(gpus, ends.size),
            ub=total * lengths.astype(float), num_rows=ends.size,
        )  # fmt: skip
    sign = 1.0 if objective == "maximize" else -1.0
    lp.set_objective(
        np.concatenate([keep, hold]),
        np.concatenate([np.full(n, value), sign * gpus / gpus.max()]),
        maximize=True,
    )
    try:
        values = lp.solve(solver, time_limit=time_limit).values
    except SolveError:
        return [False] * n, [True] * n  # no plan this lease: nobody is guaranteed, nobody dropped
    return [bool(values[h] > 0.5) for h in hold], [bool(values[k] > 0.5) for k in keep]

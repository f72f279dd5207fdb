"""Optimus as Blox implements it: an elastic share of the spare GPUs by remaining work."""

from __future__ import annotations

import heapq

from msgspec import Struct

from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import Needs, SchedulingInput, SchedulingPolicy

from ..toolkit import fill_in_order

# --------------------------------------------------------------------------- Optimus (elastic)


class OptimusParams(Struct, forbid_unknown_fields=True):
    backfill: bool = True
    """When a job's minimum share does not fit, still give later jobs theirs."""


class Optimus(SchedulingPolicy):
    """Elastic share in the spirit of Optimus (as Blox implements it): minimum shares first, in
    (priority, submit time) order; then spare GPUs, one at a time, to the job whose remaining work
    gains most from one more GPU, up to each job's `max_gpus`.

    Registry name `optimus`. Remaining work W = remaining_time * num_gpus GPU-seconds; assuming
    linear scaling, one more GPU on a job holding g saves W/g - W/(g+1) = W/(g(g+1)) seconds, so
    spare GPUs go to the jobs with the most remaining work first and spread as they accumulate.
    Jobs of unknown remaining time get spare GPUs only when no job with known work can use one.
    Optimus proper fits a convergence and speed model per job; with no such model this uses the
    remaining time the scheduler estimates. GPUs stay on the job's type (one type per job).
    """

    Params = OptimusParams
    needs = Needs(decide_on_exit=True)

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        order = sorted(inp.jobs, key=lambda j: (-j.spec.priority, j.submit_time, j.seq))
        base = fill_in_order(
            order,
            inp.cluster,
            backfill=self.params.backfill,
            demand=lambda j: j.spec.gpu_range[0],
        )
        by_id = {j.job_id: j for j in inp.jobs}
        free = dict(inp.cluster.capacity)
        for a in base:
            free[a.gpu_type] -= a.num_gpus
        heap: list[tuple[float, int, int]] = []

        def push(idx: int) -> None:
            a = base[idx]
            job = by_id[a.job_id]
            if a.num_gpus >= job.spec.gpu_range[1]:
                return
            if job.remaining_time is None:
                gain = -1.0  # unknown work: after every job with known work
            else:
                work = job.remaining_time * job.spec.num_gpus
                gain = work / (a.num_gpus * (a.num_gpus + 1))
            heapq.heappush(heap, (-gain, idx, a.num_gpus))

        for idx in range(len(base)):
            push(idx)
        while heap and any(free.values()):
            _, idx, _ = heapq.heappop(heap)
            a = base[idx]
            if free[a.gpu_type] <= 0:
                continue
            free[a.gpu_type] -= 1
            a.num_gpus += 1
            push(idx)
        return base

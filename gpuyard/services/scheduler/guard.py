"""What the scheduler makes of a policy's answer before placement sees it.

- `check`: the answer names active jobs once each, within their GPU bounds and the cluster's
  capacity; an allocation where the job cannot run (no throughput there) is left out, so that no
  policy ever starts a job where it would only fail.
- `hold_leases`: the preemption guard (`SchedulerConfig.min_run_s`).
- `made_whole`: a decision of what changes (`Decision.keep_running`) as every allocation.

Pure functions of the job records and the answer: unit-tested without NATS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gpuyard.shared.model import ANY_GPU, Allocation, JobRecord
from gpuyard.shared.policy import Decision


class PolicyAnswerError(RuntimeError):
    """A policy's answer that cannot be run (an unknown job, one twice, too many GPUs)."""


def check(
    policy: str,
    allocations: list[Allocation],
    active: Mapping[str, JobRecord],
    capacity: Mapping[str, int],
    runs_there: Callable[[JobRecord, Allocation], bool],
    used: Mapping[str, int] | None = None,
) -> tuple[list[Allocation], list[Allocation]]:
    """`policy`'s allocations as they can run, and those left out where the job cannot run
    (`runs_there` false; a run kept as it is was checked when it started). `used`: the
    thousandths of GPUs per type that jobs the answer does not name hold (GPUs are counted in
    thousandths: jobs asking for a share of one GPU pack). Raises `PolicyAnswerError`."""
    ids = [a.job_id for a in allocations]
    if len(set(ids)) != len(ids):
        twice = next(j for j in ids if ids.count(j) > 1)
        raise PolicyAnswerError(f"policy {policy!r} allocated {twice!r} twice")
    taken = dict(used or {})
    kept: list[Allocation] = []
    left_out: list[Allocation] = []
    for a in allocations:
        record = active.get(a.job_id)
        if record is None:
            raise PolicyAnswerError(f"policy {policy!r} allocated {a.job_id!r} wrongly")
        kept_as_is = (  # a run goes on as it is: its bounds and type were checked at its start
            record.state == "running" and record.gpus == a.num_gpus
            and a.gpu_type in (ANY_GPU, record.gpu_type)
        )  # fmt: skip
        if kept_as_is and a.share_with is None:
            taken[a.gpu_type] = taken.get(a.gpu_type, 0) + record.spec.milli(a.num_gpus)
            kept.append(a)
            continue
        low, high = record.spec.gpu_range
        if not low <= a.num_gpus <= high:
            raise PolicyAnswerError(
                f"policy {policy!r} gave {a.job_id!r} {a.num_gpus} GPUs outside [{low}, {high}]"
            )
        if not kept_as_is and not runs_there(record, a):
            left_out.append(a)
            continue
        if a.share_with is not None:
            if not any(k.job_id == a.share_with and k.share_with is None for k in kept):
                raise PolicyAnswerError(
                    f"policy {policy!r}: {a.job_id!r} shares the GPUs of {a.share_with!r}, "
                    "which is not allocated before it"
                )
        else:
            taken[a.gpu_type] = taken.get(a.gpu_type, 0) + record.spec.milli(a.num_gpus)
        kept.append(a)
    if sum(taken.values()) > 1000 * sum(capacity.values()) or any(
        t != ANY_GPU and n > 1000 * capacity.get(t, 0) for t, n in taken.items()
    ):
        raise PolicyAnswerError(f"policy {policy!r} allocated more GPUs than exist")
    return kept, left_out


def hold_leases(
    now: float,
    allocations: list[Allocation],
    capacity: Mapping[str, int],
    running: Iterable[JobRecord],
    lease_s: float,
) -> tuple[list[Allocation], float | None]:
    """The preemption guard: a job of `running` that started or resumed less than `lease_s`
    before `now` keeps its GPUs, even if the decision stops, resizes or moves it; the decision's
    other allocations follow in its order while GPUs are left. Jobs sharing GPUs are not held.
    Returns the allocations and, if the guard changed the decision, when the first lease it held
    ends (decide again then)."""
    if lease_s <= 0:
        return allocations, None
    running = list(running)
    sharing = {r.shares_with for r in running if r.shares_with}
    wanted = {a.job_id: a for a in allocations}
    left = dict(capacity)
    held: list[Allocation] = []
    lease_ends: float | None = None
    for r in running:
        ends = r.run_start + lease_s  # (the very sum the wake-up is set to)
        if now >= ends or r.shares_with or r.job_id in sharing:
            continue
        assert r.gpu_type is not None
        if left.get(r.gpu_type, 0) < r.gpus:  # its node went away: nothing to hold
            continue
        left[r.gpu_type] -= r.gpus
        a = wanted.get(r.job_id)
        if a is None or a.num_gpus != r.gpus or a.gpu_type not in (ANY_GPU, r.gpu_type):
            a = Allocation(r.job_id, r.gpus, r.gpu_type)
            lease_ends = ends if lease_ends is None else min(lease_ends, ends)
        held.append(a)
    if lease_ends is None:
        return allocations, None  # the decision keeps every leased job as it is
    kept = {a.job_id for a in held}
    out = list(held)
    for a in allocations:
        if a.job_id in kept:
            continue
        if a.share_with is not None:
            if a.share_with in kept:
                out.append(a)
                kept.add(a.job_id)
            continue
        types = [a.gpu_type] if a.gpu_type != ANY_GPU else list(left)
        if a.num_gpus > sum(left.get(t, 0) for t in types):
            continue
        need = a.num_gpus
        for t in types:  # (a job of any type: placement picks; count it against the total)
            take = min(need, left.get(t, 0))
            left[t] = left.get(t, 0) - take
            need -= take
        out.append(a)
        kept.add(a.job_id)
    return out, lease_ends


def made_whole(
    decision: Decision, last: Mapping[str, Allocation], active: Mapping[str, JobRecord]
) -> list[Allocation]:
    """A decision of what changes as every allocation: the running jobs it names neither in its
    allocations nor in `stop` keep their GPUs, first, in the order of the last apply (`last`)."""
    named = {a.job_id for a in decision.allocations}
    named.update(decision.stop)
    kept: list[Allocation] = []
    for job_id, a in last.items():
        r = active.get(job_id)
        if r is None or r.state != "running" or job_id in named:
            continue
        if a.num_gpus != r.gpus or a.gpu_type != r.gpu_type:
            a = Allocation(job_id, r.gpus, r.gpu_type or ANY_GPU)
        kept.append(a)
    return kept + decision.allocations

"""Deadline admission: admit a job only if every admitted job can still finish by its deadline.

ElasticFlow's access control re-plans the admitted jobs with the new one in deadline order and
admits it only when every plan stays feasible; its EDF-with-access-control baseline does the same
with EDF plans. Best-effort jobs (and jobs without a deadline) are always admitted: they live on
what the others leave.

Per job, not per batch (by default): ElasticFlow's simulator admits or declines all the jobs that
arrive in one (merged) event together, declining the whole batch when the plan with all of them
fails. Here each job is decided on its own, in arrival order, against the jobs already admitted
(those admitted earlier in the same request included). A job that fits is never declined because
another one arriving with it does not; a batch the reference admits whole is admitted here too
(the same jobs pass one by one, each against a subset of the others). As ElasticFlow's simulator
does, `decide_at="event"` holds an arrival until the scheduler's next decision and decides it there
(its merged event), and `together=True` admits that event's arrivals all or none (best-effort
jobs excepted): its `ef-accessctrl` does both, its `edf-accessctrl` the first alone.

Plans start where the scheduler first decides on the new job (`AdmissionInput.next_decision`: the
end of the current slot when events within a slot wait for it, as ElasticFlow's do), with the
running jobs' remaining steps projected there.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

from gpuyard.shared.model import JobRecord
from gpuyard.shared.policy import (
    AdmissionDecision,
    AdmissionInput,
    AdmissionPolicy,
    JobView,
    Needs,
)
from gpuyard.shared.throughput import total_steps

from .demand import Levels, MaxLevel, by_deadline, deadline_of, job_demand, main_type
from .planner import NO_DEADLINE, Demand, Plan, plan_all_edf, plan_all_mss


class DeadlineAdmissionParams(Struct, forbid_unknown_fields=True):
    slot_s: Annotated[float, Meta(gt=0)] = 240.0
    """ElasticFlow's scheduling slot: plans are cut into slots of this length. Give it the
    scheduler's round (`gpuyard sim --elasticflow` does)."""
    max_level: MaxLevel = "peak"
    """How far a job may scale in the plans (`peak`: ElasticFlow; `largest`: its EDF)."""
    decide_at: Literal["arrival", "event"] = "arrival"
    """`arrival`: at once, planned from the scheduler's next decision. `event`: held until that
    decision and decided there, with the other arrivals since the last one (ElasticFlow's
    simulator's merged events)."""
    together: bool = False
    """With `decide_at="event"`: an event's arrivals are admitted all or none (best-effort jobs
    excepted), as ElasticFlow's simulator's `ef-accessctrl` does."""


class _DeadlineAdmission(AdmissionPolicy):
    Params = DeadlineAdmissionParams
    needs = Needs(jobs=True, throughputs=True)
    in_order = False

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.levels = Levels()

    def plan(self, demands: list[Demand], start: float, slot: float, total: int) -> list[Plan]:
        raise NotImplementedError

    @property
    def all_or_none(self) -> bool:
        return bool(self.params.decide_at == "event" and self.params.together)

    def decide(self, inp: AdmissionInput) -> AdmissionDecision:
        spec = inp.job
        waits = inp.next_decision is not None and inp.next_decision > inp.now
        if self.params.decide_at == "event" and waits:
            return AdmissionDecision(
                "hold", "decided with the other arrivals at the scheduler's next decision",
                retry_at=inp.next_decision,
            )  # fmt: skip
        if deadline_of(spec) == NO_DEADLINE:
            return AdmissionDecision("admit", "best effort" if spec.best_effort else "no deadline")
        if total_steps(spec, inp.cluster.throughputs) is None:
            return AdmissionDecision(
                "reject",
                "a deadline needs the job's work: give total_steps (gpuyard submit --steps) or "
                "duration",
            )
        gpu_type, total = main_type(inp.cluster)
        slot = self.params.slot_s
        start = inp.now if inp.next_decision is None else max(inp.now, inp.next_decision)
        try:
            new = self._as_view(inp)
        except ValueError as exc:
            return AdmissionDecision("reject", str(exc))
        jobs = by_deadline([*inp.jobs, new])
        demands, ids = [], []
        cache = self.levels.of(inp.cluster.throughputs)
        for job in jobs:
            d = job_demand(job, gpu_type, total, self.params.max_level, at=start, cache=cache)
            if d is not None:
                demands.append(d)
                ids.append(job.job_id)
        if new.job_id not in ids:
            return AdmissionDecision("reject", f"cannot run on {gpu_type or 'this cluster'}")
        plans = self.plan(demands, start, slot, total)
        late = [(i, p) for i, p in zip(ids, plans, strict=True) if not p.feasible]
        if not late:
            return AdmissionDecision("admit", "")
        mine = next((p for i, p in late if i == new.job_id), None)
        if mine is not None:  # (times from its submission: readable on a wall clock too)
            submitted = spec.submit_time if spec.submit_time is not None else inp.now
            return AdmissionDecision(
                "reject",
                f"cannot meet its deadline: it would finish {mine.finish - submitted:.0f} s after "
                f"submission at best, its deadline is {deadline_of(spec) - submitted:.0f} s after",
            )
        names = ", ".join(i for i, _ in late[:3]) + (", ..." if len(late) > 3 else "")
        return AdmissionDecision("reject", f"admitting it would make {names} miss its deadline")

    @staticmethod
    def _as_view(inp: AdmissionInput) -> JobView:
        spec = inp.job
        assert spec.job_id is not None
        record = JobRecord(
            job_id=spec.job_id, seq=2**62, spec=spec, submit_time=spec.submit_time or inp.now,
            admit_time=inp.now, total_steps=total_steps(spec, inp.cluster.throughputs),
            progress_at=inp.now,
        )  # fmt: skip
        view = JobView(record)
        view.bind(inp.cluster.context(inp.now))
        return view


class ElasticFlowAdmission(_DeadlineAdmission):
    """ElasticFlow's access control (`ef-accessctrl`): Minimum Satisfactory Share plans of every
    admitted job and the new one, in deadline order; admitted if all are feasible.

    Registry name `elasticflow`. A rejection says why: the job itself cannot make its deadline,
    or which admitted jobs it would push past theirs."""

    def plan(self, demands: list[Demand], start: float, slot: float, total: int) -> list[Plan]:
        return plan_all_mss(demands, start, slot, total)[0]


class EdfAdmissionParams(DeadlineAdmissionParams, forbid_unknown_fields=True):
    max_level: MaxLevel = "largest"
    """How far a job may scale in the plans (ElasticFlow's EDF: as far as it can run)."""


class EdfAdmission(_DeadlineAdmission):
    """EDF with access control (`edf-accessctrl`): the same test on EDF plans (each job as many
    GPUs as it can use, in deadline order). Registry name `edf`."""

    Params = EdfAdmissionParams

    def plan(self, demands: list[Demand], start: float, slot: float, total: int) -> list[Plan]:
        return plan_all_edf(demands, start, slot, total)[0]

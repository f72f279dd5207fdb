"""Admission: the front door. Validates job specs, names them, applies the admission policy and hands
admitted jobs to the scheduler."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from gpuyard.shared.bus import Bus, Route, Service
from gpuyard.shared.contract import (
    ClusterInfo,
    Empty,
    EnqueueRequest,
    Event,
    SchedulerStatus,
    SubmitReply,
    SubmitRequest,
    SubmitResult,
)
from gpuyard.shared.model import ANY_GPU, JobSpec
from gpuyard.shared.policy import (
    AdmissionInput,
    AdmissionPolicy,
    ClusterView,
    admission_policies,
)
from msgspec import Struct


class AdmissionConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    policy: str = "accept-all"
    params: dict[str, Any] = {}
    id_prefix: str = "j"
    """Jobs submitted without a job_id are named `<id_prefix><n>`."""


class Admission(Service):
    name = "admission"

    def __init__(self, bus: Bus, config: AdmissionConfig) -> None:
        super().__init__(bus)
        self.config = config
        self.policy: AdmissionPolicy = admission_policies.create(config.policy, config.params)
        self.counter = 0
        self.capacity: dict[str, int] = {}
        self.active_gpu_demand = 0
        self.active_jobs = 0

    def describe_policy(self) -> str:
        return self.config.policy

    def routes(self) -> dict[str, Route]:
        return {"submit": Route(self.submit, SubmitRequest)}

    async def submit(self, req: SubmitRequest) -> SubmitReply:
        now = req.now if req.now is not None else time.time()
        if not self.capacity:
            await self._refresh_capacity()
        results: list[SubmitResult] = []
        admitted: list[JobSpec] = []
        for spec in req.jobs:
            job_id = spec.job_id or self._new_id()
            spec = msgspec.structs.replace(
                spec,
                job_id=job_id,
                submit_time=spec.submit_time if spec.submit_time is not None else now,
            )
            await self._event("job.submitted", now, job_id)
            reason = self._never_fits(spec)
            if reason:  # nodes may have joined since we last looked
                await self._refresh_capacity()
                reason = self._never_fits(spec)
            if reason:
                verdict, why = "reject", reason
            else:
                decision = self.policy.decide(
                    AdmissionInput(
                        now=now,
                        job=spec,
                        cluster=ClusterView(capacity=self.capacity, round_s=0.0),
                        active_gpu_demand=self.active_gpu_demand,
                        active_jobs=self.active_jobs,
                    )
                )
                verdict, why = decision.verdict, decision.reason
            if verdict == "hold":
                # Holding needs re-evaluation as load drops; until a policy that holds exists,
                # say so rather than forget the job.
                verdict, why = "reject", f"held jobs are not supported yet ({why})"
            results.append(SubmitResult(job_id=job_id, verdict=verdict, reason=why))
            if verdict == "admit":
                admitted.append(spec)
        status: SchedulerStatus | None = None
        if admitted:
            status = await self.bus.request(
                f"{self.bus.subjects.scheduler}.enqueue",
                EnqueueRequest(now=now, jobs=admitted, tick=req.tick),
                SchedulerStatus,
            )
            for r in results:
                if r.job_id in status.rejected:
                    r.verdict, r.reason = "reject", status.rejected[r.job_id]
        for r in results:
            await self._event(
                "job.admitted" if r.verdict == "admit" else "job.rejected", now, r.job_id, r.reason
            )
        return SubmitReply(results=results, scheduler=status)

    async def _refresh_capacity(self) -> None:
        info = await self.bus.request(
            f"{self.bus.subjects.placement}.cluster", Empty(), ClusterInfo
        )
        self.capacity = info.capacity

    def _new_id(self) -> str:
        self.counter += 1
        return f"{self.config.id_prefix}{self.counter}"

    def _never_fits(self, spec: JobSpec) -> str:
        """Why the job could never run on this cluster, or '' (unknown cluster: anything goes)."""
        if not self.capacity:
            return ""
        low = spec.gpu_range[0]
        if spec.gpu_type == ANY_GPU:
            most = max(self.capacity.values())
            if low > most:
                return f"needs {low} GPUs of one type; the largest GPU type has {most}"
        elif spec.gpu_type not in self.capacity:
            return f"GPU type {spec.gpu_type!r} is not in the cluster ({', '.join(sorted(self.capacity))})"
        elif low > self.capacity[spec.gpu_type]:
            return (
                f"needs {low} {spec.gpu_type} GPUs; the cluster has {self.capacity[spec.gpu_type]}"
            )
        return ""

    async def _event(self, kind: Any, now: float, job_id: str, reason: str = "") -> None:
        await self.bus.emit(
            Event(type=kind, now=now, job_id=job_id, reason=reason, service=self.name)
        )

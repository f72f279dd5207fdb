"""Admission: the front door. Validates job specs, names them, applies the admission policy and hands
admitted jobs to the scheduler."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from msgspec import Struct

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


class AdmissionConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    policy: str = "accept-all"
    params: dict[str, Any] = {}
    id_prefix: str = "j"
    """Jobs submitted without a job_id are named `<id_prefix><n>`."""
    retry_held_s: float | None = None
    """Real clusters: try held jobs again this often (a simulation's clock does it on exits)."""
    durable: bool = False
    """Keep the id counter and the held jobs in a JetStream key-value bucket."""
    call_timeout_s: float | None = None
    """How long one request to the scheduler or placement may take (None: the default)."""
    retry_for_s: float = 0.0
    """Retry (idempotent) requests this long while the service called restarts."""


class StoredAdmission(Struct, kw_only=True):
    counter: int = 0
    held: list[JobSpec] = []


STATE_KEY = "state"


class Admission(Service):
    name = "admission"

    def __init__(self, bus: Bus, config: AdmissionConfig) -> None:
        super().__init__(bus)
        self.config = config
        self.policy: AdmissionPolicy = admission_policies.create(config.policy, config.params)
        self.counter = 0
        self.held: list[JobSpec] = []  # the overflow queue, in arrival order
        self._retry: asyncio.Task[None] | None = None
        self.capacity: dict[str, int] = {}
        self.active_gpu_demand = 0
        self.active_jobs = 0

    def describe_policy(self) -> str:
        return self.config.policy

    def describe_policy_params(self) -> dict[str, Any]:
        return msgspec.to_builtins(self.policy.params)

    def swap_policy(self, policy: str, params: dict[str, Any]) -> None:
        self.policy = admission_policies.create(policy, params)
        self.config = msgspec.structs.replace(self.config, policy=policy, params=params)

    def routes(self) -> dict[str, Route]:
        return {"submit": Route(self.submit, SubmitRequest)}

    async def persist(self) -> None:
        await self.store.put_many(
            {STATE_KEY: StoredAdmission(counter=self.counter, held=self.held)}
        )

    async def restore(self, values: dict[str, bytes]) -> None:
        if STATE_KEY in values:
            state = msgspec.json.decode(values[STATE_KEY], type=StoredAdmission)
            self.counter, self.held = state.counter, list(state.held)
            self.log.info("state.admission_restored", counter=self.counter, held=len(self.held))

    async def hand_over(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    async def _call(self, service: str, suffix: str, msg: Any, typ: type[Any]) -> Any:
        return await self.bus.request(
            f"{self.bus.subjects.service(service)}.{suffix}", msg, typ,
            within_s=self.config.call_timeout_s, retry_for_s=self.config.retry_for_s,
        )  # fmt: skip

    async def start(self) -> None:
        await super().start()
        if self.config.retry_held_s:
            self._retry = asyncio.create_task(self._retry_held(self.config.retry_held_s))

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        await super().stop()

    async def _retry_held(self, every_s: float) -> None:
        """Through our own subject, so a retry queues behind other requests like any submit."""
        while True:
            await asyncio.sleep(every_s)
            if self.held:
                await self.bus.nc.publish(f"{self.prefix}.submit", b'{"jobs": []}')

    async def submit(self, req: SubmitRequest) -> SubmitReply:
        now = req.now if req.now is not None else time.time()
        if not self.capacity:
            await self._refresh_capacity()
        load = await self._load() if self.held or req.jobs else None
        results: list[SubmitResult] = []
        admitted: list[JobSpec] = []
        # Held jobs first, in order; then the new ones (behind any still held, if in order).
        still_held: list[JobSpec] = []
        held_ids = {s.job_id for s in self.held} if self.durable else set()
        for spec in self.held:
            verdict, why = self._decide(now, spec, load, blocked=bool(still_held))
            if verdict == "hold":
                still_held.append(spec)
                continue
            results.append(SubmitResult(job_id=spec.job_id or "", verdict=verdict, reason=why))
            if verdict == "admit":
                admitted.append(spec)
                self._count(load, spec)
        self.held = still_held
        for spec in req.jobs:
            if spec.job_id is not None and spec.job_id in held_ids:
                continue  # durable: a retried submit whose first attempt held this job
            spec = msgspec.structs.replace(
                spec,
                job_id=spec.job_id or self._new_id(),
                submit_time=spec.submit_time if spec.submit_time is not None else now,
            )
            assert spec.job_id is not None
            await self._event("job.submitted", now, spec.job_id)
            verdict, why = self._decide(now, spec, load, blocked=bool(self.held))
            if verdict == "reject" and self._never_fits(spec):
                await self._refresh_capacity()  # nodes may have joined since we last looked
                verdict, why = self._decide(now, spec, load, blocked=bool(self.held))
            results.append(SubmitResult(job_id=spec.job_id, verdict=verdict, reason=why))
            if verdict == "admit":
                admitted.append(spec)
                self._count(load, spec)
            elif verdict == "hold":
                self.held.append(spec)
        status: SchedulerStatus | None = None
        if admitted or req.tick:
            # The ids given out are stored before the scheduler hears of them: never reused.
            await self.persist()
            status = await self._call(
                "scheduler", "enqueue", EnqueueRequest(now=now, jobs=admitted, tick=req.tick),
                SchedulerStatus,
            )  # fmt: skip
            for r in results:
                if r.job_id in status.rejected:
                    r.verdict, r.reason = "reject", status.rejected[r.job_id]
        for r in results:
            kind = {"admit": "job.admitted", "hold": "job.held", "reject": "job.rejected"}[
                r.verdict
            ]
            await self._event(kind, now, r.job_id, r.reason)
        return SubmitReply(results=results, held=len(self.held), scheduler=status)

    def _decide(
        self, now: float, spec: JobSpec, load: SchedulerStatus | None, *, blocked: bool
    ) -> tuple[str, str]:
        """(verdict, reason) for one job; `blocked`: an earlier job is held (FIFO overflow)."""
        never = self._never_fits(spec)
        if never:
            return "reject", f"can never run here: {never}"
        decision = self.policy.decide(
            AdmissionInput(
                now=now,
                job=spec,
                cluster=ClusterView(capacity=self.capacity, round_s=0.0),
                active_gpu_demand=load.active_gpu_demand if load else 0,
                active_jobs=(load.queued + load.running) if load else 0,
                tenant_gpu_demand=load.tenant_gpu_demand if load else {},
            )
        )
        if decision.verdict == "admit" and blocked and self.policy.in_order:
            return "hold", "behind earlier held jobs"
        return decision.verdict, decision.reason

    async def _load(self) -> SchedulerStatus | None:
        """The scheduler's current load figures, when the policy looks at them."""
        if not self.policy.uses_load:
            return None
        return await self._call("scheduler", "status", Empty(), SchedulerStatus)

    @staticmethod
    def _count(load: SchedulerStatus | None, spec: JobSpec) -> None:
        """Jobs admitted in this request count towards the load for the ones after them."""
        if load is None:
            return
        load.active_gpu_demand += spec.num_gpus
        load.queued += 1
        if spec.tenant:
            load.tenant_gpu_demand[spec.tenant] = (
                load.tenant_gpu_demand.get(spec.tenant, 0) + spec.num_gpus
            )

    async def _refresh_capacity(self) -> None:
        info = await self._call("placement", "cluster", Empty(), ClusterInfo)
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

"""The scheduler: owns the job lifecycle and runs scheduling rounds with the scheduling policy.

Rounds run when the clock says time has come (`sched.tick`). With `mode="rounds"` decisions happen
only at multiples of `round_s` (the references' semantics); with `mode="events"` also at every
arrival and completion. Either way the policy may ask to be woken (`next_decision_time`), and every
reply to the clock says when the scheduler next needs a tick, so instants where nothing can change
cost nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any, Literal

import msgspec
from msgspec import Struct

from gpuyard.shared.bus import BadRequest, Bus, Route, Service, ensure_event_stream
from gpuyard.shared.contract import (
    ApplyReply,
    ApplyRequest,
    CancelReply,
    CancelRequest,
    ClusterChanged,
    ClusterInfo,
    Empty,
    EnqueueRequest,
    Event,
    ExitReport,
    JobExit,
    JobQuery,
    JobRecord,
    JobsPage,
    PageQuery,
    SchedulerStatus,
    TickRequest,
)
from gpuyard.shared.model import ANY_GPU, Allocation, JobSpec
from gpuyard.shared.policy import (
    ClusterView,
    JobView,
    SchedulingInput,
    SchedulingPolicy,
    scheduling_policies,
)
from gpuyard.shared.store import decode, name_of, store_key


class SchedulerConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    policy: str = "fifo"
    params: dict[str, Any] = {}
    round_s: float = 300.0
    mode: Literal["rounds", "events"] = "events"
    """rounds: decide only at multiples of round_s; events: also at every arrival and completion."""
    clock: Literal["external", "wall"] = "external"
    """external: a clock (the simclock) sends ticks; wall: the scheduler ticks itself on real time."""
    event_retention_s: float = 7 * 24 * 3600.0
    """How long the cluster's event stream keeps events."""
    event_storage: Literal["file", "memory"] = "file"
    max_policy_ms_inline: float = 5.0
    """A policy that took longer than this once runs in a worker thread from then on."""
    durable: bool = False
    """Keep the jobs in a JetStream key-value bucket: a restarted scheduler goes on where it was."""
    call_timeout_s: float | None = None
    """How long one request to placement may take (None: the connection's default)."""
    retry_for_s: float = 0.0
    """Retry requests to placement this long while it restarts (real clusters)."""

    def __post_init__(self) -> None:
        if self.round_s <= 0:
            raise ValueError(f"round_s ({self.round_s}) must be > 0")


class StoredJob(Struct, kw_only=True):
    """One job as the scheduler keeps it in its bucket (key: the job id)."""

    spec: JobSpec
    seq: int
    state: Literal["queued", "running", "completed", "failed", "cancelled"]
    submit_time: float
    admit_time: float
    queued_since: float | None
    first_start: float | None
    end_time: float | None
    last_start: float
    gpus: int
    gpu_type: str | None
    executed: float
    gpu_seconds: float
    rounds_run: int
    preemptions: int
    parts: list[str] = []
    reason: str = ""


class StoredMeta(Struct, kw_only=True):
    released: list[str] = []
    last_round: float | None = None
    dirty: bool = True
    policy_wake: float | None = None
    """Whether a round is due and when the policy asked to decide again: a restarted scheduler on
    an external clock (a durable simulation) decides exactly when the old one would have."""


META_KEY = "meta"


class Job:
    """The scheduler's mutable record of one job."""

    __slots__ = (
        "admit_time", "end_time", "executed", "first_start", "gpu_seconds", "gpu_type", "gpus",
        "job_id", "last_start", "preemptions", "queued_since", "rounds_run", "seq", "spec",
        "state", "submit_time", "waiting_view",
    )  # fmt: skip

    def __init__(self, spec: JobSpec, seq: int, now: float) -> None:
        assert spec.job_id is not None
        self.job_id = spec.job_id
        self.spec = spec
        self.seq = seq
        self.state: Literal["queued", "running", "completed", "failed", "cancelled"] = "queued"
        self.submit_time = spec.submit_time if spec.submit_time is not None else now
        self.admit_time = now
        self.queued_since: float | None = now
        self.first_start: float | None = None
        self.end_time: float | None = None
        self.last_start = 0.0
        self.gpus = 0
        self.gpu_type: str | None = None
        self.executed = 0.0
        self.gpu_seconds = 0.0
        self.rounds_run = 0
        self.preemptions = 0
        self.waiting_view: JobView | None = None  # a queued job's view does not change: reuse it

    def start(self, now: float, gpus: int, gpu_type: str) -> None:
        self.waiting_view = None
        self.state = "running"
        self.gpus, self.gpu_type, self.last_start, self.queued_since = gpus, gpu_type, now, None
        if self.first_start is None:
            self.first_start = now

    def settle(self, now: float) -> None:
        """Account the current run up to `now` and take the job off its GPUs."""
        ran = now - self.last_start
        self.executed += ran
        self.gpu_seconds += ran * self.gpus
        self.gpus, self.gpu_type = 0, None

    def view(self, now: float) -> JobView:
        if self.waiting_view is not None:
            return self.waiting_view
        running = self.state == "running"
        ran = now - self.last_start if running else 0.0
        executed = self.executed + ran
        duration = self.spec.duration
        view = JobView(
            job_id=self.job_id,
            seq=self.seq,
            spec=self.spec,
            state="running" if running else "queued",
            submit_time=self.submit_time,
            gpus=self.gpus,
            gpu_type=self.gpu_type,
            attained_service=self.gpu_seconds + ran * self.gpus,
            executed_time=executed,
            rounds_run=self.rounds_run,
            remaining_time=None if duration is None else max(duration - executed, 0.0),
            queued_since=self.queued_since,
            first_start=self.first_start,
            preemptions=self.preemptions,
        )
        if not running:
            self.waiting_view = view
        return view

    def stored(self, parts: set[str] | None, reason: str) -> StoredJob:
        return StoredJob(
            spec=self.spec, seq=self.seq, state=self.state, submit_time=self.submit_time,
            admit_time=self.admit_time, queued_since=self.queued_since,
            first_start=self.first_start, end_time=self.end_time, last_start=self.last_start,
            gpus=self.gpus, gpu_type=self.gpu_type, executed=self.executed,
            gpu_seconds=self.gpu_seconds, rounds_run=self.rounds_run,
            preemptions=self.preemptions, parts=sorted(parts or ()), reason=reason,
        )  # fmt: skip

    @classmethod
    def from_stored(cls, job_id: str, s: StoredJob) -> Job:
        job = cls(msgspec.structs.replace(s.spec, job_id=job_id), s.seq, s.admit_time)
        job.state, job.submit_time, job.queued_since = s.state, s.submit_time, s.queued_since
        job.first_start, job.end_time, job.last_start = s.first_start, s.end_time, s.last_start
        job.gpus, job.gpu_type, job.executed = s.gpus, s.gpu_type, s.executed
        job.gpu_seconds, job.rounds_run, job.preemptions = (
            s.gpu_seconds,
            s.rounds_run,
            s.preemptions,
        )
        return job

    def record(self) -> JobRecord:
        return JobRecord(
            job_id=self.job_id,
            seq=self.seq,
            state=self.state,
            spec=self.spec,
            submit_time=self.submit_time,
            admit_time=self.admit_time,
            first_start=self.first_start,
            end_time=self.end_time,
            preemptions=self.preemptions,
            gpu_seconds=self.gpu_seconds,
            executed_time=self.executed,
            rounds_run=self.rounds_run,
        )


class Scheduler(Service):
    name = "scheduler"

    def __init__(self, bus: Bus, config: SchedulerConfig) -> None:
        super().__init__(bus)
        self.config = config
        self.policy: SchedulingPolicy = scheduling_policies.create(config.policy, config.params)
        self.jobs: dict[str, Job] = {}
        self.active: dict[str, Job] = {}  # queued and running, in admission order
        self.released: list[str] = []  # ended on their own since the last apply
        self.capacity: dict[str, int] | None = None
        self.dirty = False
        self.last_round: float | None = None
        self.policy_wake: float | None = None
        self.wake_at: float | None = None
        self.finished = 0
        self.busy_gpus = 0
        self.active_gpu_demand = 0
        self.tenant_gpu_demand: dict[str, int] = {}
        self.running = 0
        self.policy_slow = False
        self._ticker: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # wall clock: tick now (jobs arrived or ended, nodes changed)
        self.parts: dict[str, set[str]] = {}  # running job -> nodes whose part has not exited yet
        self.reasons: dict[str, str] = {}  # why a job last stopped (real clusters' `sched.query`)
        self.touched: set[str] = set()  # jobs changed by the request in hand (durable: to write)
        self.stored_meta: StoredMeta | None = None  # as last written
        self.reconcile_pending = False  # external clock, restored: reconcile at the first `now`

    def describe_policy(self) -> str:
        return self.config.policy

    def describe_policy_params(self) -> dict[str, Any]:
        return msgspec.to_builtins(self.policy.params)

    def swap_policy(self, policy: str, params: dict[str, Any]) -> None:
        self.policy = scheduling_policies.create(policy, params)
        self.config = msgspec.structs.replace(self.config, policy=policy, params=params)
        # Decide again with the new policy at the next tick; its own wake-ups start afresh.
        self.policy_slow = False
        self.policy_wake = None
        self.dirty = True

    def routes(self) -> dict[str, Route]:
        return {
            "enqueue": Route(self.enqueue, EnqueueRequest),
            "tick": Route(self.tick, TickRequest),
            "exited": Route(self.exited, ExitReport),
            "cluster_changed": Route(self.cluster_changed, ClusterChanged),
            "jobs": Route(self.list_jobs, PageQuery),
            "status": Route(self.status_request, Empty),
            "cancel": Route(self.cancel, CancelRequest),
            "query": Route(self.query, JobQuery),
        }

    async def start(self) -> None:
        stored = await ensure_event_stream(
            self.bus.nc, self.bus.subjects, max_age_s=self.config.event_retention_s,
            storage=self.config.event_storage,
        )  # fmt: skip
        if not stored:
            self.log.warning("events.not_stored", reason="the NATS server has no JetStream")
        await super().start()
        if self.config.clock == "wall":
            self._ticker = asyncio.create_task(self._tick_on_wall_clock())
            await self.bus.nc.subscribe(f"{self.bus.subjects.events}.node.>", cb=self._node_event)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        await super().stop()

    async def _tick_on_wall_clock(self) -> None:
        """Real clusters: tick through our own subject, so ticks queue behind other requests."""
        subject = f"{self.prefix}.tick"
        while True:
            now = time.time()
            due = self.wake_at if self.wake_at is not None else now + self.config.round_s
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), min(max(due - now, 0.05), self.config.round_s)
                )
            await self.bus.nc.publish(subject, msgspec.json.encode(TickRequest(now=time.time())))

    # ------------------------------------------------------------------ durable state

    async def persist(self) -> None:
        """Write the jobs the request changed, and the released list, before the reply."""
        if not self.store.durable:
            self.touched.clear()
            return
        touched, self.touched = self.touched, set()
        items: dict[str, Any] = {
            store_key(j): self.jobs[j].stored(self.parts.get(j), self.reasons.get(j, ""))
            for j in touched
            if j in self.jobs
        }
        meta = StoredMeta(
            released=self.released, last_round=self.last_round, dirty=self.dirty,
            policy_wake=self.policy_wake,
        )  # fmt: skip
        if meta != self.stored_meta:
            items[META_KEY] = meta
        try:
            await self.store.put_many(items)
        except Exception:
            self.touched |= touched  # written with the next request
            raise
        self.stored_meta = msgspec.structs.replace(meta, released=list(meta.released))

    async def restore(self, values: dict[str, bytes]) -> None:
        meta = values.pop(META_KEY, None)
        stored = {name_of(k): decode(v, StoredJob) for k, v in values.items()}
        for job_id, s in sorted(stored.items(), key=lambda kv: kv[1].seq):
            job = self.jobs[job_id] = Job.from_stored(job_id, s)
            if s.reason:
                self.reasons[job_id] = s.reason
            if job.state in ("queued", "running"):
                self.active[job_id] = job
                self._add_demand(job.spec, +1)
            else:
                self.finished += 1
            if job.state == "running":
                self.running += 1
                self.busy_gpus += job.gpus
                self.parts[job_id] = set(s.parts)
        self.dirty = True
        if meta is not None:
            m = decode(meta, StoredMeta)
            self.released, self.last_round = list(m.released), m.last_round
            if self.config.clock == "external":
                # Virtual time: go on as the old one would have; the clock's next request (perhaps
                # the one it was handling, sent again) brings the time to reconcile at.
                self.dirty, self.policy_wake = m.dirty, m.policy_wake
        if self.config.clock == "external":
            self.reconcile_pending = bool(self.jobs)
        else:
            if self.jobs:
                await self._reconcile(time.time())
            self.wake_at = self.next_wake(time.time())  # a wall clock's first round comes at once
        self.log.info(
            "state.jobs_restored", jobs=len(self.jobs), active=len(self.active),
            running=self.running,
        )  # fmt: skip

    async def _reconcile(self, now: float) -> None:
        """Agree with placement on what runs: we may have died between its apply and our write."""
        info = await self._placement("cluster", Empty(), ClusterInfo)
        types = {n.node_id: n.gpu_type for n in info.nodes}
        for job_id, job in self.active.items():
            gpus = info.busy.get(job_id)
            if job.state == "running" and not gpus:
                await self._requeue(now, job_id, "not running after a scheduler restart")
            elif gpus and (job.state != "running" or job.gpus != len(gpus)):
                if job.state == "running":
                    self.busy_gpus -= job.gpus
                    job.settle(now)
                else:
                    self.running += 1
                job.start(now, len(gpus), types.get(gpus[0].node_id, ANY_GPU))
                self.parts[job_id] = {g.node_id for g in gpus}
                self.busy_gpus += len(gpus)
                self.touched.add(job_id)
        strays = [j for j in info.busy if j not in self.active and j not in self.released]
        self.released += strays
        if strays:
            self.log.warning("state.stray_jobs_released", jobs=strays[:10], count=len(strays))
        await self.persist()

    async def _catch_up(self, now: float) -> None:
        """External clock, just restored: reconcile with placement at the clock's time."""
        if self.reconcile_pending:
            self.reconcile_pending = False
            await self._reconcile(now)

    async def _placement(self, suffix: str, msg: Any, typ: type[Any]) -> Any:
        return await self.bus.request(
            f"{self.bus.subjects.placement}.{suffix}", msg, typ,
            within_s=self.config.call_timeout_s, retry_for_s=self.config.retry_for_s,
        )  # fmt: skip

    async def hand_over(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    # ------------------------------------------------------------------ requests

    async def enqueue(self, req: EnqueueRequest) -> SchedulerStatus:
        await self._catch_up(req.now)
        rejected: dict[str, str] = {}
        for spec in req.jobs:
            if spec.job_id is None:
                raise BadRequest("admitted jobs must carry a job_id", field="$.jobs[].job_id")
            known = self.jobs.get(spec.job_id)
            if known is not None:
                # Durable (callers retry): the same job again is a retried request, already here.
                if not (self.config.durable and _same_job(known.spec, spec)):
                    rejected[spec.job_id] = f"job id {spec.job_id!r} is already in use"
                continue
            job = Job(spec, len(self.jobs), req.now)
            self.jobs[job.job_id] = self.active[job.job_id] = job
            self.touched.add(job.job_id)
            self._add_demand(spec, +1)
            self.dirty = True
            await self.emit("job.queued", req.now, job.job_id)
        self._poke()
        ran = await self._round_if_due(req.now, req.tick)
        return self.status(req.now, ran_round=ran, rejected=rejected)

    async def exited(self, req: ExitReport) -> SchedulerStatus:
        await self._catch_up(req.now)
        for ex in req.exits:
            job = self.jobs.get(ex.job_id)
            if job is None or job.state != "running":
                state = "unknown" if job is None else job.state
                self.log.warning("exit.ignored", job_id=ex.job_id, state=state)
                continue
            if not self._part_ended(ex):
                continue
            self.busy_gpus -= job.gpus
            self.running -= 1
            job.settle(req.now)
            self.touched.add(job.job_id)
            job.state = ex.status
            job.end_time = req.now
            del self.active[job.job_id]
            self._add_demand(job.spec, -1)
            self.released.append(job.job_id)
            self.finished += 1
            self.dirty = self.dirty or self.policy.elastic or self._any_queued()
            await self.emit(f"job.{ex.status}", req.now, job.job_id, reason=ex.reason)
        self._poke()
        ran = await self._round_if_due(req.now, req.tick)
        return self.status(req.now, ran_round=ran)

    async def cluster_changed(self, req: ClusterChanged) -> SchedulerStatus:
        await self._catch_up(req.now)
        self.capacity = None
        self.dirty = True
        for job_id in req.lost_jobs:
            await self._requeue(req.now, job_id, "node lost")
        return self.status(req.now)

    async def tick(self, req: TickRequest) -> SchedulerStatus:
        await self._catch_up(req.now)
        ran = await self._round_if_due(req.now, True)
        return self.status(req.now, ran_round=ran)

    async def _round_if_due(self, now: float, tick: bool) -> bool:
        """The clock's tick: run the round if one is due at `now` (always, on wall-clock time)."""
        if not tick:
            return False
        wake = self.next_wake(now)
        if self.config.clock == "wall" or (wake is not None and wake <= now):
            await self.run_round(now)
            return True
        return False

    async def list_jobs(self, req: PageQuery) -> JobsPage:
        page = list(self.jobs.values())[req.offset : req.offset + req.limit]
        return JobsPage(jobs=self._records(page), total=len(self.jobs))

    async def status_request(self, _: Empty) -> SchedulerStatus:
        """Counts and load now, without touching the wake-up time."""
        wake = self.wake_at
        status = self.status(self.last_round or 0.0)
        self.wake_at = status.wake_at = wake
        return status

    async def query(self, req: JobQuery) -> JobsPage:
        """Jobs by id and/or state, in admission order."""
        if req.job_ids:
            found = [self.jobs[j] for j in req.job_ids if j in self.jobs]
        else:
            found = list(self.jobs.values())
        if req.states:
            states = set(req.states)
            found = [j for j in found if j.state in states]
        page = found[req.offset : req.offset + req.limit]
        return JobsPage(jobs=self._records(page), total=len(found))

    def _records(self, jobs: list[Job]) -> list[JobRecord]:
        records = [j.record() for j in jobs]
        for r in records:
            r.reason = self.reasons.get(r.job_id, "")
        return records

    async def cancel(self, req: CancelRequest) -> CancelReply:
        """End jobs for good. A running one is left out of the next allocation: placement stops it."""
        now = req.now if req.now is not None else time.time()
        cancelled: list[str] = []
        refused: dict[str, str] = {}
        for job_id in req.job_ids:
            job = self.jobs.get(job_id)
            if job is None:
                refused[job_id] = "no such job"
                continue
            if job.state not in ("queued", "running"):
                refused[job_id] = f"the job has already ended ({job.state})"
                continue
            if job.state == "running":
                self.busy_gpus -= job.gpus
                self.running -= 1
                job.settle(now)
            job.state = "cancelled"
            self.touched.add(job_id)
            job.end_time = now
            job.waiting_view = None
            del self.active[job_id]
            self.parts.pop(job_id, None)
            self._add_demand(job.spec, -1)
            self.finished += 1
            self.dirty = True
            cancelled.append(job_id)
            self.reasons[job_id] = "cancelled by request"
            await self.emit("job.cancelled", now, job_id, reason="cancelled by request")
        self._poke()
        return CancelReply(cancelled=cancelled, refused=refused)

    # ------------------------------------------------------------------ real clusters

    def _poke(self) -> None:
        """Wall clock: something changed, tick now rather than at the next round."""
        if self._ticker is not None:
            self._wake.set()

    async def _node_event(self, _: Any) -> None:
        """Wall clock: a node came or went (`evt.node.*`): refresh capacity, decide again soon.

        Jobs on a lost node come back in the next apply's `lost` and are requeued there.
        """
        self.capacity = None
        self.dirty = True
        self._poke()

    def _part_ended(self, ex: JobExit) -> bool:
        """Whether this exit ends the job: a job on several nodes ends when every part has exited
        0, or at the first failure. Exits from nodes it does not run on now (an old run) are ignored."""
        parts = self.parts.get(ex.job_id)
        self.touched.add(ex.job_id)
        if ex.node_id and parts is not None:
            if ex.node_id not in parts:
                self.log.warning("exit.stale", job_id=ex.job_id, node_id=ex.node_id)
                return False
            parts.discard(ex.node_id)
            if parts and ex.status == "completed":
                return False
        self.parts.pop(ex.job_id, None)
        if ex.reason:
            self.reasons[ex.job_id] = ex.reason
        return True

    # ------------------------------------------------------------------ the round

    async def run_round(self, now: float) -> None:
        if self.capacity is None:
            info = await self._placement("cluster", Empty(), ClusterInfo)
            self.capacity = info.capacity
        inp = SchedulingInput(
            now=now,
            jobs=[job.view(now) for job in self.active.values()],
            cluster=ClusterView(capacity=dict(self.capacity), round_s=self.config.round_s),
        )
        allocations = await self._decide(inp)
        specs = {
            a.job_id: self.active[a.job_id].spec
            for a in allocations
            if self.active[a.job_id].state != "running"
        }
        attempts = {j: self.active[j].preemptions for j in specs if self.active[j].preemptions}
        # Durable: what the request changed so far (exits, the released list) is written before
        # placement acts on it; a restart between the apply and our next write then reconciles
        # only what the apply itself did (started and stopped jobs), never a job that ended.
        await self.persist()
        reply = await self._placement(
            "apply",
            ApplyRequest(
                now=now,
                allocations=allocations,
                specs=specs,
                released=self.released,
                attempts=attempts,
            ),
            ApplyReply,
        )
        self.released = []
        self.capacity = reply.capacity
        for job_id in reply.lost:
            await self._requeue(now, job_id, "node lost")
        resized = set(reply.stopped) & reply.started.keys()  # stopped and relaunched at once
        for job_id in reply.stopped:
            if job_id not in resized:
                await self._requeue(now, job_id, "preempted")
        for job_id, gpu_type in reply.started.items():
            job = self.active[job_id]
            gpus = reply.placed[job_id]
            if job_id in resized:
                self.busy_gpus -= job.gpus
                job.settle(now)
            else:
                self.running += 1
            job.start(now, len(gpus), gpu_type)
            self.touched.add(job_id)
            self.parts[job_id] = {g.node_id for g in gpus}
            self.busy_gpus += len(gpus)
            kind = "job.resized" if job_id in resized else "job.started"
            await self.emit(kind, now, job_id, gpus=gpus)
        if self.config.mode == "rounds":
            for job in self.active.values():
                if job.state == "running":
                    job.rounds_run += 1
                    self.touched.add(job.job_id)
        self.last_round = now
        self.dirty = False
        self.policy_wake = self.policy.next_decision_time(inp)

    async def _decide(self, inp: SchedulingInput) -> list[Allocation]:
        started = time.perf_counter()
        if self.policy_slow:
            loop = asyncio.get_running_loop()
            allocations = await loop.run_in_executor(None, self.policy.schedule, inp)
        else:
            allocations = self.policy.schedule(inp)
        took = time.perf_counter() - started
        self.policy_s += took
        if took * 1000 > self.config.max_policy_ms_inline:
            self.policy_slow = True
        self._check(allocations)
        return allocations

    def _check(self, allocations: list[Allocation]) -> None:
        """A policy's answer must name active jobs once each, within their GPU bounds and capacity."""
        seen: set[str] = set()
        used: dict[str, int] = {}
        for a in allocations:
            job = self.active.get(a.job_id)
            if job is None or a.job_id in seen:
                raise RuntimeError(f"policy {self.config.policy!r} allocated {a.job_id!r} wrongly")
            seen.add(a.job_id)
            low, high = job.spec.gpu_range
            if not low <= a.num_gpus <= high:
                raise RuntimeError(
                    f"policy {self.config.policy!r} gave {a.job_id!r} {a.num_gpus} GPUs "
                    f"outside [{low}, {high}]"
                )
            used[a.gpu_type] = used.get(a.gpu_type, 0) + a.num_gpus
        assert self.capacity is not None
        total = sum(self.capacity.values())
        if sum(used.values()) > total or any(
            t != ANY_GPU and n > self.capacity.get(t, 0) for t, n in used.items()
        ):
            raise RuntimeError(f"policy {self.config.policy!r} allocated more GPUs than exist")

    async def _requeue(self, now: float, job_id: str, reason: str) -> None:
        job = self.active.get(job_id)
        if job is None or job.state != "running":
            return
        self.busy_gpus -= job.gpus
        self.running -= 1
        job.settle(now)
        job.state = "queued"
        job.queued_since = now
        job.preemptions += 1
        self.touched.add(job_id)
        self.dirty = True
        if self._ticker is not None:
            self.reasons[job_id] = reason
        await self.emit("job.preempted", now, job_id, reason=reason)

    # ------------------------------------------------------------------ helpers

    def _add_demand(self, spec: JobSpec, sign: int) -> None:
        self.active_gpu_demand += sign * spec.num_gpus
        if spec.tenant:
            left = self.tenant_gpu_demand.get(spec.tenant, 0) + sign * spec.num_gpus
            if left:
                self.tenant_gpu_demand[spec.tenant] = left
            else:
                self.tenant_gpu_demand.pop(spec.tenant, None)

    def _any_queued(self) -> bool:
        return len(self.active) > self.running

    def next_wake(self, now: float) -> float | None:
        """When the next round is due, or None when nothing can change until the next event."""
        wanted: list[float] = []
        if self.dirty:
            wanted.append(now)
        if self.policy_wake is not None:
            wanted.append(max(self.policy_wake, now))
        if not wanted:
            return None
        due = min(wanted)
        if self.config.mode == "rounds":
            round_s = self.config.round_s
            boundary = math.ceil(due / round_s) * round_s
            if self.last_round is not None and boundary <= self.last_round:
                boundary = self.last_round + round_s
            return boundary
        return due

    def status(
        self, now: float, *, ran_round: bool = False, rejected: dict[str, str] | None = None
    ) -> SchedulerStatus:
        self.wake_at = self.next_wake(now)
        return SchedulerStatus(
            wake_at=self.wake_at,
            busy_gpus=self.busy_gpus,
            queued=len(self.active) - self.running,
            running=self.running,
            finished=self.finished,
            active_gpu_demand=self.active_gpu_demand,
            tenant_gpu_demand=self.tenant_gpu_demand,
            ran_round=ran_round,
            rejected=rejected or {},
        )

    async def emit(self, kind: Any, now: float, job_id: str, **fields: Any) -> None:
        await self.bus.emit(Event(type=kind, now=now, job_id=job_id, service=self.name, **fields))


def _same_job(known: JobSpec, new: JobSpec) -> bool:
    """The same submission again (a retry), whatever submission time the retry was given."""
    return msgspec.structs.replace(new, submit_time=known.submit_time) == known

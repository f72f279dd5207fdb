"""The scheduler: owns the job lifecycle and runs scheduling rounds with the scheduling policy.

Its pieces: the job table (`jobs.py`: records and the transitions that own the counters), the
round mechanism the policy chose (`mechanism.py`), durability (`durability.py`), and the request
handlers here.

Rounds run when the clock says time has come (`sched.tick`). With `mode="rounds"` decisions happen
only at multiples of `round_s` (the references' semantics); with `mode="events"` also at every
arrival and completion; with `mode="slots"` at those, at most once a round. Either way the policy
may ask to be woken (`next_decision_time`), and every reply to the clock says when the scheduler
next needs a tick, so instants where nothing can change cost nothing. Progress is kept in steps: the throughput model (`throughputs`) gives each run's rate,
and the node agents' reports (at a preemption, an exit, in heartbeats) correct it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, cast

import msgspec
from msgspec import Meta, Struct

from gpuyard.shared.connection import Bus, encode, ensure_event_stream
from gpuyard.shared.contract import (
    ApplyReply,
    ApplyRequest,
    ApplyStages,
    BatchChoice,
    CancelReply,
    CancelRequest,
    ClusterChanged,
    ClusterInfo,
    DoneReply,
    Empty,
    EnqueueRequest,
    Event,
    ExitReport,
    FinishedPage,
    FinishedQuery,
    HoldRequest,
    JobExit,
    JobQuery,
    JobsPage,
    PageQuery,
    RequeueRequest,
    SchedulerStatus,
    StepsReport,
    StepsUpdate,
    TickRequest,
)
from gpuyard.shared.durations import slurm_duration
from gpuyard.shared.endpoints import (
    APPLY,
    APPLY_STAGES,
    CANCEL,
    CLUSTER,
    CLUSTER_CHANGED,
    ENQUEUE,
    EVENT,
    EXITED,
    FINISHED,
    HOLD,
    JOBS,
    QUERY,
    REQUEUE,
    STATUS,
    STEPS,
    TICK,
    Endpoint,
)
from gpuyard.shared.errors import BadRequest, RemoteError
from gpuyard.shared.identity import ANONYMOUS, Caller
from gpuyard.shared.leader import LEASE_S, LeaseSeconds
from gpuyard.shared.model import (
    ANY_GPU,
    Allocation,
    GpuRef,
    JobRecord,
    JobSpec,
    JobState,
    parse_dependency,
)
from gpuyard.shared.policy import (
    ClusterView,
    Decision,
    JobList,
    JobView,
    NodeStatus,
    PolicyError,
    SchedulingInput,
    SchedulingPolicy,
    scheduling_policies,
)
from gpuyard.shared.service import Handler, Service
from gpuyard.shared.store import Replicas
from gpuyard.shared.throughput import (
    LearnedThroughputs,
    LinearModel,
    ThroughputModel,
    load_throughputs,
    total_steps,
)

from .batches import AdaptiveBatches, profiled_times
from .cadence import Cadence
from .durability import SchedulerStore, StoredMeta
from .guard import check, hold_leases, made_whole
from .identity import check_exits, may_change, ran_there, shown_to
from .jobs import CountsLog, Hold, JobTable
from .mechanism import AllocationsMechanism, TimeShareConfig, make_mechanism
from .offload import Offload
from .stages import NODE_LOST, UNKNOWN_GPU, Staged, Stages

R = TypeVar("R")


class SchedulerConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    policy: str = "fifo"
    params: dict[str, Any] = {}
    round_s: float = 300.0
    mode: Literal["rounds", "events", "slots", "clock"] = "events"
    """rounds: decide only at multiples of round_s; events: also at every arrival and completion;
    slots: at those, at most once a round (what happens less than `round_s` after a decision waits
    until `round_s` after it, to be decided on together: ElasticFlow's scheduling slot); clock: at
    every tick of a clock that owns the rounds (Gavel's simulator)."""
    round_origin: Literal["zero", "first_decision"] = "zero"
    """rounds: where the grid of rounds starts, at 0 or at the first decision, made at once when
    the first job comes (ElasticFlow's Themis counts its slots from its first event)."""
    clock: Literal["external", "wall"] = "external"
    """external: a clock (the simclock) sends ticks; wall: the scheduler ticks itself on real time."""
    throughputs: str = "default"
    """The throughput model (a Gavel JSON, ElasticFlow table(s), BFTrainer JNPs CSV, or "default"):
    each run's rate in steps/s, and what policies' `rate()` answers."""
    learn_throughputs: bool = False
    """Real clusters: learn each job type's throughputs from its progress reports, the configured
    model being the prior (`shared.throughput.LearnedThroughputs`)."""
    time_shares: TimeShareConfig = msgspec.field(default_factory=TimeShareConfig)
    """The round mechanism of policies that decide time shares (Gavel's)."""
    goodput_profiles: str | None = None
    """Real clusters: a folder of models' profiles (Pollux's `traces/`): an adaptive job of a
    profiled model (its `job_type`) fits its goodput model to its model's profiled step times
    where it has not measured its own (the prior; `batches.AdaptiveBatches`)."""
    event_retention_s: float = 7 * 24 * 3600.0
    """How long the cluster's event stream keeps events."""
    event_storage: Literal["file", "memory", "none"] = "file"
    """Where the event stream keeps events; "none": events are published but not stored (a
    sweep's runs: `gpuyard tail --follow` shows them as they come)."""
    max_policy_ms_inline: float = 5.0
    """A policy that took longer than this decides in a worker thread (`Offload`)."""
    durable: bool = False
    """Keep the jobs in a JetStream key-value bucket: a restarted scheduler goes on where it was."""
    replicas: Replicas = 1
    lease_s: LeaseSeconds = LEASE_S
    """Durable: the leader lease (`shared.leader`): a standby takes over this long after the
    active instance stopped renewing it."""
    call_timeout_s: float | None = None
    """How long one request to placement may take (None: the connection's default)."""
    retry_for_s: float = 0.0
    """Retry requests to placement this long while it restarts (real clusters)."""
    min_run_s: Annotated[float, Meta(ge=0)] = 0.0
    """The preemption guard, for every policy: a job that started or resumed keeps its GPUs for
    at least this long (Gavel's lease, Tiresias' quanta); a decision that would stop it sooner
    waits until then. 0: off (the references have none)."""
    hand_over_results: bool = False
    """A simulation: the jobs that ended leave memory once the driver took them (`sched.finished`,
    to stream a long replay's results to its files), unless the policy reads finished jobs or
    the scheduler is durable. A real cluster keeps them for `gpuyard jobs`."""
    remember_ended: bool = False
    """With `hand_over_results`: keep how each job that left memory ended (its state alone), as a
    job submitted later may depend on it (a workload with dependencies)."""
    min_round_interval_s: Annotated[float, Meta(ge=0)] = 0.02
    """Wall clock under load: the least time from one round to the next. Arrivals and exits ask
    for a round at once; while requests wait to be handled, those that come within this interval
    share one (a job waits at most this much longer for its round), rather than a round each.
    0: a round for every one."""

    def __post_init__(self) -> None:
        if self.round_s <= 0:
            raise ValueError(f"round_s ({self.round_s}) must be > 0")


@dataclass(frozen=True)
class Launches:
    """What placement needs to launch the allocated jobs (`ApplyRequest`'s `specs`, `attempts`
    and `time_left`)."""

    specs: dict[str, JobSpec]
    attempts: dict[str, int]
    time_left: dict[str, float]
    batches: dict[str, BatchChoice]
    """The batch of each adaptive job (`batches.AdaptiveBatches.choose`)."""

    def of(self, allocations: list[Allocation]) -> dict[str, Any]:
        """The attempts, time left and batches of these jobs alone (an apply of what changed)."""
        ids = [a.job_id for a in allocations]
        return {
            "attempts": {j: self.attempts[j] for j in ids if j in self.attempts},
            "time_left": {j: self.time_left[j] for j in ids if j in self.time_left},
            "batches": {j: self.batches[j] for j in ids if j in self.batches},
        }


@dataclass(frozen=True)
class LastApply:
    """What the scheduler last had placement apply."""

    cluster: ClusterInfo
    allocations: dict[str, Allocation]
    """By job."""
    settled: bool
    """Placement would place them again where they run (`ApplyReply.settled`)."""
    number: int
    """Its number (`ApplyReply.applied`): the next apply may tell what changed since."""
    sharing: bool
    """Jobs shared GPUs in it (the next apply tells every allocation)."""


class Scheduler(Service):
    name = "scheduler"
    policies = scheduling_policies
    commits_in_groups = True  # it calls placement only, which never calls it back

    def __init__(self, bus: Bus, config: SchedulerConfig) -> None:
        super().__init__(bus)
        self.config = config
        self.cadence = Cadence(
            config.mode, config.round_s, external=config.clock == "external",
            origin=0.0 if config.round_origin == "zero" else None,
        )  # fmt: skip
        self.model: ThroughputModel = LinearModel()  # the configured one is loaded at start
        self.policy: SchedulingPolicy
        self.table = JobTable()
        self.batches = AdaptiveBatches(self.table, self.log)
        """Real adaptive jobs' goodput fits and batches (`batches.py`)."""
        self.configured = (config.policy, config.params)
        self.install_policy(config.policy, config.params)
        self.released: list[str] = []  # ended on their own since the last apply
        self.arriving: deque[tuple[float, JobSpec, float | None]] = deque()
        """Jobs a simulation's clock submitted ahead of their arrival (`SubmitRequest.times`), in
        arrival order, with their work: they join the queue when a request's time reaches them."""
        self.arriving_ids: set[str] = set()
        self.commands = 0  # placement's last `clock.cmds` for our applies (simulated nodes)
        self.cluster: ClusterInfo | None = None  # placement's, as last heard; None: ask again
        self._applied: LastApply | None = None
        self.stages = Stages()
        """A simulation's applies kept back as it goes on through instants (`stages.py`)."""
        self._since_apply: dict[str, None] = {}
        """Jobs that changed since the last apply, and those it left unplaced: of its allocations,
        those that may no longer hold (what a decision of what changes must look at)."""
        self._node_list: tuple[ClusterInfo, list[NodeStatus]] | None = None  # its node views
        self._node_views: dict[str, NodeStatus] = {}  # the last view of each node
        self.dirty = False
        self.force_decision = False  # the clock asked for a decision now (`TickRequest.resolve`)
        self.decided_with = 0  # the learning model's version when the policy last decided
        self.last_round: float | None = None
        self.policy_wake: float | None = None
        self.wake_at: float | None = None
        self.offload = Offload(self.config.max_policy_ms_inline)
        self.durability = SchedulerStore(self.store)
        self._ticker: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # wall clock: tick now (jobs arrived or ended, nodes changed)
        self._ticked = asyncio.Event()  # wall clock: the tick we sent is being handled
        self._tick_sent = -math.inf  # ... sent then (monotonic), not handled yet
        self._round_at = -math.inf  # wall clock: when the last round began (monotonic)
        self.launched_only = False
        """The last round's apply only launched jobs: none stopped, moved or left unplaced, none
        with a time limit (a clock's run of each is its work at its rate: `least_run_s`)."""

    # ------------------------------------------------------------------ policy

    def install_policy(self, name: str, params: dict[str, Any]) -> None:
        policy = cast(SchedulingPolicy, self.make_policy(name, params))  # from scheduling_policies
        if policy.needs.throughputs and self.config.throughputs == "default":
            raise PolicyError(
                f"scheduling policy {name!r} needs a measured throughput model; configure "
                f"`throughputs` (gpuyard sim --throughputs FILE)"
            )
        old_mechanism = getattr(self.policy, "mechanism", None) if self.policy else None
        self.policy, self.policy_name = policy, name
        self.policy_fed = False  # it decided since it came: it may be told what changed since
        self.config = msgspec.structs.replace(self.config, policy=name, params=params)
        if old_mechanism != policy.mechanism:
            self.mechanism = make_mechanism(
                policy.mechanism, self.config.time_shares, self.config.round_s
            )

    def policy_swapped(self) -> None:
        # Decide again with the new policy at the next tick; its own wake-ups start afresh.
        self.offload = Offload(self.config.max_policy_ms_inline)
        self.policy_wake = None
        self.dirty = self.table.changed = True
        self._poke()

    def routes(self) -> dict[Endpoint[Any, Any], Handler]:
        return {
            ENQUEUE: self.enqueue, TICK: self.tick, EXITED: self.exited, STEPS: self.steps,
            CLUSTER_CHANGED: self.cluster_changed, JOBS: self.list_jobs,
            STATUS: self.status_request, CANCEL: self.cancel, HOLD: self.hold,
            REQUEUE: self.requeue, QUERY: self.query, FINISHED: self.finished_page,
        }  # fmt: skip

    async def start(self) -> None:
        if self.config.throughputs != "default":
            self.model = await asyncio.to_thread(load_throughputs, self.config.throughputs)
        if self.config.goodput_profiles is not None:
            self.batches.priors = await asyncio.to_thread(
                profiled_times, self.config.goodput_profiles
            )
        if self.config.learn_throughputs:
            self.model = LearnedThroughputs(self.model)
        if self.config.event_storage == "none":
            self.log.info("events.not_stored", reason="event_storage is none")
        elif why := await ensure_event_stream(
            self.bus.nc, self.bus.subjects, max_age_s=self.config.event_retention_s,
            storage=self.config.event_storage, replicas=self.config.replicas,
        ):  # fmt: skip
            self.log.warning("events.not_stored", reason=why)
        await super().start()
        if self.config.clock == "wall":
            self._ticker = asyncio.create_task(self._tick_on_wall_clock())
            node_events = self.bus.subjects.of(EVENT, type="node.>")
            # (drained when it hands over or stands down: no stale instance acts on them)
            self._subs.append(await self.bus.nc.subscribe(node_events, cb=self._node_event))

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        self.batches.close()
        await super().stop()

    async def _tick_on_wall_clock(self) -> None:
        """Real clusters: tick through our own subject, so ticks queue behind other requests."""
        subject = self.bus.subjects.of(TICK)
        while True:
            now = time.time()
            due = self.wake_at if self.wake_at is not None else now + self.config.round_s
            self._wake.clear()
            # (asyncio.timeout: Python 3.11's wait_for may drop a cancellation, the service's stop)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(max(due - now, 0.05), self.config.round_s)):
                    await self._wake.wait()
            if time.monotonic() - self._tick_sent < self.config.round_s:
                # A tick is still queued behind other requests: its round will see what changed
                # since (arrivals under load share one round). Wait for it to be handled.
                await self._ticked.wait()
                continue
            gap = self._round_at + self.config.min_round_interval_s - time.monotonic()
            if gap > 0 and self.queued():  # under load: what comes in meanwhile shares the round
                await asyncio.sleep(gap)
            self._ticked.clear()
            self._tick_sent = time.monotonic()
            await self.bus.nc.publish(subject, encode(TickRequest(now=time.time())))

    # ------------------------------------------------------------------ durable state

    def _meta(self) -> StoredMeta:
        return StoredMeta(
            released=list(self.released), last_round=self.last_round, dirty=self.dirty,
            policy_wake=self.policy_wake, policy=self.policy_name, params=self.config.params,
            configured=self.configured[0], configured_params=self.configured[1],
            changed=self.table.changed, round_origin=self.cadence.origin,
        )  # fmt: skip

    async def persist(self) -> None:
        """Write the jobs the request changed, and the scheduler's own state, before the reply
        (and tell of the jobs their dependencies released or cancelled meanwhile)."""
        if self.table.resolved:
            await self._resolved()
        if not self.store.durable:  # (twice a request: build nothing that would not be written)
            self.table.touched.clear()
            return
        learned = self.model.snapshot() if isinstance(self.model, LearnedThroughputs) else None
        await self.durability.write(
            self.table, self._meta(), self.policy.snapshot(), self.mechanism.snapshot(), learned
        )

    async def restore(self, values: dict[str, bytes]) -> None:
        self.durability = SchedulerStore(self.store)
        restored = self.durability.read(dict(values))
        self.table.load(restored.records)
        self.dirty = True
        if restored.meta is not None:
            m = restored.meta
            swapped = m.policy is not None and (m.policy, m.params) != self.configured
            if swapped and (m.configured, m.configured_params) == self.configured:
                assert m.policy is not None  # (swapped)
                try:  # a runtime swap outlives a restart with the same configuration
                    self.install_policy(m.policy, m.params)
                except PolicyError as exc:
                    self.log.error("policy.not_restored", policy=m.policy, error=str(exc))
            self.released, self.last_round = list(m.released), m.last_round
            if m.round_origin is not None and self.cadence.origin is None:
                self.cadence = dataclasses.replace(self.cadence, origin=m.round_origin)
            self.table.changed = m.changed
            if self.config.clock == "external":
                # Virtual time: go on as the old one would have; the clock's next request (perhaps
                # the one it was handling, sent again) brings the time to reconcile at.
                self.dirty, self.policy_wake = m.dirty, m.policy_wake
        if restored.policy_state is not None and self.policy.State is not None:
            self.policy.restore(msgspec.json.decode(restored.policy_state, type=self.policy.State))
        self.policy_fed = False  # (what it kept of the jobs did not outlive the restart)
        if restored.mechanism_state is not None:
            self.mechanism.restore(restored.mechanism_state)
        if restored.throughputs is not None and isinstance(self.model, LearnedThroughputs):
            self.model.restore(msgspec.json.decode(restored.throughputs))
        if self.config.clock == "wall":
            # Real time went on while we were down: agree with placement on what runs now.
            if self.table.jobs:
                await self._reconcile(time.time())
            self.wake_at = self.next_wake(time.time())  # a wall clock's first round comes at once
        # An external clock (a durable simulation) sends the request in hand again: from the
        # state stored before its round (the policy's too) we decide exactly as before, and
        # placement answers the repeated apply with its stored reply.
        self.log.info(
            "state.jobs_restored", jobs=len(self.table), active=len(self.table.active),
            running=self.table.running,
        )  # fmt: skip

    async def _reconcile(self, now: float) -> None:
        """Agree with placement on what runs: we may have died between its apply and our write."""
        info = await self._placement(CLUSTER, Empty())
        types = {n.node_id: n.gpu_type for n in info.nodes}
        for job_id, record in list(self.table.active.items()):
            gpus = info.busy.get(job_id)
            if record.state == "running" and not gpus:
                await self._requeue(now, record, "not running after a scheduler restart")
            elif gpus and (record.state != "running" or record.gpus != len(gpus)):
                gpu_type = types.get(gpus[0].node_id, ANY_GPU)
                self.table.start(
                    record, now, (g.node_id for g in gpus), len(gpus), gpu_type,
                    self._rate(record, gpu_type, len(gpus)),
                )  # fmt: skip
        # (a job being cancelled is left to the next apply, which stops it: a released one is
        # only freed)
        strays = [
            j for j in info.busy
            if j not in self.table.active and j not in self.released and j not in self.table.stopping
        ]  # fmt: skip
        self.released += strays
        if strays:
            self.log.warning("state.stray_jobs_released", jobs=strays[:10], count=len(strays))
        await self.persist()

    async def _placement(self, endpoint: Endpoint[Any, R], msg: Any) -> R:
        if self.stages.staged:  # (placement hears of them first)
            await self._flush_stages()
        return await self.bus.call(
            endpoint, msg, within_s=self.config.call_timeout_s, retry_for_s=self.config.retry_for_s
        )

    async def hand_over(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    # ------------------------------------------------------------------ requests

    async def enqueue(self, req: EnqueueRequest) -> SchedulerStatus:
        rejected: dict[str, str] = {}
        if req.times and len(req.times) != len(req.jobs):
            raise BadRequest("times: one per job, or none", field="$.times")
        changes = CountsLog(self.table, req.now)
        await self._arrive(req.now, changes)  # (those held for now come before these)
        for i, submitted in enumerate(req.jobs):
            if submitted.job_id is None:
                raise BadRequest("admitted jobs must carry a job_id", field="$.jobs[].job_id")
            spec = self.policy.accepts(submitted)  # (e.g. its queue's default time limit)
            if isinstance(spec, str):
                rejected[submitted.job_id] = spec
                continue
            assert spec.job_id is not None  # (the policy keeps it)
            known = self.table.get(spec.job_id)
            if known is not None or spec.job_id in self.arriving_ids:
                # Durable (callers retry): the same job again is a retried request, already here.
                if not (known is not None and self.config.durable and _same_job(known.spec, spec)):
                    rejected[spec.job_id] = f"job id {spec.job_id!r} is already in use"
                continue
            try:
                work = total_steps(spec, self.model)
            except ValueError as exc:
                rejected[spec.job_id] = str(exc)
                continue
            if spec.depends_on and (why := self._unknown_dependency(spec)):
                rejected[spec.job_id] = why
                continue
            at = req.times[i] if req.times else req.now
            if at > req.now:  # submitted ahead of its arrival: it joins the queue then
                if self.arriving and at < self.arriving[-1][0]:
                    raise BadRequest("times: jobs ahead of their arrival come in arrival order",
                                     field="$.times")  # fmt: skip
                self.arriving.append((at, spec, work))
                self.arriving_ids.add(spec.job_id)
                continue
            with changes.at(at):
                self.table.admit(spec, at, work)
            self.dirty = True
            await self.emit("job.queued", at, spec.job_id)
        if req.declined and self.policy.needs.decide_on_arrival:
            self.dirty = True
        self._poke()
        ran, reached = await self._advance(req.now, req.tick, req.until, changes)
        return self._status(reached, ran_round=ran, rejected=rejected, changes=changes)

    def _unknown_dependency(self, spec: JobSpec) -> str:
        """Why `spec`'s dependencies name a job that is not there ("": they all are)."""
        table = self.table
        for _, jobs in parse_dependency(spec.depends_on):
            for job_id in jobs:
                if job_id == spec.job_id:
                    return f"dependency on {job_id}: the job itself"
                known = job_id in table.jobs or job_id in self.arriving_ids
                if not known and job_id not in table.deps.outcomes:
                    return f"dependency on {job_id}: no such job"
        return ""

    async def exited(self, req: ExitReport, caller: Caller = ANONYMOUS) -> SchedulerStatus:
        check_exits(req, caller)
        self._simulated_progress(req.steps)
        changes = CountsLog(self.table, req.now)
        for ex in req.exits:
            with changes.at(req.now if ex.ended_at is None else ex.ended_at):
                await self._exit(req, ex, caller)
        if self.dirty:  # (a part that stopped as it was told changes nothing: no round for it)
            self._poke()
        foreseen = self._foreseen(req)
        ran, reached = await self._advance(
            req.now, req.tick, req.until, changes, foreseen, (req.least_run_s, req.least_end)
        )
        return self._status(reached, ran_round=ran, changes=changes)

    async def _exit(self, req: ExitReport, ex: JobExit, caller: Caller) -> None:
        """One job's exit (a part's, of a job on several nodes)."""
        record = self.table.get(ex.job_id)
        if record is not None and not ran_there(record, ex, caller):
            self.log.warning("exit.not_placed_there", job_id=ex.job_id, node_id=ex.node_id)
            return
        if record is not None and (record.cancelling or record.requeueing):  # gone, however
            if ex.attempt is None or ex.attempt == record.attempt - 1:
                await self._part_stopped(record, ex.node_id, req.now)
            return
        if ex.status == "stopped":
            return  # a part told to stop, stopped: the job moved on when it was told
        if record is not None and self._done_by_an_earlier_run(record, ex):
            # Its work is done (runs share the checkpoint): it must not run again. A run
            # started since is left out of the next apply, which stops it.
            self.table.end(record, req.now, "completed", ex.reason, record.total_steps)
            self.dirty = True
            await self.emit("job.completed", req.now, ex.job_id, reason=ex.reason)
            return
        if record is None or record.state != "running":
            state = "unknown" if record is None else record.state
            self.log.warning("exit.ignored", job_id=ex.job_id, state=state)
            return
        if ex.attempt is not None and ex.attempt != record.attempt - 1:
            self.log.warning(
                "exit.stale", job_id=ex.job_id, node_id=ex.node_id, attempt=ex.attempt,
                current=record.attempt - 1,
            )  # fmt: skip
            return
        if ex.node_id and ex.node_id not in record.nodes:
            self.log.warning("exit.stale", job_id=ex.job_id, node_id=ex.node_id)
            return
        # A job on several nodes ends when every part has exited 0, or at the first failure.
        if (
            ex.status == "completed"
            and ex.node_id
            and not self.table.part_exited(record, ex.node_id)
        ):
            if ex.steps_done is not None:  # rank 0's part: the job's progress as it ended
                self.table.report(record, StepsReport(ex.steps_done, req.now))
            return
        # (within what the scheduler has accounted of this run already)
        at = req.now if ex.ended_at is None else min(max(ex.ended_at, record.progress_at), req.now)
        self._end(record, at, ex)
        await self.emit(f"job.{record.state}", at, ex.job_id, reason=ex.reason)

    @staticmethod
    def _done_by_an_earlier_run(record: JobRecord, ex: JobExit) -> bool:
        """An earlier run of the job exited 0 (it finished just as it was stopped, and the
        scheduler had requeued it, perhaps relaunched it, before hearing of the exit)."""
        if ex.status != "completed" or ex.attempt is None:
            return False
        current = record.attempt - 1
        return (record.state == "queued" and ex.attempt <= current) or (
            record.state == "running" and ex.attempt < current
        )

    def _end(self, record: JobRecord, now: float, ex: JobExit) -> None:
        steps = ex.steps_done
        if steps is None and ex.status == "completed":
            steps = record.total_steps
        state: JobState = "failed"  # (not `stopped`)
        reason = ex.reason
        if ex.status == "completed":
            # (a replayed trace's recorded end: JobSpec.outcome)
            state = record.spec.outcome or "completed"
        elif ex.status == "timeout":
            state = "timeout"
            reason = f"time limit of {slurm_duration(record.spec.time_limit_s or 0.0)} reached"
        if self.table.end(record, now, state, reason, steps):
            record.exit_code = ex.exit_code
        self.released.append(record.job_id)
        self.dirty = self.dirty or self.policy.needs.decide_on_exit or self.table.queued > 0

    async def steps(self, req: StepsUpdate) -> SchedulerStatus:
        """The simclock's word on jobs' progress (`TickRequest.steps`), before a request that is
        not a tick."""
        self._simulated_progress(req.jobs)
        return self._status(req.now)

    def _simulated_progress(self, reports: dict[str, StepsReport]) -> None:
        """Simulated nodes' progress reports: the steps of the jobs their commands stopped, and of
        running jobs that fell behind their rate (restart pauses), from which their progress goes
        on. (A real cluster hears these in its nodes' command replies and heartbeats.)"""
        for job_id, report in reports.items():
            record = self.table.get(job_id)
            if record is not None:
                self.table.report(record, report)

    async def cluster_changed(self, req: ClusterChanged) -> SchedulerStatus:
        self.cluster = None
        self.dirty = True
        for job_id in req.lost_jobs:
            record = self.table.get(job_id)
            if record is not None:
                await self._requeue(req.now, record, NODE_LOST)
        ran = await self._round_if_due(req.now, req.tick)
        return self._status(req.now, ran_round=ran)

    async def tick(self, req: TickRequest) -> SchedulerStatus:
        if req.resolve:
            self.table.changed = self.force_decision = True
        self._tick_sent = -math.inf  # (wall clock: the next poke sends another)
        self._ticked.set()
        self._simulated_progress(req.steps)
        foreseen = self._foreseen(req)
        changes = CountsLog(self.table, req.now)
        ran, reached = await self._advance(
            req.now, True, req.until, changes, foreseen, (req.least_run_s, req.least_end)
        )
        return self._status(reached, ran_round=ran, changes=changes)

    def _foreseen(self, req: TickRequest | ExitReport) -> list[ExitReport]:
        """The exits a simulation's clock told of ahead (`TickRequest.foreseen`), as a report
        at each of their instants, the latest first."""
        if not req.foreseen:
            return []
        if not self.runs_ahead():
            raise BadRequest("exits are foreseen by a simulation's clock only", field="$.foreseen")
        last = req.now
        for i, instant in enumerate(req.foreseen):
            if req.until is None or not last < instant.at < req.until:
                raise BadRequest(
                    "exits foreseen go in time order, after now and before until",
                    field=f"$.foreseen[{i}].at",
                )
            last = instant.at
        return [ExitReport(now=f.at, exits=f.exits) for f in reversed(req.foreseen)]

    async def _round_if_due(self, now: float, tick: bool) -> bool:
        """The clock's tick: run the round if one is due at `now` (always, on wall-clock time)."""
        ran = False
        if tick and self.cadence.round_due(now, self.next_wake(now), self.last_round):
            await self.run_round(now)
            ran = True
        self._after(now)
        return ran

    async def _advance(
        self, now: float, tick: bool, until: float | None, changes: CountsLog,
        foreseen: list[ExitReport] | None = None,
        least: tuple[float | None, float | None] = (None, None),
    ) -> tuple[bool, float]:  # fmt: skip
        """`_go_on`, keeping back the applies that placement assured it would place as asked
        (`stages.py`): they are sent, in one request, before the clock hears of the instants."""
        self.stages.open = self.runs_ahead()
        try:
            ran, reached = await self._go_on(now, tick, until, changes, foreseen, least)
        finally:
            self.stages.open = False
        await self._flush_stages()
        return ran, reached

    async def _go_on(
        self, now: float, tick: bool, until: float | None, changes: CountsLog,
        foreseen: list[ExitReport] | None,
        least: tuple[float | None, float | None],
    ) -> tuple[bool, float]:  # fmt: skip
        """The tick at `now`: the jobs held for their arrival that it reaches join the queue, and
        the round runs if due. Then, where the clock asked (`until`) and may (`runs_ahead`), on
        to each held arrival before `until` (and to the exits the clock `foreseen`, at their
        instants: a stack, the latest first), one instant after another, as the clock would
        have told of them, while a decision changes nothing the clock must act on (no node
        command, no job ended) and no round is due sooner; with a `least` run or end, also
        through decisions that only start jobs, short of the soonest such a start could end
        (`TickRequest.least_run_s`). Returns whether a round ran at the instant reached, and
        that instant; `changes` logs the counts of those before it."""
        table = self.table

        def state() -> tuple[int, int, int, int]:
            """What a decision changes that the clock must act on."""
            return self.commands, table.finished, table.running, table.busy_gpus

        before = state()  # (the request's exits came before)
        if tick:
            await self._arrive(now, changes)
        with changes.at(now):
            ran = await self._round_if_due(now, tick)
        if not (tick and until is not None and self.runs_ahead()):
            return ran, now
        told = True  # `now` is an instant the clock tells of (its timeline has a point there)
        least_run, least_end = least
        bounded = least_run is not None or least_end is not None
        own_wakes = self.goes_through_own_wakes()
        while True:
            if state() != before:
                finished = before[1]
                if not (told and bounded and self.launched_only):
                    break
                if table.finished != finished:
                    break
                # (what started runs at least that long, and what arrives ends no sooner)
                if least_run is not None:
                    until = min(until, now + least_run)
                if least_end is not None:
                    until = min(until, least_end)
                before = state()
            times = [foreseen[-1].now] if foreseen else []
            if self.arriving:
                times.append(self.arriving[0][0])
            if (begins := table.begins.next_time()) is not None:
                times.append(begins)
            wake = self._own_wake(now)
            # (an arrival or exit the clock told of ahead: it vouches that nothing else it
            # knows of comes before, not even a job it has not submitted yet)
            vouched = bool(foreseen or self.arriving)
            if own_wakes and vouched and wake is not None and now < wake < min(times):
                # A wake of its own, before anything the clock tells of: the clock would tick
                # there alone and hear the same decision; one that changes nothing goes on.
                if wake >= until:
                    break
                now, told = wake, False
                changes.wakes.append(now)
                with changes.at(now):
                    ran = await self._round_if_due(now, True)
                continue
            if not times:
                break
            at = min(times)
            if at >= until or (wake is not None and wake < at):
                break
            now = at
            exits = foreseen.pop() if foreseen and foreseen[-1].now == at else None
            told = exits is not None or bool(self.arriving and self.arriving[0][0] == at)
            if exits is not None:
                for ex in exits.exits:
                    with changes.at(at):
                        await self._exit(exits, ex, ANONYMOUS)
                before = state()
            await self._arrive(now, changes)
            with changes.at(now):
                ran = await self._round_if_due(now, True)
        changes.now = now
        return ran, now

    async def _arrive(self, now: float, changes: CountsLog) -> None:
        """The jobs held for their arrival at or before `now` join the queue, at their time; then
        those whose begin time came (`JobSpec.begin_time`)."""
        arriving = self.arriving
        while arriving and arriving[0][0] <= now:
            at, spec, work = arriving.popleft()
            assert spec.job_id is not None
            self.arriving_ids.discard(spec.job_id)
            with changes.at(at):
                self.table.admit(spec, at, work)
            self.dirty = True
            await self.emit("job.queued", at, spec.job_id)
        if (begins := self.table.begins.next_time()) is not None and begins <= now:
            with changes.at(now):
                begun = self.table.begin(now)
            self.dirty = True
            for record in begun:  # (a held one stays held; one cancelled is told of as such)
                if record.state == "queued" and not record.hold:
                    await self.emit("job.released", now, record.job_id, reason="begin time came")

    def goes_through_own_wakes(self) -> bool:
        """Whether going on (`runs_ahead`), the scheduler also goes through its own wakes (its
        policy's: a demotion, a promotion, a starving job) while their decisions change nothing
        the clock acts on: in events mode, with decisions of allocations (time shares keep
        rounds of their own; rounds and slots decide at the clock's round instants)."""
        return self.config.mode == "events" and self.policy.mechanism != "time_shares"

    def runs_ahead(self) -> bool:
        """Whether a clock may submit jobs ahead of their arrival and have us go on through them
        (`SchedulerStatus.runs_ahead`): at every event, as the clock tells of it, with nothing
        stored and no decision on declined arrivals (those the clock would tell of alone)."""
        return (
            self.config.mode in ("events", "rounds")
            and self.config.clock == "external"
            and not self.store.durable
            and not self.policy.needs.decide_on_arrival
        )

    async def list_jobs(self, req: PageQuery, caller: Caller = ANONYMOUS) -> JobsPage:
        page = list(self.table.jobs.values())[req.offset : req.offset + req.limit]
        return JobsPage(jobs=shown_to(caller, page), total=len(self.table))

    async def finished_page(self, req: FinishedQuery) -> FinishedPage:
        """The jobs that ended from `req.taken` on; those before are forgotten where the results
        are handed over (`SchedulerConfig.hand_over_results`)."""
        table = self.table
        forgets = (
            self.config.hand_over_results
            and not self.policy.needs.finished_jobs
            and not self.store.durable
        )
        if forgets:
            table.forget_ended(req.taken, remember=self.config.remember_ended)
        start = req.taken - table.ended_base
        if start < 0:
            raise BadRequest(
                f"the first {table.ended_base} jobs that ended were taken and forgotten",
                field="$.taken",
            )
        return FinishedPage(
            jobs=table.ended[start : start + req.limit], total=table.ended_base + len(table.ended),
            forgets=forgets,
        )  # fmt: skip

    async def status_request(self, _: Empty) -> SchedulerStatus:
        """Counts and the wake-up time, as they are."""
        return self._status(self.last_round or 0.0)

    async def query(self, req: JobQuery, caller: Caller = ANONYMOUS) -> JobsPage:
        """Jobs by id and/or state, in admission order; with the caller's time, when a job
        admitted then would first be decided on."""
        if req.job_ids:
            table = self.table
            found = [r for j in req.job_ids if (r := table.get(j)) is not None]
            if arrays := set(req.job_ids) - table.jobs.keys():  # (an array's id: its tasks)
                found += [r for r in table.jobs.values() if r.spec.array is not None
                          and r.spec.array.array_id in arrays]  # fmt: skip
        elif req.states and set(req.states) <= {"queued", "running"}:
            found = list(self.table.active.values())  # admission asks this often: no full scan
            # (held, blocked and array tasks over their limit: waiting too; stopping: running
            # until their nodes say they stopped)
            table = self.table
            if others := [
                *table.held.values(),
                *table.deps.blocked.values(),
                *table.arrays.records(),
                *table.begins.records(),
                *table.stopping.values(),
            ]:
                found = sorted([*found, *others], key=lambda r: r.seq)
        else:
            found = list(self.table.jobs.values())
        if req.states:
            states = set(req.states)
            found = [r for r in found if r.state in states]
        shown = found[req.offset : req.offset + req.limit]
        if req.reasons:
            shown = [self._with_reason(r) for r in shown]
        page = JobsPage(jobs=shown_to(caller, shown), total=len(found))
        own_clock = self.config.mode == "clock" or self.policy.mechanism == "time_shares"
        if req.now is not None and not own_clock:
            page.next_decision = self.cadence.decides(req.now, self.last_round)
        return page

    def _with_reason(self, record: JobRecord) -> JobRecord:
        """A waiting job that never started, with the reason that holds it now (`JobQuery.
        reasons`): the policy's (`QuotaExceeded`), else GPUs enough of a type it can use are
        free (`Priority`), or not (`Resources`)."""
        if record.state != "queued" or record.reason or record.attempt or self.cluster is None:
            return record
        if said := self.policy.waiting_reason(record):
            return msgspec.structs.replace(record, reason=said)
        spec, capacity, busy = record.spec, self.cluster.capacity, self.table.busy_by_type
        types = [t for t in capacity if spec.allows(t)]
        free = max((1000 * capacity.get(t, 0) - busy.get(t, 0) for t in types), default=0)
        need = spec.milli(spec.gpu_range[0])
        return msgspec.structs.replace(record, reason="Priority" if free >= need else "Resources")

    async def cancel(self, req: CancelRequest, caller: Caller = ANONYMOUS) -> CancelReply:
        """End jobs for good: those named, or those the filters choose. A running one is left
        out of the next allocation: placement stops it. A submitter cancels only their own
        jobs."""
        now = req.now if req.now is not None else time.time()
        cancelled: list[str] = []
        refused: dict[str, str] = {}
        for record in self._changeable(req.job_ids or self._chosen(req, caller), caller, refused):
            job_id = record.job_id
            why = "cancelled by request" if caller == ANONYMOUS else f"cancelled by {caller}"
            if record.cancelling:  # (asked again: it is being cancelled)
                cancelled.append(job_id)
                continue
            if record.requeueing:
                refused[job_id] = "it is being requeued: cancel it once it waits again"
                continue
            if agents := await self._agents_running(record):
                # Cancelled once its agents said its processes are gone (or were lost, so they
                # stopped them): never shown cancelled while its ranks still run.
                self.table.cancel_running(record, now, why, agents)
                self.dirty = True
                cancelled.append(job_id)
                self.log.info("job.cancelling", job_id=job_id, nodes=agents, reason=why)
                continue
            if not self.table.end(record, now, "cancelled", why):
                refused[job_id] = f"the job has already ended ({record.state})"
                continue
            self.dirty = True
            cancelled.append(job_id)
            await self.emit("job.cancelled", now, job_id, reason=why)
        self._poke()
        return CancelReply(cancelled=cancelled, refused=refused)

    def _changeable(
        self, job_ids: list[str], caller: Caller, refused: dict[str, str]
    ) -> Iterator[JobRecord]:
        """The jobs named (an array's id: its tasks) that `caller` may change; each other one
        goes into `refused`, with why, in turn (the replies list them in the order asked)."""
        for job_id in self._tasks(job_ids):
            record = self.table.get(job_id)
            why = "no such job" if record is None else may_change(record, caller)
            if record is None or why is not None:
                refused[job_id] = why or "no such job"
            else:
                yield record

    def _tasks(self, job_ids: list[str]) -> list[str]:
        """The jobs named, an array's id standing for its tasks that have not ended."""
        table = self.table
        found: list[str] = []
        for job_id in job_ids:
            tasks = [] if job_id in table.jobs else [
                r.job_id for r in sorted(table.not_ended(), key=lambda r: r.seq)
                if r.spec.array is not None and r.spec.array.array_id == job_id
            ]  # fmt: skip
            found += tasks or [job_id]
        return found

    def _chosen(self, req: CancelRequest, caller: Caller) -> list[str]:
        """The jobs not ended that `req`'s filters choose (a user's: their own, whatever
        `req.user` says), in admission order."""
        if req.user is None and not req.states:
            raise BadRequest("name the jobs, or choose them by user or state", field="$.job_ids")
        user = caller.name if caller.role == "user" else req.user
        states = set(req.states or ("queued", "running"))
        found = list(self.table.not_ended())
        return [
            r.job_id
            for r in sorted(found, key=lambda r: r.seq)
            if r.state in states and (user is None or r.spec.user == user)
        ]

    async def _resolved(self) -> None:
        """Events for the jobs a job's start or end released (their dependencies hold) or
        cancelled (they never can)."""
        resolved, self.table.resolved = self.table.resolved, []
        for record, at in resolved:
            if record.state == "cancelled":
                await self.emit("job.cancelled", at, record.job_id, reason=record.reason)
            else:
                await self.emit("job.released", at, record.job_id, reason="dependency satisfied")
        self.dirty = True
        self._poke()

    async def hold(self, req: HoldRequest, caller: Caller = ANONYMOUS) -> DoneReply:
        """Hold waiting jobs (they start no more: `JobHeldUser` by their owner, `JobHeldAdmin`
        by an operator or a service), or release them (`req.release`): a user releases only
        their own hold."""
        now = req.now if req.now is not None else time.time()
        by: Hold = "user" if caller.role == "user" else "admin"
        done: list[str] = []
        refused: dict[str, str] = {}
        for record in self._changeable(req.job_ids, caller, refused):
            job_id = record.job_id
            if req.release:
                if not record.hold or record.requeueing:
                    refused[job_id] = "it is not held"
                    continue
                if record.hold == "admin" and by == "user":
                    refused[job_id] = "held by an operator: only an operator releases it"
                    continue
                self.table.release(record)
                await self.emit("job.released", now, job_id, reason=f"released by {caller}")
            elif record.state != "queued" or record.requeueing:
                refused[job_id] = (
                    f"it is {record.state}: only a waiting job is held (requeue --hold stops "
                    "a running one and holds it)"
                )
                continue
            elif record.hold != "admin":  # (an operator's hold stays: the user's adds nothing)
                self.table.hold(record, by)
                await self.emit("job.on_hold", now, job_id, reason=record.reason)
            done.append(job_id)
            self.dirty = True
        self._poke()
        return DoneReply(done=done, refused=refused)

    async def requeue(self, req: RequeueRequest, caller: Caller = ANONYMOUS) -> DoneReply:
        """Running jobs stop, as a preemption stops them, and wait again (held too, with
        `req.hold`); a waiting job named with `hold` is held. On a real cluster a job waits again
        once its node agents say its parts stopped (it shows as running until then)."""
        now = req.now if req.now is not None else time.time()
        by: Hold = ("user" if caller.role == "user" else "admin") if req.hold else ""
        done: list[str] = []
        refused: dict[str, str] = {}
        for record in self._changeable(req.job_ids, caller, refused):
            job_id = record.job_id
            if record.cancelling or record.requeueing:
                refused[job_id] = "it is already stopping"
                continue
            if record.state == "queued" and by:
                if record.hold != "admin":
                    self.table.hold(record, by)
                    await self.emit("job.on_hold", now, job_id, reason=record.reason)
            elif record.state != "running":
                refused[job_id] = f"it is {record.state}: only a running job is requeued"
                continue
            elif agents := await self._agents_running(record):
                reason = "requeued by request" if caller == ANONYMOUS else f"requeued by {caller}"
                self.table.requeue_running(record, now, reason, agents, by)
                self.log.info("job.requeueing", job_id=job_id, nodes=agents, reason=reason)
            else:  # (a simulation's nodes, or nodes no agent runs: none to wait for)
                refused[job_id] = "it runs on no node agent: nothing to stop and requeue"
                continue
            done.append(job_id)
            self.dirty = True
        self._poke()
        return DoneReply(done=done, refused=refused)

    # ------------------------------------------------------------------ real clusters

    async def _agents_running(self, record: JobRecord) -> list[str]:
        """The node agents a running job's parts run on, on a real cluster (a simulation's
        nodes, and nodes no agent runs, stop a job as they are told)."""
        if self.config.clock != "wall" or record.state != "running" or not record.nodes:
            return []
        if self.cluster is None:
            self.cluster = await self._placement(CLUSTER, Empty())
        agents = {n.node_id for n in self.cluster.nodes if n.labels.get("boot")}
        return [n for n in record.nodes if n in agents]

    async def _part_stopped(self, record: JobRecord, node_id: str, now: float) -> None:
        if self.table.part_stopped(record, node_id, now):
            self.dirty = True
            if record.state == "queued":
                await self.emit("job.requeued", now, record.job_id, reason=record.reason)
                if record.hold:
                    await self.emit("job.on_hold", now, record.job_id, reason=record.reason)
                self._poke()
            else:
                await self.emit("job.cancelled", now, record.job_id, reason=record.reason)

    def _poke(self) -> None:
        """Wall clock: something changed, tick now rather than at the next round."""
        if self._ticker is not None:
            self._wake.set()

    async def _node_event(self, msg: Any) -> None:
        """Wall clock: a node came or went (`evt.node.*`): refresh the cluster, decide again soon.

        Jobs on a lost node come back in the next apply's `lost` and are requeued there; jobs
        being cancelled there are cancelled (a node is declared lost once its agent fenced it).
        """
        if msg.subject.endswith(".node.lost") and self.table.stopping:
            with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
                event = msgspec.json.decode(msg.data, type=Event)
                for record in list(self.table.stopping.values()):
                    if event.node_id in record.nodes:
                        await self._part_stopped(record, event.node_id, time.time())
        self.cluster = None
        self.dirty = True
        self._poke()

    # ------------------------------------------------------------------ the round

    async def run_round(self, now: float) -> None:
        self._round_at = time.monotonic()
        self.launched_only = False
        if self.cluster is None:
            self.cluster = await self._placement(CLUSTER, Empty())
        cluster = self.cluster  # (a node event may drop `self.cluster` while we wait below)
        # Durable: what the request changed so far (exits, the released list) is written before
        # the policy decides and placement acts, so a restart between the apply and our next
        # write reconciles only what the apply itself did, and decides again from the same state.
        await self.persist()
        inp = self._input(now, cluster, changed=self._feed())
        decision: Decision | None = None
        changed = self.table.changed or self._learned_since_decision()
        if self.force_decision or self.mechanism.wants_decision(now, changed):
            self.policy_fed = False  # (until it answered)
            decision = await self._decide(inp)
            self.policy_fed = True
            self._since_apply.update(self.table.moved)
            self.table.moved.clear()
            self.table.changed = self.force_decision = False
            if isinstance(self.model, LearnedThroughputs):
                self.decided_with = self.model.version
        lease_ends: float | None = None
        if decision is not None and decision.keep_running:
            self.decisions_of_changes += 1
            allocations, reply = await self._apply_changes(now, cluster, decision, inp)
        else:
            allocations = self._checked(self.mechanism.allocations(decision, inp), cluster)
            allocations, lease_ends = self._guarded(now, allocations, cluster.capacity)
            reply = await self._apply_all(now, cluster, allocations)
        active = self.table.active
        cluster.capacity = reply.capacity
        for job_id, steps in reply.progress.items():
            record = active.get(job_id)
            if record is None:
                continue
            if steps.profile is not None:  # (a real adaptive job's measurements)
                self.batches.observe(record, steps.profile)
            rate = self.table.report(record, steps)
            if rate is not None and isinstance(self.model, LearnedThroughputs):
                assert record.gpu_type is not None
                self.model.observe(record.spec.job_type, record.gpu_type, record.gpus, rate)
        # Jobs whose node left before this decision (a real cluster hears of it here, not
        # before the round as a simulation does): they wait again, and are decided on at once,
        # not a round later (placement left them out of this apply).
        relost = False
        for job_id in reply.lost:
            if (record := active.get(job_id)) is not None and record.state == "running":
                await self._requeue(now, record, reply.lost_why.get(job_id, NODE_LOST))
                relost = True
        resized = set(reply.stopped) & reply.started.keys()  # stopped and relaunched at once
        for job_id in reply.stopped:
            if job_id not in resized and (record := active.get(job_id)) is not None:
                why = (decision.reasons.get(job_id) if decision is not None else None) or (
                    self._preempted_for(record, reply.started, reply.placed)
                )
                await self._requeue(now, record, why, reply.progress.get(job_id))
        unplaced = set(reply.unplaced)
        for a in allocations:  # (its type tried: a type-agnostic walk tries another first)
            record = active.get(a.job_id) if a.job_id in unplaced else None
            if record is not None and a.gpu_type != ANY_GPU:
                self.table.unplaced(record, a.gpu_type)
        sharing = {a.job_id: a.share_with for a in allocations if a.share_with}
        for job_id, gpu_type in reply.started.items():
            record = active[job_id]
            gpus = reply.placed[job_id]
            partner = sharing.get(job_id)
            rate = self._rate(record, gpu_type, len(gpus), partner)
            nodes = [g.node_id for g in gpus if g != UNKNOWN_GPU]  # (a stage's: not yet known)
            was_resized = self.table.start(record, now, nodes, len(gpus), gpu_type, rate, partner)
            if (batch := self.batches.chosen.get(job_id)) is not None:
                self.table.told_batch(record, now, batch.batch_size)
            kind = "job.resized" if was_resized else "job.started"
            await self.emit(kind, now, job_id, gpus=gpus)
        if self.batches.said:  # (what is kept of the jobs that ended goes)
            self.batches.forget(self.table.active)
        self.last_round = now
        if self.cadence.origin is None:  # the first decision starts the grid of rounds
            self.cadence = dataclasses.replace(self.cadence, origin=now)
        self.dirty = relost
        # When to decide again with time alone, from the jobs as this round left them.
        # (The views read their records live: this round's changes show through the same views;
        # only the capacity is new.)
        wake = self.policy.next_decision_time(
            self._input(now, cluster, inp.jobs, inp.finished, inp.changed)
        )
        if wake is not None and wake <= now:  # "again, now" would never end: a policy's bug
            self.log.warning("policy.wake_in_the_past", policy=self.policy_name, wake=wake)
            wake = None
        if lease_ends is not None:  # the guard held a decision back: decide again when it ends
            wake = lease_ends if wake is None else min(wake, lease_ends)
        self.policy_wake = wake

    async def _apply(
        self, now: float, cluster: ClusterInfo, allocations: list[Allocation], launches: Launches
    ) -> ApplyReply:
        """Have placement run `allocations`: told as what changed since the last apply where it
        can be (`ApplyRequest.base`), else in full (and in full again if placement refuses the
        base: it restarted without its state)."""
        await self._flush_stages()  # (this apply's base is the last of them)
        last, self._applied = self._applied, None
        by_job = {a.job_id: a for a in allocations}
        sharing = any(a.share_with for a in allocations)
        specs, attempts = launches.specs, launches.attempts
        request = ApplyRequest(
            now=now, allocations=allocations, specs=specs, released=self.released,
            attempts=attempts, time_left=launches.time_left, batches=launches.batches,
        )  # fmt: skip
        # (Jobs sharing GPUs, now or before, are placed with their partners: every allocation.
        # A durable simulation's scheduler, restarted, sends the request in hand again: in full.)
        if (
            last is not None and last.number and not cluster.rearranges and not sharing
            and not last.sharing and not (self.config.durable and self.config.clock == "external")
        ):  # fmt: skip
            previous = last.allocations
            changed = [a for a in allocations if a.job_id in specs or previous.get(a.job_id) != a]
            delta = msgspec.structs.replace(
                request, allocations=changed, base=last.number,
                stop=[j for j in previous if j not in by_job], **launches.of(changed),
            )  # fmt: skip
            if (reply := await self._apply_delta(delta)) is not None:
                self._applied = LastApply(cluster, by_job, reply.settled, reply.applied, False)
                return self._done(reply)
        reply = await self._placement(APPLY, request)
        self._applied = LastApply(cluster, by_job, reply.settled, reply.applied, sharing)
        return self._done(reply)

    async def _apply_delta(self, request: ApplyRequest) -> ApplyReply | None:
        """Placement's reply to an apply of what changed (`ApplyRequest.base`); None when it
        refused the base (it restarted without its state): send every allocation then."""
        try:
            return await self._placement(APPLY, request)
        except RemoteError as exc:
            if exc.reply.field != "$.base":
                raise
            self.log.info("apply.in_full", why=exc.reply.error)
            return None

    def _done(self, reply: ApplyReply) -> ApplyReply:
        """After an apply: the jobs released are freed; what may no longer hold starts afresh."""
        self.released = []
        self.commands = max(self.commands, reply.commands)
        self._since_apply = dict.fromkeys(reply.unplaced)
        self.stages.assured = reply.assures_fit
        return reply

    async def _flush_stages(self) -> None:
        """Send the applies kept back (`stages.py`), in one request; then the jobs they started
        get their nodes, and the events held are published. Not sent (an error): they stay
        kept back, for the next request to placement."""
        staged, events = self.stages.take()
        if not staged:
            return
        try:
            replies = await self._send_stages(staged)
        except BaseException:
            self.stages.put_back(staged, events)
            raise
        placed, undone = Stages.placed(staged, replies)
        for job_id, gpus in placed.items():
            if (record := self.table.active.get(job_id)) is not None:
                self.table.placed(record, (g.node_id for g in gpus))
        final = replies[-1]
        if (last := self._applied) is not None:
            for job_id in undone:  # (not running there: no longer allocated)
                last.allocations.pop(job_id, None)
            self._applied = dataclasses.replace(last, number=final.applied)
        if self.cluster is not None:
            self.cluster.capacity = final.capacity
        self.commands = max(self.commands, final.commands)
        self.stages.assured = final.assures_fit  # (the releases since stay to be sent)
        for event in Stages.with_gpus(events, placed):
            await self.bus.emit(event)
        if undone:  # (they wait again, from their stage's instant)
            self.log.warning(
                "stages.not_run", jobs=list(undone)[:5], count=len(undone),
                why="placement did not run jobs as staged although its reply before assured it "
                "would (`assures_fit`): its policy's `places_what_fits` is wrong, or the "
                "cluster changed since (a drain, a policy swapped in during a simulation)",
            )  # fmt: skip
            for job_id, (at, why) in undone.items():
                if (record := self.table.active.get(job_id)) is not None:
                    await self._requeue(at, record, why)
            self._after(staged[-1].request.now)

    async def _flushed(self) -> LastApply:
        """The last apply once the stages kept back are sent (`_flush_stages`)."""
        await self._flush_stages()
        assert self._applied is not None  # (a stage is an apply of what changed since the last)
        return self._applied

    async def _send_stages(self, staged: list[Staged]) -> list[ApplyReply]:
        """Placement's replies to the stages: in one request; where it refuses the first base
        (it restarted without its state), one by one, each it refuses with every allocation as
        of that stage (the stages' own launches carry their specs), as a single apply would."""
        try:
            request = ApplyStages(stages=[s.request for s in staged])
            return (await self._placement(APPLY_STAGES, request)).replies
        except RemoteError as exc:
            if exc.reply.field != "$.base":
                raise
            self.log.info("apply.in_full", why=exc.reply.error)
        assert self._applied is not None  # (a stage is an apply of what changed since the last)
        allocations = self._applied.allocations
        launched = {j: spec for stage in staged for j, spec in stage.request.specs.items()}
        replies: list[ApplyReply] = []
        for k, stage in enumerate(staged):
            base = replies[-1].applied if replies else 0
            if base:
                try:
                    again = msgspec.structs.replace(stage.request, base=base)
                    replies.append(await self._placement(APPLY, again))
                    continue
                except RemoteError as exc:
                    if exc.reply.field != "$.base":
                        raise
            whole = Stages.whole_as_of(staged, k, allocations)
            specs = {a.job_id: spec for a in whole if (spec := self._spec_of(a.job_id, launched))}
            full = msgspec.structs.replace(
                stage.request, base=0, stop=[], allocations=whole, specs=specs
            )
            replies.append(await self._placement(APPLY, full))
        return replies

    def _spec_of(self, job_id: str, launched: dict[str, JobSpec]) -> JobSpec | None:
        """The spec a full apply carries for `job_id`: a staged launch's, or a waiting job's."""
        if (spec := launched.get(job_id)) is not None:
            return spec
        record = self.table.active.get(job_id)
        return record.spec if record is not None and record.state != "running" else None

    async def _apply_all(
        self, now: float, cluster: ClusterInfo, allocations: list[Allocation]
    ) -> ApplyReply:
        """Run every allocation (placement is told what changed where it can be)."""
        launches = self._launches(allocations, now, cluster)
        if self._confirms_what_runs(cluster, allocations, launches.specs):
            return _nothing_done(cluster)
        return await self._apply(now, cluster, allocations, launches)

    def _launches(
        self, allocations: list[Allocation], now: float, cluster: ClusterInfo
    ) -> Launches:
        """The specs of the allocated jobs that do not run, and every allocated job's attempt:
        every launch carries its attempt number, a running job's too (placement relaunches it when
        it resizes or moves it), so that its exit is not taken for an earlier run's; the time
        left to those with a time limit, as of `now`; and the batch of each adaptive one, on
        its allocation (as the attempt: a running one is relaunched when resized or moved)."""
        active = self.table.active
        launches = Launches({}, {}, {}, self.batches.choose(allocations, active, cluster))
        for a in allocations:
            record = active[a.job_id]
            if record.state != "running":
                launches.specs[a.job_id] = record.spec
            if record.attempt:
                launches.attempts[a.job_id] = record.attempt
            if (limit := record.spec.time_limit_s) is not None:
                ran = record.executed_time + (
                    now - record.run_start if record.state == "running" else 0.0
                )
                launches.time_left[a.job_id] = max(limit - ran, 0.0)
        return launches

    async def _apply_changes(
        self, now: float, cluster: ClusterInfo, decision: Decision, inp: SchedulingInput
    ) -> tuple[list[Allocation], ApplyReply]:
        """A decision of what changes (`Decision.keep_running`), applied as one: the running jobs
        it does not name keep their GPUs, and placement hears what changed since its last apply
        (every allocation where it cannot be told so: jobs that share GPUs, a placement restarted
        without its state). It costs what the decision names, not what runs. Returns the
        allocations named and placement's reply."""
        last = self._applied
        if inp.changed is None or last is None:
            raise RuntimeError(
                f"policy {self.policy_name!r} kept running jobs (keep_running) in a decision "
                "that was not told what changed"
            )
        if any(a.share_with for a in decision.allocations):
            whole = self._checked(
                made_whole(decision, last.allocations, self.table.active), cluster
            )
            return whole, await self._apply_all(now, cluster, whole)
        active = self.table.active
        named_ids = {a.job_id for a in decision.allocations}
        stop = [
            j for j in dict.fromkeys(decision.stop)
            if j not in named_ids and (r := active.get(j)) is not None and r.state == "running"
        ]  # fmt: skip
        used = dict(self.table.busy_by_type)  # (what the jobs kept hold)
        for job_id in (*named_ids, *stop):
            r = active.get(job_id)
            if r is not None and r.state == "running" and r.shares_with is None and r.gpu_type:
                used[r.gpu_type] -= r.spec.milli(r.gpus)
        named = self._checked(decision.allocations, cluster, used)
        if len(named) < len(named_ids):  # left out (it cannot run there): a running one stops
            left_out = named_ids.difference(a.job_id for a in named)
            stop += [j for j in left_out if active[j].state == "running"]
        launches = self._launches(named, now, cluster)
        specs = launches.specs
        previous = last.allocations
        released = set(self.released)
        stale = [
            j for j in self._since_apply
            if j in previous and j not in named_ids and j not in released
            and ((r := active.get(j)) is None or r.state != "running")
        ]  # fmt: skip
        changed = [a for a in named if a.job_id in specs or previous.get(a.job_id) != a]
        if (
            not stop and not stale and not changed
            and self.config.clock == "external" and last.cluster is cluster
        ):  # fmt: skip
            return named, _nothing_done(cluster)  # (as `_confirms_what_runs`)
        if self.stages.full():  # (those kept back make a request big enough: they go now)
            last = await self._flushed()
        staging = (
            last.cluster is cluster and not self.policy.needs.job_nodes
            and self.stages.can_stage(
                changed, specs, stops=bool(stop or stale), limited=launches.time_left,
                adaptive=bool(launches.batches),
            )
        )  # fmt: skip
        if not staging and self.stages.staged:
            last = await self._flushed()  # (this apply's base is the last of them)
        request = ApplyRequest(
            now=now, allocations=changed, specs=specs, released=self.released,
            base=last.number, stop=stop + stale, **launches.of(changed),
        )  # fmt: skip
        if staging:
            releasing = {j: a for j in self.released if (a := last.allocations.get(j)) is not None}
            staged: ApplyReply | None = self.stages.stage(
                request, releasing, cluster.capacity, self.commands
            )
        else:
            self._applied = None  # (until placement answered)
            staged = await self._apply_delta(request)
        if (reply := staged) is None:
            kept = msgspec.structs.replace(decision, allocations=named, stop=stop)
            whole = made_whole(kept, last.allocations, self.table.active)
            return whole, await self._apply(
                now, cluster, whole, self._launches(whole, now, cluster)
            )
        allocations = last.allocations  # (what runs now, in the order of `made_whole`)
        for job_id in (*stop, *stale, *self.released):
            allocations.pop(job_id, None)
        for a in named:
            allocations.pop(a.job_id, None)
            allocations[a.job_id] = a
        self._applied = LastApply(cluster, allocations, reply.settled, reply.applied, False)
        self.launched_only = (
            not stop and not stale and not reply.stopped and not reply.unplaced
            and not reply.lost and all(a.job_id in specs for a in changed)
            and not any(job_id in launches.time_left for job_id in specs)
        )  # fmt: skip
        return named, self._done(reply)

    def _confirms_what_runs(
        self, cluster: ClusterInfo, allocations: list[Allocation], specs: dict[str, JobSpec]
    ) -> bool:
        """A simulation's apply would change nothing, so none is sent: the allocations of the
        last apply (in any order), less the jobs that ended since, on the same cluster, no job to
        launch, and a placement that keeps running jobs where they are (one that does not
        rearrange, or one settled where the last apply left them). Such decisions are common: an
        arrival that waits behind a long queue, a job that ended, the same allocations in another
        order. The ended jobs' release waits for the next apply, which frees their GPUs before it
        places anything, as this one would have. A real cluster applies every decision: the reply
        brings the heartbeats' progress and lost jobs."""
        last = self._applied
        if not (
            self.config.clock == "external"
            and last is not None
            and last.cluster is cluster
            and (not cluster.rearranges or last.settled)
            and not specs
        ):
            return False
        applied = last.allocations
        if self.released:
            ended = set(self.released)
            applied = {job_id: a for job_id, a in applied.items() if job_id not in ended}
        return len(allocations) == len(applied) and {a.job_id: a for a in allocations} == applied

    def _learned_since_decision(self) -> bool:
        """The model learned from progress since the policy last decided, and that counts as a
        change (`TimeShareConfig.resolve_on_learning`)."""
        return (
            self.config.time_shares.resolve_on_learning
            and isinstance(self.model, LearnedThroughputs)
            and self.model.version != self.decided_with
        )

    def _feed(self) -> dict[str, JobView | None] | None:
        """What changed since the policy's last decision (`SchedulingInput.changed`), where the
        scheduler can take a decision of what changes (`Decision.keep_running`): the policy saw
        every change since it came, the last apply is known (the jobs kept run as it left them),
        and what runs follows the policy's allocations as they are (no time shares, no
        preemption guard, no placement that moves running jobs, no jobs sharing GPUs), and no
        restart of a durable simulation must decide again exactly as before."""
        last = self._applied
        if not (
            self.policy_fed
            and last is not None
            and not last.cluster.rearranges
            and not last.sharing
            and isinstance(self.mechanism, AllocationsMechanism)
            and self.config.min_run_s <= 0
            and not (self.config.durable and self.config.clock == "external")
        ):
            return None
        views = self.table.views
        return {job_id: views.get(job_id) for job_id in self.table.moved}

    def _input(
        self, now: float, info: ClusterInfo, jobs: Sequence[JobView] | None = None,
        finished: list[JobView] | None = None, changed: dict[str, JobView | None] | None = None,
    ) -> SchedulingInput:  # fmt: skip
        """The policy's input at `now`; `jobs` and `finished`: views of the same records at the
        same instant, to reuse (thousands of jobs in a long queue, twice a round)."""
        nodes: list[NodeStatus] = []
        if self.policy.needs.nodes:  # (once per cluster answer: thousands of nodes in a replay)
            if self._node_list is None or self._node_list[0] is not info:
                self._node_list = (info, self._nodes(info))
            nodes = list(self._node_list[1])
        cluster = ClusterView(
            capacity=dict(info.capacity), round_s=self.config.round_s, nodes=nodes,
            throughputs=self.model,
        )  # fmt: skip
        context = self.table.context
        context.now, context.round_s, context.model = now, self.config.round_s, self.model
        if finished is None:
            finished = []
            if self.policy.needs.finished_jobs:
                finished = [
                    JobView.of(r, context)
                    for r in self.table.jobs.values()
                    if r.end_time is not None
                ]
        if jobs is None:
            jobs = JobList(self.table.views)
        return SchedulingInput(
            now=now, jobs=jobs, cluster=cluster, finished=finished, changed=changed
        )

    def _nodes(self, info: ClusterInfo) -> list[NodeStatus]:
        """The node views, reusing those of nodes that did not change (node replays list
        thousands, most of them as they were at the last decision)."""
        known = self._node_views
        views: list[NodeStatus] = []
        for n in info.nodes:
            view = known.get(n.node_id)
            if (
                view is None
                or not view.up
                or (view.gpu_type, view.num_gpus) != (n.gpu_type, n.num_gpus)
            ):
                view = known[n.node_id] = NodeStatus(n.node_id, n.gpu_type, n.num_gpus)
            views.append(view)
        for node_id, t in info.down.items():
            view = known.get(node_id)
            if view is None or view.up or view.down_since != t:
                view = known[node_id] = NodeStatus(node_id, "", 0, False, t)
            views.append(view)
        return views

    def _rate(
        self, record: JobRecord, gpu_type: str, gpus: int, partner: str | None = None
    ) -> float:
        """The steps/s of a run, from the throughput model (space sharing: the pair's figure)."""
        job_type = record.spec.job_type
        if partner is not None and (other := self.table.get(partner)) is not None:
            return self.model.colocated(job_type, other.spec.job_type, gpu_type, gpus)[0]
        return self.model.throughput(job_type, gpu_type, gpus)

    async def _decide(self, inp: SchedulingInput) -> Decision:
        decision, took = await self.offload.run(self.policy.schedule, inp)
        self.policy_s += took
        self.decision_s.append(took)
        return decision if isinstance(decision, Decision) else Decision(allocations=decision)

    def _runs_there(self, record: JobRecord, a: Allocation, capacity: dict[str, int]) -> bool:
        """The job may use `a`'s GPU type and has throughput there (for any type: every type
        with GPUs that it allows, and there is one)."""
        spec = record.spec
        if a.gpu_type != ANY_GPU:
            types = [a.gpu_type] if spec.allows(a.gpu_type) else []
        else:
            types = [t for t in capacity if capacity[t] and spec.allows(t)]
        job_type = spec.job_type
        return bool(types) and all(
            self.model.throughput(job_type, t, a.num_gpus) > 0 for t in types
        )

    def _checked(
        self, allocations: list[Allocation], cluster: ClusterInfo, used: dict[str, int] | None = None,
    ) -> list[Allocation]:  # fmt: skip
        """The policy's allocations as they can run (`guard.check`) on `cluster` (the round's: a
        node event may have dropped `self.cluster` since), with the GPUs `used` per type by the
        jobs it does not name; those left out (the job cannot run there) with a warning."""
        capacity = cluster.capacity

        def runs_there(record: JobRecord, a: Allocation) -> bool:
            return self._runs_there(record, a, capacity)

        kept, left_out = check(
            self.policy_name or "", allocations, self.table.active, capacity, runs_there, used
        )
        for a in left_out:
            self.log.warning(
                "allocation.unsupported", job_id=a.job_id, gpu_type=a.gpu_type,
                gpus=a.num_gpus, policy=self.policy_name,
            )  # fmt: skip
        return kept

    def _preempted_for(
        self, record: JobRecord, started: dict[str, str], placed: dict[str, list[GpuRef]]
    ) -> str:
        """Why a running job was stopped: for the jobs this round started on its nodes (or, if
        none, on its GPU type), as the policy decided."""
        mine = set(record.nodes)
        took = [j for j in started if mine.intersection(g.node_id for g in placed.get(j, []))]
        took = took or [j for j, t in started.items() if t == record.gpu_type]
        if not took:
            return f"preempted by {self.policy_name}"
        shown = ", ".join(took[:3]) + (f" and {len(took) - 3} more" if len(took) > 3 else "")
        return f"preempted by {self.policy_name} for {shown}"

    def _guarded(
        self, now: float, allocations: list[Allocation], capacity: dict[str, int]
    ) -> tuple[list[Allocation], float | None]:
        """The preemption guard (`min_run_s`, `guard.hold_leases`): the allocations and, if the
        guard changed the decision, when the first lease it held ends."""
        if self.config.min_run_s <= 0:
            return allocations, None
        running = (r for r in self.table.active.values() if r.state == "running")
        out, lease_ends = hold_leases(now, allocations, capacity, running, self.config.min_run_s)
        if lease_ends is not None:
            self.log.debug("lease.held", until=lease_ends)
        return out, lease_ends

    async def _requeue(
        self, now: float, record: JobRecord, reason: str, report: StepsReport | None = None
    ) -> None:
        if self.table.requeue(record, now, reason, report):
            self.dirty = True
            await self.emit("job.preempted", now, record.job_id, reason=reason)

    # ------------------------------------------------------------------ time

    def next_wake(self, now: float) -> float | None:
        """When the next tick is due, or None when nothing can change until the next event: the
        next round, the decision on a job submitted ahead of its arrival (at its arrival, or at
        the round it is decided in: it joins the queue at its own time with the tick then), or
        the earliest begin time of a job waiting for it (`JobSpec.begin_time`), whichever is
        first."""
        times = [t for t in (self._own_wake(now), self.table.begins.next_time()) if t is not None]
        if self.arriving:
            times.append(self.cadence.decides(self.arriving[0][0], self.last_round))
        return min(times, default=None)

    def _own_wake(self, now: float) -> float | None:
        """When the next round is due (None: not until something happens)."""
        if self.config.mode != "clock" and self.policy.mechanism == "time_shares":
            return self.mechanism.next_round(now, self.config.round_s, bool(self.table.active))
        return self.cadence.next_wake(
            now, dirty=self.dirty, policy_wake=self.policy_wake, last_round=self.last_round
        )

    def _after(self, now: float) -> None:
        """After a clock-driven request: when the scheduler next needs a tick. On the wall clock
        one due already (a round left jobs to decide on: their node left) goes out at once: the
        ticker may be waiting out a round, having read `wake_at` before the round changed it."""
        self.wake_at = self.next_wake(now)
        if self.wake_at is not None and self.wake_at <= now:
            self._poke()

    def quiet_until(self, now: float) -> float | None:
        """Until when jobs that arrive or end after `now` are decided on no sooner than then
        (`Cadence.quiet_until`; time shares keep their own rounds)."""
        if self.policy.mechanism == "time_shares":
            return None
        return self.cadence.quiet_until(now, self.last_round)

    def _status(
        self, now: float, *, ran_round: bool = False, rejected: dict[str, str] | None = None,
        changes: CountsLog | None = None,
    ) -> SchedulerStatus:  # fmt: skip
        table = self.table
        return SchedulerStatus(
            wake_at=self.wake_at, busy_gpus=table.busy_gpus, queued=table.queued,
            running=table.running, finished=table.finished, ran_round=ran_round,
            rejected=rejected or {}, commands=self.commands, quiet_until=self.quiet_until(now),
            exit_decides=self.policy.needs.decide_on_exit or table.queued > 0,
            changes=changes.changes() if changes is not None else [],
            reached=now if changes is not None and now > changes.started else None,
            wakes=changes.wakes if changes is not None else [],
            runs_ahead=self.runs_ahead(),
        )  # fmt: skip

    async def emit(self, kind: Any, now: float, job_id: str, **fields: Any) -> None:
        event = Event(type=kind, now=now, job_id=job_id, service=self.name, **fields)
        if not self.stages.hold(event):  # (while stages wait: after them, in order)
            await self.bus.emit(event)


def _nothing_done(cluster: ClusterInfo) -> ApplyReply:
    """The reply to an apply not sent: it would change nothing."""
    return ApplyReply(
        placed={}, started={}, stopped=[], unplaced=[], lost=[], capacity=cluster.capacity
    )


def _same_job(known: JobSpec, new: JobSpec) -> bool:
    """The same submission again (a retry), whatever submission time the retry was given."""
    return msgspec.structs.replace(new, submit_time=known.submit_time) == known

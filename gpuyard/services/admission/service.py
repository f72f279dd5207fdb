"""Admission: the front door. Validates job specs, names them, applies the admission policy and hands
admitted jobs to the scheduler."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct
from nats.aio.msg import Msg

from gpuyard.shared.connection import Bus
from gpuyard.shared.contract import (
    ClusterInfo,
    Empty,
    EnqueueRequest,
    Event,
    JobQuery,
    SchedulerStatus,
    SubmitReply,
    SubmitRequest,
    SubmitResult,
)
from gpuyard.shared.durations import slurm_duration
from gpuyard.shared.endpoints import CLUSTER, ENQUEUE, EVENT, QUERY, SUBMIT, Endpoint
from gpuyard.shared.errors import BadRequest, error_from_validation
from gpuyard.shared.identity import ANONYMOUS, Caller
from gpuyard.shared.leader import LEASE_S, LeaseSeconds
from gpuyard.shared.model import ANY_GPU, NEVER_FITS, JobRecord, JobSpec
from gpuyard.shared.policy import (
    AdmissionDecision,
    AdmissionInput,
    AdmissionPolicy,
    ClusterView,
    JobView,
    NodeStatus,
    admission_policies,
)
from gpuyard.shared.service import Handler, Later, Service
from gpuyard.shared.store import Replicas
from gpuyard.shared.throughput import LinearModel, ThroughputModel, load_throughputs

from .identity import named_for, owned_by

RECONSIDER_ON = (
    "job.completed",
    "job.failed",
    "job.cancelled",
    "job.timeout",
    "node.up",
    "policy.changed",
)
"""The events after which held jobs are decided on again (`reconsider_on_events`): capacity freed
or added, or a policy (an admission quota) changed."""

QUERY_PAGE = 10_000
"""Jobs per page when admission reads the admitted jobs from the scheduler."""


class AdmissionConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    policy: str = "accept-all"
    params: dict[str, Any] = {}
    id_prefix: str = "j"
    """Jobs submitted without a job_id are named `<id_prefix><n>`."""
    retry_held_s: float | None = None
    """Real clusters: try held jobs again this often (a simulation's clock does it on exits)."""
    reconsider_on_events: bool = False
    """Real clusters: decide on held jobs again whenever capacity or policy changes, as the event
    stream says (`RECONSIDER_ON`: a job ended, a node joined, a policy or quota changed). A
    simulation's clock asks itself, in its own order."""
    durable: bool = False
    """Keep the id counter and the held jobs in a JetStream key-value bucket."""
    replicas: Replicas = 1
    lease_s: LeaseSeconds = LEASE_S
    """Durable: the leader lease (`shared.leader`): a standby takes over this long after the
    active instance stopped renewing it."""
    throughputs: str = "default"
    """The throughput model behind the views' `rate()` (deadline-feasibility admission)."""
    call_timeout_s: float | None = None
    """How long one request to the scheduler or placement may take (None: the default)."""
    retry_for_s: float = 0.0
    """Retry (idempotent) requests this long while the service called restarts."""
    require_command: bool = False
    """Real clusters: a job must name its command (node agents have nothing to run otherwise);
    one without is rejected at submission rather than failing at launch."""
    default_time_limit_s: Annotated[float, Meta(gt=0)] | None = None
    """The time limit of a job submitted without one (Slurm's partition `DefaultTime`; None:
    `max_time_limit_s`, as there)."""
    max_time_limit_s: Annotated[float, Meta(gt=0)] | None = None
    """The longest time limit a job may ask for (Slurm's `MaxTime`): one asking for more is
    rejected at submission, saying so."""


class Submission(Struct, kw_only=True, forbid_unknown_fields=True):
    """`adm.submit` as admission reads it: a `SubmitRequest` whose job specs are read one by one,
    so that a malformed one is refused alone (by index and field) and the others decided."""

    jobs: list[msgspec.Raw]
    now: float | None = None
    tick: bool = False
    times: list[float] = []
    until: float | None = None

    def judged(self) -> tuple[SubmitRequest, list[SubmitResult], list[int]]:
        """The request with the specs that are well formed, a refusal for each other one, and
        where each spec kept was in the submission. None well formed: the request is wrong (the
        first spec's error, by field)."""
        if self.times and len(self.times) != len(self.jobs):
            raise BadRequest("times: one per job, or none", field="$.times")
        specs: list[JobSpec] = []
        times: list[float] = []
        refused: list[SubmitResult] = []
        kept: list[int] = []
        first: BadRequest | None = None
        for i, raw in enumerate(self.jobs):
            try:
                spec = _spec_decoder.decode(raw)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                bad = error_from_validation(exc)
                field = (bad.field or "$").replace("$", f"$.jobs[{i}]", 1)
                first = first or BadRequest(bad.error, field=field)
                refused.append(SubmitResult(
                    job_id=_job_id(raw), verdict="reject", reason=f"{bad.error} (at {field})"
                ))  # fmt: skip
                continue
            specs.append(spec)
            kept.append(i)
            if self.times:
                times.append(self.times[i])
        if first is not None and not specs:
            raise first
        req = SubmitRequest(jobs=specs, now=self.now, tick=self.tick, times=times, until=self.until)
        return req, refused, kept


_spec_decoder = msgspec.json.Decoder(JobSpec)


def _job_id(raw: msgspec.Raw) -> str:
    """The id a malformed spec names, if it names one ("" if not)."""
    try:
        named = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return ""
    job_id = named.get("job_id") if isinstance(named, dict) else None
    return job_id if isinstance(job_id, str) else ""


@dataclass
class Arrivals:
    """One submission's jobs as judged, for the scheduler to hear of: alone, or with the other
    submissions of a group (requests that came together, on the wall clock) in one request."""

    now: float
    admitted: list[JobSpec]
    results: list[SubmitResult]
    """Its jobs' verdicts (not the malformed ones': they named no job)."""
    arrived: dict[str, float]
    users: dict[str, str]
    declined: int
    reply: SubmitReply | None = None


class StoredAdmission(Struct, kw_only=True):
    counter: int = 0
    held: list[JobSpec] = []


STATE_KEY = "state"


class Admission(Service):
    name = "admission"
    policies = admission_policies
    commits_in_groups = True  # it calls the scheduler and placement, which never call it
    decoded_as = {SUBMIT: Submission}

    def __init__(self, bus: Bus, config: AdmissionConfig) -> None:
        super().__init__(bus)
        self.config = config
        self.policy: AdmissionPolicy
        self.install_policy(config.policy, config.params)
        self.model: ThroughputModel = LinearModel()  # the configured one is loaded at start
        self.counter = 0
        self.held: list[JobSpec] = []  # the overflow queue, in arrival order
        self._stored = msgspec.json.encode(StoredAdmission())
        """The state as last written (or read): a request that changed neither the counter nor
        the held jobs writes nothing."""
        self._retry: asyncio.Task[None] | None = None
        self._due: asyncio.Task[None] | None = None
        """On the wall clock: the retry of held jobs at the time their policy named."""
        self.cluster: ClusterInfo | None = None
        self._shapes: dict[tuple[str, int, int, int], int] = {}
        self._shapes_of: ClusterInfo | None = None
        self._asked = False
        """A decision on the held jobs is queued (`_ask_again`): a burst of events asks once."""
        self._group: list[Arrivals] = []
        """Submissions judged whose jobs the scheduler hears of when the group commits."""

    def routes(self) -> dict[Endpoint[Any, Any], Handler]:
        return {SUBMIT: self.submit}

    async def persist(self) -> None:
        if not self.store.durable:
            return
        state = msgspec.json.encode(StoredAdmission(counter=self.counter, held=self.held))
        if state != self._stored:
            await self.store.put_many({STATE_KEY: state})
            self._stored = state

    async def restore(self, values: dict[str, bytes]) -> None:
        if STATE_KEY in values:
            self._stored = values[STATE_KEY]
            state = msgspec.json.decode(self._stored, type=StoredAdmission)
            self.counter, self.held = state.counter, list(state.held)
            self.log.info("state.admission_restored", counter=self.counter, held=len(self.held))

    async def hand_over(self) -> None:
        self._stop_timers()

    def _stop_timers(self) -> None:
        for task in (self._retry, self._due):
            if task is not None:
                task.cancel()
        self._retry = self._due = None

    async def _call(self, endpoint: Endpoint[Any, Any], msg: Any) -> Any:
        return await self.bus.call(
            endpoint, msg, within_s=self.config.call_timeout_s, retry_for_s=self.config.retry_for_s
        )

    async def start(self) -> None:
        if self.config.throughputs != "default":
            self.model = await asyncio.to_thread(load_throughputs, self.config.throughputs)
        await super().start()
        if self.config.retry_held_s:
            self._retry = asyncio.create_task(self._retry_held(self.config.retry_held_s))
        if self.config.reconsider_on_events:
            for kind in RECONSIDER_ON:
                sub = await self.bus.nc.subscribe(
                    self.bus.subjects.of(EVENT, type=kind), cb=self._capacity_or_policy_changed
                )
                self._subs.append(sub)  # (drained when a replacement takes over)
            await self._ask_again()  # held jobs restored from the store: capacity may have changed

    async def _capacity_or_policy_changed(self, msg: Msg) -> None:
        if msg.subject.endswith(".node.up"):
            self.cluster = None  # its capacity: asked for again at the next decision
        await self._ask_again()

    async def stop(self) -> None:
        self._stop_timers()
        await super().stop()

    async def _retry_held(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            await self._ask_again()

    async def _retry_at(self, at: float) -> None:
        """Wall clock: decide on the held jobs again at `at` (a simulation's clock asks itself)."""
        await asyncio.sleep(max(at - time.time(), 0.0))
        await self._ask_again()

    async def _ask_again(self) -> None:
        """Held jobs are decided again through our own subject, so that this queues behind other
        requests like any submit."""
        if self.held and not self._asked:
            self._asked = True
            await self.bus.nc.publish(self.bus.subject(SUBMIT), b'{"jobs": []}')

    async def submit(
        self, submission: SubmitRequest | Submission, caller: Caller = ANONYMOUS
    ) -> SubmitReply | Later[SubmitReply]:
        if isinstance(submission, Submission):
            req, results, kept = submission.judged()
        else:
            req, results, kept = submission, [], list(range(len(submission.jobs)))
        malformed = len(results)  # (refused first, then the jobs decided)
        for r in results:
            self.log.warning("job.malformed", job_id=r.job_id, reason=r.reason)
        try:
            req = owned_by(req, caller)
        except BadRequest as exc:  # (named by its place in the submission)
            if exc.field and (m := re.match(r"\$\.jobs\[(\d+)\]", exc.field)):
                exc.field = f"$.jobs[{kept[int(m[1])]}]{exc.field[m.end() :]}"
            raise
        self._asked = False  # (every submit decides on the held jobs)
        now = req.now if req.now is not None else time.time()
        if self.cluster is None or not self.cluster.capacity:
            await self._refresh_cluster()
        view = self._cluster_view()
        jobs, decides = (
            await self._admitted_jobs(view, now) if self.held or req.jobs else ([], None)
        )
        admitted: list[JobSpec] = []
        declined = 0  # arrivals refused: still an event for some scheduling policies
        retry_at: float | None = None  # the earliest time a held job asks to be decided again

        def decide(
            spec: JobSpec, blocked: bool, never: str | None = None, at: float = now
        ) -> tuple[Literal["admit", "hold", "reject"], str]:
            nonlocal retry_at
            decision = self._decide(
                at, spec, view, jobs, blocked=blocked, never=never, next_decision=decides
            )
            if decision.verdict == "admit":
                admitted.append(spec)
                if self.policy.needs.jobs:  # counts for the jobs after it
                    jobs.append(self._admitted_view(spec, at))
            elif decision.verdict == "hold" and (again := decision.retry_at) is not None:
                retry_at = again if retry_at is None else min(retry_at, again)
            return decision.verdict, decision.reason

        # Held jobs first, in order; then the new ones (behind any still held, if in order).
        users = {s.job_id or "": s.user for s in self.held}
        still_held: list[JobSpec] = []
        held_ids = {s.job_id for s in self.held} if self.durable else set()
        asked: set[str] = set()  # the ids of this request's jobs
        for spec in self.held:
            verdict, why = decide(spec, blocked=bool(still_held))
            if verdict == "hold":
                still_held.append(spec)
            else:
                results.append(SubmitResult(job_id=spec.job_id or "", verdict=verdict, reason=why))
                declined += verdict == "reject"  # (its arrival is decided on now)
        self.held = still_held
        if req.times and len(req.times) != len(req.jobs):
            raise BadRequest("times: one per job, or none", field="$.times")
        arrived: dict[str, float] = {}  # (batched arrivals: the time of each)
        array_id = ""  # the id this request's array tasks share (`<array_id>_<task>` each)
        for i, spec in enumerate(req.jobs):
            if spec.job_id is not None and spec.job_id in held_ids:
                continue  # durable: a retried submit whose first attempt held this job
            # (a simulation's clock may submit a job ahead of its arrival: `SubmitRequest.times`)
            at = (
                (req.times[i] if req.now is not None else min(req.times[i], now))
                if req.times
                else now
            )
            if spec.array is not None and spec.job_id is None:
                array_id = array_id or self._new_id()
                array = msgspec.structs.replace(spec.array, array_id=array_id)
                spec = msgspec.structs.replace(
                    spec, array=array, job_id=f"{array_id}_{spec.array.task}"
                )
            spec = msgspec.structs.replace(
                spec,
                job_id=spec.job_id or self._new_id(),
                submit_time=spec.submit_time if spec.submit_time is not None else at,
                time_limit_s=self._time_limit(spec),
            )
            assert spec.job_id is not None
            users[spec.job_id] = spec.user
            asked.add(spec.job_id)
            if req.times:
                arrived[spec.job_id] = at
            await self._event("job.submitted", at, spec.job_id, user=spec.user)
            never = self._never_fits(spec)
            if never and self.cluster is not None:
                await self._refresh_cluster()  # nodes may have joined since we last looked
                view = self._cluster_view()
                never = self._never_fits(spec)
            verdict, why = decide(spec, blocked=bool(self.held), never=never, at=at)
            results.append(SubmitResult(job_id=spec.job_id, verdict=verdict, reason=why))
            if verdict == "hold":
                self.held.append(spec)
            declined += verdict == "reject"
        if self.policy.all_or_none:
            declined += self._decline_together(results, admitted)
        arrivals = Arrivals(now, admitted, results[malformed:], arrived, users, declined)
        # On the wall clock, with more submissions waiting behind this one, the scheduler hears
        # of them all in one request when the group commits: one decision for a burst.
        grouped = (
            req.now is None and not req.tick and req.until is None and not self.held
            and not self.policy.needs.jobs and self.queued() > 0
        )  # fmt: skip
        status: SchedulerStatus | None = None
        if grouped:
            self._group.append(arrivals)
        else:
            await self.before_commit()  # (those before it first)
            status = await self._tell_scheduler([arrivals], now, tick=req.tick, until=req.until)
        if retry_at is not None and req.now is None:  # the wall clock: our own timer
            if self._due is not None:
                self._due.cancel()
            self._due = asyncio.create_task(self._retry_at(retry_at))
        # The reply names the caller's jobs only: a held job of another user decided on here
        # is told to its owner by its events (`gpuyard jobs`), not to whoever submitted next.
        mine = named_for(caller, asked, users)
        held = sum(1 for s in self.held if mine(s.job_id or ""))
        reply = SubmitReply(
            results=results[:malformed] + [r for r in results[malformed:] if mine(r.job_id)],
            held=held, scheduler=status,
            retry_at=retry_at if held else None,
            batches=not (self.policy.needs.jobs or self.policy.all_or_none or self.held),
        )  # fmt: skip
        if grouped:
            arrivals.reply = reply
            return Later(reply)
        return reply

    async def before_commit(self) -> None:
        """The scheduler hears of the group's submissions, in one request."""
        if self._group:
            group, self._group = self._group, []
            await self._tell_scheduler(group, time.time())

    async def _tell_scheduler(
        self, group: list[Arrivals], now: float, *, tick: bool = False, until: float | None = None
    ) -> SchedulerStatus | None:
        """Enqueue the admitted jobs of `group` in one request (with the declined count, and a
        simulation's tick), take the scheduler's refusals into the verdicts, and say each job's
        verdict (`job.admitted`, `job.held`, `job.rejected`)."""
        status: SchedulerStatus | None = None
        admitted = [s for a in group for s in a.admitted]
        declined = sum(a.declined for a in group)
        if admitted or tick or declined:
            # The ids given out are stored before the scheduler hears of them: never reused.
            await self.persist()
            times = [a.arrived[s.job_id or ""] for a in group if a.arrived for s in a.admitted]
            status = await self._call(
                ENQUEUE,
                EnqueueRequest(
                    now=now, jobs=admitted, tick=tick, declined=declined, times=times, until=until
                ),
            )
            for a in group:
                for r in a.results:
                    if r.job_id in status.rejected:
                        r.verdict, r.reason = "reject", status.rejected[r.job_id]
        for a in group:
            for r in a.results:
                kind = {"admit": "job.admitted", "hold": "job.held", "reject": "job.rejected"}[
                    r.verdict
                ]
                at = a.arrived.get(r.job_id, a.now)
                await self._event(kind, at, r.job_id, r.reason, user=a.users.get(r.job_id, ""))
            if a.reply is not None:
                a.reply.scheduler = status
        return status

    @staticmethod
    def _decline_together(results: list[SubmitResult], admitted: list[JobSpec]) -> int:
        """All or none: where this request declined a job, it declines the jobs it admitted too
        (best-effort ones excepted); returns how many."""
        refused = next((r for r in results if r.verdict == "reject"), None)
        if refused is None:
            return 0
        undone = {s.job_id for s in admitted if not s.best_effort}
        for r in results:
            if r.job_id in undone:
                r.verdict = "reject"
                r.reason = (
                    f"declined with the jobs decided with it ({refused.job_id}: {refused.reason})"
                )
        admitted[:] = [s for s in admitted if s.job_id not in undone]
        return len(undone)

    def _decide(
        self, now: float, spec: JobSpec, cluster: ClusterView, jobs: list[JobView], *,
        blocked: bool, never: str | None = None, next_decision: float | None = None,
    ) -> AdmissionDecision:  # fmt: skip
        """The decision on one job; `blocked`: an earlier job is held (FIFO overflow); `never`:
        `_never_fits(spec)`, where the caller has it already; `next_decision`: when the
        scheduler first decides on it (`_admitted_jobs`)."""
        if self.config.require_command and not spec.command:
            return AdmissionDecision(
                "reject", "no command: a job on this cluster runs a command (submit -- CMD ...)"
            )
        most = self.config.max_time_limit_s
        if most is not None and spec.time_limit_s is not None and spec.time_limit_s > most:
            return AdmissionDecision(
                "reject", f"time limit of {slurm_duration(spec.time_limit_s)} is over this "
                f"cluster's maximum of {slurm_duration(most)}",
            )  # fmt: skip
        if never is None:
            never = self._never_fits(spec)
        if never:
            return AdmissionDecision("reject", f"{NEVER_FITS}: {never}")
        decision = self.policy.decide(
            AdmissionInput(
                now=now, job=spec, cluster=cluster, jobs=jobs, next_decision=next_decision
            )
        )
        if decision.verdict == "admit" and blocked and self.policy.in_order:
            return AdmissionDecision("hold", "behind earlier held jobs")
        return decision

    async def _admitted_jobs(
        self, cluster: ClusterView, now: float
    ) -> tuple[list[JobView], float | None]:
        """The admitted jobs that have not ended, from the scheduler, when the policy needs them,
        and when the scheduler would first decide on a job admitted now."""
        if not self.policy.needs.jobs:
            return [], None
        records: list[JobRecord] = []
        decides: float | None = None
        while True:
            query = JobQuery(
                states=["queued", "running"], offset=len(records), limit=QUERY_PAGE, now=now
            )
            page = await self._call(QUERY, query)
            records += page.jobs
            decides = page.next_decision  # (the same on every page: the same `now`)
            if not page.jobs or len(records) >= page.total:
                break
        context = cluster.context(now)
        return [JobView.of(r, context) for r in records], decides

    def _admitted_view(self, spec: JobSpec, now: float) -> JobView:
        """A job admitted by this request, as the scheduler will first see it."""
        assert spec.job_id is not None
        record = JobRecord(
            job_id=spec.job_id, seq=-1, spec=spec, submit_time=spec.submit_time or now,
            admit_time=now, queued_since=now, progress_at=now,
        )  # fmt: skip
        return JobView(record)

    def _cluster_view(self) -> ClusterView:
        info = self.cluster
        capacity = dict(info.capacity) if info is not None else {}
        nodes: list[NodeStatus] = []
        if info is not None and self.policy.needs.nodes:
            nodes = [NodeStatus(n.node_id, n.gpu_type, n.num_gpus) for n in info.nodes]
        return ClusterView(capacity=capacity, round_s=0.0, nodes=nodes, throughputs=self.model)

    async def _refresh_cluster(self) -> None:
        self.cluster = await self._call(CLUSTER, Empty())

    def _time_limit(self, spec: JobSpec) -> float | None:
        """The job's time limit: its own, else the cluster's default (or its maximum)."""
        config = self.config
        if spec.time_limit_s is not None:
            return spec.time_limit_s
        return config.default_time_limit_s or config.max_time_limit_s

    def _new_id(self) -> str:
        self.counter += 1
        return f"{self.config.id_prefix}{self.counter}"

    def _never_fits(self, spec: JobSpec) -> str:
        """Why the job could never run on this cluster, or '' (unknown cluster: anything goes)."""
        capacity = self.cluster.capacity if self.cluster is not None else {}
        if not capacity:
            return ""
        low = spec.gpu_range[0]
        if spec.gpu_types and not capacity.keys() & set(spec.gpu_types):
            return (f"GPU types {'|'.join(spec.gpu_types)} are not in the cluster "
                    f"({', '.join(sorted(capacity))})")  # fmt: skip
        if spec.gpu_type == ANY_GPU:
            most = max(n for t, n in capacity.items() if spec.allows(t))
            if low > most:
                return f"needs {low} GPUs of one type; the largest GPU type has {most}"
        elif spec.gpu_type not in capacity:
            return (
                f"GPU type {spec.gpu_type!r} is not in the cluster ({', '.join(sorted(capacity))})"
            )
        elif low > capacity[spec.gpu_type]:
            return f"needs {low} {spec.gpu_type} GPUs; the cluster has {capacity[spec.gpu_type]}"
        if (spec.cpu_milli or spec.memory_mib) and (room := self._room_for(spec)) < low:
            return (f"needs {low} GPUs on nodes with {spec.cpu_milli} thousandths of CPUs and "
                    f"{spec.memory_mib} MiB spread over them; its nodes have room for {room}")  # fmt: skip
        high = spec.gpu_range[1]
        types = [t for t in capacity if spec.allows(t)]
        if not any(
            self.model.throughput(spec.job_type, t, n) > 0
            for t in types
            for n in range(low, min(high, capacity[t]) + 1)
        ):
            gpus = f"{low}" if low == high else f"{low} to {high}"
            return (
                f"the throughput model has no figure for {spec.job_type!r} on {gpus} GPUs of "
                f"{', '.join(types)}"
            )
        return ""

    def _room_for(self, spec: JobSpec) -> int:
        """How many of the job's GPUs the cluster's empty nodes could host, as far as their CPUs
        and memory go (where they count them)."""
        low = spec.gpu_range[0]
        room = 0
        for (gpu_type, num_gpus, cpu_milli, memory_mib), count in self._node_shapes().items():
            if not spec.allows(gpu_type):
                continue
            here = num_gpus
            for total, amount in ((cpu_milli, spec.cpu_milli), (memory_mib, spec.memory_mib)):
                if total and amount:
                    here = min(here, total * low // amount)
            room += here * count
        return room

    def _node_shapes(self) -> dict[tuple[str, int, int, int], int]:
        """The cluster's nodes counted by (GPU type, GPUs, CPUs, memory): a job's room costs the
        shapes a cluster has (a few), not its nodes (thousands); made again when it changes."""
        cluster = self.cluster
        if cluster is None:
            return {}
        if self._shapes_of is not cluster:
            shapes: dict[tuple[str, int, int, int], int] = {}
            for node in cluster.nodes:
                key = (node.gpu_type, node.num_gpus, node.cpu_milli, node.memory_mib)
                shapes[key] = shapes.get(key, 0) + 1
            self._shapes, self._shapes_of = shapes, cluster
        return self._shapes

    async def _event(
        self, kind: Any, now: float, job_id: str, reason: str = "", *, user: str = ""
    ) -> None:
        await self.bus.emit(
            Event(type=kind, now=now, job_id=job_id, reason=reason, service=self.name, user=user)
        )

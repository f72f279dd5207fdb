"""The simulation clock: owns virtual time, replays a workload, and impersonates the node agents.

It submits each job through admission at its arrival time, like a real client; it answers the node
commands placement sends, computing each job's progress from the throughput model; it reports each
job's exit at its exact virtual completion time (or at the next round boundary, with
`completion_quantum`, as Blox does).

Time only moves when every request the clock started has been answered (the system is quiescent),
and it jumps straight to the next instant at which something can change: an arrival, a completion,
or a tick the scheduler asked for. Same inputs, same sequence of messages, same results.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import math
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from gpuyard.shared.connection import Bus
from gpuyard.shared.contract import (
    Ack,
    ClusterChanged,
    ExitReport,
    JobExit,
    NodeCommand,
    NodeCommandReply,
    NodeCommands,
    NodesChanged,
    PageQuery,
    Progress,
    RunRequest,
    SchedulerStatus,
    StepsReport,
    StepsUpdate,
    SubmitRequest,
    TickRequest,
    TimelinePage,
    TimelinePoint,
)
from gpuyard.shared.endpoints import (
    CLUSTER_CHANGED,
    EXITED,
    NODE_COMMAND,
    NODE_COMMANDS,
    NODES,
    PROGRESS,
    RUN,
    STEPS,
    SUBMIT,
    TICK,
    TIMELINE,
    Endpoint,
)
from gpuyard.shared.errors import BadRequest
from gpuyard.shared.model import ClusterSpec, JobSpec, NodeSpec
from gpuyard.shared.service import Handler, Service
from gpuyard.shared.throughput import ThroughputModel, load_throughputs, total_steps

MAX_TICKS_PER_INSTANT = 3

Rep = TypeVar("Rep")


class RestartCost(Struct, kw_only=True, forbid_unknown_fields=True):
    """ElasticFlow's restart model: a job whose processes (re)start makes no progress for a while.

    A launch (a start, a resume, a resize or a move: a resize is a preemption and a relaunch of
    the same job at the same instant) costs `base_s`, plus `per_doubling_s * (log2(GPUs) + 1)`
    while its workers set up and join, plus `cold_s` if its processes must start from scratch.
    With `warm_ranks`, a job on a set of GPUs that some job used since the last cold start keeps
    its warm processes and pays `base_s` only. Every `cold_every`-th instant at which launches
    happen (0: never) is a cold start: jobs not on warm GPUs pay `cold_s` too, and the warm sets
    are forgotten. Which jobs restart (`scope`): `launched`, only those; `changes`, every running
    job at an instant with any launch (ElasticFlow's executor stops and relaunches them all);
    `decisions`, every running job at every scheduling decision, changed or not, decisions being
    counted at least `decision_gap_s` apart (ElasticFlow's simulator: at every event, events a
    slot apart).

    ElasticFlow's simulator (`utils.estimate_overhead`): base 2 s (7 s on 256 GPUs or more), 2 s
    per doubling, cold 27 s (47 s on 256 or more), every 240th scheduling event.
    """

    base_s: float = 2.0
    per_doubling_s: float = 2.0
    cold_s: float = 27.0
    cold_every: int = 0
    warm_ranks: bool = True
    warm_key: Literal["gpus", "first_rank"] = "gpus"
    """What makes a job's processes warm: a set of the very same GPUs (`gpus`), or, as
    ElasticFlow's simulator keys its cache, one of the same size starting at the same rank (the
    position of its first GPU in the cluster's order, as if its GPUs were contiguous)."""
    scope: Literal["launched", "changes", "decisions"] = "launched"
    decision_gap_s: float = 0.0

    def seconds(self, gpus: int, *, warm: bool, cold: bool) -> float:
        if warm:
            return self.base_s
        return (
            self.base_s
            + self.per_doubling_s * (math.log2(max(gpus, 1)) + 1)
            + (self.cold_s if cold else 0.0)
        )


class PreemptionCost(Struct, kw_only=True, forbid_unknown_fields=True):
    """What a preemption costs, charged as lost progress (the references charge nothing).

    A preempted job loses the work of its last `checkpoint_s` seconds (saving it), and a resumed
    job runs `restore_s` seconds before it progresses again. `by_job_type` overrides both per
    job type (model): {"resnet50": [checkpoint_s, restore_s]}. `restart`: ElasticFlow's model of
    the time a (re)launched job spends starting (`RestartCost`), on top of these. A job stopped
    before it progresses again loses no more than it had.
    """

    checkpoint_s: float = 0.0
    restore_s: float = 0.0
    by_job_type: dict[str, tuple[float, float]] = {}
    restart: RestartCost | None = None

    def of(self, job_type: str) -> tuple[float, float]:
        return self.by_job_type.get(job_type, (self.checkpoint_s, self.restore_s))


class SimClockConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    workload: str
    """JSON-lines file of job specs (each with job_id and submit_time)."""
    cluster: ClusterSpec
    """Nodes present from the start."""
    throughputs: str = "default"
    """Throughput model: a Gavel JSON, ElasticFlow table(s), BFTrainer JNPs CSV, or "default"."""
    node_events: str | None = None
    """CSV `time,node,up` (seconds): nodes that join and leave (see gpuyard.workloads.churn)."""
    churn_node_gpus: int = 1
    churn_node_type: str = "gpu"
    """GPUs per node and their type, for nodes that only appear in `node_events`."""
    completion_quantum: float | None = None
    """If set, a job's exit is reported at the next multiple of this (Blox: the round length;
    ElasticFlow: 1 s, its ends being rounded up to whole seconds)."""
    completion_grid_s: Annotated[float, Meta(gt=0)] | None = None
    """ElasticFlow's simulator: a job's end is an event at the end of the last slot of this
    length its run reaches (slots counted from its last restart, after the restart's pause: the
    end its plan predicted), or at the first instant after its finish at which anything else
    happens, whichever comes first; its JCT counts to its finish."""
    arrival_quantum: float | None = None
    """If set, jobs are submitted at the next multiple of this (Blox admits at round starts);
    their submit_time, and so their JCT, stays the true arrival."""
    at_node_events: bool = False
    """BFTrainer's replayer: jobs are submitted, and their exits reported, only at node events
    (the first at or after their arrival, completion); their submit_time, and so their JCT,
    stays the true arrival, and a finished job holds its nodes until that event."""
    gavel_round_s: Annotated[float, Meta(gt=0)] | None = None
    """Gavel's simulator semantics, rounds of this length (Gavel: 360 s): every round, each
    running job runs `min(int(rate * round), steps left)` steps; the round ends when the last of
    those micro-tasks ends (so a round ends early when every job finishes), a job that finished
    leaves its GPUs idle until then, completions are reported and arrivals submitted at round
    ends, and with nothing running time jumps to the next arrival."""
    preemption_cost: PreemptionCost = msgspec.field(default_factory=PreemptionCost)
    window: tuple[Annotated[int, Meta(ge=0)], Annotated[int, Meta(ge=1)]] | None = None
    """Gavel's measurement window (its `jobs_to_complete`): jobs `window[0]` to `window[1] - 1`
    of the workload in arrival order; the run ends as soon as they have all ended, the jobs
    still running or queued then left as they are."""
    progress_interval_s: float = 0.25
    call_timeout_s: float | None = None
    """How long one request to the services may go unanswered (None: the connection's default)."""
    retry_for_s: float = 0.0
    """Durable runs: send a request again while its service restarts (it was killed), this long."""


class SimJob:
    """A simulated job's processes: which GPUs of which nodes run its parts, and its progress."""

    __slots__ = (
        "attempt", "base", "done", "down_s", "ended_at", "failure", "floor", "gpu_type", "held",
        "job_type", "min_gpus", "parts", "placed", "ranks", "rate", "restarting", "restoring",
        "round_steps", "since", "total", "up_s", "version",
    )  # fmt: skip

    def __init__(self, spec: JobSpec, total: float) -> None:
        self.job_type = spec.job_type
        self.total = total
        self.done = 0.0
        self.rate = 0.0
        self.since = 0.0
        self.parts: dict[str, tuple[int, ...]] = {}  # node -> GPU indices
        self.ranks: frozenset[tuple[str, int]] | None = None  # `gpu_set`, while parts do not change
        self.attempt = 0
        self.round_steps = 0.0  # Gavel's rounds: the steps of this round's micro-task
        self.ended_at: float | None = None  # Gavel's rounds: its last micro-task's end
        self.gpu_type = ""
        self.version = 0
        self.failure = ""  # why the job crashes as soon as it starts, if it does
        self.restarting = False  # some part was stopped at this instant
        self.restoring = False  # resumed after a preemption: the restore time is still to pay
        self.floor = 0.0  # progress at the current launch: a pause never takes it below
        # Rescale costs (JobSpec.rescale_up_s/down_s): the GPUs per node it ran on since the last
        # instant, and what it kept after this instant's node losses (None: none lost).
        self.up_s, self.down_s = spec.rescale_up_s, spec.rescale_down_s
        self.min_gpus = spec.gpu_range[0]
        self.placed: dict[str, int] = {}
        self.held = 0
        self.base: int | None = None

    def gpu_set(self) -> frozenset[tuple[str, int]]:
        """Its GPUs, (node, index) each: made again only when its parts change."""
        if self.ranks is None:
            self.ranks = frozenset((node, g) for node, gpus in self.parts.items() for g in gpus)
        return self.ranks

    def settle(self, now: float) -> None:
        if self.rate:
            self.done = max(self.done + self.rate * (now - self.since), self.floor)
        self.since = now


def load_workload(path: str) -> list[JobSpec]:
    """Job specs from JSON lines; an error names the file, line and field."""
    decoder = msgspec.json.Decoder(JobSpec)
    jobs: list[JobSpec] = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                spec = decoder.decode(line)
            except msgspec.ValidationError as exc:
                raise BadRequest(f"{path}:{lineno}: {exc}", field="$.workload") from None
            if spec.job_id is None or spec.submit_time is None:
                raise BadRequest(f"{path}:{lineno}: job_id and submit_time are required")
            if spec.duration is None and spec.total_steps is None:
                raise BadRequest(f"{path}:{lineno}: a simulated job needs duration or total_steps")
            jobs.append(spec)
    jobs.sort(key=lambda s: s.submit_time or 0.0)  # stable: file order breaks ties
    return jobs


class SimClock(Service):
    name = "simclock"

    def __init__(self, bus: Bus, config: SimClockConfig) -> None:
        super().__init__(bus)
        self.config = config
        self.model: ThroughputModel = load_throughputs(config.throughputs)
        self.node_types = {n.node_id: n.gpu_type for n in config.cluster.nodes()}
        self.node_specs = {n.node_id: n for n in config.cluster.nodes()}
        self.present: set[str] = set(self.node_specs)
        self.gpus = config.cluster.total_gpus  # usable GPUs of the nodes present
        self.jobs: dict[str, SimJob] = {}
        self.holding: dict[tuple[str, int], list[str]] = {}  # (node, GPU) -> jobs running there
        self.changed: set[str] = set()
        self.heap: list[tuple[float, int, str, int]] = []
        self.launches = 0
        self.finished = 0
        self.awaited: set[str] = set()  # the window's jobs that have not ended yet
        self.held = 0  # jobs admission holds, as it last said
        self.held_retry: float | None = None  # when admission asked to decide on them again
        self.timeline: list[TimelinePoint] = []
        self.launched: set[str] = set()  # jobs launched at the current instant
        self.running: set[str] = set()  # jobs with parts on some node
        self.warm: set[Hashable] = set()  # GPU sets with warm processes (`RestartCost.warm_key`)
        self.rank_offsets: dict[str, int] = {}  # each node's first rank (`_first_rank`)
        self.restart_instants = 0
        self.decided: float | None = None  # the last instant at which the scheduler decided
        self.charged: float | None = None  # the last decision at which restarts were charged
        self.sched_wake: float | None = None
        self.churn_times: list[float] = []  # instants with node events (`at_node_events`)
        self.task: asyncio.Task[None] | None = None
        self.progress = Progress(now=0.0, submitted=0, finished=0, total=0, instants=0)
        self.finished_steps = 0.0  # steps of the jobs that completed
        self.finishes: list[tuple[float, int, str, int]] = []  # real finishes (completion_grid_s)
        self.unreported: dict[str, StepsReport] = {}  # progress the scheduler has not heard of
        self.commands_handled = 0  # the number of the last `clock.cmds` handled
        self.commands_due = 0  # ... that the services' replies named
        self.commands_in = asyncio.Event()  # set when one is handled
        self.command_error: str | None = None  # a command no simulated node could carry out

    def routes(self) -> dict[Endpoint[Any, Any], Handler]:
        # NODE_COMMANDS: an apply's commands to every node at once (placement, `simulated`).
        return {RUN: self.run, TIMELINE: self.get_timeline, NODE_COMMANDS: self.node_commands}

    async def start(self) -> None:
        await super().start()
        await self.serve(NODE_COMMAND, self.node_command)  # or every node's, one at a time

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        await super().stop()

    # ------------------------------------------------------------------ requests

    async def run(self, _: RunRequest) -> Ack:
        if self.task is not None:
            raise BadRequest("the simulation has already been started")
        # Reading the files (node events can be a million lines) stays off the event loop.
        workload = await asyncio.to_thread(load_workload, self.config.workload)
        if self.config.window is not None:
            first, end = self.config.window
            if not first < end <= len(workload):
                raise BadRequest(
                    f"window {first}:{end} is not within the workload's {len(workload)} jobs",
                    field="$.window",
                )
            self.awaited = {spec.job_id for spec in workload[first:end] if spec.job_id}
        churn = await asyncio.to_thread(self._load_churn)
        self.churn_times = [t for t, _ in churn]
        self.progress.total = len(workload)
        self.task = asyncio.create_task(self._run(workload, churn))
        return Ack()

    async def get_timeline(self, req: PageQuery) -> TimelinePage:
        points = self.timeline[req.offset : req.offset + req.limit]
        return TimelinePage(points=points, total=len(self.timeline))

    async def node_commands(self, batch: NodeCommands) -> None:
        """The commands of one apply (or nodes change) to several nodes, in their order. They are
        published: the steps of the jobs they stop go to the scheduler with our next request, and
        the loop waits for the commands a reply names before it goes on (`_commands_handled`)."""
        if batch.seq <= self.commands_handled:
            return  # (sent again by a placement that restarted before it stored having sent it)
        try:
            for cmd in batch.commands:
                stopped = (await self.node_command(cmd)).progress
                for job_id, steps in stopped.items():
                    seen = self.unreported.get(job_id)
                    if seen is None or seen.at < cmd.now or steps < seen.steps:  # (the slowest part)
                        self.unreported[job_id] = StepsReport(steps, cmd.now)
        except BadRequest as exc:
            self.command_error = f"placement's node commands #{batch.seq}: {exc.error}"
        self.commands_handled = batch.seq
        self.commands_in.set()

    async def node_command(self, cmd: NodeCommand) -> NodeCommandReply:
        """Be the node agent of `cmd.node_id`: stop and start the job parts placed there."""
        if cmd.node_id not in self.node_types:
            raise BadRequest(f"no simulated node {cmd.node_id!r}", field="$.node_id")
        progress: dict[str, float] = {}
        preempted: list[str] = []
        for job_id in cmd.preempt:
            job = self.jobs.get(job_id)
            if job is None:  # it ended (placement hears of that at its next apply): nothing runs
                continue
            preempted.append(job_id)
            job.settle(cmd.now)
            self._partners_alone(self._detach(job_id, cmd.node_id), cmd.now)
            if not job.restarting:  # a distributed job restarts as a whole: checkpoint once
                self._checkpoint(job)
            progress[job_id] = job.done
            self.changed.add(job_id)
        for launch in cmd.launch:
            job = self.jobs[launch.job_id]
            job.settle(cmd.now)
            self._partners_alone(self._detach(launch.job_id, cmd.node_id), cmd.now)
            job.parts[cmd.node_id] = tuple(launch.gpus)
            job.ranks = None
            for g in launch.gpus:
                self.holding.setdefault((cmd.node_id, g), []).append(launch.job_id)
            job.gpu_type = self.node_types[cmd.node_id]
            job.attempt = launch.attempt
            self.changed.add(launch.job_id)
            self.launched.add(launch.job_id)
            self.running.add(launch.job_id)
        return NodeCommandReply(
            preempted=preempted, launched=[launch.job_id for launch in cmd.launch],
            progress=progress,
        )  # fmt: skip

    def _detach(self, job_id: str, node_id: str) -> list[str]:
        """The job's part on `node_id` stops holding its GPUs; returns the jobs still there."""
        left: list[str] = []
        job = self.jobs[job_id]
        job.ranks = None
        for g in job.parts.pop(node_id, ()):
            holders = self.holding[(node_id, g)]
            holders.remove(job_id)
            if not holders:
                del self.holding[(node_id, g)]
            left = holders
        if not job.parts:
            self.running.discard(job_id)
        return left

    def _partners_alone(self, partners: list[str], now: float) -> None:
        """Jobs whose space-sharing partner just left their GPUs: they keep the progress made
        at the pair's rate until `now`, and run on at their own rate from then on."""
        for job_id in partners:
            self.jobs[job_id].settle(now)
            self.changed.add(job_id)

    def _checkpoint(self, job: SimJob) -> None:
        """The job stops: it keeps what its last checkpoint saved, and pays a restore to resume."""
        checkpoint_s, _ = self.config.preemption_cost.of(job.job_type)
        job.done = job.floor = max(job.done - job.rate * checkpoint_s, 0.0)
        job.restarting, job.restoring = True, True

    # ------------------------------------------------------------------ the loop

    async def _call(self, endpoint: Endpoint[Any, Rep], msg: Any) -> Rep:
        """A request to the services; the progress the scheduler has not heard of goes first (on
        a tick or exits, with them; before a request that reaches it otherwise, in its own)."""
        if self.unreported and (endpoint is TICK or endpoint is EXITED):
            msg = msgspec.structs.replace(msg, steps=self._take_unreported())
        elif self.unreported and endpoint in (SUBMIT, CLUSTER_CHANGED):
            await self._request(STEPS, StepsUpdate(now=msg.now, jobs=self._take_unreported()))
        return await self._request(endpoint, msg)

    async def _request(self, endpoint: Endpoint[Any, Rep], msg: object) -> Rep:
        return await self.bus.call(
            endpoint, msg, within_s=self.config.call_timeout_s, retry_for_s=self.config.retry_for_s
        )

    def _take_unreported(self) -> dict[str, StepsReport]:
        unreported, self.unreported = self.unreported, {}
        return unreported

    async def _commands_handled(self) -> None:
        """Wait until the node commands the services' replies named (`SchedulerStatus.commands`,
        `NodesChangedReply.commands`) have been handled: published, they may come after the
        reply that names them."""
        limit = self.config.call_timeout_s or self.bus.request_timeout
        while self.commands_handled < self.commands_due and self.command_error is None:
            self.commands_in.clear()
            try:
                await asyncio.wait_for(self.commands_in.wait(), limit)
            except TimeoutError:
                raise RuntimeError(
                    f"placement's node commands #{self.commands_due} did not come within {limit} s"
                ) from None
        if self.command_error is not None:
            raise RuntimeError(self.command_error)

    def _load_churn(self) -> list[tuple[float, list[tuple[str, bool]]]]:
        """Node events grouped by instant: [(time, [(node, up), ...]), ...]."""
        if self.config.node_events is None:
            return []
        import pandas as pd

        df = pd.read_csv(self.config.node_events, dtype={"node": str})
        missing = {"time", "node", "up"} - set(df.columns)
        if missing:
            raise BadRequest(f"{self.config.node_events}: missing columns {sorted(missing)}")
        groups: list[tuple[float, list[tuple[str, bool]]]] = []
        for time_s, node, up in zip(
            df["time"].tolist(), df["node"].tolist(), df["up"].tolist(), strict=True
        ):
            if not groups or groups[-1][0] != time_s:
                groups.append((float(time_s), []))
            groups[-1][1].append((node, bool(up)))
            if node not in self.node_specs:
                self.node_specs[node] = NodeSpec(
                    node_id=node,
                    num_gpus=self.config.churn_node_gpus,
                    gpu_type=self.config.churn_node_type,
                )
                self.node_types[node] = self.config.churn_node_type
        return groups

    async def _run(
        self, workload: list[JobSpec], churn: list[tuple[float, list[tuple[str, bool]]]]
    ) -> None:
        try:
            nodes = self.config.cluster.nodes()
            if nodes:
                await self._call(NODES, NodesChanged(now=0.0, up=nodes))
            for spec in workload:
                assert spec.job_id is not None
                total = total_steps(spec, self.model)
                assert total is not None
                self.jobs[spec.job_id] = SimJob(spec, total)
            if self.config.gavel_round_s is not None:
                await self._loop_rounds(workload, self.config.gavel_round_s)
            else:
                await self._loop(workload, churn)
            if self.unreported:  # (the jobs a measurement window left running)
                now = self.progress.now
                await self._request(STEPS, StepsUpdate(now=now, jobs=self._take_unreported()))
        except Exception as exc:  # report, never hang the caller
            self.log.exception("simulation.failed")
            self.progress.error = f"{type(exc).__name__}: {exc}"
        self.progress.done = True
        await self._publish_progress()
        self.log.info("simulation.done", **msgspec.structs.asdict(self.progress))

    async def _loop(
        self, workload: list[JobSpec], churn: list[tuple[float, list[tuple[str, bool]]]]
    ) -> None:
        progress = self.progress
        next_churn = 0
        next_arrival = 0
        rejected = 0
        last_instant: float | None = None
        ticks_here = 0
        last_report = time.monotonic()
        while True:
            candidates = []
            if next_arrival < len(workload):
                candidates.append(self._delivery(workload[next_arrival]))
            completion = self._next_completion()
            if completion is not None:
                candidates.append(completion)
            unfinished = progress.finished < progress.total
            if next_churn < len(churn) and unfinished:
                candidates.append(churn[next_churn][0])
            if self.sched_wake is not None:
                candidates.append(max(self.sched_wake, last_instant or 0.0))
            if self.held and self.held_retry is not None:
                candidates.append(max(self.held_retry, last_instant or 0.0))
            if not candidates:
                break
            now = min(candidates)
            ticks_here = ticks_here + 1 if now == last_instant else 0
            last_instant = now
            progress.now = now
            progress.instants += 1

            # Nodes, then exits, then arrivals, then the round: the tick rides on the last request
            # of the instant (the scheduler runs the round if one is due), or goes alone.
            lost: list[str] | None = None
            if next_churn < len(churn) and churn[next_churn][0] == now:
                lost = await self._churn(now, churn[next_churn][1])
                next_churn += 1
            exits = self._pop_exits(now)
            batch: list[JobSpec] = []
            while next_arrival < len(workload) and self._delivery(workload[next_arrival]) <= now:
                batch.append(workload[next_arrival])
                next_arrival += 1
            # Jobs held by admission get another chance when others have left, or when admission
            # asked for one.
            due = self.held_retry is not None and self.held_retry <= now
            retry_held = self.held > 0 and (bool(exits) or due)
            ticked = False
            if lost is not None:
                last = not exits and not batch and not retry_held
                status = await self._call(
                    CLUSTER_CHANGED, ClusterChanged(now=now, lost_jobs=lost, tick=last)
                )
                self._note(now, status)
                ticked = last
            if exits:
                last = not batch and not retry_held
                status = await self._call(EXITED, ExitReport(now=now, exits=exits, tick=last))
                self._note(now, status)
                ticked = last
            if batch or retry_held:
                reply = await self._call(SUBMIT, SubmitRequest(now=now, jobs=batch, tick=True))
                progress.submitted += len(batch)
                self.held, self.held_retry = reply.held, reply.retry_at
                for r in reply.results:
                    if r.verdict == "reject":
                        rejected += 1
                        self.jobs.pop(r.job_id, None)
                        self.awaited.discard(r.job_id)
                if reply.scheduler is not None:
                    self._note(now, reply.scheduler)
                    ticked = True
            if not ticked and self.sched_wake is not None and self.sched_wake <= now:
                if ticks_here >= MAX_TICKS_PER_INSTANT:
                    raise RuntimeError(f"the scheduler keeps asking for a tick at t={now}")
                status = await self._call(TICK, TickRequest(now=now))
                self._note(now, status)
            await self._refresh(now)
            progress.finished = self.finished + rejected
            if self._window_done():
                break
            if time.monotonic() - last_report >= self.config.progress_interval_s:
                last_report = time.monotonic()
                await self._publish_progress()
        if progress.finished != progress.total and not self._window_done():
            stuck = progress.total - progress.finished
            raise RuntimeError(
                f"{stuck} jobs never finished ({self.held} held by admission): nothing runs, "
                f"nothing arrives, and the scheduler asks for no tick (do they need more GPUs "
                f"than the policy will ever give?)"
            )

    async def _loop_rounds(self, workload: list[JobSpec], round_s: float) -> None:
        """Gavel's simulator (`gavel_round_s`): time moves from round end to round end."""
        progress = self.progress
        next_arrival = 0
        rejected = 0
        compute_gpu_s = 0.0
        resolved = False  # a forced re-decision (nothing running) was tried at this instant
        last_report = time.monotonic()
        now = workload[0].submit_time or 0.0 if workload else 0.0
        while True:
            progress.now = now
            progress.instants += 1
            exits = self._pop_exits(now)  # the jobs whose last micro-task ended the round
            batch: list[JobSpec] = []
            while next_arrival < len(workload) and (workload[next_arrival].submit_time or 0.0) <= now:
                batch.append(workload[next_arrival])
                next_arrival += 1
            # The next round rides on the instant's last request (exits, then arrivals).
            submit = bool(batch or (self.held and exits))
            ticked = False
            if exits:
                report = ExitReport(now=now, exits=exits, tick=not submit)
                self._note(now, await self._call(EXITED, report))
                ticked = not submit
            if submit:
                reply = await self._call(SUBMIT, SubmitRequest(now=now, jobs=batch, tick=True))
                progress.submitted += len(batch)
                self.held = reply.held
                rejected += sum(1 for r in reply.results if r.verdict == "reject")
                for r in reply.results:
                    if r.verdict == "reject":
                        self.jobs.pop(r.job_id, None)
                        self.awaited.discard(r.job_id)
                if reply.scheduler is not None:
                    self._note(now, reply.scheduler)
                    ticked = True
            if not ticked:
                self._note(now, await self._call(TICK, TickRequest(now=now)))
            await self._refresh(now)
            progress.finished = self.finished + rejected
            if self._window_done():
                break
            end, busy = self._plan_round(now, round_s)
            compute_gpu_s += busy
            progress.compute_gpu_s = compute_gpu_s
            if time.monotonic() - last_report >= self.config.progress_interval_s:
                last_report = time.monotonic()
                await self._publish_progress()
            if end is not None:
                now = end
            elif next_arrival < len(workload):  # nothing runs: on to the next arrival
                now = max(now, workload[next_arrival].submit_time or 0.0)
            elif self._next_completion() is not None:  # a failure to report
                continue
            elif progress.finished < progress.total and not resolved:
                # Nothing runs and nothing more arrives: Gavel then resets its allocation.
                resolved = True
                self._note(now, await self._call(TICK, TickRequest(now=now, resolve=True)))
                await self._refresh(now)
                end, busy = self._plan_round(now, round_s)
                compute_gpu_s += busy
                if end is not None:
                    now, resolved = end, False
            else:
                break
        if progress.finished != progress.total and not self._window_done():
            raise RuntimeError(
                f"{progress.total - progress.finished} jobs never finished ({self.held} held by "
                f"admission): nothing runs, nothing arrives, and the scheduler starts nothing"
            )

    def _plan_round(self, now: float, round_s: float) -> tuple[float | None, float]:
        """Each running job's micro-task: `min(int(rate * round), steps left)` steps. Returns when
        the round ends (the last micro-task's end; None if nothing runs) and the GPU-seconds
        spent computing, and credits the steps at the round's end (a job whose steps are all done
        then exits there)."""
        running = sorted(j for j in self.running if self.jobs[j].rate > 0)
        if not running:
            return None, 0.0
        length = 0.0
        busy = 0.0
        sharing: set[tuple[str, int]] = set()
        for job_id in running:
            job = self.jobs[job_id]
            job.round_steps = min(float(int(job.rate * round_s)), max(job.total - job.done, 0.0))
            took = job.round_steps / job.rate
            length = max(length, took)
            gpus = job.gpu_set()
            if sharing.isdisjoint(gpus):  # a pair's GPUs count once
                busy += took * len(gpus)
            sharing |= gpus
        end = now + length
        for job_id in running:
            job = self.jobs[job_id]
            job.done += job.round_steps
            job.since = end
            if job.done >= job.total:  # it exits at the round's end, its work done before
                job.ended_at = now + job.round_steps / job.rate
                job.version += 1
                self.launches += 1
                heapq.heappush(self.heap, (end, self.launches, job_id, job.version))
        return end, busy

    async def _churn(self, now: float, events: list[tuple[str, bool]]) -> list[str] | None:
        """Nodes join and leave; jobs on a departed node lose that part (placement stops the rest).
        Returns those jobs, for the scheduler (None: no node changed)."""
        final: dict[str, bool] = {}
        for node, up in events:
            final[node] = up  # a node that flips twice in one instant ends in its last state
        up = [self.node_specs[n] for n, is_up in final.items() if is_up and n not in self.present]
        gone = [n for n, is_up in final.items() if not is_up and n in self.present]
        if not up and not gone:
            return None
        reply = await self._call(NODES, NodesChanged(now=now, up=up, gone=gone, reason="node events"))
        self.commands_due = max(self.commands_due, reply.commands)
        await self._commands_handled()  # (the parts of the jobs hit that it stopped elsewhere)
        self.present.difference_update(gone)
        self.present.update(n.node_id for n in up)
        self.gpus = sum(self.node_specs[n].num_gpus for n in self.present)
        for job_id in reply.lost_jobs:
            job = self.jobs[job_id]
            job.settle(now)
            if job.down_s and job.rate > 0:  # its share on the departed nodes is preempted
                lost = job.down_s * job.rate
                job.done -= lost
                job.floor = min(job.floor, job.done)  # (its checkpoint saved no more)
                self.progress.preemption_steps += lost
            job.base = sum(n for node, n in job.placed.items() if node not in final or final[node])
            for node in gone:
                self._detach(job_id, node)
            if not job.restarting:
                self._checkpoint(job)
            self.changed.add(job_id)
        return reply.lost_jobs

    def _delivery(self, spec: JobSpec) -> float:
        """When the job is submitted: its arrival, or the next arrival quantum."""
        arrival = spec.submit_time or 0.0
        quantum = self.config.arrival_quantum
        if self.config.at_node_events:
            return self._next_node_event(arrival)
        return math.ceil(arrival / quantum - 1e-9) * quantum if quantum else arrival

    def _next_node_event(self, t: float) -> float:
        """The first node-event instant at or after `t` (`t` itself after the last)."""
        i = bisect.bisect_left(self.churn_times, t)
        return self.churn_times[i] if i < len(self.churn_times) else t

    def _note(self, now: float, status: SchedulerStatus) -> None:
        self.sched_wake = status.wake_at
        self.commands_due = max(self.commands_due, status.commands)
        if status.ran_round:
            self.decided = now
        point = TimelinePoint(now, status.busy_gpus, status.queued, status.running, self.gpus)
        if self.timeline and self.timeline[-1].time == now:
            self.timeline[-1] = point
        else:
            self.timeline.append(point)

    async def _refresh(self, now: float) -> None:
        """New rates and completion times for the jobs whose parts changed at `now`. The jobs
        that made less than their rate says (restart pauses, restores, rescales) are told to the
        scheduler, as a real node agent's heartbeats would: its plans (ElasticFlow's admission)
        see the progress lost, as ElasticFlow's own do."""
        await self._commands_handled()
        sharing = self._sharing()
        behind: dict[str, StepsReport] = {}
        pauses = self._restarts(now)
        for job_id in sorted(self.changed | sharing.keys() | pauses.keys()):
            job = self.jobs.get(job_id)
            if job is None:  # ended at this instant
                continue
            if job_id not in self.changed and job_id not in sharing:
                job.settle(now)  # a running job restarting with the others
            job.version += 1
            job.restarting = False
            gpus = sum(len(p) for p in job.parts.values())
            partner = sharing.get(job_id)
            if partner is not None:  # space sharing: the pair's measured throughput
                other = self.jobs[partner].job_type
                job.rate = self.model.colocated(job.job_type, other, job.gpu_type, gpus)[0]
            else:
                job.rate = self.model.throughput(job.job_type, job.gpu_type, gpus) if gpus else 0.0
            job.since = now
            made = job.done
            self._charge_rescale(job, gpus)
            job.floor = job.done
            pause = pauses.get(job_id, 0.0)
            if job.restoring and job.rate > 0:
                pause += self.config.preemption_cost.of(job.job_type)[1]
                job.restoring = False
            if pause and job.rate > 0:
                job.done -= job.rate * pause  # no progress while (re)starting
            if job.done < made and job.rate > 0:  # behind what its rate alone says: tell
                behind[job_id] = StepsReport(job.done, now, job.rate)
            if gpus and job.rate <= 0:  # e.g. a batch that does not fit that GPU: it crashes
                job.failure = f"no throughput for {job.job_type!r} on {gpus} x {job.gpu_type}"
                self.launches += 1
                heapq.heappush(self.heap, (now, self.launches, job_id, job.version))
            elif job.rate > 0 and self.config.gavel_round_s is None:
                finish = now + max(job.total - job.done, 0.0) / job.rate
                quantum = self.config.completion_quantum
                if quantum:
                    finish = math.ceil(finish / quantum - 1e-9) * quantum
                if self.config.at_node_events:
                    finish = self._next_node_event(finish)
                if grid := self.config.completion_grid_s:
                    job.ended_at = finish
                    heapq.heappush(self.finishes, (finish, self.launches, job_id, job.version))
                    start = now + pause  # (its slots count from its restart's end)
                    finish = start + grid * math.ceil((finish - start) / grid - 1e-9)
                self.launches += 1
                heapq.heappush(self.heap, (finish, self.launches, job_id, job.version))
        self.changed.clear()
        self.launched.clear()
        self.unreported.update(behind)  # (told with our next request)

    def _charge_rescale(self, job: SimJob, gpus: int) -> None:
        """A job that grew (shrank) loses `up_s` (`down_s`) seconds of the rate it had before, at
        the size this instant's node losses left it (BFTrainer's rescale cost)."""
        before = job.held if job.base is None else job.base
        if gpus != before and (job.up_s or job.down_s) and before >= job.min_gpus and before:
            rate = self.model.throughput(job.job_type, job.gpu_type, before)
            lost = (job.up_s if gpus > before else job.down_s) * rate
            job.done -= lost
            self.progress.rescale_steps += lost
        job.held, job.base = gpus, None
        if job.up_s or job.down_s:  # (what a node loss leaves it: only rescale costs ask)
            job.placed = {node: len(part) for node, part in job.parts.items()}

    def _restarts(self, now: float) -> dict[str, float]:
        """Seconds each job spends (re)starting at `now` (`RestartCost`), if jobs were launched."""
        model = self.config.preemption_cost.restart
        if model is None:
            return {}
        if model.scope == "decisions":
            due = self.decided == now and (
                self.charged is None or now >= self.charged + model.decision_gap_s
            )
            if not due:
                return {}
            self.charged = now
        elif not self.launched:
            return {}
        # ElasticFlow's count: a cold start at every `cold_every`-th instant after the first
        every = model.cold_every
        cold = every > 0 and self.restart_instants > 0 and self.restart_instants % every == 0
        self.restart_instants += 1
        scope = self.launched if model.scope == "launched" else self.running
        pauses: dict[str, float] = {}
        for job_id in sorted(scope):
            job = self.jobs.get(job_id)
            if job is None or not job.parts:
                continue
            ranks = job.gpu_set()
            key: Hashable = ranks if model.warm_key == "gpus" else self._first_rank(ranks)
            warm = model.warm_ranks and key in self.warm
            self.warm.add(key)
            pauses[job_id] = model.seconds(len(ranks), warm=warm, cold=cold)
        if cold:
            self.warm.clear()
        return pauses

    def _first_rank(self, ranks: frozenset[tuple[str, int]]) -> tuple[int, int]:
        """(the rank of the set's first GPU in the cluster's order of nodes, its size)."""
        offsets = self.rank_offsets
        if len(offsets) < len(self.node_specs):
            total = 0
            for node_id, spec in self.node_specs.items():
                offsets[node_id] = total
                total += spec.num_gpus
        return min(offsets[node] + gpu for node, gpu in ranks), len(ranks)

    def _sharing(self) -> dict[str, str]:
        """The changed jobs that run on the very GPUs of another (space sharing), and their
        partners: {job: partner}."""
        pairs: dict[str, str] = {}
        for job_id in self.changed:
            job = self.jobs.get(job_id)
            for node, gpus in job.parts.items() if job is not None else ():
                holders = self.holding.get((node, gpus[0]), []) if gpus else []
                if len(holders) == 2:
                    a, b = holders
                    pairs[a], pairs[b] = b, a
        return pairs

    def _next_completion(self) -> float | None:
        heap = self.heap
        while heap:
            finish, _, job_id, version = heap[0]
            job = self.jobs.get(job_id)
            if job is not None and job.version == version:
                return finish
            heapq.heappop(heap)
        return None

    def _pop_exits(self, now: float) -> list[JobExit]:
        exits: list[JobExit] = []
        while self.finishes and self.finishes[0][0] <= now:  # finished: ends at this instant
            _, launch, job_id, version = heapq.heappop(self.finishes)
            heapq.heappush(self.heap, (now, launch, job_id, version))
        while (finish := self._next_completion()) is not None and finish <= now:
            _, _, job_id, _ = heapq.heappop(self.heap)
            for node in list(self.jobs[job_id].parts):
                self._partners_alone(self._detach(job_id, node), now)
            job = self.jobs.pop(job_id)
            if not job.failure:
                self.finished_steps += job.total
            if job.failure:
                exits.append(
                    JobExit(job_id=job_id, status="failed", reason=job.failure, attempt=job.attempt)
                )
            else:
                exits.append(
                    JobExit(
                        job_id=job_id, status="completed", steps_done=job.total,
                        attempt=job.attempt, ended_at=job.ended_at,
                    )
                )  # fmt: skip
            self.finished += 1
            self.awaited.discard(job_id)
        return exits

    def _window_done(self) -> bool:
        """Every job of the measurement window has ended (never, without one)."""
        return self.config.window is not None and not self.awaited

    async def _publish_progress(self) -> None:
        self.progress.steps_done = self.finished_steps + sum(
            max(j.done, 0.0) for j in self.jobs.values()
        )
        await self.bus.publish(PROGRESS, self.progress)


def write_workload(jobs: list[JobSpec], path: Path) -> None:
    """The file format `SimClockConfig.workload` reads."""
    encoder = msgspec.json.Encoder()
    with open(path, "wb") as f:
        for spec in jobs:
            f.write(encoder.encode(spec) + b"\n")

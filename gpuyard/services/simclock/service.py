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
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gpuyard.services.simclock.agents import SimJob, SimNodes
from gpuyard.services.simclock.config import SimClockConfig
from gpuyard.services.simclock.costs import PreemptionCost, RestartCost
from gpuyard.services.simclock.instants import EventInstants, GavelRounds, NodeEvents
from gpuyard.services.simclock.progress import Completions
from gpuyard.services.simclock.timeline import QueueChanges, Timeline
from gpuyard.services.simclock.workload import load_node_events, load_workload, write_workload
from gpuyard.shared.connection import Bus
from gpuyard.shared.contract import (
    Ack,
    CountsChange,
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
from gpuyard.shared.errors import BadRequest, RemoteError
from gpuyard.shared.goodput import Application, GoodputJob, load_applications
from gpuyard.shared.model import JobSpec, NodeSpec
from gpuyard.shared.service import Handler, Service
from gpuyard.shared.throughput import ThroughputModel, load_throughputs, total_steps
from gpuyard.shared.typed_goodput import TypedGoodputJob, TypedProfiles, typed_model

__all__ = [  # (what the simclock's users import from here)
    "PreemptionCost", "RestartCost", "SimClock", "SimClockConfig", "load_workload",
    "write_workload",
]  # fmt: skip

Rep = TypeVar("Rep")


class SimClock(Service):
    name = "simclock"

    def __init__(self, bus: Bus, config: SimClockConfig) -> None:
        super().__init__(bus)
        self.config = config
        self.model: ThroughputModel = load_throughputs(config.throughputs)
        queues = QueueChanges(config.queues) if config.queues is not None else None
        self.nodes = SimNodes(config.cluster, config.preemption_cost, queues)
        self.runs = Completions(self.nodes, self.model, config)
        self.decided: float | None = None  # the last instant at which the scheduler decided
        self.sched_wake: float | None = None
        self.quiet_until: float | None = None  # the scheduler's (`SchedulerStatus.quiet_until`)
        self.exit_decides = False  # ... and whether an exit would make it decide
        self.runs_ahead = False  # ... and whether it goes on through arrivals submitted ahead
        self.reached: float | None = None  # the instant its last reply went on to, if later
        self.wakes: list[float] = []  # the scheduler's own wakes it went through, up to then
        self.changes: list[CountsChange] = []  # its replies' changes at earlier instants
        self.timeline = Timeline(queues)
        self.task: asyncio.Task[None] | None = None
        self.progress = Progress(now=0.0, submitted=0, finished=0, total=0, instants=0)
        self.declined: dict[str, str] = {}
        """The jobs admission declined since the last progress report, and why (for the results:
        no service keeps them)."""
        self.declined_count = 0
        self.ended_by_scheduler = 0
        """Jobs the scheduler ended, as its last reply counted them (`SchedulerStatus.finished`):
        with those no run of ours ended (cancelled because a dependency never holds)."""
        self.unreported: dict[str, StepsReport] = {}  # progress the scheduler has not heard of
        self.commands_handled = 0  # the number of the last `clock.cmds` handled
        self.commands_due = 0  # ... that the services' replies named
        self.commands_in = asyncio.Event()  # set when one is handled
        self.commands_at: float | None = None  # the instant of those handled since `refresh`
        self.foreseen: list[float] = []
        """When the exits the current request foresees end, where it may go on through starts:
        each instant's leave before the commands of that instant or later are carried out."""
        self.foreseen_ended: list[JobExit] = []  # ... those exits, once they left
        self.command_error: str | None = None  # a command no simulated node could carry out
        self.applications: dict[str, Application] = {}  # the goodput jobs' models, by type
        self.typed: TypedProfiles | None = None  # ... or their per-GPU-type profiles
        self.gpu_types = tuple(dict.fromkeys(g.gpu_type for g in config.cluster.groups))
        """The cluster's GPU types, in its order (a typed job's first is its reference)."""

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

    async def run(self, _request: RunRequest) -> Ack:
        if self.task is not None:
            raise BadRequest("the simulation has already been started")
        # Reading the files (node events can be a million lines) stays off the event loop.
        workload = await asyncio.to_thread(load_workload, self.config.workload)
        if self.config.completion_origin == "first_arrival" and workload:
            self.runs.quantum_origin = min(spec.submit_time or 0.0 for spec in workload)
        if self.config.window is not None:
            first, end = self.config.window
            if not first < end <= len(workload):
                raise BadRequest(
                    f"window {first}:{end} is not within the workload's {len(workload)} jobs",
                    field="$.window",
                )
        if self.config.goodput is not None:
            profiles = Path(self.config.goodput.profiles)
            if self.config.goodput.per_type:
                self.typed = await asyncio.to_thread(self._typed_profiles, profiles, workload)
            else:
                self.applications = await asyncio.to_thread(load_applications, profiles)
        churn: NodeEvents = []
        if self.config.node_events is not None:
            churn = await asyncio.to_thread(load_node_events, self.config.node_events)
        for _, events in churn:  # nodes that only the events name
            for node, _ in events:
                if node not in self.nodes.node_specs:
                    self.nodes.add_node(NodeSpec(
                        node_id=node, num_gpus=self.config.churn_node_gpus,
                        gpu_type=self.config.churn_node_type,
                    ))  # fmt: skip
        self.runs.churn_times = [t for t, _ in churn]
        self.progress.total = len(workload)
        self.task = asyncio.create_task(self._run(workload, churn))
        return Ack()

    async def get_timeline(self, req: PageQuery) -> TimelinePage:
        limit, queues = self.timeline.queue_page(req.offset, req.limit)
        points = self.timeline.page(req.offset, limit)
        return TimelinePage(points=points, total=len(self.timeline), queues=queues)

    async def node_commands(self, batch: NodeCommands) -> None:
        """The commands of one apply (or nodes change) to several nodes, in their order. They are
        published: the steps of the jobs they stop go to the scheduler with our next request, and
        the loop waits for the commands a reply names before it goes on (`_commands_handled`)."""
        if batch.seq <= self.commands_handled:
            return  # (sent again by a placement that restarted before it stored having sent it)
        if batch.commands:
            at = batch.commands[0].now
            if self.commands_at is not None and at > self.commands_at:
                # The scheduler went on through starts (`TickRequest.least_run_s`): those of the
                # earlier instant run from then.
                self.unreported.update(self.runs.refresh(self.commands_at, self.decided))
            self.commands_at = at
            taken = bisect.bisect_right(self.foreseen, at)
            for foreseen in self.foreseen[:taken]:
                self.foreseen_ended += self.runs.exits(foreseen)
            del self.foreseen[:taken]
        try:
            for cmd in batch.commands:
                stopped = self.nodes.command(cmd).progress
                for job_id, steps in stopped.items():
                    seen = self.unreported.get(job_id)
                    if (
                        seen is None or seen.at < cmd.now or steps < seen.steps
                    ):  # (the slowest part)
                        self.unreported[job_id] = StepsReport(steps, cmd.now)
        except BadRequest as exc:
            self.command_error = f"placement's node commands #{batch.seq}: {exc.error}"
        self.commands_handled = batch.seq
        self.commands_in.set()

    async def node_command(self, cmd: NodeCommand) -> NodeCommandReply:
        """Be the node agent of `cmd.node_id`: stop and start the job parts placed there."""
        return self.nodes.command(cmd)

    # ------------------------------------------------------------------ what the loop asks

    async def call(self, endpoint: Endpoint[Any, Rep], msg: Any) -> Rep:
        """A request to the services; the progress the scheduler has not heard of goes first (on
        a tick or exits, with them; before a request that reaches it otherwise, in its own)."""
        if self.unreported and (endpoint is TICK or endpoint is EXITED):
            msg = msgspec.structs.replace(msg, steps=self._take_unreported())
        elif self.unreported and endpoint in (SUBMIT, CLUSTER_CHANGED):
            await self._request(STEPS, StepsUpdate(now=msg.now, jobs=self._take_unreported()))
        return await self._request(endpoint, msg)

    def _typed_profiles(self, folder: Path, workload: list[JobSpec]) -> TypedProfiles:
        """The per-type profiles, every (model, GPU type) the run needs read once up front (a
        bad or missing file fails the run before it starts, naming the file)."""
        try:
            typed = TypedProfiles(folder)
        except ValueError as exc:
            raise BadRequest(str(exc), field="$.goodput.profiles") from None
        for model in sorted({typed_model(spec.job_type)[0] for spec in workload}):
            if typed.has(model):
                for gpu_type in self.gpu_types:
                    typed.app(model, gpu_type)
        return typed

    def _profiled(self, model: str) -> bool:
        """Whether jobs of `model` train at their goodput."""
        if self.typed is not None:
            return self.typed.has(typed_model(model)[0])
        return model in self.applications

    def arrived(self, batch: list[JobSpec]) -> None:
        """The simulated processes of jobs about to be submitted: made as they arrive (a long
        replay holds those of the jobs that came and have not ended, not every job's)."""
        for spec in batch:
            assert spec.job_id is not None
            if self.typed is not None and self.typed.has(typed_model(spec.job_type)[0]):
                self._arrived_typed(spec, self.typed)
                continue
            app = self.applications.get(spec.job_type)
            if app is not None:  # it trains at its goodput: its work is its model's epochs
                settings = self.config.goodput
                assert settings is not None
                training = GoodputJob(app, spec.batch_size, restart_s=settings.restart_s)
                total = app.progress_at(
                    app.completion_epoch(spec.batch_size or app.init_batch_size) + 1
                )
                self.nodes.jobs[spec.job_id] = SimJob(
                    spec, total, self.nodes.queue_of(spec.user), training
                )
                continue
            steps = total_steps(spec, self.model)
            assert steps is not None
            job = self.nodes.jobs[spec.job_id] = SimJob(spec, steps, self.nodes.queue_of(spec.user))
            self.runs.waiting(spec.job_id, job, spec.submit_time)

    def _arrived_typed(self, spec: JobSpec, typed: TypedProfiles) -> None:
        """A job that trains at its goodput on whichever GPU type it runs (Sia's simulator):
        its work is its model's epochs, the same on every type. Its type names its model
        (`cifar10`, or `cifar10@4096`: a rigid job's, whose batch is its spec's)."""
        assert spec.job_id is not None
        settings = self.config.goodput
        assert settings is not None
        model = typed_model(spec.job_type)[0]
        training = TypedGoodputJob(
            typed, model, self.gpu_types,
            target_batch_size=None if settings.adaptive else spec.batch_size,
            restart_s=settings.restart_of(model), slowdown=settings.slowdowns.get(model, 1.0),
        )  # fmt: skip
        app = training.app
        total = app.progress_at(app.completion_epoch(spec.batch_size or app.init_batch_size) + 1)
        self.nodes.jobs[spec.job_id] = SimJob(spec, total, self.nodes.queue_of(spec.user), training)

    def note(self, now: float, status: SchedulerStatus) -> None:
        """The scheduler's reply at `now`: when it wants its next tick, the node commands to wait
        for, and the timeline's point."""
        self.sched_wake = status.wake_at
        self.ended_by_scheduler = status.finished
        self.quiet_until = status.quiet_until
        self.exit_decides = status.exit_decides
        self.runs_ahead = status.runs_ahead
        self.changes += status.changes
        self.commands_due = max(self.commands_due, status.commands)
        if status.reached is not None:  # (it went on to a later instant: the point is of that)
            now = self.reached = status.reached
            self.wakes += status.wakes
        if status.ran_round:
            self.decided = now
        self.timeline.put(
            TimelinePoint(now, status.busy_gpus, status.queued, status.running, self.nodes.gpus)
        )

    def finished(self) -> int:
        """Jobs that ended: their runs did, the scheduler ended them without one, or admission
        declined them."""
        return max(self.runs.finished, self.ended_by_scheduler) + self.declined_count

    def earlier_points(self, now: float, times: list[float], before: TimelinePoint | None) -> None:
        """The timeline's points at instants told of with the one at `now` (`times`, in order,
        after the point `before`): its counts and the changes the scheduler's replies gave."""
        if not times:
            self.changes.clear()
            return
        counts = [before.busy_gpus, before.queued, before.running] if before else [0, 0, 0]
        changes = sorted(self.changes, key=lambda c: c.time)  # (two replies' lists: merged)
        self.changes.clear()
        last = self.timeline.last()
        at = len(self.timeline) - (last is not None and last.time == now)
        points: list[TimelinePoint] = []
        i = 0
        for t in times:
            while i < len(changes) and changes[i].time <= t:
                c = changes[i]
                counts[0] += c.busy_gpus
                counts[1] += c.queued
                counts[2] += c.running
                i += 1
            points.append(TimelinePoint(t, counts[0], counts[1], counts[2], self.nodes.gpus))
        self.timeline.insert(at, points)

    async def refresh(self, now: float) -> None:
        """Once the node commands of `now` are handled: new rates and completion times for the
        jobs whose parts changed; the progress they lost is told with our next request."""
        await self._commands_handled()
        if self.commands_at is not None and self.commands_at < now:
            now = self.commands_at  # (the scheduler went on past its last start: they run since)
        self.unreported.update(self.runs.refresh(now, self.decided))
        self.commands_at = None

    async def change_nodes(self, now: float, events: list[tuple[str, bool]]) -> list[str] | None:
        """Nodes join and leave; jobs on a departed node lose that part (placement stops the rest).
        Returns those jobs, for the scheduler (None: no node changed)."""
        final, joining, leaving = self.nodes.node_events(events)
        if not joining and not leaving:
            return None
        msg = NodesChanged(now=now, up=joining, gone=leaving, reason="node events")
        reply = await self.call(NODES, msg)
        self.commands_due = max(self.commands_due, reply.commands)
        await self._commands_handled()  # (the parts of the jobs hit that it stopped elsewhere)
        self.nodes.nodes_changed(now, final, joining, leaving, reply.lost_jobs)
        return reply.lost_jobs

    async def publish_progress(self) -> None:
        progress = self.progress
        if progress.done:  # (a sum over every job: only the last report carries it)
            progress.steps_done = self.runs.steps_done()
        progress.declined, self.declined = self.declined, {}
        progress.rescale_steps = self.runs.rescale_steps
        progress.preemption_steps = self.nodes.preemption_steps
        await self.bus.publish(PROGRESS, progress)

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
            try:  # (asyncio.timeout: Python 3.11's wait_for may drop a cancellation)
                async with asyncio.timeout(limit):
                    await self.commands_in.wait()
            except TimeoutError:
                raise RuntimeError(
                    f"placement's node commands #{self.commands_due} did not come within {limit} s"
                ) from None
        if self.command_error is not None:
            raise RuntimeError(self.command_error)

    # ------------------------------------------------------------------ the run

    async def _run(self, workload: list[JobSpec], churn: NodeEvents) -> None:
        try:
            nodes = self.config.cluster.nodes()
            if nodes:
                await self.call(NODES, NodesChanged(now=0.0, up=nodes))
            round_s = self.config.gavel_round_s
            for spec in workload:  # (a job whose work cannot be known fails the run at its start)
                if self._profiled(spec.job_type):
                    continue
                if total_steps(spec, self.model) is None:
                    raise ValueError(
                        f"job {spec.job_id!r}: a simulated job needs duration or total_steps, "
                        f"or a model with a goodput profile (--profiles; its type is "
                        f"{spec.job_type!r})"
                    )
                if spec.time_limit_s is not None and round_s is not None:
                    raise ValueError(
                        f"job {spec.job_id!r} has a time limit: Gavel's rounds "
                        "(gavel_round_s) do not simulate time limits"
                    )
            loop = (
                GavelRounds(self, workload, round_s) if round_s is not None
                else EventInstants(self, workload, churn)
            )  # fmt: skip
            del workload  # (the loop submits each job once: its spec goes when the job ends)
            await loop.run()
            if self.unreported:  # (the jobs a measurement window left running)
                now = self.progress.now
                await self._request(STEPS, StepsUpdate(now=now, jobs=self._take_unreported()))
        except Exception as exc:  # report, never hang the caller
            self.log.exception("simulation.failed")
            # (a service's error reply says what failed, a policy's where: no type to add)
            remote = isinstance(exc, RemoteError)
            self.progress.error = str(exc) if remote else f"{type(exc).__name__}: {exc}"
        self.progress.done = True
        await self.publish_progress()
        done = msgspec.structs.asdict(self.progress) | {"declined": self.declined_count}
        self.log.info("simulation.done", **done)  # (how many declined: the list may be long)

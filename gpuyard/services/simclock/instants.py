"""Virtual time: the instants of a simulation, one after another, and what the clock asks of the
services at each. One loop for both cadences: at every event (arrivals, completions, node
events, the ticks the scheduler asks for: `EventInstants`), or from one Gavel round's end to the
next (`GavelRounds`). At an instant the clock tells the scheduler, in this order, of the nodes
that changed, the jobs that exited and the jobs that arrived (`plan_instant`), then makes the
running jobs' rates again."""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Literal, TypeVar

import msgspec

from gpuyard.shared.contract import (
    ClusterChanged,
    ExitReport,
    ForeseenExits,
    JobExit,
    SchedulerStatus,
    SubmitRequest,
    TickRequest,
)
from gpuyard.shared.endpoints import CLUSTER_CHANGED, EXITED, SUBMIT, TICK, Endpoint
from gpuyard.shared.model import JobSpec

if TYPE_CHECKING:
    from gpuyard.services.simclock.service import SimClock

MAX_TICKS_PER_INSTANT = 3
AHEAD_JOBS = 1000
"""Jobs submitted ahead of their arrival at once, where the scheduler goes on through them."""
FORESEEN_INSTANTS = 64
"""Completion instants told of ahead at most, where the scheduler goes on through them: twice
as many as the last time after it went through them all, half as many (but one more than it
went through) after it stopped short of them (told of again, those cost their telling twice)."""

Step = Literal["nodes", "exits", "submit"]
Told = TypeVar("Told", TickRequest, ExitReport)
NodeEvents = list[tuple[float, list[tuple[str, bool]]]]
"""Node events grouped by instant: [(time, [(node, up), ...]), ...]."""


def plan_instant(*, nodes: bool, exits: bool, submit: bool) -> list[tuple[Step, bool]]:
    """The requests of one instant, in their order (the nodes that changed, the jobs that exited,
    the jobs that arrived with those held to decide again), each with whether it carries the
    scheduler's tick: the last one does (the scheduler runs its round if one is due). None: a
    tick goes alone, if one is due."""
    asked: list[tuple[Step, bool]] = [("nodes", nodes), ("exits", exits), ("submit", submit)]
    steps = [s for s, due in asked if due]
    return [(step, i == len(steps) - 1) for i, step in enumerate(steps)]


def next_event(
    *, arrival: float | None, completion: float | None, node_event: float | None,
    wake: float | None, held_retry: float | None, last: float | None,
    training: float | None = None,
) -> float | None:  # fmt: skip
    """The next instant at which something can change: an arrival, a completion, a node event,
    the end of the goodput jobs' step (`training`), the tick the scheduler asked for or
    admission's time to decide on held jobs again (those two never before the last instant).
    None: nothing ever will."""
    floor = last or 0.0
    candidates = [t for t in (arrival, completion, node_event, training) if t is not None]
    candidates += [max(t, floor) for t in (wake, held_retry) if t is not None]
    return min(candidates, default=None)


class InstantLoop:
    """The instants of one run of `clock` over `workload` (sorted by arrival) with its node
    events, until every job has ended (or the measurement window's jobs have)."""

    retries_held_at = True
    """Whether held jobs are decided again at the time admission asks (not only at exits)."""
    batches_quiet = True
    """Whether the instants of the scheduler's quiet windows are told of together."""
    submits_ahead = True
    """Whether jobs may be submitted ahead of their arrival, for the scheduler to go on through
    while its decisions change nothing (`SchedulerStatus.runs_ahead`)."""
    stuck: str
    """Why jobs that never finished did not (the end of the error's line)."""

    def __init__(self, clock: SimClock, workload: list[JobSpec], churn: NodeEvents) -> None:
        self.clock = clock
        self.progress = clock.progress
        self.waiting = deque(workload)
        """The jobs not submitted yet, in arrival order (each leaves as it is: a long replay's
        specs go as their jobs end)."""
        self.ahead: deque[float] = deque()
        """When each job submitted ahead of its arrival arrives, in order (those admission
        declined too: their arrival is an instant all the same)."""
        self.foresight = FORESEEN_INSTANTS  # completion instants to tell of ahead
        self.declined_ahead: deque[tuple[float, str, str]] = deque()
        """The jobs submitted ahead that admission declined, told of as they arrive (a run
        stopped sooner never heard of them): (arrival, job, reason), in order."""
        self.churn = churn
        self.next_churn = 0
        self.held = 0  # jobs admission holds, as it last said
        self.held_retry: float | None = None  # when admission asked to decide on them again
        self.admission_batches = False  # admission takes arrivals of several instants at once
        self.awaited: set[str] = set()  # the window's jobs that have not ended yet
        if clock.config.window is not None:
            first, end = clock.config.window
            self.awaited = {spec.job_id for spec in workload[first:end] if spec.job_id}
        self.last_report = time.monotonic()

    async def run(self) -> None:
        progress = self.progress
        now = self.first_instant()
        while now is not None:
            now = await self.instant(now)
            if self.window_done():
                break
            await self.after_instant(now)
            if time.monotonic() - self.last_report >= self.clock.config.progress_interval_s:
                self.last_report = time.monotonic()
                await self.clock.publish_progress()
            now = await self.next_instant(now)
        if progress.finished != progress.total and not self.window_done():
            raise RuntimeError(
                f"{progress.total - progress.finished} jobs never finished ({self.held} held by "
                f"admission): nothing runs, nothing arrives, and {self.stuck}"
            )

    async def instant(self, now: float) -> float:
        """Nodes, then exits, then arrivals, then the round: the tick rides on the last request
        of the instant, or goes alone if the cadence says one is due. Instants after it that
        the scheduler's quiet window holds (`SchedulerStatus.quiet_until`) are told of with the
        last of them, their exits and arrivals each with its own time; returns that last one."""
        clock, progress = self.clock, self.progress
        clock.unreported.update(clock.runs.advance(now))  # (on the GPUs they held until now)
        lost: list[str] | None = None
        if self.next_churn < len(self.churn) and self.churn[self.next_churn][0] == now:
            lost = await clock.change_nodes(now, self.churn[self.next_churn][1])
            self.next_churn += 1
        before = clock.timeline.last()
        earlier: list[float] = []  # instants told of with this one
        exits: list[JobExit] = []
        batch: list[JobSpec] = []
        times: list[float] = []
        clock.reached, clock.wakes = None, []
        arriving = len(self.arrive_ahead(now))  # jobs submitted ahead that arrive now
        while True:
            progress.now = now
            progress.instants += 1
            ended = clock.runs.exits(now)
            for ex in ended:
                self.awaited.discard(ex.job_id)
            arrived = self.arrivals(now)
            progress.submitted += len(arrived)
            if earlier:  # (those submitted ahead that arrive at this instant told of with it)
                self.arrive_ahead(now)
            later = await self.quiet_after(now, bool(exits or ended)) if lost is None else None
            if later is None:
                exits += ended
                batch += arrived
                times += [now] * len(arrived) if earlier else []
                break
            earlier.append(now)
            exits += [msgspec.structs.replace(ex, ended_at=now) for ex in ended]
            batch += arrived
            times += [now] * len(arrived)
            progress.finished = clock.finished()
            now = later
        clock.unreported.update(clock.runs.stalled(now))
        # Jobs held by admission get another chance when others have left, or when admission
        # asked for one.
        due = self.held_retry is not None and self.held_retry <= now
        retry_held = self.held > 0 and (bool(exits) or due)
        plan = plan_instant(
            nodes=lost is not None, exits=bool(exits), submit=bool(batch) or retry_held
        )
        # With one request (or a lone tick) the scheduler may go on through the arrivals
        # submitted ahead, until the next thing only the clock knows of. Where it may, the next
        # arrivals go with any submission, so that the instants they arrive at need no other.
        ahead_ok = self.runs_ahead()
        until = self.horizon() if len(plan) <= 1 and not earlier and ahead_ok else None
        if ahead_ok and batch:
            ahead = self.submitted_ahead()
            if ahead:
                times = (times or [now] * len(batch)) + [self.delivery(spec) for spec in ahead]
                batch += ahead
        # (no job it could start ends sooner than these: it may go on through starts)
        least_run, least_end = clock.runs.least_runs(now) if until is not None else (None, None)
        bounded = least_run is not None or least_end is not None
        ticked = False
        foreseen: list[float] = []  # when the exits told of ahead end
        for step, tick in plan:
            if step == "nodes":
                assert lost is not None
                msg = ClusterChanged(now=now, lost_jobs=lost, tick=tick)
                clock.note(now, await clock.call(CLUSTER_CHANGED, msg))
                ticked = tick
            elif step == "exits":
                report = ExitReport(
                    now=now, exits=exits, tick=tick, until=until, least_run_s=least_run,
                    least_end=least_end,
                )  # fmt: skip
                foreseen = await self.tell(EXITED, report, bounded)
                ticked = tick
            else:
                ticked = await self.submit(now, batch, times, until)
        if not ticked and (self.tick_due(now) or arriving):
            request = TickRequest(now=now, until=until, least_run_s=least_run, least_end=least_end)
            foreseen = await self.tell(TICK, request, bounded)
        if clock.reached is not None and clock.reached > now:
            now = self.went_on(now, clock.reached, earlier, foreseen)
        if foreseen:  # (as many as it may go through next time: `FORESEEN_INSTANTS`)
            taken = bisect.bisect_right(foreseen, now)
            more = 2 * self.foresight if taken == len(foreseen) else self.foresight // 2
            self.foresight = min(max(more, taken + 1), FORESEEN_INSTANTS)
        clock.foreseen, clock.foreseen_ended = [], []
        clock.earlier_points(now, earlier, before)
        await clock.refresh(now)
        progress.finished = clock.finished()
        return now

    async def quiet_after(self, now: float, exits: bool) -> float | None:
        """The next instant, if it is within the scheduler's quiet window and nothing but exits
        and arrivals happen until then, or the window's end if nothing more happens in it and
        the scheduler will decide then (it asked to, or the window has `exits` that make it):
        it is then told of with this one (having refreshed the rates at `now`, as the
        instant's requests start nothing). None: this instant is told of now."""
        clock = self.clock
        quiet = clock.quiet_until
        if (
            not self.batches_quiet
            or quiet is None
            or now >= quiet
            or not self.admission_batches
            or self.held
            or clock.config.window is not None
            or clock.config.completion_grid_s is not None
            or clock.config.goodput is not None
        ):
            return None
        limits = [quiet, self.node_event_at()]
        if clock.sched_wake is not None:
            limits.append(clock.sched_wake)
        until = min(limits)

        decides = until == quiet and (clock.sched_wake == quiet or (exits and clock.exit_decides))

        def within() -> float | None:
            nxt = (self.next_delivery(), clock.runs.next_completion())
            later = min((t for t in nxt if t is not None), default=None)
            if later is not None and now < later < until:
                return later
            return quiet if decides and (later is None or later >= quiet) else None

        if within() is None:
            return None
        await clock.refresh(now)  # (a job whose partner left goes on at another rate)
        return within()

    def runs_ahead(self) -> bool:
        """Whether the scheduler may go on through arrivals submitted ahead: it says it may, and
        nothing the clock does at an arrival could change what it decides there (admission
        decides each job alone, holds none; no window, no restart charged at every decision,
        no end event or stall that only the clock's instants make)."""
        clock = self.clock
        config = clock.config
        restart = config.preemption_cost.restart
        return (
            self.submits_ahead
            and clock.runs_ahead
            and self.admission_batches
            and not self.held
            and config.window is None
            and config.completion_grid_s is None
            and config.predicted_ends is None
            and config.goodput is None
            and not config.at_node_events
            and (restart is None or restart.scope != "decisions")
        )

    def horizon(self) -> float | None:
        """The first instant after `now` that only the clock knows of: a completion or a node
        event (None: none is known, as when nothing runs: the scheduler is not asked to go on)."""
        completion = self.clock.runs.next_completion()
        first = min(math.inf if completion is None else completion, self.node_event_at())
        return None if first == math.inf else first

    def submitted_ahead(self) -> list[JobSpec]:
        """The next jobs to submit ahead of their arrival (up to `AHEAD_JOBS`, with every job
        arriving when the last does, before the next node event: admission decides on the
        cluster as it is)."""
        waiting = self.waiting
        limit = self.node_event_at()
        jobs: list[JobSpec] = []
        while waiting and (at := self.delivery(waiting[0])) < limit:
            if len(jobs) >= AHEAD_JOBS and at > self.ahead[-1]:
                break
            jobs.append(waiting.popleft())
            self.ahead.append(at)
        self.clock.arrived(jobs)
        return jobs

    def arrive_ahead(self, upto: float) -> list[float]:
        """The jobs submitted ahead that arrive by `upto`, counted (and admission's word on
        those it declined told of): when each arrives."""
        ahead, arrived = self.ahead, []
        while ahead and ahead[0] <= upto:
            arrived.append(ahead.popleft())
        self.progress.submitted += len(arrived)
        declined = self.declined_ahead
        while declined and declined[0][0] <= upto:
            _, job_id, reason = declined.popleft()
            self.clock.declined[job_id] = reason
            self.clock.declined_count += 1
        return arrived

    async def tell(
        self, endpoint: Endpoint[Told, SchedulerStatus], request: Told, bounded: bool
    ) -> list[float]:
        """The instant's tick (or exit report), with the exits of the completions it may go on
        through told of ahead (`foreseeing`), where its `until` is the next completion; returns
        when those end (the clock takes them as commands after them come in, if `bounded`)."""
        clock = self.clock
        if request.until is not None and request.until == clock.runs.next_completion():
            request = self.foreseeing(request, request.until)
        foreseen = [f.at for f in request.foreseen]
        clock.foreseen = list(foreseen) if bounded else []
        clock.note(request.now, await clock.call(endpoint, request))
        return foreseen

    def foreseeing(self, request: Told, until: float) -> Told:
        """The request (the instant's tick) with the exits at `until`, the next completion, and
        at the completions after it, told of ahead: the scheduler may go on through them to
        the completion after them (or the next node event). They stop short of a job not
        submitted yet (its arrival comes first) and of the next node event."""
        churn = self.node_event_at()
        arrival = self.delivery(self.waiting[0]) if self.waiting else math.inf
        foreseen = self.clock.runs.foresee(until, min(arrival, churn), self.foresight)
        if foreseen is None:
            return request
        instants, after = foreseen
        after = min(after if after is not None else math.inf, churn)
        if after == math.inf:  # (nothing known after them: the last is where going on ends)
            after = instants.pop()[0]
            if not instants:
                return request
        told = [ForeseenExits(at=at, exits=exits) for at, exits in instants]
        return msgspec.structs.replace(request, foreseen=told, until=after)

    def node_event_at(self) -> float:
        """When the next node event is (infinity: none is to come)."""
        return self.churn[self.next_churn][0] if self.next_churn < len(self.churn) else math.inf

    def went_on(
        self, now: float, reached: float, earlier: list[float], foreseen: list[float]
    ) -> float:
        """The scheduler went on from `now` to `reached` through arrivals submitted ahead (and
        the exits `foreseen` at those instants, which leave now for those it reached, and its
        own wakes): the instants on the way are told of (`earlier`); returns `reached`."""
        clock = self.clock
        visited = {*self.arrive_ahead(reached), *clock.wakes}
        ended = list(clock.foreseen_ended)  # (those that left as it went on through starts)
        for at in foreseen:
            if at > reached:
                break
            ended += clock.runs.exits(at)
            visited.add(at)
        for ex in ended:
            self.awaited.discard(ex.job_id)
        self.progress.instants += len(visited)
        earlier += [now, *sorted(t for t in visited if t < reached)]
        self.progress.now = reached
        return reached

    def next_delivery(self) -> float | None:
        """When the next job is submitted, or arrives having been submitted ahead (None: every
        job has arrived)."""
        if self.ahead:
            return self.ahead[0]
        return self.delivery(self.waiting[0]) if self.waiting else None

    def arrivals(self, now: float) -> list[JobSpec]:
        """The jobs submitted at `now`."""
        batch: list[JobSpec] = []
        waiting = self.waiting
        while waiting and self.delivery(waiting[0]) <= now:
            batch.append(waiting.popleft())
        self.clock.arrived(batch)
        return batch

    async def submit(
        self, now: float, batch: list[JobSpec], times: list[float], until: float | None
    ) -> bool:
        """Submit the arrivals (and have the held jobs decided again), with the tick; whether the
        scheduler got the tick. `times`: when each arrives (empty: all now); `until`: the
        scheduler may go on through those after now until then."""
        msg = SubmitRequest(now=now, jobs=batch, tick=True, times=times, until=until)
        reply = await self.clock.call(SUBMIT, msg)
        self.held = reply.held
        self.admission_batches = reply.batches
        if self.retries_held_at:
            self.held_retry = reply.retry_at
        declined = [r for r in reply.results if r.verdict == "reject"]
        arrivals = (
            dict(zip((s.job_id for s in batch), times, strict=True)) if declined and times else {}
        )
        for r in declined:
            at = arrivals.get(r.job_id) or now
            if at > now:  # (told of as it arrives)
                self.declined_ahead.append((at, r.job_id, r.reason))
            else:
                self.clock.declined[r.job_id] = r.reason
                self.clock.declined_count += 1
            self.clock.nodes.jobs.pop(r.job_id, None)
            self.awaited.discard(r.job_id)
        if reply.scheduler is None:
            return False
        self.clock.note(now, reply.scheduler)
        return True

    def window_done(self) -> bool:
        """Every job of the measurement window has ended (never, without one)."""
        return self.clock.config.window is not None and not self.awaited

    def delivery(self, spec: JobSpec) -> float:
        """When the job is submitted: its arrival, the next arrival quantum (Blox's round
        start) or the next node event (BFTrainer's replayer)."""
        arrival = spec.submit_time or 0.0
        config = self.clock.config
        if config.at_node_events:
            return self.clock.runs.next_node_event(arrival)
        quantum = config.arrival_quantum
        return math.ceil(arrival / quantum - 1e-9) * quantum if quantum else arrival

    # The cadence: when the instants are.

    def first_instant(self) -> float | None:
        raise NotImplementedError

    def tick_due(self, now: float) -> bool:
        """Whether an instant whose requests did not carry the tick needs one alone."""
        raise NotImplementedError

    async def after_instant(self, now: float) -> None:
        """What the cadence does once the instant's requests are answered."""

    async def next_instant(self, now: float) -> float | None:
        """The instant after `now` (None: the run is over)."""
        raise NotImplementedError


class EventInstants(InstantLoop):
    """Time jumps to the next instant at which something can change (`next_event`)."""

    stuck = (
        "the scheduler asks for no tick (do they need more GPUs than the policy will ever give?)"
    )

    def __init__(self, clock: SimClock, workload: list[JobSpec], churn: NodeEvents) -> None:
        super().__init__(clock, workload, churn)
        self.last: float | None = None
        self.ticks_here = 0  # ticks asked for again at the same instant

    def first_instant(self) -> float | None:
        return self._next()

    async def after_instant(self, now: float) -> None:
        self.last = now  # (the last of the instants told of together)

    def tick_due(self, now: float) -> bool:
        wake = self.clock.sched_wake
        if wake is None or wake > now:
            return False
        if self.ticks_here >= MAX_TICKS_PER_INSTANT:
            raise RuntimeError(f"the scheduler keeps asking for a tick at t={now}")
        return True

    async def next_instant(self, now: float) -> float | None:
        return self._next()

    def _next(self) -> float | None:
        unfinished = self.progress.finished < self.progress.total
        arrival = self.next_delivery()
        node_event = (
            self.churn[self.next_churn][0]
            if self.next_churn < len(self.churn) and unfinished
            else None
        )
        now = next_event(
            arrival=arrival, completion=self.clock.runs.next_completion(), node_event=node_event,
            wake=self.clock.sched_wake, held_retry=self.held_retry if self.held else None,
            last=self.last, training=self.clock.runs.next_training_step() if unfinished else None,
        )  # fmt: skip
        if now is not None:
            self.ticks_here = self.ticks_here + 1 if now == self.last else 0
            self.last = now
        return now


class GavelRounds(InstantLoop):
    """Gavel's simulator (`SimClockConfig.gavel_round_s`): time moves from round end to round
    end, a round ending when its last micro-task does (`Completions.plan_round`); arrivals are
    submitted at their time (no quantum; Gavel's rounds replay no node events), held jobs are
    decided again at exits, and every instant ticks."""

    retries_held_at = False
    batches_quiet = False
    submits_ahead = False
    stuck = "the scheduler starts nothing"

    def __init__(self, clock: SimClock, workload: list[JobSpec], round_s: float) -> None:
        super().__init__(clock, workload, [])
        self.round_s = round_s
        self.end: float | None = None  # the end of the round planned from the last instant
        self.compute_gpu_s = 0.0
        self.resolved = False  # a forced re-decision (nothing running) was tried at this instant

    def first_instant(self) -> float | None:
        return (self.waiting[0].submit_time or 0.0) if self.waiting else 0.0

    def delivery(self, spec: JobSpec) -> float:
        return spec.submit_time or 0.0

    def tick_due(self, now: float) -> bool:
        return True

    async def after_instant(self, now: float) -> None:
        self.plan(now)

    def plan(self, now: float) -> None:
        self.end, busy = self.clock.runs.plan_round(now, self.round_s)
        self.compute_gpu_s += busy
        self.progress.compute_gpu_s = self.compute_gpu_s

    async def next_instant(self, now: float) -> float | None:
        clock = self.clock
        if self.end is not None:
            return self.end
        if self.waiting:  # nothing runs: on to the next arrival
            return max(now, self.waiting[0].submit_time or 0.0)
        if clock.runs.next_completion() is not None:  # a failure to report
            return now
        if self.progress.finished < self.progress.total and not self.resolved:
            # Nothing runs and nothing more arrives: Gavel then resets its allocation.
            self.resolved = True
            clock.note(now, await clock.call(TICK, TickRequest(now=now, resolve=True)))
            await clock.refresh(now)
            self.plan(now)
            if self.end is not None:
                self.resolved = False
                return self.end
            return now
        return None

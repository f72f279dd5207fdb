"""Each simulated job's progress: its rate from the throughput model on the GPUs it holds (with
its space-sharing partner's, its restart pauses and rescale costs), when it finishes, and its
exit when it has. No I/O."""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque

from gpuyard.services.simclock.agents import SimJob, SimNodes
from gpuyard.services.simclock.config import SimClockConfig
from gpuyard.services.simclock.costs import Restarts
from gpuyard.shared.contract import JobExit, StepsReport
from gpuyard.shared.throughput import LinearModel, ThroughputModel
from gpuyard.shared.typed_goodput import TypedGoodputJob


class Completions:
    """The jobs' rates and completion times, made again for the jobs whose parts changed at an
    instant (`refresh`), and the jobs that have finished by an instant (`exits`).

    The config's `completion_quantum`, `completion_grid_s`, `at_node_events` and
    `gavel_round_s` say when a finished job's exit is reported."""

    def __init__(self, nodes: SimNodes, model: ThroughputModel, config: SimClockConfig) -> None:
        self.nodes = nodes
        self.jobs = nodes.jobs
        self.model = model
        self.cost = config.preemption_cost
        self.config = config
        self.restarts = Restarts(self.cost.restart, nodes.node_specs)
        self.heap: list[tuple[float, int, str, int]] = []  # (finish, launch, job, version)
        self.finishes: list[tuple[float, int, str, int]] = []  # real finishes (completion_grid_s)
        self.stalls: list[tuple[float, str, int]] = []  # (until, job, version): predicted_ends
        self.stalled_jobs: dict[str, int] = {}  # job -> version, past its `until`
        self.launches = 0
        self.finished = 0
        self.finished_steps = 0.0  # steps of the jobs that completed
        self.rescale_steps = 0.0  # steps lost to growing and shrinking jobs
        self.churn_times: list[float] = []  # instants with node events (`at_node_events`)
        self.quantum_origin = 0.0  # where the multiples of `completion_quantum` start
        self.training = config.goodput  # jobs that progress at their goodput (`advance`)
        self.next_step = 0.0  # when their next step ends
        self.bounds_runs = _runs_are_bounded(model, config)
        """Whether a job's least run time can be told from its work (`least_runs`): each job runs
        at its GPUs' rate from its launch, nothing else paces it (no pause, no partner, no time
        limit, no goodput); jobs that arrive may still say otherwise (`waiting`)."""
        self.types_of: tuple[int, list[str]] = (0, [])  # (nodes known, their GPU types)
        self.fastest: dict[tuple[str, int], float] = {}  # (job type, GPUs) -> its best rate
        self.not_running: list[tuple[float, str, float]] = []
        """(least run, job, its progress then) of the jobs that arrived and do not run, as a
        heap; those that started since, or ran, are dropped as they come to its top."""
        self.to_arrive: deque[tuple[float, float, str]] = deque()
        """(arrival, least run, job) of the jobs submitted ahead of their arrival, in arrival
        order; they join `not_running` once `least_runs` is asked at or after their arrival."""
        self.ends_ahead: deque[tuple[float, float, str]] = deque()
        """The same entries whose arrival + least run is less than every later one's: its first
        is the soonest any of them could end (a sliding window's minimum)."""
        self.arrived_by = -math.inf  # the last time `least_runs` was asked at

    def next_node_event(self, t: float) -> float:
        """The first node-event instant at or after `t` (`t` itself after the last)."""
        i = bisect.bisect_left(self.churn_times, t)
        return self.churn_times[i] if i < len(self.churn_times) else t

    def refresh(self, now: float, decided: float | None) -> dict[str, StepsReport]:
        """New rates and completion times for the jobs whose parts changed at `now` (`decided`:
        the last instant the scheduler decided at). Returns the jobs that made less than their
        rate says (restart pauses, restores, rescales), for the scheduler, as a real node
        agent's heartbeats would: its plans (ElasticFlow's admission) see the progress lost, as
        ElasticFlow's own do."""
        nodes = self.nodes
        sharing = nodes.sharing()
        behind: dict[str, StepsReport] = {}
        pauses = self.restarts.pauses(
            now, decided=decided, launched=nodes.launched, running=nodes.running,
            gpu_set=nodes.gpu_set,
        )  # fmt: skip
        for job_id in sorted(nodes.changed | sharing.keys() | pauses.keys()):
            job = self.jobs.get(job_id)
            if job is None:  # ended at this instant
                continue
            if job.training is not None:
                self.retrain(job_id, job, now)
                continue
            if job_id not in nodes.changed and job_id not in sharing:
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
            self.charge_rescale(job, gpus)
            job.floor = job.done
            if self.config.predicted_ends and job.rate > 0:  # (before its pause: the bug)
                job.until = math.ceil(now + max(job.total - job.done, 0.0) / job.rate - 1e-9)
                heapq.heappush(self.stalls, (job.until, job_id, job.version))
            pause = pauses.get(job_id, 0.0)
            if job.restoring and job.rate > 0:
                pause += self.cost.of(job.job_type)[1]
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
                self.schedule_finish(job_id, job, now, pause)
            if not gpus:
                self.waiting(job_id, job)
        nodes.changed.clear()
        nodes.launched.clear()
        return behind

    def waiting(self, job_id: str, job: SimJob, arrival: float | None = None) -> None:
        """`job` arrived (at `arrival`, if it is submitted ahead of it), or stopped: it may start
        again, and end no sooner than its least run (its work left at its most GPUs, on the
        fastest GPUs of the cluster) after that."""
        if not self.bounds_runs:
            return
        if job.training is not None or job.share is not None or job.up_s or job.down_s:
            self._unbounded()  # (their runs are paced otherwise)
            return
        if not self._same_types():
            return
        key = (job.job_type, job.most_gpus)
        fastest = self.fastest.get(key)
        if fastest is None:
            fastest = self.fastest[key] = max(
                self.model.throughput(job.job_type, gpu_type, job.most_gpus)
                for gpu_type in self.types_of[1]
            )
        if fastest <= 0:  # (it would crash on start)
            self._unbounded()
            return
        run = max(job.total - job.done, 0.0) / fastest
        arriving = self.to_arrive
        if (
            arrival is not None and arrival > self.arrived_by
            and (not arriving or arrival >= arriving[-1][0])
        ):  # fmt: skip
            entry = (arrival, run, job_id)
            arriving.append(entry)
            ends = self.ends_ahead
            while ends and ends[-1][0] + ends[-1][1] >= arrival + run:
                ends.pop()
            ends.append(entry)
            return
        heap = self.not_running
        if len(heap) > 2 * len(self.jobs) + 64:  # (mostly jobs that have started since)
            heap[:] = [e for e in heap if self._still_waits(e)]
            heapq.heapify(heap)
        heapq.heappush(heap, (run, job_id, job.done))

    def least_runs(self, now: float) -> tuple[float | None, float | None]:
        """How soon at the least a job that does not run at `now` would end, once started:
        no job waiting now runs less than the first (`TickRequest.least_run_s`), none arriving
        later ends before the second (`TickRequest.least_end`). None, None: not known (some
        job's run is paced otherwise); one None: no such job."""
        if not self.bounds_runs or not self._same_types():
            return None, None
        self.arrived_by = now
        arriving, ends, heap = self.to_arrive, self.ends_ahead, self.not_running
        while arriving and arriving[0][0] <= now:
            entry = arriving.popleft()
            if ends and ends[0] is entry:
                ends.popleft()
            _, run, job_id = entry
            job = self.jobs.get(job_id)
            if job is not None:
                heapq.heappush(heap, (run, job_id, job.done))
        while heap and not self._still_waits(heap[0]):
            heapq.heappop(heap)
        return (heap[0][0] if heap else None), (ends[0][0] + ends[0][1] if ends else None)

    def _same_types(self) -> bool:
        """Whether the cluster's GPU types are among those the least runs were told on, the
        first known (a node of another type could run a job faster: then none is told again;
        none known: nothing is told)."""
        node_types = self.nodes.node_types
        if len(node_types) != self.types_of[0]:  # (nodes joined or left)
            types = set(node_types.values())
            known = self.types_of[1]
            if known and not types <= set(known):
                self._unbounded()
                return False
            self.types_of = (len(node_types), known or sorted(types))
        if not self.types_of[1]:
            self._unbounded()
            return False
        return True

    def _unbounded(self) -> None:
        self.bounds_runs = False
        self.not_running.clear()
        self.to_arrive.clear()
        self.ends_ahead.clear()

    def _still_waits(self, entry: tuple[float, str, float]) -> bool:
        job = self.jobs.get(entry[1])
        return job is not None and not job.parts and job.done == entry[2]

    def advance(self, now: float) -> dict[str, StepsReport]:
        """Where a step of the goodput jobs (`SimJob.training`) ends at `now`: each running one
        makes its progress since its last step, as Pollux's simulator steps its jobs every
        round; those that finished in it exit at `now` (`exits`), their end when they
        finished. Returns their progress and goodput hints, for the scheduler."""
        settings = self.training
        if settings is None or now < self.next_step:
            return {}
        self.next_step = (math.floor(now / settings.step_s + 1e-9) + 1) * settings.step_s
        reports: dict[str, StepsReport] = {}
        for job_id in sorted(self.nodes.running):
            job = self.jobs.get(job_id)
            if job is not None and job.training is not None and job.since < now:
                self.train(job_id, job, now)
                if not job.training.finished:  # (one that did ends when it finished)
                    reports[job_id] = StepsReport(job.done, now, goodput=job.training.hints())
        return reports

    def next_training_step(self) -> float | None:
        """When the goodput jobs' next step ends, if one runs (None: none does)."""
        if self.training is None:
            return None
        running = (self.jobs.get(j) for j in self.nodes.running)
        if any(job is not None and job.training is not None for job in running):
            return self.next_step
        return None

    def train(self, job_id: str, job: SimJob, now: float) -> None:
        """The goodput job's progress from its last step to `now`; if it finished on the way, its
        exit is reported at `now` and its end is when it finished."""
        training = job.training
        assert training is not None
        if training.placement and not training.finished and now > job.since:
            finished = training.step(now - job.since)
            job.done = training.progress
            if finished is not None:
                job.ended_at = job.since + finished
                job.version += 1
                self.launches += 1
                heapq.heappush(self.heap, (now, self.launches, job_id, job.version))
        job.since = now

    def retrain(self, job_id: str, job: SimJob, now: float) -> None:
        """A goodput job whose GPUs changed at `now`: its progress on the old ones, then a
        restart on the new ones (none: it waits), on their type's profile for a typed one. Its
        placement is its GPUs per node, most first, as Pollux's simulator places a job (the most
        free node first)."""
        training = job.training
        assert training is not None
        self.train(job_id, job, now)
        if training.finished:
            return
        placement = sorted((len(gpus) for gpus in job.parts.values()), reverse=True)
        if isinstance(training, TypedGoodputJob) and placement:
            training.switch(job.gpu_type)  # (its parts are all of one type: placement's rule)
        training.reallocate(tuple(placement))

    def stalled(self, now: float) -> dict[str, StepsReport]:
        """The jobs that have stopped progressing (`predicted_ends`), with their progress as of
        `now`, at every instant until they restart: a scheduler that extrapolates a job's
        progress at its rate from its last report must not count steps it did not make."""
        while self.stalls and self.stalls[0][0] < now:
            _, job_id, version = heapq.heappop(self.stalls)
            self.stalled_jobs[job_id] = version
        stalled: dict[str, StepsReport] = {}
        for job_id, version in list(self.stalled_jobs.items()):
            job = self.jobs.get(job_id)
            if job is None or job.version != version:  # ended, or restarted since
                del self.stalled_jobs[job_id]
                continue
            job.settle(now)
            stalled[job_id] = StepsReport(job.done, now, job.rate)
        return stalled

    def schedule_finish(self, job_id: str, job: SimJob, now: float, pause: float) -> None:
        """When the job's exit is reported: its finish at its rate, or later (Blox's round
        quantum, BFTrainer's node events, ElasticFlow's slot grid)."""
        config = self.config
        finish = now + max(job.total - job.done, 0.0) / job.rate
        job.timed_out = job.limit_at is not None and job.limit_at < finish
        if job.timed_out:  # (its agent stops it there, whatever cadence ends report on)
            assert job.limit_at is not None
            self.launches += 1
            heapq.heappush(self.heap, (job.limit_at, self.launches, job_id, job.version))
            return
        quantum = config.completion_quantum
        if quantum:
            origin = self.quantum_origin
            finish = origin + math.ceil((finish - origin) / quantum - 1e-9) * quantum
        if config.at_node_events:
            finish = self.next_node_event(finish)
        if (grid := config.completion_grid_s) and job.until is not None:
            # ElasticFlow's bug (`predicted_ends`): its planned end event, from the real end
            # predicted before the pause; its work done by then only if the pause fits the slack
            # of rounding that end up to a second.
            predicted = job.until
            planned = now + grid * math.ceil((predicted - now) / grid - 1e-9) + pause
            done_by_then = finish <= predicted
            job.ended_at = (
                planned if config.predicted_ends == "planned" and not done_by_then else predicted
            )
            if done_by_then:
                heapq.heappush(self.finishes, (finish, self.launches, job_id, job.version))
            finish = planned
        elif grid:
            job.ended_at = finish
            heapq.heappush(self.finishes, (finish, self.launches, job_id, job.version))
            start = now + pause  # (its slots count from its restart's end)
            finish = start + grid * math.ceil((finish - start) / grid - 1e-9)
        self.launches += 1
        heapq.heappush(self.heap, (finish, self.launches, job_id, job.version))

    def charge_rescale(self, job: SimJob, gpus: int) -> None:
        """A job that grew (shrank) loses `up_s` (`down_s`) seconds of the rate it had before, at
        the size this instant's node losses left it (BFTrainer's rescale cost)."""
        before = job.held if job.base is None else job.base
        if gpus != before and (job.up_s or job.down_s) and before >= job.min_gpus and before:
            rate = self.model.throughput(job.job_type, job.gpu_type, before)
            lost = (job.up_s if gpus > before else job.down_s) * rate
            job.done -= lost
            self.rescale_steps += lost
        job.held, job.base = gpus, None
        if job.up_s or job.down_s:  # (what a node loss leaves it: only rescale costs ask)
            job.placed = {node: len(part) for node, part in job.parts.items()}

    def next_completion(self) -> float | None:
        heap = self.heap
        while heap:
            finish, _, job_id, version = heap[0]
            job = self.jobs.get(job_id)
            if job is not None and job.version == version:
                return finish
            heapq.heappop(heap)
        return None

    def exits(self, now: float) -> list[JobExit]:
        """The jobs whose exit is reported at `now`: they leave their GPUs and the simulation."""
        exits: list[JobExit] = []
        while self.finishes and self.finishes[0][0] <= now:  # finished: ends at this instant
            _, launch, job_id, version = heapq.heappop(self.finishes)
            heapq.heappush(self.heap, (now, launch, job_id, version))
        while (finish := self.next_completion()) is not None and finish <= now:
            _, _, job_id, _ = heapq.heappop(self.heap)
            for node in list(self.jobs[job_id].parts):
                self.nodes.partners_alone(self.nodes.detach(job_id, node, now), now)
            job = self.jobs.pop(job_id)
            ended = _exit_of(job_id, job)
            if job.timed_out:  # (the steps it made by then)
                self.finished_steps += ended.steps_done or 0.0
            elif not job.failure:
                self.finished_steps += job.total
            exits.append(ended)
            self.finished += 1
        return exits

    def foresee(
        self, at: float, before: float, most: int
    ) -> tuple[list[tuple[float, list[JobExit]]], float | None] | None:
        """The exits `exits(t)` will report at each completion instant `t` from `at` on, before
        `before` (at most `most` instants), should nothing change before then, and the next
        completion after them. They stop short of an instant where a job's leaving would change
        another's rate (a space-sharing partner); None where that is the first, or ends wait for
        an instant (`finishes`)."""
        if self.finishes:
            return None
        heap, holding = self.heap, self.nodes.holding
        popped: list[tuple[float, int, str, int]] = []
        instants: list[tuple[float, list[JobExit]]] = []
        after: float | None = at
        try:
            while after is not None and after < before and len(instants) < most:
                exits: list[JobExit] = []
                shared = False
                while (finish := self.next_completion()) is not None and finish <= after:
                    entry = heapq.heappop(heap)
                    popped.append(entry)
                    job = self.jobs[entry[2]]
                    for node, gpus in job.parts.items() if job.share is None else ():
                        shared = shared or any(len(holding[(node, g)]) > 1 for g in gpus)
                    exits.append(_exit_of(entry[2], job))
                if shared:  # (going on stops short of it)
                    break
                instants.append((after, exits))
                after = self.next_completion()
        finally:
            for entry in popped:
                heapq.heappush(heap, entry)
        return (instants, after) if instants else None

    def plan_round(self, now: float, round_s: float) -> tuple[float | None, float]:
        """Gavel's round from `now`: each running job's micro-task, `min(int(rate x round),
        steps left)` steps. Returns when the round ends (the last micro-task's end; None if
        nothing runs) and the GPU-seconds spent computing, and credits the steps at the round's
        end (a job whose steps are all done then exits there)."""
        running = sorted(j for j in self.nodes.running if self.jobs[j].rate > 0)
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

    def steps_done(self) -> float:
        """Steps trained so far by every job, finished or not (costs deducted)."""
        return self.finished_steps + sum(max(j.done, 0.0) for j in self.jobs.values())


def _runs_are_bounded(model: ThroughputModel, config: SimClockConfig) -> bool:
    """Whether the run's settings leave a job's run time to its work and its GPUs' rate (a
    linear model, no preemption cost, no cadence of ends)."""
    cost = config.preemption_cost
    return (
        isinstance(model, LinearModel)
        and all(factor > 0 for factor in model.factors.values())  # (none crashes on start)
        and cost.checkpoint_s == 0 and cost.restore_s == 0 and not cost.by_job_type
        and cost.restart is None
        and config.goodput is None
        and config.gavel_round_s is None
        and config.completion_grid_s is None
        and config.predicted_ends is None
    )  # fmt: skip


def _exit_of(job_id: str, job: SimJob) -> JobExit:
    """The exit a job that leaves the simulation reports."""
    if job.failure:
        return JobExit(job_id=job_id, status="failed", reason=job.failure, attempt=job.attempt)
    if job.timed_out:
        assert job.limit_at is not None
        done = job.done + job.rate * max(job.limit_at - job.since, 0.0)
        return JobExit(job_id=job_id, status="timeout", steps_done=done, attempt=job.attempt)
    return JobExit(
        job_id=job_id, status="completed", steps_done=job.total, attempt=job.attempt,
        ended_at=job.ended_at,
    )  # fmt: skip

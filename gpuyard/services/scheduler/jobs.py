"""The job table: every job the scheduler was given, and the transitions that change them.

Each job is one `JobRecord`, the same record the scheduler stores and sends; the counters (jobs
running, GPUs busy, jobs finished) change only inside the transitions below, so they cannot drift
from the records. Every transition marks the job `touched`, which is what a durable scheduler
writes before it replies.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Literal

from gpuyard.shared.contract import CountsChange, StepsReport
from gpuyard.shared.model import GoodputHints, JobRecord, JobSpec, JobState
from gpuyard.shared.policy import JobView, ViewContext
from gpuyard.shared.throughput import LinearModel

from .arrays import TASK_LIMIT, ArrayLimits
from .begins import BEGIN_TIME, Begins
from .dependencies import NEVER_SATISFIED, WAITING, Dependencies

Hold = Literal["", "user", "admin"]
HELD_REASONS = {"user": "JobHeldUser", "admin": "JobHeldAdmin"}
"""A held job's reason, as Slurm names it, by who held it (its owner, or an operator)."""


class JobTable:
    def __init__(self) -> None:
        self.jobs: dict[str, JobRecord] = {}
        """Every job, in admission order (less those that ended and were forgotten)."""
        self.admitted = 0
        """Jobs admitted so far (the next one's `seq`)."""
        self.ended: list[JobRecord] = []
        """The jobs that ended, in the order they ended, from the `ended_base`-th on."""
        self.ended_base = 0
        """Jobs that ended and were forgotten (`forget_ended`)."""
        self.active: dict[str, JobRecord] = {}
        """Queued and running jobs, in admission order."""
        self.stopping: dict[str, JobRecord] = {}
        """Running jobs cancelled or requeued, until their node agents say their parts stopped
        (not active: no decision includes them, so placement stops them; they show as running)."""
        self.held: dict[str, JobRecord] = {}
        """Waiting jobs held (`JobRecord.hold`): not active, so no decision starts them."""
        self.arrays = ArrayLimits()
        """Array tasks waiting for room in their array (`arrays.waiting`: not active)."""
        self.deps = Dependencies()
        """Waiting jobs whose dependencies do not hold yet (`deps.blocked`: not active either)."""
        self.begins = Begins()
        """Jobs waiting for their begin time (`begins.waiting`: not active, their dependencies
        not judged yet)."""
        self.resolved: list[tuple[JobRecord, float]] = []
        """Jobs a dependency released or cancelled since this was last cleared, and when (their
        events)."""
        self.running = 0
        self.busy_milli = 0
        self.busy_by_type: dict[str, int] = {}
        """Thousandths of GPUs busy per type (a job's share of a GPU as such; jobs sharing a
        partner's GPUs not counted)."""
        self.finished = 0
        self.touched: set[str] = set()
        """Jobs changed since the last write (durable: what to store)."""
        self.changed = False
        """The set of active jobs changed (a job came or went) since this was last cleared."""
        self.moved: dict[str, None] = {}
        """Jobs that came, started, stopped or ended since this was last cleared (each once): what
        a policy told what changed (`SchedulingInput.changed`) has to look at."""
        self.context = ViewContext(0.0, 0.0, LinearModel())
        """What the views see: the scheduler sets the time and model before each decision."""
        self.views: dict[str, JobView] = {}
        """A view of each active job, in admission order: made once, not at every decision
        (thousands of jobs wait in a long queue)."""

    @property
    def queued(self) -> int:
        return len(self.active) - self.running

    def get(self, job_id: str) -> JobRecord | None:
        return self.jobs.get(job_id)

    def __len__(self) -> int:
        return len(self.jobs)

    # ------------------------------------------------------------------ transitions

    def admit(self, spec: JobSpec, now: float, total_steps: float | None) -> JobRecord:
        """A new job, queued. `spec.job_id` must be new."""
        assert spec.job_id is not None and spec.job_id not in self.jobs
        record = JobRecord(
            job_id=spec.job_id, seq=self.admitted, spec=spec,
            submit_time=spec.submit_time if spec.submit_time is not None else now,
            admit_time=now, queued_since=now, total_steps=total_steps, progress_at=now,
        )  # fmt: skip
        self.jobs[record.job_id] = record
        self.admitted += 1
        self._touch(record)
        if spec.begin_time is not None and spec.begin_time > now:
            record.reason = BEGIN_TIME
            self.begins.add(record)
            return record
        if spec.depends_on and not self._judged(record, now):
            return record
        if not self.arrays.admits(record, self._active):
            record.reason = TASK_LIMIT
            return record
        self.active[record.job_id] = record
        self.views[record.job_id] = JobView.of(record, self.context)
        self._moved(record)
        self.changed = True
        return record

    def start(
        self, record: JobRecord, now: float, nodes: Iterable[str], gpus: int, gpu_type: str,
        rate: float, shares_with: str | None = None,
    ) -> bool:  # fmt: skip
        """The job runs from `now` on `gpus` GPUs of `gpu_type` on `nodes`, at `rate` steps/s.
        A running job started again (resized or moved) first settles its run. True if resized."""
        resized = record.state == "running"
        if resized:
            self._settle(record, now)
            self._busy(record, -1)  # as it was added
        else:
            self.running += 1
        record.state = "running"
        record.queued_since = None
        record.run_start = record.progress_at = now
        record.gpus, record.gpu_type, record.rate = gpus, gpu_type, rate
        record.nodes = sorted(set(nodes))
        if any(n not in record.ran_on for n in record.nodes):  # (a job moved every round: rarely)
            record.ran_on = sorted({*record.ran_on, *record.nodes})
        record.shares_with = shares_with
        record.reason = ""  # why it waited: no longer so
        record.unplaced_on = []
        record.attempt += 1
        if record.first_start is None:
            record.first_start = now
            self._others_judged(record.job_id, now)  # (`after` dependencies)
        self._busy(record, 1)
        self._touch(record)
        self._moved(record)
        return resized

    def placed(self, record: JobRecord, nodes: Iterable[str]) -> None:
        """Where a job started before placement said (a simulation's stage) runs."""
        record.nodes = sorted(set(nodes))
        if any(n not in record.ran_on for n in record.nodes):
            record.ran_on = sorted({*record.ran_on, *record.nodes})

    def requeue(
        self, record: JobRecord, now: float, reason: str, report: StepsReport | None = None
    ) -> bool:
        """A running job stopped (preempted, its node lost): it waits again. False if not running."""
        if record.state != "running":
            return False
        self._stop(record, now, report)
        record.state = "queued"
        record.queued_since = now
        record.preemptions += 1
        record.reason = reason
        return True

    def end(
        self, record: JobRecord, now: float, state: JobState, reason: str = "",
        steps: float | None = None,
    ) -> bool:  # fmt: skip
        """The job ended for good (completed, failed, cancelled). False if it had already ended."""
        if record.state not in ("queued", "running"):
            return False
        if record.state == "running":
            self._stop(record, now, StepsReport(steps, now) if steps is not None else None)
        elif steps is not None:
            record.steps_done = steps
        record.state = state
        record.queued_since = None
        record.end_time = now
        record.reason = reason  # why it ended (not why it once waited)
        if self.active.pop(record.job_id, None) is not None:
            del self.views[record.job_id]
            self.changed = True
            self._moved(record)
        self.held.pop(record.job_id, None)
        self.deps.unblock(record.job_id)
        self.arrays.leave(record.job_id)
        self.begins.leave(record.job_id)
        self.finished += 1
        self.ended.append(record)
        self._touch(record)
        self._others_judged(record.job_id, now)
        self._next_tasks(record)
        return True

    def cancel_running(self, record: JobRecord, now: float, reason: str, nodes: list[str]) -> None:
        """A running job is cancelled on node agents `nodes`: it is cancelled once each of them
        said its part stopped (`part_stopped`), and shows as running until then."""
        self._stop_on(record, now, nodes)
        record.cancelling = reason
        record.reason = f"cancelling ({reason})"

    def requeue_running(
        self, record: JobRecord, now: float, reason: str, nodes: list[str], hold: Hold
    ) -> None:
        """A running job is requeued on node agents `nodes`: it waits again (held by `hold`, if
        any) once each of them said its part stopped (`part_stopped`); running until then."""
        self._stop_on(record, now, nodes)
        record.requeueing, record.hold = reason, hold
        record.reason = f"requeueing ({reason})"

    def _stop_on(self, record: JobRecord, now: float, nodes: list[str]) -> None:
        assert record.state == "running" and record.job_id in self.active
        self._stop(record, now, None)
        record.nodes = list(nodes)
        del self.active[record.job_id]
        del self.views[record.job_id]
        self.stopping[record.job_id] = record
        self.changed = True

    def part_stopped(self, record: JobRecord, node_id: str, now: float) -> bool:
        """A job being cancelled or requeued: `node_id`'s part stopped (or the node is lost, so
        it fenced itself). True when that was the last: the job is cancelled, or waits again."""
        if node_id in record.nodes:
            record.nodes = [n for n in record.nodes if n != node_id]
            self._touch(record)
        if record.nodes or record.job_id not in self.stopping:
            return False
        del self.stopping[record.job_id]
        self._touch(record)
        if record.requeueing:
            record.state, record.queued_since = "queued", now
            record.preemptions += 1
            record.reason, record.requeueing = record.requeueing, ""
            self._wait(record)
            return True
        record.state, record.end_time = "cancelled", now
        record.reason, record.cancelling = record.cancelling, ""
        self.finished += 1
        self.ended.append(record)
        self._others_judged(record.job_id, now)
        self._next_tasks(record)
        return True

    def hold(self, record: JobRecord, by: Hold) -> None:
        """A waiting job starts no more until released: it leaves the active jobs (one waiting for
        its dependencies waits for them, then held)."""
        assert record.state == "queued" and by
        record.hold, record.reason = by, HELD_REASONS[by]
        if record.job_id in self.active:
            del self.active[record.job_id]
            del self.views[record.job_id]
            self.held[record.job_id] = record
            self.changed = True
            self._moved(record)
            self._next_tasks(record)
        self._touch(record)

    def release(self, record: JobRecord) -> None:
        """A held job waits to start again, in its place in admission order (or for its
        dependencies, if they do not hold yet)."""
        assert record.hold
        record.hold, record.reason = "", ""
        if self.held.pop(record.job_id, None) is not None:
            self._wait(record)
        elif record.job_id in self.begins.waiting:
            record.reason = BEGIN_TIME
        else:
            record.reason = WAITING if record.job_id in self.deps.blocked else TASK_LIMIT
        self._touch(record)

    def begin(self, now: float) -> list[JobRecord]:
        """The jobs whose begin time came by `now` wait to start, or for their dependencies,
        held if they are (those alone are looked at: the heap gives them). Returns them."""
        due = self.begins.due(now)
        for record in due:
            if not record.hold:
                record.reason = ""
            if not record.spec.depends_on or self._judged(record, now):
                self._wait(record)
            self._touch(record)
        return due

    # ------------------------------------------------------------------ dependencies

    def _judged(self, record: JobRecord, now: float) -> bool:
        """A waiting job's dependencies judged: True if they hold (it may wait to start), False
        if it waits for them (blocked) or was cancelled because they never can."""
        deps = self.deps
        needs = deps.needs.get(record.job_id)
        if needs is None:
            needs = deps.of(record, self.not_ended)
        decided, waits = deps.judge(needs, self.jobs.get)
        if decided == "holds":
            deps.unblock(record.job_id)
            return True
        if decided == "waits":
            deps.block(record, needs, waits)
            if not record.hold:
                record.reason = WAITING
            return False
        deps.unblock(record.job_id)
        record.state, record.end_time, record.reason = "cancelled", now, NEVER_SATISFIED
        record.queued_since = None
        self.held.pop(record.job_id, None)
        self.finished += 1
        self.ended.append(record)
        self.resolved.append((record, now))
        self._others_judged(record.job_id, now)
        return False

    def _others_judged(self, job_id: str, now: float) -> None:
        """`job_id` started or ended: the jobs waiting for it are judged again; those whose
        dependencies now hold wait to start (held, if they are)."""
        for record in self.deps.waiting_for(job_id):
            if self._judged(record, now):
                if not record.hold:
                    record.reason = ""
                self._wait(record)
                self.resolved.append((record, now))
            self._touch(record)

    def not_ended(self) -> Iterable[JobRecord]:
        """Every job that has not ended: waiting (for its begin time too), held, blocked, running,
        stopping."""
        yield from self.active.values()
        yield from self.held.values()
        yield from self.deps.blocked.values()
        yield from self.arrays.records()
        yield from self.begins.records()
        yield from self.stopping.values()

    def _active(self, job_id: str) -> bool:
        """Active, or running until its node agents say it stopped (an array task counts)."""
        return job_id in self.active or job_id in self.stopping

    def _next_tasks(self, record: JobRecord) -> None:
        """An array task left the active jobs: the tasks of its array waiting for room come in."""
        if record.spec.array is not None:
            for task in self.arrays.next_in(record, self._active):
                task.reason = ""
                self._wait(task)
                self._touch(task)

    def _wait(self, record: JobRecord) -> None:
        """A queued job joins the active jobs (held, if it is): in admission order, as the
        policies that walk them in order expect (a release or a requeue: rarely)."""
        if record.hold:
            record.reason = HELD_REASONS[record.hold]
            self.held[record.job_id] = record
            return
        if not self.arrays.admits(record, self._active):
            record.reason = TASK_LIMIT
            return
        late = bool(self.active) and next(reversed(self.active.values())).seq > record.seq
        self.active[record.job_id] = record
        self.views[record.job_id] = JobView.of(record, self.context)
        if late:
            self.active = dict(sorted(self.active.items(), key=lambda kv: kv[1].seq))
            self.views = {job_id: self.views[job_id] for job_id in self.active}
        self.changed = True
        self._moved(record)

    def report(self, record: JobRecord, report: StepsReport) -> float | None:
        """Progress measured by the job's node agents (steps done as of `report.at`; of a queued
        job, the steps it had done when it stopped). Returns
        the rate of this run: the one the agent measured from the job's own reports
        (`report.rate`), else the rate since the last report of the same run that reached us
        (None: nothing to measure). The agent's needs no earlier report here, so a run that
        lasts one round (Gavel's mechanism moves jobs every round) is measured too. Goodput
        hints the report brings replace the job's."""
        hints = report.goodput
        if hints is not None and report.at >= record.progress_at:
            record.goodput = hints
            told = record.batch_sizes
            if hints.batch_size and (not told or told[-1][1] != hints.batch_size):
                record.batch_sizes = [*told, (report.at, hints.batch_size)]
        if record.state == "queued" and report.at >= record.progress_at:
            # A stopped job's steps as it stopped, heard after (a simulation's nodes tell them
            # with the clock's next request): no run began since.
            record.steps_done = report.steps
            self._touch(record)
            self._moved(record)  # (a policy's order may read its remaining steps)
            return None
        if record.state != "running" or report.at < record.progress_at:
            return None
        measured = record.progress_at > record.run_start  # a report of this run came before
        rate: float | None = None
        if report.rate > 0:
            rate = report.rate
        elif measured and report.at > record.progress_at:
            rate = (report.steps - record.steps_done) / (report.at - record.progress_at)
        record.steps_done, record.progress_at = report.steps, report.at
        if rate is not None and rate > 0:
            record.rate = rate
        self._touch(record)
        return rate

    def told_goodput(self, record: JobRecord, hints: GoodputHints) -> None:
        """A real adaptive job's hints, fitted by the scheduler to what it measured
        (`batches.AdaptiveBatches`). Its batch sizes are those it was launched with
        (`told_batch`): measurements may come after it was launched again."""
        record.goodput = hints
        self._touch(record)

    def told_batch(self, record: JobRecord, at: float, batch_size: int) -> None:
        """The job trains at `batch_size` from `at` (`JobRecord.batch_sizes`, where it changed)."""
        told = record.batch_sizes
        if batch_size and (not told or told[-1][1] != batch_size):
            record.batch_sizes = [*told, (at, batch_size)]
            self._touch(record)

    def part_exited(self, record: JobRecord, node_id: str) -> bool:
        """One node's part of a running job exited 0; True when no other part is left."""
        if node_id and node_id in record.nodes:
            record.nodes = [n for n in record.nodes if n != node_id]
            self._touch(record)
        return not record.nodes

    # ------------------------------------------------------------------ restore

    def load(self, records: Iterable[JobRecord]) -> None:
        """Take records back (a restarted scheduler), in admission order; counters follow."""
        waiting: list[JobRecord] = []  # with dependencies: judged again
        for record in sorted(records, key=lambda r: r.seq):
            self.jobs[record.job_id] = record
            self.admitted = max(self.admitted, record.seq + 1)
            if record.cancelling or record.requeueing:
                self.stopping[record.job_id] = record
                continue
            if _before_begin(record):  # (a held one: its time decides again, then its hold)
                self.begins.add(record)
                continue
            if record.state == "queued" and (record.spec.depends_on or record.spec.array):
                waiting.append(record)  # (judged, or counted in its array, once all are back)
                continue
            if record.state == "queued" and record.hold:
                self.held[record.job_id] = record
                continue
            if record.state in ("queued", "running"):
                self.active[record.job_id] = record
                self.views[record.job_id] = JobView.of(record, self.context)
            else:
                self.finished += 1
                self.ended.append(record)
            if record.state == "running":
                self.running += 1
                self._busy(record, 1)
        self.ended.sort(key=lambda r: (r.end_time or 0.0, r.seq))
        for record in [*self.active.values(), *self.stopping.values()]:
            self.arrays.counted(record)
        for record in waiting:  # (sorted into admission order once, below)
            if record.spec.depends_on and not self._judged(record, record.admit_time):
                continue
            if record.hold:
                self.held[record.job_id] = record
            elif self.arrays.admits(record, self._active):
                self.active[record.job_id] = record
                self.views[record.job_id] = JobView.of(record, self.context)
        if waiting:
            self.active = dict(sorted(self.active.items(), key=lambda kv: kv[1].seq))
            self.views = {job_id: self.views[job_id] for job_id in self.active}
        self.resolved.clear()  # (told of before the restart)

    def forget_ended(self, upto: int, *, remember: bool = False) -> None:
        """The jobs that ended before the `upto`-th leave memory (their results were taken);
        `remember`: how each ended stays (`deps.outcomes`: a later job may depend on it)."""
        count = min(upto - self.ended_base, len(self.ended))
        if count <= 0:
            return
        outcomes = self.deps.outcomes
        for record in self.ended[:count]:
            del self.jobs[record.job_id]
            if remember:
                outcomes[record.job_id] = record.state
        del self.ended[:count]
        self.ended_base += count

    # ------------------------------------------------------------------ helpers

    def _stop(self, record: JobRecord, now: float, report: StepsReport | None) -> None:
        self._settle(record, now)
        if report is not None:
            record.steps_done = report.steps
        self.running -= 1
        self._busy(record, -1)
        record.gpus, record.gpu_type, record.rate = 0, None, 0.0
        record.nodes, record.shares_with = [], None
        self._touch(record)
        self._moved(record)

    def _busy(self, record: JobRecord, sign: int) -> None:
        """Count a running job's GPUs in (1) or out (-1) of the busy ones."""
        if record.shares_with is not None:
            return
        milli = sign * record.spec.milli(record.gpus)
        self.busy_milli += milli
        if (t := record.gpu_type) is not None:
            self.busy_by_type[t] = self.busy_by_type.get(t, 0) + milli

    @property
    def busy_gpus(self) -> int:
        """GPUs busy: shares of GPUs counted as their thousandths, the total rounded up."""
        return -(-self.busy_milli // 1000)

    @staticmethod
    def _settle(record: JobRecord, now: float) -> None:
        """Account the current run up to `now` (a new run, or none, follows)."""
        ran = now - record.run_start
        record.executed_time += ran
        share = record.spec.gpu_milli
        record.gpu_seconds += ran * record.gpus if share is None else ran * share / 1000
        if record.total_steps is not None:  # unknown work: its steps are those it reported
            record.steps_done += record.rate * (now - record.progress_at)
        record.run_start = record.progress_at = now

    def unplaced(self, record: JobRecord, gpu_type: str) -> None:
        """Placement could not place the waiting job on `gpu_type` (`JobRecord.unplaced_on`)."""
        if record.state == "queued" and gpu_type not in record.unplaced_on:
            record.unplaced_on = [*record.unplaced_on, gpu_type]
            self._touch(record)

    def _touch(self, record: JobRecord) -> None:
        self.touched.add(record.job_id)

    def _moved(self, record: JobRecord) -> None:
        self.moved[record.job_id] = None


def _before_begin(record: JobRecord) -> bool:
    """A stored job that waited for its begin time (or may have: a hold hides the reason)."""
    return (
        record.state == "queued"
        and record.first_start is None
        and record.spec.begin_time is not None
        and (record.reason == BEGIN_TIME or bool(record.hold))
    )


class CountsLog:
    """What a request telling of earlier instants changed in the table's counts, at each of
    them (`SchedulerStatus.changes`): a clock's timeline has a point at every instant it told of,
    though it told of several in one request. Changes at the request's own time are not logged:
    the reply's counts show them."""

    def __init__(self, table: JobTable, now: float) -> None:
        self.table = table
        self.started = now
        """The request's time."""
        self.now = now
        """The instant the request reached (`SchedulerStatus.reached`): the reply's counts are
        of it, the log has the changes before it."""
        self.by_time: dict[float, list[int]] = {}
        self.wakes: list[float] = []
        """The scheduler's own wakes it went on through (`SchedulerStatus.wakes`)."""

    @contextmanager
    def at(self, time: float) -> Iterator[None]:
        """Log what the transitions inside the block change, at `time`."""
        table = self.table
        before = (table.busy_gpus, table.queued, table.running)
        yield
        after = (table.busy_gpus, table.queued, table.running)
        if after != before:
            total = self.by_time.setdefault(time, [0, 0, 0])
            for i in range(3):
                total[i] += after[i] - before[i]

    def changes(self) -> list[CountsChange]:
        return [CountsChange(t, *d) for t, d in sorted(self.by_time.items()) if t < self.now]

"""Kueue's quota management as a scheduling policy: jobs run within their queue's nominal quota of
each GPU type, borrow what the other queues of its cohort leave unused (up to a borrowing limit,
within what they lend), and take it back when they need it (reclaim, preempting the borrowers),
as Kueue's scheduler admits workloads to ClusterQueues.

A decision takes the waiting jobs queue by queue, each queue's in order (priority, then
submission), the queues' next jobs together in Kueue's order (those that fit without borrowing
first, then by priority and submission), and admits each that fits now; one that does not may
preempt (`QueueSpec.reclaim_within_cohort`, `within_queue`), else it is passed over (Kueue's
BestEffortFIFO) and so are the jobs after it in its queue that need as many GPUs or more of it.
Running jobs keep their GPUs unless preempted so.

With fair sharing (`Queues.fair_sharing`), the queues' next jobs that borrow are taken in order of
their queues' shares, a queue's jobs of one priority in order of their users' shares, and a queue
may preempt another's borrowed jobs to borrow itself while its share with the job stays at most
the other's without it (Kueue's `LessThanOrEqualToFinalShare`).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import defaultdict
from typing import Any

import msgspec
from msgspec import Struct

from gpuyard.policies.toolkit.usage import Usage, account, decayed, mean_life
from gpuyard.shared.durations import slurm_duration
from gpuyard.shared.model import ANY_GPU, Allocation, JobRecord, JobSpec
from gpuyard.shared.policy import Decision, JobView, Needs, SchedulingInput, SchedulingPolicy

from .config import FairSharing, Queues, QueueSpec

Key = tuple[str, str]
"""(queue or cohort, GPU type)."""
InQueue = tuple[int, float, int]
"""A waiting job's place in its queue: (-priority, submission time, admission order)."""
Running = dict[str, tuple[JobView, QueueSpec, str]]
"""The running jobs that count against a queue: job -> (its view, its queue, its GPU type)."""
Lane = tuple[str, int]
"""Where a queue keeps a waiting job: (its user under fair sharing by users, else "", GPUs)."""


class KueueState(Struct):
    """Fair sharing's decayed usage per queue and per user."""

    queues: dict[str, Usage] = {}
    users: dict[str, Usage] = {}


class Book:
    """The GPUs each queue holds per type, what each cohort has lent and what the cluster has
    free, and whether a job of a queue fits."""

    def __init__(self, queues: dict[str, QueueSpec], capacity: dict[str, int]) -> None:
        self.queues = queues
        self.free = dict(capacity)
        self.used: dict[Key, int] = defaultdict(int)
        self.lent: dict[Key, int] = defaultdict(int)  # per cohort: GPUs held beyond guarantees
        self.pool: dict[Key, int] = defaultdict(int)  # per cohort: GPUs its queues lend
        for q in queues.values():
            if q.cohort:
                for t in q.quota:
                    self.pool[q.cohort, t] += q.lendable(t)

    def copy(self) -> Book:
        book = Book.__new__(Book)
        book.queues, book.free = self.queues, dict(self.free)
        book.used, book.lent = defaultdict(int, self.used), defaultdict(int, self.lent)
        book.pool = self.pool  # (fixed by the queues)
        return book

    def _over(self, q: QueueSpec, gpu_type: str, used: int) -> int:
        """What `used` GPUs of `q` take from its cohort's pool: beyond what it does not lend."""
        return max(0, used - (q.quota.get(gpu_type, 0) - q.lendable(gpu_type)))

    def fits(self, q: QueueSpec, gpu_type: str, gpus: int) -> bool:
        if self.free.get(gpu_type, 0) < gpus:
            return False
        used = self.used[q.name, gpu_type] + gpus
        quota = q.quota.get(gpu_type, 0)
        if not q.cohort:
            return used <= quota
        if used > quota + q.borrow_limit(gpu_type):
            return False
        more = self._over(q, gpu_type, used) - self._over(q, gpu_type, used - gpus)
        return self.lent[q.cohort, gpu_type] + more <= self.pool[q.cohort, gpu_type]

    def borrows(self, q: QueueSpec, gpu_type: str, gpus: int = 0) -> bool:
        return self.used[q.name, gpu_type] + gpus > q.quota.get(gpu_type, 0)

    def add(self, q: QueueSpec, gpu_type: str, gpus: int) -> None:
        before = self.used[q.name, gpu_type]
        self.used[q.name, gpu_type] = before + gpus
        self.free[gpu_type] = self.free.get(gpu_type, 0) - gpus
        if q.cohort:
            self.lent[q.cohort, gpu_type] += self._over(q, gpu_type, before + gpus) - self._over(
                q, gpu_type, before
            )

    def remove(self, q: QueueSpec, gpu_type: str, gpus: int) -> None:
        self.add(q, gpu_type, -gpus)


class Kueue(SchedulingPolicy):
    """Registry name `kueue`. Parameters: the queues file's content (`Queues`)."""

    Params = Queues
    State = KueueState

    def __init__(self, params: Queues | None = None) -> None:
        super().__init__(params if params is not None else Queues(queue=[]))
        p: Queues = self.params
        self.queues = {q.name: q for q in p.queue}
        self.user_queue = {user: q for q in p.queue for user in q.users}
        self.default = self.queues.get(p.default_queue) if p.default_queue else None
        self.fair: FairSharing | None = p.fair_sharing
        self.tau = mean_life(self.fair.half_life_s) if self.fair is not None else 0.0
        if self.tau > 0:  # (usage counted to each exit, not to the next decision)
            self.needs = Needs(decide_on_exit=True)
        self.usage = KueueState()
        # The active jobs as the last decisions left them, kept from the input's `changed` (a
        # decision then costs the jobs that changed and the queues' heads, not every waiting job;
        # none of it is state: it is made again from the jobs when the input has no `changed`).
        self._waiting: dict[str, dict[Lane, list[tuple[InQueue, str]]]] = defaultdict(dict)
        """Per queue, per lane (user, GPUs asked), the waiting jobs in order (a job passed over
        passes over the others as large at once)."""
        self._entries: dict[str, tuple[str, Lane, InQueue]] = {}  # job -> (queue, lane, place)
        self._views: dict[str, JobView] = {}  # waiting jobs
        self._kept = False
        # The running jobs, and the book of what they hold, kept as they start and end: a
        # decision starts from a copy (it costs the queues, not the running jobs).
        self._run: Running = {}
        self._holding: dict[str, tuple[QueueSpec | None, str, int, str]] = {}
        """Running job -> (its queue, GPU type, GPUs, user) as it was counted."""
        self._unqueued: dict[str, Allocation] = {}  # (running jobs whose queue was taken away)
        self._base = Book(self.queues, {})
        self._capacity: dict[str, int] = {}
        self._base_held: dict[str, int] = defaultdict(int)
        self._book: Book | None = None  # as the last decision left it (for waiting reasons)
        self._now = 0.0
        self._held: dict[str, int] = {}  # per user, GPUs held (fair sharing by users, now)

    def queue_of(self, job: JobView | JobRecord) -> QueueSpec | None:
        """The job's queue: its submitter's, else the default one (None: no queue takes it)."""
        return self.user_queue.get(job.spec.user, self.default)

    # ------------------------------------------------------------------ submission, reasons

    def accepts(self, spec: JobSpec) -> JobSpec | str:
        """The job with its priority class's priority and its queue's time limit, or why not:
        no queue takes its user, a priority class not defined, a time limit over the queue's."""
        p: Queues = self.params
        q = self.user_queue.get(spec.user, self.default)
        if q is None:
            who = f"user {spec.user!r}" if spec.user else "a job with no user"
            return (
                f"{who} has no queue: the queues file lists them in none and has no default_queue"
            )
        changes: dict[str, Any] = {}
        if spec.priority_class is not None:
            if spec.priority_class not in p.priority_classes:
                known = ", ".join(sorted(p.priority_classes)) or "none"
                return f"priority class {spec.priority_class!r} is not defined (defined: {known})"
            changes["priority"] = p.priority_classes[spec.priority_class]
        most = q.max_time_limit_s
        if spec.time_limit_s is None:
            if (default := q.default_time_limit_s or most) is not None:
                changes["time_limit_s"] = default
        elif most is not None and spec.time_limit_s > most:
            return (f"time limit of {slurm_duration(spec.time_limit_s)} is over queue {q.name}'s "
                    f"maximum of {slurm_duration(most)}")  # fmt: skip
        return msgspec.structs.replace(spec, **changes) if changes else spec

    def waiting_reason(self, record: JobRecord) -> str:
        """`QuotaExceeded` where GPUs of a type the job may use are free but its queue may not
        take them (as the last decision left the queues), naming the queue."""
        book = self._book
        q = self.queue_of(record)
        if q is None:
            return f"NoQueue (user {record.spec.user!r} is in no queue)"
        if book is None:
            return ""
        need, wanted = record.spec.num_gpus, record.spec.gpu_type
        types = [t for t in q.quota if wanted in (ANY_GPU, t)]
        free = [t for t in types if book.free.get(t, 0) >= need]
        if not free or any(book.fits(q, t, need) for t in free):
            return ""  # (GPUs it may take are busy, or others come first)
        t = free[0]
        used, quota = book.used[q.name, t], q.quota.get(t, 0)
        said = f"QuotaExceeded (queue {q.name} holds {used} of its {quota} {t} GPUs"
        if q.cohort:
            lent = book.pool[q.cohort, t] - book.lent[q.cohort, t]
            most = q.borrow_limit(t)
            limit = "" if math.isinf(most) else f", may borrow {most:g}"
            said += f"{limit}; cohort {q.cohort} has {lent} to lend"
        return f"{said}; it asks for {need})"

    # ------------------------------------------------------------------ state

    def snapshot(self) -> KueueState | None:
        return self.usage if self.tau > 0 else None

    def restore(self, state: KueueState) -> None:
        self.usage = state

    # ------------------------------------------------------------------ deciding

    def schedule(self, inp: SchedulingInput) -> Decision:
        self._keep_up(inp)
        self._now = inp.now
        book = self._base.copy()
        running = dict(self._run)
        self._held = defaultdict(int, self._base_held)
        reasons: dict[str, str] = {}
        started = self._admit(inp, book, running, reasons)
        self._book = book
        if self.tau > 0:
            self._account(inp.now, book)
        if inp.changed is not None:  # (what changes: the running jobs not stopped go on)
            return Decision(allocations=started, stop=list(reasons), keep_running=True,
                            reasons=reasons)  # fmt: skip
        kept = [Allocation(j, v.record.gpus, t) for j, (v, _, t) in running.items()]
        return Decision(allocations=[*self._unqueued.values(), *kept, *started], reasons=reasons)

    def _account(self, now: float, book: Book) -> None:
        """Usage from here on at the GPUs each queue and user holds now (what they used since
        the last decision counted at what they held then)."""
        held_q: dict[str, int] = defaultdict(int)
        for (name, _), gpus in book.used.items():
            held_q[name] += gpus
        account(self.usage.queues, held_q, now, self.tau)
        account(self.usage.users, self._held, now, self.tau)

    def _keep_up(self, inp: SchedulingInput) -> None:
        """The waiting jobs per queue, in order, and the running ones: from the jobs that changed
        since the last decision, or from every job."""
        capacity = inp.cluster.capacity
        if inp.changed is None or not self._kept:
            self._waiting.clear()
            self._entries.clear()
            self._views.clear()
            self._run.clear()
            self._holding.clear()
            self._unqueued.clear()
            self._base, self._base_held = Book(self.queues, capacity), defaultdict(int)
            self._capacity = dict(capacity)
            for job in inp.jobs:
                self._add(job)
            self._kept = True
            return
        for job_id, view in inp.changed.items():
            self._drop(job_id)
            if view is not None:
                self._add(view)
        if capacity != self._capacity:  # (nodes came or went)
            self._base, self._capacity = Book(self.queues, capacity), dict(capacity)
            for q, t, gpus, _ in self._holding.values():
                self._count(q, t, gpus)

    def _count(self, q: QueueSpec | None, gpu_type: str, gpus: int) -> None:
        """The base book holds `gpus` more (fewer, when negative) of `gpu_type` for `q`."""
        if q is None:
            self._base.free[gpu_type] = self._base.free.get(gpu_type, 0) - gpus
        else:
            self._base.add(q, gpu_type, gpus)

    def _add(self, job: JobView) -> None:
        r = job.record
        if r.state == "running":
            if r.gpus > 0 and r.gpu_type is not None:
                q = self.queue_of(job)
                self._holding[r.job_id] = (q, r.gpu_type, r.gpus, r.spec.user)
                self._count(q, r.gpu_type, r.gpus)
                if q is None:
                    self._unqueued[r.job_id] = Allocation(r.job_id, r.gpus, r.gpu_type)
                else:
                    self._run[r.job_id] = (job, q, r.gpu_type)
                    self._base_held[r.spec.user] += r.gpus
            return
        q = self.queue_of(job)
        if q is None:
            return
        place: InQueue = (-r.spec.priority, r.submit_time, r.seq)
        lane = (r.spec.user if self.fair is not None and self.fair.users else "", r.spec.num_gpus)
        insort(self._waiting[q.name].setdefault(lane, []), (place, r.job_id))
        self._entries[r.job_id] = (q.name, lane, place)
        self._views[r.job_id] = job

    def _drop(self, job_id: str) -> None:
        holding = self._holding.pop(job_id, None)
        if holding is not None:
            q, t, gpus, user = holding
            self._count(q, t, -gpus)
            self._unqueued.pop(job_id, None)
            if self._run.pop(job_id, None) is not None:
                self._base_held[user] -= gpus
        entry = self._entries.pop(job_id, None)
        if entry is not None:
            name, lane, place = entry
            waiting = self._waiting[name][lane]
            del waiting[bisect_left(waiting, (place, job_id))]
            del self._views[job_id]

    # ------------------------------------------------------------------ shares

    def _queue_share(self, book: Book, q: QueueSpec, more: int = 0, now: bool = False) -> float:
        """The queue's share, were it to borrow `more` GPUs beyond what it does (fair sharing):
        with a half-life its decayed usage unless `now` (what it borrows now: preemption takes
        borrowed GPUs down to equal shares of what the queues borrow, never for history)."""
        if self.tau > 0 and not now:
            used = decayed(self.usage.queues, q.name, self._now, self.tau)
        else:  # (Kueue's dominant resource share: what it borrows over what its cohort lends)
            borrowed = sum(max(0, book.used[q.name, t] - quota) for t, quota in q.quota.items())
            lends = sum(book.pool[q.cohort, t] for t in q.quota) if q.cohort else 0
            used = (borrowed + more) / lends if lends else 0.0
        return _over(used, q.weight)

    def _user_share(self, user: str) -> float:
        fair = self.fair
        if fair is None or not fair.users:
            return 0.0
        if self.tau > 0:
            used = decayed(self.usage.users, user, self._now, self.tau)
        else:
            used = float(self._held.get(user, 0))
        return _over(used, fair.user_weights.get(user, 1.0))

    def _extra(self, book: Book, q: QueueSpec, need: int) -> int:
        """The GPUs the queue would borrow beyond what it does, taking `need` more on its best
        type."""
        return min(
            (max(0, book.used[q.name, t] + need - quota) - max(0, book.used[q.name, t] - quota)
             for t, quota in q.quota.items()),
            default=need,
        )  # fmt: skip

    # ------------------------------------------------------------------ admitting

    def _admit(
        self, inp: SchedulingInput, book: Book, running: Running, reasons: dict[str, str]
    ) -> list[Allocation]:
        """The waiting jobs admitted, each queue's next ones together, in Kueue's order (each
        queue's: higher priority first, then the user with the least share under fair sharing,
        then the earlier submitted)."""
        views = self._views
        queues = [name for name, lanes in self._waiting.items() if any(lanes.values())]
        position: dict[tuple[str, Lane], int] = {}  # (queue, lane) -> the next job there
        passed: dict[str, float] = {}  # queue -> the fewest GPUs a job passed over needed
        started: list[Allocation] = []
        while queues:
            heads: list[tuple[QueueSpec, JobView]] = []
            for name in list(queues):
                # Its next job: the first in order of those needing fewer GPUs than one that
                # did not fit (one needing as many does not fit either).
                least = passed.get(name, math.inf)
                best: tuple[tuple[int, float, float, int], Lane, str] | None = None
                for lane, jobs in self._waiting[name].items():
                    i = position.get((name, lane), 0)
                    if lane[1] < least and i < len(jobs):
                        (priority, submitted, seq), job_id = jobs[i]
                        key = (priority, self._user_share(lane[0]), submitted, seq)
                        if best is None or key < best[0]:
                            best = (key, lane, job_id)
                if best is None:
                    queues.remove(name)
                    continue
                position[name, best[1]] = position.get((name, best[1]), 0) + 1
                heads.append((self.queues[name], views[best[2]]))
            heads.sort(key=lambda qj: self._order(book, *qj))
            for q, job in heads:
                gpu_type = self._admitted(inp, book, running, q, job, reasons)
                if gpu_type is None:
                    passed[q.name] = min(passed.get(q.name, math.inf), job.spec.num_gpus)
                    continue
                book.add(q, gpu_type, job.spec.num_gpus)
                self._held[job.spec.user] += job.spec.num_gpus
                started.append(Allocation(job.job_id, job.spec.num_gpus, gpu_type))
        return started

    def _order(self, book: Book, q: QueueSpec, job: JobView) -> tuple[bool, float, int, float, int]:
        """Kueue's order of the queues' next jobs: those that fit without borrowing first, then
        (fair sharing) the queue whose share would be the least, then priority, submission."""
        borrows = self._would_borrow(book, q, job)
        share = 0.0
        if self.fair is not None and borrows:
            share = self._queue_share(book, q, self._extra(book, q, job.spec.num_gpus))
        return (borrows, share, *_in_queue(job))

    def _types(self, inp: SchedulingInput, q: QueueSpec, job: JobView) -> list[str]:
        """The GPU types the job may run on in its queue, in the queue's order."""
        need = job.spec.num_gpus
        wanted = job.spec.gpu_type
        return [
            t for t in q.quota
            if wanted in (ANY_GPU, t) and inp.cluster.supports(job, t, need)
        ]  # fmt: skip

    def _would_borrow(self, book: Book, q: QueueSpec, job: JobView) -> bool:
        return all(book.borrows(q, t, job.spec.num_gpus) for t in q.quota) if q.quota else True

    def _admitted(
        self, inp: SchedulingInput, book: Book, running: Running, q: QueueSpec, job: JobView,
        reasons: dict[str, str],
    ) -> str | None:  # fmt: skip
        """The type the job is admitted on (preempting what it must), or None."""
        need = job.spec.num_gpus
        types = self._types(inp, q, job)
        for t in types:
            if book.fits(q, t, need):
                return t
        for t in types:
            victims = self._victims(book, running, q, job, t)
            if victims is not None:
                for job_id in victims:
                    v, vq, vt = running.pop(job_id)
                    book.remove(vq, vt, v.record.gpus)
                    self._held[v.spec.user] -= v.record.gpus
                    reasons[job_id] = (
                        f"preempted in queue {q.name} for {job.job_id} (priority "
                        f"{job.spec.priority})" if vq.name == q.name
                        else f"reclaimed by queue {q.name} for {job.job_id}"
                    )  # fmt: skip
                return t
        return None

    def _victims(
        self, book: Book, running: Running, q: QueueSpec, job: JobView, gpu_type: str
    ) -> list[str] | None:
        """The running jobs to preempt so that `job` fits on `gpu_type`, or None when no set of
        them makes room; the book is left as it was. Within its queue's quota: its own jobs of
        lower priority (`within_queue`) and other queues' borrowed ones (`reclaim_within_cohort`),
        in Kueue's order (other queues' borrowers first, then lower priority, then the newest).
        Beyond it, only under fair sharing: other queues' borrowed jobs while its share with the
        job stays at most theirs without them, the queue of the greatest share first."""
        need, priority = job.spec.num_gpus, job.spec.priority
        reclaims = q.reclaim_within_cohort
        beyond = book.borrows(q, gpu_type, need)
        fair = beyond and self.fair is not None and reclaims != "never" and bool(q.cohort)
        if beyond and not fair and q.within_queue == "never":
            return None  # (only its own jobs' leaving would bring it within its quota)
        candidates: list[tuple[tuple[float, int, int, float, int], str]] = []
        for job_id, (v, vq, vt) in running.items():
            if vt != gpu_type:
                continue
            lower = v.spec.priority < priority
            if vq.name == q.name:
                ok = q.within_queue == "lower_priority" and lower
            else:
                ok = bool(vq.cohort) and vq.cohort == q.cohort and book.borrows(vq, vt)
                ok = ok and (reclaims == "any" or (reclaims == "lower_priority" and lower))
            if ok:  # (other queues' borrowers first, lower priority first, the newest first)
                share = (
                    -self._queue_share(book, vq, now=True) if fair and vq.name != q.name else 0.0
                )
                order = (share, int(vq.name == q.name), v.spec.priority, -v.record.run_start,
                         -v.seq)  # fmt: skip
                candidates.append((order, job_id))
        if not candidates:
            return None
        candidates.sort()
        taken: list[tuple[str, QueueSpec, int]] = []
        chosen: list[str] = []
        fits = False
        for _, job_id in candidates:
            v, vq, vt = running[job_id]
            if vq.name != q.name:
                if not book.borrows(vq, vt):
                    continue  # (no longer borrowing: its jobs are its own)
                if fair and book.borrows(q, gpu_type, need):
                    mine = self._queue_share(book, q, self._extra(book, q, need), now=True)
                    book.remove(vq, vt, v.record.gpus)
                    theirs = self._queue_share(book, vq, now=True)
                    book.add(vq, vt, v.record.gpus)
                    if mine > theirs:
                        continue  # (it would take more than its fair share from them)
            book.remove(vq, vt, v.record.gpus)
            taken.append((vt, vq, v.record.gpus))
            chosen.append(job_id)
            if book.fits(q, gpu_type, need) and (fair or not book.borrows(q, gpu_type, need)):
                fits = True
                break
        for vt, vq, gpus in taken:
            book.add(vq, vt, gpus)
        return chosen if fits else None


def _over(used: float, weight: float) -> float:
    """A share: usage over weight (weight 0: infinite, served last)."""
    return used / weight if weight > 0 else math.inf


def _in_queue(job: JobView) -> tuple[int, float, int]:
    """A queue's order: higher priority first, then the earlier submitted."""
    return (-job.spec.priority, job.submit_time, job.seq)

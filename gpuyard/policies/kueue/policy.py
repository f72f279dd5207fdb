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
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import defaultdict

from gpuyard.shared.model import ANY_GPU, Allocation
from gpuyard.shared.policy import Decision, JobView, SchedulingInput, SchedulingPolicy

from .config import Queues, QueueSpec

Key = tuple[str, str]
"""(queue or cohort, GPU type)."""
InQueue = tuple[int, float, int]
"""A waiting job's place in its queue: (-priority, submission time, admission order)."""
Running = dict[str, tuple[JobView, QueueSpec, str]]
"""The running jobs that count against a queue: job -> (its view, its queue, its GPU type)."""


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

    def __init__(self, params: Queues | None = None) -> None:
        super().__init__(params if params is not None else Queues(queue=[]))
        p: Queues = self.params
        self.queues = {q.name: q for q in p.queue}
        self.user_queue = {user: q for q in p.queue for user in q.users}
        self.default = self.queues.get(p.default_queue) if p.default_queue else None
        # The active jobs as the last decisions left them, kept from the input's `changed` (a
        # decision then costs the jobs that changed and the queues' heads, not every waiting job;
        # none of it is state: it is made again from the jobs when the input has no `changed`).
        self._waiting: dict[str, dict[int, list[tuple[InQueue, str]]]] = defaultdict(dict)
        """Per queue, per GPUs asked, the waiting jobs in order (a job passed over passes over
        the others as large at once)."""
        self._entries: dict[str, tuple[str, int, InQueue]] = {}  # job -> (queue, GPUs, place)
        self._views: dict[str, JobView] = {}  # waiting jobs
        self._running: dict[str, JobView] = {}
        self._kept = False

    def queue_of(self, job: JobView) -> QueueSpec | None:
        """The job's queue: its submitter's, else the default one (None: no queue takes it)."""
        return self.user_queue.get(job.record.spec.user, self.default)

    def schedule(self, inp: SchedulingInput) -> Decision:
        self._keep_up(inp)
        book = Book(self.queues, inp.cluster.capacity)
        running: Running = {}
        unqueued: list[Allocation] = []  # (running jobs whose queue was taken away: they go on)
        for job in self._running.values():
            r = job.record
            if r.gpus <= 0 or r.gpu_type is None:
                continue
            q = self.queue_of(job)
            if q is None:
                book.free[r.gpu_type] = book.free.get(r.gpu_type, 0) - r.gpus
                unqueued.append(Allocation(r.job_id, r.gpus, r.gpu_type))
            else:
                book.add(q, r.gpu_type, r.gpus)
                running[r.job_id] = (job, q, r.gpu_type)
        reasons: dict[str, str] = {}
        started = self._admit(inp, book, running, reasons)
        kept = [Allocation(j, v.record.gpus, t) for j, (v, _, t) in running.items()]
        return Decision(allocations=unqueued + kept + started, reasons=reasons)

    def _keep_up(self, inp: SchedulingInput) -> None:
        """The waiting jobs per queue, in order, and the running ones: from the jobs that changed
        since the last decision, or from every job."""
        if inp.changed is None or not self._kept:
            self._waiting.clear()
            self._entries.clear()
            self._views.clear()
            self._running.clear()
            for job in inp.jobs:
                self._add(job)
            self._kept = True
            return
        for job_id, view in inp.changed.items():
            self._drop(job_id)
            if view is not None:
                self._add(view)

    def _add(self, job: JobView) -> None:
        r = job.record
        if r.state == "running":
            self._running[r.job_id] = job
            return
        q = self.queue_of(job)
        if q is None:
            return
        place: InQueue = (-r.spec.priority, r.submit_time, r.seq)
        gpus = r.spec.num_gpus
        insort(self._waiting[q.name].setdefault(gpus, []), (place, r.job_id))
        self._entries[r.job_id] = (q.name, gpus, place)
        self._views[r.job_id] = job

    def _drop(self, job_id: str) -> None:
        self._running.pop(job_id, None)
        entry = self._entries.pop(job_id, None)
        if entry is not None:
            name, gpus, place = entry
            waiting = self._waiting[name][gpus]
            del waiting[bisect_left(waiting, (place, job_id))]
            del self._views[job_id]

    def _admit(
        self, inp: SchedulingInput, book: Book, running: Running, reasons: dict[str, str]
    ) -> list[Allocation]:
        """The waiting jobs admitted, each queue's next ones together, in Kueue's order (each
        queue's: higher priority first, then the earlier submitted)."""
        views = self._views
        queues = [name for name, sizes in self._waiting.items() if any(sizes.values())]
        position: dict[tuple[str, int], int] = {}  # (queue, GPUs) -> the next job there
        passed: dict[str, float] = {}  # queue -> the fewest GPUs a job passed over needed
        started: list[Allocation] = []
        while queues:
            heads: list[tuple[QueueSpec, JobView]] = []
            for name in list(queues):
                # Its next job: the first in order of those needing fewer GPUs than one that
                # did not fit (one needing as many does not fit either).
                least = passed.get(name, math.inf)
                best: tuple[int, tuple[InQueue, str]] | None = None
                for gpus, jobs in self._waiting[name].items():
                    i = position.get((name, gpus), 0)
                    if gpus < least and i < len(jobs) and (best is None or jobs[i] < best[1]):
                        best = (gpus, jobs[i])
                if best is None:
                    queues.remove(name)
                    continue
                position[name, best[0]] = position.get((name, best[0]), 0) + 1
                heads.append((self.queues[name], views[best[1][1]]))
            heads.sort(key=lambda qj: (self._would_borrow(book, *qj), *_in_queue(qj[1])))
            for q, job in heads:
                gpu_type = self._admitted(inp, book, running, q, job, reasons)
                if gpu_type is None:
                    passed[q.name] = min(passed.get(q.name, math.inf), job.spec.num_gpus)
                    continue
                book.add(q, gpu_type, job.spec.num_gpus)
                started.append(Allocation(job.job_id, job.spec.num_gpus, gpu_type))
        return started

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
        """The running jobs to preempt so that `job` fits on `gpu_type` within its queue's quota
        (preemption never makes room to borrow: Kueue's order, other queues' borrowers first,
        then lower priority, then the newest), or None when no set of them makes room. The book
        is left as it was."""
        need, priority = job.spec.num_gpus, job.spec.priority
        if q.within_queue == "never" and book.borrows(q, gpu_type, need):
            return None  # (only its own jobs' leaving would bring it within its quota)
        reclaims = q.reclaim_within_cohort
        candidates: list[tuple[tuple[int, int, float, int], str]] = []
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
                order = (int(vq.name == q.name), v.spec.priority, -v.record.run_start, -v.seq)
                candidates.append((order, job_id))
        if not candidates:
            return None
        candidates.sort()
        taken: list[tuple[str, QueueSpec, int]] = []
        chosen: list[str] = []
        fits = False
        for _, job_id in candidates:
            v, vq, vt = running[job_id]
            if vq.name != q.name and not book.borrows(vq, vt):
                continue  # (no longer borrowing: its jobs are its own)
            book.remove(vq, vt, v.record.gpus)
            taken.append((vt, vq, v.record.gpus))
            chosen.append(job_id)
            if book.fits(q, gpu_type, need) and not book.borrows(q, gpu_type, need):
                fits = True
                break
        for vt, vq, gpus in taken:
            book.add(vq, vt, gpus)
        return chosen if fits else None


def _in_queue(job: JobView) -> tuple[int, float, int]:
    """A queue's order: higher priority first, then the earlier submitted."""
    return (-job.spec.priority, job.submit_time, job.seq)

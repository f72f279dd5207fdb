"""Jobs that may not start before a time (`JobSpec.begin_time`, Slurm's `--begin`): they wait here,
with reason `BeginTime`, out of the active jobs, in a heap by begin time. The job table takes in
those whose time came (only those: the others are not looked at) and the scheduler wakes up at
the earliest (`next_time`). No I/O: the job table asks."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from gpuyard.shared.model import JobRecord

BEGIN_TIME = "BeginTime"


class Begins:
    def __init__(self) -> None:
        self.waiting: dict[str, JobRecord] = {}
        """The jobs waiting for their begin time (held ones too: a hold outlasts it)."""
        self.heap: list[tuple[float, int, str]] = []
        """(begin time, admission order, job): the waiting jobs' times, and those of jobs that
        left since (they ended: dropped as they reach the top, not searched for)."""

    def add(self, record: JobRecord) -> None:
        assert record.spec.begin_time is not None and record.job_id not in self.waiting
        self.waiting[record.job_id] = record
        heapq.heappush(self.heap, (record.spec.begin_time, record.seq, record.job_id))

    def leave(self, job_id: str) -> None:
        """A waiting job left (it ended)."""
        self.waiting.pop(job_id, None)

    def next_time(self) -> float | None:
        """The earliest begin time of a waiting job (None: none waits)."""
        heap, waiting = self.heap, self.waiting
        while heap and heap[0][2] not in waiting:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def due(self, now: float) -> list[JobRecord]:
        """The jobs whose begin time is at or before `now`, earliest first (ties: admission
        order); they leave the waiting jobs."""
        found: list[JobRecord] = []
        while (at := self.next_time()) is not None and at <= now:
            found.append(self.waiting.pop(heapq.heappop(self.heap)[2]))
        return found

    def records(self) -> Iterator[JobRecord]:
        yield from self.waiting.values()

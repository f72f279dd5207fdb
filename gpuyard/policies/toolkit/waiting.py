"""A waiting order: the jobs in the order of a key that moves with time for running jobs only.

SRTF's and LAS's keys (remaining time, attained service) change as running jobs run, but not
while a job waits: a waiting job's key changes when the job does (`SchedulingInput.changed`),
when the throughput model does, or when it starves (its class moves up one, `queued_since +
starvation_s`). `WaitingOrder` keeps the waiting jobs sorted across decisions, sorts only the
running ones at each decision and walks the two merged: the walk's order is
`sorted(inp.jobs, key=...)`'s, job for job, and its allocations `fill_in_order`'s, at the cost
of what runs, what changed and what the walk reaches rather than of the whole queue. Without
`changed` in the input it sorts every job.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Any

from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import JobView, SchedulingInput
from gpuyard.shared.throughput import ThroughputModel

from .ordering import fill_in_order, holdings, walk
from .starvation import is_starved

Key = Callable[[JobView, float], tuple[Any, ...]]
"""A job's sort key at a time (unique: it ends with the job's admission order, `seq`)."""


class WaitingOrder:
    """`fill(inp)`: `fill_in_order` over `inp.jobs` sorted by `key(job, inp.now)`, where a
    waiting job's key reads only the job's record, the throughput model and whether it starved
    (`is_starved` with `starvation_s`), and a running job's may read anything."""

    def __init__(self, key: Key, starvation_s: float | None) -> None:
        self.key = key
        self.starvation_s = starvation_s
        self._entries: dict[str, tuple[Any, ...]] = {}
        """Waiting job -> its entry in `_waiting` (its key, then its id)."""
        self._waiting: list[tuple[Any, ...]] = []
        self._running: dict[str, JobView] = {}
        self._views: dict[str, JobView] = {}
        self._starving: list[tuple[float, int, str]] = []
        """(when it starves, seq, job id) of waiting jobs not starved when last keyed."""
        self._model: tuple[ThroughputModel, Any] | None = None
        self.keyed = 0
        """Keys the last order computed (a count for tests and benchmarks)."""

    def fill(self, inp: SchedulingInput, *, backfill: bool) -> list[Allocation]:
        """`fill_in_order` over the jobs in this order. The walk goes only as far as it places
        jobs: a decision keys the running jobs and walks them and the waiting jobs up to where
        it stops, not the rest of the queue."""
        now, key = inp.now, self.key
        if inp.changed is None:
            self._model = None  # (no feed: what is kept would go stale)
            self.keyed = len(inp.jobs)
            return fill_in_order(sorted(inp.jobs, key=lambda j: key(j, now)), inp.cluster,
                                 backfill=backfill)  # fmt: skip
        if not self._update(inp):
            self._build(inp)
        self._starve(now)
        views = self._views
        running = sorted((*key(j, now), j.record.job_id) for j in self._running.values())
        self.keyed += len(running)
        # `fill_in_order`'s start, on the running jobs alone: each job's place in the order is its
        # entry (the order is theirs), so the waiting jobs need not be counted to be placed.
        free, by_type, after = holdings(((e, views[e[-1]]) for e in running), inp.cluster)
        sequence = ((e, views[e[-1]]) for e in heapq.merge(running, self._waiting))
        walked = walk(sequence, inp.cluster, free, by_type, after, backfill)
        return [a for _, a in walked]

    def _build(self, inp: SchedulingInput) -> None:
        self._entries, self._waiting, self._running, self._views = {}, [], {}, {}
        self._starving = []
        self._model = self._model_of(inp)
        self.keyed = 0
        for view in inp.jobs:
            self._add(view, inp.now, sort=False)
        self._waiting.sort()
        heapq.heapify(self._starving)

    def _update(self, inp: SchedulingInput) -> bool:
        """Take in `inp.changed`; False if what is kept cannot be updated (rebuild it)."""
        if self._model is None or self._model != self._model_of(inp):
            return False
        assert inp.changed is not None
        self.keyed = 0
        for job_id, view in inp.changed.items():
            self._remove(job_id)
            if view is not None:
                self._add(view, inp.now, sort=True)
        return len(self._views) == len(inp.jobs)

    def _starve(self, now: float) -> None:
        """Re-key the waiting jobs that starved since they were keyed."""
        starving, again = self._starving, []
        while starving and starving[0][0] <= now:
            entry = heapq.heappop(starving)
            job_id = entry[2]
            view = self._views.get(job_id)
            if view is None or job_id not in self._entries or entry != self._starves(view):
                continue  # (gone, running, or waiting since another time: a stale entry)
            if not is_starved(view, now, self.starvation_s):  # (a rounding away from it)
                again.append(entry)
                continue
            self._remove(job_id)
            self._add(view, now, sort=True)
        for entry in again:
            heapq.heappush(starving, entry)

    @staticmethod
    def _model_of(inp: SchedulingInput) -> tuple[ThroughputModel, Any]:
        """The model and its version (a learning model's rates change as it learns)."""
        model = inp.cluster.throughputs
        return model, getattr(model, "version", None)

    def _add(self, view: JobView, now: float, *, sort: bool) -> None:
        r = view.record
        self._views[r.job_id] = view
        if r.state == "running":
            self._running[r.job_id] = view
            return
        entry = (*self.key(view, now), r.job_id)
        self.keyed += 1
        self._entries[r.job_id] = entry
        if sort:
            insort(self._waiting, entry)
        else:
            self._waiting.append(entry)
        item = self._starves(view)
        if item is not None and not is_starved(view, now, self.starvation_s):
            if sort:
                heapq.heappush(self._starving, item)
            else:
                self._starving.append(item)

    def _starves(self, view: JobView) -> tuple[float, int, str] | None:
        """When the waiting job starves (its entry in `_starving`; None: never)."""
        r, s = view.record, self.starvation_s
        if s is None or r.queued_since is None:
            return None
        return (r.queued_since + s, r.seq, r.job_id)

    def _remove(self, job_id: str) -> None:
        if self._views.pop(job_id, None) is None:
            return
        if self._running.pop(job_id, None) is not None:
            return
        entry = self._entries.pop(job_id)
        del self._waiting[bisect_left(self._waiting, entry)]

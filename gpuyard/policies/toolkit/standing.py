"""A standing order: the active jobs in a policy's order, kept across decisions from what changed.

An ordering policy whose order of two jobs changes only when one of them changes state (FIFO;
SJF without its starvation guard) need not sort every job at every decision, nor walk the running
jobs ahead of the first waiting one: they keep their GPUs (`fill_in_order` keeps a running job
whose GPUs are still there). `StandingOrder` keeps the waiting and the running jobs in two sorted
lists, updated from the input's `changed`, and resumes the walk at the first waiting job: a
decision costs what it starts, stops and passes over, and its answer tells only that
(`Decision.keep_running`). The answer is the one `fill_in_order` gives over the whole order,
allocation for allocation; where the standing order cannot vouch for the jobs it skips (a
running job the walk would not keep as it is, a cluster or throughput model that changed, no
`changed` in the input) the policy walks every job.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable
from typing import Any

from gpuyard.shared.model import Allocation, JobRecord
from gpuyard.shared.policy import ClusterView, Decision, JobView, SchedulingInput
from gpuyard.shared.throughput import ThroughputModel

from .ordering import RunningHolds, fill_in_order, walk

Entry = tuple[Any, int, str]
"""(the policy's key, admission order, job id): a job's place in the order (unique)."""


class StandingOrder:
    """The active jobs sorted by `key` (smallest first; ties in admission order), where `key`
    reads only what changes with a job's state (its spec, submit time, state)."""

    def __init__(self, key: Callable[[JobRecord], Any]) -> None:
        self.key = key
        self._entries: dict[str, Entry] = {}
        self._views: dict[str, JobView] = {}
        self._queued: list[Entry] = []
        self._started = 0
        """Entries at the head of `_queued` whose jobs left it during `_update`, dropped together
        at its end (a FIFO queue loses its head: one at a time would move every entry behind)."""
        self._running: list[Entry] = []
        self._holds = RunningHolds()
        self._capacity: dict[str, int] | None = None
        self._model: tuple[ThroughputModel, Any] | None = None
        self.walked = 0
        """Jobs the last decision walked (a count for tests and benchmarks)."""

    def fill(self, inp: SchedulingInput, *, backfill: bool) -> Decision | list[Allocation]:
        """`fill_in_order` over the jobs in this order, told as what changes where it can be."""
        if inp.changed is None:
            self._capacity = None  # (no feed: what is kept would go stale)
            self.walked = len(inp.jobs)
            order = sorted(inp.jobs, key=lambda j: (self.key(j.record), j.record.seq))
            return fill_in_order(order, inp.cluster, backfill=backfill)
        if not self._update(inp):
            self._build(inp)
        free = self._holds.free(inp.cluster.capacity)
        if free is None:
            self.walked = len(inp.jobs)
            order = [self._views[e[2]] for e in heapq.merge(self._running, self._queued)]
            return Decision(allocations=fill_in_order(order, inp.cluster, backfill=backfill))
        return self._resume(inp.cluster, free, backfill)

    # ------------------------------------------------------------------ the walk

    def _resume(self, cluster: ClusterView, free: dict[str, int], backfill: bool) -> Decision:
        """The walk from the first waiting job on: the running jobs before it keep their GPUs."""
        queued, views = self._queued, self._views
        self.walked = 0
        if not queued:
            return Decision(keep_running=True)
        later = self._running[bisect_left(self._running, queued[0]) :]
        running: dict[str, list[tuple[Entry, JobView]]] = {}
        after: dict[str, int] = {}
        for e in later:
            t, gpus = self._holds.of[e[2]]
            running.setdefault(t, []).append((e, views[e[2]]))
            after[t] = after.get(t, 0) + gpus

        def sequence() -> Any:
            for e in heapq.merge(later, queued):
                self.walked += 1
                yield e, views[e[2]]

        walked = walk(sequence(), cluster, free, running, after, backfill)
        allocated = {a.job_id for _, a in walked}
        return Decision(
            allocations=[a for _, a in walked],
            keep_running=True,
            stop=[e[2] for e in later if e[2] not in allocated],
        )

    # ------------------------------------------------------------------ keeping the order

    def _build(self, inp: SchedulingInput) -> None:
        self._entries, self._views, self._holds = {}, {}, RunningHolds()
        self._queued, self._running = [], []
        self._started = 0
        self._capacity = dict(inp.cluster.capacity)
        self._model = self._model_of(inp.cluster)
        for view in inp.jobs:
            self._add(view, inp.cluster, sort=False)
        self._queued.sort()
        self._running.sort()

    def _update(self, inp: SchedulingInput) -> bool:
        """Take in `inp.changed`; False if what is kept cannot be updated (rebuild it)."""
        cluster = inp.cluster
        if self._capacity != cluster.capacity or self._model != self._model_of(cluster):
            return False
        assert inp.changed is not None
        for job_id, view in inp.changed.items():
            self._remove(job_id)
            if view is not None:
                self._add(view, cluster, sort=True)
        if self._started:
            del self._queued[: self._started]
            self._started = 0
        return len(self._entries) == len(inp.jobs)

    @staticmethod
    def _model_of(cluster: ClusterView) -> tuple[ThroughputModel, Any]:
        """The model and its version (a learning model's rates change as it learns)."""
        model = cluster.throughputs
        return model, getattr(model, "version", None)

    def _add(self, view: JobView, cluster: ClusterView, *, sort: bool) -> None:
        r = view.record
        entry = (self.key(r), r.seq, r.job_id)
        self._entries[r.job_id] = entry
        self._views[r.job_id] = view
        if r.state == "running" and self._holds.add(view, cluster):
            lst = self._running
        else:  # (a running job on a type the cluster lacks: the walk sees it waiting)
            lst = self._queued
        if not sort:
            lst.append(entry)
        elif lst is self._queued:
            insort(lst, entry, self._started)
        else:
            insort(lst, entry)

    def _remove(self, job_id: str) -> None:
        entry = self._entries.pop(job_id, None)
        if entry is None:
            return
        del self._views[job_id]
        if self._holds.remove(job_id):
            del self._running[bisect_left(self._running, entry)]
            return
        i = bisect_left(self._queued, entry, self._started)
        if i == self._started:
            self._started += 1
        else:
            del self._queued[i]

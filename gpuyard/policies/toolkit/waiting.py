"""A waiting order: the jobs in the order of a key that moves with time for running jobs only.

SRTF's and LAS's keys (remaining time, attained service) change as running jobs run, but not
while a job waits: a waiting job's key changes when the job does (`SchedulingInput.changed`),
when the throughput model does, or when it starves (its class moves up one, `queued_since +
starvation_s`). `WaitingOrder` keeps the waiting jobs sorted across decisions, sorts only the
running ones at each decision and walks the two merged: the walk's order is
`sorted(inp.jobs, key=...)`'s, job for job, and its allocations `fill_in_order`'s, at the cost
of what runs, what changed and what the walk reaches rather than of the whole queue. The answer
tells only what changes (`Decision.keep_running`): the jobs it starts, resizes or moves and
the running jobs it stops, so that the scheduler and placement cost what changed, not what runs.
Without `changed` in the input it sorts every job and answers with every allocation.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import ClusterView, Decision, JobView, SchedulingInput
from gpuyard.shared.throughput import ThroughputModel

from .ordering import (
    RunningHolds,
    agnostic_types,
    fill_in_order,
    held_or_requested,
    holdings,
    runnable_types,
    walk,
)
from .starvation import is_starved, next_starvation

Key = Callable[[JobView, float], tuple[Any, ...]]
"""A job's sort key at a time (unique: it ends with the job's admission order, `seq`)."""


class WaitingOrder:
    """`fill(inp)`: `fill_in_order` over `inp.jobs` sorted by `key(job, inp.now)`, where a
    waiting job's key reads only the job's record, the throughput model and whether it starved
    (`is_starved` with `starvation_s`), and a running job's may read anything."""

    def __init__(
        self, key: Key, starvation_s: float | None, *, running_keys_hold: bool = False
    ) -> None:
        self.key = key
        self.starvation_s = starvation_s
        self.running_keys_hold = running_keys_hold
        """A running job's key stays until the policy names it `moved` (Tiresias's: until a
        demotion): the running jobs stay sorted too, rather than keyed at every decision."""
        self._ranked: list[tuple[Any, ...]] = []
        """With `running_keys_hold`: the running jobs' entries, sorted."""
        self._rank: dict[str, tuple[Any, ...]] = {}
        """Running job -> its entry in `_ranked`."""
        self._ranked_of: dict[str, list[tuple[Any, ...]]] = {}
        """With `running_keys_hold`: `_ranked` per GPU type (of the jobs whose GPUs are counted)."""
        self._entries: dict[str, tuple[Any, ...]] = {}
        """Waiting job -> its entry in `_waiting` (its key, then its id)."""
        self._waiting: list[tuple[Any, ...]] = []
        self._running: dict[str, JobView] = {}
        self._holds = RunningHolds()
        self._capacity: dict[str, int] | None = None
        self._views: dict[str, JobView] = {}
        self._starving: list[tuple[float, int, str]] = []
        """(when it starves, seq, job id) of waiting jobs not starved when last keyed."""
        self._model: tuple[ThroughputModel, Any] | None = None
        self._stopped: list[str] = []
        """The running jobs the last decision stopped (waiting now, with no entry in
        `_starving` until the next decision hears of them)."""
        self._named: list[str] = []
        """The jobs the last decision started, resized or moved."""
        self._decided: object = None
        """The `changed` of the input the last decision took in (None: not kept from one)."""
        self.keyed = 0
        """Keys the last order computed (a count for tests and benchmarks)."""

    def fill(
        self, inp: SchedulingInput, *, backfill: bool, moved: Iterable[str] = ()
    ) -> Decision | list[Allocation]:
        """`fill_in_order` over the jobs in this order, told as what changes where the input
        says what changed. A decision keys the running jobs (unless their keys hold) and walks
        from the first waiting job on (the running jobs before it keep their GPUs) as far as it
        places jobs, not the rest of the queue. `moved`: jobs whose key the policy's own state
        changed since they were keyed (Tiresias's promotions and demotions), keyed again."""
        now, key = inp.now, self.key
        self._decided, self._stopped, self._named = inp.changed, [], []
        if inp.changed is None:
            self._model = None  # (no feed: what is kept would go stale)
            self.keyed = len(inp.jobs)
            return fill_in_order(sorted(inp.jobs, key=lambda j: key(j, now)), inp.cluster,
                                 backfill=backfill)  # fmt: skip
        if not self._update(inp):
            self._build(inp)
        for job_id in moved:
            if job_id in self._entries or job_id in self._rank:
                view = self._views[job_id]
                self._remove(job_id)
                self._add(view, now, inp.cluster, sort=True)
        self._starve(now, inp.cluster)
        views, cluster = self._views, inp.cluster
        if (free := self._holds.free(cluster.capacity)) is not None:
            return self._resume(now, cluster, free, backfill)
        if self.running_keys_hold:
            running = list(self._ranked)
        else:
            running = sorted((*key(j, now), j.record.job_id) for j in self._running.values())
            self.keyed += len(running)
        # `fill_in_order`'s start, on the running jobs alone: each job's place in the order is its
        # entry (the order is theirs), so the waiting jobs need not be counted to be placed.
        free, by_type, after = holdings(((e, views[e[-1]]) for e in running), cluster)
        sequence = ((e, views[e[-1]]) for e in heapq.merge(running, self._waiting))
        return self._changes(walk(sequence, cluster, free, by_type, after, backfill), running)

    def _resume(
        self, now: float, cluster: ClusterView, free: dict[str, int], backfill: bool
    ) -> Decision:
        """The walk from the first waiting job on: every running job before it keeps its GPUs
        (none is irregular, and no type's GPUs are overcommitted), so only those after it are
        walked with the waiting ones."""
        if not self._waiting:
            return Decision(keep_running=True)
        if self.running_keys_hold:
            return self._resume_held(cluster, free, backfill)
        first, views = self._waiting[0], self._views
        keys = [(*self.key(j, now), job_id) for job_id, j in self._running.items()]
        self.keyed += len(keys)
        later = sorted(e for e in keys if e > first)
        by_type: dict[str, list[tuple[Any, JobView]]] = {}
        after: dict[str, int] = {}
        for e in later:
            t, held = self._holds.of[e[-1]]
            by_type.setdefault(t, []).append((e, views[e[-1]]))
            after[t] = after.get(t, 0) + held
        sequence = ((e, views[e[-1]]) for e in heapq.merge(later, self._waiting))
        return self._changes(walk(sequence, cluster, free, by_type, after, backfill), later)

    def _resume_held(self, cluster: ClusterView, free: dict[str, int], backfill: bool) -> Decision:
        """`_resume` where running keys hold, over the waiting jobs alone: every running job the
        walk passes keeps its GPUs, so of the running jobs it needs only what those after a
        waiting job hold (where it may preempt, the last first), summed from the last of each
        type back as far as the decision asks, not a pass over each of them."""
        views, of, ranked_of = self._views, self._holds.of, self._ranked_of
        cut = {t: len(ranked) for t, ranked in ranked_of.items()}  # (the rest: preempted)
        tails: dict[str, list[int]] = {t: [0] for t in ranked_of}
        """Per type: the thousandths held by its last k running jobs, at k, as far as asked."""

        def held_after(t: str, entry: tuple[Any, ...]) -> int:
            """What the running jobs of type `t` after `entry` hold, but those preempted."""
            ranked = ranked_of.get(t)
            if not ranked:
                return 0
            i, end, n = bisect_right(ranked, entry), cut[t], len(ranked)
            if i >= end:
                return 0
            tail = tails[t]
            while len(tail) <= n - i:
                tail.append(tail[-1] + of[ranked[n - len(tail)][-1]][1])
            return tail[n - i] - tail[n - end]

        known: dict[tuple[str | int, ...], list[str]] = {}
        named: list[Allocation] = []
        stopped: list[tuple[Any, ...]] = []
        preempted: list[tuple[Any, ...]] = []
        """The running jobs preempted and not walked yet (a heap): each is walked at its place
        as a waiting job would be (it may run on, elsewhere), or stops."""
        waiting, w = self._waiting, 0
        while True:  # (`walk`'s steps, in the order's order)
            if preempted and (w == len(waiting) or preempted[0] < waiting[w]):
                entry = heapq.heappop(preempted)
            elif w < len(waiting):
                entry, w = waiting[w], w + 1
            else:
                break
            job = views[entry[-1]]
            r = job.record
            need = held_or_requested(job)
            cost = r.spec.milli(need)
            kind: tuple[str | int, ...] = (
                r.spec.gpu_type, r.spec.job_type, need, *r.spec.gpu_types,
            )  # fmt: skip
            cands = known.get(kind)
            if cands is None:
                cands = known[kind] = runnable_types(job, cluster, need)
            if len(cands) > 1:
                cands = agnostic_types(job, cands, need)
            chosen = next((c for c in cands if free.get(c, 0) >= cost), None)
            if chosen is None:
                chosen = next(
                    (c for c in cands if free.get(c, 0) + held_after(c, entry) >= cost), None
                )
            if chosen is None:
                if r.job_id in of:
                    stopped.append(entry)
                if not backfill:
                    break
                if not any(n > 0 for n in free.values()) and not any(
                    held_after(t, entry) for t in ranked_of
                ):
                    break  # no GPU left to take or to preempt: no later job can be placed
                continue
            while free[chosen] < cost:  # preempt the last running job after this one
                cut[chosen] -= 1
                victim = ranked_of[chosen][cut[chosen]]
                free[chosen] += of[victim[-1]][1]
                heapq.heappush(preempted, victim)
            free[chosen] -= cost
            if r.job_id not in of or (need, chosen) != (r.gpus, r.gpu_type):
                named.append(Allocation(r.job_id, need, chosen))  # (started, or moved)
        stop = [e[-1] for e in sorted([*stopped, *preempted])]  # (those not walked stop too)
        self._stopped, self._named = stop, [a.job_id for a in named]
        return Decision(allocations=named, keep_running=True, stop=stop)

    def _changes(
        self, walked: list[tuple[Any, Allocation]], walked_running: list[tuple[Any, ...]]
    ) -> Decision:
        """The walk's allocations as what changes: those of the jobs it starts, resizes or
        moves, in its order; the running jobs it walked (`walked_running`, entries) and left
        out stop; those it keeps as they run go unnamed."""
        running = self._running
        named: list[Allocation] = []
        allocated: set[str] = set()
        for _, a in walked:
            allocated.add(a.job_id)
            view = running.get(a.job_id)
            if view is None or view.record.gpus != a.num_gpus or view.record.gpu_type != a.gpu_type:
                named.append(a)
        stop = [e[-1] for e in walked_running if e[-1] not in allocated]
        self._stopped, self._named = stop, [a.job_id for a in named]
        return Decision(allocations=named, keep_running=True, stop=stop)

    def follows(self, inp: SchedulingInput) -> bool:
        """`inp` is the input of the last decision, or of its aftermath (the same `changed`),
        and that decision was kept from what changed."""
        return self._model is not None and inp.changed is not None and inp.changed is self._decided

    def touched(self) -> Iterator[JobView]:
        """After a decision kept from what changed: the jobs that ran when it was taken and
        those it started, resized or moved (views, read live). Every job running after the
        decision is among them, and every job it stopped."""
        views = self._views
        for job_id in self._running:
            yield views[job_id]
        for job_id in self._named:
            if job_id not in self._running and (view := views.get(job_id)) is not None:
                yield view

    def decided(self) -> Iterator[JobView]:
        """After a decision kept from what changed: the jobs it started, resized, moved or
        stopped (views, read live), not those it left running as they ran."""
        views = self._views
        for job_id in (*self._named, *self._stopped):
            if (view := views.get(job_id)) is not None:
                yield view

    def next_starvation(self, inp: SchedulingInput) -> float | None:
        """When the next waiting job starves (`next_starvation` over `inp.jobs`), from the jobs
        kept where `inp` follows the last decision (its `changed`): the earliest entry of
        `_starving` whose job still waits since then, or a job the decision stopped."""
        s, now = self.starvation_s, inp.now
        if s is None:
            return None
        if not self.follows(inp):
            return next_starvation(inp.jobs, now, s)  # (not as the last decision left them)
        starving, views, passed = self._starving, self._views, []
        soonest: float | None = None
        while starving:
            at, _, job_id = starving[0]
            r = view.record if (view := views.get(job_id)) is not None else None
            if (
                r is None
                or r.state != "queued"
                or r.queued_since is None
                or r.queued_since + s != at
            ):
                heapq.heappop(starving)  # (gone, started, or waiting since another time)
            elif at <= now:  # (a rounding away from starving: `_starve` keys it again)
                passed.append(heapq.heappop(starving))
            else:
                soonest = at
                break
        for entry in passed:
            heapq.heappush(starving, entry)
        for job_id in self._stopped:
            r = view.record if (view := views.get(job_id)) is not None else None
            if r is not None and r.state == "queued" and r.queued_since is not None:
                at = r.queued_since + s
                if at > now and (soonest is None or at < soonest):
                    soonest = at
        return soonest

    def _build(self, inp: SchedulingInput) -> None:
        self._entries, self._waiting, self._running, self._views = {}, [], {}, {}
        self._holds, self._capacity = RunningHolds(), dict(inp.cluster.capacity)
        self._starving = []
        self._model = self._model_of(inp)
        self.keyed = 0
        self._ranked, self._rank, self._ranked_of = [], {}, {}
        for view in inp.jobs:
            self._add(view, inp.now, inp.cluster, sort=False)
        self._waiting.sort()
        self._ranked.sort()
        for ranked in self._ranked_of.values():
            ranked.sort()
        heapq.heapify(self._starving)

    def _update(self, inp: SchedulingInput) -> bool:
        """Take in `inp.changed`; False if what is kept cannot be updated (rebuild it)."""
        if self._model is None or self._model != self._model_of(inp):
            return False
        if self._capacity != inp.cluster.capacity:
            return False
        assert inp.changed is not None
        self.keyed = 0
        for job_id, view in inp.changed.items():
            self._remove(job_id)
            if view is not None:
                self._add(view, inp.now, inp.cluster, sort=True)
        return len(self._views) == len(inp.jobs)

    def _starve(self, now: float, cluster: ClusterView) -> None:
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
            self._add(view, now, cluster, sort=True)
        for entry in again:
            heapq.heappush(starving, entry)

    @staticmethod
    def _model_of(inp: SchedulingInput) -> tuple[ThroughputModel, Any]:
        """The model and its version (a learning model's rates change as it learns)."""
        model = inp.cluster.throughputs
        return model, getattr(model, "version", None)

    def _add(self, view: JobView, now: float, cluster: ClusterView, *, sort: bool) -> None:
        r = view.record
        self._views[r.job_id] = view
        if r.state == "running":
            self._running[r.job_id] = view
            counted = self._holds.add(view, cluster)
            if self.running_keys_hold:
                ranked = self._rank[r.job_id] = (*self.key(view, now), r.job_id)
                self.keyed += 1
                held = self._holds.of[r.job_id][0] if counted else None  # (its type)
                of_type = self._ranked_of.setdefault(held, []) if held is not None else None
                if sort:
                    insort(self._ranked, ranked)
                    if of_type is not None:
                        insort(of_type, ranked)
                else:
                    self._ranked.append(ranked)
                    if of_type is not None:
                        of_type.append(ranked)
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
            holds = self._holds.of.get(job_id)
            self._holds.remove(job_id)
            if (ranked := self._rank.pop(job_id, None)) is not None:
                del self._ranked[bisect_left(self._ranked, ranked)]
                if holds is not None:
                    of_type = self._ranked_of[holds[0]]
                    del of_type[bisect_left(of_type, ranked)]
            return
        entry = self._entries.pop(job_id)
        del self._waiting[bisect_left(self._waiting, entry)]

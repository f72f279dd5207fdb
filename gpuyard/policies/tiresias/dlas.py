"""Tiresias (NSDI 2019): discretised 2D-LAS (`dlas-gpu`) and its Gittins-index variant.

Both keep state between decisions (promotions; learned job sizes): they declare it (`State`) and
snapshot it, so a restarted scheduler decides exactly as the one that died would have.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from typing import Annotated, Any

from msgspec import Meta, Struct, field

from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import Decision, JobView, SchedulingInput, SchedulingPolicy

from ..toolkit import WaitingOrder, fill_in_order

PositiveSeconds = Annotated[float, Meta(gt=0)]


# --------------------------------------------------------------------------- Tiresias


class Epoch(Struct, array_like=True):
    """A promoted job's counters at its last promotion (Tiresias resets them there)."""

    at: float
    executed: float
    service: float
    rerun: float | None = None
    """When it first ran again after the promotion (pending time counts from then)."""


class TiresiasState(Struct, kw_only=True):
    epochs: dict[str, Epoch] = {}
    """Each promoted job's counters at its last promotion."""


def _default_thresholds() -> list[float]:
    return [3600.0]


class TiresiasParams(Struct, forbid_unknown_fields=True):
    thresholds: list[Annotated[float, Meta(gt=0)]] = field(default_factory=_default_thresholds)
    """Queue limits in GPU-seconds: K-1 limits make K queues. Default [3600] (2 queues, as
    Tiresias' README runs it); ElasticFlow's `dlas-gpu` copy uses [3250, 7200] (3 queues); [] is one FIFO queue."""
    promote_knob: Annotated[float, Meta(ge=0)] | None = None
    """Starvation prevention (the reference's `solve_starvation`): a waiting job in a lower queue is
    promoted to the top queue once its pending time reaches promote_knob * its executed time (both
    counted since its last promotion, see the class notes). None: K, the number of queues; 0: never (the reference's plain `dlas-gpu`)."""
    backfill: bool = True
    """Let later jobs run when one does not fit (the reference does: its walk skips)."""
    running_first: bool = True
    """Inside a queue, running jobs stay ahead of waiting ones (the reference moves waiting jobs to
    the back of their queue after every decision), so preemption happens only across queues."""


class Tiresias(SchedulingPolicy):
    """Tiresias discretised 2D-LAS (`dlas-gpu` of SymbioticLab/Tiresias, NSDI 2019).

    Registry name `tiresias`. A job's queue is given by its attained GPU-time (GPUs * seconds) since
    its last promotion against `thresholds`; queues are served in order (preemptive across queues),
    FIFO by submit time inside a queue (running jobs first, see `running_first`); the walk skips
    jobs that do not fit (backfill). Starvation prevention follows the reference's exact rule: a job
    is considered only when it waits, is not in the top queue and has run since its last promotion
    (so a job that never ran, or was just promoted, is never promoted again at once); its pending
    time counts from its first run (after the last promotion), across all its waits; it is promoted
    when pending >= promote_knob * executed seconds; promotion zeroes both counters, so the job gets
    a full top-queue allowance again.

    Differences from the reference: pending jobs within a queue are in submit order, whereas the
    reference keeps them in the order they entered the queue; a job is demoted when its GPU-time
    reaches the limit, down every queue it passed (the reference wakes at `(limit - seconds run) /
    GPUs`, late for a multi-GPU job, moves it one queue per event and counts whole seconds:
    docs/fidelity.md). The per-promoted-job counters (`Epoch`) are
    the only memory this policy keeps: they are what the reference stores in its job records and
    cannot be derived from a `JobView`; `schedule()` updates them, `next_decision_time()` does not.
    Without promotions the policy is a pure function of its input.

    Cost: where the input says what changed, a decision costs what changed and what its walk
    reaches, not what waits or runs. A waiting job's place (its queue, then submit order) moves
    only when it changes state or is promoted, a running job's only at a demotion: the jobs stay
    sorted across decisions (`WaitingOrder` with `running_keys_hold`), and the promotion and
    demotion instants wait in heaps. The decision, the promotions and the next decision time are
    those of the walk over every job, bit for bit.
    """

    Params = TiresiasParams
    State = TiresiasState

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.limits: list[float] = sorted(self.params.thresholds)
        knob = self.params.promote_knob
        self.knob: float = float(len(self.limits) + 1) if knob is None else knob
        self._epochs: dict[str, Epoch] = {}
        self._unrerun: set[str] = set()
        """The promoted jobs not known to have run since (`Epoch.rerun` None): those `_take_in`
        looks at, not every running job."""
        self.order = self._new_order()
        # Kept from what changed, while `_tracking` (see `_take_in`):
        self._tracking = False
        self._views: dict[str, JobView] = {}
        self._runs: dict[str, JobView] = {}
        self._promotions: list[tuple[float, int, str]] = []
        """(when its pending time reaches the knob, seq, job id) of waiting jobs (a heap, with
        stale entries: a job that ran or was promoted since has another instant or none)."""
        self._limits: dict[str, float] = {}
        """A running job, keyed in the order: when its service reaches its queue's limit (its
        key holds until then; `_demoted` names it to be keyed again)."""
        self._demotions: list[tuple[float, int, str]] = []
        """(when, seq, job id) of `_limits` (a heap, with stale entries)."""

    def snapshot(self) -> Struct:
        return TiresiasState(epochs=self._epochs)

    def restore(self, state: TiresiasState) -> None:
        self._epochs = dict(state.epochs)
        self.order, self._tracking = self._new_order(), False  # (keys read epochs)

    # -- counters

    def _counters(self, j: JobView, now: float) -> tuple[float, float, float]:
        """(queue service GPU-s, executed s, pending s) since the last promotion."""
        e = self._epochs.get(j.job_id)
        if e is None:
            started = j.first_start
            pending = 0.0 if started is None else max(0.0, now - started - j.executed_time)
            return j.attained_service, j.executed_time, pending
        executed = j.executed_time - e.executed
        rerun = e.rerun
        if rerun is None and executed > 0:  # ran since promotion; estimate when it restarted
            rerun = now - executed if j.state == "running" else (j.queued_since or now) - executed
        pending = 0.0 if rerun is None else max(0.0, now - rerun - executed)
        return j.attained_service - e.service, executed, pending

    def queue_of(self, j: JobView, now: float) -> int:
        """The job's queue (0 = top) at `now`, promotions recorded so far taken into account."""
        return bisect.bisect_right(self.limits, self._counters(j, now)[0])

    def _promotable(self, j: JobView, q: int, executed: float, pending: float) -> bool:
        return (
            self.knob > 0
            and j.state == "queued"
            and q > 0
            and j.executed_time > 0
            and executed > 0
            and pending >= executed * self.knob
        )

    def _rerun(self, j: JobView, now: float) -> None:
        """A promoted job that ran since: when it first ran again (pending time counts from it)."""
        e = self._epochs.get(j.job_id)
        if e is not None and e.rerun is None and j.executed_time > e.executed:
            ran = j.executed_time - e.executed
            end = now if j.state == "running" else (j.queued_since or now)
            e.rerun = end - ran
            self._unrerun.discard(j.job_id)

    def _promote(self, j: JobView, now: float) -> bool:
        """Promote the job if it is due at `now` (the reference's rule); whether it was."""
        service, executed, pending = self._counters(j, now)
        if not self._promotable(j, bisect.bisect_right(self.limits, service), executed, pending):
            return False
        self._epochs[j.job_id] = Epoch(now, j.executed_time, j.attained_service)
        self._unrerun.add(j.job_id)
        return True

    def _sweep(self, inp: SchedulingInput) -> tuple[dict[str, int], list[str]]:
        """Record promotions due at `inp.now` over every job: each job's queue, those promoted."""
        now = inp.now
        live = {j.job_id for j in inp.jobs}
        for gone in [k for k in self._epochs if k not in live]:
            del self._epochs[gone]
        queues: dict[str, int] = {}
        promoted: list[str] = []
        for j in inp.jobs:
            self._rerun(j, now)
            service, executed, pending = self._counters(j, now)
            q = bisect.bisect_right(self.limits, service)
            if self._promotable(j, q, executed, pending):
                self._epochs[j.job_id] = Epoch(now, j.executed_time, j.attained_service)
                promoted.append(j.job_id)
                q = 0
            queues[j.job_id] = q
        self._unrerun = {k for k, e in self._epochs.items() if e.rerun is None}
        return queues, promoted

    def _key(self, j: JobView, now: float) -> tuple[Any, ...]:
        """The job's place: its queue, then (inside it) running first, submit time, admission."""
        if j.state != "running":
            return (self.queue_of(j, now), 1, j.submit_time, j.seq)
        first = 0 if self.params.running_first else 1
        return (self._running_queue(j, now), first, j.submit_time, j.seq)

    def _running_queue(self, j: JobView, now: float) -> int:
        """`queue_of` a running job; where tracking, also when its service reaches the queue's
        limit (`_limits`: its key in the order holds until then)."""
        service = self._counters(j, now)[0]
        q = bisect.bisect_right(self.limits, service)
        if self._tracking:
            until = math.inf
            if q < len(self.limits) and j.gpus > 0:
                until = now + (self.limits[q] - service) / j.gpus
                heapq.heappush(self._demotions, (until, j.seq, j.job_id))
            self._limits[j.job_id] = until
        return q

    def _within_queue_key(self, j: JobView) -> tuple[float, ...]:
        first = 0 if (self.params.running_first and j.state == "running") else 1
        return (first, j.submit_time, j.seq)

    holds_running_keys = True
    """A running job's place moves only at a demotion (`_running_queue`): the waiting order
    keeps the running jobs sorted too, and is told of those whose limit came (`_demoted`)."""

    def _new_order(self) -> WaitingOrder:
        return WaitingOrder(self._key, None, running_keys_hold=self.holds_running_keys)

    def schedule(self, inp: SchedulingInput) -> Decision | list[Allocation]:
        if self._tracking and inp.changed is not None:
            promoted = self._take_in(inp)
            promoted += self._demoted(inp.now)
        else:
            queues, promoted = self._sweep(inp)
            self._track(inp)
            if inp.changed is None:  # (every job, as the queues were just computed)
                self.order = self._new_order()  # (what it kept would go stale)
                order = sorted(
                    inp.jobs, key=lambda j: (queues[j.job_id], *self._within_queue_key(j))
                )
                return fill_in_order(order, inp.cluster, backfill=self.params.backfill)
        return self.order.fill(inp, backfill=self.params.backfill, moved=promoted)

    # -- kept from what changed

    def _track(self, inp: SchedulingInput) -> None:
        """Keep the jobs and their promotion instants from here on (where `changed` is told)."""
        self._tracking = inp.changed is not None
        if not self._tracking:
            return
        self._views = {j.job_id: j for j in inp.jobs}
        self._runs = {j.job_id: j for j in inp.jobs if j.state == "running"}
        self._limits, self._demotions = {}, []
        self.order = self._new_order()  # (its running keys hold to `_limits`)
        self._promotions = [
            (at, j.seq, j.job_id) for j in inp.jobs if (at := self._promotion_at(j)) is not None
        ]
        heapq.heapify(self._promotions)

    def _take_in(self, inp: SchedulingInput) -> list[str]:
        """`_sweep` from what changed: the jobs that came, went, started or stopped, the
        running ones, and the waiting ones whose promotion is due. Returns those promoted."""
        assert inp.changed is not None
        now, views, runs, epochs = inp.now, self._views, self._runs, self._epochs
        for job_id, view in inp.changed.items():
            self._limits.pop(job_id, None)
            if view is None:
                views.pop(job_id, None)
                runs.pop(job_id, None)
                epochs.pop(job_id, None)
                self._unrerun.discard(job_id)
                continue
            views[job_id] = view
            if view.state == "running":
                runs[job_id] = view
            else:
                runs.pop(job_id, None)
        if len(views) != len(inp.jobs):  # (not as the last decision left them: every job)
            promoted = self._sweep(inp)[1]
            self._track(inp)
            return promoted
        for job_id in [k for k in self._unrerun if k in runs]:  # (`_rerun` of every running job)
            self._rerun(runs[job_id], now)
        for job_id, view in inp.changed.items():
            if view is not None and view.state != "running":
                self._rerun(view, now)
                if (at := self._promotion_at(view)) is not None:
                    heapq.heappush(self._promotions, (at, view.seq, job_id))
        promoted = []
        promotions, later = self._promotions, []
        # (an instant a rounding later than the reference's test: a little slack, tested exactly)
        while promotions and promotions[0][0] <= now + _rounding(now):
            entry = heapq.heappop(promotions)
            view = views.get(entry[2])
            if view is None or self._promotion_at(view) != entry[0]:
                continue  # (gone, running, promoted, or waiting since another time)
            if self._promote(view, now):
                promoted.append(entry[2])
            else:
                later.append(entry)
        for entry in later:
            heapq.heappush(promotions, entry)
        return promoted

    def _demoted(self, now: float) -> list[str]:
        """The running jobs whose kept queue is due (their service nears its limit): forgotten,
        to be keyed again."""
        demotions, limits, runs = self._demotions, self._limits, self._runs
        due: list[str] = []
        while demotions and demotions[0][0] - _rounding(demotions[0][0]) <= now:
            until, _, job_id = heapq.heappop(demotions)
            if limits.get(job_id) == until and job_id in runs:
                del limits[job_id]
                due.append(job_id)
        return due

    def _promotion_at(self, j: JobView) -> float | None:
        """When a waiting job's pending time reaches the knob times its executed time (both
        since its last promotion): a time that stays while it waits. None: it cannot be."""
        if self.knob <= 0 or j.state != "queued" or j.executed_time <= 0:
            return None
        e = self._epochs.get(j.job_id)
        if e is None:
            if j.first_start is None:
                return None
            service, executed, since = j.attained_service, j.executed_time, j.first_start
        else:
            executed = j.executed_time - e.executed
            if executed <= 0:
                return None
            rerun = e.rerun
            if rerun is None:
                if j.queued_since is None:
                    return None  # (pending stays 0: see `_counters`)
                rerun = j.queued_since - executed
            service, since = j.attained_service - e.service, rerun
        if bisect.bisect_right(self.limits, service) == 0:
            return None
        return since + executed + executed * self.knob

    # -- when to decide again

    def _wake(self, j: JobView, now: float) -> float | None:
        """The job's next demotion (running) or promotion (waiting), None if neither."""
        service, executed, pending = self._counters(j, now)
        q = bisect.bisect_right(self.limits, service)
        if j.state == "running" and q < len(self.limits) and j.gpus > 0:
            return now + (self.limits[q] - service) / j.gpus
        if (
            self.knob > 0 and j.state == "queued" and q > 0 and j.executed_time > 0
        ) and executed > 0:
            return now + max(0.0, executed * self.knob - pending)
        return None

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        """The next demotion (a running job reaching its queue's limit) or promotion."""
        now = inp.now
        best: float | None = None
        if self._tracking and self.order.follows(inp):
            # The waiting jobs' promotions and the keyed running jobs' limits from their heaps;
            # the jobs the decision started or stopped one by one (where running keys hold, every
            # running job was keyed and has a limit: those it left running need no look).
            limits = self._limits
            looked = self.order.decided() if self.holds_running_keys else self.order.touched()
            jobs: Any = (
                view for view in looked if not (view.state == "running" and view.job_id in limits)
            )  # fmt: skip
            best = self._soonest(self._promotions, self._promoting, now)
            demotion = self._soonest(self._demotions, self._demoting, now)
            if demotion is not None and (best is None or demotion < best):
                best = demotion
        else:
            jobs = inp.jobs
        for j in jobs:
            t = self._wake(j, now)
            if t is not None and t > now and (best is None or t < best):
                best = t
        return best

    def _promoting(self, entry: tuple[float, int, str]) -> JobView | None:
        """The waiting job of a `_promotions` entry, if the entry is its own (not stale)."""
        view = self._views.get(entry[2])
        return view if view is not None and self._promotion_at(view) == entry[0] else None

    def _demoting(self, entry: tuple[float, int, str]) -> JobView | None:
        """The running job of a `_demotions` entry, if the entry is its own (not stale)."""
        view = self._runs.get(entry[2])
        if self._limits.get(entry[2]) != entry[0] or view is None or view.state != "running":
            return None
        return view

    def _soonest(
        self, heap: list[tuple[float, int, str]],
        own: Callable[[tuple[float, int, str]], JobView | None], now: float,
    ) -> float | None:  # fmt: skip
        """The soonest `_wake` after `now` of the jobs with an entry in `heap`, whose instant is
        its job's to a rounding: the entries in time order, up to a rounding past the soonest
        found; the stale ones go."""
        kept: list[tuple[float, int, str]] = []
        best: float | None = None
        while heap and (best is None or heap[0][0] - _rounding(heap[0][0]) <= best):
            entry = heapq.heappop(heap)
            view = own(entry)
            if view is None:
                continue
            kept.append(entry)
            t = self._wake(view, now)
            if t is not None and t > now and (best is None or t < best):
                best = t
        for entry in kept:
            heapq.heappush(heap, entry)
        return best


def _rounding(t: float) -> float:
    """More than the rounding of a time computed two ways around `t` (a slack, never a step)."""
    return 1e-6 + 1e-9 * abs(t)


class TiresiasGittinsParams(TiresiasParams, forbid_unknown_fields=True):
    gittins_delta: PositiveSeconds = 3250.0
    """Service quantum Δ (GPU-seconds) of the Gittins index (the reference's `gittins_delta`)."""
    samples: list[Annotated[float, Meta(gt=0)]] = []
    """Known job sizes in GPU-seconds (a prior), added to the sizes learned from finished jobs."""
    window: Annotated[int, Meta(ge=0)] = 10_000
    """How many learned sizes to keep (the most recent). 0: none, the distribution is `samples`
    alone, fixed as the reference's (its `yarn-gput1000.csv`)."""
    wake_at_sizes: bool = False
    """Decide again when a running job's service crosses a known size (its index moves there).
    False, as the reference: a running job's index is evaluated at the decisions that come anyway
    (arrivals, exits, demotions, promotions) and goes stale between them."""


class GittinsState(TiresiasState, kw_only=True):
    learned: list[float] = []
    """GPU-seconds of the jobs seen to finish, oldest first."""
    last: dict[str, tuple[float, float, int]] = {}
    """Each active job's (service, executed, GPUs) at the last decision."""
    last_now: float | None = None


class TiresiasGittins(Tiresias):
    """Tiresias with the Gittins index inside each queue (the reference's `dlas-gpu-gittins`).

    Registry name `tiresias-gittins`. Queues, demotion, promotion and backfill are as in
    `tiresias`; inside a queue jobs are sorted by Gittins index, highest first, ties by submit
    time. The index of a job with attained GPU-time a over the job-size distribution S is
    P(S - a <= Δ | S > a) / E[min(S - a, Δ) | S > a]. Like the reference it is evaluated at the next
    sample point above a (so it only changes when a crosses a sample) and is 0 past the largest.
    As in the reference, indexes are evaluated at the decisions Tiresias makes anyway (arrivals,
    exits, demotions, promotions): a running job's index goes stale between them.
    `wake_at_sizes` decides again each time a running job's service crosses a known size.

    The distribution: the reference reads durations from a trace file (`yarn-gput1000.csv`) but
    compares them with GPU-time; here it is `samples` plus the GPU-time of the jobs seen to finish
    (a job leaving the active set; its last service plus its GPUs * the time since the last
    decision). With no sizes at all every index is 0, i.e. FIFO inside each queue.

    Reference bug: `cal_r_gittins_index` sums the finishing jobs' whole sizes instead of the
    service they still need (S - a) in the expectation; this computes E[min(S - a, Δ) | S > a].
    Its single-queue `gittins` schedule sorts by index ascending (lowest first), which inverts the
    policy; `dlas-gpu-gittins`, reproduced here, sorts highest first.

    Cost: as `tiresias`, kept from what changed, except that a waiting job's index moves with
    the known sizes: every job is keyed again at the first decision after one ended.
    """

    Params = TiresiasGittinsParams
    State = GittinsState
    holds_running_keys = False  # (a running job's index moves as it crosses known sizes)

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self._learned: list[float] = []
        self._last: dict[str, tuple[float, float, int]] = {}
        self._last_now: float | None = None
        self._sorted: list[float] = []
        self._prefix: list[float] = [0.0]
        self._dirty = True
        self._sizes = 0
        """How many times the known sizes changed (a waiting job's index moves with them)."""
        self._keyed_sizes = -1
        """`_sizes` when the waiting order was keyed."""

    def snapshot(self) -> Struct:
        return GittinsState(
            epochs=self._epochs, learned=self._learned, last=self._last, last_now=self._last_now
        )

    def restore(self, state: GittinsState) -> None:  # type: ignore[override]
        super().restore(state)
        self._learned, self._last_now = list(state.learned), state.last_now
        self._last = {k: (service, executed, gpus)
                      for k, (service, executed, gpus) in state.last.items()}  # fmt: skip
        self._dirty, self._sizes = True, self._sizes + 1

    def _learn(self, inp: SchedulingInput) -> None:
        live = {j.job_id for j in inp.jobs}
        self._learn_sizes([job_id for job_id in self._last if job_id not in live], inp.now)
        self._last = {j.job_id: self._seen(j) for j in inp.jobs}
        self._last_now = inp.now

    def _learn_sizes(self, gone: list[str], now: float) -> None:
        """The sizes of the jobs `gone` since the last decision (in the order of `_last`)."""
        if not self.params.window:
            return
        for job_id in gone:
            service, _, gpus = self._last[job_id]
            extra = gpus * (now - self._last_now) if self._last_now is not None else 0.0
            self._learned.append(service + max(0.0, extra))
            self._dirty = True
            self._sizes += 1
        if len(self._learned) > self.params.window:
            del self._learned[: len(self._learned) - self.params.window]

    @staticmethod
    def _seen(j: JobView) -> tuple[float, float, int]:
        return (j.attained_service, j.executed_time, j.gpus if j.state == "running" else 0)

    def _learn_changes(self, inp: SchedulingInput) -> None:
        """`_learn` from what changed: the sizes of the jobs gone, and a place in `_last` for
        those that came (in admission order, as `inp.jobs` has them). `schedule` then sees again
        the running jobs and those that changed; a waiting job's entry stays as it is."""
        assert inp.changed is not None
        last, views = self._last, self._views
        gone = sorted(
            (views[job_id].seq, job_id)
            for job_id, view in inp.changed.items()
            if view is None and job_id in last and job_id in views
        )
        self._learn_sizes([job_id for _, job_id in gone], inp.now)
        for _, job_id in gone:
            del last[job_id]
        came = sorted(
            (view.seq, job_id)
            for job_id, view in inp.changed.items()
            if view is not None and job_id not in last
        )
        for _, job_id in came:
            view = inp.changed[job_id]
            assert view is not None
            last[job_id] = self._seen(view)
        self._last_now = inp.now

    def _distribution(self) -> tuple[list[float], list[float]]:
        if self._dirty:
            self._sorted = sorted([*self.params.samples, *self._learned])
            self._prefix = [0.0]
            for s in self._sorted:
                self._prefix.append(self._prefix[-1] + s)
            self._dirty = False
        return self._sorted, self._prefix

    def gittins_index(self, attained: float) -> float:
        """The index at `attained` GPU-seconds (0 past every known size)."""
        data, prefix = self._distribution()
        n = len(data)
        i = bisect.bisect_right(data, attained)
        if i >= n:
            return 0.0
        a = data[i] - 1.0 if data[i] - 1.0 > attained else attained  # evaluated at the step
        delta = self.params.gittins_delta
        lo = bisect.bisect_right(data, a)
        hi = bisect.bisect_right(data, a + delta)
        alive = n - lo
        if alive <= 0:
            return 0.0
        finishing = hi - lo
        expected = (prefix[hi] - prefix[lo] - a * finishing + delta * (n - hi)) / alive
        return (finishing / alive) / expected if expected > 0 else 0.0

    def _key(self, j: JobView, now: float) -> tuple[Any, ...]:
        service = self._counters(j, now)[0]
        q = bisect.bisect_right(self.limits, service)
        return (q, -self.gittins_index(service), j.submit_time, j.seq)

    def schedule(self, inp: SchedulingInput) -> Decision | list[Allocation]:
        if self._tracking and inp.changed is not None and self._follows_jobs(inp):
            self._learn_changes(inp)
            promoted = self._take_in(inp)
            last = self._last
            for running in self._runs.values():
                last[running.job_id] = self._seen(running)
            for job_id, changed in inp.changed.items():
                if changed is not None:
                    last[job_id] = self._seen(changed)
        else:
            self._learn(inp)
            queues, promoted = self._sweep(inp)
            self._track(inp)
            if inp.changed is None:  # (every job, as the queues were just computed)
                self.order = self._new_order()  # (what it kept would go stale)
                now = inp.now
                index = {j.job_id: self.gittins_index(self._counters(j, now)[0]) for j in inp.jobs}
                order = sorted(
                    inp.jobs,
                    key=lambda j: (queues[j.job_id], -index[j.job_id], j.submit_time, j.seq),
                )
                return fill_in_order(order, inp.cluster, backfill=self.params.backfill)
        if self._keyed_sizes != self._sizes:  # (every waiting job's index may have moved)
            self.order, self._keyed_sizes = self._new_order(), self._sizes
        return self.order.fill(inp, backfill=self.params.backfill, moved=promoted)

    def _follows_jobs(self, inp: SchedulingInput) -> bool:
        """The jobs kept, as `inp.changed` changes them, are `inp.jobs` (as many of them)."""
        assert inp.changed is not None
        views, count = self._views, len(self._views)
        for job_id, view in inp.changed.items():
            if view is None and job_id in views:
                count -= 1
            elif view is not None and job_id not in views:
                count += 1
        return count == len(inp.jobs)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        """Tiresias's events; with `wake_at_sizes`, the next time a running job's service crosses
        a known size too."""
        best = super().next_decision_time(inp)
        data, _ = self._distribution()
        if not data or not self.params.wake_at_sizes:
            return best
        jobs = self.order.touched() if self._tracking and self.order.follows(inp) else inp.jobs
        for j in jobs:
            if j.state != "running" or j.gpus <= 0:
                continue
            service = self._counters(j, inp.now)[0]
            i = bisect.bisect_right(data, service)
            if i < len(data):
                t = inp.now + (data[i] - service) / j.gpus
                if t > inp.now and (best is None or t < best):
                    best = t
        return best

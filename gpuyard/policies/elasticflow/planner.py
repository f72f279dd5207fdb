"""Plans of future GPU use: ElasticFlow's Minimum Satisfactory Share, and EDF's greedy plan.

A plan says how many GPUs a job gets from now on, segment by segment, on a *timeline* of the GPUs
still free in the future (a step function that the jobs planned before it have used up). Planning
every job in deadline order on one timeline answers the two questions ElasticFlow asks at every
event: can each job still finish by its deadline (admission), and how many GPUs does each job need
now (its minimum share; what is left over goes to the jobs that gain most from it).

Semantics follow ElasticFlow's simulator (gudiandian/ElasticFlow, `scheduler.py`:
`ef_sim_allocation`, `edf_sim_allocation`, `get_marginal`, `allocate_free_gpus`), written anew:

- Time is cut into slots of `slot` seconds from `now`: the deadline is rounded up to a slot
  boundary (`aligned deadline`), and a job's GPUs come back at its finish rounded up to a slot
  (its real finish, `ceil` to a second, is what the deadline is checked against). Every timeline
  breakpoint is therefore `now + k * slot`; only the segment that ends at the aligned deadline
  counts its work up to the real deadline.
- GPU counts are *levels*: the counts the job may run at (ElasticFlow: the throughput table's
  columns 1, 2, 4, ... up to the job's maximum). Where fewer GPUs than a level are free, the job
  gets the largest level that fits.
- Minimum Satisfactory Share (`plan_mss`): try levels from the smallest; for a level q, fill the
  segments *backwards* from the aligned deadline with q (or the largest level that fits) until the
  job's remaining steps are covered; the first level that covers them wins. The plan then runs
  forwards from now: the smaller level tried before q (none for the first level) until the
  segment where the backward fill stopped, q from there, until the work is done. A job that no
  level can finish in time gets its largest level throughout, past its deadline.
- `first`: the same plan with the job held at `first` GPUs until the next breakpoint (how
  ElasticFlow prices one more level for a job: `marginal`).
- EDF (`plan_edf`): in every segment from now, the job's maximum if that many GPUs are free, else
  the largest level that fits; its GPUs come back at its finish rounded up to a slot.

Timelines keep no two consecutive breakpoints with the same free count (ElasticFlow merges them
after each plan), which decides where the backward fill may stop. Everything here is plain Python
on plain data: it knows nothing of jobs, services or the throughput model.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress
from operator import ne

NO_DEADLINE = float(2**62)
"""The deadline of a best-effort job (ElasticFlow uses sys.maxsize): it plans after every job with
a deadline, at its smallest level, and takes leftovers."""


def align_up(start: float, t: float, slot: float) -> float:
    """`t` rounded up to `start + k * slot` (ElasticFlow's `align_to_time_slot`)."""
    k = (t - start) // slot
    if (t - start) % slot > 0:
        k += 1
    return start + k * slot


@dataclass(frozen=True, slots=True)
class Demand:
    """What planning needs to know of one job.

    `levels`: the GPU counts it may run at, ascending (at least one); `rates`: its steps/s at each.
    `deadline`: absolute seconds (`NO_DEADLINE` for a best-effort job)."""

    remaining: float
    deadline: float
    levels: tuple[int, ...]
    rates: tuple[float, ...]
    _rate: dict[int, float] = field(init=False, repr=False, compare=False)
    _fit: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rate", _rate_table(self.levels, self.rates))
        object.__setattr__(self, "_fit", _fit_table(self.levels))

    def rate(self, gpus: int) -> float:
        return self._rate[gpus]

    def fitting(self, free: int) -> int:
        """The largest level that fits in `free` GPUs (0 if none)."""
        fit = self._fit
        return fit[free] if 0 <= free < len(fit) else (fit[-1] if free > 0 else 0)

    def above(self, gpus: int) -> int:
        """The next level above `gpus` (`gpus` itself at the top)."""
        i = bisect.bisect_right(self.levels, gpus)
        return self.levels[i] if i < len(self.levels) else gpus


@functools.lru_cache(maxsize=1024)
def _rate_table(levels: tuple[int, ...], rates: tuple[float, ...]) -> dict[int, float]:
    """Steps/s by level (shared by every demand with these levels and rates: read only)."""
    return dict(zip(levels, rates, strict=True))


@functools.lru_cache(maxsize=1024)
def _fit_table(levels: tuple[int, ...]) -> list[int]:
    """The largest level <= n, for n up to the top level (shared: read only)."""
    return [levels[i - 1] if (i := bisect.bisect_right(levels, n)) else 0
            for n in range(levels[-1] + 1)]  # fmt: skip


@dataclass(slots=True)
class Timeline:
    """Free GPUs from `times[i]` until `times[i + 1]` (the last value lasts for ever)."""

    times: list[float]
    free: list[int]

    @classmethod
    def empty(cls, now: float, total: int) -> Timeline:
        return cls([now], [total])

    def copy(self) -> Timeline:
        return Timeline(list(self.times), list(self.free))

    def at(self, t: float) -> int:
        """Free GPUs at `t` (the whole cluster before the first breakpoint... never asked)."""
        i = bisect.bisect_right(self.times, t)
        return self.free[i - 1] if i else self.free[0]

    def index(self, t: float) -> int:
        """The index of breakpoint `t`, inserted (with the value in force there) if missing."""
        i = bisect.bisect_left(self.times, t)
        if i < len(self.times) and self.times[i] == t:
            return i
        self.times.insert(i, t)
        self.free.insert(i, self.free[i - 1] if i else self.free[0])
        return i

    def merged(self) -> Timeline:
        """Without breakpoints whose free count equals the one before (this timeline if none)."""
        changes = _changes(self.free)
        if all(changes):
            return self
        return Timeline(list(compress(self.times, changes)), list(compress(self.free, changes)))


@dataclass(slots=True)
class Plan:
    """A job's GPUs from `starts[i]` on (merged: no two consecutive equal counts; the last count
    lasts until `end`), its slot-aligned `end` (when its GPUs come back) and its real `finish`."""

    starts: list[float] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    end: float = 0.0
    finish: float = 0.0
    deadline: float = NO_DEADLINE

    @property
    def feasible(self) -> bool:
        return self.finish <= self.deadline

    def at(self, t: float) -> int:
        """GPUs at `t` (0 before the first start and from `end`)."""
        if t >= self.end:
            return 0
        i = bisect.bisect_right(self.starts, t)
        return self.gpus[i - 1] if i else 0

    def next_change(self, now: float) -> float | None:
        """The first time after `now` at which the plan's count changes, if any."""
        i = bisect.bisect_right(self.starts, now)
        return self.starts[i] if i < len(self.starts) else None

    def gpu_time(self) -> float:
        """GPU-seconds of the plan, as ElasticFlow counts them: each count until the next start,
        the last one until `end` (a count that starts after `end` adds nothing)."""
        total = 0.0
        for i, g in enumerate(self.gpus):
            until = self.starts[i + 1] if i + 1 < len(self.starts) else self.end
            total += g * (until - self.starts[i])
        return total


def _merged_plan(allocations: dict[float, int]) -> tuple[list[float], list[int]]:
    times = sorted(allocations)
    counts = list(map(allocations.__getitem__, times))
    changes = _changes(counts)
    return list(compress(times, changes)), list(compress(counts, changes))


def _changes(counts: list[int]) -> list[bool]:
    """Whether each count differs from the one before (the first always does)."""
    return [True, *map(ne, counts[1:], counts)]


# --------------------------------------------------------------------------- MSS


def plan_mss(
    timeline: Timeline, job: Demand, now: float, slot: float, total: int, *,
    first: int | None = None, merged: bool = True,
) -> tuple[Plan, Timeline]:  # fmt: skip
    """The job's Minimum Satisfactory Share plan on `timeline` (module docstring), and the
    timeline with the plan taken out (merged; `merged=False` leaves that to the caller, for a
    timeline it may never use). `timeline` starts at `now` and is not changed."""
    plan, new = _plan_mss(timeline, job, now, slot, total, first)
    return plan, new.merged() if merged else new


def _plan_mss(
    timeline: Timeline, job: Demand, now: float, slot: float, total: int, first: int | None
) -> tuple[Plan, Timeline]:
    deadline = job.deadline
    left = job.remaining
    aligned = align_up(now, deadline, slot)
    new = timeline.copy()
    if aligned >= now:
        new.index(aligned)
    allocations: dict[float, int] = {now: 0}
    start = now
    if first is not None:
        held, left = _hold_first(timeline, new, job, now, slot, aligned, first, allocations)
        if held is None:  # done within the first segment
            return _finish_first(timeline, new, job, now, slot, first, allocations, total)
        start = held
    tried = 0  # the level tried last
    for q in job.levels:
        if q > total:
            break
        point = _backward_fill(new, job, q, start, aligned, left)
        if point is not None:
            return _forward(
                timeline,
                new,
                job,
                slot,
                aligned,
                start,
                left,
                q,
                tried,
                point,
                allocations,
                total,
            )
        tried = q
    return _late(timeline, new, job, now, slot, total, aligned, start, left, tried, allocations,
                 first)  # fmt: skip


def _backward_fill(
    new: Timeline, job: Demand, q: int, start: float, aligned: float, left: float
) -> float | None:
    """Where a backward fill from the aligned deadline at level `q` covers `left` steps."""
    period_end = aligned
    done = 0.0
    times, free = new.times, new.free
    fit, rate, deadline = job._fit, job._rate, job.deadline
    for i in range(bisect.bisect_left(times, aligned) - 1, -1, -1):
        t = times[i]
        if t < start:
            break
        f = free[i]
        g = q if f >= q else (fit[f] if f > 0 else 0)  # (q is a level: what fits of it)
        if g == 0:
            period_end = t
            continue
        done += ((deadline if period_end == aligned else period_end) - t) * rate[g]
        if done >= left:
            return t
        period_end = t
    return None


def _forward(
    timeline: Timeline, new: Timeline, job: Demand, slot: float, aligned: float, start: float,
    left: float, q: int, smaller: int, point: float, allocations: dict[float, int], total: int,
) -> tuple[Plan, Timeline]:  # fmt: skip
    """Run the plan forwards from `start`: `smaller` before `point`, `q` from it, until done."""
    times, free = new.times, new.free
    fit, rate, deadline = job._fit, job._rate, job.deadline
    stop = bisect.bisect_right(times, aligned)
    # Every breakpoint from `start` to the deadline holds nothing unless planned: a run of them
    # is one 0 in the plan (its first), before the planned part and after it.
    unplanned_from = bisect.bisect_left(times, start)
    unplanned_to = bisect.bisect_left(times, aligned)
    # With no smaller level the job holds nothing before `point`: planning starts there.
    planned_from = bisect.bisect_left(times, start if smaller else point)
    if unplanned_from < min(planned_from, unplanned_to):
        allocations[times[unplanned_from]] = 0
    for k in range(planned_from, stop):
        t0, f = times[k], free[k]
        level = q if t0 >= point else smaller
        g = level if f >= level else (fit[f] if f > 0 else 0)  # (levels: what fits of them)
        allocations[t0] = g
        free[k] = f - g
        if k + 1 == stop:  # the last segment lasts until done
            real = math.ceil(left / rate[g]) if g else math.inf
            return _commit(timeline, new, job, start, t0 + align_up(0, real, slot), t0 + real,
                           allocations, total)  # fmt: skip
        if g:
            t1 = times[k + 1]
            work = ((deadline if t1 == aligned else t1) - t0) * rate[g]
            if t0 >= point and work >= left:
                real = math.ceil(left / rate[g])
                if k + 1 < unplanned_to:
                    allocations[t1] = 0
                return _commit(timeline, new, job, start, t0 + align_up(0, real, slot), t0 + real,
                               allocations, total)  # fmt: skip
            left -= work
    raise AssertionError("a backward fill's point lies before the aligned deadline")


def _commit(
    timeline: Timeline, new: Timeline, job: Demand, start: float, end: float, finish: float,
    allocations: dict[float, int], total: int,
) -> tuple[Plan, Timeline]:  # fmt: skip
    """The job's GPUs come back at `end`: the free count there is the one the timeline had before
    this plan (no breakpoint of the old timeline lies inside the job's last segment)."""
    times = timeline.times
    i = bisect.bisect_left(times, end)
    if math.isfinite(end) and not (i < len(times) and times[i] == end):
        before = timeline.free[i - 1] if i and times[i - 1] >= start else total
        new.free[new.index(end)] = before
    starts, gpus = _merged_plan(allocations)
    return Plan(starts, gpus, end, finish, job.deadline), new


def _late(
    timeline: Timeline, new: Timeline, job: Demand, now: float, slot: float, total: int,
    aligned: float, start: float, left: float, top: int, allocations: dict[float, int],
    first: int | None,
) -> tuple[Plan, Timeline]:  # fmt: skip
    """No level finishes by the deadline: the largest level tried (or what fits) until the
    aligned deadline, then what fits (up to the job's maximum) after it, until done."""
    times, free = new.times, new.free
    last = -1
    g = 0
    for i, t in enumerate(times):
        if t > aligned:
            break
        if t < start:
            continue
        if last >= 0:
            t0 = times[last]
            allocations[t0] = g
            free[last] -= g
            if g > 0:
                until = job.deadline if t == aligned else t
                left -= (until - t0) * job.rate(g)
        last, g = i, min(top, job.fitting(free[i]))
    # From the aligned deadline (or from start if it lies in the past) to the end of the timeline.
    t0 = max(aligned, start)
    i0 = new.index(t0)
    top_level = job.levels[-1]
    while i0 + 1 < len(times):
        g = min(job.fitting(free[i0]), top_level)
        allocations[times[i0]] = g
        if g > 0:
            work = (times[i0 + 1] - times[i0]) * job.rate(g)
            if work >= left:
                finish: float = math.ceil(times[i0] + left / job.rate(g))  # (or math.inf below)
                end = align_up(now, finish, slot)
                k = i0
                while k < len(times) and times[k] < end:
                    free[k] -= g
                    k += 1
                return _commit(timeline, new, job, start, end, finish, allocations, total)
            left -= work
            free[i0] -= g
        i0 += 1
    g = first if first is not None else job.fitting(min(total, top_level))
    allocations[times[i0]] = g
    finish = math.ceil(times[i0] + left / job.rate(g)) if g else math.inf
    end = align_up(now, finish, slot) if g else math.inf
    free[i0] = total - g
    if math.isfinite(end):
        new.free[new.index(end)] = total
    starts, gpus = _merged_plan(allocations)
    return Plan(starts, gpus, end, finish, job.deadline), new


def _hold_first(
    timeline: Timeline, new: Timeline, job: Demand, now: float, slot: float, aligned: float,
    first: int, allocations: dict[float, int],
) -> tuple[float | None, float]:  # fmt: skip
    """Hold the job at `first` GPUs from now to the next breakpoint: (where planning goes on,
    the steps left then), or (None, steps) if it finishes in that segment by its deadline."""
    i = bisect.bisect_right(timeline.times, now)
    following = timeline.times[i] if i < len(timeline.times) else aligned
    allocations[now] = first
    rate = job.rate(first)
    finish = math.ceil(now + job.remaining / rate)
    end = align_up(now, finish, slot)
    if following >= end and job.deadline >= finish:
        return None, job.remaining
    until = job.deadline if following == aligned else following
    new.free[new.index(now)] -= first
    allocations[following] = 0
    return following, job.remaining - (until - now) * rate


def _finish_first(
    timeline: Timeline, new: Timeline, job: Demand, now: float, slot: float, first: int,
    allocations: dict[float, int], total: int,
) -> tuple[Plan, Timeline]:  # fmt: skip
    rate = job.rate(first)
    finish = math.ceil(now + job.remaining / rate)
    end = align_up(now, finish, slot)
    new.free[new.index(now)] -= first
    return _commit(timeline, new, job, now, end, finish, allocations, total)


def plan_all_mss(
    jobs: Sequence[Demand], now: float, slot: float, total: int
) -> tuple[list[Plan], Timeline]:
    """Every job's MSS plan, in the order given (ElasticFlow: deadline order), on one timeline."""
    timeline = Timeline.empty(now, total)
    plans = []
    for job in jobs:
        plan, timeline = plan_mss(timeline, job, now, slot, total)
        plans.append(plan)
    return plans, timeline


# --------------------------------------------------------------------------- leftovers


def release(timeline: Timeline, plan: Plan) -> Timeline:
    """`timeline` with `plan`'s GPUs given back (merged). Only the plan's span is walked."""
    new = timeline.copy()
    times, free = new.times, new.free
    starts, end = plan.starts, plan.end
    for t in [*starts, end]:
        if math.isfinite(t):
            new.index(t)
    for k, g in enumerate(plan.gpus):
        until = min(starts[k + 1] if k + 1 < len(starts) else end, end)
        if g and starts[k] < until:
            stop = bisect.bisect_left(times, until) if math.isfinite(until) else len(times)
            for i in range(bisect.bisect_left(times, starts[k]), stop):
                free[i] += g
    # Merge where it may be needed: from the plan's first start to just past its last bound.
    lo = max(bisect.bisect_left(times, starts[0]), 1) if starts else 1
    last = max(starts[-1] if starts else -math.inf, end if math.isfinite(end) else -math.inf)
    hi = (
        min(bisect.bisect_right(times, last) + 1, len(times)) if math.isfinite(last) else len(times)
    )
    # The rest was merged and unchanged: only its first may repeat.
    for i in reversed([i for i in range(lo, min(hi + 1, len(times))) if free[i] == free[i - 1]]):
        del times[i], free[i]
    return new


def share_leftovers(
    jobs: Sequence[Demand], plans: list[Plan], timeline: Timeline, now: float, slot: float,
    total: int, *, order: str = "reference", lazy: bool = False,
) -> tuple[list[int], list[int]]:  # fmt: skip
    """Hand the GPUs free now to the jobs one level at a time (ElasticFlow's `allocate_free_gpus`).

    Every job that can take one more level is priced (`marginal`: re-planned held at the higher
    level until the next breakpoint, its minimum share after that); jobs with no GPUs now come
    first (ElasticFlow: an "infinite" gain), jobs that cannot grow last. The first job in that
    order grows, the others are priced again against the new timeline, and the order is sorted
    again (stably: ties keep the order they had, at first the deadline order `jobs` come in).
    `order="reference"` sorts the change in planned GPU-seconds per extra GPU in descending order
    (what ElasticFlow's code does, so that the job whose plan grows most is served first);
    `order="saving"` ascending (the paper's marginal return: the largest saving first).
    `plans` is updated in place for the jobs that grow. Returns each job's GPUs now, and the jobs
    (their indices) in the order the walk left them: sorted by their last price, ties in the order
    before; the deadline order if no GPU was free (ElasticFlow then sorts nothing). ElasticFlow
    places its jobs in that order, largest first.

    Pricing every job again after every step costs steps x jobs re-plans. The walk skips the
    re-plans whose answer it knows: a job with no GPUs keeps its infinite gain, and a job whose
    pricing read only a part of the timeline that the step left as it was (`_PriceScope`) keeps
    its price; the result is the same as pricing every job every time. With `lazy`, prices are
    only refreshed for the job about to be served: it is served if its fresh price still ranks
    first, else it goes back in line (lazy greedy evaluation; ties by deadline order). Not
    ElasticFlow's exact walk: a job's price can rise when others grow. (The lazy walk prices the
    job it is about to serve on the timeline it will grow on, so it keeps no scopes: a price that
    held would be made again for the plan.)"""
    gpus = [p.at(now) for p in plans]
    spare = total - sum(gpus)
    sign = 1.0 if order == "reference" else -1.0
    score = [-math.inf] * len(jobs)
    pending: list[tuple[Plan, Timeline] | None] = [None] * len(jobs)
    scope: list[_PriceScope | None] = [None] * len(jobs)
    current = [True] * len(jobs)  # whether a job's pending plan was made on this timeline
    cost = [p.gpu_time() for p in plans]  # of each job's current plan

    def price(i: int) -> None:
        step = jobs[i].above(gpus[i])
        current[i] = True
        if step == gpus[i] or step - gpus[i] > spare:
            score[i], pending[i] = -math.inf, None
            return
        released = release(timeline, plans[i])
        plan, after = plan_mss(released, jobs[i], now, slot, total, first=step, merged=False)
        pending[i] = plan, after  # (merged if it is served)
        if not lazy:
            scope[i] = _PriceScope.of(released, plans[i], plan, jobs[i], now, slot)
        gain = (plan.gpu_time() - cost[i]) / (step - gpus[i])
        score[i] = math.inf if gpus[i] == 0 else sign * gain

    def unpriced(i: int) -> bool:
        """Whether `i` keeps an infinite gain without a price (it has no GPUs and its next level
        fits): its plan is made when it is served."""
        if gpus[i] == 0 and jobs[i].above(0) <= spare:
            score[i], current[i] = math.inf, False
            return True
        return False

    def reprice(i: int, changed: float) -> None:
        """Price `i` again, unless its price holds on a timeline changed from `changed` on."""
        kept = scope[i]
        if unpriced(i):
            return
        if (
            pending[i] is not None
            and jobs[i].above(gpus[i]) - gpus[i] <= spare
            and kept is not None
            and kept.holds(timeline, changed)
        ):
            current[i] = False
        else:
            price(i)

    def grow(i: int) -> Timeline:
        """Give `i` its next level; returns the timeline before."""
        nonlocal spare, timeline
        if not current[i]:  # its price held, but its plan was made on an earlier timeline
            price(i)
        entry = pending[i]
        assert entry is not None
        before = timeline
        plans[i], timeline = entry[0], entry[1].merged()
        cost[i] = plans[i].gpu_time()
        step = jobs[i].above(gpus[i])
        spare -= step - gpus[i]
        gpus[i] = step
        return before

    if spare <= 0:
        return gpus, list(range(len(jobs)))
    for i in range(len(jobs)):
        if not unpriced(i):
            price(i)
    if lazy:
        steps = 0  # levels handed out so far
        priced = [0 if current[i] else -1 for i in range(len(jobs))]  # the step of each price
        line = [(-score[i], i) for i in range(len(jobs)) if score[i] > -math.inf]
        heapq.heapify(line)
        while line and spare > 0:
            _, i = heapq.heappop(line)
            if priced[i] != steps:  # stale: price again, serve only if still first in line
                price(i)
                priced[i] = steps
                if score[i] == -math.inf:
                    continue
                if line and (-score[i], i) > line[0]:
                    heapq.heappush(line, (-score[i], i))
                    continue
            grow(i)
            steps += 1
            price(i)
            priced[i] = steps
            if score[i] > -math.inf:
                heapq.heappush(line, (-score[i], i))
        return gpus, sorted(range(len(jobs)), key=lambda i: -score[i])
    queue = sorted(range(len(jobs)), key=lambda i: -score[i])
    while spare > 0:
        chosen = next(
            (i for i in queue
             if gpus[i] < jobs[i].above(gpus[i]) <= gpus[i] + spare),
            None,
        )  # fmt: skip
        if chosen is None:
            break
        changed = _first_change(grow(chosen), timeline)
        for i in queue:
            if jobs[i].above(gpus[i]) > gpus[i]:
                if i == chosen:
                    price(i)
                else:
                    reprice(i, changed)
        queue.sort(key=lambda i: -score[i])
    return gpus, queue


@dataclass(frozen=True, slots=True)
class _PriceScope:
    """What a job's price read of the timeline (it was priced held at a level until the first
    breakpoint after now, planned from there on): the breakpoint it started from, its plan's
    GPUs then and before, and the last instant whose free count it read (its aligned deadline or
    its end, whichever is later; for ever if it could not finish in time)."""

    start: float
    gpus_before: int
    gpus_at_start: int
    horizon: float

    @classmethod
    def of(
        cls, released: Timeline, given_back: Plan, priced: Plan, job: Demand, now: float,
        slot: float,
    ) -> _PriceScope | None:  # fmt: skip
        """The scope of pricing `job` on `released` (the timeline with its plan `given_back`),
        which made the plan `priced`."""
        if len(released.times) < 2:
            return None
        start = released.times[1]
        in_time = priced.finish <= job.deadline and math.isfinite(priced.end)
        horizon = max(align_up(now, job.deadline, slot), priced.end) if in_time else math.inf
        return cls(start, given_back.at(now), given_back.at(start), horizon)

    def holds(self, timeline: Timeline, changed: float) -> bool:
        """Whether the price is the same on `timeline`, which differs from the one it was made
        on from `changed` on (and in the count free now): the same free counts and breakpoints
        up to its horizon, and the same breakpoint to start from once the job's plan is given
        back (the count free now plus its GPUs now still differ from the next segment's)."""
        times, free = timeline.times, timeline.free
        return (
            changed > self.horizon
            and len(times) > 1
            and times[1] == self.start
            and free[0] + self.gpus_before != free[1] + self.gpus_at_start
        )


def _first_change(before: Timeline, after: Timeline) -> float:
    """The first instant after the first segment at which two timelines (merged, from the same
    instant) differ, in a breakpoint or a free count (-inf if their first breakpoints differ)."""
    bt, bf, at, af = before.times, before.free, after.times, after.free
    if len(bt) < 2 and len(at) < 2:
        return math.inf  # both flat from now on
    if len(bt) < 2 or len(at) < 2 or bt[1] != at[1]:
        return -math.inf
    n = min(len(bt), len(at))
    for k in range(1, n):
        if bt[k] != at[k] or bf[k] != af[k]:
            return min(bt[k], at[k])
    if len(bt) == len(at):
        return math.inf
    return bt[n] if len(bt) > n else at[n]


# --------------------------------------------------------------------------- EDF


def plan_edf(
    timeline: Timeline, job: Demand, now: float, slot: float, total: int, *,
    reference: bool = True,
) -> tuple[Plan, Timeline]:  # fmt: skip
    """EDF's plan (module docstring): as many GPUs as the job may use, from now on, where free.

    The job's GPUs come back at its finish rounded up to a slot. When that instant is already a
    breakpoint, ElasticFlow's code still writes there the count free before the job started
    (losing whatever an earlier job gave back at that instant); `reference=False` keeps the
    breakpoint's own count."""
    top = job.fitting(total)
    left = job.remaining
    new = timeline.copy()
    times, free = new.times, new.free
    allocations: dict[float, int] = {now: 0}
    i = 0
    while i + 1 < len(times):
        t0, t1 = times[i], times[i + 1]
        g = top if free[i] >= top else job.fitting(free[i])
        allocations[t0] = g
        if g > 0:
            finish = math.ceil(t0 + left / job.rate(g))
            if t1 >= finish:
                spare = free[i]
                free[i] -= g
                end = align_up(now, finish, slot)
                if end != t1 or reference:
                    new.free[new.index(end)] = spare
                return _edf_plan(allocations, end, finish, job), new.merged()
            left -= (t1 - t0) * job.rate(g)
            free[i] -= g
        i += 1
    # Past the last breakpoint every GPU is free.
    allocations[times[i]] = top
    finish = math.ceil(times[i] + left / job.rate(top))
    end = align_up(now, finish, slot)
    free[i] = total - top
    new.free[new.index(end)] = total
    return _edf_plan(allocations, end, finish, job), new.merged()


def _edf_plan(allocations: dict[float, int], end: float, finish: float, job: Demand) -> Plan:
    starts, gpus = _merged_plan(allocations)
    return Plan(starts, gpus, end, finish, job.deadline)


def plan_all_edf(
    jobs: Sequence[Demand], now: float, slot: float, total: int
) -> tuple[list[Plan], Timeline]:
    timeline = Timeline.empty(now, total)
    plans = []
    for job in jobs:
        plan, timeline = plan_edf(timeline, job, now, slot, total)
        plans.append(plan)
    return plans, timeline

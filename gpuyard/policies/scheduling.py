"""Built-in scheduling policies.

Every ordering policy here sorts the active jobs and hands the order to `fill_in_order`, the shared
walk that turns an order into allocations (Blox's round walk). Elastic policies (`optimus`) build on
the same walk for their minimum shares. Policies never read the clock: time comes in `inp.now`.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable
from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from gpuyard.shared.model import ANY_GPU, Allocation
from gpuyard.shared.policy import JobView, SchedulingInput, SchedulingPolicy

INF = math.inf
BLOX_STARVATION_S = 3.6e6
"""Blox's starvation threshold: seconds waited in a row before a job moves up one priority class."""

PositiveSeconds = Annotated[float, Meta(gt=0)]


# --------------------------------------------------------------------------- shared helpers


def held_or_requested(job: JobView) -> int:
    """GPUs a job asks for in a rigid policy: what it holds while running (when within its
    [min, max] range, e.g. after an elastic policy resized it), else `num_gpus`."""
    if job.state == "running" and job.gpus:
        low, high = job.spec.gpu_range
        if low <= job.gpus <= high:
            return job.gpus
    return job.spec.num_gpus


def _candidate_types(job: JobView, types: list[str]) -> list[str]:
    if job.spec.gpu_type != ANY_GPU:
        return [job.spec.gpu_type]
    if job.gpu_type is not None and job.gpu_type in types:
        return [job.gpu_type, *(t for t in types if t != job.gpu_type)]
    return types


def fill_in_order(
    order: list[JobView],
    capacity: dict[str, int],
    *,
    backfill: bool = False,
    demand: Callable[[JobView], int] = held_or_requested,
) -> list[Allocation]:
    """Walk `order` (most important first), giving each job `demand(job)` GPUs of one type.

    This is Blox's round walk: running jobs hold their GPUs; a job that is not running takes free
    GPUs, else preempts the running jobs *after it* in the order, last first (jobs placed earlier
    in this walk are not preemptible); a running job reached by the walk keeps its GPUs and type
    (resized to `demand(job)`, taking more from free GPUs or later running jobs if it grows).
    Without `backfill` the walk stops at the first job that cannot be placed even by preempting
    (head-of-line blocking, as Blox and Gavel do) and running jobs after that point keep running
    (they were not needed to make room). With `backfill`, the walk skips such a job and goes on
    (Tiresias's simulator does this). Returns allocations in order; running jobs left out are to
    be preempted. O(n) in the number of jobs.
    """
    free = dict(capacity)
    types = sorted(free)
    # Running jobs per type in walk order; entries [head:] are still "after" the walk position and
    # may be preempted from the tail. after[t] = their GPU total.
    running: dict[str, list[tuple[int, JobView]]] = {}
    after: dict[str, int] = {}
    for pos, job in enumerate(order):
        t = job.gpu_type
        if job.state == "running" and job.gpus > 0 and t is not None and t in free:
            free[t] -= job.gpus
            running.setdefault(t, []).append((pos, job))
            after[t] = after.get(t, 0) + job.gpus
    head = dict.fromkeys(running, 0)
    result: list[tuple[int, Allocation]] = []
    stopped = False
    for pos, job in enumerate(order):
        t = job.gpu_type
        lst = running.get(t) if t is not None else None
        if lst is not None and head[t] < len(lst) and lst[head[t]][0] == pos:
            # Running and not preempted: it competes for its own GPUs first, on its own type.
            head[t] += 1
            after[t] -= job.gpus
            free[t] += job.gpus
            cands = [t]
        else:
            cands = _candidate_types(job, types)
        need = demand(job)
        chosen = next((c for c in cands if free.get(c, 0) >= need), None)
        if chosen is None:
            chosen = next((c for c in cands if free.get(c, 0) + after.get(c, 0) >= need), None)
        if chosen is None:
            if backfill:
                continue
            stopped = True
            break
        while free[chosen] < need:  # preempt the last running job after this one
            _, victim = running[chosen].pop()
            free[chosen] += victim.gpus
            after[chosen] -= victim.gpus
        free[chosen] -= need
        result.append((pos, Allocation(job.job_id, need, chosen)))
    if stopped:  # running jobs after the blocking job keep running
        for t, lst in running.items():
            result.extend((p, Allocation(j.job_id, j.gpus, t)) for p, j in lst[head[t] :])
        result.sort(key=lambda pa: pa[0])
    return [a for _, a in result]


def is_starved(job: JobView, now: float, starvation_s: float | None) -> bool:
    """Blox's starvation guard: the job has waited `starvation_s` seconds in a row."""
    return (
        starvation_s is not None
        and job.state == "queued"
        and job.queued_since is not None
        and now - job.queued_since >= starvation_s
    )


def priority_class(job: JobView, now: float, starvation_s: float | None) -> int:
    """Sort key part (smaller first): the job's priority, one class better once starved."""
    return -(job.spec.priority + (1 if is_starved(job, now, starvation_s) else 0))


def next_starvation(
    jobs: Iterable[JobView], now: float, starvation_s: float | None
) -> float | None:
    """When the next queued job crosses the starvation threshold (None if none will)."""
    if starvation_s is None:
        return None
    times = [
        j.queued_since + starvation_s
        for j in jobs
        if j.state == "queued"
        and j.queued_since is not None
        and j.queued_since + starvation_s > now
    ]
    return min(times, default=None)


def earliest(*times: float | None) -> float | None:
    """The earliest of the given times, ignoring None."""
    present = [t for t in times if t is not None]
    return min(present, default=None)


# --------------------------------------------------------------------------- FIFO


class FifoParams(Struct, forbid_unknown_fields=True):
    backfill: bool = False
    """Let later jobs run when the head of the queue does not fit."""


class Fifo(SchedulingPolicy):
    """First in, first out by (priority, submit time): Blox's and Gavel's FIFO, with priority first.

    Registry name `fifo`. Running jobs are preempted only by higher-priority jobs.
    """

    Params = FifoParams

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        order = sorted(inp.jobs, key=lambda j: (-j.spec.priority, j.submit_time, j.seq))
        return fill_in_order(order, inp.cluster.capacity, backfill=self.params.backfill)


# --------------------------------------------------------------------------- SJF / SRTF


class SjfParams(Struct, forbid_unknown_fields=True):
    preemptive: bool = False
    """False: running jobs keep their GPUs ahead of shorter queued jobs (classic SJF);
    True: a shorter queued job preempts a longer running one."""
    backfill: bool = False
    """Let later jobs run when the job at the head does not fit."""
    starvation_s: PositiveSeconds | None = None
    """Seconds waited in a row after which a job moves up one priority class (None: never)."""


class Sjf(SchedulingPolicy):
    """Shortest job first by total `duration` (jobs of unknown duration last), priority first.

    Registry name `sjf`. Ties: submit time, then admission order. Tiresias's simulator's `sjf` is
    "smallest job (fewest GPUs) first"; this is the textbook shortest-duration-first instead.
    """

    Params = SjfParams

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        p, now = self.params, inp.now

        def key(j: JobView) -> tuple[int, int, float, float, int]:
            keep = 0 if (not p.preemptive and j.state == "running") else 1
            duration = j.spec.duration if j.spec.duration is not None else INF
            return (priority_class(j, now, p.starvation_s), keep, duration, j.submit_time, j.seq)

        return fill_in_order(sorted(inp.jobs, key=key), inp.cluster.capacity, backfill=p.backfill)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        return next_starvation(inp.jobs, inp.now, self.params.starvation_s)


class SrtfParams(Struct, forbid_unknown_fields=True):
    backfill: bool = False
    """Let later jobs run when the job at the head does not fit (Blox: False)."""
    starvation_s: PositiveSeconds | None = BLOX_STARVATION_S
    """Seconds waited in a row after which a job moves up one priority class (None: never)."""


class Srtf(SchedulingPolicy):
    """Shortest remaining time first (preemptive), Blox's SRTF: sort by (priority class,
    remaining time); jobs of unknown remaining time last. Registry name `srtf`."""

    Params = SrtfParams

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        p, now = self.params, inp.now

        def key(j: JobView) -> tuple[int, float, int]:
            rem = j.remaining_time if j.remaining_time is not None else INF
            return (priority_class(j, now, p.starvation_s), rem, j.seq)

        return fill_in_order(sorted(inp.jobs, key=key), inp.cluster.capacity, backfill=p.backfill)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        # Running jobs' remaining time only shrinks, so only starvation changes the order.
        return next_starvation(inp.jobs, inp.now, self.params.starvation_s)


# --------------------------------------------------------------------------- LAS


class LasParams(Struct, forbid_unknown_fields=True):
    key: Literal["gpu_seconds", "rounds"] = "gpu_seconds"
    """Attained service: GPU-seconds (`attained_service`) or, as Blox counts it, rounds run
    (+1 per round whatever the GPU count: `rounds_run`)."""
    backfill: bool = False
    """Let later jobs run when the job at the head does not fit (Blox: False)."""
    starvation_s: PositiveSeconds | None = BLOX_STARVATION_S
    """Seconds waited in a row after which a job moves up one priority class (None: never)."""


class Las(SchedulingPolicy):
    """Least attained service first, Blox's LAS: sort by (priority class, attained service), ties
    in admission order; preemptive.

    Registry name `las`. With `key="rounds"` and the Blox round loop this reproduces Blox (its
    attained service is +1 per round run). The starvation guard moves a job that has waited
    `starvation_s` in a row up one priority class while it keeps waiting; once it runs it is back
    in its own class (Blox keeps no memory of it either).
    """

    Params = LasParams

    def _service(self, j: JobView) -> float:
        return float(j.rounds_run) if self.params.key == "rounds" else j.attained_service

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        p, now = self.params, inp.now
        order = sorted(
            inp.jobs,
            key=lambda j: (priority_class(j, now, p.starvation_s), self._service(j), j.seq),
        )
        return fill_in_order(order, inp.cluster.capacity, backfill=p.backfill)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        # While jobs wait and others run, the running jobs' service grows past the waiting ones'.
        states = {j.state for j in inp.jobs}
        regular = inp.now + inp.cluster.round_s if states == {"queued", "running"} else None
        return earliest(regular, next_starvation(inp.jobs, inp.now, self.params.starvation_s))


# --------------------------------------------------------------------------- Tiresias


class _Epoch(Struct):
    """A promoted job's counters at its last promotion (Tiresias resets them there)."""

    at: float
    executed: float
    service: float
    rerun: float | None = None
    """When it first ran again after the promotion (pending time counts from then)."""


def _default_thresholds() -> list[float]:
    return [3600.0]


class TiresiasParams(Struct, forbid_unknown_fields=True):
    thresholds: list[Annotated[float, Meta(gt=0)]] = field(default_factory=_default_thresholds)
    """Queue limits in GPU-seconds: K-1 limits make K queues. Default [3600] (the README's 2
    queues); ElasticFlow's `dlas-gpu` copy uses [3250, 7200] (3 queues); [] is one FIFO queue."""
    promote_knob: Annotated[float, Meta(ge=0)] | None = None
    """Starvation prevention (the reference's `solve_starvation`): a waiting job in a lower queue is
    promoted to the top queue once its pending time reaches promote_knob * its executed time (both
    counted since its last promotion, see the class notes). None: K, the number of queues (as the
    ANCHORS summary puts it); 0: never (the reference's plain `dlas-gpu`)."""
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
    reference keeps them in the order they entered the queue; a job crossing several thresholds at
    once moves down all of them (the reference moves one queue per event, but schedules an event
    at every crossing, so the outcome is the same). The per-promoted-job counters (`_Epoch`) are
    the only memory this policy keeps: they are what the reference stores in its job records and
    cannot be derived from a `JobView`; `schedule()` updates them, `next_decision_time()` does not.
    Without promotions the policy is a pure function of its input.
    """

    Params = TiresiasParams

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.limits: list[float] = sorted(self.params.thresholds)
        knob = self.params.promote_knob
        self.knob: float = float(len(self.limits) + 1) if knob is None else knob
        self._epochs: dict[str, _Epoch] = {}

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

    def _update(self, inp: SchedulingInput) -> dict[str, int]:
        """Record promotions due at `inp.now`; return each job's queue."""
        now = inp.now
        live = {j.job_id for j in inp.jobs}
        for gone in [k for k in self._epochs if k not in live]:
            del self._epochs[gone]
        queues: dict[str, int] = {}
        for j in inp.jobs:
            e = self._epochs.get(j.job_id)
            if e is not None and e.rerun is None and j.executed_time > e.executed:
                ran = j.executed_time - e.executed
                end = now if j.state == "running" else (j.queued_since or now)
                e.rerun = end - ran
            service, executed, pending = self._counters(j, now)
            q = bisect.bisect_right(self.limits, service)
            if self._promotable(j, q, executed, pending):
                self._epochs[j.job_id] = _Epoch(now, j.executed_time, j.attained_service)
                q = 0
            queues[j.job_id] = q
        return queues

    def _within_queue_key(self, j: JobView) -> tuple[float, ...]:
        first = 0 if (self.params.running_first and j.state == "running") else 1
        return (first, j.submit_time, j.seq)

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        queues = self._update(inp)
        order = sorted(inp.jobs, key=lambda j: (queues[j.job_id], *self._within_queue_key(j)))
        return fill_in_order(order, inp.cluster.capacity, backfill=self.params.backfill)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        """The next demotion (a running job reaching its queue's limit) or promotion."""
        now = inp.now
        best: float | None = None
        for j in inp.jobs:
            service, executed, pending = self._counters(j, now)
            q = bisect.bisect_right(self.limits, service)
            t: float | None = None
            if j.state == "running" and q < len(self.limits) and j.gpus > 0:
                t = now + (self.limits[q] - service) / j.gpus
            elif (
                self.knob > 0 and j.state == "queued" and q > 0 and j.executed_time > 0
            ) and executed > 0:
                t = now + max(0.0, executed * self.knob - pending)
            if t is not None and t > now and (best is None or t < best):
                best = t
        return best


class TiresiasGittinsParams(TiresiasParams, forbid_unknown_fields=True):
    gittins_delta: PositiveSeconds = 3250.0
    """Service quantum Δ (GPU-seconds) of the Gittins index (the reference's `gittins_delta`)."""
    samples: list[Annotated[float, Meta(gt=0)]] = []
    """Known job sizes in GPU-seconds (a prior), added to the sizes learned from finished jobs."""
    window: Annotated[int, Meta(ge=1)] = 10_000
    """How many learned sizes to keep (the most recent)."""


class TiresiasGittins(Tiresias):
    """Tiresias with the Gittins index inside each queue (the reference's `dlas-gpu-gittins`).

    Registry name `tiresias-gittins`. Queues, demotion, promotion and backfill are as in
    `tiresias`; inside a queue jobs are sorted by Gittins index, highest first, ties by submit
    time. The index of a job with attained GPU-time a over the job-size distribution S is
    P(S - a <= Δ | S > a) / E[min(S - a, Δ) | S > a]. Like the reference it is evaluated at the next
    sample point above a (so it only changes when a crosses a sample) and is 0 past the largest.

    The distribution: the reference reads durations from a trace file (`yarn-gput1000.csv`) but
    compares them with GPU-time; here it is `samples` plus the GPU-time of the jobs seen to finish
    (a job leaving the active set; its last service plus its GPUs * the time since the last
    decision). With no sizes at all every index is 0, i.e. FIFO inside each queue.

    Reference bug: `cal_r_gittins_index` sums the finishing jobs' whole sizes instead of the
    service they still need (S - a) in the expectation; this computes E[min(S - a, Δ) | S > a].
    Its single-queue `gittins` schedule sorts by index ascending (lowest first), which inverts the
    policy; `dlas-gpu-gittins`, reproduced here, sorts highest first.
    """

    Params = TiresiasGittinsParams

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self._learned: list[float] = []
        self._last: dict[str, tuple[float, float, int]] = {}
        self._last_now: float | None = None
        self._sorted: list[float] = []
        self._prefix: list[float] = [0.0]
        self._dirty = True

    def _learn(self, inp: SchedulingInput) -> None:
        live = {j.job_id for j in inp.jobs}
        for job_id, (service, _, gpus) in self._last.items():
            if job_id not in live:
                extra = gpus * (inp.now - self._last_now) if self._last_now is not None else 0.0
                self._learned.append(service + max(0.0, extra))
                self._dirty = True
        if len(self._learned) > self.params.window:
            del self._learned[: len(self._learned) - self.params.window]
        self._last = {
            j.job_id: (j.attained_service, j.executed_time, j.gpus if j.state == "running" else 0)
            for j in inp.jobs
        }
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

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        self._learn(inp)
        queues = self._update(inp)
        now = inp.now
        index = {j.job_id: self.gittins_index(self._counters(j, now)[0]) for j in inp.jobs}
        order = sorted(
            inp.jobs, key=lambda j: (queues[j.job_id], -index[j.job_id], j.submit_time, j.seq)
        )
        return fill_in_order(order, inp.cluster.capacity, backfill=self.params.backfill)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        """Tiresias's events plus the next time a running job's service crosses a known size."""
        best = super().next_decision_time(inp)
        data, _ = self._distribution()
        if not data:
            return best
        for j in inp.jobs:
            if j.state != "running" or j.gpus <= 0:
                continue
            service = self._counters(j, inp.now)[0]
            i = bisect.bisect_right(data, service)
            if i < len(data):
                t = inp.now + (data[i] - service) / j.gpus
                if best is None or t < best:
                    best = t
        return best


# --------------------------------------------------------------------------- Optimus (elastic)


class OptimusParams(Struct, forbid_unknown_fields=True):
    backfill: bool = True
    """When a job's minimum share does not fit, still give later jobs theirs."""


class Optimus(SchedulingPolicy):
    """Elastic share in the spirit of Optimus (as Blox implements it): minimum shares first, in
    (priority, submit time) order; then spare GPUs, one at a time, to the job whose remaining work
    gains most from one more GPU, up to each job's `max_gpus`.

    Registry name `optimus`. Remaining work W = remaining_time * num_gpus GPU-seconds; assuming
    linear scaling, one more GPU on a job holding g saves W/g - W/(g+1) = W/(g(g+1)) seconds, so
    spare GPUs go to the jobs with the most remaining work first and spread as they accumulate.
    Jobs of unknown remaining time get spare GPUs only when no job with known work can use one.
    Optimus proper fits a convergence and speed model per job; with no such model this uses the
    remaining time the scheduler estimates. GPUs stay on the job's type (one type per job).
    """

    Params = OptimusParams
    elastic = True

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        order = sorted(inp.jobs, key=lambda j: (-j.spec.priority, j.submit_time, j.seq))
        base = fill_in_order(
            order,
            inp.cluster.capacity,
            backfill=self.params.backfill,
            demand=lambda j: j.spec.gpu_range[0],
        )
        by_id = {j.job_id: j for j in inp.jobs}
        free = dict(inp.cluster.capacity)
        for a in base:
            free[a.gpu_type] -= a.num_gpus
        heap: list[tuple[float, int, int]] = []

        def push(idx: int) -> None:
            a = base[idx]
            job = by_id[a.job_id]
            if a.num_gpus >= job.spec.gpu_range[1]:
                return
            if job.remaining_time is None:
                gain = -1.0  # unknown work: after every job with known work
            else:
                work = job.remaining_time * job.spec.num_gpus
                gain = work / (a.num_gpus * (a.num_gpus + 1))
            heapq.heappush(heap, (-gain, idx, a.num_gpus))

        for idx in range(len(base)):
            push(idx)
        while heap and any(free.values()):
            _, idx, _ = heapq.heappop(heap)
            a = base[idx]
            if free[a.gpu_type] <= 0:
                continue
            free[a.gpu_type] -= 1
            a.num_gpus += 1
            push(idx)
        return base

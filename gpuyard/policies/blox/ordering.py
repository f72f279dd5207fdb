"""Blox's ordering policies: FIFO, SJF, SRTF and LAS, each an order handed to the shared walk
(`toolkit.fill_in_order`). Policies never read the clock: time comes in `inp.now`."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from gpuyard.shared.model import Allocation, JobRecord
from gpuyard.shared.policy import Decision, JobView, SchedulingInput, SchedulingPolicy

from ..toolkit import (
    BLOX_STARVATION_S,
    StandingOrder,
    WaitingOrder,
    earliest,
    fill_in_order,
    next_starvation,
    priority_class,
)

INF = math.inf
PositiveSeconds = Annotated[float, Meta(gt=0)]


# --------------------------------------------------------------------------- FIFO


class FifoParams(Struct, forbid_unknown_fields=True):
    backfill: bool = False
    """Let later jobs run when the head of the queue does not fit (they are then never preempted
    for it: only a job of higher priority preempts)."""


class Fifo(SchedulingPolicy):
    """First in, first out by (priority, submit time): Blox's and Gavel's FIFO, with priority first.

    Registry name `fifo`. Running jobs are preempted only by higher-priority jobs: with
    `backfill`, a job that started ahead of an earlier one that did not fit keeps its GPUs (running
    jobs come first within a priority), so the earlier one waits for GPUs to free up.
    """

    Params = FifoParams

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        backfill = self.params.backfill

        def key(r: JobRecord) -> tuple[int, int, float]:
            first = 0 if backfill and r.state == "running" else 1
            return (-r.spec.priority, first, r.submit_time)

        self.order = StandingOrder(key)

    def schedule(self, inp: SchedulingInput) -> Decision | list[Allocation]:
        return self.order.fill(inp, backfill=self.params.backfill)


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

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        preemptive = self.params.preemptive

        def key(r: JobRecord) -> tuple[int, int, float, float]:  # (without the starvation guard)
            keep = 0 if (not preemptive and r.state == "running") else 1
            duration = r.spec.duration if r.spec.duration is not None else INF
            return (-r.spec.priority, keep, duration, r.submit_time)

        self.key = key
        self.order = StandingOrder(key)

    def schedule(self, inp: SchedulingInput) -> Decision | list[Allocation]:
        p, now = self.params, inp.now
        if p.starvation_s is None:  # the order changes only when jobs do
            return self.order.fill(inp, backfill=p.backfill)

        def key(j: JobView) -> tuple[Any, ...]:  # the guard's class in place of the priority
            _, *rest = self.key(j.record)
            return (priority_class(j, now, p.starvation_s), *rest, j.seq)

        return fill_in_order(sorted(inp.jobs, key=key), inp.cluster, backfill=p.backfill)

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

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        starvation_s = self.params.starvation_s

        def key(j: JobView, now: float) -> tuple[int, float, int]:
            rem = j.remaining_time
            if rem is None:
                rem = INF
            return (priority_class(j, now, starvation_s), rem, j.seq)

        # (a waiting job's remaining time stays as it is: only the running jobs are sorted anew)
        self.order = WaitingOrder(key, starvation_s)

    def schedule(self, inp: SchedulingInput) -> Decision | list[Allocation]:
        return self.order.fill(inp, backfill=self.params.backfill)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        # Running jobs' remaining time only shrinks, so only starvation changes the order.
        return self.order.next_starvation(inp)


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
    attained service is +1 per round run: `rounds_run` counts the rounds' worth of time a job ran,
    including rounds the scheduler skipped because nothing could change in them). The starvation guard moves a job that has waited
    `starvation_s` in a row up one priority class while it keeps waiting; once it runs it is back
    in its own class (Blox keeps no memory of it either).
    """

    Params = LasParams

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        starvation_s, rounds = self.params.starvation_s, self.params.key == "rounds"

        def key(j: JobView, now: float) -> tuple[int, float, int]:
            service = float(j.rounds_run) if rounds else j.attained_service
            return (priority_class(j, now, starvation_s), service, j.seq)

        # (a waiting job's service stays as it is: only the running jobs are sorted anew)
        self.order = WaitingOrder(key, starvation_s)

    def schedule(self, inp: SchedulingInput) -> Decision | list[Allocation]:
        return self.order.fill(inp, backfill=self.params.backfill)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        # While jobs wait and others run, the running jobs' service grows past the waiting ones'.
        states = {j.state for j in inp.jobs}
        regular = inp.now + inp.cluster.round_s if states == {"queued", "running"} else None
        return earliest(regular, self.order.next_starvation(inp))

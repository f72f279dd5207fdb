"""Gavel's heterogeneity-aware policies (OSDI 2020), registered under Gavel's names.

Each policy turns the scheduler's view into the arrays of `programs.py` (throughputs T[job, type]
from the configured throughput model, scale factors, weights, GPUs per type, steps left, time
since arrival), solves, and returns time shares: the scheduler's round mechanism (`mechanism =
"time_shares"`, `gpuyard/services/scheduler/mechanism.py`) turns them into each round's allocations, as
Gavel's does. Jobs are in admission order, which is Gavel's job-id order.

Naming: Gavel's own names, except that Gavel's `fifo` is `gavel_fifo` (gpuyard's `fifo` is Blox's;
`gpuyard sim --gavel --policy fifo` picks Gavel's). The heterogeneity-agnostic baselines are the
aware programs on made-up throughputs, as in the reference (`agnostic_throughputs`).
Where Gavel's code differs from its names (docs/fidelity.md), the default reproduces the code and
a parameter gives the intended behaviour.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from msgspec import Meta, Struct, field

from gpuyard.shared.model import ANY_GPU
from gpuyard.shared.policy import (
    Decision,
    JobView,
    Needs,
    SchedulingInput,
    SchedulingPolicy,
)

from . import programs
from .programs import Packing

PositiveFloat = Annotated[float, Meta(gt=0)]


# --------------------------------------------------------------------------- the arrays


@dataclass
class Arrays:
    """The scheduler's view as Gavel's programs take it."""

    now: float
    jobs: list[JobView]
    types: list[str]
    throughputs: np.ndarray
    scale_factors: np.ndarray
    weights: np.ndarray
    num_gpus: np.ndarray
    remaining: np.ndarray
    since_start: np.ndarray
    reference: int | None
    """The index of the throughput model's reference type (V100 for Gavel's table), if present."""

    @classmethod
    def of(cls, inp: SchedulingInput) -> Arrays:
        jobs = sorted(inp.jobs, key=lambda j: j.seq)
        cluster = inp.cluster
        types = [t for t, n in cluster.capacity.items() if n > 0]
        n, k = len(jobs), len(types)
        throughputs = np.zeros((n, k))
        for i, job in enumerate(jobs):
            for j, t in enumerate(types):
                throughputs[i, j] = cluster.rate(job, t, job.spec.num_gpus)
        reference = cluster.throughputs.reference_gpu_type
        return cls(
            now=inp.now, jobs=jobs, types=types, throughputs=throughputs,
            scale_factors=np.array([j.spec.num_gpus for j in jobs], dtype=np.float64),
            weights=np.array([j.spec.weight for j in jobs], dtype=np.float64),
            num_gpus=np.array([cluster.capacity[t] for t in types], dtype=np.float64),
            remaining=np.array([j.remaining_steps or 0.0 for j in jobs], dtype=np.float64),
            since_start=np.array([inp.now - j.submit_time for j in jobs], dtype=np.float64),
            reference=types.index(reference) if reference in types else None,
        )  # fmt: skip

    def packing(self, inp: SchedulingInput) -> Packing:
        """Pair throughputs by job type and GPU count from the model's co-located measurements
        (jobs of different GPU counts never share)."""
        kinds = sorted({(j.spec.job_type, j.spec.num_gpus) for j in self.jobs})
        index = {kind: i for i, kind in enumerate(kinds)}
        table = np.zeros((len(kinds), len(kinds), len(self.types)))
        model = inp.cluster.throughputs
        for a, (first, gpus) in enumerate(kinds):
            for b, (second, other_gpus) in enumerate(kinds):
                if gpus == other_gpus:
                    for k, t in enumerate(self.types):
                        table[a, b, k] = model.colocated(first, second, t, gpus)[0]
        job_types = np.array(
            [index[(j.spec.job_type, j.spec.num_gpus)] for j in self.jobs], dtype=np.int64
        )
        return Packing(job_types=job_types, pair_throughputs=table)

    def decision(self, allocation: programs.Allocation, **flags: Any) -> Decision:
        shares: dict[str, dict[str, float]] = {}
        for i, job in enumerate(self.jobs):
            row = {
                t: float(x) for t, x in zip(self.types, allocation.shares[i], strict=True) if x > 0
            }
            if row:
                shares[job.job_id] = row
        pair_shares: dict[tuple[str, str], dict[str, float]] = {}
        for (a, b), xs in zip(allocation.pairs.tolist(), allocation.pair_shares, strict=True):
            row = {t: float(x) for t, x in zip(self.types, xs, strict=True) if x > 0}
            if row:
                pair_shares[(self.jobs[a].job_id, self.jobs[b].job_id)] = row
        return Decision(shares=shares, pair_shares=pair_shares, **flags)


class GavelPolicy(SchedulingPolicy):
    """Base of Gavel's allocation policies: time shares, solved off the event loop."""

    mechanism = "time_shares"
    needs = Needs(throughputs=True)
    variant: ClassVar[Literal["agnostic", "perf", "packed"]] = "perf"

    def schedule(self, inp: SchedulingInput) -> Decision:
        arrays = Arrays.of(inp)
        if not arrays.jobs or not arrays.types:
            return Decision()
        packing = arrays.packing(inp) if self.variant == "packed" else None
        allocation = self.solve(arrays, packing)
        return arrays.decision(allocation, shuffle_types=self.shuffles_types())

    def shuffles_types(self) -> bool:
        """Whether the mechanism walks the GPU types in a new random order every round: Gavel
        does for the policies whose names say neither Perf nor Packing (the agnostic ones)."""
        return self.variant == "agnostic"

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        raise NotImplementedError

    def agnostic(self, a: Arrays, *, reference: bool, respect_unsupported: bool) -> np.ndarray:
        """The made-up throughputs of the agnostic baselines: all 1, or the reference (V100)
        column copied into every type."""
        return programs.agnostic_throughputs(
            a.throughputs, a.reference if reference else None,
            respect_unsupported=respect_unsupported,
        )  # fmt: skip

    def throughputs(self, a: Arrays, *, reference: bool = False) -> np.ndarray:
        if self.variant != "agnostic":
            return a.throughputs
        return self.agnostic(
            a, reference=reference, respect_unsupported=self.params.respect_unsupported
        )


# --------------------------------------------------------------------------- max-min fairness


class MaxMinParams(Struct, forbid_unknown_fields=True):
    respect_unsupported: bool = False
    """Agnostic variant: keep throughput 0 where a job cannot run (the reference writes 1 there,
    and can give a job time on a type where it makes no progress)."""
    tie_break: Literal["center", "vertex"] = "center"
    """Among optimal allocations: a central one (as the reference's interior-point solver) or a
    simplex corner."""


class MaxMinInteriorParams(MaxMinParams, forbid_unknown_fields=True):
    tie_break: Literal["interior", "center", "vertex"] = "interior"  # type: ignore[assignment]
    """Among optimal allocations: the one the reference's solver (ECOS) returns
    (`interior.py`), a central one of ours, or a simplex corner."""


class MaxMinFairnessPerf(GavelPolicy):
    """`max_min_fairness_perf`: heterogeneity-aware LAS (maximise the minimum normalised
    throughput)."""

    Params: ClassVar[type[MaxMinParams]] = MaxMinInteriorParams  # (the packed one's too)

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        return programs.max_min_fairness(
            self.throughputs(a), a.scale_factors, a.weights, a.num_gpus, packing=packing,
            tie_break=self.params.tie_break,
        )  # fmt: skip


class MaxMinFairness(MaxMinFairnessPerf):
    """`max_min_fairness`: LAS, heterogeneity-agnostic (every throughput 1)."""

    variant = "agnostic"
    needs = Needs()


class MaxMinFairnessPacked(MaxMinFairnessPerf):
    """`max_min_fairness_packed`: with space sharing (pairs of jobs on the same GPUs)."""

    Params = MaxMinParams  # (the reference fails on it in its own simulator: no point to follow)
    variant = "packed"


class WaterFillingParams(MaxMinInteriorParams, forbid_unknown_fields=True):
    bottleneck_test: Literal["reference", "exact"] = "reference"
    """How bottleneck jobs are found: the reference's MILP (silently falls back to plain max-min
    when a level is below 0.1) or exact LPs."""


class WaterFillingPackedParams(WaterFillingParams, forbid_unknown_fields=True):
    tie_break: Literal["center", "vertex"] = "center"
    """Among optimal allocations: a central one or a simplex corner (ECOS's point is the
    unpacked programs' only)."""


class MaxMinFairnessWaterFillingPerf(GavelPolicy):
    """`max_min_fairness_water_filling_perf`: max-min fairness, then raise the jobs that are not
    bottlenecks, level after level."""

    Params: ClassVar[type[WaterFillingParams]] = WaterFillingParams  # (the packed one's too)

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        return programs.max_min_fairness_water_filling(
            self.throughputs(a), a.scale_factors, a.weights, a.num_gpus, packing=packing,
            bottleneck_test=self.params.bottleneck_test, tie_break=self.params.tie_break,
        )  # fmt: skip


class MaxMinFairnessWaterFilling(MaxMinFairnessWaterFillingPerf):
    """`max_min_fairness_water_filling`: heterogeneity-agnostic."""

    variant = "agnostic"
    needs = Needs()


class MaxMinFairnessWaterFillingPacked(MaxMinFairnessWaterFillingPerf):
    """`max_min_fairness_water_filling_packed`."""

    Params = WaterFillingPackedParams
    variant = "packed"


# --------------------------------------------------------------------------- finish-time fairness


class FinishTimeParams(MaxMinInteriorParams, forbid_unknown_fields=True):
    priority_weighting: Literal["reference", "slowdown"] = "reference"
    """The reference ignores priority weights (`_perf`) or divides throughputs by them
    (`_packed`); "slowdown" minimises the weighted finish-time ratio instead."""

    def __post_init__(self) -> None:
        if self.tie_break == "interior" and self.priority_weighting != "reference":
            raise ValueError(
                "tie_break 'interior' goes with priority_weighting 'reference' (the "
                "reference's own program): use 'center' or 'vertex'"
            )


class FinishTimePackedParams(FinishTimeParams, forbid_unknown_fields=True):
    tie_break: Literal["center", "vertex"] = "center"


class FinishTimeState(Struct, kw_only=True):
    isolated: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    """Per job: (isolated time accrued, steps left, isolated throughput) at the last call."""


class FinishTimeFairnessPerf(GavelPolicy):
    """`finish_time_fairness_perf` (Themis): minimise the largest ratio of a job's finish time
    under the allocation to its finish time under an isolated 1/n share."""

    Params: ClassVar[type[FinishTimeParams]] = FinishTimeParams  # (the packed one's too)
    State = FinishTimeState

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.state = FinishTimeState()

    def snapshot(self) -> Struct:
        return self.state

    def restore(self, state: FinishTimeState) -> None:
        self.state = state

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        throughputs = self.throughputs(a, reference=True)
        iso = programs.isolated_throughputs(throughputs, a.scale_factors, a.num_gpus)
        known = self.state.isolated
        accrued = np.zeros(len(a.jobs))
        for i, job in enumerate(a.jobs):
            if job.job_id in known:  # the reference's bookkeeping between calls
                before, left, rate = known[job.job_id]
                accrued[i] = before + ((left - a.remaining[i]) / rate if rate > 0 else 0.0)
        self.state.isolated = {
            job.job_id: (float(accrued[i]), float(a.remaining[i]), float(iso[i]))
            for i, job in enumerate(a.jobs)
        }
        return programs.finish_time_fairness(
            throughputs, a.scale_factors, a.weights, a.num_gpus, a.remaining, a.since_start,
            isolated_time_elapsed=accrued, packing=packing,
            priority_weighting=self.params.priority_weighting, tie_break=self.params.tie_break,
        )  # fmt: skip


class FinishTimeFairness(FinishTimeFairnessPerf):
    """`finish_time_fairness`: heterogeneity-agnostic (V100 throughputs on every type)."""

    variant = "agnostic"


class FinishTimeFairnessPacked(FinishTimeFairnessPerf):
    """`finish_time_fairness_packed`."""

    Params = FinishTimePackedParams
    variant = "packed"


# --------------------------------------------------------------------------- makespan


class MinTotalDurationParams(MaxMinInteriorParams, forbid_unknown_fields=True):
    search: Literal["reference", "exact"] = "reference"
    """The reference's binary search (stops within a factor 1.05) or the exact optimum;
    `tie_break="interior"` (the reference's answer to its own search) goes with the first."""

    def __post_init__(self) -> None:
        if self.tie_break == "interior" and self.search != "reference":
            raise ValueError(
                "tie_break 'interior' goes with search 'reference' (the "
                "reference's answer to its own search): use 'center' or 'vertex'"
            )


class MinTotalDurationPackedParams(MaxMinParams, forbid_unknown_fields=True):
    search: Literal["reference", "exact"] = "reference"
    """The reference's binary search (stops within a factor 1.05) or the exact optimum."""


class MinTotalDurationPerf(GavelPolicy):
    """`min_total_duration_perf`: minimise the makespan of the jobs present."""

    Params: ClassVar[type[MaxMinParams]] = MinTotalDurationParams  # (the packed one's too)

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        return programs.min_total_duration(
            self.throughputs(a, reference=True), a.scale_factors, a.num_gpus, a.remaining,
            packing=packing, search=self.params.search, tie_break=self.params.tie_break,
        )  # fmt: skip


class MinTotalDuration(MinTotalDurationPerf):
    """`min_total_duration`: heterogeneity-agnostic (V100 throughputs on every type)."""

    variant = "agnostic"


class MinTotalDurationPacked(MinTotalDurationPerf):
    """`min_total_duration_packed` (the reference's own simulator fails on it: a central point
    of ours among the allocations that meet the bound)."""

    Params = MinTotalDurationPackedParams
    variant = "packed"


# --------------------------------------------------------------------------- throughput


class SumParams(Struct, forbid_unknown_fields=True):
    normalize: bool = False
    """Maximise the sum of normalised throughputs (what the reference's name says) rather than of
    raw steps/s (what its code does)."""
    tie_break: Literal["center", "vertex"] = "center"


class MaxSumThroughputPerf(GavelPolicy):
    """`max_sum_throughput_perf`: maximise the cluster's total throughput."""

    Params = SumParams

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        return programs.max_sum_throughput(
            a.throughputs, a.scale_factors, a.num_gpus, normalize=self.params.normalize,
            tie_break=self.params.tie_break,
        )  # fmt: skip


def _on_demand_costs() -> dict[str, float]:
    return {"v100": 3.06, "p100": 1.46, "k80": 0.90}


class CostParams(Struct, forbid_unknown_fields=True):
    costs: dict[str, PositiveFloat] = field(default_factory=_on_demand_costs)
    """Price of one GPU of each type per hour (default: AWS/GCP on-demand prices of Gavel's time:
    p3 V100 3.06, P100 1.46, p2 K80 0.90); types not listed cost 1."""
    tie_break: Literal["center", "vertex"] = "center"


class MaxSumThroughputNormalizedByCostPerf(GavelPolicy):
    """`max_sum_throughput_normalized_by_cost_perf`: maximise steps per dollar."""

    Params = CostParams
    slos: ClassVar[bool] = False

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        costs = np.array([self.params.costs.get(t, 1.0) for t in a.types])
        slos = None
        if self.slos:  # seconds left to each job's deadline (its SLO)
            slos = np.array([np.inf if j.spec.deadline is None else j.spec.deadline - a.now
                             for j in a.jobs])  # fmt: skip
        return programs.max_sum_throughput_normalized_by_cost(
            a.throughputs, a.scale_factors, a.num_gpus, costs, slos=slos,
            remaining_steps=a.remaining if self.slos else None, tie_break=self.params.tie_break,
        )  # fmt: skip


class MaxSumThroughputNormalizedByCostPerfSlos(MaxSumThroughputNormalizedByCostPerf):
    """`max_sum_throughput_normalized_by_cost_perf_SLOs`: the same, with each job's deadline (its
    SLO) met when it can be."""

    slos = True


# --------------------------------------------------------------------------- no program


class Isolated(GavelPolicy):
    """`isolated`: an equal share of the cluster for every job."""

    class Params(Struct, forbid_unknown_fields=True):
        skip_unsupported: bool = False
        """Give no time where a job cannot run (the reference does)."""

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        return programs.isolated(
            a.throughputs, a.scale_factors, a.num_gpus,
            skip_unsupported=self.params.skip_unsupported,
        )  # fmt: skip

    def shuffles_types(self) -> bool:
        return True  # Gavel's `Isolated` (its name says neither Perf nor Packing)


class AlloxState(Struct, kw_only=True):
    running: dict[str, list[float]] = field(default_factory=dict)
    """The shares of the jobs it started (a job keeps its GPU until it finishes)."""


class Allox(GavelPolicy):
    """`allox` (Le et al., EuroSys 2020): single-GPU jobs matched to GPUs by a min-cost
    assignment that minimises the sum of completion times."""

    class Params(Struct, forbid_unknown_fields=True):
        alpha: Annotated[float, Meta(gt=0, le=1)] = 1.0
        """The share of waiting jobs considered, longest waiting first."""

    State = AlloxState

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.state = AlloxState()

    def snapshot(self) -> Struct:
        return self.state

    def restore(self, state: AlloxState) -> None:
        self.state = state

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        previous = np.zeros_like(a.throughputs)
        for i, job in enumerate(a.jobs):
            row = self.state.running.get(job.job_id)
            if row is not None and len(row) == len(a.types):
                previous[i] = row
        allocation = programs.allox(
            a.throughputs, a.scale_factors, a.num_gpus, a.remaining, a.since_start,
            previous=previous, alpha=self.params.alpha,
        )  # fmt: skip
        self.state.running = {
            job.job_id: allocation.shares[i].tolist()
            for i, job in enumerate(a.jobs)
            if allocation.shares[i].sum() > 0
        }
        return allocation


class GandivaState(Struct, kw_only=True):
    partners: dict[str, str] = field(default_factory=dict)
    """Each placed job's partner, or "" when it runs alone."""
    rng: Any = None
    """The generator's state (`random.Random.getstate()`), to draw the same pairs after a restart."""


class Gandiva(GavelPolicy):
    """`gandiva`: random pairing of jobs on the same GPUs when they do not all fit, kept while
    the pair's normalised throughput is at least 1."""

    class Params(Struct, forbid_unknown_fields=True):
        seed: int = 0

    variant = "packed"
    State = GandivaState

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.rng = random.Random(self.params.seed)
        self.partners: dict[str, str] = {}

    def snapshot(self) -> Struct:
        return GandivaState(partners=self.partners, rng=self.rng.getstate())

    def restore(self, state: GandivaState) -> None:
        self.partners = dict(state.partners)
        if state.rng is not None:
            version, internal, gauss = state.rng
            self.rng.setstate((version, tuple(internal), gauss))

    def solve(self, a: Arrays, packing: Packing | None) -> programs.Allocation:
        assert packing is not None
        index = {job.job_id: i for i, job in enumerate(a.jobs)}
        partner = np.full(len(a.jobs), programs.UNASSIGNED, dtype=np.int64)
        for i, job in enumerate(a.jobs):
            mate = self.partners.get(job.job_id)
            if mate == "":
                partner[i] = programs.ALONE
            elif mate is not None and mate in index:
                partner[i] = index[mate]
        allocation, after = programs.gandiva(
            a.throughputs, a.scale_factors, a.num_gpus, packing, partner, self.rng
        )
        self.partners = {}
        for i, job in enumerate(a.jobs):
            if after[i] == programs.ALONE:
                self.partners[job.job_id] = ""
            elif after[i] >= 0:
                self.partners[job.job_id] = a.jobs[int(after[i])].job_id
        return allocation


# --------------------------------------------------------------------------- FIFO


class FifoState(Struct, kw_only=True):
    assigned: dict[str, str] = field(default_factory=dict)
    """The GPU type each started job keeps until it ends (Gavel's FIFO does not preempt)."""
    rng: Any = None
    """The generator's state (`random.Random.getstate()`), to draw the same types after a
    restart."""


class GavelFifo(GavelPolicy):
    """Gavel's `fifo`: jobs in arrival order, each given one GPU type and kept there until it
    ends. As the reference does: the GPUs a finished job leaves go to the job at the head of the
    queue if it fits and can run there; then each waiting job, in order, draws a type at random
    among those with room for it (the reference's code draws one and then uses another, V100
    first: a bug; gpuyard uses the one drawn), is skipped for now if it cannot run on the type
    drawn, and the walk stops at the first job that fits no type. Registry name `gavel_fifo`."""

    class Params(Struct, forbid_unknown_fields=True):
        seed: int = 0
        """Seed of the random type choice."""

    variant: ClassVar[Literal["agnostic", "perf", "packed"]] = "agnostic"  # (FifoPerf's too)
    needs = Needs()
    State = FifoState
    perf: ClassVar[bool] = False

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.state = FifoState()
        self.rng = random.Random(self.params.seed)

    def snapshot(self) -> Struct:
        return FifoState(assigned=self.state.assigned, rng=self.rng.getstate())

    def restore(self, state: FifoState) -> None:
        self.state = FifoState(assigned=dict(state.assigned))
        if state.rng is not None:
            version, internal, gauss = state.rng
            self.rng.setstate((version, tuple(internal), gauss))

    def schedule(self, inp: SchedulingInput) -> Decision:
        a = Arrays.of(inp)
        index = {j.job_id: i for i, j in enumerate(a.jobs)}
        kept = {} if self.perf else {j: t for j, t in self.state.assigned.items() if j in index}
        free = dict(zip(a.types, a.num_gpus.tolist(), strict=True))
        for job_id, t in kept.items():
            free[t] -= a.jobs[index[job_id]].spec.num_gpus
        queue = [i for i, job in enumerate(a.jobs) if job.job_id not in kept]

        def runs(i: int, t: str) -> bool:
            spec = a.jobs[i].spec
            return a.throughputs[i, a.types.index(t)] > 0 and spec.gpu_type in (ANY_GPU, t)

        def assign(i: int, t: str) -> None:
            kept[a.jobs[i].job_id] = t
            free[t] -= a.jobs[i].spec.num_gpus

        if not self.perf:  # a finished job's GPUs go to the head of the queue first
            ended = sorted(set(self.state.assigned) - index.keys(), key=_job_order)
            for t in (self.state.assigned[j] for j in ended):
                if queue and free.get(t, 0) >= a.jobs[queue[0]].spec.num_gpus and runs(queue[0], t):
                    assign(queue.pop(0), t)
        for i in queue:
            need = a.jobs[i].spec.num_gpus
            if self.perf:
                fits = [t for t in a.types if free[t] >= need and runs(i, t)]
                if not fits:
                    break  # FIFO: nobody overtakes the job at the head
                assign(i, max(fits, key=lambda t: a.throughputs[i, a.types.index(t)]))
                continue
            fits = sorted(t for t in a.types if free[t] >= need)
            if not fits:
                break
            t = fits[self.rng.randrange(len(fits))]
            if runs(i, t):
                assign(i, t)
        self.state.assigned = kept
        shares = {job_id: {t: 1.0} for job_id, t in kept.items()}
        return Decision(shares=shares, only_allocated=True)


def _job_order(job_id: str) -> tuple[int, int | str]:
    """Job ids in the reference's order: numerically where they are numbers."""
    return (0, int(job_id)) if job_id.isdigit() else (1, job_id)


class FifoPerf(GavelFifo):
    """`fifo_perf`: FIFO, each job on the fastest GPU type with room, decided afresh each time."""

    variant = "perf"
    needs = Needs(throughputs=True)
    perf = True

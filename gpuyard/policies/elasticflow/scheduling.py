"""ElasticFlow's elastic scheduling and its EDF baseline: deadline-ordered plans of future GPU use.

Both re-plan every active job at every decision, in deadline order, from the jobs' remaining steps
(`planner`), and run what the plans give now. Decisions come at arrivals (declined ones too),
completions and the plans' own change points, at most once per scheduling slot (the scheduler's
`slots` mode); the slot is the scheduler's round (`--round`), on which ElasticFlow also
aligns its plans.
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import Needs, SchedulingInput, SchedulingPolicy

from .demand import Levels, MaxLevel, by_deadline, job_demand, main_type
from .planner import Demand, Plan, plan_all_edf, plan_all_mss, share_leftovers


class _Planned(SchedulingPolicy):
    """A policy that plans at every event and wakes where its plans change."""

    needs = Needs(throughputs=True, decide_on_exit=True, decide_on_arrival=True)

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self._wake: tuple[float, float | None] | None = None  # (decided at, next plan change)
        self.levels = Levels()

    def decide(self, inp: SchedulingInput) -> tuple[list[Allocation], list[Plan]]:
        raise NotImplementedError

    def demands(self, inp: SchedulingInput) -> tuple[str, int, list[str], list[Demand]]:
        """(the GPU type, its GPUs, the ids of the jobs with a demand in deadline order, their
        demands)."""
        gpu_type, total = main_type(inp.cluster)
        ids: list[str] = []
        demands: list[Demand] = []
        cache = self.levels.of(inp.cluster.throughputs)
        for job in by_deadline(inp.jobs):
            d = job_demand(job, gpu_type, total, self.params.max_level, cache=cache)
            if d is not None:
                ids.append(job.job_id)
                demands.append(d)
        return gpu_type, total, ids, demands

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        allocations, plans = self.decide(inp)
        self._wake = (inp.now, _next_change(plans, inp.now))
        return allocations

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        if self._wake is not None and self._wake[0] == inp.now:
            return self._wake[1]
        return _next_change(self.decide(inp)[1], inp.now)


class ElasticFlowParams(Struct, forbid_unknown_fields=True):
    marginal_order: Literal["reference", "saving"] = "reference"
    """Which job gets the next level of the GPUs left over: `reference` as ElasticFlow's code
    does (the largest increase in planned GPU-seconds per extra GPU first), `saving` as its paper
    says (the smallest increase, i.e. the largest marginal return, first)."""
    max_level: MaxLevel = "peak"
    """How far a job scales: `peak` (ElasticFlow) or `largest`."""
    leftovers: Literal["exact", "lazy"] = "exact"
    """`exact`: ElasticFlow's walk, every job priced again after every level handed out (steps x
    jobs re-plans per decision); `lazy`: only the job at the head of the line is priced again
    (`planner.share_leftovers(lazy=True)`), for clusters of hundreds of GPUs and jobs."""
    listed: Literal["largest-first", "started"] = "largest-first"
    """The order of the allocations, which ElasticFlow's placement (`node-sets`, order `given`)
    follows: `largest-first` (ties in the order the leftover walk leaves them), as its
    `ef-accessctrl` places; `started`, as its `ef` places: the jobs of whole nodes in the order
    they started, then the others by size, largest first, each size in the order they started
    (those a decision starts: first the ones their plans start, in arrival order, then the ones
    the leftover walk starts, in its order)."""


class ElasticFlowState(Struct, kw_only=True):
    started: list[str] = []
    """The active jobs in the order they started (`listed="started"`)."""


class ElasticFlow(_Planned):
    """ElasticFlow (ASPLOS 2023) elastic scheduling: every job gets its Minimum Satisfactory Share,
    the GPUs left over go out one level at a time by marginal gain.

    Registry name `elasticflow`. At each decision every active job is planned in deadline order on
    one timeline of future free GPUs (`planner.plan_mss`); a job runs now on what its plan gives
    now (a job whose plan starts later waits, a running one may pause), then the GPUs still free
    go out by `planner.share_leftovers`. Allocations are listed largest first, ties in the order
    the leftover walk left them (the order in which ElasticFlow places jobs: `node-sets`). The
    policy decides at most once a slot and asks to decide again where a plan changes before any
    running job's planned end (`_next_change`). Best-effort jobs (and jobs without a deadline)
    plan after every job with one and live on leftovers. Admission (`elasticflow` admission
    policy) keeps the plans feasible; without it (ElasticFlow's `ef` scheme) jobs that cannot make
    it run at their largest level.
    """

    Params = ElasticFlowParams
    State = ElasticFlowState
    # (the nodes' size: `listed="started"` puts the jobs of whole nodes first)
    needs = Needs(throughputs=True, decide_on_exit=True, decide_on_arrival=True, nodes=True)

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.started: list[str] = []
        self.starting: list[str] = []  # the order of the decision being made

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        allocations = super().schedule(inp)
        if self.params.listed == "started":
            self.started = self.starting
        return allocations

    def snapshot(self) -> ElasticFlowState:
        return ElasticFlowState(started=list(self.started))

    def restore(self, state: ElasticFlowState) -> None:
        self.started = list(state.started)

    def plans(
        self, inp: SchedulingInput
    ) -> tuple[list[str], list[Plan], list[int], list[int], str]:
        """(job ids in deadline order, their plans, their GPUs now, the order the leftover walk
        left them in, the GPU type)."""
        gpu_type, total, ids, demands = self.demands(inp)
        slot = inp.cluster.round_s
        plans, timeline = plan_all_mss(demands, inp.now, slot, total)
        gpus, order = share_leftovers(
            demands,
            plans,
            timeline,
            inp.now,
            slot,
            total,
            order=self.params.marginal_order,
            lazy=self.params.leftovers == "lazy",
        )
        return ids, plans, gpus, order, gpu_type

    def decide(self, inp: SchedulingInput) -> tuple[list[Allocation], list[Plan]]:
        ids, plans, gpus, order, gpu_type = self.plans(inp)
        if self.params.listed == "started":
            return self.in_start_order(inp, ids, plans, gpus, order, gpu_type), plans
        chosen = sorted((i for i in order if gpus[i] > 0), key=lambda i: -gpus[i])  # (stable)
        return [Allocation(ids[i], gpus[i], gpu_type) for i in chosen], plans

    def in_start_order(
        self, inp: SchedulingInput, ids: list[str], plans: list[Plan], gpus: list[int],
        order: list[int], gpu_type: str,
    ) -> list[Allocation]:  # fmt: skip
        """The allocations as ElasticFlow's `ef` places its jobs (`listed="started"`)."""
        index = {job_id: i for i, job_id in enumerate(ids)}
        started = [job_id for job_id in self.started if job_id in index]
        known = set(started)
        new = [i for i in order if gpus[i] > 0 and ids[i] not in known]  # (in the walk's order)
        arrival = {j.job_id: j.seq for j in inp.jobs}
        by_plan = sorted(
            (i for i in new if plans[i].at(inp.now) > 0), key=lambda i: arrival[ids[i]]
        )
        by_walk = [i for i in new if plans[i].at(inp.now) == 0]
        started += [ids[i] for i in by_plan + by_walk]
        self.starting = started  # (kept by `schedule`: a look ahead must not change it)
        nodes = [n.num_gpus for n in inp.cluster.nodes if n.gpu_type == gpu_type]
        whole_node = max(nodes, default=1)
        running = [index[job_id] for job_id in started if gpus[index[job_id]] > 0]
        whole = [i for i in running if gpus[i] >= whole_node]
        parts = sorted((i for i in running if gpus[i] < whole_node), key=lambda i: -gpus[i])
        return [Allocation(ids[i], gpus[i], gpu_type) for i in whole + parts]


def _next_change(plans: list[Plan], now: float) -> float | None:
    """The first instant a plan changes, unless a running job's plan ends before or then: that
    end is an event of its own, where every plan is made again (ElasticFlow adds a plan's change
    as an event only before its next event). A restart pause makes a job end later than planned;
    waking at its planned end would decide once more, and restart every job once more."""
    changes = [t for p in plans if (t := p.next_change(now)) is not None]
    if not changes:
        return None
    ends = [p.end for p in plans if p.end > now and p.at(now) > 0]
    first = min(changes)
    return None if ends and first >= min(ends) else first


class EdfState(Struct, kw_only=True):
    order: list[str] = []
    """The active jobs in the order the last decision listed them."""


class EdfParams(Struct, forbid_unknown_fields=True):
    max_level: MaxLevel = "largest"
    """How far a job scales: `largest` (ElasticFlow's EDF: as many GPUs as the job can use)."""


class Edf(_Planned):
    """Earliest deadline first with elastic jobs (ElasticFlow's `edf` baseline).

    Registry name `edf`. In deadline order, each job takes as many GPUs as it can use (its
    largest level) where that many are free, else the largest level that fits, until it is done
    (`planner.plan_edf`); a job runs now on what its plan gives now. Best-effort jobs come last.
    Allocations are listed in the order ElasticFlow's EDF places its jobs (`node-sets`, order
    `given`): deadline order, except where the decision takes in newly admitted jobs, which then
    follow the previous decision's order, in admission order (its list of runnable jobs is sorted
    by deadline only at events that admit no job).
    Decisions come at most once a slot. With the `edf` admission policy only jobs whose plans all
    meet their deadlines are admitted (`edf-accessctrl`).
    """

    Params = EdfParams
    State = EdfState

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.order: list[str] = []

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        """None: EDF decides at arrivals and completions only, as ElasticFlow's does. (Its plans
        change only where a job is planned to end, and that job's end is an event; waking at the
        planned end would decide once more when a restart pause has delayed the job.)"""
        return None

    def snapshot(self) -> EdfState:
        return EdfState(order=list(self.order))

    def restore(self, state: EdfState) -> None:
        self.order = list(state.order)

    def decide(self, inp: SchedulingInput) -> tuple[list[Allocation], list[Plan]]:
        gpu_type, total, ids, demands = self.demands(inp)
        plans, _ = plan_all_edf(demands, inp.now, inp.cluster.round_s, total)
        allocations = [
            Allocation(job_id, g, gpu_type)
            for job_id, plan in zip(ids, plans, strict=True)
            if (g := plan.at(inp.now)) > 0
        ]
        return allocations, plans

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        allocations = super().schedule(inp)
        listed = set(self.order)
        new = [j for j in inp.jobs if j.job_id not in listed]
        if new:
            active = {j.job_id for j in inp.jobs}
            kept = [job_id for job_id in self.order if job_id in active]
            self.order = kept + [j.job_id for j in sorted(new, key=lambda j: j.seq)]
        else:
            self.order = [j.job_id for j in by_deadline(inp.jobs)]
        place = {job_id: i for i, job_id in enumerate(self.order)}
        return sorted(allocations, key=lambda a: place[a.job_id])

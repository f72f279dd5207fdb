"""Pollux's policy (OSDI '21, `simulator/pollux.py` of its artifact): every round, the
allocation of GPUs to jobs that maximises the power mean (p = -1) of the jobs' speedups, each
a job's goodput on its allocation over its goodput at a fair share of the cluster, scaled by its
share and docked for a restart; at most one distributed job per node.

The artifact searches with NSGA-II (pymoo, 100 generations of 100, drawn at random). Ours is a
deterministic search (docs/fidelity.md § Pollux): the GPUs each job gets, optimal for the
objective given each job on as few nodes as its GPUs need (a multiple-choice knapsack solved by
dynamic programming over the cluster's GPUs), then the jobs laid out on nodes, those that keep
their GPUs where they are, the others largest first, each on the node it fits best.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from msgspec import Struct

from gpuyard.shared.goodput import Application, GoodputFunction, SpeedupFunction
from gpuyard.shared.model import Allocation, GoodputHints, JobSpec
from gpuyard.shared.policy import JobView, Needs, NodeStatus, SchedulingInput

from .profiles import ProfilesParams, UsesProfiles

MAX_REPLICAS = 64
"""The artifact's cap on a job's GPUs ("the simulator can't handle more")."""
LAYOUT_ROUNDS = 4
"""How often the GPU counts are chosen again, jobs that could not be laid out with theirs
limited to what they got."""
SPEEDUP_FLOOR = 1e-3
"""Added to every scaled speedup in the power mean (a job without GPUs weighs 1 / 1e-3)."""


class PolluxParams(ProfilesParams, forbid_unknown_fields=True):
    restart_delay_s: float = 30.0
    """The restart penalty's delay: a job that would restart has its speedup scaled by
    max(age - restarts x delay, 0) / (age + delay)."""
    power: float = -1.0
    """The power mean's exponent (more negative: fairer); 0 is the geometric mean."""
    max_nodes: int = 16
    """The most nodes one job spans (the artifact's repair)."""


class PolluxState(Struct, kw_only=True):
    """The GPUs per node of each job as the policy last laid them out (its running jobs' places)."""

    layouts: dict[str, dict[str, int]] = {}


class Pollux(UsesProfiles):
    """Pollux (OSDI '21): co-adaptive scheduling on goodput. A job's speedup comes from the
    goodput hints it reports (`JobView.goodput`: its fitted step-time model and gradient
    statistics); before any, its GPUs over its fair share. Each job may grow to twice the most
    GPUs it has run on (at least 1; at most its batch limit over its smallest per-GPU batch, and
    64). Registry name `pollux`; `--pollux --policy pollux`."""

    Params = PolluxParams
    State = PolluxState
    needs = Needs(nodes=True, job_nodes=True)
    needs_batch_size = False

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.state = PolluxState()
        self._speedups: dict[str, tuple[tuple[object, ...], np.ndarray]] = {}
        """Each job's speedups (entry r - 1 for r GPUs, then its current layout's) and what they
        were computed from: a job's hints change at most once an epoch, so most rounds reuse
        them (a memo of a pure function, not state)."""

    def snapshot(self) -> PolluxState:
        return self.state

    def restore(self, state: PolluxState) -> None:
        self.state = state

    def gpu_range(self, app: Application, spec: JobSpec) -> tuple[int, int]:
        if app.name == "ncf":  # (the artifact's: one GPU)
            return 1, 1
        return 1, max(min(MAX_REPLICAS, app.max_batch_size // app.min_local_bsz), 1)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        return inp.now + inp.cluster.round_s if inp.jobs else None

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        params: PolluxParams = self.params
        nodes = [n for n in inp.cluster.nodes if n.up and n.num_gpus > 0]
        jobs = sorted(inp.jobs, key=lambda j: (j.attained_service, j.submit_time, j.seq))
        if not jobs or not nodes:
            self.state = PolluxState()
            return []
        total = sum(n.num_gpus for n in nodes)
        per_node = max(n.num_gpus for n in nodes)
        current = {j.job_id: self._layout(j, nodes) for j in jobs}
        values = [self._values(j, current[j.job_id], len(jobs), total, len(nodes), per_node)
                  for j in jobs]  # fmt: skip
        self._speedups = {j.job_id: self._speedups[j.job_id] for j in jobs
                          if j.job_id in self._speedups}  # fmt: skip
        costs = [v for v, _ in values]
        ids = [j.job_id for j in jobs]
        keeps = [keep for _, keep in values]
        for _ in range(LAYOUT_ROUNDS):
            counts = best_counts(costs, total)
            layouts = lay_out(ids, counts, keeps, current, nodes, per_node, params.max_nodes)
            got = [sum(layouts.get(k, {}).values()) for k in ids]
            short = [i for i, (c, g) in enumerate(zip(counts, got, strict=True)) if g < c]
            if not short:
                break
            for i in short:  # (no more than it got, laid out so: the others may use the rest)
                costs[i] = costs[i][: got[i] + 1]
        self.state = PolluxState(layouts=layouts)
        kept = [j.job_id for j in jobs if layouts.get(j.job_id) == current[j.job_id]]
        moved = [j.job_id for j in jobs if j.job_id in layouts and j.job_id not in kept]
        return [Allocation(k, sum(layouts[k].values()), layout=layouts[k]) for k in (*kept, *moved)]

    def _layout(self, job: JobView, nodes: Sequence[NodeStatus]) -> dict[str, int]:
        """Where the job runs now, GPUs per node (empty while it waits): as last laid out if
        that still holds, else its GPUs spread over its nodes."""
        if not job.running or not job.gpus:
            return {}
        known = self.state.layouts.get(job.job_id)
        if known and sum(known.values()) == job.gpus and set(known) == set(job.nodes):
            return known
        held = job.nodes or [nodes[0].node_id]
        share, extra = divmod(job.gpus, len(held))
        return {n: share + (i < extra) for i, n in enumerate(held) if share + (i < extra)}

    def _values(
        self, job: JobView, layout: Mapping[str, int], num_jobs: int, total: int,
        num_nodes: int, per_node: int,
    ) -> tuple[np.ndarray, bool]:  # fmt: skip
        """The job's term of the objective, 1 / (scaled speedup + 1e-3) ** -p, for each number
        of GPUs 0..its most (entry r); True when entry len(layout's GPUs) is for keeping it
        where it runs (no restart)."""
        params: PolluxParams = self.params
        app = self.apps[job.spec.job_type]
        hints = job.goodput
        most = min(max(2 * (hints.max_profiled_replicas if hints else 0), 1), job.spec.gpu_range[1])
        most = min(most, total)
        replicas = np.arange(1, most + 1)
        spans = np.minimum(-(-replicas // per_node), params.max_nodes)
        kept_gpus = sum(layout.values())
        fair_replicas = math.ceil(total / num_jobs)  # (a GPU per replica: 1 / total of the cluster)
        fair_nodes = math.ceil(num_nodes / total)
        if hints is None:
            speedups = replicas / fair_replicas
            kept_speedup = kept_gpus / fair_replicas
        else:
            asked = (len(layout) or 1, kept_gpus or 1)
            key = (hints, fair_nodes, fair_replicas, most, per_node, params.max_nodes, asked)
            known = self._speedups.get(job.job_id)
            if known is not None and known[0] == key:
                found = known[1]
            else:
                found = self._speedup(app, hints, fair_nodes, fair_replicas, spans, replicas, asked)
                self._speedups[job.job_id] = key, found
            speedups, kept_speedup = found[:-1], float(found[-1])
        scale = num_nodes / total  # a share of one node's worth of the cluster is 1
        age = job.now - job.submit_time
        restarts = max(job.record.attempt - 1, 0)
        factor = max(age - restarts * params.restart_delay_s, 0.0) / (age + params.restart_delay_s)
        scaled = np.concatenate(([0.0], speedups * scale * factor))
        keeps = 0 < kept_gpus <= most
        if keeps:
            scaled[kept_gpus] = kept_speedup * scale
        return power_terms(scaled, params.power), keeps

    @staticmethod
    def _speedup(
        app: Application, hints: GoodputHints, fair_nodes: int, fair_replicas: int,
        spans: np.ndarray, replicas: np.ndarray, asked: tuple[int, int],
    ) -> np.ndarray:  # fmt: skip
        """The speedups over a fair share of (spans[i], replicas[i]), then of `asked`."""
        fn = GoodputFunction(hints.perf, (hints.grad_sqr, hints.grad_var), app.init_batch_size)
        bounds = (app.min_local_bsz, app.max_local_bsz)
        speedup = SpeedupFunction(fn, app.max_batch_size, bounds, accumulation=True)
        speedup.base_goodput = fn.optimize(
            fair_nodes, fair_replicas, max_batch_size=app.max_batch_size,
            atomic_bsz_range=bounds, accumulation=True,
        )[0]  # fmt: skip
        found: np.ndarray = speedup(np.append(spans, asked[0]), np.append(replicas, asked[1]))
        return found


def power_terms(scaled: np.ndarray, power: float) -> np.ndarray:
    """Each scaled speedup's term of the power mean, as a cost: minimising their sum maximises
    the mean (p < 0: (s + 1e-3)^p; p = 0: -log; p > 0: -(s + 1e-3)^p)."""
    floored = scaled + SPEEDUP_FLOOR
    if power == 0:
        terms = -np.log(np.maximum(scaled, SPEEDUP_FLOOR))
    else:
        terms = floored**power if power < 0 else -(floored**power)
    return np.asarray(terms, dtype=float)


def best_counts(values: Sequence[np.ndarray], capacity: int) -> list[int]:
    """The GPUs for each job (entry r of its costs: r GPUs) that minimise the total cost with at
    most `capacity` GPUs in all: dynamic programming over the GPUs used, jobs in order (ties:
    fewer GPUs to the earlier jobs)."""
    inf = np.inf
    best = np.zeros(capacity + 1)  # least cost of the jobs so far with at most c GPUs
    choices: list[np.ndarray] = []
    used = np.arange(capacity + 1)
    for cost in values:
        options = min(len(cost), capacity + 1)
        # table[c, r]: best[c - r] + cost[r]
        before = used[:, None] - np.arange(options)[None, :]
        table = np.where(before >= 0, best[np.maximum(before, 0)] + cost[None, :options], inf)
        pick = np.argmin(table, axis=1)
        best = table[used, pick]
        choices.append(pick)
    counts: list[int] = []
    c = capacity
    for pick in reversed(choices):
        r = int(pick[c])
        counts.append(r)
        c -= r
    return counts[::-1]


def lay_out(
    job_ids: Sequence[str], counts: Sequence[int], keeps: Sequence[bool],
    current: Mapping[str, dict[str, int]], nodes: Sequence[NodeStatus], per_node: int,
    max_nodes: int,
) -> dict[str, dict[str, int]]:  # fmt: skip
    """GPUs per node for each job given its count: a job whose count is the GPUs it runs on
    stays where it is; the others, most GPUs first, take whole free nodes for each node's
    worth and the free node that fits the rest best, a node holding at most one job that
    spans nodes; a job that does not fit so spreads over the nodes with the most free GPUs,
    else gets as many as one node has free."""
    free = {n.node_id: n.num_gpus for n in nodes}
    spanned: set[str] = set()  # nodes holding a job that spans nodes
    layouts: dict[str, dict[str, int]] = {}
    moving: list[tuple[int, int, str]] = []
    for i, (job_id, count, keep) in enumerate(zip(job_ids, counts, keeps, strict=True)):
        held = current[job_id]
        if (
            keep
            and count == sum(held.values())
            and all(free.get(n, 0) >= k for n, k in held.items())
        ):
            for n, k in held.items():
                free[n] -= k
            if len(held) > 1:
                spanned.update(held)
            layouts[job_id] = dict(held)
        elif count > 0:
            moving.append((-count, i, job_id))
    order = {n.node_id: i for i, n in enumerate(nodes)}
    for negative, _, job_id in sorted(moving):
        layout = _fit(-negative, free, spanned, order, per_node, max_nodes)
        held = current[job_id]
        if layout and sum(layout.values()) == sum(held.values()) and layout != held:
            # Placement keeps a job whose GPU count is unchanged where it runs: so must we.
            still_free = all(free.get(n, 0) >= k for n, k in held.items())
            layout = dict(held) if still_free else _fewer(layout)
        if layout:
            for n, k in layout.items():
                free[n] -= k
            if len(layout) > 1:
                spanned.update(layout)
            layouts[job_id] = layout
    return layouts


def _fit(
    count: int, free: Mapping[str, int], spanned: set[str], order: Mapping[str, int],
    per_node: int, max_nodes: int,
) -> dict[str, int]:  # fmt: skip
    """Where `count` GPUs go (see `lay_out`); empty if nowhere."""
    if count <= per_node:
        fits = [n for n, k in free.items() if k >= count]
        if fits:
            node = min(fits, key=lambda n: (free[n] - count, order[n]))
            return {node: count}
    else:
        whole = [n for n, k in free.items() if k >= per_node and n not in spanned]
        wanted, rest = divmod(count, per_node)
        if len(whole) >= wanted and wanted + (rest > 0) <= max_nodes:
            layout = {n: per_node for n in whole[:wanted]}
            others = [n for n, k in free.items() if k >= rest and n not in spanned
                      and n not in layout]  # fmt: skip
            if not rest:
                return layout
            if others:
                layout[min(others, key=lambda n: (free[n] - rest, order[n]))] = rest
                return layout
    open_nodes = sorted(
        (n for n, k in free.items() if k > 0 and n not in spanned),
        key=lambda n: (-free[n], order[n]),
    )[:max_nodes]
    if sum(free[n] for n in open_nodes) >= count:
        spread: dict[str, int] = {}
        for n in open_nodes:
            spread[n] = min(free[n], count - sum(spread.values()))
            if sum(spread.values()) == count:
                return spread
    most = max(free.values(), default=0)
    if most <= 0:
        return {}
    node = min((n for n, k in free.items() if k == most), key=order.__getitem__)
    return {node: most}


def _fewer(layout: dict[str, int]) -> dict[str, int]:
    """`layout` less one GPU, from its last node with the fewest."""
    node = min(reversed(layout), key=layout.__getitem__)
    smaller = dict(layout)
    smaller[node] -= 1
    return {n: k for n, k in smaller.items() if k}

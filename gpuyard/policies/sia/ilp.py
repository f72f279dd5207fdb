"""Sia's program (SOSP '23, `sia-simulator/sia.py` of its artifact): a 0/1 multiple-choice
knapsack over configurations, on OR-Tools CP-SAT.

Configurations c = (GPU type, nodes, GPUs) come from `configurations`. Given the cost matrix
A[j, c] (a job's normalised goodput on c, docked for a restart, raised to the power p, rounded to
two decimals: `costs.costs`), the reference solves

    minimise   sum_jc A[j,c] x[j,c] + lambda_n (N - sum_jc x[j,c])      (p < 0; maximise if p > 0)
    subject to sum_c x[j,c] <= 1                   for every job j
               sum_jc gpus[c] x[j,c] <= capacity[t] for every GPU type t (c of type t)
               x[j, prev_j] = 1                    for a job still restoring its checkpoint
               x binary

with CBC through cvxpy (stopping at a relative gap of 1e-4). We solve the same program with
CP-SAT. Its objective needs integers: the coefficient of x[j,c] is (A[j,c] - lambda_n) x
10^decimals (negated when maximising), plus the constant lambda_n x N x 10^decimals, exact for the
reference's coefficients (A is rounded to two decimals and lambda_n = 1.1: both are multiples of
1/100), so the optimum is the reference's optimum, not an approximation of it.

Steps that keep the model small without changing its optimal value: held jobs are taken out
with their GPUs; a variable whose coefficient cannot improve on leaving the job out is dropped,
and so is a configuration that another of the same GPU type with no more GPUs and no worse
coefficient dominates; the LP relaxation (HiGHS) gives a bound, a starting solution and exact
reduced-cost fixing. If its rounded solution is already within the relative gap, CP-SAT is not
called.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from ortools.sat.python import cp_model
from scipy import optimize, sparse

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

MAX_JOB_GPUS = 64
"""The most GPUs one job gets (the artifact's configuration tables stop at 64)."""


@dataclass(frozen=True)
class Configurations:
    """Sia's configuration set, one entry per (GPU type, nodes, GPUs), types in cluster order."""

    types: tuple[str, ...]
    type_index: IntArray
    """For each configuration, its GPU type (an index into `types`)."""
    nodes: IntArray
    gpus: IntArray
    capacity: IntArray
    """GPUs of each type."""

    def __len__(self) -> int:
        return len(self.gpus)

    def index(self, gpu_type: str, gpus: int) -> int | None:
        """The configuration of `gpus` GPUs of `gpu_type`, if there is one."""
        if gpu_type not in self.types:
            return None
        t = self.types.index(gpu_type)
        found = np.flatnonzero((self.type_index == t) & (self.gpus == gpus))
        return int(found[0]) if found.size else None


def configurations(
    shape: Mapping[str, tuple[int, int]],
    max_gpus: int = MAX_JOB_GPUS,
    max_nodes: Mapping[str, int] | None = None,
) -> Configurations:
    """The configurations of a cluster of `shape` {GPU type: (nodes, GPUs per node)}: on one node,
    1, 2, 4, ... GPUs up to a whole node; then whole nodes, 2..n of them, up to `max_gpus`
    GPUs and `max_nodes` of the type (the artifact's CONFIGS_4GPU and CONFIGS_8GPU tables are
    this rule for 4 and 8 GPUs a node and 64 GPUs). The capacity is all the type's GPUs."""
    max_nodes = max_nodes or {}
    types, type_index, nodes, gpus, capacity = [], [], [], [], []
    for gpu_type, (num_nodes, per_node) in shape.items():
        if num_nodes <= 0 or per_node <= 0:
            continue
        types.append(gpu_type)
        capacity.append(num_nodes * per_node)
        ti = len(types) - 1
        k = 1
        while k < per_node and k <= max_gpus:
            type_index.append(ti)
            nodes.append(1)
            gpus.append(k)
            k *= 2
        for n in range(1, min(num_nodes, max_nodes.get(gpu_type, num_nodes)) + 1):
            if n * per_node > max_gpus:
                break
            type_index.append(ti)
            nodes.append(n)
            gpus.append(n * per_node)
    return Configurations(
        types=tuple(types),
        type_index=np.asarray(type_index, dtype=np.int64),
        nodes=np.asarray(nodes, dtype=np.int64),
        gpus=np.asarray(gpus, dtype=np.int64),
        capacity=np.asarray(capacity, dtype=np.int64),
    )


@dataclass(frozen=True)
class Solution:
    choice: IntArray
    """For each job, its configuration (-1: none)."""
    objective: float
    """The reference's objective at `choice`: sum of the chosen A + lambda_n x the jobs left out."""
    optimal: bool
    """Proved optimal within `relative_gap` (False: the best found within the time limit)."""
    bound: float | None = None
    """The best bound proved on the objective (the reference's units), if any."""


def objective(costs: FloatArray, choice: IntArray, lambda_n: float) -> float:
    """The reference's objective (`sia.py` `obj_expr`) at `choice`."""
    chosen = choice >= 0
    rows = np.flatnonzero(chosen)
    total = float(costs[rows, choice[rows]].sum()) if rows.size else 0.0
    return total + lambda_n * float(np.count_nonzero(~chosen))


def solve(
    costs: FloatArray,
    configs: Configurations,
    lambda_n: float,
    *,
    maximise: bool = False,
    forced: Mapping[int, int] | None = None,
    hint: Sequence[int] | None = None,
    decimals: int = 2,
    time_limit_s: float = 10.0,
    deterministic_limit: float = 0.5,
    workers: int = 1,
    seed: int = 0,
    relative_gap: float = 1e-4,
    fix_by_lp: bool = True,
    log: bool = False,
) -> Solution:
    """The choice of configurations that optimises Sia's program for the cost matrix `costs`
    (jobs x configurations), `forced` {job: configuration} held where they are, `hint` a
    starting choice (e.g. the last round's).

    Deterministic with one worker: a fixed seed and a limit in CP-SAT's deterministic time
    units, so the answer does not depend on the machine's speed; the wall-clock `time_limit_s`
    is only a safety net for a very slow machine. More workers (CP-SAT's parallel portfolio)
    may answer differently from run to run when a limit stops them."""
    num_jobs, num_configs = costs.shape
    if num_configs != len(configs):
        raise ValueError(f"costs has {num_configs} columns for {len(configs)} configurations")
    if forced:
        held = _with_held(
            costs, configs, lambda_n, dict(forced), maximise=maximise, hint=hint,
            decimals=decimals, time_limit_s=time_limit_s, deterministic_limit=deterministic_limit,
            workers=workers, seed=seed, relative_gap=relative_gap, fix_by_lp=fix_by_lp,
        )  # fmt: skip
        if held is not None:
            return held
    scale = 10**decimals
    sign = -1.0 if maximise else 1.0
    # Per-variable coefficient relative to leaving the job out, as integers (see module doc).
    weights = np.rint(sign * (costs - lambda_n) * scale).astype(np.int64)
    useful = weights < 0
    useful &= _undominated(weights, configs)
    choice = np.full(num_jobs, -1, dtype=np.int64)
    rows, cols = np.nonzero(useful)
    if rows.size == 0:
        value = objective(costs, choice, lambda_n)
        return Solution(choice, value, True, value)
    must = np.zeros(num_jobs, dtype=bool)
    offset = round(sign * lambda_n * scale) * num_jobs
    bound: float | None = None
    incumbent: IntArray | None = None
    fixed = _fix_by_reduced_costs(weights, rows, cols, configs, num_jobs) if fix_by_lp else None
    if fixed is not None:
        rows, cols, must, start, lp_value = fixed
        bound = (lp_value + offset) / scale
        chosen = start >= 0
        found = float(weights[np.flatnonzero(chosen), start[chosen]].sum())
        if found - lp_value <= relative_gap * abs(found + offset):
            # The LP's rounding is within the gap the reference's solver stops at.
            return Solution(start, objective(costs, start, lambda_n), True, sign * bound)
        hint = start.tolist()
        incumbent = start

    model = cp_model.CpModel()
    x = [model.new_bool_var("") for _ in range(rows.size)]
    # Variables are grouped by job (np.nonzero is row-major): one at-most-one per job.
    starts = np.searchsorted(rows, np.arange(num_jobs + 1))
    for j in range(num_jobs):
        lo, hi = int(starts[j]), int(starts[j + 1])
        if must[j] and hi > lo:
            model.add_exactly_one(x[lo:hi])
        elif hi - lo > 1:
            model.add_at_most_one(x[lo:hi])
    gpus = configs.gpus[cols]
    types = configs.type_index[cols]
    for t, cap in enumerate(configs.capacity):
        of_type = np.flatnonzero(types == t)
        if of_type.size and int(gpus[of_type].sum()) > cap:
            model.add(
                cp_model.LinearExpr.weighted_sum([x[i] for i in of_type], gpus[of_type].tolist())
                <= int(cap)
            )
    w = weights[rows, cols]
    # The constant lambda_n x N makes CP-SAT's relative gap the reference's (CBC's gap is on the
    # whole objective).
    model.minimize(cp_model.LinearExpr.weighted_sum(x, w.tolist()) + offset)
    if hint is not None:
        hinted = {(j, int(c)) for j, c in enumerate(hint) if c >= 0}
        for i, (j, c) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
            model.add_hint(x[i], (j, c) in hinted)

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.max_deterministic_time = deterministic_limit
    solver.parameters.relative_gap_limit = relative_gap
    solver.parameters.log_search_progress = log
    status = solver.solve(model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = np.fromiter((solver.boolean_value(v) for v in x), dtype=bool, count=len(x))
        choice[rows[values]] = cols[values]
    if incumbent is not None and (
        status not in (cp_model.OPTIMAL, cp_model.FEASIBLE)
        or _value(weights, incumbent) < _value(weights, choice)
    ):
        # Stopped before it got back to the LP's rounding (it does not always start from it).
        choice = incumbent
    proved = solver.best_objective_bound / scale if status != cp_model.UNKNOWN else -np.inf
    best = max(proved, bound if bound is not None else -np.inf)
    return Solution(
        choice,
        objective(costs, choice, lambda_n),
        status == cp_model.OPTIMAL,
        sign * best if np.isfinite(best) else None,
    )


def _value(weights: IntArray, choice: IntArray) -> int:
    chosen = np.flatnonzero(choice >= 0)
    return int(weights[chosen, choice[chosen]].sum())


def _with_held(
    costs: FloatArray,
    configs: Configurations,
    lambda_n: float,
    forced: dict[int, int],
    *,
    hint: Sequence[int] | None,
    **options: Any,
) -> Solution | None:
    """`solve` with the `forced` jobs held on their configurations: their GPUs are taken out
    of the capacity and the others decided alone (the same optimum as constraining them to 1).
    None if the held jobs no longer fit (GPUs lost): then none is held."""
    used = np.bincount(
        configs.type_index[list(forced.values())],
        weights=configs.gpus[list(forced.values())],
        minlength=len(configs.types),
    ).astype(np.int64)
    left = configs.capacity - used
    if (left < 0).any():
        return None
    others = np.asarray([j for j in range(costs.shape[0]) if j not in forced], dtype=np.int64)
    rest = replace(configs, capacity=left)
    sub_hint = None if hint is None else [hint[j] for j in others]
    sub = solve(costs[others], rest, lambda_n, hint=sub_hint, **options)
    choice = np.full(costs.shape[0], -1, dtype=np.int64)
    choice[others] = sub.choice
    for j, c in forced.items():
        choice[j] = c
    held_cost = float(sum(costs[j, c] for j, c in forced.items()))
    bound = None if sub.bound is None else sub.bound + held_cost
    return Solution(choice, objective(costs, choice, lambda_n), sub.optimal, bound)


def _fix_by_reduced_costs(
    weights: IntArray, rows: IntArray, cols: IntArray, configs: Configurations, num_jobs: int
) -> tuple[IntArray, IntArray, npt.NDArray[np.bool_], IntArray, float] | None:
    """Shrink the program by reduced-cost fixing on its LP relaxation (HiGHS, interior point
    with crossover): with y the LP's duals and z its optimum, any integer x costs at least
    z + rc.x, so a variable (or a job's slack: no GPUs) whose reduced cost exceeds
    (incumbent - z) is 0 in every optimum. Exact: it only narrows the search.

    Returns the variables left, the jobs that must get a configuration, the incumbent (the
    LP's integral part, the rest fitted greedily into the GPUs left) and z; None if the LP
    failed."""
    n = rows.size
    w = weights[rows, cols].astype(np.float64)
    gpus = configs.gpus[cols]
    types = configs.type_index[cols]
    num_types = len(configs.types)
    # rows 0..num_jobs-1: at most one configuration a job; then one capacity row a type
    a = sparse.csr_matrix(
        (
            np.concatenate([np.ones(n), gpus.astype(np.float64)]),
            (
                np.concatenate([rows, num_jobs + types]),
                np.concatenate([np.arange(n), np.arange(n)]),
            ),
        ),
        shape=(num_jobs + num_types, n),
    )
    b = np.concatenate([np.ones(num_jobs), configs.capacity.astype(np.float64)])
    lp = optimize.linprog(w, A_ub=a, b_ub=b, bounds=(0, None), method="highs-ipm")
    if lp.status != 0:
        return None
    start = np.full(num_jobs, -1, dtype=np.int64)
    integral = lp.x > 1 - 1e-6
    start[rows[integral]] = cols[integral]
    left = configs.capacity - np.bincount(
        types[integral], weights=gpus[integral], minlength=num_types
    ).astype(np.int64)
    # Jobs the LP split between configurations: their best configuration that still fits.
    for j in np.unique(rows[(lp.x > 1e-6) & ~integral]):
        if start[j] >= 0:
            continue
        mine = np.flatnonzero(rows == j)
        fits = mine[gpus[mine] <= left[types[mine]]]
        if fits.size:
            i = fits[np.argmin(w[fits])]
            start[j] = cols[i]
            left[types[i]] -= gpus[i]
    start = _fill(start, weights, rows, cols, configs, left)
    chosen = start >= 0
    incumbent = float(weights[np.flatnonzero(chosen), start[chosen]].sum())
    duals = np.asarray(lp.ineqlin.marginals)  # <= 0 for the <= rows of a minimisation
    reduced = w - a.T @ duals
    gap = incumbent - float(lp.fun) + 1e-6 * max(1.0, abs(incumbent))
    keep = (reduced <= gap) | (cols == start[rows])
    must = np.zeros(num_jobs, dtype=bool)
    must[rows] = -duals[rows] > gap
    return rows[keep], cols[keep], must, start, float(lp.fun)


def _fill(
    start: IntArray, weights: IntArray, rows: IntArray, cols: IntArray,
    configs: Configurations, left: IntArray, max_moves: int = 10_000,
) -> IntArray:  # fmt: skip
    """`start` improved by moving one job at a time to the configuration that lowers the
    objective most within the GPUs left (the LP's rounding leaves some idle)."""
    choice = start.copy()
    left = left.copy()
    w = weights[rows, cols]
    gpus = configs.gpus[cols]
    types = configs.type_index[cols]
    for _ in range(max_moves):
        current = choice[rows]
        held = current >= 0
        now_w = np.where(held, weights[rows, np.maximum(current, 0)], 0)
        now_gpus = np.where(held, configs.gpus[np.maximum(current, 0)], 0)
        now_type = np.where(held, configs.type_index[np.maximum(current, 0)], -1)
        # GPUs the move needs from its type: the new configuration's, less what the job
        # frees there.
        needed = gpus - np.where(now_type == types, now_gpus, 0)
        gain = now_w - w
        ok = (gain > 0) & (needed <= left[types])
        if not ok.any():
            break
        i = int(np.flatnonzero(ok)[np.argmax(gain[ok])])
        j = int(rows[i])
        if choice[j] >= 0:
            left[configs.type_index[choice[j]]] += configs.gpus[choice[j]]
        choice[j] = cols[i]
        left[types[i]] -= gpus[i]
    return choice


def _undominated(weights: IntArray, configs: Configurations) -> npt.NDArray[np.bool_]:
    """True where no configuration of the same type with fewer GPUs has a coefficient as good
    (configurations of a type are listed by increasing GPUs)."""
    keep = np.ones(weights.shape, dtype=bool)
    for t in range(len(configs.types)):
        cols = np.flatnonzero(configs.type_index == t)
        cols = cols[np.argsort(configs.gpus[cols], kind="stable")]
        block = weights[:, cols]
        # best coefficient among strictly smaller configurations of this type
        before = np.minimum.accumulate(block, axis=1)
        before = np.concatenate(
            [np.full((weights.shape[0], 1), np.iinfo(np.int64).max), before[:, :-1]], axis=1
        )
        keep[:, cols] = block < before
    return keep

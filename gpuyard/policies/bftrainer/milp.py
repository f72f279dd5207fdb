"""BFTrainer's re-allocation, as arrays: the MILP, the equal-share heuristic, and the node map.

Every decision starts from the current map: the idle nodes each job holds (after the nodes taken
back at this event are gone) and the free idle nodes. BFTrainer's MILP (Liu et al., "BFTrainer:
Low-Cost Training of Neural Networks on Unfillable Supercomputer Nodes", eq. 1-9) chooses binary
x[j, n] (job j runs on node n) with

- each node to at most one job; each job 0 or Jmin..Jmax nodes;
- no migration: a job only grows (keeps all its nodes and adds free ones) or only shrinks (keeps a
  subset of its nodes);
- throughput P_j(N_j), piecewise linear in the node count N_j between its scalability points;
- rescale cost in lost samples: Tcup x (its current rate) if it grows, Tcdw x (current rate) if it
  shrinks (current rate: 0 below Jmin);
- objective: maximise Tfwd x sum_j P_j(N_j) - sum_j cost_j.

Idle nodes are interchangeable, and with no migration the node-level model only decides *how many*
nodes each job gets: a growing job keeps its nodes and takes free ones, a shrinking one drops some
of its own, and counts N_j fit together exactly when sum_j N_j <= (idle nodes) (what the shrinking
jobs drop and the free nodes cover what the growing ones take). So the MILP is solved over counts,
and `node_map` turns the counts back into x[j, n] without a migration. Over counts, each job picks
one of its feasible sizes k in {0} + [Jmin, min(Jmax, idle nodes)] (binary y[j, k], one per job),
whose value Tfwd x P_j(k) - cost_j(k) is known in advance: the throughput is exact at every
integer count (the SOS2 interpolation of the reference gives the same values) and any throughput
model works, piecewise linear or not. The model has sum_j (sizes of j) binaries and J + 1 rows,
whatever the number of nodes, which is why a 4,734-node replay solves in milliseconds per event.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gpuyard.policies.toolkit.lp import Solver


@dataclass(frozen=True)
class Problem:
    """One re-allocation: the jobs' bounds, current sizes, throughputs and rescale costs.

    `rates[j][k]` is job j's throughput on k nodes for k = 0..len-1 (at least up to
    min(Jmax, nodes)); `current[j]` the idle nodes it holds now (after the nodes taken back).
    """

    nodes: int
    """Idle nodes in all: those the jobs hold plus the free ones."""
    jmin: np.ndarray
    jmax: np.ndarray
    current: np.ndarray
    rates: Sequence[np.ndarray]
    up_s: np.ndarray
    """Tcup: seconds of the current throughput a job loses when it grows."""
    down_s: np.ndarray
    """Tcdw: seconds of the current throughput a job loses when it shrinks."""
    max_step: int | None = None
    """At most this many nodes more or fewer per job (None: any; see `reference_step`)."""
    done: np.ndarray | None = None
    """Steps each job has trained: among jobs the MILP cannot tell apart, those that trained
    least get at least as many nodes (None: queue order)."""

    @property
    def jobs(self) -> int:
        return len(self.jmin)

    def rate(self, j: int, count: int) -> float:
        """Job j's throughput on `count` nodes: 0 outside [Jmin, Jmax] (it cannot run)."""
        if count < self.jmin[j] or count > self.jmax[j] or count <= 0:
            return 0.0
        return float(self.rates[j][count])

    def alike_pairs(self) -> list[tuple[int, int]]:
        """(a, b): a gets at least as many nodes as b (`alike_chains`, link by link)."""
        return [(g[i], g[i + 1]) for g in self.alike_chains() for i in range(len(g) - 1)]

    def alike_chains(self) -> list[list[int]]:
        """Jobs alike in every figure the MILP sees, each group in the order of the nodes they
        get (most first): those that trained least first (later arrivals first on ties). The
        objective is indifferent between them, and this is the least-attained-service choice."""
        groups: dict[tuple[object, ...], list[int]] = {}
        for j in range(self.jobs):
            key = (
                float(self.jmin[j]), float(self.jmax[j]), int(self.current[j]),
                float(self.up_s[j]), float(self.down_s[j]),
                np.asarray(self.rates[j], dtype=np.float64).tobytes(),
            )  # fmt: skip
            groups.setdefault(key, []).append(j)
        done = self.done if self.done is not None else np.zeros(self.jobs)
        return [sorted(g, key=lambda j: (float(done[j]), -j)) for g in groups.values()]

    def key(self) -> bytes:
        """Everything the MILP's answer depends on, as bytes (equal keys, equal answers)."""
        parts = [
            np.array([self.nodes, -1 if self.max_step is None else self.max_step]),
            self.jmin, self.jmax, self.current, self.up_s, self.down_s,
            np.array(self.alike_pairs(), dtype=np.int64),
            *(np.asarray(r, dtype=np.float64) for r in self.rates),
        ]  # fmt: skip
        return b"|".join(np.ascontiguousarray(p, dtype=np.float64).tobytes() for p in parts)

    def current_rates(self) -> np.ndarray:
        return np.array([self.rate(j, int(c)) for j, c in enumerate(self.current)])

    def sizes(self, j: int) -> np.ndarray:
        """The node counts job j may get: 0, or Jmin..min(Jmax, nodes) (within `max_step` of its
        current size)."""
        high = int(min(self.jmax[j], self.nodes))
        low = int(max(self.jmin[j], 1))
        sizes = np.concatenate([[0], np.arange(low, high + 1)]).astype(np.int64)
        if self.max_step is not None:
            sizes = sizes[np.abs(sizes - int(self.current[j])) <= self.max_step]
        return sizes

    def rescale_cost(self, counts: np.ndarray) -> np.ndarray:
        """Samples each job loses going from `current` to `counts`."""
        counts = np.asarray(counts)
        rate = self.current_rates()
        grow = counts > self.current
        shrink = counts < self.current
        return np.where(grow, self.up_s * rate, 0.0) + np.where(shrink, self.down_s * rate, 0.0)


@dataclass(frozen=True)
class Outcome:
    counts: np.ndarray
    """Nodes per job, in the problem's job order."""
    solved: bool
    """False when the solver found nothing in time: `counts` is the current allocation."""
    seconds: float
    """Building and solving the model."""


def keep_current(problem: Problem) -> np.ndarray:
    """The allocation as it is, jobs that fell below Jmin stopped (they cannot run)."""
    current = problem.current.astype(np.int64)
    return np.where(current >= problem.jmin, np.minimum(current, problem.jmax), 0)


def runs(problem: Problem, j: int) -> list[tuple[int, int]]:
    """Job j's sizes as runs (first, last): 0 alone, its current size alone, and the rest of
    Jmin..min(Jmax, nodes) cut wherever the throughput's slope changes (at the scalability points
    of a piecewise-linear curve; at every count for a curved one). Within a run the throughput is
    linear and the rescale cost constant, so a run is one binary and one integer offset."""
    current = int(problem.current[j])
    sizes = problem.sizes(j)
    out = [(0, 0)] if sizes.size and sizes[0] == 0 else []
    sizes = sizes[sizes > 0]
    if not sizes.size:
        return out
    rates = np.asarray(problem.rates[j], dtype=np.float64)[sizes]
    slope = np.diff(rates)
    bends = ~np.isclose(slope[1:], slope[:-1], rtol=1e-12, atol=1e-9)  # at sizes[1:-1]
    first = 0
    for i in range(1, len(sizes)):
        k = int(sizes[i])
        if k == current or k - 1 == current or (i < len(sizes) - 1 and bends[i - 1]):
            out.append((int(sizes[first]), int(sizes[i - 1])))
            first = i
    out.append((int(sizes[first]), int(sizes[-1])))
    return out


def reference_step(nodes: int) -> int:
    """How far the reference's MILP lets a job grow or shrink at one event: its no-migration
    constraints use bigM = idle nodes + 1 on both sides of `new - old = +-(nodes changed)`, so a
    change of d nodes needs 2 d <= bigM (see docs/fidelity.md)."""
    return (nodes + 1) // 2


def solve_milp(
    problem: Problem, *, tfwd: float, time_limit_s: float, solver: Solver = "scip",
    table_cells: int = 0,
) -> Outcome:  # fmt: skip
    """BFTrainer's MILP over node counts (module docstring); the current allocation when the
    solver returns no solution within `time_limit_s`. A solution found by the time limit but
    not proven optimal is used (the reference throws it away and keeps the old map).

    `table_cells`: find the optimum by dynamic programming (`best_counts`) instead of the solver
    when its table has at most this many cells (0: always the solver)."""
    jobs = problem.jobs
    if jobs == 0:
        return Outcome(np.zeros(0, dtype=np.int64), True, 0.0)
    started = time.perf_counter()
    choices = _choices(problem, tfwd)
    alone = _each_alone(problem, choices)
    if alone is None and table_cells > 0:
        alone = _best_counts(problem, choices, table_cells)
    if alone is not None:
        return Outcome(alone, True, time.perf_counter() - started)
    # (imported here: OR-Tools takes a quarter of a second to import, and the table, above,
    # answers most problems)
    from gpuyard.policies.toolkit.lp import LinearProgram, SolveError

    cuts = [runs(problem, j) for j in range(jobs)]
    owner = np.concatenate([np.full(len(c), j) for j, c in enumerate(cuts)])
    lo = np.array([a for c in cuts for a, _ in c], dtype=np.float64)
    hi = np.array([b for c in cuts for _, b in c], dtype=np.float64)
    at_lo = np.array([problem.rate(j, int(a)) for j, c in enumerate(cuts) for a, _ in c])
    at_hi = np.array([problem.rate(j, int(b)) for j, c in enumerate(cuts) for _, b in c])
    slope = np.where(hi > lo, (at_hi - at_lo) / np.maximum(hi - lo, 1.0), 0.0)
    current = problem.current[owner]
    rate_now = problem.current_rates()[owner]
    cost = np.where(lo > current, problem.up_s[owner] * rate_now, 0.0) + np.where(
        hi < current, problem.down_s[owner] * rate_now, 0.0
    )
    m = len(lo)
    lp = LinearProgram()
    z = lp.add_variables(m, lb=0.0, ub=1.0, integer=True)  # job's size is in this run
    t = lp.add_variables(m, lb=0.0, ub=hi - lo, integer=True)  # this far into it
    lp.add_constraints(owner, z, 1.0, lb=1.0, ub=1.0, num_rows=jobs)  # one run per job
    rows = np.arange(m)
    lp.add_constraints(  # t = 0 unless the run is chosen
        np.concatenate([rows, rows]), np.concatenate([t, z]),
        np.concatenate([np.ones(m), lo - hi]), ub=0.0, num_rows=m,
    )  # fmt: skip
    size_cols = np.concatenate([z, t])
    size_coefs = np.concatenate([lo, np.ones(m)])
    lp.add_constraints(np.zeros(2 * m), size_cols, size_coefs, ub=float(problem.nodes))
    # Jobs alike in every figure are interchangeable: order their sizes (`alike_pairs`), or the
    # solver spends its time proving that permutations of one allocation are no better.
    pairs = problem.alike_pairs()
    if pairs:
        sign = np.concatenate([np.ones(m), np.ones(m)])
        rows_, cols_, coefs_ = [], [], []
        for r, (a, b) in enumerate(pairs):
            for job, s in ((a, 1.0), (b, -1.0)):
                mine = np.concatenate([owner == job, owner == job])
                rows_.append(np.full(int(mine.sum()), r))
                cols_.append(size_cols[mine])
                coefs_.append(s * size_coefs[mine] * sign[mine])
        lp.add_constraints(
            np.concatenate(rows_),
            np.concatenate(cols_),
            np.concatenate(coefs_),
            lb=0.0,
            num_rows=len(pairs),
        )
    lp.set_objective(size_cols, np.concatenate([tfwd * at_lo - cost, tfwd * slope]), maximize=True)
    try:
        solution = lp.solve(solver, time_limit=time_limit_s)
    except SolveError:
        return Outcome(keep_current(problem), False, 0.0)
    chosen = solution[z] > 0.5
    size = lo + np.round(solution[t])
    counts = np.zeros(jobs, dtype=np.int64)
    np.add.at(counts, owner[chosen], size[chosen].astype(np.int64))
    return Outcome(counts, True, solution.export_seconds + solution.solve_seconds)


Choices = list[tuple[np.ndarray, np.ndarray]] | None
"""Per job, the sizes it may take and the objective's term at each (None: a job has none)."""


def _choices(problem: Problem, tfwd: float) -> Choices:
    """Each job's sizes and, at each, Tfwd x throughput less the rescale cost of getting there."""
    rate_now = problem.current_rates()
    out = []
    for j in range(problem.jobs):
        sizes = problem.sizes(j)
        if not sizes.size:
            return None
        rates = np.asarray(problem.rates[j], dtype=np.float64)[sizes]
        rates[sizes == 0] = 0.0
        current = problem.current[j]
        cost = np.where(sizes > current, problem.up_s[j] * rate_now[j], 0.0) + np.where(
            sizes < current, problem.down_s[j] * rate_now[j], 0.0
        )
        out.append((sizes, tfwd * rates - cost))
    return out


def _each_alone(problem: Problem, choices: Choices) -> np.ndarray | None:
    """The optimum when the node constraint cannot bind: every job's best size on its own (the
    fewest nodes among equally good ones), if those fit together; else None. The objective is a
    sum over jobs, so this is the MILP's answer without a search (often so on the whole 4,734-node
    log, when idle nodes outnumber what ten jobs of at most 64 nodes can take)."""
    if choices is None:
        return None
    best = np.array([sizes[int(np.argmax(values))] for sizes, values in choices], dtype=np.int64)
    return best if best.sum() <= problem.nodes else None


def best_counts(problem: Problem, tfwd: float, max_cells: int) -> np.ndarray | None:
    """The MILP's optimum by dynamic programming, or None when its table would have more than
    `max_cells` cells (or no allocation is feasible: the solver then says why).

    Over counts the MILP is a multiple-choice knapsack: each job takes one of its sizes, whose
    value is known (`_choices`), and the sizes fit in the idle nodes. best[c], the best total of
    the jobs so far on c nodes, grows one job at a time: a table of (sizes of the job) x (nodes
    + 1) cells per job, where nodes need not exceed what the jobs can take together. Exact, with
    ties to fewer nodes (the smaller size for each job, the smallest total), like `_each_alone`;
    alike jobs then get their sizes in `alike_chains` order (they are interchangeable). A few
    milliseconds where the solver's fixed cost alone is several."""
    return _best_counts(problem, _choices(problem, tfwd), max_cells)


def _best_counts(problem: Problem, choices: Choices, max_cells: int) -> np.ndarray | None:
    if choices is None:
        return None
    top = int(min(problem.nodes, sum(int(sizes[-1]) for sizes, _ in choices)))
    if sum(len(sizes) for sizes, _ in choices) * (top + 1) > max_cells:
        return None
    nodes = np.arange(top + 1)
    best = np.full(top + 1, -np.inf)
    best[0] = 0.0
    picks = []
    for sizes, values in choices:
        fits = sizes <= top
        mine = sizes[fits]
        if not mine.size:
            return None
        before = nodes[None, :] - mine[:, None]  # nodes used by the jobs before this one
        total = np.where(before >= 0, best[np.maximum(before, 0)] + values[fits][:, None], -np.inf)
        pick = np.argmax(total, axis=0)  # (the first of equals: the smaller size)
        best = total[pick, nodes]
        picks.append(mine[pick])
    used = int(np.argmax(best))
    if not np.isfinite(best[used]):
        return None
    counts = np.zeros(problem.jobs, dtype=np.int64)
    for j in range(problem.jobs - 1, -1, -1):
        counts[j] = picks[j][used]
        used -= int(counts[j])
    for chain in problem.alike_chains():
        counts[chain] = np.sort(counts[chain])[::-1]
    return counts


def equal_share(problem: Problem) -> np.ndarray:
    """The reference's heuristic (`re_allocate_ndf`): every job gets an equal share of the idle
    nodes, clipped to its Jmax (0 if the share is below its Jmin); what is left goes to the jobs
    in queue order, each up to its Jmax.

    The reference gives a job its share only when the share *exceeds* Jmin (`min(1, max(q - Jmin,
    0))`), so a job whose Jmin equals the share gets nothing; here a share of at least Jmin counts.
    """
    jobs = problem.jobs
    if jobs == 0:
        return np.zeros(0, dtype=np.int64)
    share = problem.nodes // jobs
    counts = np.where(share >= problem.jmin, np.minimum(share, problem.jmax), 0).astype(np.int64)
    left = problem.nodes - int(counts.sum())
    for j in range(jobs):
        if left <= 0:
            break
        extra = int(min(problem.jmax[j] - counts[j], left))
        if extra <= 0 or counts[j] + extra < problem.jmin[j]:
            continue
        counts[j] += extra
        left -= extra
    return counts


def node_map(
    current: Sequence[Sequence[str]], counts: Sequence[int] | np.ndarray, free: Sequence[str]
) -> list[list[str]]:
    """The nodes of each job for the new `counts`, without migration: a job that shrinks keeps the
    first of its nodes, one that grows keeps all of them and takes free nodes (the nodes no job
    holds any more, in the order of `free` then of the nodes released), jobs in order.

    Raises ValueError if the counts do not fit (sum above the idle nodes)."""
    kept = [list(nodes[: int(n)]) for nodes, n in zip(current, counts, strict=True)]
    released = [node for nodes, n in zip(current, counts, strict=True) for node in nodes[int(n) :]]
    pool = [*free, *released]
    need = sum(max(int(n) - len(nodes), 0) for nodes, n in zip(current, counts, strict=True))
    if need > len(pool):
        raise ValueError(f"{need} more nodes wanted, {len(pool)} free")
    taken = 0
    for nodes, n in zip(kept, counts, strict=True):
        more = int(n) - len(nodes)
        if more > 0:
            nodes.extend(pool[taken : taken + more])
            taken += more
    return kept

"""The allocations Gavel's solver returns where many are optimal.

Gavel's programs go through cvxpy to ECOS, an interior-point solver. Where the optimum is not
unique, which allocation comes back is wherever ECOS's path stops, and that decides how much of
each type every job gets, and the simulated JCTs with it: `min_total_duration` asks for *any* X
that lets every job finish within a bound (`Maximize(1)`), where a simplex corner or another
central point moved the mean JCT by 9 to 19% on Gavel's traces; `max_min_fairness` has a whole
face of optimal X, where another central point moved it by 3.6%.

This module reproduces ECOS 2.0's method for a linear cone (Domahidi, Chu and Boyd, ECC 2013;
embotech/ecos `ecos.c`, `equil.c`, `cone.c`, `kkt.c`): three passes of Ruiz equilibration, its
starting point (the least-squares x and the slack brought into the cone), its homogeneous
self-dual embedding and Mehrotra predictor-corrector steps, its step rules and stopping tests,
its best-iterate fallback ("close to optimal"), on the rows cvxpy writes for these programs
(for a max-min objective, an epigraph variable after X). ECOS factors its regularised KKT system
(sparse LDL) and refines the solutions; here the same regularised system is solved through its
normal equations with the structure of Gavel's constraints (each job's k variables are coupled
only by its own rows and by k capacity rows across jobs: k x k blocks per job, a Woodbury
correction for the capacity rows, a Schur complement for the epigraph variable), O(n k^3) per
solve in numpy, and refined as ECOS refines. On Gavel's traces the X agree with ECOS's to 1e-9
and the simulated results to the second.

Finish-time fairness has 1/r terms, which cvxpy writes as second-order cones of three entries;
for those the method is ECOS's for symmetric cones: Nesterov-Todd scaling, conic products and
divisions, the cones' line search and `bring2cone`, and its KKT system lifted as ECOS lifts
it (two more rows a cone, `_ConeBlock`), with the epigraph variable, each job's X and u, and the
capacity rows solved by blocks (`_JobBlocks`).
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from threadpoolctl import ThreadpoolController

GAMMA = 0.99  # final step scaling (and the slack's initial margin)
STEP_MIN, STEP_MAX = 1e-6, 0.999
SIGMA_MIN, SIGMA_MAX = 1e-4, 1.0
TOLERANCE = 1e-8  # ECOS's feasibility, absolute and relative gap tolerances
EQUILIBRATION_PASSES = 3
TINY = 1e-13
MAX_ITERATIONS = 100
REGULARIZATION = 7e-8  # ECOS's static regularisation of its linear systems
REFINEMENTS = 9  # and its iterative refinement of their solutions
DENSE_UP_TO = 1000  # variables up to which a max-min normal matrix is formed and solved whole
SOC_SIZE = 3  # the second-order cones cvxpy writes for 1/r (r u >= 1): (r + u, r - u, 2)
STALL = 10  # iterations without a better iterate after which we take the best (see `_solve`)

Solver = Callable[[np.ndarray], np.ndarray]
"""x for b, of a linear system (a normal matrix's, factored)."""


def _inverse(a: np.ndarray) -> np.ndarray:
    """The inverse of each matrix of `a` (..., m, m), by Gauss-Jordan elimination with partial
    pivoting in numpy's own arithmetic: LAPACK's through OpenBLAS rounds differently with the
    kernel OpenBLAS picks for the processor, and near an optimum that moves the point on a face
    of optima, and the runs' results with it, from one machine to the next. In place: the inverse's
    column of each step's pivot row takes the slot of the column that step eliminates (m x m
    work a step, not the m x 2m of [A | I], to the same bits)."""
    if a.ndim == 2:
        return _inverse_one(a)
    m = a.shape[-1]
    work = a.reshape(-1, m, m).astype(np.float64, copy=True)
    batch = np.arange(work.shape[0])
    origin = np.broadcast_to(np.arange(m), work.shape[:2]).copy()  # each row's index in `a`
    outer = np.empty_like(work)
    for col in range(m):
        pivot = col + np.abs(work[:, col:, col]).argmax(axis=1)
        row, row_origin = work[batch, pivot], origin[batch, pivot]
        work[batch, pivot], origin[batch, pivot] = work[:, col], origin[:, col]
        pivot_value = row[:, col : col + 1].copy()
        row /= pivot_value
        row[:, col] = 1.0 / pivot_value[:, 0]
        factors = work[:, :, col].copy()
        factors[:, col] = 0.0
        work[:, :, col] = 0.0
        work[:, col], origin[:, col] = row, row_origin
        np.multiply(factors[:, :, None], row[:, None, :], out=outer)
        work -= outer
    inverse = np.empty_like(work)
    inverse[batch[:, None], :, origin] = work.transpose(0, 2, 1)
    return inverse.reshape(a.shape)


def _inverse_one(a: np.ndarray) -> np.ndarray:
    """`_inverse` of one matrix, its rows swapped in place (3x faster than a batch of one at the
    dense normal matrices' ~100 rows)."""
    m = a.shape[0]
    work = a.astype(np.float64, copy=True)
    origin = np.arange(m)
    outer = np.empty_like(work)
    for col in range(m):
        pivot = col + int(np.abs(work[col:, col]).argmax())
        if pivot != col:
            work[[col, pivot]] = work[[pivot, col]]
            origin[[col, pivot]] = origin[[pivot, col]]
        row = work[col]
        pivot_value = row[col]
        factors = work[:, col].copy()
        factors[col] = 0.0
        inverse_pivot = 1.0 / pivot_value
        row /= pivot_value
        work[:, col] = 0.0
        work[col, col] = inverse_pivot
        np.multiply(factors[:, None], row[None, :], out=outer)
        work -= outer
    inverse = np.empty_like(work)
    inverse[:, origin] = work
    return inverse


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """a'b in numpy's own (pairwise) summation: BLAS's dot rounds differently per kernel."""
    return float((a * b).sum())


def _norm(a: np.ndarray) -> float:
    return math.sqrt(_dot(a, a))


REMEMBERED = 128  # answers each program keeps (`_remembered`)


class NoPoint(RuntimeError):
    """The method stopped without a point (its safeguards, or the iteration limit)."""


def _remembered(program: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """`program` (a pure function of its arguments: the same arrays give the same point, bit for
    bit) answering again from its last `REMEMBERED` answers. Gavel's rounds ask again with the
    very same inputs: the agnostic policies' depend only on which scale factors and weights are
    active (on its single-GPU trace, 56 different programs among the 263 that `max_min_fairness`
    solves)."""
    answers: dict[bytes, np.ndarray] = {}
    lock = threading.Lock()

    @functools.wraps(program)
    def remembered(*args: Any) -> np.ndarray:
        digest = hashlib.blake2b(digest_size=16)
        for arg in args:
            value = np.asarray(arg)
            digest.update(f"{value.dtype}{value.shape}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        key = digest.digest()
        with lock:
            known = answers.get(key)
        if known is None:
            known = program(*args)  # (NoPoint is not kept: rare, and raised again)
            with lock:
                if len(answers) >= REMEMBERED:
                    del answers[next(iter(answers))]
                answers[key] = known
        return known.copy()

    return remembered


class _Rows:
    """G (as cvxpy writes the program: s = h - G x >= 0) by blocks, over X of shape (n, k) and,
    for a max-min program, the epigraph variable t after it: x >= 0 (one row per entry),
    capacity (one row per type), each job's time (one row per job) and each job's throughput row
    (one per job: -T[j] X[j] <= -need_j, or -W[j] X[j] - t <= 0). Entries are (n, k) arrays."""

    def __init__(self, rate: np.ndarray, scale_factors: np.ndarray, num_gpus: np.ndarray,
                 rate_bound: np.ndarray, epigraph: bool) -> None:  # fmt: skip
        n, k = rate.shape
        self.shape = (n, k)
        self.epigraph = epigraph
        self.size = n * k + (1 if epigraph else 0)
        self.nonneg = -np.ones((n, k))
        self.capacity = np.broadcast_to(scale_factors[:, None], (n, k)).astype(np.float64)
        self.time = np.ones((n, k))
        self.rate = -rate.astype(np.float64)
        self.level = -np.ones(n) if epigraph else np.zeros(n)  # t's coefficient in rate rows
        self.h = (np.zeros((n, k)), num_gpus.astype(np.float64), np.ones(n), -rate_bound)

    def equilibrate(self) -> np.ndarray:
        """Scale rows and columns as ECOS's Ruiz passes do (h with its rows); returns the
        columns' factors, flat (x = x_scaled / factor)."""
        n, k = self.shape
        column = np.ones(self.size)
        h_nonneg, h_capacity, h_time, h_rate = self.h
        for _ in range(EQUILIBRATION_PASSES):
            col_x = np.maximum.reduce([np.abs(self.nonneg), np.abs(self.capacity),
                                       np.abs(self.time), np.abs(self.rate)])  # fmt: skip
            col = np.concatenate([col_x.ravel(), [np.abs(self.level).max()]])[: self.size]
            rows = (np.abs(self.nonneg), np.abs(self.capacity).max(axis=0),
                    np.abs(self.time).max(axis=1),
                    np.maximum(np.abs(self.rate).max(axis=1), np.abs(self.level)))  # fmt: skip
            col, r_nonneg, r_capacity, r_time, r_rate = (
                np.where(v < 1e-6, 1.0, np.sqrt(v)) for v in (col, *rows)
            )
            col_x = col[: n * k].reshape(n, k)
            self.nonneg = self.nonneg / r_nonneg / col_x
            self.capacity = self.capacity / r_capacity[None, :] / col_x
            self.time = self.time / r_time[:, None] / col_x
            self.rate = self.rate / r_rate[:, None] / col_x
            if self.size > n * k:
                self.level = self.level / r_rate / col[-1]
            h_nonneg, h_capacity = h_nonneg / r_nonneg, h_capacity / r_capacity
            h_time, h_rate = h_time / r_time, h_rate / r_rate
            column = column * col
        self.h = (h_nonneg, h_capacity, h_time, h_rate)
        return column

    # Primal vectors are flat (X.ravel(), then t); row vectors are tuples (nonneg (n, k),
    # capacity (k,), time (n,), rate (n,)).

    def _parts(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        n, k = self.shape
        return x[: n * k].reshape(n, k), (float(x[-1]) if self.size > n * k else 0.0)

    def times(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        """G x."""
        xs, level = self._parts(x)
        return (self.nonneg * xs, (self.capacity * xs).sum(axis=0), (self.time * xs).sum(axis=1),
                (self.rate * xs).sum(axis=1) + self.level * level)  # fmt: skip

    def transposed_times(self, z: tuple[np.ndarray, ...]) -> np.ndarray:
        """G' z."""
        nonneg, capacity, time, rate = z
        xs = (self.nonneg * nonneg + self.capacity * capacity[None, :]
              + self.time * time[:, None] + self.rate * rate[:, None])  # fmt: skip
        if self.size > xs.size:
            return np.concatenate([xs.ravel(), [_dot(self.level, rate)]])
        return cast(np.ndarray, xs.ravel())

    def normal_solver(self, v: tuple[np.ndarray, ...], delta: float) -> Solver:
        """A solver of (delta I + G' diag(1/v) G) x = b: per-job k x k blocks (a job's own rows),
        the k capacity rows added back by the Woodbury identity, and t's row and column
        (max-min) by a Schur complement."""
        v_nonneg, v_capacity, v_time, v_rate = v
        n, k = self.shape
        blocks = np.zeros((n, k, k))
        blocks[:, np.arange(k), np.arange(k)] = self.nonneg**2 / v_nonneg + delta
        blocks += np.einsum("ja,jb->jab", self.time, self.time) / v_time[:, None, None]
        blocks += np.einsum("ja,jb->jab", self.rate, self.rate) / v_rate[:, None, None]
        inverse = _inverse(blocks)
        # U's column t is the capacity row t: entries capacity[j, t] at (j, t).
        inverse_u = inverse * self.capacity[:, None, :]  # (n, k, k): B_j^-1 U_j
        small = np.diag(v_capacity) + np.einsum("ja,jab->ab", self.capacity, inverse_u)
        small_inverse = _inverse(small)

        def solve_x(b: np.ndarray) -> np.ndarray:
            y = np.einsum("jab,jb->ja", inverse, b)
            correction = (small_inverse * (self.capacity * y).sum(axis=0)).sum(axis=1)
            return cast(np.ndarray, y - np.einsum("jab,b->ja", inverse_u, correction))

        if self.size == n * k:
            return lambda b: solve_x(b.reshape(n, k)).ravel()
        border = self.rate * (self.level / v_rate)[:, None]  # G_x' V^-1 G_t
        corner = float((self.level**2 / v_rate).sum()) + delta
        border_solved = solve_x(border)
        schur = corner - float((border * border_solved).sum())

        def solve(b: np.ndarray) -> np.ndarray:
            bx = b[: n * k].reshape(n, k)
            y = solve_x(bx)
            level = (float(b[-1]) - float((border * y).sum())) / schur
            return np.concatenate([(y - border_solved * level).ravel(), [level]])

        return solve

    def matrix(self) -> np.ndarray:
        """G as a dense matrix: rows in `h`'s order, columns X.ravel() then t."""
        n, k = self.shape
        entries = np.arange(n * k).reshape(n, k)
        g_nonneg = np.zeros((n * k, self.size))
        g_nonneg[np.arange(n * k), np.arange(n * k)] = self.nonneg.ravel()
        g_capacity = np.zeros((k, self.size))
        g_capacity[np.arange(k)[None, :].repeat(n, 0), entries] = self.capacity
        g_time = np.zeros((n, self.size))
        g_time[np.arange(n)[:, None], entries] = self.time
        g_rate = np.zeros((n, self.size))
        g_rate[np.arange(n)[:, None], entries] = self.rate
        if self.size > n * k:
            g_rate[:, -1] = self.level
        return np.vstack([g_nonneg, g_capacity, g_time, g_rate])


class _JobBlocks:
    """Where a dense program's rows fall, for a structured normal solve: job j's own variables
    are `columns[j]` (its X, then its own others), touched by its linear rows `rows[j]`, its
    cone (the j-th), its epigraph row `epigraph[j]` (which also holds the epigraph variable,
    `border`), and by the `shared` rows across jobs (capacity)."""

    def __init__(self, columns: np.ndarray, rows: np.ndarray, epigraph: np.ndarray,
                 shared: np.ndarray, border: int) -> None:  # fmt: skip
        self.columns, self.rows, self.epigraph = columns, rows, epigraph
        self.shared, self.border = shared, border

    def take(self, g: np.ndarray) -> None:
        """G's blocks, once G is equilibrated (they do not change from one solve to the next):
        each job's own rows (jobs, rows, b), its cone's rows (jobs, 3, b), its epigraph row
        (jobs, b), the shared rows (shared, jobs, b), the epigraph rows' entry on t."""
        jobs = self.columns.shape[0]
        self.cone_rows = g.shape[0] - SOC_SIZE * jobs + np.arange(SOC_SIZE * jobs).reshape(jobs, -1)
        self.own = g[self.rows[:, :, None], self.columns[:, None, :]]
        self.cone = g[self.cone_rows[:, :, None], self.columns[:, None, :]]
        self.epigraph_row = g[self.epigraph[:, None], self.columns]
        self.shared_rows = g[self.shared[:, None, None], self.columns[None, :, :]]
        self.t_entries = g[self.epigraph, self.border]

    def normal_solver(self, block: _Block) -> Solver:
        """A solver of (delta I + G' M^-1 G) x = b by the structure (`take` first): per-job
        blocks, the shared rows by the Woodbury identity, the epigraph variable by a Schur
        complement."""
        own, cone, epigraph, shared = self.own, self.cone, self.epigraph_row, self.shared_rows
        weight = 1.0 / block.vd
        blocks = np.einsum("jrb,jr,jrc->jbc", own, weight[self.rows], own)
        if block.cones is None:  # (the start: W = I on every row)
            blocks += np.einsum("jrb,jr,jrc->jbc", cone, weight[self.cone_rows], cone)
        else:
            blocks += np.einsum("jrb,jrs,jsc->jbc", cone, block.cones.zz, cone)
        w_epigraph = weight[self.epigraph]
        blocks += np.einsum("jb,j,jc->jbc", epigraph, w_epigraph, epigraph)
        size = self.columns.shape[1]
        blocks[:, np.arange(size), np.arange(size)] += REGULARIZATION
        inverse = _inverse(blocks)
        inverse_u = np.einsum("jbc,sjc->sjb", inverse, shared)  # B_j^-1 U_j'
        small = np.diag(block.vd[self.shared]) + np.einsum("sjb,tjb->st", shared, inverse_u)
        small_inverse = _inverse(small)

        def solve_jobs(r: np.ndarray) -> np.ndarray:
            y = np.einsum("jbc,jc->jb", inverse, r)
            correction = (small_inverse * np.einsum("sjb,jb->s", shared, y)).sum(axis=1)
            return cast(np.ndarray, y - np.einsum("sjb,s->jb", inverse_u, correction))

        t_entries = self.t_entries
        border = (w_epigraph * t_entries)[:, None] * epigraph
        corner = float((w_epigraph * t_entries * t_entries).sum()) + REGULARIZATION
        border_solved = solve_jobs(border)
        schur = corner - float((border * border_solved).sum())

        def solve(b: np.ndarray) -> np.ndarray:
            y = solve_jobs(b[self.columns])
            level = (float(b[self.border]) - float((border * y).sum())) / schur
            out = np.empty_like(b)
            out[self.columns] = y - border_solved * level
            out[self.border] = level
            return out

        return solve


class _DenseRows:
    """G (s = h - G x in the cones) and h given whole, over X of shape (n, k) and other
    variables: for programs whose rows do not fit `_Rows`' blocks (G kept dense; its normal
    solves dense, or by `blocks` where the program gives its structure). The last
    `socs` triples of rows are second-order cones (s0 >= ||(s1, s2)||), the rows before them
    linear; X[j, c] is variable `x_columns[j, c]` (default: X.ravel() first)."""

    def __init__(self, g: np.ndarray, h: np.ndarray, shape: tuple[int, int],
                 x_columns: np.ndarray | None = None, socs: int = 0,
                 blocks: _JobBlocks | None = None) -> None:  # fmt: skip
        self.g, self.shape, self.size = g, shape, g.shape[1]
        self.h = (h,)
        self.x_columns = x_columns
        self.socs = socs
        self.blocks = blocks

    def equilibrate(self) -> np.ndarray:
        """ECOS's Ruiz passes on the whole matrix (each row and column by the square root of its
        largest entry; a cone's rows all by the sum of theirs), h with its rows; returns the
        columns' factors."""
        column = np.ones(self.size)
        (h,) = self.h
        linear = h.size - SOC_SIZE * self.socs
        for _ in range(EQUILIBRATION_PASSES):
            magnitude = np.abs(self.g)
            col, row = magnitude.max(axis=0), magnitude.max(axis=1)
            if self.socs:
                cone = row[linear:].reshape(self.socs, SOC_SIZE).sum(axis=1)
                row[linear:] = np.repeat(cone, SOC_SIZE)
            col, row = (np.where(v < 1e-6, 1.0, np.sqrt(v)) for v in (col, row))
            self.g = self.g / row[:, None] / col[None, :]
            h = h / row
            column = column * col
        self.h = (h,)
        return column

    def matrix(self) -> np.ndarray:
        return self.g


def _flat(parts: tuple[np.ndarray, ...]) -> np.ndarray:
    return np.concatenate([p.ravel() for p in parts])


def _split(flat: np.ndarray, like: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    out, start = [], 0
    for p in like:
        out.append(flat[start : start + p.size].reshape(p.shape))
        start += p.size
    return tuple(out)


def _into_cone(r: np.ndarray) -> np.ndarray:
    """ECOS's `bring2cone` for a linear cone: shift r by 1 + max(-0.99, its most negative)."""
    alpha = max(-GAMMA, float((-r[r <= 0]).max()) if (r <= 0).any() else -GAMMA)
    return r + (alpha + 1.0)


def _step(lam: np.ndarray, ds: np.ndarray, dz: np.ndarray, tau: float, dtau: float,
          kap: float, dkap: float, clamp: bool = True) -> float:  # fmt: skip
    """ECOS's line search for a linear cone: the longest step that keeps s, z, tau and kappa
    positive, within [STEP_MIN, STEP_MAX] (`clamp`)."""
    rho, sigma = (ds / lam).min(), (dz / lam).min()
    if -sigma > -rho:
        alpha = 1.0 / -sigma if sigma < 0 else 1.0 / TINY
    else:
        alpha = 1.0 / -rho if rho < 0 else 1.0 / TINY
    for value, change in ((tau, dtau), (kap, dkap)):
        if change != 0 and 0 < -value / change < alpha:
            alpha = -value / change
    return min(max(alpha, STEP_MIN), STEP_MAX) if clamp else alpha


@_remembered
def feasible_point(
    throughputs: np.ndarray, scale_factors: np.ndarray, num_gpus: np.ndarray, need: np.ndarray
) -> np.ndarray:
    """The X ECOS returns (cvxpy's clip to [0, 1] applied) for `min_total_duration`: any X >= 0
    with sum_j sf_j X[j, k] <= N_k, sum_k X[j, k] <= 1 and sum_k T[j, k] X[j, k] >= need_j,
    every such point being optimal. Raises NoPoint where ECOS would not report an optimum."""
    rows = _Rows(throughputs, scale_factors, num_gpus, need, epigraph=False)
    return _solve(rows, np.zeros(rows.size))


@_remembered
def max_min_point(
    weighted: np.ndarray, scale_factors: np.ndarray, num_gpus: np.ndarray
) -> np.ndarray:
    """The X ECOS returns (clipped to [0, 1]) for `max_min_fairness`: maximise
    min_j sum_k W[j, k] X[j, k] over the same base constraints, which cvxpy writes as: minimise
    t' subject to -W[j] X[j] - t' <= 0 (t' = -t, after X in its variable order)."""
    rows = _Rows(weighted, scale_factors, num_gpus, np.zeros(weighted.shape[0]), epigraph=True)
    c = np.zeros(rows.size)
    c[-1] = 1.0
    return _solve(rows, c)


@_remembered
def water_filling_point(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    inv_prop: np.ndarray,
    mult: np.ndarray,
    so_far: np.ndarray,
    frozen: np.ndarray,
    lower: np.ndarray,
    big_m: float,
) -> np.ndarray:
    """The X ECOS returns (clipped to [0, 1]) for one of Gavel's water-filling LPs: maximise
    min_j (mult_j (e_j - so_far_j) + add_j), e_j = T[j] X[j] * inv_prop_j its level, add_j = M
    (`big_m`) for a frozen job (whose term then has no X in it) and 0 otherwise, over the base
    constraints and e_j >= lower_j. cvxpy writes the minimum as an epigraph over every job:
    minimise t' s.t. -mult_j e_j - t' <= add_j - mult_j so_far_j (frozen: -t' <= M), with the
    lower bounds as rows of their own: two rows per job, which `_Rows`' blocks do not hold, so
    this program is solved dense, up to `DENSE_UP_TO` variables (NoPoint beyond)."""
    n, k = throughputs.shape
    size = n * k + 1
    if size > DENSE_UP_TO:  # (a dense solve there takes seconds: the caller's own point instead)
        raise NoPoint(f"{n} jobs: too many for the dense solve")
    entries = np.arange(n * k).reshape(n, k)
    rate = throughputs * inv_prop[:, None]  # e_j's coefficients
    weight = np.where(frozen, 0.0, mult)
    g = np.zeros((n * k + k + 3 * n, size))
    g[np.arange(n * k), np.arange(n * k)] = -1.0
    g[n * k + np.arange(k)[None, :].repeat(n, 0), entries] = scale_factors[:, None]
    g[n * k + k + np.arange(n)[:, None], entries] = 1.0
    epigraph = n * k + k + n
    g[epigraph + np.arange(n)[:, None], entries] = -weight[:, None] * rate
    g[epigraph + np.arange(n), -1] = -1.0
    g[epigraph + n + np.arange(n)[:, None], entries] = -rate
    h = np.concatenate([np.zeros(n * k), num_gpus.astype(np.float64), np.ones(n),
                        np.where(frozen, big_m, 0.0) - weight * so_far, -lower])  # fmt: skip
    c = np.zeros(size)
    c[-1] = 1.0
    return _solve(_DenseRows(g, h, (n, k)), c)


@_remembered
def finish_time_point(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    remaining: np.ndarray,
    since_start: np.ndarray,
    finish: np.ndarray,
) -> np.ndarray:
    """The X ECOS returns (clipped to [0, 1]) for Gavel's finish-time fairness program:
    minimise max_j (t_j + R_j / r_j) / D_j, r_j = T[j] X[j] (`since_start` t_j, `remaining`
    R_j, `finish` D_j), over the base constraints. cvxpy writes each 1/r_j as a variable u_j in
    the cone r_j u_j >= 1, ||(2, r_j - u_j)|| <= r_j + u_j, and the maximum as an epigraph t:
    variables t, X column by column, u; rows -t + (R_j / D_j) u_j <= -t_j / D_j, -X <= 0 (column
    by column), capacity, each job's time, then each job's cone (r_j + u_j, r_j - u_j, 2).
    Two jobs or more (cvxpy writes one job's program without t); dense, up to `DENSE_UP_TO`
    variables (NoPoint otherwise)."""
    n, k = throughputs.shape
    size = 1 + n * k + n
    if n < 2 or size > DENSE_UP_TO:
        raise NoPoint(f"{n} jobs: not solved the reference's way")
    jobs = np.arange(n)
    x_columns = 1 + np.arange(n * k).reshape(k, n).T  # X[j, c], column-major
    u_columns = 1 + n * k + jobs
    capacity, time = n + n * k, n + n * k + k
    cone = time + n + SOC_SIZE * jobs
    g = np.zeros((cone[-1] + SOC_SIZE, size))
    h = np.zeros(g.shape[0])
    g[jobs, 0] = -1.0
    g[jobs, u_columns] = remaining / finish
    h[:n] = -since_start / finish
    g[n + np.arange(n * k), 1 + np.arange(n * k)] = -1.0
    g[np.broadcast_to(capacity + np.arange(k), (n, k)), x_columns] = scale_factors[:, None]
    h[capacity:time] = num_gpus
    g[time + jobs[:, None], x_columns] = 1.0
    h[time : time + n] = 1.0
    for row, sign in ((cone, -1.0), (cone + 1, 1.0)):
        g[row[:, None], x_columns] = -throughputs
        g[row, u_columns] = sign
    h[cone + 2] = 2.0
    c = np.zeros(size)
    c[0] = 1.0
    own_rows = np.column_stack([n + x_columns - 1, time + jobs])  # x >= 0 rows, the time row
    blocks = _JobBlocks(np.column_stack([x_columns, u_columns]), own_rows, jobs,
                        capacity + np.arange(k), 0)  # fmt: skip
    return _solve(_DenseRows(g, h, (n, k), x_columns=x_columns, socs=n, blocks=blocks), c)


class _Operator:
    """G, G' and the regularised normal solves, on flat vectors: a dense G for small max-min
    programs and `_DenseRows` (as accurate as it gets, and fast), the structured blocks of `_Rows`
    for the others."""

    def __init__(self, rows: _Rows | _DenseRows) -> None:
        self.rows = rows
        self.like = rows.h
        # Max-min programs (an epigraph variable) up to DENSE_UP_TO variables have the dense
        # normal matrix: by the blocks, t's Schur complement loses the accuracy ECOS's path needs
        # (on Gavel's traces 56 of 716 such programs then end without a point). The others go by
        # the blocks at any size: on the same traces their points are the dense ones' to 2e-11
        # (the runs' results unchanged), in half the time.
        small = isinstance(rows, _DenseRows) or (rows.epigraph and rows.size <= DENSE_UP_TO)
        self.dense = rows.matrix() if small else None
        self.blocks = rows.blocks if isinstance(rows, _DenseRows) else None
        if self.blocks is not None and self.dense is not None:
            self.blocks.take(self.dense)

    def times(self, x: np.ndarray) -> np.ndarray:
        if self.dense is not None:
            return cast(np.ndarray, (self.dense * x).sum(axis=1))
        assert isinstance(self.rows, _Rows)  # (`_DenseRows` always have `dense`)
        return _flat(self.rows.times(x))

    def transposed(self, z: np.ndarray) -> np.ndarray:
        if self.dense is not None:
            return cast(np.ndarray, (self.dense * z[:, None]).sum(axis=0))
        assert isinstance(self.rows, _Rows)  # (`_DenseRows` always have `dense`)
        return self.rows.transposed_times(_split(z, self.like))

    def normal_solver(self, block: _Block) -> Solver:
        """A solver of (delta I + G' M^-1 G) x = b, M^-1 the z block's inverse (its cones'
        part: `_JobBlocks`, the only programs with cones)."""
        if self.blocks is not None:
            return self.blocks.normal_solver(block)
        if self.dense is not None:
            g = self.dense
            normal = np.einsum("ri,rj->ij", g, g / block.vd[:, None])  # not BLAS: `_inverse`
            normal[np.diag_indices_from(normal)] += REGULARIZATION
            inverse = _inverse(normal)
            return lambda b: (inverse * b).sum(axis=1)  # (refined by the caller)
        assert isinstance(self.rows, _Rows)  # (`_DenseRows` always have `dense`)
        return self.rows.normal_solver(_split(block.vd, self.like), REGULARIZATION)


def _lorentz(u: np.ndarray) -> np.ndarray:
    """u0^2 - u1^2 - u2^2 of each cone (cones, 3): positive inside (ECOS's `socres`)."""
    return cast(np.ndarray, u[:, 0] * u[:, 0] - u[:, 1] * u[:, 1] - u[:, 2] * u[:, 2])


def _safe_divide(x: np.ndarray | float, y: np.ndarray) -> np.ndarray:
    """ECOS's SAFEDIV_POS: x / y, with y no smaller than TINY."""
    return cast(np.ndarray, x / np.maximum(y, TINY))  # (a NaN stays NaN, as in ECOS's macro)


class _ConeScaling:
    """ECOS's Nesterov-Todd scaling W of its second-order cones (`updateScalings`, `scale`;
    CONEMODE 0: W^2 = eta^2 [D v u; v' 1 0; u' 0 -1] with two extra rows a cone in its KKT
    system), for cones given as (cones, 3) arrays of s and z."""

    def __init__(self, s: np.ndarray, z: np.ndarray) -> None:
        snorm, znorm = np.sqrt(_lorentz(s)), np.sqrt(_lorentz(z))
        sbar, zbar = _safe_divide(s, snorm[:, None]), _safe_divide(z, znorm[:, None])
        self.eta_square = _safe_divide(snorm, znorm)
        self.eta = np.sqrt(self.eta_square)
        gamma = np.sqrt(0.5 * (1.0 + sbar[:, 0] * zbar[:, 0] + sbar[:, 1] * zbar[:, 1]
                               + sbar[:, 2] * zbar[:, 2]))  # fmt: skip
        half_over_gamma = _safe_divide(0.5, gamma)
        self.a = a = half_over_gamma * (sbar[:, 0] + zbar[:, 0])
        self.q = q = half_over_gamma[:, None] * (sbar[:, 1:] - zbar[:, 1:])
        w = q[:, 0] * q[:, 0] + q[:, 1] * q[:, 1]
        one_a = 1.0 + a
        c = 1.0 + a + w / one_a
        d = 1.0 + 2.0 / one_a + w / (one_a * one_a)
        d1 = np.maximum(0.5 * (a * a + w * (1.0 - c * c / (1.0 + w * d))), 0.0)
        u0_square = a * a + w - d1
        c2_u02 = _safe_divide(c * c, u0_square)
        self.inside = bool((c2_u02 - d > 0).all())
        self.d1, self.u0 = d1, np.sqrt(u0_square)
        self.u1, self.v1 = np.sqrt(c2_u02), np.sqrt(np.maximum(c2_u02 - d, 0.0))

    def times(self, z: np.ndarray) -> np.ndarray:
        """W z."""
        zeta = self.q[:, 0] * z[:, 1] + self.q[:, 1] * z[:, 2]
        factor = z[:, 0] + zeta / (1.0 + self.a)
        head = self.eta * (self.a * z[:, 0] + zeta)
        return np.column_stack([head, self.eta[:, None] * (z[:, 1:] + factor[:, None] * self.q)])

    def lifted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """D's diagonal and the columns v and u of W^2 / eta^2 in the lifted form, (cones, 3)."""
        zero = np.zeros_like(self.a)
        diagonal = np.column_stack([self.d1, np.ones_like(self.a), np.ones_like(self.a)])
        v = np.column_stack([zero, self.v1[:, None] * self.q])
        u = np.column_stack([self.u0, self.u1[:, None] * self.q])
        return diagonal, v, u


class _ConeBlock:
    """The cones' part of ECOS's regularised KKT system, lifted as ECOS lifts it (CONEMODE 0:
    two more rows a cone, W^2 = eta^2 [D v u; v' 1 0; u' 0 -1], which keeps its entries of the
    order of W's rather than W^2's): ECOS factors -(W^2 + delta diag(1, 1, 1, 0, -1)) and refines
    against -(W^2 + delta diag(1, 1, -1, 0, 0)) (the sign it gives each cone's last row).
    Vectors here are lifted: (cones, 5)."""

    def __init__(self, scaling: _ConeScaling) -> None:
        lifted = SOC_SIZE + 2
        diagonal, v, u = scaling.lifted()
        w2 = np.zeros((scaling.a.size, lifted, lifted))
        w2[:, np.arange(SOC_SIZE), np.arange(SOC_SIZE)] = diagonal
        w2[:, :SOC_SIZE, SOC_SIZE] = w2[:, SOC_SIZE, :SOC_SIZE] = v
        w2[:, :SOC_SIZE, SOC_SIZE + 1] = w2[:, SOC_SIZE + 1, :SOC_SIZE] = u
        w2[:, SOC_SIZE, SOC_SIZE], w2[:, SOC_SIZE + 1, SOC_SIZE + 1] = 1.0, -1.0
        w2 *= scaling.eta_square[:, None, None]
        self.inverse = _inverse(w2 + np.diag([*[REGULARIZATION] * SOC_SIZE, 0.0,
                                                   -REGULARIZATION]))  # fmt: skip
        self.refined = w2 + np.diag([REGULARIZATION, REGULARIZATION, -REGULARIZATION, 0.0, 0.0])
        self.zz = np.ascontiguousarray(self.inverse[:, :SOC_SIZE, :SOC_SIZE])  # M^-1 on z

    def solve(self, r: np.ndarray) -> np.ndarray:
        """F^-1 r, r lifted."""
        return cast(np.ndarray, (self.inverse * r[:, None, :]).sum(axis=2))

    def residual(self, r: np.ndarray, lifted: np.ndarray) -> np.ndarray:
        """r + (W^2 + refinement's delta) lifted, r lifted (rz - G dx, and the lifted rows')."""
        return cast(np.ndarray, r + (self.refined * lifted[:, None, :]).sum(axis=2))


class _Block:
    """The z block of the regularised KKT system: diag(v + delta) on the linear rows, and the
    cones' blocks (`_ConeBlock`) after them."""

    def __init__(self, v: np.ndarray, cones: _ConeBlock | None = None) -> None:
        self.vd = self.refined = v + REGULARIZATION
        self.cones = cones

    @classmethod
    def start(cls, size: int, cones: _Cones) -> _Block:
        """W = I, ECOS's first system. With cones, as ECOS has it: factored with -I, refined
        against -(I + delta) with each cone's last row's delta negated. (Linear programs keep
        I + delta in both, which agrees with ECOS to 1e-9 and which their results were
        validated with.)"""
        block = cls(np.ones(size))
        if cones.socs:
            block.vd = np.ones(size)
            block.refined = 1.0 + REGULARIZATION * cones.identity_signs
        return block


class _Cones:
    """s and z: `linear` entries in the nonnegative orthant, then `socs` second-order cones of
    SOC_SIZE entries. With no cones, every operation is the linear one alone."""

    def __init__(self, linear: int, socs: int) -> None:
        self.linear, self.socs = linear, socs
        self.degree = linear + socs  # ECOS's D: one per linear entry, one per cone
        self.identity = np.ones(linear + SOC_SIZE * socs)  # e: 1 on linear entries and heads
        self.identity[linear:].reshape(socs, SOC_SIZE)[:, 1:] = 0.0
        self.identity_signs = np.ones(linear + SOC_SIZE * socs)  # ECOS's refinement's signs
        self.identity_signs[linear:].reshape(socs, SOC_SIZE)[:, -1] = -1.0

    def parts(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return u[: self.linear], u[self.linear :].reshape(self.socs, SOC_SIZE)

    def into_cone(self, r: np.ndarray) -> np.ndarray:
        """ECOS's `bring2cone`: shift r by (1 + its largest violation, at least -0.99) times the
        cones' identity."""
        if not self.socs:
            return _into_cone(r)
        linear, cones = self.parts(r)
        residual = cones[:, 0] - np.sqrt(cones[:, 1] ** 2 + cones[:, 2] ** 2)
        worst = np.concatenate([-linear[linear <= 0], -residual[residual <= 0]])
        alpha = max(-GAMMA, float(worst.max()) if worst.size else -GAMMA) + 1.0
        out = r.copy()
        out[: self.linear] += alpha
        out[self.linear :: SOC_SIZE] += alpha
        return out

    def product(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """ECOS's conic product u o v."""
        (ul, uc), (vl, vc) = self.parts(u), self.parts(v)
        head = uc[:, 0] * vc[:, 0] + uc[:, 1] * vc[:, 1] + uc[:, 2] * vc[:, 2]
        tail = uc[:, :1] * vc[:, 1:] + vc[:, :1] * uc[:, 1:]
        return np.concatenate([ul * vl, np.column_stack([head, tail]).ravel()])

    def divide(self, u: np.ndarray, w: np.ndarray) -> np.ndarray:
        """ECOS's conic division: the v with u o v = w."""
        (ul, uc), (wl, wc) = self.parts(u), self.parts(w)
        rho = _lorentz(uc)
        zeta = uc[:, 1] * wc[:, 1] + uc[:, 2] * wc[:, 2]
        factor = _safe_divide(_safe_divide(zeta, uc[:, 0]) - wc[:, 0], rho)
        head = _safe_divide(uc[:, 0] * wc[:, 0] - zeta, rho)
        tail = factor[:, None] * uc[:, 1:] + _safe_divide(wc[:, 1:], uc[:, :1])
        return np.concatenate([_safe_divide(wl, ul), np.column_stack([head, tail]).ravel()])

    def step(self, lam: np.ndarray, ds: np.ndarray, dz: np.ndarray, tau: float, dtau: float,
             kap: float, dkap: float) -> float:  # fmt: skip
        """ECOS's `lineSearch`: the linear cone's and tau's and kappa's bound (`_step`), then
        each second-order cone's."""
        if not self.socs:
            return _step(lam, ds, dz, tau, dtau, kap, dkap)
        (ll, lc), (sl, sc), (zl, zc) = self.parts(lam), self.parts(ds), self.parts(dz)
        alpha = _step(ll, sl, zl, tau, dtau, kap, dkap, clamp=False)
        norm2 = _lorentz(lc)
        inside = norm2 > 0
        norm = np.sqrt(np.where(inside, norm2, 1.0))
        bar, inverse = lc / norm[:, None], 1.0 / norm
        worst = np.zeros(lc.shape[0])
        for d in (sc, zc):
            along = bar[:, 0] * d[:, 0] - bar[:, 1] * d[:, 1] - bar[:, 2] * d[:, 2]
            factor = (along + d[:, 0]) / (bar[:, 0] + 1.0)
            rest = inverse[:, None] * (d[:, 1:] - factor[:, None] * bar[:, 1:])
            rest_norm = np.sqrt(rest[:, 0] * rest[:, 0] + rest[:, 1] * rest[:, 1])
            worst = np.maximum(worst, rest_norm - inverse * along)
        worst = worst[inside & (worst != 0)]
        if worst.size:
            alpha = min(alpha, float((1.0 / worst).min()))
        return min(max(alpha, STEP_MIN), STEP_MAX)

    def scaling(self, s: np.ndarray, z: np.ndarray) -> _Scaling | None:
        """ECOS's `updateScalings`; None where s or z has left its cone."""
        if not self.socs:
            return _Scaling(self, np.where(z < TINY, s / TINY, s / z), None)
        sl, zl = s[: self.linear], z[: self.linear]
        v = np.where(zl < TINY, sl / TINY, sl / zl)
        (_, sc), (_, zc) = self.parts(s), self.parts(z)
        if (_lorentz(sc) <= 0).any() or (_lorentz(zc) <= 0).any():
            return None
        cones = _ConeScaling(sc, zc)
        return _Scaling(self, v, cones) if cones.inside else None


class _Scaling:
    """W: sqrt(s / z) on the linear entries, the Nesterov-Todd scaling on the cones."""

    def __init__(self, cones: _Cones, v: np.ndarray, soc: _ConeScaling | None) -> None:
        self.cones, self.v, self.w, self.soc = cones, v, np.sqrt(v), soc

    def times(self, z: np.ndarray) -> np.ndarray:
        if self.soc is None:
            return cast(np.ndarray, self.w * z)
        linear, cone = self.cones.parts(z)
        return np.concatenate([self.w * linear, self.soc.times(cone).ravel()])

    def block(self) -> _Block:
        return _Block(self.v, None if self.soc is None else _ConeBlock(self.soc))


@functools.cache
def _blas() -> ThreadpoolController:
    return ThreadpoolController()


def _solve(rows: _Rows | _DenseRows, c: np.ndarray) -> np.ndarray:
    """ECOS's iterations on `rows` with objective c'x; returns X (n, k). On one BLAS thread:
    a threaded product or inverse rounds differently with the number of threads, which moves
    the point on a face of optima, and the results with it, from one machine (or `--parallel`)
    to the next."""
    with _blas().limit(limits=1, user_api="blas"):
        return _iterate(rows, c)


def _iterate(rows: _Rows | _DenseRows, c: np.ndarray) -> np.ndarray:
    column = rows.equilibrate()
    c = c / column
    h = _flat(rows.h)
    op = _Operator(rows)
    socs = rows.socs if isinstance(rows, _DenseRows) else 0
    cones = _Cones(h.size - SOC_SIZE * socs, socs)

    def factor(block: _Block) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """Solves [0 G'; G -W^2] [dx; dz] = [rx; rz] as ECOS does: regularised,
        [delta I, G'; G, -(W^2 + delta)] (on the linear rows -diag(v + delta)), and refined
        against that system while the error falls (ECOS: at most 9 times, while it falls
        6-fold)."""
        vd = block.vd
        normal = op.normal_solver(block)
        linear = vd.size
        soc = block.cones

        no_lifted_rows = np.zeros((socs, 2))

        def lift(cone_rows: np.ndarray, rl: np.ndarray | None) -> np.ndarray:
            """The cones' rows with their two lifted rows after each cone's (zero if None)."""
            rows = cone_rows.reshape(socs, SOC_SIZE)
            return np.concatenate([rows, no_lifted_rows if rl is None else rl], axis=1)

        def once(rx: np.ndarray, rz: np.ndarray, rl: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:  # fmt: skip
            if soc is None:
                dx = normal(rx + op.transposed(rz / vd))
                return dx, (op.times(dx) - rz) / vd, None
            r = lift(rz[linear:], rl)
            weighted = soc.solve(r)[:, :SOC_SIZE].ravel()
            dx = normal(rx + op.transposed(np.concatenate([rz[:linear] / vd, weighted])))
            gdx = op.times(dx)
            lifted = soc.solve(lift(gdx[linear:], None) - r)
            dz = np.concatenate([(gdx[:linear] - rz[:linear]) / vd, lifted[:, :SOC_SIZE].ravel()])
            return dx, dz, lifted

        def residual(rx: np.ndarray, rz: np.ndarray, dx: np.ndarray, dz: np.ndarray,
                     dl: np.ndarray | None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:  # fmt: skip
            ex = rx - op.transposed(dz) - REGULARIZATION * dx
            if soc is None or dl is None:
                return ex, rz - op.times(dx) + block.refined * dz, None
            base = rz - op.times(dx)
            lifted = soc.residual(lift(base[linear:], None), dl)
            ez = np.concatenate(
                [base[:linear] + block.refined * dz[:linear], lifted[:, :SOC_SIZE].ravel()]
            )
            return ex, ez, lifted[:, SOC_SIZE:]

        def solve(rx: np.ndarray, rz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            dx, dz, dl = once(rx, rz, None)
            limit = (1.0 + max(float(np.abs(rx).max()), float(np.abs(rz).max()))) * 1e-14
            before, last = np.inf, (dx, dz, dl)
            for refinement in range(REFINEMENTS + 1):
                ex, ez, el = residual(rx, rz, dx, dz, dl)
                err = max(float(np.abs(ex).max()), float(np.abs(ez).max()))
                if el is not None:
                    err = max(err, float(np.abs(el).max()))
                if refinement > 0 and err > before:  # worse: undo the last refinement
                    dx, dz, dl = last
                    break
                if (
                    refinement == REFINEMENTS
                    or err < limit
                    or (refinement > 0 and before < 6 * err)
                ):
                    break
                before, last = err, (dx, dz, dl)
                ddx, ddz, ddl = once(ex, ez, el)
                dx, dz = dx + ddx, dz + ddz
                if dl is not None and ddl is not None:
                    dl = dl + ddl
            return dx, dz

        return solve

    start = factor(_Block.start(h.size, cones))
    x, minus_r = start(np.zeros(rows.size), h)
    s = cones.into_cone(-minus_r)
    _, z_start = start(-c, np.zeros(h.size))
    z = cones.into_cone(z_start)
    tau = kap = 1.0
    resx0 = max(1.0, _norm(c))
    resz0 = max(1.0, _norm(h))
    pres_before, step, since_best = np.nan, 0.0, 0
    best: _Iterate | None = None
    for iteration in range(MAX_ITERATIONS + 1):
        rx = -op.transposed(z)
        hresx = _norm(rx)
        rx = rx - tau * c
        rz = s + op.times(x) - tau * h
        cx, hz = _dot(c, x), _dot(h, z)
        rt = kap + cx + hz
        gap = _dot(s, z)
        mu = (gap + kap * tau) / (cones.degree + 1)
        nz = _norm(z)
        pres = _norm(rz) / max(resz0 + _norm(x) + _norm(s), 1.0) / tau
        dres = _norm(rx) / max(resx0 + nz, 1.0) / tau
        pcost, dcost = cx / tau, -hz / tau
        relgap = gap / -pcost if pcost < 0 else (gap / dcost if dcost > 0 else np.nan)
        pinfres = hresx / max(nz, 1.0) if hz / max(nz, 1.0) < -TOLERANCE else np.nan
        now = _Iterate(x, tau, cx, hz, gap, mu, pres, dres, relgap, pinfres, kap / tau)
        if iteration > 0 and (pres > 500 * pres_before or gap < 0):
            return _close_enough(best, rows, column, "the method's safeguard stopped it")
        pres_before = pres
        if now.optimal(TOLERANCE, TOLERANCE, TOLERANCE):
            break
        if best is None or now.better_than(best):
            best, since_best = now, 0
        else:
            since_best += 1
        # ECOS goes on to its iteration limit where numerics stall it, and then takes its best
        # iterate; so do we, but stop once 10 iterations in a row did not improve on it.
        if iteration == MAX_ITERATIONS or step == STEP_MIN * GAMMA or since_best >= STALL:
            return _close_enough(best, rows, column, "the method stalled")
        scaling = cones.scaling(s, z)
        if scaling is None:
            return _close_enough(best, rows, column, "an iterate left its cone")
        lam = scaling.times(z)
        solve = factor(scaling.block())
        dx1, dz1 = solve(-c, h)
        dx2, dz2 = solve(rx, s - rz)
        denominator = kap / tau - (_dot(c, dx1) + _dot(h, dz1))
        dtau_affine = (rt - kap + _dot(c, dx2) + _dot(h, dz2)) / denominator
        w_dz_affine = scaling.times(dz2 + dtau_affine * dz1)
        ds_affine = -w_dz_affine - lam
        dkap_affine = -kap - kap / tau * dtau_affine
        step_affine = cones.step(lam, ds_affine, w_dz_affine, tau, dtau_affine, kap, dkap_affine)
        sigma = min(max((1 - step_affine) ** 3, SIGMA_MIN), SIGMA_MAX)
        # lambda \ (lambda o lambda + W\ds_a o W dz_a - sigma mu e); a linear program's keeps
        # the order of operations its results were validated with (so below for s).
        if socs:
            combined = cones.product(lam, lam) + (
                cones.product(ds_affine, w_dz_affine) - sigma * mu * cones.identity
            )
            lam_ds = cones.divide(lam, combined)
        else:
            lam_ds = (lam * lam + ds_affine * w_dz_affine - sigma * mu) / lam
        dx2, dz2 = solve((1 - sigma) * rx, -(1 - sigma) * rz + scaling.times(lam_ds))
        bkap = kap * tau + dkap_affine * dtau_affine - sigma * mu
        dtau = ((1 - sigma) * rt - bkap / tau + _dot(c, dx2) + _dot(h, dz2)) / denominator
        dx = dx2 + dtau * dx1
        dz = dz2 + dtau * dz1
        w_dz = scaling.times(dz)
        ds_w = -(lam_ds + w_dz)
        dkap = -(bkap + kap * dtau) / tau
        step = cones.step(lam, ds_w, w_dz, tau, dtau, kap, dkap) * GAMMA
        x = x + step * dx
        z = z + step * dz
        s = s + (step * scaling.times(ds_w) if socs else step * scaling.w * ds_w)
        kap += step * dkap
        tau += step * dtau
    return now.point(rows, column)


class _Iterate:
    """An iterate and the figures ECOS judges it by (its `stats`)."""

    def __init__(self, x: np.ndarray, tau: float, cx: float, hz: float, gap: float, mu: float,
                 pres: float, dres: float, relgap: float, pinfres: float,
                 kapovert: float) -> None:  # fmt: skip
        self.x, self.tau, self.cx, self.hz = x, tau, cx, hz
        self.gap, self.mu, self.pres, self.dres = gap, mu, pres, dres
        self.relgap, self.pinfres, self.kapovert = relgap, pinfres, kapovert

    def optimal(self, feastol: float, abstol: float, reltol: float) -> bool:
        """ECOS's test for an optimum (`checkExitConditions`) at these tolerances."""
        return bool(
            (-self.cx > 0 or -self.hz >= -abstol)
            and self.pres < feastol
            and self.dres < feastol
            and (self.gap < abstol or self.relgap < reltol)
        )

    def better_than(self, best: _Iterate) -> bool:
        """ECOS's `compareStatistics` (no equality rows)."""
        gap = 0 < self.gap < best.gap and best.gap > 0
        mu = 0 < self.mu < best.mu
        if self.pinfres == self.pinfres and self.kapovert > 1:
            if best.pinfres == best.pinfres:
                return gap and 0 < self.pinfres < best.pres and mu
            return gap and mu
        return (gap and 0 < self.pres < best.pres and 0 < self.dres < best.dres
                and 0 < self.kapovert < best.kapovert and mu)  # fmt: skip

    def point(self, rows: _Rows | _DenseRows, column: np.ndarray) -> np.ndarray:
        n, k = rows.shape
        x = self.x / (column * self.tau)
        columns = rows.x_columns if isinstance(rows, _DenseRows) else None
        return np.clip(x[: n * k].reshape(n, k) if columns is None else x[columns], 0.0, 1.0)


def _close_enough(
    best: _Iterate | None, rows: _Rows | _DenseRows, column: np.ndarray, why: str
) -> np.ndarray:
    """ECOS's way out when it stalls: its best iterate, if that is optimal to its reduced
    tolerances ("close to optimal"); else no point."""
    if best is None or not best.optimal(1e-4, 5e-5, 5e-5):
        raise NoPoint(why)
    return best.point(rows, column)

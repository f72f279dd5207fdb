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
"""

from __future__ import annotations

import numpy as np

GAMMA = 0.99  # final step scaling (and the slack's initial margin)
STEP_MIN, STEP_MAX = 1e-6, 0.999
SIGMA_MIN, SIGMA_MAX = 1e-4, 1.0
TOLERANCE = 1e-8  # ECOS's feasibility, absolute and relative gap tolerances
EQUILIBRATION_PASSES = 3
TINY = 1e-13
MAX_ITERATIONS = 100
REGULARIZATION = 7e-8  # ECOS's static regularisation of its linear systems
REFINEMENTS = 9  # and its iterative refinement of their solutions
DENSE_UP_TO = 1000  # variables up to which the normal matrix is formed and solved whole
STALL = 10  # iterations without a better iterate after which we take the best (see `_solve`)


class NoPoint(RuntimeError):
    """The method stopped without a point (its safeguards, or the iteration limit)."""


class _Rows:
    """G (as cvxpy writes the program: s = h - G x >= 0) by blocks, over X of shape (n, k) and,
    for a max-min program, the epigraph variable t after it: x >= 0 (one row per entry),
    capacity (one row per type), each job's time (one row per job) and each job's throughput row
    (one per job: -T[j] X[j] <= -need_j, or -W[j] X[j] - t <= 0). Entries are (n, k) arrays."""

    def __init__(self, rate: np.ndarray, scale_factors: np.ndarray, num_gpus: np.ndarray,
                 rate_bound: np.ndarray, epigraph: bool) -> None:  # fmt: skip
        n, k = rate.shape
        self.shape = (n, k)
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
            return np.concatenate([xs.ravel(), [float(self.level @ rate)]])
        return xs.ravel()

    def normal_solver(self, v: tuple[np.ndarray, ...], delta: float):  # type: ignore[no-untyped-def]
        """A solver of (delta I + G' diag(1/v) G) x = b: per-job k x k blocks (a job's own rows),
        the k capacity rows added back by the Woodbury identity, and t's row and column
        (max-min) by a Schur complement."""
        v_nonneg, v_capacity, v_time, v_rate = v
        n, k = self.shape
        blocks = np.zeros((n, k, k))
        blocks[:, np.arange(k), np.arange(k)] = self.nonneg**2 / v_nonneg + delta
        blocks += np.einsum("ja,jb->jab", self.time, self.time) / v_time[:, None, None]
        blocks += np.einsum("ja,jb->jab", self.rate, self.rate) / v_rate[:, None, None]
        inverse = np.linalg.inv(blocks)
        # U's column t is the capacity row t: entries capacity[j, t] at (j, t).
        inverse_u = inverse * self.capacity[:, None, :]  # (n, k, k): B_j^-1 U_j
        small = np.diag(v_capacity) + np.einsum("ja,jab->ab", self.capacity, inverse_u)
        small_inverse = np.linalg.inv(small)

        def solve_x(b: np.ndarray) -> np.ndarray:
            y = np.einsum("jab,jb->ja", inverse, b)
            correction = small_inverse @ (self.capacity * y).sum(axis=0)
            return y - np.einsum("jab,b->ja", inverse_u, correction)

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


class _DenseRows:
    """G (s = h - G x >= 0) and h given whole, over X of shape (n, k) and one epigraph variable
    after it: for programs whose rows do not fit `_Rows`' blocks (solved dense only)."""

    def __init__(self, g: np.ndarray, h: np.ndarray, shape: tuple[int, int]) -> None:
        self.g, self.shape, self.size = g, shape, g.shape[1]
        self.h = (h,)

    def equilibrate(self) -> np.ndarray:
        """ECOS's Ruiz passes on the whole matrix (each row and column by the square root of its
        largest entry), h with its rows; returns the columns' factors."""
        column = np.ones(self.size)
        (h,) = self.h
        for _ in range(EQUILIBRATION_PASSES):
            magnitude = np.abs(self.g)
            col, row = magnitude.max(axis=0), magnitude.max(axis=1)
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
          kap: float, dkap: float) -> float:  # fmt: skip
    """ECOS's line search for a linear cone: the longest step that keeps s, z, tau and kappa
    positive, within [STEP_MIN, STEP_MAX]."""
    rho, sigma = (ds / lam).min(), (dz / lam).min()
    if -sigma > -rho:
        alpha = 1.0 / -sigma if sigma < 0 else 1.0 / TINY
    else:
        alpha = 1.0 / -rho if rho < 0 else 1.0 / TINY
    for value, change in ((tau, dtau), (kap, dkap)):
        if change != 0 and 0 < -value / change < alpha:
            alpha = -value / change
    return min(max(alpha, STEP_MIN), STEP_MAX)


def feasible_point(
    throughputs: np.ndarray, scale_factors: np.ndarray, num_gpus: np.ndarray, need: np.ndarray
) -> np.ndarray:
    """The X ECOS returns (cvxpy's clip to [0, 1] applied) for `min_total_duration`: any X >= 0
    with sum_j sf_j X[j, k] <= N_k, sum_k X[j, k] <= 1 and sum_k T[j, k] X[j, k] >= need_j,
    every such point being optimal. Raises NoPoint where ECOS would not report an optimum."""
    rows = _Rows(throughputs, scale_factors, num_gpus, need, epigraph=False)
    return _solve(rows, np.zeros(rows.size))


def max_min_point(weighted: np.ndarray, scale_factors: np.ndarray, num_gpus: np.ndarray) -> np.ndarray:
    """The X ECOS returns (clipped to [0, 1]) for `max_min_fairness`: maximise
    min_j sum_k W[j, k] X[j, k] over the same base constraints, which cvxpy writes as: minimise
    t' subject to -W[j] X[j] - t' <= 0 (t' = -t, after X in its variable order)."""
    rows = _Rows(weighted, scale_factors, num_gpus, np.zeros(weighted.shape[0]), epigraph=True)
    c = np.zeros(rows.size)
    c[-1] = 1.0
    return _solve(rows, c)


def water_filling_point(
    throughputs: np.ndarray, scale_factors: np.ndarray, num_gpus: np.ndarray,
    inv_prop: np.ndarray, mult: np.ndarray, so_far: np.ndarray, frozen: np.ndarray,
    lower: np.ndarray, big_m: float,
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


class _Operator:
    """G, G' and the regularised normal solves, on flat vectors: a dense G for small programs
    (as accurate as it gets, and fast), the structured blocks of `_Rows` for large ones."""

    def __init__(self, rows: _Rows | _DenseRows) -> None:
        self.rows = rows
        self.like = rows.h
        small = isinstance(rows, _DenseRows) or rows.size <= DENSE_UP_TO
        self.dense = rows.matrix() if small else None

    def times(self, x: np.ndarray) -> np.ndarray:
        return self.dense @ x if self.dense is not None else _flat(self.rows.times(x))

    def transposed(self, z: np.ndarray) -> np.ndarray:
        if self.dense is not None:
            return self.dense.T @ z
        return self.rows.transposed_times(_split(z, self.like))

    def normal_solver(self, v: np.ndarray):  # type: ignore[no-untyped-def]
        """A solver of (delta I + G' diag(1/v) G) x = b."""
        if self.dense is not None:
            g = self.dense
            normal = g.T @ (g / v[:, None])
            normal[np.diag_indices_from(normal)] += REGULARIZATION
            inverse = np.linalg.inv(normal)
            return lambda b: inverse @ b  # (refined by the caller)
        return self.rows.normal_solver(_split(v, self.like), REGULARIZATION)


def _solve(rows: _Rows | _DenseRows, c: np.ndarray) -> np.ndarray:
    """ECOS's iterations on `rows` with objective c'x; returns X (n, k)."""
    column = rows.equilibrate()
    c = c / column
    h = _flat(rows.h)
    op = _Operator(rows)

    def factor(v: np.ndarray):  # type: ignore[no-untyped-def]
        """Solves [0 G'; G -diag(v)] [dx; dz] = [rx; rz] as ECOS does: regularised,
        [delta I, G'; G, -diag(v + delta)], and refined against that system while the error
        falls (ECOS: at most 9 times, while it falls 6-fold)."""
        vd = v + REGULARIZATION
        normal = op.normal_solver(vd)

        def once(rx: np.ndarray, rz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            dx = normal(rx + op.transposed(rz / vd))
            return dx, (op.times(dx) - rz) / vd

        def solve(rx: np.ndarray, rz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            dx, dz = once(rx, rz)
            limit = (1.0 + max(float(np.abs(rx).max()), float(np.abs(rz).max()))) * 1e-14
            before, last = np.inf, (dx, dz)
            for refinement in range(REFINEMENTS + 1):
                ex = rx - op.transposed(dz) - REGULARIZATION * dx
                ez = rz - op.times(dx) + vd * dz
                err = max(float(np.abs(ex).max()), float(np.abs(ez).max()))
                if refinement > 0 and err > before:  # worse: undo the last refinement
                    dx, dz = last
                    break
                if refinement == REFINEMENTS or err < limit or (refinement > 0 and before < 6 * err):
                    break
                before, last = err, (dx, dz)
                ddx, ddz = once(ex, ez)
                dx, dz = dx + ddx, dz + ddz
            return dx, dz

        return solve

    degree = h.size
    start = factor(np.ones(degree))
    x, minus_r = start(np.zeros(rows.size), h)
    s = _into_cone(-minus_r)
    _, z_start = start(-c, np.zeros(degree))
    z = _into_cone(z_start)
    tau = kap = 1.0
    resx0 = max(1.0, float(np.linalg.norm(c)))
    resz0 = max(1.0, float(np.linalg.norm(h)))
    pres_before, step, since_best = np.nan, 0.0, 0
    best: _Iterate | None = None
    for iteration in range(MAX_ITERATIONS + 1):
        rx = -op.transposed(z)
        hresx = float(np.linalg.norm(rx))
        rx = rx - tau * c
        rz = s + op.times(x) - tau * h
        cx, hz = float(c @ x), float(h @ z)
        rt = kap + cx + hz
        gap = float(s @ z)
        mu = (gap + kap * tau) / (degree + 1)
        nz = float(np.linalg.norm(z))
        pres = float(np.linalg.norm(rz)) / max(
            resz0 + float(np.linalg.norm(x)) + float(np.linalg.norm(s)), 1.0) / tau
        dres = float(np.linalg.norm(rx)) / max(resx0 + nz, 1.0) / tau
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
        v = np.where(z < TINY, s / TINY, s / z)
        w = np.sqrt(v)
        lam = w * z
        solve = factor(v)
        dx1, dz1 = solve(-c, h)
        dx2, dz2 = solve(rx, s - rz)
        denominator = kap / tau - (float(c @ dx1) + float(h @ dz1))
        dtau_affine = (rt - kap + float(c @ dx2) + float(h @ dz2)) / denominator
        w_dz_affine = w * (dz2 + dtau_affine * dz1)
        ds_affine = -w_dz_affine - lam
        dkap_affine = -kap - kap / tau * dtau_affine
        step_affine = _step(lam, ds_affine, w_dz_affine, tau, dtau_affine, kap, dkap_affine)
        sigma = min(max((1 - step_affine) ** 3, SIGMA_MIN), SIGMA_MAX)
        lam_ds = (lam * lam + ds_affine * w_dz_affine - sigma * mu) / lam
        dx2, dz2 = solve((1 - sigma) * rx, -(1 - sigma) * rz + w * lam_ds)
        bkap = kap * tau + dkap_affine * dtau_affine - sigma * mu
        dtau = ((1 - sigma) * rt - bkap / tau + float(c @ dx2) + float(h @ dz2)) / denominator
        dx = dx2 + dtau * dx1
        dz = dz2 + dtau * dz1
        w_dz = w * dz
        ds_w = -(lam_ds + w_dz)
        dkap = -(bkap + kap * dtau) / tau
        step = _step(lam, ds_w, w_dz, tau, dtau, kap, dkap) * GAMMA
        x = x + step * dx
        z = z + step * dz
        s = s + step * w * ds_w
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
        return bool((-self.cx > 0 or -self.hz >= -abstol) and self.pres < feastol
                    and self.dres < feastol and (self.gap < abstol or self.relgap < reltol))

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
        return np.clip((self.x / (column * self.tau))[: n * k].reshape(n, k), 0.0, 1.0)


def _close_enough(
    best: _Iterate | None, rows: _Rows | _DenseRows, column: np.ndarray, why: str
) -> np.ndarray:
    """ECOS's way out when it stalls: its best iterate, if that is optimal to its reduced
    tolerances ("close to optimal"); else no point."""
    if best is None or not best.optimal(1e-4, 5e-5, 5e-5):
        raise NoPoint(why)
    return best.point(rows, column)

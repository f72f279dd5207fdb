"""The allocation Gavel's solver returns for a program with nothing to optimise.

Gavel's `min_total_duration` programs ask cvxpy for *any* X that lets every job finish within a
bound T (`Maximize(1)` over its base constraints), and cvxpy hands that to ECOS. Every feasible
X is then optimal, and which one comes back is wherever ECOS's interior-point path stops; that
point decides how much of each type every job gets, and the simulated JCTs with it (a simplex
corner or another central point moved the mean JCT by 9 to 19% on Gavel's traces).

`feasible_point` reproduces it: ECOS 2.0's method for a linear cone (Domahidi, Chu and Boyd,
ECC 2013; embotech/ecos `ecos.c`, `equil.c`, `cone.c`): three passes of Ruiz equilibration, its
starting point (the least-squares x and the slack brought into the cone), its homogeneous
self-dual embedding and Mehrotra predictor-corrector steps, its step rules and its stopping
test, on the constraint rows cvxpy gives it. ECOS solves its linear systems with a sparse LDL
factorisation, regularisation and iterative refinement; here they are solved exactly with the
structure of Gavel's constraints (each job's k variables are coupled only by its own rows and by
k capacity rows across jobs): k x k blocks per job and a k x k correction for the capacity rows
(Woodbury), O(n k^3) per solve, all numpy. On Gavel's traces the X agrees with ECOS's to 1e-4
and the simulated JCTs to 0.1%.
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


class NoPoint(RuntimeError):
    """The method stopped without a point (its safeguards, or the iteration limit)."""


class _Rows:
    """G (as cvxpy writes the program: s = h - G x >= 0) by blocks, over X of shape (n, k):
    x >= 0 (one row per entry), capacity (one row per type), each job's time (one row per job)
    and each job's throughput (one row per job). Entries are kept as (n, k) arrays."""

    def __init__(self, throughputs: np.ndarray, scale_factors: np.ndarray, num_gpus: np.ndarray,
                 need: np.ndarray) -> None:  # fmt: skip
        n, k = throughputs.shape
        self.nonneg = -np.ones((n, k))
        self.capacity = np.broadcast_to(scale_factors[:, None], (n, k)).astype(np.float64)
        self.time = np.ones((n, k))
        self.rate = -throughputs.astype(np.float64)
        self.h = (np.zeros((n, k)), num_gpus.astype(np.float64), np.ones(n), -need)

    def equilibrate(self) -> np.ndarray:
        """Scale rows and columns as ECOS's Ruiz passes do (h with its rows); returns the
        columns' factors (x = x_scaled / factor)."""
        column = np.ones_like(self.nonneg)
        h_nonneg, h_capacity, h_time, h_rate = self.h
        for _ in range(EQUILIBRATION_PASSES):
            col = np.maximum.reduce([np.abs(self.nonneg), np.abs(self.capacity),
                                     np.abs(self.time), np.abs(self.rate)])  # fmt: skip
            rows = (np.abs(self.nonneg), np.abs(self.capacity).max(axis=0),
                    np.abs(self.time).max(axis=1), np.abs(self.rate).max(axis=1))  # fmt: skip
            col, r_nonneg, r_capacity, r_time, r_rate = (
                np.where(v < 1e-6, 1.0, np.sqrt(v)) for v in (col, *rows)
            )
            self.nonneg = self.nonneg / r_nonneg / col
            self.capacity = self.capacity / r_capacity[None, :] / col
            self.time = self.time / r_time[:, None] / col
            self.rate = self.rate / r_rate[:, None] / col
            h_nonneg, h_capacity = h_nonneg / r_nonneg, h_capacity / r_capacity
            h_time, h_rate = h_time / r_time, h_rate / r_rate
            column = column * col
        self.h = (h_nonneg, h_capacity, h_time, h_rate)
        return column

    # Row vectors are tuples (nonneg (n, k), capacity (k,), time (n,), rate (n,)).

    def times(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        """G x."""
        return (self.nonneg * x, (self.capacity * x).sum(axis=0), (self.time * x).sum(axis=1),
                (self.rate * x).sum(axis=1))  # fmt: skip

    def transposed_times(self, z: tuple[np.ndarray, ...]) -> np.ndarray:
        """G' z."""
        nonneg, capacity, time, rate = z
        return (self.nonneg * nonneg + self.capacity * capacity[None, :]
                + self.time * time[:, None] + self.rate * rate[:, None])  # fmt: skip

    def normal_solver(self, v: tuple[np.ndarray, ...]):  # type: ignore[no-untyped-def]
        """A solver of (G' diag(1/v) G) x = b: per-job k x k blocks (a job's own rows) and the k
        capacity rows added back by the Woodbury identity."""
        v_nonneg, v_capacity, v_time, v_rate = v
        n, k = self.nonneg.shape
        blocks = np.zeros((n, k, k))
        blocks[:, np.arange(k), np.arange(k)] = self.nonneg**2 / v_nonneg
        blocks += np.einsum("ja,jb->jab", self.time, self.time) / v_time[:, None, None]
        blocks += np.einsum("ja,jb->jab", self.rate, self.rate) / v_rate[:, None, None]
        inverse = np.linalg.inv(blocks)
        # U's column t is the capacity row t: entries capacity[j, t] at (j, t).
        inverse_u = inverse * self.capacity[:, None, :]  # (n, k, k): B_j^-1 U_j
        small = np.diag(v_capacity) + np.einsum("ja,jab->ab", self.capacity, inverse_u)
        small_inverse = np.linalg.inv(small)

        def solve(b: np.ndarray) -> np.ndarray:
            y = np.einsum("jab,jb->ja", inverse, b)
            correction = small_inverse @ (self.capacity * y).sum(axis=0)
            return y - np.einsum("jab,b->ja", inverse_u, correction)

        return solve


def _dot(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> float:
    return float(sum(float(np.vdot(x, y)) for x, y in zip(a, b, strict=True)))


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
    """The X ECOS returns (cvxpy's clip to [0, 1] applied) for: find X >= 0 with
    sum_j sf_j X[j, k] <= N_k, sum_k X[j, k] <= 1 and sum_k T[j, k] X[j, k] >= need_j, every
    point being optimal. Raises NoPoint where ECOS would not report one as optimal."""
    rows = _Rows(throughputs, scale_factors, num_gpus, need)
    column = rows.equilibrate()
    h = rows.h
    shape = rows.nonneg.shape
    degree = sum(p.size for p in h)

    def kkt(solver, v, rx, rz):  # type: ignore[no-untyped-def]
        """[0 G'; G -diag(v)] [dx; dz] = [rx; rz]."""
        dx = solver(rx + rows.transposed_times(tuple(r / w for r, w in zip(rz, v, strict=True))))
        gdx = rows.times(dx)
        return dx, tuple((g - r) / w for g, r, w in zip(gdx, rz, v, strict=True))

    ones = tuple(np.ones_like(p) for p in h)
    start = rows.normal_solver(ones)
    x, minus_r = kkt(start, ones, np.zeros(shape), h)
    s = _split(_into_cone(-_flat(minus_r)), h)
    z = _split(_into_cone(np.zeros(degree)), h)  # (c = 0: the dual start is 0, shifted)
    tau = kap = 1.0
    resz0 = max(1.0, float(np.linalg.norm(_flat(h))))
    pres_before = np.nan
    for iteration in range(MAX_ITERATIONS + 1):
        gz = rows.transposed_times(z)
        rx = -gz
        gx = rows.times(x)
        rz = tuple(si + g - tau * hi for si, g, hi in zip(s, gx, h, strict=True))
        hz = _dot(h, z)
        rt = kap + hz
        sf, zf = _flat(s), _flat(z)
        gap = float(sf @ zf)
        mu = (gap + kap * tau) / (degree + 1)
        pres = float(np.linalg.norm(_flat(rz))) / max(
            resz0 + float(np.linalg.norm(x)) + float(np.linalg.norm(sf)), 1.0) / tau
        dres = float(np.linalg.norm(rx)) / max(1.0 + float(np.linalg.norm(zf)), 1.0) / tau
        if iteration > 0 and (pres > 500 * pres_before or gap < 0):
            raise NoPoint("the interior-point method's safeguard stopped it")
        pres_before = pres
        dcost = -hz / tau
        relgap = gap / dcost if dcost > 0 else np.nan
        if (-hz >= -TOLERANCE and pres < TOLERANCE and dres < TOLERANCE
                and (gap < TOLERANCE or relgap < TOLERANCE)):  # fmt: skip
            break
        if iteration == MAX_ITERATIONS:
            raise NoPoint("the interior-point method ran out of iterations")
        v = np.where(zf < TINY, sf / TINY, sf / zf)
        w = np.sqrt(v)
        lam = w * zf
        vs = _split(v, h)
        solver = rows.normal_solver(vs)
        dx1, dz1 = kkt(solver, vs, np.zeros(shape), h)
        dz1f = _flat(dz1)
        dx2, dz2 = kkt(solver, vs, rx, _split(sf - _flat(rz), h))
        denominator = kap / tau - _dot(h, dz1)
        dtau_affine = (rt - kap + _dot(h, dz2)) / denominator
        w_dz_affine = w * (_flat(dz2) + dtau_affine * dz1f)
        ds_affine = -w_dz_affine - lam
        dkap_affine = -kap - kap / tau * dtau_affine
        step_affine = _step(lam, ds_affine, w_dz_affine, tau, dtau_affine, kap, dkap_affine)
        sigma = min(max((1 - step_affine) ** 3, SIGMA_MIN), SIGMA_MAX)
        lam_ds = (lam * lam + ds_affine * w_dz_affine - sigma * mu) / lam
        dx2, dz2 = kkt(solver, vs, (1 - sigma) * rx,
                       _split(-(1 - sigma) * _flat(rz) + w * lam_ds, h))  # fmt: skip
        bkap = kap * tau + dkap_affine * dtau_affine - sigma * mu
        dtau = ((1 - sigma) * rt - bkap / tau + _dot(h, dz2)) / denominator
        dx = dx2 + dtau * dx1
        dz = _flat(dz2) + dtau * dz1f
        w_dz = w * dz
        ds_w = -(lam_ds + w_dz)
        dkap = -(bkap + kap * dtau) / tau
        step = _step(lam, ds_w, w_dz, tau, dtau, kap, dkap) * GAMMA
        x = x + step * dx
        z = _split(zf + step * dz, h)
        s = _split(sf + step * w * ds_w, h)
        kap += step * dkap
        tau += step * dtau
    return np.clip(x / (column * tau), 0.0, 1.0)

"""Gavel's allocation programs as pure functions over numpy arrays.

Every program answers the same question: which fraction of time should each job spend on each GPU
type (and, with space sharing, sharing a GPU with which other job)? They follow the policies in
Gavel's `scheduler/policies/` (stanford-futuredata/gavel) and solve with OR-Tools through
`gpuyard.policies.toolkit.lp`; nothing here does I/O or keeps state between calls (state the
reference keeps inside a policy object, e.g. Gandiva's pairs or AlloX's running jobs, is an input
and an output here).

Inputs, for n jobs and K GPU types:
- `throughputs` T[n, K]: steps/s of the whole job (all its GPUs) on type k; 0 = cannot run there.
- `scale_factors` sf[n]: GPUs the job needs at once; `priority_weights` w[n] > 0 (a larger weight
  asks for a larger share); `num_gpus` N[K]: GPUs of each type.
- `packing` (the `_packed` variants): `Packing(job_types, pair_throughputs)`, where
  `pair_throughputs[a, b, k]` is the steps/s of an a-type job while it shares a type-k GPU with a
  b-type job (0 or NaN = the two may not share). Only jobs with equal scale factors share, as in
  the reference.

Output: `Allocation` with `shares[n, K]` (time alone on each type), `pairs[P, 2]` and
`pair_shares[P, K]` (time two jobs spend together on each type), `objective` (what the program
optimised) and solve statistics. Base constraints everywhere: shares >= 0; each job's shares
(alone and in pairs) sum to <= 1; sum of sf * share (a pair counted once) <= N[k] per type; no
share on a type where the job (or the pair) has throughput 0.

Agnostic baselines. The reference builds its heterogeneity-agnostic policies by calling the aware
program with made-up throughputs: `max_min_fairness` (and its water-filling form) sets every entry
to 1, `finish_time_fairness` and `min_total_duration` copy the V100 column into every type.
`agnostic_throughputs` builds those matrices (`respect_unsupported=True` keeps the zeros of types
a job cannot use, which the reference overwrites).

Exactness and speed: jobs that are interchangeable for a program (same throughputs, scale factor,
weight, and whatever else the program reads) form a class, and the LP is solved over classes with
their multiplicities. The programs are convex and invariant under permuting interchangeable jobs,
so averaging an optimal solution over those permutations gives an optimal solution that treats
them alike: the class LP loses nothing, and identical jobs get identical shares (as the
reference's interior-point solver also returns). With Gavel's 26 job templates the 2,048-job
max-min LP has a few dozen classes.

Space sharing without a variable per job pair. Group jobs by (job type, scale factor). Between two
groups g, h a job's throughput depends only on the partner's group, so a variable y[c, k, h] holds
the time a member of class c spends on type k with some member of group h, and the rows
sum_{c in g} m_c y[c, k, h] = sum_{c in h} m_c y[c, k, g] (both sides count the same pair time)
make it realisable: two nonnegative vectors u, v with equal totals S are the margins of the
nonnegative matrix u_i v_j / S, which is what `Allocation.pairs` reports. Inside a group, and
between two groups where it is no larger (one of them has a single class), there is a variable
per pair of classes instead. This is exact, and for 500 jobs of Gavel's 26 templates it has
~50k variables instead of the ~375k of the reference's variable per job pair (a few hundred when
the jobs also form classes, as in max-min fairness).

Finish-time fairness (Themis) as LPs. rho_j(X) = (t_j + R_j / r_j(X)) / D_j with r_j(X) the job's
throughput under X (linear in X), t_j the time since it started, R_j its remaining steps and
D_j = C_j + R_j / iso_j its finish time under an isolated 1/n share (C_j: isolated time already
accrued). rho_j = (t_j r_j + R_j) / (D_j r_j) is a ratio of two linear functions of X with a
positive denominator, so min_X max_j rho_j is a generalised linear-fractional program. For a fixed
level r the question "max_j rho_j <= r?" is linear: r_j(X) (r D_j - t_j) >= R_j for every j. We
solve it with the Dinkelbach-type method of Crouzeix, Ferland and Schaible (1985): from a feasible
X_k with r_k = max_j rho_j(X_k), solve the LP
    F(r_k) = min_{X, z} z  subject to  (t_j r_j(X) + R_j - r_k D_j r_j(X)) / (D_j r_j(X_k)) <= z,
set X_{k+1} to its solution and r_{k+1} = max_j rho_j(X_{k+1}). F(r) < 0 exactly when r exceeds
the optimum r*, F(r*) = 0, and r_k decreases to r* (superlinearly near it); we stop when F(r_k)
>= -1e-7 r_k (r_k is then optimal to that relative tolerance), typically after 2-5 LPs. The
first X is the isolated allocation.

Ties. Most of these LPs have many optimal allocations (max-min fairness pins only the worst-off
jobs). The reference solves them with ECOS, an interior-point method, which ends near the centre of
the optimal set; a simplex solver ends on a vertex, which for the agnostic baseline can put every
job on one GPU type. With `tie_break="center"` (the default) a second LP keeps every job's
throughput at least where the optimum put it and spreads each job's time as evenly as it can over
the types the job can use (maximise the sum over jobs of their smallest share on a usable type).
Measured against ECOS on Gavel's throughputs (10, 30, 120 jobs on 12 + 12 + 12 GPUs; objectives
agree to solver precision), the mean absolute difference per entry of X falls from 0.33 / 0.20 /
0.018 (vertex) to 0.037 / 0.015 / 0.000 for agnostic max-min fairness, from 0.15 to 0.07 for
heterogeneity-aware max-min fairness at 10 jobs (identical at 30 and 120, where the optimum is
unique), and from 0.12 / 0.23 to 0.08 / 0.10 for finish-time fairness. `tie_break="vertex"` skips
the second LP.

Each program's docstring says where the reference's code differs from its name and
which keyword gives the intended behaviour; the default reproduces the reference.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, cast

import numpy as np
from ortools.graph.python import min_cost_flow

from gpuyard.policies.toolkit.lp import Infeasible, LinearProgram, Solution, SolveError, Solver

from . import interior

__all__ = [
    "ALONE",
    "UNASSIGNED",
    "Allocation",
    "Packing",
    "SolveStats",
    "agnostic_throughputs",
    "allox",
    "finish_time_fairness",
    "gandiva",
    "isolated",
    "isolated_throughputs",
    "max_min_fairness",
    "max_min_fairness_water_filling",
    "max_sum_throughput",
    "max_sum_throughput_normalized_by_cost",
    "min_total_duration",
    "proportional_throughputs",
]

ALONE = -1
"""`gandiva` state: the job was placed on its own."""
UNASSIGNED = -2
"""`gandiva` state: the job has no placement yet (new, or its partner left)."""

_ZERO = 1e-12  # solver noise below this is treated as 0 in shares


# ------------------------------------------------------------------------------------------------
# Inputs and outputs


@dataclass(frozen=True)
class Packing:
    """Space sharing (the `_packed` variants and `gandiva`): job types and pair throughputs.

    `job_types[j]` indexes the first two axes of `pair_throughputs[a, b, k]`: steps/s of an a-type
    job while it shares one type-k GPU with a b-type job (so `[b, a, k]` is the partner's rate).
    0 or NaN = the pair may not share that type (the reference needs an entry for every pair and
    fails on a missing one)."""

    job_types: np.ndarray
    pair_throughputs: np.ndarray


@dataclass
class SolveStats:
    """Where a program's time went."""

    build_seconds: float = 0.0
    """Everything outside the solver: arrays, the model proto, reading and expanding results."""
    solve_seconds: float = 0.0
    """Inside the solver calls (including handing the model over)."""
    num_solves: int = 0
    optimal: bool = True
    """False when a time limit stopped a solve with a feasible but unproven solution."""
    fallback: str | None = None
    """What the program did instead when a solve failed (the reference's own fallbacks)."""

    def record(self, solution: Solution) -> None:
        self.solve_seconds += solution.solve_seconds
        self.num_solves += 1
        self.optimal &= solution.optimal


@dataclass(frozen=True)
class Allocation:
    """Fractions of time: `shares[j, k]` job j alone on type k; `pair_shares[p, k]` jobs
    `pairs[p] = (i, j)` (i < j) together on type k."""

    shares: np.ndarray
    pairs: np.ndarray
    pair_shares: np.ndarray
    objective: float
    stats: SolveStats = field(default_factory=SolveStats)

    def job_time(self) -> np.ndarray:
        """Total time share of each job (alone and in pairs), shape [n]."""
        total: np.ndarray = self.shares.sum(axis=1)
        if self.pairs.size:
            per_pair = self.pair_shares.sum(axis=1)
            np.add.at(total, self.pairs[:, 0], per_pair)
            np.add.at(total, self.pairs[:, 1], per_pair)
        return total

    def job_throughputs(
        self, throughputs: np.ndarray, packing: Packing | None = None
    ) -> np.ndarray:
        """Each job's steps/s under this allocation, shape [n]."""
        rate: np.ndarray = (np.asarray(throughputs, dtype=np.float64) * self.shares).sum(axis=1)
        if self.pairs.size:
            if packing is None:
                raise ValueError("this allocation has pairs: pass the Packing it was computed with")
            types = np.asarray(packing.job_types)
            table = np.nan_to_num(np.asarray(packing.pair_throughputs, dtype=np.float64))
            first, second = self.pairs[:, 0], self.pairs[:, 1]
            np.add.at(rate, first, (table[types[first], types[second]] * self.pair_shares).sum(1))
            np.add.at(rate, second, (table[types[second], types[first]] * self.pair_shares).sum(1))
        return rate


def _empty_pairs(num_types: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((0, 2), dtype=np.int64), np.zeros((0, num_types))


def _float_array(value: object, name: str, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: values must be finite")
    return array + 0.0  # turns -0.0 into 0.0 so that equal jobs compare equal bytewise


@dataclass(frozen=True)
class _Jobs:
    throughputs: np.ndarray
    scale_factors: np.ndarray
    weights: np.ndarray
    num_gpus: np.ndarray

    @property
    def n(self) -> int:
        return cast(int, self.throughputs.shape[0])

    @property
    def k(self) -> int:
        return cast(int, self.throughputs.shape[1])


def _jobs(
    throughputs: object,
    scale_factors: object,
    num_gpus: object,
    priority_weights: object | None = None,
) -> _Jobs:
    t = np.asarray(throughputs, dtype=np.float64)
    if t.ndim != 2:
        raise ValueError(f"throughputs: expected a [jobs, gpu types] matrix, got shape {t.shape}")
    n, k = t.shape
    t = _float_array(t, "throughputs", (n, k))
    if np.any(t < 0):
        raise ValueError("throughputs: must be >= 0 (0 = the job cannot run on that type)")
    sf = _float_array(scale_factors, "scale_factors", (n,))
    if np.any(sf < 1) or np.any(sf != np.round(sf)):
        raise ValueError("scale_factors: must be whole numbers >= 1")
    gpus = _float_array(num_gpus, "num_gpus", (k,))
    if np.any(gpus < 0):
        raise ValueError("num_gpus: must be >= 0")
    w = (
        np.ones(n)
        if priority_weights is None
        else _float_array(priority_weights, "priority_weights", (n,))
    )
    if np.any(w <= 0):
        raise ValueError("priority_weights: must be > 0")
    return _Jobs(t, sf, w, gpus)


def _per_job(value: object, name: str, n: int, *, allow_negative: bool = False) -> np.ndarray:
    array = _float_array(value, name, (n,))
    if not allow_negative and np.any(array < 0):
        raise ValueError(f"{name}: must be >= 0")
    return array


# ------------------------------------------------------------------------------------------------
# Closed-form allocations and helpers


def agnostic_throughputs(
    throughputs: np.ndarray,
    reference_type: int | None = None,
    *,
    respect_unsupported: bool = False,
) -> np.ndarray:
    """The made-up throughputs of the reference's heterogeneity-agnostic baselines.

    `reference_type=None`: every entry 1 (Gavel's `max_min_fairness` and water-filling);
    an index k: column k copied into every type (Gavel's `finish_time_fairness` and
    `min_total_duration` use V100). The reference writes these values also where the job cannot
    run (throughput 0), so an agnostic allocation can give time on a type where the job makes no
    progress; `respect_unsupported=True` keeps those entries 0."""
    t = np.asarray(throughputs, dtype=np.float64)
    if reference_type is None:
        made_up = np.ones_like(t)
    else:
        made_up = np.repeat(t[:, [reference_type]], t.shape[1], axis=1)
    return np.where(t > 0, made_up, 0.0) if respect_unsupported else made_up


def proportional_throughputs(throughputs: np.ndarray, num_gpus: np.ndarray) -> np.ndarray:
    """Each job's throughput under an equal share of every type (Gavel's `ProportionalPolicy`):
    sum_k T[j, k] N[k] / sum N. The reference normalises each row to sum 1 whatever the job
    count, so this does not depend on how many jobs there are (nor on scale factors)."""
    t = np.asarray(throughputs, dtype=np.float64)
    gpus = np.asarray(num_gpus, dtype=np.float64)
    total = gpus.sum()
    return t @ gpus / total if total > 0 else np.zeros(t.shape[0])


def _isolated_shares(
    num_jobs: int, scale_factors: np.ndarray, num_gpus: np.ndarray, mask: np.ndarray | None = None
) -> np.ndarray:
    shares = np.broadcast_to(num_gpus / max(num_jobs, 1), (num_jobs, num_gpus.size))
    shares = shares / scale_factors[:, None]
    if mask is not None:
        shares = np.where(mask, shares, 0.0)
    return cast(np.ndarray, shares / np.maximum(shares.sum(axis=1), 1.0)[:, None])


def isolated(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    *,
    skip_unsupported: bool = False,
) -> Allocation:
    """Gavel's `isolated`: every job gets N[k] / n of each type, divided by its scale factor, and
    rows scaled down to sum to at most 1. The reference ignores throughputs, so a job also gets
    time on a type where it cannot run; `skip_unsupported=True` leaves those entries 0."""
    jobs = _jobs(throughputs, scale_factors, num_gpus)
    mask = jobs.throughputs > 0 if skip_unsupported else None
    shares = _isolated_shares(jobs.n, jobs.scale_factors, jobs.num_gpus, mask)
    pairs, pair_shares = _empty_pairs(jobs.k)
    return Allocation(shares, pairs, pair_shares, objective=float("nan"))


def isolated_throughputs(
    throughputs: np.ndarray, scale_factors: np.ndarray, num_gpus: np.ndarray
) -> np.ndarray:
    """Each job's steps/s under `isolated` (the reference's yardstick for finish-time fairness)."""
    jobs = _jobs(throughputs, scale_factors, num_gpus)
    shares = _isolated_shares(jobs.n, jobs.scale_factors, jobs.num_gpus)
    return cast(np.ndarray, (jobs.throughputs * shares).sum(axis=1))


# ------------------------------------------------------------------------------------------------
# Classes of interchangeable jobs and the shared LP skeleton


def _concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each (s, l), without a Python loop."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return cast(
        np.ndarray, np.repeat(starts.astype(np.int64), lengths) + np.arange(total) - offsets
    )


def _matching_pairs(keys_a: np.ndarray, keys_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (i, j) with keys_a[i] == keys_b[j] (a join on equal keys), vectorised."""
    order_a = np.argsort(keys_a, kind="stable")
    order_b = np.argsort(keys_b, kind="stable")
    sorted_b = keys_b[order_b]
    lo = np.searchsorted(sorted_b, keys_a[order_a], side="left")
    hi = np.searchsorted(sorted_b, keys_a[order_a], side="right")
    counts = hi - lo
    first = np.repeat(order_a, counts)
    second = order_b[_concat_ranges(lo, counts)]
    return first, second


@dataclass
class _Classes:
    of_job: np.ndarray  # [n] class of each job
    members: np.ndarray  # [C] multiplicity
    representative: np.ndarray  # [C] one job of the class
    job_order: np.ndarray  # jobs sorted by class
    start: np.ndarray  # [C] offset of the class in job_order

    @property
    def count(self) -> int:
        return self.members.size


def _classes(features: np.ndarray) -> _Classes:
    """Jobs with identical feature rows form a class (classes sorted by features, members by job
    index). A lexicographic sort of the columns: much faster than np.unique(axis=0)."""
    n = features.shape[0]
    order = np.lexsort(features.T[::-1]) if n else np.zeros(0, dtype=np.int64)
    ordered = features[order]
    first = np.ones(n, dtype=bool)
    first[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    class_of_sorted = np.cumsum(first) - 1
    of_job = np.empty(n, dtype=np.int64)
    of_job[order] = class_of_sorted
    start = np.flatnonzero(first)
    members = np.diff(np.append(start, n))
    return _Classes(of_job, members, order[first], order, start)


@dataclass
class _Skeleton:
    """The variables and base rows every program shares, over classes of jobs. Programs extend a
    `lp.copy()` of it.

    Rate terms: class `rate_rows[i]` earns `rate_tput[i]` steps/s per unit of variable
    `rate_cols[i]` on GPU type `rate_type[i]`; a program scales them into its own rows."""

    lp: LinearProgram
    classes: _Classes
    throughputs: np.ndarray  # [C, K]
    scale_factors: np.ndarray  # [C]
    num_gpus: np.ndarray  # [K]
    single: np.ndarray  # [C, K] variable indices
    rate_rows: np.ndarray
    rate_cols: np.ndarray
    rate_tput: np.ndarray
    rate_type: np.ndarray
    peak_throughput: np.ndarray  # [C] largest steps/s of any of the class's variables
    can_run: np.ndarray  # [C] some variable gives it steps/s on a type that has GPUs
    pairing: _Pairing | None = None

    def rates(self, values: np.ndarray, factor: np.ndarray | None = None) -> np.ndarray:
        """Per-class steps/s under variable values (each term scaled by factor[class])."""
        coef = self.rate_tput if factor is None else self.rate_tput * factor[self.rate_rows]
        return np.bincount(
            self.rate_rows, weights=coef * values[self.rate_cols], minlength=self.classes.count
        )

    def add_rate_rows(
        self,
        lp: LinearProgram,
        factor: np.ndarray,
        rows_for: np.ndarray,
        extra_cols: np.ndarray | None = None,
        extra_coefs: np.ndarray | float | None = None,
        *,
        lb: float | np.ndarray = -math.inf,
        ub: float | np.ndarray = math.inf,
    ) -> np.ndarray:
        """One row per class in `rows_for`: sum factor[c] * rate terms of c (+ an extra term per
        row, e.g. an epigraph variable), bounded by lb/ub."""
        position = np.full(self.classes.count, -1, dtype=np.int64)
        position[rows_for] = np.arange(rows_for.size)
        keep = position[self.rate_rows] >= 0
        rows = position[self.rate_rows[keep]]
        cols = self.rate_cols[keep]
        coefs = self.rate_tput[keep] * factor[self.rate_rows[keep]]
        if extra_cols is not None:
            assert extra_coefs is not None  # (an extra term has its coefficients)
            rows = np.concatenate([rows, np.arange(rows_for.size)])
            cols = np.concatenate([cols, np.broadcast_to(extra_cols, rows_for.shape)])
            coefs = np.concatenate([coefs, np.broadcast_to(extra_coefs, rows_for.shape)])
        return lp.add_constraints(rows, cols, coefs, lb=lb, ub=ub, num_rows=rows_for.size)


@dataclass
class _Pairing:
    """Space-sharing variables. `pair_*`: a variable per (class pair, type), the time each member
    pair spends together. `partner_*`: a variable per (class, type, partner group), the time a
    member spends with some member of that group (see the module docstring)."""

    group_of_class: np.ndarray
    pair_first: np.ndarray
    pair_second: np.ndarray
    pair_type: np.ndarray
    pair_var: np.ndarray
    partner_class: np.ndarray
    partner_type: np.ndarray
    partner_group: np.ndarray
    partner_var: np.ndarray


@dataclass
class _Terms:
    """COO pieces of the share rows, capacity rows and rate terms, collected as variables appear."""

    share: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    capacity: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    rate: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)

    @staticmethod
    def joined(parts: Sequence[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
        return tuple(np.concatenate(column) for column in zip(*parts, strict=True))


def _block_product(
    start_a: np.ndarray, size_a: np.ndarray, start_b: np.ndarray, size_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each block q, every (start_a[q] + i, start_b[q] + j), i < size_a[q], j < size_b[q];
    returns (q, first position, second position)."""
    sizes = (size_a * size_b).astype(np.int64)
    block = np.repeat(np.arange(sizes.size), sizes)
    offset = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    width = size_b[block]
    return block, start_a[block] + offset // width, start_b[block] + offset % width


def _skeleton(jobs: _Jobs, packing: Packing | None, features: list[np.ndarray]) -> _Skeleton:
    """Classes, share/capacity rows and rate terms for `jobs`, with space sharing if `packing`."""
    n, num_types = jobs.n, jobs.k
    columns = [jobs.scale_factors[:, None], jobs.throughputs]
    columns += [np.asarray(f, dtype=np.float64).reshape(n, 1) for f in features]
    if packing is not None:
        _check_packing(packing, n, num_types)
        columns.append(np.asarray(packing.job_types, dtype=np.float64)[:, None])
    classes = _classes(np.concatenate(columns, axis=1))
    rep = classes.representative
    count = classes.count
    tput = jobs.throughputs[rep]
    sf = jobs.scale_factors[rep]
    members = classes.members.astype(np.float64)
    lp = LinearProgram()
    terms = _Terms()

    single = lp.add_variables((count, num_types), ub=np.where(tput > 0, 1.0, 0.0))
    single_class = np.repeat(np.arange(count), num_types)
    single_type = np.tile(np.arange(num_types), count)
    terms.share.append((single_class, single.ravel(), np.ones(single.size)))
    terms.capacity.append((single_type, single.ravel(), (members * sf)[single_class]))
    terms.rate.append((single_class, single.ravel(), tput.ravel(), single_type))
    peak = tput.max(axis=1) if num_types else np.zeros(count)
    pairing = None
    if packing is not None:
        pairing = _add_pairing(
            lp, terms, packing, np.asarray(packing.job_types)[rep], tput, sf, members, peak
        )

    lp.add_constraints(*_Terms.joined(terms.share), ub=1.0, num_rows=count)
    lp.add_constraints(*_Terms.joined(terms.capacity), ub=jobs.num_gpus, num_rows=num_types)
    rate_rows, rate_cols, rate_tput, rate_type = _Terms.joined(terms.rate)
    useful = (rate_tput > 0) & (jobs.num_gpus[rate_type] > 0)
    can_run = np.bincount(rate_rows[useful], minlength=count) > 0
    return _Skeleton(
        lp=lp,
        classes=classes,
        throughputs=tput,
        scale_factors=sf,
        num_gpus=jobs.num_gpus,
        single=single,
        rate_rows=rate_rows,
        rate_cols=rate_cols,
        rate_tput=rate_tput,
        rate_type=rate_type,
        peak_throughput=peak,
        can_run=can_run,
        pairing=pairing,
    )


def _check_packing(packing: Packing, n: int, num_types: int) -> None:
    job_types = np.asarray(packing.job_types)
    if job_types.shape != (n,) or not np.issubdtype(job_types.dtype, np.integer):
        raise ValueError(f"packing.job_types: expected {n} integers")
    table = np.asarray(packing.pair_throughputs, dtype=np.float64)
    if table.ndim != 3 or table.shape[0] != table.shape[1] or table.shape[2] != num_types:
        raise ValueError(
            f"packing.pair_throughputs: expected shape [types, types, {num_types}], "
            f"got {table.shape}"
        )
    if job_types.size and (job_types.min() < 0 or job_types.max() >= table.shape[0]):
        raise ValueError("packing.job_types: a type indexes no row of pair_throughputs")
    if np.any(np.nan_to_num(table, nan=0.0) < 0) or np.any(np.isinf(table)):
        raise ValueError("packing.pair_throughputs: must be finite and >= 0 (NaN = not measured)")


def _add_pairing(
    lp: LinearProgram,
    terms: _Terms,
    packing: Packing,
    class_type: np.ndarray,
    tput: np.ndarray,
    sf: np.ndarray,
    members: np.ndarray,
    peak: np.ndarray,
) -> _Pairing:
    """Space-sharing variables and their terms (module docstring). Jobs in the same group
    (job type, scale factor) are paired through a variable per class pair; two groups through a
    variable per (class, partner group) unless a variable per class pair is no more (one group
    has a single class, or both have two)."""
    count, num_types = tput.shape
    table = np.nan_to_num(np.asarray(packing.pair_throughputs, dtype=np.float64), nan=0.0)
    runnable = tput.max(axis=1) > 0 if num_types else np.zeros(count, dtype=bool)
    groups, group_of_class = np.unique(np.stack([class_type, sf]), axis=1, return_inverse=True)
    group_of_class = group_of_class.ravel()
    group_type, group_sf = groups[0].astype(np.int64), groups[1]
    num_groups = group_type.size
    # pairable[g, h, k]: members of g and h may share a type-k GPU (both rates > 0, same sf)
    both = (table > 0) & (np.transpose(table, (1, 0, 2)) > 0)
    pairable = both[group_type][:, group_type] & (group_sf[:, None] == group_sf[None, :])[..., None]
    by_group = np.argsort(group_of_class, kind="stable")
    group_size = np.bincount(group_of_class, minlength=num_groups)
    group_start = np.cumsum(group_size) - group_size
    low, high = np.nonzero(np.triu(pairable.any(axis=2)))
    per_pair = (low == high) | (
        group_size[low] * group_size[high] <= group_size[low] + group_size[high]
    )
    per_pair_groups = np.zeros((num_groups, num_groups), dtype=bool)
    per_pair_groups[low[per_pair], high[per_pair]] = True
    per_pair_groups |= per_pair_groups.T

    # -- a variable per (class pair, type) ---------------------------------------------------------
    g, h = low[per_pair], high[per_pair]
    block, a, b = _block_product(group_start[g], group_size[g], group_start[h], group_size[h])
    first, second = by_group[a], by_group[b]
    same_class = first == second
    keep = ((g[block] != h[block]) | (a <= b)) & runnable[first] & runnable[second]
    pair_count = np.where(
        same_class, members[first] * (members[first] - 1) / 2, members[first] * members[second]
    )
    keep &= pair_count > 0
    first, second, same_class, pair_count = (
        first[keep],
        second[keep],
        same_class[keep],
        pair_count[keep],
    )
    index, pair_type = np.nonzero(pairable[group_of_class[first], group_of_class[second]])
    first, second, same_class, pair_count = (
        first[index],
        second[index],
        same_class[index],
        pair_count[index],
    )
    pair_var = lp.add_variables(index.size, ub=1.0)
    rate_first = table[class_type[first], class_type[second], pair_type]
    rate_second = table[class_type[second], class_type[first], pair_type]
    partners_of_first = np.where(same_class, members[first] - 1, members[second])
    partners_of_second = members[first]
    other = ~same_class
    terms.share += [
        (first, pair_var, partners_of_first),
        (second[other], pair_var[other], partners_of_second[other]),
    ]
    terms.capacity.append((pair_type, pair_var, pair_count * sf[first]))
    terms.rate += [
        (first, pair_var, partners_of_first * rate_first, pair_type),
        (
            second[other],
            pair_var[other],
            partners_of_second[other] * rate_second[other],
            pair_type[other],
        ),
    ]
    np.maximum.at(peak, first, rate_first)
    np.maximum.at(peak, second, rate_second)

    # -- a variable per (class, type, partner group) with balance rows -------------------------
    candidate = np.transpose(pairable[group_of_class], (0, 2, 1)).copy()  # [C, K, G]
    candidate &= ~per_pair_groups[group_of_class][:, None, :]
    candidate &= runnable[:, None, None]
    partner_class, partner_type, partner_group = np.nonzero(candidate)
    partner_var = lp.add_variables(partner_class.size, ub=1.0)
    rate = table[class_type[partner_class], group_type[partner_group], partner_type]
    terms.share.append((partner_class, partner_var, np.ones(partner_var.size)))
    terms.capacity.append(
        (partner_type, partner_var, 0.5 * members[partner_class] * sf[partner_class])
    )
    terms.rate.append((partner_class, partner_var, rate, partner_type))
    np.maximum.at(peak, partner_class, rate)
    if partner_var.size:
        own = group_of_class[partner_class]
        key = (
            np.minimum(own, partner_group) * num_groups + np.maximum(own, partner_group)
        ) * num_types + partner_type
        _, balance_row = np.unique(key, return_inverse=True)
        sign = np.where(own < partner_group, 1.0, -1.0)
        lp.add_constraints(
            balance_row.ravel(), partner_var, sign * members[partner_class], lb=0.0, ub=0.0
        )
    return _Pairing(
        group_of_class,
        first,
        second,
        pair_type,
        pair_var,
        partner_class,
        partner_type,
        partner_group,
        partner_var,
    )


def _member_pairs(
    first_class: np.ndarray, second_class: np.ndarray, classes: _Classes
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every job pair (i in first class, j in second class, i != j) for each class pair p;
    returns (p, min(i, j), max(i, j)). A class paired with itself gives each pair once."""
    block, a, b = _block_product(
        classes.start[first_class],
        classes.members[first_class],
        classes.start[second_class],
        classes.members[second_class],
    )
    i, j = classes.job_order[a], classes.job_order[b]
    keep = np.where(first_class[block] == second_class[block], i < j, True)
    i, j = i[keep], j[keep]
    return block[keep], np.minimum(i, j), np.maximum(i, j)


def _expand(
    skeleton: _Skeleton, values: np.ndarray, num_types: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Class-level solution -> (shares[n, K], pairs[P, 2], pair_shares[P, K])."""
    values = np.clip(values, 0.0, 1.0)
    values[values < _ZERO] = 0.0
    shares = values[skeleton.single][skeleton.classes.of_job]
    pairing = skeleton.pairing
    if pairing is None:
        return (shares, *_empty_pairs(num_types))
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    together = values[pairing.pair_var]
    used = together > 0
    if used.any():
        block, i, j = _member_pairs(
            pairing.pair_first[used], pairing.pair_second[used], skeleton.classes
        )
        parts.append((i, j, pairing.pair_type[used][block], together[used][block]))

    with_group = values[pairing.partner_var]
    used = with_group > 0
    if used.any():
        cls, k, partner = (
            pairing.partner_class[used],
            pairing.partner_type[used],
            pairing.partner_group[used],
        )
        time_with = with_group[used]
        own = pairing.group_of_class[cls]
        num_groups = int(pairing.group_of_class.max()) + 1
        # the lower group's side and the higher group's side of one (low, high, type) pair time
        key = (np.minimum(own, partner) * num_groups + np.maximum(own, partner)) * num_types + k
        low_side = np.flatnonzero(own < partner)
        high_side = np.flatnonzero(own > partner)
        ia, ib = _matching_pairs(key[low_side], key[high_side])
        a, b = low_side[ia], high_side[ib]
        members = skeleton.classes.members.astype(np.float64)
        total_key, total_of = np.unique(key[low_side], return_inverse=True)
        totals = np.bincount(total_of.ravel(), weights=members[cls[low_side]] * time_with[low_side])
        share = time_with[a] * time_with[b] / totals[np.searchsorted(total_key, key[a])]
        block, i, j = _member_pairs(cls[a], cls[b], skeleton.classes)
        parts.append((i, j, k[a][block], share[block]))

    if not parts:
        return (shares, *_empty_pairs(num_types))
    i, j, k, share = (np.concatenate(column) for column in zip(*parts, strict=True))
    n = shares.shape[0]
    pair_key, pair_of = np.unique(i * n + j, return_inverse=True)
    pair_shares = np.zeros((pair_key.size, num_types))
    np.add.at(pair_shares, (pair_of.ravel(), k), share)
    pairs = np.stack([pair_key // n, pair_key % n], axis=1)
    return shares, pairs, pair_shares


def _solve(
    lp: LinearProgram, stats: SolveStats, solver: Solver | None, time_limit: float | None
) -> Solution:
    started = time.perf_counter()
    try:
        solution = lp.solve(solver, time_limit=time_limit)
    except SolveError:
        stats.solve_seconds += time.perf_counter() - started
        stats.num_solves += 1
        raise
    stats.record(solution)
    return solution


def _finish(
    skeleton: _Skeleton,
    values: np.ndarray,
    objective: float,
    stats: SolveStats,
    started: float,
    num_types: int,
) -> Allocation:
    shares, pairs, pair_shares = _expand(skeleton, values, num_types)
    elapsed = time.perf_counter() - started
    stats.build_seconds = max(elapsed - stats.solve_seconds, 0.0)
    return Allocation(shares, pairs, pair_shares, float(objective), stats)


def _nothing(jobs: _Jobs, objective: float = float("nan")) -> Allocation:
    pairs, pair_shares = _empty_pairs(jobs.k)
    return Allocation(np.zeros((jobs.n, jobs.k)), pairs, pair_shares, objective)


def _ecos_allocation(
    jobs: _Jobs, taking_part: np.ndarray, point: Callable[[], np.ndarray], objective: float,
    stats: SolveStats, started: float,
) -> Allocation | None:  # fmt: skip
    """`point()`, ECOS's X for the jobs `taking_part` (the others get nothing), as an allocation;
    None where ECOS would report no optimum either (`stats.fallback` says so): the caller's
    central point instead."""
    shares = np.zeros((jobs.n, jobs.k))
    try:
        shares[taking_part] = point()
    except interior.NoPoint as exc:
        stats.fallback = f"{exc}: the central allocation instead"
        return None
    pairs, pair_shares = _empty_pairs(jobs.k)
    stats.build_seconds = time.perf_counter() - started
    return Allocation(shares, pairs, pair_shares, objective, stats)


TieBreak = Literal["center", "vertex"]
_KEEP = 1e-9  # relative slack on the throughputs (and objective) a tie-break must keep


def _check_tie_break(tie_break: str) -> None:
    if tie_break not in ("center", "vertex"):
        raise ValueError(f"tie_break: 'center' or 'vertex', not {tie_break!r}")


def _spread(
    skeleton: _Skeleton,
    face: LinearProgram,
    stats: SolveStats,
    solver: Solver | None,
    time_limit: float | None,
) -> Solution:
    """Solve `face` maximising sum_c m_c min_k x[c, k] over the types class c can use: each job's
    time spread as evenly over its types as the constraints allow."""
    lp = face.copy()
    usable = (skeleton.throughputs > 0) & (skeleton.num_gpus > 0)[None, :]
    cls, k = np.nonzero(usable)
    spread = lp.add_variables(skeleton.classes.count, ub=np.where(usable.any(axis=1), 1.0, 0.0))
    lp.add_constraints(
        np.repeat(np.arange(cls.size), 2),
        np.stack([spread[cls], skeleton.single[cls, k]], axis=1).ravel(),
        np.tile([1.0, -1.0], cls.size),
        ub=0.0,
        num_rows=cls.size,
    )
    lp.set_objective(spread, skeleton.classes.members.astype(np.float64), maximize=True)
    return _solve(lp, stats, solver, time_limit)


def _tie_break(
    skeleton: _Skeleton,
    values: np.ndarray,
    tie_break: TieBreak,
    stats: SolveStats,
    solver: Solver | None,
    time_limit: float | None,
    face: LinearProgram | None = None,
) -> np.ndarray:
    """Among allocations that give every job at least its throughput under `values` (and satisfy
    `face`, default the base constraints), the one `_spread` picks; `values` if that fails."""
    if tie_break == "vertex":
        return values
    face = (skeleton.lp if face is None else face).copy()
    rates = skeleton.rates(values)
    rows = np.flatnonzero(rates > 0)
    skeleton.add_rate_rows(
        face, np.ones(skeleton.classes.count), rows, lb=rates[rows] * (1 - _KEEP)
    )
    try:
        return _spread(skeleton, face, stats, solver, time_limit).values
    except SolveError:
        stats.fallback = "tie-break LP failed: kept the solver's vertex"
        return values


# ------------------------------------------------------------------------------------------------
# Max-min fairness


def max_min_fairness(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    priority_weights: np.ndarray,
    num_gpus: np.ndarray,
    *,
    packing: Packing | None = None,
    tie_break: TieBreak | Literal["interior"] = "center",
    solver: Solver | None = None,
    time_limit: float | None = None,
) -> Allocation:
    """Gavel's `max_min_fairness_perf` (with `packing`: `max_min_fairness_packed`): maximise
    min_j sf_j r_j(X) / (w_j p_j), r_j the job's steps/s under X and p_j its proportional-share
    throughput (`proportional_throughputs`). `objective` is that minimum.

    The agnostic `max_min_fairness` (LAS) is this program on `agnostic_throughputs(T)` (all 1).
    A job that can run nowhere (p_j = 0) is left out of the minimum and gets nothing (the
    reference divides by zero). Among the optimal allocations, `tie_break="interior"` returns
    the one the reference's solver (ECOS) returns (`interior.max_min_point`; unpacked only)."""
    started = time.perf_counter()
    jobs = _jobs(throughputs, scale_factors, num_gpus, priority_weights)
    if jobs.n == 0:
        return _nothing(jobs, objective=0.0)
    stats = SolveStats()
    prop = proportional_throughputs(jobs.throughputs, jobs.num_gpus)
    if tie_break == "interior":
        if packing is not None:
            raise ValueError("tie_break 'interior' is the reference's answer for the unpacked "
                             "programs: use 'center' or 'vertex' with packing")  # fmt: skip
        try:
            return _max_min_interior(jobs, prop, stats, started)
        except interior.NoPoint as exc:  # ECOS would report no optimum either: ours, central
            stats.fallback = f"{exc}: the central allocation instead"
            tie_break = "center"
    _check_tie_break(tie_break)
    skeleton = _skeleton(jobs, packing, [jobs.weights])
    rep = skeleton.classes.representative
    active = np.flatnonzero((prop[rep] > 0) & skeleton.can_run)
    if active.size == 0:
        return _nothing(jobs)
    factor = np.zeros(skeleton.classes.count)
    factor[active] = skeleton.scale_factors[active] / (
        jobs.weights[rep[active]] * prop[rep[active]]
    )
    lp = skeleton.lp.copy()
    level = lp.add_variables(1)
    skeleton.add_rate_rows(lp, -factor, active, extra_cols=level[0], extra_coefs=1.0, ub=0.0)
    lp.set_objective(level, 1.0, maximize=True)
    solution = _solve(lp, stats, solver, time_limit)
    values = _tie_break(skeleton, solution.values, tie_break, stats, solver, time_limit)
    return _finish(skeleton, values, solution.objective, stats, started, jobs.k)


def _max_min_interior(jobs: _Jobs, prop: np.ndarray, stats: SolveStats, started: float
                      ) -> Allocation:  # fmt: skip
    """`max_min_fairness` as ECOS solves the reference's program, over the jobs that can run."""
    active = prop > 0
    weighted = (
        jobs.throughputs[active]
        * (jobs.scale_factors[active] / (jobs.weights[active] * prop[active]))[:, None]
    )
    shares = np.zeros((jobs.n, jobs.k))
    pairs, pair_shares = _empty_pairs(jobs.k)
    if not active.any():
        return Allocation(shares, pairs, pair_shares, objective=float("nan"))
    shares[active] = interior.max_min_point(weighted, jobs.scale_factors[active], jobs.num_gpus)
    level = float((weighted * shares[active]).sum(axis=1).min())
    stats.build_seconds = time.perf_counter() - started
    return Allocation(shares, pairs, pair_shares, level, stats)


def max_min_fairness_water_filling(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    priority_weights: np.ndarray,
    num_gpus: np.ndarray,
    *,
    packing: Packing | None = None,
    bottleneck_test: Literal["reference", "exact"] = "reference",
    tie_break: TieBreak | Literal["interior"] = "center",
    solver: Solver | None = None,
    milp_solver: Solver | None = None,
    time_limit: float | None = None,
) -> Allocation:
    """Gavel's `max_min_fairness_water_filling_perf` (`_packed` with `packing`; the agnostic form
    on `agnostic_throughputs(T)`): max-min fairness, then raise whoever can still be raised.

    Level of job j: e_j(X) = r_j(X) / p_j (normalised throughput, no scale factor). Each
    iteration (1) solves the LP max t s.t. t <= (sf_j / w_j)(e_j - s_j) for unfrozen jobs,
    t <= M if any job is frozen, e_j >= its level so far (frozen jobs: their final level), with
    M = max_j,k sf_j T[j,k] / p_j; every unfrozen job's level s_j rises by t w_j / sf_j;
    (2) finds the bottlenecks, the unfrozen jobs that cannot rise while everyone keeps their
    level; (3) freezes them. It stops when nothing new freezes; the allocation is the last LP's.
    `objective` is the first LP's level (= `max_min_fairness`'s).

    `bottleneck_test="reference"` finds bottlenecks as Gavel does, with one MILP: binary z_j
    (0 for frozen jobs), maximise the number of z_j = 1, where z_j = 1 forces
    e_j >= 1.0001 s_j and z_j = 0 forces e_j <= 1.0001 s_j - 1e-5. Quirk: z_j = 0 needs
    1.0001 s_j - 1e-5 >= s_j, i.e. s_j >= 0.1, so when any job's level is below 0.1 the MILP is
    infeasible and the reference silently freezes everyone at the first level (its result is
    then plain max-min fairness). `"exact"` (intended) asks LPs instead: maximise the sum of the
    unfrozen jobs' rises (each capped small) while everyone keeps their level; jobs that rose can
    rise, and the LP is repeated on the rest until none rises, so a job freezes exactly when it
    cannot rise at all (to 1e-6 of its level), at any level.

    The last LP has a face of optima; `tie_break="interior"` returns the point the reference's
    solver (ECOS) returns on it (`interior.water_filling_point`; unpacked only)."""
    started = time.perf_counter()
    jobs = _jobs(throughputs, scale_factors, num_gpus, priority_weights)
    if bottleneck_test not in ("reference", "exact"):
        raise ValueError(f"bottleneck_test: 'reference' or 'exact', not {bottleneck_test!r}")
    if tie_break == "interior" and packing is not None:
        raise ValueError("tie_break 'interior' is the reference's answer for the unpacked "
                         "programs: use 'center' or 'vertex' with packing")  # fmt: skip
    if jobs.n == 0:
        return _nothing(jobs, objective=0.0)
    if tie_break != "interior":
        _check_tie_break(tie_break)
    stats = SolveStats()
    prop = proportional_throughputs(jobs.throughputs, jobs.num_gpus)
    skeleton = _skeleton(jobs, packing, [jobs.weights])
    rep = skeleton.classes.representative
    count = skeleton.classes.count
    active = (prop[rep] > 0) & skeleton.can_run
    if not active.any():
        return _nothing(jobs)
    inv_prop = np.where(active, 1.0 / np.where(active, prop[rep], 1.0), 0.0)
    big_m = float(np.max((skeleton.peak_throughput * skeleton.scale_factors * inv_prop)[active]))
    mult = skeleton.scale_factors / jobs.weights[rep]

    so_far = np.zeros(count)
    final = np.zeros(count)
    frozen = ~active  # classes that cannot run take no part
    values: np.ndarray | None = None
    first_level = float("nan")
    last_lp = (so_far, frozen, so_far)  # (levels so far, frozen, lower bounds) of the last LP
    for _ in range(count + 1):
        lower = np.where(frozen, final, so_far)
        this_lp = (so_far.copy(), frozen.copy(), lower)
        unfrozen = np.flatnonzero(~frozen)
        lp = skeleton.lp.copy()
        level = lp.add_variables(1, lb=-math.inf, ub=big_m if frozen[active].any() else math.inf)
        skeleton.add_rate_rows(
            lp,
            -mult * inv_prop,
            unfrozen,
            extra_cols=level[0],
            extra_coefs=1.0,
            ub=-mult[unfrozen] * so_far[unfrozen],
        )
        active_rows = np.flatnonzero(active)
        skeleton.add_rate_rows(lp, inv_prop, active_rows, lb=lower[active_rows])
        lp.set_objective(level, 1.0, maximize=True)
        try:
            solution = _solve(lp, stats, solver, time_limit)
        except SolveError:
            stats.fallback = "water-filling LP failed: kept the previous level"
            break
        values, last_lp = solution.values, this_lp
        if math.isnan(first_level):
            first_level = solution.objective
        so_far[unfrozen] += solution.objective / mult[unfrozen]
        lower = np.where(frozen, final, so_far)
        if bottleneck_test == "reference":
            rise = _gavel_can_rise(
                skeleton, inv_prop, active, frozen, lower, stats, milp_solver, time_limit
            )
        else:
            rise = _can_rise(skeleton, inv_prop, active, ~frozen, lower, stats, solver, time_limit)
        newly = ~frozen & ~rise
        if not newly.any():
            break
        final[newly] = so_far[newly]
        frozen |= newly
        if frozen.all():
            break
    if values is None:
        return _nothing(jobs)
    if tie_break == "interior":
        # Per job, as the reference writes its rows (our LPs are over classes of equal jobs).
        of = skeleton.classes.of_job
        taking_part = active[of]
        so_far_then, frozen_then, lower_then = (v[of][taking_part] for v in last_lp)
        found = _ecos_allocation(jobs, taking_part, lambda: interior.water_filling_point(
            jobs.throughputs[taking_part], jobs.scale_factors[taking_part], jobs.num_gpus,
            inv_prop[of][taking_part], mult[of][taking_part], so_far_then, frozen_then,
            lower_then, big_m), first_level, stats, started)  # fmt: skip
        if found is not None:
            return found
        tie_break = "center"
    values = _tie_break(skeleton, values, tie_break, stats, solver, time_limit)
    return _finish(skeleton, values, first_level, stats, started, jobs.k)


def _gavel_can_rise(
    skeleton: _Skeleton,
    inv_prop: np.ndarray,
    active: np.ndarray,
    frozen: np.ndarray,
    lower: np.ndarray,
    stats: SolveStats,
    solver: Solver | None,
    time_limit: float | None,
) -> np.ndarray:
    """The reference's bottleneck MILP (see `max_min_fairness_water_filling`); all False when it
    is infeasible, as the reference then freezes everyone."""
    slack, epsilon = 1.0001, 1e-5
    rows = np.flatnonzero(active)
    reached = lower[rows] * slack
    # a big-M per row, as small as stays valid (the reference uses one M for every row; any valid
    # M gives the same feasible z, a tight one a faster MILP)
    row_m = (skeleton.peak_throughput * inv_prop)[rows] + reached + epsilon
    milp = skeleton.lp.copy()
    can_rise = milp.add_variables(
        skeleton.classes.count, ub=np.where(frozen, 0.0, 1.0), integer=True
    )
    skeleton.add_rate_rows(
        milp, -inv_prop, rows, extra_cols=can_rise[rows], extra_coefs=row_m, lb=-reached + epsilon
    )
    skeleton.add_rate_rows(
        milp, inv_prop, rows, extra_cols=can_rise[rows], extra_coefs=-row_m, lb=reached - row_m
    )
    skeleton.add_rate_rows(milp, inv_prop, rows, lb=lower[rows])
    milp.set_objective(can_rise, skeleton.classes.members.astype(np.float64), maximize=True)
    try:
        return cast(np.ndarray, _solve(milp, stats, solver, time_limit).values[can_rise] > 0.5)
    except SolveError:
        return np.zeros(skeleton.classes.count, dtype=bool)


def _can_rise(
    skeleton: _Skeleton,
    inv_prop: np.ndarray,
    active: np.ndarray,
    candidates: np.ndarray,
    lower: np.ndarray,
    stats: SolveStats,
    solver: Solver | None,
    time_limit: float | None,
) -> np.ndarray:
    """Which candidate classes can raise their level e_c above `lower` while every class keeps
    its own: LPs maximising the candidates' summed rises (rise_c <= cap_c), repeated without
    those that rose until none does. Exact: a class that can rise alone makes the LP's optimum
    positive, so each LP finds at least one while any is left."""
    members = skeleton.classes.members.astype(np.float64)
    cap = 1e-3 * (1.0 + lower)
    threshold = 1e-6 * (1.0 + lower)
    rose = np.zeros(skeleton.classes.count, dtype=bool)
    todo = candidates & active
    while todo.any():
        lp = skeleton.lp.copy()
        others = np.flatnonzero(active & ~todo)
        asked = np.flatnonzero(todo)
        skeleton.add_rate_rows(lp, inv_prop, others, lb=lower[others])
        rise = lp.add_variables(asked.size, ub=cap[asked])
        skeleton.add_rate_rows(
            lp, inv_prop, asked, extra_cols=rise, extra_coefs=-1.0, lb=lower[asked]
        )
        lp.set_objective(rise, members[asked], maximize=True)
        try:
            up = _solve(lp, stats, solver, time_limit).values[rise] > threshold[asked]
        except SolveError:
            break
        if not up.any():
            break
        rose[asked[up]] = True
        todo[asked[up]] = False
    return rose


# ------------------------------------------------------------------------------------------------
# Finish-time fairness


def finish_time_fairness(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    priority_weights: np.ndarray,
    num_gpus: np.ndarray,
    remaining_steps: np.ndarray,
    time_since_start: np.ndarray,
    *,
    isolated_time_elapsed: np.ndarray | None = None,
    packing: Packing | None = None,
    priority_weighting: Literal["reference", "slowdown"] = "reference",
    tie_break: TieBreak | Literal["interior"] = "center",
    solver: Solver | None = None,
    time_limit: float | None = None,
    tolerance: float = 1e-7,
    max_iterations: int = 100,
) -> Allocation:
    """Gavel's `finish_time_fairness_perf` (Themis; `_packed` with `packing`; the agnostic form
    on `agnostic_throughputs(T, v100_index)`): minimise max_j rho_j(X),
    rho_j = (t_j + R_j / r_j(X)) / (C_j + R_j / iso_j), solved exactly as a sequence of LPs (the
    module docstring). `objective` is the optimal max rho.

    `time_since_start` t_j: now - the job's start time; `remaining_steps` R_j;
    `isolated_time_elapsed` C_j: the isolated time it has accrued, which the reference keeps
    between calls as C_j += (R_j at the previous call - R_j now) / iso_j at the previous call
    (0 on a job's first call; zeros if omitted). iso_j = `isolated_throughputs(T, sf, N)`.
    Jobs with R_j = 0 or no usable GPU type take no part (and get nothing).

    Priority weights (`priority_weighting`): "reference" does what Gavel does: the `_perf`
    program ignores them, the `_packed` one divides every throughput of job j by w_j. "slowdown"
    minimises max_j w_j rho_j instead (a heavier job gets a proportionally smaller slowdown).
    If the first LP fails the reference's fallback is returned: the isolated allocation.

    Where several allocations reach the optimal max rho, `tie_break="interior"` returns the one
    the reference's solver (ECOS) returns (`interior.finish_time_point`: its path through the
    program's second-order cones; unpacked, reference weighting)."""
    started = time.perf_counter()
    jobs = _jobs(throughputs, scale_factors, num_gpus, priority_weights)
    n = jobs.n
    remaining = _per_job(remaining_steps, "remaining_steps", n)
    since_start = _per_job(time_since_start, "time_since_start", n)
    accrued = (
        np.zeros(n)
        if isolated_time_elapsed is None
        else _per_job(isolated_time_elapsed, "isolated_time_elapsed", n)
    )
    if priority_weighting not in ("reference", "slowdown"):
        raise ValueError(
            f"priority_weighting: 'reference' or 'slowdown', not {priority_weighting!r}"
        )
    ecos_point = tie_break == "interior"
    if ecos_point and (packing is not None or priority_weighting != "reference"):
        raise ValueError("tie_break 'interior' is the reference's answer for the unpacked program "
                         "with its weighting: use 'center' or 'vertex' here")  # fmt: skip
    if jobs.n == 0:
        return _nothing(jobs, objective=0.0)
    if not ecos_point:
        _check_tie_break(tie_break)
    stats = SolveStats()
    iso = isolated_throughputs(jobs.throughputs, jobs.scale_factors, jobs.num_gpus)
    skeleton = _skeleton(jobs, packing, [jobs.weights, remaining, since_start, accrued])
    rep = skeleton.classes.representative
    count = skeleton.classes.count
    weights = jobs.weights[rep]
    rate_factor = (
        1.0 / weights
        if (packing is not None and priority_weighting == "reference")
        else np.ones(count)
    )
    rho_scale = weights if priority_weighting == "slowdown" else np.ones(count)
    iso_c, r_c, t_c = iso[rep], remaining[rep], since_start[rep]
    active = (r_c > 0) & (iso_c > 0) & skeleton.can_run
    rows = np.flatnonzero(active)
    isolated_allocation = isolated(jobs.throughputs, jobs.scale_factors, jobs.num_gpus)
    if rows.size == 0:
        return _nothing(jobs)
    # rho'_c = (t_c + R_c / rate_c) / D'_c with D'_c = isolated finish time / rho_scale
    finish = np.where(active, accrued[rep] + r_c / np.where(active, iso_c, 1.0), 1.0) / rho_scale
    if ecos_point:  # each job on its own rows, as the reference writes them; its level is the
        # optimum to ECOS's tolerance, so the level search below is only its fallback's
        part = active[skeleton.classes.of_job]
        job_finish = finish[skeleton.classes.of_job][part]
        found = _ecos_allocation(jobs, part, lambda: interior.finish_time_point(
            jobs.throughputs[part], jobs.scale_factors[part], jobs.num_gpus, remaining[part],
            since_start[part], job_finish), math.nan, stats, started)  # fmt: skip
        if found is not None:
            rates = (jobs.throughputs[part] * found.shares[part]).sum(axis=1)
            with np.errstate(divide="ignore"):
                level = float(np.max((since_start[part] + remaining[part] / rates) / job_finish))
            return replace(found, objective=level)
        tie_break = "center"

    def worst(rates: np.ndarray) -> float:
        with np.errstate(divide="ignore"):
            return float(np.max((t_c[rows] + r_c[rows] / rates[rows]) / finish[rows]))

    rates = iso_c * rate_factor  # the isolated allocation's (weighted) rates
    level = worst(rates)
    best_values: np.ndarray | None = None
    for _ in range(max_iterations):
        lp = skeleton.lp.copy()
        gap = lp.add_variables(1, lb=-math.inf)
        scale = np.ones(count)
        scale[rows] = finish[rows] * rates[rows]
        factor = np.zeros(count)
        factor[rows] = rate_factor[rows] * (t_c[rows] - level * finish[rows]) / scale[rows]
        skeleton.add_rate_rows(
            lp, factor, rows, extra_cols=gap[0], extra_coefs=-1.0, ub=-r_c[rows] / scale[rows]
        )
        lp.set_objective(gap, 1.0, maximize=False)
        try:
            solution = _solve(lp, stats, solver, time_limit)
        except SolveError:
            if best_values is None:
                stats.fallback = "finish-time fairness LP failed: isolated allocation"
                return Allocation(
                    isolated_allocation.shares,
                    isolated_allocation.pairs,
                    isolated_allocation.pair_shares,
                    level,
                    stats,
                )
            stats.fallback = "finish-time fairness LP failed: kept the last level"
            break
        new_rates = skeleton.rates(solution.values, rate_factor)
        new_level = worst(new_rates)
        improved = new_level < level
        if improved or best_values is None:
            best_values = solution.values
        if solution.objective >= -tolerance * level or level - new_level <= tolerance * level:
            level = min(level, new_level)
            break
        level, rates = new_level, new_rates
    if best_values is None:
        return _nothing(jobs)
    assert tie_break != "interior"  # (the ECOS point returned above, or fell back to "center")
    best_values = _tie_break(skeleton, best_values, tie_break, stats, solver, time_limit)
    return _finish(skeleton, best_values, level, stats, started, jobs.k)


# ------------------------------------------------------------------------------------------------
# Makespan


def _gavel_makespan_search(optimum: float) -> float:
    """The makespan bound Gavel's binary search ends on when every T >= `optimum` is feasible:
    bisect [100 s, 1e6 s] while 1.05 lo < hi (then [1e6, 1e7], ... if nothing was feasible)."""
    if not math.isfinite(optimum):
        raise SolveError("min_total_duration: no finite makespan (a job can run nowhere)")
    lo, hi, last_hi = 100.0, 1e6, 1e6
    found: float | None = None
    while found is None:
        while 1.05 * lo < hi:
            middle = (lo + hi) / 2.0
            if middle >= optimum:
                found, hi = middle, middle
            else:
                lo = middle
        lo, hi, last_hi = last_hi, last_hi * 10.0, last_hi * 10.0
    return found


def min_total_duration(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    remaining_steps: np.ndarray,
    *,
    packing: Packing | None = None,
    search: Literal["reference", "exact"] = "reference",
    tie_break: TieBreak | Literal["interior"] = "center",
    solver: Solver | None = None,
    time_limit: float | None = None,
) -> Allocation:
    """Gavel's `min_total_duration_perf` (`_packed` with `packing`; the agnostic form on
    `agnostic_throughputs(T, v100_index)`): the smallest makespan T such that every job can
    finish its remaining steps within T, r_j(X) >= R_j / T. `objective` is that T in seconds.

    The optimum is one LP: maximise theta s.t. r_j(X) >= R_j theta, T* = 1 / theta*.
    `search="reference"` (default) returns what Gavel's binary search returns: it bisects
    [100 s, 1e6 s] (then [1e6, 1e7], ...) with one feasibility LP per probe and stops once
    1.05 lo >= hi, so it ends on a T up to ~5% above T* (and never below ~100 s); we replay its
    probes against T* (same T, two LPs instead of ~20) and return a feasible X for that T from a
    constant-objective LP, as it does. `search="exact"` returns T* and the LP's X.
    Every X that meets the bound is optimal there: `tie_break="interior"` returns the one the
    reference's solver (ECOS) returns (`interior.feasible_point`; unpacked programs with the
    reference's search only), "center" a central one of ours, "vertex" a simplex corner.
    Jobs with R_j = 0 take no part; a job with R_j > 0 that can run nowhere is left out and gets
    nothing (the reference's search never ends on it)."""
    started = time.perf_counter()
    jobs = _jobs(throughputs, scale_factors, num_gpus)
    remaining = _per_job(remaining_steps, "remaining_steps", jobs.n)
    if search not in ("reference", "exact"):
        raise ValueError(f"search: 'reference' or 'exact', not {search!r}")
    ecos_point = tie_break == "interior"
    if ecos_point and (packing is not None or search != "reference"):
        raise ValueError("tie_break 'interior' is the reference's answer to its own search, for "
                         "the unpacked programs: use 'center' or 'vertex' here")  # fmt: skip
    if jobs.n == 0:
        return _nothing(jobs, objective=0.0)
    if not ecos_point:
        _check_tie_break(tie_break)
    stats = SolveStats()
    skeleton = _skeleton(jobs, packing, [remaining])
    rep = skeleton.classes.representative
    r_c = remaining[rep]
    rows = np.flatnonzero((r_c > 0) & skeleton.can_run)
    if rows.size == 0:
        return _nothing(jobs, objective=0.0)
    inv_remaining = np.zeros(skeleton.classes.count)
    inv_remaining[rows] = 1.0 / r_c[rows]
    lp = skeleton.lp.copy()
    theta = lp.add_variables(1)
    skeleton.add_rate_rows(lp, inv_remaining, rows, extra_cols=theta[0], extra_coefs=-1.0, lb=0.0)
    lp.set_objective(theta, 1.0, maximize=True)
    best = _solve(lp, stats, solver, time_limit)
    optimum = 1.0 / best.objective if best.objective > 0 else math.inf
    if search == "exact":
        assert tie_break != "interior"  # (refused above with search="exact")
        values = _tie_break(skeleton, best.values, tie_break, stats, solver, time_limit)
        return _finish(skeleton, values, optimum, stats, started, jobs.k)
    bound = _gavel_makespan_search(optimum)
    if ecos_point:  # each job on its own rows, as the reference writes them
        taking_part = (remaining <= 0) | (jobs.throughputs > 0).any(axis=1)
        found = _ecos_allocation(jobs, taking_part, lambda: interior.feasible_point(
            jobs.throughputs[taking_part], jobs.scale_factors[taking_part], jobs.num_gpus,
            np.maximum(remaining[taking_part], 0.0) / bound), bound, stats, started)  # fmt: skip
        if found is not None:
            return found
        tie_break = "center"
    feasible = skeleton.lp.copy()
    skeleton.add_rate_rows(feasible, np.ones(skeleton.classes.count), rows, lb=r_c[rows] / bound)
    try:
        if tie_break == "center":  # the centre of everything that meets the bound
            values = _spread(skeleton, feasible, stats, solver, time_limit).values
        else:
            values = _solve(feasible, stats, solver, time_limit).values
    except SolveError:  # the probe sits within solver tolerance of T*
        values = best.values
    return _finish(skeleton, values, bound, stats, started, jobs.k)


# ------------------------------------------------------------------------------------------------
# Throughput


def max_sum_throughput(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    *,
    costs: np.ndarray | None = None,
    slos: np.ndarray | None = None,
    remaining_steps: np.ndarray | None = None,
    normalize: bool = False,
    packing: Packing | None = None,
    tie_break: TieBreak = "center",
    solver: Solver | None = None,
    time_limit: float | None = None,
) -> Allocation:
    """Gavel's `max_sum_throughput_perf`: maximise the cluster's total steps/s,
    sum_j r_j(X) (each term divided by `costs[k]`, the price of a type-k GPU, when given: the
    `max_sum_throughput_normalized_by_cost_perf` policy; with `packing`, the `_packed` one).
    `objective` is that sum.

    SLOs: `slos[j]` seconds left until job j's SLO deadline (NaN or inf: none) with
    `remaining_steps` R_j add r_j(X) >= R_j / slos[j]; when they cannot all hold the reference
    drops them all and solves again (reported in `stats.fallback`). A deadline already passed
    (slos[j] <= 0) constrains nothing, as in the reference.

    Reference quirk: Gavel computes 1 / sum_k T[j, k] to normalise each job's throughput but
    never uses it, so the program maximises raw steps/s and favours fast jobs;
    `normalize=True` divides job j's throughput by sum_k T[j, k], as intended."""
    started = time.perf_counter()
    jobs = _jobs(throughputs, scale_factors, num_gpus)
    n, num_types = jobs.n, jobs.k
    price = np.ones(num_types) if costs is None else _float_array(costs, "costs", (num_types,))
    if np.any(price <= 0):
        raise ValueError("costs: must be > 0")
    features: list[np.ndarray] = []
    deadline = np.full(n, np.inf)
    remaining = np.zeros(n)
    if slos is not None:
        deadline = np.asarray(slos, dtype=np.float64).copy()
        if deadline.shape != (n,):
            raise ValueError(f"slos: expected shape ({n},), got {deadline.shape}")
        deadline[np.isnan(deadline)] = np.inf
        if remaining_steps is None:
            raise ValueError("slos need remaining_steps")
        remaining = _per_job(remaining_steps, "remaining_steps", n)
        features = [np.where(np.isfinite(deadline), deadline, -1.0), remaining]
    if jobs.n == 0:
        return _nothing(jobs, objective=0.0)
    _check_tie_break(tie_break)
    stats = SolveStats()
    skeleton = _skeleton(jobs, packing, features)
    rep = skeleton.classes.representative
    members = skeleton.classes.members.astype(np.float64)
    per_job = np.ones(skeleton.classes.count)
    if normalize:
        total = jobs.throughputs[rep].sum(axis=1)
        per_job = np.where(total > 0, 1.0 / np.where(total > 0, total, 1.0), 0.0)
    coefs = skeleton.rate_tput * (members * per_job)[skeleton.rate_rows] / price[skeleton.rate_type]
    base = skeleton.lp.copy()
    d_c = deadline[rep]
    bounded = np.flatnonzero(np.isfinite(d_c) & (d_c > 0))
    solution: Solution | None = None
    if bounded.size:
        with_slos = base.copy()
        skeleton.add_rate_rows(
            with_slos,
            np.ones(skeleton.classes.count),
            bounded,
            lb=remaining[rep][bounded] / d_c[bounded],
        )
        with_slos.set_objective(skeleton.rate_cols, coefs, maximize=True)
        try:
            solution = _solve(with_slos, stats, solver, time_limit)
            base = with_slos
        except Infeasible:
            stats.fallback = "SLOs cannot all be met: solved without them"
    if solution is None:
        base.set_objective(skeleton.rate_cols, coefs, maximize=True)
        solution = _solve(base, stats, solver, time_limit)
    face = base.copy()
    face.add_constraints(
        np.zeros(coefs.size, dtype=np.int64),
        skeleton.rate_cols,
        coefs,
        lb=solution.objective - _KEEP * abs(solution.objective),
    )
    values = _tie_break(skeleton, solution.values, tie_break, stats, solver, time_limit, face)
    return _finish(skeleton, values, solution.objective, stats, started, num_types)


def max_sum_throughput_normalized_by_cost(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    costs: np.ndarray,
    *,
    slos: np.ndarray | None = None,
    remaining_steps: np.ndarray | None = None,
    packing: Packing | None = None,
    tie_break: TieBreak = "center",
    solver: Solver | None = None,
    time_limit: float | None = None,
) -> Allocation:
    """Gavel's `max_sum_throughput_normalized_by_cost_perf[_SLOs]`: `max_sum_throughput` with
    every type-k throughput divided by `costs[k]` (steps per dollar)."""
    return max_sum_throughput(
        throughputs,
        scale_factors,
        num_gpus,
        costs=costs,
        slos=slos,
        remaining_steps=remaining_steps,
        packing=packing,
        tie_break=tie_break,
        solver=solver,
        time_limit=time_limit,
    )


# ------------------------------------------------------------------------------------------------
# AlloX and Gandiva (combinatorial; state passed in and out)


def allox(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    remaining_steps: np.ndarray,
    time_since_start: np.ndarray,
    *,
    previous: np.ndarray | None = None,
    alpha: float = 1.0,
) -> Allocation:
    """Gavel's `allox` (Le et al., EuroSys 2020): single-GPU jobs, each running alone on one GPU
    until it finishes; shares are 0 or 1.

    `previous`: the shares this returned last time (rows of the current jobs; zeros for new
    ones). A job whose row sums to 1 keeps its GPU. The others, longest since start first (at
    most max(alpha * their number, free GPUs) of them), are matched to the free GPUs by a
    min-cost assignment that minimises the sum of completion times: the job in the p-th last
    position of a GPU's queue costs p * R_j / T[j, k]. Each GPU's first job gets share 1.
    We solve it as a min-cost flow over (type, position) slots with as many units as the type
    has free GPUs (identical GPUs give the same cost, so this is the reference's assignment with
    its GPU copies merged). Which of several equal-cost jobs starts first is arbitrary in the
    reference (scipy's tie-break); we start the shortest (smallest R_j / T[j, k]).
    The reference adds time_since_start to every cost of a job's row, which cannot change an
    assignment; we use it only for the order. Where a job cannot run (T = 0) the reference
    prices it at 1e-10 steps/s and may still place it, where it never finishes and never gives
    the GPU back; we never place a job on such a type."""
    jobs = _jobs(throughputs, scale_factors, num_gpus)
    n, num_types = jobs.n, jobs.k
    if np.any(jobs.scale_factors != 1):
        raise ValueError("allox: AlloX schedules single-GPU jobs only (every scale factor 1)")
    remaining = _per_job(remaining_steps, "remaining_steps", n)
    since_start = _per_job(time_since_start, "time_since_start", n, allow_negative=True)
    if not alpha > 0:
        raise ValueError("alpha: must be > 0")
    before = (
        np.zeros((n, num_types))
        if previous is None
        else _float_array(previous, "previous", (n, num_types))
    )
    running = before.sum(axis=1) == 1.0
    shares = np.where(running[:, None], before, 0.0)
    taken = (shares[running] == 1.0).sum(axis=0)
    free = np.maximum(jobs.num_gpus.astype(np.int64) - taken, 0)
    waiting = np.flatnonzero(~running)
    waiting = waiting[np.argsort(-since_start[waiting], kind="stable")]
    waiting = waiting[: max(int(alpha * waiting.size), int(free.sum()))]
    tput = jobs.throughputs[waiting]
    usable = (tput > 0) & (free > 0)[None, :]
    candidates = np.flatnonzero(usable.any(axis=1))
    pairs, pair_shares = _empty_pairs(num_types)
    if candidates.size == 0:
        return Allocation(shares, pairs, pair_shares, objective=float("nan"))
    selected = waiting[candidates]
    usable = usable[candidates]
    cost_base = np.where(
        usable, remaining[selected, None] / np.where(usable, tput[candidates], 1.0), 0.0
    )
    num_jobs = selected.size
    depth = np.where(free > 0, -(-num_jobs // np.maximum(free, 1)), 0)  # positions per type
    column_start = np.cumsum(depth) - depth
    job_of, type_of = np.nonzero(usable)
    positions = depth[type_of]
    arc_job = np.repeat(job_of, positions)
    arc_type = np.repeat(type_of, positions)
    arc_position = _concat_ranges(np.zeros(job_of.size, dtype=np.int64), positions)
    arc_cost = (arc_position + 1) * cost_base[arc_job, arc_type]
    scale = 2.0**40 / arc_cost.max() if arc_cost.max() > 0 else 1.0
    num_columns = int(depth.sum())
    sink = num_jobs + num_columns
    flow = min_cost_flow.SimpleMinCostFlow()
    job_arcs = flow.add_arcs_with_capacity_and_unit_cost(
        arc_job.astype(np.int32),
        (num_jobs + column_start[arc_type] + arc_position).astype(np.int32),
        np.ones(arc_job.size, dtype=np.int64),
        np.round(arc_cost * scale).astype(np.int64),
    )
    column_type = np.repeat(np.arange(num_types), depth)
    flow.add_arcs_with_capacity_and_unit_cost(
        np.arange(num_jobs, sink, dtype=np.int32),
        np.full(num_columns, sink, dtype=np.int32),
        free[column_type].astype(np.int64),
        np.zeros(num_columns, dtype=np.int64),
    )
    flow.set_nodes_supplies(
        np.arange(sink + 1, dtype=np.int32),
        np.concatenate([np.ones(num_jobs), np.zeros(num_columns), [-num_jobs]]).astype(np.int64),
    )
    status = flow.solve()
    if status != flow.OPTIMAL:
        raise SolveError(f"allox: min-cost flow ended with status {status}")
    chosen = np.flatnonzero(flow.flows(np.asarray(job_arcs, dtype=np.int32)) > 0)
    job, k, position = arc_job[chosen], arc_type[chosen], arc_position[chosen]
    # per type, the GPUs' queues are filled position by position; a GPU's first job is the one at
    # its last position: count[k, p] - max_{q > p} count[k, q] GPUs end at position p
    max_depth = int(depth.max())
    count = np.zeros((num_types, max_depth + 1), dtype=np.int64)
    np.add.at(count, (k, position), 1)
    deeper = np.maximum.accumulate(count[:, ::-1], axis=1)[:, ::-1]
    starts_here = count[:, :-1] - deeper[:, 1:]
    order = np.lexsort((selected[job], cost_base[job, k], position, k))
    job, k, position = job[order], k[order], position[order]
    slot = k * (max_depth + 1) + position
    first_in_slot = np.concatenate(([True], slot[1:] != slot[:-1]))
    rank = np.arange(slot.size) - np.maximum.accumulate(
        np.where(first_in_slot, np.arange(slot.size), 0)
    )
    starts = rank < starts_here[k, position]
    shares[selected[job[starts]], k[starts]] = 1.0
    return Allocation(shares, pairs, pair_shares, objective=float("nan"))


def _gandiva_score(
    first: np.ndarray, second: np.ndarray, throughputs: np.ndarray, packing: Packing
) -> np.ndarray:
    """Gavel's normalised packed throughput of job pairs: sum over types of both jobs' pair
    throughput / isolated throughput; 0 if either pair throughput is 0 on any type."""
    types = np.asarray(packing.job_types)
    table = np.nan_to_num(np.asarray(packing.pair_throughputs, dtype=np.float64), nan=0.0)
    mine = table[types[first], types[second]]
    theirs = table[types[second], types[first]]
    alone_mine, alone_theirs = throughputs[first], throughputs[second]
    ratio = np.divide(mine, alone_mine, out=np.zeros_like(mine), where=alone_mine > 0)
    ratio += np.divide(theirs, alone_theirs, out=np.zeros_like(theirs), where=alone_theirs > 0)
    blocked = ((mine <= 0) | (theirs <= 0)).any(axis=1)
    return np.where(blocked, 0.0, ratio.sum(axis=1))


def gandiva(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    packing: Packing,
    partner: np.ndarray,
    rng: random.Random,
) -> tuple[Allocation, np.ndarray]:
    """Gavel's `gandiva` policy: random pairing for space sharing. Returns the allocation and the
    new `partner` state to pass to the next call.

    `partner[j]`: j's partner's index in this call's job list, `ALONE`, or `UNASSIGNED` (a new
    job, or one whose partner has left); jobs in the reference's order (ascending job id).
    A pair is kept while its normalised packed throughput (the sum over GPU types of each job's
    pair throughput divided by its throughput alone; 0 if the pair may not share some type) is
    >= 1; every other placement, including every job that was alone, is undone. If the jobs' GPUs fit in the
    cluster nobody is paired and everyone gets the `isolated` split. Otherwise the unplaced jobs
    are paired at random exactly as the reference does (as many draws as unplaced jobs,
    `rng.sample(pool, 2)`, a draw of two different scale factors wasted), so the same
    `random.Random(seed)` gives the reference's pairs; the rest run alone, and time is split
    equally over the resulting pairs and singles."""
    jobs = _jobs(throughputs, scale_factors, num_gpus)
    n, num_types = jobs.n, jobs.k
    state = np.asarray(partner, dtype=np.int64).copy()
    if state.shape != (n,) or np.any(state < UNASSIGNED) or np.any(state >= n):
        raise ValueError(f"partner: expected {n} values, each a job index, ALONE or UNASSIGNED")
    paired = np.flatnonzero(state >= 0)
    if np.any(state[paired] == paired) or np.any(state[state[paired]] != paired):
        raise ValueError("partner: pairs must be mutual (partner[partner[j]] == j, j != partner)")
    if np.asarray(packing.job_types).shape != (n,):
        raise ValueError(f"packing.job_types: expected {n} values")
    first = paired[paired < state[paired]]
    second = state[first]
    undone = _gandiva_score(first, second, jobs.throughputs, packing) < 1.0
    state[first[undone]] = UNASSIGNED
    state[second[undone]] = UNASSIGNED
    state[state == ALONE] = UNASSIGNED
    pairs, pair_shares = _empty_pairs(num_types)
    if jobs.scale_factors.sum() <= jobs.num_gpus.sum():
        shares = _isolated_shares(n, jobs.scale_factors, jobs.num_gpus)
        return Allocation(shares, pairs, pair_shares, objective=float("nan")), state
    pool = [int(j) for j in np.flatnonzero(state == UNASSIGNED)]
    for _ in range(len(pool)):
        if len(pool) <= 1:
            break
        a, b = rng.sample(pool, 2)
        if jobs.scale_factors[a] != jobs.scale_factors[b]:
            continue
        pool.remove(a)
        pool.remove(b)
        state[a], state[b] = b, a
    state[pool] = ALONE
    alone = np.flatnonzero(state == ALONE)
    first = np.flatnonzero(state > np.arange(n))
    combos = alone.size + first.size
    rows = _isolated_shares(
        combos,
        np.concatenate([jobs.scale_factors[alone], jobs.scale_factors[first]]),
        jobs.num_gpus,
    )
    shares = np.zeros((n, num_types))
    shares[alone] = rows[: alone.size]
    pairs = np.stack([first, state[first]], axis=1)
    return Allocation(shares, pairs, rows[alone.size :], objective=float("nan")), state

"""Gavel's allocation programs (gpuyard.policies.gavel.programs) on real OR-Tools solves.

Optimal values are checked against closed forms and against independent formulations built here
with one variable per job and per job pair (the reference's shape, no classes, no partner-group
aggregation); allocations are checked against every base constraint."""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from gpuyard.policies.gavel import interior
from gpuyard.policies.gavel import programs as gp
from gpuyard.policies.toolkit.lp import Infeasible, LinearProgram

TOL = 1e-6


# ------------------------------------------------------------------------------------------------
# Independent checks


def assert_feasible(
    allocation: gp.Allocation,
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    packing: gp.Packing | None = None,
) -> None:
    shares, pairs, pair_shares = allocation.shares, allocation.pairs, allocation.pair_shares
    assert shares.shape == throughputs.shape
    assert np.all(shares >= 0) and np.all(pair_shares >= 0)
    assert np.all(shares[throughputs == 0] == 0), "time on a type where the job cannot run"
    time_per_job = shares.sum(axis=1)
    np.add.at(time_per_job, pairs[:, 0], pair_shares.sum(axis=1))
    np.add.at(time_per_job, pairs[:, 1], pair_shares.sum(axis=1))
    assert np.all(time_per_job <= 1 + TOL)
    assert np.allclose(time_per_job, allocation.job_time())
    used = (shares * scale_factors[:, None]).sum(axis=0)
    if pairs.size:
        assert packing is not None
        assert np.all(pairs[:, 0] < pairs[:, 1])
        assert len({tuple(p) for p in pairs.tolist()}) == len(pairs)
        assert np.all(scale_factors[pairs[:, 0]] == scale_factors[pairs[:, 1]])
        table = np.nan_to_num(packing.pair_throughputs)
        types = packing.job_types
        mine = table[types[pairs[:, 0]], types[pairs[:, 1]]]
        theirs = table[types[pairs[:, 1]], types[pairs[:, 0]]]
        assert np.all(pair_shares[(mine <= 0) | (theirs <= 0)] == 0)
        used += (pair_shares * scale_factors[pairs[:, 0], None]).sum(axis=0)
    assert np.all(used <= num_gpus + TOL)


def pairwise_model(
    throughputs: np.ndarray,
    scale_factors: np.ndarray,
    num_gpus: np.ndarray,
    packing: gp.Packing | None = None,
    rate_scale: np.ndarray | None = None,
) -> tuple[LinearProgram, list[list[tuple[int, float]]]]:
    """The base LP with a variable per (job, type) and per (job pair, type), built row by row;
    returns the model and, per job, its rate terms [(variable, steps/s)]."""
    n, k = throughputs.shape
    scale = np.ones(n) if rate_scale is None else rate_scale
    lp = LinearProgram()
    alone = lp.add_variables((n, k), ub=np.where(throughputs > 0, 1.0, 0.0))
    rates: list[list[tuple[int, float]]] = [
        [(int(alone[j, t]), throughputs[j, t] * scale[j]) for t in range(k)] for j in range(n)
    ]
    share_terms: list[list[int]] = [list(alone[j]) for j in range(n)]
    capacity: list[list[tuple[int, float]]] = [
        [(int(alone[j, t]), scale_factors[j]) for j in range(n)] for t in range(k)
    ]
    if packing is not None:
        table = np.nan_to_num(packing.pair_throughputs)
        types = packing.job_types
        for i, j in itertools.combinations(range(n), 2):
            if scale_factors[i] != scale_factors[j]:
                continue
            mine, theirs = table[types[i], types[j]], table[types[j], types[i]]
            var = lp.add_variables(k, ub=np.where((mine > 0) & (theirs > 0), 1.0, 0.0))
            for t in range(k):
                rates[i].append((int(var[t]), mine[t] * scale[i]))
                rates[j].append((int(var[t]), theirs[t] * scale[j]))
                capacity[t].append((int(var[t]), scale_factors[i]))
            share_terms[i] += list(var)
            share_terms[j] += list(var)
    for j in range(n):
        lp.add_constraints(np.zeros(len(share_terms[j]), dtype=int), share_terms[j], 1.0, ub=1.0)
    for t in range(k):
        cols, coefs = zip(*capacity[t], strict=True)
        lp.add_constraints(np.zeros(len(cols), dtype=int), cols, coefs, ub=num_gpus[t])
    return lp, rates


def add_rate_row(
    lp: LinearProgram,
    terms: list[tuple[int, float]],
    factor: float,
    extra: tuple[int, float] | None = None,
    *,
    lb: float = -math.inf,
    ub: float = math.inf,
) -> None:
    cols = [c for c, _ in terms] + ([extra[0]] if extra else [])
    coefs = [v * factor for _, v in terms] + ([extra[1]] if extra else [])
    lp.add_constraints(np.zeros(len(cols), dtype=int), cols, coefs, lb=lb, ub=ub)


def reference_max_min(throughputs, scale_factors, weights, num_gpus, packing=None) -> float:
    prop = throughputs @ num_gpus / num_gpus.sum()
    lp, rates = pairwise_model(throughputs, scale_factors, num_gpus, packing)
    level = lp.add_variables(1)
    for j in range(len(rates)):
        add_rate_row(
            lp, rates[j], -scale_factors[j] / (weights[j] * prop[j]), (int(level[0]), 1.0), ub=0.0
        )
    lp.set_objective(level, 1.0, maximize=True)
    return lp.solve().objective


def reference_finish_time(
    throughputs,
    scale_factors,
    num_gpus,
    remaining,
    since_start,
    packing=None,
    rate_scale=None,
    rho_scale=None,
) -> float:
    """Bisection on the level r, each probe an LP feasibility check: r_j(X) (r D_j - t_j) >= R_j."""
    n = len(remaining)
    iso = gp.isolated_throughputs(throughputs, scale_factors, num_gpus)
    finish = remaining / iso / (np.ones(n) if rho_scale is None else rho_scale)

    def feasible(level: float) -> bool:
        if np.any(level * finish - since_start <= 0):
            return False
        lp, rates = pairwise_model(throughputs, scale_factors, num_gpus, packing, rate_scale)
        for j in range(n):
            add_rate_row(lp, rates[j], 1.0, lb=remaining[j] / (level * finish[j] - since_start[j]))
        try:
            lp.solve("scip")  # another solver than the programs' GLOP
        except Infeasible:
            return False
        return True

    lo = float(np.max(since_start / finish))
    hi = (
        float(
            np.max(
                (since_start + remaining / (iso * (1 if rate_scale is None else rate_scale)))
                / finish
            )
        )
        * 1.000001
    )
    for _ in range(60):
        middle = (lo + hi) / 2
        lo, hi = (lo, middle) if feasible(middle) else (middle, hi)
    return hi


def reference_makespan(throughputs, scale_factors, num_gpus, remaining, packing=None) -> float:
    lp, rates = pairwise_model(throughputs, scale_factors, num_gpus, packing)
    theta = lp.add_variables(1)
    for j in range(len(rates)):
        add_rate_row(lp, rates[j], 1.0 / remaining[j], (int(theta[0]), -1.0), lb=0.0)
    lp.set_objective(theta, 1.0, maximize=True)
    return 1.0 / lp.solve().objective


def random_instance(
    seed: int, n: int = 8, num_types: int = 2, job_types: int = 3, multi_gpu: bool = True
):
    """Throughputs of n jobs from job_types templates (some unsupported entries), scale factors
    1 or 2, and a pair table with some pairs that may not share."""
    rng = np.random.default_rng(seed)
    template = rng.uniform(0.5, 4.0, (job_types, num_types))
    template[0, -1] = 0.0
    types = rng.integers(0, job_types, n)
    types[:job_types] = np.arange(job_types)
    sf = np.where(rng.random(n) < 0.25, 2.0, 1.0) if multi_gpu else np.ones(n)
    table = rng.uniform(0.3, 0.9, (job_types, job_types, num_types)) * template[:, None, :]
    table[1, 2, 0] = 0.0  # type 1 with type 2 may not share type 0
    return template[types], sf, types, gp.Packing(types, table)


# ------------------------------------------------------------------------------------------------
# Max-min fairness


def test_identical_jobs_on_one_type_get_equal_shares() -> None:
    tput = np.full((5, 1), 3.0)
    allocation = gp.max_min_fairness(tput, np.ones(5), np.ones(5), np.array([2.0]))
    assert np.allclose(allocation.shares, 0.4)
    assert_feasible(allocation, tput, np.ones(5), np.array([2.0]))
    # few jobs: each is capped by the whole of its time
    allocation = gp.max_min_fairness(tput[:2], np.ones(2), np.ones(2), np.array([4.0]))
    assert np.allclose(allocation.shares, 1.0)


def test_priority_weights_scale_the_share() -> None:
    tput = np.full((3, 1), 2.0)
    weights = np.array([1.0, 1.0, 2.0])
    allocation = gp.max_min_fairness(tput, np.ones(3), weights, np.array([1.0]))
    assert allocation.shares[:, 0] == pytest.approx([0.25, 0.25, 0.5])


def test_scale_factor_is_charged_per_gpu() -> None:
    # a 2-GPU job needs twice the GPUs for the same time; max-min on sf * r / (w p) gives it half
    # the time share and equalises GPU-time
    tput = np.array([[1.0], [2.0]])
    allocation = gp.max_min_fairness(tput, np.array([1.0, 2.0]), np.ones(2), np.array([2.0]))
    share = allocation.shares[:, 0]
    assert 1 * share[0] + 2 * share[1] == pytest.approx(2.0)
    prop = tput[:, 0]
    assert 1 * tput[0, 0] * share[0] / prop[0] == pytest.approx(2 * tput[1, 0] * share[1] / prop[1])


def test_heterogeneity_aware_beats_agnostic_on_two_types() -> None:
    # job 0 is 4x faster on V100, job 1 2x faster on K80: the aware program gives each its fast
    # type; the agnostic one (all throughputs 1) splits both evenly over the two types
    tput = np.array([[4.0, 1.0], [1.0, 2.0]])
    sf, w, gpus = np.ones(2), np.ones(2), np.array([1.0, 1.0])
    aware = gp.max_min_fairness(tput, sf, w, gpus)
    agnostic = gp.max_min_fairness(gp.agnostic_throughputs(tput), sf, w, gpus)
    assert_feasible(aware, tput, sf, gpus)
    assert_feasible(agnostic, tput, sf, gpus)
    assert aware.shares[1] == pytest.approx([0.0, 1.0], abs=1e-6)  # the bottleneck: all of K80
    assert aware.shares[0, 1] == pytest.approx(0.0, abs=1e-6)
    assert agnostic.shares == pytest.approx(np.full((2, 2), 0.5))
    prop = tput @ gpus / gpus.sum()
    aware_level = (aware.job_throughputs(tput) / prop).min()
    agnostic_level = (agnostic.job_throughputs(tput) / prop).min()
    assert aware.objective == pytest.approx(aware_level) == pytest.approx(2 / 1.5)
    assert agnostic_level == pytest.approx(1.0)
    assert agnostic.objective == pytest.approx(1.0)  # its own level, with all throughputs 1


@pytest.mark.parametrize("seed", range(4))
def test_max_min_fairness_matches_a_per_job_formulation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 12
    tput = rng.uniform(0.5, 3.0, (n, 3))
    tput[rng.random((n, 3)) < 0.15] = 0.0
    tput[:, 0] = np.maximum(tput[:, 0], 0.1)
    sf = rng.choice([1.0, 2.0, 4.0], n)
    weights = rng.choice([1.0, 2.0], n)
    tput[6:9], sf[6:9], weights[6:9] = tput[5], sf[5], weights[5]  # a few identical jobs
    gpus = np.array([3.0, 4.0, 2.0])
    allocation = gp.max_min_fairness(tput, sf, weights, gpus)
    assert_feasible(allocation, tput, sf, gpus)
    assert allocation.objective == pytest.approx(
        reference_max_min(tput, sf, weights, gpus), rel=1e-7
    )
    prop = gp.proportional_throughputs(tput, gpus)
    levels = sf * allocation.job_throughputs(tput) / (weights * prop)
    assert levels.min() == pytest.approx(allocation.objective, rel=1e-7)
    assert np.allclose(allocation.shares[6:9], allocation.shares[5])


def test_centre_tie_break_spreads_agnostic_jobs_over_the_types() -> None:
    # two jobs, three types with room for both: every split of each job's time is optimal; the
    # reference's interior-point solver returns the even split, a simplex vertex does not
    tput = np.array([[3.0, 2.0, 1.0], [1.0, 2.0, 0.0]])
    sf, w, gpus = np.ones(2), np.ones(2), np.array([4.0, 4.0, 4.0])
    agnostic = gp.agnostic_throughputs(tput, respect_unsupported=True)
    centre = gp.max_min_fairness(agnostic, sf, w, gpus)
    vertex = gp.max_min_fairness(agnostic, sf, w, gpus, tie_break="vertex")
    assert centre.objective == pytest.approx(vertex.objective) == pytest.approx(1.0)
    assert centre.shares == pytest.approx(np.array([[1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0.0]]))
    assert_feasible(vertex, agnostic, sf, gpus)
    # the tie-break never lowers a job's throughput below the optimum's
    aware = gp.max_min_fairness(tput, sf, w, gpus)
    aware_vertex = gp.max_min_fairness(tput, sf, w, gpus, tie_break="vertex")
    assert np.all(aware.job_throughputs(tput) >= aware_vertex.job_throughputs(tput) * (1 - 1e-8))


def test_proportional_throughput_is_the_reference_equal_share() -> None:
    tput = np.array([[2.0, 1.0, 0.0]])
    assert gp.proportional_throughputs(tput, np.array([1.0, 2.0, 1.0])) == pytest.approx([1.0])


def test_agnostic_throughputs_as_the_reference_builds_them() -> None:
    tput = np.array([[2.0, 1.0, 0.0], [3.0, 0.0, 1.0]])
    assert np.array_equal(gp.agnostic_throughputs(tput), np.ones((2, 3)))
    assert np.array_equal(
        gp.agnostic_throughputs(tput, respect_unsupported=True), [[1, 1, 0], [1, 0, 1]]
    )
    assert np.array_equal(gp.agnostic_throughputs(tput, 0), [[2, 2, 2], [3, 3, 3]])
    assert np.array_equal(
        gp.agnostic_throughputs(tput, 0, respect_unsupported=True), [[2, 2, 0], [3, 0, 3]]
    )


def test_a_job_that_can_run_nowhere_gets_nothing_and_does_not_set_the_minimum() -> None:
    tput = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    allocation = gp.max_min_fairness(tput, np.ones(3), np.ones(3), np.array([1.0, 1.0]))
    assert np.all(allocation.shares[1] == 0)
    assert allocation.objective > 0


# ------------------------------------------------------------------------------------------------
# Water filling


def water_filling_instance(many: int):
    """Job 0 alone can use type 0 (1 GPU); `many` jobs share type 1 (2 GPUs) and cannot use
    type 0. Max-min is set by the crowd; job 0 could take its whole GPU without hurting anyone."""
    tput = np.vstack([[[1.0, 0.0]], np.tile([0.0, 1.0], (many, 1))])
    return tput, np.ones(many + 1), np.ones(many + 1), np.array([1.0, 2.0])


def test_water_filling_raises_the_job_that_is_not_a_bottleneck() -> None:
    tput, sf, w, gpus = water_filling_instance(many=4)  # crowd level (2/4) / (2/3) = 0.75
    allocation = gp.max_min_fairness_water_filling(tput, sf, w, gpus)
    assert_feasible(allocation, tput, sf, gpus)
    assert allocation.objective == pytest.approx(0.75)
    assert allocation.shares[0, 0] == pytest.approx(1.0)
    assert allocation.shares[1:, 1] == pytest.approx(0.5)
    assert allocation.stats.num_solves >= 3  # LP, bottleneck MILP, LP again (+ final MILP)


def test_water_filling_reference_quirk_stops_at_the_first_level_below_0_1() -> None:
    tput, sf, w, gpus = water_filling_instance(many=40)  # crowd level (2/40) / (2/3) = 0.075
    plain = gp.max_min_fairness(tput, sf, w, gpus)
    reference = gp.max_min_fairness_water_filling(tput, sf, w, gpus, tie_break="vertex")
    intended = gp.max_min_fairness_water_filling(tput, sf, w, gpus, bottleneck_test="exact")
    assert reference.objective == pytest.approx(0.075) == plain.objective
    # the reference's MILP is infeasible at this level: one LP, one failed MILP, then it stops
    assert reference.stats.num_solves == 2
    assert intended.shares[0, 0] == pytest.approx(1.0)
    assert intended.shares[1:, 1] == pytest.approx(2 / 40)
    assert_feasible(intended, tput, sf, gpus)


@pytest.mark.parametrize("seed", range(3))
def test_water_filling_levels_dominate_plain_max_min(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 10
    tput = rng.uniform(0.5, 3.0, (n, 3))
    tput[rng.random((n, 3)) < 0.3] = 0.0
    tput[:, 1] = np.maximum(tput[:, 1], 0.2)
    sf, w, gpus = np.ones(n), np.ones(n), np.array([2.0, 6.0, 3.0])
    plain = gp.max_min_fairness(tput, sf, w, gpus)
    filled = gp.max_min_fairness_water_filling(tput, sf, w, gpus, bottleneck_test="exact")
    assert_feasible(filled, tput, sf, gpus)
    prop = gp.proportional_throughputs(tput, gpus)
    levels = np.sort(filled.job_throughputs(tput) / prop)
    plain_levels = np.sort(plain.job_throughputs(tput) / prop)
    assert levels[0] == pytest.approx(plain.objective, rel=1e-6)
    # leximin: the sorted level vector is lexicographically at least plain max-min's
    difference = levels - plain_levels
    first = np.flatnonzero(np.abs(difference) > 1e-6)
    assert first.size == 0 or difference[first[0]] > 0


# ------------------------------------------------------------------------------------------------
# Finish-time fairness


def test_finish_time_fairness_closed_forms() -> None:
    # one job alone on one GPU: it runs all the time, rho = (t + R/T) / (R/T)
    allocation = gp.finish_time_fairness(
        np.array([[2.0]]),
        np.ones(1),
        np.ones(1),
        np.array([1.0]),
        np.array([1000.0]),
        np.array([100.0]),
    )
    assert allocation.shares[0, 0] == pytest.approx(1.0)
    assert allocation.objective == pytest.approx((100 + 500) / 500)
    # identical jobs sharing one GPU from the start: equal shares, rho = 1
    allocation = gp.finish_time_fairness(
        np.full((4, 1), 2.0),
        np.ones(4),
        np.ones(4),
        np.array([1.0]),
        np.full(4, 1000.0),
        np.zeros(4),
    )
    assert np.allclose(allocation.shares, 0.25)
    assert allocation.objective == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(3))
def test_finish_time_fairness_matches_bisection_on_a_per_job_lp(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 9
    tput = rng.uniform(0.5, 3.0, (n, 3))
    tput[rng.random((n, 3)) < 0.2] = 0.0
    tput[:, 2] = np.maximum(tput[:, 2], 0.3)
    sf = rng.choice([1.0, 2.0], n)
    gpus = np.array([2.0, 3.0, 2.0])
    remaining = rng.uniform(1e3, 1e5, n)
    since_start = rng.uniform(0, 5e3, n)
    allocation = gp.finish_time_fairness(tput, sf, np.ones(n), gpus, remaining, since_start)
    assert_feasible(allocation, tput, sf, gpus)
    expected = reference_finish_time(tput, sf, gpus, remaining, since_start)
    assert allocation.objective == pytest.approx(expected, rel=1e-6)
    iso = gp.isolated_throughputs(tput, sf, gpus)
    rho = (since_start + remaining / allocation.job_throughputs(tput)) / (remaining / iso)
    assert rho.max() == pytest.approx(allocation.objective, rel=1e-9)


def test_finish_time_fairness_counts_accrued_isolated_time() -> None:
    # with C_j = accrued isolated time, the yardstick is C_j + R_j / iso_j
    tput, gpus = np.full((2, 1), 1.0), np.array([1.0])
    remaining, since_start, accrued = (
        np.array([100.0, 100.0]),
        np.array([50.0, 50.0]),
        np.array([0.0, 300.0]),
    )
    allocation = gp.finish_time_fairness(
        tput, np.ones(2), np.ones(2), gpus, remaining, since_start, isolated_time_elapsed=accrued
    )
    share = allocation.shares[:, 0]
    rho = (since_start + remaining / share) / (accrued + remaining / 0.5)
    assert share[0] > share[1]  # the job with no accrued isolated time is further behind
    assert rho[0] == pytest.approx(rho[1], rel=1e-6)
    assert allocation.objective == pytest.approx(rho.max(), rel=1e-9)


def test_finish_time_fairness_priority_weights() -> None:
    tput, gpus = np.full((2, 1), 1.0), np.array([1.0])
    remaining, since_start = np.full(2, 1000.0), np.zeros(2)
    weights = np.array([1.0, 3.0])
    plain = gp.finish_time_fairness(tput, np.ones(2), np.ones(2), gpus, remaining, since_start)
    reference = gp.finish_time_fairness(tput, np.ones(2), weights, gpus, remaining, since_start)
    assert np.allclose(reference.shares, plain.shares)  # the reference's _perf ignores weights
    weighted = gp.finish_time_fairness(
        tput, np.ones(2), weights, gpus, remaining, since_start, priority_weighting="slowdown"
    )
    share = weighted.shares[:, 0]
    rho = (remaining / share) / (remaining / 0.5)
    assert weights[0] * rho[0] == pytest.approx(weights[1] * rho[1], rel=1e-6)
    assert share[1] > share[0]


# ------------------------------------------------------------------------------------------------
# Makespan


def gavel_binary_search(feasible) -> float:
    """Gavel's min_total_duration search, literally, with an LP feasibility oracle."""
    max_t, min_t, last_max_t = 1e6, 100.0, 1e6
    last_feasible = None
    while last_feasible is None:
        while 1.05 * min_t < max_t:
            t = (min_t + max_t) / 2
            if feasible(t):
                last_feasible, max_t = t, t
            else:
                min_t = t
        max_t, min_t, last_max_t = last_max_t * 10, last_max_t, last_max_t * 10
    return last_feasible


@pytest.mark.parametrize("scale", [1.0, 1e-3, 40.0])
def test_min_total_duration_reproduces_the_reference_search(scale: float) -> None:
    rng = np.random.default_rng(7)
    n = 7
    tput = rng.uniform(0.5, 3.0, (n, 2))
    sf = rng.choice([1.0, 2.0], n)
    gpus = np.array([2.0, 2.0])
    remaining = rng.uniform(1e4, 1e5, n) * scale

    def feasible(bound: float) -> bool:
        lp, rates = pairwise_model(tput, sf, gpus)
        for j in range(n):
            add_rate_row(lp, rates[j], 1.0, lb=remaining[j] / bound)
        try:
            lp.solve()
        except Infeasible:
            return False
        return True

    exact = gp.min_total_duration(tput, sf, gpus, remaining, search="exact")
    reference = gp.min_total_duration(tput, sf, gpus, remaining)
    assert exact.objective == pytest.approx(reference_makespan(tput, sf, gpus, remaining), rel=1e-7)
    assert reference.objective == pytest.approx(gavel_binary_search(feasible), rel=1e-9)
    assert exact.objective <= reference.objective
    assert reference.objective <= max(1.05 * exact.objective, 105.0)
    for allocation in (exact, reference):
        assert_feasible(allocation, tput, sf, gpus)
        rates = allocation.job_throughputs(tput)
        assert np.all(rates * allocation.objective >= remaining * (1 - 1e-6))


def test_min_total_duration_closed_form_on_one_gpu() -> None:
    # two jobs on one GPU at 1 step/s: the makespan is the total work
    allocation = gp.min_total_duration(
        np.ones((2, 1)), np.ones(2), np.array([1.0]), np.array([1000.0, 3000.0]), search="exact"
    )
    assert allocation.objective == pytest.approx(4000.0)
    assert allocation.shares[:, 0] == pytest.approx([0.25, 0.75])


ECOS_INSTANCE = (
    np.array([[2.0, 1.0, 0.5], [1.0, 0.9, 0.0], [3.0, 1.5, 1.0], [0.8, 0.8, 0.3], [5.0, 2.0, 0.0]]),
    np.array([1.0, 2.0, 1.0, 1.0, 4.0]),
    np.array([4.0, 4.0, 4.0]),
)
"""(throughputs, scale factors, GPUs per type) of the instance ECOS was run on for the tests below."""


@pytest.mark.parametrize("structured", [False, True])
def test_the_interior_tie_break_is_the_point_ecos_returns(
    structured: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gavel asks cvxpy/ECOS for any X meeting the bound (a constant objective). ECOS's answer on
    this instance (ECOS 2.0.14 through cvxpy 1.9.3, `Maximize(1)` over Gavel's base constraints
    and the rows r_j(X) >= R_j / 2000, clipped to [0, 1] as Gavel does), to 1e-8. `structured`:
    the solves large programs take (per-job blocks), here on a small one."""
    if structured:
        monkeypatch.setattr(interior, "DENSE_UP_TO", 0)
    ecos = np.array([
        [0.13008113, 0.3606262, 0.30263101],
        [0.08863474, 0.40424902, 0.32723991],
        [0.29863519, 0.34668381, 0.23098608],
        [0.12456056, 0.26774711, 0.33644046],
        [0.76401004, 0.15961941, 0.04994446],
    ])  # fmt: skip
    tput, sf, gpus = ECOS_INSTANCE
    remaining = np.array([1000.0, 500.0, 3000.0, 200.0, 8000.0])
    point = interior.feasible_point(tput, sf, gpus, remaining / 2000.0)
    assert np.abs(point - ecos).max() < 1e-5
    # As the reference, it may give time where a job cannot run (T = 0): it is ECOS's point.
    assert point[1, 2] > 0.3
    # In the program, with the bound the reference's search ends on (here 2,000 s is not
    # probed; the search's own bound gives another point, still strictly inside the constraints).
    allocation = gp.min_total_duration(tput, sf, gpus, remaining, tie_break="interior")
    x = allocation.shares
    assert np.all(x > 0) and np.all(x.sum(axis=1) < 1)
    assert np.all((x * sf[:, None]).sum(axis=0) < gpus)
    assert np.all((tput * x).sum(axis=1) * allocation.objective >= remaining * (1 - 1e-7))
    vertex = gp.min_total_duration(tput, sf, gpus, remaining, tie_break="vertex")
    assert vertex.objective == allocation.objective and np.abs(vertex.shares - x).max() > 0.05
    with pytest.raises(ValueError, match="interior"):
        gp.min_total_duration(tput, sf, gpus, remaining, tie_break="interior", search="exact")


@pytest.mark.parametrize("structured", [False, True])
def test_max_min_fairness_interior_is_the_optimum_ecos_returns(
    structured: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gavel's max-min program has a face of optima; ECOS's answer on this instance (ECOS 2.0.14
    through cvxpy 1.9.3, Gavel's `MaxMinFairnessPolicyWithPerf` objective over its base
    constraints, clipped to [0, 1]), to 1e-8; `structured` as above."""
    if structured:
        monkeypatch.setattr(interior, "DENSE_UP_TO", 0)
    ecos = np.array([
        [0.41750326, 0.24751255, 0.19025358],
        [0.25321666, 0.25200219, 0.28678009],
        [1.0, 0.0, 0.0],
        [0.35346497, 0.33979082, 0.17862907],
        [0.17598826, 0.29911077, 0.33487208],
    ])  # fmt: skip
    tput, sf, gpus = ECOS_INSTANCE
    weights = np.array([1.0, 1.0, 2.0, 1.0, 1.0])
    found = gp.max_min_fairness(tput, sf, weights, gpus, tie_break="interior")
    assert found.stats is not None and found.stats.fallback is None
    assert np.abs(found.shares - ecos).max() < 1e-6
    vertex = gp.max_min_fairness(tput, sf, weights, gpus, tie_break="vertex")
    assert found.objective == pytest.approx(vertex.objective, rel=1e-7)  # the same optimum
    assert np.abs(vertex.shares - found.shares).max() > 0.1  # at another point of the face
    with pytest.raises(ValueError, match="interior"):
        gp.max_min_fairness(
            tput,
            sf,
            weights,
            gpus,
            tie_break="interior",
            packing=gp.Packing(np.zeros(5, dtype=np.int64), np.zeros((1, 1, 3))),
        )


def test_water_filling_interior_is_the_allocation_gavel_returns() -> None:
    """Gavel's water-filling ends on an LP with a face of optima. What Gavel's
    `MaxMinFairnessWaterFillingPolicyWithPerf` returns on this instance (ECOS 2.0.14 and GLPK_MI
    through cvxpy 1.9.3), to 1e-8: job 4 even gets time on a type where it cannot run."""
    ecos = np.array([
        [1.0, 0.0, 0.0],
        [0.796875, 0.203125, 0.0],
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.1015625, 0.6484375, 0.12427489],
    ])  # fmt: skip
    tput, sf, gpus = ECOS_INSTANCE
    weights = np.array([1.0, 1.0, 2.0, 1.0, 1.0])
    found = gp.max_min_fairness_water_filling(tput, sf, weights, gpus, tie_break="interior")
    assert found.stats is not None and found.stats.fallback is None
    assert np.abs(found.shares - ecos).max() < 1e-6
    center = gp.max_min_fairness_water_filling(tput, sf, weights, gpus)
    assert found.objective == pytest.approx(center.objective, rel=1e-7)  # the same levels
    assert found.job_throughputs(tput) == pytest.approx(center.job_throughputs(tput), rel=1e-6)
    assert center.shares[4, 2] < 1e-6  # ours spends no time where the job cannot run
    # Beyond the dense solve's size, the central point (and the fallback says so).
    many = 400
    rng = np.random.default_rng(3)
    large = gp.max_min_fairness_water_filling(
        rng.uniform(0.5, 3.0, (many, 3)), np.ones(many), np.ones(many), gpus, tie_break="interior"
    )
    assert large.stats is not None and "too many" in (large.stats.fallback or "")
    with pytest.raises(ValueError, match="interior"):
        gp.max_min_fairness_water_filling(
            tput, sf, weights, gpus, tie_break="interior",
            packing=gp.Packing(np.zeros(5, dtype=np.int64), np.zeros((1, 1, 3))),
        )  # fmt: skip


def test_finish_time_fairness_interior_is_the_allocation_gavel_returns() -> None:
    """Gavel's finish-time fairness program minimises the largest ratio, so every job with slack
    can be anywhere on a face of optima; what comes back is where ECOS's path through the
    program's second-order cones (its 1/r terms) stops. What Gavel's
    `FinishTimeFairnessPolicyWithPerf` returns on this instance, its first call (ECOS 2.0.14
    through cvxpy 1.9.3), to 1e-5: the face's other points are 1e-2 away, and where on it a
    solve stops moves by ~1e-6 with its rounding (ECOS's sparse LDL against our blocks)."""
    ecos = np.array([
        [0.26712625, 0.25916865, 0.25115934],
        [0.30980394, 0.28425659, 0.21935428],
        [0.24598036, 0.25145852, 0.26608007],
        [0.50456928, 0.49543072, 0.0],
        [0.25215269, 0.24798092, 0.27426921],
    ])  # fmt: skip
    tput, sf, gpus = ECOS_INSTANCE
    remaining = np.array([1000.0, 500.0, 3000.0, 200.0, 8000.0])
    since_start = np.array([100.0, 400.0, 0.0, 900.0, 50.0])
    found = gp.finish_time_fairness(
        tput, sf, np.ones(5), gpus, remaining, since_start, tie_break="interior"
    )
    assert found.stats is not None and found.stats.fallback is None
    assert np.abs(found.shares - ecos).max() < 1e-5
    center = gp.finish_time_fairness(tput, sf, np.ones(5), gpus, remaining, since_start)
    assert found.objective == pytest.approx(center.objective, rel=1e-9)  # the same optimum
    assert np.abs(center.shares - found.shares).max() > 0.1  # at another point of the face
    # Beyond the dense solve's size, the central point (and the fallback says so).
    many = 300
    rng = np.random.default_rng(3)
    large = gp.finish_time_fairness(
        rng.uniform(0.5, 3.0, (many, 3)), np.ones(many), np.ones(many), gpus,
        np.full(many, 1000.0), np.zeros(many), tie_break="interior")  # fmt: skip
    assert large.stats is not None and "not solved" in (large.stats.fallback or "")
    with pytest.raises(ValueError, match="interior"):
        gp.finish_time_fairness(
            tput,
            sf,
            np.ones(5),
            gpus,
            remaining,
            since_start,
            priority_weighting="slowdown",
            tie_break="interior",
        )


def test_interior_points_do_not_depend_on_the_blas_threads() -> None:
    """A threaded product or inverse rounds differently with the number of threads, and on a
    face of optima that moves the point (a run's results moved with `--parallel` and with the
    machine's cores): the solves run on one BLAS thread, whatever the caller's setting."""
    rng = np.random.default_rng(60)
    weighted = rng.uniform(0.2, 3.0, (60, 3))
    scale_factors = rng.choice([1.0, 2.0], 60)
    points = []
    solve = interior.max_min_point.__wrapped__  # (solved each time: not the remembered answer)
    for threads in (1, 2):
        with threadpool_limits(limits=threads, user_api="blas"):
            points.append(solve(weighted, scale_factors, np.full(3, 10.0)))
    assert np.array_equal(points[0], points[1])


def test_a_program_asked_again_answers_as_it_did() -> None:
    """Gavel's rounds solve the very same program again and again (the agnostic policies: the
    same active scale factors): the answer is kept, bit for bit the solve's, and a caller that
    changes its copy changes nothing kept; other inputs are solved."""
    rng = np.random.default_rng(61)
    weighted = rng.uniform(0.2, 3.0, (30, 3))
    scale_factors = np.ones(30)
    gpus = np.full(3, 8.0)
    solved = interior.max_min_point.__wrapped__(weighted, scale_factors, gpus)
    first = interior.max_min_point(weighted, scale_factors, gpus)
    first[:] = -1.0
    again = interior.max_min_point(weighted.copy(), scale_factors.copy(), gpus.copy())
    assert np.array_equal(again, solved)
    other = interior.max_min_point(weighted, scale_factors, np.full(3, 4.0))
    assert np.array_equal(other, interior.max_min_point.__wrapped__(weighted, scale_factors,
                                                                    np.full(3, 4.0)))  # fmt: skip
    assert not np.array_equal(other, solved)


# ------------------------------------------------------------------------------------------------
# Throughput


def test_max_sum_throughput_gives_each_gpu_to_the_fastest_jobs() -> None:
    tput = np.array([[5.0], [1.0], [3.0], [2.0]])
    allocation = gp.max_sum_throughput(tput, np.ones(4), np.array([2.0]))
    assert allocation.objective == pytest.approx(8.0)
    assert allocation.shares[:, 0] == pytest.approx([1, 0, 1, 0])


def test_max_sum_throughput_reference_quirk_and_normalised_intent() -> None:
    # job 0 is fast everywhere, job 1 is slow and only runs on type 0: raw steps/s gives type 0
    # to job 0 (10 > 8 + 1); normalising by each job's total throughput gives it to job 1
    tput = np.array([[10.0, 8.0], [1.0, 0.0]])
    sf, gpus = np.ones(2), np.array([1.0, 1.0])
    raw = gp.max_sum_throughput(tput, sf, gpus)
    assert raw.shares[0, 0] == pytest.approx(1.0)
    assert raw.objective == pytest.approx(10.0)
    normalised = gp.max_sum_throughput(tput, sf, gpus, normalize=True)
    assert normalised.shares[1, 0] == pytest.approx(1.0)
    assert normalised.shares[0, 1] == pytest.approx(1.0)
    assert normalised.objective == pytest.approx(8 / 18 + 1.0)


def test_max_sum_throughput_with_costs_and_slos() -> None:
    tput = np.array([[4.0, 1.0], [4.0, 1.0]])
    sf, gpus = np.ones(2), np.array([1.0, 1.0])
    # V100 ten times the price: steps per dollar favour the cheap type
    cheap = gp.max_sum_throughput_normalized_by_cost(tput, sf, gpus, np.array([10.0, 1.0]))
    assert cheap.objective == pytest.approx(4 / 10 + 1 / 1)
    # an SLO job 1 cannot meet alone on the slow type forces it onto V100 for a while
    remaining = np.array([1e3, 2e3])
    slo = gp.max_sum_throughput(
        tput, sf, gpus, slos=np.array([np.nan, 1000.0]), remaining_steps=remaining
    )
    assert slo.stats.fallback is None
    assert slo.job_throughputs(tput)[1] >= 2.0 - 1e-9
    impossible = gp.max_sum_throughput(
        tput, sf, gpus, slos=np.array([np.nan, 100.0]), remaining_steps=remaining
    )
    assert "SLO" in impossible.stats.fallback
    assert impossible.objective == pytest.approx(gp.max_sum_throughput(tput, sf, gpus).objective)


# ------------------------------------------------------------------------------------------------
# Space sharing


@pytest.mark.parametrize("seed", range(4))
def test_packed_programs_match_a_per_pair_formulation(seed: int) -> None:
    tput, sf, _, packing = random_instance(seed)
    n = len(sf)
    gpus = np.array([2.0, 1.0])
    w = np.ones(n)
    mmf = gp.max_min_fairness(tput, sf, w, gpus, packing=packing)
    assert_feasible(mmf, tput, sf, gpus, packing)
    assert mmf.objective == pytest.approx(reference_max_min(tput, sf, w, gpus, packing), rel=1e-6)
    prop = gp.proportional_throughputs(tput, gpus)
    levels = sf * mmf.job_throughputs(tput, packing) / prop
    assert levels.min() == pytest.approx(mmf.objective, rel=1e-6)
    assert mmf.objective >= gp.max_min_fairness(tput, sf, w, gpus).objective - 1e-9

    rng = np.random.default_rng(seed)
    remaining = rng.uniform(1e3, 1e4, n)
    makespan = gp.min_total_duration(tput, sf, gpus, remaining, packing=packing, search="exact")
    assert_feasible(makespan, tput, sf, gpus, packing)
    assert makespan.objective == pytest.approx(
        reference_makespan(tput, sf, gpus, remaining, packing), rel=1e-6
    )

    filled = gp.max_min_fairness_water_filling(
        tput, sf, w, gpus, packing=packing, bottleneck_test="exact"
    )
    assert_feasible(filled, tput, sf, gpus, packing)
    assert filled.objective == pytest.approx(mmf.objective, rel=1e-6)
    filled_levels = np.sort(sf * filled.job_throughputs(tput, packing) / prop)
    assert filled_levels[0] == pytest.approx(mmf.objective, rel=1e-6)
    assert filled_levels.sum() >= np.sort(levels).sum() * (1 - 1e-6)

    since_start = rng.uniform(0, 1e3, n)
    ftf = gp.finish_time_fairness(tput, sf, w, gpus, remaining, since_start, packing=packing)
    assert_feasible(ftf, tput, sf, gpus, packing)
    assert ftf.objective == pytest.approx(
        reference_finish_time(tput, sf, gpus, remaining, since_start, packing), rel=1e-6
    )


def test_packed_finish_time_fairness_reference_weights_divide_throughputs() -> None:
    tput, sf, _, packing = random_instance(11, multi_gpu=False)
    n = len(sf)
    gpus = np.array([2.0, 1.0])
    weights = np.where(np.arange(n) % 2 == 0, 1.0, 2.0)
    rng = np.random.default_rng(11)
    remaining, since_start = rng.uniform(1e3, 1e4, n), rng.uniform(0, 1e3, n)
    allocation = gp.finish_time_fairness(
        tput, sf, weights, gpus, remaining, since_start, packing=packing
    )
    expected = reference_finish_time(
        tput, sf, gpus, remaining, since_start, packing, rate_scale=1.0 / weights
    )
    assert allocation.objective == pytest.approx(expected, rel=1e-6)


def test_packing_pairs_jobs_when_the_pair_is_worth_it() -> None:
    # four identical jobs, two GPUs; sharing gives each 0.8 of its speed: better than half a GPU
    tput = np.ones((4, 1))
    packing = gp.Packing(np.zeros(4, dtype=int), np.full((1, 1, 1), 0.8))
    allocation = gp.max_min_fairness(tput, np.ones(4), np.ones(4), np.array([2.0]), packing=packing)
    assert allocation.objective == pytest.approx(0.8)
    assert_feasible(allocation, tput, np.ones(4), np.array([2.0]), packing)
    assert len(allocation.pairs) == 6  # every pair of the four, symmetrically
    assert np.allclose(allocation.job_throughputs(tput, packing), 0.8)
    # a pair that may not share is never used
    blocked = gp.Packing(np.zeros(4, dtype=int), np.full((1, 1, 1), np.nan))
    alone = gp.max_min_fairness(tput, np.ones(4), np.ones(4), np.array([2.0]), packing=blocked)
    assert alone.pairs.size == 0 and alone.objective == pytest.approx(0.5)


def test_packing_across_job_types_realises_the_partner_group_times() -> None:
    # many jobs of two types (each type its own group): the partner-group variables must turn
    # into real job pairs whose totals give every job the rate the LP promised
    rng = np.random.default_rng(5)
    types = np.repeat([0, 1, 2], [5, 4, 3])
    since = rng.uniform(0, 100, 12)  # makes every job its own class
    table = np.array([[[0.6], [0.7], [0.5]], [[0.9], [0.4], [0.8]], [[0.5], [0.9], [0.6]]])
    packing = gp.Packing(types, table)
    tput = np.ones((12, 1))
    allocation = gp.finish_time_fairness(
        tput, np.ones(12), np.ones(12), np.array([4.0]), np.full(12, 1e3), since, packing=packing
    )
    assert_feasible(allocation, tput, np.ones(12), np.array([4.0]), packing)
    rho = (since + 1e3 / allocation.job_throughputs(tput, packing)) / (1e3 / (4 / 12))
    assert rho.max() == pytest.approx(allocation.objective, rel=1e-6)
    assert allocation.objective == pytest.approx(
        reference_finish_time(tput, np.ones(12), np.array([4.0]), np.full(12, 1e3), since, packing),
        rel=1e-6,
    )


# ------------------------------------------------------------------------------------------------
# Isolated, AlloX, Gandiva


def test_isolated_split_as_the_reference_computes_it() -> None:
    tput = np.array([[1.0, 0.0], [1.0, 1.0], [2.0, 1.0]])
    sf, gpus = np.array([1.0, 2.0, 1.0]), np.array([3.0, 6.0])
    allocation = gp.isolated(tput, sf, gpus)
    raw = np.array([[1.0, 2.0], [0.5, 1.0], [1.0, 2.0]])
    assert np.allclose(allocation.shares, raw / np.maximum(raw.sum(1), 1)[:, None])
    assert allocation.shares[0, 1] > 0  # the reference ignores that job 0 cannot use type 1
    skipping = gp.isolated(tput, sf, gpus, skip_unsupported=True)
    assert skipping.shares[0, 1] == 0
    assert_feasible(skipping, tput, sf, gpus)
    assert gp.isolated_throughputs(tput, sf, gpus) == pytest.approx(
        (tput * allocation.shares).sum(1)
    )


def brute_force_first_jobs(
    processing: np.ndarray, gpu_type: list[int]
) -> list[set[tuple[int, int]]]:
    """For each schedule minimising the sum of completion times (each job on one GPU, queues in
    shortest-first order), the (job, type) of every GPU's first job."""
    n, num_gpus = processing.shape[0], len(gpu_type)
    best, winners = math.inf, []
    for assignment in itertools.product(range(num_gpus), repeat=n):
        total, firsts = 0.0, set()
        for gpu in range(num_gpus):
            queue = sorted(
                (processing[j, gpu_type[gpu]], j) for j in range(n) if assignment[j] == gpu
            )
            total += sum(p * (len(queue) - position) for position, (p, _) in enumerate(queue))
            if queue:
                firsts.add((queue[0][1], gpu_type[gpu]))
        if total < best - 1e-9:
            best, winners = total, [firsts]
        elif abs(total - best) <= 1e-9:
            winners.append(firsts)
    return winners


@pytest.mark.parametrize("seed", range(5))
def test_allox_starts_the_jobs_of_an_optimal_schedule(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 5
    tput = rng.uniform(0.5, 3.0, (n, 2))
    remaining = rng.uniform(100, 1000, n)
    gpus = np.array([2.0, 1.0])
    allocation = gp.allox(tput, np.ones(n), gpus, remaining, rng.uniform(0, 10, n))
    assert_feasible(allocation, tput, np.ones(n), gpus)
    started = {(int(j), int(k)) for j, k in zip(*np.nonzero(allocation.shares), strict=True)}
    assert started in brute_force_first_jobs(remaining[:, None] / tput, [0, 0, 1])
    assert set(np.unique(allocation.shares)) <= {0.0, 1.0}


def test_allox_breaks_ties_by_starting_the_shortest() -> None:
    # three jobs, two identical GPUs: the shortest goes first on the GPU that runs two; which of
    # the other two runs alone costs the same, and the shorter one starts
    tput = np.ones((3, 1))
    allocation = gp.allox(
        tput, np.ones(3), np.array([2.0]), np.array([30.0, 10.0, 20.0]), np.zeros(3)
    )
    assert allocation.shares[:, 0].tolist() == [0.0, 1.0, 1.0]
    optimal = brute_force_first_jobs(np.array([[30.0], [10.0], [20.0]]), [0, 0])
    assert {(1, 0), (2, 0)} in optimal and {(0, 0), (1, 0)} in optimal


def test_allox_keeps_running_jobs_and_never_uses_unsupported_types() -> None:
    tput = np.array([[1.0, 1.0], [2.0, 0.0], [1.0, 0.5], [1.0, 1.0]])
    remaining = np.array([100.0, 100.0, 100.0, 100.0])
    previous = np.zeros((4, 2))
    previous[3, 1] = 1.0  # job 3 holds the only type-1 GPU
    allocation = gp.allox(
        tput, np.ones(4), np.array([1.0, 1.0]), remaining, np.zeros(4), previous=previous
    )
    assert allocation.shares[3].tolist() == [0.0, 1.0]
    assert allocation.shares[:, 0].sum() == 1.0  # the free V100 goes to one waiting job
    assert allocation.shares[1, 0] == 1.0  # the fastest there
    only_k80 = gp.allox(
        np.array([[0.0, 1.0]]), np.ones(1), np.array([1.0, 0.0]), np.array([10.0]), np.zeros(1)
    )
    assert np.all(only_k80.shares == 0)
    with pytest.raises(ValueError, match="single-GPU"):
        gp.allox(tput, np.array([1.0, 2.0, 1.0, 1.0]), np.array([1.0, 1.0]), remaining, np.zeros(4))


def test_gandiva_pairs_like_the_reference_and_keeps_good_pairs() -> None:
    n = 6
    tput = np.ones((n, 1))
    packing = gp.Packing(np.zeros(n, dtype=int), np.full((1, 1, 1), 0.7))
    fresh = np.full(n, gp.UNASSIGNED)
    allocation, state = gp.gandiva(
        tput, np.ones(n), np.array([2.0]), packing, fresh, random.Random(3)
    )
    # the reference: sample two of the unplaced jobs at a time, in job order
    rng, pool, expected = random.Random(3), list(range(n)), set()
    for _ in range(n):
        if len(pool) <= 1:
            break
        a, b = rng.sample(pool, 2)
        pool.remove(a)
        pool.remove(b)
        expected.add((min(a, b), max(a, b)))
    assert {tuple(p) for p in allocation.pairs.tolist()} == expected
    assert np.all(state[state] == np.arange(n))
    assert np.allclose(allocation.pair_shares, 2.0 / 3)  # 3 pairs share 2 GPUs equally
    assert_feasible(allocation, tput, np.ones(n), np.array([2.0]), packing)
    # a pair worth >= 1 (0.7 + 0.7) is kept whatever the random stream
    again, state_again = gp.gandiva(
        tput, np.ones(n), np.array([2.0]), packing, state, random.Random(99)
    )
    assert np.array_equal(state_again, state)
    assert np.array_equal(again.pairs, allocation.pairs)
    # a pair worth < 1 is undone and redrawn; jobs that fit run alone, unpaired
    poor = gp.Packing(np.zeros(n, dtype=int), np.full((1, 1, 1), 0.3))
    redrawn, _ = gp.gandiva(tput, np.ones(n), np.array([2.0]), poor, state, random.Random(3))
    assert {tuple(p) for p in redrawn.pairs.tolist()} == expected  # same draws from seed 3
    fits, fits_state = gp.gandiva(
        tput, np.ones(n), np.array([6.0]), packing, fresh, random.Random(3)
    )
    assert fits.pairs.size == 0 and np.allclose(fits.shares, 1.0)
    assert np.all(fits_state == gp.UNASSIGNED)


def test_gandiva_never_pairs_different_scale_factors() -> None:
    n = 10
    sf = np.array([1.0, 2.0] * 5)
    packing = gp.Packing(np.zeros(n, dtype=int), np.full((1, 1, 1), 0.9))
    allocation, state = gp.gandiva(
        np.ones((n, 1)), sf, np.array([4.0]), packing, np.full(n, gp.UNASSIGNED), random.Random(0)
    )
    assert_feasible(allocation, np.ones((n, 1)), sf, np.array([4.0]), packing)
    assert np.all(allocation.job_time() > 0)  # every job placed, alone or paired
    assert set(state.tolist()) <= set(range(n)) | {gp.ALONE}


# ------------------------------------------------------------------------------------------------
# Properties across programs


def test_same_input_same_allocation_and_identical_jobs_treated_alike() -> None:
    tput, sf, _, packing = random_instance(2, n=10)
    gpus = np.array([2.0, 2.0])
    first = gp.max_min_fairness(tput, sf, np.ones(10), gpus, packing=packing)
    second = gp.max_min_fairness(tput, sf, np.ones(10), gpus, packing=packing)
    assert np.array_equal(first.shares, second.shares)
    assert np.array_equal(first.pairs, second.pairs)
    assert np.array_equal(first.pair_shares, second.pair_shares)
    # permuting the jobs permutes the answer
    order = np.random.default_rng(0).permutation(10)
    permuted = gp.max_min_fairness(
        tput[order],
        sf[order],
        np.ones(10),
        gpus,
        packing=gp.Packing(packing.job_types[order], packing.pair_throughputs),
    )
    assert np.allclose(permuted.shares, first.shares[order])


def test_bad_input_gets_one_clear_line() -> None:
    with pytest.raises(ValueError, match="throughputs: expected"):
        gp.max_min_fairness(np.ones(3), np.ones(3), np.ones(3), np.ones(1))
    with pytest.raises(ValueError, match="scale_factors"):
        gp.max_min_fairness(np.ones((2, 1)), np.array([1.0, 1.5]), np.ones(2), np.ones(1))
    with pytest.raises(ValueError, match="priority_weights"):
        gp.max_min_fairness(np.ones((2, 1)), np.ones(2), np.array([1.0, 0.0]), np.ones(1))
    with pytest.raises(ValueError, match="finite"):
        gp.max_min_fairness(np.array([[np.nan]]), np.ones(1), np.ones(1), np.ones(1))
    with pytest.raises(ValueError, match="pair_throughputs"):
        gp.max_min_fairness(
            np.ones((2, 1)),
            np.ones(2),
            np.ones(2),
            np.ones(1),
            packing=gp.Packing(np.zeros(2, dtype=int), np.ones((1, 1, 2))),
        )
    with pytest.raises(ValueError, match="bottleneck_test"):
        gp.max_min_fairness_water_filling(
            np.ones((1, 1)), np.ones(1), np.ones(1), np.ones(1), bottleneck_test="fast"
        )  # type: ignore[arg-type]


def test_no_jobs_gives_an_empty_allocation() -> None:
    empty = np.zeros((0, 3))
    allocation = gp.max_min_fairness(empty, np.zeros(0), np.zeros(0), np.ones(3))
    assert allocation.shares.shape == (0, 3) and allocation.pairs.shape == (0, 2)


# ------------------------------------------------------------------------------------------------
# On Gavel's measured throughputs


def gavel_table(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(isolated throughputs [A, 3], pair table [A, A, 3], scale factor [A]) by job type."""
    raw = json.loads(path.read_text())
    gpu_types = ("v100", "p100", "k80")
    keys = sorted(raw["v100"])
    index = {key: i for i, key in enumerate(keys)}
    alone = np.zeros((len(keys), 3))
    pairs = np.zeros((len(keys), len(keys), 3))
    for k, gpu in enumerate(gpu_types):
        for key, entry in raw[gpu].items():
            alone[index[key], k] = entry["null"]
            for other, value in entry.items():
                if other != "null":
                    pairs[index[key], index[other], k] = value[0]
    scale = np.array([float(key.rsplit(",", 1)[1].strip(" )")) for key in keys])
    return alone, pairs, scale


def test_programs_on_gavel_throughputs(data) -> None:
    alone, pair_table, type_sf = gavel_table(data("gavel/simulation_throughputs.json"))
    rng = np.random.default_rng(0)
    n = 150
    types = rng.integers(0, len(type_sf), n)
    tput, sf = alone[types], type_sf[types]
    w = np.ones(n)
    gpus = np.array([12.0, 12.0, 12.0])
    packing = gp.Packing(types, pair_table)
    remaining = tput[:, 0] * rng.uniform(600, 6e4, n)
    since_start = rng.uniform(0, 3600, n)

    aware = gp.max_min_fairness(tput, sf, w, gpus)
    agnostic = gp.max_min_fairness(gp.agnostic_throughputs(tput), sf, w, gpus)
    packed = gp.max_min_fairness(tput, sf, w, gpus, packing=packing)
    filled = gp.max_min_fairness_water_filling(tput, sf, w, gpus)
    ftf = gp.finish_time_fairness(tput, sf, w, gpus, remaining, since_start)
    ftf_packed = gp.finish_time_fairness(tput, sf, w, gpus, remaining, since_start, packing=packing)
    makespan = gp.min_total_duration(tput, sf, gpus, remaining, search="exact")
    makespan_packed = gp.min_total_duration(
        tput, sf, gpus, remaining, packing=packing, search="exact"
    )
    for allocation in (aware, agnostic, filled, ftf, makespan):
        assert_feasible(
            allocation, tput if allocation is not agnostic else np.ones_like(tput), sf, gpus
        )
    for allocation in (packed, ftf_packed, makespan_packed):
        assert_feasible(allocation, tput, sf, gpus, packing)
    prop = gp.proportional_throughputs(tput, gpus)
    aware_level = (sf * aware.job_throughputs(tput) / prop).min()
    agnostic_level = (sf * agnostic.job_throughputs(tput) / prop).min()
    assert aware_level == pytest.approx(aware.objective, rel=1e-6)
    assert aware_level >= agnostic_level
    # sharing GPUs can only help each program's own objective
    assert packed.objective >= aware.objective * (1 - 1e-9)
    assert ftf_packed.objective <= ftf.objective * (1 + 1e-6)
    assert makespan_packed.objective <= makespan.objective * (1 + 1e-9)
    assert packed.pairs.size > 0
    assert filled.objective == pytest.approx(aware.objective, rel=1e-6)


_POINTS_SCRIPT = """
import hashlib
import numpy as np
from gpuyard.policies.gavel import programs as gp
rng = np.random.default_rng(7)
digest = hashlib.blake2b(digest_size=16)
for n in (5, 12, 40):
    tput = rng.uniform(0.2, 5.0, (n, 3))
    sf = rng.choice([1.0, 2.0, 4.0], n)
    gpus = np.array([8.0, 8.0, 8.0])
    remaining = rng.uniform(100.0, 5000.0, n)
    since = rng.uniform(0.0, 900.0, n)
    for found in (
        gp.max_min_fairness(tput, sf, np.ones(n), gpus, tie_break="interior"),
        gp.min_total_duration(tput, sf, gpus, remaining, tie_break="interior"),
        gp.finish_time_fairness(tput, sf, np.ones(n), gpus, remaining, since, tie_break="interior"),
    ):
        digest.update(found.shares.tobytes())
print(digest.hexdigest())
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 OpenBLAS kernels")
def test_interior_points_are_the_same_bits_whatever_blas_kernel_runs() -> None:
    """The interior points (and so a Gavel run's results) do not depend on which kernel OpenBLAS
    picks for the processor: under three x86 kernels, whose inverses and dot products round
    differently, the points agree bit for bit."""
    digests = set()
    for kernel in ("Prescott", "Sandybridge", "Haswell"):
        env = {**os.environ, "OPENBLAS_CORETYPE": kernel}
        done = subprocess.run([sys.executable, "-c", _POINTS_SCRIPT], env=env, check=True,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        digests.add(done.stdout.strip())
    assert len(digests) == 1

"""The numpy LP/MILP helper (gpuyard.policies.toolkit.lp) on real OR-Tools solves."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gpuyard.policies.toolkit.lp import Infeasible, LinearProgram


def small_lp() -> tuple[LinearProgram, np.ndarray]:
    """max x0 + 2 x1 s.t. x0 + x1 <= 3, x0 - x1 >= -1, 0 <= x <= (2, 2.5): x1 <= x0 + 1 and
    x0 + x1 <= 3 meet at the optimum (1, 2), objective 5."""
    lp = LinearProgram()
    x = lp.add_variables(2, ub=[2.0, 2.5])
    lp.add_constraints(
        [0, 0, 1, 1],
        [x[0], x[1], x[0], x[1]],
        [1, 1, 1, -1],
        lb=[-math.inf, -1.0],
        ub=[3.0, math.inf],
    )
    lp.set_objective(x, [1.0, 2.0], maximize=True)
    return lp, x


@pytest.mark.parametrize("solver", ["glop", "highs", "scip", "pdlp"])
def test_lp_optimum_matches_hand_solution(solver: str) -> None:
    lp, x = small_lp()
    solution = lp.solve(solver)
    assert solution.optimal
    assert solution.objective == pytest.approx(5.0, abs=1e-6)
    assert solution[x] == pytest.approx([1.0, 2.0], abs=1e-6)


def test_duplicate_triplets_are_summed_and_blocks_keep_their_shape() -> None:
    lp = LinearProgram()
    x = lp.add_variables((2, 3), ub=10.0)
    assert x.shape == (2, 3)
    # one row, every variable twice with coefficient 0.5: sum x <= 6
    rows = np.zeros(12, dtype=int)
    cols = np.concatenate([x.ravel(), x.ravel()])
    lp.add_constraints(rows, cols, 0.5, ub=6.0)
    # objective with repeated columns: 1 + 2 on x[1, 2] -> the best column is x[1, 2] (3 per unit)
    lp.set_objective(np.array([x[0, 0], x[1, 2], x[1, 2]]), [1.0, 1.0, 2.0], maximize=True)
    solution = lp.solve()
    assert solution.objective == pytest.approx(18.0)
    assert solution[x][1, 2] == pytest.approx(6.0)
    assert solution[x].shape == (2, 3)


@pytest.mark.parametrize("solver", ["scip", "cp_sat", "highs"])
def test_integer_knapsack_matches_brute_force(solver: str) -> None:
    weights, values, capacity = [3, 5, 7, 4], [4, 6, 9, 5], 17
    lp = LinearProgram()
    y = lp.add_variables(4, ub=3, integer=True)
    lp.add_constraints(np.zeros(4, dtype=int), y, weights, ub=capacity)
    lp.set_objective(y, values, maximize=True)
    best = max(
        sum(v * c for v, c in zip(values, counts, strict=True))
        for counts in itertools.product(range(4), repeat=4)
        if sum(w * c for w, c in zip(weights, counts, strict=True)) <= capacity
    )
    solution = lp.solve(solver)
    assert solution.objective == pytest.approx(best)
    assert np.allclose(solution[y], np.round(solution[y]))


def test_default_solver_handles_integers_and_lp_only_solvers_refuse_them() -> None:
    lp = LinearProgram()
    y = lp.add_variables(1, ub=2.5, integer=True)
    lp.set_objective(y, 1.0, maximize=True)
    assert lp.solve().objective == pytest.approx(2.0)
    with pytest.raises(ValueError, match="LPs only"):
        lp.solve("glop")


@pytest.mark.parametrize("solver", ["glop", "highs", "scip"])
def test_infeasible_model_raises_infeasible(solver: str) -> None:
    lp = LinearProgram()
    x = lp.add_variables(2, ub=1.0)
    lp.add_constraints([0, 0], x, 1.0, lb=3.0)
    with pytest.raises(Infeasible, match=solver):
        lp.solve(solver)


def test_copy_is_independent_and_bounds_can_change_between_solves() -> None:
    lp, x = small_lp()
    tighter = lp.copy()
    tighter.set_bounds(x[1], ub=1.0)
    tighter.add_constraints([0], [x[0]], 1.0, ub=1.5)
    assert tighter.solve().objective == pytest.approx(1.5 + 2.0)
    assert lp.solve().objective == pytest.approx(5.0)  # the original is untouched


def test_bad_input_gets_one_clear_error() -> None:
    lp = LinearProgram()
    x = lp.add_variables(2)
    with pytest.raises(ValueError, match="names no declared variable"):
        lp.add_constraints([0], [5], 1.0, ub=1.0)
    with pytest.raises(ValueError, match="lower bound exceeds"):
        lp.add_constraints([0], [x[0]], 1.0, lb=2.0, ub=1.0)
    with pytest.raises(ValueError, match="finite"):
        lp.add_constraints([0], [x[0]], math.nan, ub=1.0)
    with pytest.raises(ValueError, match="unknown solver"):
        lp.solve("cplex")  # type: ignore[arg-type]


def test_same_model_same_answer_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    n = 60
    lp = LinearProgram()
    x = lp.add_variables((n, 3), ub=1.0)
    level = lp.add_variables(1)
    tput = rng.uniform(0.1, 2.0, (n, 3))
    rows = np.concatenate([np.repeat(np.arange(n), 3), np.arange(n)])
    cols = np.concatenate([x.ravel(), np.full(n, level[0])])
    lp.add_constraints(rows, cols, np.concatenate([-tput.ravel(), np.ones(n)]), ub=0.0)
    lp.add_constraints(np.repeat(np.arange(n), 3), x.ravel(), 1.0, ub=1.0)
    lp.add_constraints(np.tile(np.arange(3), n), x.ravel(), 1.0, ub=[5.0, 7.0, 11.0])
    lp.set_objective(level, 1.0, maximize=True)
    first, second = lp.solve(), lp.solve()
    assert np.array_equal(first.values, second.values)
    assert first.objective == second.objective

"""Linear and mixed-integer programs built from numpy arrays and solved with OR-Tools.

A caller declares variables in blocks (`add_variables` returns an index array of any shape),
adds constraint rows as COO triplets of numpy arrays (`add_constraints(rows, cols, coefs)`, row
numbers local to the call, duplicates summed), sets a linear objective, and solves. Nothing loops
in Python per variable or per row: the model is kept as flat arrays and handed to the solver in
one piece.

Why MathOpt's model proto rather than `model_builder` or `pywraplp`: those create variables in bulk
(`model_builder.new_var_series`, as pandas Series) but add constraints one Python call at a time;
their one bulk entry point, `ModelBuilderHelper.fill_model_from_sparse_data`, takes a scipy CSR
matrix, and scipy is not a gpuyard dependency. MathOpt's `ModelProto` stores the whole constraint
matrix as three flat vectors (row ids, column ids, coefficients) and every bound as a flat vector,
so building it is a sort and a handful of bulk copies. The solve goes through MathOpt's core
`solve` entry point, the one `mathopt.solve()` calls: that wrapper would then turn the result into
one Python object per variable, which costs more than the solve itself on large models.

Solvers (`Solver`): "glop" (primal/dual simplex; the default for LPs), "pdlp" (first-order
primal-dual method for LPs too large for simplex; solutions are accurate to its tolerance, not a
vertex; on the Gavel programs up to ~150k variables GLOP was still 2-4x faster), "highs"
(simplex/interior point and MIP), "scip" (MILP; the default when a model has integer variables),
"cp_sat" (integer models; continuous variables are only approximated, so prefer "scip" for mixed
models). PDLP, SCIP and CP-SAT run single-threaded with a fixed seed, GLOP and HiGHS are
deterministic as they are: the same model gives the same answer bit for bit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, cast

import numpy as np
from ortools.math_opt import model_pb2, result_pb2, solution_pb2
from ortools.math_opt.core.python import solver as _core_solver
from ortools.math_opt.python import mathopt
from ortools.math_opt.python.callback import CallbackRegistration
from ortools.math_opt.python.init_arguments import StreamableSolverInitArguments
from ortools.math_opt.python.model_parameters import ModelSolveParameters
from pybind11_abseil.status import StatusNotOk

Solver = Literal["glop", "pdlp", "highs", "scip", "cp_sat"]

_SOLVER_TYPES: dict[str, mathopt.SolverType] = {
    "glop": mathopt.SolverType.GLOP,
    "pdlp": mathopt.SolverType.PDLP,
    "highs": mathopt.SolverType.HIGHS,
    "scip": mathopt.SolverType.GSCIP,
    "cp_sat": mathopt.SolverType.CP_SAT,
}
_LP_ONLY = {"glop", "pdlp"}
_THREADED = {"pdlp", "scip", "cp_sat"}  # HiGHS takes its thread count from globals
_SEEDED = {"highs", "scip", "cp_sat"}

_REASON = result_pb2.TerminationReasonProto
_FEASIBLE = solution_pb2.SolutionStatusProto.SOLUTION_STATUS_FEASIBLE


class SolveError(RuntimeError):
    """The solver returned no usable solution (time limit without a solution, numerical trouble)."""


class Infeasible(SolveError):
    """The model has no feasible solution (or, as some presolvers put it, is infeasible or
    unbounded)."""


@dataclass(frozen=True)
class Solution:
    """Variable values (index them with the arrays `add_variables` returned) and solve facts."""

    values: np.ndarray
    objective: float
    optimal: bool
    """False when a limit stopped the solver with a feasible but unproven solution."""
    export_seconds: float
    """Sorting the triplets and filling the model proto."""
    solve_seconds: float
    """The solver call, including handing the model over and reading the values back."""

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        return cast(np.ndarray, self.values[index])


def _broadcast(value: float | np.ndarray, size: int, what: str) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    try:
        return np.broadcast_to(array, (size,)).copy() if array.ndim <= 1 else array.reshape(size)
    except ValueError as exc:
        raise ValueError(
            f"{what}: expected a scalar or {size} values, got shape {array.shape}"
        ) from exc


class LinearProgram:
    """A linear or mixed-integer program kept as numpy arrays (module docstring)."""

    def __init__(self) -> None:
        self._var_lb: list[np.ndarray] = []
        self._var_ub: list[np.ndarray] = []
        self._var_int: list[np.ndarray] = []
        self.num_variables = 0
        self._rows: list[np.ndarray] = []
        self._cols: list[np.ndarray] = []
        self._coefs: list[np.ndarray] = []
        self._row_lb: list[np.ndarray] = []
        self._row_ub: list[np.ndarray] = []
        self.num_constraints = 0
        self._obj_cols = np.zeros(0, dtype=np.int64)
        self._obj_coefs = np.zeros(0)
        self._maximize = False
        self._offset = 0.0
        self._overrides: list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]] = []

    def copy(self) -> LinearProgram:
        """An independent copy to extend (cheap: the stored arrays are shared, never mutated)."""
        other = LinearProgram()
        for name, value in vars(self).items():
            setattr(other, name, list(value) if isinstance(value, list) else value)
        return other

    # -- variables --------------------------------------------------------------------------------

    def add_variables(
        self,
        shape: int | tuple[int, ...],
        *,
        lb: float | np.ndarray = 0.0,
        ub: float | np.ndarray = math.inf,
        integer: bool = False,
    ) -> np.ndarray:
        """Declare `prod(shape)` variables; returns their indices as an int64 array of `shape`.
        `lb`/`ub` broadcast to `shape` (use +-inf for free)."""
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        size = math.prod(shape)
        lb_array = np.broadcast_to(np.asarray(lb, dtype=np.float64), shape).reshape(size)
        ub_array = np.broadcast_to(np.asarray(ub, dtype=np.float64), shape).reshape(size)
        if np.any(lb_array > ub_array):
            raise ValueError("a variable's lower bound exceeds its upper bound")
        self._var_lb.append(lb_array.copy())
        self._var_ub.append(ub_array.copy())
        self._var_int.append(np.full(size, integer))
        index = np.arange(self.num_variables, self.num_variables + size, dtype=np.int64)
        self.num_variables += size
        return index.reshape(shape)

    def set_bounds(
        self,
        index: np.ndarray,
        *,
        lb: float | np.ndarray | None = None,
        ub: float | np.ndarray | None = None,
    ) -> None:
        """Change the bounds of already declared variables (e.g. between iterative solves)."""
        flat = np.asarray(index, dtype=np.int64).ravel()
        lb_array = None if lb is None else _broadcast(lb, flat.size, "lb")
        ub_array = None if ub is None else _broadcast(ub, flat.size, "ub")
        self._overrides.append((flat, lb_array, ub_array))

    # -- constraints ------------------------------------------------------------------------------

    def add_constraints(
        self,
        rows: np.ndarray,
        cols: np.ndarray,
        coefs: np.ndarray | float,
        *,
        lb: float | np.ndarray = -math.inf,
        ub: float | np.ndarray = math.inf,
        num_rows: int | None = None,
    ) -> np.ndarray:
        """Add `num_rows` constraints `lb <= A x <= ub`, A given as COO triplets: `rows` numbered
        from 0 within this call, `cols` variable indices, `coefs` (a scalar broadcasts);
        duplicate (row, col) entries are summed. `num_rows` defaults to `rows.max() + 1` (pass it
        when trailing rows are empty). Returns the global row indices."""
        rows = np.asarray(rows, dtype=np.int64).ravel()
        cols = np.asarray(cols, dtype=np.int64).ravel()
        coefs = np.broadcast_to(np.asarray(coefs, dtype=np.float64), rows.shape).ravel()
        if rows.shape != cols.shape:
            raise ValueError(f"rows and cols differ in length ({rows.size} vs {cols.size})")
        if num_rows is None:
            num_rows = int(rows.max()) + 1 if rows.size else 0
        if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
            raise ValueError(f"row numbers must lie in [0, {num_rows})")
        if cols.size and (cols.min() < 0 or cols.max() >= self.num_variables):
            raise ValueError("a column index names no declared variable")
        if not np.all(np.isfinite(coefs)):
            raise ValueError("constraint coefficients must be finite")
        row_lb, row_ub = _broadcast(lb, num_rows, "lb"), _broadcast(ub, num_rows, "ub")
        if np.any(row_lb > row_ub) or np.any(np.isnan(row_lb)) or np.any(np.isnan(row_ub)):
            raise ValueError("a constraint's lower bound exceeds its upper bound (or is NaN)")
        self._rows.append(rows + self.num_constraints)
        self._cols.append(cols)
        self._coefs.append(coefs)
        self._row_lb.append(row_lb)
        self._row_ub.append(row_ub)
        start = self.num_constraints
        self.num_constraints += num_rows
        return np.arange(start, start + num_rows, dtype=np.int64)

    def set_objective(
        self,
        cols: np.ndarray,
        coefs: np.ndarray | float,
        *,
        maximize: bool,
        offset: float = 0.0,
    ) -> None:
        """Objective `offset + sum coefs * x[cols]` (duplicates summed), replacing any earlier one."""
        cols = np.asarray(cols, dtype=np.int64).ravel()
        coefs = np.broadcast_to(np.asarray(coefs, dtype=np.float64), cols.shape).ravel()
        if not np.all(np.isfinite(coefs)):
            raise ValueError("objective coefficients must be finite")
        self._obj_cols, self._obj_coefs = cols, coefs.copy()
        self._maximize, self._offset = maximize, float(offset)

    # -- export and solve -------------------------------------------------------------------------

    def _variable_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lb = np.concatenate(self._var_lb) if self._var_lb else np.zeros(0)
        ub = np.concatenate(self._var_ub) if self._var_ub else np.zeros(0)
        integer = np.concatenate(self._var_int) if self._var_int else np.zeros(0, dtype=bool)
        for index, new_lb, new_ub in self._overrides:
            if new_lb is not None:
                lb[index] = new_lb
            if new_ub is not None:
                ub[index] = new_ub
        return lb, ub, integer

    @property
    def has_integers(self) -> bool:
        return any(block.any() for block in self._var_int)

    def to_proto(self) -> model_pb2.ModelProto:
        """The model as a MathOpt `ModelProto` (triplets sorted row-major, duplicates summed)."""
        lb, ub, integer = self._variable_arrays()
        if np.any(lb > ub):
            raise ValueError("a variable's lower bound exceeds its upper bound")
        proto = model_pb2.ModelProto()
        variables = proto.variables
        variables.ids.extend(range(self.num_variables))
        variables.lower_bounds.extend(lb.tolist())
        variables.upper_bounds.extend(ub.tolist())
        variables.integers.extend(integer.tolist())

        constraints = proto.linear_constraints
        constraints.ids.extend(range(self.num_constraints))
        if self.num_constraints:
            constraints.lower_bounds.extend(np.concatenate(self._row_lb).tolist())
            constraints.upper_bounds.extend(np.concatenate(self._row_ub).tolist())
        if self._rows:
            rows, cols, coefs = _sum_duplicates(
                np.concatenate(self._rows), np.concatenate(self._cols), np.concatenate(self._coefs)
            )
            matrix = proto.linear_constraint_matrix
            matrix.row_ids.extend(rows.tolist())
            matrix.column_ids.extend(cols.tolist())
            matrix.coefficients.extend(coefs.tolist())

        objective = proto.objective
        objective.maximize = self._maximize
        objective.offset = self._offset
        if self._obj_cols.size:
            cols, coefs = _sum_duplicates_1d(self._obj_cols, self._obj_coefs)
            objective.linear_coefficients.ids.extend(cols.tolist())
            objective.linear_coefficients.values.extend(coefs.tolist())
        return proto

    def solve(
        self,
        solver: Solver | None = None,
        *,
        time_limit: float | None = None,
        relative_gap: float | None = None,
        enable_output: bool = False,
    ) -> Solution:
        """Solve; `solver` defaults to "scip" for models with integer variables, else "glop".
        Raises `Infeasible` for an infeasible model and `SolveError` when no solution came back
        (e.g. the time limit passed first). `relative_gap` is the MIP optimality gap."""
        if solver is None:
            solver = "scip" if self.has_integers else "glop"
        if solver not in _SOLVER_TYPES:
            raise ValueError(f"unknown solver {solver!r}; choose one of {sorted(_SOLVER_TYPES)}")
        if solver in _LP_ONLY and self.has_integers:
            raise ValueError(f"{solver} solves LPs only; the model has integer variables")
        started = time.perf_counter()
        proto = self.to_proto()
        exported = time.perf_counter()
        params = mathopt.SolveParameters(
            time_limit=None if time_limit is None else timedelta(seconds=time_limit),
            threads=1 if solver in _THREADED else None,
            random_seed=0 if solver in _SEEDED else None,
            relative_gap_tolerance=relative_gap,
            enable_output=enable_output,
        )
        try:
            result = _core_solver.solve(
                proto,
                _SOLVER_TYPES[solver].value,
                StreamableSolverInitArguments().to_proto(),
                params.to_proto(),
                ModelSolveParameters().to_proto(),
                None,
                CallbackRegistration().to_proto(),
                None,
                None,
            )
        except StatusNotOk as exc:
            raise SolveError(f"{solver} refused the model: {exc}") from None
        reason = result.termination.reason
        if reason in (
            _REASON.TERMINATION_REASON_INFEASIBLE,
            _REASON.TERMINATION_REASON_INFEASIBLE_OR_UNBOUNDED,
        ):
            raise Infeasible(
                f"{solver}: {_REASON.Name(reason).removeprefix('TERMINATION_REASON_').lower()}"
                f" ({self.num_variables} variables, {self.num_constraints} constraints)"
            )
        primal = next(
            (
                s.primal_solution
                for s in result.solutions
                if s.HasField("primal_solution")
                and s.primal_solution.feasibility_status == _FEASIBLE
            ),
            None,
        )
        if primal is None:
            detail = result.termination.detail or "no detail"
            raise SolveError(
                f"{solver} returned no feasible solution: "
                f"{_REASON.Name(reason).removeprefix('TERMINATION_REASON_').lower()} ({detail})"
            )
        values = np.zeros(self.num_variables)
        ids = np.asarray(primal.variable_values.ids, dtype=np.int64)
        values[ids] = np.asarray(primal.variable_values.values, dtype=np.float64)
        finished = time.perf_counter()
        return Solution(
            values=values,
            objective=float(primal.objective_value),
            optimal=reason == _REASON.TERMINATION_REASON_OPTIMAL,
            export_seconds=exported - started,
            solve_seconds=finished - exported,
        )


def _sum_duplicates(
    rows: np.ndarray, cols: np.ndarray, coefs: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort COO triplets row-major, sum repeated (row, col) entries, drop zeros."""
    order = np.lexsort((cols, rows))
    rows, cols, coefs = rows[order], cols[order], coefs[order]
    if rows.size:
        starts = np.flatnonzero(
            np.concatenate(([True], (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])))
        )
        if starts.size != rows.size:
            coefs = np.add.reduceat(coefs, starts)
            rows, cols = rows[starts], cols[starts]
    keep = coefs != 0.0
    return rows[keep], cols[keep], coefs[keep]


def _sum_duplicates_1d(cols: np.ndarray, coefs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    _, cols, coefs = _sum_duplicates(np.zeros_like(cols), cols, coefs)
    return cols, coefs

"""BFTrainer (Liu et al., 2021): elastic training on a supercomputer's idle nodes, re-allocated by a
MILP (`bftrainer`) or by equal shares (`bftrainer-equal`) whenever nodes come and go."""

from .milp import Outcome, Problem, best_counts, equal_share, node_map, reference_step, solve_milp
from .policy import BFTrainer, BFTrainerParams, BFTrainerState, EqualShare, EqualShareParams

__all__ = [
    "BFTrainer", "BFTrainerParams", "BFTrainerState", "EqualShare", "EqualShareParams", "Outcome",
    "Problem", "best_counts", "equal_share", "node_map", "reference_step", "solve_milp",
]  # fmt: skip

"""Sia (SOSP '23): heterogeneity-aware, goodput-aware scheduling over configurations of GPU
type, nodes and GPUs, solved as a 0/1 program on CP-SAT (`ilp`), over the costs of `costs` and
the models' per-GPU-type profiles (`gpuyard.shared.typed_goodput`, which also holds a job's side
of the artifact's simulator)."""

from .costs import COST_CLIP, ZERO_GAIN, costs, docked, normalised_row, restart_factor
from .ilp import Configurations, Solution, configurations, objective, solve
from .sia import Sia, SiaParams, SiaState, cluster_shape

__all__ = [
    "COST_CLIP",
    "ZERO_GAIN",
    "Configurations",
    "Sia",
    "SiaParams",
    "SiaState",
    "Solution",
    "cluster_shape",
    "configurations",
    "costs",
    "docked",
    "normalised_row",
    "objective",
    "restart_factor",
    "solve",
]  # fmt: skip

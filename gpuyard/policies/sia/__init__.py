"""Sia (SOSP '23): heterogeneity-aware, goodput-aware scheduling over configurations of GPU
type, nodes and GPUs, solved as a 0/1 program on CP-SAT (`ilp`), over the costs of `costs` and
the per-GPU-type profiles of `profiles`; `training` is a job's side of the artifact's simulator
(per-type profiles and fits), for a simulation that reproduces it."""

from .costs import COST_CLIP, ZERO_GAIN, costs, docked, normalised_row, restart_factor
from .ilp import Configurations, Solution, configurations, objective, solve
from .profiles import TypedProfiles
from .sia import Sia, SiaParams, SiaState, cluster_shape
from .training import SLOWDOWNS, TypedGoodputJob

__all__ = [
    "COST_CLIP",
    "SLOWDOWNS",
    "ZERO_GAIN",
    "Configurations",
    "Sia",
    "SiaParams",
    "SiaState",
    "Solution",
    "TypedGoodputJob",
    "TypedProfiles",
    "cluster_shape",
    "configurations",
    "costs",
    "docked",
    "normalised_row",
    "objective",
    "restart_factor",
    "solve",
]  # fmt: skip

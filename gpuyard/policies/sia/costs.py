"""Sia's cost matrix: each job's goodput on each configuration, normalised, docked for a
restart, raised to the power p (`sia-simulator/sia.py` `optimize_mip` and
`__solve_mip_rescaled`).

A row starts as the job's goodput (useful samples per second) on each configuration it may use,
on every GPU type: measured on a type it ran on, projected on one it never ran on from a type it
did ("bootstrapping": the goodput there times the ratio of the two types' one-GPU throughputs),
unknown where it never ran anywhere (then only one GPU of that type is offered, at value 1).
The row is divided by its smallest positive entry, so a job's least useful configuration is
worth 1 whatever its model (the reference's fairness normalisation); if the job runs now, every
configuration but its current one is scaled by its restart factor; the cost is the value to the
power p, rounded to two decimals and capped at 3000.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .ilp import Configurations

FloatArray = npt.NDArray[np.float64]

ZERO_GAIN = 1e-4
"""The value of a configuration a job cannot use (the reference's ZERO_ALLOC_GAIN): its cost
1e-4^p (100 for p = -0.5) is never worth choosing."""
COST_CLIP = 3000.0
"""Costs above this are capped (the reference's sia_goodput_clip_val)."""


def restart_factor(age: float, restarts: int, penalty_s: float) -> float:
    """The share of its goodput a job keeps if it restarts (the Pollux factor the reference
    uses): max(age - restarts x penalty, 0) / (age + penalty); 1 for a job younger than the
    penalty."""
    if age < penalty_s:
        return 1.0
    return max(age - restarts * penalty_s, 0.0) / (age + penalty_s)


def normalised_row(
    goodput: FloatArray, unknown_types: npt.NDArray[np.bool_], configs: Configurations
) -> FloatArray:
    """A job's values: `goodput` on each configuration (NaN where it may not use it), its types
    with no goodput at all flagged in `unknown_types`."""
    row = np.full(len(configs), ZERO_GAIN)
    usable = ~np.isnan(goodput)
    row[usable] = goodput[usable]
    known = ~unknown_types[configs.type_index]
    positive = row[known & (row > ZERO_GAIN)]
    row = row * (1.0 / positive.min() if positive.size else 1.0)
    row[unknown_types[configs.type_index] & (configs.gpus == 1)] = 1.0
    row[row <= ZERO_GAIN] = ZERO_GAIN
    return row


def docked(row: FloatArray, current: int | None, factor: float) -> FloatArray:
    """`row` with every configuration but the `current` one scaled by the restart `factor` (a
    job that does not run now is not docked)."""
    if current is None:
        return row
    out = row * factor
    out[current] = row[current]
    return out


def costs(
    values: FloatArray, power: float, decimals: int = 2, clip: float = COST_CLIP
) -> FloatArray:
    """The program's coefficients: values^power, rounded, capped."""
    with np.errstate(divide="ignore", over="ignore"):
        raised = np.power(values, power)
    return np.minimum(np.round(raised, decimals), clip)

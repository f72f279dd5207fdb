"""Workloads: load the reference systems' traces, generate synthetic ones, describe clusters.

Entry points: `load_workload(path, format=None, skip_bad=False)`, the generators `blox`, `gavel`,
`elasticflow` and `calibrated` (helios, seren, kalos, pai, philly: published cluster statistics),
`save_workload`, `to_frame`/`from_frame`, and `load_cluster`.
"""

from .calibrated import calibrated
from .churn import load_node_events, save_node_events
from .clusterlogs import load_acme, load_helios
from .clusters import load_cluster
from .core import JOB_FIELDS, Workload, WorkloadError, describe, to_frame
from .formats import (
    from_frame,
    load_bftrainer,
    load_blox_jobs,
    load_elasticflow,
    load_gavel_trace,
    load_native,
    load_philly,
    save_workload,
)
from .generators import blox, elasticflow, gavel, poisson_arrivals
from .loader import LOADERS, detect_format, load_workload
from .pai import load_pai

__all__ = [
    "JOB_FIELDS",
    "LOADERS",
    "Workload",
    "WorkloadError",
    "blox",
    "calibrated",
    "describe",
    "detect_format",
    "elasticflow",
    "from_frame",
    "gavel",
    "load_acme",
    "load_bftrainer",
    "load_blox_jobs",
    "load_cluster",
    "load_elasticflow",
    "load_gavel_trace",
    "load_helios",
    "load_native",
    "load_node_events",
    "load_pai",
    "load_philly",
    "load_workload",
    "poisson_arrivals",
    "save_node_events",
    "save_workload",
    "to_frame",
]

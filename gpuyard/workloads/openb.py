"""Alibaba's openb pod lists (ATC '23 "Beware of Fragmentation", alibaba/clusterdata
`cluster-trace-gpu-v2023`): `openb_pod_list_*.csv`.

    name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
    deletion_time,scheduled_time

Times are whole seconds on the trace's own clock (no date). Each pod becomes a job:
job_id = name, submit_time = creation_time - the first creation of the pods loaded (that first
creation is `Workload.metadata["first_creation_s"]`), duration = deletion_time - scheduled_time
(the time the pod held its resources; the wait from creation to scheduling was the production
scheduler's, which the simulated one replaces), num_gpus = num_gpu.

GPU sharing: `gpu_milli` below 1000 on a one-GPU pod asks for that share of one GPU
(`JobSpec.gpu_milli`; how many do is `metadata["fraction_of_a_gpu"]`). CPUs and memory:
`cpu_milli` and `memory_mib` are the job's (counted on nodes that give theirs: an openb node
list does).

GPU types: `gpu_spec` lists the types a pod may run on, `|`-separated, empty for any. One type
is the job's gpu_type (spelled as the node list's `model`, so it runs only there); several are
its `gpu_types` (`metadata["several_gpu_types"]` counts those). A file without the column has no
constraints. (openb_pod_list_multigpu50.csv
has neither gpu_spec nor any time: it cannot be replayed, and loading it says which column is
missing.)

Pods left out, each counted in `metadata["left_out"]` (none of them is an error): CPU-only pods
(num_gpu 0; `cpu_jobs="keep"` keeps them as one-GPU jobs marked `cpu_only` in extras, as for
Helios), pods never scheduled (no scheduled_time: Pending at the end of the trace), pods with no
deletion_time, and pods whose run time is zero or negative.

pod_phase (Running, Succeeded, Failed, Pending) stays in extras: every replayed job completes
after its recorded run time. A Running pod's deletion_time is where the trace ends, so its run
time is cut there. extras: gpu_spec, qos, pod_phase, and the scheduled and deletion times in
seconds on the jobs' clock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpuyard.shared.model import ANY_GPU

from .clusterlogs import CpuJobs, left_out_rows
from .core import Workload, WorkloadError, build_jobs, nan_to_none, numeric_column
from .formats import _required_str, _str_column, read_table

OPENB_REQUIRED = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time",
                  "scheduled_time")  # fmt: skip
ODDITIES = ("cpu_only", "never_scheduled", "no_deletion_time", "non_positive_run_time")
"""Why a pod is left out (not an error), in the order they are checked."""
WHOLE_GPU_MILLI = 1000


def load_openb(path: str | Path, *, cpu_jobs: CpuJobs = "skip", skip_bad: bool = False) -> Workload:
    """An openb pod list (module docstring)."""
    import pandas as pd

    if cpu_jobs not in ("skip", "keep"):
        raise ValueError(f"cpu_jobs must be 'skip' or 'keep', not {cpu_jobs!r}")
    text = {"name": str, "gpu_spec": str, "qos": str, "pod_phase": str}
    t = read_table(path, required=OPENB_REQUIRED, dtype=text, skip_bad=skip_bad)
    df, lines = t.df, t.lines
    bad: dict[int, WorkloadError] = {}

    def number(column: str, *, required: bool = True, integer: bool = False) -> np.ndarray:
        return numeric_column(df[column], column, path=path, lines=lines, bad=bad,
                              required=required, integer=integer)  # fmt: skip

    names = _required_str(df["name"], "name", path, lines, bad)
    gpus = number("num_gpu", integer=True)
    milli = number("gpu_milli")
    created = number("creation_time")
    scheduled = number("scheduled_time", required=False)
    deleted = number("deletion_time", required=False)
    run = deleted - scheduled
    specs = _str_column(df["gpu_spec"]) if "gpu_spec" in df.columns else [None] * len(df)
    allowed = [sorted(set(s.split("|"))) if s else [] for s in specs]

    # Why each row is left out: the first reason that applies (ODDITIES' order).
    never = np.isnan(scheduled)
    no_deletion = ~never & np.isnan(deleted)
    reasons = {
        "cpu_only": (gpus == 0) if cpu_jobs == "skip" else np.zeros(len(df), bool),
        "never_scheduled": never,
        "no_deletion_time": no_deletion,
        "non_positive_run_time": ~never & ~no_deletion & (run <= 0),
    }
    counts = dict.fromkeys(ODDITIES, 0)
    left_out = left_out_rows(reasons, bad, counts)
    rows = sorted({*np.flatnonzero(~left_out).tolist(), *bad})
    pick = np.asarray(rows, dtype=np.int64)
    cpu_only = gpus[pick] == 0
    fraction = (gpus[pick] == 1) & (milli[pick] < WHOLE_GPU_MILLI)
    several = [len(allowed[i]) > 1 for i in rows]
    kept = np.asarray([i not in bad for i in rows], dtype=bool)
    first = float(np.nanmin(created[pick][kept])) if kept.any() else 0.0
    columns: dict[str, Any] = {
        "job_id": [names[i] for i in rows],
        "num_gpus": nan_to_none(np.where(cpu_only, 1, gpus[pick]), int),
        "duration": nan_to_none(run[pick]),
        "submit_time": nan_to_none(created[pick] - first),
        "gpu_type": [allowed[i][0] if len(allowed[i]) == 1 else ANY_GPU for i in rows],
        "gpu_types": [allowed[i] if len(allowed[i]) > 1 else None for i in rows],
        "gpu_milli": nan_to_none(np.where(fraction & (milli[pick] > 0), milli[pick], np.nan), int),
    }
    for c in ("cpu_milli", "memory_mib"):
        if c in df.columns:
            columns[c] = nan_to_none(number(c, required=False, integer=True)[pick], int)
    extras: dict[str, Any] = {
        "gpu_spec": ["|".join(allowed[i]) for i in rows],
        "scheduled_time": scheduled[pick] - first,
        "deletion_time": deleted[pick] - first,
    }
    for c in ("qos", "pod_phase"):
        if c in df.columns:
            values = _str_column(df[c])
            extras[c] = [values[i] for i in rows]
    if cpu_jobs == "keep":
        extras["cpu_only"] = cpu_only
    position = {row: k for k, row in enumerate(rows)}
    workload = build_jobs(
        columns, len(rows), path=path, lines=[lines[i] for i in rows], skip_bad=skip_bad,
        extras=pd.DataFrame(extras), fmt="openb", pre_bad={position[i]: e for i, e in bad.items()},
        broken=t.broken,
    )  # fmt: skip
    workload.metadata = {
        "first_creation_s": first,
        "rows": len(df),
        "left_out": {k: v for k, v in counts.items() if k != "cpu_only" or cpu_jobs == "skip"},
        "fraction_of_a_gpu": int((fraction & kept).sum()),
        "several_gpu_types": int((np.asarray(several, dtype=bool) & kept).sum()),
    }
    return workload

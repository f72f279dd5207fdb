"""Pollux's workloads (OSDI '21 artifact, `simulator/workloads*/workload-N.csv`):

    name,time,application,num_replicas,batch_size

Each row becomes a job: job_id and name = name, submit_time = time (seconds), job_type =
application (a model profiled in Pollux's `traces/<application>/`: cifar10, imagenet, ...),
num_gpus = num_replicas and batch_size = batch_size, the GPUs and total batch size a user would
ask for (Tiresias+TunedJobs runs the job so; Optimus takes the batch size and picks the GPUs;
Pollux picks both). The work is the model's: its profile's epochs (`gpuyard.shared.goodput`), so
a simulation needs the profiles (`--profiles`, or `--pollux` beside Pollux's data).
"""

from __future__ import annotations

from pathlib import Path

from .core import Workload, WorkloadError, nan_to_none, numeric_column
from .formats import _required_str, read_table

POLLUX_FIELDS = ("name", "time", "application", "num_replicas", "batch_size")


def load_pollux(path: str | Path, *, skip_bad: bool = False) -> Workload:
    """A Pollux workload (module docstring)."""
    t = read_table(path, required=POLLUX_FIELDS, dtype={"name": str}, skip_bad=skip_bad)
    df, lines = t.df, t.lines
    bad: dict[int, WorkloadError] = {}
    time = numeric_column(df["time"], "time", path=path, lines=lines, bad=bad)
    replicas = numeric_column(
        df["num_replicas"], "num_replicas", path=path, lines=lines, bad=bad, integer=True,
    )  # fmt: skip
    batch = numeric_column(
        df["batch_size"], "batch_size", path=path, lines=lines, bad=bad, integer=True,
    )  # fmt: skip
    names = _required_str(df["name"], "name", path, lines, bad)
    columns = {
        "job_id": names,
        "name": names,
        "submit_time": nan_to_none(time),
        "job_type": _required_str(df["application"], "application", path, lines, bad),
        "num_gpus": nan_to_none(replicas, int),
        "batch_size": nan_to_none(batch, int),
    }
    extra_cols = [c for c in df.columns if c not in POLLUX_FIELDS]
    extras = df[extra_cols] if extra_cols else None
    return t.jobs(columns, path=path, fmt="pollux", bad=bad, skip_bad=skip_bad, extras=extras)

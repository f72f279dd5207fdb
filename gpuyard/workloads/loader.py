"""`load_workload`: one entry point for every workload format, with auto-detection."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .clusterlogs import load_acme, load_helios
from .core import Workload, WorkloadError
from .formats import (
    load_bftrainer,
    load_blox_jobs,
    load_elasticflow,
    load_gavel_trace,
    load_native,
    load_philly,
)
from .openb import load_openb
from .pai import load_pai
from .pollux import load_pollux

LOADERS: dict[str, Callable[..., Workload]] = {
    "gavel": load_gavel_trace,
    "elasticflow": load_elasticflow,
    "itp": load_elasticflow,
    "bftrainer": load_bftrainer,
    "blox": load_blox_jobs,
    "philly": load_philly,
    "helios": load_helios,
    "acme": load_acme,
    "openb": load_openb,
    "pai": load_pai,
    "pollux": load_pollux,
    "gpuyard": load_native,
    "csv": load_native,
    "parquet": load_native,
}
"""Format names accepted by `load_workload(format=...)`."""


def _first_line(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.readline().rstrip("\r\n")


def detect_format(path: str | Path) -> str:
    """Guess a file's format from its extension, then its first line.

    `.trace` -> gavel, `.json` -> philly, `.parquet` -> gpuyard; otherwise a line with 9 tabs is
    Gavel, and a CSV header decides: Jmin/Jmax -> bftrainer, arrival_time_s -> blox,
    model_name -> elasticflow (ITP files included), vc and gpu_num -> helios, gpu_num with type or
    gpu_time -> acme, num_gpu and gpu_milli -> openb (not gpu_spec: openb_pod_list_multigpu50.csv
    has none, nor any time, which the loader then names), num_gpus -> gpuyard, application with num_replicas and batch_size -> pollux; PAI 2020's job
    table by its header (job_name, inst_id, user, status) or, as the publisher ships it without
    one, by its name (`pai_job_table*`); its task table (`pai_task_table*`) is read with it.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".trace":
        return "gavel"
    if suffix == ".json":
        return "philly"
    if suffix == ".parquet":
        return "gpuyard"
    if not path.exists():
        raise WorkloadError(path, None, None, "no such file")
    if path.name.startswith(("pai_job_table", "pai_task_table")):
        return "pai"
    line = _first_line(path)
    if line.count("\t") == 9:
        return "gavel"
    header = {c.strip() for c in line.split(",")}
    if {"Jmin", "Jmax"} <= header:
        return "bftrainer"
    if "arrival_time_s" in header:
        return "blox"
    if "model_name" in header:
        return "elasticflow"
    if {"vc", "gpu_num"} <= header:
        return "helios"
    if "gpu_num" in header and ("type" in header or "gpu_time" in header):
        return "acme"
    if {"num_gpu", "gpu_milli"} <= header:
        return "openb"
    if "num_gpus" in header:
        return "gpuyard"
    if {"application", "num_replicas", "batch_size"} <= header:
        return "pollux"
    if {"job_name", "inst_id", "user", "status"} <= header:
        return "pai"
    if {"Ns", "Ps"} <= header:
        raise WorkloadError(
            path,
            1,
            None,
            "a BFTrainer scalability file (Ns,Ps): "
            "load it with gpuyard.shared.throughput.load_throughputs",
        )
    if line.lstrip().startswith("["):
        return "philly"
    raise WorkloadError(
        path,
        1,
        None,
        f"unknown workload format (header {line[:80]!r}): name it with --trace-format, one of "
        f"{', '.join(sorted(LOADERS))}",
    )


def load_workload(
    path: str | Path, format: str | None = None, skip_bad: bool = False, **options: Any
) -> Workload:
    """Load any supported workload file into a `Workload` (validated jobs + extras).

    `format`: None/"auto" to detect (see `detect_format`) or a name in `LOADERS`. `skip_bad`:
    skip broken lines/fields and report them in `Workload.skipped` / `skip_reasons` instead of
    raising `WorkloadError`. `options` go to the format's loader (e.g. `throughputs=` for gavel,
    `elastic=True` for elasticflow, `semantics=`/`multigpu=` for philly, `cpu_jobs=` for helios,
    acme, openb and pai; `task_table=` for pai).
    """
    name = detect_format(path) if format in (None, "auto") else format
    if name not in LOADERS:
        raise ValueError(f"unknown workload format {name!r}; known: {sorted(LOADERS)}")
    return LOADERS[name](path, skip_bad=skip_bad, **options)

"""Loaders for the reference systems' workload files, and our own format.

Every loader returns a `Workload` (validated `list[JobSpec]` + `extras`). Field mapping, per format:

gavel (`*.trace`, 10 tab-separated fields, no header)
    job_type, command, working_dir, num_steps_arg, needs_data_dir, total_steps, scale_factor,
    priority_weight, SLO, arrival_time.
    -> job_type = job_type (the model, e.g. "ResNet-50 (batch size 64)"), num_gpus = scale_factor,
    total_steps = total_steps, weight = priority_weight, submit_time = arrival_time,
    job_id = row number from 0 (Gavel numbers jobs in file order).
    SLO (-1 = none) is a factor on the job's isolated duration on the reference GPU (Gavel:
    deadline = arrival + SLO x duration); when a throughput model is passed the deadline is set to
    arrival + SLO x total_steps / throughput(job_type, reference, scale_factor), otherwise only
    `extras["SLO"]` holds it. extras: command, working_dir, num_steps_arg, needs_data_dir, SLO.

elasticflow / itp (CSV with header)
    ElasticFlow traces: job_id,submit_time,iteration,model_name,ddl,batch_size,num_gpu,duration,
    best_effort (philly_103959.csv: no best_effort, plus real_iteration/real_duration);
    ITP cluster files: job_id,submission_time,num_iteration,model_name,deadline,batch_size,
    num_gpu,duration. Both map to: job_type = "<model_name>@<batch_size>" (what
    `gpuyard.shared.throughput.ElasticFlowThroughputs` looks up), total_steps = iteration(s),
    duration = duration (seconds at num_gpu GPUs; informational, total_steps wins), num_gpus =
    num_gpu, deadline = ddl/deadline (absolute seconds, same clock as submit_time), best_effort.
    With `elastic=True` min_gpus = 1 and max_gpus = max(num_gpu, max_gpus) (ElasticFlow chooses
    the GPU count itself). extras: model_name, batch_size and any other column.

bftrainer (`*-Jbnd-*.csv`: job,Tcup,Tcdw,Jmin,Jmax,Pmax,Tsub)
    Counts are NODES, not GPUs: num_gpus = max_gpus = Jmax, min_gpus = Jmin (nodes),
    total_steps = Pmax (samples), job_id = job_type = job (BFTrainer's scalability curve is per
    job, see `gpuyard.shared.throughput.BFTrainerThroughputs`), submit_time = Tsub - earliest Tsub (s),
    rescale_up_s = Tcup, rescale_down_s = Tcdw.
    extras: Tcup, Tcdw (rescale costs, seconds of lost throughput), Tsub.

blox (`*_jobs.csv`: job_id,arrival_time_s,duration_s,num_gpus)
    -> job_id, submit_time, duration, num_gpus.

philly (`cluster_job_log` JSON): see `load_philly`.

gpuyard (our own CSV / Parquet)
    Columns named as JobSpec fields (`JOB_FIELDS`); `command` is a JSON list, `env` a JSON
    object, `gpu_types` the types `|`-separated (`V100M16|V100M32`); empty cells use the JobSpec
    default; other columns go to `extras`. `begin_s` is
    `begin_time` (not before `submit_time`); `array` in Slurm's `--array` form (`0-9%2`) makes
    the line a job array, one job per task (`<job_id>_<task>`). Parquet needs pyarrow.
"""

from __future__ import annotations

import csv
import datetime as dt
import importlib.util
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import numpy as np

from gpuyard.shared.model import parse_array
from gpuyard.shared.throughput import ThroughputModel

if TYPE_CHECKING:  # (imported where a file is read: a generated workload needs none)
    import pandas as pd

from .core import (
    ELASTIC_MAX_GPUS,
    JOB_FIELDS,
    Workload,
    WorkloadError,
    build_jobs,
    nan_to_none,
    numeric_column,
)

GAVEL_FIELDS = (
    "job_type",
    "command",
    "working_dir",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "priority_weight",
    "SLO",
    "arrival_time",
)
BLOX_FIELDS = ("job_id", "arrival_time_s", "duration_s", "num_gpus")
BFTRAINER_FIELDS = ("job", "Tcup", "Tcdw", "Jmin", "Jmax", "Pmax", "Tsub")

_EF_ALIASES = {
    "submit_time": ("submit_time", "submission_time"),
    "iteration": ("iteration", "num_iteration"),
    "ddl": ("ddl", "deadline"),
}
_INT_FIELDS = (
    "num_gpus",
    "min_gpus",
    "max_gpus",
    "priority",
    "gpu_milli",
    "cpu_milli",
    "memory_mib",
)
_FLOAT_FIELDS = (
    "duration", "total_steps", "weight", "deadline", "submit_time", "rescale_up_s",
    "rescale_down_s", "time_limit_s", "begin_time",
)  # fmt: skip
_STR_FIELDS = (
    "job_id", "name", "job_type", "gpu_type", "user", "tenant", "processes", "depends_on",
    "priority_class",
)  # fmt: skip
BEGIN_COLUMN = "begin_s"
"""Our format's column for `JobSpec.begin_time` (the clock's seconds; `begin_time` is read too)."""
_SKIP_RE = re.compile(r"[Ss]kipping line (\d+): ([^\n]*)")


# ----------------------------------------------------------------------------------------------
# Reading text tables with line numbers


class Table:
    """A parsed text table: `df`, each row's 1-based file `lines`, bad-line errors in `broken`."""

    def __init__(self, df: pd.DataFrame, lines: list[int], broken: list[WorkloadError]):
        self.df = df
        self.lines = lines
        self.broken = broken

    def jobs(
        self, columns: Mapping[str, Sequence[Any]], *, path: str | Path, fmt: str,
        bad: dict[int, WorkloadError], skip_bad: bool, extras: pd.DataFrame | None = None,
    ) -> Workload:  # fmt: skip
        """`build_jobs` of this table's rows (`columns`, and the cells a loader found `bad`), each
        with its line, and its broken lines."""
        return build_jobs(
            columns, len(self.df), path=path, lines=self.lines, skip_bad=skip_bad, extras=extras,
            fmt=fmt, pre_bad=bad, broken=self.broken,
        )  # fmt: skip


def read_table(
    path: str | Path,
    *,
    sep: str = ",",
    names: Sequence[str] | None = None,
    required: Sequence[str] = (),
    dtype: dict[str, Any] | None = None,
    quoting: Literal[0, 1, 2, 3] = csv.QUOTE_MINIMAL,  # (csv.QUOTE_*)
    skip_bad: bool = False,
) -> Table:
    """Read a CSV/TSV (header unless `names`), keeping each row's line number.

    Lines with too many fields are in `broken` (for `build_jobs`: an error with the rows' own,
    or skipped and counted with `skip_bad`); blank lines are ignored; too few fields leave empty cells that the field checks
    report.
    """
    import pandas as pd

    header = 0 if names is None else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pd.errors.ParserWarning)
        try:
            df = pd.read_csv(
                path,
                sep=sep,
                header=header,
                names=list(names) if names is not None else None,
                on_bad_lines="warn",
                skip_blank_lines=False,
                quoting=quoting,
                dtype=dtype,
                low_memory=False,
            )
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise WorkloadError(path, None, None, f"cannot parse: {exc}") from exc
    broken: list[WorkloadError] = []
    for w in caught:
        for line, why in _SKIP_RE.findall(str(w.message)):
            broken.append(WorkloadError(path, int(line), None, f"broken line: {why.strip()}"))
    if names is None:
        checked_header(df, required, path)
    df, lines, _ = numbered_rows(df, 2 if names is None else 1, {e.line for e in broken})
    return Table(df, lines, broken)


def checked_header(df: pd.DataFrame, required: Sequence[str], path: str | Path) -> None:
    """Strip the header's names; WorkloadError naming the first `required` column missing."""
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise WorkloadError(path, 1, missing[0], f"missing column (header has {list(df.columns)})")


def numbered_rows(
    df: pd.DataFrame, first: int, bad: set[int | None]
) -> tuple[pd.DataFrame, list[int], int]:
    """`df` without its blank rows, each row's line in the file (rows read from line `first` on,
    the `bad` lines not among them), and the line after the last."""
    lines: list[int] = []
    line = first
    while len(lines) < len(df):
        if line not in bad:
            lines.append(line)
        line += 1
    blank = df.isna().all(axis=1).to_numpy()
    if blank.any():
        df = df.loc[~blank].reset_index(drop=True)
        lines = [ln for ln, b in zip(lines, blank, strict=True) if not b]
    return df, lines, line


def _row_ids(table: Table, first_line: int) -> list[str]:
    """Ids for formats without one: the 0-based data row number (stable when rows are skipped)."""
    return [str(ln - first_line) for ln in table.lines]


def _str_column(series: pd.Series) -> list[str | None]:
    return [None if (v is None or v != v or v == "") else str(v).strip() for v in series.tolist()]


def _gpu_types(value: object) -> list[str] | None:
    """A `gpu_types` cell: `A|B` as read from a file, or a list as a frame holds it."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [str(v) for v in value]
    if isinstance(value, str) and value.strip():
        return value.strip().split("|")
    return None


def _required_str(
    series: pd.Series,
    name: str,
    path: str | Path,
    lines: Sequence[int],
    bad: dict[int, WorkloadError],
) -> list[str | None]:
    values = _str_column(series)
    for i, v in enumerate(values):
        if v is None:
            bad.setdefault(i, WorkloadError(path, lines[i], name, "missing value"))
    return values


def _bool_column(
    series: pd.Series,
    name: str,
    path: str | Path | None,
    lines: Sequence[int],
    bad: dict[int, WorkloadError],
) -> list[bool | None]:
    out: list[bool | None] = []
    for i, v in enumerate(series.tolist()):
        if v is None or (isinstance(v, float) and v != v) or v == "":
            out.append(None)
        elif isinstance(v, bool | np.bool_):
            out.append(bool(v))
        elif str(v).strip().lower() in ("1", "1.0", "true", "yes"):
            out.append(True)
        elif str(v).strip().lower() in ("0", "0.0", "false", "no"):
            out.append(False)
        else:
            bad.setdefault(i, WorkloadError(path, lines[i], name, f"{v!r} is not a boolean"))
            out.append(None)
    return out


# ----------------------------------------------------------------------------------------------
# Gavel


def load_gavel_trace(
    path: str | Path, *, throughputs: ThroughputModel | None = None, skip_bad: bool = False
) -> Workload:
    """Gavel's 10-field tab-separated `.trace` (see module docstring for the mapping)."""
    import pandas as pd

    t = read_table(
        path,
        sep="\t",
        names=GAVEL_FIELDS,
        dtype={"job_type": str, "command": str, "working_dir": str, "num_steps_arg": str},
        quoting=csv.QUOTE_NONE,
        skip_bad=skip_bad,
    )
    df, lines = t.df, t.lines
    bad: dict[int, WorkloadError] = {}
    job_type = _required_str(df["job_type"], "job_type", path, lines, bad)
    steps = numeric_column(df["total_steps"], "total_steps", path=path, lines=lines, bad=bad)
    sf = numeric_column(
        df["scale_factor"], "scale_factor", path=path, lines=lines, bad=bad, integer=True
    )
    weight = numeric_column(
        df["priority_weight"], "priority_weight", path=path, lines=lines, bad=bad
    )
    slo = numeric_column(df["SLO"], "SLO", path=path, lines=lines, bad=bad, required=False)
    arrival = numeric_column(df["arrival_time"], "arrival_time", path=path, lines=lines, bad=bad)
    needs_dir = numeric_column(
        df["needs_data_dir"], "needs_data_dir", path=path, lines=lines, bad=bad, required=False
    )
    slo = np.where(slo > 0, slo, np.nan)
    deadline = np.full(len(df), np.nan)
    if throughputs is not None:
        ref = throughputs.reference_gpu_type
        for i in np.flatnonzero(~np.isnan(slo)):
            kind = job_type[i]
            if i in bad or kind is None:  # (a job without its type is in `bad`)
                continue
            rate = throughputs.throughput(kind, ref, int(sf[i]))
            if rate > 0:
                deadline[i] = arrival[i] + slo[i] * steps[i] / rate
    columns: dict[str, Sequence[Any]] = {
        "job_id": _row_ids(t, 1),
        "job_type": job_type,
        "num_gpus": nan_to_none(sf, int),
        "total_steps": nan_to_none(steps),
        "weight": nan_to_none(weight),
        "submit_time": nan_to_none(arrival),
        "deadline": nan_to_none(deadline),
    }
    extras = pd.DataFrame(
        {
            "command": df["command"].to_numpy(),
            "working_dir": df["working_dir"].to_numpy(),
            "num_steps_arg": df["num_steps_arg"].to_numpy(),
            "needs_data_dir": needs_dir == 1,
            "SLO": slo,
        }
    )
    return t.jobs(columns, path=path, fmt="gavel", bad=bad, skip_bad=skip_bad, extras=extras)


# ----------------------------------------------------------------------------------------------
# ElasticFlow / ITP


def _alias(df: pd.DataFrame, name: str, path: str | Path) -> str:
    for candidate in _EF_ALIASES.get(name, (name,)):
        if candidate in df.columns:
            return candidate
    raise WorkloadError(path, 1, name, f"missing column (header has {list(df.columns)})")


def load_elasticflow(
    path: str | Path,
    *,
    elastic: bool = False,
    max_gpus: int = ELASTIC_MAX_GPUS,
    skip_bad: bool = False,
) -> Workload:
    """ElasticFlow trace CSVs and ITP cluster CSVs, both header variants (module docstring)."""
    t = read_table(path, dtype={"job_id": str, "model_name": str}, skip_bad=skip_bad)
    df, lines = t.df, t.lines
    cols = {k: _alias(df, k, path) for k in ("submit_time", "iteration", "ddl")}
    for k in ("job_id", "model_name", "batch_size", "num_gpu"):
        _alias(df, k, path)
    bad: dict[int, WorkloadError] = {}
    model = _required_str(df["model_name"], "model_name", path, lines, bad)
    batch = numeric_column(
        df["batch_size"], "batch_size", path=path, lines=lines, bad=bad, integer=True
    )
    gpus = numeric_column(df["num_gpu"], "num_gpu", path=path, lines=lines, bad=bad, integer=True)
    iters = numeric_column(
        df[cols["iteration"]], cols["iteration"], path=path, lines=lines, bad=bad
    )
    submit = numeric_column(
        df[cols["submit_time"]], cols["submit_time"], path=path, lines=lines, bad=bad
    )
    ddl = numeric_column(
        df[cols["ddl"]], cols["ddl"], path=path, lines=lines, bad=bad, required=False
    )
    duration = (
        numeric_column(df["duration"], "duration", path=path, lines=lines, bad=bad, required=False)
        if "duration" in df.columns
        else np.full(len(df), np.nan)
    )
    duration = np.where(duration > 0, duration, np.nan)
    best_effort = (
        _bool_column(df["best_effort"], "best_effort", path, lines, bad)
        if "best_effort" in df.columns
        else [None] * len(df)
    )
    batch_str = [None if b != b else str(int(b)) for b in batch.tolist()]
    job_type = [
        None if m is None or b is None else f"{m}@{b}"
        for m, b in zip(model, batch_str, strict=True)
    ]
    columns: dict[str, Any] = {
        "job_id": _str_column(df["job_id"]),
        "job_type": job_type,
        "num_gpus": nan_to_none(gpus, int),
        "total_steps": nan_to_none(iters),
        "duration": nan_to_none(duration),
        "submit_time": nan_to_none(submit),
        "deadline": nan_to_none(ddl),
        "best_effort": best_effort,
    }
    if elastic:
        columns["min_gpus"] = [1] * len(df)
        columns["max_gpus"] = [None if g != g else max(int(g), max_gpus) for g in gpus.tolist()]
    used = {"job_id", "num_gpu", "duration", "best_effort", *cols.values()}
    extras = df[[c for c in df.columns if c not in used]]
    fmt = "itp" if cols["submit_time"] == "submission_time" else "elasticflow"
    return t.jobs(columns, path=path, fmt=fmt, bad=bad, skip_bad=skip_bad, extras=extras)


# ----------------------------------------------------------------------------------------------
# BFTrainer


def load_bftrainer(path: str | Path, *, skip_bad: bool = False) -> Workload:
    """BFTrainer job bounds (`*-Jbnd-*.csv`); node counts go into the GPU fields (docstring)."""
    import pandas as pd

    t = read_table(
        path, required=BFTRAINER_FIELDS, dtype={"job": str, "Tsub": str}, skip_bad=skip_bad
    )
    df, lines = t.df, t.lines
    bad: dict[int, WorkloadError] = {}
    job = _required_str(df["job"], "job", path, lines, bad)
    num = {
        k: numeric_column(df[k], k, path=path, lines=lines, bad=bad) for k in BFTRAINER_FIELDS[1:6]
    }
    for k in ("Jmin", "Jmax"):
        frac = ~np.isnan(num[k]) & (np.floor(num[k]) != num[k])
        for i in np.flatnonzero(frac):
            bad.setdefault(int(i), WorkloadError(path, lines[i], k, "not a whole number of nodes"))
    tsub = pd.to_datetime(df["Tsub"], errors="coerce", format="%Y-%m-%d %H:%M:%S")
    for i in np.flatnonzero(tsub.isna().to_numpy()):
        bad.setdefault(
            int(i),
            WorkloadError(path, lines[i], "Tsub", f"{df['Tsub'].iat[int(i)]!r} is not a time"),
        )
    valid = tsub.dropna()
    t0 = valid.min() if len(valid) else pd.Timestamp(0)
    submit = ((tsub - t0).dt.total_seconds()).to_numpy(dtype="float64", na_value=np.nan)
    columns = {
        "job_id": job,
        "job_type": job,
        "num_gpus": nan_to_none(num["Jmax"], int),
        "min_gpus": nan_to_none(num["Jmin"], int),
        "max_gpus": nan_to_none(num["Jmax"], int),
        "total_steps": nan_to_none(num["Pmax"]),
        "submit_time": nan_to_none(submit),
        "rescale_up_s": nan_to_none(num["Tcup"]),
        "rescale_down_s": nan_to_none(num["Tcdw"]),
    }
    extras = pd.DataFrame({"Tcup": num["Tcup"], "Tcdw": num["Tcdw"], "Tsub": df["Tsub"].to_numpy()})
    return t.jobs(columns, path=path, fmt="bftrainer", bad=bad, skip_bad=skip_bad, extras=extras)


# ----------------------------------------------------------------------------------------------
# Blox job lists


def load_blox_jobs(path: str | Path, *, skip_bad: bool = False) -> Workload:
    """Blox's generated job lists: job_id,arrival_time_s,duration_s,num_gpus."""
    t = read_table(path, required=BLOX_FIELDS, dtype={"job_id": str}, skip_bad=skip_bad)
    df, lines = t.df, t.lines
    bad: dict[int, WorkloadError] = {}
    arrival = numeric_column(
        df["arrival_time_s"], "arrival_time_s", path=path, lines=lines, bad=bad
    )
    duration = numeric_column(df["duration_s"], "duration_s", path=path, lines=lines, bad=bad)
    gpus = numeric_column(df["num_gpus"], "num_gpus", path=path, lines=lines, bad=bad, integer=True)
    columns = {
        "job_id": _required_str(df["job_id"], "job_id", path, lines, bad),
        "num_gpus": nan_to_none(gpus, int),
        "duration": nan_to_none(duration),
        "submit_time": nan_to_none(arrival),
    }
    extra_cols = [c for c in df.columns if c not in BLOX_FIELDS]
    extras = df[extra_cols] if extra_cols else None
    return t.jobs(columns, path=path, fmt="blox", bad=bad, skip_bad=skip_bad, extras=extras)


# ----------------------------------------------------------------------------------------------
# Philly cluster_job_log

PhillyReading = Literal["blox", "plain", "attempts"]
PHILLY_READINGS: tuple[PhillyReading, ...] = ("blox", "plain", "attempts")
_PHILLY_OUTCOMES: dict[str, Literal["failed", "cancelled"]] = {
    "Killed": "cancelled",
    "Failed": "failed",
}
"""A Philly job's recorded status -> `JobSpec.outcome` (Pass: None, it completes)."""
_PHILLY_LEFT_OUT = (
    "jobs_without_attempts",
    "attempts_without_times",
    "attempts_non_positive_duration",
    "attempts_without_gpus",
)
"""What every reading leaves out of a Philly log, counted in `metadata["left_out"]`."""


def _philly_time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or "None" in value:
        return None
    try:
        return dt.datetime.strptime(value, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None


def load_philly(
    path: str | Path,
    *,
    semantics: str = "blox",
    multigpu: bool = False,
    sum_attempts: bool = True,
    skip_bad: bool = False,
) -> Workload:
    """Philly `cluster_job_log` JSON: a list of
    `{status, vc, jobid, submitted_time, user,
    attempts: [{start_time, end_time, detail: [{ip, gpus}]}]}`.

    An attempt is valid when its start and end parse, end > start and it used a GPU (GPUs = sum
    of len(gpus) over its detail).
    `semantics="blox"` reproduces Blox's `workload/parse_philly_jobs.py` (msr-fiddle/blox), which
    Blox's Workload calls with `sum_attempts=True`:
      - jobs without attempts are dropped (any status is kept); t = 0 is the earliest
        submitted_time among the rest;
      - an attempt with a "None" start/end time, a non-positive duration or no GPUs is ignored;
        with `multigpu`, attempts using more than 16 GPUs are ignored too;
      - duration = sum over the valid attempts of end - start; GPU count = that of the last valid
        attempt (sum of len(gpus) over its detail), or 1 unless `multigpu`;
      - Blox emits a job only while looking at its *last* attempt, so a job whose last attempt is
        invalid is dropped (kept here: it decides which jobs exist);
      - only jobs with 60*10^1.5 s < duration < 60*10^4 s are kept (Gavel/Gandiva-like range).
      With `sum_attempts=False` every valid attempt is its own job `<jobid>-attempt<k>` arriving
      when the previous attempt ended. Blox filters those on the (always zero) summed duration and
      so keeps none: a bug; here the attempt's own duration is filtered instead.
      Blox ignores the status: every job completes.
    `semantics="plain"`: every job with at least one valid attempt, duration = summed valid
    attempts, GPUs = largest attempt, no duration filter; the job ends as recorded (status
    Killed: `outcome="cancelled"`, Failed: "failed", Pass: it completes).
    `semantics="attempts"` (the Philly paper's, Jeon et al., ATC '19: a failed job is retried):
    every valid attempt k (1-based in the job's list) is its own job `<jobid>-attempt<k>`, with
    its own GPUs and duration; the first valid attempt is submitted at the job's
    submitted_time, a later one at the recorded end of the valid attempt before it, which it
    waits for (`depends_on="afterany:<jobid>-attempt<j>"`). Every attempt but the last fails
    (it was retried); the last ends as the job's status says (as in plain). No filter.
    Blox then replays the list with Poisson arrivals (see `generators.poisson_arrivals`); the
    submit times here are the trace's own.
    extras: status, vc, queueing_delay (first start - submit; an attempt's: its start - its
    submit); the attempts reading adds attempt (k) and attempts (the job's valid ones).
    metadata["left_out"] counts jobs without attempts and invalid attempts (without a start or
    end time, with a non-positive duration, without GPUs), whatever the reading.
    """
    import pandas as pd

    if semantics not in PHILLY_READINGS:
        raise ValueError(
            f"semantics must be one of {', '.join(map(repr, PHILLY_READINGS))}, not {semantics!r}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise WorkloadError(path, exc.lineno, None, f"not JSON: {exc.msg}") from exc
    if not isinstance(data, list):
        raise WorkloadError(path, 1, None, "expected a JSON list of jobs")
    bad: list[WorkloadError] = []
    left_out = dict.fromkeys(_PHILLY_LEFT_OUT, 0)
    entries: list[tuple[dict[str, Any], dt.datetime]] = []
    for k, j in enumerate(data):
        if not isinstance(j, dict):
            continue
        if not j.get("attempts"):
            left_out["jobs_without_attempts"] += 1
            continue
        submitted = _philly_time(j.get("submitted_time"))
        if submitted is None or "jobid" not in j:
            fld = "jobid" if "jobid" not in j else "submitted_time"
            bad.append(WorkloadError(path, None, fld, f"job #{k}: missing or malformed {fld}"))
            continue
        entries.append((j, submitted))
    rows: list[dict[str, Any]] = []
    if entries:
        t0 = min(s for _, s in entries)
        for j, submitted in entries:
            valid = _philly_valid_attempts(j["attempts"], left_out)
            rows.extend(_philly_rows(j, valid, submitted, t0, semantics, multigpu, sum_attempts))
    columns = {
        "job_id": [r["job_id"] for r in rows],
        "num_gpus": [r["num_gpus"] for r in rows],
        "duration": [r["duration"] for r in rows],
        "submit_time": [r["submit_time"] for r in rows],
        "user": [r["user"] for r in rows],
        "tenant": [r["vc"] for r in rows],
        "depends_on": [r.get("depends_on") for r in rows],
        "outcome": [r.get("outcome") for r in rows],
    }
    names = ["status", "vc", "queueing_delay"]
    if semantics == "attempts":
        names += ["attempt", "attempts"]
    extras = pd.DataFrame({k: [r[k] for r in rows] for k in names})
    workload = build_jobs(
        columns, len(rows), path=path, skip_bad=skip_bad, extras=extras, fmt="philly", broken=bad
    )
    workload.metadata["left_out"] = left_out
    return workload


_BLOX_MIN_S = 60 * 10**1.5
_BLOX_MAX_S = 60 * 10**4


def _philly_valid_attempts(
    attempts: list[dict[str, Any]], left_out: dict[str, int]
) -> list[tuple[int, dt.datetime, dt.datetime, int]]:
    """(index, start, end, GPUs) of each valid attempt; the others counted in `left_out`."""
    valid: list[tuple[int, dt.datetime, dt.datetime, int]] = []
    for i, a in enumerate(attempts):
        start, end = _philly_time(a.get("start_time")), _philly_time(a.get("end_time"))
        if start is None or end is None:
            left_out["attempts_without_times"] += 1
        elif (end - start).total_seconds() <= 0:
            left_out["attempts_non_positive_duration"] += 1
        elif (gpus := sum(len(d.get("gpus", [])) for d in a.get("detail", []))) <= 0:
            left_out["attempts_without_gpus"] += 1
        else:
            valid.append((i, start, end, gpus))
    return valid


def _philly_rows(
    j: dict[str, Any],
    valid: list[tuple[int, dt.datetime, dt.datetime, int]],
    submitted: dt.datetime,
    t0: dt.datetime,
    semantics: str,
    multigpu: bool,
    sum_attempts: bool,
) -> list[dict[str, Any]]:
    attempts = j["attempts"]
    base = {"user": str(j.get("user", "")), "vc": str(j.get("vc", "")), "status": j.get("status")}
    blox = semantics == "blox"
    if blox and multigpu:
        valid = [v for v in valid if v[3] <= 16]
    if not valid:
        return []
    if semantics == "attempts":
        return _philly_attempt_rows(j, valid, submitted, t0, base)
    if not sum_attempts:
        rows = []
        prev_end: dt.datetime | None = None
        for i, start, end, gpus in valid:
            arrival = prev_end or submitted
            prev_end = end
            dur = (end - start).total_seconds()
            if blox and not _BLOX_MIN_S < dur < _BLOX_MAX_S:
                continue
            rows.append(
                base
                | {
                    "job_id": f"{j['jobid']}-attempt{i + 1}",
                    "num_gpus": gpus if (multigpu or not blox) else 1,
                    "duration": dur,
                    "submit_time": (arrival - t0).total_seconds(),
                    "queueing_delay": (start - arrival).total_seconds(),
                }
            )
        return rows
    if blox and valid[-1][0] != len(attempts) - 1:
        return []
    dur = sum((end - start).total_seconds() for _, start, end, _ in valid)
    if blox and not _BLOX_MIN_S < dur < _BLOX_MAX_S:
        return []
    gpus = (valid[-1][3] if multigpu else 1) if blox else max(v[3] for v in valid)
    row = base | {
        "job_id": str(j["jobid"]),
        "num_gpus": gpus,
        "duration": dur,
        "submit_time": (submitted - t0).total_seconds(),
        "queueing_delay": (valid[0][1] - submitted).total_seconds(),
    }
    if not blox:  # (Blox ignores the status)
        row["outcome"] = _PHILLY_OUTCOMES.get(str(base["status"]))
    return [row]


def _philly_attempt_rows(
    j: dict[str, Any],
    valid: list[tuple[int, dt.datetime, dt.datetime, int]],
    submitted: dt.datetime,
    t0: dt.datetime,
    base: dict[str, Any],
) -> list[dict[str, Any]]:
    """The attempts reading: one job per valid attempt, each after the one before."""
    rows: list[dict[str, Any]] = []
    arrival, before = submitted, None
    for n, (i, start, end, gpus) in enumerate(valid):
        job_id = f"{j['jobid']}-attempt{i + 1}"
        last = n == len(valid) - 1
        rows.append(
            base
            | {
                "job_id": job_id,
                "num_gpus": gpus,
                "duration": (end - start).total_seconds(),
                "submit_time": (arrival - t0).total_seconds(),
                "queueing_delay": (start - arrival).total_seconds(),
                # (the retry waits for the attempt before it, however that one ends)
                "depends_on": f"afterany:{before}" if before else None,
                # (all but the last were retried: they failed)
                "outcome": _PHILLY_OUTCOMES.get(str(base["status"])) if last else "failed",
                "attempt": i + 1,
                "attempts": len(valid),
            }
        )
        arrival, before = end, job_id
    return rows


# ----------------------------------------------------------------------------------------------
# Our own format


def load_native(path: str | Path, *, skip_bad: bool = False) -> Workload:
    """Our CSV (or Parquet, with pyarrow): columns are JobSpec field names."""
    import pandas as pd

    path = Path(path)
    if path.suffix == ".parquet":
        _need_pyarrow()
        df = pd.read_parquet(path)
        lines = list(range(1, len(df) + 1))
        broken: list[WorkloadError] = []
    else:
        t = read_table(
            path,
            dtype={k: str for k in (*_STR_FIELDS, "command", "env", "array", "gpu_types")},
            required=("num_gpus",),
            skip_bad=skip_bad,
        )
        df, lines, broken = t.df, t.lines, t.broken
    return _native_frame(df, path, lines, skip_bad, broken)


def from_frame(
    df: pd.DataFrame, *, path: str | Path | None = None, skip_bad: bool = False
) -> Workload:
    """Jobs from a DataFrame in our format (the inverse of `Workload.to_frame`).

    Columns named as JobSpec fields fill them; `command` may be a list or JSON text, `env` a dict
    or JSON text; empty cells use the defaults; other columns become `extras`. Row k is "line k+2"
    in errors (as if read from a CSV with a header).
    """
    return _native_frame(df.reset_index(drop=True), path, list(range(2, len(df) + 2)), skip_bad)


def _native_frame(
    df: pd.DataFrame, path: str | Path | None, lines: list[int], skip_bad: bool,
    broken: Sequence[WorkloadError] = (),
) -> Workload:  # fmt: skip
    bad: dict[int, WorkloadError] = {}
    columns: dict[str, Any] = {}
    arrays: list[tuple[list[int], int | None] | None] | None = None
    begin = BEGIN_COLUMN if BEGIN_COLUMN in df.columns else "begin_time"
    for name in JOB_FIELDS:
        column = begin if name == "begin_time" else name
        if column not in df.columns:
            continue
        col = df[column]
        if name in _INT_FIELDS:
            columns[name] = nan_to_none(
                numeric_column(
                    col,
                    name,
                    path=path,
                    lines=lines,
                    bad=bad,
                    required=name == "num_gpus",
                    integer=True,
                ),
                int,
            )
        elif name in _FLOAT_FIELDS:
            columns[name] = nan_to_none(
                numeric_column(col, column, path=path, lines=lines, bad=bad, required=False)
            )
        elif name == "array":
            given = [_array_value(v, path, lines[i], bad, i) for i, v in enumerate(col.tolist())]
            arrays = [a if isinstance(a, tuple) else None for a in given]
            columns[name] = [a if isinstance(a, dict) else None for a in given]
        elif name == "best_effort":
            columns[name] = _bool_column(col, name, path, lines, bad)
        elif name in ("command", "env"):
            columns[name] = [
                _json_value(v, name, path, lines[i], bad, i) for i, v in enumerate(col.tolist())
            ]
        elif name == "gpu_types":  # `A|B`, as openb writes the types a job may use (or a list)
            columns[name] = [_gpu_types(v) for v in col.tolist()]
        else:
            columns[name] = _str_column(col)
    if "begin_time" in columns:  # (a job begins once submitted, or later)
        arrivals = columns.get("submit_time") or [None] * len(df)
        for i, (at, arrival) in enumerate(zip(columns["begin_time"], arrivals, strict=True)):
            if at is not None and at < (arrival or 0.0):
                bad.setdefault(i, WorkloadError(
                    path, lines[i], begin, f"{at:g} is before the job's arrival at "
                    f"{arrival or 0.0:g} (submit_time): it begins at its arrival or later",
                ))  # fmt: skip
    extra_cols = [c for c in df.columns if c not in JOB_FIELDS and c != BEGIN_COLUMN]
    return build_jobs(
        columns,
        len(df),
        path=path,
        lines=lines,
        skip_bad=skip_bad,
        extras=df[extra_cols] if extra_cols else None,
        fmt="gpuyard",
        pre_bad=bad,
        broken=broken,
        arrays=arrays,
    )


def _array_value(
    v: Any, path: str | Path | None, line: int, bad: dict[int, WorkloadError], i: int
) -> tuple[list[int], int | None] | dict[str, Any] | None:
    """A cell of the `array` column: Slurm's `--array` form (`0-9%2`, `1,3,5`), the array's
    task ids and limit; or one task as `save_workload` writes it (JSON), kept as it is."""
    if v is None or (isinstance(v, float) and v != v) or v == "":
        return None
    if isinstance(v, dict):
        return v
    text = str(v).strip()
    try:
        return json.loads(text) if text.startswith("{") else parse_array(text)
    except ValueError as exc:  # (json's errors are ValueErrors too)
        bad.setdefault(i, WorkloadError(path, line, "array", str(exc)))
        return None


def _json_value(
    v: Any, name: str, path: str | Path | None, line: int, bad: dict[int, WorkloadError], i: int
) -> Any:
    if v is None or (isinstance(v, float) and v != v) or v == "":
        return None
    if isinstance(v, list | dict):
        return v
    if hasattr(v, "tolist"):
        return v.tolist()
    try:
        return json.loads(v)
    except (TypeError, ValueError) as exc:
        bad.setdefault(i, WorkloadError(path, line, name, f"not JSON ({exc})"))
        return None


def _need_pyarrow() -> None:
    if importlib.util.find_spec("pyarrow") is None:
        raise WorkloadError(
            None, None, None, "Parquet needs pyarrow (pip install pyarrow); use CSV otherwise"
        )


def save_workload(
    workload: Workload | Sequence[Any], path: str | Path, *, extras: bool = True
) -> Path:
    """Write our format: `.csv` (default) or `.parquet` (needs pyarrow). Returns the path.

    `command`/`env` are stored as JSON text; `extras` columns are appended when asked, so a
    converted Gavel or ElasticFlow trace keeps its extra fields.
    """
    from .core import to_frame

    path = Path(path)
    if isinstance(workload, Workload):
        df = workload.to_frame(with_extras=extras)
    else:
        df = to_frame(workload)
    df = df.copy()
    for name in ("command", "env"):
        df[name] = [json.dumps(v) if v else "" for v in df[name]]
    df["gpu_types"] = ["|".join(v) for v in df["gpu_types"]]
    # (an array's task as JSON: read back as that task, not as an array to expand again)
    df["array"] = [
        json.dumps(msgspec.to_builtins(v)) if v is not None else None for v in df["array"]
    ]
    # Drop columns that are everywhere the default, to keep files readable.
    defaults = {
        "name": "",
        "job_type": "default",
        "gpu_type": "any",
        "priority": 0,
        "weight": 1.0,
        "best_effort": False,
        "user": "",
        "tenant": "",
        "command": "",
        "env": "",
        "processes": "per_gpu",
        "rescale_up_s": 0.0,
        "rescale_down_s": 0.0,
        "gpu_types": "",
        "cpu_milli": 0,
        "memory_mib": 0,
    }
    drop = [
        c
        for c in JOB_FIELDS
        if c != "num_gpus"
        and c != "job_id"
        and (df[c].isna().all() or (c in defaults and (df[c] == defaults[c]).all()))
    ]
    df = df.drop(columns=drop)
    if path.suffix == ".parquet":
        _need_pyarrow()
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False)
    return path

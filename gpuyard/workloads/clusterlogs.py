"""Loaders for Slurm-style cluster logs: Helios (SC '21) and Acme (NSDI '24).

helios (`cluster_log.csv`, S-Lab-System-Group/HeliosData)
    job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue
    Times are "YYYY-MM-DD HH:MM:SS" without a zone: the cluster's local time, assumed to be
    Asia/Shanghai (UTC+08:00, no daylight saving since 1991, so differences are exact).
acme (`trace_seren.csv`, `trace_kalos.csv`, InternLM/AcmeTrace)
    job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,
    queue,gpu_time; Kalos adds mem_per_pod_GB, shared_mem_per_pod, fail_time, stop_time.
    Times carry their offset ("2023-03-01 00:18:22+08:00" in Seren, "+00:00" in Kalos); one
    without an offset is read as UTC+08:00, like Helios's.

Both map to: job_id, num_gpus = gpu_num, user, tenant = vc (Helios; Acme has no virtual
clusters), submit_time = seconds from the first submission of the jobs loaded (the absolute
instant is `Workload.metadata["first_submit"]`), duration = `duration` (the publishers compute
it as end_time - start_time; end_time - start_time when the cell is empty). `queue` is not a
queue but the recorded wait (start_time - submit_time, seconds): it stays in extras.
extras: state (the recorded outcome), node_num, cpu_num, queue, the start/end (and Kalos's
fail/stop) times in seconds on the jobs' clock, and the format's other columns (Acme's type,
gpu_time, Kalos's memory). Acme's `type` is not the JobSpec's job_type, which names a throughput
model entry.

The recorded outcome is replayed: JobSpec.outcome is "failed" for FAILED, TIMEOUT, NODE_FAIL and
OUT_OF_MEMORY (the publishers count TIMEOUT and NODE_FAIL as failures), "cancelled" for
CANCELLED; such a job ends in that state after its recorded run time. Other states (COMPLETED,
and ones this loader does not know, which it counts) complete.

Jobs left out, each counted in `metadata` (none of them is an error): CPU-only jobs (gpu_num 0;
`cpu_jobs="keep"` keeps them as one-GPU jobs marked `cpu_only` in extras, the job model having no
GPU-less job), jobs with no start time (they never ran), jobs that end before they start, jobs
whose run time is zero or negative, and jobs with no run time at all (no duration, no end).
A cell that cannot be read (a gpu_num that is not a whole number, a time that is not a time, a
line with too many fields) is an error naming the file and line, or skipped and counted with
`skip_bad`, as in the other loaders.

The file is read in chunks of `chunk_rows` rows, so memory grows with the jobs kept, not with
the file's text.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .core import BrokenRows, Workload, WorkloadError, build_jobs, nan_to_none, numeric_column

if TYPE_CHECKING:
    import pandas as pd

    from gpuyard.shared.model import JobSpec

HELIOS_FIELDS = (
    "job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state", "submit_time",
    "start_time", "end_time", "duration", "queue",
)  # fmt: skip
ACME_FIELDS = (
    "job_id", "user", "node_num", "gpu_num", "cpu_num", "type", "state", "submit_time",
    "start_time", "end_time", "duration", "queue", "gpu_time",
)  # fmt: skip
HELIOS_REQUIRED = ("job_id", "gpu_num", "state", "submit_time", "start_time", "end_time")
ACME_REQUIRED = HELIOS_REQUIRED
CLUSTER_LOCAL_UTC_OFFSET_S = 8 * 3600
"""Helios's times (and Acme's without an offset) are Shanghai's local time, UTC+08:00."""
CHUNK_ROWS = 100_000

OUTCOMES: dict[str, Literal["completed", "failed", "cancelled"]] = {
    "COMPLETED": "completed",
    "CANCELLED": "cancelled",
    "FAILED": "failed",
    "TIMEOUT": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
}
"""Slurm's end states the publishers document, and the state a replayed job ends in."""

CpuJobs = Literal["skip", "keep"]
ODDITIES = ("cpu_only", "no_start_time", "end_before_start", "non_positive_duration", "no_run_time")
"""Why a row is left out (not an error), in the order they are checked."""


def left_out_rows(
    reasons: dict[str, np.ndarray], bad: Collection[int], counts: dict[str, int]
) -> np.ndarray:
    """The rows left out: each counted in `counts` under the first of `reasons` (in order) that
    holds for it; `bad` rows (errors, reported as such) are not left out."""
    left_out = np.zeros(len(next(iter(reasons.values()))), bool)
    for reason, holds in reasons.items():
        hits = holds & ~left_out
        hits[list(bad)] = False
        counts[reason] += int(hits.sum())
        left_out |= hits
    return left_out


_TIME_COLUMNS = ("start_time", "end_time", "fail_time", "stop_time")
_NUMBER_COLUMNS = ("node_num", "cpu_num", "queue", "gpu_time", "mem_per_pod_GB",
                   "shared_mem_per_pod")  # fmt: skip


def load_helios(
    path: str | Path, *, cpu_jobs: CpuJobs = "skip", skip_bad: bool = False,
    chunk_rows: int = CHUNK_ROWS,
) -> Workload:  # fmt: skip
    """Helios's `cluster_log.csv` (module docstring)."""
    return _load_cluster_log(path, "helios", HELIOS_REQUIRED, cpu_jobs, skip_bad, chunk_rows)


def load_acme(
    path: str | Path, *, cpu_jobs: CpuJobs = "skip", skip_bad: bool = False,
    chunk_rows: int = CHUNK_ROWS,
) -> Workload:  # fmt: skip
    """Acme's `trace_seren.csv` / `trace_kalos.csv` (module docstring)."""
    return _load_cluster_log(path, "acme", ACME_REQUIRED, cpu_jobs, skip_bad, chunk_rows)


class _Chunk:
    """Rows of the file: `df`, each row's 1-based file line, the broken lines met so far."""

    def __init__(self, df: pd.DataFrame, lines: list[int], broken: list[WorkloadError]):
        self.df, self.lines, self.broken = df, lines, broken


def _chunks(path: str | Path, required: tuple[str, ...], chunk_rows: int) -> Iterator[_Chunk]:
    """The file's rows in chunks, blank lines dropped, lines with too many fields reported."""
    import pandas as pd

    from .formats import _SKIP_RE, checked_header, numbered_rows

    text = {c: str for c in ("job_id", "user", "vc", "state", "type", "submit_time",
                             *_TIME_COLUMNS)}  # fmt: skip
    bad_lines: set[int | None] = set()
    next_line = 2  # (line 1 is the header)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pd.errors.ParserWarning)
        try:
            reader = pd.read_csv(
                path, chunksize=chunk_rows, on_bad_lines="warn", skip_blank_lines=False,
                dtype=text,
            )  # fmt: skip
            for df in reader:
                broken: list[WorkloadError] = []
                for w in caught:
                    for line, why in _SKIP_RE.findall(str(w.message)):
                        bad_lines.add(int(line))
                        broken.append(
                            WorkloadError(path, int(line), None, f"broken line: {why.strip()}")
                        )
                caught.clear()
                checked_header(df, required, path)
                df, lines, next_line = numbered_rows(df, next_line, bad_lines)
                yield _Chunk(df, lines, broken)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise WorkloadError(path, None, None, f"cannot parse: {exc}") from exc
        for w in caught:  # (a broken last line is reported after the last chunk)
            for line, why in _SKIP_RE.findall(str(w.message)):
                yield _Chunk(
                    pd.DataFrame(),
                    [],
                    [WorkloadError(path, int(line), None, f"broken line: {why}")],
                )


def _epoch_seconds(
    raw: pd.Series, name: str, path: str | Path, lines: list[int],
    bad: dict[int, WorkloadError], *, required: bool,
) -> np.ndarray:  # fmt: skip
    """Times as seconds since the epoch (UTC); empty cells NaN, unreadable ones in `bad`."""
    import pandas as pd

    text = raw.astype("string").str.strip()
    present = (text.notna() & (text != "")).fillna(False).to_numpy(dtype=bool)
    parsed = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=True)
    epoch = pd.Timestamp(0, tz="UTC")
    seconds = (
        (parsed - epoch).dt.total_seconds().to_numpy(dtype="float64", na_value=np.nan, copy=True)
    )
    # A time with no zone is the clusters' local time, read above as if it were UTC.
    naive = ~text.str.contains(r"(?:[+-]\d\d:?\d\d|Z)$", regex=True).fillna(False).to_numpy(bool)
    seconds[naive] -= CLUSTER_LOCAL_UTC_OFFSET_S
    for i in np.flatnonzero(present & np.isnan(seconds)).tolist():
        bad.setdefault(i, WorkloadError(path, lines[i], name, f"{raw.iat[i]!r} is not a time"))
    if required:
        for k in np.flatnonzero(~present).tolist():
            bad.setdefault(k, WorkloadError(path, lines[k], name, "missing value"))
    return seconds


def _strings(series: pd.Series, interned: dict[str, str]) -> list[str]:
    """Cells as text, "" for empty ones, each distinct value one object (users repeat)."""
    return [
        "" if v is None or v != v else interned.setdefault(str(v).strip(), str(v).strip())
        for v in series.tolist()
    ]


def _load_cluster_log(
    path: str | Path, fmt: str, required: tuple[str, ...], cpu_jobs: CpuJobs, skip_bad: bool,
    chunk_rows: int,
) -> Workload:  # fmt: skip
    import pandas as pd

    if cpu_jobs not in ("skip", "keep"):
        raise ValueError(f"cpu_jobs must be 'skip' or 'keep', not {cpu_jobs!r}")
    counts = dict.fromkeys(ODDITIES, 0)
    unknown_states: dict[str, int] = {}
    interned: dict[str, str] = {}
    seen_ids: set[str] = set()
    errors: list[WorkloadError] = []
    parts: list[Workload] = []
    rows = 0
    for chunk in _chunks(path, required, chunk_rows):
        df, lines = chunk.df, chunk.lines
        rows += len(df)
        if not len(df):
            errors.extend(chunk.broken)
            continue
        bad: dict[int, WorkloadError] = {}
        job_id = _strings(df["job_id"], {})
        for i, v in enumerate(job_id):
            if not v:
                bad.setdefault(i, WorkloadError(path, lines[i], "job_id", "missing value"))
        gpus = numeric_column(
            df["gpu_num"], "gpu_num", path=path, lines=lines, bad=bad, integer=True
        )
        submit = _epoch_seconds(df["submit_time"], "submit_time", path, lines, bad, required=True)
        times = {
            c: _epoch_seconds(df[c], c, path, lines, bad, required=False)
            for c in _TIME_COLUMNS
            if c in df.columns
        }
        start, end = times["start_time"], times["end_time"]
        numbers = {
            c: numeric_column(df[c], c, path=path, lines=lines, bad=bad, required=False)
            for c in _NUMBER_COLUMNS
            if c in df.columns
        }
        recorded = (
            numeric_column(df["duration"], "duration", path=path, lines=lines, bad=bad,
                           required=False)
            if "duration" in df.columns else np.full(len(df), np.nan)
        )  # fmt: skip
        run = np.where(np.isnan(recorded), end - start, recorded)
        state = _strings(df["state"], interned)
        # Why each row is left out: the first reason that applies (ODDITIES' order).
        no_start = np.isnan(start)
        backwards = ~no_start & (end < start)
        reasons = {
            "cpu_only": (gpus == 0) if cpu_jobs == "skip" else np.zeros(len(df), bool),
            "no_start_time": no_start,
            "end_before_start": backwards,
            "non_positive_duration": ~no_start & ~backwards & (run <= 0),
            "no_run_time": ~no_start & np.isnan(run),
        }
        left_out = left_out_rows(reasons, bad, counts)
        keep = [i for i in np.flatnonzero(~left_out).tolist() if i not in bad]
        for i in keep:
            if state[i] not in OUTCOMES:
                unknown_states[state[i]] = unknown_states.get(state[i], 0) + 1
            if job_id[i] in seen_ids:
                bad[i] = WorkloadError(path, lines[i], "job_id", f"duplicate job id {job_id[i]!r}")
            seen_ids.add(job_id[i])
        rows_kept = sorted({*keep, *bad})  # (bad rows go on to build_jobs, which reports them)
        pick = np.asarray(rows_kept, dtype=np.int64)
        cpu_only = gpus[pick] == 0
        users = _strings(df["user"], interned) if "user" in df.columns else [""] * len(df)
        columns: dict[str, Any] = {
            "job_id": [job_id[i] for i in rows_kept],
            "num_gpus": nan_to_none(np.where(cpu_only, 1, gpus[pick]), int),
            "duration": nan_to_none(run[pick]),
            "submit_time": nan_to_none(submit[pick]),
            "user": [users[i] for i in rows_kept],
            "outcome": [_outcome(state[i]) for i in rows_kept],
        }
        extras: dict[str, Any] = {"state": [state[i] for i in rows_kept]}
        if "vc" in df.columns:
            columns["tenant"] = _pick(_strings(df["vc"], interned), rows_kept)
        extras |= {c: v[pick] for c, v in numbers.items()}
        extras |= {c: v[pick] for c, v in times.items()}
        extras |= {
            c: _pick(_strings(df[c], interned), rows_kept)
            for c in df.columns
            if c not in (*HELIOS_FIELDS, *ACME_FIELDS, *_TIME_COLUMNS, *_NUMBER_COLUMNS)
        }
        if "type" in df.columns:
            extras["type"] = _pick(_strings(df["type"], interned), rows_kept)
        if cpu_jobs == "keep":
            extras["cpu_only"] = cpu_only
        position = {row: k for k, row in enumerate(rows_kept)}
        chunk_bad = {position[i]: e for i, e in bad.items()}
        parts.append(
            build_jobs(
                columns, len(rows_kept), path=path, lines=[lines[i] for i in rows_kept],
                extras=pd.DataFrame(extras), fmt=fmt, pre_bad=chunk_bad, broken=chunk.broken,
                errors_out=errors,
            )
        )  # fmt: skip
    errors.sort(key=lambda e: (e.line is None, e.line or 0))
    if errors and not skip_bad:
        raise BrokenRows(errors)
    return _joined(parts, path, fmt, errors, counts, unknown_states, rows, cpu_jobs)


def _pick(values: list[Any], rows: list[int]) -> list[Any]:
    return [values[i] for i in rows]


def _outcome(state: str) -> Literal["failed", "cancelled"] | None:
    """The end a replay gives the job: None (it completes) unless the trace says otherwise."""
    outcome = OUTCOMES.get(state)
    return None if outcome == "completed" else outcome


def rebased(
    parts: list[Workload], times: Sequence[str], categories: Sequence[str]
) -> tuple[list[JobSpec], pd.DataFrame | None, float]:
    """The chunks' jobs and extras together, their clock starting at the first submission (the
    extras' `times` columns moved with it, their `categories` columns made categories), and that
    first submission on the trace's clock."""
    import pandas as pd

    jobs = [job for part in parts for job in part.jobs]
    frames = [part.extras for part in parts if part.extras is not None and len(part.extras)]
    extras = pd.concat(frames) if frames else None
    first = min((job.submit_time or 0.0 for job in jobs), default=0.0)
    for job in jobs:  # (JobSpec is mutable; no copy of a million jobs)
        job.submit_time = (job.submit_time or 0.0) - first
    if extras is not None:
        for c in times:
            if c in extras.columns:
                extras[c] = extras[c] - first
        for c in categories:
            if c in extras.columns:
                extras[c] = extras[c].astype("category")
    return jobs, extras, first


def _joined(
    parts: list[Workload], path: str | Path, fmt: str, errors: list[WorkloadError],
    counts: dict[str, int], unknown_states: dict[str, int], rows: int, cpu_jobs: CpuJobs,
) -> Workload:  # fmt: skip
    """The chunks' jobs as one workload, its clock starting at the first submission."""
    import pandas as pd

    jobs, extras, first = rebased(parts, _TIME_COLUMNS, ("state", "type", "user"))
    first_submit = (
        pd.Timestamp(first, unit="s", tz="UTC").tz_convert("Asia/Shanghai").isoformat()
        if jobs
        else None
    )
    metadata: dict[str, Any] = {
        "first_submit": first_submit,
        "rows": rows,
        "left_out": {k: v for k, v in counts.items() if k != "cpu_only" or cpu_jobs == "skip"},
        "unknown_states": dict(sorted(unknown_states.items())),
        "outcomes": _outcome_counts(extras),
    }
    return Workload(
        jobs=jobs, extras=extras, source=str(path), format=fmt, skipped=len(errors),
        skip_reasons=[str(e) for e in errors], metadata=metadata,
    )  # fmt: skip


def _outcome_counts(extras: pd.DataFrame | None) -> dict[str, int]:
    if extras is None or "state" not in extras.columns:
        return {}
    counts = extras["state"].value_counts()
    return {str(k): int(v) for k, v in counts.items() if v}

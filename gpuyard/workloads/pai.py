"""Alibaba PAI 2020 (NSDI '22 "MLaaS in the Wild", alibaba/clusterdata `cluster-trace-gpu-v2020`):
`pai_job_table.csv` joined with the `pai_task_table.csv` beside it.

    pai_job_table:  job_name,inst_id,user,status,start_time,end_time
    pai_task_table: job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,
                    plan_gpu,gpu_type

The publisher ships both files without a header row (its `analysis/utils.py` `get_df` reads them
with `header=None` and takes the names from `data/<table>.header`): a file whose first line starts
with `job_name` has a header, otherwise the columns are those of a `<table>.header` beside it, or
the published ones above. Times are seconds on the trace's own clock (the README: deducted by a
constant; read as Asia/Shanghai they keep the time of day and the weekday, not the date).

A job is its job-table row and its tasks (joined on job_name, as `get_dfa` joins them):
job_id = job_name, user = user, submit_time = the job's start_time ("timestamp of job submission
time", README) in seconds from the first submission of the jobs loaded (that first submission is
`metadata["first_submit_s"]`); duration = the latest task end_time - the earliest task
start_time: the README calls the gap from the job's start_time to its earliest task start the
wait before launching, which the simulated scheduler replaces. A task start_time of 0 means it
never started (`get_dfa` sets such a task's start and end to NaN); an end_time of 0 is read as
none too (`get_dfia` keeps only end_time > 0).

GPUs: plan_gpu is a percent of one GPU per instance (README: 50.0 is 50% of a GPU; its example
job of three instances, 0% + 50% + 50%, asks for 1 GPU), so a job asks for the sum over its tasks
of inst_num x plan_gpu / 100 (`gpu_request` in extras). A job whose sum is less than one GPU asks
for that share of one (`gpu_milli`, in thousandths) and shares a GPU with others; a larger one
gets its sum rounded up to whole GPUs (a share is of one GPU). Jobs whose instances ask for a
fraction of a GPU (plan_gpu not a multiple of 100) are counted in `metadata["fraction_of_a_gpu"]`.
gpu_type is the type the trace says the GPU tasks were given: one type is the job's gpu_type;
MISC ("GPUs of older generations, e.g. K40m, K80, M60") runs on any type
(`metadata["misc_gpu_type"]`); several types run on any of them (`gpu_types`;
`metadata["several_gpu_types"]`), the types kept in extras too (`gpu_types`, `|`-separated).

Outcome (job status; README: 'Running', 'Terminated', 'Failed', 'Waiting', only Terminated ones
successful): Failed replays as `failed` after its recorded run time; Terminated, Running and
Waiting complete; other statuses complete and are counted in `metadata["unknown_states"]`. Every
status is counted in `metadata["outcomes"]`.

Left out, each counted in `metadata["left_out"]` (none of them an error), in this order: with
`skip_bad`, jobs one of whose task rows was skipped (`broken_task`), jobs without tasks (`no_tasks`), CPU-only jobs (no task asks for a GPU; `cpu_jobs="keep"` keeps them as
one-GPU jobs marked `cpu_only` in extras), jobs without a submission time (`no_submit_time`), jobs
none of whose tasks started (`no_start_time`) or ended (`no_end_time`), jobs with a task that ends
before it starts (`end_before_start`), and jobs whose run time is zero or negative. Task rows
whose job is not in the job table are counted (`metadata["tasks_without_job"]`). A cell that
cannot be read (a plan_gpu that is not a number, a missing job_name or inst_num, a line with too
many fields) is an error naming the file and line, or with `skip_bad` skipped and counted.

extras: inst_id, state (the job's status), gpu_request, gpu_types, tasks, instances,
cpu_request (cores: inst_num x plan_cpu / 100 summed), mem_request_gb (inst_num x plan_mem
summed), and the job's start/end and its tasks' first start and last end on the jobs' clock.

Both tables are read in chunks of `chunk_rows` rows: memory grows with the jobs, not with the
files' text.
"""

from __future__ import annotations

import gzip
import math
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from gpuyard.shared.model import ANY_GPU

from .clusterlogs import CHUNK_ROWS, CpuJobs, left_out_rows, rebased
from .core import BrokenRows, Workload, WorkloadError, build_jobs, nan_to_none, numeric_column

if TYPE_CHECKING:
    import pandas as pd

JOB_FIELDS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
TASK_FIELDS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
               "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")  # fmt: skip
JOB_REQUIRED = ("job_name", "user", "status", "start_time")
TASK_REQUIRED = ("job_name", "inst_num", "start_time", "end_time", "plan_gpu", "gpu_type")
MISC_GPU_TYPE = "MISC"
"""The trace's name for "GPUs of older generations" (K40m, K80, M60): no one type."""
OUTCOMES: dict[str, Literal["completed", "failed"]] = {
    "Terminated": "completed",
    "Failed": "failed",
    "Running": "completed",
    "Waiting": "completed",
}
"""The job statuses the README documents, and how a replayed job ends."""
ODDITIES = ("broken_task", "no_tasks", "cpu_only", "no_submit_time", "no_start_time",
            "no_end_time", "end_before_start", "non_positive_run_time")  # fmt: skip
"""Why a job is left out (not an error), in the order they are checked."""
_TIME_EXTRAS = ("start_time", "end_time", "task_start_time", "task_end_time")
_TEXT = ("job_name", "inst_id", "user", "status", "task_name", "gpu_type")


def task_table_beside(path: str | Path) -> Path:
    """The task table the job table `path` is read with: its name with `pai_job_table` replaced
    by `pai_task_table`, or `pai_task_table.csv` in the same folder."""
    path = Path(path)
    if "pai_job_table" in path.name:
        return path.with_name(path.name.replace("pai_job_table", "pai_task_table"))
    return path.with_name("pai_task_table.csv")


def load_pai(
    path: str | Path, *, task_table: str | Path | None = None, cpu_jobs: CpuJobs = "skip",
    skip_bad: bool = False, chunk_rows: int = CHUNK_ROWS,
) -> Workload:  # fmt: skip
    """PAI 2020's job table joined with its task table (module docstring)."""
    if cpu_jobs not in ("skip", "keep"):
        raise ValueError(f"cpu_jobs must be 'skip' or 'keep', not {cpu_jobs!r}")
    if "pai_task_table" in Path(path).name:
        raise WorkloadError(path, None, None, "a PAI task table: give the job table "
                            "(pai_job_table.csv); its task table is read from beside it")  # fmt: skip
    tasks_path = Path(task_table) if task_table is not None else task_table_beside(path)
    if not Path(path).exists():
        raise WorkloadError(path, None, None, "no such file")
    if not tasks_path.exists():
        raise WorkloadError(
            path, None, None, f"no task table {str(tasks_path)!r} beside it (a PAI job's GPUs and "
            "run time are in pai_task_table.csv; pass task_table= to name another)",
        )  # fmt: skip
    errors: list[WorkloadError] = []
    tasks, broken_jobs = _task_summary(tasks_path, chunk_rows, errors)
    if errors and not skip_bad:
        raise BrokenRows(sorted(errors, key=_by_line))
    return _jobs(path, tasks, broken_jobs, cpu_jobs, skip_bad, chunk_rows, errors)


def _by_line(e: WorkloadError) -> tuple[bool, int]:
    return (e.line is None, e.line or 0)


class _Chunk:
    """Rows of a table: `df`, each row's 1-based file line, the broken lines met so far."""

    def __init__(self, df: pd.DataFrame, lines: list[int], broken: list[WorkloadError]):
        self.df, self.lines, self.broken = df, lines, broken


def _first_line(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.readline().rstrip("\r\n")


def _columns(path: Path, fields: Sequence[str]) -> list[str] | None:
    """None when the file's first line is a header; else the names of its columns: those of the
    publisher's `<table>.header` beside it, or `fields`."""
    if _first_line(path).split(",")[0].strip().lstrip("\ufeff") == "job_name":
        return None
    stem = path.name.split(".")[0]
    header = path.with_name(f"{stem}.header")
    if header.is_file():
        names = [c.strip() for c in _first_line(header).split(",")]
        if "job_name" in names:
            return names
    return list(fields)


def _chunks(
    path: Path, fields: Sequence[str], required: Sequence[str], chunk_rows: int
) -> Iterator[_Chunk]:
    """A table's rows in chunks, with or without a header row, blank lines dropped, lines with
    too many fields reported."""
    import pandas as pd

    from .formats import _SKIP_RE, checked_header, numbered_rows

    names = _columns(path, fields)
    if names is not None:
        missing = [c for c in required if c not in names]
        if missing:
            raise WorkloadError(path, None, missing[0], f"missing column (columns {names})")
    bad_lines: set[int | None] = set()
    next_line = 2 if names is None else 1

    def broken(caught: list[warnings.WarningMessage]) -> list[WorkloadError]:
        found = []
        for w in caught:
            for line, why in _SKIP_RE.findall(str(w.message)):
                bad_lines.add(int(line))
                found.append(WorkloadError(path, int(line), None, f"broken line: {why.strip()}"))
        caught.clear()
        return found

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pd.errors.ParserWarning)
        try:
            reader = pd.read_csv(
                path, chunksize=chunk_rows, on_bad_lines="warn", skip_blank_lines=False,
                header=0 if names is None else None, names=names,
                dtype={c: str for c in _TEXT},
            )  # fmt: skip
            for df in reader:
                found = broken(caught)
                if names is None:
                    checked_header(df, required, path)
                df, lines, next_line = numbered_rows(df, next_line, bad_lines)
                yield _Chunk(df, lines, found)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise WorkloadError(path, None, None, f"cannot parse: {exc}") from exc
        last = broken(caught)  # (a broken last line is reported after the last chunk)
        if last:
            yield _Chunk(pd.DataFrame(), [], last)


def _text(series: pd.Series) -> list[str | None]:
    return [None if v is None or v != v or not str(v).strip() else str(v).strip()
            for v in series.tolist()]  # fmt: skip


def _task_summary(
    path: Path, chunk_rows: int, errors: list[WorkloadError]
) -> tuple[pd.DataFrame, set[str]]:
    """One row per job_name of the task table: its GPU, CPU and memory requests, instances,
    tasks, first start and last end, whether a task ends before it starts or asks for a fraction
    of a GPU, and its GPU types; and the jobs with a broken task row."""
    import pandas as pd

    parts: list[pd.DataFrame] = []
    type_parts: list[pd.DataFrame] = []
    broken_jobs: set[str] = set()
    for chunk in _chunks(path, TASK_FIELDS, TASK_REQUIRED, chunk_rows):
        errors.extend(chunk.broken)
        if len(chunk.df):
            frame, typed = _task_rows(path, chunk, broken_jobs, errors)
            parts.append(_summed(frame))
            type_parts.append(typed)
    if not parts:
        empty = _summed(pd.DataFrame({c: [] for c in _SUMS}, dtype="float64").assign(job_name=""))
        return empty.assign(gpu_types=pd.Series(dtype=object)), broken_jobs
    summary = _summed(pd.concat(parts).reset_index())
    typed = pd.concat(type_parts).drop_duplicates().sort_values(["job_name", "gpu_type"])
    joined = typed.groupby("job_name", sort=False)["gpu_type"].agg("|".join)
    summary["gpu_types"] = joined.reindex(summary.index)
    return summary, broken_jobs


def _task_rows(
    path: Path, chunk: _Chunk, broken_jobs: set[str], errors: list[WorkloadError]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A chunk's readable task rows (requests per task, times, oddities), the distinct
    (job_name, gpu_type) of its GPU tasks; its broken rows in `errors`, their jobs in
    `broken_jobs`."""
    import pandas as pd

    df, lines = chunk.df, chunk.lines
    bad: dict[int, WorkloadError] = {}

    def number(column: str, *, required: bool = False) -> np.ndarray:
        if column not in df.columns:
            return np.full(len(df), np.nan)
        return numeric_column(df[column], column, path=path, lines=lines, bad=bad,
                              required=required)  # fmt: skip

    names = _text(df["job_name"])
    for i, v in enumerate(names):
        if v is None:
            bad.setdefault(i, WorkloadError(path, lines[i], "job_name", "missing value"))
    inst = number("inst_num", required=True)
    gpu = number("plan_gpu")
    cpu, mem = number("plan_cpu"), number("plan_mem")
    start, end = number("start_time"), number("end_time")
    for column, values in (("inst_num", inst), ("plan_gpu", gpu)):
        for i in np.flatnonzero(values < 0).tolist():
            bad.setdefault(i, WorkloadError(path, lines[i], column, f"{values[i]:g} is negative"))
    gpu = np.nan_to_num(gpu, nan=0.0)
    never = start == 0  # (get_dfa: a task start_time of 0 never started; end with it)
    start = np.where(never, np.nan, start)
    end = np.where(never | (end == 0), np.nan, end)
    types = _text(df["gpu_type"]) if "gpu_type" in df.columns else [None] * len(df)
    rows = np.ones(len(df), dtype=bool)
    for i, error in bad.items():
        rows[i] = False
        name = names[i]
        if name is not None:
            broken_jobs.add(name)
        errors.append(error)
    frame = pd.DataFrame({
        "job_name": names, "gpu_request": inst * gpu / 100, "cpu_request": inst * cpu / 100,
        "mem_request_gb": inst * mem, "instances": inst, "tasks": 1,
        "task_start_time": start, "task_end_time": end,
        "backwards": ~np.isnan(start) & ~np.isnan(end) & (end < start),
        "fraction": (gpu > 0) & (gpu % 100 != 0),
    })[rows]  # fmt: skip
    typed = pd.DataFrame({"job_name": names, "gpu_type": types})[rows & (gpu > 0)]
    return frame, typed.dropna().drop_duplicates()


_SUMS = {"gpu_request": "sum", "cpu_request": "sum", "mem_request_gb": "sum", "instances": "sum",
         "tasks": "sum", "task_start_time": "min", "task_end_time": "max", "backwards": "max",
         "fraction": "max"}  # fmt: skip


def _summed(frame: pd.DataFrame) -> pd.DataFrame:
    """Tasks (or partial sums of them) summed per job_name (index)."""
    return frame.groupby("job_name", sort=False).agg(_SUMS)


def _jobs(
    path: str | Path, tasks: pd.DataFrame, broken_jobs: set[str], cpu_jobs: CpuJobs,
    skip_bad: bool, chunk_rows: int, errors: list[WorkloadError],
) -> Workload:  # fmt: skip
    import pandas as pd

    counts = dict.fromkeys(ODDITIES, 0)
    unknown: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    misc = several = fraction = rows = 0
    seen = np.zeros(len(tasks), dtype=bool)
    seen_names: set[str] = set()
    parts: list[Workload] = []
    for chunk in _chunks(Path(path), JOB_FIELDS, JOB_REQUIRED, chunk_rows):
        df, lines = chunk.df, chunk.lines
        rows += len(df)
        if not len(df):
            errors.extend(chunk.broken)
            continue
        bad: dict[int, WorkloadError] = {}
        names = _text(df["job_name"])
        for i, v in enumerate(names):
            if v is None:
                bad.setdefault(i, WorkloadError(path, lines[i], "job_name", "missing value"))
            elif v in seen_names:
                bad.setdefault(i, WorkloadError(path, lines[i], "job_name",
                                                f"duplicate job {v!r}"))  # fmt: skip
            else:
                seen_names.add(v)
        submit = numeric_column(df["start_time"], "start_time", path=path, lines=lines, bad=bad,
                                required=False)  # fmt: skip
        job_end = (
            numeric_column(df["end_time"], "end_time", path=path, lines=lines, bad=bad,
                           required=False)
            if "end_time" in df.columns else np.full(len(df), np.nan)
        )  # fmt: skip
        status = [s or "" for s in _text(df["status"])]
        at = tasks.index.get_indexer(pd.Index([n or "" for n in names], dtype=object))
        seen[at[at >= 0]] = True
        t = tasks.reindex([n or "" for n in names])  # (NaN rows: jobs without tasks)
        request = t["gpu_request"].to_numpy(dtype="float64", na_value=np.nan)
        start = t["task_start_time"].to_numpy(dtype="float64", na_value=np.nan)
        end = t["task_end_time"].to_numpy(dtype="float64", na_value=np.nan)
        run = end - start
        has_tasks = at >= 0
        no_start = has_tasks & np.isnan(start)
        no_end = has_tasks & ~no_start & np.isnan(end)
        timed = has_tasks & ~no_start & ~no_end
        backwards = timed & t["backwards"].fillna(False).to_numpy(dtype=bool)
        reasons = {
            "broken_task": np.asarray([n in broken_jobs for n in names], dtype=bool),
            "no_tasks": ~has_tasks,
            "cpu_only": (has_tasks & (request == 0)) if cpu_jobs == "skip"
            else np.zeros(len(df), bool),
            "no_submit_time": np.isnan(submit),
            "no_start_time": no_start,
            "no_end_time": no_end,
            "end_before_start": backwards,
            "non_positive_run_time": timed & ~backwards & (run <= 0),
        }  # fmt: skip
        left_out = left_out_rows(reasons, bad, counts)
        keep = sorted({*np.flatnonzero(~left_out).tolist(), *bad})
        pick = np.asarray(keep, dtype=np.int64)
        ok = np.asarray([i not in bad for i in keep], dtype=bool)
        types = t["gpu_types"].to_numpy(dtype=object)[pick]
        type_list = [s.split("|") if isinstance(s, str) and s else [] for s in types]
        for k, i in enumerate(keep):
            if not ok[k]:
                continue
            outcomes[status[i]] = outcomes.get(status[i], 0) + 1
            if status[i] not in OUTCOMES:
                unknown[status[i]] = unknown.get(status[i], 0) + 1
            if len(type_list[k]) > 1:
                several += 1
            elif type_list[k] == [MISC_GPU_TYPE]:
                misc += 1
        cpu_only = request[pick] == 0
        gpus = np.asarray([math.ceil(round(r, 6)) if r == r else math.nan
                           for r in request[pick].tolist()], dtype="float64")  # fmt: skip
        frac = t["fraction"].fillna(False).to_numpy(dtype=bool)[pick]
        fraction += int((frac & ok).sum())
        users = _text(df["user"]) if "user" in df.columns else [None] * len(df)
        # (a job asking for less than one GPU in all asks for a share of one)
        share = ~cpu_only & (request[pick] < 1.0)
        milli = np.clip(np.round(np.nan_to_num(request[pick]) * 1000.0), 1, 999)
        columns: dict[str, Any] = {
            "job_id": [names[i] for i in keep],
            "num_gpus": nan_to_none(np.where(cpu_only, 1, gpus), int),
            "gpu_milli": [int(m) if sh else None for m, sh in zip(milli, share, strict=True)],
            "gpu_types": [
                ts if len(ts) > 1 and MISC_GPU_TYPE not in ts else None for ts in type_list
            ],
            "duration": nan_to_none(run[pick]),
            "submit_time": nan_to_none(submit[pick]),
            "user": [users[i] or "" for i in keep],
            "outcome": [_outcome(status[i]) for i in keep],
            "gpu_type": [
                ts[0] if len(ts) == 1 and ts[0] != MISC_GPU_TYPE else ANY_GPU for ts in type_list
            ],
        }
        inst_id = _text(df["inst_id"]) if "inst_id" in df.columns else [None] * len(df)
        extras: dict[str, Any] = {
            "inst_id": [inst_id[i] for i in keep],
            "state": [status[i] for i in keep],
            "gpu_types": ["|".join(ts) for ts in type_list],
        }
        for c in ("gpu_request", "tasks", "instances", "cpu_request", "mem_request_gb"):
            extras[c] = t[c].to_numpy(dtype="float64", na_value=np.nan)[pick]
        extras |= {"start_time": submit[pick], "end_time": job_end[pick],
                   "task_start_time": start[pick], "task_end_time": end[pick]}  # fmt: skip
        if cpu_jobs == "keep":
            extras["cpu_only"] = cpu_only
        position = {row: k for k, row in enumerate(keep)}
        parts.append(
            build_jobs(
                columns, len(keep), path=path, lines=[lines[i] for i in keep],
                extras=pd.DataFrame(extras), fmt="pai",
                pre_bad={position[i]: e for i, e in bad.items()}, broken=chunk.broken,
                errors_out=errors,
            )
        )  # fmt: skip
    errors.sort(key=_by_line)
    if errors and not skip_bad:
        raise BrokenRows(errors)
    without_job = int(tasks["tasks"].to_numpy(dtype="float64")[~seen].sum()) if len(tasks) else 0
    metadata: dict[str, Any] = {
        "rows": rows,
        "left_out": {
            k: v for k, v in counts.items()
            if (k != "cpu_only" or cpu_jobs == "skip") and (k != "broken_task" or skip_bad)
        },
        "tasks_without_job": without_job,
        "unknown_states": dict(sorted(unknown.items())),
        "outcomes": dict(sorted(outcomes.items())),
        "fraction_of_a_gpu": fraction,
        "misc_gpu_type": misc,
        "several_gpu_types": several,
    }  # fmt: skip
    return _joined(parts, path, errors, metadata)


def _outcome(status: str) -> Literal["failed"] | None:
    """The end a replay gives the job: None (it completes) unless the trace says it failed."""
    return "failed" if OUTCOMES.get(status) == "failed" else None


def _joined(
    parts: list[Workload], path: str | Path, errors: list[WorkloadError], metadata: dict[str, Any]
) -> Workload:
    """The chunks' jobs as one workload, its clock starting at the first submission."""
    jobs, extras, first = rebased(parts, _TIME_EXTRAS, ("state", "gpu_types"))
    return Workload(
        jobs=jobs, extras=extras, source=str(path), format="pai", skipped=len(errors),
        skip_reasons=[str(e) for e in errors], metadata={"first_submit_s": first} | metadata,
    )  # fmt: skip

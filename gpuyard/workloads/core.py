"""The workload container, its errors, and the JobSpec <-> DataFrame conversions loaders share.

A `Workload` is a validated `list[JobSpec]` (`jobs`) plus `extras`: a DataFrame, indexed by job id,
holding the source columns that have no JobSpec slot (Gavel's SLO and command, ElasticFlow's batch
size, Philly's virtual cluster and status, BFTrainer's rescale costs, ...). Nothing a source file
says is silently dropped: a field either lands in a JobSpec slot or in `extras`.

Loaders build plain Python columns (one list per JobSpec field) and hand them to `build_jobs`, which
validates every row with msgspec in one call and, only when that fails, row by row so that the
error names the file, line and field (or, with `skip_bad`, skips and counts the bad rows).
"""

from __future__ import annotations

import gc
import json
import math
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsInt, cast

import msgspec
import numpy as np

from gpuyard.shared.model import ArrayTask, JobSpec

if TYPE_CHECKING:  # (imported where a frame is made: a generated workload needs none)
    import pandas as pd

JOB_FIELDS: tuple[str, ...] = JobSpec.__struct_fields__
"""JobSpec field names, in declaration order: the columns of `to_frame` and of our CSV format."""
ELASTIC_MAX_GPUS = 64
"""The most GPUs an elastic ElasticFlow job may get, however few it asked for (ElasticFlow
chooses the GPU counts itself)."""
CONVERT_ROWS = 20_000
"""Rows validated into jobs at a time (`build_jobs`)."""


class WorkloadError(ValueError):
    """A workload file (or generated row) that cannot be turned into valid jobs.

    `path`, `line` (1-based, as an editor counts, or None) and `field` (None when the whole line is
    broken) say where.
    """

    def __init__(self, path: str | Path | None, line: int | None, fld: str | None, reason: str):
        self.path = str(path) if path is not None else "<memory>"
        self.line = line
        self.field = fld
        self.reason = reason
        where = self.path
        if line is not None:
            where += f", line {line}"
        if fld is not None:
            where += f", field {fld!r}"
        super().__init__(f"{where}: {reason}")


class BrokenRows(WorkloadError):
    """Rows of a workload that cannot become jobs: the first of them (`path`, `line`, `field`),
    and in the message the first `SHOWN` with the count of all (pass `skip_bad` to skip them)."""

    SHOWN = 5

    def __init__(self, errors: Sequence[WorkloadError]) -> None:
        first = errors[0]
        super().__init__(first.path, first.line, first.field, first.reason)
        self.errors = list(errors)
        if len(errors) == 1:
            return
        shown = "; ".join(str(e).removeprefix(f"{first.path}, ") for e in errors[: self.SHOWN])
        more = f"; and {len(errors) - self.SHOWN:,} more" if len(errors) > self.SHOWN else ""
        self.args = (f"{first.path}: {len(errors):,} broken rows: {shown}{more}",)


_TOML_AT = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.S)


def read_document(path: str | Path) -> Any:
    """The data of a small TOML (`.toml`) or JSON file (a cluster spec, a job); a syntax error is
    a WorkloadError naming the file, line and column (`c.toml, line 3: ... (column 7)`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(path, None, None, exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise WorkloadError(path, None, None, "not UTF-8 text (TOML or JSON)") from None
    if path.suffix.lower() == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            m = _TOML_AT.match(str(exc))
            if m is None:  # "... (at end of document)": the last line
                last = len(text.splitlines()) or 1
                raise WorkloadError(path, last, None, f"not TOML: {exc}") from None
            raise WorkloadError(
                path, int(m["line"]), None, f"not TOML: {m['msg']} (column {m['col']})"
            ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadError(
            path, exc.lineno, None, f"not JSON: {exc.msg} (column {exc.colno})"
        ) from None


@dataclass
class Workload:
    """Validated jobs plus what the source had beyond JobSpec.

    - `jobs`: every job has a unique str `job_id` and a `submit_time` (seconds).
    - `extras`: DataFrame indexed by job_id with source columns that have no JobSpec slot, or None
      when the source has none.
    - `source`: the file (or generator call) it came from; `format`: the format name.
    - `skipped`: how many rows were skipped (only with `skip_bad=True`); `skip_reasons`: one
      `WorkloadError` message per skipped row.
    - `metadata`: what the source says about itself beyond its jobs, for `describe` (a cluster
      log's absolute first submission, its counts of oddities and of jobs left out).
    """

    jobs: list[JobSpec]
    extras: pd.DataFrame | None = None
    source: str = ""
    format: str = ""
    skipped: int = 0
    skip_reasons: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[JobSpec]:
        return iter(self.jobs)

    def __getitem__(self, i: int) -> JobSpec:
        return self.jobs[i]

    def describe(self) -> dict[str, Any]:
        """See `describe`; adds source, format, skipped rows and `metadata`."""
        head = {"source": self.source, "format": self.format, "skipped": self.skipped}
        return head | self.metadata | describe(self.jobs)

    def to_frame(self, with_extras: bool = True) -> pd.DataFrame:
        """JobSpec columns (see `to_frame`), joined with `extras` when asked."""
        df = to_frame(self.jobs)
        if with_extras and self.extras is not None and len(self.extras.columns):
            ex = self.extras.rename(columns=lambda c: f"{c}_extra" if c in df.columns else c)
            df = df.join(ex, on="job_id")
        return df


def describe(jobs: Iterable[JobSpec]) -> dict[str, Any]:
    """Summary figures for `gpuyard trace describe`: counts, GPU-demand histogram, work and
    arrival statistics (seconds), deadline/best-effort/elastic counts."""
    df = to_frame(jobs)
    n = len(df)
    if n == 0:
        return {"jobs": 0}
    arrival = df["submit_time"].astype(float).sort_values().to_numpy()
    duration = df["duration"].astype(float).dropna()
    out: dict[str, Any] = {
        "jobs": n,
        "gpus_total": int(df["num_gpus"].sum()),
        "gpu_demand": {
            int(cast(SupportsInt, k)): int(v)
            for k, v in df["num_gpus"].value_counts().sort_index().items()
        },
        "job_types": int(df["job_type"].nunique()),
        "first_arrival_s": float(arrival[0]),
        "last_arrival_s": float(arrival[-1]),
        "mean_gap_s": float(np.diff(arrival).mean()) if n > 1 else 0.0,
        "with_total_steps": int(df["total_steps"].notna().sum()),
        "with_duration": len(duration),
        "with_deadline": int(df["deadline"].notna().sum()),
        "best_effort": int(df["best_effort"].sum()),
        "elastic": int(
            sum(
                j_min is not None or j_max is not None
                for j_min, j_max in zip(df["min_gpus"], df["max_gpus"], strict=True)
            )
        ),
    }
    if len(duration):
        q = duration.quantile([0.5, 0.9, 0.99])
        out |= {
            "duration_mean_s": float(duration.mean()),
            "duration_p50_s": float(q.iloc[0]),
            "duration_p90_s": float(q.iloc[1]),
            "duration_p99_s": float(q.iloc[2]),
        }
    return out


def to_frame(jobs: Iterable[JobSpec]) -> pd.DataFrame:
    """One row per job, one column per JobSpec field (`JOB_FIELDS`), unset optionals as NaN/None."""
    import pandas as pd

    jobs = list(jobs)
    # Column by column, each list gone once it is a Series: a million jobs' lists at once would
    # hold some 300 MB beside the frame.
    cols = {name: pd.Series([getattr(j, name) for j in jobs]) for name in JOB_FIELDS}
    return pd.DataFrame(cols, columns=list(JOB_FIELDS))


def _missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float):
        return math.isnan(v)
    if isinstance(v, str):
        return v == ""
    pd = sys.modules.get("pandas")  # (pandas' NA comes only from a frame pandas made)
    return pd is not None and v is pd.NA


def numeric_column(
    raw: pd.Series,
    name: str,
    *,
    path: str | Path | None,
    lines: Sequence[int],
    bad: dict[int, WorkloadError],
    required: bool = True,
    integer: bool = False,
) -> np.ndarray:
    """Parse a column as float64, recording unparsable (or, if `required`, empty) cells in `bad`.

    Returns the parsed values; bad cells are NaN. `integer` additionally rejects fractional values.
    """
    import pandas as pd

    if pd.api.types.is_numeric_dtype(raw.dtype) and not pd.api.types.is_bool_dtype(raw.dtype):
        values = raw.to_numpy(dtype="float64", na_value=np.nan)
        unparsable = np.zeros(len(values), dtype=bool)
    else:
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
        text = raw.astype("string")
        present = (text.notna() & (text.str.strip() != "")).fillna(False).to_numpy(dtype=bool)
        unparsable = np.isnan(values) & present
    empty = np.isnan(values) & ~unparsable
    for i in np.flatnonzero(unparsable):
        bad.setdefault(
            int(i), WorkloadError(path, lines[int(i)], name, f"{raw.iat[int(i)]!r} is not a number")
        )
    if required:
        for i in np.flatnonzero(empty):
            bad.setdefault(int(i), WorkloadError(path, lines[int(i)], name, "missing value"))
    if integer:
        frac = ~np.isnan(values) & (np.floor(values) != values)
        for i in np.flatnonzero(frac):
            bad.setdefault(
                int(i),
                WorkloadError(path, lines[int(i)], name, f"{raw.iat[int(i)]!r} is not an integer"),
            )
    return values


def nan_to_none(values: np.ndarray, cast: type = float) -> list[Any]:
    """A float array as a list with NaN -> None and the rest cast (int or float)."""
    out: list[Any] = values.tolist()
    if cast is int:
        return [None if x != x else int(x) for x in out]
    return [None if x != x else x for x in out]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while creating many objects that hold no cycles (it
    otherwise rescans them repeatedly: about 3x slower for 100,000 jobs)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def build_jobs(
    columns: Mapping[str, Sequence[Any]],
    n: int,
    *,
    path: str | Path | None,
    lines: Sequence[int | None] | None = None,
    skip_bad: bool = False,
    extras: pd.DataFrame | None = None,
    fmt: str = "",
    pre_bad: dict[int, WorkloadError] | None = None,
    broken: Sequence[WorkloadError] = (),
    errors_out: list[WorkloadError] | None = None,
    arrays: Sequence[tuple[list[int], int | None] | None] | None = None,
) -> Workload:
    """Validate `n` rows given as JobSpec-named columns into a `Workload`.

    None in a column means "field absent" (JobSpec default). `pre_bad` holds rows a loader already
    found broken (unparsable cells), `broken` lines that were no rows at all (too many fields).
    Missing job ids become the row number; duplicate ids are an error (or skipped). Missing
    submit times become 0. Bad rows are skipped and counted with `skip_bad`, else they are one
    `BrokenRows` error: the first few, in file order, and how many. With `errors_out` the bad
    rows are skipped and their errors appended there (a loader reading a file in chunks decides
    once it has read them all). `arrays`: per row, a job array's task ids and limit
    (`parse_array`), or None: such a row is one job per task, `<id>_<task>` (as `gpuyard submit
    --array` makes them on a real cluster), its `extras` row repeated.
    """
    bad = dict(pre_bad or {})
    if lines is None:
        lines = [None] * n
    names = list(columns)
    cols = [columns[k] for k in names]
    if "job_id" not in columns:
        names.append("job_id")
        cols.append([str(i) for i in range(n)])
    else:
        idx = names.index("job_id")
        cols[idx] = [str(i) if _missing(v) else str(v) for i, v in enumerate(cols[idx])]
    if "submit_time" not in columns:
        names.append("submit_time")
        cols.append([0.0] * n)
    else:
        idx = names.index("submit_time")
        cols[idx] = [0.0 if v is None else v for v in cols[idx]]
    jobs: list[JobSpec] = []
    keep: list[int] = []

    def convert(records: list[dict[str, Any]], rows: list[int]) -> None:
        """The rows' jobs onto `jobs` (their rows onto `keep`), a bad one's error into `bad`."""
        try:
            jobs.extend(msgspec.convert(records, list[JobSpec]))
            keep.extend(rows)
            return
        except (msgspec.ValidationError, ValueError, TypeError):
            pass
        for i, rec in zip(rows, records, strict=True):
            try:
                jobs.append(msgspec.convert(rec, JobSpec))
                keep.append(i)
            except (msgspec.ValidationError, ValueError, TypeError) as exc:
                bad[i] = WorkloadError(path, lines[i], _error_field(str(exc)), str(exc))

    with gc_paused():
        # In batches: a million rows' dicts at once would hold some 200 MB beside their jobs.
        records: list[dict[str, Any]] = []
        rows: list[int] = []
        for i, row in enumerate(zip(*cols, strict=True)):
            if i in bad:
                continue
            records.append({k: v for k, v in zip(names, row, strict=True) if v is not None})
            rows.append(i)
            if len(records) == CONVERT_ROWS:
                convert(records, rows)
                records, rows = [], []
        convert(records, rows)
    # Unique ids (an array's tasks' too).
    seen: set[str] = set()
    unique_jobs: list[JobSpec] = []
    unique_keep: list[int] = []
    for i, job in zip(keep, jobs, strict=True):
        array = arrays[i] if arrays is not None else None
        made = [job] if array is None else array_tasks(job, *array)
        # (every row has an id: its number where the file has none)
        taken = next((j.job_id for j in made if cast(str, j.job_id) in seen), None)
        if taken is not None:
            bad[i] = WorkloadError(path, lines[i], "job_id", f"duplicate job id {taken!r}")
            continue
        seen.update(cast(str, j.job_id) for j in made)
        unique_jobs += made
        unique_keep += [i] * len(made)
    errors = sorted([*broken, *bad.values()], key=lambda e: (e.line is None, e.line or 0))
    if errors_out is not None:
        errors_out.extend(errors)
    elif errors and not skip_bad:
        raise BrokenRows(errors)
    ex = None
    if extras is not None and len(extras.columns):
        index = [j.job_id for j in unique_jobs]
        ex = extras.iloc[unique_keep].set_axis(index, axis=0).rename_axis("job_id")
    return Workload(
        jobs=unique_jobs,
        extras=ex,
        source=str(path) if path is not None else "",
        format=fmt,
        skipped=len(errors),
        skip_reasons=[str(e) for e in errors],
    )


def array_tasks(job: JobSpec, tasks: list[int], limit: int | None) -> list[JobSpec]:
    """A job array's tasks, one job each, named `<job id>_<task>`: the array's id is the job's."""
    array_id = cast(str, job.job_id)
    low, high, count = min(tasks), max(tasks), len(tasks)
    made: list[JobSpec] = []
    for t in tasks:
        task = ArrayTask(task=t, count=count, low=low, high=high, limit=limit, array_id=array_id)
        made.append(msgspec.structs.replace(job, job_id=f"{array_id}_{t}", array=task))
    return made


def _error_field(message: str) -> str | None:
    """The field msgspec names in `... - at `$.num_gpus``, or one our __post_init__ names."""
    if "at `$." in message:
        return message.rsplit("at `$.", 1)[1].split("`")[0].split("[")[0]
    for name in JOB_FIELDS:
        if message.startswith(name + " "):
            return name
    return None

"""A run's results as columns of numbers: each job's row of `jobs.csv` as jobs end, the timeline as
its pages come, and the CSV files written from them.

numpy and the csv module, not a data frame: a million-job replay's rows cost their numbers (about
200 bytes a job, a third of a row of Python objects), writing them copies no frame of objects, and
a 100-job run does not import pandas to write a hundred lines. The files are those pandas'
`to_csv(index=False)` writes of the same columns, byte for byte (tests/test_results.py).
"""

from __future__ import annotations

import csv
import sys
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import numpy as np

from gpuyard.shared.contract import QueueGpus, TimelinePoint
from gpuyard.shared.model import JobRecord, JobSpec

JOB_COLUMNS = [
    "job_id", "job_type", "state", "num_gpus", "gpu_type", "priority", "user", "arrival", "start",
    "end", "jct", "slowdown", "queueing_delay", "preemptions", "gpu_seconds", "executed_time",
    "deadline", "deadline_met", "admission", "reason",
]  # fmt: skip
_FLOATS = ("arrival", "start", "end", "jct", "slowdown", "queueing_delay", "gpu_seconds",
           "executed_time", "deadline")  # fmt: skip
_INTS = ("num_gpus", "priority", "preemptions")
_TEXTS = ("job_id", "job_type", "state", "gpu_type", "user", "admission", "reason")
_MET = np.array([None, False, True], dtype=object)
"""`deadline_met` by its code + 1: no deadline (-1), missed (0), met (1)."""
_DECLINED = 1 << 62
"""Where declined jobs' rows come in admission order: after every admitted job, in workload order."""
TIMELINE_COLUMNS = ["time", "busy_gpus", "queued", "running", "gpus"]
QUEUE_COLUMNS = ["time", "queue", "gpus"]
"""`queues.csv`: a row where a queue's GPUs held changed (a run with queues)."""
CSV_CHUNK = 65_536
"""Rows turned into text at a time."""


class Table:
    """Columns of one length, each float64 (NaN: no value), int64, or objects (None: no value)."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.columns = columns
        self._length = len(next(iter(columns.values()))) if columns else 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __len__(self) -> int:
        return self._length

    def where(self, mask: np.ndarray) -> Table:
        """The rows where `mask` holds (or at the indices it gives), in order."""
        return Table({name: column[mask] for name, column in self.columns.items()})

    def write_csv(self, path: Path) -> None:
        """The columns as CSV, a header first: as pandas writes the same frame (floats as
        Python prints them, no value as nothing, text quoted where it must be)."""
        with open(path, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(self.columns)
            for start in range(0, len(self), CSV_CHUNK):
                writer.writerows(zip(*(_cells(column[start : start + CSV_CHUNK])
                                       for column in self.columns.values()), strict=True))  # fmt: skip


def _cells(column: np.ndarray) -> list[object]:
    if column.dtype.kind != "f":
        return cast(list[object], column.tolist())
    cells = column.astype(object)
    cells[np.isnan(column)] = None
    return cast(list[object], cells.tolist())


class JobRows:
    """Rows of `jobs.csv`, one added as each job is known to have ended (or at the end of a run),
    kept as columns; `table()` gives them in admission order."""

    def __init__(self) -> None:
        self._order = array("q")
        self._floats = {name: array("d") for name in _FLOATS}
        self._ints = {name: array("q") for name in _INTS}
        self._texts: dict[str, list[str | None]] = {name: [] for name in _TEXTS}
        self._met = array("b")
        self._shares = array("q")  # each job's share of a GPU in thousandths (0: whole GPUs)
        self._batches: dict[int, str] = {}  # by row: batch sizes over time (the jobs that told)
        self._declined = 0

    def __len__(self) -> int:
        return len(self._order)

    def last_end(self) -> float:
        """When the last job to end ended (0.0 if none did)."""
        ends = np.frombuffer(self._floats["end"], dtype=np.float64)
        ended = ends[~np.isnan(ends)]
        return float(ended.max()) if len(ended) else 0.0

    def job_ids(self, start: int = 0) -> list[str | None]:
        """The jobs of the rows from the `start`th added on, in the order they were added."""
        return self._texts["job_id"][start:]

    def add(self, r: JobRecord) -> None:
        """A job the scheduler admitted: its record as the run leaves it."""
        spec, end, start = r.spec, r.end_time, r.first_start
        self._row(
            r.seq, r.job_id, r.state, spec, start=start, end=end,
            jct=None if end is None else end - r.submit_time,
            queueing=None if start is None else start - r.submit_time, arrival=r.submit_time,
            preemptions=r.preemptions, gpu_seconds=r.gpu_seconds, executed=r.executed_time,
            met=None if spec.deadline is None else end is not None and end <= spec.deadline,
            admission="best-effort" if spec.best_effort else "accepted", reason=r.reason,
            batches=batch_sizes_cell(r.batch_sizes),
        )  # fmt: skip

    def add_declined(self, workload: Iterable[JobSpec], reasons: dict[str, str]) -> None:
        """A row for each job of the `workload` that has none: admission declined it (for the
        reason `reasons` gives, where it is known)."""
        seen = set(self._texts["job_id"])
        for spec in workload:
            if spec.job_id in seen:
                continue
            self._row(
                _DECLINED + self._declined, spec.job_id, "declined", spec, start=None, end=None,
                jct=None, queueing=None, arrival=spec.submit_time, preemptions=0,
                gpu_seconds=0.0, executed=0.0, met=None if spec.deadline is None else False,
                admission="declined", reason=reasons.get(spec.job_id or "", "declined by admission"),
            )  # fmt: skip
            self._declined += 1

    def _row(
        self, order: int, job_id: str | None, state: str, spec: JobSpec, *, start: float | None,
        end: float | None, jct: float | None, queueing: float | None, arrival: float | None,
        preemptions: int, gpu_seconds: float, executed: float, met: bool | None,
        admission: str, reason: str | None, batches: str | None = None,
    ) -> None:  # fmt: skip
        self._order.append(order)
        # Slowdown: its JCT against the time it ran (1: it never waited nor was stopped).
        slowdown = jct / executed if jct is not None and end is not None and executed > 0 else None
        floats = (
            arrival,
            start,
            end,
            jct,
            slowdown,
            queueing,
            gpu_seconds,
            executed,
            spec.deadline,
        )
        for name, value in zip(_FLOATS, floats, strict=True):
            self._floats[name].append(np.nan if value is None else value)
        for name, value in zip(_INTS, (spec.num_gpus, spec.priority, preemptions), strict=True):
            self._ints[name].append(value)
        # (states, types, users and reasons repeat: one string each, not one a job)
        texts = (job_id, spec.job_type, state, spec.gpu_type, spec.user, admission, reason)
        for name, text in zip(_TEXTS, texts, strict=True):
            self._texts[name].append(text if text is None or name == "job_id" else sys.intern(text))
        self._met.append(-1 if met is None else int(met))
        self._shares.append(spec.gpu_milli or 0)
        if batches is not None:
            self._batches[len(self._order) - 1] = batches

    def table(self, ended_by: float | None = None) -> Table:
        """Every row, in admission order (then the declined jobs, in the order they were added),
        with `JOB_COLUMNS` (and `gpu_milli`, each job's share of a GPU, 0 for whole GPUs, where
        some job asked for a share; `batch_sizes`, where some job told its batch sizes); `ended_by`: only the jobs that had ended by then, and those declined
        (an interrupted run's: admission declined them when they arrived, by then)."""
        order = np.argsort(np.frombuffer(self._order, dtype=np.int64), kind="stable")
        if ended_by is not None:
            ends = np.frombuffer(self._floats["end"], dtype=np.float64)[order]
            declined = np.frombuffer(self._order, dtype=np.int64)[order] >= _DECLINED
            order = order[(ends <= ended_by) | declined]  # (NaN, not ended, is not)
        columns: dict[str, np.ndarray] = {}
        for name in JOB_COLUMNS:
            if name in self._floats:
                column = np.frombuffer(self._floats[name], dtype=np.float64)
            elif name in self._ints:
                column = np.frombuffer(self._ints[name], dtype=np.int64)
            elif name == "deadline_met":
                column = _MET[np.frombuffer(self._met, dtype=np.int8) + 1]
            else:
                column = np.empty(len(self), dtype=object)
                column[:] = self._texts[name]
            columns[name] = column[order]
            if name == "num_gpus" and any(self._shares):
                columns["gpu_milli"] = np.frombuffer(self._shares, dtype=np.int64)[order]
        if self._batches:
            column = np.empty(len(self), dtype=object)
            for row, told in self._batches.items():
                column[row] = told
            columns["batch_sizes"] = column[order]
        return Table(columns)


def batch_sizes_cell(told: list[tuple[float, int]]) -> str | None:
    """`jobs.csv`'s `batch_sizes`: `time:batch_size` where the job's batch size changed, in
    order, space-separated (None: it told none)."""
    return " ".join(f"{t:.15g}:{b}" for t, b in told) if told else None


def job_rows(records: Iterable[JobRecord]) -> JobRows:
    rows = JobRows()
    for record in records:
        rows.add(record)
    return rows


class TimelineRows:
    """The timeline's points as their pages come, in columns (and with queues, its rows of the
    GPUs each queue holds)."""

    def __init__(self) -> None:
        self._time = array("d")
        self._counts = [array("q") for _ in TIMELINE_COLUMNS[1:]]
        self._queue_time = array("d")
        self._queue_names: list[str] = []
        self._queue_gpus = array("q")

    def __len__(self) -> int:
        return len(self._time)

    def extend(self, points: Iterable[TimelinePoint]) -> None:
        for p in points:
            self._time.append(p.time)
            for column, value in zip(self._counts, (p.busy_gpus, p.queued, p.running, p.gpus),
                                     strict=True):  # fmt: skip
                column.append(value)

    def extend_queues(self, rows: Iterable[QueueGpus]) -> None:
        for r in rows:
            self._queue_time.append(r.time)
            self._queue_names.append(sys.intern(r.queue))  # (a few names, repeated)
            self._queue_gpus.append(r.gpus)

    def last_time(self) -> float:
        return self._time[-1]

    def queue_table(self) -> Table:
        """The queues' rows, `QUEUE_COLUMNS` (by time, then queue: as the clock serves them)."""
        names = np.empty(len(self._queue_names), dtype=object)
        names[:] = self._queue_names
        columns = (np.array(self._queue_time, dtype=np.float64), names,
                   np.array(self._queue_gpus, dtype=np.int64))  # fmt: skip
        return Table(dict(zip(QUEUE_COLUMNS, columns, strict=True)))

    def table(self) -> Table:
        """The points' columns (views of these: no point may be added while they are kept)."""
        arrays = [np.frombuffer(self._time, dtype=np.float64)]
        arrays += [np.frombuffer(c, dtype=np.int64) for c in self._counts]
        return Table(dict(zip(TIMELINE_COLUMNS, arrays, strict=True)))


def timeline_table(points: Iterable[TimelinePoint]) -> Table:
    rows = TimelineRows()
    rows.extend(points)
    return rows.table()

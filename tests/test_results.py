"""A run's result files, written from columns without pandas, are those pandas writes of the same
rows (which is how researchers read them back), byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuyard.results import JOB_COLUMNS, JobRows, Table, job_rows, timeline_table
from gpuyard.shared.contract import TimelinePoint
from gpuyard.shared.model import JobRecord, JobSpec

AWKWARD = ["", "plain", "with, comma", 'with "quotes"', "two\nlines", "ünïcode ✓", " padded "]


def random_records(rng: np.random.Generator, n: int, *, deadlines: str) -> list[JobRecord]:
    def some_float() -> float:
        return float(rng.choice([0.0, 1.0, 0.1, 1e-7, 123.456, 2.5e15, 1e16, 3.3e17])
                     * rng.random() if rng.random() < 0.7 else rng.choice([0.0, 60.0, 1e16]))  # fmt: skip

    records = []
    for i in range(n):
        submit = some_float()
        start = None if rng.random() < 0.2 else submit + some_float()
        end = None if start is None or rng.random() < 0.2 else start + some_float()
        deadline = {"none": None, "all": some_float(),
                    "some": some_float() if rng.random() < 0.5 else None}[deadlines]  # fmt: skip
        spec = JobSpec(
            job_id=f"j{i}" if rng.random() < 0.8 else f'j"{i}, odd',
            num_gpus=int(rng.integers(1, 9)), priority=int(rng.integers(-3, 3)),
            gpu_type=str(rng.choice(["any", "v100", "a,100"])), user=str(rng.choice(AWKWARD)),
            deadline=deadline, best_effort=bool(rng.random() < 0.1), submit_time=submit,
        )  # fmt: skip
        records.append(JobRecord(
            job_id=spec.job_id or "", seq=int(rng.integers(0, 10 * n)), spec=spec,
            state=str(rng.choice(["completed", "failed", "running", "queued"])),
            submit_time=submit, admit_time=submit, first_start=start, end_time=end,
            preemptions=int(rng.integers(0, 4)), gpu_seconds=some_float(),
            executed_time=some_float(), reason=rng.choice([None, *AWKWARD]),
        ))  # fmt: skip
    return records


def as_pandas_writes(table: Table, columns: list[str]) -> str:
    """The file pandas writes of the frame made from the rows as Python values (no value: None)."""

    def values(column: np.ndarray) -> list[object]:
        if column.dtype.kind == "f":
            return [None if np.isnan(v) else float(v) for v in column]
        return column.tolist()

    rows = list(zip(*(values(table[name]) for name in columns), strict=True))
    return pd.DataFrame(rows, columns=columns).to_csv(index=False)


@pytest.mark.parametrize("deadlines", ["none", "all", "some"])
@pytest.mark.parametrize("n", [0, 1, 300])
def test_jobs_csv_is_what_pandas_writes(tmp_path: Path, deadlines: str, n: int) -> None:
    rng = np.random.default_rng(n)
    records = random_records(rng, n, deadlines=deadlines)
    rows = job_rows(records)
    declined = [JobSpec(job_id="declined, 1", num_gpus=2, deadline=5.0, submit_time=1.5),
                JobSpec(job_id="d2", num_gpus=1)]  # fmt: skip
    rows.add_declined([r.spec for r in records] + declined, {"d2": "no room"})
    table = rows.table()
    table.write_csv(tmp_path / "jobs.csv")
    assert (tmp_path / "jobs.csv").read_text() == as_pandas_writes(table, JOB_COLUMNS)
    # in admission order, the declined jobs after, each once
    seqs = {r.job_id: r.seq for r in records}
    admitted = list(table["job_id"][: len(records)])
    assert [seqs[j] for j in admitted] == sorted(seqs[j] for j in admitted)
    assert list(table["job_id"][len(records) :]) == ["declined, 1", "d2"]
    assert list(table["reason"][len(records) :]) == ["declined by admission", "no room"]
    back = pd.read_csv(tmp_path / "jobs.csv", keep_default_na=False, na_values=[""])
    assert len(back) == n + 2


def test_a_row_is_what_its_record_says() -> None:
    spec = JobSpec(job_id="a", num_gpus=4, deadline=100.0, user="u", priority=2)
    record = JobRecord(job_id="a", seq=0, spec=spec, state="completed", submit_time=10.0,
                       admit_time=10.0, first_start=30.0, end_time=90.0, preemptions=1,
                       gpu_seconds=240.0, executed_time=60.0)  # fmt: skip
    table = job_rows([record]).table()
    row = {name: table[name][0] for name in JOB_COLUMNS}
    assert row == {
        "job_id": "a", "job_type": spec.job_type, "state": "completed", "num_gpus": 4,
        "gpu_type": spec.gpu_type, "priority": 2, "user": "u", "arrival": 10.0, "start": 30.0,
        "end": 90.0, "jct": 80.0, "slowdown": 80.0 / 60.0, "queueing_delay": 20.0,
        "preemptions": 1, "gpu_seconds": 240.0, "executed_time": 60.0,
        "deadline": 100.0, "deadline_met": True, "admission": "accepted", "reason": "",
    }  # fmt: skip


def test_only_the_jobs_that_ended_by_an_instant_are_counted_then() -> None:
    records = random_records(np.random.default_rng(7), 200, deadlines="none")
    rows = job_rows(records)
    ended = [r for r in records if r.end_time is not None]
    cut = sorted(r.end_time for r in ended)[len(ended) // 2]  # type: ignore[type-var]
    table = rows.table(ended_by=cut)
    assert sorted(table["job_id"]) == sorted(r.job_id for r in ended if r.end_time <= cut)  # type: ignore[operator]
    assert rows.last_end() == max(r.end_time for r in ended)  # type: ignore[type-var]


def test_timeline_csv_is_what_pandas_writes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    times = np.cumsum(rng.exponential(1e4, 500)) / 7
    points = [TimelinePoint(float(t), int(rng.integers(0, 64)), int(rng.integers(0, 10**6)),
                            int(rng.integers(0, 64)), 64) for t in times]  # fmt: skip
    table = timeline_table(points)
    table.write_csv(tmp_path / "timeline.csv")
    expected = pd.DataFrame(
        [(p.time, p.busy_gpus, p.queued, p.running, p.gpus) for p in points],
        columns=["time", "busy_gpus", "queued", "running", "gpus"],
    ).to_csv(index=False)
    assert (tmp_path / "timeline.csv").read_text() == expected


@pytest.mark.slow
def test_rows_cost_their_numbers() -> None:
    """A million-job replay keeps every row until it writes them: about 200 bytes a job beside
    its id, not a tuple of Python objects (about 500)."""
    import tracemalloc

    records = random_records(np.random.default_rng(5), 20_000, deadlines="some")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rows = JobRows()
        for record in records:
            rows.add(record)
        per_job = (tracemalloc.get_traced_memory()[0] - before) / len(records)
    finally:
        tracemalloc.stop()
    assert len(rows) == 20_000
    # 20 columns of 8 bytes and the row's order: 168 (the job ids are the records' own strings)
    assert per_job < 180


def test_the_summary_comes_before_the_files_that_take_longer(tmp_path: Path) -> None:
    from gpuyard.report import write_results
    from gpuyard.results import TimelineRows

    seen: list[tuple[bool, bool, int]] = []

    def on_summary(summary: dict[str, object]) -> None:
        seen.append(((tmp_path / "summary.json").exists(), (tmp_path / "jobs.csv").exists(),
                     int(summary["jobs"])))  # type: ignore[call-overload]  # fmt: skip

    records = random_records(np.random.default_rng(4), 50, deadlines="none")
    summary = write_results(job_rows(records), TimelineRows(), tmp_path, {}, plots=False,
                            on_summary=on_summary)  # fmt: skip
    assert seen == [(True, False, 50)] and summary["jobs"] == 50
    assert (tmp_path / "jobs.csv").exists() and (tmp_path / "timeline.csv").exists()

"""Deadline metrics (ElasticFlow's): declined jobs in the job table, the deadline-satisfactory
ratio, and cluster efficiency from the jobs' runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuyard.report import efficiency_frame, summarize, thinned_ranks, thinned_steps, write_results
from gpuyard.results import Table, TimelineRows, job_rows, timeline_table
from gpuyard.shared.model import GpuRef, JobRecord, JobSpec
from gpuyard.shared.throughput import ElasticFlowThroughputs

MODEL = ElasticFlowThroughputs({"a100": {"toy": {64: {1: 2.0, 2: 3.0, 4: 4.0}}}})


def record(job_id: str, end: float, deadline: float | None, best_effort: bool = False) -> JobRecord:
    spec = JobSpec(job_id=job_id, num_gpus=1, deadline=deadline, best_effort=best_effort)
    return JobRecord(
        job_id=job_id, seq=0, spec=spec, state="completed", submit_time=0.0, admit_time=0.0,
        first_start=0.0, end_time=end,
    )  # fmt: skip


def test_declined_jobs_count_against_the_ratio():
    records = [
        record("met", 50.0, 100.0),
        record("late", 150.0, 100.0),
        record("be", 500.0, 100.0, True),
    ]
    workload = [r.spec for r in records] + [
        JobSpec(job_id="no", num_gpus=1, deadline=10.0, submit_time=3.0)
    ]
    rows = job_rows(records)
    rows.add_declined(workload, {"no": "cannot meet its deadline"})
    jobs = rows.table()
    assert list(jobs["admission"]) == ["accepted", "accepted", "best-effort", "declined"]
    no = list(jobs["job_id"]).index("no")
    assert tuple(jobs[c][no] for c in ("state", "reason", "arrival", "deadline_met")) == (
        "declined",
        "cannot meet its deadline",
        3.0,
        False,
    )
    summary = summarize(jobs, timeline_table([]))
    assert (summary["accepted"], summary["declined"], summary["best_effort"]) == (2, 1, 1)
    assert summary["deadline_met"] == 1
    assert summary["deadline_satisfactory_ratio"] == pytest.approx(1 / 3)  # best effort not counted
    assert summary["mean_jct"] == pytest.approx((50 + 150 + 500) / 3)  # completed jobs only


def test_cluster_efficiency_is_throughput_over_single_gpu_throughput_per_gpu():
    # 'a' on 2 GPUs (3/2 = 1.5) from 0, 'b' on 4 (4/2 = 2) from 10, 'a' stops at 20; 8 GPUs.
    gpus = [GpuRef("n0", i) for i in range(8)]
    runs = [(0.0, "a", gpus[:2]), (10.0, "b", gpus[4:8]), (20.0, "a", []), (40.0, "b", [])]
    frame = efficiency_frame(runs, {"a": "toy@64", "b": "toy@64"}, MODEL, {"n0": "a100"}, 8)
    assert list(frame["time"]) == [0.0, 10.0, 20.0, 40.0]
    assert list(frame["efficiency"]) == pytest.approx([1.5 / 8, 3.5 / 8, 2.0 / 8, 0.0])
    jobs = job_rows([record("a", 40.0, None)]).table()
    assert summarize(jobs, timeline_table([]), efficiency=frame)[
        "mean_cluster_efficiency"
    ] == pytest.approx((1.5 * 10 + 3.5 * 10 + 2.0 * 20) / 8 / 40)


def test_write_results_adds_the_deadline_files(tmp_path: Path):
    records = [record("met", 50.0, 100.0)]
    frame = Table({"time": np.array([0.0, 50.0]), "efficiency": np.array([0.5, 0.0])})
    rows = job_rows(records)
    rows.add_declined([r.spec for r in records], {})
    summary = write_results(rows, TimelineRows(), tmp_path, efficiency=frame, caption="t")
    assert summary["deadline_satisfactory_ratio"] == 1.0
    assert (tmp_path / "efficiency.csv").exists() and (tmp_path / "deadlines.png").exists()
    assert pd.read_csv(tmp_path / "jobs.csv")["admission"].tolist() == ["accepted"]


def test_plots_draw_a_long_series_through_the_points_its_pixels_show() -> None:
    rng = np.random.default_rng(1)
    x = np.cumsum(rng.exponential(1.0, 200_000))
    busy, queued = rng.random(200_000), np.cumsum(rng.integers(-1, 2, 200_000)).astype(float)
    kept = thinned_steps(x, [busy, queued], most=4_000)
    assert len(kept) <= 4_000 and kept[0] == 0 and kept[-1] == len(x) - 1
    assert np.all(np.diff(kept) > 0)  # (in order)
    for y in (busy, queued):  # every extreme is drawn
        assert y[kept].min() == y.min() and y[kept].max() == y.max()
    assert list(thinned_steps(x[:100], [busy[:100]], most=4_000)) == list(range(100))
    ranks = thinned_ranks(1_000_001, most=1_000)
    assert len(ranks) == 1_000 and ranks[0] == 0 and ranks[-1] == 1_000_000
    assert list(thinned_ranks(10)) == list(range(10))

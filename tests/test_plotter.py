"""A run's figures drawn by its plotter process are those drawn in the run's own process; a
plotter that cannot draw says so in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuyard.plotter import Plotter
from gpuyard.report import write_results
from gpuyard.results import JobRows, TimelineRows, job_rows
from gpuyard.shared.contract import TimelinePoint
from gpuyard.shared.model import JobRecord, JobSpec


def a_run() -> tuple[JobRows, TimelineRows]:
    rng = np.random.default_rng(2)
    records, points, t = [], TimelineRows(), 0.0
    for i in range(300):
        start = t + float(rng.exponential(100))
        end = start + float(rng.exponential(3000))
        spec = JobSpec(job_id=str(i), num_gpus=1, deadline=end + float(rng.normal(0, 500)))
        records.append(JobRecord(job_id=str(i), seq=i, spec=spec, state="completed",
                                 submit_time=t, admit_time=t, first_start=start, end_time=end))  # fmt: skip
        points.extend([TimelinePoint(t, int(rng.integers(0, 8)), int(rng.integers(0, 5)), 1, 8)])
        t += float(rng.exponential(60))
    return job_rows(records), points


@pytest.mark.parametrize("node_churn", [False, True])
def test_the_plotters_figures_are_those_drawn_here(tmp_path: Path, node_churn: bool) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    plotter = Plotter()
    try:
        for out, drawer in ((here, None), (there, plotter)):
            rows, points = a_run()
            write_results(rows, points, out, {"jobs_in_workload": 300}, caption="what ran",
                          node_churn=node_churn, plotter=drawer)  # fmt: skip
    finally:
        plotter.close()
    figures = sorted(p.name for p in here.glob("*.png"))
    expected = ["deadlines.png", "jct_cdf.png", "timeline.png"]
    assert figures == sorted(expected + (["idle_nodes.png"] if node_churn else []))
    for name in figures:
        assert (here / name).read_bytes() == (there / name).read_bytes(), name


def test_a_plotter_that_is_gone_says_so(tmp_path: Path) -> None:
    plotter = Plotter()
    plotter.close()  # (as if it had been killed)
    rows, points = a_run()
    with pytest.raises(RuntimeError, match="the plotter process was killed"):
        write_results(rows, points, tmp_path, {}, caption="x", plotter=plotter)
    assert (tmp_path / "jobs.csv").exists() and (tmp_path / "summary.json").exists()


def test_a_plotter_that_fails_names_the_error(tmp_path: Path) -> None:
    plotter = Plotter()
    try:
        with pytest.raises(RuntimeError, match="drawing the figures failed: .*Error"):
            plotter.draw("not a table", None, tmp_path, "", {})
    finally:
        plotter.close()

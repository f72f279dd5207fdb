"""A run's plots drawn by a process of its own (`gpuyard.plotter`): the same PNGs as drawn in the
run's process, one clear line when they cannot be, and no process left behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpuyard.plotter import PlotError, Plotter
from gpuyard.report import Figures, draw, figures
from gpuyard.results import Table


def some_run(out: Path) -> Figures:
    rng = np.random.default_rng(3)
    n = 50
    jobs = Table({
        "state": np.array(["completed"] * 40 + ["queued"] * 10, dtype=object),
        "jct": np.r_[rng.exponential(3600.0, 40), np.full(10, np.nan)],
        "deadline": np.r_[rng.uniform(1e3, 1e5, 30), np.full(20, np.nan)],
        "admission": np.array(["accepted"] * 25 + ["declined"] * 5 + ["best-effort"] * 20,
                              dtype=object),
        "deadline_met": np.array([True, False] * 12 + [None] * 26, dtype=object),
    })  # fmt: skip
    times = np.sort(rng.uniform(0, 1e5, 200))
    timeline = Table({
        "time": times, "gpus": np.full(200, 16), "busy_gpus": rng.integers(0, 17, 200),
        "queued": rng.integers(0, 30, 200), "running": rng.integers(0, 10, 200),
    })  # fmt: skip
    summary = {"makespan": 1e5, "simulated_s": 1e5, "idle_node_utilization": 0.5}
    return figures(jobs, timeline, out, "what ran\nwhere", n, None, summary, node_churn=True)


@pytest.mark.slow
def test_the_plotter_draws_what_the_run_would_have_drawn(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    drawn = draw(some_run(here))
    with Plotter.start() as plotter:
        plotter.draw(some_run(there))
        assert plotter.proc.returncode == 0
    names = ["deadlines.png", "idle_nodes.png", "jct_cdf.png", "timeline.png"]
    assert sorted(p.name for p in drawn) == names
    assert sorted(p.name for p in there.iterdir()) == names
    for name in names:
        assert (there / name).read_bytes() == (here / name).read_bytes(), name
    assert Image.open(there / "jct_cdf.png").text["Description"] == "what ran\nwhere"


def test_figures_it_cannot_write_get_one_line(tmp_path: Path) -> None:
    with Plotter.start() as plotter, pytest.raises(PlotError) as failed:
        plotter.draw(some_run(tmp_path / "no such folder"))
    line = str(failed.value)
    assert line.startswith("the plots could not be drawn: ") and "no such folder" in line
    assert "\n" not in line and "Traceback" not in line


def test_a_plotter_never_handed_figures_goes_when_its_run_does() -> None:
    """Its stdin closing unused (the run failed, or was killed) is its end."""
    plotter = Plotter.start()
    assert plotter.proc.stdin is not None
    plotter.proc.stdin.close()
    assert plotter.proc.wait(timeout=30) == 0
    plotter.close()

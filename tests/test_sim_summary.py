"""A simulation's summary counts the jobs of its workload, those admission declined too (each has
its row in jobs.csv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog

from gpuyard.cli import main


@pytest.mark.slow
def test_rejected_jobs_count_in_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Seed 0's first eight jobs include two of 8 GPUs, which a 1x4 cluster can never run.
    try:
        code = main(["sim", "--jobs", "8", "--cluster-spec", "1x4", "--out", str(tmp_path)])
    finally:
        structlog.reset_defaults()
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    counts = ("jobs", "jobs_in_workload", "completed", "declined")
    assert tuple(summary[k] for k in counts) == (8, 8, 6, 2)
    assert (
        "jobs         6 completed, 0 failed, 2 declined by admission of 8"
        in capsys.readouterr().out
    )


def test_the_progress_line_says_how_long_is_left() -> None:
    import io

    from gpuyard.run.simulate import ETA_AFTER_S, ProgressBar
    from gpuyard.shared.contract import Progress

    stream = io.StringIO()
    bar = ProgressBar("sim", stream)
    bar(Progress(now=3600.0, submitted=40, finished=25, total=100, instants=80))
    assert "left" not in stream.getvalue()  # (a run of a second or two shows no estimate)
    bar.started -= 100.0  # (as if it had run 100 s: a quarter of the jobs in 100 s)
    bar.last = 0.0
    bar(Progress(now=7200.0, submitted=60, finished=25, total=100, instants=1500))
    line = stream.getvalue().splitlines()[-1]
    assert line.endswith("25/100 jobs  t=2.0 h  1,500 instants  1 min 40 s, about 5 min 00 s left")
    bar(Progress(now=9000.0, submitted=100, finished=100, total=100, instants=1600, done=True))
    assert stream.getvalue().splitlines()[-1].endswith("100/100 jobs  t=2.5 h  1,600 instants")
    assert ETA_AFTER_S < 100


def test_each_users_figures_and_how_evenly_they_fared() -> None:
    """Two users' completed jobs (the third job, running, counts in jobs and GPU-hours only);
    a job with no user counts for nobody; one user alone: no per-user figures."""
    import numpy as np

    from gpuyard.report import by_user
    from gpuyard.results import Table

    def table(users: list[str]) -> Table:
        n = len(users)
        return Table({
            "user": np.array(users, dtype=object),
            "state": np.array(["completed", "completed", "running", "completed"][:n], dtype=object),
            "jct": np.array([100.0, 300.0, np.nan, 50.0][:n]),
            "queueing_delay": np.array([0.0, 100.0, np.nan, 10.0][:n]),
            "slowdown": np.array([1.0, 3.0, np.nan, 2.0][:n]),
            "gpu_seconds": np.array([3600.0, 7200.0, 3600.0, 1800.0][:n]),
        })  # fmt: skip

    got = by_user(table(["a", "b", "b", ""]))
    assert got["users"] == {
        "a": {"jobs": 1, "completed": 1, "mean_jct": 100.0, "mean_queueing_delay": 0.0,
              "gpu_hours": 1.0, "gpu_share": 0.25},
        "b": {"jobs": 2, "completed": 1, "mean_jct": 300.0, "mean_queueing_delay": 100.0,
              "gpu_hours": 3.0, "gpu_share": 0.75},
    }  # fmt: skip
    assert got["users_jain_slowdown"] == (1 + 3) ** 2 / (2 * (1 + 9))
    assert by_user(table(["a", "a", "a", ""])) == {}


@pytest.mark.slow
def test_users_spread_a_generated_workload_and_a_trace_refuses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--users 3`: the same jobs as without, each with one of three users, and the summary has
    their figures; a trace carries its own users."""
    import pandas as pd

    runs = {}
    try:
        for name, extra in (("plain", []), ("users", ["--users", "3"])):
            out = tmp_path / name
            assert main(["sim", "--jobs", "60", "--seed", "4", "--out", str(out), *extra]) == 0
            runs[name] = pd.read_csv(out / "jobs.csv")
        summary = json.loads((tmp_path / "users" / "summary.json").read_text())
        capsys.readouterr()
        code = main(["sim", "--trace", str(tmp_path / "users" / "workload.jsonl"), "--users", "2",
                     "--out", str(tmp_path / "t")])  # fmt: skip
    finally:
        structlog.reset_defaults()
    assert sorted(runs["users"]["user"].unique()) == ["user0", "user1", "user2"]
    same = [c for c in runs["plain"].columns if c != "user"]
    pd.testing.assert_frame_equal(runs["plain"][same], runs["users"][same])
    assert sorted(summary["users"]) == ["user0", "user1", "user2"]
    assert sum(u["jobs"] for u in summary["users"].values()) == 60
    assert 0 < summary["users_jain_slowdown"] <= 1
    assert code == 2 and "--users" in capsys.readouterr().err

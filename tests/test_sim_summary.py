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

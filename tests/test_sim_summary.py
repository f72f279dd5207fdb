"""A simulation's summary counts the jobs of its workload, those admission rejected too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog

from gpuyard.cli import main


def test_rejected_jobs_count_in_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Seed 0's first eight jobs include two of 8 GPUs, which a 1x4 cluster can never run.
    try:
        code = main(["sim", "--jobs", "8", "--cluster-spec", "1x4", "--out", str(tmp_path)])
    finally:
        structlog.reset_defaults()
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["jobs"], summary["jobs_in_workload"], summary["completed"]) == (6, 8, 6)
    assert "jobs         6 completed, 0 failed of 8" in capsys.readouterr().out

"""The preemption guard (`--min-run-s`, `SchedulerConfig.min_run_s`): a started or resumed job
keeps its GPUs for a minimum time whatever the policy decides, and a run that preempts more
than it progresses says so (summary fields and a warning on stderr)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import structlog

from gpuyard.cli import main


def sim(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`gpuyard sim ARGV` in this process: its exit status and stderr."""
    try:
        code = main(["sim", *argv])
    finally:
        structlog.reset_defaults()
    return int(code or 0), capsys.readouterr().err


def trace(path: Path, jobs: list[tuple[str, int, float, float]]) -> Path:
    """A gpuyard CSV: (job id, GPUs, duration s, arrival s) per job."""
    lines = ["num_gpus,job_id,duration,submit_time"]
    lines += [f"{gpus},{job},{duration},{arrival}" for job, gpus, duration, arrival in jobs]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_las_with_a_preemption_cost_thrashes_without_the_guard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four 30-minute jobs on 2 GPUs, LAS with 300 s rounds, 140 s to checkpoint and 140 s to
    restore: each run of 300 s makes 20 s of progress. Without the guard the run thrashes (and
    says so); with a 30-minute minimum run time every job finishes in its first run."""
    jobs = trace(tmp_path / "four.csv", [(f"j{i}", 1, 1800.0, 0.0) for i in range(4)])
    common = ["--trace", str(jobs), "--policy", "las", "--cluster-spec", "1x2",
              "--checkpoint-s", "140", "--restore-s", "140"]  # fmt: skip

    code, err = sim([*common, "--out", str(tmp_path / "bare")], capsys)
    assert code == 0, err
    bare = json.loads((tmp_path / "bare" / "summary.json").read_text())
    assert bare["completed"] == 4 and bare["preemptions"] >= 100  # ~75 per job
    assert bare["thrashing"] is True and bare["preemption_overhead"] > 0.5
    assert bare["preemption_cost_s"] == 280.0 and bare["min_run_s"] == 0.0
    warning = [line for line in err.splitlines() if "warning" in line]
    assert len(warning) == 1
    assert warning[0].startswith(f"gpuyard sim: warning: thrashing: {bare['preemptions']:,} ")
    assert "--min-run-s" in warning[0]

    code, err = sim([*common, "--min-run-s", "1800", "--out", str(tmp_path / "guard")], capsys)
    assert code == 0, err
    guarded = json.loads((tmp_path / "guard" / "summary.json").read_text())
    assert guarded["completed"] == 4 and guarded["preemptions"] == 0
    assert guarded["thrashing"] is False and "warning" not in err
    assert guarded["min_run_s"] == 1800.0
    assert guarded["makespan"] == pytest.approx(3600.0)  # two after two
    assert bare["makespan"] > 10 * guarded["makespan"]


@pytest.mark.slow
def test_a_held_decision_is_taken_when_the_lease_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SRTF decides again only at arrivals and completions: a short job arriving while a long one
    holds its lease starts when the lease ends (the scheduler wakes itself then), not when the
    long one completes."""
    jobs = trace(tmp_path / "two.csv", [("long", 1, 7200.0, 0.0), ("short", 1, 600.0, 300.0)])
    common = ["--trace", str(jobs), "--policy", "srtf", "--cluster-spec", "1x1"]
    for guard, short_starts, preemptions in (("0", 300.0, 1), ("1800", 1800.0, 1)):
        out = tmp_path / f"guard{guard}"
        code, err = sim([*common, "--min-run-s", guard, "--out", str(out)], capsys)
        assert code == 0, err
        frame = pd.read_csv(out / "jobs.csv").set_index("job_id")
        assert frame.loc["short", "start"] == pytest.approx(short_starts)
        assert frame.loc["long", "preemptions"] == preemptions
        assert frame.loc["long", "end"] == pytest.approx(7800.0)  # no cost: 7200 s + 600 s


def test_guard_option_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--min-run-s", "-1"])
    assert exc.value.code == 2
    assert "argument --min-run-s: must be 0 or more, not -1" in capsys.readouterr().err


@pytest.mark.slow
def test_a_comparison_names_the_runs_that_thrash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """FIFO never preempts; LAS on the same trace and cost thrashes: the comparison says which."""
    jobs = trace(tmp_path / "four.csv", [(f"j{i}", 1, 1800.0, 0.0) for i in range(4)])
    out = tmp_path / "cmp"
    code, err = sim(
        ["--trace", str(jobs), "--policy", "fifo,las", "--cluster-spec", "1x2",
         "--checkpoint-s", "140", "--restore-s", "140", "--out", str(out)],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    table = pd.read_csv(out / "comparison.csv").set_index("policy")
    assert bool(table.loc["las", "thrashing"]) and not bool(table.loc["fifo", "thrashing"])
    warning = [line for line in err.splitlines() if "warning" in line]
    assert warning == [
        "gpuyard sim: warning: thrashing in 1 of 2 runs (las): their preemptions could cost "
        "over half the time jobs ran (`thrashing`, `preemption_overhead` in comparison.csv); "
        "--min-run-s S bounds it"
    ]

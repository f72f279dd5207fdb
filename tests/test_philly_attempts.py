"""`--philly-reading attempts`: a Philly job's every valid attempt replayed as a job of its own,
each retry waiting for the attempt before, ending as recorded (the Philly paper's reading); the
plain reading keeps the recorded outcome, the blox one stays Blox's."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import structlog

from gpuyard.cli import main
from gpuyard.run.build import read_trace
from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.run.single import philly_line
from gpuyard.run.spec import RunSpec
from gpuyard.shared.model import ClusterSpec, JobSpec
from gpuyard.workloads import load_workload
from gpuyard.workloads.formats import load_philly


def attempt(start: str, end: str, *gpus: int) -> dict[str, Any]:
    """An attempt on one machine per count in `gpus` (its GPUs are their sum)."""
    detail = [{"ip": f"m{i}", "gpus": [f"gpu{g}" for g in range(n)]} for i, n in enumerate(gpus)]
    return {"start_time": start, "end_time": end, "detail": detail}


def philly_log(path: Path) -> Path:
    """app_1 passed at its 2nd attempt (8 GPUs, then 4); app_2 was killed (its 2nd and 3rd
    attempts broken: no duration, no GPUs); app_3 failed twice around an attempt without an end
    time; app_0, submitted first, has no attempt."""
    day = "2017-10-01"
    log = [
        {"status": "Pass", "vc": "vc0", "jobid": "app_0", "user": "u0",
         "submitted_time": "2017-09-30 23:00:00", "attempts": []},
        {"status": "Pass", "vc": "vc1", "jobid": "app_1", "user": "u1",
         "submitted_time": f"{day} 00:00:00",
         "attempts": [attempt(f"{day} 00:10:00", f"{day} 01:10:00", 4, 4),
                      attempt(f"{day} 02:00:00", f"{day} 02:30:00", 4)]},
        {"status": "Killed", "vc": "vc1", "jobid": "app_2", "user": "u2",
         "submitted_time": f"{day} 00:05:00",
         "attempts": [attempt(f"{day} 00:20:00", f"{day} 00:50:00", 2),
                      attempt(f"{day} 01:00:00", f"{day} 01:00:00", 2),
                      attempt(f"{day} 01:05:00", f"{day} 01:10:00", 0)]},
        {"status": "Failed", "vc": "vc2", "jobid": "app_3", "user": "u3",
         "submitted_time": f"{day} 00:20:00",
         "attempts": [attempt(f"{day} 00:30:00", f"{day} 00:40:00", 1),
                      attempt(f"{day} 00:45:00", "None", 1),
                      attempt(f"{day} 01:00:00", f"{day} 01:30:00", 2)]},
    ]  # fmt: skip
    path.write_text(json.dumps(log))
    return path


def rows(jobs: list[JobSpec]) -> list[tuple[Any, ...]]:
    """What a reading decides of each job: id, GPUs, duration, submission, dependency, outcome."""
    return [
        (j.job_id, j.num_gpus, j.duration, j.submit_time, j.depends_on, j.outcome) for j in jobs
    ]


def test_every_valid_attempt_is_a_job_after_the_one_before(tmp_path: Path) -> None:
    w = load_philly(philly_log(tmp_path / "cluster_job_log.json"), semantics="attempts")
    # t = 0 is app_1's submission (app_0, earlier, has no attempt); a retry is submitted when
    # the attempt before ended (app_1: 01:10; app_3: 00:40, its 2nd attempt being broken).
    assert rows(w.jobs) == [
        ("app_1-attempt1", 8, 3600.0, 0.0, "", "failed"),
        ("app_1-attempt2", 4, 1800.0, 4200.0, "afterany:app_1-attempt1", None),
        ("app_2-attempt1", 2, 1800.0, 300.0, "", "cancelled"),
        ("app_3-attempt1", 1, 600.0, 1200.0, "", "failed"),
        ("app_3-attempt3", 2, 1800.0, 2400.0, "afterany:app_3-attempt1", "failed"),
    ]
    assert w.extras is not None
    assert w.extras.loc["app_3-attempt3"].to_dict() == {
        "status": "Failed", "vc": "vc2", "queueing_delay": 1200.0, "attempt": 3, "attempts": 2,
    }  # fmt: skip
    assert w.extras["queueing_delay"].tolist() == [600.0, 3000.0, 900.0, 600.0, 1200.0]
    assert [(j.user, j.tenant) for j in w.jobs][:3] == [("u1", "vc1")] * 2 + [("u2", "vc1")]
    assert w.metadata["left_out"] == {
        "jobs_without_attempts": 1, "attempts_without_times": 1,
        "attempts_non_positive_duration": 1, "attempts_without_gpus": 1,
    }  # fmt: skip


def test_plain_keeps_the_recorded_outcome_and_blox_is_unchanged(tmp_path: Path) -> None:
    path = philly_log(tmp_path / "cluster_job_log.json")
    plain = load_philly(path, semantics="plain")
    assert rows(plain.jobs) == [
        ("app_1", 8, 5400.0, 0.0, "", None),
        ("app_2", 2, 1800.0, 300.0, "", "cancelled"),
        ("app_3", 2, 2400.0, 1200.0, "", "failed"),
    ]
    # Blox: 1897 s < summed duration < 600,000 s, last attempt valid (app_2's is not), one GPU
    # (--multi-gpu: the last attempt's), and every job completes (Blox ignores the status).
    blox = load_workload(path, format="philly")
    assert rows(blox.jobs) == [
        ("app_1", 1, 5400.0, 0.0, "", None),
        ("app_3", 1, 2400.0, 1200.0, "", None),
    ]
    assert blox.extras is not None and list(blox.extras.columns) == [
        "status", "vc", "queueing_delay",
    ]  # fmt: skip
    assert blox.extras["queueing_delay"].tolist() == [600.0, 600.0]
    assert [j.num_gpus for j in load_philly(path, multigpu=True)] == [4, 2]
    per_attempt = load_philly(path, sum_attempts=False)  # (each attempt filtered on its own)
    assert rows(per_attempt.jobs) == [("app_1-attempt1", 1, 3600.0, 0.0, "", None)]
    assert blox.metadata["left_out"] == plain.metadata["left_out"]  # (the log's, any reading)


def test_the_reading_says_what_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = philly_log(tmp_path / "cluster_job_log.json")
    _, info = read_trace(RunSpec(trace=str(path), philly_reading="attempts"))
    assert (info["philly_reading"], info["jobs"]) == ("attempts", 5)
    assert philly_line(info) == (
        f"{path}: Philly trace read the attempts way (5 jobs; --philly-reading "
        "blox|plain|attempts); left out: 1 jobs without attempts, 1 attempts without a start or "
        "end time, 1 attempts of non-positive duration, 1 attempts without GPUs"
    )
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(json.loads(path.read_text())[1:2]))
    line = philly_line(read_trace(RunSpec(trace=str(clean), philly_reading="attempts"))[1])
    assert line is not None and line.endswith("blox|plain|attempts)")  # nothing left out
    argv = ["trace", "describe", "--philly-reading", "attempts", "--plots", str(tmp_path / "p")]
    assert main([*argv, str(path)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["left_out"]["attempts_without_gpus"] == 1
    assert "left out: 1 jobs without attempts" in err


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`gpuyard ARGV` in this process: its exit status and stderr."""
    try:
        code: int | str | None = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    finally:
        structlog.reset_defaults()
    return int(code or 0), capsys.readouterr().err


def test_a_bad_reading_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(philly_log(tmp_path / "cluster_job_log.json"))
    out = ["--out", str(tmp_path / "o")]
    code, err = run_main(["sim", "--trace", trace, "--philly-reading", "bogus", *out], capsys)
    (line,) = err.splitlines()
    assert code == 2 and line.startswith("gpuyard sim: error: argument --philly-reading: ")
    assert "invalid choice: 'bogus'" in line and "attempts" in line
    argv = ["sim", "--trace", trace, "--philly-reading", "attempts", "--multi-gpu", *out]
    code, err = run_main(argv, capsys)
    (line,) = err.splitlines()
    assert code == 2 and "--multi-gpu applies to the blox reading of Philly traces; " in line
    assert "the attempts reading" in line and not (tmp_path / "o" / "summary.json").exists()


async def test_a_retry_runs_after_its_attempt_and_each_ends_as_recorded(
    tmp_path: Path, nats_url: str
) -> None:
    """On 8 GPUs app_1's first attempt holds them all until 3600 s; app_3's retry (submitted at
    2400 s) would fit beside its first attempt from then on, but waits for it to end."""
    path = philly_log(tmp_path / "cluster_job_log.json")
    workload, info = read_trace(RunSpec(trace=str(path), philly_reading="attempts"))
    options = SimOptions(cluster=ClusterSpec.parse("1x8"))
    await simulate(options, workload.jobs, tmp_path / "run", nats_url=nats_url, workload=info,
                   plots=False)  # fmt: skip
    with (tmp_path / "run" / "jobs.csv").open() as f:
        jobs = {row["job_id"]: row for row in csv.DictReader(f)}
    start = {k: float(row["start"]) for k, row in jobs.items()}
    end = {k: float(row["end"]) for k, row in jobs.items()}
    assert start["app_1-attempt2"] >= end["app_1-attempt1"] == 3600.0
    assert start["app_3-attempt3"] >= end["app_3-attempt1"] > 3600.0
    assert {k: row["state"] for k, row in jobs.items()} == {
        "app_1-attempt1": "failed", "app_1-attempt2": "completed", "app_2-attempt1": "cancelled",
        "app_3-attempt1": "failed", "app_3-attempt3": "failed",
    }  # fmt: skip
    for job in workload.jobs:  # each ends once its recorded work is done
        assert end[job.job_id] - start[job.job_id] == job.duration

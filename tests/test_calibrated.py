"""The generators calibrated on published cluster statistics (`gpuyard.workloads.calibrated`):
200,000 jobs of each reproduce the published means and medians within 10%, stay under the
published maxima, arrive at the trace's jobs per day with a daily cycle, and are the same for
the same seed."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import structlog

from gpuyard.cli import main
from gpuyard.workloads.calibrated import (
    CLUSTERS,
    DAILY_AMPLITUDE,
    OUTCOMES,
    ClusterStatistics,
    calibrated,
)
from tests.conftest import SHARED_DATA
from tests.test_cli_sim import gpuyard

N_JOBS = 200_000
WITHIN = 0.10

# One process runs them all: each cluster's 200,000 jobs are made once (`jobs_of`), not in each.
pytestmark = pytest.mark.xdist_group("calibrated")


@functools.cache
def jobs_of(name: str) -> pd.DataFrame:
    """200,000 jobs of cluster `name`: GPUs, run time, arrival, and the extras."""
    workload = calibrated(name, N_JOBS, seed=0)
    columns = {
        "num_gpus": [j.num_gpus for j in workload.jobs],
        "duration": [j.duration for j in workload.jobs],
        "submit_time": [j.submit_time for j in workload.jobs],
        "outcome": [j.outcome or "completed" for j in workload.jobs],
    }
    frame = pd.DataFrame(columns)
    return frame if workload.extras is None else frame.join(workload.extras.reset_index(drop=True))


@pytest.fixture(params=sorted(CLUSTERS))
def generated(request: pytest.FixtureRequest) -> tuple[ClusterStatistics, pd.DataFrame]:
    """A cluster's statistics and 200,000 of its jobs (made once per cluster)."""
    return CLUSTERS[request.param], jobs_of(request.param)


def near(measured: float, published: float) -> bool:
    return abs(measured - published) <= WITHIN * published


def test_gpus_per_job_match_the_published_statistics(
    generated: tuple[ClusterStatistics, pd.DataFrame],
) -> None:
    stats, jobs = generated
    # PAI's requests are fractions of a GPU, kept in the extras (num_gpus rounds them up)
    gpus = jobs["gpu_request"] if stats.median_gpus < 1 else jobs["num_gpus"]
    assert near(gpus.mean(), stats.mean_gpus), gpus.mean()
    assert near(gpus.median(), stats.median_gpus), gpus.median()
    assert gpus.max() <= stats.max_gpus
    assert (jobs["num_gpus"] == np.ceil(gpus)).all() and (jobs["num_gpus"] >= 1).all()


def test_run_times_match_the_published_statistics(
    generated: tuple[ClusterStatistics, pd.DataFrame],
) -> None:
    stats, jobs = generated
    run_s = jobs["duration"]
    assert near(run_s.mean(), stats.mean_run_s), run_s.mean()
    assert near(run_s.median(), stats.median_run_s), run_s.median()
    assert run_s.max() <= stats.max_run_s and (run_s == np.ceil(run_s)).all()


def test_arrivals_keep_the_trace_rate_with_a_daily_cycle(
    generated: tuple[ClusterStatistics, pd.DataFrame],
) -> None:
    stats, jobs = generated
    arrival = jobs["submit_time"].to_numpy()
    assert (np.diff(arrival) >= 0).all()
    whole_days = math.floor(arrival[-1] / 86400)  # (a last part day would weigh its hours)
    in_days = arrival[arrival < whole_days * 86400]
    assert near(len(in_days) / whole_days, stats.jobs_per_day), len(in_days) / whole_days
    per_hour = np.bincount((in_days % 86400 // 3600).astype(int), minlength=24)
    # the cosine's busiest hour has (1 + A)/(1 - A) = 3x the quietest's rate, nearly
    assert per_hour.max() / per_hour.min() > 0.9 * (1 + DAILY_AMPLITUDE) / (1 - DAILY_AMPLITUDE)
    assert 13 <= per_hour.argmax() <= 17 and (per_hour.argmin() <= 5 or per_hour.argmin() == 23)


def test_outcomes_follow_the_published_shares(
    generated: tuple[ClusterStatistics, pd.DataFrame],
) -> None:
    stats, jobs = generated
    if stats.outcome_shares is None:
        assert (jobs["outcome"] == "completed").all()
        return
    shares = jobs["outcome"].value_counts(normalize=True)
    for outcome, published in zip(OUTCOMES, stats.outcome_shares, strict=True):
        assert abs(shares[outcome] - published) < 0.01, outcome


def test_same_seed_same_jobs_and_load_sets_the_rate() -> None:
    first, again = calibrated("seren", 5000, seed=3), calibrated("seren", 5000, seed=3)
    assert first.jobs == again.jobs  # (outcomes included)
    pai, pai_again = calibrated("pai", 5000, seed=3), calibrated("pai", 5000, seed=3)
    assert pai.extras is not None and pai.extras.equals(pai_again.extras)  # (GPU fractions)
    assert calibrated("seren", 5000, seed=4).jobs != first.jobs
    busy = calibrated("seren", 20_000, jobs_per_hour=600.0, seed=3)
    days = busy.jobs[-1].submit_time / 86400
    assert near(len(busy) / days, 600.0 * 24)


def test_table_is_the_published_file() -> None:
    path = SHARED_DATA / "acme" / "cluster_summary.csv"
    if not path.is_file():
        pytest.skip("../shared/data/acme/cluster_summary.csv is not present")
    rows = pd.read_csv(path).set_index("id")
    columns = {
        "jobs": "job_num", "gpu_jobs": "gpu_job_num", "mean_run_s": "avg_run_time_gpu",
        "median_run_s": "med_run_time_gpu", "max_run_s": "max_run_time_gpu",
        "mean_gpus": "avg_gpu_num", "median_gpus": "med_gpu_num", "max_gpus": "max_gpu",
    }  # fmt: skip
    assert sorted(s.csv_id for s in CLUSTERS.values()) == sorted(rows.index)
    for stats in CLUSTERS.values():
        row = rows.loc[stats.csv_id]
        for field, column in columns.items():
            assert getattr(stats, field) == row[column], (stats.csv_id, field)
        rates = row[["complete_rate_gpu", "cancel_rate_gpu", "fail_rate_gpu"]]
        published = None if rates.isna().all() else tuple(rates)
        assert stats.outcome_shares == published, stats.csv_id


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu-demand", "1"], "--gpu-demand applies to the blox generator"),
        (["--multi-gpu"], "--multi-gpu applies to the gavel generator"),
        (["--deadline-factor", "1.5"], "--deadline-factor applies to the elasticflow generator"),
        (["--load", "0"], "argument --load: must be greater than 0, not 0"),
    ],
    ids=["gpu-demand", "multi-gpu", "deadline-factor", "load"],
)
def test_options_a_calibrated_generator_ignores_are_refused(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["sim", "--generator", "helios", *argv, "--out", str(tmp_path / "o")])
    except SystemExit as exc:  # argparse
        code = exc.code
    finally:
        structlog.reset_defaults()
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_trace_generate_writes_the_jobs_and_their_outcomes(tmp_path: Path) -> None:
    out = tmp_path / "helios.csv"
    assert main(["trace", "generate", "--generator", "helios", "--jobs", "300", str(out)]) == 0
    jobs = pd.read_csv(out)
    assert len(jobs) == 300 and set(jobs["outcome"].fillna("completed")) == set(OUTCOMES)
    assert jobs["num_gpus"].tolist() == [j.num_gpus for j in calibrated("helios", 300).jobs]


@pytest.mark.slow
def test_sim_runs_a_calibrated_workload(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = gpuyard(
        "sim", "--generator", "seren", "--jobs", "200", "--cluster-spec", "32x8", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    workload = json.loads((out / "options.json").read_text())["workload"]
    assert workload["generator"] == "seren" and workload["jobs"] == 200
    assert near(workload["load"], CLUSTERS["seren"].jobs_per_day / 24)
    assert len(pd.read_csv(out / "jobs.csv")) == 200

"""`gpuyard trace describe --against`: a generated workload beside a cluster's published
statistics (AcmeTrace's cluster_summary.csv, skipped without ../shared/data/acme) or beside
another trace, in one figure and in the JSON's `against`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import structlog
from matplotlib.image import imread
from PIL import Image

from gpuyard.cli import main
from tests.conftest import SHARED_DATA

SUMMARY = SHARED_DATA / "acme" / "cluster_summary.csv"


def gpuyard(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The CLI run in this process: its exit code, stdout and stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    finally:
        structlog.reset_defaults()
    out = capsys.readouterr()
    return code, out.out, out.err


def generate(path: Path, generator: str, jobs: int, seed: int, capsys: Any) -> pd.DataFrame:
    argv = ["trace", "generate", "--generator", generator, "--seed", str(seed)]
    code, _, err = gpuyard([*argv, "--jobs", str(jobs), str(path)], capsys)
    assert code == 0, err
    return pd.read_csv(path)


def assert_a_figure(path: Path, *, title_has: list[str]) -> None:
    """A PNG a reader can look at: a sizeable RGB(A) image that is not blank, titled."""
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] >= 400 and pixels.shape[1] >= 1000, pixels.shape
    assert pixels[..., :3].std() > 0.05  # (drawn on: a blank figure is one colour)
    title = Image.open(path).text["Title"]
    assert all(part in title for part in title_has), title


@pytest.mark.slow
def test_against_a_published_cluster_gives_the_csv_and_summary_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not SUMMARY.is_file():
        pytest.skip("../shared/data/acme/cluster_summary.csv is not present")
    trace = tmp_path / "helios_jobs.csv"
    jobs = generate(trace, "helios", 2000, 1, capsys)
    plots = tmp_path / "plots"
    argv = ["trace", "describe", "--plots", str(plots), "--against", "helios", str(trace)]
    code, out, err = gpuyard(argv, capsys)
    assert code == 0, err
    described = json.loads(out)  # (stdout stays one JSON document)
    assert described["jobs"] == 2000
    against = described["against"]
    figure = plots / "helios_jobs_vs_helios.png"
    assert against["figure"] == str(figure) and against["published"] == "Helios"
    assert_a_figure(figure, title_has=["helios_jobs.csv", "2,000 jobs", "Helios"])

    # the workload's side, computed here from the CSV
    arrival = jobs["submit_time"].sort_values().to_numpy()
    ends = jobs["outcome"].fillna("completed")
    measured = {
        "jobs_per_day": (len(jobs) - 1) * 86400 / (arrival[-1] - arrival[0]),
        "gpus_mean": jobs["num_gpus"].mean(),
        "gpus_median": jobs["num_gpus"].median(),
        "gpus_max": jobs["num_gpus"].max(),
        "run_time_mean_s": jobs["duration"].mean(),
        "run_time_median_s": jobs["duration"].median(),
        "run_time_max_s": jobs["duration"].max(),
        "completed_share": (ends == "completed").mean(),
        "cancelled_share": (ends == "cancelled").mean(),
        "failed_share": (ends == "failed").mean(),
    }
    # the published side, read here from the file
    row = pd.read_csv(SUMMARY).set_index("id").loc["Helios"]
    published = {
        "jobs_per_day": None,  # (the span is not in the file: checked below against the rate)
        "gpus_mean": row["avg_gpu_num"],
        "gpus_median": row["med_gpu_num"],
        "gpus_max": row["max_gpu"],
        "run_time_mean_s": row["avg_run_time_gpu"],
        "run_time_median_s": row["med_run_time_gpu"],
        "run_time_max_s": row["max_run_time_gpu"],
        "completed_share": row["complete_rate_gpu"],
        "cancelled_share": row["cancel_rate_gpu"],
        "failed_share": row["fail_rate_gpu"],
    }
    statistics = against["statistics"]
    assert list(statistics) == list(measured)
    for key, value in measured.items():
        shown = statistics[key]
        assert shown["workload"] == pytest.approx(value, rel=1e-12), key
        if published[key] is not None:
            assert shown["real"] == pytest.approx(published[key], rel=1e-12), key
        assert shown["relative_difference"] == pytest.approx(value / shown["real"] - 1), key
        assert shown["within_10pct"] == (abs(value / shown["real"] - 1) <= 0.10), key
    # Helios's GPU jobs over its 183 days (Hu et al., SC '21)
    assert statistics["jobs_per_day"]["real"] == pytest.approx(row["gpu_job_num"] / 183)
    # the generator reproduces the medians: the table says so at a glance
    assert statistics["gpus_median"]["within_10pct"] and statistics["gpus_max"]["ratio"] < 1
    lines = err.splitlines()
    assert any(line.startswith("GPUs per job, median") and "within 10%" in line for line in lines)
    assert any(line.startswith("GPUs per job, max") and "within" not in line for line in lines)


@pytest.mark.slow
def test_against_another_trace_overlays_both_with_their_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours, theirs = tmp_path / "generated.csv", tmp_path / "real.csv"
    generate(ours, "helios", 2000, 1, capsys)
    other = generate(theirs, "philly", 700, 2, capsys)
    plots = tmp_path / "plots"
    argv = ["trace", "describe", "--plots", str(plots), "--against", str(theirs), str(ours)]
    code, out, err = gpuyard(argv, capsys)
    assert code == 0, err
    described = json.loads(out)
    against = described["against"]
    assert (described["jobs"], against["jobs"]) == (2000, 700)
    assert against["statistics"]["jobs"] == {
        "workload": 2000.0, "real": 700.0, "ratio": pytest.approx(2000 / 700),
        "relative_difference": pytest.approx(2000 / 700 - 1), "within_10pct": False,
    }  # fmt: skip
    assert against["statistics"]["run_time_median_s"]["real"] == other["duration"].median()
    figure = plots / "generated_vs_real.png"
    assert against["figure"] == str(figure)
    assert_a_figure(figure, title_has=["generated.csv", "2,000 jobs", "real.csv", "700 jobs"])
    table = next(line for line in err.splitlines() if line.startswith("jobs "))
    assert table.split()[1:3] == ["2,000", "700"]


@pytest.mark.parametrize("real", ["hellios", "no_such_trace.csv"])
def test_an_unknown_cluster_or_missing_trace_is_one_line(
    real: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "jobs.csv"
    generate(trace, "helios", 50, 1, capsys)
    plots = tmp_path / "plots"
    argv = ["trace", "describe", "--plots", str(plots), "--against", real, str(trace)]
    code, out, err = gpuyard(argv, capsys)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--against {real}" in err and "helios, kalos, pai, philly, seren" in err, err
    assert not plots.exists() or not list(plots.glob("*_vs_*.png"))


@pytest.mark.slow
def test_gpus_per_job_of_pai_are_its_fractions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PAI's generator asks for fractions of a GPU (`gpu_request`, rounded up in num_gpus): the
    comparison takes the fractions, or its median would be 1 against a published 0.5."""
    trace = tmp_path / "pai.csv"
    jobs = generate(trace, "pai", 400, 3, capsys)
    argv = ["trace", "describe", "--plots", str(tmp_path), "--against", "PAI", str(trace)]
    code, out, err = gpuyard(argv, capsys)
    assert code == 0, err
    statistics = json.loads(out)["against"]["statistics"]
    assert statistics["gpus_median"]["workload"] == jobs["gpu_request"].median() == 0.5
    assert statistics["gpus_mean"]["workload"] == pytest.approx(jobs["gpu_request"].mean())
    assert "failed_share" not in statistics  # (PAI's summary has no outcomes)
    assert np.isfinite(statistics["run_time_mean_s"]["ratio"])

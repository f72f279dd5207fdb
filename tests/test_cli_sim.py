"""`gpuyard sim` and `gpuyard trace` as users meet them: options checked and named, sources that
would ignore an option refuse it, results that say what ran (policies asked of the services,
the Philly reading, captions on every plot), a summary for people."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import structlog
from matplotlib.figure import Figure
from PIL import Image

from gpuyard.cli import main
from gpuyard.report import plot_gpu_demand, plot_lengths
from gpuyard.run.compare import _plot_mean_jct_vs_load, comparison_caption
from gpuyard.run.launcher import ServiceSet
from gpuyard.run.simulate import SimOptions, policies_label, service_configs
from gpuyard.run.spec import RunSpec
from gpuyard.shared.model import ClusterSpec


def gpuyard(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args], capture_output=True, text=True,
        timeout=300, cwd=cwd,
    )  # fmt: skip


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`gpuyard ARGV` in this process: its exit status and stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    finally:
        structlog.reset_defaults()  # a command may have pointed it at the captured stderr
    return int(code or 0), capsys.readouterr().err


BAD_OPTIONS = [
    (["--load", "0"], "argument --load: must be greater than 0, not 0"),
    (["--load", "10,0"], "argument --load: must be greater than 0, not 0 (in '10,0')"),
    (["--load", "ten"], "argument --load: 'ten' is not a number"),
    (["--load", "inf"], "argument --load: 'inf' is not a finite number"),
    (["--round", "0"], "argument --round: must be greater than 0, not 0"),
    (["--round", "-300"], "argument --round: must be greater than 0, not -300"),
    (["--jobs", "-5"], "argument --jobs: must be greater than 0, not -5"),
    (["--jobs", "0"], "argument --jobs: must be greater than 0, not 0"),
    (["--seed", "-1"], "argument --seed: must be 0 or more, not -1"),
    (["--seed", "0,-1"], "argument --seed: must be 0 or more, not -1 (in '0,-1')"),
    (["--seed", "1.5"], "argument --seed: '1.5' is not an integer"),
    (["--checkpoint-s", "-1000"], "argument --checkpoint-s: must be 0 or more, not -1000"),
    (["--restore-s", "-1"], "argument --restore-s: must be 0 or more, not -1"),
    (["--parallel", "0"], "argument --parallel: must be greater than 0, not 0"),
    (["--churn-node-gpus", "0"], "argument --churn-node-gpus: must be greater than 0, not 0"),
    (["--gpu-demand", "0:1"], "argument --gpu-demand: '0:1' is not GPUS:WEIGHT"),
    (["--gpu-demand", "1:-0.5"], "argument --gpu-demand: '1:-0.5' is not GPUS:WEIGHT"),
    (["--gpu-demand", "2:0"], "argument --gpu-demand: '2:0': every weight is 0"),
    (["--log-level", "loud"], "argument --log-level: invalid choice: 'loud'"),
    (["--policy", "fifo,,las"], "--policy 'fifo,,las' has an empty name"),
    (["--policy", "fifo,las,fifo"], "--policy 'fifo,las,fifo' names 'fifo' twice"),
    (["--load", "4,8,4.0"], "argument --load: '4,8,4.0' gives 4 twice"),
    (["--seed", "0,1,1"], "argument --seed: '0,1,1' gives 1 twice"),
    # An enum parameter's error lists the values it takes.
    (
        ["--policy", "las", "--param", "key=bogus"],
        "scheduling policy 'las': bad parameter: Invalid enum value 'bogus' - at `$.key` "
        "(valid: gpu_seconds, rounds)",
    ),
    # In a comparison, every policy's parameters are checked before any run starts.
    (
        ["--policy", "las,fifo", "--param", "key=rounds", "--jobs", "5"],
        "scheduling policy 'fifo': bad parameter: Object contains unknown field `key`",
    ),
    (["--external", "clock", "--nats", "nats://127.0.0.1:1"], "--external 'clock' is not one of"),
    (["--external", "scheduler"], "--external needs --nats"),
    (["--cluster", "a.b"], "--cluster 'a.b'"),
    (["--window", "5:3"], "argument --window: '5:3' is not FIRST:END with 0 <= FIRST < END"),
    (["--window", "10"], "argument --window: '10' is not FIRST:END"),
    (["--window", "0:500", "--jobs", "100"], "--window 0:500: the workload has only 100 jobs"),
    (["--deadline-factor", "0"], "argument --deadline-factor: '0' is not FACTOR or MIN:MAX"),
    (["--deadline-factor", "1.5:0.5"], "argument --deadline-factor: '1.5:0.5': MIN is greater"),
    (["--deadline-factor", "a:b"], "argument --deadline-factor: 'a:b' is not FACTOR or MIN:MAX"),
    (["--best-effort-share", "1.5"], "argument --best-effort-share: must be 1 or less, not 1.5"),
    (["--best-effort-share", "-0.1"], "argument --best-effort-share: must be 0 or more"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_OPTIONS, ids=lambda v: " ".join(v)[:30])
def test_bad_sim_option_is_one_line_naming_it(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(["sim", *argv, "--out", str(tmp_path)], capsys)
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("gpuyard sim: ") and message in line
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["up", "--round", "0"], "gpuyard up: error: argument --round: must be greater than 0"),
        (["up", "--heartbeat-timeout", "-1"], "argument --heartbeat-timeout: must be greater"),
        (["up", "--listen", "127.0.0.1:99999"], "'127.0.0.1:99999': the port must be 0 to 65535"),
        (["up", "--listen", ":4222"], "argument --listen: ':4222' is not HOST:PORT"),
        (["up", "--listen", "host:x"], "argument --listen: 'host:x': the port 'x' is not a number"),
        (["submit", "--gpus", "0", "--", "x"], "argument --gpus: '0' is neither a whole number"),
        (["submit", "--gpus", "1.5", "--", "x"], "argument --gpus: '1.5' is neither a whole"),
        (["submit", "--deadline", "-5", "--", "x"], "argument --deadline: must be greater"),
        (
            ["submit", "--time-limit", "soon", "--", "x"],
            "argument --time-limit/-t: 'soon' is not a time limit; forms: MM, MM:SS, HH:MM:SS",
        ),
        (["submit", "-t", "0:00", "--", "x"], "'0:00': a time limit must be more than 0"),
        (["logs", "--tail", "-1", "j1"], "argument --tail: must be 0 or more, not -1"),
        (["tail", "--type", "job"], "--type 'job' matches no event type; types: job.submitted"),
        (["submit", "--file", "/nonexistent/job.toml"], "submit: /nonexistent/job.toml: No such"),
        (["tail", "--type", "job.*", "--type", "jobs.>"], "--type 'jobs.>' matches no event"),
        (["nodeagent", "--heartbeat", "0"], "--heartbeat must be > 0 seconds"),
        (["nodeagent", "--grace", "-1"], "--grace must be >= 0 seconds"),
        (["trace", "generate", "--jobs", "0", "x.csv"], "argument --jobs: must be greater"),
        (["trace", "generate", "--load", "10,20", "x.csv"], "--load: one value here, not a list"),
        (["trace", "generate", "/nonexistent/x.csv"], "'/nonexistent/x.csv': no folder"),
        (["trace", "convert", "in.csv", "/"], "argument out: '/' is a folder: name a file"),
    ],
    ids=lambda v: " ".join(v)[:30],
)
def test_bad_numeric_option_of_other_commands(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(argv, capsys)
    assert code == 2
    (line,) = err.splitlines()
    assert message in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--multi-gpu"], "--multi-gpu applies to the gavel generator and Philly traces"),
        (["--generator", "gavel", "--gpu-demand", "1"], "--gpu-demand applies to the blox"),
        (["--generator", "elasticflow", "--multi-gpu"], "--multi-gpu applies to the gavel"),
        (["--skip-bad"], "--skip-bad applies to --trace only"),
        (["--philly-reading", "plain"], "--philly-reading applies to --trace only"),
        (["--trace", "t.csv", "--jobs", "5", "--load", "1"], "--jobs, --load describe generated"),
        (["--blox", "--mode", "events"], "--mode events: --blox decides at round ends"),
        (
            ["--as-intended"],
            "--as-intended applies to a preset with reference bugs (--elasticflow)",
        ),
        (["--gavel", "--as-intended"], "--as-intended: --gavel has no reference bug to mend"),
        (["--deadline-factor", "1.5"], "--deadline-factor applies to the elasticflow generator"),
        (
            ["--generator", "gavel", "--deadline-factor", "1", "--best-effort-share", "0.5"],
            "--deadline-factor, --best-effort-share apply to the elasticflow generator, not to gavel",
        ),
        (
            ["--trace", "t.csv", "--best-effort-share", "0.5"],
            "--best-effort-share describes generated",
        ),
    ],
    ids=lambda v: " ".join(v)[:30],
)
def test_options_the_source_would_ignore_are_refused(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(["sim", *argv, "--out", str(tmp_path)], capsys)
    assert code == 2 and message in err


def philly_log(path: Path) -> Path:
    """Two Philly jobs: one of 1.5 h (4 then 8 GPUs), one of 3 h on 32 GPUs whose last attempt
    is broken (Blox's reading drops it)."""

    def attempt(start: str, end: str, gpus: int) -> dict:
        return {"start_time": start, "end_time": end, "detail": [{"ip": "m", "gpus": ["g"] * gpus}]}

    path.write_text(
        json.dumps(
            [
                {
                    "status": "Pass",
                    "vc": "vc1",
                    "jobid": "app_1",
                    "user": "u1",
                    "submitted_time": "2017-10-01 00:00:00",
                    "attempts": [
                        attempt("2017-10-01 00:10:00", "2017-10-01 01:10:00", 4),
                        attempt("2017-10-01 02:00:00", "2017-10-01 02:30:00", 8),
                    ],
                },
                {
                    "status": "Pass",
                    "vc": "vc2",
                    "jobid": "app_4",
                    "user": "u4",
                    "submitted_time": "2017-10-01 00:30:00",
                    "attempts": [
                        attempt("2017-10-01 00:30:00", "2017-10-01 03:30:00", 32),
                        attempt("None", "None", 2),
                    ],
                },
            ]
        )
    )
    return path


@pytest.mark.parametrize(
    ("reading", "gpus"),
    [([], {"app_1": 1}), (["--multi-gpu"], {"app_1": 8}),
     (["--philly-reading", "plain"], {"app_1": 8, "app_4": 32})],
    ids=["blox", "blox-multi-gpu", "plain"],
)  # fmt: skip
@pytest.mark.slow
def test_philly_reading_is_explicit_and_recorded(
    tmp_path: Path, reading: list[str], gpus: dict[str, int]
) -> None:
    trace = philly_log(tmp_path / "cluster_job_log.json")
    out = tmp_path / "run"
    result = gpuyard(
        "sim", "--trace", str(trace), *reading, "--cluster-spec", "2x32", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    name = "plain" if "plain" in reading else "blox"
    assert f"Philly trace read the {name} way" in result.stderr
    assert ("with --multi-gpu" in result.stderr) == ("--multi-gpu" in reading)
    workload = json.loads((out / "options.json").read_text())["workload"]
    assert workload["format"] == "philly" and workload["philly_reading"] == name
    assert workload["multi_gpu"] == ("--multi-gpu" in reading)
    jobs = pd.read_csv(out / "jobs.csv")
    assert dict(zip(jobs["job_id"], jobs["num_gpus"], strict=True)) == gpus


def test_philly_options_a_reading_ignores_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = philly_log(tmp_path / "cluster_job_log.json")
    argv = ["sim", "--trace", str(trace), "--philly-reading", "plain", "--multi-gpu"]
    code, err = run_main([*argv, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "--multi-gpu applies to the blox reading" in err
    blox = tmp_path / "jobs.csv"
    blox.write_text("job_id,arrival_time_s,duration_s,num_gpus\n1,0,600,1\n")
    for option in (["--philly-reading", "blox"], ["--multi-gpu"]):
        argv = ["sim", "--trace", str(blox), *option, "--out", str(tmp_path / "o")]
        code, err = run_main(argv, capsys)
        assert code == 2
        assert f"{option[0]} applies to Philly traces, not to blox ones" in err
    for command in (["convert", str(blox), "x.csv"], ["describe", str(blox)]):  # same checks
        code, err = run_main(["trace", *command, "--multi-gpu"], capsys)
        assert code == 2 and "--multi-gpu applies to Philly traces" in err


@pytest.mark.slow
def test_skipped_lines_are_listed(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    rows = ["job_id,arrival_time_s,duration_s,num_gpus", "1,0,600,1"]
    rows += [f"{i},10,oops,1" for i in range(2, 10)]  # lines 3 to 10: eight broken lines
    trace.write_text("\n".join(rows) + "\n")
    result = gpuyard(
        "sim", "--trace", str(trace), "--skip-bad", "--cluster-spec", "1x4",
        "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    start = lines.index("gpuyard sim: skipped 8 broken trace lines:")
    listed = lines[start + 1 : start + 7]
    assert listed[:5] == [
        f"  {trace}, line {n}, field 'duration_s': 'oops' is not a number" for n in range(3, 8)
    ]
    assert listed[5] == "  ... and 3 more"


@pytest.mark.slow
def test_a_job_that_can_never_run_is_listed_as_declined_with_why(tmp_path: Path) -> None:
    """Nothing vanishes: admission declines a job no node can hold; the results list it."""
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,arrival_time_s,duration_s,num_gpus\n0,10,100,16\n1,20,100,1\n")
    out = tmp_path / "run"
    result = gpuyard("sim", "--trace", str(trace), "--cluster-spec", "2x4", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "jobs         1 completed, 0 failed, 1 declined by admission of 2" in result.stdout
    rows = {row["job_id"]: row for row in csv.DictReader((out / "jobs.csv").open())}
    assert rows["1"]["state"] == "completed"
    declined = rows["0"]
    assert (declined["state"], declined["admission"], declined["num_gpus"]) == (
        "declined",
        "declined",
        "16",
    )
    assert "16 GPUs" in declined["reason"] and declined["start"] == ""
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["declined"], summary["never_fits"]) == (1, 1)
    assert "gpuyard sim: warning: 1 job can never run on this cluster" in result.stderr
    # --strict: the same run and results, and an error (exit 1) saying so
    strict = gpuyard("sim", "--trace", str(trace), "--cluster-spec", "2x4", "--strict", "--out",
                     str(tmp_path / "strict"))  # fmt: skip
    assert strict.returncode == 1
    assert strict.stderr.splitlines()[-1].startswith("gpuyard sim: --strict: 1 job can never run")
    assert (tmp_path / "strict" / "jobs.csv").read_bytes() == (out / "jobs.csv").read_bytes()


@pytest.mark.slow
def test_summary_for_people(tmp_path: Path) -> None:
    """The summary printed at the end, and what ran as the services report it (no warning when
    it is what was asked). `--json` prints summary.json: tests/test_cli.py."""
    out = tmp_path / "run"
    result = gpuyard(
        "sim", "--jobs", "30", "--cluster-spec", "4x4", "--policy", "las",
        "--param", "starvation_s=7200", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy_params"]["starvation_s"] == 7200.0 and "key" in summary["policy_params"]
    text = result.stdout
    assert "policy       las key=" in text and "starvation_s=7200.0" in text
    assert "workload     blox generator: 30 jobs, 20 jobs/h, seed 0" in text
    assert "cluster      4x4:gpu (16 GPUs)" in text
    assert "jobs         30 completed, 0 failed of 30" in text
    assert f"mean {summary['mean_jct'] / 3600:,.2f} h" in text
    assert f"utilisation  {100 * summary['utilization']:.1f}% of GPU time" in text


@pytest.mark.slow
async def test_external_services_are_asked_what_they_run(tmp_path: Path, nats_url: str) -> None:
    """`--external ... --policy srtf` against a LAS scheduler: the results say LAS (as the
    services report it, every parameter included), and stderr warns."""
    configs = service_configs(
        SimOptions(cluster=ClusterSpec.parse("4x4"), policy="las"), tmp_path / "unused.jsonl"
    )
    external = {k: v for k, v in configs.items() if k != "simclock"}
    out = tmp_path / "run"
    async with ServiceSet(nats_url, "ext", external):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuyard.cli", "sim", "--nats", nats_url, "--cluster", "ext",
            "--external", "admission,scheduler,placement", "--policy", "srtf", "--jobs", "20",
            "--cluster-spec", "4x4", "--out", str(out),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    warning = [line for line in err.decode().splitlines() if "warning" in line]
    assert len(warning) == 1
    assert warning[0].startswith("gpuyard sim: warning: scheduler runs las ")
    assert warning[0].endswith("not the srtf asked for; results record what ran")
    summary = json.loads((out / "summary.json").read_text())
    options = json.loads((out / "options.json").read_text())
    for record in (summary, options):
        assert record["policy"] == "las" and record["policy_params"]  # defaults included
        assert record["admission"] == "accept-all" and record["placement"] == "consolidated"
    assert Image.open(out / "jct_cdf.png").text["Description"].startswith("scheduling las (")


@pytest.mark.slow
def test_every_plot_says_what_ran(tmp_path: Path) -> None:
    """Captions (and the PNG's Description) name the policies, workload, cluster and seeds."""
    out = tmp_path / "cmp"
    result = gpuyard(
        "sim", "--policy", "las", "--load", "10,20", "--seed", "0,1", "--jobs", "20",
        "--cluster-spec", "2x4", "--parallel", "2", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(out / "comparison.csv")
    assert len(table) == 4 and not table["partial"].any()
    assert "mean JCT (h)" in result.stdout and "las" in result.stdout
    mean_plot = Image.open(out / "mean_jct_vs_load.png")
    caption = mean_plot.text["Description"]
    assert "blox generator, 20 jobs per run, seeds 0, 1; cluster 2x4:gpu (8 GPUs)" in caption
    assert "admission accept-all, placement consolidated" in caption
    assert "points: mean over 2 seeds; bars: from the lowest to the highest" in caption
    assert "seeds 0, 1" in Image.open(out / "jct_cdfs.png").text["Description"]
    run = Image.open(out / "las-load20-seed1" / "timeline.png").text["Description"]
    assert run.startswith("scheduling las (")
    assert "blox generator: 20 jobs, 20 jobs/h, seed 1; cluster 2x4:gpu (8 GPUs)" in run


def test_a_comparison_plot_names_each_points_seeds(tmp_path: Path) -> None:
    """A run left out (interrupted) leaves a point with fewer seeds: the caption and legend give
    the n of the points, not the most seeds any point has."""
    done = pd.DataFrame({"policy": ["las"] * 5 + ["fifo"] * 6,
                         "load": [10.0, 10.0, 10.0, 20.0, 20.0] + [10.0] * 3 + [20.0] * 3,
                         "mean_jct": [3600.0 * (1 + i % 3) for i in range(11)]})  # fmt: skip
    caption = Image.open(_plot_mean_jct_vs_load(done, tmp_path, "what ran")).text["Description"]
    assert caption.splitlines()[1] == (
        "points: mean over 2 to 3 seeds (each policy's n in the legend); bars: from the lowest "
        "to the highest seed's mean JCT"
    )
    uniform = done[done["policy"] == "fifo"]
    caption = Image.open(_plot_mean_jct_vs_load(uniform, tmp_path, "")).text["Description"]
    assert caption.splitlines()[1].startswith("points: mean over 3 seeds; bars")


def test_a_comparison_caption_names_the_simulator_semantics() -> None:
    """A comparison's plots say which reference simulator's semantics ran, and on which table."""
    spec = RunSpec(
        trace="traces/continuous_multi_gpu.trace", preset="gavel",
        throughputs="data/simulation_throughputs.json",
    )  # fmt: skip
    caption = comparison_caption(pd.DataFrame(), spec)
    assert caption.splitlines() == [
        "trace continuous_multi_gpu.trace",
        "Gavel's simulator semantics (--gavel); throughputs simulation_throughputs.json",
    ]
    plain = RunSpec(jobs=20, round_s=120.0)
    assert comparison_caption(pd.DataFrame(), plain).splitlines()[1] == (
        "120 s rounds; throughputs default"
    )
    # And each run's own plots.
    cluster = ClusterSpec.parse("4x4")
    run = policies_label(SimOptions(cluster=cluster, policy="max_min_fairness_perf", preset="gavel",
                                    round_s=360.0))  # fmt: skip
    assert run.endswith("360 s rounds, Gavel's simulator semantics"), run
    plain_run = policies_label(SimOptions(cluster=cluster, policy="las"))
    assert plain_run.endswith("300 s rounds, events mode"), plain_run


@pytest.mark.slow
def test_describe_writes_its_plot_where_asked_never_beside_the_input(tmp_path: Path) -> None:
    data, work = tmp_path / "data", tmp_path / "work"
    data.mkdir()
    work.mkdir()
    trace = data / "jobs.csv"
    rows = ["job_id,arrival_time_s,duration_s,num_gpus"]
    rows += [f"{i},{i * 60},{600 + i},{8 if i == 0 else 1}" for i in range(500)]
    trace.write_text("\n".join(rows) + "\n")
    result = gpuyard("trace", "describe", str(trace), cwd=work)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(data)) == ["jobs.csv"]
    plot = Image.open(work / "jobs_workload.png")
    assert plot.text["Title"] == "workload jobs.csv (blox): 500 jobs"
    assert json.loads(result.stdout)["gpu_demand"] == {"1": 499, "8": 1}


@pytest.mark.parametrize(
    ("counts", "scale"),
    [({1: 1200, 8: 3}, "log"), ({1: 60, 2: 30, 4: 5}, "linear"), ({}, "linear")],
)
def test_describe_shows_small_gpu_demand_counts(counts: dict[int, int], scale: str) -> None:
    """`trace describe`'s GPU-demand bars each carry their count, on a log scale when the counts
    span more than two orders of magnitude: three 8-GPU jobs among 1,200 stay visible."""
    num_gpus = pd.Series([gpus for gpus, n in counts.items() for _ in range(n)], dtype=int)
    ax = Figure().subplots()
    plot_gpu_demand(ax, num_gpus)
    assert ax.get_yscale() == scale
    assert [text.get_text() for text in ax.texts] == [f"{n:,}" for n in counts.values()]


def test_describe_draws_the_lengths_of_jobs_given_in_steps() -> None:
    """`trace describe` of a Gavel trace (jobs in steps, no durations) draws their steps' CDF;
    its duration panel was empty. Jobs with durations get the duration CDF."""
    in_steps = pd.DataFrame({"duration": [None, None, None], "total_steps": [3000.0, 100.0, 2e4]})
    ax = Figure().subplots()
    plot_lengths(ax, in_steps)
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [100.0, 3000.0, 2e4] and "steps" in ax.get_xlabel()
    timed = pd.DataFrame({"duration": [7200.0, 3600.0], "total_steps": [None, None]})
    ax = Figure().subplots()
    plot_lengths(ax, timed)
    assert list(ax.get_lines()[0].get_xdata()) == [1.0, 2.0] and "hours" in ax.get_xlabel()


@pytest.mark.slow
def test_a_durable_simulation_gives_the_same_results(tmp_path: Path) -> None:
    """`gpuyard sim --durable`: the services keep their state in key-value buckets, as on a real
    cluster, and the run is the same run."""
    args = ["--jobs", "30", "--load", "40", "--cluster-spec", "4x2"]
    plain = gpuyard("sim", *args, "--out", str(tmp_path / "plain"))
    durable = gpuyard("sim", *args, "--durable", "--out", str(tmp_path / "durable"))
    assert plain.returncode == 0 and durable.returncode == 0, durable.stderr
    for name in ("jobs.csv", "timeline.csv"):
        assert (tmp_path / "durable" / name).read_bytes() == (
            tmp_path / "plain" / name
        ).read_bytes()
    # Each durable service loaded its (empty) bucket before serving; the plain run has none.
    for run, restored in (("durable", 3), ("plain", 0)):
        log = (tmp_path / run / "services.log").read_text()
        assert log.count('"event": "state.restored"') == restored, run


def test_a_node_availability_replay_brings_its_own_nodes(tmp_path: Path) -> None:
    """`--node-events` without `--cluster-spec`: only the replay's nodes (BFTrainer's idle nodes),
    not the default 32x4 beside them (which ran the issue's BFTrainer command on 128 other GPUs)."""
    from gpuyard.cli import build_parser
    from gpuyard.cli.sim import run_spec
    from gpuyard.run.build import build

    events = tmp_path / "events.csv"
    events.write_text("time,node,up\n0,n1,True\n100,n1,False\n")
    argv = ["sim", "--node-events", str(events), "--jobs", "5", "--out", str(tmp_path)]
    options, _, _ = build(run_spec(build_parser().parse_args(argv)), tmp_path)
    assert options.cluster.total_gpus == 0 and options.node_events is not None
    plain = build_parser().parse_args(["sim", "--jobs", "5", "--out", str(tmp_path / "p")])
    assert build(run_spec(plain), tmp_path)[0].cluster.total_gpus == 128


def test_a_seed_with_a_trace_seeds_the_policies(tmp_path: Path) -> None:
    """Gavel's `--seed` with a trace: the jobs are the trace's, the seed goes to the policies that
    draw at random (gandiva's pairs), unless `--param seed=` says otherwise."""
    from gpuyard.cli import build_parser
    from gpuyard.cli.sim import run_spec
    from gpuyard.run.build import build

    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpus,submit_time,duration\na,1,0,100\nb,1,10,100\n")
    base = ["sim", "--trace", str(trace), "--out", str(tmp_path)]
    for extra, seed in [(["--seed", "3"], 3), (["--seed", "3", "--param", "seed=5"], 5), ([], 0)]:
        args = build_parser().parse_args([*base, "--policy", "gandiva", *extra])
        options, _, _ = build(run_spec(args), tmp_path)
        assert int(options.policy_params.get("seed", 0)) == seed
    args = build_parser().parse_args([*base, "--seed", "3"])  # fifo draws nothing: accepted
    assert build(run_spec(args), tmp_path)[0].policy_params == {}


def test_gavel_runs_the_cost_normalised_policy_as_its_simulator_does(tmp_path: Path) -> None:
    """Gavel's simulator passes no price table: under `--gavel` every GPU type costs 1 unless
    `--param costs=` gives prices; without `--gavel` the policy's default prices hold."""
    from gpuyard.cli import build_parser
    from gpuyard.cli.sim import run_spec
    from gpuyard.run.build import build
    from gpuyard.shared.policy import scheduling_policies

    trace = tmp_path / "t.csv"
    trace.write_text("job_id,num_gpus,submit_time,duration\na,1,0,100\n")
    base = ["sim", "--trace", str(trace), "--out", str(tmp_path),
            "--cluster-spec", "1x1:v100,1x1:k80", "--policy", "max_sum_throughput_normalized_by_cost_perf"]  # fmt: skip

    def costs(*extra: str) -> dict[str, float]:
        options, _, _ = build(run_spec(build_parser().parse_args([*base, *extra])), tmp_path)
        return scheduling_policies.create(options.policy, options.policy_params).params.costs

    assert costs("--gavel") == {}
    assert costs("--gavel", "--param", 'costs={"v100": 2.0}') == {"v100": 2.0}
    assert costs()["v100"] == 3.06
    args = build_parser().parse_args([*base[:-2], "--gavel"])  # fifo has no costs: nothing added
    assert build(run_spec(args), tmp_path)[0].policy_params == {}


def test_a_comparison_caption_names_each_policy_with_its_parameters_round_and_mode() -> None:
    """A comparison's plots carry what ran, as each run's summary says: every scheduling policy
    with its parameters, admission and placement with theirs, the round length and the mode."""
    rows = [
        {"policy": policy, "policy_params": json.dumps(params), "admission": "accept-all",
         "admission_params": "{}", "placement": "consolidated",
         "placement_params": json.dumps({"order": "largest-first"}), "cluster": "4x4:gpu (16 GPUs)",
         "round_s": 300.0, "mode": "events", "partial": False, "seed": 0, "load": 10.0}
        for policy, params in (("fifo", {"backfill": False}), ("las", {"key": "gpu_seconds"}))
    ]  # fmt: skip
    caption = comparison_caption(pd.DataFrame(rows), RunSpec(jobs=50))
    assert "300 s rounds, events mode" in caption
    assert "scheduling fifo (backfill=False); las (key=gpu_seconds)" in caption
    assert "admission accept-all, placement consolidated (order=largest-first)" in caption


def test_a_comparison_lists_the_runs_that_failed_or_did_not_run(tmp_path: Path) -> None:
    """comparison.csv and the printed table have a row for every run: one that wrote no summary
    is `failed`, with the last line it wrote on stderr, or `not run`; the plots leave them out."""
    from gpuyard.run.compare import comparison_table, format_comparison, write_comparison

    combos = [("fifo", 10.0, 0), ("las", 10.0, 0), ("srtf", 10.0, 0)]
    ok = tmp_path / "fifo-load10-seed0"
    ok.mkdir()
    summary = {"partial": False, "policy": "fifo", "jobs": 5, "jobs_in_workload": 5,
               "completed": 5, "mean_jct": 3600.0, "p95_jct": 7200.0, "makespan": 9000.0,
               "utilization": 0.5}  # fmt: skip
    (ok / "summary.json").write_text(json.dumps(summary))
    (ok / "jobs.csv").write_text("job_id,state,jct\na,completed,3600\n")
    failed = tmp_path / "las-load10-seed0"
    failed.mkdir()
    (failed / "stderr.log").write_text("las-load10-seed0 [###] 1/5 jobs\ngpuyard sim: it broke\n")
    table = comparison_table(combos, tmp_path)
    assert table["status"].tolist() == ["ok", "failed", "not run"]
    assert table["error"].tolist()[1] == "gpuyard sim: it broke"
    printed = format_comparison(table)
    assert "FAILED" in printed and "NOT RUN" in printed and "5/5" in printed
    write_comparison(table, tmp_path)
    assert pd.read_csv(tmp_path / "comparison.csv")["policy"].tolist() == ["fifo", "las", "srtf"]


def test_overwrite_replaces_gpuyards_files_and_keeps_the_rest(tmp_path: Path) -> None:
    """A folder with another run's results is refused, naming them; `--overwrite` removes
    gpuyard's files (a comparison's runs' folders too) and leaves anything else."""
    from gpuyard.run.outputs import claim, results_in

    out = tmp_path / "out"
    (out / "fifo-load10-seed0").mkdir(parents=True)
    for name in ("jobs.csv", "idle_nodes.png", "comparison.csv", "notes.txt"):
        (out / name).write_text("x")
    (out / "fifo-load10-seed0" / "summary.json").write_text("{}")
    (out / "mine").mkdir()  # (a folder of the user's: not a run's)
    (out / "mine" / "data.csv").write_text("x")
    assert results_in(out) == ["comparison.csv", "idle_nodes.png", "jobs.csv", "fifo-load10-seed0/"]
    with pytest.raises(ValueError, match=r"--out .* holds another run's results \(comparison.csv"):
        claim(out, overwrite=False)
    assert (out / "jobs.csv").exists()  # (refused: nothing removed)
    claim(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["mine", "notes.txt"]
    claim(tmp_path / "new", overwrite=False)  # (a folder that is not there is free)


@pytest.mark.slow
def test_a_run_into_another_runs_folder_is_refused_and_overwrite_leaves_no_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node-availability replay writes idle_nodes.png and node_events.csv; a plain run into the
    same folder is refused (exit 2, the results untouched) and, with --overwrite, leaves only
    its own files, every one of them a file gpuyard knows it writes."""
    from gpuyard.run.outputs import RUN_FILES

    events = tmp_path / "events.csv"
    events.write_text("time,node,up\n0,n1,True\n0,n2,True\n30000,n2,False\n")
    out = tmp_path / "out"
    code, err = run_main(["sim", "--node-events", str(events), "--churn-node-gpus", "4",
                          "--jobs", "5", "--out", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    replay = {p.name for p in out.iterdir()}
    assert {"idle_nodes.png", "node_events.csv"} <= replay <= RUN_FILES
    jobs = (out / "jobs.csv").read_bytes()
    code, err = run_main(["sim", "--jobs", "5", "--out", str(out)], capsys)
    assert code == 2 and "holds another run's results" in err and err.count("\n") == 1
    assert (out / "jobs.csv").read_bytes() == jobs
    code, err = run_main(["sim", "--jobs", "5", "--out", str(out), "--overwrite"], capsys)
    assert code == 0, err
    plain = {p.name for p in out.iterdir()}
    assert plain <= RUN_FILES and not plain & {"idle_nodes.png", "node_events.csv"}


def test_a_run_that_cannot_start_leaves_no_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(["sim", "--trace", str(tmp_path / "none.csv"), "--out",
                          str(tmp_path / "new")], capsys)  # fmt: skip
    assert code == 2 and "none.csv" in err
    assert not (tmp_path / "new").exists()


@pytest.mark.slow
def test_a_job_that_ended_on_a_node_before_it_left_is_not_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Job 1 (4 GPUs, ~0.5 h) ends on n2 hours before n2 leaves; with nothing else to decide,
    placement hears of its end only at the next apply, so it names job 1 among the jobs the
    departure hits. The clock, which knows it ended, loses nothing (it failed with KeyError)."""
    events = tmp_path / "events.csv"
    events.write_text("time,node,up\n0,n1,True\n0,n2,True\n30000,n2,False\n")
    out = tmp_path / "out"
    code, err = run_main(["sim", "--node-events", str(events), "--churn-node-gpus", "4",
                          "--jobs", "5", "--out", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    jobs = pd.read_csv(out / "jobs.csv").set_index("job_id")
    assert (jobs["state"] == "completed").all() and len(jobs) == 5
    assert jobs.loc[1, "preemptions"] == 0 and jobs.loc[1, "end"] < 30000


def test_a_parameter_scoped_to_a_policy_goes_to_its_runs_only() -> None:
    """`--param las.key=rounds` is LAS's alone in a comparison; `--param backfill=...` everyone's."""
    from gpuyard.cli import build_parser
    from gpuyard.cli.sim import run_spec

    args = build_parser().parse_args(
        ["sim", "--policy", "fifo,las", "--param", "las.key=rounds", "--param", "backfill=true"]
    )
    assert run_spec(args, policy="las").policy_params == {"key": "rounds", "backfill": "true"}
    assert run_spec(args, policy="fifo").policy_params == {"backfill": "true"}

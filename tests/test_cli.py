"""The `gpuyard` command as a user runs it: real processes, a private NATS server per run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest


def gpuyard(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_sim_runs_on_an_embedded_server_and_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = gpuyard(
        "sim", "--jobs", "30", "--load", "20", "--cluster-spec", "4x4", "--out", str(out), "--json"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["completed"] == 30
    assert summary == json.loads((out / "summary.json").read_text())
    assert "30/30 jobs" in result.stderr  # the progress bar's last line
    assert len(pd.read_csv(out / "jobs.csv")) == 30


@pytest.mark.slow
def test_a_comparison_takes_its_options_in_any_order(tmp_path: Path) -> None:
    # `--json` before `--parallel N` once left N in every run's options ("unrecognized arguments").
    result = gpuyard("sim", "--policy", "fifo,las", "--jobs", "20", "--cluster-spec", "2x4",
                     "--json", "--parallel", "2", "--out", str(tmp_path / "cmp"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    table = json.loads(result.stdout)
    assert [(row["policy"], row["completed"]) for row in table] == [("fifo", 20), ("las", 20)]


@pytest.mark.slow
def test_bad_input_gets_a_clear_error(tmp_path: Path) -> None:
    result = gpuyard("sim", "--policy", "nosuch", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "unknown scheduling policy 'nosuch'" in result.stderr and "fifo" in result.stderr
    result = gpuyard("sim", "--param", "backfill=maybe", "--out", str(tmp_path))
    assert result.returncode == 2 and "backfill" in result.stderr
    result = gpuyard("sim", "--cluster-spec", "lots", "--out", str(tmp_path))
    assert result.returncode == 2 and "NODESxGPUS" in result.stderr
    # A comparison names an unknown policy before any run starts (none ran, none wrote).
    result = gpuyard("sim", "--policy", "fifo,nosuch", "--out", str(tmp_path / "cmp"))
    assert result.returncode == 2 and "unknown scheduling policy 'nosuch'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "cmp").exists()
    result = gpuyard("sim", "--elasticflow", "--policy", "ef,nosuch", "--out", str(tmp_path))
    assert result.returncode == 2 and "unknown ElasticFlow scheme 'nosuch'" in result.stderr
    # ... and what every run would read: one line, not a failure per run.
    broken = tmp_path / "throughputs.json"
    broken.write_text('{"v100": {')
    result = gpuyard("sim", "--policy", "fifo,las", "--throughputs", str(broken),
                     "--out", str(tmp_path / "cmp"))  # fmt: skip
    assert result.returncode == 2 and "throughputs.json': not valid JSON" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "cmp").exists()


@pytest.mark.slow
def test_broken_trace_line_is_named_or_skipped(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "job_id,arrival_time_s,duration_s,num_gpus\n1,0,600,1\n2,10,oops,1\n3,20,900,2\n"
    )
    result = gpuyard(
        "sim", "--trace", str(trace), "--trace-format", "blox", "--out", str(tmp_path / "a")
    )
    assert result.returncode == 2
    assert f"{trace}, line 3, field 'duration_s'" in result.stderr
    result = gpuyard(
        "sim", "--trace", str(trace), "--trace-format", "blox", "--skip-bad", "--cluster-spec", "1x4",
        "--out", str(tmp_path / "b"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"skipped 1 broken trace line:\n  {trace}, line 3, field 'duration_s'" in result.stderr
    assert "jobs         2 completed, 0 failed of 2" in result.stdout


@pytest.mark.slow
def test_trace_generate_convert_describe(tmp_path: Path) -> None:
    generated = tmp_path / "gen.csv"
    result = gpuyard("trace", "generate", "--generator", "blox", "--jobs", "200", "--load", "10",
                     "--seed", "4", str(generated))  # fmt: skip
    assert result.returncode == 0, result.stderr
    again = tmp_path / "again.csv"
    assert gpuyard("trace", "convert", str(generated), str(again)).returncode == 0
    first, second = pd.read_csv(generated), pd.read_csv(again)
    assert first["duration"].tolist() == second["duration"].tolist()
    result = gpuyard("trace", "describe", str(again), "--plots", str(tmp_path / "plots"))
    assert result.returncode == 0, result.stderr
    description = json.loads(result.stdout)
    assert description["jobs"] == 200
    assert (tmp_path / "plots" / "again_workload.png").stat().st_size > 0


def session_pids(session: int) -> list[int]:
    """Processes still alive in a session (its children may sit in process groups of their own)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":  # fields[3]: the session id
            pids.append(int(stat.parent.name))
    return pids


def test_a_child_whose_parent_died_before_it_could_watch_ends_at_once() -> None:
    """A child's parent-death signal is set after the fork: a parent killed in between is never
    watched, and the child (a private server, a service) would outlive it. It checks its parent
    is still the one that started it, and ends at once when not."""
    code = "from gpuyard.run.embedded import die_with_parent as d; import sys; d(int(sys.argv[1])); print('alive')"
    ran = [subprocess.run([sys.executable, "-c", code, str(parent)], capture_output=True, text=True,
                          timeout=60) for parent in (os.getpid(), os.getpid() + 1_000_000)]  # fmt: skip
    assert (ran[0].returncode, ran[0].stdout) == (0, "alive\n")  # its parent: it goes on
    assert (ran[1].returncode, ran[1].stdout) == (1, "")  # another's: it ends


def interrupt(
    argv: list[str], sig: signal.Signals, log: Path, ready: Callable[[], bool]
) -> tuple[int, str, str]:
    """Start `gpuyard ARGV` in a session of its own (stderr into `log`), wait until `ready()`, then
    send `sig` as a terminal would (Ctrl-C: SIGINT to the whole foreground process group) or as
    `kill` would (SIGTERM or SIGKILL to the process alone). Returns its exit status, stdout and
    stderr, once nothing of the run is left alive."""
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", *argv],
            stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not ready():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    deadline = time.monotonic() + 15
    while session_pids(proc.pid):  # no nats-server, no service process, no comparison run
        assert time.monotonic() < deadline, f"left alive: {session_pids(proc.pid)}"
        time.sleep(0.1)
    return proc.returncode, out, log.read_text()


def progressing(path: Path, ended: int = 0) -> Callable[[], bool]:
    """True once `path` (a run's stderr) shows a progress line with at least `ended` jobs
    ended: the run is under way (on a loaded machine the first may come before any has)."""

    def ready() -> bool:
        if not path.exists():
            return False
        counts = re.findall(r"([\d,]+)/[\d,]+ jobs  t=", path.read_text())
        return bool(counts) and int(counts[-1].replace(",", "")) >= ended

    return ready


@pytest.mark.parametrize(
    ("sig", "processes"),
    [(signal.SIGINT, []), (signal.SIGINT, ["--processes"]), (signal.SIGTERM, [])],
    ids=["ctrl-c", "ctrl-c-processes", "sigterm"],
)
@pytest.mark.slow
def test_interrupted_run_writes_partial_results(
    tmp_path: Path, sig: signal.Signals, processes: list[str]
) -> None:
    """Ctrl-C or `kill` mid-run: no traceback, everything stopped, exit 130, and the results so
    far written and marked partial."""
    run, log = tmp_path / "run", tmp_path / "stderr.log"
    code, out, err = interrupt(
        ["sim", "--jobs", "20000", "--load", "1", "--out", str(run), *processes],
        sig, log, progressing(log, ended=1),
    )  # fmt: skip
    assert code == 130, err
    assert "Traceback" not in err and "nats:" not in err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["partial"] is True and summary["jobs_in_workload"] == 20000
    reached = summary["simulated_s"]
    assert reached > 0
    jobs = pd.read_csv(run / "jobs.csv")
    assert 0 < len(jobs) == summary["completed"] < 20000  # the jobs that had ended by then
    assert (jobs["end"] <= reached).all()
    timeline = pd.read_csv(run / "timeline.csv")
    assert timeline["time"].max() == reached
    assert f"interrupted at t = {reached / 3600:,.1f} h" in err and "partial" in err
    assert out.startswith("PARTIAL RESULTS")
    for png in ("jct_cdf.png", "timeline.png"):
        assert (run / png).stat().st_size > 0


@pytest.mark.slow
def test_an_interrupted_run_lists_the_jobs_declined_so_far(tmp_path: Path) -> None:
    """Nothing vanishes from partial results either: a fifth of the jobs ask for 16 GPUs, which
    no node of 2x4 holds; stopped mid-run, jobs.csv lists every one declined by then, with its
    reason, beside the jobs that had ended."""
    run, log = tmp_path / "run", tmp_path / "stderr.log"
    code, _, err = interrupt(
        ["sim", "--jobs", "20000", "--load", "1", "--gpu-demand", "1:0.8,16:0.2",
         "--cluster-spec", "2x4", "--out", str(run)],
        signal.SIGINT, log, progressing(log, ended=100),
    )  # fmt: skip
    assert code == 130, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["partial"] is True
    jobs = pd.read_csv(run / "jobs.csv")
    declined = jobs[jobs["state"] == "declined"]
    assert len(declined) > 0 and (declined["num_gpus"] == 16).all()
    assert declined["reason"].str.contains("16 GPUs").all()
    assert (declined["arrival"] <= summary["simulated_s"]).all()
    assert summary["declined"] == len(declined)
    completed = jobs[jobs["state"] == "completed"]
    assert len(completed) > 0 and (completed["num_gpus"] == 1).all()


@pytest.mark.slow
async def test_a_killed_comparison_stops_its_runs(tmp_path: Path, nats_url: str) -> None:
    """`kill -9` of a comparison: its runs, which a fork server started (they are not its
    children), stop as a run sent SIGTERM does: partial results written, nothing left alive.
    (On a server of its own the runs would lose the server with it: here it stays up.)"""
    runs = [tmp_path / "cmp" / f"{p}-load1-seed0" for p in ("fifo", "las")]

    code, _, _ = await asyncio.to_thread(
        interrupt,
        ["sim", "--policy", "fifo,las", "--jobs", "20000", "--load", "1", "--parallel", "2",
         "--nats", nats_url, "--out", str(tmp_path / "cmp")],
        signal.SIGKILL, tmp_path / "stderr.log",
        lambda: all(progressing(r / "stderr.log")() for r in runs),
    )  # fmt: skip
    assert code == -signal.SIGKILL
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["partial"] is True and summary["simulated_s"] > 0
        assert "interrupted at t = " in (run / "stderr.log").read_text()


@pytest.mark.slow
def test_interrupted_comparison_keeps_what_each_run_got_to(tmp_path: Path) -> None:
    runs = [tmp_path / "cmp" / f"{p}-load1-seed0" / "stderr.log" for p in ("fifo", "las")]
    code, out, err = interrupt(
        ["sim", "--policy", "fifo,las", "--jobs", "20000", "--load", "1", "--parallel", "2",
         "--out", str(tmp_path / "cmp")],
        signal.SIGINT, tmp_path / "stderr.log", lambda: all(progressing(r)() for r in runs),
    )  # fmt: skip
    assert code == 130, err
    assert "Traceback" not in err
    table = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert sorted(table["policy"]) == ["fifo", "las"] and table["partial"].all()
    for name in ("fifo-load1-seed0", "las-load1-seed0"):
        assert json.loads((tmp_path / "cmp" / name / "summary.json").read_text())["partial"] is True
    assert "0 of 2 runs complete, 2 partial" in err
    assert out.count("PARTIAL") == 2

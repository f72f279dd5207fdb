"""The `gpuyard` command as a user runs it: real processes, a private NATS server per run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
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


def test_sim_runs_on_an_embedded_server_and_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = gpuyard(
        "sim", "--jobs", "30", "--load", "20", "--cluster-spec", "4x4", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["completed"] == 30
    assert summary == json.loads((out / "summary.json").read_text())
    assert "30/30 jobs" in result.stderr  # the progress bar's last line
    assert len(pd.read_csv(out / "jobs.csv")) == 30


def test_bad_input_gets_a_clear_error(tmp_path: Path) -> None:
    result = gpuyard("sim", "--policy", "nosuch", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "unknown scheduling policy 'nosuch'" in result.stderr and "fifo" in result.stderr
    result = gpuyard("sim", "--param", "backfill=maybe", "--out", str(tmp_path))
    assert result.returncode == 2 and "backfill" in result.stderr
    result = gpuyard("sim", "--cluster-spec", "lots", "--out", str(tmp_path))
    assert result.returncode == 2 and "NODESxGPUS" in result.stderr


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
    assert "skipped 1" in result.stderr
    assert json.loads(result.stdout)["completed"] == 2


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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_kill_stop_everything(tmp_path: Path, sig: signal.Signals) -> None:
    """Interrupted mid-run, `gpuyard sim` stops its services and its private server and exits."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "sim", "--jobs", "20000", "--load", "1",
         "--processes", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:  # wait until the run is under way (progress lines appear)
        if "jobs" in line:
            break
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    deadline = time.monotonic() + 10
    while True:  # nothing of the run's session is left: no nats-server, no service process
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "processes of the run are still alive"
        time.sleep(0.1)

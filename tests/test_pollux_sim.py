"""`gpuyard sim --pollux` through the services: goodput jobs trained epoch by epoch by the
simclock, as Pollux's simulator steps them, under the artifact's baselines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gpuyard.shared.goodput import GoodputJob, load_applications
from gpuyard.shared.model import JobSpec
from gpuyard.workloads.loader import load_workload

pytestmark = pytest.mark.slow


def gpuyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args], capture_output=True, text=True, timeout=300
    )


def write_trace(jobs: list[JobSpec], path: Path) -> Path:
    """`jobs` as a Pollux workload file at `path`."""
    path.parent.mkdir()
    path.write_text(
        "name,time,application,num_replicas,batch_size\n"
        + "".join(f"{j.job_id},{j.submit_time:g},{j.job_type},{j.num_gpus},{j.batch_size}\n"
                  for j in jobs)
    )  # fmt: skip
    return path


def lone_end(job: GoodputJob, start: float, placement: tuple[int, ...]) -> float:
    """When a job that starts at `start` on `placement` ends, stepped a 60 s round at a time."""
    job.reallocate(placement)
    t = start
    while True:
        finished = job.step(60.0)
        if finished is not None:
            return t + finished
        t += 60.0


def test_jobs_train_at_their_goodput_and_end_as_the_model_steps_them(
    shared_data: Path, tmp_path: Path
) -> None:
    pollux = shared_data / "pollux"
    # Two jobs that fit side by side: each runs alone from the round after its arrival.
    trace = tmp_path / "workloads" / "two.csv"
    trace.parent.mkdir()
    trace.write_text(
        "name,time,application,num_replicas,batch_size\n"
        "cifar10-0,53,cifar10,6,2048\nncf-1,100,ncf,1,1024\n"
    )
    out = tmp_path / "out"
    proc = gpuyard(
        "sim", "--pollux", "--policy", "tiresias", "--trace", str(trace),
        "--profiles", str(pollux / "traces"), "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    jobs = pd.read_csv(out / "jobs.csv").set_index("job_id")
    apps = load_applications(pollux / "traces")
    # Admitted at the next round (60, 120); the most-free placement gives 4 + 2 and 1 GPU; each
    # makes no progress for its 30 s restart, then trains epoch by epoch.
    assert jobs.loc["cifar10-0", "start"] == 60.0
    assert jobs.loc["ncf-1", "start"] == 120.0
    cifar = lone_end(GoodputJob(apps["cifar10"], 2048), 60.0, (4, 2))
    ncf = lone_end(GoodputJob(apps["ncf"], 1024), 120.0, (1,))
    assert jobs.loc["cifar10-0", "end"] == pytest.approx(cifar)
    assert jobs.loc["ncf-1", "end"] == pytest.approx(ncf)
    assert (jobs["state"] == "completed").all()


def test_optimus_runs_a_pollux_workload_to_completion(shared_data: Path, tmp_path: Path) -> None:
    trace = shared_data / "pollux" / "workloads" / "workload-6.csv"
    first = load_workload(trace).jobs[:12]
    small = write_trace(first, tmp_path / "workloads" / "w.csv")
    out = tmp_path / "out"
    proc = gpuyard(
        "sim", "--pollux", "--policy", "optimus", "--trace", str(small),
        "--profiles", str(shared_data / "pollux" / "traces"), "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "pollux-optimus" in proc.stdout
    jobs = pd.read_csv(out / "jobs.csv")
    assert (jobs["state"] == "completed").all() and len(jobs) == 12


def test_pollux_preset_names_missing_profiles_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "w.csv"
    trace.write_text("name,time,application,num_replicas,batch_size\ncifar10-0,0,cifar10,1,128\n")
    proc = gpuyard("sim", "--pollux", "--trace", str(trace), "--out", str(tmp_path / "o"))
    assert proc.returncode != 0
    assert "--pollux needs the models' profiles" in proc.stderr
    assert "Traceback" not in proc.stderr
    # A profiles folder with no model in it: the clock refuses the run, in one line.
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = gpuyard("sim", "--pollux", "--trace", str(trace), "--profiles", str(empty),
                   "--out", str(tmp_path / "o2"))  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"gpuyard sim: gpuyard.sim.clock.run: ValueError: {empty}: no application folder "
        "(none has a placements.csv)"
    )


def test_pollux_adapts_batch_sizes_and_gpus_and_repeats_itself(
    shared_data: Path, tmp_path: Path
) -> None:
    """Pollux's own policy: the jobs pick their batch sizes (ncf stays at the artifact's 32768),
    report their goodput, and grow past one GPU on it; the same run twice gives the same
    results."""
    trace = shared_data / "pollux" / "workloads" / "workload-6.csv"
    first = [j for j in load_workload(trace).jobs[:30] if j.job_type in ("cifar10", "ncf")][:6]
    small = write_trace(first, tmp_path / "workloads" / "w.csv")
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        proc = gpuyard(
            "sim", "--pollux", "--policy", "pollux", "--trace", str(small),
            "--profiles", str(shared_data / "pollux" / "traces"), "--out", str(out),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        runs.append((out / "jobs.csv").read_text())
    assert runs[0] == runs[1]
    jobs = pd.read_csv(tmp_path / "a" / "jobs.csv").set_index("job_id")
    assert (jobs["state"] == "completed").all() and len(jobs) == len(first)
    told = {k: [int(p.split(":")[1]) for p in v.split()] for k, v in jobs["batch_sizes"].items()}
    ncf = [k for k in told if k.startswith("ncf")]
    cifar = [k for k in told if k.startswith("cifar10")]
    assert ncf and cifar
    assert all(told[k] == [32768] for k in ncf)
    # cifar10 starts at its initial 128 and grows its batch with its GPUs (its workload's
    # batch sizes are the baselines' and play no part).
    assert any(len(set(told[k])) > 1 for k in cifar)
    assert max(max(told[k]) for k in cifar) > 128
    assert (jobs.loc[cifar, "gpu_seconds"] > jobs.loc[cifar, "executed_time"]).any()

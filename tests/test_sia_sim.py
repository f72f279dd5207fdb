"""`gpuyard sim --sia`: goodput jobs on a heterogeneous cluster, trained on the profile of the
GPU type they run on (Sia's simulator), on made-up per-type profiles (the artifact's are not
shipped: `gpuyard.policies.sia.synthetic` writes some in its layout)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pandas as pd
import pytest

from gpuyard.policies.sia.synthetic import write_profiles
from gpuyard.services.scheduler.mechanism import TimeShareConfig, TimeShareMechanism
from gpuyard.services.simclock.agents import SimJob, SimNodes
from gpuyard.services.simclock.config import GoodputSettings, SimClockConfig
from gpuyard.services.simclock.costs import PreemptionCost
from gpuyard.services.simclock.progress import Completions
from gpuyard.shared.model import JobRecord, JobSpec
from gpuyard.shared.policy import ClusterView, Decision, JobView, SchedulingInput
from gpuyard.shared.throughput import default_model, load_throughputs
from gpuyard.shared.typed_goodput import (
    SIA_RESTORE_S,
    SIA_SLOWDOWNS,
    TypedGoodputJob,
    TypedProfiles,
    TypedThroughputs,
    typed_model,
)
from gpuyard.workloads import load_cluster

SPEEDS = {"fast": 1.0, "slow": 0.25}
"""Step times on `slow` are 4x those on `fast`."""
LONGER = 30


def gpuyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    """A folder laid out as Sia's artifact: `traces/` (a made-up `bert` and `synth` on the types
    `fast` and `slow`) and `workloads/saturn/`."""
    root = tmp_path / "sia-simulator"
    for model in ("bert", "synth"):
        write_profiles(root / "traces", SPEEDS, model=model)
        for path in (root / "traces" / model).glob("validation-*.csv"):
            # Epochs LONGER times as long: a job lasts tens of rounds, not one.
            curve = pd.read_csv(path)
            curve[["progress", "iteration"]] *= LONGER
            curve.to_csv(path, index=False)
    (root / "workloads" / "saturn").mkdir(parents=True)
    return root


def trace(artifact: Path, rows: str, name: str = "w.csv") -> Path:
    path = artifact / "workloads" / "saturn" / name
    path.write_text("name,time,application,num_replicas,batch_size\n" + rows)
    return path


def lone_end(job: TypedGoodputJob, gpu_type: str, start: float, gpus: int, step: float) -> float:
    """When a job that starts at `start` alone on `gpus` GPUs of one node of `gpu_type` ends,
    stepped `step` seconds at a time (the clock's rounds)."""
    job.move(gpu_type, (gpus,))
    t = start
    while True:
        finished = job.step(step)
        if finished is not None:
            return t + finished
        t += step


# -- the job model, without NATS ---------------------------------------------------------------


def test_a_job_trains_faster_on_a_faster_type_and_keeps_a_profile_per_type(
    artifact: Path,
) -> None:
    profiles = TypedProfiles(artifact / "traces")
    types = ("fast", "slow")
    on_fast = TypedGoodputJob(profiles, "synth", types, target_batch_size=128)
    on_slow = TypedGoodputJob(profiles, "synth", types, target_batch_size=128)
    on_fast.move("fast", (2,))
    on_slow.move("slow", (2,))
    on_fast.step(600.0)
    on_slow.step(600.0)
    assert on_fast.progress > 2 * on_slow.progress > 0
    # Moved to the slow type: its profile and fit there (none yet), the fast one's kept; the
    # gradient statistics and progress are the job's.
    progress, grads = on_fast.progress, on_fast.grad_params
    fast_profile = dict(on_fast.profile)
    on_fast.move("slow", (2,))
    assert on_fast.app is profiles.app("synth", "slow")
    assert on_fast.profile == {} and on_fast.perf_params is None
    assert on_fast.hints() is None and on_fast.hints_on("fast") is not None
    assert on_fast.progress == progress and on_fast.grad_params == grads
    assert on_fast.rescale_time == on_fast.restart_s  # (a change of type restarts)
    on_fast.step(600.0)
    assert on_fast.profile and on_fast.hints() is not None
    on_fast.move("fast", (2,))
    assert on_fast.profile == fast_profile  # (back: the profile it made there)
    # The same shape on the same type: no restart.
    on_fast.rescale_time = 0.0
    on_fast.move("fast", (2,))
    assert on_fast.rescale_time == 0.0


def test_slowdown_divides_progress(artifact: Path) -> None:
    profiles = TypedProfiles(artifact / "traces")
    plain = TypedGoodputJob(profiles, "synth", ("fast",), target_batch_size=128, restart_s=0.0)
    slowed = TypedGoodputJob(
        profiles, "synth", ("fast",), target_batch_size=128, restart_s=0.0, slowdown=2.0
    )
    for job in (plain, slowed):
        job.move("fast", (1,))
        job.step(30.0)  # (within the first epoch)
    assert slowed.progress == pytest.approx(plain.progress / 2)
    with pytest.raises(ValueError, match="slowdown"):
        TypedGoodputJob(profiles, "synth", ("fast",), slowdown=0.0)


def test_the_clock_switches_a_job_to_the_type_it_is_launched_on(artifact: Path) -> None:
    """The simclock's side: a job whose GPUs change trains on their type's profile."""
    cluster = load_cluster("1x8:fast,1x8:slow")
    settings = GoodputSettings(profiles=str(artifact / "traces"), per_type=True)
    config = SimClockConfig(workload="", cluster=cluster, goodput=settings)
    nodes = SimNodes(cluster, PreemptionCost())
    runs = Completions(nodes, default_model(), config)
    training = TypedGoodputJob(
        TypedProfiles(artifact / "traces"), "synth", ("fast", "slow"), target_batch_size=128
    )
    job = SimJob(JobSpec(job_id="j", job_type="synth", num_gpus=2), 1e9, training=training)
    nodes.jobs["j"] = job
    fast, slow = (n.node_id for n in cluster.nodes())
    job.parts, job.gpu_type = {fast: (0, 1)}, "fast"
    runs.retrain("j", job, 0.0)
    assert training.gpu_type == "fast" and training.placement == (2,)
    runs.train("j", job, 600.0)
    on_fast = training.progress
    job.parts, job.gpu_type = {slow: (0, 1)}, "slow"
    runs.retrain("j", job, 600.0)
    assert training.gpu_type == "slow" and training.perf_params is None
    assert training.hints_on("fast") is not None
    runs.train("j", job, 1200.0)
    assert 0 < training.progress - on_fast < on_fast / 2
    job.parts = {}
    runs.retrain("j", job, 1200.0)  # (released: it waits, keeping its type's fit)
    assert training.placement == () and training.gpu_type == "slow"


def test_settings_validate_and_give_each_model_its_restart() -> None:
    settings = GoodputSettings(profiles="p", per_type=True, model_restart_s={"bert": 120.0})
    assert settings.restart_of("bert") == 120.0 and settings.restart_of("other") == 30.0
    raw = msgspec.json.encode({"profiles": "p", "slowdowns": {"bert": 1.2}})
    with pytest.raises(msgspec.ValidationError, match="per_type"):
        msgspec.json.decode(raw, type=GoodputSettings)
    raw = msgspec.json.encode({"profiles": "p", "per_type": True, "slowdowns": {"bert": 0}})
    with pytest.raises(msgspec.ValidationError, match="slowdowns"):
        msgspec.json.decode(raw, type=GoodputSettings)


def test_typed_throughputs_are_a_rigid_jobs_rate_per_type(artifact: Path) -> None:
    model = load_throughputs(artifact / "traces")
    assert isinstance(model, TypedThroughputs)
    assert model.throughput("synth@128", "fast", 2) > 3 * model.throughput("synth@128", "slow", 2)
    assert model.throughput("synth@128", "fast", 4) > model.throughput("synth@128", "fast", 2)
    assert model.throughput("synth", "fast", 2) == 0.0  # (no batch size: not a rigid job)
    assert model.throughput("synth@128", "tpu", 2) == 0.0  # (no profile of that type)
    assert typed_model("cifar10@4096") == ("cifar10", 4096)
    assert typed_model("cifar10") == ("cifar10", None)


# -- through the services ------------------------------------------------------------------------


@pytest.mark.slow
def test_missing_profiles_are_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "workloads" / "saturn" / "w.csv"  # (no traces/ two folders up)
    path.parent.mkdir(parents=True)
    path.write_text("name,time,application,num_replicas,batch_size\nbert-0,0,bert,1,128\n")
    proc = gpuyard("sim", "--sia", "--policy", "sia", "--trace", str(path), "--out",
                   str(tmp_path / "o"))  # fmt: skip
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "siasosp23/artifacts' sia-simulator/traces" in lines[0]
    # Pollux's profiles (no per-type files) are refused the same way.
    pollux = tmp_path / "pollux"
    (pollux / "bert").mkdir(parents=True)
    (pollux / "bert" / "placements.csv").write_text("placement,local_bsz,step_time,sync_time\n")
    proc = gpuyard("sim", "--sia", "--trace", str(path), "--profiles", str(pollux), "--out",
                   str(tmp_path / "o2"))  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1
    assert "no per-GPU-type profiles" in lines[0]


@pytest.mark.slow
def test_a_rigid_job_ends_as_its_types_profile_and_its_models_restart_say(
    artifact: Path,
) -> None:
    """Gavel under --sia: one bert job alone on 4 GPUs, at its batch, in 360 s rounds, with
    bert's 120 s restart and 1.2 slowdown; on the slow type it takes longer, as its profile
    says (the profiles default to the artifact's layout: traces/ two folders up)."""
    path = trace(artifact, "bert-0,100,bert,4,256\n")
    profiles = TypedProfiles(artifact / "traces")
    ends = {}
    for gpu_type in ("fast", "slow"):
        out = artifact / f"out-{gpu_type}"
        proc = gpuyard(
            "sim", "--sia", "--policy", "max_min_fairness_perf", "--trace", str(path),
            "--cluster-spec", f"1x8:{gpu_type}", "--out", str(out),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        jobs = pd.read_csv(out / "jobs.csv").set_index("job_id")
        assert jobs.loc["bert-0", "start"] == 360.0  # (submitted at the next round)
        assert jobs.loc["bert-0", "job_type"] == "bert@256"
        ends[gpu_type] = jobs.loc["bert-0", "end"]
        bert = {"target_batch_size": 256, "slowdown": SIA_SLOWDOWNS["bert"]}
        job = TypedGoodputJob(
            profiles, "bert", (gpu_type,), restart_s=SIA_RESTORE_S["bert"], **bert
        )
        assert ends[gpu_type] == pytest.approx(lone_end(job, gpu_type, 360.0, 4, 360.0))
        other = TypedGoodputJob(profiles, "bert", (gpu_type,), restart_s=30.0, **bert)
        assert ends[gpu_type] > lone_end(other, gpu_type, 360.0, 4, 360.0)
    assert ends["slow"] - 360.0 > 2 * (ends["fast"] - 360.0)


@pytest.mark.slow
def test_sia_runs_a_heterogeneous_workload_and_repeats_itself(artifact: Path) -> None:
    path = trace(
        artifact,
        "".join(f"synth-{i},{40 * i},synth,2,256\n" for i in range(5)) + "bert-5,90,bert,4,256\n",
    )
    outs = []
    for run in range(2):
        out = artifact / f"out-{run}"
        proc = gpuyard(
            "sim", "--sia", "--policy", "sia", "--trace", str(path), "--cluster-spec",
            "1x8:fast,1x8:slow", "--out", str(out),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    jobs = pd.read_csv(outs[0] / "jobs.csv")
    assert (jobs.state == "completed").all() and len(jobs) == 6
    assert (jobs.start % 60 == 0).all()  # (decisions at round ends)
    assert (outs[0] / "jobs.csv").read_bytes() == (outs[1] / "jobs.csv").read_bytes()


def test_gavel_of_sias_artifact_never_resets_the_time_received() -> None:
    """`reset_on_decision = false`: a new allocation keeps each job's time received (the
    artifact's Gavel), where Gavel's own resets it to the initial credit."""

    def at(now: float) -> SchedulingInput:
        record = JobRecord(
            job_id="a", seq=0, spec=JobSpec(job_id="a", job_type="m", num_gpus=1),
            submit_time=0.0, admit_time=0.0, state="running", gpus=1, gpu_type="v100",
            run_start=0.0,
        )  # fmt: skip
        return SchedulingInput(
            now=now, jobs=[JobView(record)], cluster=ClusterView(capacity={"v100": 1}, round_s=100)
        )

    decision = Decision(shares={"a": {"v100": 1.0}})
    received = {}
    for reset in (True, False):
        mech = TimeShareMechanism(TimeShareConfig(reset_on_decision=reset), round_s=100.0)
        mech.allocations(decision, at(0.0))
        mech.allocations(None, at(100.0))
        mech.allocations(decision, at(200.0))  # (a new allocation)
        received[reset] = mech.state.received["a"]["v100"]
        assert mech.state.last_reset == 200.0
    assert received == {True: 50.0, False: 250.0}

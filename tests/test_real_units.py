"""Real-mode pieces without a cluster: NVML fallback, job environments, systemd notify, jobclient."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from gpuyard.cli.cluster import job_from_args
from gpuyard.cli.options import gpus_or_share
from gpuyard.jobclient import JobClient
from gpuyard.services.nodeagent.nvml import Nvml, gpu_type_name
from gpuyard.services.nodeagent.procs import JobPart, JobProcess, Places, Starter, process_envs
from gpuyard.services.nodeagent.run import add_agent_args, config_from_args
from gpuyard.services.nodeagent.sdnotify import SystemdNotifier
from gpuyard.services.nodeagent.service import NodeAgent, NodeAgentConfig
from gpuyard.shared.connection import Bus
from gpuyard.shared.contract import Launch
from gpuyard.shared.endpoints import Subjects
from gpuyard.shared.model import JobSpec

from .jobaccount import AGENT_CONFIG, JOB_PYTHON


class _NoNats:
    """Enough of a NATS client to build a service object."""

    is_closed = True


def _agent(config: NodeAgentConfig) -> NodeAgent:
    return NodeAgent(Bus(_NoNats(), Subjects("t")), config)  # type: ignore[arg-type]


def test_without_nvml_the_agent_takes_its_gpus_from_flags_and_says_so(tmp_path: Path) -> None:
    nvml, why = Nvml.open()
    if nvml is not None:
        pytest.skip("this machine has NVML")
    assert why
    places = {"log_dir": str(tmp_path / "logs"), "checkpoint_root": str(tmp_path / "ckpt")}
    agent = _agent(NodeAgentConfig(node_id="n1", gpus=3, gpu_type="v100", **places))
    assert agent.node.num_gpus == 3 and agent.node.gpu_type == "v100"
    assert agent.node.labels["gpu_source"] == "flags" and agent.nvml is None
    assert agent.heartbeat().gpus == [] and not agent.heartbeat().nvml
    with pytest.raises(ValueError, match="--gpus"):
        _agent(NodeAgentConfig(node_id="n1", **places))


def test_gpu_type_names_from_nvml_models() -> None:
    assert gpu_type_name("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_type_name("Tesla V100-SXM2-16GB") == "v100"
    assert gpu_type_name("NVIDIA A100-SXM4-80GB") == "a100"


def test_agent_options_are_checked() -> None:
    p = argparse.ArgumentParser()
    add_agent_args(p)
    for bad in (["--node-id", "a b"], ["--node-id", "a.b"], ["--label", "x"]):
        with pytest.raises(ValueError):
            config_from_args(p.parse_args(bad))
    config = config_from_args(p.parse_args(["--node-id", "n1", "--gpus", "2", "--label", "r=1"]))
    assert config.gpus == 2 and config.labels == {"r": "1"}
    # Relative folders are the agent's: its jobs start elsewhere and get them absolute.
    config = config_from_args(p.parse_args(["--node-id", "n1", "--state-dir", "s"]))
    assert (config.log_dir, config.checkpoint_root) == (
        str(Path.cwd() / "s" / "logs"),
        str(Path.cwd() / "s" / "checkpoints"),
    )
    config = config_from_args(p.parse_args(["--node-id", "n1", "--checkpoint-root", "ck"]))
    assert config.checkpoint_root == str(Path.cwd() / "ck")


def _launch(processes: str) -> Launch:
    spec = JobSpec(num_gpus=4, command=["x"], processes=processes, env={"A": "1"})  # type: ignore[arg-type]
    return Launch(
        job_id="j1", spec=spec, gpus=[2, 3], world_size=4, rank_offset=2, node_rank=1,
        num_nodes=2, master_addr="10.0.0.1", master_port=23456, attempt=2,
    )  # fmt: skip


def test_process_environments_per_gpu_and_per_node(tmp_path: Path) -> None:
    places = Places(tmp_path / "logs", tmp_path / "ckpt", "t")
    envs = process_envs(_launch("per_gpu"), "n2", places, {"PATH": "/bin"})
    assert [e["RANK"] for e in envs] == ["2", "3"] == [e["dist_rank"] for e in envs]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["2", "3"]
    assert {e["CUDA_DEVICE_ORDER"] for e in envs} == {"PCI_BUS_ID"}  # NVML's order
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    e = envs[0]
    assert e["WORLD_SIZE"] == e["world_size"] == "4" and e["MASTER_ADDR"] == "10.0.0.1"
    assert e["local_accessible_gpu"] == "2,3" and e["PATH"] == "/bin" and e["A"] == "1"
    assert e["GPUYARD_ATTEMPT"] == "2" and e["GPUYARD_CHECKPOINT_DIR"] == str(
        tmp_path / "ckpt/t/j1"
    )
    (one,) = process_envs(_launch("per_node"), "n2", places, {}, grace_s=7.5)
    assert one["CUDA_VISIBLE_DEVICES"] == "2,3" and one["NODE_RANK"] == "1" and one["RANK"] == "2"
    assert e["GPUYARD_GRACE_S"] == "30" and one["GPUYARD_GRACE_S"] == "7.5"
    assert "GPUYARD_GPU_TYPE" not in e
    (typed,) = process_envs(_launch("per_node"), "n2", places, {}, gpu_type="k80")
    assert typed["GPUYARD_GPU_TYPE"] == "k80"
    assert JobClient.from_env(typed, handle_sigterm=False).gpu_type == "k80"


def test_the_agent_measures_each_runs_rate_from_the_jobs_reports(tmp_path: Path) -> None:
    """Steps per second by the job's own clock, from the rank's first report of this run (its
    attempt) to the latest; a report left by an earlier run, or a rate the job wrote, is not."""
    launch = msgspec.structs.replace(_launch("per_gpu"), attempt=3)

    async def no_lines(job_id: str, rank: int, line: str) -> None:
        pass

    places = Places(tmp_path / "logs", tmp_path / "ckpt", "t")
    part = JobPart(launch, "n1", places, no_lines, 5.0, Starter.find())
    files = [tmp_path / "p2.json", tmp_path / "p3.json"]
    part.ranks, part.progress_files = [2, 3], files

    def write(path: Path, attempt: int, iterations: int, at: float, rate: float = 0.0) -> None:
        record = {"job_id": "j1", "rank": 2, "iterations": iterations, "attempt": attempt,
                  "time": at, "rate": rate}  # fmt: skip
        path.write_text(json.dumps(record))

    write(files[0], 2, 500, 100.0, rate=9.0)  # the previous run's, on this node
    assert [p.rate for p in part.progress()] == [0.0]
    write(files[0], 3, 510, 200.0, rate=99.0)  # this run's first report
    write(files[1], 3, 510, 200.5)
    assert [p.rate for p in part.progress()] == [0.0, 0.0]
    write(files[0], 3, 530, 202.0)
    write(files[1], 3, 520, 201.5)
    assert [p.rate for p in part.progress()] == [10.0, 10.0]


def _part(tmp_path: Path, command: list[str], workdir: str = "") -> JobPart:
    spec = JobSpec(num_gpus=1, command=command, workdir=workdir)
    launch = Launch(
        job_id="j1", spec=spec, gpus=[0], world_size=1, rank_offset=0, node_rank=0,
        num_nodes=1, master_addr="127.0.0.1", master_port=23456,
    )  # fmt: skip

    async def no_lines(job_id: str, rank: int, line: str) -> None:
        pass

    places = Places(tmp_path / "logs", tmp_path / "ckpt", "t")
    return JobPart(launch, "n1", places, no_lines, 5.0, Starter.find())


async def test_a_part_stopped_while_its_processes_start_is_stopped(tmp_path: Path) -> None:
    """A preemption that lands while the agent is still starting a part's processes (a launch and
    the next round's preempt close together, on a loaded machine) stops them once they have
    started: they must not run on, to their end, beside the job's next run elsewhere."""
    part = _part(tmp_path, [*JOB_PYTHON, "-c", "import time; time.sleep(60)"])
    spawning = asyncio.create_task(part.spawn(dict(os.environ)))
    await asyncio.sleep(0)  # the spawn is under way: no process handed back yet
    assert not part.procs
    part.stop()
    await spawning
    async with asyncio.timeout(10):
        rank, code = await part.wait()
    assert (rank, code) == (0, -signal.SIGTERM)


async def test_a_command_that_is_not_there_fails_its_launch_with_one_line(tmp_path: Path) -> None:
    """The agent says why a launch cannot start (`launch failed: ...`), as a start without
    `setpriv` between would, not a job that ran and exited 127; a command given as a path is
    looked for from the job's working directory."""
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: 'no-such-command'"):
        await _part(tmp_path, ["no-such-command", "x"]).spawn(dict(os.environ))
    script = tmp_path / "work" / "run.sh"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\necho ran in $(pwd)\n")
    script.chmod(0o755)
    with pytest.raises(FileNotFoundError, match=r"'./run.sh'"):  # (not from the agent's folder)
        await _part(tmp_path, ["./run.sh"]).spawn(dict(os.environ))
    part = _part(tmp_path, ["./run.sh"], workdir=str(script.parent))
    await part.spawn(dict(os.environ))
    assert await part.wait() == (-1, 0)
    log = tmp_path / "logs" / "t" / "j1" / "rank0.log"
    assert log.read_text() == f"ran in {script.parent}\n"


async def test_a_process_that_cannot_be_watched_is_not_left_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where its exit cannot be watched (no pidfd: out of file descriptors), the process that
    started is killed and reaped, and the launch fails with the error."""
    marker = str(tmp_path / "unwatched")

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    command = [*JOB_PYTHON, "-c", "import time; time.sleep(60)", marker]  # (one process)
    argv = Starter.find().argv(command, None)
    with pytest.raises(OSError, match="Too many open files"):
        async with asyncio.timeout(10):  # (killed, it is reaped at once)
            await JobProcess.start(argv, dict(os.environ), None)
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _runs(pid, marker)]


def _runs(pid: str, marker: str) -> bool:
    """Whether process `pid` has `marker` among its arguments."""
    return marker.encode() in _arguments(int(pid))


def _arguments(pid: int) -> list[bytes]:
    """The arguments of process `pid` ([] for one that is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[:-1]
    except OSError:
        return []


def test_without_setpriv_the_agent_says_so_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^setpriv \(util-linux\) is not on this machine's PATH"):
        Starter.find(path=str(tmp_path))


_AGENT_OF_ONE_JOB = """
import asyncio, os
from gpuyard.services.nodeagent.procs import JobProcess, Starter

async def main() -> None:
    starter = Starter.find()
    proc = await JobProcess.start(starter.argv(["sleep", "60"], None), dict(os.environ), None)
    print(proc.pid, flush=True)
    await proc.wait()

asyncio.run(main())
"""


def test_a_jobs_processes_die_with_their_agent() -> None:
    """An agent killed -9 leaves no job process running (their parent-death signal, which the
    agent's start through `setpriv` sets): a job requeued elsewhere never runs twice."""
    agent = subprocess.Popen(
        [sys.executable, "-c", _AGENT_OF_ONE_JOB], stdout=subprocess.PIPE, text=True
    )
    assert agent.stdout is not None
    job = int(agent.stdout.readline())
    deadline = time.monotonic() + 10
    while _arguments(job) != [b"sleep", b"60"] and time.monotonic() < deadline:
        time.sleep(0.01)  # (`setpriv` sets the signal as it starts the command)
    assert _arguments(job) == [b"sleep", b"60"]  # it runs
    agent.kill()
    agent.wait(10)
    deadline = time.monotonic() + 10
    while _alive(job) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(job)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (not a zombie waiting for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_systemd_notify_sends_datagrams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "notify")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    notifier = SystemdNotifier(path)
    assert notifier.notify("READY=1", "STATUS=ok") and notifier.notify("WATCHDOG=1")
    assert server.recv(100) == b"READY=1\nSTATUS=ok" and server.recv(100) == b"WATCHDOG=1"
    notifier.close()
    server.close()
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not SystemdNotifier().notify("READY=1")
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    assert SystemdNotifier.watchdog_interval_s() == 5.0


def test_jobclient_checkpoints_progress_and_sigterm(tmp_path: Path) -> None:
    env = {
        "GPUYARD_JOB_ID": "j9", "RANK": "1", "WORLD_SIZE": "2", "GPUYARD_ATTEMPT": "0",
        "GPUYARD_CHECKPOINT_DIR": str(tmp_path / "ck"),
        "GPUYARD_PROGRESS_FILE": str(tmp_path / "p.json"),
    }  # fmt: skip
    previous = signal.getsignal(signal.SIGTERM)
    try:
        job = JobClient.from_env(env)
        assert not job.resumed and job.load_checkpoint() is None
        job.save_checkpoint({"step": 7})
        assert job.resumed and job.load_checkpoint() == {"step": 7}
        job.report(iterations=7, samples=70, loss=0.5)
        assert b'"iterations": 7' in (tmp_path / "p.json").read_bytes()
        os.kill(os.getpid(), signal.SIGTERM)
        assert job.preempted
        with pytest.raises(SystemExit) as exc:
            job.exit_preempted()
        assert exc.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_run_launched_after_one_that_finished_exits_at_once(tmp_path: Path) -> None:
    """A run whose end was lost (killed by a SIGTERM on its way out, or its exit still waiting at
    its agent while the scheduler restarts) may be launched again: that run finds the job
    finished and exits 0 at once, rather than run to completion (and its ending) a second time."""
    example = Path(__file__).resolve().parents[1] / "examples" / "train.py"

    def run(attempt: int) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ, "GPUYARD_JOB_ID": "j1", "GPUYARD_ATTEMPT": str(attempt),
            "GPUYARD_CHECKPOINT_DIR": str(tmp_path / "ck" / "j1"),
        }  # fmt: skip
        command = [sys.executable, str(example), "--steps", "3", "--step-time", "0"]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    first, again = run(0), run(1)
    assert first.returncode == 0 and "done at step 3 (attempt 0)" in first.stdout
    assert again.returncode == 0, again.stderr
    assert "done at step" not in again.stdout
    assert "job=j1 attempt=1: finished by an earlier run" in again.stdout
    env = {"GPUYARD_JOB_ID": "j1", "GPUYARD_CHECKPOINT_DIR": str(tmp_path / "ck" / "j1")}
    job = JobClient.from_env(env, handle_sigterm=False)
    assert job.finished and job.load_checkpoint() == {"step": 3, "loss": pytest.approx(0.99**3)}
    previous = signal.getsignal(signal.SIGTERM)
    try:  # once finished, a SIGTERM cannot make the exit look like a stop
        JobClient.from_env({"GPUYARD_CHECKPOINT_DIR": str(tmp_path / "ck" / "j2")}).finish()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_run_after_one_stopped_at_its_last_step_ends_the_job_once(tmp_path: Path) -> None:
    """A run stopped just after its last step checkpoints it and exits as preempted; the next run
    finds the work done and ends the job as that run would have (`done`, then finished), so the
    job's end is counted once and a run after that does nothing."""
    example = Path(__file__).resolve().parents[1] / "examples" / "train.py"
    checkpoints = tmp_path / "ck" / "j1"
    stopped = "from gpuyard.jobclient import JobClient; JobClient.from_env().save_checkpoint({'step': 3, 'loss': 0.5})"  # fmt: skip
    env = {**os.environ, "GPUYARD_JOB_ID": "j1", "GPUYARD_CHECKPOINT_DIR": str(checkpoints)}
    subprocess.run([sys.executable, "-c", stopped], env=env, check=True, timeout=60)  # it exited

    def run(attempt: int) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ, "GPUYARD_JOB_ID": "j1", "GPUYARD_ATTEMPT": str(attempt),
            "GPUYARD_CHECKPOINT_DIR": str(checkpoints),
        }  # fmt: skip
        command = [sys.executable, str(example), "--steps", "3", "--step-time", "0"]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    resumed, later = run(1), run(2)
    assert resumed.returncode == 0, resumed.stderr
    assert "start_step=3" in resumed.stdout and "done at step 3 (attempt 1)" in resumed.stdout
    assert later.returncode == 0 and "done at step" not in later.stdout
    assert "finished by an earlier run" in later.stdout


def test_jobclient_after_a_resize_resumes_every_rank_from_rank_0(tmp_path: Path) -> None:
    def run(rank: int, world: int) -> JobClient:
        env = {"GPUYARD_JOB_ID": "j", "RANK": str(rank), "WORLD_SIZE": str(world),
               "GPUYARD_CHECKPOINT_DIR": str(tmp_path)}  # fmt: skip
        return JobClient.from_env(env, handle_sigterm=False)

    first = [run(0, 2), run(1, 2)]
    assert first[1].previous_world_size is None and not first[1].resized
    first[0].save_checkpoint({"step": 5})
    first[1].save_checkpoint({"step": 6})
    shrunk = run(0, 1)  # rank 1 is gone; rank 0 goes on alone
    assert (shrunk.previous_world_size, shrunk.resized) == (2, True)
    assert shrunk.load_checkpoint() == {"step": 5}
    shrunk.save_checkpoint({"step": 9})
    grown = [run(0, 2), run(1, 2)]
    assert all(g.resized and g.previous_world_size == 1 for g in grown)
    # Rank 1's own checkpoint (step 6) is older than the run in between: rank 0's counts.
    assert [g.load_checkpoint() for g in grown] == [{"step": 9}, {"step": 9}]
    grown[1].save_checkpoint({"step": 12})
    grown[0].save_checkpoint({"step": 12})
    again = run(1, 2)  # same size: each rank its own
    assert not again.resized and again.load_checkpoint() == {"step": 12}
    assert run(2, 3).load_checkpoint() == {"step": 12}  # a new rank: rank 0's


SLOW_RANK = """
import json, signal, sys, time
from gpuyard.jobclient import JobClient
job = JobClient.from_env()
if job.attempt == 0:
    job.save_checkpoint({"step": 1})
    print("running", flush=True)
    while not job.preempted:
        time.sleep(0.01)
    time.sleep(1.0)  # a slow checkpoint
    job.save_checkpoint({"step": 2})
    job.exit_preempted()
print(json.dumps([job.load_checkpoint(), job.previous_world_size, job.resized]), flush=True)
"""


@pytest.mark.slow
def test_a_restarted_job_waits_for_its_earlier_run_to_checkpoint(tmp_path: Path) -> None:
    """As on another node after a resize: the new run starts while the old one still writes."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW_RANK)
    base = {**os.environ, "GPUYARD_JOB_ID": "j", "GPUYARD_CHECKPOINT_DIR": str(tmp_path / "ck"),
            "GPUYARD_GRACE_S": "20"}  # fmt: skip

    def run(attempt: int, world: int) -> subprocess.Popen[str]:
        env = {**base, "GPUYARD_ATTEMPT": str(attempt), "WORLD_SIZE": str(world)}
        return subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                text=True)  # fmt: skip

    old = run(0, 1)
    assert old.stdout is not None and old.stdout.readline() == "running\n"
    old.terminate()
    new = run(1, 2)  # at once: the old one checkpoints for another second
    out, _ = new.communicate(timeout=60)
    assert old.wait(timeout=10) == 143
    assert json.loads(out) == [{"step": 2}, 1, True]
    assert not list((tmp_path / "ck" / ".runs").iterdir())  # every mark removed at exit


def test_submit_arguments_become_a_job(tmp_path: Path) -> None:
    from gpuyard.cli import main

    with pytest.raises(SystemExit):
        main(["submit", "--gpus", "two", "--", "x"])
    ns = argparse.Namespace(
        file=None, command=["--", "python", "t.py"], gpus=(2, None), gpu_type="a100", min_gpus=None,
        max_gpus=4, priority=3, deadline=None, name=None, job_id=None, per_node=True,
        env=["K=V"], chdir=None, array=None,
    )  # fmt: skip
    (job,) = job_from_args(ns)
    assert job == {
        "num_gpus": 2, "command": ["python", "t.py"], "gpu_type": "a100", "max_gpus": 4,
        "priority": 3, "processes": "per_node", "env": {"K": "V"}, "workdir": str(Path.cwd()),
    }  # fmt: skip
    ns.array = ([0, 2], 1)  # (`--array 0,2%1`: a job per task)
    tasks = job_from_args(ns)
    assert [t["array"] for t in tasks] == [
        {"task": t, "count": 2, "low": 0, "high": 2, "limit": 1} for t in (0, 2)
    ]
    assert all({k: v for k, v in t.items() if k != "array"} == job for t in tasks)
    ns.array = None
    ns.gpus, ns.max_gpus = gpus_or_share("0.25"), None  # (`--gpus 0.25`: a quarter of one GPU)
    assert {k: job_from_args(ns)[0][k] for k in ("num_gpus", "gpu_milli")} == {
        "num_gpus": 1, "gpu_milli": 250,
    }  # fmt: skip
    ns.gpus = (2, None)
    ns.chdir = Path("sub")  # relative to where `submit` runs
    assert job_from_args(ns)[0]["workdir"] == str(Path.cwd() / "sub")
    ns.chdir = None

    # Deadlines are seconds from now on the command line, absolute in the job.
    ns.deadline, ns.total_steps, ns.job_type = 600.0, 3000.0, "train"
    before = time.time()
    (job,) = job_from_args(ns)
    assert before + 600 <= job["deadline"] <= time.time() + 600
    assert (job["total_steps"], job["job_type"]) == (3000.0, "train")
    # BFTrainer's rescale costs (Tcup, Tcdw), seconds of the job's throughput; unset: 0.
    assert "rescale_up_s" not in job and "rescale_down_s" not in job
    ns.rescale_up_s, ns.rescale_down_s = 20.0, 0.0
    (job,) = job_from_args(ns)
    assert (job["rescale_up_s"], job["rescale_down_s"]) == (20.0, 0.0)
    with pytest.raises(SystemExit):
        main(["submit", "--rescale-down-s", "-1", "--", "x"])
    ns.command = []
    with pytest.raises(ValueError, match="command"):
        job_from_args(ns)
    toml = tmp_path / "job.toml"
    toml.write_text('num_gpus = 1\ncommand = ["python", "t.py"]\n')
    ns.file = toml
    assert job_from_args(ns) == [
        {"num_gpus": 1, "command": ["python", "t.py"], "workdir": str(Path.cwd())}
    ]


SHARER = """
import sys, time
from pathlib import Path
Path(sys.argv[1]).write_text("running")
while True:
    time.sleep(0.05)
"""


async def test_the_agent_refuses_a_command_with_a_launch_that_carries_no_spec(
    nats_url: str, tmp_path: Path
) -> None:
    """Only a simulation's launches go without the job's spec (the simclock has the workload): a
    real agent refuses the whole command, naming the launch, and starts nothing of it."""
    from gpuyard.shared.connection import connect
    from gpuyard.shared.contract import NodeCommand
    from gpuyard.shared.errors import BadRequest

    config = NodeAgentConfig(**AGENT_CONFIG, node_id="n1", gpus=2, use_nvml=False, grace_s=5,
                             log_dir=str(tmp_path / "logs"), checkpoint_root=str(tmp_path / "ckpt"))  # fmt: skip
    bus = Bus(await connect(nats_url, name="agent-n1"), Subjects("nospec"))
    agent = NodeAgent(bus, config)
    try:
        whole = msgspec.structs.replace(_launch("per_gpu"), job_id="a", gpus=[0], world_size=1)
        bare = msgspec.structs.replace(whole, job_id="b", gpus=[1], spec=None)
        with pytest.raises(BadRequest, match="'b' carries no job spec") as refused:
            await agent.command(NodeCommand(now=0.0, node_id="n1", launch=[whole, bare]))
        assert refused.value.field == "$.launch[1].spec"
        assert not agent.parts and not agent.launched
    finally:
        await bus.close()


@pytest.mark.slow
async def test_a_job_told_to_share_gpus_runs_beside_their_holder_and_others_wait(
    nats_url: str, tmp_path: Path
) -> None:
    """Space sharing on a real node: a launch that names the job it shares with starts at once
    beside it; a launch on the same GPU that does not waits until both have exited."""
    from gpuyard.shared.connection import connect
    from gpuyard.shared.contract import NodeCommand

    script = tmp_path / "sharer.py"
    script.write_text(SHARER)
    config = NodeAgentConfig(**AGENT_CONFIG, node_id="n1", gpus=1, use_nvml=False, grace_s=5,
                             log_dir=str(tmp_path / "logs"), checkpoint_root=str(tmp_path / "ckpt"))  # fmt: skip
    bus = Bus(await connect(nats_url, name="agent-n1"), Subjects("share"))
    agent = NodeAgent(bus, config)

    def launch(job: str, share_with: str | None = None) -> Launch:
        spec = JobSpec(
            job_id=job, num_gpus=1, command=[*JOB_PYTHON, str(script), str(tmp_path / job)]
        )
        return Launch(job_id=job, spec=spec, gpus=[0], world_size=1, rank_offset=0, node_rank=0,
                      num_nodes=1, master_addr="127.0.0.1", master_port=20000, share_with=share_with)  # fmt: skip

    async def running(job: str) -> None:
        deadline = time.monotonic() + 20
        while not (tmp_path / job).exists():
            assert time.monotonic() < deadline, f"{job} did not start"
            await asyncio.sleep(0.05)

    try:
        await agent.command(NodeCommand(now=0.0, node_id="n1", launch=[launch("a")]))
        await running("a")
        await agent.command(
            NodeCommand(now=1.0, node_id="n1", launch=[launch("b", share_with="a")])
        )
        await running("b")  # beside a, which goes on
        assert set(agent.parts) == {"a", "b"} and not agent.parts["a"].stopping
        await agent.command(NodeCommand(now=2.0, node_id="n1", launch=[launch("c")]))
        await asyncio.sleep(1.0)
        assert not (tmp_path / "c").exists()  # the GPU is held by a and b
        await agent.command(NodeCommand(now=3.0, node_id="n1", preempt=["a"]))
        await asyncio.sleep(1.0)
        assert not (tmp_path / "c").exists()  # b still holds it
        await agent.command(NodeCommand(now=4.0, node_id="n1", preempt=["b"]))
        await running("c")
        assert agent.holders == {0: [agent.parts["c"]]}
    finally:
        for part in [*agent.parts.values(), *agent.stopping.values()]:
            part.stop()
            await part.done.wait()
        await bus.close()

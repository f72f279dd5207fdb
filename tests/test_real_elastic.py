"""Deadlines and elastic resizes on a real cluster, through the CLI as an operator runs it, under
gpuyard's credentials: `gpuyard up --elasticflow --policy ef-accessctrl` with a throughput table,
a node agent (GPUs from flags) with its own identity, and a submitter's `gpuyard submit
--deadline --steps --min-gpus --max-gpus` of examples/train.py. The scheduler shrinks and grows
the running job; each resize checkpoints it and starts it again at the new world size, and the
job's processes say what they saw. Infeasible deadlines are refused with the reason."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.natsauth import Credentials
from gpuyard.services.nodeagent.service import NodeAgent, NodeAgentConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import Launch, NodeCommand
from gpuyard.shared.endpoints import Subjects
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import JobSpec
from tests.polling import free_port, until

from .jobaccount import AGENT_ARGS, AGENT_CONFIG, JOB_PYTHON

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)

CLUSTER = "efreal"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.py"
STEP_S = 0.02
"""train.py's step time on one GPU (`--data-parallel`: halved on two): 50 and 100 steps/s."""


class ElasticCluster:
    """`gpuyard up` on an embedded nats-server under credentials, node agents with GPUs from flags
    (each its own identity, logs under ROOT/NODE, one shared checkpoint folder), and alice, who
    submits. `start()` is the ElasticFlow cluster of this file; other tests call `up` and
    `agent` themselves (tests/test_real_bftrainer.py: agents that join and leave)."""

    def __init__(self, root: Path, nodes: tuple[str, ...] = ("a",)) -> None:
        self.root = root
        self.nodes = nodes
        self.state = root / "state"
        self.procs: list[subprocess.Popen[str]] = []
        self.agents: dict[str, subprocess.Popen[str]] = {}
        self.profiles = self.state / "profiles"
        self.alice = str(self.profiles / "user.alice.json")
        tables = root / "throughputs_t4"  # the GPU type is the folder's suffix
        tables.mkdir()
        (tables / "train.csv").write_text(f"global_batch_size,1,2\n64,{1 / STEP_S},{2 / STEP_S}\n")
        self.throughputs = tables

    def gpuyard(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "gpuyard.cli", *args], capture_output=True, text=True,
            timeout=60, cwd=self.root,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"gpuyard {' '.join(args)}: {result.returncode}\n{result.stderr}")
        return result

    def start(self) -> None:
        self.up("--elasticflow", "--policy", "ef-accessctrl", "--round", "1", "--throughputs",
                str(self.throughputs))  # fmt: skip
        self.agent("a", gpus=2)

    def up(self, *options: str) -> None:
        """The control plane with these policy options."""
        # The identities an operator would issue with `gpuyard auth add-node a` / `add-user
        # alice` (tests/test_ops_auth.py runs those); `up` writes its address into the profiles.
        Credentials(self.state, CLUSTER).init(
            [*(Caller("node", n) for n in self.nodes), Caller("user", "alice")]
        )
        log = (self.root / "up.log").open("a")
        up = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", "up", "--cluster", CLUSTER, "--state-dir",
             str(self.state), "--listen", f"127.0.0.1:{free_port()}", *options,
             "--heartbeat-timeout", "5"],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        self.procs.append(up)
        assert up.stdout is not None
        first = up.stdout.readline()
        assert first.startswith("gpuyard control plane up: --nats nats://127.0.0.1:"), first

    def agent(self, node: str, gpus: int, gpu_type: str = "t4") -> subprocess.Popen[str]:
        """Node `node`'s agent with `gpus` GPUs of `gpu_type`, once it has registered."""
        out = self.root / f"{node}.log"
        log = out.open("a")
        seen = out.read_text().count("node.registered")
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", "nodeagent", "--nats-config",
             str(self.profiles / f"node.{node}.json"), "--gpus", str(gpus), "--gpu-type", gpu_type,
             "--no-nvml", "--heartbeat", "0.2", "--grace", "10", "--address", "127.0.0.1",
             "--state-dir", str(self.root / node), "--checkpoint-root", str(self.root / "ckpt"),
             *AGENT_ARGS],
            stdout=log, stderr=log, text=True,
        )  # fmt: skip
        self.procs.append(agent)
        self.agents[node] = agent
        until(lambda: out.read_text().count("node.registered") > seen, f"agent {node} up")
        return agent

    def stop_agent(self, node: str) -> None:
        """SIGTERM, as a batch system taking its node back: its job parts checkpoint, it leaves."""
        agent = self.agents.pop(node)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0

    def submit(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.gpuyard("submit", "--nats-config", self.alice, *args, check=False)

    def jobs(self) -> dict[str, dict[str, Any]]:
        out = self.gpuyard("jobs", "--json", "--nats-config", self.alice).stdout
        return {j["job_id"]: j for j in json.loads(out)["jobs"]}

    def log(self, job_id: str, rank: int = 0, node: str = "a") -> str:
        path = self.root / node / "logs" / CLUSTER / job_id / f"rank{rank}.log"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        for p in reversed(self.procs):  # the agents first: they leave while `up` still listens
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ElasticCluster]:
    c = ElasticCluster(tmp_path)
    try:
        c.start()
        yield c
    finally:
        c.close()


def train(steps: int) -> list[str]:
    return [*JOB_PYTHON, str(EXAMPLE), "--steps", str(steps), "--step-time", str(STEP_S),
            "--checkpoint-every", "100000", "--data-parallel"]  # fmt: skip


def runs(log: str) -> list[tuple[int, int]]:
    """(world size, first step) of each run of a rank, in order, from train.py's start lines."""
    return [
        (int(m[1]), int(m[2]))
        for m in re.finditer(r"rank=\d+/(\d+) attempt=\d+ resumed=\w+ start_step=(\d+)", log)
    ]


def test_deadline_jobs_are_admitted_or_refused_and_elastic_ones_resized(
    cluster: ElasticCluster,
) -> None:
    # What no plan can finish in time is refused at once, with why, and a non-zero status.
    hopeless = cluster.submit("--min-gpus", "1", "--max-gpus", "2", "--job-type", "train",
                              "--steps", "100000", "--deadline", "30", "--", *train(100000))  # fmt: skip
    assert hopeless.returncode == 1 and hopeless.stdout == ""
    (line,) = hopeless.stderr.splitlines()
    assert re.fullmatch(
        r"rejected j1: cannot meet its deadline: it would finish \d+ s after submission at best, "
        r"its deadline is 30 s after", line,
    ), line  # fmt: skip
    # An elastic job alone takes both GPUs (1 to 2, as the table allows).
    steps = 1500
    big = cluster.submit("--min-gpus", "1", "--max-gpus", "2", "--job-type", "train", "--steps",
                         str(steps), "--deadline", "600", "--", *train(steps))  # fmt: skip
    assert big.returncode == 0, big.stderr
    job = big.stdout.split()[-1]
    until(lambda: runs(cluster.log(job)) and runs(cluster.log(job))[0][0] == 2, f"{job} on 2 GPUs")
    until(lambda: "start_step" in cluster.log(job, 1), f"{job}'s rank 1")
    # A job with an earlier deadline that needs one GPU throughout: the elastic one shrinks.
    small = cluster.submit("--job-type", "train", "--steps", "400", "--deadline", "60", "--",
                           *train(400))  # fmt: skip
    assert small.returncode == 0, small.stderr
    second = small.stdout.split()[-1]
    until(lambda: f"done at step {steps}" in cluster.log(job), f"{job} done", 120)
    jobs = until(lambda: (j := cluster.jobs())[job]["state"] == "completed" and j, "its exit")
    assert jobs[second]["state"] == "completed", jobs[second]["reason"]
    record = jobs[job]
    assert record["end_time"] <= record["spec"]["deadline"]
    assert record["preemptions"] == 0  # resized, never queued again

    rank0, rank1 = cluster.log(job, 0), cluster.log(job, 1)
    seen = runs(rank0)
    sizes = [w for w, _ in seen]
    # 2 GPUs, 1 while the other job runs, 2 again once it is done.
    assert sizes[:3] == [2, 1, 2], seen
    assert "resized: world size 2 -> 1" in rank0 and "resized: world size 1 -> 2" in rank0
    firsts = [s for _, s in seen]
    assert firsts[0] == 0 and firsts == sorted(firsts) and firsts[1] > 0  # progress survived
    assert f"done at step {steps}" in rank0
    # Rank 1 came back after the shrink from rank 0's checkpoint, not from its own older one.
    back = runs(rank1)
    assert len(back) >= 2 and back[1] == (2, firsts[2]) and back[1][1] > back[0][1], back
    # Every stop was a checkpoint at the step the next run started from.
    stopped = [int(s) for s in re.findall(r"preempted at step (\d+): checkpointed", rank0)]
    assert stopped == firsts[1:], (stopped, firsts)
    assert len(seen) == record["attempt"]


def test_admission_at_events_holds_arrivals_until_the_decision_and_declines_them_together(
    tmp_path: Path,
) -> None:
    """`--admission-param decide_at=event --admission-param together=true` on a real cluster
    (ElasticFlow's simulator's way; `gpuyard up --elasticflow` decides at arrival by default):
    an arrival is held until the scheduler's next decision (within a round) and decided there with
    the others, on admission's own timer. A feasible job that arrives with a hopeless one is
    declined with it; one that arrives alone is admitted and runs."""
    cluster = ElasticCluster(tmp_path)
    try:
        cluster.up("--elasticflow", "--policy", "ef-accessctrl", "--round", "2", "--throughputs",
                   str(cluster.throughputs), "--admission-param", "decide_at=event",
                   "--admission-param", "together=true")  # fmt: skip
        cluster.agent("a", gpus=2)

        def job(steps: int, deadline_s: float) -> dict[str, Any]:
            return {"num_gpus": 1, "job_type": "train", "total_steps": steps,
                    "deadline": time.time() + deadline_s, "command": train(steps)}  # fmt: skip

        pair = tmp_path / "pair.json"
        pair.write_text(json.dumps({"jobs": [job(100, 600), job(100_000, 30)]}))
        both = cluster.submit("--file", str(pair))  # one request: one event
        verdicts = [line.split()[0] for line in (both.stdout + both.stderr).splitlines()]
        assert verdicts in (["held", "held"], ["rejected", "rejected"]), both
        ids = [line.split()[1].rstrip(":") for line in both.stdout.splitlines()] or ["j1", "j2"]

        def decided() -> dict[str, dict[str, Any]] | None:
            jobs = cluster.jobs()
            return jobs if all(jobs.get(i, {}).get("state") == "rejected" for i in ids) else None

        jobs = until(decided, "the pair declined together at the next decision", 30)
        assert "cannot meet its deadline" in jobs[ids[1]]["state_reason"]
        assert f"declined with the jobs decided with it ({ids[1]}:" in jobs[ids[0]]["state_reason"]
        alone = tmp_path / "alone.json"
        alone.write_text(json.dumps(job(100, 600)))
        single = cluster.submit("--file", str(alone))
        assert single.returncode == 0, single.stderr
        lone = single.stdout.split()[1].rstrip(":")
        until(lambda: cluster.jobs().get(lone, {}).get("state") == "completed", f"{lone} ran", 60)
    finally:
        cluster.close()


SLOW_CHECKPOINT = """
import signal, sys, time
from gpuyard.jobclient import JobClient
job = JobClient.from_env(handle_sigterm=False)
log = job.checkpoint_dir / "events.txt"
def stop(*_):
    time.sleep(0.8)  # a checkpoint that takes a while
    with log.open("a") as f:
        f.write(f"checkpointed {job.attempt} {time.time()}\\n")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
with log.open("a") as f:
    f.write(f"started {job.attempt} {time.time()}\\n")
while True:
    time.sleep(0.05)
"""


async def test_a_job_moved_within_a_node_starts_after_its_stopped_part_has_checkpointed(
    nats_url: str, tmp_path: Path
) -> None:
    """A resize or move that gives a job other GPUs of the same node: the new processes wait for
    the old ones (their checkpoint), not only for the GPUs' holders."""
    script = tmp_path / "slow_checkpoint.py"
    script.write_text(SLOW_CHECKPOINT)
    config = NodeAgentConfig(
        **AGENT_CONFIG,
        node_id="n1", gpus=4, use_nvml=False, grace_s=10, log_dir=str(tmp_path / "logs"),
        checkpoint_root=str(tmp_path / "ckpt"),
    )  # fmt: skip
    bus = Bus(await connect(nats_url, name="agent-n1"), Subjects("mv"))
    agent = NodeAgent(bus, config)
    spec = JobSpec(job_id="j", num_gpus=1, command=[*JOB_PYTHON, str(script)])
    events = tmp_path / "ckpt" / "mv" / "j" / "events.txt"

    def launch(gpu: int, attempt: int) -> Launch:
        return Launch(
            job_id="j", spec=spec, gpus=[gpu], world_size=1, rank_offset=0, node_rank=0,
            num_nodes=1, master_addr="127.0.0.1", master_port=20000, attempt=attempt,
        )  # fmt: skip

    def lines() -> list[list[str]]:
        return [line.split() for line in events.read_text().splitlines()] if events.exists() else []

    try:
        await agent.command(NodeCommand(now=0.0, node_id="n1", launch=[launch(0, 0)]))
        await _until(lambda: [w[:2] for w in lines()] == [["started", "0"]], "the first run")
        # Moved from GPU 0 to GPU 2, which is free: stop and launch in one command.
        await agent.command(
            NodeCommand(now=1.0, node_id="n1", preempt=["j"], launch=[launch(2, 1)])
        )
        await _until(lambda: len(lines()) == 3, "the second run")
        _, (what, _, saved), (again, attempt, second) = lines()
        assert (what, again, attempt) == ("checkpointed", "started", "1")
        assert float(second) >= float(saved)
    finally:
        for part in list(agent.parts.values()):
            part.stop()
            await part.done.wait()
        await bus.close()


async def _until(check: Callable[[], object], what: str, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)

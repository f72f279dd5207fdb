"""Real mode end to end: real NATS, the control plane on the wall clock, two node agents as real
processes (GPUs from flags: this machine has none) running real Python jobs that use jobclient."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.cli.cluster import control_plane_configs, format_nodes
from gpuyard.run.launcher import ServiceSet
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import CancelRequest, Empty, JobQuery
from gpuyard.shared.endpoints import (
    CANCEL,
    HEARTBEATS,
    QUERY,
    REREGISTER,
    SUBMIT,
    Endpoint,
    Subjects,
)
from gpuyard.shared.endpoints import CLUSTER as CLUSTER_INFO
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.model import JobRecord

from .jobaccount import AGENT_ARGS, JOB_PYTHON

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)

CLUSTER = "rc"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.py"
ENV_DUMP = """
import json, os, sys, time
from pathlib import Path
from gpuyard.jobclient import JobClient
job = JobClient.from_env()
keys = ["job_id", "local_gpu_id", "world_size", "dist_rank", "master_ip_address",
        "local_accessible_gpu", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK",
        "WORLD_SIZE", "LOCAL_RANK", "GPUYARD_NODE_ID", "GPUYARD_ATTEMPT", "PATH", "EXTRA"]
out = job.checkpoint_dir / f"env.rank{job.rank}.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({k: os.environ.get(k) for k in keys}))
job.report(iterations=1, force=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


class RealCluster:
    """Control plane in this process, node agents as subprocesses."""

    def __init__(
        self, url: str, root: Path, configs: dict[str, Any] | None = None, *,
        heartbeat_s: float = 0.2, agent: tuple[str, ...] = ("-m", "gpuyard.services.nodeagent"),
        nodes: tuple[str, ...] = ("a", "b"), agent_args: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        """`configs`: the control plane's (default: fast rounds, nodes lost after 1 s of
        silence); agents heartbeat every `heartbeat_s`, run as `python <agent>` with
        `agent_args` last, and those of `nodes` start with the cluster."""
        self.url = url
        self.root = root
        self.checkpoints = root / "ckpt"
        self.agents: dict[str, asyncio.subprocess.Process] = {}
        if configs is None:
            configs = control_plane_configs(round_s=0.5, heartbeat_timeout_s=1.0)
            configs["placement"].heartbeat_check_s = 0.1
        configs["scheduler"].event_storage = "memory"
        self.services = ServiceSet(url, CLUSTER, configs)
        self.heartbeat_s = heartbeat_s
        self.agent = agent
        self.nodes = nodes
        self.agent_args = agent_args
        self.bus: Bus | None = None

    async def start_agent(self, node_id: str, gpus: int | None = 2, gpu_type: str = "t4") -> None:
        """An agent offering `gpus` of `gpu_type` whether the machine has GPUs or not (None: the
        GPUs NVML finds, as they are)."""
        offer = (
            ["--gpus", str(gpus), "--gpu-type", gpu_type, "--no-nvml"] if gpus is not None else []
        )
        log = (self.root / f"{node_id}.log").open("ab")
        self.agents[node_id] = await asyncio.create_subprocess_exec(
            sys.executable, *self.agent, "--nats", self.url,
            "--cluster", CLUSTER, "--node-id", node_id, *offer,
            "--heartbeat", str(self.heartbeat_s), "--grace", "5", "--address", "127.0.0.1",
            "--state-dir", str(self.root / node_id), "--checkpoint-root", str(self.checkpoints), *AGENT_ARGS,
            *self.agent_args, stdout=log, stderr=log,
        )  # fmt: skip
        log.close()

    async def __aenter__(self) -> RealCluster:
        await self.services.start()
        self.bus = Bus(await connect(self.url, name="test"), Subjects(CLUSTER), request_timeout=10)
        await asyncio.gather(*(self.start_agent(node) for node in self.nodes))
        await self.until(lambda: self.node_count(len(self.nodes)), f"nodes {self.nodes} registered")
        return self

    async def __aexit__(self, *exc: object) -> None:
        for proc in self.agents.values():
            if proc.returncode is None:
                proc.terminate()
        for proc in self.agents.values():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
        assert self.bus is not None
        await self.bus.close()
        await self.services.stop()

    # ------------------------------------------------------------------ helpers

    async def call(self, endpoint: Endpoint[Any, Any], msg: object) -> Any:
        assert self.bus is not None
        return await self.bus.call(endpoint, msg)

    async def node_count(self, n: int) -> bool:
        info = await self.call(CLUSTER_INFO, Empty())
        return len(info.nodes) == n

    async def submit(self, **job: object) -> str:
        reply = await self.call(SUBMIT, {"jobs": [job]})
        (result,) = reply.results
        assert result.verdict == "admit", result.reason
        return result.job_id

    async def job(self, job_id: str) -> JobRecord:
        page = await self.call(QUERY, JobQuery(job_ids=[job_id]))
        return page.jobs[0]

    async def until_state(self, job_id: str, *states: str, within_s: float = 20) -> JobRecord:
        record: list[JobRecord] = []

        async def check() -> bool:
            record[:] = [await self.job(job_id)]
            return record[0].state in states

        await self.until(check, f"{job_id} in {states}", within_s)
        return record[0]

    @staticmethod
    async def until(check, what: str, within_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + within_s
        while not await check():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)

    def job_log(self, job_id: str, rank: int = 0) -> str:
        return "".join(
            p.read_text()
            for p in sorted(self.root.glob(f"*/logs/{CLUSTER}/{job_id}/rank{rank}.log"))
        )


@pytest.fixture
async def cluster(nats_url: str, tmp_path: Path) -> AsyncIterator[RealCluster]:
    async with RealCluster(nats_url, tmp_path) as c:
        yield c


def _train(steps: int, step_time: float = 0.02, checkpoint_every: int = 1000) -> list[str]:
    return [
        *JOB_PYTHON, str(EXAMPLE), "--steps", str(steps), "--step-time", str(step_time),
        "--checkpoint-every", str(checkpoint_every),
    ]  # fmt: skip


async def test_four_gpu_job_across_two_nodes_gets_consistent_ranks(
    cluster: RealCluster, tmp_path: Path
) -> None:
    script = tmp_path / "dump_env.py"
    script.write_text(ENV_DUMP)
    job_id = await cluster.submit(
        num_gpus=4, command=[*JOB_PYTHON, str(script), "0.3"], env={"EXTRA": "x"}
    )
    record = await cluster.until_state(job_id, "completed", "failed")
    assert record.state == "completed", record.reason
    envs = [
        json.loads((cluster.checkpoints / CLUSTER / job_id / f"env.rank{r}.json").read_text())
        for r in range(4)
    ]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["dist_rank"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} == {e["world_size"] for e in envs}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"], e["master_ip_address"]) for e in envs}) == 1
    assert {e["job_id"] for e in envs} == {job_id}
    assert {e["EXTRA"] for e in envs} == {"x"} and all(e["PATH"] for e in envs)
    by_node: dict[str, list[dict[str, str]]] = {}
    for e in envs:
        by_node.setdefault(e["GPUYARD_NODE_ID"], []).append(e)
    assert sorted(by_node) == ["a", "b"]
    for part in by_node.values():
        assert sorted(e["LOCAL_RANK"] for e in part) == ["0", "1"]
        assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in part) == ["0", "1"]
        assert all(e["local_gpu_id"] == e["CUDA_VISIBLE_DEVICES"] for e in part)
        assert {e["local_accessible_gpu"] for e in part} == {"0,1"}


async def test_higher_priority_job_preempts_and_the_victim_resumes_from_its_checkpoint(
    cluster: RealCluster,
) -> None:
    low = await cluster.submit(num_gpus=4, command=_train(150, 0.02), priority=0)
    await cluster.until_state(low, "running")
    await cluster.until(
        lambda: _async(lambda: "start_step=0" in cluster.job_log(low)), "low started"
    )
    await asyncio.sleep(0.3)  # some progress to checkpoint
    high = await cluster.submit(num_gpus=4, command=_train(10, 0.01), priority=10)
    await cluster.until_state(high, "completed", within_s=20)
    record = await cluster.until_state(low, "completed", "failed", within_s=30)
    assert record.state == "completed", record.reason
    assert record.preemptions >= 1
    log = cluster.job_log(low)
    assert "preempted at step" in log and "checkpointed" in log
    stopped_at = int(log.split("preempted at step ")[1].split(":")[0])
    assert stopped_at > 0
    assert f"attempt=1 resumed=True start_step={stopped_at}" in log
    assert "done at step 150 (attempt 1)" in log
    assert record.steps_done == 150  # its last report, which its exit carries (not a heartbeat's)


SLOW_EXIT = """
import atexit, os, runpy, sys, time
if os.environ["GPUYARD_ATTEMPT"] == "0":  # an exit slower than the grace period
    atexit.register(time.sleep, 60)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


async def test_a_run_killed_as_it_exits_after_finishing_does_not_run_again(
    cluster: RealCluster, tmp_path: Path
) -> None:
    """A run that finished its work but is killed on its way out (a preemption whose grace period
    its exit outlasts) looks stopped to its agent: the scheduler requeues the job and launches it
    again. That run finds the job finished and exits 0 at once, which completes it: the work and
    its ending happened once."""
    wrapper = tmp_path / "slow_exit.py"
    wrapper.write_text(SLOW_EXIT)
    low = await cluster.submit(
        num_gpus=1,
        command=[*JOB_PYTHON, str(wrapper), *_train(5, 0.01)[len(JOB_PYTHON) :]],
        priority=0,
    )
    await cluster.until(
        lambda: _async(lambda: "done at step 5 (attempt 0)" in cluster.job_log(low)), "low done"
    )
    assert (await cluster.job(low)).state == "running"  # exiting, slowly
    high = await cluster.submit(num_gpus=4, command=_train(5, 0.01), priority=10)
    await cluster.until_state(high, "completed", within_s=20)
    record = await cluster.until_state(low, "completed", "failed", within_s=30)
    assert record.state == "completed", record.reason
    assert record.preemptions == 1 and record.attempt == 2
    log = cluster.job_log(low)
    assert log.count("done at step") == 1
    assert f"job={low} attempt=1: finished by an earlier run" in log


async def test_killed_node_agent_requeues_the_job_and_it_completes_elsewhere(
    cluster: RealCluster,
) -> None:
    job_id = await cluster.submit(num_gpus=2, command=_train(60, 0.03, checkpoint_every=5))
    await cluster.until_state(job_id, "running")
    info = await cluster.call(CLUSTER_INFO, Empty())
    node = info.busy[job_id][0].node_id
    await cluster.until(
        lambda: _async(lambda: "start_step=0" in cluster.job_log(job_id)), "job started"
    )
    await asyncio.sleep(0.3)
    os.kill(cluster.agents[node].pid, signal.SIGKILL)
    record = await cluster.until_state(job_id, "completed", "failed", within_s=30)
    assert record.state == "completed", record.reason
    assert record.preemptions == 1
    other = "b" if node == "a" else "a"
    resumed = (cluster.root / other / "logs" / CLUSTER / job_id / "rank0.log").read_text()
    assert "attempt=1 resumed=True" in resumed and "done at step 60 (attempt 1)" in resumed
    assert await cluster.node_count(1)


async def test_a_node_agent_killed_mid_command_stalls_no_round(
    nats_url: str, tmp_path: Path
) -> None:
    """Issue 10's fault, for real: a `gpuyard nodeagent` killed -9 while placement's command to it
    is unanswered. Placement as `gpuyard service placement` runs it (nodes lost after 5 s of
    silence here rather than its default, the agents' lease and grace; commands unanswered for
    longer than that, so that a round waiting for one would come after the loss), agents
    heartbeating every second as by default: the next round runs before the node is declared
    lost, which it is within the heartbeat timeout of its silence, and its job is requeued."""
    placement = PlacementConfig(heartbeat_timeout_s=5.0, command_timeout_s=30.0)
    configs = {**control_plane_configs(round_s=0.5), "placement": placement}
    beat_s = 1.0
    cli = ("-m", "gpuyard.cli", "nodeagent")
    async with RealCluster(nats_url, tmp_path, configs, heartbeat_s=beat_s, agent=cli) as cluster:
        await cluster.start_agent("victim", gpus=4, gpu_type="a100")
        await cluster.until(lambda: cluster.node_count(3), "the victim registered")
        victim = cluster.agents["victim"]
        os.kill(victim.pid, signal.SIGSTOP)  # it will not answer: the command stays in flight
        silent = time.monotonic()
        big = await cluster.submit(num_gpus=4, gpu_type="a100", command=["sleep", "60"])
        record = await cluster.until_state(big, "running", within_s=5)  # its launch is sent
        assert record.nodes == ["victim"]
        os.kill(victim.pid, signal.SIGKILL)
        await victim.wait()

        async def lost() -> bool:
            return "victim" in (await cluster.call(CLUSTER_INFO, Empty())).down

        async def marked() -> bool:  # (`gpuyard nodes`: not responding, 3 beats late)
            info = await cluster.call(CLUSTER_INFO, Empty())
            shown = format_nodes(info, await cluster.call(HEARTBEATS, Empty()), time.time())
            return any(line.split()[:2] == ["victim", "ALLOC*"] for line in shown.splitlines())

        lost_within_s = placement.heartbeat_timeout_s + placement.heartbeat_check_s
        small = await cluster.submit(num_gpus=1, command=["sleep", "30"])
        record = await cluster.until_state(small, "running", within_s=lost_within_s)
        assert record.nodes[0] in ("a", "b")
        assert not await lost()  # the next round did not wait for the victim
        await cluster.until(marked, "the victim marked not responding", within_s=lost_within_s)
        assert not await lost()
        await cluster.until(lost, "the victim declared lost", within_s=lost_within_s)
        assert time.monotonic() - silent < lost_within_s
        record = await cluster.job(big)
        why = f"no heartbeat for {placement.heartbeat_timeout_s:g} s"
        assert (record.state, record.reason, record.preemptions) == (
            "queued", f"node victim gone: {why}", 1,
        )  # fmt: skip
        assert (await cluster.call(CLUSTER_INFO, Empty())).down_why == {"victim": why}
        assert (await cluster.job(small)).state == "running"
        # Rounds go on (once the 4-GPU job, which fits nowhere now, is out of FIFO's way).
        await cluster.call(CANCEL, CancelRequest(job_ids=[big]))
        after = await cluster.submit(num_gpus=1, command=["sleep", "30"])
        await cluster.until_state(after, "running", within_s=2 * beat_s)


async def test_an_agent_asked_to_register_as_it_leaves_stays_gone(cluster: RealCluster) -> None:
    """A stopping agent's last heartbeats can reach placement after its departure; placement then
    asks it to register again. It must not: a node registered by an exiting agent takes jobs that
    never start (their next run is attempt 2, as seen on a loaded machine in `systemctl stop`)."""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    job_id = await cluster.submit(num_gpus=2, command=[*JOB_PYTHON, "-c", stubborn])
    record = await cluster.until_state(job_id, "running")
    (node,) = record.nodes
    agent, log = cluster.agents[node], cluster.root / f"{node}.log"
    agent.terminate()  # its part ignores SIGTERM: the agent leaves after its 5 s grace
    await cluster.until(lambda: _async(lambda: "node.leaving" in log.read_text()), "leaving")
    assert cluster.bus is not None
    for _ in range(5):  # as placement does for a heartbeat of a node it does not know
        await cluster.bus.publish(REREGISTER, Empty(), node=node)
        await asyncio.sleep(0.2)
    assert await agent.wait() == 0
    assert log.read_text().count('"node.registered"') == 1
    info = await cluster.call(CLUSTER_INFO, Empty())
    assert node not in {n.node_id for n in info.nodes} and node in info.down


async def test_cancel_heartbeats_and_malformed_submissions(cluster: RealCluster) -> None:
    job_id = await cluster.submit(num_gpus=1, command=_train(1000, 0.02))
    await cluster.until_state(job_id, "running")

    async def progress_reported() -> bool:
        page = await cluster.call(HEARTBEATS, Empty())
        return any(p.job_id == job_id and p.iterations > 0 for b in page.beats for p in b.jobs)

    await cluster.until(progress_reported, "progress in heartbeats")

    async def scheduler_knows_the_steps() -> bool:  # heartbeats -> placement -> scheduler
        return (await cluster.job(job_id)).steps_done > 0

    await cluster.until(scheduler_knows_the_steps, "the job's steps in the scheduler's record")
    reply = await cluster.call(CANCEL, CancelRequest(job_ids=[job_id, "nope"]))
    assert reply.cancelled == [job_id] and "nope" in reply.refused
    record = await cluster.until_state(job_id, "cancelled")
    assert record.reason == "cancelled by request"
    info = await cluster.call(CLUSTER_INFO, Empty())
    assert job_id not in info.busy

    for job, field in [
        ({"num_gpus": 0, "command": ["x"]}, "$.jobs[0].num_gpus"),
        ({"num_gpus": 1, "comand": ["x"]}, "$.jobs[0].comand"),
        ({"command": ["x"]}, "$.jobs[0].num_gpus"),
        ({"num_gpus": 1, "processes": "per_rack"}, "$.jobs[0].processes"),
    ]:
        with pytest.raises(RemoteError) as exc:
            await cluster.call(SUBMIT, {"jobs": [job]})
        assert exc.value.reply.field == field


async def _async(fn):  # type: ignore[no-untyped-def]
    return fn()


async def test_a_failing_part_fails_a_multi_node_job_and_stops_its_other_parts(
    cluster: RealCluster, tmp_path: Path
) -> None:
    script = tmp_path / "fail_rank3.py"
    script.write_text(
        "import os, sys, time\n"
        "from gpuyard.jobclient import JobClient\n"
        "job = JobClient.from_env()\n"
        "if job.rank == 3:\n    time.sleep(0.3); sys.exit(3)\n"
        "while not job.preempted:\n    time.sleep(0.02)\n"
        "print('stopped by the agent', flush=True)\n"
        "job.exit_preempted()\n"
    )
    job_id = await cluster.submit(num_gpus=4, command=[*JOB_PYTHON, str(script)])
    record = await cluster.until_state(job_id, "completed", "failed")
    assert record.state == "failed" and "exited with 3" in record.reason

    async def all_stopped() -> bool:
        return all("stopped by the agent" in cluster.job_log(job_id, r) for r in range(3))

    await cluster.until(all_stopped, "the other ranks stopped")
    after = await cluster.submit(num_gpus=4, command=_train(2, 0.01))
    assert (await cluster.until_state(after, "completed", "failed")).state == "completed"

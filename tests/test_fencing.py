"""Fencing and outages, for real: a nats-server that is stopped and started again, node agents as
processes with short leases. An agent cut off from the control plane for its lease stops its jobs;
an outage shorter than the lease, or a placement restarted, requeues nothing; a cancel shows
CANCELLED only once the job's processes are gone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuyard.cli.cluster import control_plane_configs
from gpuyard.run.launcher import ServiceSet
from gpuyard.shared.contract import CancelRequest, Empty, JobQuery
from gpuyard.shared.endpoints import CANCEL, QUERY
from gpuyard.shared.endpoints import CLUSTER as CLUSTER_INFO
from gpuyard.shared.errors import RemoteError

from .jobaccount import AGENT_ARGS, AGENT_CONFIG, JOB_PYTHON
from .polling import alive
from .test_real_cluster import CLUSTER, RealCluster, _train
from .test_recovery import NatsProcess

PID_JOB = """
import os, signal, sys, time
from pathlib import Path
Path(sys.argv[1]).write_text(str(os.getpid()))
if len(sys.argv) > 2:  # slow to stop: the SIGTERM is taken, the process ends that much later
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(float(sys.argv[2])), sys.exit(0)))
time.sleep(600)
"""


def _configs(heartbeat_timeout_s: float) -> dict[str, Any]:
    configs = control_plane_configs(round_s=0.3, heartbeat_timeout_s=heartbeat_timeout_s)
    configs["placement"].heartbeat_check_s = 0.1
    return configs


def _agent_events(cluster: RealCluster, node_id: str, event: str) -> list[dict[str, Any]]:
    """The agent's log lines (structlog JSON) of one event."""
    lines = (cluster.root / f"{node_id}.log").read_text().splitlines()
    found = []
    for line in lines:
        if f'"{event}"' in line:
            with_json = line[line.index("{") :]
            found.append(json.loads(with_json))
    return [e for e in found if e.get("event") == event]


async def _pid_of(cluster: RealCluster, path: Path) -> int:
    async def written() -> bool:
        return _read_pid(path) is not None

    await cluster.until(written, f"{path.name} written")
    pid = _read_pid(path)
    assert pid is not None
    return pid


def _read_pid(path: Path) -> int | None:
    text = path.read_text() if path.exists() else ""
    return int(text) if text.isdigit() else None


def _pid_job(
    cluster: RealCluster, name: str, stop_s: float | None = None
) -> tuple[list[str], Path]:
    script = cluster.root / "pid_job.py"
    script.write_text(PID_JOB)
    path = cluster.root / f"{name}.pid"
    command = [*JOB_PYTHON, str(script), str(path)]
    return ([*command, str(stop_s)] if stop_s is not None else command), path


@pytest.mark.slow
async def test_an_agent_cut_off_from_the_broker_stops_its_jobs_after_its_lease(
    tmp_path: Path,
) -> None:
    """The broker stops: after its 2 s lease the agent stops its job (SIGTERM, grace, SIGKILL),
    saying so in one line; the job's process is gone though the node is not yet declared lost
    (20 s). With the broker back it registers afresh, and the job, requeued, runs again."""
    server = NatsProcess(tmp_path / "nats")
    url = await server.start()
    lease = ("--lease", "2", "--grace", "1")
    try:
        async with RealCluster(
            url, tmp_path, _configs(20.0), nodes=("a",), agent_args=lease
        ) as cluster:
            command, pid_file = _pid_job(cluster, "cut")
            job = await cluster.submit(num_gpus=1, command=command)
            await cluster.until_state(job, "running")
            pid = await _pid_of(cluster, pid_file)
            pid_file.unlink()
            await server.stop()

            async def fenced() -> bool:
                return bool(_agent_events(cluster, "a", "node.fenced"))

            await cluster.until(fenced, "the agent fenced", within_s=15)
            await cluster.until(lambda: _gone(pid), "the job's process gone", within_s=10)
            (line,) = _agent_events(cluster, "a", "node.fenced")
            assert line["jobs"] == [job] and "no answer from the control plane" in line["reason"]

            await server.start()
            await _back(cluster)
            # Back: a new boot with no jobs; placement requeues the job, which runs again.
            await cluster.until(lambda: _registered(cluster, "a", 2), "registered again", 20)
            record = await cluster.until_state(job, "running", within_s=20)
            assert record.preemptions == 1 and record.attempt == 2
            assert await _pid_of(cluster, pid_file) != pid
            assert len(_agent_events(cluster, "a", "node.fenced")) == 1
    finally:
        await server.stop()


async def _back(cluster: RealCluster) -> None:
    """Until the control plane answers again (its services reconnect to the restarted broker)."""

    async def answers() -> bool:
        try:
            await cluster.call(CLUSTER_INFO, Empty())
            await cluster.call(QUERY, JobQuery(limit=1))
        except RemoteError:
            return False
        return True

    await cluster.until(answers, "the control plane back", within_s=20)


async def _gone(pid: int) -> bool:
    return not alive(pid)


async def _registered(cluster: RealCluster, node_id: str, times: int) -> bool:
    return len(_agent_events(cluster, node_id, "node.registered")) >= times


@pytest.mark.slow
async def test_a_broker_outage_shorter_than_the_lease_requeues_nothing(tmp_path: Path) -> None:
    """The broker down 3 s, agents' lease 6 s (shorter than the jobs: renewed), nodes lost after
    20 s: the same processes run on and every job ends once, in its first run; each agent
    registers once more, not once per heartbeat it sent meanwhile."""
    server = NatsProcess(tmp_path / "nats")
    url = await server.start()
    try:
        async with RealCluster(
            url, tmp_path, _configs(20.0), agent_args=("--lease", "6")
        ) as cluster:
            jobs = [await cluster.submit(num_gpus=2, command=_train(300, 0.03)) for _ in range(2)]
            for job in jobs:
                await cluster.until_state(job, "running")
            await server.stop()
            await asyncio.sleep(3.0)  # (the outage)
            await server.start()
            await _back(cluster)
            for job in jobs:
                record = await cluster.until_state(job, "completed", "failed", within_s=60)
                assert (record.state, record.preemptions, record.attempt) == ("completed", 0, 1)
                log = cluster.job_log(job)
                assert log.count("done at step") == 1 and "attempt=1" not in log
            for node in ("a", "b"):
                assert not _agent_events(cluster, node, "node.fenced")
                assert len(_agent_events(cluster, node, "node.registered")) == 2
            info = await cluster.call(CLUSTER_INFO, Empty())
            assert not info.down
    finally:
        await server.stop()


@pytest.mark.slow
async def test_a_placement_restart_requeues_nothing(nats_url: str, tmp_path: Path) -> None:
    """Placement killed -9 and started again only after its heartbeat timeout (3 s) is over: the
    silence clock starts at its own start, agents register again with what they run, and no job
    is requeued or run twice."""
    configs = _configs(3.0)
    cluster = RealCluster(nats_url, tmp_path, configs, agent_args=("--lease", "30"))
    configs["scheduler"].event_storage = "memory"
    cluster.services = ServiceSet(
        nats_url, CLUSTER, configs, processes=True, log_file=tmp_path / "control.log"
    )
    async with cluster:
        jobs = [await cluster.submit(num_gpus=2, command=_train(250, 0.03)) for _ in range(2)]
        for job in jobs:
            await cluster.until_state(job, "running")
        os.kill(cluster.services.process("placement").pid, signal.SIGKILL)
        await asyncio.sleep(4.0)  # (down longer than the timeout it restores its nodes with)
        await cluster.services.replace("placement")
        for job in jobs:
            record = await cluster.until_state(job, "completed", "failed", within_s=60)
            assert (record.state, record.preemptions, record.attempt) == ("completed", 0, 1)
            assert cluster.job_log(job).count("done at step") == 1
        for node in ("a", "b"):
            assert len(_agent_events(cluster, node, "node.registered")) == 2
        assert not (await cluster.call(CLUSTER_INFO, Empty())).down


@pytest.mark.slow
async def test_a_cancel_shows_cancelled_only_once_the_ranks_are_gone(
    nats_url: str, tmp_path: Path
) -> None:
    """A job that takes 2 s to stop after its SIGTERM: until its process is gone it shows as
    running (being cancelled), then CANCELLED."""
    async with RealCluster(nats_url, tmp_path, nodes=("a",)) as cluster:
        command, pid_file = _pid_job(cluster, "slow", stop_s=2.0)
        job = await cluster.submit(num_gpus=1, command=command)
        await cluster.until_state(job, "running")
        pid = await _pid_of(cluster, pid_file)
        reply = await cluster.call(CANCEL, CancelRequest(job_ids=[job]))
        assert reply.cancelled == [job]
        page = await cluster.call(QUERY, JobQuery(states=["running"]))  # (still listed as such)
        assert [j.job_id for j in page.jobs] == [job] and alive(pid)
        seen: list[str] = []

        async def cancelled() -> bool:
            record = await cluster.job(job)
            if record.state == "cancelled":
                assert not alive(pid), "CANCELLED while the job's process still runs"
                return True
            assert record.state == "running" and record.reason.startswith("cancelling")
            seen.append(record.state)
            return False

        await cluster.until(cancelled, "the job cancelled", within_s=20)
        assert seen  # it was seen being cancelled first
        record = await cluster.job(job)
        assert record.reason == "cancelled by request" and record.nodes == []


@pytest.mark.slow
async def test_a_cancel_on_a_paused_agent_waits_until_the_node_is_lost(
    nats_url: str, tmp_path: Path
) -> None:
    """The agent is paused (SIGSTOP), the job's process runs on: the cancelled job shows as
    running until the node is declared lost (after the agent's lease and grace: it stops its
    jobs when it runs again), then CANCELLED."""
    args = ("--lease", "2", "--grace", "1")
    async with RealCluster(
        nats_url, tmp_path, _configs(4.0), nodes=("a",), agent_args=args
    ) as cluster:
        command, pid_file = _pid_job(cluster, "paused")
        job = await cluster.submit(num_gpus=1, command=command)
        await cluster.until_state(job, "running")
        pid = await _pid_of(cluster, pid_file)
        agent = cluster.agents["a"]
        agent.send_signal(signal.SIGSTOP)
        try:
            await cluster.call(CANCEL, CancelRequest(job_ids=[job]))
            record = await cluster.job(job)
            assert record.state == "running" and alive(pid)

            async def lost() -> bool:
                # The job's state first: cancelled, the node must be down by the time we look.
                state = (await cluster.job(job)).state
                if "a" in (await cluster.call(CLUSTER_INFO, Empty())).down:
                    return True
                if state == "cancelled":
                    raise AssertionError("CANCELLED before the node was lost")
                return False

            await cluster.until(lost, "the node declared lost", within_s=20)
            record = await cluster.until_state(job, "cancelled", within_s=5)
            assert record.reason == "cancelled by request"
        finally:
            agent.send_signal(signal.SIGCONT)
        # Running again, the agent finds its lease over and stops the job.
        await cluster.until(lambda: _gone(pid), "the job's process gone", within_s=15)
        (line,) = _agent_events(cluster, "a", "node.fenced")
        assert line["jobs"] == [job]


def test_the_lease_is_an_option_checked_and_placements_timeout_exceeds_the_defaults() -> None:
    import argparse

    from gpuyard.services.nodeagent.run import add_agent_args, config_from_args
    from gpuyard.services.nodeagent.service import NodeAgentConfig
    from gpuyard.services.placement.service import PlacementConfig

    p = argparse.ArgumentParser()
    add_agent_args(p)
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match="--lease must be > 0"):
            config_from_args(p.parse_args(["--node-id", "n1", "--lease", bad]))
    assert config_from_args(p.parse_args(["--node-id", "n1", "--lease", "7"])).lease_s == 7.0
    with pytest.raises(msgspec.ValidationError, match="lease_s"):
        msgspec.convert({"node_id": "n1", "lease_s": 0}, NodeAgentConfig)
    # By default a silent node is declared lost only once it has stopped its jobs.
    agent = NodeAgentConfig(node_id="n1")
    assert PlacementConfig().heartbeat_timeout_s > agent.lease_s + agent.grace_s


async def test_asks_to_register_again_in_a_burst_make_one_registration(
    nats_url: str, tmp_path: Path
) -> None:
    """Placement's asks to register again, 20 at once (as after an outage, one per heartbeat
    the agent sent meanwhile): one registration, not one each."""
    from gpuyard.services.nodeagent.service import NodeAgent, NodeAgentConfig
    from gpuyard.shared.connection import Bus, connect
    from gpuyard.shared.contract import Ack, ClusterInfo, Ping
    from gpuyard.shared.endpoints import HEARTBEAT, PING, REGISTER, REREGISTER, Subjects

    subjects = Subjects("burst")
    nc = await connect(nats_url, name="placement")
    registrations = []

    async def register(msg: Any) -> None:
        registrations.append(msg.data)
        await msg.respond(msgspec.json.encode(ClusterInfo(nodes=[], capacity={}, busy={})))

    async def heartbeat(msg: Any) -> None:
        await msg.respond(msgspec.json.encode(Ack()))

    await nc.subscribe(subjects.every(REGISTER), cb=register)
    await nc.subscribe(subjects.every(HEARTBEAT), cb=heartbeat)
    config = NodeAgentConfig(
        **AGENT_CONFIG,
        node_id="n1", gpus=1, use_nvml=False, log_dir=str(tmp_path / "logs"),
        checkpoint_root=str(tmp_path / "ckpt"), register_every_s=0.5,
    )  # fmt: skip
    bus = Bus(await connect(nats_url, name="agent-n1"), subjects)
    agent = NodeAgent(bus, config)
    try:
        await agent.start()
        async with asyncio.timeout(10):
            await agent.registered.wait()
        for _ in range(20):
            await nc.publish(subjects.of(REREGISTER, node="n1"), b"{}")
        # Its one subscription takes them in order: once it answers this, it has had them all.
        await bus.call(PING, Ping(), svc="node.n1")
        assert agent._registering is not None
        async with asyncio.timeout(10):
            await agent._registering
        assert len(registrations) == 2  # the first, and one for the 20 asks
    finally:
        await agent.stop()
        await nc.close()


async def test_a_revoked_agent_stops_its_jobs(tmp_path: Path) -> None:
    """`gpuyard auth remove node.a` on a running cluster: the server drops the agent's connection
    and refuses it; the agent stops its job at once (its lease is long) and says why in one line,
    and keeps trying to connect."""
    from gpuyard.shared.contract import SubmitRequest
    from gpuyard.shared.endpoints import SUBMIT
    from gpuyard.shared.identity import Caller
    from gpuyard.shared.model import JobSpec

    from .secured import secured_cluster

    async with secured_cluster(tmp_path, ["node.a", "user.alice"]) as cluster:
        script = tmp_path / "pid_job.py"
        script.write_text(PID_JOB)
        pid_file = tmp_path / "revoked.pid"
        log_path = tmp_path / "a.log"
        with log_path.open("ab") as log:
            agent = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuyard.cli", "nodeagent", "--nats-config",
                str(cluster.creds.profile_path(Caller("node", "a"))), "--gpus", "1", "--no-nvml",
                "--heartbeat", "0.2", "--grace", "1", "--lease", "60", "--address", "127.0.0.1",
                "--state-dir", str(tmp_path / "a"), "--checkpoint-root", str(tmp_path / "ckpt"),
                *AGENT_ARGS, stdout=log, stderr=log,
            )  # fmt: skip
        try:
            alice = await cluster.client("user.alice")
            spec = JobSpec(num_gpus=1, command=[*JOB_PYTHON, str(script), str(pid_file)])
            (result,) = (await alice.bus.call(SUBMIT, SubmitRequest(jobs=[spec]))).results
            job = result.job_id

            async def pid() -> int | None:
                return _read_pid(pid_file)

            pid_value = await cluster.until(pid, "the job started", within_s=30)
            cluster.creds.remove(Caller("node", "a"))
            assert cluster.creds.reload_server()

            async def gone() -> bool:
                return not alive(pid_value)

            await cluster.until(gone, "the job's process gone", within_s=20)
            lines = [line for line in log_path.read_text().splitlines() if '"node.fenced"' in line]
            assert len(lines) == 1 and "credentials refused" in lines[0] and job in lines[0]
            assert agent.returncode is None  # (still trying: let in again, it registers afresh)
        finally:
            if agent.returncode is None:
                agent.kill()
                await agent.wait()


async def test_placement_answers_every_heartbeat_even_a_bad_one(nats_url: str) -> None:
    """Heartbeats are requests now (the answer is the agent's lease): a malformed one gets an
    error naming the field, a forged one (another node's id) is not taken, and placement runs on."""
    from gpuyard.services.placement.service import PlacementConfig
    from gpuyard.shared.connection import Bus, connect
    from gpuyard.shared.contract import STATUS_HEADER, Ack, Heartbeat
    from gpuyard.shared.endpoints import HEARTBEAT, REREGISTER, Subjects

    subjects = Subjects("hb")
    async with ServiceSet(nats_url, "hb", {"placement": PlacementConfig()}, log_level="error"):
        bus = Bus(await connect(nats_url, name="n1"), subjects, request_timeout=5)
        try:
            asks = await bus.nc.subscribe(subjects.of(REREGISTER, node="n1"))
            for garbage in (b"\xff", b"[]", b'{"now": "x", "node_id": "n1"}'):
                reply = await bus.nc.request(subjects.of(HEARTBEAT, node="n1"), garbage, timeout=5)
                assert reply.headers and reply.headers.get(STATUS_HEADER) == "error", reply.data
            forged = Heartbeat(now=0.0, node_id="n2")
            assert await bus.call(HEARTBEAT, forged, node="n1") == Ack(ok=False)
            beat = Heartbeat(now=0.0, node_id="n1")
            assert await bus.call(HEARTBEAT, beat, node="n1") == Ack()
            # An unknown node is asked to register.
            ask = await asks.next_msg(timeout=5)
            assert msgspec.json.decode(ask.data) == {}
            with pytest.raises(RemoteError, match="Expected `object`"):
                await bus.call(HEARTBEAT, [], node="n1")
        finally:
            await bus.close()


def test_a_job_being_cancelled_survives_a_scheduler_restart_and_ends_with_its_last_part() -> None:
    """The job table: a running job cancelled on two agents leaves the active jobs (no decision
    includes it) but stays running until both parts stopped; a table restored from the records
    (a restarted scheduler) goes on from there, its counters right."""
    from gpuyard.services.scheduler.jobs import JobTable
    from gpuyard.shared.model import JobSpec

    table = JobTable()
    record = table.admit(JobSpec(job_id="j1", num_gpus=4, command=["x"]), 0.0, None)
    table.start(record, 1.0, ["a", "b"], 4, "t4", 1.0)
    table.cancel_running(record, 2.0, "cancelled by user.alice", ["a", "b"])
    assert record.state == "running" and record.reason.startswith("cancelling")
    assert not table.active and table.running == table.busy_gpus == table.finished == 0

    restored = JobTable()
    restored.load([msgspec.json.decode(msgspec.json.encode(record), type=type(record))])
    again = restored.jobs["j1"]
    assert not restored.active and list(restored.stopping) == ["j1"]
    assert not restored.part_stopped(again, "a", 3.0) and again.state == "running"
    assert restored.part_stopped(again, "b", 4.0)
    assert (again.state, again.reason, again.end_time) == (
        "cancelled",
        "cancelled by user.alice",
        4.0,
    )
    assert not restored.stopping and restored.finished == 1 and restored.running == 0

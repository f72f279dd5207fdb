"""Crash recovery in real mode: the control plane as one process per service (durable state in
JetStream key-value buckets), two node agents, real jobs. `kill -9` a service mid-run and start it
again, or replace the scheduler by a process with another policy: every job ends exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuyard.cli.cluster import control_plane_configs
from gpuyard.ops import read_events
from gpuyard.run.launcher import ServiceSet
from gpuyard.shared.connection import connect
from gpuyard.shared.contract import Empty, JobQuery, JobsPage
from gpuyard.shared.endpoints import POLICY, QUERY, SUBMIT

from .test_real_cluster import CLUSTER, RealCluster, _train

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)

RETRY_S = 30.0


class ProcessCluster(RealCluster):
    """The control plane as separate processes (so one can be killed), durable."""

    def __init__(self, url: str, root: Path) -> None:
        super().__init__(url, root)
        # Tiresias keeps state between decisions (promotions): the scheduler stores it too. Its
        # queue limit is small enough for these short jobs to move between queues.
        configs = control_plane_configs(policy="tiresias", round_s=0.3, heartbeat_timeout_s=2.0)
        configs["scheduler"].params = {"thresholds": [0.5], "promote_knob": 1.0}
        configs["placement"].heartbeat_check_s = 0.1
        configs["scheduler"].event_storage = "memory"
        self.configs = configs
        self.services = ServiceSet(
            url, CLUSTER, configs, processes=True, log_file=root / "control.log"
        )

    async def submit_retrying(self, job_id: str, steps: int = 20) -> None:
        """Submit with our own id, retrying while admission restarts: a retry is no duplicate."""
        assert self.bus is not None
        reply = await self.bus.call(
            SUBMIT, {"jobs": [{"job_id": job_id, "num_gpus": 1, "command": _train(steps, 0.02)}]},
            within_s=5.0, retry_for_s=RETRY_S,
        )  # fmt: skip
        (result,) = reply.results
        assert result.verdict == "admit", result.reason

    async def all_jobs(self) -> JobsPage:
        assert self.bus is not None
        return await self.bus.call(QUERY, JobQuery(limit=10_000), within_s=5.0, retry_for_s=RETRY_S)

    async def until_all_ended(self, count: int, within_s: float = 60.0) -> JobsPage:
        pages: list[JobsPage] = []

        async def check() -> bool:
            pages[:] = [await self.all_jobs()]
            ended = [j for j in pages[0].jobs if j.state in ("completed", "failed", "cancelled")]
            return len(ended) == count

        await self.until(check, f"{count} jobs ended", within_s)
        return pages[0]

    def done_lines(self, job_id: str) -> int:
        """How many times the job ran to its end (across nodes and attempts)."""
        return sum(
            p.read_text().count("done at step")
            for p in self.root.glob(f"*/logs/{CLUSTER}/{job_id}/rank0.log")
        )

    def kill(self, name: str) -> None:
        os.kill(self.services.process(name).pid, signal.SIGKILL)


@pytest.fixture
async def pcluster(nats_url: str, tmp_path: Path) -> AsyncIterator[ProcessCluster]:
    async with ProcessCluster(nats_url, tmp_path) as c:
        yield c


def _assert_exactly_once(cluster: ProcessCluster, page: JobsPage, ids: list[str]) -> None:
    assert sorted(j.job_id for j in page.jobs) == sorted(ids)
    bad = {j.job_id: (j.state, j.reason) for j in page.jobs if j.state != "completed"}
    assert not bad, bad
    runs = {job_id: cluster.done_lines(job_id) for job_id in ids}
    assert set(runs.values()) == {1}, runs


@pytest.mark.parametrize("victim", ["scheduler", "placement", "admission"])
async def test_a_killed_service_restarts_and_every_job_ends_exactly_once(
    pcluster: ProcessCluster, victim: str
) -> None:
    ids = [f"r{i}" for i in range(8)]
    for job_id in ids[:5]:
        await pcluster.submit_retrying(job_id)
    await pcluster.until(
        lambda: _some_running(pcluster), "jobs running before the kill", within_s=20
    )
    pcluster.kill(victim)
    await asyncio.sleep(0.3)
    # Submissions while it is down wait (admission down: the client retries; others: admission).
    late = asyncio.gather(*(pcluster.submit_retrying(j) for j in ids[5:7]))
    await asyncio.sleep(0.3)
    await pcluster.services.replace(victim)
    await late
    for job_id in ids[7:]:
        await pcluster.submit_retrying(job_id)
    page = await pcluster.until_all_ended(len(ids))
    _assert_exactly_once(pcluster, page, ids)


async def test_a_launch_placement_stored_but_never_sent_is_run_after_its_restart(
    nats_url: str, tmp_path: Path
) -> None:
    """Placement sends each agent its commands in order, in the background, after storing the
    apply that needs them. Killed while a launch waits behind an unanswered command (here: the
    agents are paused), it leaves a job placed on a node that never heard of it. The agent's next
    registration says which jobs it was told to launch; the others are requeued and run."""
    cluster = ProcessCluster(nats_url, tmp_path)
    patient = {"heartbeat_timeout_s": 60.0, "command_timeout_s": 60.0}  # (while paused)
    cluster.configs["placement"] = msgspec_replace(cluster.configs["placement"], **patient)
    async with cluster:
        ids = [f"p{i}" for i in range(4)]
        for agent in cluster.agents.values():
            agent.send_signal(signal.SIGSTOP)
        try:
            for job_id in ids:  # one round each: a node's second launch waits behind its first
                await cluster.submit_retrying(job_id, steps=5)
                await cluster.until_state(job_id, "running")
            cluster.kill("placement")
            await cluster.services.replace("placement")
        finally:
            for agent in cluster.agents.values():
                agent.send_signal(signal.SIGCONT)
        page = await cluster.until_all_ended(len(ids))
        _assert_exactly_once(cluster, page, ids)
        assert any(j.preemptions for j in page.jobs)  # (requeued: "node lost")


async def _some_running(cluster: ProcessCluster) -> bool:
    page = await cluster.all_jobs()
    return any(j.state == "running" for j in page.jobs)


async def test_a_replacement_scheduler_takes_over_with_another_policy(
    pcluster: ProcessCluster,
) -> None:
    """A second scheduler process (sjf) takes over from the first (fifo), which drains and exits,
    while submissions keep coming: none is refused, no job is lost or run twice."""
    ids = [f"s{i}" for i in range(12)]
    old = pcluster.services.process("scheduler")

    async def submit_all() -> None:
        for job_id in ids:
            await pcluster.submit_retrying(job_id, steps=10)
            await asyncio.sleep(0.05)

    submitting = asyncio.create_task(submit_all())
    await asyncio.sleep(0.3)
    new_config = msgspec_replace(pcluster.configs["scheduler"], policy="sjf", params={})
    await pcluster.services.replace("scheduler", new_config)
    await submitting
    async with asyncio.timeout(15):
        assert await old.wait() == 0  # the old one handed over and exited on its own
    assert pcluster.bus is not None
    info = await pcluster.bus.call(POLICY, Empty(), within_s=5.0, svc="sched")
    assert info.policy == "sjf"
    swaps = [
        s.event
        async for s in read_events(pcluster.bus.nc, pcluster.bus.subjects, types=["policy.changed"])
    ]
    assert [e.reason.split(" {")[0] for e in swaps] == ["tiresias -> sjf"]
    assert swaps[0].reason.endswith("(took over)")
    page = await pcluster.until_all_ended(len(ids))
    _assert_exactly_once(pcluster, page, ids)


def msgspec_replace(config: object, **changes: object) -> object:
    import msgspec

    return msgspec.structs.replace(config, **changes)  # type: ignore[type-var]


async def test_the_nats_server_restarts_with_its_store_and_no_job_is_lost(
    tmp_path: Path,
) -> None:
    """A nats-server with file storage in a fixed folder, stopped and started again mid-run;
    then the scheduler is killed and restarted, so its jobs come from the server's store."""
    server = NatsProcess(tmp_path / "nats")
    url = await server.start()
    try:
        async with ProcessCluster(url, tmp_path) as cluster:
            ids = [f"n{i}" for i in range(6)]
            for job_id in ids[:4]:
                await cluster.submit_retrying(job_id, steps=40)
            await cluster.until(lambda: _some_running(cluster), "jobs running", within_s=20)
            await server.stop()
            await asyncio.sleep(0.5)
            await server.start()
            await asyncio.sleep(0.5)  # reports buffered in the outage are answered first
            # The store outlived the server: a scheduler started now finds every job there.
            cluster.kill("scheduler")
            await cluster.services.replace("scheduler")
            for job_id in ids[4:]:
                await cluster.submit_retrying(job_id, steps=10)
            page = await cluster.until_all_ended(len(ids), within_s=60)
            _assert_exactly_once(cluster, page, ids)
    finally:
        await server.stop()


class NatsProcess:
    """A nats-server on a fixed free port with JetStream in a fixed store folder."""

    def __init__(self, root: Path) -> None:
        import socket

        from gpuyard.run.embedded import nats_server_binary

        self.root = root
        self.binary = nats_server_binary()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        log = (self.root / "server.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js",
            "-sd", str(self.root / "js"), stdout=log, stderr=log,
        )  # fmt: skip
        log.close()
        url = f"nats://127.0.0.1:{self.port}"
        for _ in range(100):
            try:
                nc = await connect(url, name="probe", max_reconnect_attempts=0)
                await nc.close()
                return url
            except Exception:
                await asyncio.sleep(0.05)
        raise RuntimeError("nats-server did not start")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()


async def test_a_durable_simulation_gives_the_same_results(tmp_path: Path, nats_url: str) -> None:
    """Simulations keep state in memory by default; durable (as `gpuyard up`) changes nothing."""
    import random

    from gpuyard.run.simulate import SimOptions, simulate
    from gpuyard.shared.model import ClusterSpec, JobSpec

    rng = random.Random(3)
    jobs = [
        JobSpec(job_id=f"j{i}", num_gpus=rng.choice([1, 2, 4]), duration=rng.uniform(10, 500),
                submit_time=i * 20.0)
        for i in range(40)
    ]  # fmt: skip
    plain = SimOptions(cluster=ClusterSpec.parse("2x4"), mode="events")
    durable = SimOptions(cluster=ClusterSpec.parse("2x4"), mode="events", durable=True)
    await simulate(plain, jobs, tmp_path / "plain", nats_url=nats_url, cluster_name="plain")
    await simulate(durable, jobs, tmp_path / "durable", nats_url=nats_url, cluster_name="dur")
    for name in ("jobs.csv", "timeline.csv"):
        assert (tmp_path / "durable" / name).read_bytes() == (
            tmp_path / "plain" / name
        ).read_bytes()
    nc = await connect(nats_url, name="test")
    try:
        kv = await nc.jetstream().key_value("gpuyard_dur_scheduler")
        assert (await kv.status()).values >= len(jobs)  # one key per job, and the meta key
    finally:
        await nc.close()

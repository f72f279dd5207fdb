"""No single broker: the control plane on a three-server NATS cluster, its key-value buckets and
event stream kept in three replicas. Servers are killed (-9) under a real cluster's load (two node
agents, real jobs): what the services stored survives on the others, clients move to them, and
every job ends exactly once, none requeued by the outage."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuyard.run.embedded import EmbeddedNats
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.shared.connection import connect
from gpuyard.shared.endpoints import Subjects

from .polling import free_port
from .test_real_cluster import CLUSTER
from .test_recovery import ProcessCluster, _assert_exactly_once

SERVERS = 3


class Brokers:
    """Three JetStream servers routed into one NATS cluster, each with its own store and fixed
    ports (a server started again rejoins under its name, with what it stored)."""

    def __init__(self, root: Path) -> None:
        self.client_ports = [free_port() for _ in range(SERVERS)]
        route_ports = [free_port() for _ in range(SERVERS)]
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in route_ports)
        self.servers = []
        for i in range(SERVERS):
            cluster = f'name: "gy", listen: "127.0.0.1:{route_ports[i]}", routes: [{routes}]'
            self.servers.append(
                EmbeddedNats(
                    state_dir=root / f"nats{i}",
                    listen=f"127.0.0.1:{self.client_ports[i]}",
                    extra_config=f'server_name: "s{i}"\ncluster {{ {cluster} }}',
                )
            )
        self.url = ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    async def start(self) -> None:
        await asyncio.gather(*(s.start() for s in self.servers))
        await self.until_jetstream()

    async def until_jetstream(self, within_s: float = 30.0) -> None:
        """Until the servers have elected JetStream's meta leader (an R3 bucket can be made)."""
        nc = await connect(self.url, name="brokers-check")
        try:
            async with asyncio.timeout(within_s):
                while True:
                    try:
                        await nc.jetstream().account_info()
                        return
                    except Exception:  # not ready yet (no meta leader): ask again
                        await asyncio.sleep(0.2)
        finally:
            await nc.close()

    async def leader_of(self, stream: str) -> int:
        nc = await connect(self.url, name="brokers-check")
        try:
            info = await nc.jetstream().stream_info(stream)
        finally:
            await nc.close()
        assert info.cluster is not None and info.cluster.leader is not None
        assert len(info.cluster.replicas or []) == SERVERS - 1  # three copies
        return int(info.cluster.leader.removeprefix("s"))

    def kill(self, i: int) -> None:
        pid = self.servers[i].pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers))


@pytest.fixture
async def brokers(tmp_path: Path) -> AsyncIterator[Brokers]:
    b = Brokers(tmp_path / "brokers")
    try:
        await b.start()
        yield b
    finally:
        await b.stop()


@pytest.mark.slow
async def test_a_broker_killed_under_load_loses_nothing(brokers: Brokers, tmp_path: Path) -> None:
    cluster = ProcessCluster(brokers.url, tmp_path)
    for config in cluster.configs.values():
        config.replicas = SERVERS
    cluster.configs["scheduler"].event_storage = "file"
    cluster.configs["scheduler"].policy, cluster.configs["scheduler"].params = "fifo", {}  # (no
    # preemptions of its own: each one would be the outage's)
    # As deployed: longer than the agents' lease, so an outage that ends before it (the clients
    # move to another server; a loaded machine takes 15 s or more) requeues nothing.
    cluster.configs["placement"].heartbeat_timeout_s = PlacementConfig().heartbeat_timeout_s
    async with cluster:
        ids = [f"h{i}" for i in range(8)]
        for job_id in ids[:4]:
            await cluster.submit_retrying(job_id)
        # The scheduler's bucket's leader: its copies elsewhere must carry on.
        victim = await brokers.leader_of(f"KV_gpuyard_{CLUSTER}_scheduler")
        brokers.kill(victim)
        for job_id in ids[4:6]:
            await cluster.submit_retrying(job_id)
        # The scheduler itself, killed and started again: it loads its jobs from a copy.
        cluster.kill("scheduler")
        await cluster.services.replace("scheduler")
        for job_id in ids[6:]:
            await cluster.submit_retrying(job_id)
        page = await cluster.until_all_ended(len(ids))
        _assert_exactly_once(cluster, page, ids)
        assert [j.preemptions for j in page.jobs] == [0] * len(ids)
        assert await brokers.leader_of(f"KV_gpuyard_{CLUSTER}_scheduler") != victim
        assert await brokers.leader_of(Subjects(CLUSTER).stream_name) in range(SERVERS)


def test_a_service_takes_its_replicas_from_the_command_line_within_bounds() -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "service", "scheduler", "--replicas", "7"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1].endswith(
        "bad configuration: Expected `int` <= 5 - at `$.replicas`"
    )


async def test_replicas_a_single_server_cannot_keep_are_one_line(
    nats_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "scheduler.json"
    config.write_text('{"durable": true, "clock": "wall"}')
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuyard.cli", "service", "scheduler", "--nats", nats_url,
        "--cluster", "one", "--config", str(config), "--replicas", "3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1 and "Traceback" not in err.decode()
    assert err.decode().splitlines()[-1] == (
        "gpuyard-scheduler: cannot make the key-value bucket gpuyard_one_scheduler with 3 "
        "replica(s): replicas > 1 not supported in non-clustered mode"
    )

"""deploy/'s configurations say what the README says they are (no Docker needed): the control plane's
are `gpuyard up`'s (wall clock, durable), the compose simulation's are `gpuyard sim`'s; every NATS
server config shipped requires gpuyard's credentials; and the containers' health check tells a live
service from a missing one."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuyard.cli_cluster import control_plane_configs
from gpuyard.embedded import nats_server_binary
from gpuyard.launcher import ServiceSet
from gpuyard.natsauth import OPERATOR, Credentials
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.shared.connection import NatsAuth, connect
from gpuyard.shared.model import ClusterSpec
from gpuyard.sim import SimOptions, service_configs

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
CONTROL_PLANE = ("admission", "placement", "scheduler")


def load(path: Path, expected: Any) -> Any:
    """The config file decoded as its service reads it (unknown fields are refused there too)."""
    return msgspec.json.decode(path.read_bytes(), type=type(expected))


@pytest.mark.parametrize("service", CONTROL_PLANE)
def test_the_control_plane_configs_are_gpuyard_ups(service: str) -> None:
    expected = control_plane_configs()[service]
    assert load(DEPLOY / "config" / f"{service}.json", expected) == expected


def test_the_scheduler_config_ticks_on_the_wall_clock_and_is_durable() -> None:
    scheduler = control_plane_configs()["scheduler"]
    config = load(DEPLOY / "config" / "scheduler.json", scheduler)
    assert (config.clock, config.durable) == ("wall", True)


def test_the_swap_scheduler_differs_only_in_its_policy() -> None:
    expected = control_plane_configs(policy="las")["scheduler"]
    assert load(DEPLOY / "config" / "scheduler-las.json", expected) == expected


def test_a_placement_without_a_config_bounds_its_node_commands() -> None:
    # `gpuyard service placement` with no --config decodes `{}`: a dead agent must cost it
    # seconds, as under `gpuyard up` (deploy/config/placement.json), not the connection's 120 s.
    bare = msgspec.json.decode(b"{}", type=PlacementConfig)
    up = control_plane_configs()["placement"]
    assert bare.command_timeout_s == up.command_timeout_s == 3.0
    assert bare.command_timeout_s < bare.heartbeat_timeout_s
    # Simulated nodes answer in virtual time: simulations keep awaiting every answer.
    sim = service_configs(SimOptions(cluster=ClusterSpec(groups=[])), Path("w.jsonl"))["placement"]
    assert sim.command_timeout_s is None and sim.simulated


@pytest.mark.parametrize("service", CONTROL_PLANE)
def test_the_compose_simulation_configs_are_gpuyard_sims(service: str) -> None:
    options = SimOptions(cluster=ClusterSpec(groups=[]))  # `gpuyard sim`'s defaults
    expected = service_configs(options, Path("workload.jsonl"))[service]
    assert load(DEPLOY / "config" / "sim" / f"{service}.json", expected) == expected


NATS_CONFIGS = sorted((DEPLOY / "nats").glob("*.conf"))


def test_there_are_nats_configs_to_check() -> None:
    assert NATS_CONFIGS, "deploy/nats/*.conf moved: point NATS_CONFIGS at the shipped configs"


@pytest.mark.parametrize("conf", NATS_CONFIGS, ids=lambda p: p.name)
async def test_a_shipped_nats_config_requires_credentials(conf: Path, tmp_path: Path) -> None:
    # Installed as the README says: the config as /etc/gpuyard/nats.conf beside the identities of
    # `gpuyard auth init --state-dir /etc/gpuyard/cluster`. Only the ports are ours (free ones).
    shutil.copy(conf, tmp_path / "nats.conf")
    creds = Credentials(tmp_path / "cluster", "demo")
    creds.init()
    server = await asyncio.create_subprocess_exec(
        nats_server_binary(), "-c", str(tmp_path / "nats.conf"), "-a", "127.0.0.1", "-p", "-1",
        "-m", "-1", "--store_dir", str(tmp_path / "js"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert server.stderr is not None
    log: list[str] = []
    try:
        async with asyncio.timeout(15):
            while line := (await server.stderr.readline()).decode():
                log.append(line)
                if "Listening for client connections on" in line:
                    break
        assert log and "Listening for" in log[-1], f"{conf.name} did not start:\n" + "".join(log)
        url = "nats://" + log[-1].rsplit(" ", 1)[1].strip()
        # Monitoring (it has no auth of its own), if any, on loopback only.
        monitors = [line.rsplit(" ", 1)[1] for line in log if "Starting http monitor on" in line]
        assert all(m.startswith("127.0.0.1:") for m in monitors), monitors
        with pytest.raises(Exception, match=r"[Aa]uthorization"):
            await connect(url, name="x", max_reconnect_attempts=0, allow_reconnect=False)
        nc = await connect(
            url, name="op", auth=NatsAuth.from_profile(creds.profile(OPERATOR)),
            max_reconnect_attempts=0, allow_reconnect=False,
        )  # fmt: skip
        await nc.close()
    finally:
        if server.returncode is None:
            server.terminate()
        await server.wait()


def healthcheck(url: str, *target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEPLOY / "healthcheck.py"), "--nats", url, "--cluster", "hc", *target],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


async def test_the_health_check_tells_a_live_service_from_a_missing_one(nats_url: str) -> None:
    missing = await asyncio.to_thread(healthcheck, nats_url, "scheduler")
    assert missing.returncode == 1
    assert missing.stderr.startswith("unhealthy: ") and "no service is listening" in missing.stderr
    assert "Traceback" not in missing.stderr
    async with ServiceSet(nats_url, "hc", {"scheduler": service_configs(
        SimOptions(cluster=ClusterSpec(groups=[])), Path("w.jsonl"))["scheduler"]}):  # fmt: skip
        live = await asyncio.to_thread(healthcheck, nats_url, "scheduler")
        node = await asyncio.to_thread(healthcheck, nats_url, "--node", "n1")
    assert live.returncode == 0, live.stderr
    assert node.returncode == 1 and "node.n1.ping" in node.stderr


def test_the_health_check_names_an_unreachable_server() -> None:
    result = healthcheck("nats://127.0.0.1:1", "scheduler")
    assert result.returncode == 1
    assert result.stderr.startswith("unhealthy: ") and len(result.stderr.splitlines()) == 1

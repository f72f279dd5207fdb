"""deploy/'s configurations say what docs/operations.md says they are (no Docker needed): the control plane's
are `gpuyard up`'s (wall clock, durable), the compose simulation's are `gpuyard sim`'s; every NATS
server config shipped requires gpuyard's credentials; the containers' health check tells a live
service from a missing one; and the image's Python is the one its pinned dependencies are for."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gpuyard.cli.cluster import control_plane_configs
from gpuyard.natsauth import OPERATOR, Credentials
from gpuyard.run.embedded import nats_server_binary
from gpuyard.run.launcher import ServiceSet
from gpuyard.run.simulate import SimOptions, service_configs
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.shared.connection import NatsAuth, connect
from gpuyard.shared.model import ClusterSpec

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
SHARED = ROOT.parent / "shared"
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


@pytest.mark.parametrize(("flags", "wait"), [([], True), (["--new-jobs-run"], False)])
def test_up_says_whether_a_new_job_waits_for_gavels_next_solve(
    flags: list[str], wait: bool
) -> None:
    from gpuyard.cli import build_parser
    from gpuyard.cli.cluster import control_plane_from_args

    table = SHARED / "data" / "gavel" / "simulation_throughputs.json"
    if not table.exists():
        pytest.skip("no ../shared/data beside the checkout")
    argv = ["up", "--policy", "max_min_fairness_perf", "--throughputs", str(table), *flags]
    args = build_parser().parse_args(argv)
    shares = control_plane_from_args(args)["scheduler"].time_shares
    assert (shares.new_jobs_wait, shares.min_resolve_s) == (wait, 1920.0)


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
    # Installed as docs/operations.md says: the config as /etc/gpuyard/nats.conf beside the identities of
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


DEBIAN_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}
"""The python3 of each Debian release that deploy/build-images.sh may bootstrap."""


def lock_python() -> str:
    """The Python deploy/requirements.lock was made for, from the header deploy/lock.py writes."""
    header = re.search(r"for Python (\d+\.\d+)\b", (DEPLOY / "requirements.lock").read_text())
    assert header, (
        "deploy/requirements.lock does not say its Python: refresh it with deploy/lock.py"
    )
    return header[1]


def test_the_images_python_is_the_locks() -> None:
    """Some pins hold on one Python only (numpy, contourpy): the default base of the Dockerfile and
    of both compose files, and the Debian base of build-images.sh, run the lock's Python."""
    python = lock_python()
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.findall(r"^ARG BASE=python:(\S+)-slim$", dockerfile, re.M) == [python]
    for compose in ("docker-compose.yml", "docker-compose.cluster.yml"):
        defaults = re.findall(r"GPUYARD_BASE:-python:([^-}]+)-slim", (DEPLOY / compose).read_text())
        assert defaults and set(defaults) == {python}, compose
    script = (DEPLOY / "build-images.sh").read_text()
    (release,) = re.findall(r"^BASE=gpuyard-base:(\w+)$", script, re.M)
    assert f'{release} "$rootfs"' in script  # the release debootstrap installs
    assert DEBIAN_PYTHON[release] == python


def test_the_locks_pins_are_the_tested_ones_for_its_python() -> None:
    """Each pin of deploy/requirements.lock is requirements-lock.txt's (what the tests run with) for
    the lock's Python on Linux: a lock made on another Python fails here."""
    python = lock_python()
    environment = {
        "python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
        "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
        "platform_python_implementation": "CPython", "platform_machine": "x86_64",
    }  # fmt: skip
    tested: dict[str, str] = {}
    for line in (ROOT / "requirements-lock.txt").read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(environment):
                (spec,) = req.specifier
                tested[canonicalize_name(req.name)] = spec.version
    pins = [
        Requirement(line)
        for line in (DEPLOY / "requirements.lock").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert pins
    for pin in pins:
        (spec,) = pin.specifier
        assert (spec.operator, spec.version) == ("==", tested.get(canonicalize_name(pin.name))), pin

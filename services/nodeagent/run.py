"""Running a node agent: its command-line options and its main loop."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
from pathlib import Path

import msgspec

from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.endpoints import Subjects
from gpuyard.shared.model import Name

from .service import NodeAgent, NodeAgentConfig


def default_state_dir() -> Path:
    """/var/lib/gpuyard as root (systemd), else ~/.local/state/gpuyard."""
    if os.geteuid() == 0:
        return Path("/var/lib/gpuyard")
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "gpuyard"


def default_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def add_agent_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS server URL")
    p.add_argument("--cluster", default="default", help="cluster namespace")
    p.add_argument(
        "--node-id", default=socket.gethostname().split(".")[0], help="default: the host name"
    )
    p.add_argument("--gpus", type=int, help="GPUs to offer where NVML is absent (no GPU here)")
    p.add_argument("--gpu-type", help="GPU type name (default: from the NVML model, or 'gpu')")
    p.add_argument("--no-nvml", action="store_true", help="ignore NVML; use --gpus")
    p.add_argument("--address", help="address other nodes reach this one at (default: resolved)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds from SIGTERM to SIGKILL")
    p.add_argument("--heartbeat", type=float, default=1.0, help="seconds between heartbeats")
    p.add_argument("--state-dir", type=Path, help="job logs go to STATE_DIR/logs")
    p.add_argument(
        "--checkpoint-root",
        type=Path,
        default=os.environ.get("GPUYARD_CHECKPOINT_ROOT"),
        help="shared folder for checkpoints (default $GPUYARD_CHECKPOINT_ROOT or STATE_DIR/checkpoints)",
    )
    p.add_argument("--label", action="append", default=[], help="KEY=VALUE node label")
    p.add_argument("--log-level", default="info")


def config_from_args(args: argparse.Namespace) -> NodeAgentConfig:
    """Raises ValueError with a clear message on bad options."""
    try:
        msgspec.convert(args.node_id, Name)
    except msgspec.ValidationError:
        raise ValueError(
            f"--node-id {args.node_id!r} must match {Name.__metadata__[0].pattern}"
        ) from None
    if "." in args.node_id:
        raise ValueError(f"--node-id {args.node_id!r} must not contain '.'")
    if args.gpus is not None and args.gpus < 0:
        raise ValueError(f"--gpus must be >= 0, not {args.gpus}")
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--label {item!r} is not KEY=VALUE")
        labels[key] = value
    state = args.state_dir or default_state_dir()
    return NodeAgentConfig(
        node_id=args.node_id, gpus=args.gpus, gpu_type=args.gpu_type,
        address=args.address or default_address(), use_nvml=not args.no_nvml,
        heartbeat_s=args.heartbeat, grace_s=args.grace, log_dir=str(state / "logs"),
        checkpoint_root=str(args.checkpoint_root or state / "checkpoints"), labels=labels,
    )  # fmt: skip


async def run_agent(url: str, cluster: str, config: NodeAgentConfig) -> None:
    """Run until SIGTERM or SIGINT, then stop the jobs (they checkpoint) and leave."""
    agent: NodeAgent | None = None

    async def reconnected() -> None:
        if agent is not None:
            await agent.on_reconnect()

    nc = await connect(url, name=f"gpuyard-node-{config.node_id}", reconnected_cb=reconnected)
    agent = NodeAgent(Bus(nc, Subjects(cluster)), config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await agent.start()
    await stop.wait()
    await agent.stop()


def main(argv: list[str] | None = None) -> int:

    parser = argparse.ArgumentParser(prog="gpuyard nodeagent", description=__doc__)
    add_agent_args(parser)
    args = parser.parse_args(argv)
    return run_from_args(args, parser)


def run_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import uvloop

    from gpuyard.shared.logs import configure_logging

    configure_logging(args.log_level)
    try:
        config = config_from_args(args)
        Subjects(args.cluster)
    except (ValueError, msgspec.ValidationError) as exc:
        parser.error(str(exc))
    try:
        uvloop.run(run_agent(args.nats, args.cluster, config))
    except ValueError as exc:  # no GPUs found and none given
        parser.exit(2, f"gpuyard nodeagent: {exc}\n")
    return 0

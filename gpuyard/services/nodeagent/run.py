"""Running a node agent: its command-line options and its main loop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import nats
import structlog

from gpuyard.shared.connection import (
    Bus,
    NatsAuth,
    TlsFailure,
    add_nats_arguments,
    connect,
    resolve_connection,
)
from gpuyard.shared.endpoints import Subjects
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import NAME_PATTERN, Name
from gpuyard.shared.options import key_values

from .accounts import JobAccounts
from .procs import Places
from .service import NodeAgent, NodeAgentConfig, job_accounts


def default_state_dir() -> Path:
    """/var/lib/gpuyard as root (systemd), else ~/.local/state/gpuyard."""
    if os.geteuid() == 0:
        return Path("/var/lib/gpuyard")
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "gpuyard"


def default_node_id() -> str:
    return socket.gethostname().split(".")[0]


def default_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def add_agent_args(p: argparse.ArgumentParser) -> None:
    add_nats_arguments(p, url_default="nats://127.0.0.1:4222", cluster_default="default")
    p.add_argument(
        "--node-id", help="default: the credentials' node (a node profile), else the host name"
    )
    p.add_argument("--gpus", type=int, help="GPUs to offer where NVML is absent (no GPU here)")
    p.add_argument("--gpu-type", help="GPU type name (default: from the NVML model, or 'gpu')")
    p.add_argument("--no-nvml", action="store_true", help="ignore NVML; use --gpus")
    p.add_argument("--address", help="address other nodes reach this one at (default: resolved)")
    p.add_argument("--grace", type=float, default=30.0, help="seconds from SIGTERM to SIGKILL")
    p.add_argument("--heartbeat", type=float, default=1.0, help="seconds between heartbeats")
    p.add_argument(
        "--lease", type=float, default=60.0,
        help="seconds without an answer from the control plane after which the agent stops its "
        "jobs (fencing); placement's heartbeat timeout must exceed it plus --grace",
    )  # fmt: skip
    p.add_argument("--state-dir", type=Path, help="job logs go to STATE_DIR/logs/<cluster>")
    p.add_argument(
        "--checkpoint-root",
        type=Path,
        default=os.environ.get("GPUYARD_CHECKPOINT_ROOT"),
        help="shared folder for checkpoints (default $GPUYARD_CHECKPOINT_ROOT or STATE_DIR/checkpoints)",
    )
    p.add_argument("--label", action="append", default=[], help="KEY=VALUE node label")
    jobs = p.add_argument_group(
        "who jobs run as",
        "never root, never the agent's account; an agent that is not root cannot switch accounts",
    )
    jobs.add_argument(
        "--job-user", default="", metavar="ACCOUNT",
        help="the Unix account jobs run as (default: gpuyard-job where it exists, else nobody)",
    )  # fmt: skip
    jobs.add_argument(
        "--map-user", action="append", default=[], metavar="USER=ACCOUNT",
        help="run the jobs of submitter USER (alice, op.admin) as Unix ACCOUNT, as Slurm runs a "
        "job as its submitter (repeatable)",
    )  # fmt: skip
    jobs.add_argument(
        "--jobs-as-agent-user", action="store_true",
        help="an agent that is not root: run jobs as the agent's own account, which lets them "
        "read this node's credentials (for a machine whose every submitter may act as this node)",
    )  # fmt: skip
    jobs.add_argument(
        "--protect", action="append", default=[], metavar="PATH",
        help="a control plane's state (file or folder) on this machine that no job may read: the "
        "agent refuses to start if a job account could (repeatable; `gpuyard nodeagent` adds "
        "/etc/gpuyard/cluster and the default `gpuyard up` state directory of --cluster)",
    )  # fmt: skip
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")


def config_from_args(args: argparse.Namespace) -> NodeAgentConfig:
    """Raises ValueError with a clear message on bad options."""
    try:
        msgspec.convert(args.node_id, Name)
    except msgspec.ValidationError:
        raise ValueError(f"--node-id {args.node_id!r} must match {NAME_PATTERN}") from None
    if "." in args.node_id:
        raise ValueError(f"--node-id {args.node_id!r} must not contain '.'")
    if args.gpus is not None and args.gpus < 0:
        raise ValueError(f"--gpus must be >= 0, not {args.gpus}")
    if not args.heartbeat > 0:
        raise ValueError(f"--heartbeat must be > 0 seconds, not {args.heartbeat}")
    if not args.grace >= 0:
        raise ValueError(f"--grace must be >= 0 seconds, not {args.grace}")
    if not 0 < args.lease < math.inf:
        raise ValueError(f"--lease must be > 0 seconds, not {args.lease}")
    labels = key_values("--label", args.label)
    accounts = key_values("--map-user", args.map_user)
    # Absolute: a job's processes start in their own directory (the submitter's) and find their
    # checkpoints and progress file by these paths.
    state = Path(args.state_dir or default_state_dir()).expanduser().absolute()
    checkpoints = Path(args.checkpoint_root or state / "checkpoints").expanduser().absolute()
    return NodeAgentConfig(
        node_id=args.node_id, gpus=args.gpus, gpu_type=args.gpu_type,
        address=args.address or default_address(), use_nvml=not args.no_nvml,
        heartbeat_s=args.heartbeat, grace_s=args.grace, log_dir=str(state / "logs"),
        checkpoint_root=str(checkpoints), labels=labels, lease_s=args.lease,
        job_user=args.job_user, user_accounts=accounts, jobs_as_agent_user=args.jobs_as_agent_user,
        credentials=credential_files(args), control_planes=[str(Path(p).absolute()) for p in args.protect],
    )  # fmt: skip


def credential_files(args: argparse.Namespace) -> list[str]:
    """The files that hold the agent's secrets: its profile, and the seed, creds and TLS key
    files it names (a PEM given inline is in the profile)."""
    auth = NatsAuth.from_args(args)
    named = [getattr(args, "nats_config", None), auth.creds, auth.nkey_seed, auth.tls_key]
    return [str(Path(f).absolute()) for f in named if f and not f.lstrip().startswith("-----")]


class ConnectionAttempts:
    """The agent's NATS connection callbacks: each failed attempt to reach the server (at start or
    after losing it) is one log line, and the next attempt waits twice as long, up to `max_s`; a
    systemd service keeps trying until the server is back."""

    def __init__(self, url: str, first_s: float = 0.5, max_s: float = 30.0) -> None:
        self.log = structlog.get_logger().bind(url=url)
        self.first_s = first_s
        self.max_s = max_s
        self.pause_s = first_s
        self.attempt = 0
        self.connected = False
        self.on_reconnect: Callable[[], Awaitable[None]] | None = None
        self.on_refused: Callable[[str], None] | None = None
        """Called when the server refuses our credentials (revoked): the agent fences."""
        self.closed = asyncio.Event()

    async def error(self, exc: Exception) -> None:
        text = str(exc) or type(exc).__name__
        if self.on_refused is not None and (
            isinstance(exc, nats.errors.AuthorizationError) or "authorization" in text.lower()
        ):
            self.on_refused(f"credentials refused by the server ({text})")
        if self.connected:  # an error on a working connection (e.g. a permission denied)
            self.log.warning("nats.error", error=text)
            return
        self.attempt += 1
        self.log.warning(
            "nats.unreachable", attempt=self.attempt, error=text, retry_in_s=self.pause_s
        )
        await asyncio.sleep(self.pause_s)  # nats-py tries again when this returns
        self.pause_s = min(2 * self.pause_s, self.max_s)

    async def up(self) -> None:
        if self.attempt:
            self.log.info("nats.connected", attempts=self.attempt + 1)
        self.connected, self.attempt, self.pause_s = True, 0, self.first_s

    async def reconnected(self) -> None:
        await self.up()
        if self.on_reconnect is not None:
            await self.on_reconnect()

    async def disconnected(self) -> None:
        if self.connected:
            self.log.warning("nats.disconnected")
        self.connected = False

    async def on_closed(self) -> None:
        """The client gave up the connection for good (the server refused our credentials)."""
        self.closed.set()


async def run_agent(
    url: str, cluster: str, config: NodeAgentConfig, auth: NatsAuth | None = None,
    accounts: JobAccounts | None = None,
) -> None:  # fmt: skip
    """Run until SIGTERM or SIGINT, then stop the jobs (they checkpoint) and leave; a signal while
    the server is still out of reach ends the attempts."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Back soon after an outage shorter than the lease: retries at most a twentieth of it apart
    # (3 s by default).
    attempts = ConnectionAttempts(url, max_s=min(30.0, max(config.lease_s / 20, 0.5)))
    connecting = asyncio.ensure_future(
        connect(  # the pause between attempts is `attempts.error`'s
            url,
            name=f"gpuyard-node-{config.node_id}",
            auth=auth,
            error_cb=attempts.error,
            reconnected_cb=attempts.reconnected,
            disconnected_cb=attempts.disconnected,
            closed_cb=attempts.on_closed,
            reconnect_time_wait=0,
        )
    )
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([connecting, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await connecting
        return
    nc = connecting.result()
    await attempts.up()
    agent = NodeAgent(Bus(nc, Subjects(cluster)), config, accounts)
    attempts.on_reconnect = agent.on_reconnect
    attempts.on_refused = agent.fence
    await agent.start()
    closed = asyncio.ensure_future(attempts.closed.wait())
    await asyncio.wait([stopping, closed], return_when=asyncio.FIRST_COMPLETED)
    if stopping.done():
        closed.cancel()
        await agent.stop()
        return
    # No connection and none to come: stop the jobs, and leave (systemd starts a fresh agent).
    agent.fence(f"connection closed by the server ({nc.last_error or 'no reason given'})")
    await agent.halt()
    raise SystemExit(1)


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
        if not hasattr(args, "nats_profile"):  # (`gpuyard nodeagent` resolved it already)
            resolve_connection(args)
        auth = NatsAuth.from_args(args)
        if args.node_id is None:
            own = auth.caller if auth.identity else None
            args.node_id = own.name if own and own.role == "node" else default_node_id()
        config = config_from_args(args)
        Subjects(args.cluster)
        places = Places(Path(config.log_dir), Path(config.checkpoint_root), args.cluster)
        accounts = job_accounts(config, places)
        if auth.identity is not None and auth.caller != Caller("node", config.node_id):
            raise ValueError(
                f"the credentials are {auth.identity!r}, not node.{config.node_id}: give the "
                f"node's own (gpuyard auth add-node {config.node_id}), or --node-id"
            )
    except (ValueError, msgspec.ValidationError) as exc:
        parser.error(str(exc))
    try:
        uvloop.run(run_agent(args.nats, args.cluster, config, auth, accounts))
    except ValueError as exc:  # no GPUs found and none given
        parser.exit(2, f"gpuyard nodeagent: {exc}\n")
    except TlsFailure as exc:  # (trying again would not help: systemd's restarts say it again)
        parser.exit(1, f"gpuyard nodeagent: cannot connect to NATS: {exc}\n")
    return 0

"""A container's health: does its gpuyard service (or node agent) answer a ping over NATS?

    python healthcheck.py --nats nats://nats:4222 --cluster demo scheduler
    python healthcheck.py --nats nats://nats:4222 --cluster demo --node n1

Exit status 0 when it answers within two seconds, 1 (with one line saying why) otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from gpuyard.shared.connection import (
    Bus,
    NatsAuth,
    add_nats_arguments,
    connect,
    resolve_connection,
)
from gpuyard.shared.contract import Ping
from gpuyard.shared.endpoints import PING, SERVICE_TOKENS, Subjects
from gpuyard.shared.errors import RemoteError


async def quiet(_: Exception) -> None:
    """Connection errors end in the exception `connect` raises; no tracebacks on the way."""


async def ping(args: argparse.Namespace) -> None:
    subjects = Subjects(args.cluster)
    token = f"node.{args.node}" if args.node else SERVICE_TOKENS[args.service]
    # One attempt (nats-py's max_reconnect_attempts=0 would mean "forever"); the error is raised.
    auth = NatsAuth.from_args(args)
    nc = await connect(
        args.nats, name="gpuyard-healthcheck", auth=auth, connect_timeout=2,
        max_reconnect_attempts=1, reconnect_time_wait=0.1, error_cb=quiet,
    )  # fmt: skip
    bus = Bus(nc, subjects, caller=auth.caller)
    try:
        await bus.call(PING, Ping(), within_s=2.0, svc=token)
    finally:
        await bus.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="healthcheck", description=__doc__)
    add_nats_arguments(parser, url_default="nats://127.0.0.1:4222", cluster_default="default")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("service", nargs="?", choices=["admission", "scheduler", "placement"])
    target.add_argument("--node", help="a node agent's id")
    args = parser.parse_args()
    try:
        resolve_connection(args)
        asyncio.run(ping(args))
    except (RemoteError, OSError, TimeoutError, ValueError) as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # nats' NoServersError and kin
        print(f"unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Command-line options every `gpuyard` command that talks to NATS shares.

`add_nats_options(parser)` adds `--nats URL`, `--cluster NAME` and the `--nats-*` identity and TLS
options (user/password, token, creds file, NKey seed, CA/cert/key); `open_bus(args, name)` connects
with them. The options themselves are defined once in `gpuyard.shared.connection.add_nats_arguments`, which
the services' own entry points use too.
"""

from __future__ import annotations

import argparse
import os
import sys

from gpuyard.shared.connection import Bus, NatsAuth, add_nats_arguments, connect
from gpuyard.shared.endpoints import Subjects

DEFAULT_URL = "nats://127.0.0.1:4222"


def add_nats_options(
    parser: argparse.ArgumentParser, *, url_default: str | None = DEFAULT_URL,
    cluster: bool = True,
) -> None:  # fmt: skip
    """`--nats`, `--nats-*` and (unless `cluster=False`) `--cluster` (default $GPUYARD_CLUSTER or 'default')."""
    add_nats_arguments(parser, url_default=url_default)
    if cluster:
        parser.add_argument(
            "--cluster",
            default=os.environ.get("GPUYARD_CLUSTER", "default"),
            help="cluster namespace (default $GPUYARD_CLUSTER or 'default')",
        )


def nats_auth(args: argparse.Namespace) -> NatsAuth:
    return NatsAuth.from_args(args)


async def open_bus(args: argparse.Namespace, name: str, *, request_timeout: float = 10.0) -> Bus:
    """Connect to `args.nats` with the `--nats-*` options; a Bus for `args.cluster`."""
    seen: set[str] = set()

    async def report(exc: Exception) -> None:  # one line per distinct error, no tracebacks
        text = str(exc) or type(exc).__name__
        if text not in seen:
            seen.add(text)
            print(f"{name}: {text}", file=sys.stderr)

    nc = await connect(
        args.nats, name=name, auth=nats_auth(args), connect_timeout=5, max_reconnect_attempts=2,
        error_cb=report,
    )  # fmt: skip
    return Bus(nc, Subjects(args.cluster), request_timeout=request_timeout)

"""The `gpuyard` command: a module per group of subcommands (`sim`: simulations and traces,
`cluster`: a real cluster and its jobs, `ops`: tail, policy, status and node drains,
`auth`, `sweep`), `options` for what they share."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import cast

from gpuyard.cli.acct import add_acct_parser
from gpuyard.cli.auth import add_auth_parser
from gpuyard.cli.cluster import add_cluster_parsers
from gpuyard.cli.ops import add_ops_parsers
from gpuyard.cli.options import CommandError, OneLineParser, resolve_options
from gpuyard.cli.sim import add_sim_parser, add_trace_parser
from gpuyard.cli.sweep import add_sweep_parsers
from gpuyard.shared.roster import BY_NAME, SERVICES


def cmd_schema(args: argparse.Namespace) -> int:
    from gpuyard.shared.contract import CONTRACT_VERSION, json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if args.write:
        # (a source checkout's, installed editable: a Path, where a Traversable need not write)
        folder = cast(Path, files("gpuyard.shared") / "schema")
        (folder / f"contract-v{CONTRACT_VERSION}.json").write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_service(args: argparse.Namespace) -> int:
    from gpuyard.shared.service import run_service

    entry = BY_NAME[args.name]
    run_service(entry.service_class(), entry.config_class(), args.rest)
    return 0


def build_parser() -> OneLineParser:
    """The `gpuyard` command's parser, every subcommand in it."""
    parser = OneLineParser(prog="gpuyard", description="Schedule deep-learning training jobs on GPU "
                           "clusters: simulate policies, or run a real cluster.")  # fmt: skip
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    add_sim_parser(sub)
    add_trace_parser(sub)
    add_cluster_parsers(sub)
    add_acct_parser(sub)
    add_ops_parsers(sub)
    add_auth_parser(sub)
    add_sweep_parsers(sub)
    p = sub.add_parser("schema", help="print (or --write) the wire contract's JSON Schema")
    p.add_argument("--write", action="store_true", help="write it into gpuyard.shared's schema/")
    p.set_defaults(run=cmd_schema)
    p = sub.add_parser("service", help=f"run one service ({', '.join(SERVICES)})")
    p.add_argument("name", choices=SERVICES)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="--nats URL --cluster NAME --config FILE")
    p.set_defaults(run=cmd_service)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    # asyncio's notes on a TLS peer that hung up ("returning true from eof_received() ...") are
    # not the user's business: the command says in one line what failed.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    # A SIGCHLD blocked by whoever started us would hide our children's exits from the event loop.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    try:
        resolve_options(args)
    except CommandError as exc:
        print(f"gpuyard: {exc}", file=sys.stderr)
        return exc.code
    run: Callable[[argparse.Namespace], int] = args.run  # (set by each subcommand's parser)
    return run(args)

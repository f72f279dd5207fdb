"""`gpuyard auth`: the cluster's identities (gpuyard/natsauth.py), managed on the control machine.

    gpuyard auth init      [--cluster C] [--state-dir D] [--node ID ...] [--user NAME ...]
                           [--simulation]
                           operator + services (+ these), those missing only (`up` does it too);
                           the simclock's only with --simulation
    gpuyard auth add-node  ID [--out FILE]                 a node agent's credentials
    gpuyard auth add-user  NAME [--operator] [--out FILE]  a submitter's (or an operator's)
    gpuyard auth remove    ROLE.NAME                       revoke an identity
    gpuyard auth list

Each new identity gets a profile (mode 600) to hand to its owner: `gpuyard nodeagent
--nats-config node.n3.json`. A running `gpuyard up` on the same state directory reads the new
users at once (SIGHUP); a server of its own (systemd) needs `systemctl reload nats-server`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from gpuyard.cli.options import CommandError, Subcommands


def add_auth_parser(sub: Subcommands) -> None:
    p = sub.add_parser("auth", help="the cluster's identities: nodes, users, operators")
    asub = p.add_subparsers(required=True, metavar="ACTION")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        a = asub.add_parser(name, help=help, description=help)
        a.add_argument("--cluster", default="default", help="cluster namespace (default 'default')")
        a.add_argument(
            "--state-dir", type=Path, help="where `gpuyard up` keeps them (default "
            "$XDG_DATA_HOME/gpuyard/<cluster>)",
        )  # fmt: skip
        a.set_defaults(run=lambda args: run_auth(args, name))
        return a

    a = action("init", "create the operator's and the services' identities, those missing only")
    a.add_argument("--node", action="append", default=[], help="a node's too (repeatable)")
    a.add_argument("--user", action="append", default=[], help="a submitter's too (repeatable)")
    a.add_argument(
        "--simulation", action="store_true",
        help="for a simulation's services (deploy/docker-compose.yml): the simclock's identity "
        "too, which may drive every service (a real cluster has none: without this option, one "
        "there is removed)",
    )  # fmt: skip
    a = action("add-node", "issue a node agent's credentials (it can act only as that node)")
    a.add_argument("name", metavar="ID", help="the node id")
    a.add_argument("--out", type=Path, help="also write the profile here")
    a = action("add-user", "issue a submitter's credentials (or an operator's)")
    a.add_argument("name", metavar="NAME")
    a.add_argument("--operator", action="store_true", help="an operator, not a submitter")
    a.add_argument("--out", type=Path, help="also write the profile here")
    a = action("remove", "revoke an identity (ROLE.NAME, e.g. node.n3)")
    a.add_argument("name", metavar="ROLE.NAME")
    action("list", "the identities and their profiles")


def run_auth(args: argparse.Namespace, action: str) -> int:
    try:
        return _run(args, action)
    except (CommandError, ValueError, OSError) as exc:
        print(f"gpuyard auth {action}: {exc}", file=sys.stderr)
        return getattr(exc, "code", 1)


def _run(args: argparse.Namespace, action: str) -> int:
    from gpuyard.natsauth import Credentials, default_state_dir
    from gpuyard.shared.identity import Caller, Role

    state = (args.state_dir or default_state_dir(args.cluster)).expanduser().resolve()
    creds = Credentials(state, args.cluster)
    if action == "init":
        more = [Caller("node", n) for n in args.node] + [Caller("user", u) for u in args.user]
        new = creds.init(more, simulation=args.simulation)
        print(f"{'created' if new else 'already there'}: {state}")
        print(f"the server's users: include {creds.users_conf} in its config")
        return 0
    if action == "list":
        for identity in creds.index().identities:
            path = creds.profile_path(Caller.parse(identity.identity))
            print(
                f"{identity.identity:<24} {identity.public_key}  {path if path.exists() else '-'}"
            )
        return 0
    if action == "remove":
        creds.remove(Caller.parse(args.name))
        print(f"removed {args.name}")
    else:
        role: Role = "node" if action == "add-node" else "op" if args.operator else "user"
        caller = Caller(role, args.name)
        path = creds.add(caller)
        if args.out is not None:
            shutil.copyfile(path, args.out)
            args.out.chmod(0o600)
            path = args.out
        print(f"{caller.token}: {path} (secret: hand it to its owner only, mode 600)")
        if role == "node":
            print(f"  on the node: gpuyard nodeagent --nats-config {path.name}")
    told = creds.reload_server()
    print(
        "the running server took the change"
        if told
        else "restart or reload the server to take the change (systemctl reload nats-server)"
    )
    return 0

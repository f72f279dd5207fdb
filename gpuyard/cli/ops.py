"""`gpuyard` commands for operators: events, status, policies, draining nodes.

    gpuyard tail   [--job ID] [--node N] [--type T] [--since 10m | --all | --new] [--follow] [--json]
    gpuyard policy show
    gpuyard policy set SERVICE POLICY [--param K=V ...]
    gpuyard status [--json]
    gpuyard drain  NODE [NODE...] --reason TEXT
    gpuyard resume NODE [NODE...]

Each takes `--nats URL --cluster NAME` and the `--nats-*` credential and TLS options (gpuyard.cli.options).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from functools import partial
from typing import Any, get_args

import msgspec

from gpuyard.cli.options import Subcommands, add_nats_options, run_on_bus
from gpuyard.shared.connection import Bus
from gpuyard.shared.contract import DrainRequest, EventType
from gpuyard.shared.endpoints import DRAIN
from gpuyard.shared.policy import parse_params
from gpuyard.shared.roster import CONTROL_PLANE, SERVICE_TOKENS


def add_ops_parsers(sub: Subcommands) -> None:
    """Register the operations subcommands."""
    add_tail_parser(sub)
    add_policy_parser(sub)
    add_status_parser(sub)
    add_queues_parser(sub)
    add_drain_parsers(sub)


# --------------------------------------------------------------------------- tail


def add_tail_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "tail", help="print a cluster's events (live or stored)",
        description="Read the cluster's JetStream event stream; --follow keeps going until Ctrl-C.",
    )  # fmt: skip
    add_nats_options(p)
    p.add_argument("--job", help="only this job's events")
    p.add_argument("--node", help="only this node's events (node events, jobs' GPUs there)")
    p.add_argument(
        "--type", action="append", default=[], dest="types", metavar="TYPE",
        help="event type, wildcards allowed: job.started, job.*, node.> (repeatable)",
    )  # fmt: skip
    when = p.add_mutually_exclusive_group()
    when.add_argument("--since", help="from this long ago (10m, 2h, 1d) or an ISO time")
    when.add_argument("--all", action="store_true", help="every stored event (the default)")
    when.add_argument("--new", action="store_true", help="only events from now on")
    p.add_argument("--follow", "-f", action="store_true", help="wait for new events until Ctrl-C")
    p.add_argument("--json", action="store_true", help="JSON lines instead of text")
    p.set_defaults(run=cmd_tail)


def cmd_tail(args: argparse.Namespace) -> int:
    from gpuyard.ops import follow_events, format_event, matches, parse_since, read_events
    from gpuyard.ops import unknown_event_types as unknown_types

    try:
        start: Any = parse_since(args.since) if args.since else ("new" if args.new else "all")
    except ValueError as exc:
        print(f"gpuyard tail: {exc}", file=sys.stderr)
        return 2
    if unknown := unknown_types(args.types):
        print(
            f"gpuyard tail: --type {unknown[0]!r} matches no event type; types: "
            f"{', '.join(get_args(EventType))} (wildcards: job.*, node.>)",
            file=sys.stderr,
        )
        return 2

    async def body(bus: Bus) -> int:
        if args.follow:
            events = follow_events(
                bus.nc, partial(reconnect, args), bus.subjects, types=args.types, start=start,
                on_lost=lost,
            )  # fmt: skip
        else:
            events = read_events(bus.nc, bus.subjects, types=args.types, start=start)
        async for stored in events:
            if not matches(stored, job=args.job, node=args.node):
                continue
            line = json.dumps(stored.to_builtins()) if args.json else format_event(stored)
            print(line, flush=args.follow)
        sys.stdout.flush()  # a closed pipe shows here, inside the command, not at exit
        return 0

    return run_on_bus("tail", args, body, reports_loss=args.follow)


def lost(last: int | None) -> None:
    after = f" after #{last}" if last else ""
    print(f"gpuyard tail: lost the connection to NATS; resuming{after} once it is back",
          file=sys.stderr, flush=True)  # fmt: skip


async def reconnect(args: argparse.Namespace) -> Any:
    """A new connection for `tail --follow`, trying until the server is back (or Ctrl-C)."""
    from gpuyard.cli.options import reopen_bus

    return (await reopen_bus(args, "gpuyard-tail")).nc


# --------------------------------------------------------------------------- policy


def add_policy_parser(sub: Subcommands) -> None:
    p = sub.add_parser("policy", help="show or swap the services' policies at runtime")
    psub = p.add_subparsers(required=True, metavar="ACTION")
    show = psub.add_parser("show", help=f"the active policies of {', '.join(CONTROL_PLANE)}")
    add_nats_options(show)
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=cmd_policy_show)
    s = psub.add_parser(
        "set", help="swap a service's policy; it makes the next decision",
        description="Swap a running service's policy. Bad names or parameters leave the old one.",
    )  # fmt: skip
    add_nats_options(s)
    s.add_argument("service", choices=CONTROL_PLANE)
    s.add_argument("policy", help="a registered policy name (see `policy show`)")
    s.add_argument("--param", action="append", default=[], help="KEY=VALUE (repeatable)")
    s.add_argument("--queues", metavar="FILE", help="the kueue policy's queues file")
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_policy_set)


def _policy_line(service: str, info: Any) -> str:
    if isinstance(info, str):
        return f"{service:<10} (no answer: {info})"
    params = " ".join(f"{k}={v}" for k, v in info.params.items())
    return f"{service:<10} {info.policy or '-'} {params}".rstrip()


async def _policy_show(args: argparse.Namespace, bus: Bus) -> int:
    from gpuyard.ops import show_policies

    infos = await show_policies(bus)
    if args.json:
        print(
            json.dumps(
                {s: i if isinstance(i, str) else msgspec.to_builtins(i) for s, i in infos.items()}
            )
        )
    else:
        for service, info in infos.items():
            print(_policy_line(service, info))
    return 0 if all(not isinstance(i, str) for i in infos.values()) else 1


async def _policy_set(args: argparse.Namespace, bus: Bus) -> int:
    from gpuyard.ops import set_policy

    info = await set_policy(bus, args.service, args.policy, args.params)
    if args.json:
        print(json.dumps(msgspec.to_builtins(info)))
    else:
        print(
            f"{args.service}: {info.previous} -> {_policy_line(args.service, info).split(None, 1)[1]}"
        )
    return 0


def cmd_policy_show(args: argparse.Namespace) -> int:
    return run_on_bus("policy show", args, partial(_policy_show, args))


def cmd_policy_set(args: argparse.Namespace) -> int:
    args.params = parse_params(args.param)
    if args.queues is not None:  # (read and checked here: a mistake never reaches the cluster)
        from gpuyard.policies.kueue import queue_params

        try:
            if args.policy != "kueue":
                raise ValueError("--queues gives the kueue policy its queues")
            args.params |= queue_params(args.queues)
        except (OSError, ValueError) as exc:
            print(f"gpuyard policy set: {exc}", file=sys.stderr)
            return 2
    return run_on_bus("policy set", args, partial(_policy_set, args))


# --------------------------------------------------------------------------- status


def add_status_parser(sub: Subcommands) -> None:
    p = sub.add_parser("status", help="services, versions, policies, queue and nodes of a cluster")
    add_nats_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_status)


async def _status(args: argparse.Namespace, bus: Bus) -> int:
    from gpuyard.ops import cluster_status, format_status

    status = await cluster_status(bus)
    if args.json:
        print(msgspec.json.encode(status).decode())
    else:
        print("\n".join(format_status(status)))
    return 0 if any(s.up for s in status.services) else 1


def cmd_status(args: argparse.Namespace) -> int:
    return run_on_bus("status", args, partial(_status, args))


# --------------------------------------------------------------------------- drain, resume


def add_drain_parsers(sub: Subcommands) -> None:
    p = sub.add_parser(
        "drain", help="nodes take no new jobs; those running there go on (operators)",
        description="As Slurm's `scontrol update nodename=N state=drain reason=...`: `gpuyard "
        "nodes` shows each DRAIN while jobs still run there, DRAINED once none does.",
    )  # fmt: skip
    add_nats_options(p)
    p.add_argument("node_ids", nargs="+", metavar="NODE", help="as `gpuyard nodes` names it")
    p.add_argument("--reason", required=True, type=_reason, help="why (shown by `gpuyard nodes`)")
    p.set_defaults(run=cmd_drain)
    r = sub.add_parser("resume", help="drained nodes take jobs again (operators)")
    add_nats_options(r)
    r.add_argument("node_ids", nargs="+", metavar="NODE", help="as `gpuyard nodes` names it")
    r.set_defaults(run=cmd_resume)


def _reason(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must say why")
    return text.strip()


def cmd_drain(args: argparse.Namespace) -> int:
    request = DrainRequest(node_ids=args.node_ids, reason=args.reason)
    return run_on_bus("drain", args, partial(_drain, request, "draining", "drained"))


def cmd_resume(args: argparse.Namespace) -> int:
    request = DrainRequest(node_ids=args.node_ids, resume=True)
    return run_on_bus("resume", args, partial(_drain, request, "resumed", "resumed"))


async def _drain(request: DrainRequest, done: str, refused: str, bus: Bus) -> int:
    """`draining a` per node done, `not drained b: why` on stderr per node refused; 1 if any was."""
    reply = await bus.call(DRAIN, request)
    for node_id in reply.done:
        print(f"{done} {node_id}")
    for node_id, why in reply.refused.items():
        print(f"not {refused} {node_id}: {why}", file=sys.stderr)
    return 1 if reply.refused else 0


# --------------------------------------------------------------------------- queues


def add_queues_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "queues", help="the kueue policy's queues: quota, GPUs held and borrowed, jobs waiting",
        description="Each queue of the scheduler's kueue policy: its cohort, its quota and the "
        "GPUs its jobs hold per GPU type (borrowed: held beyond the quota), and its jobs running "
        "and waiting.",
    )  # fmt: skip
    add_nats_options(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_queues)


def queue_rows(queues: Any, records: list[Any]) -> list[dict[str, Any]]:
    """A row per queue of `queues` (the kueue policy's parameters) from the jobs not ended: the
    GPUs its jobs hold, borrow beyond its quota and lend (of its quota, what other queues of its
    cohort use: the cohort's borrowing shared among its lenders by what each leaves unused),
    its jobs running and waiting, and why they wait (the records' reasons)."""
    from gpuyard.policies.kueue import Kueue
    from gpuyard.shared.policy import JobView

    policy = Kueue(queues)
    rows = {
        q.name: {"queue": q.name, "cohort": q.cohort, "quota": dict(q.quota), "held": {},
                 "borrowed": {}, "lent": {}, "running": 0, "waiting": 0, "why": {}}
        for q in queues.queue
    }  # fmt: skip
    for record in records:
        q = policy.queue_of(JobView(record))
        if q is None:
            continue
        row = rows[q.name]
        if record.state == "running" and record.gpu_type is not None:
            row["running"] += 1
            row["held"][record.gpu_type] = row["held"].get(record.gpu_type, 0) + record.gpus
        elif record.state == "queued":
            row["waiting"] += 1
            why = re.split(r" \(| for ", record.reason or "Priority", maxsplit=1)[0]
            row["why"][why] = row["why"].get(why, 0) + 1
    for row in rows.values():
        row["borrowed"] = {
            t: n - row["quota"].get(t, 0) for t, n in row["held"].items() if n > row["quota"].get(t, 0)
        }  # fmt: skip
    for q in queues.queue:  # (what each lends: its cohort's borrowing, by what it leaves unused)
        if not q.cohort:
            continue
        cohort = [c for c in queues.queue if c.cohort == q.cohort]
        for t in q.quota:
            borrowed = sum(rows[c.name]["borrowed"].get(t, 0) for c in cohort)
            unused = {c.name: min(c.lendable(t), max(0, c.quota.get(t, 0) -
                                                    rows[c.name]["held"].get(t, 0)))
                      for c in cohort}  # fmt: skip
            if borrowed and unused[q.name]:
                share = _shared(borrowed, unused)[q.name]
                if share:
                    rows[q.name]["lent"][t] = share
    return list(rows.values())


def _shared(total: int, weights: dict[str, int]) -> dict[str, int]:
    """`total` shared out in whole numbers in proportion to `weights` (largest remainders)."""
    whole = sum(weights.values())
    exact = {k: total * w / whole for k, w in weights.items()}
    parts = {k: int(v) for k, v in exact.items()}
    left = total - sum(parts.values())
    for k in sorted(exact, key=lambda k: (parts[k] - exact[k], k))[:left]:
        parts[k] += 1
    return parts


def format_queues(rows: list[dict[str, Any]]) -> str:
    from gpuyard.jobview import text_table

    def per_type(counts: dict[str, int]) -> str:
        return " ".join(f"{t}:{n}" for t, n in sorted(counts.items())) or "-"

    table = [("QUEUE", "COHORT", "QUOTA", "HELD", "BORROWED", "LENT", "RUNNING", "WAITING", "WHY")]
    table += [
        (r["queue"], r["cohort"] or "-", per_type(r["quota"]), per_type(r["held"]),
         per_type(r["borrowed"]), per_type(r["lent"]), str(r["running"]), str(r["waiting"]),
         " ".join(f"{why}:{n}" for why, n in sorted(r["why"].items())) or "-")
        for r in rows
    ]  # fmt: skip
    return text_table(table)


async def scheduler_queues(bus: Bus) -> tuple[str | None, Any]:
    """The scheduler's policy, and its queues (`Queues`) where it has some (`kueue`), else
    None."""
    from gpuyard.policies.kueue import Queues
    from gpuyard.shared.contract import Empty
    from gpuyard.shared.endpoints import POLICY

    info = await bus.call(POLICY, Empty(), svc=SERVICE_TOKENS["scheduler"])
    if info.policy != "kueue":
        return info.policy, None
    return info.policy, msgspec.convert(info.params, Queues)


async def _queues(args: argparse.Namespace, bus: Bus) -> int:
    from gpuyard.cli.cluster import all_records
    from gpuyard.shared.contract import JobQuery

    policy, queues = await scheduler_queues(bus)
    if queues is None:
        print(f"gpuyard queues: the scheduler's policy is {policy}, which has no queues "
              "(gpuyard policy set scheduler kueue --queues FILE)", file=sys.stderr)  # fmt: skip
        return 1
    query = JobQuery(states=["queued", "running"], limit=10_000, reasons=True)
    records = await all_records(bus, query)
    rows = queue_rows(queues, records)
    print(json.dumps({"queues": rows}) if args.json else format_queues(rows))
    return 0


def cmd_queues(args: argparse.Namespace) -> int:
    return run_on_bus("queues", args, partial(_queues, args))

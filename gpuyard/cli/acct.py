"""`gpuyard acct`: accounting of a real cluster's jobs, as Slurm's `sacct` (a row per job) and
`sreport` (`--summary`: sums per user and per queue).

The rows come from the scheduler's job records (`sched.query`, every job's to everyone, as
`gpuyard jobs` shows them); jobs admission rejected never reach the scheduler and are not
accounted. A finished record no longer says which GPU type it ran on, so the types are those of
the nodes it ran on (`JobRecord.ran_on`), from the cluster's node list. A job's queue is its
user's in the scheduler's queues (`kueue`: the queues file it has now), else its tenant
(`JobSpec.tenant`, "-" for none). The functions that build the rows and the summaries are pure
(records, a node -> GPU type map, the time), for tests without NATS.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from gpuyard.cli.cluster import all_records
from gpuyard.cli.ops import scheduler_queues
from gpuyard.cli.options import Subcommands, add_nats_options, job_id_arg, positive_int, run_on_bus
from gpuyard.jobview import (
    JOB_STATES,
    SCHEDULER_STATES,
    clock,
    current_reason,
    elapsed_s,
    parse_states,
    slurm_state,
    text_table,
)
from gpuyard.shared.connection import Bus
from gpuyard.shared.contract import ClusterInfo, Empty, JobQuery
from gpuyard.shared.durations import slurm_duration
from gpuyard.shared.endpoints import CLUSTER
from gpuyard.shared.model import ANY_GPU, JobRecord

MIXED = "mixed"
"""The GPU type of a job whose nodes were of several types."""
UNKNOWN = "unknown"
"""The GPU type of a job that ran on a node the cluster no longer knows (and asked for any)."""
NO_QUEUE = "-"
"""The queue of a job that has none; `--queue -` chooses those jobs."""
SUMMARY_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PENDING", "RUNNING")
"""The states a summary counts jobs by (a requeued job waits: PENDING)."""


class AcctRow(msgspec.Struct, kw_only=True):
    """One job's accounting (`gpuyard acct --json`'s `jobs`); times are epoch seconds, fields
    named as `gpuyard jobs --json` names them where they mean the same."""

    job_id: str
    name: str
    user: str
    queue: str
    """The job's queue (its user's under `kueue`, else its tenant; "-" for none)."""
    job_state: str
    """Slurm's name for its state (`jobview.slurm_state`)."""
    exit_code: int | None
    submit_time: float
    first_start: float | None
    end_time: float | None
    wait_s: float | None
    """From submission to its first start; None while it never started."""
    elapsed_s: float
    """Seconds run, all runs together (the current one too)."""
    num_gpus: int
    gpu_hours: float
    gpu_type: str | None
    """The type of the nodes it ran on, `mixed` or `unknown`; None when it never ran."""
    preemptions: int
    state_reason: str
    node_list: list[str]


class Usage(msgspec.Struct, kw_only=True):
    """The sums of one user's or one queue's jobs (`gpuyard acct --summary`)."""

    jobs: int
    states: dict[str, int]
    """Jobs by state, each of `SUMMARY_STATES` (0 included)."""
    gpu_hours: float
    gpu_hours_by_type: dict[str, float]
    started: int
    mean_wait_s: float | None
    """The mean wait of the jobs that started; None when none did."""


class Summary(msgspec.Struct, kw_only=True):
    users: dict[str, Usage]
    queues: dict[str, Usage]


# --------------------------------------------------------------------------- pure parts


def node_types(info: ClusterInfo) -> dict[str, str]:
    """Node id -> GPU type, of the nodes the cluster knows (those down are not in `nodes`)."""
    return {n.node_id: n.gpu_type for n in info.nodes}


def job_gpu_type(record: JobRecord, types: dict[str, str]) -> str | None:
    """The GPU type a job ran on: its nodes' one type, `mixed` for several, None if it never ran.
    A node no longer known is of the type the job asked for (placement gave it no other), or
    `unknown` when it asked for any."""
    if not record.ran_on:
        return None
    asked = record.spec.gpu_type if record.spec.gpu_type != ANY_GPU else UNKNOWN
    found = {types.get(node, asked) for node in record.ran_on}
    return found.pop() if len(found) == 1 else MIXED


def gpu_hours(record: JobRecord, now: float) -> float:
    """GPU-hours used: its ended runs', and the current run's so far."""
    running = (now - record.run_start) * record.gpus if record.state == "running" else 0.0
    return (record.gpu_seconds + max(running, 0.0)) / 3600.0


def acct_row(
    record: JobRecord, types: dict[str, str], now: float, queue: str | None = None
) -> AcctRow:
    """The job's row; `queue` where the scheduler's queues give it one (else its tenant)."""
    start = record.first_start
    return AcctRow(
        job_id=record.job_id,
        name=record.spec.name or " ".join(record.spec.command),
        user=record.spec.user or "-",
        queue=queue or record.spec.tenant or NO_QUEUE,
        job_state=slurm_state(record),
        exit_code=record.exit_code,
        submit_time=record.submit_time,
        first_start=start,
        end_time=record.end_time,
        wait_s=None if start is None else max(start - record.submit_time, 0.0),
        elapsed_s=elapsed_s(record, now),
        num_gpus=record.spec.num_gpus,
        gpu_hours=gpu_hours(record, now),
        gpu_type=job_gpu_type(record, types),
        preemptions=record.preemptions,
        state_reason=current_reason(record),
        node_list=list(record.ran_on),
    )


def overlaps(row: AcctRow, since: float | None, until: float | None, now: float) -> bool:
    """Whether the job's [submission, end (or now, not ended)] meets [since, until]."""
    end = row.end_time if row.end_time is not None else now
    return (since is None or end >= since) and (until is None or row.submit_time <= until)


def select_rows(
    rows: Iterable[AcctRow], *, users: Sequence[str] = (), queues: Sequence[str] = (),
    states: set[str] | None = None, since: float | None = None, until: float | None = None,
    now: float,
) -> list[AcctRow]:  # fmt: skip
    """The rows the filters choose (an empty filter chooses all), in order of submission."""
    chosen = [
        r for r in rows
        if (not users or r.user in users) and (not queues or r.queue in queues)
        and (not states or r.job_state in states) and overlaps(r, since, until, now)
    ]  # fmt: skip
    return sorted(chosen, key=lambda r: (r.submit_time, r.job_id))


def usage(rows: Iterable[AcctRow]) -> Usage:
    states = dict.fromkeys(SUMMARY_STATES, 0)
    by_type: dict[str, float] = {}
    waits: list[float] = []
    jobs = 0
    for r in rows:
        jobs += 1
        states["PENDING" if r.job_state == "REQUEUED" else r.job_state] += 1
        if r.gpu_type is not None:
            by_type[r.gpu_type] = by_type.get(r.gpu_type, 0.0) + r.gpu_hours
        if r.wait_s is not None:
            waits.append(r.wait_s)
    return Usage(
        jobs=jobs, states=states, gpu_hours=sum(by_type.values()),
        gpu_hours_by_type=dict(sorted(by_type.items())), started=len(waits),
        mean_wait_s=sum(waits) / len(waits) if waits else None,
    )  # fmt: skip


def summarize(rows: Sequence[AcctRow]) -> Summary:
    """The rows' sums per user and per queue."""

    def by(key: str) -> dict[str, Usage]:
        groups: dict[str, list[AcctRow]] = {}
        for r in rows:
            groups.setdefault(getattr(r, key), []).append(r)
        return {name: usage(group) for name, group in sorted(groups.items())}

    return Summary(users=by("user"), queues=by("queue"))


def format_acct(rows: Sequence[AcctRow], now: float) -> str:
    table: list[tuple[str, ...]] = [
        ("JOBID", "NAME", "USER", "QUEUE", "STATE", "EXIT", "SUBMIT", "START", "END", "WAIT",
         "ELAPSED", "GPUS", "GPU-HOURS", "GPU-TYPE", "PREEMPT", "REASON"),
    ]  # fmt: skip
    for r in rows:
        table.append(
            (
                r.job_id, r.name[:24] or "-", r.user, r.queue, r.job_state,
                "-" if r.exit_code is None else str(r.exit_code), clock(r.submit_time, now),
                clock(r.first_start, now), clock(r.end_time, now),
                "-" if r.wait_s is None else slurm_duration(r.wait_s),
                slurm_duration(r.elapsed_s), str(r.num_gpus), f"{r.gpu_hours:.2f}",
                r.gpu_type or "-", str(r.preemptions), r.state_reason or "-",
            )
        )  # fmt: skip
    return text_table(table)


def format_usage(title: str, groups: dict[str, Usage]) -> str:
    """One table: a row per user (or queue), with a GPU-hours column per GPU type used."""
    types = sorted({t for u in groups.values() for t in u.gpu_hours_by_type})
    table: list[tuple[str, ...]] = [
        (title, "JOBS", *SUMMARY_STATES, "GPU-HOURS", *(f"GPU-HOURS[{t}]" for t in types),
         "MEAN-WAIT"),
    ]  # fmt: skip
    for name, u in groups.items():
        table.append(
            (
                name, str(u.jobs), *(str(u.states[s]) for s in SUMMARY_STATES),
                f"{u.gpu_hours:.2f}", *(f"{u.gpu_hours_by_type.get(t, 0.0):.2f}" for t in types),
                "-" if u.mean_wait_s is None else slurm_duration(u.mean_wait_s),
            )
        )  # fmt: skip
    return text_table(table)


def format_summary(summary: Summary) -> str:
    return f"{format_usage('USER', summary.users)}\n\n{format_usage('QUEUE', summary.queues)}"


# --------------------------------------------------------------------------- the command


def add_acct_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "acct", help="accounting: jobs' use (sacct), sums per user and queue (--summary)",
        description="Accounting of the scheduler's jobs: a row per job as Slurm's sacct, or with "
        "--summary sums per user and per queue (its user's queue under kueue, else its tenant) "
        "as sreport. Jobs admission rejected are not accounted (see docs/cli.md).",
    )  # fmt: skip
    add_nats_options(p)
    p.add_argument(
        "--user", action="append", default=[], metavar="USER[,USER...]",
        help="only these users' jobs (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--queue", action="append", default=[], metavar="QUEUE[,QUEUE...]",
        help="only jobs of these queues ('-': none) (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--state", action="append", default=[], metavar="STATE[,STATE...]",
        help=f"only jobs in these states (any case): "
        f"{', '.join(s for s in JOB_STATES if s != 'REJECTED')}",
    )  # fmt: skip
    p.add_argument(
        "--since", metavar="TIME",
        help="only jobs not ended by then: a time ago (10m, 2h, 1d) or an ISO time (UTC unless "
        "it says otherwise)",
    )  # fmt: skip
    p.add_argument("--until", metavar="TIME", help="only jobs submitted by then (forms as --since)")
    p.add_argument("--summary", action="store_true", help="sums per user and per queue")
    p.add_argument("--json", action="store_true", help="JSON instead of tables")
    p.add_argument(
        "--limit", type=positive_int, metavar="N", help="only the N most recently submitted jobs"
    )
    p.add_argument("job_ids", nargs="*", type=job_id_arg, help="only these jobs")
    p.set_defaults(run=cmd_acct)


def parse_time(option: str, text: str) -> float:
    """`--since`/`--until`'s value as epoch seconds, read as `gpuyard tail --since` reads it."""
    from gpuyard.ops import parse_since

    try:
        return parse_since(text).timestamp()
    except ValueError:
        raise ValueError(
            f"{option} {text!r} is neither a duration ago (10m, 2h, 1d) nor an ISO time"
        ) from None


def _names(values: Iterable[str]) -> list[str]:
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def _queue_of(queues: Any) -> Callable[[JobRecord], str | None]:
    """A job's queue by its user under the `kueue` policy's `queues` (None: no queues)."""
    if queues is None:
        return lambda _: None
    from gpuyard.policies.kueue import Kueue

    policy = Kueue(queues)

    def queue_of(record: JobRecord) -> str | None:
        q = policy.queue_of(record)
        return q.name if q is not None else None

    return queue_of


def cmd_acct(args: argparse.Namespace) -> int:
    try:
        states = parse_states(args.state)
        if "REJECTED" in states:
            raise ValueError("--state REJECTED: jobs admission rejected never reach the "
                             "scheduler and are not accounted (gpuyard jobs --state rejected "
                             "lists them)")  # fmt: skip
        since = None if args.since is None else parse_time("--since", args.since)
        until = None if args.until is None else parse_time("--until", args.until)
        if since is not None and until is not None and since > until:
            raise ValueError(f"--since {args.since!r} is after --until {args.until!r}")
        if args.summary and args.limit:
            raise ValueError("--limit lists the most recent jobs, --summary sums them all: "
                             "not both")  # fmt: skip
    except ValueError as exc:
        print(f"gpuyard acct: {exc}", file=sys.stderr)
        return 2
    users, queues = _names(args.user), _names(args.queue)
    internal = sorted({SCHEDULER_STATES[s] for s in states})

    async def body(bus: Bus) -> int:
        now = time.time()
        query = JobQuery(job_ids=args.job_ids, states=internal, limit=10_000, reasons=True)
        records = await all_records(bus, query)
        # Only the records that ran need the node list (finished ones say no GPU type).
        types = (
            node_types(await bus.call(CLUSTER, Empty())) if any(r.ran_on for r in records) else {}
        )
        _, kueue = await scheduler_queues(bus)
        queue_of = _queue_of(kueue)
        rows = select_rows(
            (acct_row(r, types, now, queue_of(r)) for r in records), users=users, queues=queues,
            states=states, since=since, until=until, now=now,
        )  # fmt: skip
        if args.summary:
            summary = summarize(rows)
            out = msgspec.json.encode(summary).decode() if args.json else format_summary(summary)
        else:
            if args.limit:
                rows = rows[-args.limit :]
            out = (
                msgspec.json.encode({"jobs": rows}).decode()
                if args.json
                else format_acct(rows, now)
            )
        print(out)
        shown = {r.job_id for r in records} | {
            r.spec.array.array_id for r in records if r.spec.array is not None
        }  # (an array's id stands for its tasks)
        missing = sorted(set(args.job_ids) - shown)
        if missing and not states:  # (rejected ones too: the scheduler never had them)
            print(f"gpuyard acct: no such job in the scheduler's records: {', '.join(missing)}",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0

    return run_on_bus("acct", args, body)

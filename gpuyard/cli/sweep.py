"""`gpuyard sweep`, `gpuyard worker` and `gpuyard report`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from gpuyard.cli.options import (
    LOG_LEVELS,
    CommandError,
    Subcommands,
    checked_url,
    positive_float,
    positive_int,
)
from gpuyard.shared.connection import NatsAuth, add_nats_arguments


def add_sweep_parsers(sub: Subcommands) -> None:
    p = sub.add_parser(
        "sweep", help="run a sweep of simulations described by a TOML file",
        description="Run every simulation of a sweep file (docs/sweeps.md) and write one results "
        "table. Without --nats, on a private server with workers on this machine; with --nats, "
        "through that server's queue, for workers on any machine (`gpuyard worker`).",
    )  # fmt: skip
    p.add_argument("config", type=Path, help="the sweep's TOML file")
    p.add_argument("--out", type=Path, help="output folder (default: sweeps/<sweep name>)")
    p.add_argument(
        "--parallel", type=positive_int,
        help="runs at once on this machine (default: sweep.parallel, else one per CPU)",
    )  # fmt: skip
    add_nats_arguments(p, url_default=None)
    p.add_argument(
        "--workers", type=int, default=None,
        help="with --nats: workers to start on this machine too (default 0)",
    )  # fmt: skip
    p.add_argument(
        "--no-pin", dest="pin", action="store_false",
        help="let the workers started here move between CPUs (default: each on a CPU of its own, "
        "with its runs' servers; `taskset` chooses the CPUs)",
    )  # fmt: skip
    p.add_argument("--retry-failed", action="store_true", help="run failed runs again")
    p.add_argument(
        "--redeliver-after", type=positive_float, default=None, metavar="S",
        help="a run whose worker went silent this long goes to another (default 60 s)",
    )  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="list the runs and stop")
    p.add_argument("--json", action="store_true", help="print the results table as JSON")
    p.set_defaults(run=cmd_sweep)

    w = sub.add_parser(
        "worker", help="take sweep runs from a NATS server's queue and simulate them",
        description="Take runs from the sweep queue of --nats, one at a time, until stopped; "
        "each is simulated on a private server started beside this worker for it (its URL is in "
        "the run.started log line, for `gpuyard tail --follow`). Pin it with taskset.",
    )  # fmt: skip
    add_nats_arguments(w, url_default=None)
    w.add_argument("--cache", type=Path, help="where input files fetched from the server are kept")
    w.add_argument(
        "--idle-exit", type=positive_float, metavar="S", help="stop after S seconds with no run"
    )
    w.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    w.set_defaults(run=cmd_worker)

    r = sub.add_parser(
        "report", help="figures and one HTML page from a sweep's results",
        description="Mean JCT vs load (means over seeds, each naming its n; 95% confidence "
        "intervals from 3 seeds on, min to max with 2), JCT CDFs, "
        "makespan, utilisation and queue over time, deadline ratios, fairness: PNG and SVG, and "
        "report.html with everything in it.",
    )  # fmt: skip
    r.add_argument("results", type=Path, help="a sweep's output folder (or its results.parquet)")
    r.add_argument("--out", type=Path, help="where to write (default: RESULTS/report)")
    r.set_defaults(run=cmd_report)


def reachable(args: argparse.Namespace, command: str) -> int:
    """0 once `--nats` answered; else one line naming it and 1 (rather than retrying for ever)."""
    from gpuyard.cli.options import open_bus, run_command

    async def check() -> int:
        await (await open_bus(argparse.Namespace(**vars(args), cluster="sweep"), command)).close()
        return 0

    return run_command(command, check())


def cmd_sweep(args: argparse.Namespace) -> int:
    if not args.dry_run and (not args.nats or args.workers):
        # The workers' fork server imports what they run while we import and plan (below):
        # it starts first, as the workers wait for it. (They draw no figures.)
        from gpuyard.run.forks import fork_server

        fork_server(plots=False)
    import nats.errors
    import uvloop

    from gpuyard.run.embedded import nats_server_binary
    from gpuyard.run.process import stop_on_signals
    from gpuyard.sweep.config import ConfigError, load_sweep
    from gpuyard.sweep.engine import format_results, results_table, run_sweep, write_table
    from gpuyard.sweep.queue import describe_failure

    try:
        sweep = load_sweep(args.config)
        if args.nats:
            checked_url(args.nats)
        elif args.workers is not None:
            raise ConfigError("--workers goes with --nats (without it, --parallel)")
        else:
            nats_server_binary()
    except (ConfigError, CommandError, FileNotFoundError) as exc:
        print(f"gpuyard sweep: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path("sweeps") / sweep.name
    if args.dry_run:
        for run in sweep.runs:
            print(f"{run.run_id}  {run.name}")
        print(f"{len(sweep.runs)} runs", file=sys.stderr)
        return 0
    from gpuyard.run.forks import default_parallel

    if args.nats and reachable(args, "sweep"):
        return 1
    workers = (
        (args.workers or 0)
        if args.nats
        else args.parallel or sweep.settings.parallel or default_parallel()
    )
    interrupted = False
    try:
        results = uvloop.run(stop_on_signals(run_sweep(
            sweep, out, nats_url=args.nats, workers=workers, auth=NatsAuth.from_args(args),
            retry_failed=args.retry_failed, redeliver_after_s=args.redeliver_after, pin=args.pin,
        )))  # fmt: skip
    except (KeyboardInterrupt, asyncio.CancelledError):
        interrupted = True
        from gpuyard.sweep.engine import finished_here

        results = finished_here(sweep, out, retry_failed=False)
    except (OSError, RuntimeError, TimeoutError, nats.errors.Error) as exc:
        print(f"gpuyard sweep: {describe_failure(exc)}", file=sys.stderr)
        return 1
    table = results_table(sweep, out, results)
    paths = write_table(table, out)
    print(table.to_json(orient="records", indent=2) if args.json else format_results(table))
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    if interrupted:
        print(
            f"gpuyard sweep: interrupted: {len(results)} of {len(sweep.runs)} runs have results; "
            "run the same command again to go on",
            file=sys.stderr,
        )
        return 130
    return 0 if (table["status"] == "ok").all() else 1


def cmd_worker(args: argparse.Namespace) -> int:
    from gpuyard.sweep.worker import Worker, work

    if not args.nats:
        print(
            "gpuyard worker: --nats URL is needed: the server of the sweep queue", file=sys.stderr
        )
        return 2
    try:
        url = checked_url(args.nats)
    except CommandError as exc:
        print(f"gpuyard worker: {exc}", file=sys.stderr)
        return exc.code
    if reachable(args, "worker"):
        return 1
    worker = Worker(url, auth=NatsAuth.from_args(args), cache=args.cache,
                    idle_exit_s=args.idle_exit)  # fmt: skip
    return work(worker, args.log_level)


def cmd_report(args: argparse.Namespace) -> int:
    from gpuyard.sweep.report import ReportError, write_report

    try:
        paths = write_report(args.results, args.out)
    except (ReportError, OSError) as exc:
        print(f"gpuyard report: {exc}", file=sys.stderr)
        return 2
    for path in paths[:-1]:
        print(f"wrote {path}", file=sys.stderr)
    print(paths[-1])  # the HTML report
    return 0

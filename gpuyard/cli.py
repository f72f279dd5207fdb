"""The `gpuyard` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gpuyard.cli_cluster import add_cluster_parsers
from gpuyard.cli_ops import add_ops_parsers
from gpuyard.shared.connection import NatsAuth, add_nats_arguments
from gpuyard.shared.model import ClusterSpec
from gpuyard.shared.policy import PolicyError, parse_params

T = TypeVar("T")

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "shared" / "schema"


def parse_demand(text: str) -> dict[int, float]:
    """`1:0.7,2:0.1,4:0.15,8:0.05` -> {1: 0.7, ...}."""
    demand: dict[int, float] = {}
    for part in text.split(","):
        gpus, sep, weight = part.partition(":")
        try:
            demand[int(gpus)] = float(weight) if sep else 1.0
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"GPU demand part {part!r} is not GPUS:WEIGHT"
            ) from None
    return demand


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """Where the jobs come from: a trace file, or one of the seeded generators."""
    g = p.add_argument_group("workload")
    g.add_argument("--trace", type=Path, help="a trace file (format detected, or --trace-format)")
    g.add_argument(
        "--trace-format",
        default="auto",
        help="gavel, elasticflow, itp, bftrainer, "
        "blox, philly, gpuyard, csv, parquet (default: detect)",
    )
    g.add_argument("--skip-bad", action="store_true", help="skip and count broken trace lines")
    g.add_argument(
        "--generator",
        choices=["blox", "gavel", "elasticflow"],
        default="blox",
        help="the generator when no --trace is given (default blox)",
    )
    g.add_argument("--jobs", type=int, default=400, help="number of generated jobs")
    g.add_argument(
        "--load",
        default="20",
        help="generated arrivals per hour (sim: a comma list compares loads)",
    )
    g.add_argument(
        "--gpu-demand",
        type=parse_demand,
        default=None,
        help="blox: GPUS:WEIGHT,... (default 1:0.7,2:0.1,4:0.15,8:0.05)",
    )
    g.add_argument("--multi-gpu", action="store_true", help="gavel: scale factors 1/2/4/8")
    g.add_argument("--seed", default="0", help="generator seed (sim: a comma list compares seeds)")  # fmt: skip


def workload_from_args(args: argparse.Namespace, throughputs: Any = None) -> Any:
    from gpuyard.workloads import blox, elasticflow, gavel, load_workload

    if args.trace is not None:
        options = (
            {"throughputs": throughputs}
            if throughputs is not None
            and args.trace_format in ("auto", "gavel")
            and str(args.trace).endswith(".trace")
            else {}
        )
        if getattr(args, "elasticflow", False):
            from gpuyard.workloads import detect_format

            fmt = detect_format(args.trace) if args.trace_format == "auto" else args.trace_format
            if fmt in ("elasticflow", "itp"):
                options["elastic"] = True  # ElasticFlow chooses the GPU counts itself
        return load_workload(args.trace, args.trace_format, args.skip_bad, **options)
    load, seed = float(args.load), int(args.seed)
    if args.generator == "gavel":
        return gavel(args.jobs, load, seed, args.multi_gpu, throughputs=throughputs)
    if args.generator == "elasticflow":
        return elasticflow(args.jobs, 3600.0 / load, seed, throughputs=throughputs)
    demand = args.gpu_demand or {1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05}
    return blox(args.jobs, load, seed, demand)


def add_sim_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="run a simulation", description="Run a complete simulation.")
    add_nats_arguments(p, url_default=None)  # no --nats: a private server for the run
    p.add_argument("--cluster", default="sim", help="namespace of this run's subjects")
    p.add_argument(
        "--cluster-spec",
        default="32x4",
        help="NODESxGPUS[:TYPE],..., a TOML/JSON file, an ElasticFlow cluster CSV, or "
        "'none' (only nodes from --node-events)",
    )
    p.add_argument(
        "--throughputs",
        default="default",
        help="Gavel JSON, ElasticFlow table (file or folder), BFTrainer JNPs CSV",
    )
    p.add_argument(
        "--node-events",
        type=Path,
        help="node churn: BFTrainer node_events.csv(.gz) or a time,node,up CSV",
    )
    p.add_argument(
        "--churn-node-gpus", type=int, default=1, help="GPUs of a node from --node-events"
    )
    p.add_argument(
        "--policy",
        default="fifo",
        help="scheduling policy; a comma list (fifo,las,tiresias) compares them",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        help="scheduling policy KEY=VALUE (POLICY.KEY=VALUE for one of several)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="comparisons: runs at once (default: one per CPU)",
    )
    p.add_argument("--admission", default="accept-all")
    p.add_argument("--admission-param", action="append", default=[], help="KEY=VALUE")
    p.add_argument("--placement", default="consolidated")
    p.add_argument("--placement-param", action="append", default=[], help="KEY=VALUE")
    p.add_argument("--round", type=float, default=300.0, dest="round_s", help="round length (s)")
    p.add_argument(
        "--mode",
        choices=["rounds", "events"],
        default="events",
        help="decide at round ends only, or also at every arrival and completion",
    )
    p.add_argument(
        "--checkpoint-s",
        type=float,
        default=0.0,
        help="preemption cost: progress lost to saving a checkpoint (s)",
    )
    p.add_argument(
        "--restore-s",
        type=float,
        default=0.0,
        help="preemption cost: time a resumed job needs before it progresses (s)",
    )
    p.add_argument(
        "--blox",
        action="store_true",
        help="Blox semantics: rounds mode, jobs admitted and seen finished at round starts",
    )
    p.add_argument(
        "--elasticflow",
        action="store_true",
        help="ElasticFlow's simulator: --policy names its scheme (ef-accessctrl, ef, edf, "
        "edf-accessctrl, gandiva, dlas-gpu, themis, chronus), --round its scheduling slot",
    )
    add_workload_args(p)
    p.add_argument("--processes", action="store_true", help="one OS process per service")
    p.add_argument(
        "--external",
        default="",
        metavar="SERVICES",
        help="comma-separated services already running on --nats (e.g. in containers)",
    )
    p.add_argument("--out", type=Path, default=Path("results"), help="output directory")
    p.add_argument("--log-level", default="info")
    p.set_defaults(run=cmd_sim)  # fmt: skip


def fail(command: str, exc: BaseException) -> int:
    print(f"gpuyard {command}: {exc}", file=sys.stderr)
    return 2


def split_list(text: str, cast: type) -> list:
    return [cast(part.strip()) for part in text.split(",") if part.strip()]


def without_options(argv: list[str], names: set[str]) -> list[str]:
    """`argv` without the options in `names` and their values (`--x v` and `--x=v`)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in names:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept


def cmd_compare(
    args: argparse.Namespace, policies: list[str], loads: list[float], seeds: list[int]
) -> int:
    """Several policies, loads or seeds: one `gpuyard sim` each, at once, on one server."""
    import uvloop

    from gpuyard.compare import default_parallel, run_all, write_comparison

    base = without_options(
        args.argv[2:],  # after "gpuyard sim"
        {"--policy", "--param", "--load", "--seed", "--out", "--cluster", "--nats", "--parallel"},
    )
    args.out.mkdir(parents=True, exist_ok=True)
    table = uvloop.run(
        run_all(
            base,
            policies,
            loads,
            seeds,
            args.param,
            args.out,
            args.nats,
            args.parallel or default_parallel(),
        )
    )
    paths = write_comparison(table, args.out)
    columns = ["policy", "load", "seed", "mean_jct", "p95_jct", "makespan", "utilization"]
    if not table.empty:
        print(table[columns].to_string(index=False))
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    runs = len(policies) * len(loads) * len(seeds)
    return 0 if len(table) == runs else 1


async def stop_on_sigterm(work: Coroutine[Any, Any, T]) -> T:
    """`kill` stops a run like Ctrl-C does: the run is cancelled and shuts its services down."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await work


def cmd_sim(args: argparse.Namespace) -> int:
    import uvloop

    from gpuyard.shared.logs import configure_logging
    from gpuyard.shared.policy import admission_policies, placement_policies, scheduling_policies
    from gpuyard.shared.throughput import load_throughputs
    from gpuyard.sim import PreemptionCost, ProgressBar, SimOptions, simulate
    from gpuyard.workloads import WorkloadError, load_cluster, load_node_events, save_node_events

    try:
        policies = split_list(args.policy, str)
        loads = split_list(args.load, float)
        seeds = split_list(args.seed, int)
    except ValueError as exc:
        return fail("sim", exc)
    if len(policies) * len(loads) * len(seeds) > 1:
        return cmd_compare(args, policies, loads, seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        cluster = (
            ClusterSpec(groups=[])
            if args.cluster_spec == "none"
            else load_cluster(args.cluster_spec)
        )
        model = load_throughputs(args.throughputs)
        options = SimOptions(
            cluster=cluster,
            throughputs=args.throughputs,
            policy=args.policy,
            policy_params=parse_params(args.param),
            admission=args.admission,
            admission_params=parse_params(args.admission_param),
            placement=args.placement,
            placement_params=parse_params(args.placement_param),
            round_s=args.round_s,
            mode="rounds" if args.blox else args.mode,
            blox=args.blox,
            churn_node_gpus=args.churn_node_gpus,
            preemption_cost=PreemptionCost(
                checkpoint_s=args.checkpoint_s, restore_s=args.restore_s
            ),
        )
        if args.elasticflow:
            from gpuyard.sim import elasticflow_options

            scheme = elasticflow_options(args.policy, args.round_s, cluster.total_gpus)
            scheme["policy_params"] |= options.policy_params
            options = msgspec.structs.replace(options, **scheme)
        scheduling_policies.create(options.policy, options.policy_params)
        admission_policies.create(options.admission, options.admission_params)
        placement_policies.create(options.placement, options.placement_params)
        workload = workload_from_args(args, model)
        if workload.skipped:
            print(f"gpuyard sim: skipped {workload.skipped} broken trace lines", file=sys.stderr)
        if args.node_events is not None:
            origin = None
            if "Tsub" in workload.extras.columns:  # BFTrainer: line node and job times up
                import pandas as pd

                origin = pd.to_datetime(workload.extras["Tsub"]).min().to_pydatetime()
            events_path = args.out / "node_events.csv"
            events = load_node_events(args.node_events, origin=origin)
            # Events before the first job only set the nodes' state at the start.
            events["time"] = events["time"].clip(lower=0.0)
            save_node_events(events, events_path)
            options.node_events = str(events_path.resolve())
    except (ValueError, OSError, msgspec.ValidationError, WorkloadError) as exc:
        return fail("sim", exc)
    log = open(args.out / "services.log", "a")  # noqa: SIM115 (open for the whole run)
    configure_logging(args.log_level, log)
    try:
        result = uvloop.run(
            stop_on_sigterm(
                simulate(
                    options,
                    workload.jobs,
                    args.out,
                    nats_url=args.nats,
                    cluster_name=args.cluster,
                    processes=args.processes,
                    on_progress=ProgressBar(args.cluster),
                    external=frozenset(filter(None, args.external.split(","))),
                    log_level=args.log_level,
                    auth=NatsAuth.from_args(args),
                )
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("gpuyard sim: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, PolicyError) as exc:
        print(f"gpuyard sim: {exc}", file=sys.stderr)
        return 1
    finally:
        log.close()
    print(json.dumps(result.summary, indent=2))
    print(f"results in {args.out}/", file=sys.stderr)
    return 0


def add_trace_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="generate, convert and describe workloads")
    tsub = p.add_subparsers(required=True, metavar="ACTION")
    g = tsub.add_parser("generate", help="write a generated workload")
    add_workload_args(g)
    g.add_argument("--throughputs", help="fill in total_steps from this throughput model")
    g.add_argument("out", type=Path, help="output .csv or .parquet")
    g.set_defaults(run=cmd_trace_generate)
    c = tsub.add_parser("convert", help="convert any supported trace to gpuyard's CSV/Parquet")
    c.add_argument("--trace-format", default="auto")
    c.add_argument("--skip-bad", action="store_true")
    c.add_argument("trace", type=Path)
    c.add_argument("out", type=Path)
    c.set_defaults(run=cmd_trace_convert)
    d = tsub.add_parser("describe", help="print counts and quantiles, write plots")
    d.add_argument("--trace-format", default="auto")
    d.add_argument("--skip-bad", action="store_true")
    d.add_argument("--plots", type=Path, help="folder for the plots (default: beside the trace)")
    d.add_argument("trace", type=Path)
    d.set_defaults(run=cmd_trace_describe)


def cmd_trace_generate(args: argparse.Namespace) -> int:
    from gpuyard.shared.throughput import load_throughputs
    from gpuyard.workloads import save_workload

    try:
        model = load_throughputs(args.throughputs) if args.throughputs else None
        args.trace = None
        path = save_workload(workload_from_args(args, model), args.out)
    except (ValueError, OSError) as exc:
        return fail("trace generate", exc)
    print(path)
    return 0


def cmd_trace_convert(args: argparse.Namespace) -> int:
    from gpuyard.workloads import WorkloadError, load_workload, save_workload

    try:
        workload = load_workload(args.trace, args.trace_format, args.skip_bad)
        path = save_workload(workload, args.out)
    except (ValueError, OSError, WorkloadError) as exc:
        return fail("trace convert", exc)
    if workload.skipped:
        print(f"skipped {workload.skipped} broken lines", file=sys.stderr)
    print(f"{len(workload)} jobs -> {path}")
    return 0


def cmd_trace_describe(args: argparse.Namespace) -> int:
    from gpuyard.report import plot_workload
    from gpuyard.workloads import WorkloadError, load_workload

    try:
        workload = load_workload(args.trace, args.trace_format, args.skip_bad)
    except (ValueError, OSError, WorkloadError) as exc:
        return fail("trace describe", exc)
    folder = args.plots or args.trace.parent
    folder.mkdir(parents=True, exist_ok=True)
    paths = plot_workload(workload.to_frame(with_extras=False), folder, args.trace.stem)
    print(json.dumps(workload.describe(), indent=2, default=str))
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from gpuyard.shared.contract import CONTRACT_VERSION, json_schema

    text = json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
    if args.write:
        SCHEMA_PATH.mkdir(parents=True, exist_ok=True)
        (SCHEMA_PATH / f"contract-v{CONTRACT_VERSION}.json").write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_service(args: argparse.Namespace) -> int:
    import importlib

    from gpuyard.launcher import SERVICE_CLASSES

    module = importlib.import_module(f"gpuyard.services.{args.name}.service")
    cls = getattr(module, SERVICE_CLASSES[args.name][1])
    config_cls = getattr(module, f"{cls.__name__}Config")
    from gpuyard.shared.service import run_service

    run_service(cls, config_cls, args.rest)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuyard", description=__doc__)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    add_sim_parser(sub)
    add_trace_parser(sub)
    add_cluster_parsers(sub)
    add_ops_parsers(sub)
    p = sub.add_parser("schema", help="print (or --write) the wire contract's JSON Schema")
    p.add_argument("--write", action="store_true", help=f"write it to {SCHEMA_PATH}/")
    p.set_defaults(run=cmd_schema)
    p = sub.add_parser(
        "service", help="run one service (admission, scheduler, placement, simclock)"
    )
    p.add_argument("name", choices=["admission", "scheduler", "placement", "simclock"])
    p.add_argument("rest", nargs=argparse.REMAINDER, help="--nats URL --cluster NAME --config FILE")
    p.set_defaults(run=cmd_service)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    # A SIGCHLD blocked by whoever started us would hide our children's exits from the event loop.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    args.argv = ["gpuyard", *argv]
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

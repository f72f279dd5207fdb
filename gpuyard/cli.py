"""The `gpuyard` command."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Collection, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats.errors

from gpuyard.cli_auth import add_auth_parser
from gpuyard.cli_cluster import add_cluster_parsers
from gpuyard.cli_ops import add_ops_parsers
from gpuyard.cliopts import (
    DEFAULT_ADMISSION,
    DEFAULT_PLACEMENT,
    LOG_LEVELS,
    CommandError,
    OneLineParser,
    id_window,
    non_negative_float,
    number_list,
    positive_float,
    positive_int,
    preset_filled,
    resolve_options,
)
from gpuyard.shared.connection import NatsAuth, add_nats_arguments
from gpuyard.shared.model import ClusterSpec
from gpuyard.shared.policy import PolicyError, parse_params
from gpuyard.sweep.cli import add_sweep_parsers

T = TypeVar("T")

SERVICES = ("admission", "scheduler", "placement", "simclock")
GAVEL_ROUND_S = 360.0
"""Gavel's round length (`--time_per_iteration`)."""
GAVEL_NAMES = {"fifo": "gavel_fifo"}
"""Under `--gavel`, Gavel's names for the policies whose names gpuyard uses for others."""
GAVEL_PARAMS: dict[str, Any] = {"costs": {}}
"""Under `--gavel`, the scheduling policy's parameters as Gavel's simulator sets them, where the
policy has them and `--param` does not give them: its driver passes no price table, so the
cost-normalised policies see every GPU type cost 1 (and allocate as `max_sum_throughput_perf`)."""

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "shared" / "schema"


def parse_demand(text: str) -> dict[int, float]:
    """`1:0.7,2:0.1,4:0.15,8:0.05` -> {1: 0.7, ...}; `4` -> {4: 1.0}."""
    demand: dict[int, float] = {}
    for part in text.split(","):
        gpus, sep, weight = part.partition(":")
        try:
            count = positive_int(gpus)
            demand[count] = non_negative_float(weight) if sep else 1.0
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r} is not GPUS:WEIGHT ({exc})"
            ) from None
    if not any(demand.values()):
        raise argparse.ArgumentTypeError(f"{text!r}: every weight is 0")
    return demand


GENERATOR_DEFAULTS: dict[str, Any] = {"jobs": 400, "load": [20.0], "seed": [0]}
DEFAULT_DEMAND = {1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05}
GENERATOR_OPTIONS = ("--generator", "--jobs", "--load", "--gpu-demand")
"""Options a --trace refuses (`--seed` is not among them: it also seeds the policies)."""
TRACE_OPTIONS = ("--trace-format", "--skip-bad", "--philly-reading")


def add_trace_args(g: Any, *, multi_gpu: bool = True) -> None:
    """How a trace file is read: its format, broken lines, the reading of Philly traces."""
    g.add_argument(
        "--trace-format",
        help="gavel, elasticflow, itp, bftrainer, blox, philly, gpuyard, csv, parquet "
        "(default: detect)",
    )
    g.add_argument("--skip-bad", action="store_true", help="skip and count broken trace lines")
    g.add_argument(
        "--philly-reading",
        choices=["blox", "plain"],
        help="Philly traces: blox = Blox's parse_philly_jobs.py (the default: jobs of 31.6 min to "
        "6.9 h, one GPU each unless --multi-gpu); plain = every job with a valid attempt, its "
        "GPUs from the attempts' detail",
    )
    if multi_gpu:
        g.add_argument(
            "--multi-gpu", action="store_true",
            help="Philly traces read Blox's way: the GPUs of each job's last attempt",
        )  # fmt: skip


def add_workload_args(
    p: argparse.ArgumentParser, *, lists: bool = False, trace: bool = True
) -> None:
    """Where the jobs come from: a trace file (unless `trace=False`), or one of the seeded
    generators. `lists`: --load and --seed take comma lists (a comparison)."""
    compare = " (a comma list compares them)" if lists else ""
    g = p.add_argument_group("workload")
    if trace:
        g.add_argument(
            "--trace", type=Path, help="a trace file (format detected, or --trace-format)"
        )
        add_trace_args(g, multi_gpu=False)
    g.add_argument(
        "--generator",
        choices=["blox", "gavel", "elasticflow"],
        help="the generator when no --trace is given (default blox)",
    )
    g.add_argument(
        "--jobs", type=positive_int, help=f"generated jobs (default {GENERATOR_DEFAULTS['jobs']})"
    )
    g.add_argument(
        "--load",
        type=number_list(float, gt=0),
        help=f"generated arrivals per hour (default 20){compare}",
    )
    g.add_argument(
        "--gpu-demand",
        type=parse_demand,
        help="blox generator: GPUS:WEIGHT,... (default 1:0.7,2:0.1,4:0.15,8:0.05)",
    )
    g.add_argument(
        "--multi-gpu",
        action="store_true",
        help="gavel generator: scale factors 1/2/4/8; Philly traces read Blox's way: the GPUs "
        "of each job's last attempt",
    )
    g.add_argument(
        "--seed", type=number_list(int, ge=0), help=f"generator seed (default 0){compare}"
    )


def given(args: argparse.Namespace, option: str) -> bool:
    """Whether `--option` was on the command line (the workload options default to None)."""
    value = getattr(args, option.lstrip("-").replace("-", "_"), None)
    return value not in (None, False)


def check_workload_args(args: argparse.Namespace, *, lists: bool = False) -> None:
    """Refuse options the chosen source would ignore (ValueError naming them)."""
    if not lists:
        for option in ("--load", "--seed"):
            if given(args, option) and len(getattr(args, option[2:])) > 1:
                raise ValueError(f"{option}: one value here, not a list")
    if getattr(args, "blox", False) and getattr(args, "mode", None) not in (None, "rounds"):
        raise ValueError(f"--mode {args.mode}: --blox decides at round ends (rounds)")
    if getattr(args, "trace", None) is not None:
        ignored = [o for o in GENERATOR_OPTIONS if given(args, o)]
        if ignored:
            raise ValueError(
                f"{', '.join(ignored)} {'describe' if len(ignored) > 1 else 'describes'} "
                "generated jobs; a --trace brings its own"
            )
        return
    ignored = [o for o in TRACE_OPTIONS if given(args, o)]
    if ignored:
        raise ValueError(
            f"{', '.join(ignored)} {'apply' if len(ignored) > 1 else 'applies'} to --trace only"
        )
    generator = args.generator or "blox"
    if args.multi_gpu and generator != "gavel":
        raise ValueError(
            f"--multi-gpu applies to the gavel generator and Philly traces, not to {generator}"
        )
    if args.gpu_demand is not None and generator != "blox":
        raise ValueError(
            f"--gpu-demand applies to the blox generator; {generator} draws GPU counts its own way"
        )


def workload_from_args(
    args: argparse.Namespace, throughputs: Any = None, *, load: float | None = None,
    seed: int | None = None,
) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """The workload the options describe, and what it is (for options.json and plot captions).

    `load`, `seed`: this run's values where the options hold lists.
    """
    from gpuyard.workloads import blox, elasticflow, gavel

    if getattr(args, "trace", None) is not None:
        return read_trace(args, throughputs)
    generator = args.generator or "blox"
    jobs = args.jobs or GENERATOR_DEFAULTS["jobs"]
    load = load if load is not None else (args.load or GENERATOR_DEFAULTS["load"])[0]
    seed = seed if seed is not None else (args.seed or GENERATOR_DEFAULTS["seed"])[0]
    info = {"generator": generator, "jobs": jobs, "load": load, "seed": seed}
    if generator == "gavel":
        info["multi_gpu"] = args.multi_gpu
        return gavel(jobs, load, seed, args.multi_gpu, throughputs=throughputs), info
    if generator == "elasticflow":
        return elasticflow(jobs, 3600.0 / load, seed, throughputs=throughputs), info
    demand = args.gpu_demand or DEFAULT_DEMAND
    info["gpu_demand"] = {str(k): v for k, v in demand.items()}
    return blox(jobs, load, seed, demand), info


def read_trace(args: argparse.Namespace, throughputs: Any = None) -> tuple[Any, dict[str, Any]]:
    """The workload in `args.trace`, read as `--trace-format`, `--skip-bad`, `--philly-reading`
    and `--multi-gpu` say, and what it is; ValueError for an option the format would ignore."""
    from gpuyard.workloads import detect_format, load_workload

    name = detect_format(args.trace) if args.trace_format in (None, "auto") else args.trace_format
    options: dict[str, Any] = {}
    info: dict[str, Any] = {"trace": str(args.trace), "format": name}
    if name == "philly":
        reading = args.philly_reading or "blox"
        if reading == "plain" and args.multi_gpu:
            raise ValueError(
                "--multi-gpu applies to the blox reading of Philly traces; the plain reading "
                "always takes each job's GPUs from its attempts"
            )
        options = {"semantics": reading, "multigpu": args.multi_gpu}
        info |= {"philly_reading": reading, "multi_gpu": args.multi_gpu}
    elif args.philly_reading is not None or args.multi_gpu:
        option = "--philly-reading" if args.philly_reading else "--multi-gpu"
        raise ValueError(f"{option} applies to Philly traces, not to {name} ones")
    elif name == "gavel" and throughputs is not None:
        options = {"throughputs": throughputs}
    elif name in ("elasticflow", "itp") and getattr(args, "elasticflow", False):
        options = {"elastic": True}  # ElasticFlow chooses the GPU counts itself
        info["elastic"] = True
    workload = load_workload(args.trace, name, args.skip_bad, **options)
    return workload, info | {"jobs": len(workload), "skipped": workload.skipped}


def philly_line(info: dict[str, Any]) -> str | None:
    """Which reading of a Philly trace ran, for stderr (None for other formats)."""
    if "philly_reading" not in info:
        return None
    return (
        f"{info['trace']}: Philly trace read the {info['philly_reading']} way"
        f"{' with --multi-gpu' if info['multi_gpu'] else ''} ({info['jobs']:,} jobs; "
        "--philly-reading blox|plain)"
    )


def skipped_lines(workload: Any, shown: int = 5) -> str:
    """`skipped 12 broken trace lines:` and the first few reasons (file, line, why), then a count."""
    lines = [f"skipped {workload.skipped} broken trace lines:"]
    lines += [f"  {reason}" for reason in workload.skip_reasons[:shown]]
    if workload.skipped > shown:
        lines.append(f"  ... and {workload.skipped - shown} more")
    return "\n".join(lines)


def add_sim_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="run a simulation", description="Run a complete simulation.")
    add_nats_arguments(p, url_default=None)  # no --nats: a private server for the run
    p.add_argument("--cluster", default="sim", help="namespace of this run's subjects")
    p.add_argument(
        "--cluster-spec",
        default=None,
        help="NODESxGPUS[:TYPE],..., a TOML/JSON file, an ElasticFlow cluster CSV, or "
        "'none' (only nodes from --node-events); default 32x4, or none with --node-events",
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
        "--nodes-from",
        type=Path,
        help="replay only these nodes of --node-events (a file, one node name a line)",
    )
    p.add_argument(
        "--start",
        help="replay --node-events from this time ('YYYY-MM-DD HH:MM:SS', or seconds): the nodes' "
        "state then, the events after it; a BFTrainer trace's job times count from it too",
    )
    p.add_argument(
        "--churn-node-gpus", type=positive_int, default=1, help="GPUs of a node from --node-events"
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
        type=positive_int,
        default=None,
        help="comparisons: runs at once (default: one per CPU)",
    )
    p.add_argument(
        "--no-pin", dest="pin", action="store_false",
        help="comparisons: let the runs move between CPUs (default: each on a CPU of its own, "
        "with its server; `taskset` chooses the CPUs)",
    )  # fmt: skip
    p.add_argument(
        "--admission", default=None,
        help=f"admission policy (default {DEFAULT_ADMISSION}; a preset's own otherwise)",
    )  # fmt: skip
    p.add_argument("--admission-param", action="append", default=[], help="KEY=VALUE")
    p.add_argument(
        "--placement", default=None,
        help=f"placement policy (default {DEFAULT_PLACEMENT}; a preset's own otherwise)",
    )  # fmt: skip
    p.add_argument("--placement-param", action="append", default=[], help="KEY=VALUE")
    p.add_argument(
        "--round",
        type=positive_float,
        default=None,
        dest="round_s",
        help="round length (s; default 300, 360 with --gavel)",
    )
    p.add_argument(
        "--mode",
        choices=["rounds", "events", "slots"],
        default=None,
        help="decide at round ends only, also at every arrival and completion, or at those at "
        "most once a round (slots: what comes within a round of the last decision waits for "
        "its end, as ElasticFlow's scheduling slot); default events, rounds with --blox, the "
        "scheme's with --elasticflow",
    )
    p.add_argument(
        "--checkpoint-s",
        type=non_negative_float,
        default=0.0,
        help="preemption cost: progress lost to saving a checkpoint (s)",
    )
    p.add_argument(
        "--restore-s",
        type=non_negative_float,
        default=0.0,
        help="preemption cost: time a resumed job needs before it progresses (s)",
    )
    p.add_argument(
        "--min-run-s",
        type=non_negative_float,
        default=0.0,
        help="preemption guard: a started or resumed job runs at least this long before a "
        "decision may stop it (s; default 0: off)",
    )
    presets = p.add_mutually_exclusive_group()
    presets.add_argument(
        "--blox",
        action="store_true",
        help="Blox semantics: rounds mode, jobs admitted and seen finished at round starts",
    )
    presets.add_argument(
        "--gavel",
        action="store_true",
        help="Gavel semantics: 360 s rounds of int(rate x round) steps that end with their last "
        "micro-task, arrivals and completions at round ends; `--policy fifo` is Gavel's FIFO "
        "(gavel_fifo)",
    )
    presets.add_argument(
        "--bftrainer",
        action="store_true",
        help="BFTrainer's replayer: jobs admitted and seen finished only at --node-events' "
        "events; with --policy bftrainer, --param reference_step=true solves its MILP as it runs",
    )
    presets.add_argument(
        "--elasticflow",
        action="store_true",
        help="ElasticFlow's simulator: --policy names its scheme (ef-accessctrl, ef, edf, "
        "edf-accessctrl, gandiva, dlas-gpu, themis, chronus), --round its scheduling slot",
    )
    add_workload_args(p, lists=True)
    p.add_argument(
        "--window",
        type=id_window,
        metavar="FIRST:END",
        help="Gavel's measurement window: the run ends once jobs FIRST to END-1 (in arrival "
        "order) have ended; JCT figures are theirs (give --jobs well past END, so that arrivals "
        "go on while they run)",
    )
    p.add_argument("--processes", action="store_true", help="one OS process per service")
    p.add_argument(
        "--lost-after", type=positive_float, default=5.0, metavar="S", dest="lost_after_s",
        help="with --processes: a service process that died and was not started again within S "
        "seconds ends the run, with partial results (default 5)",
    )  # fmt: skip
    p.add_argument(
        "--durable", action="store_true",
        help="services keep their state in JetStream key-value buckets, as on a real cluster "
        "(slower; with --nats, use a --cluster name new to that server)",
    )  # fmt: skip
    p.add_argument(
        "--external",
        default="",
        metavar="SERVICES",
        help="comma-separated services already running on --nats (e.g. in containers)",
    )
    p.add_argument("--out", type=Path, default=Path("results"), help="output directory")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.set_defaults(run=cmd_sim)  # fmt: skip


def fail(command: str, exc: BaseException) -> int:
    print(f"gpuyard {command}: {exc}", file=sys.stderr)
    return 2


def names_list(option: str, text: str) -> list[str]:
    """A comma list of names (`--policy fifo,las`); ValueError naming the option when empty."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise ValueError(f"{option} {text!r} has an empty name")
    return names


def without_options(argv: list[str], names: set[str], flags: Collection[str] = ()) -> list[str]:
    """`argv` without the options in `names` and their values (`--x v` and `--x=v`), and without
    the `flags` (options that take no value)."""
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
        if arg in flags:
            continue
        kept.append(arg)
    return kept


def cmd_compare(
    args: argparse.Namespace, policies: list[str], loads: list[float | None],
    seeds: list[int | None],
) -> int:  # fmt: skip
    """Several policies, loads or seeds: one `gpuyard sim` each, at once, each on a private server
    (all on `--nats` when given) and, unless `--no-pin`, a CPU of its own.

    Interrupted (Ctrl-C, SIGTERM), every run under way writes its partial results; the table and
    plots are made of what there is, and the exit status is 130.
    """
    import itertools

    import uvloop

    from gpuyard.compare import (
        comparison_caption,
        comparison_table,
        format_comparison,
        run_all,
        run_name,
        write_comparison,
    )
    from gpuyard.forks import default_parallel

    base = without_options(
        args.argv[2:],  # after "gpuyard sim"
        {"--policy", "--param", "--load", "--seed", "--out", "--cluster", "--nats", "--parallel"},
        flags={"--json", "--no-pin"},
    )  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    combos = list(itertools.product(policies, loads, seeds))
    parallel = args.parallel or default_parallel()
    interrupted = False
    try:
        uvloop.run(
            stop_on_signals(
                run_all(base, combos, args.param, args.out, args.nats, parallel, pin=args.pin)
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        interrupted = True
    table = comparison_table(combos, args.out)
    paths = write_comparison(table, args.out, comparison_caption(table, args))
    if not table.empty:
        print(table.to_json(orient="records", indent=2) if args.json else format_comparison(table))
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    if not table.empty and "thrashing" in table:
        thrashing = table[table["thrashing"].fillna(False).astype(bool)]
        names = [
            run_name(r.policy, None if math.isnan(r.load) else r.load, r.seed)
            for r in thrashing.itertuples()
        ]
        if names:
            print(
                f"gpuyard sim: warning: thrashing in {len(names)} of {len(table)} runs "
                f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}): their "
                "preemptions could cost over half the time jobs ran (`thrashing`, "
                "`preemption_overhead` in comparison.csv); --min-run-s S bounds it",
                file=sys.stderr,
            )
    complete = int((~table["partial"]).sum()) if not table.empty else 0
    if interrupted:
        partial = len(table) - complete
        print(
            f"gpuyard sim: interrupted: {complete} of {len(combos)} runs complete, {partial} "
            f"partial (marked in comparison.csv), {len(combos) - len(table)} not run; "
            f"results in {args.out}/",
            file=sys.stderr,
        )
        return 130
    return 0 if complete == len(combos) else 1


async def stop_on_signals(work: Coroutine[Any, Any, T]) -> T:
    """Ctrl-C and `kill` stop a run the same way: the run is cancelled, writes what it got to and
    shuts its services down. (Off the main thread, as in tests, signals are left alone.)"""
    task = asyncio.current_task()
    assert task is not None
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
    return await work


def sim_lists(args: argparse.Namespace) -> tuple[list[str], list[float | None], list[int | None]]:
    """The policies, loads and seeds to run; a trace has no load or seed (None)."""
    policies = names_list("--policy", args.policy)
    if args.trace is not None:  # a seed then seeds only the policies' random choices
        return policies, [None], args.seed or [None]
    return (
        policies,
        args.load or GENERATOR_DEFAULTS["load"],
        args.seed or GENERATOR_DEFAULTS["seed"],
    )


def scheduling_name(args: argparse.Namespace, policy: str) -> str:
    """The scheduling policy `--policy NAME` means (under `--gavel`, Gavel's own names)."""
    return GAVEL_NAMES.get(policy, policy) if args.gavel else policy


def check_policy_names(args: argparse.Namespace, policies: list[str]) -> None:
    """ValueError naming the first unknown policy (ElasticFlow scheme with `--elasticflow`), before
    any run starts: a comparison would otherwise run the others and fail that one."""
    from gpuyard.shared.policy import scheduling_policies
    from gpuyard.sim import elasticflow_scheme

    for policy in policies:
        if args.elasticflow:
            elasticflow_scheme(policy)
        else:
            scheduling_policies.get(scheduling_name(args, policy))


def warn_policies(options: Any, ran: dict[str, Any]) -> None:
    """On stderr: each service whose policy or parameters are not those `options` (SimOptions)
    asked for (services started elsewhere, `--external`, run their own)."""
    from gpuyard.shared.contract import PolicyInfo
    from gpuyard.shared.policy import admission_policies, placement_policies, scheduling_policies

    asked = {
        "scheduler": (scheduling_policies, options.policy, options.policy_params),
        "admission": (admission_policies, options.admission, options.admission_params),
        "placement": (placement_policies, options.placement, options.placement_params),
    }
    for service, (registry, name, params) in asked.items():
        info = ran.get(service)
        if not isinstance(info, PolicyInfo):
            print(
                f"gpuyard sim: warning: {service} did not say its policy: {info}", file=sys.stderr
            )
            continue
        runs = f"{info.policy} {' '.join(f'{k}={v}' for k, v in info.params.items())}".rstrip()
        if info.policy != name:
            print(
                f"gpuyard sim: warning: {service} runs {runs}, not the {name} asked for; "
                "results record what ran",
                file=sys.stderr,
            )
            continue
        try:  # the parameters asked for, typed and with defaults, as the service reports its own
            wanted = msgspec.to_builtins(registry.create(name, params).params)
        except (PolicyError, ValueError):
            continue
        differs = sorted(k for k, v in wanted.items() if info.params.get(k) != v)
        if differs:
            print(
                f"gpuyard sim: warning: {service} runs {runs}, not the {', '.join(differs)} "
                "asked for; results record what ran",
                file=sys.stderr,
            )


def cmd_sim(args: argparse.Namespace) -> int:
    import uvloop

    from gpuyard.cliopts import checked_subjects, checked_url, run_command
    from gpuyard.report import format_summary, thrashing_line
    from gpuyard.shared.logs import configure_logging
    from gpuyard.sim import ProgressBar, simulate
    from gpuyard.workloads import WorkloadError

    try:
        policies, loads, seeds = sim_lists(args)
        check_workload_args(args, lists=True)
        external = (
            frozenset(names_list("--external", args.external)) if args.external else frozenset()
        )
        unknown = sorted(external - set(SERVICES))
        if unknown:
            raise ValueError(f"--external {unknown[0]!r} is not one of {', '.join(SERVICES)}")
        if external and not args.nats:
            raise ValueError("--external needs --nats: the server where those services run")
        if args.nats:
            checked_url(args.nats)
        checked_subjects(args.cluster)
        if "scheduler" not in external:
            check_policy_names(args, policies)
    except (ValueError, CommandError) as exc:
        return fail("sim", exc)
    if args.nats:  # reachable? one line now rather than services retrying forever
        code = run_command("sim", reachable(args))
        if code:
            return code
    if len(policies) * len(loads) * len(seeds) > 1:
        if args.node_events is not None:  # (comparisons do not replay node events yet)
            return fail("sim", ValueError("--node-events: one run at a time, not a comparison"))
        try:  # what every run reads (throughputs, trace, cluster): one line now, not one a run
            sim_setup(first_run(args, policies[0]), external, load=loads[0], seed=seeds[0])
            for policy in policies[1:]:  # each policy with its parameters, before any run starts
                sim_options(first_run(args, policy), external, seed=seeds[0])
        except (ValueError, OSError, msgspec.ValidationError, WorkloadError) as exc:
            return fail("sim", exc)
        return cmd_compare(args, policies, loads, seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        options, workload, described = written_setup(args, external, load=loads[0], seed=seeds[0])
    except (ValueError, OSError, msgspec.ValidationError, WorkloadError) as exc:
        return fail("sim", exc)
    log = open(args.out / "services.log", "a")  # noqa: SIM115 (open for the whole run)
    configure_logging(args.log_level, log)
    library_logs_to(log)
    started = time.time()

    def show(summary: dict[str, Any]) -> None:  # (before the other result files are written)
        if summary.get("partial"):  # (`interrupted` says what was written)
            return
        print(json.dumps(summary, indent=2) if args.json else format_summary(summary), flush=True)
        if thrashing_line(summary):
            print(f"gpuyard sim: warning: {thrashing_line(summary)}", file=sys.stderr)

    try:
        uvloop.run(
            stop_on_signals(
                simulate(
                    options,
                    workload,
                    args.out,
                    nats_url=args.nats,
                    cluster_name=args.cluster,
                    processes=args.processes,
                    lost_after_s=args.lost_after_s,
                    on_progress=ProgressBar(args.cluster),
                    external=external,
                    log_level=args.log_level,
                    auth=NatsAuth.from_args(args),
                    workload=described,
                    on_policies=lambda ran: warn_policies(options, ran),
                    on_summary=show,
                    keep_jobs=False,  # (the summary is all it shows)
                )
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        return interrupted(args, started)
    except (RuntimeError, OSError, PolicyError, nats.errors.Error) as exc:
        print(f"gpuyard sim: {exc}", file=sys.stderr)
        return 1
    finally:
        log.close()
    print(f"results in {args.out}/", file=sys.stderr)
    return 0


def written_setup(
    args: argparse.Namespace, external: frozenset[str], *, load: float | None, seed: int | None
) -> tuple[Any, Any, dict[str, Any]]:
    """`sim_setup`'s run with its workload written into `args.out` (`sim.WrittenWorkload`): the
    jobs leave this process's memory before the run starts (the clock reads them from the file).
    Says on stderr what was skipped, and how a Philly trace was read."""
    from gpuyard.sim import written_workload

    options, workload, described = sim_setup(args, external, load=load, seed=seed)
    if workload.skipped:
        print(f"gpuyard sim: {skipped_lines(workload)}", file=sys.stderr)
    if philly_line(described):
        print(f"gpuyard sim: {philly_line(described)}", file=sys.stderr)
    return options, written_workload(workload.jobs, args.out), described


def first_run(args: argparse.Namespace, policy: str) -> argparse.Namespace:
    """A comparison's options as its run of `policy` gets them (`gpuyard.compare.run_all`)."""
    from gpuyard.compare import policy_params

    return argparse.Namespace(**{**vars(args), "policy": policy,
                                 "param": policy_params(policy, args.param)})  # fmt: skip


PolicyParams = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]
"""Scheduling, admission and placement parameters."""


def sim_setup(
    args: argparse.Namespace, external: frozenset[str] = frozenset(), *, load: float | None,
    seed: int | None, params: PolicyParams | None = None,
) -> tuple[Any, Any, dict[str, Any]]:  # fmt: skip
    """The simulation `gpuyard sim`'s options describe: its SimOptions (`sim_options`), its
    workload and what the workload is (for options.json and captions); node events are written
    into `args.out`. Raises ValueError (PolicyError), OSError, msgspec.ValidationError or
    WorkloadError naming what is wrong."""
    from gpuyard.shared.throughput import load_throughputs
    from gpuyard.workloads import save_node_events
    from gpuyard.workloads.churn import load_node_list

    options = sim_options(args, external, seed=seed, params=params)
    model = load_throughputs(args.throughputs)
    workload, described = workload_from_args(args, model, load=load, seed=seed)
    if args.window is not None and args.window[1] > len(workload.jobs):
        raise ValueError(
            f"--window {args.window[0]}:{args.window[1]}: the workload has only "
            f"{len(workload.jobs):,} jobs"
        )
    if args.node_events is not None:
        workload, events = replay_from_args(args, workload)
        described["node_events"] = {
            "file": str(args.node_events), "nodes_from": args.nodes_from and str(args.nodes_from),
            "nodes": len(load_node_list(args.nodes_from)) if args.nodes_from else
            int(events["node"].nunique()),
            "start": args.start,
            "bftrainer": args.bftrainer,
        }  # fmt: skip
        events_path = args.out / "node_events.csv"
        save_node_events(events, events_path)
        options.node_events = str(events_path.resolve())
    elif args.nodes_from is not None or args.start is not None or args.bftrainer:
        raise ValueError("--nodes-from, --start and --bftrainer apply to --node-events")
    return options, workload, described


def sim_options(
    args: argparse.Namespace, external: frozenset[str] = frozenset(), *, seed: int | None,
    params: PolicyParams | None = None,
) -> Any:  # fmt: skip
    """The SimOptions of the run `gpuyard sim`'s options describe, with the policies not in
    `external` checked (PolicyError naming a bad one). `params`: the three policies'
    parameters, typed (a sweep's config), instead of the `--param` options' text."""
    from gpuyard.shared.policy import admission_policies, placement_policies, scheduling_policies
    from gpuyard.sim import PreemptionCost, SimOptions
    from gpuyard.workloads import load_cluster

    if params is None:
        params = (parse_params(args.param), parse_params(args.admission_param),
                  parse_params(args.placement_param))  # fmt: skip
    # A replay of node availability brings its own nodes (BFTrainer's idle nodes): no others.
    cluster_spec = args.cluster_spec or ("none" if args.node_events is not None else "32x4")
    cluster = (
        ClusterSpec(groups=[]) if cluster_spec == "none" else load_cluster(cluster_spec)
    )
    options = SimOptions(
        cluster=cluster,
        throughputs=args.throughputs,
        policy=scheduling_name(args, args.policy),
        policy_params=params[0],
        admission=args.admission or DEFAULT_ADMISSION,
        admission_params=params[1],
        placement=args.placement or DEFAULT_PLACEMENT,
        placement_params=params[2],
        round_s=args.round_s or (GAVEL_ROUND_S if args.gavel else 300.0),
        mode="rounds" if args.blox else args.mode or "events",
        blox=args.blox,
        gavel=args.gavel,
        window=args.window,
        bftrainer=args.bftrainer,
        churn_node_gpus=args.churn_node_gpus,
        preemption_cost=PreemptionCost(checkpoint_s=args.checkpoint_s, restore_s=args.restore_s),
        min_run_s=args.min_run_s,
        durable=args.durable,
    )
    if args.gavel:
        options = gavel_defaults(options)
    if args.elasticflow:
        from gpuyard.sim import elasticflow_options, elasticflow_switch_nodes

        scheme = elasticflow_options(
            args.policy, options.round_s, cluster.total_gpus,
            switch_nodes=elasticflow_switch_nodes(cluster),
        )  # fmt: skip
        options = msgspec.structs.replace(options, **preset_filled(scheme, args, params))
    if args.trace is not None and seed is not None:
        options = seeded_policies(options, seed)
    if "scheduler" not in external:
        scheduling_policies.create(options.policy, options.policy_params)
    if "admission" not in external:
        admission_policies.create(options.admission, options.admission_params)
    if "placement" not in external:
        placement_policies.create(options.placement, options.placement_params)
    return options


def gavel_defaults(options: Any) -> Any:
    """`options` with `GAVEL_PARAMS` for the scheduling policy's parameters it has and was not
    given."""
    from gpuyard.shared.policy import scheduling_policies

    made = scheduling_policies.create(options.policy, options.policy_params).params
    fields = made.__struct_fields__ if made is not None else ()
    extra = {k: v for k, v in GAVEL_PARAMS.items() if k in fields and k not in options.policy_params}
    return msgspec.structs.replace(options, policy_params={**options.policy_params, **extra})


def seeded_policies(options: Any, seed: int) -> Any:
    """`options` with `seed` as the `seed` parameter of each policy that has one and was not
    given it (a trace's jobs are fixed: `--seed` then seeds the policies' random choices, as
    Gavel's `--seed` does)."""
    from gpuyard.shared.policy import admission_policies, placement_policies, scheduling_policies

    changes: dict[str, Any] = {}
    for registry, name, field in [
        (scheduling_policies, options.policy, "policy_params"),
        (admission_policies, options.admission, "admission_params"),
        (placement_policies, options.placement, "placement_params"),
    ]:
        params = getattr(options, field)
        made = registry.create(name, params).params
        if "seed" not in params and made is not None and "seed" in made.__struct_fields__:
            changes[field] = {**params, "seed": seed}
    return msgspec.structs.replace(options, **changes)


def replay_from_args(args: argparse.Namespace, workload: Any) -> tuple[Any, Any]:
    """The node events to replay (`--node-events`, `--nodes-from`, `--start`; see
    `gpuyard.workloads.churn`) and the workload on the same clock: a BFTrainer trace's job times
    count from `--start` (jobs submitted before it arrive at the start), or from its first job."""
    import datetime as dt

    import pandas as pd

    from gpuyard.workloads import load_node_events
    from gpuyard.workloads.churn import load_node_list, parse_start, replay_events

    start = parse_start(args.start) if args.start is not None else None
    nodes = load_node_list(args.nodes_from) if args.nodes_from is not None else None
    origin = start if isinstance(start, dt.datetime) else None
    extras = workload.extras
    if extras is not None and "Tsub" in extras.columns:  # BFTrainer: line node and job times up
        first = pd.to_datetime(extras["Tsub"]).min().to_pydatetime()
        if origin is None:
            origin = first
        shift = (first - origin).total_seconds()
        if shift:
            jobs = [
                msgspec.structs.replace(j, submit_time=max((j.submit_time or 0.0) + shift, 0.0))
                for j in workload.jobs
            ]
            workload = dataclasses.replace(workload, jobs=jobs)
    events = load_node_events(args.node_events, origin=origin, nodes=nodes)
    if isinstance(start, float):
        events["time"] -= start
    return workload, replay_events(events, nodes)


async def reachable(args: argparse.Namespace) -> int:
    """0 once `--nats` answered (CommandError naming it otherwise)."""
    from gpuyard.cliopts import open_bus

    await (await open_bus(args, "gpuyard-sim")).close()
    return 0


class JsonLines(logging.Formatter):
    """Standard-library log records as JSON lines, like structlog's."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"event": record.getMessage(), "logger": record.name, "level": record.levelname}
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = repr(record.exc_info[1])
        return json.dumps(entry)


def library_logs_to(stream: Any) -> None:
    """nats-py reports a connection's trouble (e.g. a drain that timed out while services stop)
    through `logging`: into the run's log, not onto the terminal."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines())
    nats_log = logging.getLogger("nats")
    nats_log.addHandler(handler)
    nats_log.propagate = False


def interrupted(args: argparse.Namespace, started: float) -> int:
    """After Ctrl-C or SIGTERM: say what was written (the partial summary, if the run had begun;
    the whole one, if it had ended). `started`: when the run began (an older summary is not its)."""
    from gpuyard.report import format_summary

    path = args.out / "summary.json"
    ours = path.exists() and path.stat().st_mtime >= started
    summary = json.loads(path.read_text()) if ours else {}
    if not summary:
        print("gpuyard sim: interrupted before the run began; nothing written", file=sys.stderr)
        return 130
    if not summary.get("partial"):  # (stopping after its results were written)
        print(f"gpuyard sim: interrupted after the run ended: its results are whole in {args.out}/",
              file=sys.stderr)  # fmt: skip
        return 130
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    print(
        f"gpuyard sim: interrupted at t = {summary['simulated_s'] / 3600:,.1f} h simulated: "
        f"{summary['completed']:,} of {summary['jobs_in_workload']:,} jobs had completed; "
        f'partial results ("partial": true) in {args.out}/',
        file=sys.stderr,
    )
    return 130


def add_trace_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="generate, convert and describe workloads")
    tsub = p.add_subparsers(required=True, metavar="ACTION")
    g = tsub.add_parser("generate", help="write a generated workload")
    add_workload_args(g, trace=False)
    g.add_argument("--throughputs", help="fill in total_steps from this throughput model")
    g.add_argument("out", type=Path, help="output .csv or .parquet")
    g.set_defaults(run=cmd_trace_generate)
    c = tsub.add_parser("convert", help="convert any supported trace to gpuyard's CSV/Parquet")
    add_trace_args(c)
    c.add_argument("trace", type=Path)
    c.add_argument("out", type=Path)
    c.set_defaults(run=cmd_trace_convert)
    d = tsub.add_parser("describe", help="print counts and quantiles, write plots")
    add_trace_args(d)
    d.add_argument(
        "--plots", type=Path, default=Path("."),
        help="folder for the plots (default: the working directory)",
    )  # fmt: skip
    d.add_argument("trace", type=Path)
    d.set_defaults(run=cmd_trace_describe)


def cmd_trace_generate(args: argparse.Namespace) -> int:
    from gpuyard.shared.throughput import load_throughputs
    from gpuyard.workloads import save_workload

    try:
        check_workload_args(args)
        model = load_throughputs(args.throughputs) if args.throughputs else None
        workload, _ = workload_from_args(args, model)
        path = save_workload(workload, args.out)
    except (ValueError, OSError) as exc:
        return fail("trace generate", exc)
    print(path)
    return 0


def cmd_trace_convert(args: argparse.Namespace) -> int:
    from gpuyard.workloads import save_workload

    try:
        workload, info = read_trace(args)
        path = save_workload(workload, args.out)
    except (ValueError, OSError) as exc:
        return fail("trace convert", exc)
    for line in (philly_line(info), workload.skipped and skipped_lines(workload)):
        if line:
            print(f"gpuyard trace convert: {line}", file=sys.stderr)
    print(f"{len(workload)} jobs -> {path}")
    return 0


def cmd_trace_describe(args: argparse.Namespace) -> int:
    from gpuyard.report import plot_workload

    try:
        workload, info = read_trace(args)
    except (ValueError, OSError) as exc:
        return fail("trace describe", exc)
    for line in (philly_line(info), workload.skipped and skipped_lines(workload)):
        if line:
            print(f"gpuyard trace describe: {line}", file=sys.stderr)
    args.plots.mkdir(parents=True, exist_ok=True)
    paths = plot_workload(workload.to_frame(with_extras=False), args.plots, args.trace.stem, info)
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


def sim_parser() -> OneLineParser:
    """A parser of `gpuyard sim` alone (a sweep parses every run's options: the whole command's
    parser costs ten times more to build)."""
    parser = OneLineParser(prog="gpuyard")
    add_sim_parser(parser.add_subparsers(required=True, metavar="COMMAND"))
    return parser


def build_parser() -> OneLineParser:
    """The `gpuyard` command's parser, every subcommand in it."""
    parser = OneLineParser(prog="gpuyard", description=__doc__)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    add_sim_parser(sub)
    add_trace_parser(sub)
    add_cluster_parsers(sub)
    add_ops_parsers(sub)
    add_auth_parser(sub)
    add_sweep_parsers(sub)
    p = sub.add_parser("schema", help="print (or --write) the wire contract's JSON Schema")
    p.add_argument("--write", action="store_true", help=f"write it to {SCHEMA_PATH}/")
    p.set_defaults(run=cmd_schema)
    p = sub.add_parser(
        "service", help="run one service (admission, scheduler, placement, simclock)"
    )
    p.add_argument("name", choices=["admission", "scheduler", "placement", "simclock"])
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
    args.argv = ["gpuyard", *argv]
    try:
        resolve_options(args)
    except CommandError as exc:
        print(f"gpuyard: {exc}", file=sys.stderr)
        return exc.code
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

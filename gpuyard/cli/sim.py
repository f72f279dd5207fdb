"""`gpuyard sim` (one run, or a comparison of several) and `gpuyard trace`: their options, and
`run_spec`, the one place those options become a run (`gpuyard.run.spec.RunSpec`)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, get_args

import msgspec

from gpuyard.cli.options import (
    LOG_LEVELS,
    CommandError,
    Subcommands,
    add_time_limit_options,
    deadline_factor_text,
    demand_text,
    non_negative_float,
    number,
    number_list,
    output_file,
    positive_float,
    positive_int,
    repeated,
    window_text,
)
from gpuyard.run.build import GENERATOR_DEFAULTS
from gpuyard.run.presets import PRESETS
from gpuyard.run.spec import (
    DEFAULT_ADMISSION,
    DEFAULT_PLACEMENT,
    GeneratorName,
    ParamValue,
    RunPlace,
    RunSpec,
)
from gpuyard.shared.connection import NatsAuth, add_nats_arguments
from gpuyard.shared.policy import own_params, parse_params
from gpuyard.shared.roster import SERVICES

if TYPE_CHECKING:
    from gpuyard.plotter import Plotter


def add_trace_args(g: Any, *, multi_gpu: bool = True) -> None:
    """How a trace file is read: its format, broken lines, the reading of Philly traces."""
    g.add_argument(
        "--trace-format",
        help="gavel, elasticflow, itp, bftrainer, blox, philly, helios, acme, openb, pai, "
        "gpuyard, csv, parquet (default: detect)",
    )
    g.add_argument("--skip-bad", action="store_true", help="skip and count broken trace lines")
    g.add_argument(
        "--philly-reading",
        choices=["blox", "plain", "attempts"],
        help="Philly traces: blox = Blox's parse_philly_jobs.py (the default: jobs of 31.6 min to "
        "6.9 h, one GPU each unless --multi-gpu, all complete); plain = every job with a valid "
        "attempt, its GPUs from the attempts' detail, ending as recorded (Pass, Killed, Failed); "
        "attempts = every valid attempt a job of its own (<jobid>-attempt<k>), each retry "
        "waiting for the attempt before, which failed; the last ends as recorded",
    )
    g.add_argument(
        "--cpu-jobs",
        choices=["skip", "keep"],
        help="Helios, Acme and openb traces: skip their CPU-only jobs (the default; counted) or keep "
        "them as one-GPU jobs",
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
        choices=list(get_args(GeneratorName)),
        help="the generator when no --trace is given (default blox); helios, seren, kalos, pai "
        "and philly draw jobs calibrated on those clusters' published statistics",
    )
    g.add_argument(
        "--jobs", type=positive_int, help=f"generated jobs (default {GENERATOR_DEFAULTS['jobs']})"
    )
    g.add_argument(
        "--load",
        type=number_list(float, gt=0),
        help="generated arrivals per hour (default 20; a calibrated generator: its trace's "
        f"mean rate){compare}",
    )
    g.add_argument(
        "--gpu-demand",
        type=demand_text,
        help="blox generator: GPUS:WEIGHT,... (default 1:0.7,2:0.1,4:0.15,8:0.05)",
    )
    g.add_argument(
        "--deadline-factor",
        type=deadline_factor_text,
        help="elasticflow generator: a job's deadline is its arrival plus FACTOR (or a factor "
        "drawn per job from MIN:MAX) times its duration (default 0.5:1.5)",
    )
    g.add_argument(
        "--best-effort-share",
        type=number(float, ge=0, le=1),
        help="elasticflow generator: the share of jobs that are best-effort, without a "
        "deadline (0 to 1; default 0)",
    )
    g.add_argument(
        "--users", type=positive_int,
        help="generators: spread the jobs over N users (user0, user1, ...), at random; the "
        "summary then adds each user's figures and how fairly they were treated",
    )  # fmt: skip
    g.add_argument(
        "--multi-gpu",
        action="store_true",
        help="gavel generator: scale factors 1/2/4/8; Philly traces read Blox's way: the GPUs "
        "of each job's last attempt",
    )
    g.add_argument(
        "--seed", type=number_list(int, ge=0), help=f"generator seed (default 0){compare}"
    )


def add_sim_parser(sub: Subcommands) -> None:
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
        "--profiles",
        default=None,
        help="a folder of models' profiles (Pollux's traces/): jobs of those models train at "
        "their goodput, epoch by epoch (default with --pollux: traces/ beside the workload's "
        "folder; with --sia: Sia's per-GPU-type traces/, two folders above the workload's)",
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
        "--queues", metavar="FILE",
        help="the kueue policy's queues (TOML: [[queue]] name, quota, users, cohort, limits; "
        "docs/simulation.md)",
    )  # fmt: skip
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
    add_time_limit_options(p)
    presets = p.add_mutually_exclusive_group()
    for preset in PRESETS.values():
        presets.add_argument(f"--{preset.name}", action="store_true", help=preset.help)
    p.add_argument(
        "--as-intended", action="store_true",
        help="with a preset: where its reference's code has a bug (docs/fidelity.md), do what it "
        "meant (" + "; ".join(f"--{p.name}: {p.intended}" for p in PRESETS.values() if p.intended)
        + ")",
    )  # fmt: skip
    add_workload_args(p, lists=True)
    p.add_argument(
        "--window",
        type=window_text,
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
    p.add_argument(
        "--out", type=Path, default=None,
        help="output directory (default results/POLICIES-TIME); one that holds another run's "
        "results is refused without --overwrite",
    )  # fmt: skip
    p.add_argument(
        "--strict", action="store_true",
        help="a job that no node of the cluster can hold makes the run fail (exit 1); without it, "
        "a warning (the job is in jobs.csv, declined, with why)",
    )  # fmt: skip
    p.add_argument(
        "--overwrite", action="store_true",
        help="replace the results --out holds (gpuyard's own files; any other file stays)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.set_defaults(run=cmd_sim)  # fmt: skip


def fail(command: str, exc: BaseException) -> int:
    print(f"gpuyard {command}: {exc}", file=sys.stderr)
    return 2


def names_list(option: str, text: str) -> list[str]:
    """A comma list of names (`--policy fifo,las`); ValueError naming the option when one is empty
    or named twice."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise ValueError(f"{option} {text!r} has an empty name")
    if (twice := repeated(names)) is not None:  # (the same run twice, into one folder)
        raise ValueError(f"{option} {text!r} names {twice!r} twice")
    return names


def sim_lists(args: argparse.Namespace) -> tuple[list[str], list[float | None], list[int | None]]:
    """The policies, loads and seeds to run; a trace has no load or seed (None)."""
    policies = names_list("--policy", args.policy)
    if args.queues is not None and "kueue" not in policies:
        raise ValueError("--queues gives the kueue policy its queues: add --policy kueue")
    if args.trace is not None:  # a seed then seeds only the policies' random choices
        return policies, [None], args.seed or [None]
    from gpuyard.workloads.calibrated import CLUSTERS

    # a calibrated generator's jobs arrive at its trace's rate unless --load says otherwise
    default_load = None if args.generator in CLUSTERS else GENERATOR_DEFAULTS["load"]
    return policies, args.load or [default_load], args.seed or [GENERATOR_DEFAULTS["seed"]]


def text_params(pairs: list[str]) -> dict[str, ParamValue]:
    """`parse_params`: the values stay text, which the run's checks convert."""
    return dict(parse_params(pairs))


def run_spec(
    args: argparse.Namespace, *, policy: str | None = None, load: float | None = None,
    seed: int | None = None,
) -> RunSpec:  # fmt: skip
    """The run the options of `gpuyard sim` (or of `gpuyard trace`) describe, with this
    `policy`, `load` and `seed` where given (one of a comparison's; otherwise the options' own,
    the first of a list). The one place options become a run; PolicyError for a parameter that
    is not KEY=VALUE."""

    def option(name: str, default: Any = None) -> Any:
        return getattr(args, name, default)

    def text(name: str) -> str | None:
        value = option(name)
        return None if value is None else str(value)

    policy = policy or option("policy", "fifo")
    load_list, seed_list = option("load"), option("seed")
    return RunSpec(
        policy=policy,
        queues=text("queues"),
        policy_params=own_params(policy, text_params(option("param", []))),
        admission=option("admission"),
        admission_params=text_params(option("admission_param", [])),
        placement=option("placement"),
        placement_params=text_params(option("placement_param", [])),
        preset=next((p for p in PRESETS if option(p, False)), None),
        as_intended=option("as_intended", False),
        round_s=option("round_s"),
        mode=option("mode"),
        cluster_spec=option("cluster_spec"),
        throughputs=option("throughputs") or "default",
        profiles=option("profiles"),
        generator=option("generator"),
        jobs=option("jobs"),
        load=load if load is not None else (load_list[0] if load_list else None),
        seed=seed if seed is not None else (seed_list[0] if seed_list else None),
        gpu_demand=option("gpu_demand"),
        deadline_factor=option("deadline_factor"),
        best_effort_share=option("best_effort_share"),
        multi_gpu=option("multi_gpu", False),
        users=option("users"),
        trace=text("trace"),
        trace_format=option("trace_format"),
        skip_bad=option("skip_bad", False),
        philly_reading=option("philly_reading"),
        cpu_jobs=option("cpu_jobs"),
        window=option("window"),
        node_events=text("node_events"),
        nodes_from=text("nodes_from"),
        start=option("start"),
        churn_node_gpus=option("churn_node_gpus", 1),
        checkpoint_s=option("checkpoint_s", 0.0),
        restore_s=option("restore_s", 0.0),
        min_run_s=option("min_run_s", 0.0),
        default_time_limit_s=option("default_time_limit"),
        max_time_limit_s=option("max_time_limit"),
    )


def run_place(args: argparse.Namespace, external: frozenset[str]) -> RunPlace:
    """Where `gpuyard sim`'s options say its run goes."""
    return RunPlace(
        out=args.out, nats_url=args.nats, cluster=args.cluster, auth=NatsAuth.from_args(args),
        external=external, processes=args.processes, lost_after_s=args.lost_after_s,
        durable=args.durable, log_level=args.log_level, json=args.json, strict=args.strict,
    )  # fmt: skip


def check_lists(args: argparse.Namespace) -> None:
    """`--load` and `--seed` take one value where the command runs one workload."""
    for name in ("load", "seed"):
        if len(getattr(args, name) or ()) > 1:
            raise ValueError(f"--{name}: one value here, not a list")


def cmd_sim(args: argparse.Namespace) -> int:
    from gpuyard.plotter import Plotter

    # First: a run's plotter imports matplotlib on another core while this process imports the
    # rest and checks the options (a comparison's runs start their own: this one is stopped).
    with Plotter.start() as plotter:
        return simulate_command(args, plotter)


def simulate_command(args: argparse.Namespace, plotter: Plotter) -> int:
    """`gpuyard sim`: one run (drawn by `plotter`) or a comparison."""
    from gpuyard.cli.options import checked_subjects, checked_url, run_command
    from gpuyard.run.build import build, check_policy_name, check_workload, sim_options
    from gpuyard.run.outputs import claim, default_out
    from gpuyard.run.single import simulate_one
    from gpuyard.workloads import WorkloadError

    try:
        policies, loads, seeds = sim_lists(args)
        combos = list(itertools.product(policies, loads, seeds))
        specs = [run_spec(args, policy=p, load=load, seed=seed) for p, load, seed in combos]
        check_workload(specs[0])
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
            for spec in specs[:: len(loads) * len(seeds)]:  # (the first run of each policy)
                check_policy_name(spec)
    except (ValueError, CommandError) as exc:
        return fail("sim", exc)
    if args.nats:  # reachable? one line now rather than services retrying forever
        code = run_command("sim", reachable(args))
        if code:
            return code
    args.out = args.out or default_out(policies)
    if len(specs) == 1:
        try:
            claim(args.out, overwrite=args.overwrite)
        except ValueError as exc:
            return fail("sim", exc)
        return simulate_one(specs[0], run_place(args, external), plotter)
    if args.node_events is not None:  # (comparisons do not replay node events yet)
        return fail("sim", ValueError("--node-events: one run at a time, not a comparison"))
    try:  # what every run reads (throughputs, trace, cluster): one line now, not one a run
        build(specs[0], args.out, external)
        for spec in specs[len(loads) * len(seeds) :: len(loads) * len(seeds)]:
            sim_options(spec, external)  # each policy with its parameters, before any run starts
        claim(args.out, overwrite=args.overwrite)
    except (ValueError, OSError, msgspec.ValidationError, WorkloadError) as exc:
        return fail("sim", exc)
    plotter.close()  # (each of the comparison's runs draws its own)
    # (--strict is the comparison's to apply: each run, its one line and its results, is whole)
    return cmd_compare(
        args, combos, specs, dataclasses.replace(run_place(args, external), strict=False)
    )


def cmd_compare(
    args: argparse.Namespace, combos: list[tuple[str, float | None, int | None]],
    specs: list[RunSpec], place: RunPlace,
) -> int:  # fmt: skip
    """Several policies, loads or seeds: one run each (`specs`, in the order of `combos`), at
    once, each on a private server (all on `--nats` when given) and, unless `--no-pin`, a CPU of
    its own.

    Interrupted (Ctrl-C, SIGTERM), every run under way writes its partial results; the table and
    plots are made of what there is, and the exit status is 130.
    """
    import uvloop

    from gpuyard.run.compare import (
        comparison_caption,
        comparison_table,
        format_comparison,
        run_all,
        run_name,
        write_comparison,
    )
    from gpuyard.run.forks import default_parallel
    from gpuyard.run.process import stop_on_signals

    args.out.mkdir(parents=True, exist_ok=True)
    runs = [(run_name(*combo), spec) for combo, spec in zip(combos, specs, strict=True)]
    parallel = args.parallel or default_parallel()
    interrupted = False
    try:
        uvloop.run(stop_on_signals(run_all(runs, place, parallel, pin=args.pin)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        interrupted = True
    table = comparison_table(combos, args.out)
    paths = write_comparison(table, args.out, comparison_caption(table, specs[0]))
    if not table.empty:
        print(table.to_json(orient="records", indent=2) if args.json else format_comparison(table))
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    if not table.empty and "thrashing" in table:
        thrashing = table[table["thrashing"].fillna(False).astype(bool)]
        names = []
        for r in thrashing.itertuples():  # (the table's columns: pandas-stubs cannot see them)
            load = cast(float, r.load)  # NaN: a trace
            names.append(run_name(cast(str, r.policy), None if math.isnan(load) else load,
                                  cast("int | None", r.seed)))  # fmt: skip
        if names:
            print(
                f"gpuyard sim: warning: thrashing in {len(names)} of {len(table)} runs "
                f"({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}): their "
                "preemptions could cost over half the time jobs ran (`thrashing`, "
                "`preemption_overhead` in comparison.csv); --min-run-s S bounds it",
                file=sys.stderr,
            )
    statuses = table["status"].tolist() if not table.empty else []
    complete = statuses.count("ok")
    errors = table.get("error", [None] * len(statuses))
    for combo, status, error in zip(combos, statuses, errors, strict=False):  # (rows: combos')
        if status == "failed":
            print(f"gpuyard sim: run {run_name(*combo)} failed: {error}", file=sys.stderr)
    never = table["never_fits"].fillna(0) if "never_fits" in table else None
    runs_hit = int((never > 0).sum()) if never is not None else 0
    if runs_hit:
        print(
            f"gpuyard sim: {'--strict' if args.strict else 'warning'}: {runs_hit} of "
            f"{len(combos)} runs have jobs that can never run on this cluster (declined, with "
            "why, in their jobs.csv; `never_fits` in comparison.csv)"
            + ("" if args.strict else "; --strict makes that an error"),
            file=sys.stderr,
        )
    if interrupted:
        print(
            f"gpuyard sim: interrupted: {complete} of {len(combos)} runs complete, "
            f"{statuses.count('partial')} partial (marked in comparison.csv), "
            f"{statuses.count('not run')} not run; results in {args.out}/",
            file=sys.stderr,
        )
        return 130
    return 0 if complete == len(combos) and not (args.strict and runs_hit) else 1


async def reachable(args: argparse.Namespace) -> int:
    """0 once `--nats` answered (CommandError naming it otherwise)."""
    from gpuyard.cli.options import open_bus

    await (await open_bus(args, "gpuyard-sim")).close()
    return 0


def add_trace_parser(sub: Subcommands) -> None:
    p = sub.add_parser("trace", help="generate, convert and describe workloads")
    tsub = p.add_subparsers(required=True, metavar="ACTION")
    g = tsub.add_parser("generate", help="write a generated workload")
    add_workload_args(g, trace=False)
    g.add_argument("--throughputs", help="fill in total_steps from this throughput model")
    g.add_argument("out", type=output_file, help="output .csv or .parquet")
    g.set_defaults(run=cmd_trace_generate)
    c = tsub.add_parser("convert", help="convert any supported trace to gpuyard's CSV/Parquet")
    add_trace_args(c)
    c.add_argument("trace", type=Path)
    c.add_argument("out", type=output_file)
    c.set_defaults(run=cmd_trace_convert)
    d = tsub.add_parser("describe", help="print counts and quantiles, write plots")
    add_trace_args(d)
    d.add_argument(
        "--plots", type=Path, default=Path("."),
        help="folder for the plots (default: the working directory)",
    )  # fmt: skip
    d.add_argument(
        "--against", metavar="REAL",
        help="compare with REAL: a trace file (read with the same options) or a published "
        "cluster (helios, seren, kalos, pai, philly: its row of AcmeTrace's "
        "cluster_summary.csv); writes <stem>_vs_<real>.png and adds `against` to the JSON",
    )  # fmt: skip
    d.add_argument("trace", type=Path)
    d.set_defaults(run=cmd_trace_describe)


def cmd_trace_generate(args: argparse.Namespace) -> int:
    from gpuyard.run.build import check_workload, make_workload
    from gpuyard.shared.throughput import load_throughputs
    from gpuyard.workloads import save_workload

    try:
        check_lists(args)
        spec = run_spec(args)
        check_workload(spec)
        model = load_throughputs(args.throughputs) if args.throughputs else None
        workload, _ = make_workload(spec, model)
        path = save_workload(workload, args.out)
    except (ValueError, OSError) as exc:
        return fail("trace generate", exc)
    print(path)
    return 0


def cmd_trace_convert(args: argparse.Namespace) -> int:
    from gpuyard.run.build import read_trace
    from gpuyard.run.single import openb_line, philly_line, skipped_lines
    from gpuyard.workloads import save_workload

    try:
        workload, info = read_trace(run_spec(args))
        path = save_workload(workload, args.out)
    except (ValueError, OSError) as exc:
        return fail("trace convert", exc)
    for line in (philly_line(info), openb_line(info), workload.skipped and skipped_lines(workload)):
        if line:
            print(f"gpuyard trace convert: {line}", file=sys.stderr)
    print(f"{len(workload)} jobs -> {path}")
    return 0


def cmd_trace_describe(args: argparse.Namespace) -> int:
    from gpuyard.report import plot_workload
    from gpuyard.run.build import read_trace
    from gpuyard.run.single import openb_line, philly_line, skipped_lines
    from gpuyard.workload_comparison import against_published, against_trace
    from gpuyard.workloads.calibrated import CLUSTERS

    # --against: a published cluster's numbers as the calibrated generators hold them (a test
    # checks them against cluster_summary.csv: no data folder needed), or a trace read as the
    # main one is
    real = args.against
    cluster = (
        real.lower() if real and real.lower() in CLUSTERS and not Path(real).is_file() else None
    )
    try:
        workload, info = read_trace(run_spec(args))
        if real is not None and cluster is None and not Path(real).exists():
            raise ValueError(
                f"--against {real}: no such trace file, nor a published cluster "
                f"(known: {', '.join(sorted(CLUSTERS))})"
            )
        other = None
        if real is not None and cluster is None:
            other = read_trace(run_spec(argparse.Namespace(**{**vars(args), "trace": real})))
    except (ValueError, OSError) as exc:
        return fail("trace describe", exc)
    for line in (philly_line(info), openb_line(info), workload.skipped and skipped_lines(workload)):
        if line:
            print(f"gpuyard trace describe: {line}", file=sys.stderr)
    args.plots.mkdir(parents=True, exist_ok=True)
    paths = plot_workload(workload.to_frame(with_extras=False), args.plots, args.trace.stem, info)
    described = workload.describe()
    table: list[str] = []
    jobs = workload.to_frame() if real is not None else None  # (extras: PAI's GPU fractions)
    if jobs is not None and cluster is not None:
        described["against"], table, path = against_published(
            jobs, args.trace, cluster, CLUSTERS[cluster], args.plots, info
        )
        paths.append(path)
    elif jobs is not None and other is not None:
        described["against"], table, path = against_trace(
            jobs, args.trace, other[0].to_frame(), Path(real), args.plots, info, other[1]
        )
        paths.append(path)
    print(json.dumps(described, indent=2, default=str))
    for line in table:  # (stdout stays one JSON document; the table is for the reader)
        print(line, file=sys.stderr)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0

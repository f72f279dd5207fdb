"""What a `RunSpec` is made of: the services' options (`SimOptions`) and the workload, checked.

`build(spec, out)` gives both; `sim_options(spec)` the options alone (every policy of a
comparison is checked through it before any run starts). Errors are ValueError (PolicyError),
OSError, msgspec.ValidationError or WorkloadError, each naming what is wrong in one line, with
`gpuyard sim`'s option names (a sweep file's keys are the same).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gpuyard.run.presets import PRESETS, semantics
from gpuyard.run.spec import (
    DEFAULT_ADMISSION,
    DEFAULT_PLACEMENT,
    RunSpec,
    parse_deadline_factor,
    parse_demand,
    parse_window,
)
from gpuyard.shared.model import ClusterSpec

T = TypeVar("T")

GENERATOR_DEFAULTS: dict[str, Any] = {"jobs": 400, "load": 20.0, "seed": 0}
DEFAULT_DEMAND = {1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05}
ELASTICFLOW_OPTIONS = ("--deadline-factor", "--best-effort-share")
"""Options of the elasticflow generator alone."""
GENERATOR_OPTIONS = (
    "--generator", "--jobs", "--load", "--gpu-demand", "--users", *ELASTICFLOW_OPTIONS,
)  # fmt: skip
"""Options a --trace refuses (`--seed` is not among them: it also seeds the policies)."""
TRACE_OPTIONS = ("--trace-format", "--skip-bad", "--philly-reading", "--cpu-jobs")


def build(
    spec: RunSpec, out: Path, external: frozenset[str] = frozenset()
) -> tuple[Any, Any, dict[str, Any]]:
    """The run `spec` describes: its SimOptions (`sim_options`), its workload and what the
    workload is (for options.json and captions); node events are written into `out`."""
    from gpuyard.shared.throughput import load_throughputs
    from gpuyard.workloads import save_node_events
    from gpuyard.workloads.churn import load_node_list

    check_workload(spec)
    options = sim_options(spec, external)
    model = load_throughputs(spec.throughputs)
    workload, described = make_workload(spec, model)
    if options.window is not None and options.window[1] > len(workload.jobs):
        raise ValueError(
            f"--window {options.window[0]}:{options.window[1]}: the workload has only "
            f"{len(workload.jobs):,} jobs"
        )
    if spec.node_events is not None:
        workload, events = replay(spec, workload)
        described["node_events"] = {
            "file": spec.node_events, "nodes_from": spec.nodes_from,
            "nodes": len(load_node_list(Path(spec.nodes_from))) if spec.nodes_from else
            int(events["node"].nunique()),
            "start": spec.start,
            "bftrainer": spec.preset == "bftrainer",
        }  # fmt: skip
        events_path = out / "node_events.csv"
        save_node_events(events, events_path)
        options.node_events = str(events_path.resolve())
    elif spec.nodes_from is not None or spec.start is not None or spec.preset == "bftrainer":
        raise ValueError("--nodes-from, --start and --bftrainer apply to --node-events")
    workload.jobs = semantics(spec.preset).jobs(options, workload.jobs)
    options = semantics(spec.preset).with_workload(options, workload.jobs)
    if spec.queues is not None and options.policy == "kueue":
        described["queues"] = spec.queues  # (what ran, for options.json and the plots' titles)
    return options, workload, described


def sim_options(spec: RunSpec, external: frozenset[str] = frozenset()) -> Any:
    """The SimOptions of the run `spec` describes, with the policies not in `external` checked
    (PolicyError naming a bad one)."""
    from gpuyard.run.simulate import SimOptions
    from gpuyard.services.simclock.costs import PreemptionCost
    from gpuyard.workloads import load_cluster

    preset = semantics(spec.preset)
    # A replay of node availability brings its own nodes (BFTrainer's idle nodes): no others.
    cluster_spec = spec.cluster_spec or ("none" if spec.node_events is not None else "32x4")
    cluster = ClusterSpec(groups=[]) if cluster_spec == "none" else load_cluster(cluster_spec)
    policy = preset.scheduling_name(spec.policy)
    params: dict[str, Any] = dict(spec.policy_params)
    if spec.queues is not None and policy == "kueue":
        from gpuyard.policies.kueue import queue_params

        params |= queue_params(spec.queues)
    options = SimOptions(
        cluster=cluster,
        throughputs=spec.throughputs,
        policy=policy,
        policy_params=params,
        admission=spec.admission or DEFAULT_ADMISSION,
        admission_params=dict(spec.admission_params),
        placement=spec.placement or DEFAULT_PLACEMENT,
        placement_params=dict(spec.placement_params),
        round_s=spec.round_s or preset.round_s,
        mode=preset.mode(spec),
        preset=spec.preset,
        as_intended=spec.as_intended,
        window=_parsed("--window", parse_window, spec.window),
        churn_node_gpus=spec.churn_node_gpus,
        preemption_cost=PreemptionCost(checkpoint_s=spec.checkpoint_s, restore_s=spec.restore_s),
        min_run_s=spec.min_run_s,
        default_time_limit_s=spec.default_time_limit_s,
        max_time_limit_s=spec.max_time_limit_s,
    )
    if spec.profiles is not None and spec.preset not in ("pollux", "sia"):  # (the preset's own)
        from gpuyard.services.simclock.config import GoodputSettings

        if not Path(spec.profiles).is_dir():
            raise ValueError(f"--profiles {spec.profiles}: no such folder")
        options.goodput = GoodputSettings(profiles=str(Path(spec.profiles).resolve()))
    options = preset.fill(options, spec)
    if spec.trace is not None and spec.seed is not None:
        # A trace's jobs are fixed: the seed seeds the policies' random choices (Gavel's --seed).
        options = options.with_policies(options.policies.seeded(spec.seed))
    options.policies.made(skip=external)
    return options


def check_policy_name(spec: RunSpec) -> None:
    """ValueError (PolicyError) if the scheduling policy (ElasticFlow's scheme with
    `--elasticflow`) is unknown."""
    semantics(spec.preset).check_policy(spec)


def _given(spec: RunSpec, option: str) -> bool:
    return getattr(spec, option.lstrip("-").replace("-", "_")) not in (None, False)


def check_workload(spec: RunSpec) -> None:
    """Refuse options the chosen source (or preset) would ignore (ValueError naming them)."""
    preset = semantics(spec.preset)
    preset.check(spec)
    if spec.as_intended and not preset.intended:
        mending = ", ".join(f"--{p.name}" for p in PRESETS.values() if p.intended)
        raise ValueError(
            f"--as-intended: --{preset.name} has no reference bug to mend (docs/fidelity.md)"
            if preset.name
            else f"--as-intended applies to a preset with reference bugs ({mending})"
        )
    if spec.trace is not None:
        ignored = [o for o in GENERATOR_OPTIONS if _given(spec, o)]
        if ignored:
            raise ValueError(
                f"{', '.join(ignored)} {'describe' if len(ignored) > 1 else 'describes'} "
                "generated jobs; a --trace brings its own"
            )
        return
    ignored = [o for o in TRACE_OPTIONS if _given(spec, o)]
    if ignored:
        raise ValueError(
            f"{', '.join(ignored)} {'apply' if len(ignored) > 1 else 'applies'} to --trace only"
        )
    generator = spec.generator or "blox"
    if spec.multi_gpu and generator != "gavel":
        raise ValueError(
            f"--multi-gpu applies to the gavel generator and Philly traces, not to {generator}"
        )
    if spec.gpu_demand is not None and generator != "blox":
        raise ValueError(
            f"--gpu-demand applies to the blox generator; {generator} draws GPU counts its own way"
        )
    _parsed("--gpu-demand", parse_demand, spec.gpu_demand)
    elastic = [o for o in ELASTICFLOW_OPTIONS if getattr(spec, o[2:].replace("-", "_")) is not None]
    if elastic and generator != "elasticflow":
        raise ValueError(
            f"{', '.join(elastic)} {'apply' if len(elastic) > 1 else 'applies'} to the "
            f"elasticflow generator, not to {generator}"
        )
    _parsed("--deadline-factor", parse_deadline_factor, spec.deadline_factor)


def _parsed(option: str, parse: Callable[[str], T], text: str | None) -> T | None:
    """`parse(text)` (None for None), its ValueError naming `option`."""
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def make_workload(spec: RunSpec, throughputs: Any = None) -> tuple[Any, dict[str, Any]]:
    """The workload `spec` describes, and what it is (for options.json and plot captions)."""
    workload, info = _made_workload(spec, throughputs)
    if spec.users is not None:
        from gpuyard.workloads.generators import spread_over_users

        seed = spec.seed if spec.seed is not None else GENERATOR_DEFAULTS["seed"]
        workload.jobs = spread_over_users(workload.jobs, spec.users, seed)
        info["users"] = spec.users
    return workload, info


def _made_workload(spec: RunSpec, throughputs: Any = None) -> tuple[Any, dict[str, Any]]:
    from gpuyard.workloads import blox, elasticflow, gavel
    from gpuyard.workloads.calibrated import CLUSTERS, calibrated
    from gpuyard.workloads.generators import ELASTICFLOW_DEADLINE_FACTOR

    if spec.trace is not None:
        return read_trace(spec, throughputs)
    generator = spec.generator or "blox"
    jobs = spec.jobs or GENERATOR_DEFAULTS["jobs"]
    load = spec.load if spec.load is not None else GENERATOR_DEFAULTS["load"]
    seed = spec.seed if spec.seed is not None else GENERATOR_DEFAULTS["seed"]
    info = {"generator": generator, "jobs": jobs, "load": load, "seed": seed}
    if generator in CLUSTERS:
        # --load is jobs per hour here too; by default the trace's own rate
        stats = CLUSTERS[generator]
        info["load"] = spec.load if spec.load is not None else stats.jobs_per_day / 24
        info["calibration"] = f"{stats.csv_id} row of AcmeTrace's cluster_summary.csv"
        return calibrated(generator, jobs, spec.load, seed), info
    if generator == "gavel":
        info["multi_gpu"] = spec.multi_gpu
        return gavel(jobs, load, seed, spec.multi_gpu, throughputs=throughputs), info
    if generator == "elasticflow":
        factor = _parsed("--deadline-factor", parse_deadline_factor, spec.deadline_factor)
        factor = factor or ELASTICFLOW_DEADLINE_FACTOR
        share = spec.best_effort_share or 0.0
        info |= {"deadline_factor": list(factor), "best_effort_share": share}
        # ElasticFlow's semantics read its generator's traces elastic: so are its jobs here.
        elastic = semantics(spec.preset).elastic_traces()
        if elastic:
            info["elastic"] = True
        workload = elasticflow(jobs, 3600.0 / load, seed, factor, best_effort_share=share,
                               throughputs=throughputs, elastic=elastic)  # fmt: skip
        return workload, info
    demand = _parsed("--gpu-demand", parse_demand, spec.gpu_demand) or DEFAULT_DEMAND
    info["gpu_demand"] = {str(k): v for k, v in demand.items()}
    return blox(jobs, load, seed, demand), info


def read_trace(spec: RunSpec, throughputs: Any = None) -> tuple[Any, dict[str, Any]]:
    """The workload in `spec.trace`, read as `--trace-format`, `--skip-bad`, `--philly-reading`,
    `--multi-gpu` and `--cpu-jobs` say, and what it is; ValueError for an option the format would ignore."""
    from gpuyard.workloads import detect_format, load_workload

    assert spec.trace is not None
    trace = Path(spec.trace)
    name = detect_format(trace) if spec.trace_format in (None, "auto") else spec.trace_format
    options: dict[str, Any] = {}
    info: dict[str, Any] = {"trace": spec.trace, "format": name}
    if name in ("helios", "acme", "openb", "pai"):
        options["cpu_jobs"] = spec.cpu_jobs or "skip"
        info["cpu_jobs"] = options["cpu_jobs"]
    elif spec.cpu_jobs is not None:
        raise ValueError(f"--cpu-jobs applies to Helios, Acme and openb traces, not to {name} ones")
    if name == "philly":
        reading = spec.philly_reading or "blox"
        if reading != "blox" and spec.multi_gpu:
            raise ValueError(
                f"--multi-gpu applies to the blox reading of Philly traces; the {reading} "
                "reading always takes each job's GPUs from its attempts"
            )
        options = {"semantics": reading, "multigpu": spec.multi_gpu}
        info |= {"philly_reading": reading, "multi_gpu": spec.multi_gpu}
    elif spec.philly_reading is not None or spec.multi_gpu:
        option = "--philly-reading" if spec.philly_reading else "--multi-gpu"
        raise ValueError(f"{option} applies to Philly traces, not to {name} ones")
    elif name == "gavel" and throughputs is not None:
        options = {"throughputs": throughputs}
    elif name in ("elasticflow", "itp") and semantics(spec.preset).elastic_traces():
        options = {"elastic": True}
        info["elastic"] = True
    workload = load_workload(trace, name, spec.skip_bad, **options)
    info |= workload.metadata  # (a cluster log's first submission and counts of jobs left out)
    return workload, info | {"jobs": len(workload), "skipped": workload.skipped}


def replay(spec: RunSpec, workload: Any) -> tuple[Any, Any]:
    """The node events to replay (`--node-events`, `--nodes-from`, `--start`; see
    `gpuyard.workloads.churn`) and the workload on the same clock: a BFTrainer trace's job times
    count from `--start` (jobs submitted before it arrive at the start), or from its first job."""
    import datetime as dt

    import pandas as pd

    from gpuyard.workloads import load_node_events
    from gpuyard.workloads.churn import load_node_list, parse_start, replay_events

    assert spec.node_events is not None
    start = parse_start(spec.start) if spec.start is not None else None
    nodes = load_node_list(Path(spec.nodes_from)) if spec.nodes_from is not None else None
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
    events = load_node_events(Path(spec.node_events), origin=origin, nodes=nodes)
    if isinstance(start, float):
        events["time"] -= start
    return workload, replay_events(events, nodes)

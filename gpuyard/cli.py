"""The `gpuyard` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import msgspec

from gpuyard.shared.model import ClusterSpec
from gpuyard.shared.policy import PolicyError, parse_params

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "shared" / "schema"


def parse_demand(text: str) -> dict[int, float]:
    """`1:0.7,2:0.1,4:0.15,8:0.05` -> {1: 0.7, ...}."""
    demand: dict[int, float] = {}
    for part in text.split(","):
        gpus, sep, weight = part.partition(":")
        try:
            demand[int(gpus)] = float(weight) if sep else 1.0
        except ValueError:
            raise argparse.ArgumentTypeError(f"GPU demand part {part!r} is not GPUS:WEIGHT") from None
    return demand


def add_sim_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="run a simulation", description="Run a complete simulation.")
    p.add_argument("--nats", help="join this NATS server (default: start a private one)")
    p.add_argument("--cluster", default="sim", help="namespace of this run's subjects")
    p.add_argument("--cluster-spec", default="32x4", help="NODESxGPUS[:TYPE],... (default 32x4)")
    p.add_argument("--policy", default="fifo", help="scheduling policy")
    p.add_argument("--param", action="append", default=[], help="scheduling policy KEY=VALUE")
    p.add_argument("--admission", default="accept-all")
    p.add_argument("--placement", default="consolidated")
    p.add_argument("--round", type=float, default=300.0, dest="round_s", help="round length (s)")
    p.add_argument("--mode", choices=["rounds", "events"], default="events",
                   help="decide at round ends only, or also at every arrival and completion")
    p.add_argument("--blox", action="store_true",
                   help="Blox semantics: rounds mode, completions seen at round ends")
    p.add_argument("--jobs", type=int, default=400, help="number of generated jobs")
    p.add_argument("--load", type=float, default=20.0, help="generated arrivals per hour")
    p.add_argument("--gpu-demand", type=parse_demand, default={1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05},
                   help="GPUS:WEIGHT,... for generated jobs (default Gavel's 1/2/4/8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--processes", action="store_true", help="one OS process per service")
    p.add_argument("--out", type=Path, default=Path("results"), help="output directory")
    p.add_argument("--log-level", default="info")
    p.set_defaults(run=cmd_sim)  # fmt: skip


def cmd_sim(args: argparse.Namespace) -> int:
    import uvloop

    from gpuyard.shared.logs import configure_logging
    from gpuyard.sim import ProgressBar, SimOptions, poisson_workload, simulate

    try:
        options = SimOptions(
            cluster=ClusterSpec.parse(args.cluster_spec),
            policy=args.policy,
            policy_params=parse_params(args.param),
            admission=args.admission,
            placement=args.placement,
            round_s=args.round_s,
            mode="rounds" if args.blox else args.mode,
            blox=args.blox,
        )
        from gpuyard.shared.policy import (
            admission_policies,
            placement_policies,
            scheduling_policies,
        )

        scheduling_policies.create(options.policy, options.policy_params)
        admission_policies.create(options.admission)
        placement_policies.create(options.placement)
    except (ValueError, msgspec.ValidationError) as exc:
        print(f"gpuyard sim: {exc}", file=sys.stderr)
        return 2
    jobs = poisson_workload(args.jobs, args.load, args.seed, args.gpu_demand)
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / "services.log", "a")  # noqa: SIM115 (open for the whole run)
    configure_logging(args.log_level, log)
    try:
        result = uvloop.run(
            simulate(
                options, jobs, args.out, nats_url=args.nats, cluster_name=args.cluster,
                processes=args.processes, on_progress=ProgressBar(args.cluster),
                log_level=args.log_level,
            )  # fmt: skip
        )
    except KeyboardInterrupt:
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
    from gpuyard.shared.bus import run_service

    run_service(cls, config_cls, args.rest)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuyard", description=__doc__)
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    add_sim_parser(sub)
    p = sub.add_parser("schema", help="print (or --write) the wire contract's JSON Schema")
    p.add_argument("--write", action="store_true", help=f"write it to {SCHEMA_PATH}/")
    p.set_defaults(run=cmd_schema)
    p = sub.add_parser("service", help="run one service (admission, scheduler, placement, simclock)")
    p.add_argument("name", choices=["admission", "scheduler", "placement", "simclock"])
    p.add_argument("rest", nargs=argparse.REMAINDER, help="--nats URL --cluster NAME --config FILE")
    p.set_defaults(run=cmd_service)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

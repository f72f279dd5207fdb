"""The openb paper's experiment (Weng et al., ATC '23, Fig. 7) through gpuyard's services: the
placement policies as the placement service runs them, in a simulation, against the library's
run of the same experiment (bench/bench_openb.py) and the artifact's published means.

    python bench/bench_openb_services.py [--seed 42] [--policies fgd,best-fit]

The workload is the library's for the seed (pods sorted by name, shuffled, re-sampled up to 130%
of the GPU capacity), one pod a second, each running far longer than the experiment lasts (the
paper's pods never end), under FIFO with backfill: a pod that no node holds waits (the paper's
fails), and the next arrives. CPU-only pods are left out (a gpuyard job asks for GPUs), in both
the services' run and the library run it is set against. The GPU allocation is read from the
run's `allocation.csv` after each arrival and at the same arrived-workload levels as the
library's. Where the services differ from the library: FGD learns its target workload from the
jobs it places (the library knows the whole trace's), and equal scores go to the node first in
node order (the library: a seeded random order).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_openb import DATA, PUBLISHED_ALLOC
from bench_openb import LEVELS as PUBLISHED_LEVELS  # (bench/bench_openb.py, beside this script)

from gpuyard.policies.fragmentation import read_nodes, read_pods, run, typical_pods
from gpuyard.policies.fragmentation.experiment import Trace, arrival_order, at_levels
from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.logs import configure_logging
from gpuyard.shared.model import JobSpec
from gpuyard.workloads.clusters import load_openb_nodes

LEVELS = (70, 80, 90, 95, 100, 110, 120, 130)
NAMES = {"random-fit": "random", "dot-product": "dotprod", "gpu-clustering": "gpuclustering",
         "gpu-packing": "gpupacking", "best-fit": "bestfit", "fgd": "fgd"}  # fmt: skip
NEVER_ENDS_S = 1e9


def gpu_pods(trace: Trace) -> Trace:
    kept = [i for i, t in enumerate(trace.tasks) if t.gpus > 0]
    return Trace(tuple(trace.names[i] for i in kept), tuple(trace.tasks[i] for i in kept))


def jobs_of(trace: Trace, order: np.ndarray) -> list[JobSpec]:
    jobs = []
    for step, i in enumerate(order.tolist()):
        task = trace.tasks[i]
        types = list(task.models)
        jobs.append(JobSpec(
            job_id=f"p{step:05d}", num_gpus=task.gpus, submit_time=float(step),
            duration=NEVER_ENDS_S, gpu_milli=task.gpu_milli if task.is_share else None,
            cpu_milli=task.cpu, memory_mib=task.mem,
            gpu_type=types[0] if len(types) == 1 else "any", gpu_types=types if len(types) > 1 else [],
        ))  # fmt: skip
    return jobs


async def through_services(
    name: str, jobs: list[JobSpec], nodes_csv: Path, out: Path
) -> tuple[dict[int, float], float]:
    cluster, _ = load_openb_nodes(nodes_csv)
    options = SimOptions(
        cluster=cluster, policy="fifo", policy_params={"backfill": True}, placement=name
    )
    started = time.perf_counter()
    await simulate(options, jobs, out, plots=False)
    seconds = time.perf_counter() - started
    import pandas as pd

    frame = pd.read_csv(out / "allocation.csv")
    frame = frame[frame["time"] < NEVER_ENDS_S]
    capacity = 1000 * cluster.total_gpus
    allocated = np.round(frame["allocated_milli"].to_numpy() / capacity * 100.0, 2)
    found = at_levels(frame["arrived_milli"].to_numpy() / capacity, allocated, LEVELS)
    return found, seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--policies", default=",".join(NAMES))
    args = parser.parse_args()
    configure_logging("warning")
    pods_csv = args.data / "openb_pod_list_default.csv"
    nodes_csv = args.data / "openb_node_list_gpu_node.csv"
    if not pods_csv.exists() or not nodes_csv.exists():
        print(f"openb data not found under {args.data}", file=sys.stderr)
        return 2
    trace = gpu_pods(read_pods(pods_csv))
    nodes = read_nodes(nodes_csv)
    order = arrival_order(trace, nodes.total_gpu_milli(), args.seed)
    jobs = jobs_of(trace, order)
    typical = typical_pods(trace.tasks)
    print(f"openb_pod_list_default, GPU pods only: {len(jobs)} arrive (seed {args.seed}); "
          f"{nodes.n} nodes")  # fmt: skip
    print("GPU allocation (%) at arrived workload (% of capacity): services / library"
          " (same pods) / artifact (all pods, its 10 seeds)")  # fmt: skip
    print(f"{'policy':<15}" + "".join(f"{lv:>22}" for lv in LEVELS) + f"{'s (services)':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.policies.split(","):
            ours, seconds = asyncio.run(through_services(name, jobs, nodes_csv, Path(tmp) / name))
            library = run(NAMES[name], trace, nodes, args.seed, typical=typical)
            theirs = library.allocation(LEVELS)
            published = dict(zip(PUBLISHED_LEVELS, PUBLISHED_ALLOC[NAMES[name]], strict=True))
            cells = [
                f"{ours.get(lv, float('nan')):6.2f}/{theirs.get(lv, float('nan')):6.2f}/"
                f"{published.get(lv, float('nan')):6.2f}".rjust(22)
                for lv in LEVELS
            ]
            print(f"{name:<15}" + "".join(cells) + f"{seconds:>14.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

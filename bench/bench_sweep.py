"""Sweep throughput: 100 runs of 1,000 jobs each, on this machine, through `gpuyard sweep`.

    python bench/bench_sweep.py                  # 100 runs: fifo, srtf x 5 loads x 10 seeds
    python bench/bench_sweep.py --runs 20        # fewer seeds
    python bench/bench_sweep.py --workers 4      # also: the same sweep via --nats with 4 workers

Prints the wall time of the whole sweep (from the command's start to its table), the runs per
minute, the runs' own wall times (median and p95, from the results table), the machine's busy CPU
time meanwhile (the sweep's processes, its servers and workers included, on an otherwise idle
machine: what the sweep would take on idle CPUs) and the machine's load average before and after
(the machine may be shared). With `--workers N` it runs the sweep again
through a server's queue with N `gpuyard worker` processes on this machine and says whether the
two results tables are identical (but the wall times and which worker ran what).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from machine import machine_cpu_s  # (bench/machine.py, beside this script)

POLICIES = ["fifo", "srtf"]
LOADS = [10, 20, 30, 40, 50]


def config(runs: int, jobs: int) -> str:
    seeds = max(1, runs // (len(POLICIES) * len(LOADS)))
    return (
        f'[sweep]\nname = "bench"\n\n[base]\njobs = {jobs}\ncluster_spec = "32x4"\n\n'
        f"[grid]\npolicy = {POLICIES}\nload = {LOADS}\nseed = {list(range(seeds))}\n"
    ).replace("'", '"')


def sweep(folder: Path, *extra: str) -> tuple[float, pd.DataFrame]:
    started = time.perf_counter()
    cpu = machine_cpu_s()
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "sweep", "bench.toml", "--out", "out", *extra],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    print(
        f"  busy CPU time of the machine meanwhile: {machine_cpu_s() - cpu:,.0f} s "
        f"(on {len(os.sched_getaffinity(0))} idle CPUs: about "
        f"{(machine_cpu_s() - cpu) / len(os.sched_getaffinity(0)):,.0f} s of wall time)"
    )
    if result.returncode != 0:
        sys.exit(f"gpuyard sweep failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return wall, pd.read_parquet(folder / "out" / "results.parquet")


def report(label: str, wall: float, table: pd.DataFrame) -> None:
    print(f"{label}: {len(table)} runs of {int(table['jobs'].iloc[0]):,} jobs in {wall:,.1f} s "
          f"({60 * len(table) / wall:,.1f} runs/min); every run ok: "
          f"{bool((table['status'] == 'ok').all())}")  # fmt: skip
    print(
        f"  per run (its simulation's wall time): median {table['wall_s'].median():.2f} s, "
        f"p95 {table['wall_s'].quantile(0.95):.2f} s, sum {table['wall_s'].sum():,.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=None, help="default: one per CPU")
    parser.add_argument("--workers", type=int, default=0, help="also run via --nats with N workers")
    args = parser.parse_args()
    print(f"CPUs: {len(os.sched_getaffinity(0))}; load average before: "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        local = Path(tmp) / "local"
        local.mkdir()
        (local / "bench.toml").write_text(config(args.runs, args.jobs))
        extra = ["--parallel", str(args.parallel)] if args.parallel else []
        wall, table = sweep(local, *extra)
        report("one machine, private server", wall, table)
        if args.workers:
            import asyncio

            from gpuyard.run.embedded import EmbeddedNats  # a server of our own for the queue

            remote = Path(tmp) / "remote"
            remote.mkdir()
            (remote / "bench.toml").write_text(config(args.runs, args.jobs))

            async def via_queue() -> tuple[float, pd.DataFrame]:
                async with EmbeddedNats() as url:
                    workers = [
                        await asyncio.create_subprocess_exec(
                            sys.executable,
                            "-m",
                            "gpuyard.cli",
                            "worker",
                            "--nats",
                            url,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                        for _ in range(args.workers)
                    ]
                    try:
                        return await asyncio.to_thread(sweep, remote, "--nats", url)
                    finally:
                        for worker in workers:
                            worker.terminate()
                            await worker.wait()

            before = machine_cpu_s()
            wall_q, table_q = asyncio.run(via_queue())
            print(f"  busy CPU time of the machine meanwhile (the sweep, its server, {args.workers} workers): "
                  f"{machine_cpu_s() - before:,.0f} s")  # fmt: skip
            report(f"{args.workers} workers through one server's queue", wall_q, table_q)
            varying = ["wall_s", "worker", "attempt"]
            same = table.drop(columns=varying).equals(table_q.drop(columns=varying))
            print(f"  results identical to the single-machine sweep: {same}")
    print(f"load average after: {', '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""Workload benchmarks: load the ten ITP cluster files, generate 100,000 Gavel jobs.

Run: python bench/bench_workloads.py  (reads ../shared/data/itp when present). Targets: ITP < 2 s,
Gavel generation < 1 s. Prints the best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from gpuyard.workloads import blox, elasticflow, gavel, load_workload

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def best_of(repeat: int, fn: Callable[[], int]) -> tuple[float, int]:
    best, count = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - start)
    return best, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    files = sorted((DATA / "itp").glob("cluster*.csv"))
    if len(files) == 10:
        secs, n = best_of(args.repeat, lambda: sum(len(load_workload(f)) for f in files))
        print(f"load 10 ITP cluster files: {n} jobs in {secs:.3f} s (target < 2 s)")
    else:
        print(f"ITP files not found under {DATA / 'itp'}: skipped")
    secs, n = best_of(args.repeat, lambda: len(gavel(100_000, 10, seed=0, multi_gpu=True)))
    print(f"generate Gavel jobs:       {n} jobs in {secs:.3f} s (target < 1 s)")
    secs, n = best_of(args.repeat, lambda: len(blox(100_000, 10, seed=0)))
    print(f"generate Blox jobs:        {n} jobs in {secs:.3f} s")
    secs, n = best_of(args.repeat, lambda: len(elasticflow(100_000, 900, seed=0)))
    print(f"generate ElasticFlow jobs: {n} jobs in {secs:.3f} s")


if __name__ == "__main__":
    main()

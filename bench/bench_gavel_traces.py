"""Gavel's two continuous traces under the seven policies issue 12 names, end to end over NATS:
wall time (target: a fifth of the reference simulator's for all fourteen runs, ~180 s on the machine
issue 12 names) and each run's mean JCT, utilisation, makespan and wall time beside the
reference's.

    python bench/bench_gavel_traces.py                 # the fourteen runs, one per CPU at a time
    python bench/bench_gavel_traces.py --parallel 1    # one run at a time

The fourteen runs are one `gpuyard sweep examples/sweeps/gavel-traces.toml` (`--parallel` local
workers, each pinned to a CPU of its own, each run on a private server beside its worker, with its
services and its simulated nodes over NATS), timed from the command's start to its results table;
its CPU seconds are the whole machine's busy time meanwhile (the servers' included). The reference figures are those of Gavel's own simulator
(stanford-futuredata/gavel, `scripts/drivers/simulate_scheduler_with_trace.py --seed 0`,
cvxpy/ECOS; `-c 12:12:12` and `-c 16:16:16 --num_gpus_per_server 4:4:4`), as docs/fidelity.md
reports them. Its wall seconds (122.3 s for the fourteen, one run after another, each on one
thread; cvxpy 1.9.3, ECOS 2.0.14, numpy 2.4.6) were measured on this 2-core machine
(docs/benchmarks.md), whose speed varies from one day to the next, so compare figures of the same
hour: `--reference-s` takes a total measured alongside.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from machine import machine_cpu_s  # (bench/machine.py, beside this script)

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "examples" / "sweeps" / "gavel-traces.toml"
DATA = ROOT.parent / "shared" / "data" / "gavel"
TRACES = {"continuous_single_gpu": "single", "continuous_multi_gpu": "multi"}
# (mean JCT s, utilisation, makespan s, wall s) of Gavel's simulator on the same inputs
# (docs/fidelity.md; wall seconds as the module docstring says).
REFERENCE = {
    ("single", "fifo_perf"): (66_967, 0.498, 962_391, 5.32),
    ("single", "max_min_fairness"): (77_417, 0.469, 1_240_743, 7.19),
    ("single", "max_min_fairness_perf"): (56_320, 0.467, 968_310, 5.91),
    ("single", "finish_time_fairness_perf"): (57_885, 0.477, 969_365, 17.39),
    ("single", "max_sum_throughput_perf"): (61_808, 0.473, 1_001_307, 6.08),
    ("single", "min_total_duration_perf"): (79_878, 0.586, 923_448, 11.67),
    ("single", "gandiva"): (70_187, 0.435, 988_111, 24.75),
    ("multi", "fifo_perf"): (63_298, 0.472, 864_909, 3.82),
    ("multi", "max_min_fairness"): (74_063, 0.438, 1_102_724, 5.65),
    ("multi", "max_min_fairness_perf"): (55_349, 0.427, 935_705, 4.43),
    ("multi", "finish_time_fairness_perf"): (56_344, 0.450, 896_423, 10.82),
    ("multi", "max_sum_throughput_perf"): (52_960, 0.379, 952_599, 4.36),
    ("multi", "min_total_duration_perf"): (68_093, 0.519, 847_168, 8.63),
    ("multi", "gandiva"): (59_890, 0.435, 912_467, 6.33),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parallel", type=int, default=None, help="runs at once (default: per CPU)")
    p.add_argument("--reference-s", type=float, default=None, metavar="S",
                   help="Gavel's simulator's total for the fourteen, measured alongside "
                        "(default: the module docstring's, 2026-12-01)")  # fmt: skip
    args = p.parse_args()
    if not DATA.is_dir():
        sys.exit(f"no Gavel data at {DATA} (../shared/data beside the checkout)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep"
        command = [sys.executable, "-m", "gpuyard.cli", "sweep", str(SWEEP), "--out", str(out)]
        if args.parallel is not None:
            command += ["--parallel", str(args.parallel)]
        cpu, started = machine_cpu_s(), time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - started, machine_cpu_s() - cpu
        if result.returncode != 0:
            sys.exit(f"gpuyard sweep failed ({result.returncode}): {result.stderr.strip()[-800:]}")
        runs = pd.read_csv(out / "results.csv")
    runs["trace"] = [TRACES[Path(t).stem] for t in runs["trace"]]
    reference_s = args.reference_s or sum(ref[3] for ref in REFERENCE.values())
    print(f"all {len(runs)} runs: {wall:.1f} s wall, {cpu:.1f} CPU-s; Gavel's simulator "
          f"{reference_s:.1f} s, one run after another: {reference_s / wall:.1f}x (target 5x: "
          f"<= {reference_s / 5:.1f} s)\n")  # fmt: skip
    print(f"{'trace':7} {'policy':26} {'mean JCT':>9} {'ref':>9} {'diff':>7} "
          f"{'util':>6} {'ref':>6} {'makespan':>10} {'ref':>10} {'run s':>6} {'ref':>6}")  # fmt: skip
    for row in runs.itertuples():
        ref = REFERENCE[(row.trace, row.policy)]
        jct, util, span = float(row.mean_jct), float(row.utilization), float(row.makespan)
        print(f"{row.trace:7} {row.policy:26} {jct:9.0f} {ref[0]:9.0f} "
              f"{100 * (jct / ref[0] - 1):+6.1f}% {util:6.3f} {ref[1]:6.3f} {span:10.0f} "
              f"{ref[2]:10.0f} {float(row.wall_s):6.1f} {ref[3]:6.1f}")  # fmt: skip


if __name__ == "__main__":
    main()

"""Gavel's two continuous traces under the seven policies issue 12 names, end to end over NATS:
wall time (target: a fifth of the reference simulator's ~180 s for all fourteen runs) and each
run's mean JCT, utilisation and makespan beside the reference's.

    python bench/bench_gavel_traces.py                 # both traces, seven policies each
    python bench/bench_gavel_traces.py --parallel 1    # one run at a time

Each trace is one `gpuyard sim --gavel` comparison (`--policy a,b,...`: every policy at once on one
embedded server, `--parallel` runs at a time, default one per CPU), timed from the command's start
to its table; its CPU seconds are the whole machine's busy time meanwhile. The reference figures are those of Gavel's own simulator
(stanford-futuredata/gavel, `scripts/drivers/simulate_scheduler_with_trace.py --seed 0`,
cvxpy/ECOS; `-c 12:12:12` and `-c 16:16:16 --num_gpus_per_server 4:4:4`), as docs/fidelity.md
reports them.
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

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gavel"
POLICIES = [
    "fifo_perf", "max_min_fairness", "max_min_fairness_perf", "finish_time_fairness_perf",
    "max_sum_throughput_perf", "min_total_duration_perf", "gandiva",
]  # fmt: skip
TRACES = {
    "single": ("continuous_single_gpu.trace", "12x1:v100,12x1:p100,12x1:k80"),
    "multi": ("continuous_multi_gpu.trace", "4x4:v100,4x4:p100,4x4:k80"),
}
# (mean JCT s, utilisation, makespan s) of Gavel's simulator on the same inputs (docs/fidelity.md).
REFERENCE = {
    ("single", "fifo_perf"): (66_967, 0.498, 962_391),
    ("single", "max_min_fairness"): (77_417, 0.469, 1_240_743),
    ("single", "max_min_fairness_perf"): (56_320, 0.467, 968_310),
    ("single", "finish_time_fairness_perf"): (57_885, 0.477, 969_365),
    ("single", "max_sum_throughput_perf"): (61_808, 0.473, 1_001_307),
    ("single", "min_total_duration_perf"): (79_878, 0.586, 923_448),
    ("single", "gandiva"): (70_187, 0.435, 988_111),
    ("multi", "fifo_perf"): (63_298, 0.472, 864_909),
    ("multi", "max_min_fairness"): (74_063, 0.438, 1_102_724),
    ("multi", "max_min_fairness_perf"): (55_349, 0.427, 935_705),
    ("multi", "finish_time_fairness_perf"): (56_344, 0.450, 896_423),
    ("multi", "max_sum_throughput_perf"): (52_960, 0.379, 952_599),
    ("multi", "min_total_duration_perf"): (68_093, 0.519, 847_168),
    ("multi", "gandiva"): (59_890, 0.435, 912_467),
}


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine so far (Linux): a comparison's runs are forked by a
    fork server that reaps them itself, so `getrusage` of the command would not count them."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def run_trace(name: str, policies: list[str], parallel: int | None, out: Path) -> pd.DataFrame:
    trace, cluster = TRACES[name]
    command = [
        sys.executable, "-m", "gpuyard.cli", "sim", "--gavel", "--seed", "0",
        "--trace", str(DATA / "traces" / trace), "--cluster-spec", cluster,
        "--throughputs", str(DATA / "simulation_throughputs.json"),
        "--policy", ",".join(policies), "--out", str(out / name), "--json",
    ]  # fmt: skip
    if parallel:
        command += ["--parallel", str(parallel)]
    cpu, started = machine_cpu_s(), time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - started, machine_cpu_s() - cpu
    if result.returncode != 0:  # (the runs' own logs go with the temporary folder: show them)
        logs = [f"{log.parent.name}: {log.read_text().strip()[-600:]}"
                for log in sorted((out / name).glob("*/stderr.log"))
                if "FAILED" in result.stderr and log.parent.name in result.stderr]  # fmt: skip
        sys.exit("\n".join([f"{name}: gpuyard sim failed ({result.returncode}): "
                             f"{result.stderr.strip()[-400:]}", *logs]))  # fmt: skip
    print(f"{name}: {len(policies)} runs in {wall:.1f} s wall, {cpu:.1f} CPU-s", flush=True)
    table = pd.read_csv(out / name / "comparison.csv")
    table["trace"] = name
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--traces", default="single,multi")
    p.add_argument("--parallel", type=int, default=None, help="runs at once (default: per CPU)")
    args = p.parse_args()
    if not DATA.is_dir():
        sys.exit(f"no Gavel data at {DATA} (../shared/data beside the checkout)")
    policies = args.policies.split(",")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tables = [run_trace(t, policies, args.parallel, Path(tmp)) for t in args.traces.split(",")]
    total = time.perf_counter() - started
    runs = pd.concat(tables, ignore_index=True)
    print(f"\nall {len(runs)} runs: {total:.1f} s wall (target <= 36 s: a fifth of ~180 s)\n")
    print(f"{'trace':7} {'policy':26} {'mean JCT':>9} {'ref':>9} {'diff':>7} "
          f"{'util':>6} {'ref':>6} {'makespan':>10} {'ref':>10}")  # fmt: skip
    for row in runs.itertuples():
        ref = REFERENCE.get((row.trace, row.policy))
        jct, util, span = float(row.mean_jct), float(row.utilization), float(row.makespan)
        if ref is None:
            print(f"{row.trace:7} {row.policy:26} {jct:9.0f} {'-':>9} {'':>7} {util:6.3f} "
                  f"{'-':>6} {span:10.0f} {'-':>10}")  # fmt: skip
            continue
        print(f"{row.trace:7} {row.policy:26} {jct:9.0f} {ref[0]:9.0f} "
              f"{100 * (jct / ref[0] - 1):+6.1f}% {util:6.3f} {ref[1]:6.3f} {span:10.0f} "
              f"{ref[2]:10.0f}")  # fmt: skip


if __name__ == "__main__":
    main()

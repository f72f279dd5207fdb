"""Pollux's simulator study (its Figure 8) end to end: the eight workloads under Pollux,
Optimus+Oracle and Tiresias+TunedJobs with the artifact's semantics (`--pollux`), as one
`gpuyard sweep` of examples/sweeps/pollux-fig8.toml, for the relative loads asked (each a folder
of ../shared/data/pollux). It prints the sweep's wall time (target: load 1.0's 24 runs in at most
5 minutes on a 2-core machine; one Pollux workload in at most 30 s) and each run's mean JCT beside
the artifact's published one (petuum/adaptdl, branch osdi21-artifact,
`simulator/results-jobload/<policy>-<load>/summary.json`, as docs/fidelity.md cites them).

    python bench/bench_pollux.py                       # load 1.0: 24 runs, one per CPU at a time
    python bench/bench_pollux.py --loads 0.5 1.0 1.5 2.0

Targets: Optimus+Oracle and Tiresias+TunedJobs within 5% per workload (the artifact runs them
deterministically), Pollux within 10% (its NSGA-II search draws at random).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from machine import machine_cpu_s  # (bench/machine.py, beside this script)

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "examples" / "sweeps" / "pollux-fig8.toml"
DATA = ROOT.parent / "shared" / "data" / "pollux"
FOLDERS = {0.5: "workloads-0.5", 1.0: "workloads", 1.5: "workloads-1.5", 2.0: "workloads-2.0"}
POLICIES = {"pollux": 0.10, "optimus": 0.05, "tiresias": 0.05}
"""Each policy's tolerance: the largest |ours / published - 1| the issue allows."""
PUBLISHED = {
    ("pollux", 0.5): (1059.513, 1826.263, 1310.525, 1497.763, 976.837, 1287.825, 2881.05, 1432.037),
    ("pollux", 1.0): (2088.769, 3322.944, 2188.494, 2720.981, 2673.7, 2446.131, 3616.144, 2951.906),
    ("pollux", 1.5): (3855.779, 3380.579, 3299.917, 3902.675, 4007.3, 3474.267, 3217.629, 4345.117),
    ("pollux", 2.0): (6186.259, 4190.828, 5131.837, 5262.4, 6590.822, 5105.312, 3836.325, 6009.812),
    ("optimus", 0.5): (1309.688, 3124.562, 1986.838, 2173.863, 1324.525, 1957.963, 5314.0, 1971.475),
    ("optimus", 1.0): (4087.062, 6913.875, 3944.006, 5967.75, 5656.25, 5301.875, 7290.856, 6293.794),
    ("optimus", 1.5): (7673.842, 6678.188, 5683.625, 7683.792, 7899.725, 7500.254, 6426.183, 8331.3),
    ("optimus", 2.0): (10806.597, 8515.388, 8363.356, 10312.913, 11830.044, 9767.256, 6997.969, 11174.794),
    ("tiresias", 0.5): (1450.938, 2333.275, 1869.9, 1946.763, 1425.388, 1826.575, 3979.15, 1899.95),
    ("tiresias", 1.0): (2473.65, 5144.962, 3876.256, 3280.262, 3501.012, 3469.694, 5479.913, 5079.706),
    ("tiresias", 1.5): (5520.292, 6333.771, 6561.979, 5577.321, 6832.421, 5830.483, 5366.783, 7435.75),
    ("tiresias", 2.0): (10138.175, 8655.991, 10727.819, 9664.728, 12098.103, 10254.669, 8370.847, 10405.806),
}  # fmt: skip
"""The artifact's mean JCT (s) of workloads 1 to 8, per policy and relative load."""


def sweep_file(loads: list[float], folder: Path) -> Path:
    """The example's sweep with the traces of `loads` (absolute paths) in place of load 1.0's."""
    text = SWEEP.read_text()
    traces = [DATA / FOLDERS[load] / f"workload-{w}.csv" for load in loads for w in range(1, 9)]
    listed = "trace = [\n" + "".join(f'    "{t}",\n' for t in traces) + "]"
    text = re.sub(r"trace = \[.*?\]", listed, text, count=1, flags=re.S)
    text = text.replace('"../../../shared/data/pollux/traces"', f'"{DATA / "traces"}"')
    path = folder / SWEEP.name
    path.write_text(text)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loads", type=float, nargs="+", default=[1.0], choices=sorted(FOLDERS))
    p.add_argument("--parallel", type=int, default=None, help="runs at once (default: per CPU)")
    args = p.parse_args()
    if not DATA.is_dir():
        sys.exit(f"no Pollux data at {DATA} (../shared/data beside the checkout)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sweep"
        config = sweep_file(args.loads, Path(tmp))
        command = [sys.executable, "-m", "gpuyard.cli", "sweep", str(config), "--out", str(out)]
        if args.parallel is not None:
            command += ["--parallel", str(args.parallel)]
        cpu, started = machine_cpu_s(), time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - started, machine_cpu_s() - cpu
        if result.returncode != 0:
            sys.exit(f"gpuyard sweep failed ({result.returncode}): {result.stderr.strip()[-800:]}")
        runs = pd.read_csv(out / "results.csv")
    print(f"all {len(runs)} runs: {wall:.1f} s wall, {cpu:.1f} CPU-s (target for load 1.0's "
          f"24: <= 300 s)\n")  # fmt: skip
    print(f"{'load':>4} {'workload':10} {'policy':9} {'mean JCT':>9} {'published':>9} "
          f"{'ratio':>6} {'run s':>6}")  # fmt: skip
    outside = 0
    for row in runs.to_dict("records"):
        trace = Path(str(row["trace"]))
        policy, jct, run_s = str(row["policy"]), float(row["mean_jct"]), float(row["wall_s"])
        load = next(load for load, name in FOLDERS.items() if name == trace.parent.name)
        workload = int(trace.stem.rsplit("-", 1)[1])
        published = PUBLISHED[(policy, load)][workload - 1]
        ratio = jct / published
        mark = "" if abs(ratio - 1) <= POLICIES[policy] else "  outside the target"
        outside += bool(mark)
        print(f"{load:4.1f} {trace.stem:10} {policy:9} {jct:9.1f} "
              f"{published:9.1f} {ratio:6.3f} {run_s:6.1f}{mark}")  # fmt: skip
    print(f"\n{len(runs) - outside} of {len(runs)} runs within their target")


if __name__ == "__main__":
    main()

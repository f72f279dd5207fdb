"""BFTrainer benchmarks: the reference's 64-node 10-job replays, and the whole 4,734-node log with
the 1,000-job set, each as one `gpuyard sim` command (server start-up and report included).

    python bench/bench_bftrainer.py                      # both
    python bench/bench_bftrainer.py --only 64x10         # Tfwd 10 and 120 on 64 nodes, 10 jobs
    python bench/bench_bftrainer.py --only full          # 4,734 nodes, 1,000 jobs, Tfwd 10
    python bench/bench_bftrainer.py --only 64x10 --reference-semantics  # --bftrainer, reference_step
    python bench/bench_bftrainer.py --only 64x10 --compare /path/BFTrainer/debug-itrOut

Targets (issue 14): 64 nodes x 10 jobs at Tfwd 10 at least 5x faster than the reference with CBC
(34 s on this machine, 6.8 s); the full log with 1,000 jobs in under 10 minutes; solver time per
event (the scheduling policy's time per decision, p50 and p99) reported. `--compare` reads a
reference run's output folder (`<name>-itrOut`: `step-logs.csv`, `iter-prints.log` printed to
it with `-print 0`) and prints both runs' idle node-time use and job completion times. Reads
../shared/data beside the checkout; the replay window is BFTrainer's replayer's
(github.com/BFTrainer/Replayer: 64 nodes from 2021-02-10 20:21:15).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bftrainer"
START = "2021-02-10 20:21:15"
REFERENCE_CBC_S = 34.0


def run(
    name: str, jobs: str, tfwd: float, out: Path, *, nodes: str | None, reference: bool
) -> dict:
    command = [
        sys.executable, "-m", "gpuyard.cli", "sim", "--policy", "bftrainer",
        "--param", f"tfwd={tfwd}", "--trace", str(DATA / f"hps-shufflenet-Jbnd-{jobs}.csv"),
        "--throughputs", str(DATA / f"hps-shufflenet-JNPs-{jobs}.csv"),
        "--node-events", str(DATA / "node_events.csv.gz"), "--start", START,
        "--cluster-spec", "none", "--out", str(out), "--overwrite", "--json",
    ]  # fmt: skip
    if nodes is not None:
        command += ["--nodes-from", str(DATA / nodes)]
    if reference:
        command += ["--bftrainer", "--param", "reference_step=true"]
    started = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name}: gpuyard sim failed:\n{proc.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    print(f"{name}: Tfwd {tfwd:g}{' (reference semantics)' if reference else ''}")
    print(f"  command wall time   {wall:8.1f} s   (simulation {summary['wall_s']:.1f} s)")
    print(f"  simulated           {summary['simulated_s'] / 3600:8.1f} h, "
          f"{summary['instants']:,} instants, {summary['decisions']:,} decisions")  # fmt: skip
    print(f"  decision time       p50 {summary['decision_s_p50'] * 1e3:.2f} ms, "
          f"p99 {summary['decision_s_p99'] * 1e3:.2f} ms, total {summary['decision_s_total']:.1f} s")  # fmt: skip
    print(f"  idle node-time used {summary['idle_node_utilization']:8.2%}")
    print(f"  jobs                {summary['completed']:,} completed, mean JCT "
          f"{summary['mean_jct'] / 3600:.2f} h, makespan {summary['makespan'] / 3600:.2f} h")  # fmt: skip
    print(f"  samples             {summary['samples_trained']:.4g} trained, "
          f"{summary['rescale_cost_samples']:.4g} lost to rescales, "
          f"{summary['preemption_cost_samples']:.4g} to nodes taken back")  # fmt: skip
    summary["command_wall_s"] = wall
    return summary


def reference_figures(folder: Path) -> tuple[float, dict[str, float]]:
    """A reference run's idle node-time use (nodes in use over idle nodes, event to event, up to
    its last event) and each job's end (s from the replay start, at the event it was seen done)."""
    steps = pd.read_csv(folder / "step-logs.csv")
    t = (pd.to_datetime(steps["evtTime"]) - pd.Timestamp(START)).dt.total_seconds().to_numpy()
    spans = np.diff(t)
    use = float((steps["nNrun"].to_numpy()[:-1] * spans).sum())
    idle = float((steps["nNd"].to_numpy()[:-1] * spans).sum())
    ends: dict[str, float] = {}
    for line in (folder / "iter-prints.log").read_text().splitlines():
        if m := re.match(r"\[Done\] (\S+ \S+) (.*)", line):
            for job in m.group(2).split(","):
                ends[job.strip()] = (pd.Timestamp(m.group(1)) - pd.Timestamp(START)).total_seconds()
    return use / idle, ends


def compare(out: Path, summary: dict, folder: Path) -> None:
    share, ends = reference_figures(folder)
    jobs = pd.read_csv(out / "jobs.csv").set_index("job_id")
    jct = {j: jobs.loc[j, "end"] - jobs.loc[j, "arrival"] for j in ends if j in jobs.index}
    ref = {j: ends[j] - jobs.loc[j, "arrival"] for j in jct}
    ours_mean, ref_mean = np.mean(list(jct.values())), np.mean(list(ref.values()))
    print(f"  vs {folder.name}: idle node-time used {summary['idle_node_utilization']:.2%} here, "
          f"{share:.2%} there ({100 * (summary['idle_node_utilization'] - share):+.1f} points)")  # fmt: skip
    print(f"    mean JCT {ours_mean / 3600:.2f} h here, {ref_mean / 3600:.2f} h there "
          f"({100 * (ours_mean / ref_mean - 1):+.1f}%)")  # fmt: skip
    print(
        f"    JCTs, sorted (h): here  {' '.join(f'{v / 3600:.1f}' for v in sorted(jct.values()))}"
    )
    print(
        f"                      there {' '.join(f'{v / 3600:.1f}' for v in sorted(ref.values()))}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["64x10", "full"], action="append")
    parser.add_argument("--tfwd", type=float, action="append", help="64x10: Tfwd values (10, 120)")
    parser.add_argument("--reference-semantics", action="store_true",
                        help="64x10: --bftrainer and reference_step=true (the reference as it runs)")  # fmt: skip
    parser.add_argument("--compare", type=Path, action="append", default=[],
                        help="64x10: a reference output folder per Tfwd, in --tfwd order")  # fmt: skip
    parser.add_argument("--out", type=Path, help="keep the runs' results here")
    args = parser.parse_args()
    if not DATA.is_dir():
        raise SystemExit(f"{DATA} is absent")
    only = args.only or ["64x10", "full"]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        if "64x10" in only:
            for i, tfwd in enumerate(args.tfwd or [10.0, 120.0]):
                out = root / f"64x10-tfwd{tfwd:g}"
                s = run("64 nodes x 10 jobs", "10J", tfwd, out, nodes="replay_nodes_64.txt",
                        reference=args.reference_semantics)  # fmt: skip
                if tfwd == 10.0:
                    print(f"  vs the reference with CBC ({REFERENCE_CBC_S:.0f} s): "
                          f"{REFERENCE_CBC_S / s['command_wall_s']:.1f}x faster (target 5x)")  # fmt: skip
                if i < len(args.compare):
                    compare(out, s, args.compare[i])
                print()
        if "full" in only:
            s = run("4,734 nodes x 1,000 jobs", "1000J", 10.0, root / "full", nodes=None,
                    reference=False)  # fmt: skip
            print(f"  target: under 600 s ({'met' if s['command_wall_s'] < 600 else 'MISSED'})")


if __name__ == "__main__":
    main()

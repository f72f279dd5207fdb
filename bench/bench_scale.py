"""Issue 39's scale targets: each row's wall time, CPU time, peak memory, jobs/s and messages.

    python bench/bench_scale.py                       # every row but the 1M-job one
    python bench/bench_scale.py --only blox,startup   # some rows
    python bench/bench_scale.py --million             # with the 1M-job row
    python bench/bench_scale.py --only rounds100k --scale 0.1   # a tenth of the jobs and GPUs

Rows (the workloads of issue 39's targets table; compare two versions of the code by running them
alternately on the same machine, the machine otherwise idle):

  rounds100k  `gpuyard sim --jobs 100000 --load 360 --gpu-demand 1:0.7,2:0.1,4:0.15,8:0.05
              --cluster-spec 1280x8 --mode rounds --policy fifo --seed 1`   target <= 30 s, 1 GiB
  events100k  the same in events mode (the default)                          target <= 90 s
  rounds1m    1M jobs on 25,600 GPUs (--load 900 --cluster-spec 3200x8), with --million
                                                                             target <= 5 min, 2 GiB
  blox        Blox's README experiment, bench/bench_sim.py's case (a)        target <= 3 s
  tiresias    a preempting policy: 3,000 jobs at load 30 on 32x8 GPUs under `tiresias` (events
              mode; thousands of demotions and promotions)                    no target
  tiresias10k the same policy on 10,240 GPUs (5,000 jobs at load 360 on 1280x8: thousands of
              jobs run at each decision, which should cost what it changes)   no target
  sweep       bench/bench_sweep.py's sweep: 100 runs of 1,000 jobs           target <= 60 s
  startup     a 100-job `gpuyard sim`, end to end                            target <= 0.8 s

The real-cluster rows (20 agents under auth and TLS; one submission of 10,000 jobs) are
bench/bench_real.py's.

Each simulation runs as the `gpuyard sim` command it names, a process of its own. Wall: from its
start to its exit. CPU: user + system seconds of its whole process tree (its private NATS server
and any service processes included; a sweep's runs are forked by a server that reaps them
itself, so the sweep's row counts the whole machine's busy CPU instead). Peak RSS: the largest
process of the tree. Messages: the request/replies the services made to one another, from their
own counters (the run's `stats.json`), per job and per instant the clock visited (`instants`
of summary.json) and per scheduling decision.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench_sim import WORKLOADS as SIM_WORKLOADS  # (bench/, beside this script)
from bench_sweep import config as sweep_config
from bench_sweep import sweep
from machine import machine_cpu_s

MIX = "1:0.7,2:0.1,4:0.15,8:0.05"


@dataclass(frozen=True)
class Row:
    name: str
    jobs: int
    argv: tuple[str, ...]
    """`gpuyard sim` options, without --out."""
    target: str


def scale100k(mode: str, scale: float) -> tuple[int, tuple[str, ...]]:
    jobs, nodes = int(100_000 * scale), max(1, int(1280 * scale))
    return jobs, ("--jobs", str(jobs), "--load", f"{360 * scale:g}", "--gpu-demand", MIX,
                  "--cluster-spec", f"{nodes}x8", "--mode", mode, "--policy", "fifo",
                  "--seed", "1")  # fmt: skip


def rows(scale: float) -> dict[str, Row]:
    """The simulation rows; `scale` shrinks the jobs and GPUs of the large ones alike."""
    blox = SIM_WORKLOADS["a"]
    demand = ",".join(f"{g}:{w:g}" for g, w in blox["demand"].items())
    million = int(1_000_000 * scale)
    return {
        "rounds100k": Row("rounds100k", *scale100k("rounds", scale), "<= 30 s, <= 1 GiB"),
        "events100k": Row("events100k", *scale100k("events", scale), "<= 90 s"),
        "rounds1m": Row("rounds1m", million, (
            "--jobs", str(million), "--load", f"{900 * scale:g}", "--gpu-demand", MIX,
            "--cluster-spec", f"{max(1, int(3200 * scale))}x8", "--mode", "rounds",
            "--policy", "fifo", "--seed", "1"), "<= 5 min, <= 2 GiB"),
        "blox": Row("blox", blox["n_jobs"], (
            "--jobs", str(blox["n_jobs"]), "--load", f"{blox['jobs_per_hour']:g}",
            "--gpu-demand", demand, "--cluster-spec", blox["cluster"], "--blox", "--seed", "1"),
            "<= 3 s (Blox: 218 s)"),
        "tiresias": Row("tiresias", 3000, (
            "--jobs", "3000", "--load", "30", "--gpu-demand", MIX, "--cluster-spec", "32x8",
            "--policy", "tiresias", "--seed", "1"), "none (a preempting policy)"),
        "tiresias10k": Row("tiresias10k", 5000, (
            "--jobs", "5000", "--load", "360", "--gpu-demand", MIX, "--cluster-spec", "1280x8",
            "--policy", "tiresias", "--seed", "1"), "none (decisions among thousands running)"),
        "startup": Row("startup", 100, ("--jobs", "100"), "<= 0.8 s end to end"),
    }  # fmt: skip


@dataclass
class Measured:
    wall_s: float
    cpu_s: float
    peak_rss_mib: float | None
    jobs_per_s: float
    requests: int | None = None
    instants: int | None = None
    decisions: int | None = None
    of_changes: int | None = None
    """Decisions that told only what changed (the scheduler's `decisions_of_changes`)."""
    by_subject: dict[str, int] | None = None


def run_sim(row: Row, out: Path) -> Measured:
    """`gpuyard sim ROW --out OUT` as a process of its own; its figures."""
    argv = [sys.executable, "-m", "gpuyard.cli", "sim", *row.argv, "--out", str(out), "--overwrite"]
    started = time.perf_counter()
    with open(out.parent / f"{row.name}.stderr", "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = (out.parent / f"{row.name}.stderr").read_text()[-2000:]
        sys.exit(f"{row.name}: gpuyard sim exited {proc.returncode}:\n{tail}")
    summary = json.loads((out / "summary.json").read_text())
    stats = json.loads((out / "stats.json").read_text())
    by_subject: dict[str, int] = {}
    for service in stats.values():
        for subject, made in service["requests"].items():
            by_subject[subject] = by_subject.get(subject, 0) + made["count"]
    return Measured(
        wall_s=wall, cpu_s=usage.ru_utime + usage.ru_stime, peak_rss_mib=usage.ru_maxrss / 1024,
        jobs_per_s=row.jobs / wall, requests=sum(by_subject.values()),
        instants=summary["instants"], decisions=stats["scheduler"]["decisions"],
        of_changes=stats["scheduler"].get("decisions_of_changes"), by_subject=by_subject,
    )  # fmt: skip


def run_sweep(folder: Path, runs: int, jobs: int) -> Measured:
    """bench/bench_sweep.py's sweep (`gpuyard sweep`); CPU: the whole machine's busy time."""
    folder.mkdir()
    (folder / "bench.toml").write_text(sweep_config(runs, jobs))
    cpu = machine_cpu_s()
    wall, table = sweep(folder)
    return Measured(wall_s=wall, cpu_s=machine_cpu_s() - cpu, peak_rss_mib=None,
                    jobs_per_s=len(table) * jobs / wall)  # fmt: skip


def show(name: str, command: str, target: str, m: Measured) -> None:
    rss = f"{m.peak_rss_mib:,.0f} MiB" if m.peak_rss_mib is not None else "n/a"
    print(f"{name:<11} wall {m.wall_s:8.2f} s  CPU {m.cpu_s:8.2f} s  peak RSS {rss:>9}  "
          f"{m.jobs_per_s:9,.0f} jobs/s   target {target}")  # fmt: skip
    print(f"            {command}")
    if m.requests is not None and m.instants and m.decisions is not None:
        jobs = m.jobs_per_s * m.wall_s
        per_decision = f"{m.requests / m.decisions:.2f}" if m.decisions else "n/a"
        print(f"            request/replies {m.requests:,}: {m.requests / jobs:.2f} per job, "
              f"{m.requests / m.instants:.2f} per instant ({m.instants:,} instants), "
              f"{per_decision} per decision ({m.decisions:,} decisions, "
              f"{m.of_changes or 0:,} of them of what changed)")  # fmt: skip
        top = sorted((m.by_subject or {}).items(), key=lambda kv: -kv[1])[:6]
        print("            " + ", ".join(f"{subject} {count:,}" for subject, count in top))
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [
        "rounds100k", "events100k", "rounds1m", "blox", "tiresias", "tiresias10k", "sweep",
        "startup",
    ]  # fmt: skip
    parser.add_argument("--only", type=lambda s: s.split(","), default=None,
                        help=f"comma-separated rows of {', '.join(names)}")  # fmt: skip
    parser.add_argument("--million", action="store_true", help="also the 1M-job row")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the jobs and GPUs of the 100k and 1M rows")  # fmt: skip
    parser.add_argument("--sweep-runs", type=int, default=100)
    args = parser.parse_args()
    chosen = args.only or [n for n in names if n != "rounds1m" or args.million]
    unknown = [n for n in chosen if n not in names]
    if unknown:
        parser.error(f"--only: {unknown[0]!r} is not one of {', '.join(names)}")
    if not 0 < args.scale <= 1:
        parser.error(f"--scale: {args.scale:g} is not in (0, 1]")
    sims = rows(args.scale)
    print(f"CPUs: {len(os.sched_getaffinity(0))}; load average before: "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for name in chosen:
            if name == "sweep":
                jobs = 1000
                m = run_sweep(Path(tmp) / "sweep", args.sweep_runs, jobs)
                command = (f"gpuyard sweep: {args.sweep_runs} runs of {jobs:,} jobs "
                           "(bench/bench_sweep.py)")  # fmt: skip
                show(name, command, "<= 60 s", m)
                continue
            row = sims[name]
            m = run_sim(row, Path(tmp) / name)
            show(name, shlex.join(["gpuyard", "sim", *row.argv]), row.target, m)
    print(f"load average after: {', '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""Results recorded from the code of one commit, for tests/test_recorded.py to compare against.

    python -m tests.recorded.record            # record every case again (from the checkout root)
    python -m tests.recorded.record las-events # only these cases

Each case is a `gpuyard sim` command; its `jobs.csv` and `timeline.csv` are kept here gzipped, and
`manifest.json` names each case's exact command, the commit recorded from and the summary's
counts. Record again only for a bug fix documented in docs/fidelity.md, and say so in the commit.
Commands name the reference data as `../shared/data/...` (run from the checkout root); cases that
need it are recorded (and tested) only where it is present.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DATA_PREFIX = "../shared/data/"
SHARED_DATA = ROOT.parent / "shared" / "data"
MANIFEST = HERE / "manifest.json"
FILES = ("jobs.csv", "timeline.csv")
COUNTS = ("jobs", "completed", "failed", "preemptions", "instants", "accepted", "declined",
          "deadline_jobs", "deadline_met", "best_effort")  # fmt: skip
"""The summary's counts each case records (those it has)."""

MIX = "1:0.7,2:0.1,4:0.15,8:0.05"  # the GPU-demand mix: multi-GPU jobs
GAVEL_TPUT = DATA_PREFIX + "gavel/simulation_throughputs.json"


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    """`gpuyard sim` options, without `--out`."""
    slow: bool = False
    """Over ~2 s of CPU: left out of `pytest -m "not slow"`."""

    @property
    def needs_data(self) -> bool:
        return any(arg.startswith(DATA_PREFIX) for arg in self.argv)

    @property
    def command(self) -> str:
        """As typed in the checkout's root."""
        return shlex.join(["gpuyard", "sim", *self.argv])

    def resolved(self) -> list[str]:
        """The options with `../shared/data/` made absolute (any working directory)."""
        return [
            str(SHARED_DATA / a.removeprefix(DATA_PREFIX)) if a.startswith(DATA_PREFIX) else a
            for a in self.argv
        ]


def case(name: str, *argv: str, slow: bool = False) -> Case:
    return Case(name, argv, slow)


CASES = [
    # Generated workloads, both modes, policies that preempt, multi-GPU jobs.
    case("fifo-events", "--jobs", "200", "--load", "20", "--gpu-demand", MIX, "--cluster-spec", "4x4", "--seed", "1"),
    case("fifo-rounds", "--jobs", "200", "--load", "20", "--gpu-demand", MIX, "--cluster-spec", "4x4", "--seed", "1", "--mode", "rounds"),
    case("fifo-backfill-slots", "--jobs", "150", "--load", "30", "--gpu-demand", MIX, "--cluster-spec", "4x4", "--policy", "fifo", "--param", "backfill=true", "--mode", "slots"),
    case("las-events", "--jobs", "30", "--load", "30", "--gpu-demand", MIX, "--cluster-spec", "4x4", "--policy", "las", "--seed", "2"),
    case("las-rounds-costs", "--jobs", "30", "--load", "30", "--gpu-demand", MIX, "--cluster-spec", "4x4", "--policy", "las", "--param", "key=rounds", "--mode", "rounds", "--checkpoint-s", "60", "--restore-s", "30", "--seed", "2"),
    case("srtf-events-min-run", "--jobs", "150", "--load", "30", "--gpu-demand", MIX, "--cluster-spec", "4x4", "--policy", "srtf", "--min-run-s", "600", "--seed", "3"),
    case("srtf-rounds", "--jobs", "150", "--load", "30", "--gpu-demand", MIX, "--cluster-spec", "4x4", "--policy", "srtf", "--mode", "rounds", "--seed", "3"),
    case("tiresias-events-costs", "--jobs", "80", "--load", "30", "--gpu-demand", MIX, "--cluster-spec", "4x4", "--policy", "tiresias", "--checkpoint-s", "30", "--restore-s", "20", "--seed", "4", slow=True),
    case("tiresias-rounds", "--jobs", "80", "--load", "30", "--gpu-demand", MIX, "--cluster-spec", "4x4", "--policy", "tiresias", "--mode", "rounds", "--seed", "4"),
    # Blox: its generator, and its trace with LAS by rounds attained.
    case("blox-generated", "--blox", "--jobs", "300", "--load", "3", "--gpu-demand", "1", "--cluster-spec", "8x4"),
    case("blox-trace-las", "--blox", "--trace", DATA_PREFIX + "blox/n5x4_load1_t100_199_jobs.csv", "--cluster-spec", "5x4", "--policy", "las", "--param", "key=rounds"),
    # Gavel: a heterogeneous cluster with its throughputs, generated and traced, and a window.
    case("gavel-hetero-generated", "--gavel", "--cluster-spec", "2x4:v100,2x4:p100,2x4:k80", "--generator", "gavel", "--multi-gpu", "--throughputs", GAVEL_TPUT, "--jobs", "30", "--load", "40", "--policy", "max_min_fairness", slow=True),
    case("gavel-trace-fifo", "--gavel", "--cluster-spec", "2x4:v100,2x4:p100,2x4:k80", "--trace", DATA_PREFIX + "gavel/traces/artifact_evaluation.trace", "--throughputs", GAVEL_TPUT, "--policy", "fifo", slow=True),
    case("gavel-window", "--gavel", "--cluster-spec", "1x4:v100,1x4:p100,1x4:k80", "--generator", "gavel", "--throughputs", GAVEL_TPUT, "--jobs", "30", "--load", "20", "--policy", "max_min_fairness_perf", "--window", "5:15", slow=True),
    case("hetero-events-throughputs", "--cluster-spec", "2x4:v100,2x4:p100,2x4:k80", "--generator", "gavel", "--multi-gpu", "--throughputs", GAVEL_TPUT, "--jobs", "40", "--load", "40", "--policy", "las"),
    # ElasticFlow: an ITP cluster trace with deadlines, two schemes.
    case("elasticflow-itp", "--elasticflow", "--trace", DATA_PREFIX + "itp/cluster10.csv", "--cluster-spec", "4x8:a100", "--throughputs", DATA_PREFIX + "elasticflow/throughputs_A100", "--policy", "ef-accessctrl", slow=True),
    case("elasticflow-edf", "--elasticflow", "--trace", DATA_PREFIX + "elasticflow/traces/fig10_100jobs.csv", "--cluster-spec", "4x8:a100", "--throughputs", DATA_PREFIX + "elasticflow/throughputs_A100", "--policy", "edf"),
    # Deadlines outside the preset: the ElasticFlow generator's, under SRTF.
    case("deadline-generated-srtf", "--generator", "elasticflow", "--jobs", "100", "--load", "30", "--cluster-spec", "4x8", "--policy", "srtf"),
    # BFTrainer: idle nodes of a real machine's log, jobs that rescale.
    case("bftrainer-64", "--policy", "bftrainer", "--param", "tfwd=10", "--trace", DATA_PREFIX + "bftrainer/hps-shufflenet-Jbnd-10J.csv", "--throughputs", DATA_PREFIX + "bftrainer/hps-shufflenet-JNPs-10J.csv", "--node-events", DATA_PREFIX + "bftrainer/node_events.csv.gz", "--nodes-from", DATA_PREFIX + "bftrainer/replay_nodes_64.txt", "--start", "2021-02-10 20:21:15", slow=True),
]  # fmt: skip


def run_case(c: Case, out: Path) -> dict[str, Any]:
    """`gpuyard sim` of case `c` in this process (results, no plots): its summary."""
    import structlog
    import uvloop

    from gpuyard.cli import build_parser
    from gpuyard.cli.sim import run_spec
    from gpuyard.run.build import build
    from gpuyard.run.simulate import simulate
    from gpuyard.shared.logs import configure_logging

    args = build_parser().parse_args(["sim", *c.resolved(), "--out", str(out)])
    options, workload, described = build(run_spec(args), out)
    with open(out / "services.log", "a") as log:
        configure_logging("warning", log)
        try:
            result = uvloop.run(
                simulate(
                    options, workload.jobs, out, cluster_name=args.cluster, workload=described,
                    plots=False,
                )
            )  # fmt: skip
        finally:
            structlog.reset_defaults()
    return result.summary


def counts(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary[k] for k in COUNTS if summary.get(k) is not None}


def head_commit() -> str:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "gpuyard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    return commit + (" (with uncommitted changes)" if dirty.strip() else "")


def record(c: Case) -> dict[str, Any]:
    """Run `gpuyard sim` as a user would (a process of its own) and keep its files."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        done = subprocess.run(
            [sys.executable, "-m", "gpuyard.cli", "sim", *c.resolved(), "--out", str(out), "--json"],
            capture_output=True, text=True, cwd=ROOT, timeout=600,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"{c.name}: gpuyard sim exited {done.returncode}:\n{done.stderr}")
        for name in FILES:
            data = (out / name).read_bytes()
            # mtime=0: the same results give the same bytes, so a re-recording diffs cleanly
            (HERE / f"{c.name}.{name}.gz").write_bytes(gzip.compress(data, mtime=0))
        summary = json.loads((out / "summary.json").read_text())
    return {"name": c.name, "command": c.command, "slow": c.slow, "counts": counts(summary)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="cases to record again (default: all)")
    args = parser.parse_args()
    known = {c.name: c for c in CASES}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise SystemExit(f"unknown case {unknown[0]!r}; cases: {', '.join(known)}")
    old = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {"cases": []}
    entries = {e["name"]: e for e in old["cases"] if e["name"] in known}
    commit = head_commit()
    for c in (known[n] for n in args.names) if args.names else CASES:
        if c.needs_data and not SHARED_DATA.is_dir():
            print(f"{c.name}: skipped, {SHARED_DATA} absent", file=sys.stderr)
            continue
        entries[c.name] = record(c) | {"commit": commit}
        print(f"{c.name}: {entries[c.name]['counts']}", file=sys.stderr)
    manifest = {"about": "tests/recorded/record.py; compared by tests/test_recorded.py",
                "cases": [entries[c.name] for c in CASES if c.name in entries]}  # fmt: skip
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Simulation speed: wall time, simulated rounds/s, jobs/s, and where the time goes.

    python bench/bench_sim.py            # both workloads
    python bench/bench_sim.py --only a   # the Blox README shape only

(a) the shape of Blox's README experiment: ~4,000 one-GPU jobs at 1 job/hour on 32 nodes x 4 GPUs
    with 300 s rounds and Blox's round semantics (about 48,800 rounds of simulated time);
(b) 20,000 jobs on 1,024 GPUs (128 nodes x 8) at a load that queues (~110% of capacity), FIFO,
    decisions at 300 s round boundaries (completions at their exact times).

Time split: "policy" is time inside scheduling and placement policy code; "handlers" is the rest of
the services' own code (nested requests excluded); "messaging" is what is left of the wall time:
NATS round trips, encoding, the event loop. Round trips per job and mean round-trip times per
subject come from the services' own counters (`<service>.stats`).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import uvloop

from gpuyard.run.simulate import ProgressBar, SimOptions, SimResult, simulate
from gpuyard.shared.logs import configure_logging
from gpuyard.shared.model import ClusterSpec
from gpuyard.shared.service import collect_cycles_rarely
from gpuyard.workloads import blox

WORKLOADS = {
    "a": dict(
        title="(a) Blox README shape: 4,000 x 1-GPU jobs, 1 job/h, 32x4 GPUs, 300 s rounds",
        n_jobs=4000, jobs_per_hour=1.0, demand={1: 1.0}, cluster="32x4",
        options=dict(mode="rounds", preset="blox"),
    ),
    "b": dict(
        title="(b) 20,000 jobs (1/2/4/8 GPUs), 1,024 GPUs (128x8), 36 jobs/h (~110% load), FIFO, 300 s rounds",
        n_jobs=20000, jobs_per_hour=36.0, demand={1: 0.7, 2: 0.1, 4: 0.15, 8: 0.05},
        cluster="128x8", options=dict(mode="rounds"),
    ),
}  # fmt: skip


def own_time(result: SimResult) -> tuple[float, float, int]:
    """(policy seconds, handler seconds excluding nested waits and policy, requests made)."""
    policy = sum(s.policy_s for s in result.stats)
    nested = {s.service: sum(v[1] for v in s.requests.values()) for s in result.stats}
    handlers = sum(
        s.handler_s - nested[s.service] - s.policy_s
        for s in result.stats
        if s.service != "simclock"
    )
    requests = sum(int(v[0]) for s in result.stats for v in s.requests.values())
    return policy, handlers, requests


def run(key: str, scale: float) -> None:
    w = dict(WORKLOADS[key])
    w["n_jobs"] = int(w["n_jobs"] * scale)
    jobs = blox(w["n_jobs"], w["jobs_per_hour"], seed=1, gpu_demand=w["demand"]).jobs
    options = SimOptions(cluster=ClusterSpec.parse(w["cluster"]), round_s=300.0, **w["options"])
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = uvloop.run(simulate(options, jobs, Path(out), on_progress=ProgressBar(key)))
        total = time.perf_counter() - started
    s = result.summary
    policy, handlers, requests = own_time(result)
    messaging = result.wall_s - policy - handlers
    rounds = s["simulated_s"] / options.round_s
    print(w["title"])
    print(
        f"  wall time           {result.wall_s:8.2f} s  (with server start-up and report: {total:.2f} s)"
    )
    print(
        f"  simulated           {s['simulated_s'] / 3600:8.0f} h = {rounds:,.0f} rounds of {options.round_s:.0f} s"
    )
    print(f"  rounds/s            {rounds / result.wall_s:8,.0f}")
    print(f"  jobs/s              {len(jobs) / result.wall_s:8,.0f}")
    print(
        f"  instants visited    {s['instants']:8,}   requests {requests:,} ({requests / len(jobs):.1f}/job)"
    )
    print(f"  policy code         {policy:8.2f} s  ({policy / result.wall_s:5.1%})")
    print(f"  service handlers    {handlers:8.2f} s  ({handlers / result.wall_s:5.1%})")
    print(f"  messaging (NATS)    {messaging:8.2f} s  ({messaging / result.wall_s:5.1%})")
    for st in result.stats:
        for subject, (count, seconds) in sorted(st.requests.items()):
            if count >= 100 and not subject.startswith("node."):
                print(
                    f"    {st.service:>9} -> {subject:<16} {int(count):7,} x {seconds / count * 1e6:6.0f} us"
                )
    node = [
        (c, t) for st in result.stats for k, (c, t) in st.requests.items() if k.startswith("node.")
    ]
    if node:
        count = sum(c for c, _ in node)
        print(
            f"    placement -> node.*.cmd        {int(count):7,} x {sum(t for _, t in node) / count * 1e6:6.0f} us"
        )
    print(f"  mean JCT {s['mean_jct'] / 3600:.2f} h, utilisation {s['utilization']:.1%}, "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")  # fmt: skip
    print()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the jobs to run")
    args = parser.parse_args()
    configure_logging("warning")
    collect_cycles_rarely()  # (as `gpuyard sim`'s process)
    for key in args.only or sorted(WORKLOADS):
        run(key, args.scale)


if __name__ == "__main__":
    main()

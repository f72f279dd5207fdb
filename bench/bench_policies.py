"""Time one scheduling decision per policy: 1,000 queued jobs on 1,024 GPUs (target < 5 ms).

Run: python bench/bench_policies.py [--jobs N] [--gpus N] [--running N] [--repeat N]
"""

from __future__ import annotations

import argparse
import random
import time

from gpuyard.shared.model import JobSpec
from gpuyard.shared.policy import ClusterView, JobView, SchedulingInput, scheduling_policies


def make_input(jobs: int, gpus: int, running: int, seed: int = 0) -> SchedulingInput:
    rng = random.Random(seed)
    views: list[JobView] = []
    used = 0
    for i in range(jobs):
        n = rng.choice([1, 1, 1, 1, 2, 4, 8])
        duration = 60 * 10 ** rng.uniform(1.5, 4)
        run = i < running and used + n <= gpus
        executed = rng.uniform(0, duration) if run or rng.random() < 0.3 else 0.0
        used += n if run else 0
        views.append(
            JobView(
                job_id=f"j{i}",
                seq=i,
                spec=JobSpec(num_gpus=n, job_id=f"j{i}", duration=duration, min_gpus=1, max_gpus=8),
                state="running" if run else "queued",
                submit_time=float(i),
                gpus=n if run else 0,
                gpu_type="gpu" if run else None,
                attained_service=executed * n,
                executed_time=executed,
                rounds_run=int(executed // 300),
                remaining_time=duration - executed,
                queued_since=None if run else float(i),
                first_start=0.0 if executed else None,
            )
        )
    cluster = ClusterView(capacity={"gpu": gpus}, round_s=300.0)
    return SchedulingInput(now=1e5, jobs=views, cluster=cluster)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--running", type=int, default=0, help="how many of the jobs run already")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    inp = make_input(args.jobs, args.gpus, args.running)
    print(f"{args.jobs} jobs ({args.running} running) on {args.gpus} GPUs, best of {args.repeat}")
    print(f"{'policy':<18}{'schedule ms':>12}{'next ms':>10}{'allocs':>8}")
    for name in scheduling_policies.names():
        params = {"samples": [60 * 10 ** (1.5 + 2.5 * k / 999) for k in range(1000)]}
        pol = scheduling_policies.create(name, params if name == "tiresias-gittins" else None)
        best = best_next = float("inf")
        out = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = pol.schedule(inp)
            t1 = time.perf_counter()
            pol.next_decision_time(inp)
            t2 = time.perf_counter()
            best, best_next = min(best, t1 - t0), min(best_next, t2 - t1)
        print(f"{name:<18}{best * 1e3:>12.2f}{best_next * 1e3:>10.2f}{len(out):>8}")


if __name__ == "__main__":
    main()

"""Time one Sia decision (gpuyard.policies.sia): 1,000 jobs on 2,048 GPUs of three types.

Run: python bench/bench_sia.py [--jobs N] [--repeat N] [--seed S] [--limit DET]

The cluster: 64 nodes of 8 "fast" GPUs, 160 nodes of 4 "mid" and 112 nodes of 8 "slow" (512 +
640 + 896 GPUs; 1-64 GPUs a job: 40 configurations). The jobs run a made-up model
(`gpuyard.policies.sia.synthetic`, profiles written to a temporary folder): a third never ran,
the others run on 1-32 GPUs of one type, each with its own fitted step-time model and gradient
statistics, restarted 0-4 times, some still restoring. Target: <= 1 s a decision on a 2-core
machine. Lines: the whole decision (`Sia.schedule`: goodput rows, costs, program), and the
program alone (`ilp.solve`) with the objective it reached and the LP bound (the reference stops
CBC at a relative gap of 1e-4). Each line is the median of --repeat runs; CPU is this process's
CPU time (wall time on a loaded machine overstates it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from gpuyard.policies.sia import Sia, configurations, solve
from gpuyard.policies.sia.synthetic import write_profiles
from gpuyard.shared.model import GoodputHints, JobSpec
from gpuyard.shared.policy import ClusterView, JobView, NodeStatus, SchedulingInput

SHAPE = {"fast": (64, 8), "mid": (160, 4), "slow": (112, 8)}
SPEEDS = {"fast": 1.0, "mid": 0.5, "slow": 0.3}


def cluster() -> ClusterView:
    nodes = [
        NodeStatus(node_id=f"{t}{i:03d}", gpu_type=t, num_gpus=per)
        for t, (count, per) in SHAPE.items()
        for i in range(count)
    ]
    capacity = {t: count * per for t, (count, per) in SHAPE.items()}
    return ClusterView(capacity=capacity, round_s=60.0, nodes=nodes)


def jobs(count: int, seed: int, now: float) -> list[JobView]:
    rng = np.random.default_rng(seed)
    views = []
    for i in range(count):
        spec = JobSpec(job_id=f"j{i}", job_type="synth", num_gpus=1, batch_size=1024)
        submit = float(rng.uniform(0, now - 60))
        if i % 3 == 0:
            views.append(
                JobView(job_id=spec.job_id, seq=i, spec=spec, state="queued", submit_time=submit)
            )
            continue
        gpu_type = str(rng.choice(list(SHAPE)))
        gpus = int(rng.choice([1, 2, 4, 8, 16, 32]))
        speed = SPEEDS[gpu_type] * float(rng.uniform(0.8, 1.2))
        hints = GoodputHints(
            perf=(0.01 / speed, 0.001 / speed, 0.02, 0.001, 0.005, 0.001, float(rng.uniform(1, 2))),
            grad_sqr=float(rng.uniform(0.5, 2)), grad_var=float(rng.uniform(0.5, 8)),
            max_profiled_replicas=gpus,
        )  # fmt: skip
        views.append(
            JobView(
                job_id=spec.job_id,
                seq=i,
                spec=spec,
                state="running",
                submit_time=submit,
                gpus=gpus,
                gpu_type=gpu_type,
                goodput=hints,
                attempt=int(rng.integers(1, 6)),
                run_start=float(now - rng.uniform(0, 600)),
            )
        )
    return views


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=float, default=None, help="CP-SAT deterministic limit")
    args = parser.parse_args()
    now = 36_000.0
    with tempfile.TemporaryDirectory() as tmp:
        profiles = write_profiles(Path(tmp), {**SPEEDS})
        params = Sia.Params(profiles=str(profiles))
        if args.limit is not None:
            params = Sia.Params(profiles=str(profiles), deterministic_limit=args.limit)
        views = jobs(args.jobs, args.seed, now)
        inp = SchedulingInput(now=now, jobs=views, cluster=cluster())
        whole, whole_cpu, program, program_cpu = [], [], [], []
        for _ in range(args.repeat):
            policy = Sia(params)
            policy.schedule(inp)  # reads the profiles: not part of a round's decision
            t0, c0 = time.perf_counter(), time.process_time()
            allocs = policy.schedule(inp)
            whole.append(time.perf_counter() - t0)
            whole_cpu.append(time.process_time() - c0)
        # The program alone, on the last decision's costs.
        configs = configurations(SHAPE)
        matrix = policy.last_costs
        assert matrix is not None
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            alone = solve(
                matrix, configs, params.lambda_n, deterministic_limit=params.deterministic_limit,
                time_limit_s=params.time_limit_s,
            )  # fmt: skip
            program.append(time.perf_counter() - t0)
            program_cpu.append(time.process_time() - c0)
    bound = alone.bound if alone.bound is not None else float("nan")
    gap = (alone.objective - bound) / abs(alone.objective)
    print(
        f"jobs={args.jobs} gpus={sum(n * g for n, g in SHAPE.values())} configurations={len(configs)}"
    )
    print(f"decision (Sia.schedule): {statistics.median(whole):.3f} s "
          f"(CPU {statistics.median(whole_cpu):.3f} s) "
          f"({len(allocs)} jobs allocated, {sum(a.num_gpus for a in allocs)} GPUs)")  # fmt: skip
    print(f"program alone (ilp.solve): {statistics.median(program):.3f} s "
          f"(CPU {statistics.median(program_cpu):.3f} s); objective "
          f"{alone.objective:.2f}, bound {bound:.2f}, gap {gap:.1e}, "
          f"proved within 1e-4: {alone.optimal}")  # fmt: skip


if __name__ == "__main__":
    main()

"""An example training job for gpuyard real clusters: a pure-Python loop, no framework needed.

    gpuyard submit --gpus 2 -- python examples/train.py --steps 200 --step-time 0.05

Each rank "trains" (sleeps `--step-time` per step), reports progress, checkpoints every
`--checkpoint-every` steps and when preempted (SIGTERM), and resumes from its checkpoint on restart;
a run launched after one that finished (whose end was lost) exits at once.
With `--data-parallel` a step is one global batch split over the ranks (it takes `--step-time`
divided by the world size), so an elastic job given more GPUs goes faster; after a resize it says
so and goes on from the step it had checkpointed:

    gpuyard submit --min-gpus 1 --gpus 1 --max-gpus 4 --job-type train --steps 3000 \
        --deadline 600 -- python examples/train.py --steps 3000 --step-time 0.1 --data-parallel

`--step-time-on TYPE=SECONDS` (repeatable) makes a step take that long on GPUs of TYPE (the node
agent says which in `GPUYARD_GPU_TYPE`), as a real model is faster on some GPU types than on
others: a heterogeneity-aware policy learns that from the progress reports.

    gpuyard submit --job-type resnet --steps 20000 -- python examples/train.py --steps 20000 \
        --step-time-on v100=0.01 --step-time-on k80=0.05
"""

from __future__ import annotations

import argparse
import time

from gpuyard.jobclient import JobClient


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument(
        "--step-time-on", action="append", default=[], metavar="TYPE=SECONDS",
        help="the step time on GPUs of TYPE (GPUYARD_GPU_TYPE; other types: --step-time)",
    )  # fmt: skip
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--fail-at", type=int, default=-1, help="exit 1 at this step (for tests)")
    p.add_argument(
        "--data-parallel", action="store_true",
        help="a step is one global batch shared by the ranks: it takes step-time / world size",
    )  # fmt: skip
    args = p.parse_args()

    per_type = {}
    for item in args.step_time_on:
        gpu_type, sep, seconds = item.partition("=")
        if not sep:
            p.error(f"--step-time-on {item!r}: expected TYPE=SECONDS")
        per_type[gpu_type] = float(seconds)

    job = JobClient.from_env()
    if job.finished:
        # An earlier run did all the steps (its end was lost, or reached the scheduler late).
        print(f"job={job.job_id} attempt={job.attempt}: finished by an earlier run", flush=True)
        return 0
    state = job.load_checkpoint() or {"step": 0, "loss": 1.0}
    print(
        f"job={job.job_id} rank={job.rank}/{job.world_size} attempt={job.attempt} "
        f"resumed={job.resumed} start_step={state['step']} gpu_type={job.gpu_type or '-'}",
        flush=True,
    )
    if job.resized:
        print(f"resized: world size {job.previous_world_size} -> {job.world_size}", flush=True)
    step_time = per_type.get(job.gpu_type, args.step_time)
    if args.data_parallel:
        step_time /= job.world_size
    # A run stopped just after its last step checkpointed it: the run after it skips the loop and
    # ends the job as that run would have (done, then finish), so the end is counted once.
    while state["step"] < args.steps:
        time.sleep(step_time)  # one step of "training"
        state["step"] += 1
        state["loss"] *= 0.99
        if state["step"] == args.fail_at:
            print(f"rank {job.rank} failing at step {state['step']}", flush=True)
            return 1
        job.report(iterations=state["step"], samples=state["step"] * args.batch, loss=state["loss"])
        if job.preempted:
            job.save_checkpoint(state)
            print(f"preempted at step {state['step']}: checkpointed", flush=True)
            job.exit_preempted()
        if state["step"] % args.checkpoint_every == 0:
            job.save_checkpoint(state)
    job.save_checkpoint(state)
    job.report(iterations=state["step"], samples=state["step"] * args.batch, force=True)
    print(f"done at step {state['step']} (attempt {job.attempt})", flush=True)
    job.finish()  # last: a later run of this job (a lost end) does nothing
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""An example PyTorch job for gpuyard real clusters: a small model trained on the GPU it was given.

    gpuyard submit --gpus 1 -- python examples/train_torch.py --steps 2000

It trains a multi-layer perceptron on synthetic regression data (seeded: the same steps give the
same loss), reports its progress through `gpuyard.jobclient`, checkpoints the model and optimiser
(`torch.save`, atomically) every `--checkpoint-every` steps and when preempted (SIGTERM), and
resumes from that checkpoint on its next run. It uses one GPU (`cuda:0`, which is the one the node
agent named in `CUDA_VISIBLE_DEVICES`) and prints which one it is, by NVML's UUID; a job of more
GPUs would run one such process per GPU under `torch.distributed`, which this example leaves out.
It needs PyTorch with CUDA on the nodes (gpuyard does not install it) and exits 2 without them.

Submitted with adaptive batch limits (`adaptive_batch` in the job spec: `--batch` is then its
initial batch), it trains at the batch gpuyard gives each run (`job.local_batch_size` samples a
micro-batch, `job.accum_steps` accumulation steps before each optimizer step) and reports what
the scheduler fits its goodput model to, as AdaptDL's jobs do: each step's time (and each
accumulation micro-step's) and the gradient statistics, from the spread of the micro-batches'
gradients around their mean (a step of one micro-batch is computed as two halves for them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from gpuyard.jobclient import JobClient


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--width", type=int, default=4096, help="hidden layer width")
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--hold-mib", type=int, default=0, help="also keep this much GPU memory")
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("this example needs PyTorch (pip install torch)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("no CUDA GPU is visible to this process", file=sys.stderr)
        return 2

    job = JobClient.from_env()
    if job.finished:
        print(f"job={job.job_id} attempt={job.attempt}: finished by an earlier run", flush=True)
        return 0
    device = torch.device("cuda:0")
    props = torch.cuda.get_device_properties(device)
    print(
        f"job={job.job_id} attempt={job.attempt} gpu={props.name} uuid=GPU-{props.uuid} "
        f"visible={os.environ.get('CUDA_VISIBLE_DEVICES')} devices={torch.cuda.device_count()}",
        flush=True,
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1)
    ).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-3)
    held = torch.empty(args.hold_mib * 2**20, dtype=torch.uint8, device=device)
    step = samples = 0
    path = job.checkpoint_path("model.pt")
    if path.exists():
        saved = torch.load(path, map_location=device)
        model.load_state_dict(saved["model"])
        optimiser.load_state_dict(saved["optimiser"])
        step, samples = saved["step"], saved.get("samples", 0)
    first_step = step
    print(f"start_step={step} resumed={job.resumed}", flush=True)

    def checkpoint() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        torch.save({"model": model.state_dict(), "optimiser": optimiser.state_dict(),
                    "step": step, "samples": samples}, part)  # fmt: skip
        os.replace(part, path)  # a run killed mid-write keeps the previous checkpoint

    generator = torch.Generator(device=device)
    target = torch.randn(256, 1, device=device, generator=generator.manual_seed(1))
    # The batch of this run: gpuyard's for an adaptive job, else --batch in one micro-batch.
    local = job.local_batch_size or args.batch
    micro_batches = job.accum_steps + 1
    batch = job.batch_size or local * micro_batches
    # Gradient statistics need two micro-batches' gradients at least: one is split in halves.
    parts = (
        [local] * micro_batches
        if micro_batches > 1 or local < 2
        else [local - local // 2, local // 2]
    )
    parameters = list(model.parameters())
    started = time.monotonic()
    loss = torch.zeros((), device=device)

    def flat_gradient() -> torch.Tensor:
        return torch.cat([q.grad.reshape(-1) for q in parameters if q.grad is not None])

    while step < args.steps:
        x = torch.randn(sum(parts), 256, device=device, generator=generator.manual_seed(step))
        optimiser.zero_grad(set_to_none=True)
        squared_norms = []  # |g_i|^2 of each part's mean gradient
        previous = None
        offset = 0
        tick = 0.0
        for i, size in enumerate(parts):
            if micro_batches > 1 or i == 0:  # (halves of one micro-batch: timed as one step)
                torch.cuda.synchronize()
                tick = time.perf_counter()
            chunk = x[offset : offset + size]
            offset += size
            # Weighted so that the gradients summed are the whole batch's mean gradient.
            part_loss = torch.nn.functional.mse_loss(model(chunk), chunk @ target)
            (part_loss * size / sum(parts)).backward()
            summed = flat_gradient()
            own = summed if previous is None else summed - previous
            squared_norms.append(float((own * sum(parts) / size).square().sum()))
            previous = summed
            last = i == len(parts) - 1
            if last:
                optimiser.step()  # (one GPU: no all-reduce to wait for)
            torch.cuda.synchronize()
            if step >= first_step + 5 and (last or micro_batches > 1):  # (past the warm-up)
                job.profile_step(time.perf_counter() - tick, accumulation=not last,
                                 local_bsz=local)  # fmt: skip
            loss = part_loss
        count = len(parts)
        if count > 1 and previous is not None:  # (AdaptDL's unbiased estimates)
            total = float(previous.square().sum())
            mean_part = sum(squared_norms) / count
            job.report_gradients(
                (count * total - mean_part) / (count - 1),
                (mean_part - total) / (count - 1),
                batch_size=sum(parts),  # (the samples the parts came from)
            )
        step += 1
        samples += batch
        job.report(iterations=step, samples=samples)
        if job.preempted:
            checkpoint()
            print(f"preempted at step {step}: checkpointed", flush=True)
            job.exit_preempted()
        if step % args.checkpoint_every == 0:
            checkpoint()
    checkpoint()
    job.report(iterations=step, samples=samples, force=True)
    rate = (step - first_step) / max(time.monotonic() - started, 1e-9)
    print(f"done at step {step} loss={loss.item():.4f} ({rate:.0f} steps/s, {held.numel() >> 20} "
          f"MiB held)", flush=True)  # fmt: skip
    job.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

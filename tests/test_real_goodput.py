"""Adaptive batch sizes on a real cluster (Pollux's co-adaptive jobs): real NATS, the control
plane on the wall clock, node agents as real processes running real jobs that use jobclient. A
job submitted with `adaptive_batch` limits reports (synthetic) step times and gradient
statistics; the scheduler fits its goodput model to them, and a restart of the job is told the
goodput-optimal batch for its GPUs in its environment. A job that reports nothing keeps its
spec's batch size, and a job that is not adaptive is told none."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.shared.contract import RequeueRequest
from gpuyard.shared.endpoints import REQUEUE
from gpuyard.shared.goodput import choose_batch

from .jobaccount import JOB_PYTHON
from .test_real_cluster import CLUSTER, RealCluster

pytestmark = pytest.mark.slow  # (integration: real agents and jobs; a few seconds each)

INIT_BATCH = 64
MAX_BATCH = 1024
LOCAL_RANGE = (8, 128)
ADAPTIVE = {"max_batch_size": MAX_BATCH, "min_local_bsz": LOCAL_RANGE[0],
            "max_local_bsz": LOCAL_RANGE[1]}  # fmt: skip

JOB = """
import json, os, sys, time
from gpuyard.jobclient import JobClient
job = JobClient.from_env()
names = ["GPUYARD_BATCH_SIZE", "GPUYARD_LOCAL_BATCH_SIZE", "GPUYARD_ACCUM_STEPS", "NNODES",
         "WORLD_SIZE"]
told = {name: os.environ.get(name) for name in names}
told["client"] = [job.batch_size, job.local_batch_size, job.accum_steps, job.num_nodes]
out = job.checkpoint_dir / f"batch.attempt{job.attempt}.rank{job.rank}.json"
out.parent.mkdir(parents=True, exist_ok=True)
partial = out.with_suffix(".partial")
partial.write_text(json.dumps(told))
partial.replace(out)  # (whole when the test reads it)
measures = sys.argv[1] == "measure"
local = job.local_batch_size or 32
step = 0
while not job.preempted:
    step += 1
    if measures:  # synthetic: compute linear in the per-GPU batch, a 20 ms all-reduce
        compute = 0.01 + 0.0005 * local
        for _ in range(job.accum_steps):
            job.profile_step(compute, accumulation=True, local_bsz=local)
        job.profile_step(compute + 0.02, sync_s=0.02, local_bsz=local)
        job.report_gradients(1.0, 40.0, batch_size=job.batch_size or 64)
    job.report(iterations=step)
    time.sleep(0.02)
job.exit_preempted()
"""


@pytest.fixture
async def cluster(nats_url: str, tmp_path: Path) -> AsyncIterator[RealCluster]:
    async with RealCluster(nats_url, tmp_path) as c:
        yield c


async def _told(cluster: RealCluster, job_id: str, attempt: int) -> dict[str, Any]:
    """What rank 0 of the job's run `attempt` was told (once it wrote it)."""
    path = cluster.checkpoints / CLUSTER / job_id / f"batch.attempt{attempt}.rank0.json"

    async def written() -> bool:
        return path.exists() and bool(path.read_text())

    await cluster.until(written, f"{job_id}'s run {attempt} started")
    told: dict[str, Any] = json.loads(path.read_text())
    return told


async def _restart(cluster: RealCluster, job_id: str) -> None:
    """Requeue the running job (it checkpoints and stops) and wait for its next run."""
    reply = await cluster.call(REQUEUE, RequeueRequest(job_ids=[job_id]))
    assert reply.done == [job_id], reply.refused

    async def relaunched() -> bool:
        record = await cluster.job(job_id)
        return record.state == "running" and record.attempt >= 2

    await cluster.until(relaunched, f"{job_id} relaunched", within_s=20)


async def test_an_adaptive_job_is_fitted_and_restarted_at_its_goodput_optimal_batch(
    cluster: RealCluster, tmp_path: Path
) -> None:
    script = tmp_path / "adaptive.py"
    script.write_text(JOB)
    job_id = await cluster.submit(
        num_gpus=2, command=[*JOB_PYTHON, str(script), "measure"], batch_size=INIT_BATCH,
        adaptive_batch=ADAPTIVE,
    )  # fmt: skip
    first = await _told(cluster, job_id, 0)
    # Before it measured anything: its spec's batch size, split over its 2 GPUs.
    assert first["GPUYARD_BATCH_SIZE"] == "64" and first["GPUYARD_LOCAL_BATCH_SIZE"] == "32"
    assert first["GPUYARD_ACCUM_STEPS"] == "0" and first["client"] == [64, 32, 0, 1]

    async def fitted() -> bool:
        return (await cluster.job(job_id)).goodput is not None

    await cluster.until(fitted, f"{job_id}'s goodput hints fitted", within_s=15)
    hints = (await cluster.job(job_id)).goodput
    assert hints is not None
    assert all(math.isfinite(v) for v in hints.perf) and len(hints.perf) == 7
    assert hints.max_profiled_replicas == 2 and hints.batch_size == 64
    # (measured at the initial batch; averaged over however many reports came: to rounding)
    assert (hints.grad_sqr, hints.grad_var) == pytest.approx((1.0, 40.0))
    # The fit reproduces the step times the job measured (1 node, 2 GPUs, 32 a GPU).
    alpha_c, beta_c = hints.perf[0], hints.perf[1]
    assert alpha_c + beta_c * 32 == pytest.approx(0.026, rel=0.01)

    await _restart(cluster, job_id)
    second = await _told(cluster, job_id, 1)
    record = await cluster.job(job_id)
    assert record.goodput is not None
    batch, local, accum = choose_batch(
        record.goodput, INIT_BATCH, MAX_BATCH, LOCAL_RANGE, num_nodes=1, num_replicas=2
    )
    assert batch != INIT_BATCH  # (a noisy gradient: a larger batch trains faster)
    assert [second["GPUYARD_BATCH_SIZE"], second["GPUYARD_LOCAL_BATCH_SIZE"],
            second["GPUYARD_ACCUM_STEPS"]] == [str(batch), str(local), str(accum)]  # fmt: skip
    assert batch == 2 * local * (accum + 1)
    assert second["client"] == [batch, local, accum, 1]
    assert [b for _, b in record.batch_sizes] == [INIT_BATCH, batch]


async def test_a_job_that_reports_nothing_keeps_its_batch_and_one_not_adaptive_gets_none(
    cluster: RealCluster, tmp_path: Path
) -> None:
    script = tmp_path / "quiet.py"
    script.write_text(JOB)
    quiet = await cluster.submit(
        num_gpus=2, command=[*JOB_PYTHON, str(script), "quiet"], batch_size=INIT_BATCH,
        adaptive_batch=ADAPTIVE,
    )  # fmt: skip
    plain = await cluster.submit(num_gpus=2, command=[*JOB_PYTHON, str(script), "measure"])
    assert (await _told(cluster, quiet, 0))["GPUYARD_BATCH_SIZE"] == "64"
    await _restart(cluster, quiet)
    told = await _told(cluster, quiet, 1)
    assert [told["GPUYARD_BATCH_SIZE"], told["GPUYARD_LOCAL_BATCH_SIZE"],
            told["GPUYARD_ACCUM_STEPS"]] == ["64", "32", "0"]  # fmt: skip
    assert (await cluster.job(quiet)).goodput is None
    untold = await _told(cluster, plain, 0)
    assert untold["GPUYARD_BATCH_SIZE"] is None and untold["client"] == [None, None, 0, 1]
    # It measures (at local batch 32) but is not adaptive: it gets no hints, nor a batch.
    assert (await cluster.job(plain)).goodput is None

"""On a machine with NVIDIA GPUs: the node agent finds them with NVML, reports their use, and runs
a real PyTorch CUDA job on the GPU it was given, which frees it when preempted or orphaned.

Skipped where NVML finds no GPU or PyTorch cannot use CUDA (CI's machines); run them on a GPU
machine with `pytest tests/test_real_gpu.py`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuyard.services.nodeagent.nvml import Nvml, gpu_type_name
from gpuyard.shared.contract import CancelRequest, Empty, GpuMetrics
from gpuyard.shared.endpoints import CANCEL, HEARTBEATS
from gpuyard.shared.endpoints import CLUSTER as CLUSTER_INFO

from .test_real_cluster import CLUSTER, RealCluster, _async

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_torch.py"
STEPS = 20_000
"""Some seconds of training on one H100: long enough for heartbeats to see it."""
HOLD_MIB = 2048
"""GPU memory the job keeps besides its model, so its use shows plainly in NVML's figures."""


def _nvml_gpus() -> list:
    nvml, _ = Nvml.open()
    if nvml is None:
        return []
    try:
        return nvml.gpus()
    finally:
        nvml.close()


def _torch_sees_cuda() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True,
                              timeout=120).returncode == 0  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False


GPUS = _nvml_gpus()
# One worker runs them all: they share the machine's GPUs, and each reads its job's use of memory
# against the GPU's use before it started.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not GPUS, reason="NVML finds no GPU on this machine"),
    pytest.mark.xdist_group("gpu"),
]


@pytest.fixture(scope="module")
def torch_cuda() -> None:
    if not _torch_sees_cuda():
        pytest.skip("PyTorch with CUDA is not installed for this Python")


@pytest.fixture
async def gpu_node(nats_url: str, tmp_path: Path) -> AsyncIterator[RealCluster]:
    """The control plane and one agent offering this machine's GPUs as NVML finds them."""
    async with RealCluster(nats_url, tmp_path, nodes=()) as cluster:
        await cluster.start_agent("g", gpus=None)
        await cluster.until(lambda: cluster.node_count(1), "the GPU node registered")
        yield cluster


def _job(steps: int, checkpoint_every: int = 50) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--steps", str(steps), "--width", "2048",
            "--checkpoint-every", str(checkpoint_every), "--hold-mib", str(HOLD_MIB)]  # fmt: skip


async def _gpu(cluster: RealCluster, index: int) -> GpuMetrics | None:
    """The GPU's figures in the node's last heartbeat."""
    page = await cluster.call(HEARTBEATS, Empty())
    for beat in page.beats:
        if beat.node_id == "g" and beat.nvml:
            return next((m for m in beat.gpus if m.index == index), None)
    return None


async def _memory_used(cluster: RealCluster, index: int) -> int:
    metrics = await _gpu(cluster, index)
    assert metrics is not None and metrics.memory_used_mib is not None
    return metrics.memory_used_mib


async def test_nvml_gpus_registered_as_they_are(gpu_node: RealCluster) -> None:
    info = await gpu_node.call(CLUSTER_INFO, Empty())
    (node,) = info.nodes
    assert node.num_gpus == len(GPUS)
    assert node.gpu_type == gpu_type_name(GPUS[0].name)
    assert node.gpu_uuids == [g.uuid for g in GPUS]
    assert node.gpu_memory_mib == GPUS[0].memory_mib
    assert node.labels["gpu_source"] == "nvml" and node.labels["gpu_model"] == GPUS[0].name
    await gpu_node.until(lambda: _has_metrics(gpu_node), "a heartbeat with NVML's figures")


async def _has_metrics(cluster: RealCluster) -> bool:
    metrics = await _gpu(cluster, 0)
    return metrics is not None and metrics.memory_total_mib == GPUS[0].memory_mib


async def test_a_cuda_job_trains_on_its_gpu_and_its_use_shows_in_heartbeats(
    gpu_node: RealCluster, torch_cuda: None
) -> None:
    baseline = await _wait_metrics(gpu_node)
    job_id = await gpu_node.submit(num_gpus=1, command=_job(STEPS))
    busy: list[GpuMetrics] = []

    async def busy_gpu() -> bool:
        info = await gpu_node.call(CLUSTER_INFO, Empty())
        if job_id not in info.busy:
            return False
        metrics = await _gpu(gpu_node, info.busy[job_id][0].index)
        held = metrics is not None and (metrics.memory_used_mib or 0) >= baseline + HOLD_MIB
        if held and metrics.utilization:
            busy.append(metrics)
        return bool(busy)

    await gpu_node.until(busy_gpu, "the job's memory and kernels in a heartbeat", within_s=120)
    record = await gpu_node.until_state(job_id, "completed", "failed", within_s=300)
    assert record.state == "completed", (record.reason, gpu_node.job_log(job_id))
    log = gpu_node.job_log(job_id)
    assert f"done at step {STEPS}" in log
    (node,) = (await gpu_node.call(CLUSTER_INFO, Empty())).nodes
    uuid = log.split("uuid=")[1].split()[0]
    assert uuid in node.gpu_uuids, (uuid, node.gpu_uuids)  # CUDA's GPU is the one NVML named
    assert "devices=1" in log  # it sees only the GPU it was given
    await gpu_node.until(lambda: _freed(gpu_node, baseline), "the GPU's memory freed")


async def test_a_cancelled_cuda_job_checkpoints_and_frees_its_gpu(
    gpu_node: RealCluster, torch_cuda: None
) -> None:
    baseline = await _wait_metrics(gpu_node)
    job_id = await gpu_node.submit(num_gpus=1, command=_job(1_000_000, checkpoint_every=10**6))
    await gpu_node.until(lambda: _holds(gpu_node, baseline), "the job holding GPU memory", 120)
    await gpu_node.call(CANCEL, CancelRequest(job_ids=[job_id]))
    record = await gpu_node.until_state(job_id, "cancelled", within_s=60)
    assert record.state == "cancelled"
    # SIGTERM reached it: it saved its model on its way out (the cancel does not wait for that).
    await gpu_node.until(
        lambda: _async(lambda: "checkpointed" in gpu_node.job_log(job_id)),
        "the job's checkpoint on SIGTERM",
    )
    assert (gpu_node.checkpoints / CLUSTER / job_id / "rank0" / "model.pt").stat().st_size > 0
    await gpu_node.until(lambda: _freed(gpu_node, baseline), "the GPU's memory freed")


async def test_a_killed_agent_leaves_no_cuda_job_holding_the_gpu(
    gpu_node: RealCluster, torch_cuda: None
) -> None:
    """The agent's jobs die with it (their parent-death signal): no orphan keeps the GPU's memory;
    the agent started again registers anew, and the job runs again from its checkpoint."""
    baseline = await _wait_metrics(gpu_node)
    job_id = await gpu_node.submit(num_gpus=1, command=_job(1_000_000, checkpoint_every=100))
    await gpu_node.until(lambda: _holds(gpu_node, baseline), "the job holding GPU memory", 120)
    checkpoint = gpu_node.checkpoints / CLUSTER / job_id / "rank0" / "model.pt"
    await gpu_node.until(lambda: _async(lambda: checkpoint.exists()), "a checkpoint", within_s=60)
    agent = gpu_node.agents["g"]
    os.kill(agent.pid, signal.SIGKILL)
    await agent.wait()
    nvml, why = Nvml.open()
    assert nvml is not None, why
    try:
        await gpu_node.until(
            lambda: _async(lambda: nvml.metrics()[0].memory_used_mib <= baseline + 256),
            "the orphan gone", within_s=30,
        )  # fmt: skip
    finally:
        nvml.close()
    await gpu_node.start_agent("g", gpus=None)
    resumed = "attempt=1"
    await gpu_node.until(
        lambda: _async(lambda: resumed in gpu_node.job_log(job_id)), "the job's next run", 60
    )
    await gpu_node.until(lambda: _holds(gpu_node, baseline), "the job on the GPU again", 120)
    next_run = gpu_node.job_log(job_id).split(resumed)[1]
    start_step = int(next_run.split("start_step=")[1].split()[0])
    assert start_step >= 100, next_run  # from its checkpoint, not from scratch


async def _wait_metrics(cluster: RealCluster) -> int:
    await cluster.until(lambda: _has_metrics(cluster), "NVML's figures in a heartbeat")
    return await _memory_used(cluster, 0)


async def _holds(cluster: RealCluster, baseline: int) -> bool:
    return await _memory_used(cluster, 0) >= baseline + HOLD_MIB


async def _freed(cluster: RealCluster, baseline: int) -> bool:
    await asyncio.sleep(0.2)
    return await _memory_used(cluster, 0) <= baseline + 256

"""Every trace format of ../shared/data runs through a simulation with its throughput model."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.model import ClusterSpec
from gpuyard.shared.throughput import load_throughputs
from gpuyard.workloads import blox, load_workload, save_workload

# (trace, throughput model, cluster, policy): the first jobs of each.
CASES = {
    "gavel": ("gavel/traces/continuous_multi_gpu.trace", "gavel/simulation_throughputs.json",
              "4x4:v100,4x4:p100,4x4:k80", "fifo"),
    "elasticflow": ("elasticflow/traces/fig10_100jobs.csv", "elasticflow/throughputs_A100",
                    "4x8:a100", "fifo"),
    "itp": ("itp/195job.csv", "elasticflow/throughputs_A100", "4x8:a100", "las"),
    "bftrainer": ("bftrainer/hps-shufflenet-Jbnd-10J.csv", "bftrainer/hps-shufflenet-JNPs-10J.csv",
                  "64x1", "optimus"),
    "blox": ("blox/n5x4_load1_t100_199_jobs.csv", None, "5x4", "srtf"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
async def test_trace_runs_end_to_end(
    name: str, shared_data: Path, tmp_path: Path, nats_url: str
) -> None:
    trace, throughputs, cluster, policy = CASES[name]
    model = str(shared_data / throughputs) if throughputs else "default"
    options = {"throughputs": load_throughputs(model)}
    workload = load_workload(shared_data / trace, **(options if name == "gavel" else {}))
    jobs = sorted(workload.jobs, key=lambda j: j.submit_time or 0.0)[:25]
    result = await simulate(
        SimOptions(cluster=ClusterSpec.parse(cluster), throughputs=model, policy=policy),
        jobs, tmp_path, nats_url=nats_url,
    )  # fmt: skip
    assert result.summary["completed"] == len(jobs) == min(25, len(workload.jobs))
    for record in result.jobs:
        assert record.end_time is not None and record.end_time > record.submit_time


@pytest.mark.slow
async def test_own_csv_format_round_trips_through_a_simulation(
    tmp_path: Path, nats_url: str
) -> None:
    jobs = blox(30, 20.0, seed=9, gpu_demand={1: 0.5, 2: 0.5}).jobs
    path = save_workload(jobs, tmp_path / "jobs.csv")
    reloaded = load_workload(path).jobs
    assert [(j.job_id, j.num_gpus, j.duration, j.submit_time) for j in reloaded] == [
        (j.job_id, j.num_gpus, j.duration, j.submit_time) for j in jobs
    ]
    options = SimOptions(cluster=ClusterSpec.parse("2x4"))
    first = await simulate(options, jobs, tmp_path / "a", nats_url=nats_url, cluster_name="a")
    second = await simulate(options, reloaded, tmp_path / "b", nats_url=nats_url, cluster_name="b")
    assert (tmp_path / "a" / "jobs.csv").read_bytes() == (tmp_path / "b" / "jobs.csv").read_bytes()
    assert first.summary["mean_jct"] == second.summary["mean_jct"]

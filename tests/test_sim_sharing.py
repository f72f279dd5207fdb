"""Decisions that carry more than GPU counts, end to end over NATS: two jobs sharing the same GPUs
(each progressing at its measured co-located throughput) and placement hints."""

from __future__ import annotations

import json
from pathlib import Path

from gpuyard.ops import read_events
from gpuyard.shared.connection import connect
from gpuyard.shared.endpoints import Subjects
from gpuyard.shared.model import Allocation, ClusterSpec, JobSpec
from gpuyard.shared.policy import (
    Decision,
    Needs,
    SchedulingInput,
    SchedulingPolicy,
    scheduling_policies,
)
from gpuyard.sim import SimOptions, simulate


class PairTheFirstTwo(SchedulingPolicy):
    """Runs the first two jobs on the same GPU, on the node the hint names, and the rest alone."""

    needs = Needs(throughputs=True, nodes=True)

    def schedule(self, inp: SchedulingInput) -> Decision:
        jobs = inp.jobs
        last = sorted(n.node_id for n in inp.cluster.nodes)[-1]
        out: list[Allocation] = []
        if len(jobs) >= 2 and jobs[0].job_id == "a" and jobs[1].job_id == "b":
            out = [Allocation("a", 1, "v100", nodes=[last]), Allocation("b", 1, "v100", share_with="a")]
            jobs = jobs[2:]
        return Decision(allocations=out + [Allocation(j.job_id, 1, "v100") for j in jobs[:1]])


def toy_throughputs(path: Path) -> str:
    """Gavel's format: A alone 10 steps/s, B alone 8; together A gets 6 and B 4."""
    table = {
        "v100": {
            "('A', 1)": {"null": 10.0, "('B', 1)": [6.0, 4.0]},
            "('B', 1)": {"null": 8.0, "('A', 1)": [4.0, 6.0]},
        }
    }
    path.write_text(json.dumps(table))
    return str(path)


async def test_a_shared_gpu_runs_both_jobs_at_their_co_located_rates(
    tmp_path: Path, nats_url: str
) -> None:
    scheduling_policies.register("test-pair-the-first-two", PairTheFirstTwo)
    jobs = [
        JobSpec(job_id="a", num_gpus=1, job_type="A", total_steps=600.0, submit_time=0.0),
        JobSpec(job_id="b", num_gpus=1, job_type="B", total_steps=400.0, submit_time=0.0),
    ]
    options = SimOptions(
        cluster=ClusterSpec.parse("2x1:v100"), policy="test-pair-the-first-two",
        throughputs=toy_throughputs(tmp_path / "pairs.json"),
    )  # fmt: skip
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    # Together: a at 6 steps/s (600 in 100 s), b at 4 (400 in 100 s); alone a would take 60 s.
    assert (by_id["a"].end_time, by_id["b"].end_time) == (100.0, 100.0)
    assert by_id["a"].steps_done == 600.0 and by_id["b"].steps_done == 400.0
    nc = await connect(nats_url, name="test")
    started = [e.event async for e in read_events(nc, Subjects("sim"), types=["job.started"])]
    await nc.drain()
    gpus = {e.job_id: [(g.node_id, g.index) for g in e.gpus] for e in started}
    assert gpus["a"] == gpus["b"] == [("v100-0001", 0)]  # the same GPU, on the hinted node
    # The pair counts its GPU once: one of two GPUs was busy.
    assert result.summary["utilization"] == 0.5

"""Decisions that carry more than GPU counts, end to end over NATS: two jobs sharing the same GPUs
(each progressing at its measured co-located throughput) and placement hints."""

from __future__ import annotations

import json
from pathlib import Path

from gpuyard.ops import read_events
from gpuyard.run.simulate import SimOptions, simulate
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


class PairTheFirstTwo(SchedulingPolicy):
    """Runs the first two jobs on the same GPU, on the node the hint names, and the rest alone."""

    needs = Needs(throughputs=True, nodes=True)

    def schedule(self, inp: SchedulingInput) -> Decision:
        jobs = inp.jobs
        last = sorted(n.node_id for n in inp.cluster.nodes)[-1]
        out: list[Allocation] = []
        if len(jobs) >= 2 and jobs[0].job_id == "a" and jobs[1].job_id == "b":
            out = [
                Allocation("a", 1, "v100", nodes=[last]),
                Allocation("b", 1, "v100", share_with="a"),
            ]
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


class PairUntilThirty(SchedulingPolicy):
    """Pairs a with b on one GPU; from t = 30 on, b runs on a GPU of its own (a stays put)."""

    needs = Needs(throughputs=True, nodes=True)

    def schedule(self, inp: SchedulingInput) -> Decision:
        ids = {j.job_id for j in inp.jobs}
        out = [Allocation(j, 1, "v100") for j in sorted(ids - {"a", "b"})]
        if "a" in ids:
            out.append(Allocation("a", 1, "v100", nodes=["v100-0001"]))
        if "b" in ids:
            paired = inp.now < 30 and "a" in ids
            out.append(Allocation("b", 1, "v100", share_with="a" if paired else None))
        return Decision(allocations=out)


async def test_a_job_whose_partner_leaves_its_gpu_runs_on_at_its_own_rate(
    tmp_path: Path, nats_url: str
) -> None:
    """Whether the partner ends or moves to other GPUs, the job left on the GPU keeps the steps it
    made at the pair's rate and goes on at its rate alone (it used to keep the pair's rate until
    its own end when the partner moved, and to lose its progress when the partner ended)."""
    scheduling_policies.register("test-pair-until-thirty", PairUntilThirty)
    throughputs = toy_throughputs(tmp_path / "pairs.json")

    async def ends(jobs: list[JobSpec], name: str) -> dict[str, float | None]:
        options = SimOptions(
            cluster=ClusterSpec.parse("3x1:v100"), policy="test-pair-until-thirty",
            throughputs=throughputs,
        )  # fmt: skip
        result = await simulate(options, jobs, tmp_path / name, nats_url=nats_url, plots=False)
        return {r.job_id: r.end_time for r in result.jobs}

    # b ends at 50 (200 steps at 4/s); a has done 300 at 6/s and does the other 300 at 10/s.
    short_b = [
        JobSpec(job_id="a", num_gpus=1, job_type="A", total_steps=600.0, submit_time=0.0),
        JobSpec(job_id="b", num_gpus=1, job_type="B", total_steps=200.0, submit_time=0.0),
    ]
    assert await ends(short_b, "ends") == {"a": 80.0, "b": 50.0}
    # c's arrival at 30 moves b away: a has done 180 at 6/s, the other 420 take 42 s at 10/s;
    # b has done 120 at 4/s and does the other 280 at 8/s alone.
    moved_b = [
        JobSpec(job_id="a", num_gpus=1, job_type="A", total_steps=600.0, submit_time=0.0),
        JobSpec(job_id="b", num_gpus=1, job_type="B", total_steps=400.0, submit_time=0.0),
        JobSpec(job_id="c", num_gpus=1, job_type="A", total_steps=100.0, submit_time=30.0),
    ]
    assert await ends(moved_b, "moves") == {"a": 72.0, "b": 65.0, "c": 40.0}

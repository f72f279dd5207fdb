"""The openb paper's placements as gpuyard placement policies: on a cluster given as the
placement service shows it (`NodeView`s), each places a decision's allocations exactly where the
library's policy puts the same pods one by one; the learnt FGD target survives a restart; a job
larger than a node spans nodes; a simulation through the real services packs shares with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuyard.policies.fragmentation import (
    BestFit,
    ClusterState,
    DotProduct,
    FragmentationGradientDescent,
    GpuClustering,
    GpuPacking,
    RandomFit,
    Task,
    make_policy,
    typical_pods,
)
from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.model import Allocation, ClusterSpec, GpuRef, JobSpec, NodeGroup
from gpuyard.shared.policy import NodeView, PlacementInput, PlacementPolicy
from gpuyard.shared.policy.registry import placement_policies

NAMES = {
    "bestfit": BestFit, "dotprod": DotProduct, "gpupacking": GpuPacking,
    "gpuclustering": GpuClustering, "fgd": FragmentationGradientDescent,
}  # fmt: skip
TYPES = ("G2", "T4", "V100")


def random_cluster(seed: int) -> tuple[list[NodeView], ClusterState]:
    """Nodes of 2 to 8 GPUs of three types, some GPUs already shared or held, CPUs and memory
    partly taken: as views and as the library's state."""
    rng = np.random.default_rng(seed)
    views, cpu, mem, counts, models, lefts = [], [], [], [], [], []
    for i in range(12):
        gpus = int(rng.choice([2, 4, 8]))
        left = rng.choice([1000, 1000, 1000, 0, 500, 300, 700], size=gpus).astype(int)
        c, m = int(rng.choice([32_000, 64_000, 96_000])), int(rng.choice([131_072, 262_144]))
        t = TYPES[i % 3]
        views.append(NodeView(
            node_id=f"n{i:02d}", gpu_type=t, num_gpus=gpus,
            usable=[g for g in range(gpus) if left[g] == 1000],
            shares={g: int(v) for g, v in enumerate(left) if 0 < v < 1000},
            cpu_milli=c, memory_mib=m,
        ))  # fmt: skip
        cpu.append(c), mem.append(m), counts.append(gpus), models.append(t), lefts.append(left)
    state = ClusterState.from_nodes(cpu, mem, counts, models)
    for row, left in enumerate(lefts):
        state.gpu_left[row, : len(left)] = left
    return views, state


def random_jobs(seed: int, n: int) -> list[JobSpec]:
    rng = np.random.default_rng(seed + 100)
    jobs = []
    for i in range(n):
        kind = int(rng.integers(4))
        jobs.append(JobSpec(
            job_id=f"j{i:02d}", num_gpus=[1, 1, 2, 4][kind],
            gpu_milli=int(rng.choice([250, 500, 600])) if kind == 0 else None,
            cpu_milli=int(rng.choice([2000, 8000, 16_000])),
            memory_mib=int(rng.choice([4096, 32_768])),
            gpu_types=["T4", "V100"] if rng.random() < 0.3 else [],
        ))  # fmt: skip
    return jobs


def as_task(spec: JobSpec) -> Task:
    return Task(
        cpu=spec.cpu_milli, mem=spec.memory_mib, gpus=spec.num_gpus,
        gpu_milli=spec.gpu_milli or 1000, models=tuple(sorted(spec.gpu_types)),
    )  # fmt: skip


def decide(policy: PlacementPolicy, views: list[NodeView], jobs: list[JobSpec], now: float = 0.0):  # type: ignore[no-untyped-def]
    allocations = [Allocation(s.job_id or "", s.num_gpus, s.gpu_type) for s in jobs]
    specs = {s.job_id or "": s for s in jobs}
    return policy.place(
        PlacementInput(now=now, allocations=allocations, current={}, nodes=views, specs=specs)
    )


@pytest.mark.parametrize("name", sorted(NAMES))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_places_a_decision_as_the_paper_places_its_pods_one_by_one(
    name: str, seed: int
) -> None:
    views, state = random_cluster(seed)
    jobs = random_jobs(seed, 30)
    placed = decide(NAMES[name](), views, jobs)
    tasks = [as_task(s) for s in jobs]
    choose = make_policy(name, typical_pods(tasks))
    expected: dict[str, list[GpuRef]] = {}
    for spec, task in zip(jobs, tasks, strict=True):
        choice = choose(state, task, np.random.default_rng(0))
        if choice is not None:
            state.allocate(task, choice)
            expected[spec.job_id or ""] = [GpuRef(f"n{choice.node:02d}", g) for g in choice.gpus]
    assert placed == expected
    assert 0 < len(placed) < len(jobs)  # (some fit, some wait: the case is not trivial)


def test_random_fit_is_valid_deterministic_and_seeded() -> None:
    views, _ = random_cluster(4)
    jobs = random_jobs(4, 30)
    first = decide(RandomFit(), views, jobs, now=5.0)
    assert first == decide(RandomFit(), views, jobs, now=5.0)
    assert first != decide(RandomFit(RandomFit.Params(seed=1)), views, jobs, now=5.0)
    by_node = {v.node_id: v for v in views}
    taken: dict[GpuRef, int] = {}
    for spec in jobs:
        for g in first.get(spec.job_id or "", []):
            taken[g] = taken.get(g, 0) + (spec.gpu_milli or 1000)
            assert spec.allows(by_node[g.node_id].gpu_type)
    for g, milli in taken.items():
        view = by_node[g.node_id]
        assert milli <= (1000 if g.index in view.usable else view.shares[g.index])


def test_fgd_learns_its_target_from_the_jobs_it_starts_and_keeps_it_across_a_restart() -> None:
    views, _ = random_cluster(5)
    jobs = random_jobs(5, 40)
    kept = FragmentationGradientDescent()
    decide(kept, views, jobs[:20])
    restarted = FragmentationGradientDescent()
    restarted.restore(kept.snapshot())
    assert sum(restarted.counts.values()) == sum(kept.counts.values()) > 0
    assert decide(restarted, views, jobs[20:]) == decide(kept, views, jobs[20:])
    fresh = FragmentationGradientDescent()  # (without what it learnt, another target)
    assert fresh.snapshot().started == {}


def test_gpu_clustering_reads_the_jobs_a_node_runs() -> None:
    # Two equal nodes; n1 runs only 1-GPU jobs, n0 only shares: a 1-GPU job goes to n1.
    views = [
        NodeView(node_id=n, gpu_type="V100", num_gpus=4, usable=[2, 3], holding=held)
        for n, held in (("n0", {0: 2}), ("n1", {1: 2}))
    ]
    placed = decide(GpuClustering(), views, [JobSpec(job_id="a", num_gpus=1)])
    assert placed == {"a": [GpuRef("n1", 2)]}
    share = JobSpec(job_id="b", num_gpus=1, gpu_milli=300)
    assert decide(GpuClustering(), views, [share]) == {"b": [GpuRef("n0", 2)]}


def test_a_job_larger_than_any_node_spans_nodes() -> None:
    views = [NodeView(node_id=f"n{i}", gpu_type="V100", num_gpus=4, usable=[0, 1, 2, 3])
             for i in range(3)]  # fmt: skip
    placed = decide(BestFit(), views, [JobSpec(job_id="big", num_gpus=6)])
    assert len(placed["big"]) == 6 and len({g.node_id for g in placed["big"]}) == 2
    # Larger than any node of the type it was given, though a node of another type is not.
    views.append(NodeView(node_id="g", gpu_type="G2", num_gpus=8, usable=list(range(8))))
    big = JobSpec(job_id="big", num_gpus=8, gpu_type="V100")
    placed = decide(BestFit(), views, [big])
    assert len(placed["big"]) == 8 and {g.node_id for g in placed["big"]} <= {"n0", "n1", "n2"}
    assert decide(BestFit(), views, [JobSpec(job_id="g", num_gpus=8, gpu_type="G2")]) == {
        "g": [GpuRef("g", i) for i in range(8)]
    }


def test_the_six_are_registered_under_their_names() -> None:
    for name in ("random-fit", "best-fit", "dot-product", "gpu-packing", "gpu-clustering", "fgd"):
        assert isinstance(placement_policies.create(name, {}), PlacementPolicy)


async def test_fgd_packs_shares_in_a_simulation(tmp_path: Path, nats_url: str) -> None:
    # Two nodes of 2 GPUs: eight quarter-GPU jobs fit on two GPUs under FGD, leaving two GPUs
    # whole for the 2-GPU job that comes next; it starts at once.
    jobs = [JobSpec(job_id=f"s{i}", num_gpus=1, gpu_milli=250, duration=100.0, submit_time=0.0)
            for i in range(8)]  # fmt: skip
    jobs.append(JobSpec(job_id="whole", num_gpus=2, duration=50.0, submit_time=1.0))
    cluster = ClusterSpec(groups=[NodeGroup(count=2, gpus_per_node=2, cpu_milli=64_000)])
    options = SimOptions(cluster=cluster, policy="fifo", placement="fgd")
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url, plots=False)
    starts = {r.job_id: r.first_start for r in result.jobs}
    assert starts["whole"] == 1.0 and all(starts[f"s{i}"] == 0.0 for i in range(8))

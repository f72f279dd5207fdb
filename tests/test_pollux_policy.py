"""Pollux's policy (`gpuyard.policies.pollux.Pollux`) on its own: the GPU counts its search
chooses, how it lays them out on nodes, and its decisions over hand-built jobs (no NATS)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from gpuyard.policies.placement import MostFree
from gpuyard.policies.pollux import Pollux
from gpuyard.policies.pollux.pollux import best_counts, lay_out, power_terms
from gpuyard.shared.goodput import GoodputJob, load_applications
from gpuyard.shared.model import Allocation, GoodputHints, JobSpec
from gpuyard.shared.policy import (
    ClusterView,
    JobView,
    NodeStatus,
    NodeView,
    PlacementInput,
    SchedulingInput,
)


def brute_force(costs: list[np.ndarray], capacity: int) -> float:
    best = np.inf
    for counts in itertools.product(*(range(len(c)) for c in costs)):
        if sum(counts) <= capacity:
            best = min(best, sum(c[r] for c, r in zip(costs, counts, strict=True)))
    return float(best)


@pytest.mark.parametrize("seed", range(6))
def test_best_counts_is_optimal(seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs = [power_terms(np.concatenate(([0.0], np.sort(rng.random(rng.integers(1, 6))))), -1.0)
             for _ in range(4)]  # fmt: skip
    capacity = int(rng.integers(2, 9))
    counts = best_counts(costs, capacity)
    assert sum(counts) <= capacity
    total = sum(c[r] for c, r in zip(costs, counts, strict=True))
    assert total == pytest.approx(brute_force(costs, capacity))


def nodes(count: int, gpus: int = 4) -> list[NodeStatus]:
    return [NodeStatus(node_id=f"n{i:02d}", gpu_type="gpu", num_gpus=gpus) for i in range(count)]


def test_lay_out_keeps_running_jobs_and_spans_a_node_with_one_distributed_job() -> None:
    cluster = nodes(4)
    current = {"a": {"n01": 2}, "b": {}, "c": {}, "d": {}}
    layouts = lay_out(
        ["a", "b", "c", "d"], [2, 6, 3, 1], [True, False, False, False], current, cluster, 4, 16
    )
    assert layouts["a"] == {"n01": 2}  # kept where it runs
    assert sum(layouts["b"].values()) == 6 and len(layouts["b"]) == 2  # as few nodes as it can
    assert sum(layouts["c"].values()) == 3 and len(layouts["c"]) == 1
    used: dict[str, int] = {}
    for layout in layouts.values():
        for n, k in layout.items():
            used[n] = used.get(n, 0) + k
    assert all(k <= 4 for k in used.values())
    spanning = [set(lay) for lay in layouts.values() if len(lay) > 1]
    for one, other in itertools.combinations(spanning, 2):
        assert not one & other


def test_placement_takes_a_layout_as_it_is() -> None:
    views = [NodeView(node_id=f"n{i}", gpu_type="gpu", usable=[0, 1, 2, 3]) for i in range(3)]
    inp = PlacementInput(
        now=0.0,
        allocations=[Allocation("a", 3, layout={"n2": 1, "n0": 2})],
        current={},
        nodes=views,
        specs={},
    )
    placed = MostFree().place(inp)["a"]
    assert sorted((g.node_id, g.index) for g in placed) == [("n0", 0), ("n0", 1), ("n2", 0)]


@pytest.fixture
def profiles(shared_data: Path) -> Path:
    return shared_data / "pollux" / "traces"


def hints_of(profiles: Path, model: str, placement: tuple[int, ...]) -> GoodputHints:
    """What a job of `model` reports after a round on `placement` (its fitted model)."""
    job = GoodputJob(load_applications(profiles)[model])
    job.reallocate(placement)
    job.step(60.0)
    hints = job.hints()
    assert hints is not None
    return hints


def view(
    job_id: str, seq: int, model: str, *, running: dict[str, int] | None = None,
    hints: GoodputHints | None = None, submit: float = 0.0, attempt: int = 0,
) -> JobView:  # fmt: skip
    spec = JobSpec(job_id=job_id, job_type=model, num_gpus=1, min_gpus=1, max_gpus=64)
    if running:
        return JobView(
            job_id=job_id, seq=seq, spec=spec, state="running", submit_time=submit,
            gpus=sum(running.values()), gpu_type="gpu", nodes=list(running), goodput=hints,
            attempt=attempt, run_start=submit,
        )  # fmt: skip
    return JobView(job_id=job_id, seq=seq, spec=spec, state="queued", submit_time=submit)


def decide(policy: Pollux, now: float, jobs: list[JobView], count: int = 16) -> list[Allocation]:
    cluster = ClusterView(capacity={"gpu": 4 * count}, round_s=60.0, nodes=nodes(count))
    answer = policy.schedule(SchedulingInput(now=now, jobs=jobs, cluster=cluster))
    assert isinstance(answer, list)
    return answer


def test_a_job_never_profiled_gets_one_gpu_and_one_that_reported_grows(profiles: Path) -> None:
    policy = Pollux(Pollux.Params(profiles=str(profiles)))
    fresh = decide(policy, 600.0, [view("a", 0, "cifar10")])
    assert [(a.job_id, a.num_gpus) for a in fresh] == [("a", 1)]
    hints = hints_of(profiles, "cifar10", (2,))
    grown = decide(policy, 600.0, [view("a", 0, "cifar10", running={"n00": 2}, hints=hints,
                                        attempt=1)])  # fmt: skip
    # At most twice the most replicas it ran on: 4, on one node.
    assert [(a.job_id, a.num_gpus) for a in grown] == [("a", 4)]
    assert len(grown[0].layout) == 1


def test_ncf_runs_on_one_gpu_whatever_it_reported(profiles: Path) -> None:
    policy = Pollux(Pollux.Params(profiles=str(profiles)))
    spec = JobSpec(job_id="a", job_type="ncf", num_gpus=4, batch_size=32768)
    accepted = policy.accepts(spec)
    assert isinstance(accepted, JobSpec) and accepted.gpu_range == (1, 1)


def test_more_jobs_than_gpus_running_jobs_keep_theirs(profiles: Path) -> None:
    """8 GPUs, 10 jobs of one GPU each: every GPU used, the 8 running jobs not restarted (the
    restart penalty), the newcomers wait."""
    policy = Pollux(Pollux.Params(profiles=str(profiles)))
    hints = hints_of(profiles, "cifar10", (1,))
    jobs = [
        view(f"r{i}", i, "cifar10", running={f"n{i // 4:02d}": 1}, hints=hints, attempt=1)
        for i in range(8)
    ]
    # (1 GPU each: twice the most replicas, 2, would leave others with none)
    jobs += [view(f"q{i}", 8 + i, "cifar10", submit=590.0) for i in range(2)]
    allocations = decide(policy, 600.0, jobs, count=2)
    assert sum(a.num_gpus for a in allocations) == 8
    assert {a.job_id for a in allocations} == {f"r{i}" for i in range(8)}


@pytest.mark.slow
def test_decisions_are_deterministic_and_fill_the_cluster(profiles: Path) -> None:
    models = ["cifar10", "imagenet", "bert", "deepspeech2", "yolov3"]
    jobs = [
        view(f"j{i}", i, m, running={f"n{i // 2:02d}": 2}, hints=hints_of(profiles, m, (2,)),
             attempt=1, submit=60.0 * i)
        for i, m in enumerate(models)
    ]  # fmt: skip
    first = decide(Pollux(Pollux.Params(profiles=str(profiles))), 3600.0, jobs, count=4)
    again = decide(Pollux(Pollux.Params(profiles=str(profiles))), 3600.0, jobs, count=4)
    assert first == again
    used: dict[str, int] = {}
    for a in first:
        assert a.num_gpus <= 4  # twice the 2 replicas each ran on
        assert sum(a.layout.values()) == a.num_gpus
        for n, k in a.layout.items():
            used[n] = used.get(n, 0) + k
    assert all(k <= 4 for k in used.values())
    assert sum(a.num_gpus for a in first) == 16  # five jobs of up to 4 GPUs on 16: all used

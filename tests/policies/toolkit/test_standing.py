"""The standing order (`toolkit.standing`): kept from what changed, it decides as the whole walk.

A small scheduler of its own drives FIFO and SJF through thousands of decisions (arrivals of
several priorities, GPU types asked for, exits, placements that fail, capacity that changes) and
checks every decision told as what changes against the whole walk over every job.
"""

from __future__ import annotations

import random

import pytest

from gpuyard.policies.blox import Fifo, FifoParams, Sjf, SjfParams
from gpuyard.shared.model import ANY_GPU, Allocation, JobRecord, JobSpec
from gpuyard.shared.policy import (
    ClusterView,
    Decision,
    JobView,
    SchedulingInput,
    SchedulingPolicy,
    ViewContext,
)
from gpuyard.shared.throughput import LinearModel


class MiniScheduler:
    """Jobs, their views and the feed of what changed, as the scheduler keeps them."""

    def __init__(self, rng: random.Random, capacity: dict[str, int]) -> None:
        self.rng = rng
        self.capacity = capacity
        self.model = LinearModel()
        self.context = ViewContext(0.0, 300.0, self.model)
        self.views: dict[str, JobView] = {}
        self.changed: dict[str, None] = {}
        self.seq = 0
        self.now = 0.0

    def arrive(self) -> None:
        rng = self.rng
        gpus = rng.choice([1, 1, 1, 2, 4, 8])
        spec = JobSpec(
            job_id=f"j{self.seq}", num_gpus=gpus, priority=rng.choice([0, 0, 0, 0, 1]),
            gpu_type=rng.choice([ANY_GPU, ANY_GPU, "a", "b"]),
            duration=rng.choice([None, 100.0, 200.0, 50.0 * rng.randint(1, 40)]),
        )  # fmt: skip
        record = JobRecord(
            job_id=spec.job_id, seq=self.seq, spec=spec, state="queued",
            submit_time=self.now - rng.choice([0.0, 0.0, 30.0]), admit_time=self.now,
            queued_since=self.now,
        )  # fmt: skip
        self.seq += 1
        self.views[record.job_id] = JobView.of(record, self.context)
        self.changed[record.job_id] = None

    def step(self) -> None:
        """Time passes: jobs arrive, some running ones end."""
        rng = self.rng
        self.now += rng.choice([10.0, 60.0, 300.0])
        for _ in range(rng.choice([0, 1, 1, 2, 5])):
            self.arrive()
        running = [j for j, v in self.views.items() if v.record.state == "running"]
        for j in rng.sample(running, k=min(len(running), rng.choice([0, 0, 1, 2]))):
            self.end(j)

    def end(self, job_id: str) -> None:
        del self.views[job_id]
        self.changed[job_id] = None

    def input(self, fed: bool) -> SchedulingInput:
        self.context.now = self.now
        cluster = ClusterView(capacity=dict(self.capacity), throughputs=self.model)
        changed = {j: self.views.get(j) for j in self.changed} if fed else None
        return SchedulingInput(
            now=self.now, jobs=list(self.views.values()), cluster=cluster, changed=changed
        )

    def apply(self, allocations: list[Allocation]) -> None:
        """Run exactly `allocations`, but a few that would start do not (placement failed)."""
        allocated = {a.job_id for a in allocations}
        for view in self.views.values():
            r = view.record
            if r.state == "running" and r.job_id not in allocated:
                r.state, r.gpus, r.gpu_type = "queued", 0, None
                self.changed[r.job_id] = None
        for a in allocations:
            r = self.views[a.job_id].record
            if r.state == "running" and (r.gpus, r.gpu_type) == (a.num_gpus, a.gpu_type):
                continue
            if r.state == "queued" and self.rng.random() < 0.05:
                continue  # unplaced: it waits, nothing about it changed
            r.state, r.gpus, r.gpu_type = "running", a.num_gpus, a.gpu_type
            self.changed[r.job_id] = None


def in_full(decision: Decision, last: list[str], views: dict[str, JobView]) -> list[Allocation]:
    """A decision of what changes as the whole list: the running jobs it keeps (in the order of
    the last decision), then those it names."""
    named = {a.job_id for a in decision.allocations} | set(decision.stop)
    kept = [
        Allocation(j, r.gpus, r.gpu_type)  # type: ignore[arg-type]
        for j in last
        if (v := views.get(j)) is not None and (r := v.record).state == "running" and j not in named
    ]
    return kept + decision.allocations


def same_as_whole(
    decision: Decision, expected: list[Allocation], last: list[str], views: dict[str, JobView],
    step: int,
) -> list[Allocation]:  # fmt: skip
    """A decision of what changes, checked against the whole list of a walk over every job
    (`expected`): the same allocations, the running jobs left out stopped, only what changes
    named and in the walk's order (placement places those), none that keeps a job as it runs.
    Returns it as the whole list."""
    assert decision.keep_running
    got = in_full(decision, last, views)
    running = {j for j, v in views.items() if v.record.state == "running"}
    assert set(decision.stop) == running - {a.job_id for a in got}, f"decision {step}"
    assert sorted(got, key=str) == sorted(expected, key=str), f"decision {step}"
    kept = {a.job_id for a in got} - {a.job_id for a in decision.allocations}
    assert kept <= running, f"decision {step}"
    assert decision.allocations == [a for a in expected if a.job_id not in kept]
    for a in decision.allocations:
        r = views[a.job_id].record
        assert r.state != "running" or (a.num_gpus, a.gpu_type) != (r.gpus, r.gpu_type)
    return got


POLICIES = [
    pytest.param(lambda: Fifo(), id="fifo"),
    pytest.param(lambda: Fifo(FifoParams(backfill=True)), id="fifo-backfill"),
    pytest.param(lambda: Sjf(), id="sjf"),
    pytest.param(lambda: Sjf(SjfParams(preemptive=True, backfill=True)), id="sjf-preemptive"),
]


@pytest.mark.parametrize("make", POLICIES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_decision_of_what_changes_is_the_whole_walks(make, seed) -> None:
    rng = random.Random(seed)
    sim = MiniScheduler(rng, {"a": 24, "b": 16})
    fed, whole = make(), make()
    last: list[str] = []
    told_changes = walked = decisions = active = 0
    for step in range(600):
        sim.step()
        if step % 97 == 50:  # a node comes or goes
            sim.capacity["b"] = rng.choice([8, 16, 24])
        expected = whole.schedule(sim.input(fed=False))
        assert isinstance(expected, list)
        decision = fed.schedule(sim.input(fed=step > 0))
        sim.changed.clear()
        if isinstance(decision, Decision) and decision.keep_running:
            told_changes += 1
            walked += fed.order.walked
            active += len(sim.views)
            got = in_full(decision, last, sim.views)
            running_now = {j for j, v in sim.views.items() if v.record.state == "running"}
            assert set(decision.stop) == running_now - {a.job_id for a in got}
            # The same allocations; those it names (placement places them) in the same order.
            assert sorted(got, key=str) == sorted(expected, key=str), f"decision {step}"
            named = {a.job_id for a in decision.allocations}
            assert decision.allocations == [a for a in expected if a.job_id in named]
        else:
            got = decision.allocations if isinstance(decision, Decision) else decision
            assert got == expected, f"decision {step}"
        last = [a.job_id for a in got]
        decisions += 1
        sim.apply(got)
    # Most decisions were told as what changes, and walked a part of the jobs.
    assert told_changes > 0.8 * decisions
    assert walked < 0.5 * active, (walked, active)


def test_a_long_queue_is_not_walked() -> None:
    """A full cluster and 2,000 waiting jobs: a decision walks the first waiting job only."""
    rng = random.Random(7)
    sim = MiniScheduler(rng, {"a": 64})
    policy = Fifo()

    def arrive() -> None:  # a job of type a (the cluster's only one)
        sim.arrive()
        r = sim.views[f"j{sim.seq - 1}"].record
        r.spec = JobSpec(job_id=r.job_id, num_gpus=r.spec.num_gpus, priority=0, gpu_type="a")

    for _ in range(2000):
        arrive()
    decision = policy.schedule(sim.input(fed=True))
    sim.changed.clear()
    first = decision.allocations if isinstance(decision, Decision) else decision
    sim.apply(first)
    sim.changed.clear()
    for _ in range(20):
        sim.now += 300.0
        arrive()
        job = next(j for j, v in sim.views.items() if v.record.state == "running")
        sim.end(job)
        decision = policy.schedule(sim.input(fed=True))
        sim.changed.clear()
        assert isinstance(decision, Decision) and decision.keep_running
        assert policy.order.walked <= 1 + len(decision.allocations)
        sim.apply(in_full(decision, [a.job_id for a in first], sim.views))


def test_without_changes_the_policy_walks_every_job() -> None:
    """A policy told no `changed` (a hand-built input, a scheduler that takes only whole
    decisions) answers with every allocation."""
    sim = MiniScheduler(random.Random(3), {"a": 8, "b": 8})
    for _ in range(30):
        sim.arrive()
    policy: SchedulingPolicy = Fifo()
    decision = policy.schedule(sim.input(fed=False))
    assert isinstance(decision, list) and decision

"""Themis, Gandiva and Chronus as ElasticFlow runs them, on views built by hand (no NATS)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.policies.elasticflow import Chronus, ChronusParams, Gandiva, Themis, ThemisParams
from gpuyard.policies.elasticflow.chronus import ACCEPTED, LOWEST, UNACCEPTED
from gpuyard.shared.model import Allocation, JobSpec
from gpuyard.shared.policy import (
    ClusterView,
    JobView,
    NodeStatus,
    SchedulingInput,
    scheduling_policies,
)
from gpuyard.shared.throughput import ElasticFlowThroughputs

MODEL = ElasticFlowThroughputs({"a100": {"toy": {64: {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0}}}})


def job(job_id: str, gpus: int, steps: float, *, deadline: float | None = None, running: bool = False,
        submit: float = 0.0, seq: int = 0, **record: Any) -> JobView:  # fmt: skip
    spec = JobSpec(job_id=job_id, job_type="toy@64", num_gpus=gpus, min_gpus=1, max_gpus=64,
                   total_steps=steps, deadline=deadline)  # fmt: skip
    if running:
        record |= {"gpus": gpus, "gpu_type": "a100", "rate": float(gpus)}
    else:
        record.setdefault("queued_since", submit)
    return JobView(job_id=job_id, seq=seq, spec=spec, state="running" if running else "queued",
                   submit_time=submit, **record)  # fmt: skip


def at(jobs: list[JobView], now: float, gpus: int = 8, round_s: float = 240.0,
       node: int = 8) -> SchedulingInput:  # fmt: skip
    for j in jobs:
        j.record.run_start = j.record.progress_at = now
    nodes = [NodeStatus(f"n{i}", "a100", node) for i in range(gpus // node)]
    cluster = ClusterView(capacity={"a100": gpus}, round_s=round_s, throughputs=MODEL, nodes=nodes)
    return SchedulingInput(now=now, jobs=[JobView(j.record) for j in jobs], cluster=cluster)


def counts(allocations: list[Allocation]) -> dict[str, int]:
    return {a.job_id: a.num_gpus for a in allocations}


def test_registered():
    assert scheduling_policies.get("themis") is Themis
    assert scheduling_policies.get("gandiva-ts") is Gandiva
    assert scheduling_policies.get("chronus") is Chronus


# --------------------------------------------------------------------------- Themis


def test_themis_runs_jobs_at_their_requested_size_and_fills_what_fits():
    jobs = [job("a", 4, 4000, seq=0), job("b", 4, 40, seq=1), job("c", 2, 20, seq=2)]
    got = counts(Themis().schedule(at(jobs, 0.0, gpus=8)))
    assert set(got.values()) <= {4, 2} and sum(got.values()) <= 8
    assert got == {j.job_id: j.spec.num_gpus for j in jobs if j.job_id in got}
    assert len(got) == 2  # only two of the three fit


def test_themis_favours_the_job_furthest_behind_its_fair_finish_time():
    # Equal jobs on one GPU; 'old' has waited 1000 s already: its finish-time ratio is worse.
    old = job("old", 1, 100, submit=0.0, seq=0)
    new = job("new", 1, 100, submit=1000.0, seq=1)
    for isolated in ("reference", "throughput"):
        pol = Themis(ThemisParams(isolated=isolated))  # type: ignore[arg-type]
        assert counts(pol.schedule(at([new, old], 1000.0, gpus=1))) == {"old": 1}


def test_themis_keeps_the_isolated_time_it_accrued():
    pol = Themis()
    a = job("a", 1, 1000, seq=0)
    pol.schedule(at([a, job("b", 1, 1000, seq=1)], 0.0, gpus=1))
    ran = job("a", 1, 1000, seq=0, steps_done=240.0)
    pol.schedule(at([ran, job("b", 1, 1000, seq=1)], 240.0, gpus=1))
    assert pol.snapshot().jobs["a"].isolated_time > 0
    assert pol.snapshot().jobs["b"].isolated_time == 0
    restored = Themis()
    restored.restore(pol.snapshot())
    assert restored.snapshot() == pol.snapshot()


def test_themis_decides_again_every_round_while_jobs_wait():
    jobs = [job("a", 8, 100, seq=0), job("b", 8, 100, seq=1)]
    pol = Themis()
    pol.schedule(at(jobs, 0.0))
    assert pol.next_decision_time(at(jobs, 0.0)) == 240.0
    assert pol.next_decision_time(at([job("a", 8, 100, running=True)], 0.0)) is None


# --------------------------------------------------------------------------- Gandiva


def test_gandiva_shares_node_sets_by_demand_and_time_slices_within_a_group():
    # 2 nodes of 4: ten 1-GPU jobs and one 4-GPU job. Demand 10 vs 4: the 1-GPU group gets a
    # node (4 at once), the 4-GPU job the other; six 1-GPU jobs wait their turn.
    ones = [job(f"o{i}", 1, 100, seq=i, submit=float(i)) for i in range(10)]
    big = job("big", 4, 100, seq=10, submit=10.0)
    pol = Gandiva()
    got = counts(pol.schedule(at([*ones, big], 100.0, gpus=8, node=4)))
    assert got["big"] == 4
    assert sorted(k for k in got if k != "big") == ["o0", "o1", "o2", "o3"]
    assert pol.next_decision_time(at([*ones, big], 100.0, gpus=8, node=4)) == 340.0
    # A slot later the ones that waited take the place of those that ran.
    ran = [job(f"o{i}", 1, 100, seq=i, submit=float(i), running=True) for i in range(4)]
    waited = [job(f"o{i}", 1, 100, seq=i, submit=float(i)) for i in range(4, 10)]
    big_running = job("big", 4, 100, seq=10, running=True)
    got = counts(pol.schedule(at([*ran, *waited, big_running], 340.0, gpus=8, node=4)))
    assert sorted(k for k in got if k != "big") == ["o4", "o5", "o6", "o7"]


def test_gandiva_gives_spare_nodes_to_the_group_that_still_waits():
    ones = [job(f"o{i}", 1, 100, seq=i) for i in range(6)]
    got = counts(Gandiva().schedule(at(ones, 0.0, gpus=8, node=4)))
    assert len(got) == 6


# --------------------------------------------------------------------------- Chronus


def test_chronus_accepts_what_its_leases_can_hold_and_guarantees_it():
    # 8 GPUs, 240 s leases. Each job runs 480 s on 8 GPUs: with Chronus's margins 3 leases. 'a'
    # has until 2400 s, 'b' and 'c' until 1000 s: 'a' and 'b' pack, 'c' does not.
    pol = Chronus()
    jobs = [
        job("a", 8, 8 * 480, deadline=2400.0, seq=0),
        job("b", 8, 8 * 480, deadline=1000.0, seq=1),
        job("c", 8, 8 * 480, deadline=1000.0, seq=2),
    ]
    first = pol.schedule(at(jobs, 0.0))
    assert pol.priority == {"a": ACCEPTED, "b": ACCEPTED, "c": UNACCEPTED}
    assert counts(first) == {"c": 8}  # accepted jobs hold leases from the next one; 'c' fills in
    second = pol.schedule(at(jobs, 240.0))
    assert counts(second) == {"b": 8}  # 'b' must hold all its 3 leases from now to make it
    late = pol.schedule(at(jobs, 1200.0))
    assert pol.priority["c"] == LOWEST  # 480 s of work left at 1200 s: past its deadline
    assert "c" not in counts(late)


def test_chronus_changes_nothing_between_leases():
    pol = Chronus(ChronusParams(lease_s=240.0))
    running = job("a", 4, 10_000, deadline=1e6, running=True)
    waiting = job("b", 4, 100, deadline=1e6, seq=1)
    assert counts(pol.schedule(at([running, waiting], 60.0, round_s=60.0))) == {"a": 4}
    assert pol.next_decision_time(at([running, waiting], 60.0, round_s=60.0)) == 240.0


@pytest.mark.parametrize("solver", ["cp_sat", "scip"])
def test_chronus_program_keeps_every_slo_it_can(solver: str):
    # Three 8-GPU jobs of one lease each on 8 GPUs: from the lease at 240 s their deadlines allow
    # leases 1, 1-2 and 1-3, so all three fit, one per lease, the most urgent first.
    pol = Chronus(ChronusParams(solver=solver))  # type: ignore[arg-type]
    jobs = [job(n, 8, 8 * 100, deadline=d, seq=i) for i, (n, d) in enumerate(
        [("c", 4 * 240 + 10), ("b", 3 * 240 + 10), ("a", 2 * 240 + 10)])]  # fmt: skip
    pol.schedule(at(jobs, 0.0))  # first sight: all accepted (one lease each from the next)
    assert set(pol.priority.values()) == {ACCEPTED}
    assert counts(pol.schedule(at(jobs, 240.0))) == {"a": 8}
    assert set(pol.priority.values()) == {ACCEPTED}

"""`gandiva-ef`, Gandiva as ElasticFlow's simulator runs it, on views built by hand (no NATS). The
expected decisions follow ElasticFlow's `gandiva_sim_jobs` and its `--scheme=gandiva` node sets
(`cluster.py`) step by step, quirks included."""

from __future__ import annotations

import msgspec

from gpuyard.policies.elasticflow import Gandiva, GandivaEf, GandivaEfParams, GandivaEfState
from gpuyard.shared.model import Allocation, JobSpec
from gpuyard.shared.policy import (
    ClusterView,
    JobView,
    NodeStatus,
    SchedulingInput,
    scheduling_policies,
)


def job(job_id: str, gpus: int, submit: float, seq: int) -> JobView:
    spec = JobSpec(job_id=job_id, job_type="toy@64", num_gpus=gpus, total_steps=1e6)
    return JobView(job_id=job_id, seq=seq, spec=spec, state="queued", submit_time=submit,
                   queued_since=submit)  # fmt: skip


def at(jobs: list[JobView], now: float, nodes: int = 2, node: int = 4) -> SchedulingInput:
    cluster = ClusterView(
        capacity={"a100": nodes * node}, round_s=240.0,
        nodes=[NodeStatus(f"n{i}", "a100", node) for i in range(nodes)],
    )  # fmt: skip
    return SchedulingInput(now=now, jobs=[JobView(j.record) for j in jobs], cluster=cluster)


def running(allocations: list[Allocation]) -> dict[str, list[str]]:
    return {a.job_id: a.nodes for a in allocations}


def test_registered_beside_the_corrected_one():
    assert scheduling_policies.get("gandiva-ef") is GandivaEf
    assert scheduling_policies.get("gandiva-ts") is Gandiva


def test_a_group_of_small_jobs_shrinks_to_one_node_set_and_takes_turns_on_whole_minutes():
    """2 nodes of 4 GPUs, five 1-GPU jobs at `start`, no more arrivals (every slot from then).

    Placement: a, b, c fill the set on n0 to a load of 3 (a set takes a job only while its load
    stays below its capacity, 4); d opens a set on n1, e joins it. Resizing then counts the group
    as 5 GPUs against the 8 its two sets occupy and gives back ceil(3 / 1) sets, at most all but
    one: n1's set goes, d and e join n0's. So only a to d run, on n0, while n1 stays idle (a
    group's share in proportion to demand would run all five). A slot later the set turns (the
    four that ran go to the back: e, a, b, c run) only if that iteration falls on a whole minute.
    """
    jobs = [job(name, 1, 0.0, i) for i, name in enumerate("abcde")]
    for start, turned in ((0.0, True), (30.0, False)):
        for j in jobs:
            j.record.submit_time = j.record.queued_since = start
        policy = GandivaEf(GandivaEfParams(last_arrival=start))
        first = policy.schedule(at(jobs, start))
        assert running(first) == {name: ["n0"] for name in "abcd"}
        assert policy.next_decision_time(at(jobs, start)) == start + 240.0
        later = policy.schedule(at(jobs, start + 240.0))
        assert [a.job_id for a in later] == (list("eabc") if turned else list("abcd"))
        # (resizing now asks for ceil(1 / 1) more sets: it makes n1 a set and leaves it empty)
        assert all(a.nodes == ["n0"] for a in later)


def test_events_within_a_slot_wait_for_its_end_and_a_finished_job_keeps_its_gpus_until_then():
    policy = GandivaEf(GandivaEfParams(last_arrival=1000.0))
    a, b = job("a", 4, 0.0, 0), job("b", 4, 100.0, 1)
    assert running(policy.schedule(at([a], 0.0))) == {"a": ["n0"]}
    # b arrives within the slot: not an iteration, nothing changes until the slot's end
    assert running(policy.schedule(at([a, b], 100.0))) == {"a": ["n0"]}
    assert policy.next_decision_time(at([a, b], 100.0)) == 240.0
    assert running(policy.schedule(at([a, b], 240.0))) == {"a": ["n0"], "b": ["n1"]}
    # a ends at 300: its GPUs stay idle, and nothing is woken for it before the next arrival
    assert running(policy.schedule(at([b], 300.0))) == {"b": ["n1"]}
    assert policy.next_decision_time(at([b], 300.0)) is None
    # the last arrival is an event at its own time, even within a slot of the last iteration
    for final, d_runs in ((1000.0, True), (2000.0, False)):
        policy = GandivaEf(GandivaEfParams(last_arrival=final))
        a, c, d = job("a", 1, 0.0, 0), job("c", 1, 800.0, 1), job("d", 1, 1000.0, 2)
        policy.schedule(at([a], 0.0))
        assert "c" in running(policy.schedule(at([a, c], 800.0)))  # (more than a slot later)
        assert ("d" in running(policy.schedule(at([a, c, d], 1000.0)))) is d_runs


def test_pending_jobs_tried_again_skip_the_one_after_each_that_starts():
    """An 8-GPU job holds both nodes; three 4-GPU jobs find no set and wait. When it has ended,
    the pending list is walked while jobs leave it: p starts on n0, q is skipped, s takes n1 (q,
    tried, would have taken n1 and left s to wait its turn)."""
    big, p, q, s = (
        job("big", 8, 0.0, 0),
        job("p", 4, 0.0, 1),
        job("q", 4, 0.0, 2),
        job("s", 4, 0.0, 3),
    )
    policy = GandivaEf(GandivaEfParams(last_arrival=0.0))
    assert running(policy.schedule(at([big, p, q, s], 0.0))) == {"big": ["n0", "n1"]}
    assert policy.snapshot().pending == ["p", "q", "s"]
    assert running(policy.schedule(at([p, q, s], 240.0))) == {"p": ["n0"], "s": ["n1"]}
    assert policy.snapshot().pending == ["q"]


def test_state_round_trips():
    policy = GandivaEf(GandivaEfParams(last_arrival=0.0))
    jobs = [job(name, 1, 0.0, i) for i, name in enumerate("abcde")]
    policy.schedule(at(jobs, 0.0))
    encoded = msgspec.json.encode(policy.snapshot())
    again = GandivaEf(GandivaEfParams(last_arrival=0.0))
    again.restore(msgspec.json.decode(encoded, type=GandivaEfState))
    assert again.schedule(at(jobs, 240.0)) == policy.schedule(at(jobs, 240.0))

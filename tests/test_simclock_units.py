"""The simclock's parts without NATS: its cost models, its simulated node agents, the progress
they make, and how it plans an instant and finds the next (end to end: tests/test_recorded.py)."""

from __future__ import annotations

import pytest

from gpuyard.services.simclock.agents import SimJob, SimNodes
from gpuyard.services.simclock.config import SimClockConfig
from gpuyard.services.simclock.costs import PreemptionCost, RestartCost, Restarts
from gpuyard.services.simclock.instants import next_event, plan_instant
from gpuyard.services.simclock.progress import Completions
from gpuyard.services.simclock.timeline import Timeline
from gpuyard.shared.contract import Launch, NodeCommand, TimelinePoint
from gpuyard.shared.errors import BadRequest
from gpuyard.shared.model import ClusterSpec, JobSpec
from gpuyard.shared.throughput import LinearModel, default_model

# ------------------------------------------------------------------ cost models


def test_a_restart_costs_base_doublings_and_a_cold_start_unless_warm() -> None:
    cost = RestartCost(base_s=2.0, per_doubling_s=3.0, cold_s=27.0)
    assert cost.seconds(8, warm=False, cold=False) == 2.0 + 3.0 * (3 + 1)
    assert cost.seconds(1, warm=False, cold=True) == 2.0 + 3.0 + 27.0
    assert cost.seconds(8, warm=True, cold=True) == 2.0  # warm processes start at base cost


def test_a_preemption_cost_per_job_type_overrides_the_default() -> None:
    cost = PreemptionCost(checkpoint_s=30.0, restore_s=10.0, by_job_type={"bert": (5.0, 1.0)})
    assert cost.of("resnet50") == (30.0, 10.0)
    assert cost.of("bert") == (5.0, 1.0)


SETS = {
    "a": frozenset({("n0", 0), ("n0", 1)}),
    "b": frozenset({("n1", 0)}),
    "c": frozenset({("n1", 1)}),
}


def test_restarts_of_launched_jobs_are_warm_on_gpus_used_before_and_cold_every_nth_instant() -> (
    None
):
    restarts = Restarts(RestartCost(base_s=1.0, per_doubling_s=1.0, cold_s=10.0, cold_every=2), {})
    pauses = lambda t, launched: restarts.pauses(  # noqa: E731
        t, decided=None, launched=launched, running=set(SETS), gpu_set=SETS.get
    )
    assert pauses(0.0, set()) == {}  # nothing launched: nothing charged, no instant counted
    assert pauses(1.0, {"a"}) == {"a": 1.0 + 1.0 * 2}  # the first instant is never cold
    assert pauses(2.0, {"a", "b"}) == {"a": 1.0, "b": 1.0 + 1.0}  # a's processes are warm
    assert pauses(3.0, {"a", "c"}) == {"a": 1.0, "c": 1.0 + 1.0 + 10.0}  # the 2nd after: cold
    assert pauses(4.0, {"a"}) == {"a": 1.0 + 2.0}  # the cold start forgot the warm sets


def test_restarts_at_decisions_charge_every_running_job_once_a_gap() -> None:
    restarts = Restarts(RestartCost(scope="decisions", decision_gap_s=60.0, warm_ranks=False), {})

    def at(t: float, decided: float | None) -> dict[str, float]:
        return restarts.pauses(t, decided=decided, launched=set(), running={"a", "b", "gone"},
                               gpu_set=SETS.get)  # fmt: skip

    assert at(0.0, decided=None) == {}  # no decision at this instant
    assert sorted(at(10.0, decided=10.0)) == ["a", "b"]  # (a job without GPUs pays nothing)
    assert at(30.0, decided=30.0) == {}  # within the gap
    assert sorted(at(70.0, decided=70.0)) == ["a", "b"]


def test_restarts_stop_at_until() -> None:
    """ElasticFlow's Gandiva charges only at its arrival events: none from its last arrival on."""
    restarts = Restarts(RestartCost(scope="changes", warm_ranks=False, until_s=100.0), {})

    def at(t: float) -> dict[str, float]:
        return restarts.pauses(t, decided=t, launched={"a"}, running={"a", "b"}, gpu_set=SETS.get)

    assert sorted(at(99.0)) == ["a", "b"]
    assert at(100.0) == {} and at(500.0) == {}


def test_elasticflow_keys_warm_processes_by_first_rank_and_size() -> None:
    """ElasticFlow's simulator caches a job's processes by the rank of its first GPU in the
    cluster's order and its size (`RestartCost.warm_key="first_rank"`): two GPUs on nodes 1 and 3
    of 2-GPU nodes are ranks 2 and 7, keyed (2, 2), as the GPUs of node 1 are."""
    nodes = {n.node_id: n for n in ClusterSpec.parse("4x2").nodes()}
    restarts = Restarts(RestartCost(warm_key="first_rank"), nodes)
    spread = frozenset({("gpu-0001", 0), ("gpu-0003", 1)})
    node1 = frozenset({("gpu-0001", 0), ("gpu-0001", 1)})
    assert restarts.first_rank(spread) == restarts.first_rank(node1) == (2, 2)
    assert restarts.first_rank(frozenset({("gpu-0003", 1)})) == (7, 1)
    pauses = restarts.pauses(0.0, decided=None, launched={"x", "y"}, running=set(),
                             gpu_set={"x": spread, "y": node1}.get)  # fmt: skip
    assert pauses == {"x": 2.0 + 2.0 * 2, "y": 2.0}  # y finds x's processes warm


# ------------------------------------------------------------------ simulated node agents


def launch(job: str, gpus: list[int], attempt: int = 0) -> Launch:
    return Launch(job_id=job, gpus=gpus, world_size=len(gpus), rank_offset=0, node_rank=0,
                  num_nodes=1, master_addr="", master_port=0, attempt=attempt)  # fmt: skip


def cluster_of(jobs: dict[str, float], cost: PreemptionCost | None = None, **config: object):
    """Two 2-GPU v100 nodes, the jobs (id: duration on one GPU) and their progress."""
    cluster = ClusterSpec.parse("2x2:v100")
    cfg = SimClockConfig(workload="-", cluster=cluster, preemption_cost=cost or PreemptionCost(),
                         **config)  # fmt: skip
    nodes = SimNodes(cluster, cfg.preemption_cost)
    for job_id, duration in jobs.items():
        nodes.jobs[job_id] = SimJob(JobSpec(job_id=job_id, num_gpus=1, duration=duration), duration)
    return nodes, Completions(nodes, default_model(), cfg)


def test_a_node_agent_starts_and_stops_parts_and_names_the_unknown_node() -> None:
    nodes, _ = cluster_of({"a": 100.0})
    reply = nodes.command(NodeCommand(now=0.0, node_id="v100-0000", launch=[launch("a", [0, 1])]))
    assert reply.launched == ["a"] and nodes.running == {"a"} and nodes.launched == {"a"}
    assert nodes.holding == {("v100-0000", 0): ["a"], ("v100-0000", 1): ["a"]}
    assert nodes.gpu_set("a") == frozenset({("v100-0000", 0), ("v100-0000", 1)})
    nodes.jobs["a"].rate = 2.0
    reply = nodes.command(NodeCommand(now=10.0, node_id="v100-0000", preempt=["a", "ended"]))
    assert reply.preempted == ["a"] and reply.progress == {"a": 20.0}  # (an ended job: skipped)
    assert nodes.running == set() and nodes.holding == {} and nodes.gpu_set("a") is None
    with pytest.raises(BadRequest, match="no simulated node 'elsewhere'"):
        nodes.command(NodeCommand(now=0.0, node_id="elsewhere"))


def test_a_preempted_job_keeps_its_last_checkpoint_and_pays_its_restore() -> None:
    nodes, runs = cluster_of({"a": 1000.0}, PreemptionCost(checkpoint_s=30.0, restore_s=20.0))
    nodes.command(NodeCommand(now=0.0, node_id="v100-0000", launch=[launch("a", [0])]))
    runs.refresh(0.0, decided=0.0)
    job = nodes.jobs["a"]
    assert job.rate == 1.0 and runs.next_completion() == 1000.0
    nodes.command(NodeCommand(now=100.0, node_id="v100-0000", preempt=["a"]))
    assert job.done == 70.0  # 100 s run, the last 30 s not saved
    runs.refresh(100.0, decided=100.0)
    assert job.rate == 0.0 and runs.next_completion() is None
    nodes.command(NodeCommand(now=200.0, node_id="v100-0001", launch=[launch("a", [1], 1)]))
    behind = runs.refresh(200.0, decided=200.0)
    assert job.done == 50.0 and behind["a"].steps == 50.0  # 20 s restoring before it progresses
    assert runs.next_completion() == 200.0 + 950.0
    (exit,) = runs.exits(1150.0)
    assert (exit.job_id, exit.status, exit.attempt, runs.finished) == ("a", "completed", 1, 1)
    assert nodes.holding == {} and "a" not in nodes.jobs


def test_a_partner_left_alone_keeps_what_it_made_at_the_pair_rate() -> None:
    nodes, runs = cluster_of({"a": 100.0, "b": 100.0})
    nodes.command(NodeCommand(now=0.0, node_id="v100-0000", launch=[launch("a", [0])]))
    nodes.command(NodeCommand(now=0.0, node_id="v100-0000", launch=[launch("b", [0])]))
    assert nodes.sharing() == {"a": "b", "b": "a"}
    runs.refresh(0.0, decided=0.0)  # the default model measured no pair: neither progresses
    assert nodes.jobs["a"].rate == 0.0 and nodes.jobs["a"].failure.startswith("no throughput")
    nodes.jobs["a"].rate = 0.5
    nodes.command(NodeCommand(now=40.0, node_id="v100-0000", preempt=["b"]))
    assert nodes.changed == {"a", "b"} and nodes.jobs["a"].done == 20.0


def test_a_job_not_running_ends_no_sooner_than_its_work_left_at_the_fastest_rate() -> None:
    """`least_runs`: the least any job waiting would run once started, and the soonest any job
    still to arrive could end (the scheduler goes on through starts short of both); a job that
    started leaves them, one stopped comes back with the work it has left, one arriving moves
    from the second to the first. The default model's fastest type here is v100 (1 step/s/GPU)."""
    nodes, runs = cluster_of({"a": 100.0, "b": 300.0, "c": 20.0, "d": 50.0})
    assert runs.least_runs(0.0) == (None, None)  # (none arrived)
    for job_id in ("a", "b"):
        runs.waiting(job_id, nodes.jobs[job_id])
    runs.waiting("d", nodes.jobs["d"], arrival=980.0)  # submitted ahead, in arrival order
    runs.waiting("c", nodes.jobs["c"], arrival=1000.0)
    assert runs.least_runs(0.0) == (100.0, 1020.0)  # (c: 1000 + 20; d: 980 + 50)
    nodes.command(NodeCommand(now=0.0, node_id="v100-0000", launch=[launch("a", [0])]))
    runs.refresh(0.0, decided=0.0)
    assert runs.least_runs(0.0) == (300.0, 1020.0)  # a runs: b is the only one waiting
    nodes.command(NodeCommand(now=40.0, node_id="v100-0000", preempt=["a"]))
    runs.refresh(40.0, decided=40.0)
    assert runs.least_runs(40.0) == (60.0, 1020.0)  # a waits again with 60 s of work left
    nodes.command(NodeCommand(now=50.0, node_id="v100-0001", launch=[launch("b", [0, 1])]))
    runs.refresh(50.0, decided=50.0)
    assert runs.next_completion() == 50.0 + 150.0  # b on 2 GPUs: its least run was at 1
    assert runs.least_runs(990.0) == (50.0, 1020.0)  # d arrived: 50 s from its start
    assert runs.least_runs(1000.0) == (20.0, None)  # c too, and none is to arrive


def test_no_least_run_is_told_where_a_run_is_paced_otherwise() -> None:
    """A preemption cost (a restore pause), a job sharing a GPU (`gpu_milli`), or a node of a
    GPU type not seen before: a started job's run is not known from its work at the rates
    known, and the clock tells no bound."""
    nodes, runs = cluster_of({"a": 100.0}, PreemptionCost(restore_s=5.0))
    runs.waiting("a", nodes.jobs["a"])
    assert runs.least_runs(0.0) == (None, None)
    nodes, runs = cluster_of({"a": 100.0})
    runs.waiting("a", nodes.jobs["a"])
    assert runs.least_runs(0.0) == (100.0, None)
    share = SimJob(JobSpec(job_id="s", num_gpus=1, duration=50.0, gpu_milli=500), 50.0)
    nodes.jobs["s"] = share
    runs.waiting("s", share)
    assert runs.least_runs(0.0) == (None, None)
    nodes, runs = cluster_of({"a": 100.0})
    runs.waiting("a", nodes.jobs["a"])
    nodes.node_types["h100-0000"] = "h100"  # (a node joined)
    assert runs.least_runs(0.0) == (None, None)
    nodes, _ = cluster_of({"a": 100.0})  # a GPU type some job crashes on
    config = SimClockConfig(workload="-", cluster=ClusterSpec.parse("2x2:v100"))
    runs = Completions(nodes, LinearModel({"k80": 0.0}), config)
    runs.waiting("a", nodes.jobs["a"])
    assert runs.least_runs(0.0) == (None, None)


def test_the_exits_of_the_next_completions_are_foreseen_instant_by_instant() -> None:
    """`foresee`: each completion instant's exits from the first on, as `exits` will report
    them, before a limit and at most so many instants; the next completion after them; nothing
    leaves meanwhile. Nothing where a job leaves a GPU it shares."""
    nodes, runs = cluster_of({"a": 10.0, "b": 20.0, "c": 20.0, "d": 40.0})
    for node, job_id, gpu in (("v100-0000", "a", 0), ("v100-0000", "b", 1),
                              ("v100-0001", "c", 0), ("v100-0001", "d", 1)):  # fmt: skip
        nodes.command(NodeCommand(now=0.0, node_id=node, launch=[launch(job_id, [gpu])]))
    runs.refresh(0.0, decided=0.0)
    foreseen = runs.foresee(10.0, before=100.0, most=8)
    assert foreseen is not None
    instants, after = foreseen
    assert [(t, sorted(e.job_id for e in exits)) for t, exits in instants] == [
        (10.0, ["a"]),
        (20.0, ["b", "c"]),
        (40.0, ["d"]),
    ]
    assert after is None and runs.next_completion() == 10.0  # (nothing left yet)
    assert all(e.status == "completed" for _, exits in instants for e in exits)
    assert runs.foresee(10.0, before=40.0, most=8) == (instants[:2], 40.0)
    assert runs.foresee(10.0, before=100.0, most=1) == (instants[:1], 20.0)
    assert [e.job_id for e in runs.exits(10.0)] == ["a"]
    # e joins d on its GPU (space sharing, which the default model cannot run: both crash as
    # they start): their leaving changes the other's GPU, and nothing is foreseen
    nodes.jobs["e"] = SimJob(JobSpec(job_id="e", num_gpus=1, duration=80.0), 80.0)
    nodes.command(NodeCommand(now=10.0, node_id="v100-0001", launch=[launch("e", [1])]))
    runs.refresh(10.0, decided=10.0)
    assert runs.next_completion() == 10.0 and runs.foresee(10.0, 100.0, 8) is None


def test_exits_wait_for_the_round_quantum_and_a_gavel_round_ends_with_its_last_task() -> None:
    nodes, runs = cluster_of({"a": 250.0}, completion_quantum=300.0)
    nodes.command(NodeCommand(now=0.0, node_id="v100-0000", launch=[launch("a", [0])]))
    runs.refresh(0.0, decided=0.0)
    assert runs.next_completion() == 300.0 and runs.exits(299.0) == []
    assert [e.job_id for e in runs.exits(300.0)] == ["a"]

    nodes, runs = cluster_of({"a": 250.0, "b": 1000.0}, gavel_round_s=100.0)
    for job, node in (("a", "v100-0000"), ("b", "v100-0001")):
        nodes.command(NodeCommand(now=0.0, node_id=node, launch=[launch(job, [0])]))
    runs.refresh(0.0, decided=0.0)
    assert runs.next_completion() is None  # Gavel's rounds: exits come from `plan_round`
    ends = [runs.plan_round(t, 100.0) for t in (0.0, 100.0, 200.0)]
    assert ends == [(100.0, 200.0), (200.0, 200.0), (300.0, 150.0)]  # a's 50 last steps
    assert nodes.jobs["a"].ended_at == 250.0 and runs.next_completion() == 300.0


# ------------------------------------------------------------------ instants


@pytest.mark.parametrize(
    ("nodes", "exits", "submit", "expected"),
    [
        (False, False, False, []),
        (True, False, False, [("nodes", True)]),
        (True, True, False, [("nodes", False), ("exits", True)]),
        (False, True, True, [("exits", False), ("submit", True)]),
        (True, True, True, [("nodes", False), ("exits", False), ("submit", True)]),
    ],
)
def test_an_instant_tells_nodes_then_exits_then_arrivals_and_the_last_ticks(
    nodes: bool, exits: bool, submit: bool, expected: list
) -> None:
    assert plan_instant(nodes=nodes, exits=exits, submit=submit) == expected


def test_the_next_instant_is_the_earliest_change_and_wakes_never_go_back() -> None:
    none = dict(arrival=None, completion=None, node_event=None, wake=None, held_retry=None)
    assert next_event(**none, last=None) is None
    assert next_event(**none | {"arrival": 50.0, "completion": 40.0}, last=30.0) == 40.0
    assert next_event(**none | {"node_event": 35.0, "wake": 60.0}, last=30.0) == 35.0
    # a tick asked for in the past, or admission's retry, comes at the last instant, not before
    assert next_event(**none | {"arrival": 50.0, "wake": 10.0}, last=30.0) == 30.0
    assert next_event(**none | {"held_retry": 10.0}, last=None) == 10.0


def test_the_timeline_keeps_a_point_per_instant_as_columns() -> None:
    timeline = Timeline()
    assert timeline.last() is None and timeline.page(0, 10) == []
    timeline.put(TimelinePoint(0.0, 0, 1, 0, 8))
    timeline.put(TimelinePoint(10.0, 4, 0, 1, 8))
    timeline.put(TimelinePoint(10.0, 6, 0, 2, 8))  # the same instant again: its latest counts
    timeline.insert(1, [TimelinePoint(4.0, 2, 1, 1, 8), TimelinePoint(7.5, 2, 0, 1, 8)])
    assert len(timeline) == 4 and timeline.last() == TimelinePoint(10.0, 6, 0, 2, 8)
    assert timeline.page(1, 2) == [TimelinePoint(4.0, 2, 1, 1, 8), TimelinePoint(7.5, 2, 0, 1, 8)]
    assert [p.time for p in timeline.page(0, 100)] == [0.0, 4.0, 7.5, 10.0]

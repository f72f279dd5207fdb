"""BFTrainer's MILP, its heuristic and the node map, as pure functions and as policies (no NATS)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpuyard.policies.bftrainer import (
    BFTrainer,
    EqualShare,
    Problem,
    best_counts,
    equal_share,
    node_map,
    reference_step,
    solve_milp,
)
from gpuyard.shared.policy import ClusterView, JobView, NodeStatus, SchedulingInput
from gpuyard.shared.throughput import BFTrainerThroughputs
from tests.policies.views import job

NS = np.array([0, 1, 2, 4, 8, 16, 32, 64])
PS = np.array([0, 2831.0, 5259.0, 9988.0, 20379.2, 38895.3, 74125.1, 145081.5])  # shufflenet
CURVE = np.interp(np.arange(65), NS, PS)


def problem(nodes: int, current: list[int], **fields: object) -> Problem:
    jobs = len(current)
    base: dict[str, object] = dict(
        nodes=nodes, jmin=np.ones(jobs, dtype=np.int64), jmax=np.full(jobs, 64),
        current=np.array(current), rates=[CURVE] * jobs, up_s=np.full(jobs, 18.0),
        down_s=np.full(jobs, 12.0),
    )  # fmt: skip
    return Problem(**(base | fields))  # type: ignore[arg-type]


def objective(p: Problem, counts: np.ndarray, tfwd: float) -> float:
    rates = np.array([p.rate(j, int(c)) for j, c in enumerate(counts)])
    return float(tfwd * rates.sum() - p.rescale_cost(counts).sum())


def brute_force(p: Problem, tfwd: float) -> float:
    """The best objective over every allocation of node counts (small problems only)."""
    best = -np.inf
    for counts in itertools.product(*(p.sizes(j) for j in range(p.jobs))):
        if sum(counts) <= p.nodes:
            best = max(best, objective(p, np.array(counts), tfwd))
    return best


@pytest.mark.parametrize(("solver", "table_cells"), [("cp_sat", 0), ("scip", 0), ("cp_sat", 10**6)])
@pytest.mark.parametrize(
    ("nodes", "current", "tfwd", "jmin", "jmax"),
    [
        (12, [3, 0], 10.0, [1, 1], [64, 64]),
        (9, [2, 5, 0], 120.0, [2, 1, 3], [6, 64, 4]),
        (7, [4, 3, 0], 10.0, [1, 4, 2], [8, 8, 8]),
        (14, [0, 0, 0, 6], 30.0, [1, 1, 1, 1], [64, 8, 64, 64]),
    ],
)
def test_the_milp_finds_the_best_allocation_within_every_bound(
    solver: str, table_cells: int, nodes: int, current: list[int], tfwd: float, jmin: list[int],
    jmax: list[int],
) -> None:  # fmt: skip
    p = problem(nodes, current, jmin=np.array(jmin), jmax=np.array(jmax))
    out = solve_milp(p, tfwd=tfwd, time_limit_s=10.0, solver=solver, table_cells=table_cells)  # type: ignore[arg-type]
    assert out.solved
    assert out.counts.sum() <= nodes
    for c, low, high in zip(out.counts, jmin, jmax, strict=True):
        assert c == 0 or low <= c <= high
    assert objective(p, out.counts, tfwd) == pytest.approx(brute_force(p, tfwd), rel=1e-9)


def random_problem(rng: np.random.Generator) -> Problem:
    """Up to five jobs on up to 16 idle nodes: random bounds, holdings, costs and curves (some
    jobs alike, some sizes cut by `max_step`)."""
    jobs = int(rng.integers(1, 6))
    nodes = int(rng.integers(1, 17))
    curves = [np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1000, 16))]) for _ in range(2)]
    pick = rng.integers(0, 2, jobs)
    jmin = rng.integers(1, 4, jobs)
    current = np.minimum(rng.integers(0, 6, jobs), nodes // jobs)
    alike = pick == 0  # jobs on curve 0 share every figure
    return Problem(
        nodes=nodes,
        jmin=np.where(alike, 1, jmin),
        jmax=np.where(alike, 16, jmin + rng.integers(0, 12, jobs)),
        current=np.where(alike, 0, current),
        rates=[curves[k] for k in pick],
        up_s=np.where(alike, 18.0, rng.uniform(0, 40, jobs)),
        down_s=np.where(alike, 12.0, rng.uniform(0, 40, jobs)),
        max_step=int(rng.integers(1, 9)) if rng.random() < 0.3 else None,
        done=rng.uniform(0, 100, jobs),
    )


@pytest.mark.slow
def test_the_dynamic_programme_finds_the_milps_optimum() -> None:
    """On random problems the table gives the brute-force optimum, the solver's objective, and
    alike jobs their nodes least-trained first."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(60):
        p, tfwd = random_problem(rng), float(rng.choice([10.0, 120.0]))
        counts = best_counts(p, tfwd, max_cells=10**6)
        if counts is None:  # (no feasible allocation under max_step: the solver says why)
            continue
        checked += 1
        assert counts.sum() <= p.nodes
        assert all(c in p.sizes(j) for j, c in enumerate(counts))
        best = brute_force(p, tfwd)
        assert objective(p, counts, tfwd) == pytest.approx(best, rel=1e-9, abs=1e-6)
        solved = solve_milp(p, tfwd=tfwd, time_limit_s=10.0, solver="cp_sat")
        assert objective(p, solved.counts, tfwd) == pytest.approx(best, rel=1e-9, abs=1e-6)
        for a, b in p.alike_pairs():
            assert counts[a] >= counts[b]
    assert checked >= 40


def test_a_table_too_large_is_left_to_the_solver() -> None:
    p = problem(40, [3, 0, 5])  # 3 jobs x 41 sizes x 41 nodes: 5,043 cells
    assert best_counts(p, 10.0, max_cells=5_042) is None
    counts = best_counts(p, 10.0, max_cells=5_043)
    assert counts is not None
    assert objective(p, counts, 10.0) == pytest.approx(
        objective(p, solve_milp(p, tfwd=10.0, time_limit_s=10.0).counts, 10.0), rel=1e-12
    )


def test_growth_pays_its_rescale_cost_against_tfwd() -> None:
    """A job on 1 node with 3 more free: growing to 4 gains Tfwd x (9988 - 2831) and costs
    18 s x 2831. Worth it at Tfwd 10 (71,570 > 50,958), not at Tfwd 5."""
    p = problem(4, [1])
    assert solve_milp(p, tfwd=10.0, time_limit_s=10.0).counts.tolist() == [4]
    assert solve_milp(p, tfwd=5.0, time_limit_s=10.0).counts.tolist() == [1]


def test_reference_step_limits_a_change_to_half_the_idle_nodes() -> None:
    """The reference's big-M lets 12 idle nodes move a job by at most 6: from 3 to 9, not 12."""
    p = problem(12, [3])
    assert solve_milp(p, tfwd=10.0, time_limit_s=10.0).counts.tolist() == [12]
    capped = problem(12, [3], max_step=reference_step(12))
    assert solve_milp(capped, tfwd=10.0, time_limit_s=10.0).counts.tolist() == [9]


def test_no_solution_in_time_keeps_the_current_allocation() -> None:
    """A time limit the solver cannot meet: the allocation stays, less a job below its minimum."""
    p = problem(30, [5, 1, 0, 3], jmin=np.array([1, 2, 1, 1]))
    out = solve_milp(p, tfwd=10.0, time_limit_s=1e-9)
    assert not out.solved
    assert out.counts.tolist() == [5, 0, 0, 3]


def test_alike_jobs_get_nodes_least_trained_first() -> None:
    """Ten nodes, three identical new jobs: the objective cannot tell them apart; the one that
    trained least gets at least as many nodes as the others."""
    p = problem(10, [0, 0, 0], done=np.array([500.0, 0.0, 100.0]))
    for table_cells in (0, 10**6):  # the solver, the table
        counts = solve_milp(p, tfwd=10.0, time_limit_s=10.0, table_cells=table_cells).counts
        assert counts.sum() == 10
        assert counts[1] >= counts[2] >= counts[0]


def test_node_map_grows_and_shrinks_without_migration() -> None:
    current = [["n1", "n2", "n3"], ["n4"], []]
    mapping = node_map(current, [1, 3, 2], free=["n5", "n6"])
    assert mapping[0] == ["n1"]  # shrank: a subset of its nodes
    assert mapping[1][:1] == ["n4"] and len(mapping[1]) == 3  # grew: all of its nodes and more
    assert len(mapping[2]) == 2
    every = [n for nodes in mapping for n in nodes]
    assert len(every) == len(set(every))  # a node to one job at most
    with pytest.raises(ValueError, match="more nodes wanted"):
        node_map(current, [3, 1, 3], free=["n5"])


def test_equal_share_clips_to_bounds_and_hands_out_leftovers_in_order() -> None:
    p = problem(10, [0, 0, 0], jmin=np.array([1, 4, 1]), jmax=np.array([2, 64, 64]))
    # share 3: job 0 capped at 2, job 1 below its minimum of 4 gets 0, job 2 gets 3; the 5
    # left go in queue order: job 0 is full, job 1 takes 5 (>= its minimum)
    assert equal_share(p).tolist() == [2, 5, 3]


# -- as scheduling policies -------------------------------------------------------------------


def bft_job(job_id: str, held: list[str] | None = None, steps_done: float = 0.0) -> JobView:
    """A BFTrainer job (1..64 nodes), running on the nodes `held` if given."""
    spec = {"min_gpus": 1, "max_gpus": 64, "job_type": "shufflenet", "total_steps": 1e8,
            "rescale_up_s": 18.0, "rescale_down_s": 12.0}  # fmt: skip
    view = job(job_id, 64, spec=spec, running=held is not None, steps_done=steps_done)
    if held is not None:
        view.record.gpus, view.record.nodes = len(held), list(held)
    return view


def policy_input(jobs: list[JobView], up: list[str], down: list[str] = ()) -> SchedulingInput:  # type: ignore[assignment]
    model = BFTrainerThroughputs({"shufflenet": dict(zip(NS.tolist(), PS.tolist(), strict=True))})
    nodes = [NodeStatus(n, "gpu", 1) for n in up] + [NodeStatus(n, "", 0, False, 0.0) for n in down]
    cluster = ClusterView(capacity={"gpu": len(up)}, nodes=nodes, throughputs=model)
    return SchedulingInput(now=0.0, jobs=[JobView(j.record) for j in jobs], cluster=cluster)


def test_policy_gives_exact_nodes_and_remembers_them_across_a_lost_node() -> None:
    """Two new jobs on 16 idle nodes get 8 each (the curve's best point per node); then n1 is
    taken back, which stopped its job (placement stops a job that loses a node; it is queued
    again): that job keeps its 7 other nodes (growing back would not pay at Tfwd 10), the other
    job keeps its 8, nothing migrates."""
    policy = BFTrainer()
    nodes = [f"n{i}" for i in range(1, 17)]
    first = policy.schedule(policy_input([bft_job("a"), bft_job("b")], nodes))
    held = {a.job_id: a.nodes for a in first}
    assert sorted(n for ns in held.values() for n in ns) == sorted(nodes)
    assert sorted(len(ns) for ns in held.values()) == [8, 8]
    assert all(a.num_gpus == len(a.nodes) for a in first)
    state = policy.snapshot()
    restarted = BFTrainer()  # a scheduler restarted from the stored state decides the same
    restarted.restore(state)
    loser = next(j for j, ns in held.items() if "n1" in ns)
    other = "b" if loser == "a" else "a"
    jobs = [
        bft_job(loser, steps_done=1e6),
        bft_job(other, held=held[other], steps_done=1e6),
    ]
    for p in (policy, restarted):
        second = {a.job_id: a.nodes for a in p.schedule(policy_input(jobs, nodes[1:], ["n1"]))}
        assert set(second[loser]) == set(held[loser]) - {"n1"}  # Tfwd 10: no regrowth
        assert second[other] == held[other]


def test_policy_runs_at_most_max_jobs_in_admission_order() -> None:
    jobs = [bft_job(f"j{i}") for i in range(4)]
    allocations = EqualShare(EqualShare.Params(max_jobs=2)).schedule(
        policy_input(jobs, [f"n{i}" for i in range(8)])
    )
    assert [(a.job_id, a.num_gpus) for a in allocations] == [("j0", 4), ("j1", 4)]


def test_policy_is_deterministic() -> None:
    jobs = [bft_job(f"j{i}", steps_done=float(i % 2)) for i in range(5)]
    nodes = [f"n{i}" for i in range(23)]
    runs = [BFTrainer().schedule(policy_input(jobs, nodes)) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]

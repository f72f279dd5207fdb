"""The openb paper's placement policies (gpuyard.policies.fragmentation) on hand-made clusters
whose right choice is known, the fragmentation measure by hand, determinism, and the paper's
experiment on the real trace (skipped without ../shared/data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuyard.policies.fragmentation import (
    POLICY_NAMES,
    ClusterState,
    Placement,
    Task,
    Trace,
    TypicalPods,
    arrival_order,
    best_fit,
    best_fit_scores,
    dot_product,
    fgd_scores,
    gpu_clustering,
    gpu_packing,
    gpu_packing_scores,
    make_policy,
    node_frag,
    pick_max,
    random_fit,
    read_nodes,
    read_pods,
    run,
    typical_pods,
)


def rng() -> np.random.Generator:
    """A fresh generator: the deterministic policies draw nothing from it."""
    return np.random.default_rng(0)


def cluster(*nodes: tuple[int, int], mem: int = 1 << 20) -> ClusterState:
    """Nodes as (CPU milli, GPUs), all of one model."""
    return ClusterState.from_nodes(
        [c for c, _ in nodes], [mem] * len(nodes), [g for _, g in nodes], ["T4"] * len(nodes)
    )


def typical(*shapes: tuple[Task, float]) -> TypicalPods:
    return TypicalPods(
        cpu=np.array([t.cpu for t, _ in shapes], dtype=np.int64),
        milli=np.array([t.gpu_milli for t, _ in shapes], dtype=np.int64),
        gpus=np.array([t.gpus for t, _ in shapes], dtype=np.int64),
        models=tuple(t.models for t, _ in shapes),
        freq=np.array([f for _, f in shapes], dtype=np.float64),
    )


def test_task_rejects_fractions_of_several_gpus() -> None:
    with pytest.raises(ValueError):
        Task(cpu=1000, gpus=2, gpu_milli=500)
    assert Task(cpu=1000, gpus=1, gpu_milli=500).is_share
    assert not Task(cpu=1000, gpus=1, gpu_milli=1000).is_share


def test_feasibility_checks_cpu_memory_model_and_gpu_milli() -> None:
    state = ClusterState.from_nodes(
        [8000, 8000, 8000], [100, 10, 100], [2, 2, 2], ["T4", "T4", "V100M16"]
    )
    state.allocate(Task(cpu=0, gpus=1, gpu_milli=700), Placement(0, (0,)))
    assert state.feasible(
        Task(cpu=1000, mem=50, gpus=1, gpu_milli=1000, models=("T4",))
    ).tolist() == [
        True,  # GPU 1 still free
        False,  # memory
        False,  # model
    ]
    assert state.feasible(Task(cpu=1000, mem=50, gpus=2, gpu_milli=1000)).tolist() == [
        False,
        False,
        True,
    ]
    assert state.feasible(Task(cpu=9000)).tolist() == [False, False, False]


def test_best_fit_picks_the_node_with_least_left() -> None:
    state = cluster((32000, 4), (16000, 2), (64000, 8))
    task = Task(cpu=4000, gpus=1, gpu_milli=1000)
    assert best_fit(state, task, rng()) == Placement(1, (0,))
    scores = best_fit_scores(state, task)
    assert scores[1] > scores[0] > scores[2]
    # a node that cannot take it scores -1 and is never chosen
    assert best_fit_scores(state, Task(cpu=40000)).tolist()[:2] == [-1, -1]


def test_share_goes_to_the_fullest_gpu_that_fits() -> None:
    state = cluster((64000, 4))
    state.allocate(Task(cpu=0, gpus=1, gpu_milli=300), Placement(0, (1,)))  # 700 left
    state.allocate(Task(cpu=0, gpus=1, gpu_milli=800), Placement(0, (2,)))  # 200 left
    assert best_fit(state, Task(cpu=1000, gpus=1, gpu_milli=500), rng()) == Placement(0, (1,))
    assert best_fit(state, Task(cpu=1000, gpus=1, gpu_milli=100), rng()) == Placement(0, (2,))
    # whole GPUs: the first fully free ones
    assert best_fit(state, Task(cpu=1000, gpus=3, gpu_milli=1000), rng()) is None
    assert best_fit(state, Task(cpu=1000, gpus=2, gpu_milli=1000), rng()) == Placement(0, (0, 3))
    assert best_fit(state, Task(cpu=1000, gpus=1, gpu_milli=1000), rng()) == Placement(0, (0,))


def test_gpu_packing_prefers_a_partly_used_gpu() -> None:
    state = cluster((64000, 8), (64000, 8), (64000, 2))
    state.allocate(Task(cpu=1000, gpus=1, gpu_milli=500), Placement(1, (3,)))
    share = Task(cpu=1000, gpus=1, gpu_milli=400)
    scores = gpu_packing_scores(state, share)
    # partly used GPU (>= 50) beats a used node's free GPU (33..49) beats idle nodes (< 33),
    # and a smaller idle node beats a bigger one
    assert scores[1] >= 50 and scores[2] < 33 and scores[0] < scores[2]
    assert gpu_packing(state, share, rng()) == Placement(1, (3,))
    # a whole GPU: partly used node's free GPU first
    assert gpu_packing(state, Task(cpu=1000, gpus=1, gpu_milli=1000), rng()) == Placement(1, (0,))
    # CPU-only pods: every node scores the same, the tie order decides
    assert set(gpu_packing_scores(state, Task(cpu=1000)).tolist()) == {0}


def test_gpu_clustering_keeps_one_kind_of_pod_together() -> None:
    state = cluster((64000, 8), (64000, 8), (64000, 8))
    state.allocate(Task(cpu=0, gpus=1, gpu_milli=1000), Placement(0, (0,)))  # a 1-GPU pod
    state.allocate(Task(cpu=0, gpus=1, gpu_milli=300), Placement(1, (0,)))  # a share pod
    share = Task(cpu=1000, gpus=1, gpu_milli=300)
    assert gpu_clustering(state, share, rng()).node == 1  # type: ignore[union-attr]
    assert gpu_clustering(state, Task(cpu=1000, gpus=1, gpu_milli=1000), rng()).node == 0  # type: ignore[union-attr]
    # a 2-GPU pod: no node hosts its kind, an idle node beats nodes of other kinds
    assert gpu_clustering(state, Task(cpu=1000, gpus=2, gpu_milli=1000), rng()).node == 2  # type: ignore[union-attr]


def test_dot_product_prefers_the_smaller_product() -> None:
    state = cluster((96000, 8), (16000, 1))
    assert dot_product(state, Task(cpu=8000, gpus=1, gpu_milli=1000), rng()) == Placement(1, (0,))


def test_random_fit_only_picks_nodes_that_fit_and_repeats_with_its_seed() -> None:
    state = cluster((1000, 1), (64000, 8), (64000, 8), (64000, 8))
    task = Task(cpu=8000, gpus=1, gpu_milli=250)
    picks = [random_fit(state, task, np.random.default_rng(s)) for s in range(30)]
    assert all(p is not None and p.node != 0 for p in picks)
    assert len({p.node for p in picks if p}) > 1 and len({p.gpus for p in picks if p}) > 1
    again = [random_fit(state, task, np.random.default_rng(s)) for s in range(30)]
    assert picks == again


def test_ties_go_to_the_lowest_tie_rank() -> None:
    scores = np.array([5, 9, 9, -1, 9], dtype=np.int64)
    assert pick_max(scores, np.arange(5, dtype=np.int64)) == 1
    assert pick_max(scores, np.array([0, 4, 3, 0, 1], dtype=np.int64)) == 4
    assert pick_max(np.full(3, -1, dtype=np.int64), np.arange(3, dtype=np.int64)) is None


def test_node_frag_by_hand() -> None:
    # one node, 2 GPUs with 600 and 200 milli left, 10 CPUs left
    state = cluster((10000, 2))
    state.gpu_left[0] = [600, 200]
    typ = typical(
        (Task(cpu=4000, gpus=1, gpu_milli=500), 0.5),  # fits on GPU 0: GPU 1 (200) is fragment
        (Task(cpu=4000, gpus=1, gpu_milli=1000), 0.25),  # no whole GPU: all 800 is fragment
        (Task(cpu=2000), 0.25),  # a CPU pod can use no GPU: all 800
    )
    frag = node_frag(state.cpu_left, state.gpu_left, state.model, typ, typ.access(state))
    assert frag[0] == pytest.approx(0.5 * 200 + 0.25 * 800 + 0.25 * 800)
    # too little CPU left for the 0.5 shape: all of it fragment
    state.cpu_left[0] = 3000
    frag = node_frag(state.cpu_left, state.gpu_left, state.model, typ, typ.access(state))
    assert frag[0] == pytest.approx(800)


def test_fgd_avoids_stranding_gpus_a_typical_pod_needs() -> None:
    # typical pods take one whole GPU and 8 CPUs. A CPU-only task on node 0 would leave it
    # 4 CPUs: its GPU is then stranded. Node 1 has no GPU to strand; best-fit still prefers
    # node 0 (less left), FGD node 1.
    state = ClusterState.from_nodes([12000, 64000], [1 << 20] * 2, [1, 0], ["T4", ""])
    typ = typical((Task(cpu=8000, gpus=1, gpu_milli=1000), 1.0))
    task = Task(cpu=8000)
    assert best_fit(state, task, rng()) == Placement(0)
    fgd = make_policy("fgd", typ)
    assert fgd(state, task, rng()) == Placement(1)
    scores, _ = fgd_scores(state, task, typ, np.arange(2, dtype=np.int64))
    assert scores.tolist() == [26, 50]  # sigmoid(-1000/1000) x 100 and sigmoid(0) x 100


def test_fgd_picks_the_gpu_that_keeps_room_for_typical_pods() -> None:
    # GPUs with 600 and 1000 left; typical pods ask 500 milli. A 400 share on GPU 1 keeps
    # both usable (600, 600); best-fit's GPU 0 leaves 200 that no typical pod can use.
    state = cluster((64000, 2))
    state.gpu_left[0] = [600, 1000]
    typ = typical((Task(cpu=1000, gpus=1, gpu_milli=500), 1.0))
    share = Task(cpu=1000, gpus=1, gpu_milli=400)
    assert best_fit(state, share, rng()) == Placement(0, (0,))
    assert make_policy("fgd", typ)(state, share, rng()) == Placement(0, (1,))


def test_fgd_cache_matches_fresh_scores() -> None:
    rng = np.random.default_rng(3)
    state = cluster(*[(64000, 8)] * 5, *[(32000, 2)] * 5)
    tasks = [Task(cpu=4000, gpus=1, gpu_milli=int(m)) for m in (250, 500, 1000)] + [Task(cpu=6000)]
    typ = typical_pods(tasks)
    fgd = make_policy("fgd", typ)
    for _ in range(40):
        task = tasks[int(rng.integers(len(tasks)))]
        placement = fgd(state, task, rng)
        assert placement is not None
        cached = fgd.scores(state, task)[0]  # type: ignore[attr-defined]
        fresh = np.full(state.n, -1, dtype=np.int64)
        nodes = np.flatnonzero(state.feasible(task))
        fresh[nodes] = fgd_scores(state, task, typ, nodes)[0]
        assert cached.tolist() == fresh.tolist()
        state.allocate(task, placement)


def test_typical_pods_cover_the_threshold_and_renormalise() -> None:
    a, b, c = (
        Task(cpu=1000),
        Task(cpu=2000, gpus=1, gpu_milli=500),
        Task(cpu=3000, gpus=1, gpu_milli=1000),
    )
    typ = typical_pods([a] * 6 + [b] * 3 + [c] * 1, threshold=85)
    assert typ.cpu.tolist() == [1000, 2000]
    assert typ.freq.tolist() == pytest.approx([6 / 9, 3 / 9])
    everything = typical_pods([a] * 6 + [b] * 3 + [c] * 1, threshold=100)
    assert everything.freq.sum() == pytest.approx(1.0) and len(everything) == 3


def synthetic_trace(n: int, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    shapes = [
        Task(cpu=4000, mem=8000, gpus=1, gpu_milli=250),
        Task(cpu=8000, mem=16000, gpus=1, gpu_milli=500),
        Task(cpu=12000, mem=32000, gpus=1, gpu_milli=1000),
        Task(cpu=24000, mem=64000, gpus=2, gpu_milli=1000),
        Task(cpu=8000, mem=16000),
    ]
    picks = rng.integers(len(shapes), size=n)
    return Trace(tuple(f"pod-{i:04d}" for i in range(n)), tuple(shapes[int(k)] for k in picks))


def test_arrival_order_tunes_gpu_requests_to_the_ratio() -> None:
    trace = synthetic_trace(200, 1)
    capacity = 20 * 8 * 1000
    up = arrival_order(trace, capacity, seed=5, tune_ratio=1.3)
    assert sorted(up[:200].tolist()) == list(range(200))  # all pods, shuffled, first
    total = sum(trace.tasks[i].total_milli for i in up)
    assert total <= 1.3 * capacity
    down = arrival_order(trace, 10_000, seed=5, tune_ratio=1.0)
    assert sum(trace.tasks[i].total_milli for i in down) <= 10_000 and len(
        set(down.tolist())
    ) == len(down)
    assert arrival_order(trace, capacity, seed=5).tolist() == up.tolist()


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_same_seed_same_run(policy: str) -> None:
    trace = synthetic_trace(300, 2)
    nodes = cluster(*[(64000, 8)] * 10, *[(32000, 2)] * 10)
    first = run(policy, trace, nodes, seed=7)
    second = run(policy, trace, nodes, seed=7)
    assert first.used_milli.tobytes() == second.used_milli.tobytes()
    assert first.frag_ratio.tobytes() == second.frag_ratio.tobytes()
    assert first.failed == second.failed
    assert int(nodes.gpu_left.sum()) == nodes.total_gpu_milli()  # runs work on a copy


@pytest.mark.slow
def test_real_openb_default_trace(shared_data: Path) -> None:
    openb = shared_data / "alibaba-openb"
    if not (openb / "openb_pod_list_default.csv").exists():
        pytest.skip("openb pod list absent")
    trace = read_pods(openb / "openb_pod_list_default.csv")
    nodes = read_nodes(openb / "openb_node_list_gpu_node.csv")
    assert len(trace) == 8152 and nodes.n == 1213 and nodes.total_gpu_milli() == 6_212_000
    typ = typical_pods(trace.tasks)
    levels = list(range(10, 131, 10))
    final = {}
    for policy in ("random", "fgd"):
        result = run(policy, trace, nodes, seed=42, typical=typ)
        assert np.all(np.diff(result.used_milli) >= 0) and np.all(
            np.diff(result.arrived_milli) >= 0
        )
        alloc = result.allocation(levels)
        assert list(alloc) == levels
        values = [alloc[lv] / 100 for lv in levels]
        assert all(0.0 <= v <= 1.0 for v in values)
        assert values == sorted(values)
        assert result.arrived_milli[-1] <= 1.3 * nodes.total_gpu_milli()
        assert result.arrived_milli[-1] >= 1.29 * nodes.total_gpu_milli()
        frag = result.fragmentation([50, 130])
        assert all(0.0 <= f <= 100.0 for f in frag.values())
        final[policy] = result.final_allocation
    assert final["fgd"] >= final["random"]

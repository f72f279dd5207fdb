"""Pure tests of the built-in placement policies (no services), including a property test."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.policies.placement import (
    Consolidated,
    FirstFit,
    MostFree,
    RandomParams,
    RandomPlacement,
    Scattered,
    Sticky,
)
from gpuyard.shared.model import ANY_GPU, Allocation, GpuRef
from gpuyard.shared.policy import NodeView, PlacementInput, placement_policies

NAMES = ["consolidated", "first-fit", "most-free", "scattered", "random", "sticky"]


def nodes(*free: list[int], gpu_type: str = "gpu", prefix: str = "n") -> list[NodeView]:
    return [
        NodeView(node_id=f"{prefix}{i}", gpu_type=gpu_type, usable=u) for i, u in enumerate(free)
    ]


def place(policy, allocs, node_list, current=None, now=0.0):
    return policy.place(
        PlacementInput(now=now, allocations=allocs, current=current or {}, nodes=node_list)
    )


def per_node(gpus: list[GpuRef]) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in gpus:
        out[g.node_id] = out.get(g.node_id, 0) + 1
    return out


def test_consolidated_prefers_single_node_on_partly_free_nodes():
    ns = nodes([0, 1], [0, 1, 2, 3], [1, 2, 3])
    out = place(Consolidated(), [Allocation("a", 3)], ns)
    assert per_node(out["a"]) == {"n1": 3}
    out = place(Consolidated(), [Allocation("a", 6)], ns)  # spans emptiest nodes first
    assert per_node(out["a"]) == {"n1": 4, "n2": 2}


@pytest.mark.parametrize("name", NAMES)
def test_a_node_listing_gpus_out_of_order_or_twice_hands_each_out_once(name):
    """A node's usable GPUs, in any order and repeated, are its GPUs in increasing order, once
    each (`NodeView`); no policy places a job on a GPU twice."""
    ns = [NodeView(node_id="n0", gpu_type="gpu", usable=[3, 1, 3, 0, 1])]
    assert ns[0].usable == [0, 1, 3]
    policy = placement_policies.create(name, {"seed": 1} if name == "random" else {})
    out = place(policy, [Allocation("a", 2), Allocation("b", 1)], ns)
    gpus = [g for placed in out.values() for g in placed]
    assert sorted(gpus) == [GpuRef("n0", 0), GpuRef("n0", 1), GpuRef("n0", 3)]


def test_most_free_takes_the_emptiest_nodes_first_in_the_order_given():
    ns = nodes([0, 1], [0, 1, 2, 3], [1, 2, 3], [0, 1, 2, 3])
    # Unlike consolidated, a job that fits on the first partly free node still goes to the
    # emptiest (Pollux's simulator); ties go to the earlier node.
    out = place(MostFree(), [Allocation("a", 2), Allocation("b", 5), Allocation("c", 2)], ns)
    assert per_node(out["a"]) == {"n1": 2}
    assert per_node(out["b"]) == {"n3": 4, "n2": 1}
    assert per_node(out["c"]) == {"n0": 2}  # (every node has 2 left: the first)


def test_first_fit_node_order_lowest_indices():
    ns = nodes([2, 3], [0, 1, 2, 3])
    out = place(FirstFit(), [Allocation("a", 3), Allocation("b", 2)], ns)
    assert out["a"] == [GpuRef("n0", 2), GpuRef("n0", 3), GpuRef("n1", 0)]
    assert out["b"] == [GpuRef("n1", 1), GpuRef("n1", 2)]


def test_scattered_spreads_round_robin():
    ns = nodes([0, 1, 2, 3], [0, 1, 2, 3], [0, 1])
    out = place(Scattered(), [Allocation("a", 3)], ns)
    assert per_node(out["a"]) == {"n0": 1, "n1": 1, "n2": 1}
    out = place(Scattered(), [Allocation("a", 8)], ns)
    assert per_node(out["a"]) == {"n0": 3, "n1": 3, "n2": 2}


def test_random_is_seeded_and_depends_on_now():
    ns = nodes(*[list(range(8)) for _ in range(8)])
    allocs = [Allocation("a", 4), Allocation("b", 4)]
    pol = RandomPlacement(RandomParams(seed=7))
    first = place(pol, allocs, ns, now=10.0)
    assert place(RandomPlacement(RandomParams(seed=7)), allocs, ns, now=10.0) == first
    others = [place(pol, allocs, ns, now=t) for t in (11.0, 12.0, 13.0)]
    others.append(place(RandomPlacement(RandomParams(seed=8)), allocs, ns, now=10.0))
    assert any(o != first for o in others)


def test_all_keep_running_jobs_in_place():
    ns = nodes([0, 1, 2, 3], [0, 1, 2, 3])
    cur = {"r": [GpuRef("n1", 2), GpuRef("n1", 3)]}
    for name in NAMES:
        out = place(
            placement_policies.create(name), [Allocation("r", 2), Allocation("n", 6)], ns, cur
        )
        assert out["r"] == cur["r"], name
        assert len(out["n"]) == 6


def test_sticky_resizes_with_fewest_moves():
    ns = nodes([0, 1, 2, 3], [0, 1, 2, 3])
    cur = {"e": [GpuRef("n0", 0), GpuRef("n1", 0), GpuRef("n1", 1)]}
    shrink = place(Sticky(), [Allocation("e", 2)], ns, cur)["e"]
    assert shrink == [GpuRef("n1", 0), GpuRef("n1", 1)]  # keeps the node where it has most
    grow = place(Sticky(), [Allocation("e", 5)], ns, cur)["e"]
    assert set(cur["e"]) <= set(grow) and len(grow) == 5
    # a new job placed after does not steal the resized job's GPUs
    out = place(Sticky(), [Allocation("new", 4), Allocation("e", 4)], ns, cur)
    assert set(cur["e"]) <= set(out["e"])
    assert not set(out["e"]) & set(out["new"])


def test_type_constraints_and_running_job_type_change():
    ns = nodes([0, 1], gpu_type="k80", prefix="k") + nodes(
        list(range(6)), gpu_type="v100", prefix="v"
    )
    for name in NAMES:
        pol = placement_policies.create(name)
        out = place(pol, [Allocation("a", 2, "v100"), Allocation("b", 3), Allocation("c", 3)], ns)
        assert {g.node_id[0] for g in out["a"]} == {"v"}, name
        assert "b" in out and {g.node_id[0] for g in out["b"]} == {"v"}, name  # only v100 fits 3
        assert "c" not in out, name
        cur = {"m": [GpuRef("k0", 0)]}
        moved = place(pol, [Allocation("m", 1, "v100")], ns, cur)
        assert moved["m"][0].node_id.startswith("v"), name


# --------------------------------------------------------------------------- property test


@st.composite
def scenarios(draw):
    types = ["a", "b"]
    n_nodes = draw(st.integers(1, 6))
    node_list = []
    for i in range(n_nodes):
        size = draw(st.integers(1, 8))
        usable = draw(st.lists(st.integers(0, size - 1), unique=True, max_size=size))
        node_list.append(
            NodeView(node_id=f"n{i}", gpu_type=draw(st.sampled_from(types)), usable=usable)
        )
    all_gpus = [GpuRef(f"n{i}", j) for i in range(n_nodes) for j in range(8)]
    n_jobs = draw(st.integers(0, 8))
    allocs = [
        Allocation(
            f"j{k}", draw(st.integers(1, 8)), draw(st.sampled_from([ANY_GPU, "a", "b", "c"]))
        )
        for k in range(n_jobs)
    ]
    current = {}
    for a in allocs:
        if draw(st.booleans()):
            current[a.job_id] = draw(st.lists(st.sampled_from(all_gpus), min_size=1, max_size=8))
    return node_list, allocs, current, draw(st.floats(0, 1e6))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_placements_are_always_valid(name, scenario):
    node_list, allocs, current, now = scenario
    out = place(placement_policies.create(name), allocs, node_list, current, now)
    usable = {(n.node_id, i) for n in node_list for i in n.usable}
    node_type = {n.node_id: n.gpu_type for n in node_list}
    wanted = {a.job_id: a for a in allocs}
    seen: set[GpuRef] = set()
    for job_id, gpus in out.items():
        a = wanted[job_id]
        assert len(gpus) == a.num_gpus
        assert len(set(gpus)) == len(gpus)
        assert all((g.node_id, g.index) in usable for g in gpus)
        assert len({node_type[g.node_id] for g in gpus}) == 1
        if a.gpu_type != ANY_GPU:
            assert node_type[gpus[0].node_id] == a.gpu_type
        assert not seen & set(gpus)
        seen |= set(gpus)
    # Complete: a job left out does not fit in the GPUs still free at the end (free GPUs only
    # shrink as the walk goes on, so it did not fit at its turn either).
    free_by_type: dict[str, int] = {}
    for n in node_list:
        free_by_type[n.gpu_type] = free_by_type.get(n.gpu_type, 0) + sum(
            1 for i in n.usable if GpuRef(n.node_id, i) not in seen
        )
    for a in allocs:
        if a.job_id not in out:
            ok = [t for t, c in free_by_type.items() if a.gpu_type in (ANY_GPU, t)]
            assert all(free_by_type[t] < a.num_gpus for t in ok), f"{a} fits in {free_by_type}"

"""Placements that keep their free map (and the openb placements their `ClusterState`) from one
decision to the next decide exactly as if they built it afresh each time: over a run where jobs
start and end, nodes fill up, leave the views and come back, and new nodes join; told which
nodes changed (`PlacementInput.changed_nodes`, as the placement service tells) or not."""

from __future__ import annotations

import random

import msgspec
import pytest

from gpuyard.policies.placement.strategies import FreeMap, StandingMap
from gpuyard.shared.model import Allocation, GpuRef, JobSpec
from gpuyard.shared.policy import NodeView, PlacementInput
from gpuyard.shared.policy.registry import placement_policies

TYPES = ("A100", "T4")


class Cluster:
    """What the placement service tracks, in miniature: each node's free GPUs, shares, CPUs and
    memory left; views made again only for the nodes that changed (the others: the same
    objects), a node with nothing free left out, nodes in the order they joined."""

    def __init__(self, rng: random.Random, nodes: int) -> None:
        self.rng = rng
        self.spec: dict[str, tuple[str, int, int, int]] = {}
        self.free: dict[str, set[int]] = {}
        self.shares: dict[str, dict[int, int]] = {}
        self.cpu: dict[str, int] = {}
        self.memory: dict[str, int] = {}
        self.views: dict[str, NodeView] = {}
        self.running: dict[str, tuple[JobSpec, list[GpuRef]]] = {}
        self.full = 0  # times a node filled up (and left the views)
        self.listed: set[str] = set()
        self.changed: set[str] = set()  # nodes whose views were made again since `hint`
        for _ in range(nodes):
            self.join()

    def join(self) -> None:
        node = f"n{len(self.spec):03d}"
        gpus = self.rng.choice([2, 4, 8])
        cpu, memory = self.rng.choice([16_000, 64_000]), self.rng.choice([65_536, 0])
        self.spec[node] = (TYPES[len(self.spec) % 2], gpus, cpu, memory)
        self.free[node], self.shares[node] = set(range(gpus)), {}
        self.cpu[node], self.memory[node] = cpu, memory
        self.views.pop(node, None)
        self.changed.add(node)

    def nodes(self) -> list[NodeView]:
        found = []
        for node, (gpu_type, gpus, _cpu, memory) in self.spec.items():
            if not self.free[node] and not self.shares[node]:
                self.full += node in self.listed
                self.listed.discard(node)
                self.views.pop(node, None)
                continue
            if node not in self.views:
                self.views[node] = NodeView(
                    node_id=node, gpu_type=gpu_type, usable=sorted(self.free[node]),
                    shares={i: 1000 - held for i, held in self.shares[node].items()},
                    cpu_milli=self.cpu[node], memory_mib=self.memory[node] if memory else None,
                    num_gpus=gpus,
                )  # fmt: skip
            found.append(self.views[node])
            self.listed.add(node)
        return found

    def hint(self, told: bool) -> list[str] | None:
        """The nodes whose views changed since the last hint, in node order (None: not told)."""
        changed, self.changed = self.changed, set()
        return sorted(changed) if told else None

    def charge(self, spec: JobSpec, gpus: list[GpuRef], sign: int) -> None:
        for g in gpus:
            n = g.node_id
            self.views.pop(n, None)
            self.changed.add(n)
            if spec.gpu_milli is None:
                (self.free[n].discard if sign > 0 else self.free[n].add)(g.index)
            else:
                held = self.shares[n].get(g.index, 0) + sign * spec.gpu_milli
                self.free[n].discard(g.index)
                if held:
                    self.shares[n][g.index] = held
                else:
                    del self.shares[n][g.index]
                    self.free[n].add(g.index)
            per_gpu = 1 / len(gpus)
            self.cpu[n] -= sign * int(spec.cpu_milli * per_gpu)
            if self.spec[n][3]:
                self.memory[n] -= sign * int(spec.memory_mib * per_gpu)

    def end_some(self) -> None:
        for job_id in sorted(self.running):
            if self.rng.random() < 0.15:
                spec, gpus = self.running.pop(job_id)
                self.charge(spec, gpus, -1)


def arrivals(rng: random.Random, step: int) -> list[JobSpec]:
    jobs = []
    for k in range(rng.randint(0, 5)):
        kind = rng.randrange(4)
        if rng.random() < 0.5:  # whole GPUs alone: placed on the kept map itself
            jobs.append(JobSpec(job_id=f"j{step}-{k}", num_gpus=[1, 2, 4, 8][kind]))
            continue
        jobs.append(JobSpec(
            job_id=f"j{step}-{k}", num_gpus=[1, 1, 2, 8][kind],
            gpu_milli=rng.choice([250, 500]) if kind == 0 else None,
            cpu_milli=rng.choice([1000, 4000]) * [1, 1, 2, 8][kind],
            memory_mib=rng.choice([1024, 8192]),
            gpu_types=[rng.choice(TYPES)] if rng.random() < 0.3 else [],
        ))  # fmt: skip
    return jobs


def same_map(kept: FreeMap, fresh: FreeMap) -> None:
    present = [n for n in kept.order if n in fresh.free]
    assert present == fresh.order
    for n in kept.order:
        if n in fresh.free:
            assert (kept.free[n], kept.gpu_type[n]) == (fresh.free[n], fresh.gpu_type[n])
            assert kept.shares.get(n) == fresh.shares.get(n)
            assert (kept.cpu.get(n), kept.memory.get(n)) == (fresh.cpu.get(n), fresh.memory.get(n))
        else:  # (a node that left the views: nothing to take)
            assert kept.free[n] == [] and n not in kept.shares


@pytest.mark.parametrize("told", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_a_kept_map_is_the_map_of_the_views(seed: int, told: bool) -> None:
    rng = random.Random(seed)
    cluster = Cluster(rng, 12)
    standing = StandingMap()
    for step in range(60):
        cluster.end_some()
        if step % 20 == 19:
            cluster.join()
        nodes = cluster.nodes()
        before = dict(standing.views)
        kept, changed = standing.working(nodes, cluster.hint(told))
        same_map(kept, FreeMap(nodes))
        assert {v.node_id for v in nodes if before.get(v.node_id) is not v} <= set(changed)
        free = FreeMap(nodes)
        for spec in arrivals(rng, step):  # take from the kept map: the next one must not see it
            gpus = [GpuRef(n, i) for n in free.order for i in free.free[n]][: spec.num_gpus]
            if len(gpus) == spec.num_gpus and spec.gpu_milli is None:
                assert kept.take(gpus) and free.take(gpus)
                cluster.running[spec.job_id or ""] = (spec, gpus)
                cluster.charge(spec, gpus, +1)
    assert standing.rank  # (the map was kept, not made afresh)


PLACEMENTS = ["consolidated", "first-fit", "scattered", "sticky", "random", "random-fit",
              "best-fit", "dot-product", "gpu-packing", "gpu-clustering", "fgd"]  # fmt: skip


@pytest.mark.parametrize("told", [False, True])
@pytest.mark.parametrize("name", PLACEMENTS)
@pytest.mark.parametrize("seed", range(3))
def test_a_policy_decides_as_it_would_afresh(name: str, seed: int, told: bool) -> None:
    """The same policy across a run and a new one at each decision (given the kept one's state)
    place every decision alike; some decisions place jobs, some leave jobs waiting, some
    placements are not carried out (a launch that failed)."""
    rng = random.Random(seed)
    cluster = Cluster(rng, 8)
    kept = placement_policies.create(name, {})
    waiting: list[JobSpec] = []
    placed_any = waited = 0
    for step in range(80):
        cluster.end_some()
        if step == 40:
            cluster.join()
        waiting += arrivals(rng, step)
        specs = {s.job_id or "": s for s in waiting}
        allocations = [Allocation(s.job_id or "", s.num_gpus) for s in waiting]
        inp = PlacementInput(
            now=float(step), allocations=allocations, current={}, nodes=cluster.nodes(),
            specs=specs,
        )  # fmt: skip
        fresh = placement_policies.create(name, {})
        state = kept.snapshot()
        if state is not None:
            fresh.restore(state)
        placed = kept.place(msgspec.structs.replace(inp, changed_nodes=cluster.hint(told)))
        assert placed == fresh.place(inp), f"decision {step}"
        for job_id, gpus in list(placed.items()):
            if rng.random() < 0.25:  # (its launch failed: it waits, the nodes stay as they were)
                del placed[job_id]
                continue
            spec = specs[job_id]
            cluster.running[job_id] = (spec, gpus)
            cluster.charge(spec, gpus, +1)
            placed_any += 1
        waiting = [s for s in waiting if s.job_id not in placed]
        waited += bool(waiting)
    assert placed_any > 50 and waited > 5 and cluster.full > 5

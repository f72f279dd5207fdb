"""The openb paper's six placements as gpuyard placement policies.

Each decision turns the nodes the policy may use (`NodeView`: free GPUs, the thousandths left on
shared ones, CPUs and memory left, the jobs each node runs) into a `ClusterState` and places the
allocations in order with the library's policy, updating the state after each. A job's `Task`:
its allocation's GPUs (or its share of one), its CPUs and memory, the GPU types its spec and its
allocation allow. Equal scores go to the node first in node order (the artifact's seeded random
node order is the experiment's, not a cluster's); random-fit draws from a generator seeded by
`seed` and the decision's time.

A job the paper's model cannot hold on one node (more GPUs than any node of the types it may use
has) spans nodes as `consolidated` places it; any other job waits until a node fits it, as the paper's pods do. FGD's target workload (its "typical pods") is learnt from the
jobs the policy has started (a restarted job counts again) and those it is asked to place now;
the counts are its state, kept by the service.
"""

from __future__ import annotations

import random
from typing import Annotated

import msgspec
import numpy as np
from msgspec import Meta, Struct

from gpuyard.policies.placement.strategies import (
    Ask,
    FreeMap,
    KeepsMap,
    consolidate,
    keep_running,
    pick_asked,
    pick_hinted,
)
from gpuyard.shared.model import ANY_GPU, Allocation, GpuRef, JobSpec
from gpuyard.shared.policy import NodeView, PlacementInput

from .cluster import MAX_SPEC_CPU, MILLI, ClusterState, Placement, Task
from .fgd import POPULARITY_THRESHOLD, Fgd, Shape, typical_of_counts
from .scores import best_fit, dot_product, gpu_clustering, gpu_packing, random_fit


class RandomFitParams(Struct, forbid_unknown_fields=True):
    seed: int = 0
    """Seed of the draws (each decision: a generator seeded by (seed, now))."""


class FgdParams(Struct, forbid_unknown_fields=True):
    popularity: float = POPULARITY_THRESHOLD
    """The share (%) of the jobs seen that the target workload's most frequent shapes cover."""
    relearn: Annotated[float, Meta(ge=0)] = 5.0
    """Learn the target workload again when the jobs seen have grown by this many % since it
    was last learnt (0: at every decision). Between, nodes that did not change keep their
    scores."""


class ShapeCounts(Struct, forbid_unknown_fields=True):
    """FGD's state: how many jobs of each shape it has started, and the counts its target
    workload was learnt from ("cpu,milli,gpus,types")."""

    started: dict[str, int] = {}
    learnt: dict[str, int] = {}


def task_of(alloc: Allocation, spec: JobSpec | None) -> Task:
    """The paper's request for `alloc`: a share of one GPU or its whole GPUs, the job's CPUs and
    memory, and the GPU types the job allows: its own, as a pod names the GPU models it may use,
    not the one the scheduler's count of free GPUs gave the allocation (placement reports the
    type it ran on). Without a spec, the allocation's type."""
    if spec is None:
        types: tuple[str, ...] = () if alloc.gpu_type == ANY_GPU else (alloc.gpu_type,)
    elif spec.gpu_type != ANY_GPU:
        types = (spec.gpu_type,)
    else:
        types = tuple(sorted(spec.gpu_types))
    share = spec.gpu_milli if spec is not None else None
    return Task(
        cpu=spec.cpu_milli if spec is not None else 0,
        mem=spec.memory_mib if spec is not None else 0,
        gpus=alloc.num_gpus,
        gpu_milli=share if share is not None else MILLI,
        models=types,
    )


_UNCOUNTED_CPU = MAX_SPEC_CPU
"""CPUs left on a node that does not count them: the scores' largest node (128 CPUs), so that
they score as they would on an idle such node."""
_UNCOUNTED_MEMORY = np.iinfo(np.int64).max // 4
"""Memory left on a node that does not count it (memory is only checked, never scored)."""


class Mirror:
    """The free map of a policy's decisions (`StandingMap`) as the paper's `ClusterState`, row by
    row in node order, kept from one decision to the next: each decision takes again the rows of
    the nodes whose views changed and of those the last decision placed on, and the rows of the
    jobs it places as it places them. A GPU neither free nor shared is full (0 left)."""

    def __init__(self, free: FreeMap, views: dict[str, NodeView]) -> None:
        self.free = free
        self.rows = free.order
        self.row_of = {n: i for i, n in enumerate(self.rows)}
        self.width = max(
            [1] + [max(views[n].num_gpus, *free.free[n], *free.shares.get(n, {}), -1) + 1
                   for n in self.rows]
        )  # fmt: skip
        models = tuple(sorted(set(free.gpu_type.values())))
        index = {m: i for i, m in enumerate(models)}
        size = len(self.rows)
        self.state = ClusterState(
            cpu_cap=np.zeros(size, dtype=np.int64),
            cpu_left=np.zeros(size, dtype=np.int64),
            mem_left=np.zeros(size, dtype=np.int64),
            gpu_left=np.zeros((size, self.width), dtype=np.int64),
            gpu_count=np.zeros(size, dtype=np.int64),
            model=np.array([index[free.gpu_type[n]] for n in self.rows], dtype=np.int64),
            models=models,
        )
        self.sizes: dict[str, dict[int, int]] = {}
        """Nodes in the views by type and GPUs: a job asking for more GPUs than any has spans
        nodes (as a fresh look at the views would decide)."""
        self.listed: dict[str, tuple[str, int]] = {}
        self.placed_on: set[str] = set()
        """Nodes this decision placed on: taken again from the views at the next."""
        for n in self.rows:
            self.sync(n, views[n])
        self.state.cpu_cap = self.state.cpu_left.copy()

    def fits(self, free: FreeMap, views: dict[str, NodeView], changed: list[str]) -> bool:
        """Whether the rows can take the nodes that changed (no GPU beyond the width)."""
        return free.order is self.rows and all(
            max(views[n].num_gpus, *free.free[n], *free.shares.get(n, {}), -1) < self.width
            for n in changed
        )

    def refresh(self, free: FreeMap, views: dict[str, NodeView], changed: list[str]) -> None:
        """Take up a decision's map: again the rows of `changed` and of the last placements."""
        self.free = free
        for n in sorted(self.placed_on.union(changed), key=self.row_of.__getitem__):
            self.sync(n, views[n])
        self.placed_on = set()

    def holds_whole(self, task: Task) -> bool:
        """Whether some node in the views, of a type `task` allows, has as many GPUs as it asks
        for."""
        return any(
            gpus >= task.gpus
            for t, sizes in self.sizes.items()
            if not task.models or t in task.models
            for gpus, count in sizes.items()
            if count
        )

    def _list(self, node: str, view: NodeView) -> None:
        """Count `node` among the nodes in the views if it is there (`usable` or shares)."""
        was = self.listed.pop(node, None)
        if was is not None:
            self.sizes[was[0]][was[1]] -= 1
        if view.usable or view.shares:
            size = view.num_gpus or max(*view.usable, *view.shares, -1) + 1
            sizes = self.sizes.setdefault(view.gpu_type, {})
            sizes[size] = sizes.get(size, 0) + 1
            self.listed[node] = (view.gpu_type, size)

    def sync(self, node: str, view: NodeView | None = None) -> None:
        """Take `node`'s row again from the map (and, given its view, its GPUs and jobs)."""
        row, st, free = self.row_of[node], self.state, self.free
        st.gpu_left[row] = 0
        st.gpu_left[row, free.free[node]] = MILLI
        for index, left in free.shares.get(node, {}).items():
            st.gpu_left[row, index] = left
        count = max(view.num_gpus if view is not None else 0, int(st.gpu_count[row]),
                    int(np.count_nonzero(st.gpu_left[row])))  # fmt: skip
        st.gpu_count[row] = count
        st.cpu_left[row] = free.cpu.get(node, _UNCOUNTED_CPU)
        st.mem_left[row] = free.memory.get(node, _UNCOUNTED_MEMORY)
        if view is not None:
            self._list(node, view)
            st.affinity[row] = 0
            for kind, jobs in view.holding.items():
                if 0 <= kind < st.affinity.shape[1]:
                    st.affinity[row, kind] = jobs
        st.version[row] += 1

    def taken(self, task: Task, gpus: list[GpuRef]) -> None:
        """`task` now holds `gpus` (already taken from the map)."""
        for node in sorted({g.node_id for g in gpus}):
            self.sync(node)
            self.placed_on.add(node)
            if task.affinity >= 0:
                self.state.affinity[self.row_of[node], task.affinity] += 1


class _Fragmentation(KeepsMap):
    """Places each allocation with one of the paper's policies (see the module)."""

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.mirror: Mirror | None = None

    @property
    def chooses_types(self) -> bool:
        return True  # (as a pod, a job names the GPU types it may use: `task_of`)

    @property
    def places_what_fits(self) -> bool:
        return False  # (a policy may decline a node for the fragmentation it would leave)

    def choose(self, state: ClusterState, task: Task) -> Placement | None:
        raise NotImplementedError

    def begin(self, inp: PlacementInput) -> None:
        """Called once per decision before the first `choose`."""

    def started(self, task: Task) -> None:
        """Called for each job this decision starts."""

    def _mirrored(self, inp: PlacementInput) -> tuple[FreeMap, Mirror, dict[str, list[GpuRef]]]:
        """The decision's free map with the running jobs it keeps taken out, and its mirror."""
        free, changed = self.standing.working(inp.nodes, inp.changed_nodes)
        placed = keep_running(inp, free)
        touched = {g.node_id for gpus in placed.values() for g in gpus}
        changed = sorted(touched.union(changed), key=self.standing.rank.__getitem__)
        views = self.standing.known
        mirror = self.mirror
        if mirror is None or not mirror.fits(free, views, changed):
            mirror = self.mirror = Mirror(free, views)
        else:
            mirror.refresh(free, views, changed)
        mirror.placed_on |= touched  # (kept jobs: the next decision reads them from the views)
        return free, mirror, placed

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        free, mirror, placed = self._mirrored(inp)
        self.begin(inp)
        for alloc in inp.allocations:
            if alloc.job_id in placed or alloc.num_gpus <= 0:
                continue
            spec = inp.specs.get(alloc.job_id)
            task = task_of(alloc, spec)
            ask = Ask.of(spec, alloc.num_gpus)
            choice = self.choose(mirror.state, task)
            gpus: list[GpuRef] | None = None
            if choice is not None:
                gpus = [GpuRef(mirror.rows[choice.node], g) for g in choice.gpus]
                if not free.take_for(gpus, ask):
                    gpus = None  # (the state mirrors the map: cannot happen)
            elif not mirror.holds_whole(task):  # no node of its types could: span the fewest
                if spec is not None:  # (on the types the job allows, as `task`)
                    alloc = msgspec.structs.replace(alloc, gpu_type=spec.gpu_type)
                gpus = (
                    pick_hinted(free, alloc, consolidate)
                    if ask is None
                    else pick_asked(free, alloc, ask, consolidate)
                )
            if gpus is not None:
                mirror.taken(task, gpus)
                placed[alloc.job_id] = gpus
                self.started(task)
        return placed


class RandomFit(_Fragmentation):
    """The openb paper's random-fit: a node drawn among those the job fits, then a GPU drawn
    among those its share fits. Registry name `random-fit`."""

    Params = RandomFitParams

    def __init__(self, params: RandomFitParams | None = None) -> None:
        super().__init__(params)
        self._rng = np.random.default_rng(0)

    def begin(self, inp: PlacementInput) -> None:
        # (each decision draws afresh from (seed, now))
        seed = random.Random(f"gpuyard-random-fit:{self.params.seed}:{inp.now!r}").getrandbits(64)
        self._rng = np.random.default_rng(seed)

    def choose(self, state: ClusterState, task: Task) -> Placement | None:
        return random_fit(state, task, self._rng)


class BestFit(_Fragmentation):
    """The openb paper's best-fit: the node with least CPUs and GPUs left after the job (each over
    128 CPUs and 8 GPUs). Registry name `best-fit`."""

    def choose(self, state: ClusterState, task: Task) -> Placement | None:
        return best_fit(state, task, _NO_DRAWS)


class DotProduct(_Fragmentation):
    """The openb paper's dot-product: the node whose free (CPUs, GPUs) has the smallest dot
    product with the job's request. Registry name `dot-product`."""

    def choose(self, state: ClusterState, task: Task) -> Placement | None:
        return dot_product(state, task, _NO_DRAWS)


class GpuPacking(_Fragmentation):
    """The openb paper's GPU packing: partly used GPUs first, then free GPUs of partly used nodes,
    then idle nodes. Registry name `gpu-packing`."""

    def choose(self, state: ClusterState, task: Task) -> Placement | None:
        return gpu_packing(state, task, _NO_DRAWS)


class GpuClustering(_Fragmentation):
    """The openb paper's GPU clustering: nodes that run only jobs of the same kind (a share, one
    GPU, two, ...) first. Registry name `gpu-clustering`."""

    def choose(self, state: ClusterState, task: Task) -> Placement | None:
        return gpu_clustering(state, task, _NO_DRAWS)


class FragmentationGradientDescent(_Fragmentation):
    """FGD (Weng et al., ATC '23): the node (and GPU) where the job least adds to the expected
    GPU capacity that the target workload could not use. Registry name `fgd`."""

    Params = FgdParams
    State = ShapeCounts

    def __init__(self, params: FgdParams | None = None) -> None:
        super().__init__(params)
        self.counts: dict[Shape, int] = {}
        self.learnt: dict[Shape, int] = {}
        self._fgd: Fgd | None = None

    def snapshot(self) -> ShapeCounts:
        return ShapeCounts(
            started={_shape_key(k): n for k, n in sorted(self.counts.items())},
            learnt={_shape_key(k): n for k, n in sorted(self.learnt.items())},
        )

    def restore(self, state: ShapeCounts) -> None:
        self.counts = {_shape_of(k): n for k, n in state.started.items()}
        self.learnt = {_shape_of(k): n for k, n in state.learnt.items()}
        self._fgd = None

    def begin(self, inp: PlacementInput) -> None:
        seen = dict(self.counts)
        for alloc in inp.allocations:  # (those running count once started, unless none did)
            if alloc.num_gpus > 0 and (alloc.job_id not in inp.current or not self.counts):
                task = task_of(alloc, inp.specs.get(alloc.job_id))
                seen[task.key] = seen.get(task.key, 0) + 1
        learnt = sum(self.learnt.values())
        if sum(seen.values()) > learnt * (1 + self.params.relearn / 100) or not learnt:
            self.learnt, self._fgd = seen, None
        if self._fgd is None and self.learnt:
            self._fgd = Fgd(typical_of_counts(self.learnt, self.params.popularity))

    def started(self, task: Task) -> None:
        self.counts[task.key] = self.counts.get(task.key, 0) + 1

    def choose(self, state: ClusterState, task: Task) -> Placement | None:
        assert self._fgd is not None  # (`begin` saw this task)
        return self._fgd(state, task, _NO_DRAWS)


_NO_DRAWS = np.random.default_rng(0)
"""Passed to the policies that draw nothing (all but random-fit)."""


def _shape_key(shape: Shape) -> str:
    cpu, milli, gpus, models = shape
    return f"{cpu},{milli},{gpus},{'|'.join(models)}"


def _shape_of(key: str) -> Shape:
    cpu, milli, gpus, models = key.split(",")
    return (int(cpu), int(milli), int(gpus), tuple(m for m in models.split("|") if m))

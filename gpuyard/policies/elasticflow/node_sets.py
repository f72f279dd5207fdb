"""ElasticFlow's own placement: node sets kept in classes by the GPUs they have free.

ElasticFlow's simulator (its `elastic` scheme, `cluster.py`) empties the cluster at every event
and places every running job again, one at a time, in a fixed order. A job goes to a *node set*:
one node for a job smaller than a node, ceil(n / node) whole nodes otherwise. Node sets are kept
in classes by their free GPUs (the largest class size that divides what is free), each class
sorted by use. A job of n GPUs takes, in turn:

1. the least used set of class n, if it has room;
2. else, from the largest class down to n + 1, the first set of each class, if it has room
   ("filling in" a set of larger jobs);
3. else a new set on the first free nodes.

A set whose first candidate had no room goes to the back of its class: the classes rotate, as
ElasticFlow's lists do. Jobs take a set's GPUs one after another, in the order they came.

The free nodes are a list that lives on from one placement to the next: emptying the cluster
releases the jobs that ended first, then the others by deadline, and a set whose last job is
released puts its nodes back at the end of the list, in the order it took them; the list is then
sorted, stably, by each node's index within its switch (`switch_nodes`). On a cluster of several
switches the nodes of the same index alternate between switches in an order that this history
decides, as in ElasticFlow. Where a job lands decides whether its restart is warm (ElasticFlow
caches process groups by the ranks they span), and so the restart overhead it pays; `buddy`
keeps jobs where they are and pays fewer of them than ElasticFlow does.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Annotated, Literal

from msgspec import Meta, Struct

from gpuyard.shared.model import ANY_GPU, Allocation, GpuRef
from gpuyard.shared.policy import PlacementInput, PlacementPolicy

from .planner import NO_DEADLINE

CLASSES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 88, 128, 256)
"""ElasticFlow's node-set classes (`node_g`). A job of a size not among them gets a set of its own,
kept in no class (ElasticFlow cannot place it)."""


class NodeSetsParams(Struct, forbid_unknown_fields=True):
    order: Literal["largest-first", "given"] = "largest-first"
    """The order jobs are placed in: `largest-first` (stable: ties in the allocations' order), as
    ElasticFlow places its own jobs, Themis's and Tiresias's; `given`, the allocations' order, as
    it places EDF's (deadline order)."""
    switch_nodes: Annotated[int, Meta(ge=0)] = 0
    """Nodes per switch, in cluster order (0: one switch). ElasticFlow sorts its free nodes by
    their index within their switch."""


class Taken(Struct, array_like=True):
    """A node set of the last placement: its nodes in the order it took them, and its jobs."""

    nodes: list[str]
    jobs: list[str]


class NodeSetsState(Struct, kw_only=True):
    """What lives on between placements: per GPU type, the free nodes in order and the sets."""

    free: dict[str, list[str]] = {}
    sets: dict[str, list[Taken]] = {}
    deadlines: dict[str, float] = {}
    """Of the jobs the last placement placed (their release order)."""


class _Set:
    """A node set: its nodes and GPUs in order, how many GPUs its jobs took, and its jobs."""

    __slots__ = ("gpus", "jobs", "nodes", "used")

    def __init__(self, nodes: list[str], gpus: list[GpuRef]) -> None:
        self.nodes, self.gpus = nodes, gpus
        self.jobs: list[str] = []
        self.used = 0

    def take(self, job_id: str, n: int) -> list[GpuRef]:
        taken = self.gpus[self.used : self.used + n]
        self.used += n
        self.jobs.append(job_id)
        return taken


class _Type:
    """The placement state of one GPU type: its free nodes in order, and its classes."""

    def __init__(self, free: list[tuple[str, list[GpuRef]]]) -> None:
        self.free_nodes = free
        self.classes: dict[int, list[_Set]] = {size: [] for size in CLASSES}
        self.sets: list[_Set] = []

    def place(self, job_id: str, n: int) -> list[GpuRef] | None:
        own = self.classes.get(n)
        if own:
            chosen = own.pop(0)
            if chosen.used + n <= len(chosen.gpus):
                return self._fill(chosen, job_id, n, own)
            own.append(chosen)
        for size in reversed(CLASSES):
            if size <= n:
                break
            others = self.classes[size]
            if others:
                chosen = others.pop(0)
                if chosen.used + n <= len(chosen.gpus):
                    return self._fill(chosen, job_id, n, own)
                others.append(chosen)
        return self._new_set(job_id, n, own)

    def _fill(self, chosen: _Set, job_id: str, n: int, own: list[_Set] | None) -> list[GpuRef]:
        gpus = chosen.take(job_id, n)
        self._file(chosen, own)
        return gpus

    def _new_set(self, job_id: str, n: int, own: list[_Set] | None) -> list[GpuRef] | None:
        nodes: list[str] = []
        gpus: list[GpuRef] = []
        count = 0
        while count < len(self.free_nodes) and len(gpus) < n:
            node, node_gpus = self.free_nodes[count]
            nodes.append(node)
            gpus += node_gpus
            count += 1
        if len(gpus) < n:
            return None
        del self.free_nodes[:count]
        chosen = _Set(nodes, gpus)
        self.sets.append(chosen)
        taken = chosen.take(job_id, n)
        self._file(chosen, own)
        return taken

    def _file(self, chosen: _Set, own: list[_Set] | None) -> None:
        """Put a set that just took a job into its class: the largest class size that divides
        its free GPUs, or the job's own class when it is full; both classes sorted by use."""
        free = len(chosen.gpus) - chosen.used
        target = own
        if free > 0:
            size = next(s for s in reversed(CLASSES) if s <= free and free % s == 0)
            target = self.classes[size]
        if target is None:  # (a size of no class, full: it stays out of every class)
            return
        target.append(chosen)
        by_use = attrgetter("used")
        if own is not None:
            own.sort(key=by_use)
        target.sort(key=by_use)


class NodeSets(PlacementPolicy):
    """Registry name `node-sets`: ElasticFlow's placement (module docstring). Every allocation is
    placed again at every apply, from an emptied cluster. A job that does not fit is left out (it
    stays queued). Its free list is state (`NodeSetsState`), stored with placement's map."""

    Params = NodeSetsParams
    State = NodeSetsState

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self._gpus: dict[tuple[str, tuple[int, ...]], list[GpuRef]] = {}  # a node's, made once
        self.state = NodeSetsState()

    @property
    def rearranges(self) -> bool:
        return True

    def snapshot(self) -> NodeSetsState:
        return self.state

    def restore(self, state: NodeSetsState) -> None:
        self.state = state

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        allocations: list[Allocation] = inp.allocations
        if self.params.order == "largest-first":
            allocations = sorted(allocations, key=lambda a: -a.num_gpus)
        types: dict[str, _Type] = {}
        placed: dict[str, list[GpuRef]] = {}
        for a in allocations:
            state = types.get(a.gpu_type)
            if state is None:
                state = types[a.gpu_type] = _Type(self._free_list(inp, a.gpu_type))
            gpus = state.place(a.job_id, a.num_gpus)
            if gpus is not None:
                placed[a.job_id] = gpus
        for gpu_type in self.state.free.keys() - types.keys():  # (released all the same)
            types[gpu_type] = _Type(self._free_list(inp, gpu_type))
        self.state = NodeSetsState(
            free={t: [node for node, _ in s.free_nodes] for t, s in types.items()},
            sets={t: [Taken(x.nodes, x.jobs) for x in s.sets] for t, s in types.items()},
            deadlines={j: d for j, d in inp.deadlines.items() if j in placed},
        )
        return placed

    def _free_list(self, inp: PlacementInput, gpu_type: str) -> list[tuple[str, list[GpuRef]]]:
        """The type's nodes in the order ElasticFlow's free list has them once every job of the
        last placement is released (module docstring)."""
        usable = {
            n.node_id: self._gpus_of(n.node_id, n.usable)
            for n in inp.nodes
            if gpu_type in (ANY_GPU, n.gpu_type) and n.usable
        }
        before, sets = self.state.free.get(gpu_type), self.state.sets.get(gpu_type, [])
        if before is None:  # (the first placement: the cluster's order, as ElasticFlow starts)
            return list(usable.items())
        ended = {job_id: i for i, job_id in enumerate(inp.ended)}
        deadlines = self.state.deadlines

        def released(job_id: str) -> tuple[int, float, int]:
            if job_id in ended:
                return (0, 0.0, ended[job_id])
            return (1, deadlines.get(job_id, NO_DEADLINE), 0)

        order = [n for n in before if n in usable]
        listed = set(order)
        for taken in sorted(sets, key=lambda s: max(map(released, s.jobs))):
            order += [n for n in taken.nodes if n in usable and n not in listed]
            listed.update(taken.nodes)
        order += [n for n in usable if n not in listed]  # (nodes that joined)
        if sets:  # (ElasticFlow sorts its list when a set gives its nodes back)
            position = {n.node_id: i for i, n in enumerate(inp.nodes)}
            per_switch = self.params.switch_nodes
            order.sort(key=lambda n: position[n] % per_switch if per_switch else position[n])
        return [(n, usable[n]) for n in order]

    def _gpus_of(self, node_id: str, usable: list[int]) -> list[GpuRef]:
        key = (node_id, tuple(usable))
        gpus = self._gpus.get(key)
        if gpus is None:
            gpus = self._gpus[key] = [GpuRef(node_id, i) for i in usable]
        return gpus

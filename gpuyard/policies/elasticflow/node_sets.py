"""ElasticFlow's own placement: node sets kept in classes by the GPUs they have free.

ElasticFlow's simulator (its `elastic` scheme, `cluster.py`) empties the cluster at every event
and places every running job again, one at a time, in a fixed order. A job goes to a *node set*:
one node for a job smaller than a node, ceil(n / node) whole nodes otherwise. Node sets are kept
in classes by their free GPUs (the largest class size that divides what is free), each class
sorted by use. A job of n GPUs takes, in turn:

1. the least used set of class n, if it has room;
2. else, from the largest class down to n + 1, the first set of each class, if it has room
   ("filling in" a set of larger jobs);
3. else a new set on the first free nodes (nodes are kept in cluster order).

A set whose first candidate had no room goes to the back of its class: the classes rotate, as
ElasticFlow's lists do. Jobs take a set's GPUs one after another, in the order they came. Where a
job lands decides whether its processes are warm (ElasticFlow caches process groups by the
ranks they span), and so the restart overhead it pays; `buddy` keeps jobs where they are and pays
fewer of them than ElasticFlow does.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Literal

from msgspec import Struct

from gpuyard.shared.model import ANY_GPU, Allocation, GpuRef
from gpuyard.shared.policy import PlacementInput, PlacementPolicy

CLASSES = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 88, 128, 256)
"""ElasticFlow's node-set classes (`node_g`). A job of a size not among them gets a set of its own,
kept in no class (ElasticFlow cannot place it)."""


class NodeSetsParams(Struct, forbid_unknown_fields=True):
    order: Literal["largest-first", "given"] = "largest-first"
    """The order jobs are placed in: `largest-first` (stable: ties in the allocations' order), as
    ElasticFlow places its own jobs, Themis's and Tiresias's; `given`, the allocations' order, as
    it places EDF's (deadline order)."""


class _Set:
    """A node set: its GPUs in order, and how many of them its jobs took."""

    __slots__ = ("gpus", "used")

    def __init__(self, gpus: list[GpuRef]) -> None:
        self.gpus = gpus
        self.used = 0

    def take(self, n: int) -> list[GpuRef]:
        taken = self.gpus[self.used : self.used + n]
        self.used += n
        return taken


class _Type:
    """The placement state of one GPU type: its free nodes in order, and its classes."""

    def __init__(self, nodes: list[list[GpuRef]]) -> None:
        self.free_nodes = nodes
        self.classes: dict[int, list[_Set]] = {size: [] for size in CLASSES}

    def place(self, n: int) -> list[GpuRef] | None:
        own = self.classes.get(n)
        if own:
            chosen = own.pop(0)
            if chosen.used + n <= len(chosen.gpus):
                return self._fill(chosen, n, own)
            own.append(chosen)
        for size in reversed(CLASSES):
            if size <= n:
                break
            others = self.classes[size]
            if others:
                chosen = others.pop(0)
                if chosen.used + n <= len(chosen.gpus):
                    return self._fill(chosen, n, own)
                others.append(chosen)
        return self._new_set(n, own)

    def _fill(self, chosen: _Set, n: int, own: list[_Set] | None) -> list[GpuRef]:
        gpus = chosen.take(n)
        self._file(chosen, own)
        return gpus

    def _new_set(self, n: int, own: list[_Set] | None) -> list[GpuRef] | None:
        gpus: list[GpuRef] = []
        count = 0
        while count < len(self.free_nodes) and len(gpus) < n:
            gpus += self.free_nodes[count]
            count += 1
        if len(gpus) < n:
            return None
        del self.free_nodes[:count]
        chosen = _Set(gpus)
        taken = chosen.take(n)
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
    placed again at every apply, from an empty cluster; nodes are taken in the cluster's order. A
    job that does not fit is left out (it stays queued)."""

    Params = NodeSetsParams

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self._gpus: dict[tuple[str, tuple[int, ...]], list[GpuRef]] = {}  # a node's, made once

    @property
    def rearranges(self) -> bool:
        return True

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        types: dict[str, _Type] = {}
        allocations: list[Allocation] = inp.allocations
        if self.params.order == "largest-first":
            allocations = sorted(allocations, key=lambda a: -a.num_gpus)
        placed: dict[str, list[GpuRef]] = {}
        for a in allocations:
            state = types.get(a.gpu_type)
            if state is None:
                nodes = [
                    self._gpus_of(n.node_id, n.usable)
                    for n in inp.nodes
                    if a.gpu_type in (ANY_GPU, n.gpu_type) and n.usable
                ]
                state = types[a.gpu_type] = _Type(nodes)
            gpus = state.place(a.num_gpus)
            if gpus is not None:
                placed[a.job_id] = gpus
        return placed

    def _gpus_of(self, node_id: str, usable: list[int]) -> list[GpuRef]:
        key = (node_id, tuple(usable))
        gpus = self._gpus.get(key)
        if gpus is None:
            gpus = self._gpus[key] = [GpuRef(node_id, i) for i in usable]
        return gpus

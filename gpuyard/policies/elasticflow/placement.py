"""Buddy placement: power-of-two blocks of GPUs, whole nodes for jobs of a node or more.

ElasticFlow places jobs on node sets by power-of-two size so that scaling a job up or down keeps
it on GPUs that belong together: a job of at least a node takes whole nodes, a smaller one a block
of its size (rounded up to a power of two) aligned within one node, and every job is placed again
at every decision, largest first. Placing largest first on aligned blocks never fragments: if the
sizes fit the cluster, they fit its blocks.
"""

from __future__ import annotations

from msgspec import Struct

from gpuyard.shared.model import ANY_GPU, Allocation, GpuRef
from gpuyard.shared.policy import PlacementInput, PlacementPolicy


class BuddyParams(Struct, forbid_unknown_fields=True):
    sticky: bool = True
    """Keep a job on the GPUs it holds when they are still a valid block for its size (fewer
    restarts; ElasticFlow re-places from scratch, which lands a job that did not change on the
    same GPUs when nothing else changed either)."""


def _block(n: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return size


class Buddy(PlacementPolicy):
    """Registry name `buddy` (module docstring). A job of n >= a node's GPUs takes ceil(n / node)
    whole nodes (its current ones if they are still whole and free), the last one partly if n is
    not a multiple; a smaller job takes the first n GPUs of a free block of size next_pow2(n),
    aligned to that size, on the fullest node that has one (its current block if `sticky`). When
    no aligned block is left (sizes that are not powers of two), it takes free GPUs on the fewest
    nodes. A job that does not fit is left out (it stays queued)."""

    Params = BuddyParams

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self._gpus: dict[str, list[GpuRef]] = {}  # a node's GPUs in index order (made once)
        self._settled = False

    @property
    def rearranges(self) -> bool:
        return True

    @property
    def settled(self) -> bool:
        """Its last placement put every job on whole nodes or an aligned block of its size: placed
        again, each job keeps those (`sticky`: a larger job, or an earlier one of the same size,
        never takes another's; otherwise every job lands where it did, the input being the
        same). A job placed on free GPUs of the fewest nodes, or left out, unsettles it."""
        return self._settled

    def gpus_of(self, node_id: str, size: int) -> list[GpuRef]:
        """GPUs 0..size-1 of `node_id` (shared, immutable)."""
        gpus = self._gpus.get(node_id)
        if gpus is None or len(gpus) < size:
            gpus = self._gpus[node_id] = [GpuRef(node_id, i) for i in range(size)]
        return gpus

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        free = {n.node_id: set(n.usable) for n in inp.nodes}
        size = {n.node_id: len(n.usable) for n in inp.nodes}
        kind = {n.node_id: n.gpu_type for n in inp.nodes}
        order = [n.node_id for n in inp.nodes]
        rank = {a.job_id: i for i, a in enumerate(inp.allocations)}
        placed: dict[str, list[GpuRef]] = {}
        self._settled = True
        # Per GPU type asked for: the nodes it may use, and the largest of them.
        of_type: dict[str, tuple[list[str], int, set[str]]] = {}
        for a in sorted(inp.allocations, key=lambda a: (-a.num_gpus, rank[a.job_id])):
            if a.gpu_type not in of_type:
                nodes = [n for n in order if a.gpu_type in (ANY_GPU, kind[n])]
                of_type[a.gpu_type] = (nodes, max((size[x] for x in nodes), default=0), set(nodes))
            nodes, largest, allowed = of_type[a.gpu_type]
            current = inp.current.get(a.job_id, []) if self.params.sticky else []
            gpus = self._place(a, nodes, allowed, largest, free, size, current)
            if gpus is None:
                self._settled = False
                continue
            for g in gpus:
                free[g.node_id].discard(g.index)
            placed[a.job_id] = gpus
        return placed

    def _place(
        self, a: Allocation, nodes: list[str], allowed: set[str], largest: int,
        free: dict[str, set[int]], size: dict[str, int], current: list[GpuRef],
    ) -> list[GpuRef] | None:  # fmt: skip
        n = a.num_gpus
        if n >= largest > 0:
            chosen = _whole_nodes(n, nodes, allowed, free, size, current)
            if chosen is None:
                return None
            gpus = [g for x in chosen for g in self.gpus_of(x, size[x])[: size[x]]]
            return gpus[:n]
        block = _block(n)
        kept = _block_around(current, block, free)
        if kept is not None:
            node, start = kept
            return self.gpus_of(node, size[node])[start : start + n]
        # The fullest node with a free aligned block (then the first such node, its first block).
        best: tuple[int, int, int, str] | None = None
        for position, x in enumerate(nodes):
            room = free[x]
            if len(room) < block or (best is not None and len(room) > best[0]):
                continue
            for start in range(0, size[x] - block + 1, block):
                if all(i in room for i in range(start, start + block)):
                    if best is None or (len(room), position) < best[:2]:
                        best = (len(room), position, start, x)
                    break
        if best is not None:
            _, _, start, x = best
            return self.gpus_of(x, size[x])[start : start + n]
        self._settled = False  # (free GPUs anywhere: placed again, it may get an aligned block)
        return _fewest_nodes(n, nodes, free)


def _block_around(
    gpus: list[GpuRef], block: int, free: dict[str, set[int]]
) -> tuple[str, int] | None:
    """The aligned block of `block` GPUs that holds all of `gpus` (one node), if it is all free."""
    if not gpus or any(g.node_id != gpus[0].node_id for g in gpus):
        return None
    node = gpus[0].node_id
    start = min(g.index for g in gpus) // block * block
    inside = all(start <= g.index < start + block for g in gpus)
    if node in free and inside and all(i in free[node] for i in range(start, start + block)):
        return node, start
    return None


def _whole_nodes(
    n: int, nodes: list[str], allowed: set[str], free: dict[str, set[int]],
    size: dict[str, int], current: list[GpuRef],
) -> list[str] | None:  # fmt: skip
    """The job's current nodes that are whole and free, then the first other such nodes of
    `nodes` (`allowed`: the same, as a set), until they hold `n` GPUs (None if they cannot)."""

    def whole(x: str) -> bool:
        return x in allowed and size[x] > 0 and len(free[x]) == size[x]

    chosen = [x for x in dict.fromkeys(g.node_id for g in current) if whole(x)]
    taken, held = set(chosen), sum(size[x] for x in chosen)
    for x in nodes:
        if held >= n:
            break
        if x not in taken and whole(x):
            chosen.append(x)
            taken.add(x)
            held += size[x]
    return chosen if held >= n else None


def _fewest_nodes(n: int, nodes: list[str], free: dict[str, set[int]]) -> list[GpuRef] | None:
    position = {x: i for i, x in enumerate(nodes)}
    by_room = sorted(nodes, key=lambda x: (-len(free[x]), position[x]))
    one = [x for x in by_room if len(free[x]) >= n]
    if one:
        x = min(one, key=lambda x: (len(free[x]), position[x]))
        return [GpuRef(x, i) for i in sorted(free[x])[:n]]
    gpus: list[GpuRef] = []
    for x in by_room:
        gpus += [GpuRef(x, i) for i in sorted(free[x])[: n - len(gpus)]]
        if len(gpus) == n:
            return gpus
    return None

"""Buddy placement: power-of-two blocks of GPUs, whole nodes for jobs of a node or more.

ElasticFlow places jobs on node sets by power-of-two size so that scaling a job up or down keeps
it on GPUs that belong together: a job of at least a node takes whole nodes, a smaller one a block
of its size (rounded up to a power of two) aligned within one node, and every job is placed again
at every decision, largest first. Placing largest first on aligned blocks never fragments: if the
sizes fit the cluster, they fit its blocks.
"""

from __future__ import annotations

from itertools import islice
from operator import attrgetter

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
        placed: dict[str, list[GpuRef]] = {}
        self._settled = True
        of_type: dict[str, _Candidates] = {}
        for a in sorted(inp.allocations, key=lambda a: -a.num_gpus):  # (stable: then in order)
            candidates = of_type.get(a.gpu_type)
            if candidates is None:
                nodes = [n.node_id for n in inp.nodes if a.gpu_type in (ANY_GPU, n.gpu_type)]
                candidates = of_type[a.gpu_type] = _Candidates(nodes, size)
            current = inp.current.get(a.job_id, []) if self.params.sticky else []
            gpus = self._place(a, candidates, free, size, current)
            if gpus is None:
                self._settled = False
                continue
            placed[a.job_id] = gpus
        return placed

    def _place(
        self, a: Allocation, candidates: _Candidates, free: dict[str, set[int]],
        size: dict[str, int], current: list[GpuRef],
    ) -> list[GpuRef] | None:  # fmt: skip
        """The job's GPUs, taken out of `free` (None: it does not fit)."""
        n = a.num_gpus
        nodes = candidates.nodes
        if n >= candidates.largest > 0:
            chosen = _whole_nodes(n, candidates, free, size, current)
            if chosen is None:
                return None
            gpus: list[GpuRef] = []
            for x in chosen:
                if len(gpus) == n:
                    break  # (current nodes beyond what a smaller job needs)
                take = min(size[x], n - len(gpus))
                gpus += self.gpus_of(x, size[x])[:take]
                free[x].difference_update(range(take))
            return gpus
        block = _block(n)
        kept = _block_around(current, block, free)
        if kept is not None:
            node, start = kept
            free[node].difference_update(range(start, start + n))
            return self.gpus_of(node, size[node])[start : start + n]
        # The fullest node with a free aligned block (then the first such node, its first block).
        best: tuple[int, int, int, str] | None = None
        scanned = candidates.with_room
        with_room: list[tuple[int, str]] = []
        for i, (position, x) in enumerate(scanned):
            room = free[x]
            k = len(room)
            if not k:
                continue  # full: it stays so
            with_room.append((position, x))
            if k < block or (best is not None and k >= best[0]):
                continue  # (a later node as full as the best so far loses the tie)
            for start in range(0, size[x] - block + 1, block):
                if room.issuperset(range(start, start + block)):
                    best = (k, position, start, x)
                    break
            if best is not None and best[0] == block:
                with_room += scanned[i + 1 :]
                break  # none can be fuller
        candidates.with_room = with_room
        if best is not None:
            _, _, start, x = best
            free[x].difference_update(range(start, start + n))
            return self.gpus_of(x, size[x])[start : start + n]
        self._settled = False  # (free GPUs anywhere: placed again, it may get an aligned block)
        spread = _fewest_nodes(n, nodes, free)  # (None: it does not fit)
        for g in spread or ():
            free[g.node_id].discard(g.index)
        return spread


class _Candidates:
    """The nodes of the GPU type a job asks for, in order; the largest of them; and where the
    first that may still be whole is, and those that may still have room, with their places
    (during a placement GPUs are only taken: a node that stopped being whole stays so, a full
    node stays full)."""

    __slots__ = ("allowed", "first_whole", "largest", "nodes", "with_room")

    def __init__(self, nodes: list[str], size: dict[str, int]) -> None:
        self.nodes = nodes
        self.allowed = set(nodes)
        self.largest = max((size[x] for x in nodes), default=0)
        self.first_whole = 0
        self.with_room = list(enumerate(nodes))


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
    n: int, candidates: _Candidates, free: dict[str, set[int]], size: dict[str, int],
    current: list[GpuRef],
) -> list[str] | None:  # fmt: skip
    """The job's current nodes that are whole and free, then the first other such nodes of the
    candidates, until they hold `n` GPUs (None if they cannot)."""

    def whole(x: str) -> bool:
        return size[x] > 0 and len(free[x]) == size[x]

    allowed = candidates.allowed
    chosen = [x for x in dict.fromkeys(map(_node_of, current)) if x in allowed and whole(x)]
    taken, held = set(chosen), sum(size[x] for x in chosen)
    nodes, first = candidates.nodes, candidates.first_whole
    while first < len(nodes) and not whole(nodes[first]):
        first += 1
    candidates.first_whole = first
    for x in islice(nodes, first, None):
        if held >= n:
            break
        if x not in taken and whole(x):
            chosen.append(x)
            taken.add(x)
            held += size[x]
    return chosen if held >= n else None


_node_of = attrgetter("node_id")


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

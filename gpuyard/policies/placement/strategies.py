"""Built-in placement policies.

Every policy returns, for each allocation it can place, exactly `num_gpus` distinct usable GPUs of
one type (the allocation's type unless it is ANY_GPU), never a GPU twice across jobs. They share
`FreeMap` (free GPUs while a placement is built), `keep_running` (no migration for jobs whose
allocation did not change) and one picker per strategy. An allocation's `layout` (GPUs per node)
is taken as it is where those GPUs are free; its `nodes` hint is honoured next: the picker tries
those nodes alone, then the whole cluster.

A job that asks for more than whole GPUs of a type (`Ask`: a share of one GPU, some GPU types,
CPUs or memory) is placed by the same picker on the nodes that have room for it; a share goes
to the GPU it fits best among those others already share (least left after it), else to a free
GPU the picker chooses.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable
from typing import Any, NamedTuple

from msgspec import Struct

from gpuyard.shared.model import ANY_GPU, Allocation, GpuRef, JobSpec
from gpuyard.shared.policy import NodeView, PlacementInput, PlacementPolicy

_NONE = object()  # (a node a table did not have)

Picker = Callable[["FreeMap", int, str], "list[GpuRef] | None"]
"""(free GPUs, count, GPU type) -> `count` GPUs of one type taken from the map, or None."""


class Ask(NamedTuple):
    """What a job asks for beyond whole GPUs of a type."""

    gpus: int
    milli: int | None
    """A share of one GPU, in thousandths; None: whole GPUs."""
    spec: JobSpec

    @classmethod
    def of(cls, spec: JobSpec | None, gpus: int) -> Ask | None:
        """None for a job that asks for whole GPUs and nothing else (the pickers alone)."""
        if spec is None or not (
            spec.gpu_milli or spec.gpu_types or spec.cpu_milli or spec.memory_mib
        ):
            return None
        return cls(gpus, spec.gpu_milli, spec)

    def spread(self, amount: int, gpus_here: int) -> int:
        """A job's CPUs or memory on a node where it has `gpus_here` of its GPUs (rounded up)."""
        return -(-amount * gpus_here // self.gpus)


class FreeMap:
    """Free GPUs per node while a placement is built (kept jobs' GPUs are taken out first), the
    shares left on GPUs jobs share, and the CPUs and memory left where nodes count them.

    It keeps each type's nodes by how many GPUs they have free, so that finding the first node
    with enough (`first_with`) or the emptiest (`most_free`) costs the sizes of nodes, not the
    nodes."""

    def __init__(self, nodes: list[NodeView]) -> None:
        self.order: list[str] = []
        self.gpu_type: dict[str, str] = {}
        self.of_type: dict[str, list[str]] = {}  # each type's nodes, in node order
        self.type_rank: dict[str, int] = {}  # each node's place in its type's nodes
        self.undo: list[tuple[dict[str, Any], str, Any]] | None = None
        """What each change of the map replaced, (table, node, value), in order (None: not
        kept; a `StandingMap` takes a decision's changes back before the next)."""
        self.free: dict[str, list[int]] = {}
        """Each node's free GPUs (changed through `set_free`, which keeps the two below)."""
        self._by_free: dict[str, list[list[int]]] = {}
        """Each type's nodes by how many GPUs they have free (at k: those with k, k >= 1), as
        their places among the type's nodes (`type_rank`), in order."""
        self._total: dict[str, int] = {}  # each type's free GPUs
        self.shares: dict[str, dict[int, int]] = {}  # node -> GPU index -> thousandths left
        self.cpu: dict[str, int] = {}  # nodes that count their CPUs: thousandths left
        self.memory: dict[str, int] = {}
        for n in nodes:
            if n.node_id in self.free:  # a node listed twice: merge (never hand a GPU out twice)
                self.set_free(n.node_id, sorted(set(self.free[n.node_id]) | set(n.usable)))
                continue
            self._add(n.node_id, n.gpu_type, list(n.usable))  # (sorted, each once: `NodeView`)
            if n.shares:
                self.shares[n.node_id] = dict(n.shares)
            if n.cpu_milli is not None:
                self.cpu[n.node_id] = n.cpu_milli
            if n.memory_mib is not None:
                self.memory[n.node_id] = n.memory_mib

    def _add(self, node: str, gpu_type: str, free: list[int]) -> None:
        self.order.append(node)
        self.gpu_type[node] = gpu_type
        of_type = self.of_type.get(gpu_type)
        if of_type is None:
            of_type = self.of_type[gpu_type] = []
        self.type_rank[node] = len(of_type)
        of_type.append(node)
        self.set_free(node, free)

    def set_free(self, node: str, free: list[int]) -> None:
        """`node`'s free GPUs are now `free` (a change not to take back: `_set` for those)."""
        old = self.free.get(node)
        self.free[node] = free
        before, after = len(old) if old is not None else 0, len(free)
        if before == after:
            return
        gpu_type, at = self.gpu_type[node], self.type_rank[node]
        by_free = self._by_free.get(gpu_type)
        if by_free is None:
            by_free = self._by_free[gpu_type] = [[]]
        if before:
            nodes = by_free[before]
            del nodes[bisect.bisect_left(nodes, at)]
        if after:
            while len(by_free) <= after:
                by_free.append([])
            bisect.insort(by_free[after], at)
        self._total[gpu_type] = self._total.get(gpu_type, 0) + after - before

    def subset(self, free: dict[str, list[int]]) -> FreeMap:
        """A map of only these free GPUs, nodes in the order given, for a picker to take from;
        shares, CPUs and memory are not carried (the caller checks them)."""
        sub = FreeMap([])
        gpu_type = self.gpu_type
        for n, usable in free.items():
            sub._add(n, gpu_type[n], usable)
        return sub

    def room(self, node: str, ask: Ask) -> int:
        """How many of `ask`'s GPUs `node` could host now: its free GPUs, as far as its CPUs
        and memory go (0 for a type the job does not allow)."""
        if not ask.spec.allows(self.gpu_type[node]):
            return 0
        room = len(self.free[node])
        for left, amount in ((self.cpu.get(node), ask.spec.cpu_milli),
                             (self.memory.get(node), ask.spec.memory_mib)):  # fmt: skip
            if left is not None and amount:
                room = min(room, left * ask.gpus // amount)
        return room

    def fits_share(self, node: str, ask: Ask) -> bool:
        """Whether `node` has the CPUs and memory for a job that asks for a share of a GPU, and
        a type it allows."""
        spec = ask.spec
        return (
            spec.allows(self.gpu_type[node])
            and self.cpu.get(node, spec.cpu_milli) >= spec.cpu_milli
            and self.memory.get(node, spec.memory_mib) >= spec.memory_mib
        )

    def within(self, ask: Ask) -> FreeMap:
        """The free GPUs `ask` may use: on each node as many as it has room for."""
        spec = ask.spec
        limits = [(left, amount) for left, amount in ((self.cpu, spec.cpu_milli),
                                                      (self.memory, spec.memory_mib)) if amount]  # fmt: skip
        free = self.free
        allowed = [t for t in self.of_type if spec.allows(t)]
        nodes = self.order if len(allowed) == len(self.of_type) else self._in_order(allowed)
        found: dict[str, list[int]] = {}
        for n in nodes:
            usable = free[n]
            if not usable:
                continue
            room = len(usable)
            for left, amount in limits:
                if (have := left.get(n)) is not None:
                    room = min(room, have * ask.gpus // amount)
            if room > 0:
                found[n] = usable[:room]
        return self.subset(found)

    def _in_order(self, types: list[str]) -> list[str]:
        """The nodes of these types, in node order."""
        if len(types) == 1:
            return self.of_type[types[0]]
        chosen = set(types)
        return [n for n in self.order if self.gpu_type[n] in chosen]

    def take_for(self, gpus: list[GpuRef], ask: Ask | None) -> bool:
        """Reserve these GPUs for a job that asks `ask` (its share of the one GPU, its CPUs and
        memory on their nodes); False (nothing reserved) if they are not there to take."""
        if ask is None:
            return self.take(gpus)
        per_node: dict[str, int] = {}
        for g in gpus:
            per_node[g.node_id] = per_node.get(g.node_id, 0) + 1
        if any(g.node_id not in self.free or not ask.spec.allows(self.gpu_type[g.node_id])
               for g in gpus):  # fmt: skip
            return False
        if ask.milli is not None:
            if len(gpus) != 1 or not self.fits_share(gpus[0].node_id, ask):
                return False
            g = gpus[0]
            shared = self.shares.get(g.node_id, {})
            if g.index in shared:
                if shared[g.index] < ask.milli:
                    return False
            elif not self.take(gpus):
                return False
            left = shared.get(g.index, 1000) - ask.milli
            shared = {**shared, g.index: left}  # (a copy: maps share them)
            self._set(self.shares, g.node_id, shared)
        else:
            for n, k in per_node.items():
                for remaining, amount in ((self.cpu, ask.spec.cpu_milli),
                                          (self.memory, ask.spec.memory_mib)):  # fmt: skip
                    if n in remaining and remaining[n] < ask.spread(amount, k):
                        return False
            if not self.take(gpus):
                return False
        for n, k in per_node.items():
            if n in self.cpu:
                self._set(self.cpu, n, self.cpu[n] - ask.spread(ask.spec.cpu_milli, k))
            if n in self.memory:
                self._set(self.memory, n, self.memory[n] - ask.spread(ask.spec.memory_mib, k))
        return True

    def take(self, gpus: list[GpuRef]) -> bool:
        """Reserve exactly these GPUs; False (nothing reserved) if any is not free or repeated."""
        wanted: dict[str, set[int]] = {}
        for g in gpus:
            wanted.setdefault(g.node_id, set()).add(g.index)
        if sum(len(v) for v in wanted.values()) != len(gpus):
            return False
        if any(not idx <= set(self.free.get(node, ())) for node, idx in wanted.items()):
            return False
        for node, idx in wanted.items():
            self._set(self.free, node, [i for i in self.free[node] if i not in idx])
        return True

    def _set(self, table: dict[str, Any], node: str, value: Any) -> None:
        if self.undo is not None:
            self.undo.append((table, node, table.get(node, _NONE)))
        if table is self.free:
            self.set_free(node, value)
        else:
            table[node] = value

    def rollback(self) -> None:
        """Take back every change since `undo` was set (and stop keeping them)."""
        undo, self.undo = self.undo or [], None
        for table, node, value in reversed(undo):
            if table is self.free:
                self.set_free(node, value)  # (a node whose GPUs changed was in the map)
            elif value is _NONE:
                del table[node]
            else:
                table[node] = value

    def nodes_of(self, gpu_type: str) -> list[str]:
        """Nodes (in node order) of this type (any type for ANY_GPU) with free GPUs."""
        free = self.free
        nodes = self.order if gpu_type == ANY_GPU else self.of_type.get(gpu_type, ())
        return [n for n in nodes if free[n]]

    def first_with(self, gpu_type: str, count: int) -> str | None:
        """The first node (in node order) of this concrete type with `count` free GPUs, or None."""
        by_free = self._by_free.get(gpu_type, ())
        first = min((nodes[0] for nodes in by_free[max(count, 1) :] if nodes), default=None)
        return None if first is None else self.of_type[gpu_type][first]

    def most_free(self, gpu_type: str, count: int) -> list[str]:
        """Nodes of this concrete type with free GPUs, those with the most first (node order
        breaks ties), as far as they hold `count` GPUs (all of them where they do not)."""
        nodes, by_free = self.of_type.get(gpu_type, []), self._by_free.get(gpu_type, [])
        found: list[str] = []
        held = 0
        for k in range(len(by_free) - 1, 0, -1):
            for at in by_free[k]:
                found.append(nodes[at])
                held += k
                if held >= count:
                    return found
        return found

    def put_back(self, gpus: list[GpuRef]) -> None:
        """Free these GPUs again (an undone take)."""
        for g in gpus:
            self._set(self.free, g.node_id, sorted([*self.free[g.node_id], g.index]))

    def types(self) -> list[str]:
        return sorted(self.of_type)

    def types_for(self, gpu_type: str) -> list[str]:
        """The concrete types an allocation of `gpu_type` may use, in a fixed order."""
        return self.types() if gpu_type == ANY_GPU else [gpu_type]

    def free_count(self, gpu_type: str) -> int:
        if gpu_type == ANY_GPU:
            return sum(self._total.values())
        return self._total.get(gpu_type, 0)

    def grab(self, node: str, count: int) -> list[GpuRef]:
        """The `count` lowest free GPUs of `node`."""
        taken = self.free[node][:count]
        self._set(self.free, node, self.free[node][count:])
        return [GpuRef(node, i) for i in taken]


class StandingMap:
    """The free map of a policy's decisions, kept from one to the next and brought up to date
    from the nodes whose views changed. Placement hands the same `NodeView` object for a node
    that did not change, so a decision costs the nodes that did, not every node; `working`
    gives what `FreeMap(nodes)` would (a node that left the views stays with nothing free, which
    no picker takes)."""

    def __init__(self) -> None:
        self.base = FreeMap([])
        self.rank: dict[str, int] = {}
        self.views: dict[str, NodeView] = {}
        self.known: dict[str, NodeView] = {}
        """Every node of the map by its last view (one that left: with nothing free)."""

    def working(
        self, nodes: list[NodeView], changed: list[str] | None = None
    ) -> tuple[FreeMap, list[str]]:
        """A map of `nodes` for one decision to take from, and the nodes whose views changed
        since the last call (in node order; every node when the order had to be made again).
        `changed`: the nodes whose views may differ from the last call's, as the service knows
        them (`PlacementInput.changed_nodes`): only those are looked at; None: every node is."""
        self.base.rollback()  # (the last decision's changes)
        seen = self.views
        rank = self.rank
        told = self._told(nodes, changed) if changed is not None else None
        view_of: Callable[[str], NodeView | None]
        if told is not None:
            changed = list(told)
            view_of = told.get
        else:
            current = {v.node_id: v for v in nodes}
            ranks = [rank.get(n, -1) for n in current]
            if (
                len(current) != len(nodes)
                or any(a >= b for a, b in itertools.pairwise(ranks))
                or (ranks and ranks[0] < 0)
            ):  # (a new node, or another order: made again, those that left kept at the end)
                return self._rebuilt(nodes), list(self.base.order)
            changed = [n for n, v in current.items() if seen.get(n) is not v]
            changed += [n for n in seen.keys() - current.keys()]
            changed.sort(key=rank.__getitem__)
            view_of = current.get
        base = self.base
        for n in changed:
            view = view_of(n)
            seen.pop(n, None)
            base.shares.pop(n, None)
            base.cpu.pop(n, None)
            base.memory.pop(n, None)
            if view is None:
                base.set_free(n, [])
                self.known[n] = _emptied(self.known[n])
                continue
            if view.gpu_type != base.gpu_type[n]:  # (a node that came back as another)
                return self._rebuilt(nodes), list(self.base.order)
            seen[n] = self.known[n] = view
            base.set_free(n, list(view.usable))
            if view.shares:
                base.shares[n] = dict(view.shares)
            if view.cpu_milli is not None:
                base.cpu[n] = view.cpu_milli
            if view.memory_mib is not None:
                base.memory[n] = view.memory_mib
        return self._working(), changed

    def _told(self, nodes: list[NodeView], changed: list[str]) -> dict[str, NodeView | None] | None:
        """The views of the nodes `changed` (None: not listed), in node order, found in `nodes`
        without looking at the others; None where the search cannot vouch for them: a node new
        to the map, or one listed out of the map's order (a node that came back is ranked
        last), which the whole look then puts right."""
        rank, seen = self.rank, self.views
        if not rank or any(n not in rank for n in changed):
            return None

        def place_of(view: NodeView) -> int:
            return rank.get(view.node_id, -1)

        told: dict[str, NodeView | None] = {}
        for n in sorted(set(changed), key=rank.__getitem__):
            at = rank[n]
            i = bisect.bisect_left(nodes, at, key=place_of)
            if i < len(nodes) and nodes[i].node_id == n:
                if (i and place_of(nodes[i - 1]) >= at) or (
                    i + 1 < len(nodes) and place_of(nodes[i + 1]) <= at
                ):
                    return None
                told[n] = nodes[i]
            else:
                told[n] = None
        stayed = len(seen) - sum(n in seen for n in told)
        if stayed + sum(v is not None for v in told.values()) != len(nodes):
            return None  # (a node listed that the search did not find: out of order)
        return told

    def _working(self) -> FreeMap:
        """The map itself, for one decision: it keeps what the decision changes, to take back."""
        self.base.undo = []
        return self.base

    def _rebuilt(self, nodes: list[NodeView]) -> FreeMap:
        current = {v.node_id: v for v in nodes}
        gone = [_emptied(self.known[n]) for n in self.base.order if n not in current]
        self.base = FreeMap([*nodes, *gone])
        self.rank = {n: i for i, n in enumerate(self.base.order)}
        self.views = dict(current)
        self.known = {v.node_id: v for v in gone} | current
        return self._working()


def _emptied(view: NodeView) -> NodeView:
    """A node that left the views: nothing on it to give out."""
    return NodeView(node_id=view.node_id, gpu_type=view.gpu_type, usable=[],
                    num_gpus=view.num_gpus, holding=view.holding)  # fmt: skip


def _type_of(gpus: list[GpuRef], free: FreeMap) -> str | None:
    """The one GPU type of these GPUs (None if unknown nodes or mixed types)."""
    found = {free.gpu_type.get(g.node_id) for g in gpus}
    if len(found) != 1:
        return None
    return found.pop()


def keep_running(inp: PlacementInput, free: FreeMap) -> dict[str, list[GpuRef]]:
    """Jobs whose allocation did not change keep their GPUs (no migration)."""
    kept: dict[str, list[GpuRef]] = {}
    for alloc in inp.allocations:
        gpus = inp.current.get(alloc.job_id)
        if not gpus or len(gpus) != alloc.num_gpus or alloc.job_id in kept:
            continue
        t = _type_of(gpus, free)
        ask = Ask.of(inp.specs.get(alloc.job_id), alloc.num_gpus)
        if t is not None and alloc.gpu_type in (ANY_GPU, t) and free.take_for(gpus, ask):
            kept[alloc.job_id] = list(gpus)
    return kept


def consolidate(free: FreeMap, count: int, gpu_type: str) -> list[GpuRef] | None:
    """`count` GPUs of one type on as few nodes as possible: the first node that fits them all,
    else the emptiest nodes first. None if they do not fit."""
    for t in free.types_for(gpu_type):
        single = free.first_with(t, count)
        if single is not None:
            return free.grab(single, count)
        gpus = most_free_first(free, count, t)
        if gpus is not None:
            return gpus
    return None


def most_free_first(free: FreeMap, count: int, gpu_type: str) -> list[GpuRef] | None:
    """`count` GPUs of one type from the nodes with the most free GPUs first (node order breaks
    ties), all of each node's until enough (Pollux's simulator: `most_common` of the free
    GPUs, again and again). None if they do not fit."""
    for t in free.types_for(gpu_type):
        if free.free_count(t) < count:
            continue
        gpus: list[GpuRef] = []
        for n in free.most_free(t, count):
            gpus += free.grab(n, min(count - len(gpus), len(free.free[n])))
            if len(gpus) == count:
                return gpus
    return None


def first_fit(free: FreeMap, count: int, gpu_type: str) -> list[GpuRef] | None:
    """`count` GPUs of the first type that has them: nodes in order, lowest indices first,
    spanning nodes as needed."""
    for t in free.types_for(gpu_type):
        if free.free_count(t) < count:
            continue
        gpus: list[GpuRef] = []
        for n in free.nodes_of(t):
            gpus += free.grab(n, min(count - len(gpus), len(free.free[n])))
            if len(gpus) == count:
                return gpus
    return None


def scatter(free: FreeMap, count: int, gpu_type: str) -> list[GpuRef] | None:
    """`count` GPUs of one type spread over as many nodes as possible: one GPU per node in turn
    (round-robin), nodes with the most free GPUs first (node order breaks ties)."""
    for t in free.types_for(gpu_type):
        if free.free_count(t) < count:
            continue
        nodes = sorted(free.nodes_of(t), key=lambda n: -len(free.free[n]))
        per_node = dict.fromkeys(nodes, 0)
        left = count
        while left:
            for n in nodes:
                if left and per_node[n] < len(free.free[n]):
                    per_node[n] += 1
                    left -= 1
        gpus: list[GpuRef] = []
        for n in nodes:
            gpus += free.grab(n, per_node[n])
        return gpus
    return None


def random_pick(rng: random.Random) -> Picker:
    """A picker taking `count` GPUs uniformly at random among the free GPUs of a type (the types
    that fit are tried in random order)."""

    def pick(free: FreeMap, count: int, gpu_type: str) -> list[GpuRef] | None:
        types = [t for t in free.types_for(gpu_type) if free.free_count(t) >= count]
        if not types:
            return None
        t = rng.choice(types)
        pool = [GpuRef(n, i) for n in free.nodes_of(t) for i in free.free[n]]
        gpus = sorted(rng.sample(pool, count))
        free.take(gpus)
        return gpus

    return pick


def pick_share(free: FreeMap, alloc: Allocation, ask: Ask, pick: Picker) -> list[GpuRef] | None:
    """A GPU for a job that asks for a share of one: among the GPUs others share, on nodes with
    its CPUs and memory, the one it fits best (least left after it; its hinted nodes first, then
    node order), else a free GPU `pick` chooses on such a node."""
    assert ask.milli is not None
    hinted = set(alloc.nodes)
    position = {n: i for i, n in enumerate(free.order)}
    best: tuple[bool, int, int, int] | None = None
    for node, shared in free.shares.items():
        if not free.fits_share(node, ask) or alloc.gpu_type not in (ANY_GPU, free.gpu_type[node]):
            continue
        for index, left in shared.items():
            if left >= ask.milli:
                key = (node not in hinted, left - ask.milli, position[node], index)
                best = key if best is None or key < best else best
    if best is not None:
        gpus = [GpuRef(free.order[best[2]], best[3])]
    else:
        within = free.within(ask)
        gpus = pick_hinted(within, alloc, pick) or []
    return gpus if gpus and free.take_for(gpus, ask) else None


def pick_asked(free: FreeMap, alloc: Allocation, ask: Ask, pick: Picker) -> list[GpuRef] | None:
    """GPUs for a job with an `Ask`: with `pick`, on the nodes with room for it."""
    if ask.milli is not None:
        return pick_share(free, alloc, ask, pick)
    gpus = pick_hinted(free.within(ask), alloc, pick)
    return gpus if gpus is not None and free.take_for(gpus, ask) else None


def pick_hinted(free: FreeMap, alloc: Allocation, pick: Picker) -> list[GpuRef] | None:
    """GPUs for `alloc`: its `layout` if those GPUs are free, else with `pick`, on its hinted
    nodes if they have room, else anywhere."""
    layout = alloc.layout
    if layout and sum(layout.values()) == alloc.num_gpus:
        kinds = {free.gpu_type.get(n) for n in layout}
        if (
            len(kinds) == 1
            and alloc.gpu_type in (ANY_GPU, *kinds)
            and all(len(free.free.get(n, ())) >= k for n, k in layout.items())
        ):
            return [g for n, k in layout.items() for g in free.grab(n, k)]
    hinted = [n for n in alloc.nodes if n in free.free]
    if hinted:
        within = free.subset({n: list(free.free[n]) for n in hinted})
        gpus = pick(within, alloc.num_gpus, alloc.gpu_type)
        if gpus is not None and free.take(gpus):
            return gpus
    return pick(free, alloc.num_gpus, alloc.gpu_type)


def place_with(
    inp: PlacementInput,
    pick: Picker,
    *,
    keep: bool = True,
    free: FreeMap | None = None,
    placed: dict[str, list[GpuRef]] | None = None,
) -> dict[str, list[GpuRef]]:
    """Keep running jobs in place (if `keep`), then place the other allocations in order with
    `pick`; an allocation that does not fit is left out (it stays queued). `free` and `placed`
    carry over what an earlier step already decided."""
    free = free if free is not None else FreeMap(inp.nodes)
    placed = dict(placed or {})
    if keep:
        placed |= keep_running(inp, free)
    for alloc in inp.allocations:
        if alloc.job_id in placed or alloc.num_gpus <= 0:
            continue
        ask = Ask.of(inp.specs.get(alloc.job_id), alloc.num_gpus)
        gpus = pick_hinted(free, alloc, pick) if ask is None else pick_asked(free, alloc, ask, pick)
        if gpus is not None:
            placed[alloc.job_id] = gpus
    return placed


class KeepParams(Struct, forbid_unknown_fields=True):
    keep_running: bool = True
    """Jobs whose allocation did not change keep their GPUs (False: re-place every job)."""


class KeepsMap(PlacementPolicy):
    """A policy whose decisions take from a `StandingMap`: each costs the nodes that changed."""

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.standing = StandingMap()

    @property
    def places_what_fits(self) -> bool:
        return True  # (each picker spans the nodes when no node has the GPUs alone)

    def free_map(self, inp: PlacementInput) -> FreeMap:
        """The free map of `inp.nodes`, as `FreeMap(inp.nodes)`."""
        return self.standing.working(inp.nodes, inp.changed_nodes)[0]


class MayRearrange(KeepsMap):
    """A policy with a `keep_running` parameter: with it False, it sees and re-places every job."""

    @property
    def rearranges(self) -> bool:
        return not self.params.keep_running


class Consolidated(KeepsMap):
    """Keep running jobs where they are; place the others on the fewest nodes, first fit.

    Registry name `consolidated`. A multi-GPU job goes to the first node with enough free GPUs; if
    none has, it spans the nodes with the most free GPUs. Correct on partly free nodes (unlike
    Blox's consolidated placement, which fails there).
    """

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        return place_with(inp, consolidate, free=self.free_map(inp))


class MostFree(KeepsMap):
    """Keep running jobs where they are; take the others' GPUs from the nodes with the most free
    GPUs first, in the order the scheduler ranks them (Pollux's simulator places its Optimus and
    Tiresias jobs so). Registry name `most-free`."""

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        return place_with(inp, most_free_first, free=self.free_map(inp))


class FirstFit(MayRearrange):
    """First fit: nodes in order, lowest GPU indices first, spanning nodes when needed.

    Registry name `first-fit`. Like Tiresias's `yarn`-less "count then fill" placement; running
    jobs keep their GPUs unless `keep_running` is False.
    """

    Params = KeepParams

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        return place_with(inp, first_fit, keep=self.params.keep_running, free=self.free_map(inp))


class Scattered(MayRearrange):
    """Spread each job over as many nodes as possible, round-robin, emptiest nodes first (Blox's
    scattered placement). Registry name `scattered`."""

    Params = KeepParams

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        return place_with(inp, scatter, keep=self.params.keep_running, free=self.free_map(inp))


class RandomParams(Struct, forbid_unknown_fields=True):
    seed: int = 0
    """Seed; each decision draws from a generator seeded by (seed, now), so a decision depends
    only on its input and results are reproducible."""
    keep_running: bool = True
    """Jobs whose allocation did not change keep their GPUs (False: re-place every job)."""


class RandomPlacement(MayRearrange):
    """Random GPUs of one type (Tiresias's `random` scheme, which ignores locality).

    Registry name `random`. Deterministic: the generator is seeded from `seed` and `inp.now`.
    """

    Params = RandomParams

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        rng = random.Random(f"gpuyard-random:{self.params.seed}:{inp.now!r}")
        pick = random_pick(rng)
        return place_with(inp, pick, keep=self.params.keep_running, free=self.free_map(inp))


class Sticky(KeepsMap):
    """Minimise migrations: running jobs keep their GPUs; a resized job keeps as many of its GPUs
    as it can use (shrinking keeps those on the nodes where it has most; growing adds GPUs on its
    own nodes first, then the fewest other nodes); new jobs are placed consolidated.

    Registry name `sticky`. Order: unchanged jobs, then resized jobs (in allocation order), then new
    ones, so a newly started job never takes a GPU a resized job already had. A job whose GPUs are
    gone (node down) or whose type changed is placed afresh.
    """

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        free = self.free_map(inp)
        placed = keep_running(inp, free)
        for alloc in inp.allocations:
            if alloc.job_id in placed or Ask.of(inp.specs.get(alloc.job_id), 1) is not None:
                continue  # (a job with an `Ask` is placed afresh)
            current = inp.current.get(alloc.job_id) or []
            gpus = self._resize(free, current, alloc.num_gpus, alloc.gpu_type)
            if gpus is not None:
                placed[alloc.job_id] = gpus
        return place_with(inp, consolidate, keep=False, free=free, placed=placed)

    @staticmethod
    def _resize(
        free: FreeMap, current: list[GpuRef], count: int, gpu_type: str
    ) -> list[GpuRef] | None:
        """Keep what can be kept of `current` for a job now of `count` GPUs, or None."""
        if not current or count <= 0:
            return None
        # Its GPUs that are still free, of one type compatible with the allocation.
        mine: dict[str, list[int]] = {}
        for g in sorted(set(current)):
            t = free.gpu_type.get(g.node_id)
            if t is not None and gpu_type in (ANY_GPU, t) and g.index in free.free[g.node_id]:
                mine.setdefault(g.node_id, []).append(g.index)
        if not mine:
            return None
        by_type: dict[str, list[str]] = {}
        for n in mine:
            by_type.setdefault(free.gpu_type[n], []).append(n)
        t, nodes = max(by_type.items(), key=lambda kv: sum(len(mine[n]) for n in kv[1]))
        nodes.sort(key=lambda n: -len(mine[n]))  # nodes where it has most first (stable)
        keep: list[GpuRef] = []
        for n in nodes:
            keep += [GpuRef(n, i) for i in mine[n][: count - len(keep)]]
            if len(keep) == count:
                break
        if len(keep) < count:  # growing: room on its own nodes, then elsewhere
            missing = count - len(keep)
            extra_free = free.free_count(t) - len(keep)
            if extra_free < missing:
                return None
        if not free.take(keep):
            return None
        for n in nodes:
            if len(keep) == count:
                break
            keep += free.grab(n, min(count - len(keep), len(free.free[n])))
        if len(keep) < count:
            more = consolidate(free, count - len(keep), t)
            if more is None:  # cannot happen (counted above); undo to stay safe
                free.put_back(keep)
                return None
            keep += more
        return keep

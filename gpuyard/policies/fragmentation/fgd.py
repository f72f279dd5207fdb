"""Fragmentation of GPU capacity against a target workload, and FGD (fragmentation gradient
descent) scoring, as the openb artifact defines them (`pkg/utils/frag.go`,
`pkg/simulator/plugin/fgd_score.go`).

A node's fragmentation is the expected GPU milli that a pod drawn from the target workload
(the "typical pods", with their popularity) could not use there: for a typical pod the node can
host (CPU, model and enough GPUs with the milli it asks), the milli of GPUs too small for it; for
one it cannot host (and for every CPU-only pod), all the node's free GPU milli. FGD places a task
where this measure grows least.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from .cluster import (
    MILLI,
    BoolArray,
    ClusterState,
    FloatArray,
    IntArray,
    Placement,
    Task,
    exclusive_gpus,
    pick_max,
)

POPULARITY_THRESHOLD = 95  # percent of pods the typical pods cover (generate_config_and_run.py)


@dataclass(frozen=True)
class TypicalPods:
    """The target workload: K pod shapes and their popularity (summing to 1)."""

    cpu: IntArray
    milli: IntArray
    gpus: IntArray
    models: tuple[tuple[str, ...], ...]
    freq: FloatArray

    def __len__(self) -> int:
        return len(self.cpu)

    def access(self, state: ClusterState) -> BoolArray:
        """(GPU models + 1, K): whether a node of each model may run each shape; the last row is
        for nodes without GPUs (model -1 indexes it)."""
        rows = np.ones((len(state.models) + 1, len(self)), dtype=np.bool_)
        for k, models in enumerate(self.models):
            if models:
                rows[:-1, k] = [m in models for m in state.models]
                rows[-1, k] = False
        return rows


Shape = tuple[int, int, int, tuple[str, ...]]
"""`Task.key`: CPU milli, GPU milli, GPUs, GPU models."""


def typical_pods(tasks: Iterable[Task], threshold: float = POPULARITY_THRESHOLD) -> TypicalPods:
    """The artifact's `GetTypicalPods` (CPU pods included, step 1, no GPU weight): the most
    frequent shapes until they cover `threshold`% of pods, renormalised. Equal counts are
    ordered by shape, larger first, as its `sort.Reverse` does."""
    return typical_of_counts(Counter(t.key for t in tasks), threshold)


def typical_of_counts(
    counts: Mapping[Shape, int], threshold: float = POPULARITY_THRESHOLD
) -> TypicalPods:
    """`typical_pods` of a workload given as how many pods of each shape it holds."""
    total = sum(counts.values())
    if total == 0:
        raise ValueError("no pods to learn the target workload from")
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], _shape_order(kv[0])), reverse=True)
    expected = threshold * total / 100.0
    kept: list[tuple[Shape, int]] = []
    cum = 0.0
    for shape, count in ranked:
        if cum >= expected:
            break
        kept.append((shape, count))
        cum += count
    # with every shape kept the artifact does not renormalise (frag.go GetTypicalPods)
    norm = float(total) if len(kept) == len(ranked) else cum
    return TypicalPods(
        cpu=np.array([s[0] for s, _ in kept], dtype=np.int64),
        milli=np.array([s[1] if s[2] > 0 else 0 for s, _ in kept], dtype=np.int64),
        gpus=np.array([s[2] for s, _ in kept], dtype=np.int64),
        models=tuple(s[3] for s, _ in kept),
        freq=np.array([c / norm for _, c in kept], dtype=np.float64),
    )


def _shape_order(shape: Shape) -> tuple[int, int, int, str]:
    cpu, milli, gpus, models = shape
    return (cpu, milli, gpus, "|".join(models))


def node_frag(
    cpu_left: IntArray, gpu_left: IntArray, model: IntArray, typ: TypicalPods, access: BoolArray
) -> FloatArray:
    """Fragmentation (GPU milli) of B node states: `NodeGpuShareFragAmountScore`, vectorised."""
    total = gpu_left.sum(axis=1)
    fits = gpu_left[:, :, None] >= typ.milli[None, None, :]  # (B, G, K)
    enough = fits.sum(axis=1) >= typ.gpus[None, :]
    small = np.where(fits, 0, gpu_left[:, :, None]).sum(axis=1)  # milli too small per shape
    satisfied = (
        (typ.milli[None, :] > 0) & access[model] & enough & (cpu_left[:, None] >= typ.cpu[None, :])
    )
    frag = np.where(satisfied, small, total[:, None]).astype(np.float64)
    out: FloatArray = frag @ typ.freq
    return out


def fgd_score(delta: FloatArray) -> IntArray:
    """`int64(sigmoid(delta/1000) * 100)`: delta is the fragmentation removed (milli)."""
    out: IntArray = np.floor(100.0 / (1.0 + np.exp(-delta / 1000.0))).astype(np.int64)
    return out


def fgd_scores(
    state: ClusterState,
    task: Task,
    typ: TypicalPods,
    nodes: IntArray,
    access: BoolArray | None = None,
    before: FloatArray | None = None,
) -> tuple[IntArray, IntArray]:
    """FGD's integer score for `nodes` and, for a GPU share, the GPU it picks on each (the one
    with the best score, lowest index on ties; -1 otherwise). `before`: the nodes'
    fragmentation now, where known (`node_frag`)."""
    acc = typ.access(state) if access is None else access
    cpu = state.cpu_left[nodes]
    left = state.gpu_left[nodes]
    model = state.model[nodes]
    old = node_frag(cpu, left, model, typ, acc) if before is None else before
    gpu_pick = np.full(len(nodes), -1, dtype=np.int64)
    if task.is_share:
        b, g = np.nonzero(left >= task.gpu_milli)  # every (node, GPU) it could go to
        # GPUs of a node with as much left score alike: score the first (lowest index) of each
        _, first = np.unique(b * (MILLI + 1) + left[b, g], return_index=True)
        b, g = b[first], g[first]
        new_left = left[b].copy()
        new_left[np.arange(len(b)), g] -= task.gpu_milli
        new = node_frag(cpu[b] - task.cpu, new_left, model[b], typ, acc)
        cand = fgd_score(old[b] - new)
        scores = np.full(len(nodes), -1, dtype=np.int64)
        np.maximum.at(scores, b, cand)
        # the artifact keeps the first GPU among equal best scores (strict `>` in its loop)
        best = cand == scores[b]
        gpu_pick[:] = np.iinfo(np.int64).max
        np.minimum.at(gpu_pick, b[best], g[best])
        gpu_pick[scores < 0] = -1
        return scores, gpu_pick
    new_left = left.copy()
    if task.gpus > 0:
        # `NodeResource.Sub`: GPUs by milli left ascending (stable), first ones that fit
        order = np.argsort(left, axis=1, kind="stable")
        sorted_left = np.take_along_axis(left, order, axis=1)
        fits = sorted_left >= task.gpu_milli
        take = fits & (np.cumsum(fits, axis=1) <= task.gpus)
        np.put_along_axis(new_left, order, sorted_left - take * task.gpu_milli, axis=1)
    new = node_frag(cpu - task.cpu, new_left, model, typ, acc)
    return fgd_score(old - new), gpu_pick


class Fgd:
    """The FGD policy. Caches each task shape's scores per node and recomputes a node only
    after it changed (its `version`): one placement changes one node, so this keeps a run
    linear in pods rather than pods x nodes x GPUs x shapes."""

    def __init__(self, typ: TypicalPods) -> None:
        self.typical = typ
        self._state: ClusterState | None = None
        self._access: BoolArray | None = None
        self._cache: dict[
            tuple[int, int, int, tuple[str, ...]], tuple[IntArray, IntArray, IntArray]
        ] = {}
        self._frag: FloatArray = np.zeros(0)
        """Each node's fragmentation now, whatever the task, as of `_frag_seen` (its version)."""
        self._frag_seen: IntArray = np.zeros(0, dtype=np.int64)

    def __call__(
        self, state: ClusterState, task: Task, rng: np.random.Generator
    ) -> Placement | None:
        scores, gpus = self.scores(state, task)
        node = pick_max(scores, state.tie_rank)
        if node is None:
            return None
        if task.is_share:
            return Placement(node, (int(gpus[node]),))
        return Placement(node, exclusive_gpus(state.gpu_left[node], task))

    def scores(self, state: ClusterState, task: Task) -> tuple[IntArray, IntArray]:
        """Scores of every node (-1 where the task does not fit) and the share GPU picked."""
        if state is not self._state:
            # a new cluster: nothing cached holds (a strong reference keeps `is` meaningful)
            self._state, self._access, self._cache = state, self.typical.access(state), {}
            self._frag = np.zeros(state.n)
            self._frag_seen = np.full(state.n, -1, dtype=np.int64)
        assert self._access is not None
        entry = self._cache.get(task.key)
        if entry is None:
            entry = (
                np.full(state.n, -1, dtype=np.int64),
                np.full(state.n, -1, dtype=np.int64),
                np.full(state.n, -1, dtype=np.int64),
            )
            self._cache[task.key] = entry
        seen, scores, gpus = entry
        stale = np.flatnonzero(seen != state.version)
        if len(stale):
            # feasibility depends only on the node's own state, so it is cached with the
            # score; memory is not in the key (nor scored), hence checked at the end
            ok = state.feasible(replace(task, mem=0))[stale]
            todo = stale[ok]
            scores[stale] = -1
            gpus[stale] = -1
            if len(todo):
                s, g = fgd_scores(state, task, self.typical, todo, self._access, self._now(todo))
                scores[todo] = s
                gpus[todo] = g
            seen[stale] = state.version[stale]
        mem_ok = state.mem_left >= task.mem
        return np.where(mem_ok, scores, -1), gpus

    def _now(self, nodes: IntArray) -> FloatArray:
        """The fragmentation of `nodes` as they are (computed again for those that changed)."""
        state, frag, seen = self._state, self._frag, self._frag_seen
        assert state is not None and self._access is not None
        stale = nodes[seen[nodes] != state.version[nodes]]
        if len(stale):
            frag[stale] = node_frag(
                state.cpu_left[stale], state.gpu_left[stale], state.model[stale], self.typical,
                self._access,
            )  # fmt: skip
            seen[stale] = state.version[stale]
        out: FloatArray = frag[nodes]
        return out


class ClusterFrag:
    """Fragmentation of the whole cluster, kept per node and updated node by node."""

    def __init__(self, state: ClusterState, typ: TypicalPods) -> None:
        self.typical = typ
        self.access = typ.access(state)
        self.per_node = node_frag(state.cpu_left, state.gpu_left, state.model, typ, self.access)

    def update(self, state: ClusterState, node: int) -> None:
        sl = slice(node, node + 1)
        self.per_node[node] = node_frag(
            state.cpu_left[sl], state.gpu_left[sl], state.model[sl], self.typical, self.access
        )[0]

    def amount(self) -> float:
        return float(self.per_node.sum())

    def ratio(self, state: ClusterState) -> float:
        """Fragmented share of idle GPU milli, in % (the artifact's "Frag ratio (origin)")."""
        idle = float(self.typical.freq.sum()) * float(state.gpu_left.sum())
        return 100.0 * self.amount() / idle if idle > 0 else math.nan


__all__ = [
    "MILLI",
    "ClusterFrag",
    "Fgd",
    "TypicalPods",
    "fgd_score",
    "fgd_scores",
    "node_frag",
    "typical_of_counts",
    "typical_pods",
]

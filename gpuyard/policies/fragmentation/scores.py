"""The six placement policies of the openb artifact as pure functions.

Each scores every node with the integer (0..100) score of the artifact's kube-scheduler plugin
(`pkg/simulator/plugin/*_score.go`), -1 where the task does not fit; the highest wins, equal
best broken by the cluster's `tie_rank` (see `pick_max`). The GPU(s) on the node are then chosen as
the artifact's experiments configure it (`experiments/run_scripts/generate_run_scripts.py`):
random-fit draws a fitting GPU, FGD takes the GPU its score picked, the others best-fit.
A policy is `(state, task, rng) -> Placement | None`; it never changes `state`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .cluster import (
    MAX_SPEC_CPU,
    MAX_SPEC_GPU,
    MILLI,
    BoolArray,
    ClusterState,
    IntArray,
    Placement,
    Task,
    best_fit_gpu,
    pick_max,
    random_gpu,
)
from .fgd import Fgd, TypicalPods

Policy = Callable[[ClusterState, Task, np.random.Generator], Placement | None]
MAX_SCORE = 100

POLICY_NAMES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")


def _masked(scores: IntArray, ok: BoolArray) -> IntArray:
    out: IntArray = np.where(ok, scores, -1).astype(np.int64)
    return out


def best_fit_scores(state: ClusterState, task: Task) -> IntArray:
    """BestFitScore: 100 x (1 - mean of CPU and GPU milli left after placing, each over the
    largest node's: 128 CPUs, 8 GPUs); least left wins. (Its min-max NormalizeScore keeps
    the order and ties of scores within 0..100, so it is left out.)"""
    ok = state.feasible(task)
    free_cpu = (state.cpu_left - task.cpu) / MAX_SPEC_CPU * 0.5
    free_gpu = (state.gpu_left.sum(axis=1) - task.total_milli) / MAX_SPEC_GPU * 0.5
    score = np.floor((1.0 - (free_cpu + free_gpu)) * MAX_SCORE).astype(np.int64)
    return _masked(score, ok)


def dot_product_scores(state: ClusterState, task: Task) -> IntArray:
    """DotProductScore as run in the paper (dimExt "merge", norm "max"): 100 x (1 - the dot
    product of the node's free (CPU, GPU milli) and the request, both over 128 CPUs / 8 GPUs,
    halved); the smaller the product, the better."""
    ok = state.feasible(task)
    node_cpu = state.cpu_left / MAX_SPEC_CPU
    node_gpu = state.gpu_left.sum(axis=1) / MAX_SPEC_GPU
    dot = node_cpu * (task.cpu / MAX_SPEC_CPU) + node_gpu * (task.total_milli / MAX_SPEC_GPU)
    score = np.floor(MAX_SCORE * (1.0 - dot / 2.0)).astype(np.int64)
    return _masked(score, ok)


def gpu_packing_scores(state: ClusterState, task: Task) -> IntArray:
    """GpuPackingScore, in three tiers: a task that fits on partly used GPUs only scores
    50..100 (less milli left on them, higher); one that needs fully free GPUs of a partly used
    node 33..49; a fully free node 0..33 (fewer GPUs, higher). CPU-only tasks score 0."""
    ok = state.feasible(task)
    if task.gpus == 0:
        return _masked(np.zeros(state.n, dtype=np.int64), ok)
    left = state.gpu_left
    fully_free = (left == MILLI).sum(axis=1)
    idle_node = fully_free == state.gpu_count
    tier_idle = np.maximum(MAX_SCORE // 3 - fully_free, fully_free)
    # the GPUs it would use: fitting ones, least milli left first
    fits = np.where(left >= task.gpu_milli, left, MILLI + 1)
    chosen = np.sort(fits, axis=1)[:, : task.gpus]
    chosen = np.where(chosen > MILLI, 0, chosen)
    free_used = (chosen == MILLI).sum(axis=1)
    tier_new = np.maximum(MAX_SCORE // 2 - free_used, MAX_SCORE // 3)
    ratio = (chosen * 100 // MILLI).sum(axis=1)
    tier_shared = np.maximum(MAX_SCORE - ratio // 10, MAX_SCORE // 2)
    score = np.where(idle_node, tier_idle, np.where(free_used > 0, tier_new, tier_shared))
    return _masked(score.astype(np.int64), ok)


def gpu_clustering_scores(state: ClusterState, task: Task) -> IntArray:
    """GpuClusteringScore: keep GPU pods of one kind (share-gpu, 1-gpu, 2-gpu, ...) together.
    Tier 75..100: the node hosts only this kind; 50..75: this kind among others; 25..50: no GPU
    pod yet; 0..25: only other kinds; within a tier, more GPU milli used scores higher.
    CPU-only tasks score 0."""
    ok = state.feasible(task)
    if task.gpus == 0:
        return _masked(np.zeros(state.n, dtype=np.int64), ok)
    used = MAX_SPEC_GPU - state.gpu_left.sum(axis=1)
    base = (MAX_SCORE // 4) * used // MAX_SPEC_GPU
    kinds = (state.affinity > 0).sum(axis=1)
    same = state.affinity[:, task.affinity] > 0
    tier = np.where(same, np.where(kinds == 1, 3, 2), np.where(kinds == 0, 1, 0))
    return _masked((base + tier * (MAX_SCORE // 4)).astype(np.int64), ok)


def _with_best_fit_gpu(
    scores: IntArray, state: ClusterState, task: Task, rng: np.random.Generator
) -> Placement | None:
    node = pick_max(scores, state.tie_rank)
    if node is None:
        return None
    return Placement(node, best_fit_gpu(state.gpu_left[node], task) if task.gpus else ())


def random_fit(state: ClusterState, task: Task, rng: np.random.Generator) -> Placement | None:
    """RandomScore: a uniformly drawn node among those that fit, then a drawn GPU."""
    fits = np.flatnonzero(state.feasible(task))
    if len(fits) == 0:
        return None
    node = int(fits[rng.integers(len(fits))])
    return Placement(node, random_gpu(state.gpu_left[node], task, rng) if task.gpus else ())


def best_fit(state: ClusterState, task: Task, rng: np.random.Generator) -> Placement | None:
    return _with_best_fit_gpu(best_fit_scores(state, task), state, task, rng)


def dot_product(state: ClusterState, task: Task, rng: np.random.Generator) -> Placement | None:
    return _with_best_fit_gpu(dot_product_scores(state, task), state, task, rng)


def gpu_packing(state: ClusterState, task: Task, rng: np.random.Generator) -> Placement | None:
    return _with_best_fit_gpu(gpu_packing_scores(state, task), state, task, rng)


def gpu_clustering(state: ClusterState, task: Task, rng: np.random.Generator) -> Placement | None:
    return _with_best_fit_gpu(gpu_clustering_scores(state, task), state, task, rng)


def make_policy(name: str, typical: TypicalPods | None = None) -> Policy:
    """A policy by name (`POLICY_NAMES`); FGD needs the target workload."""
    simple: dict[str, Policy] = {
        "random": random_fit,
        "dotprod": dot_product,
        "gpuclustering": gpu_clustering,
        "gpupacking": gpu_packing,
        "bestfit": best_fit,
    }
    if name in simple:
        return simple[name]
    if name == "fgd":
        if typical is None:
            raise ValueError("FGD needs the target workload (typical pods)")
        return Fgd(typical)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")

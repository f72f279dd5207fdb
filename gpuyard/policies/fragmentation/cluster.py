"""Node state of a GPU-sharing cluster as numpy arrays, and the `Task` (one pod's request).

The model is the one of Alibaba's openb simulator (hkust-adsl/kubernetes-scheduler-simulator,
`pkg/type/resource.go`, `pkg/type/open-gpu-share/cache/gpunodeinfo.go`): a node has CPU milli,
memory MiB and up to 8 GPUs of one model, each GPU with 1000 milli; a task asks CPU milli, memory
MiB and either whole GPUs (`gpu_milli == 1000`, `gpus >= 1`) or a share of one GPU
(`gpus == 1`, `0 < gpu_milli < 1000`), optionally restricted to some GPU models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

MILLI = 1000  # milli of one GPU
MAX_SPEC_CPU = 128_000  # the artifact's normaliser for CPU milli (utils/const.go MaxSpecCpu)
MAX_SPEC_GPU = 8_000  # the artifact's normaliser for GPU milli (MaxSpecGpu: 8 GPUs)
SHARE_TAG = 0  # column of the GPU-affinity counts for GPU-sharing pods; column k is "k-gpu"

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Task:
    """One pod's request. `models` empty means any GPU model (the trace's empty `gpu_spec`)."""

    cpu: int
    mem: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gpus < 0 or not 0 <= self.gpu_milli <= MILLI:
            raise ValueError(f"bad GPU request: {self.gpus} x {self.gpu_milli}m")
        if self.gpus > 1 and self.gpu_milli < MILLI:
            # the artifact panics on this too (open_gpu_share.go allocateGpuId)
            raise ValueError("a fractional GPU request must ask for exactly one GPU")
        if self.gpus > 0 and self.gpu_milli == 0:
            raise ValueError("a GPU request needs gpu_milli > 0")

    @property
    def is_share(self) -> bool:
        """Shares one GPU with others (the artifact's `IsGpuShare`)."""
        return self.gpus == 1 and self.gpu_milli < MILLI

    @property
    def total_milli(self) -> int:
        return self.gpus * self.gpu_milli

    @property
    def affinity(self) -> int:
        """Column in `ClusterState.affinity` (-1: no GPU): share-gpu or k-gpu."""
        if self.gpus == 0:
            return -1
        return SHARE_TAG if self.is_share else self.gpus

    @property
    def key(self) -> tuple[int, int, int, tuple[str, ...]]:
        """What placement scores depend on (memory is only filtered, never scored)."""
        return (self.cpu, self.gpu_milli, self.gpus, self.models)


@dataclass(frozen=True)
class Placement:
    node: int
    gpus: tuple[int, ...] = ()


@dataclass
class ClusterState:
    """Free resources per node. Padding GPUs (nodes with fewer than `gpu_left.shape[1]` GPUs)
    have 0 milli left: they can host nothing and add nothing to sums or fragmentation."""

    cpu_cap: IntArray
    cpu_left: IntArray
    mem_left: IntArray
    gpu_left: IntArray  # (nodes, max GPUs) milli left per GPU
    gpu_count: IntArray
    model: IntArray  # index into `models`, -1 for a node without GPUs
    models: tuple[str, ...]
    affinity: IntArray = field(init=False)  # (nodes, 9) GPU pods per tag, for GPU clustering
    version: IntArray = field(init=False)  # bumped per change: lets scorers cache per node
    tie_rank: IntArray = field(init=False)  # order among equal scores, lowest first

    def __post_init__(self) -> None:
        n = len(self.cpu_left)
        self.affinity = np.zeros((n, 9), dtype=np.int64)
        self.version = np.zeros(n, dtype=np.int64)
        self.tie_rank = np.arange(n, dtype=np.int64)

    @classmethod
    def from_nodes(
        cls,
        cpu: Sequence[int],
        mem: Sequence[int],
        gpus: Sequence[int],
        models: Sequence[str],
    ) -> ClusterState:
        gpu_count = np.asarray(gpus, dtype=np.int64)
        width = max(1, int(gpu_count.max()) if len(gpu_count) else 1)
        gpu_left = np.where(np.arange(width)[None, :] < gpu_count[:, None], MILLI, 0).astype(
            np.int64
        )
        names = tuple(sorted({m for m, g in zip(models, gpus, strict=True) if g > 0 and m}))
        index = {m: i for i, m in enumerate(names)}
        model = np.array(
            [index.get(m, -1) if g > 0 else -1 for m, g in zip(models, gpus, strict=True)],
            dtype=np.int64,
        )
        cpu_arr = np.asarray(cpu, dtype=np.int64)
        return cls(
            cpu_cap=cpu_arr.copy(),
            cpu_left=cpu_arr.copy(),
            mem_left=np.asarray(mem, dtype=np.int64).copy(),
            gpu_left=gpu_left,
            gpu_count=gpu_count,
            model=model,
            models=names,
        )

    @property
    def n(self) -> int:
        return len(self.cpu_left)

    def copy(self) -> ClusterState:
        out = ClusterState(
            self.cpu_cap.copy(),
            self.cpu_left.copy(),
            self.mem_left.copy(),
            self.gpu_left.copy(),
            self.gpu_count.copy(),
            self.model.copy(),
            self.models,
        )
        out.affinity = self.affinity.copy()
        out.version = self.version.copy()
        out.tie_rank = self.tie_rank.copy()
        return out

    def total_gpu_milli(self) -> int:
        return int(self.gpu_count.sum()) * MILLI

    def used_gpu_milli(self) -> int:
        return self.total_gpu_milli() - int(self.gpu_left.sum())

    def model_ok(self, models: tuple[str, ...]) -> BoolArray:
        """Nodes whose GPU model a request accepts (`IsNodeAccessibleToPodByType`)."""
        if not models:
            return np.ones(self.n, dtype=np.bool_)
        wanted = [self.models.index(m) for m in models if m in self.models]
        return np.isin(self.model, np.asarray(wanted, dtype=np.int64)) & (self.model >= 0)

    def feasible(self, task: Task) -> BoolArray:
        """The artifact's filters: CPU and memory (kube NodeResourcesFit), GPU model and enough
        GPUs with `gpu_milli` left (Open-Gpu-Share `Filter`)."""
        ok = (self.cpu_left >= task.cpu) & (self.mem_left >= task.mem)
        if task.gpus > 0:
            ok &= self.model_ok(task.models)
            ok &= (self.gpu_left >= task.gpu_milli).sum(axis=1) >= task.gpus
        return ok

    def allocate(self, task: Task, placement: Placement) -> None:
        node = placement.node
        if len(placement.gpus) != task.gpus:
            raise ValueError(f"{task} needs {task.gpus} GPUs, got {placement.gpus}")
        self.cpu_left[node] -= task.cpu
        self.mem_left[node] -= task.mem
        for g in placement.gpus:
            if self.gpu_left[node, g] < task.gpu_milli:
                raise ValueError(f"GPU {g} of node {node} lacks {task.gpu_milli}m")
            self.gpu_left[node, g] -= task.gpu_milli
        if self.cpu_left[node] < 0 or self.mem_left[node] < 0:
            raise ValueError(f"node {node} over-committed by {task}")
        if task.affinity >= 0:
            self.affinity[node, task.affinity] += 1
        self.version[node] += 1


def exclusive_gpus(left: IntArray, task: Task) -> tuple[int, ...]:
    """Whole GPUs for a task: the first fully free ones by index (`AllocateExclusiveGpuId`)."""
    free = np.flatnonzero(left == MILLI)[: task.gpus]
    return tuple(int(g) for g in free)


def best_fit_gpu(left: IntArray, task: Task) -> tuple[int, ...]:
    """The artifact's default GPU choice ("best"): for a share, the GPU with least milli left
    that fits, lowest index on ties; whole GPUs as `exclusive_gpus`."""
    if not task.is_share:
        return exclusive_gpus(left, task)
    fits = np.where(left >= task.gpu_milli, left, MILLI + 1)
    return (int(np.argmin(fits)),)


def random_gpu(left: IntArray, task: Task, rng: np.random.Generator) -> tuple[int, ...]:
    """The "random" GPU choice (random-fit policy): a uniformly drawn GPU that fits."""
    if not task.is_share:
        return exclusive_gpus(left, task)
    fits = np.flatnonzero(left >= task.gpu_milli)
    return (int(fits[rng.integers(len(fits))]),)


def pick_max(scores: IntArray, tie_rank: IntArray) -> int | None:
    """The node with the highest score (-1: does not fit). Among equal best, the lowest
    `tie_rank`: the artifact's kube-scheduler fork picks the smallest node name (its
    `selectHost`), and the simulator prefixes node names with a seeded random permutation
    (`syncClusterResourceList`). None when nothing fits."""
    best = int(scores.max()) if len(scores) else -1
    if best < 0:
        return None
    tied = np.flatnonzero(scores == best)
    if len(tied) == 1:
        return int(tied[0])
    return int(tied[np.argmin(tie_rank[tied])])

"""The openb artifact's experiment: feed a shuffled, re-sampled trace to a policy, one pod at a
time, until 130% of the cluster's GPU capacity has arrived, and record after each pod the GPU
allocation ratio and the fragmentation ratio (`pkg/simulator/core.go`, `simulator.go`
`SortClusterPods`/`TunePodsByNodeTotalResource`/`SchedulePods`, `analysis.go`
`ClusterGpuFragReport`, `experiments/analysis/merge_alloc_discrete.py`).

Pods never end: a pod that fits nowhere fails and the next one arrives. The curves are read at
whole percents of arrived workload as the artifact's analysis does: the mean over the pods whose
arrived share rounds to that percent (or, where none does, to within one percent).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .cluster import MILLI, ClusterState, FloatArray, IntArray, Task
from .fgd import ClusterFrag, TypicalPods, typical_pods
from .scores import make_policy

TUNE_RATIO = 1.3  # the paper's runs: arrived GPU requests up to 130% of capacity
PAPER_SEEDS = tuple(range(42, 52))  # the artifact's 10 repeats (-tuneseed 42..51)


@dataclass(frozen=True)
class Trace:
    """A pod list: names and one `Task` each, in the CSV's order."""

    names: tuple[str, ...]
    tasks: tuple[Task, ...]

    def __len__(self) -> int:
        return len(self.tasks)


def read_pods(path: str | Path) -> Trace:
    """openb pod CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...), converted as
    the artifact's `data/pod_csv_to_yaml.py` does: GPU milli only with num_gpu > 0, clipped to
    1000; `gpu_spec` split on `|`."""
    df = pd.read_csv(path, dtype={"gpu_spec": str})
    specs = df["gpu_spec"].fillna("") if "gpu_spec" in df else pd.Series([""] * len(df))
    tasks = []
    for cpu, mem, num, milli, spec in zip(
        df["cpu_milli"], df["memory_mib"], df["num_gpu"], df["gpu_milli"], specs, strict=True
    ):
        gpus = int(num)
        m = min(int(milli), MILLI) if gpus > 0 and milli > 0 else 0
        if gpus > 0 and m == 0:
            gpus = 0  # no milli means no GPU annotation: the artifact sees a CPU pod
        models = tuple(x for x in str(spec).split("|") if x)
        tasks.append(Task(cpu=int(cpu), mem=int(mem), gpus=gpus, gpu_milli=m, models=models))
    return Trace(tuple(str(n) for n in df["name"]), tuple(tasks))


def read_nodes(path: str | Path) -> ClusterState:
    """openb node CSV (sn,cpu_milli,memory_mib,gpu,model)."""
    df = pd.read_csv(path, dtype={"model": str})
    models = [str(m) if isinstance(m, str) else "" for m in df["model"]]
    return ClusterState.from_nodes(
        [int(x) for x in df["cpu_milli"]],
        [int(x) for x in df["memory_mib"]],
        [int(x) for x in df["gpu"]],
        models,
    )


def arrival_order(
    trace: Trace, capacity_milli: int, seed: int, tune_ratio: float = TUNE_RATIO
) -> IntArray:
    """Indices into `trace` in arrival order: pods sorted by name and shuffled, then trimmed by
    random removals or extended by random draws (with replacement, appended after the
    shuffled ones) until their GPU requests reach `tune_ratio` x capacity. The draw-up stops at
    the first draw whose per-GPU milli would overshoot, as the artifact's `tuneUpPods` does."""
    rng = np.random.default_rng(seed)
    by_name = np.array(sorted(range(len(trace)), key=lambda i: trace.names[i]), dtype=np.int64)
    order = list(by_name[rng.permutation(len(by_name))])
    milli = np.array([t.total_milli for t in trace.tasks], dtype=np.int64)
    total = int(milli.sum())
    target = tune_ratio * capacity_milli
    if tune_ratio <= 0:
        return np.asarray(order, dtype=np.int64)
    while total > target and order:
        total -= int(milli[order.pop(int(rng.integers(len(order))))])
    if total < target:
        while True:
            i = int(by_name[rng.integers(len(by_name))])
            if total + trace.tasks[i].gpu_milli > target:
                break
            total += int(milli[i])
            order.append(i)
    return np.asarray(order, dtype=np.int64)


def at_levels(arrived: FloatArray, values: FloatArray, levels: Sequence[int]) -> dict[int, float]:
    """`values` read at arrived-workload levels (%; `arrived`: shares of the capacity) as the
    artifact's `merge_alloc_discrete.py` reads them: arrived % rounded to a whole percent (half
    to even, as pandas' round), the mean at the exact level, else within one percent."""
    arrive = np.round(arrived * 100.0, 0)
    out: dict[int, float] = {}
    for lv in levels:
        hit = arrive == lv
        if not hit.any():
            hit = (arrive >= lv - 1) & (arrive <= lv + 1)
        if hit.any():
            out[lv] = round(float(values[hit].mean()), 2)
    return out


@dataclass(frozen=True)
class RunResult:
    """Per arrived pod: cumulative GPU milli arrived, GPU milli allocated, fragmentation."""

    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: IntArray
    used_milli: IntArray
    frag_ratio: FloatArray  # % of idle GPU milli that is fragmented
    frag_milli: FloatArray
    failed: int
    seconds: float

    def _at(self, values: FloatArray, levels: Sequence[int]) -> dict[int, float]:
        return at_levels(self.arrived_milli / self.capacity_milli, values, levels)

    def allocation(self, levels: Sequence[int]) -> dict[int, float]:
        """GPU allocation ratio (%) at arrived-workload levels (% of GPU capacity)."""
        alloc = np.round(self.used_milli / self.capacity_milli * 100.0, 2)
        return self._at(alloc, levels)

    def fragmentation(self, levels: Sequence[int]) -> dict[int, float]:
        """Fragmentation ratio (%) at arrived-workload levels."""
        return self._at(self.frag_ratio, levels)

    @property
    def final_allocation(self) -> float:
        return 100.0 * float(self.used_milli[-1]) / self.capacity_milli


def run(
    policy: str,
    trace: Trace,
    nodes: ClusterState,
    seed: int,
    tune_ratio: float = TUNE_RATIO,
    typical: TypicalPods | None = None,
) -> RunResult:
    """One run of `policy` on a fresh copy of `nodes`. The workload (order and re-sampling)
    depends on the seed only, so every policy sees the same pods for a seed; random-fit's draws
    and the node order that breaks equal scores come from further streams of the same seed."""
    started = time.perf_counter()
    state = nodes.copy()
    target = typical if typical is not None else typical_pods(trace.tasks)
    choose = make_policy(policy, target)
    capacity = state.total_gpu_milli()
    order = arrival_order(trace, capacity, seed, tune_ratio)
    rng = np.random.default_rng([seed, 1])
    # the artifact's node names get a seeded random prefix, and equal scores go to the
    # smallest name: a fixed random node order per seed
    state.tie_rank = np.random.default_rng([seed, 2]).permutation(state.n).astype(np.int64)
    frag = ClusterFrag(state, target)
    n = len(order)
    arrived = np.zeros(n, dtype=np.int64)
    used = np.zeros(n, dtype=np.int64)
    ratio = np.zeros(n, dtype=np.float64)
    amount = np.zeros(n, dtype=np.float64)
    total_arrived = 0
    total_used = state.used_gpu_milli()
    failed = 0
    for step, i in enumerate(order):
        task = trace.tasks[int(i)]
        total_arrived += task.total_milli
        placement = choose(state, task, rng)
        if placement is None:
            failed += 1
        else:
            state.allocate(task, placement)
            total_used += task.total_milli
            frag.update(state, placement.node)
        arrived[step] = total_arrived
        used[step] = total_used
        amount[step] = frag.amount()
        ratio[step] = frag.ratio(state)
    return RunResult(
        policy=policy,
        seed=seed,
        capacity_milli=capacity,
        arrived_milli=arrived,
        used_milli=used,
        frag_ratio=ratio,
        frag_milli=amount,
        failed=failed,
        seconds=time.perf_counter() - started,
    )

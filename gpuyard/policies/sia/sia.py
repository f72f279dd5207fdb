"""Sia's policy (SOSP '23, `sia-simulator/sia.py` of its artifact, its `run_experiment.sh`
settings: p = -0.5, lambda_n = 1.1, throughputs projected to unprofiled GPU types, the most
GPUs shared across types): every round, each job gets at most one configuration (GPU type,
nodes, GPUs), chosen by the program of `ilp` over the costs of `costs`.

What the policy knows of a job's goodput on a GPU type is the goodput hints the job reported
while it ran on that type (`JobView.goodput`, kept per type in the policy's state); the
gradient statistics are the latest, whatever the type. Differences from the reference are in
docs/fidelity.md § Sia.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import msgspec
import numpy as np
from msgspec import Struct

from gpuyard.shared.goodput import Application, GoodputFunction
from gpuyard.shared.model import Allocation, GoodputHints, JobSpec
from gpuyard.shared.policy import JobView, Needs, SchedulingInput, SchedulingPolicy
from gpuyard.shared.typed_goodput import SIA_DEFAULT_RESTORE_S, SIA_RESTORE_S, TypedProfiles

from .costs import costs, docked, normalised_row, restart_factor
from .ilp import MAX_JOB_GPUS, Configurations, Solution, configurations, solve

RESTART_PENALTY_S = {
    "deepspeech2": 25.0,
    "imagenet": 250.0,
    "cifar10": 30.0,
    "bert": 120.0,
    "yolov3": 45.0,
}
"""The restart penalty per model in the restart factor (the reference's get_restart_penalty,
measured on its cluster); others: `default_restart_penalty_s`."""


class SiaParams(Struct, forbid_unknown_fields=True):
    profiles: str = ""
    """The folder of the models' per-GPU-type profiles (the artifact's `traces/`)."""
    profile_names: dict[str, str] = {}
    """GPU type -> the suffix of its profile files (`placements-<suffix>.csv`), if not its name."""
    power: float = -0.5
    """p: the fairness exponent of the costs (p < 0: minimise; p > 0: maximise)."""
    lambda_n: float = 1.1
    """The cost of leaving a job without GPUs (above 1, a job's least useful configuration)."""
    restart_penalty_s: dict[str, float] = msgspec.field(
        default_factory=lambda: dict(RESTART_PENALTY_S)
    )
    default_restart_penalty_s: float = 30.0
    restore_s: dict[str, float] = msgspec.field(default_factory=lambda: dict(SIA_RESTORE_S))
    default_restore_s: float = SIA_DEFAULT_RESTORE_S
    hold_restoring: bool = True
    """A job still restoring after its last (re)start keeps its configuration."""
    project: bool = True
    """Bootstrapping: project a job's goodput to the GPU types it never ran on."""
    max_gpus: int = MAX_JOB_GPUS
    max_nodes: dict[str, int] = {}
    """The most nodes of a type one job spans (the artifact's profiled-node limits), if any."""
    decimals: int = 2
    """The costs' rounding (the reference's); the program's integers are costs x 10^decimals."""
    time_limit_s: float = 10.0
    deterministic_limit: float = 0.5
    """CP-SAT's limit in its deterministic time units (about seconds of one core)."""
    workers: int = 1
    seed: int = 0
    relative_gap: float = 1e-4
    """Stop once proved within this relative gap (the reference's CBC setting); 0: optimal."""


class SiaState(Struct, kw_only=True):
    """The goodput hints each job reported on each GPU type it ran on."""

    hints: dict[str, dict[str, GoodputHints]] = {}


class Sia(SchedulingPolicy):
    """Sia (SOSP '23): heterogeneity-aware goodput scheduling over (GPU type, nodes, GPUs)
    configurations. Registry name `sia`."""

    Params = SiaParams
    State = SiaState
    needs = Needs(nodes=True)

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        if not self.params.profiles:
            raise ValueError("Sia needs profiles=FOLDER (the models' per-GPU-type profiles)")
        self.profiles = TypedProfiles(self.params.profiles, self.params.profile_names)
        self.state = SiaState()
        self.last: Solution | None = None
        """The last decision's solution (for inspection and tests)."""
        self.last_costs: np.ndarray | None = None
        """The last decision's cost matrix (jobs in submission order x configurations)."""

    def snapshot(self) -> SiaState:
        return self.state

    def restore(self, state: SiaState) -> None:
        self.state = state

    def accepts(self, spec: JobSpec) -> JobSpec | str:
        if not self.profiles.has(spec.job_type):
            return f"no profile of model {spec.job_type!r} in {self.params.profiles}"
        most = 1 if spec.job_type == "ncf" else self.params.max_gpus
        asked = min(max(spec.num_gpus, 1), most)
        return super().accepts(
            msgspec.structs.replace(spec, num_gpus=asked, min_gpus=1, max_gpus=most)
        )

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        return inp.now + inp.cluster.round_s if inp.jobs else None

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        params: SiaParams = self.params
        shape = cluster_shape(inp)
        jobs = sorted(inp.jobs, key=lambda j: (j.submit_time, j.seq))
        self._remember(jobs)
        if not jobs or not shape:
            return []
        configs = configurations(shape, params.max_gpus, params.max_nodes)
        matrix = np.empty((len(jobs), len(configs)))
        forced: dict[int, int] = {}
        hint: list[int] = []
        values_all, unknown_all = self.goodput_rows(jobs, configs, shape)
        for i, job in enumerate(jobs):
            current = (
                configs.index(job.gpu_type, job.gpus) if job.running and job.gpu_type else None
            )
            hint.append(-1 if current is None else current)
            model = job.spec.job_type
            values = normalised_row(values_all[i], unknown_all[i], configs)
            restarts = max(job.record.attempt - 1, 0)
            penalty = params.restart_penalty_s.get(model, params.default_restart_penalty_s)
            factor = restart_factor(job.now - job.submit_time, restarts, penalty)
            values = docked(values, current, factor)
            matrix[i] = costs(values, params.power, params.decimals)
            restore = params.restore_s.get(model, params.default_restore_s)
            if (
                params.hold_restoring
                and current is not None
                and job.now - job.record.run_start < restore
            ):
                forced[i] = current
        solution = solve(
            matrix, configs, params.lambda_n, maximise=params.power > 0, forced=forced,
            hint=hint, decimals=params.decimals, time_limit_s=params.time_limit_s,
            deterministic_limit=params.deterministic_limit, workers=params.workers,
            seed=params.seed, relative_gap=params.relative_gap,
        )  # fmt: skip
        self.last = solution
        self.last_costs = matrix
        kept: list[Allocation] = []
        moved: list[Allocation] = []
        for i, job in enumerate(jobs):
            c = int(solution.choice[i])
            if c < 0:
                continue
            alloc = Allocation(
                job.job_id, int(configs.gpus[c]), gpu_type=configs.types[configs.type_index[c]]
            )
            (kept if c == hint[i] else moved).append(alloc)
        return [*kept, *moved]

    def _remember(self, jobs: Sequence[JobView]) -> None:
        """Keep the hints each job reports under the GPU type it runs on; forget ended jobs."""
        known = {j.job_id for j in jobs}
        hints = {k: v for k, v in self.state.hints.items() if k in known}
        for job in jobs:
            if job.running and job.gpu_type and job.goodput is not None:
                hints[job.job_id] = {**hints.get(job.job_id, {}), job.gpu_type: job.goodput}
        self.state = SiaState(hints=hints)

    def goodput_row(
        self, job: JobView, configs: Configurations, shape: Mapping[str, tuple[int, int]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """One job's row of `goodput_rows`."""
        rows, unknown = self.goodput_rows([job], configs, shape)
        return rows[0], unknown[0]

    def goodput_rows(
        self, jobs: Sequence[JobView], configs: Configurations, shape: Mapping[str, tuple[int, int]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each job's goodput on each configuration (NaN where it may not use it) and the GPU
        types where it has none at all (`costs.normalised_row`'s input). Evaluated in batches,
        one per (model, GPU type measured on, batch limit): see `_batch_goodput`."""
        params: SiaParams = self.params
        rows = np.full((len(jobs), len(configs)), np.nan)
        unknown = np.zeros((len(jobs), len(configs.types)), dtype=bool)
        # (model, measured on, batch limit) -> [(job, columns, nodes, GPUs, factor, hints, grads)]
        batches: dict[tuple[str, str, int], list[_Request]] = {}
        for i, job in enumerate(jobs):
            model = job.spec.job_type
            typed = self.state.hints.get(job.job_id, {})
            latest = job.goodput or next(iter(typed.values()), None)
            apps = {t: self.profiles.app(model, t) for t in configs.types}
            if model == "ncf":  # (the reference runs NCF on one GPU)
                most = 1
            else:
                # The most GPUs: twice the most it ran on (at least 1), the largest over types.
                most = max(
                    min(
                        max(2 * (typed[t].max_profiled_replicas if t in typed else 0), 1),
                        params.max_gpus,
                        app.max_batch_size // app.min_local_bsz,
                    )
                    for t, app in apps.items()
                )
            source = next((t for t in configs.types if t in typed), None)
            for ti, gpu_type in enumerate(configs.types):
                cols = np.flatnonzero((configs.type_index == ti) & (configs.gpus <= most))
                if latest is None or cols.size == 0:
                    unknown[i, ti] = True
                    continue
                gpus = configs.gpus[cols]
                if gpu_type in typed:
                    on, nodes, factor = gpu_type, configs.nodes[cols], 1.0
                elif params.project and source is not None:
                    # Bootstrapping: as on `source` (its own nodes for these GPUs), scaled by
                    # the ratio of the two types' one-GPU throughputs.
                    on, nodes = source, -(-gpus // shape[source][1])
                    factor = self.profiles.one_gpu_rate(
                        model, gpu_type
                    ) / self.profiles.one_gpu_rate(model, source)
                else:
                    unknown[i, ti] = True
                    continue
                limit = max(
                    job.spec.batch_size or apps[on].max_batch_size, apps[on].init_batch_size
                )
                batches.setdefault((model, on, limit), []).append(
                    _Request(i, cols, nodes, gpus, factor, typed[on].perf, latest)
                )
        for (model, on, limit), requests in batches.items():
            found = _batch_goodput(self.profiles.app(model, on), limit, requests)
            for r, values in zip(requests, found, strict=True):
                rows[r.job, r.cols] = r.factor * values
        return rows, unknown


class _Request(NamedTuple):
    job: int
    cols: np.ndarray
    nodes: np.ndarray
    gpus: np.ndarray
    factor: float
    perf: tuple[float, ...]
    latest: GoodputHints


def _batch_goodput(app: Application, limit: int, requests: Sequence[_Request]) -> list[np.ndarray]:
    """The best goodput (over batch sizes up to `limit`) of each request's configurations on
    `app`'s GPU type, all requests in one `GoodputFunction.optimize` call: its parameters may be
    arrays, one entry per (job, configuration), since the model is elementwise numpy."""
    sizes = [len(r.cols) for r in requests]
    perf = np.repeat(np.asarray([r.perf for r in requests], dtype=float), sizes, axis=0)
    grads = np.repeat(
        np.asarray([(r.latest.grad_sqr, r.latest.grad_var) for r in requests], dtype=float),
        sizes,
        axis=0,
    )
    fn = GoodputFunction(list(perf.T), list(grads.T), app.init_batch_size)
    found = fn.optimize(
        np.concatenate([r.nodes for r in requests]).astype(float),
        np.concatenate([r.gpus for r in requests]).astype(float),
        max_batch_size=limit,
        atomic_bsz_range=(app.min_local_bsz, app.max_local_bsz),
        accumulation=True,
    )[0]
    return np.split(np.asarray(found, dtype=float), np.cumsum(sizes)[:-1])


def cluster_shape(inp: SchedulingInput) -> dict[str, tuple[int, int]]:
    """{GPU type: (nodes up, GPUs a node)} in the cluster's order of types; from the GPUs per
    type at 8 a node where the service gave no nodes."""
    shape: dict[str, tuple[int, int]] = {}
    nodes = [n for n in inp.cluster.nodes if n.up and n.num_gpus > 0]
    if nodes:
        for n in nodes:
            count, per = shape.get(n.gpu_type, (0, 0))
            shape[n.gpu_type] = (count + 1, max(per, n.num_gpus))
    else:
        for gpu_type, gpus in inp.cluster.capacity.items():
            if gpus > 0:
                shape[gpu_type] = (math.ceil(gpus / 8), min(gpus, 8))
    return shape

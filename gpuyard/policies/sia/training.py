"""A job's training on a heterogeneous cluster as Sia's simulator advances it
(`sia-simulator/job.py`): the building block of a simulation that reproduces Sia's artifact.

Unlike Pollux's simulator (`gpuyard.shared.goodput.GoodputJob`, which this extends), a job has one
profile per GPU type (`placements-<type>.csv`), keeps one step-time profile and fitted model per
type it ran on (the gradient statistics are the job's, whatever the type), chooses its per-GPU
batch within what its placement fits in memory, and progresses at its goodput times a per-model
calibration factor (the artifact's SLOWDOWNS: real runs were slower than its simulator). Its
restart delay is its model's (`sia.RESTORE_S`).
"""

from __future__ import annotations

import math

from gpuyard.shared.goodput import EPS, GoodputJob, PerfParams
from gpuyard.shared.model import GoodputHints

from .profiles import TypedProfiles
from .sia import RESTORE_S

SLOWDOWNS = {
    "cifar10": 1.8,
    "imagenet": 1.2,
    "yolov3": 1.2,
    "bert": 1.2,
    "deepspeech2": 1.2,
    "ncf": 1.5,
}
"""How much slower each model ran on the artifact's real cluster than in its simulator
(`simulator_config.SLOWDOWNS`): progress is goodput / slowdown."""


class TypedGoodputJob(GoodputJob):
    """One job of `model`, on the GPU types of `profiles` (see the module doc)."""

    def __init__(
        self, profiles: TypedProfiles, model: str, gpu_types: tuple[str, ...],
        *, target_batch_size: int | None = None, slowdown: float | None = None,
        restart_s: float | None = None,
    ) -> None:  # fmt: skip
        self.profiles = profiles
        self.model = model
        self.apps = {t: profiles.app(model, t) for t in gpu_types}
        super().__init__(
            self.apps[gpu_types[0]], target_batch_size,
            restart_s=restart_s if restart_s is not None else RESTORE_S.get(model, 30.0),
        )  # fmt: skip
        self.calibration = 1.0 / (slowdown if slowdown is not None else SLOWDOWNS.get(model, 1.0))
        self.gpu_type: str | None = None
        self._profiles: dict[str, dict[tuple[int, int, int], tuple[float, float]]] = {
            t: {} for t in gpu_types
        }
        self._perf: dict[str, PerfParams | None] = dict.fromkeys(gpu_types)

    def move(self, gpu_type: str | None, placement: tuple[int, ...]) -> None:
        """Run on `placement` (GPUs per node) of `gpu_type` from now, restarting (a change of
        type always restarts); empty: release the GPUs."""
        if placement and gpu_type is not None and gpu_type != self.gpu_type:
            if self.gpu_type is not None:
                self._perf[self.gpu_type] = self.perf_params
            self.gpu_type = gpu_type
            self.app = self.apps[gpu_type]
            self.profile = self._profiles[gpu_type]  # (the same dict: steps add to it)
            self.perf_params = self._perf[gpu_type]
            self.placement = ()  # a new type: a restart even with the same shape
        if placement and tuple(placement) == self.placement:
            return
        self.reallocate(tuple(placement))

    def step(self, seconds: float, interference: float = 0.0) -> float | None:
        # The calibration scales goodput exactly as the reference's (1 - interference) does.
        return super().step(seconds, 1.0 - (1.0 - interference) * self.calibration)

    def hints_on(self, gpu_type: str) -> GoodputHints | None:
        """The hints it would report about `gpu_type` (None: never ran there)."""
        perf = self.perf_params if gpu_type == self.gpu_type else self._perf.get(gpu_type)
        if perf is None or self.grad_params is None:
            return None
        profile = self._profiles[gpu_type]
        return GoodputHints(
            tuple(float(v) for v in perf),  # type: ignore[arg-type]
            float(self.grad_params.sqr), float(self.grad_params.var),
            max((k[1] for k in profile), default=0), self.batch_size,
        )  # fmt: skip

    def _update_local_bsz(self, placement: tuple[int, ...]) -> None:
        """The reference's choice (`job.py` update_local_bsz): the goodput-best batch with the
        per-GPU batch capped by what this placement fits, then by what the same number of GPUs
        was profiled with."""
        app = self.app
        nonempty = tuple(filter(None, placement))
        num_nodes, num_replicas = len(nonempty), sum(nonempty)
        assert self.gpu_type is not None
        most_local = self.profiles.max_local_bsz(self.model, self.gpu_type, nonempty)
        batch_size = self.target_batch_size
        if batch_size is None and self.perf_params is None:
            batch_size = max(app.init_batch_size, app.min_local_bsz * num_replicas)
        if batch_size is None:
            _, self.atomic_bsz, self.accum_steps = self.goodput_fn().optimize(
                num_nodes, num_replicas, app.max_batch_size, (app.min_local_bsz, most_local),
                accumulation=True,
            )  # fmt: skip
        else:
            local_bsz = math.ceil(batch_size / num_replicas - EPS)
            self.accum_steps = math.ceil(local_bsz / most_local - EPS) - 1
            if num_replicas == 1 and batch_size > app.init_batch_size:
                self.accum_steps = max(1, self.accum_steps)
            self.atomic_bsz = math.ceil(local_bsz / (self.accum_steps + 1) - EPS)
        cap = self.profiles.replica_bsz_cap(self.model, self.gpu_type, num_replicas)
        if cap is not None:
            self.atomic_bsz = min(self.atomic_bsz, cap)
        count = num_replicas * (self.accum_steps + 1)
        self.atomic_bsz = min(self.atomic_bsz, int(app.max_batch_size / count))

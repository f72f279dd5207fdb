"""Goodput jobs on a heterogeneous cluster, as Sia's artifact simulates them (SOSP '23,
siasosp23/artifacts `sia-simulator/`: `applications.py`, `job.py`; no licence: read, not copied).

- `TypedProfiles`: each model's profiles per GPU type, in the artifact's layout (`<model>/
  placements-<type>.csv` and `scalability-<type>.csv` per type, `validation-<batch size>.csv`
  shared by all types), read from a copy the user points to (gpuyard ships none of it).
- `TypedGoodputJob`: Pollux's `GoodputJob` trained on whichever GPU type it runs on: that type's
  profile gives its true step times, it keeps one step-time profile and one fitted model per type
  (its gradient statistics, epochs and progress are the job's, whatever the type), picks its
  per-GPU batch within what its placement fits in memory, and progresses at its goodput divided
  by a per-model slowdown (the artifact's calibration to its real cluster).
- `TypedThroughputs`: the throughput model the artifact gives Gavel's policies (rigid jobs at
  a fixed batch size, `<model>@<batch>`), for `load_throughputs` of a folder of such profiles.

Both the simulation (`simclock`) and Sia's policy use them: one reading of the profiles.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .goodput import (
    EPS,
    Application,
    GoodputJob,
    PerfParams,
    read_placements,
    read_scalability,
    read_validation,
)
from .model import ANY_GPU, GoodputHints

if TYPE_CHECKING:
    import pandas as pd

SIA_APPLICATIONS: dict[str, dict[str, int]] = {
    "bert": {"max_epochs": 2},
    "cifar10": {"max_epochs": 100},
    "ncf": {"max_epochs": 10},
    "imagenet": {"max_epochs": 90},
    "deepspeech2": {"max_epochs": 80},
    "yolov3": {"max_epochs": 50},
}
"""The artifact's per-model settings (`applications.py`; unlike Pollux's artifact, no per-GPU
batch limit for yolov3)."""
SIA_TYPE_SETTINGS: dict[tuple[str, str], dict[str, int]] = {
    ("deepspeech2", "rtx"): {"max_local_bsz": 57}
}
"""Per (model, profile suffix) overrides (the artifact's: deepspeech2 fits 57 a GPU on RTX)."""
SIA_RESTORE_S: dict[str, float] = {
    "cifar10": 50.0,
    "deepspeech2": 25.0,
    "bert": 120.0,
    "yolov3": 80.0,
    "imagenet": 250.0,
    "ncf": 15.0,
}
"""Seconds a (re)started job checkpoints and restores before it trains again, per model (the
artifact simulator's `rescale_time`; others: 30)."""
SIA_DEFAULT_RESTORE_S = 30.0
SIA_SLOWDOWNS: dict[str, float] = {
    "cifar10": 1.8,
    "imagenet": 1.2,
    "yolov3": 1.2,
    "bert": 1.2,
    "deepspeech2": 1.2,
    "ncf": 1.5,
}
"""How much slower each model ran on the artifact's real cluster than in its simulator
(`simulator_config.SLOWDOWNS`): its simulated progress is goodput / slowdown."""


class TypedProfiles:
    """Each model's `Application` on each GPU type, and its one-GPU throughput there (the
    reference's `compute_throughputs`: the largest per-GPU batch over the longest step time
    among the one-GPU placements), read once per (model, type) at first use. Errors are
    ValueError naming the file."""

    def __init__(self, folder: str | Path, names: Mapping[str, str] | None = None) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ValueError(f"{self.folder}: not a directory")
        self.names = dict(names or {})
        """GPU type -> the suffix of its profiles' files (default: the type's own name)."""
        self._apps: dict[tuple[str, str], Application] = {}
        self._rates: dict[tuple[str, str], float] = {}
        self._frames: dict[tuple[str, str], tuple[pd.DataFrame, pd.DataFrame]] = {}
        self._validation: dict[str, dict[int, pd.DataFrame]] = {}

    def __repr__(self) -> str:
        return f"TypedProfiles({str(self.folder)!r})"

    def has(self, model: str) -> bool:
        """Whether `model` has a folder with validation curves."""
        return (self.folder / model).is_dir() and any(
            (self.folder / model).glob("validation-*.csv")
        )

    def app(self, model: str, gpu_type: str) -> Application:
        key = (model, gpu_type)
        if key not in self._apps:
            self._load(model, gpu_type)
        return self._apps[key]

    def one_gpu_rate(self, model: str, gpu_type: str) -> float:
        key = (model, gpu_type)
        if key not in self._rates:
            self._load(model, gpu_type)
        return self._rates[key]

    def max_local_bsz(self, model: str, gpu_type: str, placement: tuple[int, ...]) -> int:
        """The largest per-GPU batch profiled for `placement` (GPUs per node, up to rotation), or
        else for any scalability row with at least its nodes and GPUs (the reference's
        `Application.get_max_local_bsz`: what fits in memory)."""
        placements, scalability = self.frames(model, gpu_type)
        nonempty = tuple(k for k in placement if k)
        nonempty = min(nonempty[i:] + nonempty[:i] for i in range(len(nonempty)))
        placement_id = int("".join(map(str, nonempty)))
        rows = placements[placements.placement == placement_id]
        if rows.empty:
            rows = scalability[
                (scalability.num_nodes >= len(nonempty))
                & (scalability.num_replicas >= sum(nonempty))
            ]
        if rows.empty:
            raise ValueError(
                f"{model} on {gpu_type}: no profile holds placement {nonempty} (none as wide)"
            )
        return int(rows.local_bsz.max())

    def replica_bsz_cap(self, model: str, gpu_type: str, replicas: int) -> int | None:
        """The largest per-GPU batch profiled on `replicas` GPUs in any placement (None: none
        profiled; the reference's memory correction)."""
        placements, _ = self.frames(model, gpu_type)
        counts = placements.placement.astype(str).map(_replicas)
        rows = placements[counts == replicas]
        return None if rows.empty else int(rows.local_bsz.max())

    def frames(self, model: str, gpu_type: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The (placements, scalability) tables of `model` on `gpu_type`."""
        key = (model, gpu_type)
        if key not in self._frames:
            self._load(model, gpu_type)
        return self._frames[key]

    def _file(self, model: str, stem: str, gpu_type: str) -> Path:
        suffix = self.names.get(gpu_type, gpu_type)
        typed = self.folder / model / f"{stem}-{suffix}.csv"
        if typed.is_file():
            return typed
        plain = self.folder / model / f"{stem}.csv"
        if plain.is_file():
            return plain
        raise ValueError(f"{typed}: no profile of {model} on GPU type {gpu_type!r}")

    def _load(self, model: str, gpu_type: str) -> None:
        if model not in self._validation:
            self._validation[model] = read_validation(self.folder / model)
        placements_path = self._file(model, "placements", gpu_type)
        placements = read_placements(placements_path)
        scalability = read_scalability(self._file(model, "scalability", gpu_type))
        self._frames[(model, gpu_type)] = (placements, scalability)
        suffix = self.names.get(gpu_type, gpu_type)
        settings = {**SIA_APPLICATIONS.get(model, {}), **SIA_TYPE_SETTINGS.get((model, suffix), {})}
        self._apps[(model, gpu_type)] = Application(
            model, self._validation[model], placements, scalability, **settings
        )
        one = placements[placements.placement.astype(str).map(_replicas) == 1]
        if one.empty:
            raise ValueError(f"{placements_path}: no one-GPU placement profiled")
        self._rates[(model, gpu_type)] = float(one.local_bsz.max() / one.step_time.max())


def _replicas(placement: str) -> int:
    return sum(int(d) for d in placement)


class TypedGoodputJob(GoodputJob):
    """One job of `model` on the GPU types `gpu_types` of `profiles` (see the module doc).

    It trains on no type until it is placed (`switch` to a type, then `reallocate`, as the
    simulation does at a launch; or `move`, which does both and keeps a job that stays where it
    is). `target_batch_size`: its fixed batch (None: it picks its own); `restart_s`: its restart
    delay; `slowdown`: its progress is its goodput / slowdown (None: the artifact's, by model).
    """

    def __init__(
        self, profiles: TypedProfiles, model: str, gpu_types: tuple[str, ...], *,
        target_batch_size: int | None = None, slowdown: float | None = None,
        restart_s: float | None = None,
    ) -> None:  # fmt: skip
        if restart_s is None:
            restart_s = SIA_RESTORE_S.get(model, SIA_DEFAULT_RESTORE_S)
        if slowdown is None:
            slowdown = SIA_SLOWDOWNS.get(model, 1.0)
        if not gpu_types:
            raise ValueError(f"{model}: a typed goodput job needs at least one GPU type")
        if not slowdown > 0:
            raise ValueError(f"{model}: slowdown {slowdown} must be > 0")
        self.profiles = profiles
        self.model = model
        self.apps = {t: profiles.app(model, t) for t in gpu_types}
        super().__init__(self.apps[gpu_types[0]], target_batch_size, restart_s=restart_s)
        self.calibration = 1.0 / slowdown
        self.gpu_type: str | None = None
        self._profiles: dict[str, dict[tuple[int, int, int], tuple[float, float]]] = {
            t: {} for t in gpu_types
        }
        self._perf: dict[str, PerfParams | None] = dict.fromkeys(gpu_types)

    def __repr__(self) -> str:
        return f"Typed{super().__repr__()[:-1]}, gpu_type={self.gpu_type})"

    def switch(self, gpu_type: str) -> None:
        """Train on `gpu_type` from the next `reallocate` on: its profile, its fit there (the
        current type's kept for a return)."""
        if gpu_type == self.gpu_type:
            return
        if gpu_type not in self.apps:
            raise ValueError(f"{self.model}: no GPU type {gpu_type!r} among {list(self.apps)}")
        if self.gpu_type is not None:
            self._perf[self.gpu_type] = self.perf_params
        self.gpu_type = gpu_type
        self.app = self.apps[gpu_type]
        self.profile = self._profiles[gpu_type]  # (the same dict: steps add to it)
        self.perf_params = self._perf[gpu_type]

    def move(self, gpu_type: str | None, placement: tuple[int, ...]) -> None:
        """Run on `placement` (GPUs per node) of `gpu_type` from now, restarting unless that is
        where it runs (a change of type always restarts); empty: release the GPUs."""
        if placement and gpu_type is not None and gpu_type != self.gpu_type:
            self.switch(gpu_type)
            self.placement = ()  # a new type: a restart even with the same shape
        if placement and tuple(placement) == self.placement:
            return
        self.reallocate(tuple(placement))

    def step(self, seconds: float, interference: float = 0.0) -> float | None:
        # The calibration scales goodput exactly as the reference's (1 - interference) does.
        return super().step(seconds, 1.0 - (1.0 - interference) * self.calibration)

    def hints_on(self, gpu_type: str) -> GoodputHints | None:
        """The hints it would report about `gpu_type` (None: it never ran a step there)."""
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
        if self.gpu_type is None:
            raise ValueError(f"{self.model}: placed before it has a GPU type (switch first)")
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


_TYPED_JOB = re.compile(r"^(.*)@(\d+)$")


def typed_model(job_type: str) -> tuple[str, int | None]:
    """A job type's model and fixed batch size: "cifar10@4096" -> ("cifar10", 4096) (a
    rigid job's, Gavel's under Sia's simulator); any other name is a model alone."""
    if m := _TYPED_JOB.match(job_type):
        return m[1], int(m[2])
    return job_type, None


class TypedThroughputs:
    """A `ThroughputModel` over per-type profiles: the steps/s of a rigid job `<model>@<batch>`
    on `num_gpus` GPUs of a type, as Sia's artifact predicts them for Gavel
    (`gavel.py` predict_throughput): its batch split over the GPUs packed on as few nodes as the
    type's (the most GPUs on one node its profiles have), with accumulation steps beyond what a
    GPU holds, one step's time from that type's profile, times 1/slowdown of the model. A type
    without a profile, or a job type without a batch size: 0 (unsupported)."""

    def __init__(
        self, profiles: TypedProfiles, slowdowns: Mapping[str, float] | None = None,
        reference_gpu_type: str = "rtx",
    ) -> None:  # fmt: skip
        self.profiles = profiles
        self.slowdowns = dict(SIA_SLOWDOWNS if slowdowns is None else slowdowns)
        self.reference_gpu_type = reference_gpu_type
        """What ANY_GPU means (the artifact calibrates its slowdowns on its RTX nodes)."""
        self._memo: dict[tuple[str, str, int], float] = {}

    def __repr__(self) -> str:
        return f"TypedThroughputs({str(self.profiles.folder)!r})"

    def throughput(self, job_type: str, gpu_type: str, num_gpus: int) -> float:
        if gpu_type == ANY_GPU:
            gpu_type = self.reference_gpu_type
        key = (job_type, gpu_type, num_gpus)
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = self._predict(job_type, gpu_type, num_gpus)
        return cached

    def colocated(
        self, job_type: str, other: str, gpu_type: str, num_gpus: int
    ) -> tuple[float, float]:
        return (0.0, 0.0)  # (nothing measured shares a GPU)

    def _predict(self, job_type: str, gpu_type: str, num_gpus: int) -> float:
        model, batch_size = typed_model(job_type)
        if batch_size is None or num_gpus < 1 or not self.profiles.has(model):
            return 0.0
        try:
            app = self.profiles.app(model, gpu_type)
        except ValueError:  # (no profile of that type)
            return 0.0
        placements, _ = self.profiles.frames(model, gpu_type)
        per_node = max(int(d) for p in placements.placement.astype(str) for d in p)
        placement = (per_node,) * (num_gpus // per_node) + (
            (num_gpus % per_node,) if num_gpus % per_node else ()
        )
        local_bsz = math.ceil(batch_size / num_gpus - EPS)
        most_local = self.profiles.max_local_bsz(model, gpu_type, placement)
        accum_steps = math.ceil(local_bsz / most_local - EPS) - 1
        if num_gpus == 1:
            accum_steps = max(1, accum_steps)
        atomic_bsz = math.ceil(local_bsz / (accum_steps + 1) - EPS)
        atomic_bsz = min(atomic_bsz, int(app.max_batch_size / (num_gpus * (accum_steps + 1))))
        try:
            step_time, sync_time = app.throughput(placement, atomic_bsz)
        except ValueError:  # (outside what was profiled)
            return 0.0
        rate = 1.0 / (step_time + (step_time - sync_time) * accum_steps)
        return rate / self.slowdowns.get(model, 1.0)

    @staticmethod
    def is_folder(path: Path) -> bool:
        """Whether `path` is a folder of per-type profiles (`<model>/placements-<type>.csv`)."""
        return path.is_dir() and next(path.glob("*/placements-*.csv"), None) is not None

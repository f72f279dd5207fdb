"""The models' profiles per GPU type, as Sia's artifact lays them out (`traces/<model>/`:
`placements-<type>.csv` and `scalability-<type>.csv` per GPU type, `validation-<batch size>.csv`
shared by all types). Read from a copy the user points to: the artifact ships no licence, so
none of it is part of gpuyard."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from gpuyard.shared.goodput import Application

SIA_APPLICATIONS: dict[str, dict[str, int]] = {
    "bert": {"max_epochs": 2},
    "cifar10": {"max_epochs": 100},
    "ncf": {"max_epochs": 10},
    "imagenet": {"max_epochs": 90},
    "deepspeech2": {"max_epochs": 80},
    "yolov3": {"max_epochs": 50},
}
"""The artifact's per-model settings (`applications.py` APPLICATIONS; unlike Pollux's artifact,
no per-GPU batch limit for yolov3)."""
SIA_TYPE_SETTINGS: dict[tuple[str, str], dict[str, int]] = {
    ("deepspeech2", "rtx"): {"max_local_bsz": 57}
}
"""Per (model, profile suffix) overrides (the artifact's: deepspeech2 fits 57 a GPU on RTX)."""


class TypedProfiles:
    """Each model's `Application` on each GPU type, and its one-GPU throughput there (the
    reference's `compute_throughputs`: the largest per-GPU batch over the longest step time
    among the one-GPU placements), read once per (model, type) at first use."""

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

    def has(self, model: str) -> bool:
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
            curves = {}
            for path in sorted((self.folder / model).glob("validation-*.csv")):
                curves[int(path.stem.split("-")[-1])] = pd.read_csv(path)
            if not curves:
                raise ValueError(f"{self.folder / model}: no validation-<batch size>.csv")
            self._validation[model] = curves
        placements = pd.read_csv(self._file(model, "placements", gpu_type))
        scalability = pd.read_csv(self._file(model, "scalability", gpu_type))
        self._frames[(model, gpu_type)] = (placements, scalability)
        suffix = self.names.get(gpu_type, gpu_type)
        settings = {**SIA_APPLICATIONS.get(model, {}), **SIA_TYPE_SETTINGS.get((model, suffix), {})}
        self._apps[(model, gpu_type)] = Application(
            model, self._validation[model], placements, scalability, **settings
        )
        one = placements[placements.placement.astype(str).map(_replicas) == 1]
        if one.empty:
            raise ValueError(f"{model} on {gpu_type}: no one-GPU placement profiled")
        self._rates[(model, gpu_type)] = float(one.local_bsz.max() / one.step_time.max())


def _replicas(placement: str) -> int:
    return sum(int(d) for d in placement)

"""The models' profiles a goodput-aware policy reads (Pollux's `traces/<model>/`), loaded once."""

from __future__ import annotations

from pathlib import Path

import msgspec
from msgspec import Struct

from gpuyard.shared.goodput import Application, load_applications
from gpuyard.shared.model import JobSpec
from gpuyard.shared.policy import SchedulingPolicy


class ProfilesParams(Struct, forbid_unknown_fields=True):
    profiles: str = ""
    """The folder of the models' profiles (Pollux's `traces/`; `--pollux` sets it)."""


class UsesProfiles(SchedulingPolicy):
    """A policy that reads the models' profiles (`params.profiles`): it refuses a job whose
    model has none, or that gives no batch size where the policy needs one."""

    Params = ProfilesParams
    needs_batch_size = True

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        if not self.params.profiles:
            raise ValueError(f"{type(self).__name__} needs profiles=FOLDER (the models' profiles)")
        self._apps: dict[str, Application] | None = None

    @property
    def apps(self) -> dict[str, Application]:
        """The models, by name (read at first use: off the path of building the policy)."""
        if self._apps is None:
            self._apps = load_applications(Path(self.params.profiles))
        return self._apps

    def accepts(self, spec: JobSpec) -> JobSpec | str:
        app = self.apps.get(spec.job_type)
        if app is None:
            return f"no profile of model {spec.job_type!r} in {self.params.profiles}"
        if self.needs_batch_size and spec.batch_size is None:
            return f"{type(self).__name__} runs a job at its batch size: give batch_size"
        least, most = self.gpu_range(app, spec)
        asked = min(max(spec.num_gpus, least), most)
        ranged = msgspec.structs.replace(spec, num_gpus=asked, min_gpus=least, max_gpus=most)
        return super().accepts(ranged)

    def gpu_range(self, app: Application, spec: JobSpec) -> tuple[int, int]:
        """The fewest and most GPUs the policy gives the job (it chooses within them)."""
        return spec.gpu_range

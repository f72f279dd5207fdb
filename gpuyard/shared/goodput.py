"""Pollux's goodput job model, re-implemented from its artifact simulator (Apache-2.0).

Reference: the OSDI'21 Pollux artifact's simulator (`applications.py`, `goodput.py`,
`speedup.py`, `simulator.py`'s `Job`). Semantics follow it exactly, including its rounding
(`ceil(x - 1e-8)`, `round()` at epoch boundaries) and interpolation, so that simulations reproduce
its numbers. Pure: no I/O besides reading the profile CSVs of an application folder
(`placements.csv`, `scalability.csv`, `validation-<batch size>.csv`).

- `Application`: one model's measured profiles: step/sync times by placement and local batch size
  (`throughput`), and per-epoch progress, iterations, metric and gradient statistics by batch size.
- `GoodputFunction`, `fit_perf_params`, `SpeedupFunction`: the performance model Pollux's agent
  fits from the profiled step times, and the goodput/speedup it predicts from it.
- `GoodputJob`: a job's training as the simulator advances it (true goodput from the profiles,
  fitted model updated from what the job has seen, batch size re-chosen between steps).

Deviations (only where the reference crashes): a failed check raises ValueError (the reference
asserts); `GoodputFunction.optimize` returns scalars only when both counts are scalars (the
reference returns scalars when either is, and fails for a scalar beside an array of several); an
epoch boundary rounded past the end of a fractional interval completes at the interval's end (the
reference asserts; its intervals are whole seconds).

Checked against the artifact: run with the artifact's libraries (numpy 1.26, pandas 1.5,
scipy 1.11) every value matches it bit for bit, fits and job traces included. With ours, the
deterministic values agree to ~3e-13 (pandas < 2 parsed the CSVs' floats up to an ulp off), and
fits match the artifact's code run on the same scipy bit for bit; across scipy versions
L-BFGS-B lands elsewhere on the ill-conditioned profiles, for the artifact's code as for this.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt
from threadpoolctl import ThreadpoolController, threadpool_limits

from .model import GoodputHints, GoodputProfile, StepTimes

if TYPE_CHECKING:
    import pandas as pd
    from scipy.interpolate import LinearNDInterpolator

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

EPS = 1e-8
"""Tolerance of the reference's floor/ceil operations."""

MAX_INTERPOLATED_NODES = 16
"""scalability.csv's largest node count: wider placements interpolate as if on 16 nodes."""


class PerfParams(NamedTuple):
    """Pollux's step-time model.

    T_accum = alpha_c + beta_c * atomic_bsz; T_network = alpha + beta * max(replicas - 2, 1e-8)
    with (alpha_n, beta_n) across nodes, (alpha_r, beta_r) within one node;
    T_optim = (T_accum^gamma + T_network^gamma)^(1/gamma) (gamma in [1, 10]: the overlap).
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float


class GradParams(NamedTuple):
    """Gradient statistics: squared norm and variance (their ratio gives the noise scale)."""

    sqr: float
    var: float


POLLUX_APPLICATIONS: dict[str, dict[str, int]] = {
    "bert": {"max_epochs": 2},
    "cifar10": {"max_epochs": 100},
    "ncf": {"max_epochs": 10},
    "imagenet": {"max_epochs": 90},
    "deepspeech2": {"max_epochs": 80},
    "yolov3": {"max_epochs": 50, "max_local_bsz": 8},
}
"""The artifact's per-model settings (`applications.APPLICATIONS`)."""

_XS = ["num_nodes", "num_replicas", "local_bsz"]
_YS = ["step_time", "sync_time"]
_PLACEMENT_COLUMNS = ["placement", "local_bsz", *_YS]
_SCALABILITY_COLUMNS = [*_XS, *_YS]
_VALIDATION_COLUMNS = ["progress", "iteration", "metric", "grad_sqr", "grad_var"]


def _read_csv(path: Path, columns: Sequence[str], may_lack: Sequence[str] = ()) -> pd.DataFrame:
    """The CSV at `path` with numeric `columns` (values present but in `may_lack`); ValueError
    (one line naming the file) otherwise."""
    import pandas as pd  # (only where profiles are read: a run without them never imports it)

    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: file not found") from None
    except (OSError, ValueError, pd.errors.ParserError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{path}: unreadable CSV ({reason})") from None
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    if frame.empty:
        raise ValueError(f"{path}: no rows")
    for column in columns:
        if not pd.api.types.is_numeric_dtype(frame[column]) or (
            column not in may_lack and frame[column].isna().any()
        ):
            raise ValueError(f"{path}: column {column} has non-numeric or empty values")
    return frame


def read_validation(folder: Path) -> dict[int, pd.DataFrame]:
    """A model's validation curves (`validation-<batch size>.csv`), by batch size; ValueError
    naming a bad file, or the folder without any."""
    validation: dict[int, pd.DataFrame] = {}
    for path in sorted(folder.glob("validation-*.csv")):
        try:
            batch_size = int(path.stem.split("-")[-1])
        except ValueError:
            raise ValueError(f"{path}: expected validation-<batch size>.csv") from None
        # A missing metric is skipped (pandas' max/min), as in the reference.
        validation[batch_size] = _read_csv(path, _VALIDATION_COLUMNS, may_lack=["metric"])
    if not validation:
        raise ValueError(f"{folder / 'validation-*.csv'}: no such files")
    return validation


def read_placements(path: Path) -> pd.DataFrame:
    """A model's step times per placement (`placements.csv`: its GPUs per node as digits)."""
    import pandas as pd

    placements = _read_csv(path, _PLACEMENT_COLUMNS)
    if not pd.api.types.is_integer_dtype(placements.placement) or (placements.placement <= 0).any():
        raise ValueError(f"{path}: placement must be positive integers")
    return placements


def read_scalability(path: Path) -> pd.DataFrame:
    """A model's step times per node and GPU count (`scalability.csv`)."""
    return _read_csv(path, _SCALABILITY_COLUMNS)


class _Curve(NamedTuple):
    """One validation-<batch size>.csv: per-epoch columns (row e = after epoch e + 1)."""

    progress: FloatArray
    iteration: npt.NDArray[Any]
    metric: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray


class Application:
    """One model's profiles (the reference's `applications.Application`)."""

    def __init__(
        self,
        name: str,
        validation: Mapping[int, pd.DataFrame],
        placements: pd.DataFrame,
        scalability: pd.DataFrame,
        *,
        init_batch_size: int | None = None,
        max_batch_size: int | None = None,
        min_local_bsz: int | None = None,
        max_local_bsz: int | None = None,
        max_epochs: int | None = None,
        target_metric: float | None = None,
    ) -> None:
        """From parsed frames (see `load` for the files and their columns)."""
        if not validation:
            raise ValueError(f"application {name}: no validation curves")
        self.name = name
        self._curves = {
            batch_size: _Curve(
                progress=frame.progress.to_numpy(dtype=np.float64),
                iteration=frame.iteration.to_numpy(),
                metric=frame.metric.to_numpy(dtype=np.float64),
                grad_sqr=frame.grad_sqr.to_numpy(dtype=np.float64),
                grad_var=frame.grad_var.to_numpy(dtype=np.float64),
            )
            for batch_size, frame in sorted(validation.items())
        }
        self._batch_sizes = list(self._curves)
        placements = placements[_PLACEMENT_COLUMNS].copy()
        placements["num_nodes"] = placements.placement.apply(lambda p: len(str(p)))
        placements["num_replicas"] = placements.placement.apply(lambda p: sum(map(int, str(p))))
        self._placements = placements
        self._scalability = scalability[_SCALABILITY_COLUMNS]
        # Per profiled placement id: local_bsz ascending (stable, as interp1d sorts) and times.
        self._profiled: dict[int, tuple[IntArray, FloatArray]] = {}
        for placement_id, rows in placements.groupby("placement", sort=False):
            order = np.argsort(rows.local_bsz.to_numpy(), kind="mergesort")
            self._profiled[int(str(placement_id))] = (
                rows.local_bsz.to_numpy()[order],
                rows[_YS].to_numpy(dtype=np.float64)[order],
            )
        self._interpolator: LinearNDInterpolator | None = None
        self.init_batch_size: int = init_batch_size or min(self._curves)
        self.max_batch_size: int = max_batch_size or max(self._curves)
        self.min_local_bsz: int = min_local_bsz or int(placements.local_bsz.min())
        self.max_local_bsz: int = max_local_bsz or int(placements.local_bsz.max())
        if self.max_batch_size < self.min_local_bsz:
            raise ValueError(
                f"application {name}: max_batch_size {self.max_batch_size} < "
                f"min_local_bsz {self.min_local_bsz}"
            )
        shortest = self._epochs_recorded = min(len(c.progress) for c in self._curves.values())
        self.max_epochs: int = max_epochs or shortest
        if self.max_epochs > shortest:
            raise ValueError(
                f"application {name}: max_epochs {self.max_epochs} > the {shortest} epochs "
                "of its shortest validation curve"
            )
        self.target_metric = target_metric
        # Memoised as the reference's @memoize (per instance).
        self._throughput_memo: dict[tuple[tuple[int, ...], float], tuple[float, float]] = {}
        self._progress_memo: dict[int, float] = {}
        self._completion_memo: dict[float, int] = {}
        self._iteration_memo: dict[tuple[float, int], float] = {}
        self._metric_memo: dict[tuple[float, int], float | None] = {}
        self.fits: dict[
            tuple[tuple[tuple[int, int, int], tuple[float, float]], ...], PerfParams
        ] = {}
        """`fit_perf_params` of a job's profile (its configurations in the order it ran them, with
        their step times): the jobs of one application that ran the same configurations fit
        the same parameters, so each profile is fitted once."""
        self._grad_memo: dict[tuple[float, int], tuple[float, float]] = {}
        self._epoch_progress: FloatArray | None = None

    @classmethod
    def load(
        cls,
        folder: Path,
        *,
        init_batch_size: int | None = None,
        max_batch_size: int | None = None,
        min_local_bsz: int | None = None,
        max_local_bsz: int | None = None,
        max_epochs: int | None = None,
        target_metric: float | None = None,
    ) -> Application:
        """Read an application folder (named after the model); ValueError naming a bad file."""
        folder = Path(folder)
        validation = read_validation(folder)
        placements = read_placements(folder / "placements.csv")
        scalability = read_scalability(folder / "scalability.csv")
        return cls(
            folder.name,
            validation,
            placements,
            scalability,
            init_batch_size=init_batch_size,
            max_batch_size=max_batch_size,
            min_local_bsz=min_local_bsz,
            max_local_bsz=max_local_bsz,
            max_epochs=max_epochs,
            target_metric=target_metric,
        )

    def __repr__(self) -> str:
        return f"Application({self.name!r})"

    def _bracket(self, batch_size: float) -> tuple[int, int]:
        """The validated batch sizes just below and above `batch_size` (equal when validated)."""
        lower = upper = None
        for validated in self._batch_sizes:
            if validated <= batch_size:
                lower = validated
            if validated >= batch_size:
                upper = validated
                break
        if lower is None or upper is None:
            raise ValueError(
                f"application {self.name}: batch size {batch_size} outside the validated "
                f"{self._batch_sizes}"
            )
        return lower, upper

    def throughput(self, placement: tuple[int, ...], atomic_bsz: float) -> tuple[float, float]:
        """(step_time, sync_time) of one step on `placement` (GPUs per node) at `atomic_bsz`.

        A placement profiled in placements.csv (up to rotation) interpolates linearly in
        local_bsz; any other interpolates linearly (Delaunay) over the placements' means by
        (num_nodes, num_replicas, local_bsz) and scalability.csv, num_nodes capped at 16.
        """
        key = (placement, atomic_bsz)
        cached = self._throughput_memo.get(key)
        if cached is None:
            cached = self._throughput_memo[key] = self._interpolate(placement, atomic_bsz)
        return cached

    def _interpolate(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        nonempty = tuple(filter(None, placement))
        if not nonempty:
            raise ValueError(f"application {self.name}: empty placement {placement}")
        # Normalise to the lexicographically smallest rotation and read it as the CSV's id.
        nonempty = min(nonempty[i:] + nonempty[:i] for i in range(len(nonempty)))
        placement_id = int("".join(map(str, nonempty)))
        profiled = self._profiled.get(placement_id)
        if profiled is not None:
            x, y = profiled
            if not x[0] <= local_bsz <= x[-1]:
                raise ValueError(
                    f"application {self.name}: placement {placement} batch size {local_bsz} "
                    f"outside its profiled local batch sizes {x[0]}..{x[-1]}"
                )
            # interp1d(kind="linear")'s arithmetic, term for term.
            hi = min(max(int(np.searchsorted(x, local_bsz)), 1), len(x) - 1)
            lo = hi - 1
            slope = (y[hi] - y[lo]) / (x[hi] - x[lo])
            result = slope * (local_bsz - x[lo]) + y[lo]
        else:
            point = [min(len(nonempty), MAX_INTERPOLATED_NODES), sum(nonempty), local_bsz]
            result = self._nd_interpolator()([point])[0]
        step_time, sync_time = float(result[0]), float(result[1])
        if math.isnan(step_time + sync_time):
            raise ValueError(
                f"application {self.name}: no throughput for placement {placement} "
                f"at batch size {local_bsz} (outside the profiled range)"
            )
        return step_time, sync_time

    def _nd_interpolator(self) -> LinearNDInterpolator:
        """Built once: the reference rebuilds the same (deterministic) one on every miss."""
        if self._interpolator is None:
            import pandas as pd

            grouped = self._placements.groupby(_XS)[_XS + _YS].mean()
            points = pd.concat([grouped, self._scalability], ignore_index=True)
            from scipy.interpolate import LinearNDInterpolator  # (scipy costs a simulation
            # without goodput jobs half a second to import)

            interpolator = LinearNDInterpolator(points[_XS].values, points[_YS].values)
            # Its barycentric transforms (lazy: thousands of tiny LAPACK solves) on one BLAS
            # thread: multi-threaded they take seconds, or minutes on a busy machine.
            with threadpool_limits(limits=1):
                interpolator.tri.transform  # noqa: B018
            self._interpolator = interpolator
        return self._interpolator

    def profiled_times(self) -> list[StepTimes]:
        """The profiled step times (`placements.csv`: the mean per nodes, replicas and per-GPU
        batch) as a job reports its own: the prior of a real job's fit
        (`fit_goodput_hints`)."""
        keys = ["num_nodes", "num_replicas", "local_bsz"]
        means = self._placements.groupby(keys)[_YS].mean()
        return [
            StepTimes(int(n), int(r), int(b), float(step), float(sync), 1)
            for (n, r, b), (step, sync) in zip(means.index, means.to_numpy(), strict=True)
            if 0 <= sync < step
        ]

    def progress_at(self, epoch: int) -> float:
        """Progress (samples scaled to the initial batch size) at the end of epoch `epoch`."""
        cached = self._progress_memo.get(epoch)
        if cached is None:
            if epoch == 0:
                cached = 0.0
            else:
                if epoch < 0:
                    raise ValueError(f"application {self.name}: epoch {epoch} < 0")
                cached = float(min(curve.progress[epoch - 1] for curve in self._curves.values()))
            self._progress_memo[epoch] = cached
        return cached

    def epoch_of(self, progress: float) -> int:
        """How many epoch boundaries `progress` has reached (at most max_epochs)."""
        if self._epoch_progress is None:
            self._epoch_progress = np.array(
                [self.progress_at(epoch) for epoch in range(1, self.max_epochs + 1)]
            )
        reached = np.flatnonzero(self._epoch_progress <= progress)
        return int(reached[-1]) + 1 if reached.size else 0

    def completion_epoch(self, batch_size: float) -> int:
        """The epoch after which a job at `batch_size` is done.

        Always max_epochs - 1, as in the reference: its target-metric loop never records a best
        metric, so it never stops early (it still rejects unvalidated batch sizes).
        """
        cached = self._completion_memo.get(batch_size)
        if cached is None:
            if self.target_metric is not None:
                for epoch in range(self.max_epochs):
                    self.best_metric(batch_size, epoch)
            cached = self._completion_memo[batch_size] = self.max_epochs - 1
        return cached

    def _between(self, batch_size: float, lower: int, upper: int, low: Any, high: Any) -> Any:
        """The reference's linear interpolation between validated batch sizes."""
        return ((batch_size - lower) * high + (upper - batch_size) * low) / (upper - lower)

    def _epoch_index(self, epoch: int) -> int:
        if not 0 <= epoch < self._epochs_recorded:
            raise ValueError(f"application {self.name}: no epoch {epoch} in the curves")
        return epoch

    def iterations(self, batch_size: float, epoch: int) -> float:
        """Iterations at `batch_size` after completing epoch `epoch` (counted from 0)."""
        key = (batch_size, epoch)
        cached = self._iteration_memo.get(key)
        if cached is None:
            lower, upper = self._bracket(batch_size)
            index = self._epoch_index(epoch)
            low = self._curves[lower].iteration[index]
            high = self._curves[upper].iteration[index]
            if lower == upper:
                cached = float(low)
            else:
                cached = float(self._between(batch_size, lower, upper, low, high))
            self._iteration_memo[key] = cached
        return cached

    def best_metric(self, batch_size: float, epoch: int) -> float | None:
        """The best validation metric seen before epoch `epoch` (None at epoch 0)."""
        key = (batch_size, epoch)
        if key in self._metric_memo:
            return self._metric_memo[key]
        value: float | None = None
        if epoch != 0:
            lower, upper = self._bracket(batch_size)
            first = self._curves[self._batch_sizes[0]].metric
            # pandas' Series.max/min (skipping NaN): fmax/fmin.
            best = np.fmax if first[0] < first[-1] else np.fmin
            low = best.reduce(self._curves[lower].metric[:epoch])
            high = best.reduce(self._curves[upper].metric[:epoch])
            if lower == upper:
                value = float(low)
            else:
                value = float(self._between(batch_size, lower, upper, low, high))
        self._metric_memo[key] = value
        return value

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during epoch `epoch` at `batch_size`."""
        key = (batch_size, epoch)
        cached = self._grad_memo.get(key)
        if cached is None:
            lower, upper = self._bracket(batch_size)
            index = self._epoch_index(epoch)
            low, high = self._curves[lower], self._curves[upper]
            if lower == upper:
                cached = (float(low.grad_sqr[index]), float(low.grad_var[index]))
            else:
                cached = (
                    float(
                        self._between(
                            batch_size, lower, upper, low.grad_sqr[index], high.grad_sqr[index]
                        )
                    ),
                    float(
                        self._between(
                            batch_size, lower, upper, low.grad_var[index], high.grad_var[index]
                        )
                    ),
                )
            self._grad_memo[key] = cached
        return cached

    def configurations(
        self, lo_util: float = 0.5, hi_util: float = 0.8
    ) -> list[tuple[int, int, float]]:
        """(num_replicas, batch size, JCT s) the workload generator may give a job.

        On 4-GPU nodes: replica counts whose best validated batch size finishes within 12 h at a
        per-GPU speedup over one GPU between lo_util and hi_util; one GPU if none.
        """
        found: list[tuple[int, int, float]] = []
        base_jct = base_batch_size = None
        for num_replicas in (1, 2, 4, 6, 8, 12, 16, 24, 32, 48):
            if num_replicas * self.min_local_bsz > self.max_batch_size:
                break
            placement: tuple[int, ...] = ()
            while sum(placement) < num_replicas:
                placement = (*placement, min(num_replicas - sum(placement), 4))
            best_jct = best_batch_size = None
            for batch_size, curve in self._curves.items():
                local_bsz = math.ceil(batch_size / sum(placement) - EPS)
                if local_bsz < self.min_local_bsz:
                    continue
                accum_steps = math.ceil(local_bsz / self.max_local_bsz - EPS) - 1
                atomic_bsz = math.ceil(local_bsz / (accum_steps + 1) - EPS)
                epoch = self.completion_epoch(batch_size)
                step_time, sync_time = self.throughput(placement, atomic_bsz)
                step_time += accum_steps * (step_time - sync_time)
                jct = float(curve.iteration[epoch] * step_time)
                if best_jct is None or jct < best_jct:
                    best_jct, best_batch_size = jct, batch_size
            if best_jct is None or best_batch_size is None:
                continue
            if num_replicas == 1:
                base_jct, base_batch_size = best_jct, best_batch_size
            elif (
                base_jct is not None
                and best_jct < 12 * 3600
                and lo_util < base_jct / best_jct / num_replicas < hi_util
            ):
                found.append((num_replicas, best_batch_size, best_jct))
        if not found and base_jct is not None and base_batch_size is not None:
            found.append((1, base_batch_size, base_jct))
        return found


def load_applications(folder: Path) -> dict[str, Application]:
    """Every subfolder of `folder` with a placements.csv, POLLUX_APPLICATIONS settings by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: not a directory")
    apps = {
        sub.name: Application.load(sub, **POLLUX_APPLICATIONS.get(sub.name, {}))
        for sub in sorted(folder.iterdir())
        if (sub / "placements.csv").is_file()
    }
    if not apps:
        raise ValueError(f"{folder}: no application folder (none has a placements.csv)")
    return apps


# -- the performance model --------------------------------------------------------------------


def _accum_time(params: PerfParams, atomic_bsz: Any) -> Any:
    """Forward/backward time of one atomic batch: linear in its size."""
    return params.alpha_c + params.beta_c * atomic_bsz


def _network_time(params: PerfParams, num_nodes: Any, num_replicas: Any) -> Any:
    """All-reduce time over the slowest link: across nodes, within a node, or none (1e-8)."""
    across_nodes = np.greater(num_nodes, 1)
    within_node = np.greater(num_replicas, 1)
    bottleneck = np.select([across_nodes, within_node], [params.alpha_n, params.alpha_r], 1e-8)
    retrogress = np.select([across_nodes, within_node], [params.beta_n, params.beta_r], 1e-8)
    return bottleneck + retrogress * np.maximum(num_replicas - 2, 1e-8)


def _log_optim_time(params: PerfParams, accum_time: Any, network_time: Any) -> Any:
    """log of the step time with an all-reduce: a gamma-norm of compute and network time."""
    gamma = params.gamma
    return np.log(accum_time**gamma + network_time**gamma) / gamma


class GoodputFunction:
    """Goodput = throughput x statistical efficiency, predicted from fitted parameters."""

    def __init__(
        self, perf_params: Iterable[float], grad_params: Iterable[float], init_batch_size: float
    ) -> None:
        self.perf_params = PerfParams(*perf_params)
        self.grad_params = GradParams(*grad_params)
        self.init_batch_size = init_batch_size

    @overload
    def evaluate(
        self, num_nodes: float, num_replicas: float, atomic_bsz: float, accum_steps: float
    ) -> float: ...
    @overload
    def evaluate(
        self,
        num_nodes: npt.NDArray[Any],
        num_replicas: npt.NDArray[Any] | float,
        atomic_bsz: npt.NDArray[Any] | float,
        accum_steps: npt.NDArray[Any] | float,
    ) -> FloatArray: ...
    def evaluate(self, num_nodes: Any, num_replicas: Any, atomic_bsz: Any, accum_steps: Any) -> Any:
        """Goodput (useful samples per second) of these configurations."""
        batch_size = num_replicas * atomic_bsz * (accum_steps + 1)
        if not np.all(self.init_batch_size <= batch_size):
            raise ValueError(
                f"batch size {np.min(batch_size)} below the initial {self.init_batch_size}"
            )
        throughput = self.throughput(num_nodes, num_replicas, atomic_bsz, accum_steps)
        return throughput * self.efficiency(batch_size)

    __call__ = evaluate

    @overload
    def throughput(
        self, num_nodes: float, num_replicas: float, atomic_bsz: float, accum_steps: float
    ) -> float: ...
    @overload
    def throughput(
        self,
        num_nodes: npt.NDArray[Any],
        num_replicas: npt.NDArray[Any] | float,
        atomic_bsz: npt.NDArray[Any] | float,
        accum_steps: npt.NDArray[Any] | float,
    ) -> FloatArray: ...
    def throughput(
        self, num_nodes: Any, num_replicas: Any, atomic_bsz: Any, accum_steps: Any
    ) -> Any:
        """Samples per second: accum_steps atomic batches, then one with the all-reduce."""
        accum_time = _accum_time(self.perf_params, atomic_bsz)
        network_time = _network_time(self.perf_params, num_nodes, num_replicas)
        optim_time = np.exp(_log_optim_time(self.perf_params, accum_time, network_time))
        total_time = accum_steps * accum_time + optim_time
        batch_size = num_replicas * atomic_bsz * (accum_steps + 1)
        return batch_size / total_time

    @overload
    def efficiency(self, batch_size: float) -> float: ...
    @overload
    def efficiency(self, batch_size: npt.NDArray[Any]) -> FloatArray: ...
    def efficiency(self, batch_size: Any) -> Any:
        """Progress per sample relative to the initial batch size (1 there, falling above it).

        Equals (PGNS + init_batch_size) / (PGNS + batch_size), with the gradient noise scale
        PGNS = grad_var / grad_sqr * init_batch_size.
        """
        grad_sqr, grad_var = self.grad_params
        scale = batch_size / self.init_batch_size
        denom = grad_var / scale + grad_sqr
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(denom > 0, (grad_var + grad_sqr) / np.asarray(denom), 1.0)
        return gain / scale

    @overload
    def optimize(
        self,
        num_nodes: float,
        num_replicas: float,
        max_batch_size: float | None = None,
        atomic_bsz_range: tuple[int | None, int | None] | None = None,
        accumulation: bool = False,
    ) -> tuple[float, int, int]: ...
    @overload
    def optimize(
        self,
        num_nodes: npt.NDArray[Any],
        num_replicas: npt.NDArray[Any] | float,
        max_batch_size: float | None = None,
        atomic_bsz_range: tuple[int | None, int | None] | None = None,
        accumulation: bool = False,
    ) -> tuple[FloatArray, IntArray, IntArray]: ...
    def optimize(
        self,
        num_nodes: Any,
        num_replicas: Any,
        max_batch_size: float | None = None,
        atomic_bsz_range: tuple[int | None, int | None] | None = None,
        accumulation: bool = False,
    ) -> Any:
        """The best (goodput, atomic_bsz, accum_steps) for each (num_nodes, num_replicas).

        Candidates: 50 total batch sizes spaced geometrically from max(init_batch_size,
        min atomic bsz x replicas) to max_batch_size (default init_batch_size); with
        accumulation, a local batch above the max atomic bsz is split into accumulation steps
        (at least one on one replica above init_batch_size: its gradient statistics need two).
        """
        if not (
            np.all(np.less_equal(1, num_nodes)) and np.all(np.less_equal(num_nodes, num_replicas))
        ):
            raise ValueError(f"need 1 <= num_nodes <= num_replicas: {num_nodes}, {num_replicas}")
        if max_batch_size is None:
            max_batch_size = self.init_batch_size
        if self.init_batch_size > max_batch_size:
            raise ValueError(f"max batch size {max_batch_size} < initial {self.init_batch_size}")
        atomic_range = atomic_bsz_range or (None, None)
        min_atomic_bsz: float = atomic_range[0] or 1
        max_atomic_bsz: float = atomic_range[1] or max_batch_size
        output_shape = np.broadcast(num_nodes, num_replicas).shape
        output_scalar = np.ndim(num_nodes) == 0 and np.ndim(num_replicas) == 0
        num_nodes = np.broadcast_to(num_nodes, output_shape).flatten()
        num_replicas = np.broadcast_to(num_replicas, output_shape).flatten()
        min_batch_size = np.maximum(self.init_batch_size, min_atomic_bsz * num_replicas)
        batch_size = np.geomspace(min_batch_size, max_batch_size)  # (50, configurations)
        local_bsz = batch_size / num_replicas
        if accumulation:
            accum_steps = np.ceil(local_bsz / max_atomic_bsz - EPS) - 1
            accum_steps = np.where(
                np.logical_and(num_replicas == 1, local_bsz > self.init_batch_size + EPS),
                np.maximum(accum_steps, 1),
                accum_steps,
            ).astype(int)
        else:
            accum_steps = np.zeros_like(local_bsz, dtype=int)
        atomic_bsz = np.ceil(local_bsz / (accum_steps + 1) - EPS).astype(int)
        goodput = self.evaluate(num_nodes, num_replicas, atomic_bsz, accum_steps)
        valid = (min_atomic_bsz <= atomic_bsz) & (atomic_bsz <= max_atomic_bsz)
        goodput = np.where(valid, goodput, 0.0)
        best = np.argmax(goodput, axis=0), np.arange(goodput.shape[1])
        best_goodput = goodput[best].reshape(output_shape)
        best_atomic_bsz = atomic_bsz[best].reshape(output_shape)
        best_accum_steps = accum_steps[best].reshape(output_shape)
        if output_scalar:
            return best_goodput.item(), best_atomic_bsz.item(), best_accum_steps.item()
        return best_goodput, best_atomic_bsz, best_accum_steps


class _FitData(NamedTuple):
    """What the fit's loss needs of the measurements, computed once per fit (the loss runs
    ~75 times per fit: on a few configurations, numpy's per-call cost is all it costs)."""

    atomic_bsz: IntArray
    log_accum_step_time: FloatArray
    log_optim_step_time: FloatArray
    link: IntArray
    """Each configuration's slowest link: 0 across nodes, 1 within a node, 2 none."""
    spread: FloatArray
    """max(num_replicas - 2, 1e-8): what the retrogress terms scale with."""
    across_nodes: npt.NDArray[np.bool_]
    within_node: npt.NDArray[np.bool_]

    @classmethod
    def of(
        cls,
        num_nodes: IntArray,
        num_replicas: IntArray,
        atomic_bsz: IntArray,
        accum_step_time: FloatArray,
        optim_step_time: FloatArray,
    ) -> _FitData:
        across_nodes = np.greater(num_nodes, 1)
        within_node = ~across_nodes & np.greater(num_replicas, 1)
        return cls(
            atomic_bsz=atomic_bsz,
            log_accum_step_time=np.log(accum_step_time),
            log_optim_step_time=np.log(optim_step_time),
            link=np.where(across_nodes, 0, np.where(within_node, 1, 2)),
            spread=np.maximum(num_replicas - 2, 1e-8),
            across_nodes=across_nodes,
            within_node=within_node,
        )


_sum = np.add.reduce
"""`np.sum` and `mean`'s sum, without their per-call wrapping (the same pairwise sum)."""


def _fit_objective(params: FloatArray, data: _FitData) -> tuple[float, FloatArray]:
    """The reference's fit loss and its gradient.

    Loss: RMS log error of accum and of optim step times, plus 1e-3 (gamma - 1)^2 (a smaller
    gamma eases the fit) and 1e-2 ((beta_n/alpha_n)^2 + (beta_r/alpha_r)^2) (optimism).

    The gradient is the reference's autograd reverse pass written out by hand, operation for
    operation and summed in its order: the fit is ill-conditioned on few profiled
    configurations, so L-BFGS-B only lands where the reference does on a bit-identical gradient.
    Every value is computed as `_accum_time`, `_network_time` and `_log_optim_time` do (the
    links' parameters are picked, not computed, so picking them by index changes no bit).
    """
    p = PerfParams(*params)
    accum = _accum_time(p, data.atomic_bsz)
    network = (
        np.array([p.alpha_n, p.alpha_r, 1e-8])[data.link]
        + np.array([p.beta_n, p.beta_r, 1e-8])[data.link] * data.spread
    )
    accum_residual = np.log(accum) - data.log_accum_step_time
    # Autograd's forward pass powers with np.power, not `**` (they round differently in
    # numpy < 2, which takes SVML's pow for arrays).
    accum_pow, network_pow = np.power(accum, p.gamma), np.power(network, p.gamma)
    log_total = np.log(accum_pow + network_pow)
    optim_residual = log_total / p.gamma - data.log_optim_step_time
    count = len(accum_residual)
    reg_gamma = 1e-3 * (p.gamma - 1) ** 2
    ratio_n, ratio_r = p.beta_n / p.alpha_n, p.beta_r / p.alpha_r
    reg_retrogress = 1e-2 * (ratio_n**2 + ratio_r**2)
    loss = (
        np.sqrt(_sum(accum_residual**2) / count)
        + np.sqrt(_sum(optim_residual**2) / count)
        + reg_gamma
        + reg_retrogress
    )

    # d(sqrt(mean(r^2)))/dr, as autograd's sqrt, mean and power rules compute it.
    d_accum_residual = (
        0.5 * (_sum(np.power(accum_residual, 2)) / count) ** -0.5 / count * 2 * accum_residual
    )
    d_log_optim = (
        0.5 * (_sum(np.power(optim_residual, 2)) / count) ** -0.5 / count * 2 * optim_residual
    )
    d_log_total = d_log_optim / p.gamma
    d_total = d_log_total / (accum_pow + network_pow)
    power_less_one = np.where(p.gamma, p.gamma - 1, 1.0)
    d_accum = d_total * p.gamma * accum**power_less_one + d_accum_residual / accum
    d_network = d_total * p.gamma * network**power_less_one
    d_gamma = (
        0.001 * 2 * (p.gamma - 1)
        + _sum(-d_log_optim * log_total / p.gamma**2)
        + _sum(d_total * np.log(network) * network_pow)
        + _sum(d_total * np.log(accum) * accum_pow)
    )
    d_ratio_n, d_ratio_r = 0.01 * 2 * ratio_n, 0.01 * 2 * ratio_r
    d_retrogress = data.spread * d_network

    def chain(first: float, terms: FloatArray) -> float:
        """Autograd adds the selected elements' gradients one by one, last element first."""
        total = first
        for term in terms[::-1]:
            total = total + term
        return total

    grad = np.array(
        [
            _sum(d_accum),
            _sum(data.atomic_bsz * d_accum),
            chain(-d_ratio_n * p.beta_n / p.alpha_n**2, d_network[data.across_nodes]),
            chain(d_ratio_n / p.alpha_n, d_retrogress[data.across_nodes]),
            chain(-d_ratio_r * p.beta_r / p.alpha_r**2, d_network[data.within_node]),
            chain(d_ratio_r / p.alpha_r, d_retrogress[data.within_node]),
            d_gamma,
        ]
    )
    return float(loss), grad


@functools.cache
def _blas() -> ThreadpoolController:
    """The BLAS libraries loaded (found once: looking costs a millisecond, a fit ten)."""
    return ThreadpoolController()


def fit_perf_params(
    num_nodes: npt.ArrayLike,
    num_replicas: npt.ArrayLike,
    atomic_bsz: npt.ArrayLike,
    accum_step_time: npt.ArrayLike,
    optim_step_time: npt.ArrayLike,
) -> PerfParams:
    """Fit PerfParams to measured accum/optim step times (L-BFGS-B, as Pollux's agent).

    Parameters nothing constrains stay fixed: alpha_c (at half the mean accum time) with one
    atomic bsz, the inter-node terms without multi-node data, the intra-node terms without
    single-node multi-replica data, both betas without more than 2 replicas.
    """
    nodes = np.asarray(num_nodes)
    replicas = np.asarray(num_replicas)
    bsz = np.asarray(atomic_bsz)
    accum_times = np.asarray(accum_step_time, dtype=np.float64)
    optim_times = np.asarray(optim_step_time, dtype=np.float64)
    initial = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [1e-8, 1e-8] * 3 + [1.0]
    upper = [np.inf, np.inf] * 3 + [10.0]
    if len(np.unique(bsz)) == 1:
        initial[0] = upper[0] = lower[0] = float(np.mean(accum_times) / 2)
    if not np.any(nodes > 1):
        for i in (2, 3):
            initial[i] = upper[i] = lower[i]
    if not np.any(np.logical_and(nodes == 1, replicas > 1)):
        for i in (4, 5):
            initial[i] = upper[i] = lower[i]
    if not np.any(replicas > 2):
        for i in (3, 5):
            initial[i] = upper[i] = lower[i]
    # One BLAS thread: L-BFGS-B's many tiny BLAS calls run ~100x slower handed to threads. An
    # exact fit (zero RMS error) gives a NaN gradient, as in the reference: quietly.
    import scipy.optimize  # (as in `Application._nd_interpolator`: only where jobs fit)

    with _blas().limit(limits=1), np.errstate(divide="ignore", invalid="ignore"):
        result = scipy.optimize.minimize(
            _fit_objective,
            initial,
            args=(_FitData.of(nodes, replicas, bsz, accum_times, optim_times),),
            jac=True,
            method="L-BFGS-B",
            bounds=scipy.optimize.Bounds(lower, upper, keep_feasible=True),
        )
    params = [float(value) for value in result.x]
    if not np.any(nodes > 1):
        # Prior: the inter-node terms are at least the intra-node ones.
        params[2] = max(params[2], params[4] * 1.1)
        params[3] = max(params[3], params[5] * 1.1)
    return PerfParams(*params)


class SpeedupFunction:
    """Goodput of (num_nodes, num_replicas) at its best batch size over `base_goodput`
    (one GPU's, until Pollux's policy replaces it with a fair share's)."""

    def __init__(
        self,
        goodput_fn: GoodputFunction,
        max_batch_size: float | None = None,
        atomic_bsz_range: tuple[int | None, int | None] | None = None,
        accumulation: bool = False,
        mem_size: int = 32,
    ) -> None:
        self.goodput_fn = goodput_fn
        self.max_batch_size = max_batch_size
        self.atomic_bsz_range = atomic_bsz_range
        self.accumulation = accumulation
        self.mem_size = mem_size
        self.base_goodput: float = goodput_fn.optimize(
            1,
            1,
            max_batch_size=max_batch_size,
            atomic_bsz_range=atomic_bsz_range,
            accumulation=accumulation,
        )[0]
        # Speedups already computed, by [num_nodes, num_replicas] (-1: not yet).
        self._memo = -np.ones((mem_size, mem_size))
        self._memo[0, 0] = 0.0

    @overload
    def __call__(self, num_nodes: int, num_replicas: int) -> float: ...
    @overload
    def __call__(
        self, num_nodes: npt.NDArray[Any], num_replicas: npt.NDArray[Any] | int
    ) -> FloatArray: ...
    def __call__(self, num_nodes: Any, num_replicas: Any) -> Any:
        """Speedups, shaped as the inputs broadcast (0 for no replicas)."""
        if not (
            np.all(np.less_equal(0, num_nodes))
            and np.all(np.less_equal(num_nodes, num_replicas))
            and np.all(np.greater(num_nodes, 0) == np.greater(num_replicas, 0))
        ):
            raise ValueError(
                f"need 0 <= num_nodes <= num_replicas, both 0 or neither: {num_nodes}, "
                f"{num_replicas}"
            )
        output_scalar = np.isscalar(num_nodes) and np.isscalar(num_replicas)
        output_shape = np.broadcast(num_nodes, num_replicas).shape
        nodes = np.broadcast_to(num_nodes, output_shape).flatten().astype(int)
        replicas = np.broadcast_to(num_replicas, output_shape).flatten().astype(int)
        speedup = -np.ones(output_shape).flatten()
        remembered = replicas < self.mem_size
        speedup[remembered] = self._memo[nodes[remembered], replicas[remembered]]
        missing = speedup < 0
        if np.count_nonzero(missing) > 0:
            unique, inverse = np.unique(
                np.stack([nodes[missing], replicas[missing]]), axis=1, return_inverse=True
            )
            goodput, _, _ = self.goodput_fn.optimize(
                unique[0],
                unique[1],
                max_batch_size=self.max_batch_size,
                atomic_bsz_range=self.atomic_bsz_range,
                accumulation=self.accumulation,
            )
            memo = unique[1] < self.mem_size
            self._memo[unique[0][memo], unique[1][memo]] = goodput[memo] / self.base_goodput
            speedup[missing] = goodput[inverse.reshape(-1)] / self.base_goodput
        if not np.all(np.less_equal(0, speedup)):
            raise ValueError(f"negative speedup for {num_nodes}, {num_replicas}")
        shaped = speedup.reshape(output_shape)
        return shaped.item() if output_scalar else shaped


# -- a job as the simulator advances it -------------------------------------------------------


class GoodputJob:
    """A job's training as the reference's simulator advances it (`simulator.Job`).

    With `target_batch_size` (Optimus, Tiresias) the batch size is fixed; without it (Pollux)
    it starts at max(init_batch_size, min_local_bsz x replicas) and, once a step time has been
    profiled, is the fitted model's best. Every step taken profiles (num_nodes, num_replicas,
    atomic_bsz) and refits perf_params when that configuration is new.
    """

    def __init__(
        self, app: Application, target_batch_size: int | None = None, *, restart_s: float = 30.0
    ) -> None:
        self.app = app
        self.target_batch_size = target_batch_size
        self.restart_s = restart_s
        self.epoch = 0
        self.progress = 0.0
        self.atomic_bsz = 0
        self.accum_steps = 0
        self.rescale_time: float = 0.0
        self.attained_service: float = 0.0
        self.num_restarts: int | None = None
        self.placement: tuple[int, ...] = ()
        self.profile: dict[tuple[int, int, int], tuple[float, float]] = {}
        self.perf_params: PerfParams | None = None
        self.grad_params: GradParams | None = None
        self.best_metric: float | None = None
        self.finished = False

    def __repr__(self) -> str:
        return (
            f"GoodputJob({self.app.name}, epoch={self.epoch}, progress={self.progress:.6g}, "
            f"placement={self.placement}, batch_size={self.batch_size})"
        )

    @property
    def batch_size(self) -> int:
        """The global batch size now: atomic_bsz x (accum_steps + 1) x replicas."""
        return self.atomic_bsz * (self.accum_steps + 1) * sum(self.placement)

    @property
    def max_profiled_replicas(self) -> int:
        """The most replicas this job has run (and so profiled) on."""
        return max((key[1] for key in self.profile), default=0)

    def hints(self) -> GoodputHints | None:
        """What the job tells its scheduler (None before its first profiled step)."""
        if self.perf_params is None or self.grad_params is None:
            return None
        return GoodputHints(
            tuple(float(v) for v in self.perf_params),  # type: ignore[arg-type]
            float(self.grad_params.sqr), float(self.grad_params.var),
            self.max_profiled_replicas, self.batch_size,
        )  # fmt: skip

    def goodput_fn(self) -> GoodputFunction:
        """The goodput model as fitted so far (needs a profiled step)."""
        if self.perf_params is None or self.grad_params is None:
            raise ValueError(f"{self.app.name}: no profiled step yet, no goodput model")
        return GoodputFunction(self.perf_params, self.grad_params, self.app.init_batch_size)

    def speedup_fn(self) -> SpeedupFunction | None:
        """Pollux's speedup function; None before any profiled step (then speedup = replicas)."""
        if self.perf_params is None:
            return None
        app = self.app
        return SpeedupFunction(
            self.goodput_fn(),
            app.max_batch_size,
            (app.min_local_bsz, app.max_local_bsz),
            accumulation=True,
        )

    def _update_local_bsz(self, placement: tuple[int, ...]) -> None:
        """Choose atomic_bsz and accum_steps for `placement` (the reference's update_local_bsz)."""
        app = self.app
        nonempty = tuple(filter(None, placement))
        num_nodes, num_replicas = len(nonempty), sum(nonempty)
        batch_size = self.target_batch_size
        if batch_size is None and self.perf_params is None:
            batch_size = max(app.init_batch_size, app.min_local_bsz * num_replicas)
        if batch_size is None:
            _, self.atomic_bsz, self.accum_steps = self.goodput_fn().optimize(
                num_nodes,
                num_replicas,
                app.max_batch_size,
                (app.min_local_bsz, app.max_local_bsz),
                accumulation=True,
            )
        else:
            local_bsz = math.ceil(batch_size / num_replicas - EPS)
            self.accum_steps = math.ceil(local_bsz / app.max_local_bsz - EPS) - 1
            if num_replicas == 1 and batch_size > app.init_batch_size:
                self.accum_steps = max(1, self.accum_steps)
            self.atomic_bsz = math.ceil(local_bsz / (self.accum_steps + 1) - EPS)
        count = num_replicas * (self.accum_steps + 1)
        self.atomic_bsz = min(self.atomic_bsz, int(app.max_batch_size / count))

    def _update_params(
        self,
        num_nodes: int,
        num_replicas: int,
        atomic_bsz: int,
        step_time: float,
        sync_time: float,
        grad_sqr: float,
        grad_var: float,
    ) -> None:
        """Record what a step saw; refit perf_params on a configuration not profiled before."""
        self.grad_params = GradParams(grad_sqr, grad_var)
        key = (num_nodes, num_replicas, atomic_bsz)
        if key in self.profile:
            return
        self.profile[key] = step_time, sync_time
        profile = tuple(self.profile.items())
        fitted = self.app.fits.get(profile)
        if fitted is None:
            keys = np.array(list(self.profile))
            times = np.array(list(self.profile.values()))
            fitted = fit_perf_params(
                keys[:, 0], keys[:, 1], keys[:, 2], times[:, 0] - times[:, 1], times[:, 0]
            )
            self.app.fits[profile] = fitted
        self.perf_params = fitted

    def reallocate(self, placement: tuple[int, ...]) -> None:
        """Move to `placement` (GPUs per node), restarting for restart_s; empty: release."""
        if placement:
            self.placement = tuple(placement)
            self._update_local_bsz(self.placement)
            self.rescale_time = self.restart_s
            self.num_restarts = 0 if self.num_restarts is None else self.num_restarts + 1
        else:
            self.placement = ()
            self.atomic_bsz = 0

    def step(self, seconds: float, interference: float = 0.0) -> float | None:
        """Advance `seconds` of wall time (`interference`: the fraction of goodput lost).

        Returns the offset into this interval at which the job completed, None if it did not.
        """
        if not self.placement:
            return None
        app = self.app
        gpus = sum(self.placement)
        delay = min(self.rescale_time, seconds)
        self.attained_service += delay * gpus
        self.rescale_time -= delay
        seconds -= delay
        elapsed = delay
        completed_at = None
        while seconds > 0 and not self.finished:
            if self.epoch >= app.max_epochs:
                raise RuntimeError(f"{self!r}: stepped past max_epochs {app.max_epochs}")
            placement = tuple(filter(None, self.placement))
            num_nodes, num_replicas = len(placement), sum(placement)
            batch_size = num_replicas * self.atomic_bsz * (self.accum_steps + 1)
            scale = batch_size / app.init_batch_size
            # True (simulated) throughput and efficiency, from the profiles.
            step_time, sync_time = app.throughput(placement, self.atomic_bsz)
            accum_time = step_time - sync_time
            grad_sqr, grad_var = app.grad_stats(batch_size, self.epoch)
            gain = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)
            self._update_params(
                num_nodes, num_replicas, self.atomic_bsz, step_time, sync_time, grad_sqr, grad_var
            )
            total_time = step_time + accum_time * self.accum_steps
            goodput = gain / total_time * (1.0 - interference)
            next_progress = app.progress_at(self.epoch + 1)
            if self.progress + goodput * seconds < next_progress:
                # The whole interval within this epoch.
                self.progress += goodput * seconds
                self.attained_service += seconds * gpus
                elapsed += seconds
                seconds = 0
            else:
                # Crossed an epoch boundary, at whole seconds.
                self.epoch += 1
                delta: float = round(float((next_progress - self.progress) / goodput))
                delta = min(delta, seconds)
                if self.epoch > app.completion_epoch(batch_size):
                    self.finished = True
                    completed_at = elapsed + delta
                self.progress = next_progress
                self.best_metric = app.best_metric(batch_size, self.epoch)
                self.attained_service += delta * gpus
                elapsed += delta
                seconds -= delta
            # Re-choose the batch size between epochs (and intervals).
            self._update_local_bsz(self.placement)
        return completed_at

    def remaining_iterations(self) -> float:
        """Iterations left at target_batch_size (what Optimus weighs); 1 when at the end."""
        if self.target_batch_size is None:
            raise ValueError(f"{self.app.name}: remaining_iterations needs a target batch size")
        completion_epoch = self.app.completion_epoch(self.target_batch_size)
        if completion_epoch <= self.epoch:
            return 1
        return self.app.iterations(self.target_batch_size, completion_epoch) - self.app.iterations(
            self.target_batch_size, self.epoch
        )


# -- a real cluster's adaptive job: fitted by the scheduler from what the job measured -----------


def fit_goodput_hints(
    profile: GoodputProfile, init_batch_size: int, prior: Sequence[StepTimes] = ()
) -> tuple[GoodputHints | None, list[str]]:
    """The goodput hints a real adaptive job's measurements give (what Pollux's agent fits):
    PerfParams fitted to its step times (`fit_perf_params`) and to the `prior`'s (its model's
    profiled ones, `Application.profiled_times`) at the configurations it has not measured, its
    gradient statistics rescaled to `init_batch_size` (AdaptDL's grad_var is the variance at the
    initial batch; the job measures it at its own). The most replicas it profiled are those it
    ran on, not the prior's (Pollux lets a job grow to twice that). Returns the hints (None when
    there is not enough: no usable step time of its own, or no gradient statistics) and what
    was left out, and why (one line each).

    A step time at a configuration without accumulation steps stands in for its accumulation
    step less its all-reduce wait, as AdaptDL's profile does."""
    problems: list[str] = []
    nodes, replicas, bsz, accum, optim = [], [], [], [], []
    own = {(t.num_nodes, t.num_replicas, t.local_bsz) for t in profile.times}
    assumed = [t for t in prior if (t.num_nodes, t.num_replicas, t.local_bsz) not in own]
    ran_on: list[int] = []  # (the replicas of its own measurements that hold)
    for i, t in enumerate((*assumed, *profile.times)):
        where = f"step times at nodes={t.num_nodes} replicas={t.num_replicas} bsz={t.local_bsz}"
        accum_s = t.accum_s if t.accum_steps else t.optim_s - t.sync_s
        if t.num_nodes > t.num_replicas:
            problems.append(f"{where}: more nodes than replicas")
        elif not (math.isfinite(t.optim_s) and math.isfinite(accum_s) and accum_s > 0):
            problems.append(f"{where}: no positive accumulation time (sync_s >= optim_s?)")
        else:
            nodes.append(t.num_nodes)
            replicas.append(t.num_replicas)
            bsz.append(t.local_bsz)
            accum.append(accum_s)
            optim.append(t.optim_s)
            if i >= len(assumed):
                ran_on.append(t.num_replicas)
    grad = profile_grad_params(profile, init_batch_size, problems)
    if grad is None or not ran_on:
        return None, problems
    perf = fit_perf_params(nodes, replicas, bsz, accum, optim)
    if not all(math.isfinite(v) for v in perf):
        problems.append(f"the fit gave {tuple(perf)}")
        return None, problems
    hints = GoodputHints(
        tuple(float(v) for v in perf),  # type: ignore[arg-type]
        grad.sqr, grad.var, max(ran_on), profile.batch_size,
    )  # fmt: skip
    return hints, problems


def profile_grad_params(
    profile: GoodputProfile, init_batch_size: int, problems: list[str]
) -> GradParams | None:
    """A real adaptive job's gradient statistics as GradParams (grad_var rescaled from the
    batch it was measured at to `init_batch_size`); None when it has none that hold (why:
    appended to `problems`)."""
    grad_sqr, grad_var = profile.grad_sqr, profile.grad_var
    if grad_sqr is None or grad_var is None:
        return None
    if not (math.isfinite(grad_sqr) and math.isfinite(grad_var) and grad_sqr > 0 <= grad_var):
        problems.append(f"gradient statistics grad_sqr={grad_sqr} grad_var={grad_var}: need "
                        "grad_sqr > 0 and grad_var >= 0")  # fmt: skip
        return None
    if profile.batch_size <= 0:
        problems.append("gradient statistics without the batch size they were measured at")
        return None
    return GradParams(float(grad_sqr), float(grad_var) * profile.batch_size / init_batch_size)


def split_batch(
    batch_size: int, num_replicas: int, max_local_bsz: int, max_batch_size: int
) -> tuple[int, int, int]:
    """A fixed total batch over `num_replicas` GPUs, as the reference's jobs of a target batch
    size split it: (total batch, per-GPU batch, accumulation steps), the per-GPU batch at most
    `max_local_bsz` (the rest in accumulation steps) and the total at most `max_batch_size`."""
    local_bsz = math.ceil(batch_size / num_replicas - EPS)
    accum_steps = math.ceil(local_bsz / max_local_bsz - EPS) - 1
    atomic_bsz = math.ceil(local_bsz / (accum_steps + 1) - EPS)
    atomic_bsz = max(min(atomic_bsz, max_batch_size // (num_replicas * (accum_steps + 1))), 1)
    return num_replicas * atomic_bsz * (accum_steps + 1), atomic_bsz, accum_steps


def choose_batch(
    hints: GoodputHints | None,
    init_batch_size: int,
    max_batch_size: int,
    atomic_bsz_range: tuple[int, int],
    num_nodes: int,
    num_replicas: int,
) -> tuple[int, int, int]:
    """An adaptive job's batch on `num_replicas` GPUs over `num_nodes` nodes: (total batch,
    per-GPU batch, accumulation steps) that maximise its goodput (`GoodputFunction.optimize`
    with accumulation, as Pollux's jobs), within its limits. Without hints (it reported nothing
    yet), or where no batch within the limits fits the GPUs, `init_batch_size` split over them."""
    low, high = atomic_bsz_range
    if hints is not None and low * num_replicas <= max_batch_size:
        fn = GoodputFunction(
            PerfParams(*hints.perf), GradParams(hints.grad_sqr, hints.grad_var), init_batch_size
        )
        with np.errstate(all="ignore"):
            goodput, atomic_bsz, accum_steps = fn.optimize(
                num_nodes, num_replicas, max_batch_size, (low, high), accumulation=True
            )
        if goodput > 0 and math.isfinite(goodput):
            return num_replicas * atomic_bsz * (accum_steps + 1), atomic_bsz, accum_steps
    return split_batch(init_batch_size, num_replicas, high, max_batch_size)

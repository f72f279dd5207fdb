"""Throughput models read from the reference systems' files, behind the `ThroughputModel` protocol.

`throughput(job_type, gpu_type, num_gpus)` returns the job's steps per second (the whole job, all
its GPUs together) or 0 when that combination is unsupported. `gpu_type` "any" means the model's
`reference_gpu_type`.

Between measured GPU counts (all models): every source measures a job at a few GPU counts
(Gavel: scale factors 1/2/4/8; ElasticFlow: 1/2/4/.../64; BFTrainer: its Ns points). For a count
that was measured the measured value is returned. For a count strictly between two measured
counts the value is interpolated *linearly in the GPU count* between those two points, provided
both are supported; if either neighbour is unsupported the count is unsupported. Beyond the largest
measured count the throughput stays at that last value (extra GPUs add nothing; the job still
runs), unless that last value is itself unsupported. Below the smallest measured count, and for
counts < 1, the result is 0. BFTrainer defines its scalability curve exactly this way (piecewise
linear through the points); for Gavel and ElasticFlow it is our choice.

Unsupported: a missing entry, or an entry that is empty, `nan` or <= 0 (ElasticFlow marks memory
limits this way; Gavel's table has a few 0.0 entries on K80).

Models:
- `GavelThroughputs`: Gavel's `simulation_throughputs.json` (GPU types v100/p100/k80 and their
  `*_unconsolidated` variants), job types as Gavel names them ("ResNet-50 (batch size 64)"),
  reference v100; `colocated()` gives space-sharing pair throughputs by GPU count (Gavel
  measured pairs of 1-GPU jobs only: every pair of multi-GPU jobs is 0, it never shares).
- `ElasticFlowThroughputs`: `throughputs_<GPU>/<model>.csv` tables, iterations/s by global batch
  size x GPU count. job_type is "<model>@<global batch size>" (as the ElasticFlow/ITP loaders name
  jobs) or "<model>" (= its smallest listed batch size). GPU type = lower-cased directory suffix
  ("a100", "t4"); reference = the first loaded ("a100" when present).
- `BFTrainerThroughputs`: `*-JNPs-*.csv` (job, Ns, Ps: space-separated node counts and samples/s);
  job_type is the job name, counts are nodes, one node type ("node"; any gpu_type answers).
- `default_model()`: no file; linear in GPU count, GPU types scaled by `DEFAULT_GPU_SPEEDS`.
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec

from .model import ANY_GPU, JobSpec


class ThroughputModel(Protocol):
    """How fast a job runs: the whole job's steps/s on `num_gpus` GPUs of `gpu_type` (0 =
    unsupported; ANY_GPU = the reference type), and pair throughputs for space sharing."""

    reference_gpu_type: str

    def throughput(self, job_type: str, gpu_type: str, num_gpus: int) -> float: ...

    def colocated(
        self, job_type: str, other: str, gpu_type: str, num_gpus: int
    ) -> tuple[float, float]: ...


class LinearModel:
    """Every job type scales linearly with GPU count; GPU types differ by a constant factor.

    The default (all factors 1) makes a job's `duration` its run time at its requested GPU count
    on any GPU, which is what the Blox simulator assumes. No pair was measured: no space sharing.
    """

    def __init__(self, factors: dict[str, float] | None = None, reference_gpu_type: str = ANY_GPU):
        self.factors = dict(factors or {})
        self.reference_gpu_type = reference_gpu_type

    def throughput(self, job_type: str, gpu_type: str, num_gpus: int) -> float:
        return num_gpus * self.factors.get(gpu_type, 1.0)

    def colocated(
        self, job_type: str, other: str, gpu_type: str, num_gpus: int
    ) -> tuple[float, float]:
        return (0.0, 0.0)


def total_steps(spec: JobSpec, model: ThroughputModel) -> float | None:
    """The job's work in steps, or None when neither `total_steps` nor `duration` is given."""
    if spec.total_steps is not None:
        return spec.total_steps
    if spec.duration is None:
        return None
    rate = model.throughput(spec.job_type, model.reference_gpu_type, spec.num_gpus)
    if rate <= 0:
        raise ValueError(
            f"job {spec.job_id}: type {spec.job_type!r} has no throughput on the reference GPU "
            f"type {model.reference_gpu_type!r} at {spec.num_gpus} GPUs"
        )
    return spec.duration * rate


DEFAULT_GPU_SPEEDS: dict[str, float] = {"v100": 1.0, "p100": 0.943, "k80": 0.297}
"""Relative single-GPU speed, V100 = 1. Source: geometric mean over Gavel's 26 job templates of
isolated single-GPU throughput on the type / on V100, from Gavel's `simulation_throughputs.json`
(stanford-futuredata/gavel, MIT): P100 0.943, K80 0.297 (arithmetic means 1.058 and 0.441,
medians 0.813 and 0.247; the geometric mean is the one that averages ratios consistently)."""


def default_model() -> LinearModel:
    """Linear scaling in GPU count, GPU types weighted by `DEFAULT_GPU_SPEEDS` (unknown types 1.0),
    reference type v100."""
    return LinearModel(DEFAULT_GPU_SPEEDS, reference_gpu_type="v100")


class Curve:
    """Throughput measured at a few GPU counts, interpolated as the module docstring says."""

    __slots__ = ("counts", "values")

    def __init__(self, points: Mapping[int, float] | Iterable[tuple[int, float]]):
        items = sorted(dict(points).items())
        self.counts = [float(c) for c, _ in items]
        self.values = [_supported(v) for _, v in items]

    def __call__(self, n: float) -> float:
        if n < 1 or not self.counts:
            return 0.0
        counts, values = self.counts, self.values
        i = bisect.bisect_left(counts, n)
        if i < len(counts) and counts[i] == n:
            return float(values[i])
        if i == 0:
            return 0.0
        if i == len(counts):
            return float(values[-1])
        lo, hi = values[i - 1], values[i]
        if lo <= 0 or hi <= 0:
            return 0.0
        frac = (n - counts[i - 1]) / (counts[i] - counts[i - 1])
        return float(lo + frac * (hi - lo))

    def __repr__(self) -> str:
        return f"Curve({dict(zip(self.counts, self.values, strict=True))})"


def _supported(v: Any) -> float:
    """A measured value, or 0.0 for unsupported (missing, empty, nan, non-positive)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) and x > 0 else 0.0


class _CurveModel:
    """Shared lookup: curves[gpu_type][job_type] -> Curve, with a small result cache."""

    reference_gpu_type: str

    def __init__(self, curves: dict[str, dict[str, Curve]], reference_gpu_type: str):
        self.curves = curves
        self.reference_gpu_type = reference_gpu_type
        self._cache: dict[tuple[str, str, int], float] = {}

    @property
    def gpu_types(self) -> list[str]:
        return list(self.curves)

    @property
    def job_types(self) -> list[str]:
        seen: dict[str, None] = {}
        for per_type in self.curves.values():
            seen.update(dict.fromkeys(per_type))
        return list(seen)

    def _curve(self, job_type: str, gpu_type: str) -> Curve | None:
        return self.curves.get(gpu_type, {}).get(job_type)

    def colocated(
        self, job_type: str, other: str, gpu_type: str, num_gpus: int
    ) -> tuple[float, float]:
        """No pair was measured: (0, 0), no space sharing (Gavel's model overrides this)."""
        return (0.0, 0.0)

    def throughput(self, job_type: str, gpu_type: str, num_gpus: int) -> float:
        key = (job_type, gpu_type, num_gpus)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        gt = self.reference_gpu_type if gpu_type == ANY_GPU else gpu_type
        curve = self._curve(job_type, gt)
        value = curve(num_gpus) if curve is not None else 0.0
        self._cache[key] = value
        return value


# ----------------------------------------------------------------------------------------------
# Gavel

_GAVEL_KEY = re.compile(r"^\('(.*)', (\d+)\)$")


def parse_gavel_key(key: str) -> tuple[str, int]:
    """ "('ResNet-50 (batch size 64)', 1)" -> ("ResNet-50 (batch size 64)", 1)."""
    m = _GAVEL_KEY.match(key)
    if not m:
        raise ValueError(f"not a Gavel job key: {key!r}")
    return m[1], int(m[2])


class GavelThroughputs(_CurveModel):
    """Gavel's measured throughputs (module docstring)."""

    def __init__(
        self, raw: Mapping[str, Mapping[str, Mapping[str, Any]]], reference_gpu_type: str = "v100"
    ):
        curves: dict[str, dict[str, Curve]] = {}
        pairs: dict[str, dict[tuple[str, str, int], tuple[float, float]]] = {}
        parsed: dict[str, tuple[str, int]] = {}  # (each key comes back once per pair it is in)

        def parse(key: str) -> tuple[str, int]:
            if (hit := parsed.get(key)) is None:
                hit = parsed[key] = parse_gavel_key(key)
            return hit

        for gpu_type, jobs in raw.items():
            points: dict[str, dict[int, float]] = {}
            pairs[gpu_type] = {}
            for key, entry in jobs.items():
                name, sf = parse(key)
                points.setdefault(name, {})[sf] = entry.get("null", 0.0)
                for other_key, value in entry.items():
                    if other_key == "null":
                        continue
                    other, other_sf = parse(other_key)
                    if other_sf == sf and isinstance(value, list) and len(value) == 2:
                        pairs[gpu_type][(name, other, sf)] = (
                            _supported(value[0]),
                            _supported(value[1]),
                        )
            curves[gpu_type] = {name: Curve(p) for name, p in points.items()}
        if reference_gpu_type not in curves and curves:
            reference_gpu_type = next(iter(curves))
        super().__init__(curves, reference_gpu_type)
        self.pairs = pairs

    @classmethod
    def from_file(cls, path: str | Path) -> GavelThroughputs:
        try:
            raw = msgspec.json.decode(Path(path).read_bytes())
        except msgspec.DecodeError as exc:
            raise ValueError(f"throughputs file {str(path)!r}: not valid JSON ({exc})") from None
        return cls(raw)

    def colocated(
        self, job_type: str, other: str, gpu_type: str, num_gpus: int
    ) -> tuple[float, float]:
        """(this job's, the other's) steps/s when the two share the same `num_gpus` GPUs of
        `gpu_type`; (0, 0) when Gavel did not measure the pair (or it does not fit). Gavel
        measured only pairs of jobs of the same GPU count, and found every multi-GPU pair 0."""
        gt = self.reference_gpu_type if gpu_type == ANY_GPU else gpu_type
        return self.pairs.get(gt, {}).get((job_type, other, num_gpus), (0.0, 0.0))


# ----------------------------------------------------------------------------------------------
# ElasticFlow


def _read_elasticflow_csv(path: Path) -> dict[int, dict[int, float]]:
    """{global batch size: {GPU count: iterations/s (0 = unsupported)}}."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][0].strip() != "global_batch_size":
        raise ValueError(f"{path}: expected a header starting with global_batch_size")
    try:
        counts = [int(c) for c in rows[0][1:]]
    except ValueError as exc:
        raise ValueError(f"{path}, line 1: GPU counts must be integers ({exc})") from exc
    table: dict[int, dict[int, float]] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row or not row[0].strip():
            continue
        try:
            batch = int(float(row[0]))
        except ValueError as exc:
            raise ValueError(f"{path}, line {line}: bad global_batch_size {row[0]!r}") from exc
        cells = row[1:] + [""] * (len(counts) - len(row[1:]))
        table[batch] = {c: _supported(v) for c, v in zip(counts, cells, strict=False)}
    return table


def _gpu_type_of(directory: Path) -> str:
    name = directory.name
    return name.split("_", 1)[1].lower() if name.startswith("throughputs_") else name.lower()


class ElasticFlowThroughputs(_CurveModel):
    """ElasticFlow's per-GPU-count tables (module docstring)."""

    def __init__(
        self,
        tables: Mapping[str, Mapping[str, Mapping[int, Mapping[int, float]]]],
        reference_gpu_type: str | None = None,
    ):
        curves: dict[str, dict[str, Curve]] = {}
        for gpu_type, models in tables.items():
            per: dict[str, Curve] = {}
            for model, batches in models.items():
                for batch in sorted(batches):
                    per[f"{model}@{batch}"] = Curve(batches[batch])
                if batches:
                    per[model] = per[f"{model}@{min(batches)}"]
            curves[gpu_type] = per
        if reference_gpu_type is None:
            reference_gpu_type = "a100" if "a100" in curves else next(iter(curves), ANY_GPU)
        super().__init__(curves, reference_gpu_type)

    @classmethod
    def from_path(cls, path: str | Path, gpu_type: str | None = None) -> ElasticFlowThroughputs:
        """A `<model>.csv`, a `throughputs_<GPU>/` directory, or a directory of those."""
        path = Path(path)
        tables: dict[str, dict[str, dict[int, dict[int, float]]]] = {}
        if path.is_file():
            gt = gpu_type or _gpu_type_of(path.parent)
            tables[gt] = {path.stem: _read_elasticflow_csv(path)}
        else:
            subdirs = sorted(p for p in path.glob("throughputs_*") if p.is_dir())
            for d in subdirs or [path]:
                gt = gpu_type if (gpu_type and not subdirs) else _gpu_type_of(d)
                tables[gt] = {f.stem: _read_elasticflow_csv(f) for f in sorted(d.glob("*.csv"))}
            if not any(tables.values()):
                raise ValueError(f"{path}: no ElasticFlow throughput tables (*.csv) found")
        return cls(tables)


# ----------------------------------------------------------------------------------------------
# BFTrainer


class BFTrainerThroughputs(_CurveModel):
    """BFTrainer scalability points (module docstring). Counts are nodes."""

    NODE = "node"

    def __init__(self, points: Mapping[str, Mapping[int, float]]):
        super().__init__({self.NODE: {job: Curve(p) for job, p in points.items()}}, self.NODE)

    def _curve(self, job_type: str, gpu_type: str) -> Curve | None:
        return self.curves[self.NODE].get(job_type)

    @classmethod
    def from_file(cls, path: str | Path) -> BFTrainerThroughputs:
        points: dict[str, dict[int, float]] = {}
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or not {"job", "Ns", "Ps"} <= set(reader.fieldnames):
                raise ValueError(f"{path}: expected columns job,Ns,Ps")
            for line, row in enumerate(reader, start=2):
                try:
                    ns = [int(float(x)) for x in row["Ns"].split()]
                    ps = [float(x) for x in row["Ps"].split()]
                except (ValueError, AttributeError) as exc:
                    raise ValueError(f"{path}, line {line}: bad Ns/Ps ({exc})") from exc
                if len(ns) != len(ps):
                    raise ValueError(f"{path}, line {line}: {len(ns)} Ns but {len(ps)} Ps")
                points[row["job"]] = dict(zip(ns, ps, strict=True))
        return cls(points)


# ----------------------------------------------------------------------------------------------


_BATCH_SUFFIX = (re.compile(r"^(.*?)\s*\(batch size (\d+)\)$"), re.compile(r"^(.*)@(\d+)$"))


def split_job_type(name: str) -> tuple[str, int | None]:
    """A job type's model and batch size, as the reference tables name them: Gavel's
    "ResNet-50 (batch size 64)" and ElasticFlow's "resnet50@64" -> ("resnet-50", 64) and
    ("resnet50", 64); any other name is a model of unknown batch size. Models are lower-cased."""
    for pattern in _BATCH_SUFFIX:
        if m := pattern.match(name):
            return m[1].strip().lower(), int(m[2])
    return name.strip().lower(), None


class LearnedThroughputs:
    """A throughput model that learns from what jobs report (real clusters).

    An entry T[job type J, GPU type, GPU count] is, in this order:

    1. measured: the measurement (an exponential moving average, `weight` for the newest);
    2. otherwise J's *reference row* R_J scaled by how J's measurements compare with it: R_J[e] x
       the geometric mean over J's measured entries m of measured[m] / R_J[m] (1 when J has no
       measurement), so a job type seen twice as fast as its reference row on one type is taken to
       be twice as fast on the others. Where R_J is 0 (unsupported) the estimate is 0.

    J's reference row (`reference()`):

    a. the prior's row for J, when the prior knows J (a table that lists J; a model without a list
       of job types, such as the default linear one, knows every type);
    b. otherwise, when J has measurements, the prior's row of the *most similar* listed job type:
       the K, among those the prior supports on every entry J was measured on, whose row best
       explains J's measurements up to one factor (the smallest variance over J's measured
       entries of log measured - log prior[K], i.e. the same ratios between GPU types and counts);
       ties, as when J was measured on one entry only, go to the K whose figures are closest to
       J's (the smallest |mean log difference|), then to the first name. Gavel estimates unseen
       entries by matrix completion over the job types; this is a one-nearest-neighbour version of
       that idea, exact where J behaves like a known type and cheap enough to run at every solve;
    c. otherwise (J not in the prior, and never measured or measured only where no listed type
       runs) by name: the listed type of the same model (`split_job_type`) with the nearest batch
       size (in log scale; ties: the smaller batch, then the first name), as is; with no such
       model, a typical job: per entry, the geometric mean of the listed job types that run there.

    Only the prior's job types are neighbours (a learned type's own row is mostly estimates). A
    job type's choice is remembered until it is measured again. Pair throughputs (space sharing)
    stay the prior's. Deterministic: the same prior and measurements give the same answers.
    """

    def __init__(self, prior: ThroughputModel, weight: float = 0.5) -> None:
        self.prior = prior
        self.weight = weight
        self.reference_gpu_type = prior.reference_gpu_type
        self.measured: dict[tuple[str, str, int], float] = {}
        self._scale: dict[str, float] = {}
        self._reference: dict[str, str | None] = {}
        known = getattr(prior, "job_types", None)
        self._known: list[str] | None = sorted(known) if known is not None else None
        """The prior's job types, sorted (None: it answers for any job type)."""
        self._typical: dict[tuple[str, int], float] = {}
        self.version = 0
        """Counts what was learned: a policy that caches rates computes them again when it moves."""

    def observe(self, job_type: str, gpu_type: str, num_gpus: int, rate: float) -> None:
        """A job of `job_type` was seen doing `rate` steps/s on `num_gpus` GPUs of `gpu_type`."""
        if not (rate > 0 and math.isfinite(rate)):
            return
        key = (job_type, gpu_type, num_gpus)
        old = self.measured.get(key)
        self.measured[key] = rate if old is None else (1 - self.weight) * old + self.weight * rate
        self._scale.pop(job_type, None)
        self._reference.pop(job_type, None)
        self.version += 1

    def knows(self, job_type: str) -> bool:
        """The prior has a row for this job type."""
        return self._known is None or job_type in self._known

    def reference(self, job_type: str) -> str | None:
        """The job type whose prior row `job_type`'s estimates follow (None: a typical job)."""
        if job_type in self._reference:
            return self._reference[job_type]
        if self.knows(job_type):
            found: str | None = job_type
        else:
            found = self._most_similar(job_type)
            if found is None:
                found = self._same_model(job_type)
        self._reference[job_type] = found
        return found

    def _reference_rate(self, job_type: str, gpu_type: str, num_gpus: int) -> float:
        """R_J[gpu_type, num_gpus] (class docstring)."""
        ref = self.reference(job_type)
        if ref is not None:
            return self.prior.throughput(ref, gpu_type, num_gpus)
        return self._typical_rate(gpu_type, num_gpus)

    def _measurements(self, job_type: str) -> list[tuple[str, int, float]]:
        return [(gt, n, rate) for (jt, gt, n), rate in self.measured.items() if jt == job_type]

    def _most_similar(self, job_type: str) -> str | None:
        """Rule b: the listed job type whose row best explains `job_type`'s measurements."""
        seen = self._measurements(job_type)
        if not seen or not self._known:
            return None
        best: tuple[float, float, str] | None = None
        for other in self._known:  # sorted: ties go to the first name
            rows = [self.prior.throughput(other, gt, n) for gt, n, _ in seen]
            if min(rows) <= 0:
                continue  # it cannot run where this job type ran: not alike
            diffs = [math.log(rate / row) for (_, _, rate), row in zip(seen, rows, strict=True)]
            mean = sum(diffs) / len(diffs)
            spread = round(sum((d - mean) ** 2 for d in diffs) / len(diffs), 12)
            key = (spread, abs(mean), other)
            if best is None or key < best:
                best = key
        return best[2] if best is not None else None

    def _same_model(self, job_type: str) -> str | None:
        """Rule c: the listed type of the same model with the nearest batch size, or None."""
        model, batch = split_job_type(job_type)
        best: tuple[float, int, str] | None = None
        for other in self._known or []:
            other_model, other_batch = split_job_type(other)
            if other_model != model:
                continue
            if batch is None or other_batch is None:
                distance = 0.0 if batch == other_batch else math.inf
            else:
                distance = abs(math.log(other_batch / batch))
            key = (distance, other_batch or 0, other)
            if best is None or key < best:
                best = key
        return best[2] if best is not None else None

    def _typical_rate(self, gpu_type: str, num_gpus: int) -> float:
        """A typical listed job type on this entry: the geometric mean of those that run there."""
        key = (gpu_type, num_gpus)
        hit = self._typical.get(key)
        if hit is not None:
            return hit
        logs = [
            math.log(rate)
            for other in self._known or []
            if (rate := self.prior.throughput(other, gpu_type, num_gpus)) > 0
        ]
        value = math.exp(sum(logs) / len(logs)) if logs else 0.0
        self._typical[key] = value
        return value

    def scale(self, job_type: str) -> float:
        """How this job type's measurements compare with its reference row (1 when never
        measured)."""
        cached = self._scale.get(job_type)
        if cached is not None:
            return cached
        logs = [
            math.log(rate / base)
            for gt, n, rate in self._measurements(job_type)
            if (base := self._reference_rate(job_type, gt, n)) > 0
        ]
        value = math.exp(sum(logs) / len(logs)) if logs else 1.0
        self._scale[job_type] = value
        return value

    def throughput(self, job_type: str, gpu_type: str, num_gpus: int) -> float:
        measured = self.measured.get((job_type, gpu_type, num_gpus))
        if measured is not None:
            return measured
        return self._reference_rate(job_type, gpu_type, num_gpus) * self.scale(job_type)

    def colocated(
        self, job_type: str, other: str, gpu_type: str, num_gpus: int
    ) -> tuple[float, float]:
        return self.prior.colocated(job_type, other, gpu_type, num_gpus)

    def snapshot(self) -> list[tuple[str, str, int, float]]:
        return [(*key, rate) for key, rate in self.measured.items()]

    def restore(self, measured: list[tuple[str, str, int, float]]) -> None:
        self.measured = {(jt, gt, int(n)): rate for jt, gt, n, rate in measured}
        self._scale.clear()
        self._reference.clear()
        self.version += 1


def load_throughputs(path: str | Path | None = None) -> ThroughputModel:
    """A throughput model from a file, detected by shape:

    - None, "default" or "builtin": `default_model()`;
    - a `.json` with GPU types mapping to "('job', n)" keys: `GavelThroughputs`;
    - a directory (of `throughputs_*/` or of `*.csv`) or a CSV whose header starts with
      `global_batch_size`: `ElasticFlowThroughputs`;
    - a CSV with columns job,Ns,Ps: `BFTrainerThroughputs`;
    - a directory of per-GPU-type profiles (Sia's `traces/`: `<model>/placements-<type>.csv`):
      `typed_goodput.TypedThroughputs` (job types `<model>@<batch size>`).
    """
    if path is None or str(path) in ("default", "builtin"):
        return default_model()
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"throughputs file {str(p)!r} does not exist")
    if p.is_dir():
        from .typed_goodput import TypedProfiles, TypedThroughputs  # (pandas: only here)

        if TypedThroughputs.is_folder(p):
            return TypedThroughputs(TypedProfiles(p))
        return ElasticFlowThroughputs.from_path(p)
    found = p.stat()
    return _load_file(str(p), found.st_mtime_ns, found.st_size)


@functools.lru_cache(maxsize=8)
def _load_file(path: str, mtime_ns: int, size: int) -> ThroughputModel:
    """A table file's model, read once per process while the file stays as it was (its path,
    modification time and size): a simulation's services, and a sweep worker's runs one after
    another, read the same table (Gavel's: 1.2 MB of JSON). The models are read-only (a learning
    model keeps its measurements apart from its prior's table)."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        return GavelThroughputs.from_file(p)
    try:
        with open(p, newline="") as f:
            header = [c.strip() for c in f.readline().split(",")]
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not a throughput table (not UTF-8 text)") from None
    if header and header[0] == "global_batch_size":
        return ElasticFlowThroughputs.from_path(p)
    if {"job", "Ns", "Ps"} <= set(header):
        return BFTrainerThroughputs.from_file(p)
    raise ValueError(
        f"{p}: unknown throughput format (expected Gavel JSON, ElasticFlow table or BFTrainer "
        f"JNPs CSV; header {header[:5]})"
    )

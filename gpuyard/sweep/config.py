"""A sweep's TOML file, typed and validated, and its plan: one `Run` per combination.

```toml
[sweep]                      # optional: name (default: the file's stem), parallel, timeout_s, ...
[base]                       # options of every run (RunSpec's fields: `gpuyard sim`'s options)
[grid]                       # field = [values]: every combination
[[runs]]                     # optional list of variants, each crossed with the grid
[report]                     # optional: the figures' x axis, which figures, a baseline scheme
```

Paths in the file (trace, throughputs, profiles, cluster_spec files, node_events, nodes_from) are relative to the file's
folder. A run is identified by a hash of its inputs (its options with the input files' contents in
place of their paths), so a sweep run again skips what it has already done.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import itertools
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

import gpuyard
from gpuyard.run.spec import PositiveInt, RunSpec
from gpuyard.shared.policy import own_params

FILE_FIELDS = ("trace", "throughputs", "profiles", "cluster_spec", "node_events", "nodes_from")
"""Fields that may name a file (or, for throughputs and profiles, a folder) the run reads."""
PARAM_FIELDS = ("policy_params", "admission_params", "placement_params")
RUN_FIELDS = frozenset(f.name for f in msgspec.structs.fields(RunSpec))


class SweepSettings(Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    name: str | None = None
    """The sweep's name on the server (default: the file's stem)."""
    parallel: PositiveInt | None = None
    """Runs at once on this machine (default: one per CPU)."""
    timeout_s: Annotated[float, Meta(gt=0)] | None = None
    """A run that takes longer fails with that error."""
    max_attempts: PositiveInt = 3
    """A run whose worker died this many times is recorded as failed."""


FigureName = Literal[
    "mean_jct", "jct_cdfs", "makespan", "timelines", "deadlines", "fairness",
    "cluster_efficiency", "jct_improvement",
]  # fmt: skip
"""The figures `gpuyard report` can draw (docs/sweeps.md, "The report")."""


class ReportSettings(Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    x: str = "load"
    """The run field the figures put on their x axis (a panel each where a figure has panels)."""
    figures: list[FigureName] | None = None
    """The figures to draw, in this order (default: every one the results allow)."""
    baseline: str | None = None
    """The scheme `jct_improvement` compares every scheme with."""


class SweepFile(Struct, kw_only=True, forbid_unknown_fields=True):
    sweep: SweepSettings = SweepSettings()
    base: dict[str, Any] = {}
    grid: dict[str, list[Any]] = {}
    runs: list[dict[str, Any]] = []
    report: ReportSettings = ReportSettings()


class InputFile(Struct, frozen=True):
    """A file (or folder) a run reads, by content: it travels to workers through the server."""

    field: str
    path: str
    digest: str
    folder: bool = False


class Run(Struct, kw_only=True):
    run_id: str
    name: str
    spec: RunSpec
    inputs: list[InputFile] = []


class Sweep(Struct, kw_only=True):
    name: str
    settings: SweepSettings
    runs: list[Run]
    source: str = ""


class ConfigError(ValueError):
    """A sweep file that cannot be used, in one line naming the file and the key."""


def _where(exc: msgspec.ValidationError, prefix: str) -> str:
    """msgspec's `... - at `$.base.load`` as `base.load: ...`."""
    text = str(exc)
    match = re.search(r" - at `\$(.*)`$", text)
    path = prefix
    if match:
        path += match[1] if prefix else match[1].lstrip(".")
        text = text[: match.start()]
    unknown = re.match(r"Object contains unknown field `(.+)`", text)
    if unknown:
        return f"unknown key {path + '.' if path else ''}{unknown[1]}"
    return f"{path}: {text}" if path else text


def load_sweep(path: Path) -> Sweep:
    """The sweep `path` describes, every run validated; ConfigError in one line otherwise."""
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not TOML: {exc}") from None
    try:
        config = msgspec.convert(raw, SweepFile)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {_where(exc, '')}") from None
    return plan(config, path)


def report_settings(text: str) -> ReportSettings:
    """The `[report]` table of a sweep file's text (its defaults when it has none)."""
    config = msgspec.convert(tomllib.loads(text).get("report", {}), ReportSettings)
    assert isinstance(config, ReportSettings)
    return config


def _spec(fields: dict[str, Any], where: str, source: Path) -> RunSpec:
    try:
        return msgspec.convert(fields, RunSpec)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {_where(exc, where)}") from None


def plan(config: SweepFile, source: Path) -> Sweep:
    """Every run of the sweep: each of `runs` (or the base alone) crossed with the grid."""
    _spec(config.base, "base", source)
    for key, values in config.grid.items():
        if key not in RUN_FIELDS:
            raise ConfigError(f"{source}: unknown key grid.{key}")
        if not values:
            raise ConfigError(f"{source}: grid.{key}: an empty list")
        for i, value in enumerate(values):
            if value in values[:i]:  # (10 and 10.0 too: the same run twice)
                raise ConfigError(f"{source}: grid.{key}: {value!r} is there twice")
        for i, value in enumerate(values):
            try:
                msgspec.convert({key: value}, RunSpec)
            except msgspec.ValidationError as exc:
                text = re.sub(r" - at `\$.*`$", "", str(exc))
                raise ConfigError(f"{source}: grid.{key}[{i}]: {text}") from None
    for i, variant in enumerate(config.runs):
        _spec(variant, f"runs[{i}]", source)
    variants = config.runs or [{}]
    axes = list(config.grid)
    runs: list[Run] = []
    folder = source.parent
    prefixes: set[str] = set()
    made: dict[str, str] = {}  # run id -> where it was made (each run once: its one folder)
    for v, variant in enumerate(variants):
        for combo in itertools.product(*config.grid.values()):
            fields = {**config.base, **variant, **dict(zip(axes, combo, strict=True))}
            where = f"runs[{v}]" if config.runs else "base"
            at = ", ".join(f"{k} = {value!r}" for k, value in zip(axes, combo, strict=True))
            prefixes |= _scoped(fields.get("policy_params"))
            fields = _own_params(fields)
            spec = _resolve_paths(_spec(fields, where, source), folder)
            inputs = _inputs(spec, source, where)
            _check(spec, source, where)
            run = Run(run_id=run_id(spec, inputs), name="", spec=spec, inputs=inputs)
            here = f"{where} at {at}" if at else where
            if run.run_id in made:
                raise ConfigError(
                    f"{source}: {here} is the same run as {made[run.run_id]}: each run once"
                )
            made[run.run_id] = here
            runs.append(run)
    if not runs:
        raise ConfigError(f"{source}: no runs")
    stray = sorted(prefixes - {run.spec.policy for run in runs})
    if stray:
        raise ConfigError(f"{source}: policy_params: {stray[0]}.*: no run's policy is {stray[0]!r}")
    # Runs that the grid's values leave alike are told apart by the scalar options their
    # variants change (the trace of each of ten clusters, say) rather than by a hash.
    varying = [
        key for key in dict.fromkeys(k for variant in config.runs for k in variant)
        if key not in axes
        and all(isinstance(v.get(key), str | int | float | bool | None) for v in config.runs)
        and len({repr(v.get(key)) for v in config.runs}) > 1
    ]  # fmt: skip
    _name_runs(runs, axes, varying)
    _check_report(config, runs, source)
    name = config.sweep.name or source.stem
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ConfigError(
            f"{source}: sweep.name {name!r}: letters, digits, '-' and '_' only (a subject token)"
        )
    return Sweep(name=name, settings=config.sweep, runs=runs, source=str(source))


def _scoped(params: Any) -> set[str]:
    """The policies that `policy.key` parameters name."""
    return (
        {key.split(".", 1)[0] for key in params if "." in key}
        if isinstance(params, dict)
        else set()
    )


def _own_params(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with the policy parameters its policy takes (`own_params`)."""
    params = fields.get("policy_params")
    if not isinstance(params, dict) or not _scoped(params):
        return fields
    return fields | {"policy_params": own_params(fields.get("policy", "fifo"), params)}


def _check_report(config: SweepFile, runs: list[Run], source: Path) -> None:
    """`[report]` names a field the runs vary, a scheme they run, and a baseline where needed."""
    report = config.report
    varied = {*config.grid, *(key for variant in config.runs for key in variant)}
    if report.x != "load" and report.x not in varied:
        raise ConfigError(
            f"{source}: report.x: {report.x!r} is no field the grid or the runs vary "
            f"({', '.join(sorted(varied)) or 'none'})"
        )
    schemes = sorted({run.spec.scheme for run in runs})
    if report.baseline is not None and report.baseline not in schemes:
        raise ConfigError(
            f"{source}: report.baseline: {report.baseline!r} is no run's scheme "
            f"({', '.join(schemes)})"
        )
    if report.figures and "jct_improvement" in report.figures and report.baseline is None:
        raise ConfigError(
            f"{source}: report.figures: jct_improvement needs report.baseline, the scheme "
            "to compare with"
        )


def _resolve_paths(spec: RunSpec, folder: Path) -> RunSpec:
    changes = {}
    for field in FILE_FIELDS:
        value = getattr(spec, field)
        if value is None or (field == "throughputs" and value == "default"):
            continue
        candidate = folder / value
        if field == "cluster_spec" and not candidate.exists():
            continue  # `32x4`, not a file
        changes[field] = str(candidate.resolve())
    return msgspec.structs.replace(spec, **changes)


def _digest(path: Path) -> str:
    """sha256 of a file, or of a folder's files with their relative names."""
    h = hashlib.sha256()
    if path.is_dir():
        for item in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(str(item.relative_to(path)).encode() + b"\0")
            h.update(hashlib.sha256(item.read_bytes()).digest())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def _inputs(spec: RunSpec, source: Path, where: str) -> list[InputFile]:
    found = []
    for field in FILE_FIELDS:
        value = getattr(spec, field)
        if value is None or (field == "throughputs" and value == "default"):
            continue
        path = Path(value)
        if field == "cluster_spec" and not path.exists():
            continue
        if not path.exists():
            raise ConfigError(f"{source}: {where}.{field}: {value} does not exist")
        found.append(InputFile(field, str(path), _digest(path), path.is_dir()))
    return found


def run_id(spec: RunSpec, inputs: list[InputFile]) -> str:
    """A hash of what determines the run's results: its options, with the contents of the files
    it reads in place of their paths, and the code that runs it (`code_digest`): a sweep run
    again after its policy's code changed runs again."""
    digests = {i.field: i.digest for i in inputs}
    fields = msgspec.to_builtins(spec) | digests
    fields.pop("label", None)  # a name, not an input
    text = msgspec.json.encode({"code": code_digest(spec), "run": fields}, order="sorted")
    return hashlib.sha256(text).hexdigest()[:16]


RESULT_CODE = ("shared", "services", "policies", "workloads", "run")
"""gpuyard's parts that decide a simulation's results (not the CLI, sweeps or reports; `run` holds
the simulation's driver, with its comparisons)."""


def code_digest(spec: RunSpec) -> str:
    """sha256 (16 hex digits) of the source a run's results depend on: gpuyard's services, wire
    contract, policies, workloads and simulation driver, and the modules of any third-party
    policy the run names."""
    from gpuyard.shared.policy import admission_policies, placement_policies, scheduling_policies

    roots = set(_gpuyard_sources())
    for registry, name in ((scheduling_policies, spec.policy), (admission_policies, spec.admission),
                           (placement_policies, spec.placement)):  # fmt: skip
        if name is None:  # the default (one of gpuyard's own)
            continue
        with contextlib.suppress(Exception):  # an unknown policy fails the run, with its message
            module = registry.get(name).__module__
            if module.split(".")[0] != "gpuyard":  # gpuyard's own policies are counted above
                roots.add(_package_source(module))
    h = hashlib.sha256(gpuyard.__version__.encode())
    for root in sorted(roots):
        h.update(_source_digest(root).encode())
    return h.hexdigest()[:16]


@functools.cache
def _gpuyard_sources() -> tuple[str, ...]:
    import gpuyard.services
    import gpuyard.shared

    here = Path(gpuyard.__file__).parent
    found = {Path(gpuyard.shared.__file__).parent, Path(gpuyard.services.__file__).parent}
    found |= {here / name for name in RESULT_CODE[2:]}
    return tuple(sorted(str(path) for path in found))


def _package_source(module: str) -> str:
    """The folder of a module's top-level package (or the module's own file)."""
    top = importlib.util.find_spec(module.split(".")[0])
    if top is not None and top.submodule_search_locations:
        return str(next(iter(top.submodule_search_locations)))
    return top.origin if top is not None and top.origin else module


@functools.cache
def _source_digest(root: str) -> str:
    """sha256 of the Python files under `root` (or of `root` itself), with their names."""
    path = Path(root)
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
    h = hashlib.sha256(root.encode() if not files else b"")
    for item in files:
        h.update(str(item.relative_to(path) if path.is_dir() else item.name).encode() + b"\0")
        h.update(hashlib.sha256(item.read_bytes()).digest())
    return h.hexdigest()


def _name_runs(runs: list[Run], axes: list[str], variants: list[str]) -> None:
    """`las-load10-seed0`: the scheme, then the run's value of each of `axes` but the scheme's
    (a file: its name's stem); runs still alike get their value of each of `variants` too (those
    it has), and any still alike a part of their run id."""
    for run in runs:
        run.name = _name(run, axes)
    for alike in _alike(runs):
        for run in alike:
            run.name = _name(
                run, [*axes, *(v for v in variants if getattr(run.spec, v) is not None)]
            )
    for alike in _alike(runs):
        for run in alike:
            run.name += f"-{run.run_id[:6]}"


def _name(run: Run, axes: list[str]) -> str:
    parts = [run.spec.scheme]
    for axis in axes:
        if axis == "label" or (axis == "policy" and run.spec.label is None):
            continue  # (the scheme's name, first)
        value = getattr(run.spec, axis)
        if axis in FILE_FIELDS and value:
            value = Path(value).stem
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(f"{axis}{shown}" if axis in ("load", "seed") else f"{axis}={shown}")
    return "-".join(re.sub(r"[^A-Za-z0-9_=.-]+", "_", part).strip("_") for part in parts)


def _alike(runs: list[Run]) -> list[list[Run]]:
    """The groups of runs that share a name."""
    by_name: dict[str, list[Run]] = {}
    for run in runs:
        by_name.setdefault(run.name, []).append(run)
    return [group for group in by_name.values() if len(group) > 1]


def _check(spec: RunSpec, source: Path, where: str) -> None:
    """What can be checked before anything runs: the options and the policies' parameters."""
    from gpuyard.run.build import check_workload, sim_options

    try:
        check_workload(spec)
        sim_options(spec)
    except (ValueError, OSError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{source}: {where} ({spec.scheme}): {exc}") from None

"""`RunSpec`: one simulation, typed: the options of `gpuyard sim` that decide its results (same
names, `_` for `-`), as a sweep file writes them. Where and how it runs (its server, its output
folder, its log level) is `RunPlace`'s."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta, Struct

from gpuyard.shared.connection import NatsAuth

ParamValue = str | int | float | bool | list[str | int | float | bool]
PositiveInt = Annotated[int, Meta(gt=0)]
NonNegative = Annotated[float, Meta(ge=0)]
PresetName = Literal["blox", "gavel", "elasticflow", "bftrainer", "pollux", "sia"]
GeneratorName = Literal["blox", "gavel", "elasticflow", "helios", "seren", "kalos", "pai", "philly"]
"""The reference systems' generators, then those calibrated on published cluster statistics
(`gpuyard.workloads.calibrated`)."""

DEFAULT_ADMISSION = "accept-all"
DEFAULT_PLACEMENT = "consolidated"


class RunSpec(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One simulation: the options of `gpuyard sim` (same names, `_` for `-`), typed. A field
    left out takes `gpuyard sim`'s default."""

    label: str | None = None
    """How the run's scheme is called in tables and plots (default: the policy)."""
    policy: str = "fifo"
    policy_params: dict[str, ParamValue] = {}
    queues: str | None = None
    """The queues file (`--queues`, Kueue's ClusterQueues and cohorts): the `kueue` policy's
    parameters."""
    admission: str | None = None
    """Default: `accept-all`, or the preset's (`elasticflow`), as `gpuyard sim`."""
    admission_params: dict[str, ParamValue] = {}
    placement: str | None = None
    """Default: `consolidated`, or the preset's (`elasticflow`)."""
    placement_params: dict[str, ParamValue] = {}
    preset: PresetName | None = None
    """A reference's simulator semantics (`--blox`, `--gavel`, `--elasticflow`, `--bftrainer`,
    `--pollux`, `--sia`)."""
    as_intended: bool = False
    """With a preset: where the reference's code has a bug (docs/fidelity.md), do what it meant
    rather than what it does (`--as-intended`)."""
    round_s: Annotated[float, Meta(gt=0)] | None = None
    mode: Literal["rounds", "events", "slots"] | None = None
    """Default: `events`, or the preset's (`blox`: `rounds`; `elasticflow`: the scheme's)."""
    cluster_spec: str | None = None
    """Default: `32x4`, or no nodes but the replay's with `node_events` (as `gpuyard sim`)."""
    throughputs: str = "default"
    profiles: str | None = None
    """A folder of models' profiles (Pollux's `traces/`): jobs of those models train at their
    goodput (`--profiles`; `--pollux`: the `traces/` folder beside the workload's; `--sia`:
    Sia's per-GPU-type `traces/`, by default two folders above the workload's)."""
    generator: GeneratorName | None = None
    jobs: PositiveInt | None = None
    load: Annotated[float, Meta(gt=0)] | None = None
    seed: Annotated[int, Meta(ge=0)] | None = None
    gpu_demand: str | None = None
    """The blox generator's `GPUS:WEIGHT,...` (`--gpu-demand`)."""
    deadline_factor: str | None = None
    """The elasticflow generator's deadline factor, `F` or `MIN:MAX` (`--deadline-factor`): a
    job's deadline is its arrival plus the factor (drawn per job from MIN:MAX) times its
    duration. Default 0.5:1.5, ElasticFlow's."""
    best_effort_share: Annotated[float, Meta(ge=0, le=1)] | None = None
    """The elasticflow generator's share of best-effort jobs, without a deadline
    (`--best-effort-share`; default 0)."""
    multi_gpu: bool = False
    users: PositiveInt | None = None
    """Generators: the jobs spread over this many users, `user0`, `user1`, ..., each job's drawn
    uniformly at random (`--users`; seeded, apart from the generator's own draws)."""
    trace: str | None = None
    trace_format: str | None = None
    skip_bad: bool = False
    philly_reading: Literal["blox", "plain", "attempts"] | None = None
    cpu_jobs: Literal["skip", "keep"] | None = None
    """Helios, Acme and openb traces: leave out their CPU-only jobs (`skip`, the default) or keep them,
    as one-GPU jobs (`--cpu-jobs`)."""
    window: str | None = None
    """Gavel's measurement window, `FIRST:END` (`--window`)."""
    node_events: str | None = None
    nodes_from: str | None = None
    start: str | None = None
    churn_node_gpus: PositiveInt = 1
    checkpoint_s: NonNegative = 0.0
    restore_s: NonNegative = 0.0
    min_run_s: NonNegative = 0.0
    default_time_limit_s: Annotated[float, Meta(gt=0)] | None = None
    """The time limit of a job without one (`--default-time-limit`; Slurm's DefaultTime)."""
    max_time_limit_s: Annotated[float, Meta(gt=0)] | None = None
    """The longest a job may ask for (`--max-time-limit`; Slurm's MaxTime): more is declined."""

    @property
    def scheme(self) -> str:
        return self.label or self.policy


@dataclass(frozen=True, kw_only=True)
class RunPlace:
    """Where and how a run runs, which does not change its results."""

    out: Path
    """Its output folder."""
    nats_url: str | None = None
    """A server to run on (None: a private one of its own)."""
    cluster: str = "sim"
    """The namespace of its subjects."""
    auth: NatsAuth = field(default_factory=NatsAuth)
    """How it connects to `nats_url`."""
    external: frozenset[str] = frozenset()
    """Services already running on `nats_url`: not started."""
    processes: bool = False
    """One OS process per service."""
    lost_after_s: float = 5.0
    """With `processes`: a service process gone this long ends the run, with partial results."""
    durable: bool = False
    """Services keep their state in JetStream key-value buckets, as on a real cluster."""
    log_level: str = "info"
    json: bool = False
    """The summary as JSON on stdout."""
    strict: bool = False
    """Jobs no node of the cluster can hold make the run fail (exit 1); else a warning."""


def parse_window(text: str) -> tuple[int, int]:
    """`FIRST:END`: jobs FIRST to END - 1 (0 <= FIRST < END); ValueError otherwise."""
    first, sep, end = text.partition(":")
    try:
        window = (int(first), int(end))
    except ValueError:
        window = None
    if not sep or window is None or not 0 <= window[0] < window[1]:
        raise ValueError(f"{text!r} is not FIRST:END with 0 <= FIRST < END (jobs FIRST to END - 1)")
    return window


def checked_number(
    kind: type[int] | type[float], text: str, *, gt: float | None = None, ge: float | None = None,
    le: float | None = None,
) -> int | float:  # fmt: skip
    """`text` as an int or a finite float within the given bound; ValueError naming the bound."""
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    if gt is not None and not value > gt:
        raise ValueError(f"must be greater than {gt:g}, not {text}")
    if ge is not None and not value >= ge:
        raise ValueError(f"must be {ge:g} or more, not {text}")
    if le is not None and not value <= le:
        raise ValueError(f"must be {le:g} or less, not {text}")
    return value


def parse_deadline_factor(text: str) -> tuple[float, float]:
    """`1.5` -> (1.5, 1.5); `0.5:1.5` -> (0.5, 1.5) (0 < MIN <= MAX); ValueError otherwise."""
    low, sep, high = text.partition(":")
    try:
        least = float(checked_number(float, low.strip(), gt=0))
        most = float(checked_number(float, high.strip(), gt=0)) if sep else least
    except ValueError as exc:
        raise ValueError(f"{text!r} is not FACTOR or MIN:MAX ({exc})") from None
    if least > most:
        raise ValueError(f"{text!r}: MIN is greater than MAX")
    return least, most


def parse_demand(text: str) -> dict[int, float]:
    """`1:0.7,2:0.1,4:0.15,8:0.05` -> {1: 0.7, ...}; `4` -> {4: 1.0}; ValueError otherwise."""
    demand: dict[int, float] = {}
    for part in text.split(","):
        gpus, sep, weight = part.partition(":")
        try:
            count = int(checked_number(int, gpus.strip(), gt=0))
            demand[count] = float(checked_number(float, weight.strip(), ge=0)) if sep else 1.0
        except ValueError as exc:
            raise ValueError(f"{part.strip()!r} is not GPUS:WEIGHT ({exc})") from None
    if not any(demand.values()):
        raise ValueError(f"{text!r}: every weight is 0")
    return demand

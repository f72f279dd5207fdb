"""The policy API: what admission, scheduling and placement policies see, return, and how they are found.

A policy is a small class with typed parameters (a msgspec Struct named `Params`) and one pure method.
It never does I/O and never reads the OS clock: time comes in `now`. Policies are registered by name;
third-party packages add their own through the entry-point groups `gpuyard.scheduling`,
`gpuyard.admission` and `gpuyard.placement` (see docs/writing-a-policy.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, ClassVar, Generic, Literal, TypeVar

import msgspec
from msgspec import Struct

from .model import Allocation, GpuRef, JobSpec


class NoParams(Struct, forbid_unknown_fields=True):
    """Parameters of a policy that takes none."""


# --------------------------------------------------------------------------- views


class JobView(Struct, kw_only=True):
    """One active job as the scheduler knows it at `now`. Read-only for policies."""

    job_id: str
    seq: int
    """Admission order (unique): the stable tie-break."""
    spec: JobSpec
    state: Literal["queued", "running"]
    submit_time: float
    gpus: int = 0
    """GPUs held now (0 while queued)."""
    gpu_type: str | None = None
    attained_service: float = 0.0
    """GPU-seconds received so far, the current run included."""
    executed_time: float = 0.0
    """Seconds run so far, whatever the GPU count."""
    rounds_run: int = 0
    """Scheduling rounds in which the job held GPUs (Blox's LAS counts these)."""
    remaining_time: float | None = None
    """Estimated seconds left at the requested GPU count; None when the work is unknown."""
    queued_since: float | None = None
    """When the job last began to wait; None while running."""
    first_start: float | None = None
    preemptions: int = 0


class ClusterView(Struct, kw_only=True):
    """Usable GPUs per type (nodes that are up) and the round length."""

    capacity: dict[str, int]
    round_s: float

    @property
    def total_gpus(self) -> int:
        return sum(self.capacity.values())


class SchedulingInput(Struct, kw_only=True):
    now: float
    jobs: list[JobView]
    """Active jobs (queued and running) in admission order."""
    cluster: ClusterView


class AdmissionInput(Struct, kw_only=True):
    now: float
    job: JobSpec
    cluster: ClusterView
    active_gpu_demand: int
    """GPUs requested by admitted jobs that have not finished."""
    active_jobs: int
    tenant_gpu_demand: dict[str, int] = {}


class AdmissionDecision(Struct):
    verdict: Literal["admit", "hold", "reject"]
    reason: str = ""


class NodeView(Struct, kw_only=True):
    node_id: str
    gpu_type: str
    usable: list[int]
    """GPU indices this decision may give out (see PlacementInput)."""


class PlacementInput(Struct, kw_only=True):
    """What to place and where it can go.

    Normally (`PlacementPolicy.rearranges` False) the service keeps every running job whose
    allocation did not change on its GPUs, and the policy sees only the other allocations and
    the GPUs they may use: the free ones plus those of jobs being stopped or resized (nodes with
    none are left out). A policy that rearranges sees every allocation and every healthy GPU.
    """

    now: float
    allocations: list[Allocation]
    """What to place, most important first."""
    current: dict[str, list[GpuRef]]
    """Where the jobs among `allocations` run now, if they run."""
    nodes: list[NodeView]


# --------------------------------------------------------------------------- interfaces

P = TypeVar("P", bound="Policy")


class Policy:
    """Base of every policy: typed parameters and a registry name."""

    Params: ClassVar[type[Struct]] = NoParams
    kind: ClassVar[str] = ""

    def __init__(self, params: Struct | None = None) -> None:
        self.params: Any = params if params is not None else self.Params()


class SchedulingPolicy(Policy):
    kind = "scheduling"
    elastic: ClassVar[bool] = False
    """True when freed GPUs may change running jobs' shares (not only start queued jobs)."""

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        """Jobs to run from now on, most important first. Running jobs left out are preempted."""
        raise NotImplementedError

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        """The earliest time at which the decision may change with time alone (None: only events)."""
        return None


class AdmissionPolicy(Policy):
    kind = "admission"
    uses_load: ClassVar[bool] = True
    """False if `decide` ignores the load figures (the service then need not fetch them)."""
    in_order: ClassVar[bool] = True
    """Held jobs are admitted strictly in arrival order (a FIFO overflow queue, as in Blox); with
    False, any held job that the policy now admits goes ahead."""

    def decide(self, inp: AdmissionInput) -> AdmissionDecision:
        raise NotImplementedError


class PlacementPolicy(Policy):
    kind = "placement"

    @property
    def rearranges(self) -> bool:
        """True if the policy may move jobs whose allocation did not change (see PlacementInput)."""
        return False

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        """GPUs for each allocation it can place; an allocation left out stays queued."""
        raise NotImplementedError


# --------------------------------------------------------------------------- registry


class PolicyError(ValueError):
    """An unknown policy or bad parameters; the message names what is wrong."""


class Registry(Generic[P]):
    """Policies of one kind by name: built-ins and third-party ones alike come from entry points."""

    def __init__(self, kind: str, base: type[P]) -> None:
        self.kind = kind
        self.base = base
        self._classes: dict[str, type[P]] = {}
        self._loaded = False

    @property
    def group(self) -> str:
        return f"gpuyard.{self.kind}"

    def register(self, name: str, cls: type[P]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise PolicyError(f"{self.kind} policy {name!r}: {cls!r} is not a {self.base.__name__}")
        self._classes[name] = cls

    def _load_entry_points(self, *, again: bool = False) -> None:
        if self._loaded and not again:
            return
        self._loaded = True
        for ep in entry_points(group=self.group):
            if ep.name not in self._classes:
                self.register(ep.name, ep.load())

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted(self._classes)

    def get(self, name: str) -> type[P]:
        self._load_entry_points()
        if name not in self._classes:
            self._load_entry_points(again=True)  # a package installed since we last looked
        try:
            return self._classes[name]
        except KeyError:
            raise PolicyError(
                f"unknown {self.kind} policy {name!r}; known: {', '.join(self.names()) or 'none'}"
            ) from None

    def create(self, name: str, params: Mapping[str, Any] | None = None) -> P:
        """Instantiate by name; string values (from a command line) are converted to the field types."""
        cls = self.get(name)
        try:
            parsed = msgspec.convert(dict(params or {}), cls.Params, strict=False)
        except msgspec.ValidationError as exc:
            fields = ", ".join(f.name for f in msgspec.structs.fields(cls.Params)) or "none"
            raise PolicyError(
                f"{self.kind} policy {name!r}: bad parameter: {exc} (parameters: {fields})"
            ) from None
        return cls(parsed)


scheduling_policies: Registry[SchedulingPolicy] = Registry("scheduling", SchedulingPolicy)
admission_policies: Registry[AdmissionPolicy] = Registry("admission", AdmissionPolicy)
placement_policies: Registry[PlacementPolicy] = Registry("placement", PlacementPolicy)


def parse_params(pairs: list[str]) -> dict[str, str]:
    """`["k=v", ...]` from a command line into a dict; the values are converted by `Registry.create`."""
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PolicyError(f"parameter {pair!r} is not KEY=VALUE")
        params[key.strip()] = value.strip()
    return params

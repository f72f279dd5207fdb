"""What policies see: jobs, the cluster and its throughputs, at one instant.

A `JobView` is a job's `JobRecord` (the scheduler's own record, never copied) seen at `now`: it adds
what changes with time alone, the current run's service and progress. Views are read-only for
policies. `ClusterView` has the usable GPUs per type, the nodes when a policy needs them
(`Needs.nodes`), and the throughput model behind `rate()`. Inputs and node views are msgspec
Structs, as the policies' answers are: the services build several for every request.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

import msgspec
from msgspec import Struct

from ..model import ANY_GPU, GoodputHints, JobRecord, JobSpec
from ..throughput import LinearModel, ThroughputModel

_NEUTRAL_MODEL = LinearModel()
"""Every job type scales linearly on every GPU type: views built by hand (tests) use this."""


class ViewContext:
    """What every view of one decision shares: the time, the round length and the throughputs."""

    __slots__ = ("model", "now", "round_s")

    def __init__(self, now: float, round_s: float, model: ThroughputModel) -> None:
        self.now = now
        self.round_s = round_s
        self.model = model


class JobView:
    """One job at `now`, read-only. Built by the services with `JobView.of(record, context)`; in
    tests, from the record's fields: `JobView(job_id="a", seq=0, spec=spec, state="queued",
    submit_time=0.0)` (the input it is given to supplies the time)."""

    __slots__ = ("_ctx", "record")

    def __init__(self, record: JobRecord | None = None, **fields: Any) -> None:
        if record is None:
            fields.setdefault("admit_time", fields.get("submit_time", 0.0))
            record = JobRecord(**fields)
        self.record = record
        self._ctx: ViewContext | None = None

    @classmethod
    def of(cls, record: JobRecord, context: ViewContext) -> JobView:
        view = cls.__new__(cls)
        view.record = record
        view._ctx = context
        return view

    def bind(self, context: ViewContext) -> None:
        """Give a view built by hand the time and model of the input it is part of."""
        if self._ctx is None:
            self._ctx = context

    def __repr__(self) -> str:
        r = self.record
        return f"JobView({r.job_id!r}, {r.state}, gpus={r.gpus}, type={r.gpu_type})"

    # --------------------------------------------------------------- the record as it is

    @property
    def job_id(self) -> str:
        return self.record.job_id

    @property
    def seq(self) -> int:
        """Admission order (unique): the stable tie-break."""
        return self.record.seq

    @property
    def spec(self) -> JobSpec:
        return self.record.spec

    @property
    def state(self) -> str:
        """`queued` or `running` (a finished job, see `Needs.finished_jobs`: how it ended)."""
        return self.record.state

    @property
    def running(self) -> bool:
        return self.record.state == "running"

    @property
    def submit_time(self) -> float:
        return self.record.submit_time

    @property
    def gpus(self) -> int:
        """GPUs held now (0 while queued)."""
        return self.record.gpus

    @property
    def gpu_type(self) -> str | None:
        """The GPU type of the current run (None while queued)."""
        return self.record.gpu_type

    @property
    def nodes(self) -> list[str]:
        """The nodes of its current run. A policy that reads them declares `Needs(job_nodes=True)`:
        otherwise a simulation may decide again before placement said where a job started at an
        earlier instant of the same request runs (empty until then)."""
        return self.record.nodes

    @property
    def shares_with(self) -> str | None:
        return self.record.shares_with

    @property
    def queued_since(self) -> float | None:
        """When the job last began to wait; None while running."""
        return self.record.queued_since

    @property
    def first_start(self) -> float | None:
        return self.record.first_start

    @property
    def end_time(self) -> float | None:
        return self.record.end_time

    @property
    def preemptions(self) -> int:
        return self.record.preemptions

    @property
    def goodput(self) -> GoodputHints | None:
        """The job's latest goodput hints (a job that adapts its batch size), None before any."""
        return self.record.goodput

    # --------------------------------------------------------------- at now

    @property
    def now(self) -> float:
        return self._ctx.now if self._ctx is not None else self.record.run_start

    def _ran(self) -> float:
        """Seconds of the current run up to now (0 unless running)."""
        r = self.record
        if r.state != "running" or self._ctx is None:
            return 0.0
        return self._ctx.now - r.run_start

    @property
    def executed_time(self) -> float:
        """Seconds run so far, whatever the GPU count, the current run included."""
        return self.record.executed_time + self._ran()

    @property
    def attained_service(self) -> float:
        """GPU-seconds received so far, the current run included."""
        return self.record.gpu_seconds + self._ran() * self.record.gpus

    @property
    def rounds_run(self) -> int:
        """Scheduling rounds of service received (Blox's LAS counts these): seconds run over the
        round length, whether or not a round was actually held (idle rounds are skipped)."""
        round_s = self._ctx.round_s if self._ctx is not None else 0.0
        if round_s <= 0:
            return 0
        return math.floor(self.executed_time / round_s + 1e-9)

    @property
    def total_steps(self) -> float | None:
        """The job's work in steps (None: unknown, the job runs until it exits)."""
        r = self.record
        if r.total_steps is not None:
            return r.total_steps
        spec = r.spec
        if spec.total_steps is not None:
            return spec.total_steps
        if spec.duration is None:
            return None
        model = self._model()
        return spec.duration * model.throughput(
            spec.job_type, model.reference_gpu_type, spec.num_gpus
        )

    @property
    def steps_done(self) -> float:
        """Steps done so far: the last report plus the current run's rate since then."""
        r = self.record
        if r.state != "running" or self._ctx is None:
            return r.steps_done
        return r.steps_done + r.rate * (self._ctx.now - r.progress_at)

    @property
    def remaining_steps(self) -> float | None:
        # (`total_steps` and `steps_done` written out: sort keys read this for every job at
        # every decision, and the properties' calls were most of an SRTF decision)
        r = self.record
        total = r.total_steps if r.total_steps is not None else self.total_steps
        if total is None:
            return None
        done = r.steps_done
        if r.state == "running" and self._ctx is not None:
            done += r.rate * (self._ctx.now - r.progress_at)
        return max(total - done, 0.0)

    @property
    def remaining_time(self) -> float | None:
        """Seconds left: at the current run's rate while running, else at the requested GPU count
        on the throughput model's reference type. None when the work is unknown (or no rate)."""
        left = self.remaining_steps
        if left is None:
            return None
        r = self.record
        rate = (
            r.rate if r.state == "running" and r.rate > 0 else self.rate(ANY_GPU, r.spec.num_gpus)
        )
        return left / rate if rate > 0 else None

    def rate(self, gpu_type: str, num_gpus: int) -> float:
        """This job's steps/s on `num_gpus` GPUs of `gpu_type` (0: it cannot run there)."""
        return self._model().throughput(self.record.spec.job_type, gpu_type, num_gpus)

    def _model(self) -> ThroughputModel:
        return self._ctx.model if self._ctx is not None else _NEUTRAL_MODEL


class NodeStatus(Struct, frozen=True):
    """A node as the scheduler sees it (`Needs.nodes`)."""

    node_id: str
    gpu_type: str
    num_gpus: int
    up: bool = True
    down_since: float | None = None


class ClusterView(Struct, kw_only=True):
    """Usable GPUs per type (nodes that are up), the round length, the nodes (when the policy
    needs them) and the throughput model behind `rate()`."""

    capacity: dict[str, int]
    round_s: float = 300.0
    nodes: list[NodeStatus] = []
    throughputs: ThroughputModel = _NEUTRAL_MODEL

    @property
    def total_gpus(self) -> int:
        return sum(self.capacity.values())

    @property
    def types(self) -> list[str]:
        """GPU types with usable GPUs, in a fixed (sorted) order."""
        return sorted(t for t, n in self.capacity.items() if n > 0)

    def rate(self, job: JobView, gpu_type: str, num_gpus: int) -> float:
        """`job`'s steps/s on `num_gpus` GPUs of `gpu_type` (0: it cannot run there)."""
        return self.throughputs.throughput(job.spec.job_type, gpu_type, num_gpus)

    def supports(self, job: JobView, gpu_type: str, num_gpus: int) -> bool:
        return self.rate(job, gpu_type, num_gpus) > 0

    def pair_rates(
        self, job: JobView, other: JobView, gpu_type: str, num_gpus: int
    ) -> tuple[float, float]:
        """The steps/s of `job` and `other` sharing the same `num_gpus` GPUs of `gpu_type` (0:
        they may not)."""
        return self.throughputs.colocated(
            job.spec.job_type, other.spec.job_type, gpu_type, num_gpus
        )

    def context(self, now: float) -> ViewContext:
        return ViewContext(now, self.round_s, self.throughputs)


class JobList(Sequence[JobView]):
    """The active jobs, in admission order, as the scheduler holds them: the list is made when
    a policy first reads it (its length is known without), so that a policy told only what
    changed (`SchedulingInput.changed`) does not pay, every decision, for a long queue's list."""

    __slots__ = ("_items", "_views")

    def __init__(self, views: Mapping[str, JobView]) -> None:
        self._views = views
        self._items: list[JobView] | None = None

    def _list(self) -> list[JobView]:
        if self._items is None:
            self._items = list(self._views.values())
        return self._items

    def __len__(self) -> int:
        return len(self._views) if self._items is None else len(self._items)

    def __iter__(self) -> Iterator[JobView]:
        return iter(self._list())

    @overload
    def __getitem__(self, i: int) -> JobView: ...
    @overload
    def __getitem__(self, i: slice) -> list[JobView]: ...
    def __getitem__(self, i: int | slice) -> JobView | list[JobView]:
        return self._list()[i]

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JobList({self._list()!r})"


class SchedulingInput(Struct, kw_only=True):
    now: float
    jobs: Sequence[JobView]
    """Active jobs (queued and running) in admission order: a list, or the scheduler's
    `JobList` (read like one, made when first read)."""
    cluster: ClusterView
    finished: list[JobView] = []
    """Jobs that ended, in admission order (only for policies with `Needs.finished_jobs`)."""
    changed: dict[str, JobView | None] | None = None
    """The jobs whose state changed since this policy's last decision (they came, started,
    stopped, were resized or ended), each with its view (None: it is no longer active); None: not
    told (the policy's first decision, or a scheduler that takes
    only whole decisions). Where it is given, the scheduler takes a decision of what changes
    (`Decision.keep_running`). A policy may ignore it."""

    def __post_init__(self) -> None:
        if self.changed is not None:  # (the services' views come bound: a feed is theirs)
            return
        # Views built by hand (tests) take this input's time and model; the services' come bound.
        unbound = [v for v in self.jobs if v._ctx is None]
        unbound += [v for v in self.finished if v._ctx is None]
        if unbound:
            context = self.cluster.context(self.now)
            for view in unbound:
                view.bind(context)


class AdmissionInput(Struct, kw_only=True):
    now: float
    job: JobSpec
    """The job to decide on (with its id and submit time)."""
    cluster: ClusterView
    jobs: list[JobView] = []
    """Admitted jobs that have not ended, those admitted earlier in this request included (only for
    policies with `Needs.jobs`)."""
    next_decision: float | None = None
    """When the scheduler first decides on a job admitted now (its next round boundary, or the
    end of its current slot); None when unknown (then at once). Only with `Needs.jobs`."""

    def __post_init__(self) -> None:
        context = self.cluster.context(self.now)
        for view in self.jobs:
            view.bind(context)


class NodeView(Struct, frozen=True):
    """A node as placement shows it to its policy: the GPU indices this decision may give out,
    and, where jobs ask for shares of GPUs or for CPUs and memory, what is left of those."""

    node_id: str
    gpu_type: str
    usable: list[int]
    """Wholly free GPUs, in increasing order, each once (made so where given otherwise)."""
    shares: dict[int, int] = {}
    """GPUs that jobs hold shares of (`JobSpec.gpu_milli`), never among `usable`: index ->
    thousandths left, for a job asking for a share of a GPU."""
    cpu_milli: int | None = None
    """CPUs left, in thousandths; None: not counted (the node's spec does not give them)."""
    memory_mib: int | None = None
    """Memory left; None: not counted."""
    num_gpus: int = 0
    """All the node's GPUs, free or not (0: not told)."""
    holding: dict[int, int] = {}
    """The jobs running on the node by what they hold there: 0 those holding a share of a GPU,
    k those holding k of its GPUs (placements that keep like jobs together read it)."""

    def __post_init__(self) -> None:
        usable = self.usable
        if len(usable) > 1 and any(a >= b for a, b in itertools.pairwise(usable)):
            msgspec.structs.force_setattr(self, "usable", sorted(set(usable)))

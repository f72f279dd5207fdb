"""The domain model: jobs, GPUs, nodes and clusters.

These Structs travel on the wire (see `contract.py`) and are what policies see. They carry, from the
start, what later policies need: several GPU types in one cluster, elastic min/max GPU demand,
priority and weight, deadlines and a best-effort flag, users and tenants, nodes that join and leave.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$"
Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
"""An identifier safe to use inside a NATS subject token (no spaces, `*`, `>`; dots allowed)."""

DependencyKind = Literal["after", "afterany", "afterok", "afternotok", "singleton"]
DEPENDENCY_KINDS: tuple[DependencyKind, ...] = (
    "after", "afterany", "afterok", "afternotok", "singleton",
)  # fmt: skip


def parse_dependency(text: str) -> list[tuple[DependencyKind, list[str]]]:
    """Slurm's `--dependency`: `afterok:J[:J...]`, `afterany:...`, `afternotok:...`, `after:...`
    (J started) and `singleton`, joined by `,` (every one must hold) -> [(kind, jobs), ...].
    ValueError in one line for anything else (`?`, Slurm's either-or, is not taken)."""
    found: list[tuple[DependencyKind, list[str]]] = []
    for item in text.split(","):
        kind, *jobs = item.strip().split(":")
        if "?" in item:
            raise ValueError(f"dependency {text!r}: `?` (either one) is not taken; `,` joins "
                             "dependencies that must all hold")  # fmt: skip
        if kind not in DEPENDENCY_KINDS:
            raise ValueError(
                f"dependency {item.strip()!r}: not one of {', '.join(DEPENDENCY_KINDS)}"
            )
        if (kind == "singleton") != (not jobs):
            wants = "takes no job" if kind == "singleton" else "names jobs: KIND:J[:J...]"
            raise ValueError(f"dependency {item.strip()!r}: {kind} {wants}")
        for job in jobs:
            if not re.match(NAME_PATTERN, job):
                raise ValueError(f"dependency {item.strip()!r}: {job!r} is not a job id")
        found.append((kind, jobs))
    return found


ARRAY_MAX_TASKS = 100_000


def parse_array(text: str) -> tuple[list[int], int | None]:
    """Slurm's `--array`: `0-99`, `1,3,5-9`, `0-15:4` (a step), each with `%N` (at most N tasks
    at once) -> (the task ids, in order, once each; N or None). ValueError in one line."""
    spec, _, limit_text = text.partition("%")
    limit: int | None = None
    if limit_text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ValueError(f"array {text!r}: %{limit_text}: at most N tasks at once, N >= 1")
        limit = int(limit_text)
    tasks: dict[int, None] = {}
    for part in spec.split(","):
        bounds, _, step_text = part.strip().partition(":")
        low_text, dash, high_text = bounds.partition("-")
        try:
            low, high = int(low_text), int(high_text) if dash else int(low_text)
            step = int(step_text) if step_text else 1
        except ValueError:
            raise ValueError(
                f"array {text!r}: {part.strip()!r} is not N, N-M or N-M:STEP"
            ) from None
        if low < 0 or high < low or step < 1:
            raise ValueError(f"array {text!r}: {part.strip()!r}: need 0 <= N <= M and STEP >= 1")
        tasks |= dict.fromkeys(range(low, high + 1, step))
        if len(tasks) > ARRAY_MAX_TASKS:
            raise ValueError(f"array {text!r}: more than {ARRAY_MAX_TASKS:,} tasks")
    return list(tasks), limit


class ArrayTask(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A job's place in a job array (`gpuyard submit --array`): its task id among `count` tasks
    (from `low` to `high`); at most `limit` of them wait or run at once. `array_id` is the id the
    array's tasks share (admission gives it: the tasks are `<array_id>_<task>`)."""

    task: Annotated[int, Meta(ge=0)]
    count: Annotated[int, Meta(ge=1, le=ARRAY_MAX_TASKS)]
    low: Annotated[int, Meta(ge=0)]
    high: Annotated[int, Meta(ge=0)]
    limit: Annotated[int, Meta(ge=1)] | None = None
    array_id: str = ""


GpuCount = Annotated[int, Meta(ge=1, le=1_000_000)]
Seconds = Annotated[float, Meta(ge=0)]

ANY_GPU = "any"
NEVER_FITS = "can never run here"
"""How admission's reason for a job no node of the cluster can hold begins (then: why)."""
"""GPU type meaning 'no constraint'."""


class BatchLimits(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A real cluster's adaptive job (Pollux's co-adaptive jobs): at each (re)start gpuyard tells
    it the total batch size, per-GPU batch and accumulation steps that maximise its goodput on
    the GPUs it got, within these limits, from the step times and gradient statistics it reports
    (`gpuyard.jobclient`). Its `JobSpec.batch_size` is the initial batch (the reference of its
    statistical efficiency), what it runs with until it has reported any."""

    max_batch_size: Annotated[int, Meta(ge=1)]
    min_local_bsz: Annotated[int, Meta(ge=1)] = 1
    """The smallest per-GPU (atomic) batch worth running."""
    max_local_bsz: Annotated[int, Meta(ge=1)] | None = None
    """The largest per-GPU batch one step holds (its memory); a larger one is split into
    accumulation steps. None: `max_batch_size`."""

    def atomic_range(self) -> tuple[int, int]:
        return self.min_local_bsz, self.max_local_bsz or self.max_batch_size


class JobSpec(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """What a user submits.

    Work is given either as `total_steps` (in the throughput model's steps) or as `duration`
    (seconds the job runs at `num_gpus` GPUs of the throughput model's reference type); with both
    absent the job runs until it exits (real clusters) and simulations reject it.
    Priority: larger is more important.
    """

    num_gpus: GpuCount
    job_id: Name | None = None
    name: str = ""
    job_type: str = "default"
    min_gpus: GpuCount | None = None
    max_gpus: GpuCount | None = None
    gpu_type: str = ANY_GPU
    duration: Annotated[float, Meta(gt=0)] | None = None
    total_steps: Annotated[float, Meta(gt=0)] | None = None
    priority: int = 0
    priority_class: Name | None = None
    """A priority by name, the cluster's queues file giving its value (Kueue's
    WorkloadPriorityClass); the policy that knows it sets `priority`, one that does not refuses
    the job."""
    weight: Annotated[float, Meta(gt=0)] = 1.0
    deadline: Seconds | None = None
    best_effort: bool = False
    user: str = ""
    tenant: str = ""
    submit_time: Seconds | None = None
    command: list[str] = []
    env: dict[str, str] = {}
    processes: Literal["per_gpu", "per_node"] = "per_gpu"
    workdir: str = ""
    """The directory the job's processes start in, an absolute path on the nodes ("": the node
    agent's own). `gpuyard submit` sets it to the submitter's directory, as Slurm does."""
    rescale_up_s: Annotated[float, Meta(ge=0)] = 0.0
    """Growing costs the job this many seconds of its throughput before the change, as lost
    steps (checkpoint, restart at the new size; BFTrainer's Tcup)."""
    rescale_down_s: Annotated[float, Meta(ge=0)] = 0.0
    """Shrinking, or losing a node, costs this many seconds of its throughput (BFTrainer's
    Tcdw)."""
    time_limit_s: Annotated[float, Meta(gt=0)] | None = None
    """The longest the job may run, its runs together (what `gpuyard jobs` shows as ELAPSED):
    past it the job is stopped (SIGTERM, the grace period, SIGKILL) and ends `timeout`."""
    depends_on: str = ""
    """Jobs this one waits for, as Slurm's `--dependency` (`parse_dependency`): e.g.
    `afterok:j3:j4,singleton`. It waits with reason `Dependency`; one that can no longer hold (a
    job it needs completed failed) cancels it (`DependencyNeverSatisfied`)."""
    begin_time: Seconds | None = None
    """Not to start before this time (Slurm's `--begin`), on the clock's seconds (a real
    cluster's: the epoch); None: at once. Admitted at once, it waits with reason `BeginTime`
    until then, then as any job (for its dependencies too)."""
    array: ArrayTask | None = None
    """Its place in a job array (`gpuyard submit --array 0-99%10`): one job per task."""
    gpu_milli: Annotated[int, Meta(ge=1, le=999)] | None = None
    """A share of one GPU, in thousandths (openb's `gpu_milli`, PAI's `plan_gpu`): the job runs
    on one GPU that other such jobs share, up to 1,000 in all (`num_gpus` 1, rigid). None: whole
    GPUs."""
    gpu_types: list[Name] = []
    """The GPU types the job may run on (openb's `V100M16|V100M32`); empty: any (or `gpu_type`,
    which must then be one of them)."""
    cpu_milli: Annotated[int, Meta(ge=0)] = 0
    """CPUs the job asks for, in thousandths, spread over its nodes as its GPUs are (a job on one
    node: all there); counted on nodes whose spec gives their CPUs. 0: none counted."""
    memory_mib: Annotated[int, Meta(ge=0)] = 0
    """Memory the job asks for, spread as `cpu_milli`; counted on nodes that give theirs."""
    batch_size: Annotated[int, Meta(ge=1)] | None = None
    """The total batch size the job trains with (Pollux's workloads: its `batch_size`), for
    models whose progress depends on it (`gpuyard.shared.goodput`); None: the job picks the one
    that maximises its goodput on the GPUs it gets (Pollux's adaptive jobs)."""
    adaptive_batch: BatchLimits | None = None
    """Real clusters: the job adapts its batch size within these limits, `batch_size` (required)
    the initial one (`BatchLimits`); None: it trains at the batch size it chose itself."""
    outcome: Literal["failed", "cancelled"] | None = None
    """How the job ends once its work is done, when a trace recorded that it did not complete
    (a replayed Helios or Acme job that FAILED after an hour fails after an hour); None: it
    completes."""

    def __post_init__(self) -> None:
        # msgspec reports these as ValidationErrors naming the struct; name the field ourselves.
        if self.min_gpus is not None and self.min_gpus > self.num_gpus:
            raise ValueError(f"min_gpus ({self.min_gpus}) must be <= num_gpus ({self.num_gpus})")
        if self.max_gpus is not None and self.max_gpus < self.num_gpus:
            raise ValueError(f"max_gpus ({self.max_gpus}) must be >= num_gpus ({self.num_gpus})")
        if self.workdir and not self.workdir.startswith("/"):
            raise ValueError(f"workdir {self.workdir!r} must be an absolute path")
        if self.depends_on:
            parse_dependency(self.depends_on)
        if self.gpu_milli is not None and (self.num_gpus != 1 or self.elastic):
            raise ValueError(f"gpu_milli ({self.gpu_milli}) is a share of one GPU: num_gpus must "
                             "be 1, and the job rigid")  # fmt: skip
        if (limits := self.adaptive_batch) is not None:
            if self.batch_size is None:
                raise ValueError("adaptive_batch needs batch_size (the initial total batch)")
            if limits.max_batch_size < self.batch_size:
                raise ValueError(f"adaptive_batch.max_batch_size ({limits.max_batch_size}) must "
                                 f"be >= batch_size ({self.batch_size})")  # fmt: skip
            low, high = limits.atomic_range()
            if low > high:
                raise ValueError(f"adaptive_batch.min_local_bsz ({low}) must be <= "
                                 f"max_local_bsz ({high})")  # fmt: skip
        if self.gpu_types and self.gpu_type not in (ANY_GPU, *self.gpu_types):
            raise ValueError(f"gpu_type {self.gpu_type!r} is not among gpu_types "
                             f"{'|'.join(self.gpu_types)}")  # fmt: skip

    @property
    def gpu_range(self) -> tuple[int, int]:
        """(min, max) GPUs; a rigid job has min == max == num_gpus."""
        return (self.min_gpus or self.num_gpus, self.max_gpus or self.num_gpus)

    @property
    def elastic(self) -> bool:
        low, high = self.gpu_range
        return low != high

    def allows(self, gpu_type: str) -> bool:
        """Whether the job may run on GPUs of this (concrete) type."""
        if self.gpu_type != ANY_GPU:
            return gpu_type == self.gpu_type
        return not self.gpu_types or gpu_type in self.gpu_types

    def milli(self, gpus: int) -> int:
        """Thousandths of a GPU the job holds on `gpus` GPUs (its share, or 1,000 a GPU)."""
        return self.gpu_milli if self.gpu_milli is not None else 1000 * gpus


class GpuRef(Struct, array_like=True, frozen=True, order=True):
    """One GPU: the node it is on and its index there."""

    node_id: str
    index: int


class Allocation(Struct, array_like=True, omit_defaults=True):
    """Run `job_id` on `num_gpus` GPUs of `gpu_type` (ANY_GPU: wherever they fit).

    `share_with`: space sharing, run on the very GPUs of that job (both progress at their
    co-located throughput); the pair counts its GPUs once. `nodes`: a placement hint, the nodes
    to use (in order of preference) when they have room. `layout`: exactly this many GPUs on
    each of these nodes (Pollux decides the nodes), taken when they are free, else the job is
    placed as without it.
    """

    job_id: str
    num_gpus: int
    gpu_type: str = ANY_GPU
    share_with: str | None = None
    nodes: list[str] = []
    layout: dict[str, int] = {}


JobState = Literal["queued", "running", "completed", "failed", "cancelled", "timeout"]
ACTIVE_STATES = ("queued", "running")


class GoodputHints(Struct, array_like=True, frozen=True):
    """What a job that adapts its batch size tells its scheduler of its goodput (AdaptDL's
    hints, Pollux OSDI '21): its step-time model fitted to the configurations it ran
    (`gpuyard.shared.goodput.PerfParams`: alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r,
    gamma), its latest gradient statistics, the most replicas it has run on, and the total
    batch size it trains with now (0: not told)."""

    perf: tuple[float, float, float, float, float, float, float]
    grad_sqr: float
    grad_var: float
    max_profiled_replicas: int
    batch_size: int = 0


PROFILE_MAX_CONFIGS = 32
"""The most configurations a job's goodput profile reports (the most recent ones)."""


class StepTimes(Struct, array_like=True, frozen=True):
    """A job's measured step times at one configuration (AdaptDL's profile): `num_nodes` and
    `num_replicas` (GPUs) it ran on, `local_bsz` its per-GPU (atomic) batch; `optim_s` the mean
    seconds of a step that ends with the gradients' all-reduce and the optimizer, `sync_s` the
    part of it spent waiting for the all-reduce (0: not measured), over `optim_steps` steps;
    `accum_s` the mean seconds of an accumulation step (no all-reduce) over `accum_steps` (0:
    none)."""

    num_nodes: Annotated[int, Meta(ge=1)]
    num_replicas: Annotated[int, Meta(ge=1)]
    local_bsz: Annotated[int, Meta(ge=1)]
    optim_s: Annotated[float, Meta(gt=0)]
    sync_s: Annotated[float, Meta(ge=0)]
    optim_steps: Annotated[int, Meta(ge=1)]
    accum_s: Annotated[float, Meta(ge=0)] = 0.0
    accum_steps: Annotated[int, Meta(ge=0)] = 0


class GoodputProfile(Struct, kw_only=True, omit_defaults=True):
    """What an adaptive job measured for its goodput model (`gpuyard.jobclient`): its step times
    by configuration and its latest gradient statistics (`grad_sqr` the squared norm of the
    gradient, `grad_var` the variance of the gradient averaged over `batch_size` samples, the
    total batch it trains with; None: not measured yet). The scheduler fits `GoodputHints` to
    it."""

    times: Annotated[list[StepTimes], Meta(max_length=PROFILE_MAX_CONFIGS)] = []
    grad_sqr: float | None = None
    grad_var: float | None = None
    batch_size: Annotated[int, Meta(ge=0)] = 0


class JobRecord(Struct, kw_only=True):
    """One job as the scheduler keeps it: the same record in memory, in its durable store and on
    the wire (`sched.jobs`, `sched.query`). Policies see it through `JobView` (`shared.policy`),
    which adds what changes with time alone (service attained, steps done so far).

    Times are the clock's (virtual in a simulation). Accumulated quantities cover the runs that
    have ended; the current run, if any, started at `run_start`.
    """

    job_id: str
    seq: int
    """Admission order (unique): the stable tie-break."""
    spec: JobSpec
    state: JobState = "queued"
    submit_time: float
    admit_time: float
    queued_since: float | None = None
    """When the job last began to wait; None while running or ended."""
    first_start: float | None = None
    end_time: float | None = None
    # The current run.
    run_start: float = 0.0
    gpus: int = 0
    """GPUs held now (0 unless running)."""
    gpu_type: str | None = None
    nodes: list[str] = []
    """Nodes whose part of the current run has not exited yet."""
    ran_on: list[str] = []
    """Every node any run of the job was placed on (whose exits about it are believed)."""
    shares_with: str | None = None
    """Space sharing: the job whose GPUs this one runs on too."""
    attempt: int = 0
    """Launches so far: the current run is attempt `attempt - 1` (0 for the first)."""
    # Ended runs.
    executed_time: float = 0.0
    """Seconds run, whatever the GPU count."""
    gpu_seconds: float = 0.0
    preemptions: int = 0
    # Progress, in the throughput model's steps.
    total_steps: float | None = None
    """The job's work; None when unknown (a real job that runs until it exits)."""
    steps_done: float = 0.0
    """Steps done as of `progress_at` (the last report, or the start of the current run)."""
    progress_at: float = 0.0
    rate: float = 0.0
    """Steps per second of the current run (measured, or from the throughput model)."""
    reason: str = ""
    """Why it waits or ended (the last preemption's, exit's or cancellation's reason)."""
    exit_code: int | None = None
    """The exit status of the run that ended it (its first failed part's); None: it ended
    without one (cancelled, or never ran)."""
    cancelling: str = ""
    """A running job cancelled on node agents: why, until every node in `nodes` said its part
    stopped (or was declared lost: it fenced itself). It shows as running until then."""
    requeueing: str = ""
    """A running job requeued on node agents (`sched.requeue`): why, until every node in `nodes`
    said its part stopped; it then waits again. It shows as running until then."""
    hold: Literal["", "user", "admin"] = ""
    """A waiting job held (`sched.hold`) by its owner or by an operator: it starts no more until
    released (reason `JobHeldUser` or `JobHeldAdmin`)."""
    goodput: GoodputHints | None = None
    """The job's latest goodput hints (a job that adapts its batch size; None: none told)."""
    batch_sizes: list[tuple[float, int]] = []
    """When the batch size its hints told changed, and to what (`jobs.csv`'s `batch_sizes`)."""
    unplaced_on: list[str] = []
    """GPU types its allocations named that placement could not place it on since it last
    started (its CPUs, memory or share fit no node of them): a type-agnostic walk tries the
    other types it allows first."""


class NodeSpec(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A machine: its GPUs (all of one type) and where to reach its processes."""

    node_id: Name
    num_gpus: Annotated[int, Meta(ge=0, le=65_536)]
    gpu_type: Name = "gpu"
    address: str = ""
    gpu_memory_mib: int = 0
    gpu_uuids: list[str] = []
    labels: dict[str, str] = {}
    cpu_milli: Annotated[int, Meta(ge=0)] = 0
    """Its CPUs, in thousandths, for jobs that ask for some (`JobSpec.cpu_milli`); 0: not
    counted."""
    memory_mib: Annotated[int, Meta(ge=0)] = 0
    """Its memory for jobs that ask for some; 0: not counted."""


class NodeGroup(Struct, kw_only=True, forbid_unknown_fields=True):
    """`count` identical nodes."""

    count: Annotated[int, Meta(ge=1)]
    gpus_per_node: Annotated[int, Meta(ge=1)]
    gpu_type: Name = "gpu"
    cpu_milli: Annotated[int, Meta(ge=0)] = 0
    """Each node's CPUs in thousandths (`NodeSpec.cpu_milli`); 0: not counted."""
    memory_mib: Annotated[int, Meta(ge=0)] = 0


class ClusterSpec(Struct, kw_only=True, forbid_unknown_fields=True):
    """A simulated (or expected) cluster: groups of identical nodes."""

    groups: list[NodeGroup]

    def nodes(self) -> list[NodeSpec]:
        """The nodes, named `<type>-<n>` in order, each group's numbering continuing the last."""
        nodes: list[NodeSpec] = []
        for group in self.groups:
            for _ in range(group.count):
                nodes.append(
                    NodeSpec(
                        node_id=f"{group.gpu_type}-{len(nodes):04d}",
                        num_gpus=group.gpus_per_node,
                        gpu_type=group.gpu_type,
                        cpu_milli=group.cpu_milli,
                        memory_mib=group.memory_mib,
                    )
                )
        return nodes

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus_per_node for g in self.groups)

    def gpus_by_type(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for g in self.groups:
            totals[g.gpu_type] = totals.get(g.gpu_type, 0) + g.count * g.gpus_per_node
        return totals

    @classmethod
    def parse(cls, text: str) -> ClusterSpec:
        """Parse `32x4`, `32x4:v100` or `36x4:v100,36x4:p100,36x4:k80` (nodes x GPUs per node[:type])."""
        groups = []
        for part in text.split(","):
            m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*(?::\s*([A-Za-z0-9_.-]+))?\s*", part)
            if not m:
                raise ValueError(
                    f"cluster spec {text!r}: part {part!r} is not NODESxGPUS[:TYPE] (e.g. 32x4:v100)"
                )
            if int(m[1]) < 1 or int(m[2]) < 1:
                raise ValueError(
                    f"cluster spec {text!r}: part {part.strip()!r} has no "
                    f"{'nodes' if int(m[1]) < 1 else 'GPUs'} (NODESxGPUS, each at least 1)"
                )
            groups.append(
                {"count": int(m[1]), "gpus_per_node": int(m[2]), "gpu_type": m[3] or "gpu"}
            )
        return msgspec.convert({"groups": groups}, cls)

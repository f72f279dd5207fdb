"""The wire contract: every message that crosses NATS, and the subjects they travel on.

Messages are JSON-encoded msgspec Structs. The contract is versioned (`CONTRACT_VERSION`, sent in the
`Gpuyard-Contract` header); its JSON Schema is exported to `shared/schema/contract-v<N>.json` by
`gpuyard schema` and a test fails when the file and the code drift apart.

Requests are answered either with their reply type or, when the request was bad or failed, with an
`ErrorReply` and the header `Gpuyard-Status: error`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from .model import (
    Allocation,
    GoodputHints,
    GoodputProfile,
    GpuRef,
    JobRecord,
    JobSpec,
    JobState,
    Name,
    NodeSpec,
)

CONTRACT_VERSION = 3
VERSION_HEADER = "Gpuyard-Contract"
STATUS_HEADER = "Gpuyard-Status"


# --------------------------------------------------------------------------- generic replies


class ErrorReply(Struct, kw_only=True):
    """The request could not be served. `field` is the JSON path of the bad field, when one is to blame."""

    error: str
    field: str | None = None
    subject: str = ""


class Ack(Struct, kw_only=True):
    ok: bool = True


class Ping(Struct, kw_only=True):
    pass


class Pong(Struct, kw_only=True):
    service: str
    cluster: str
    version: str
    contract: int = CONTRACT_VERSION
    policy: str | None = None


class ServiceStats(Struct, kw_only=True):
    """`<service>.stats`: where a service's time went, for benchmarks."""

    service: str
    handled: int
    handler_s: float
    """Seconds spent in request handlers, nested requests included."""
    policy_s: float
    """Seconds spent in policy code."""
    decision_s: list[float] = []
    """Seconds of each scheduling decision, in order (the scheduler's policy calls)."""
    decisions_of_changes: int = 0
    """Scheduling decisions that told only what changed (`Decision.keep_running`): they cost
    what they changed, not what runs or waits."""
    requests: dict[str, list[float]]
    """Requests this service made, per subject: [count, seconds waited for the reply]."""


class SetPolicy(Struct, kw_only=True, forbid_unknown_fields=True):
    """`<svc>.policy.set`: swap the service's policy at runtime; it decides from the next request on.

    An unknown policy or bad parameters get an ErrorReply (`field` `$.policy` or `$.params.<name>`)
    and the old policy stays. A swap is recorded as the event `policy.changed`.
    """

    policy: str
    params: dict[str, Any] = {}
    now: float | None = None
    """The caller's clock, for the event (default: the service's wall clock)."""


class PolicyInfo(Struct, kw_only=True):
    """`<svc>.policy` (and the reply to `<svc>.policy.set`): the active policy and its parameters."""

    service: str
    policy: str | None = None
    """None: this service has no policy."""
    params: dict[str, Any] = {}
    """Every parameter, defaults included."""
    previous: str | None = None
    """After a swap: the policy it replaced."""


class Empty(Struct, kw_only=True, forbid_unknown_fields=True):
    """A request with no arguments."""


class PageQuery(Struct, kw_only=True, forbid_unknown_fields=True):
    offset: int = 0
    limit: int = 2000


# --------------------------------------------------------------------------- admission


class SubmitRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """`adm.submit`: one or more jobs. `now` is the client's clock (virtual time in a simulation).

    Held jobs are tried again first; an empty `jobs` list only does that.
    """

    jobs: list[JobSpec]
    now: float | None = None
    tick: bool = False
    """Simulation clocks: after enqueueing, run the scheduling round if one is due (saves a tick)."""
    times: list[float] = []
    """When each job arrived, where they arrived at different times (a simulation's clock tells
    of a quiet window's arrivals together: `SchedulerStatus.quiet_until`, `SubmitReply.batches`);
    each job is decided on at its own time. Empty: all at `now`. With a `now` (a simulation's
    clock), a time after it is a job submitted ahead of its arrival: the scheduler holds it
    until then (`SchedulerStatus.runs_ahead`); on the wall clock none is later than now."""
    until: float | None = None
    """Simulation clocks, with the tick: the scheduler may go on to the arrivals it holds before
    this time, deciding at each, while its decisions change nothing (`SchedulerStatus.reached`)."""


class SubmitResult(Struct, kw_only=True):
    job_id: str
    verdict: Literal["admit", "hold", "reject"]
    reason: str = ""


class SubmitReply(Struct, kw_only=True):
    results: list[SubmitResult]
    held: int = 0
    """Jobs admission holds (from this and earlier submissions), waiting for the load to drop."""
    retry_at: float | None = None
    """When admission wants to decide on held jobs again (a submission with no jobs, then); None:
    when jobs leave. A simulation's clock asks at that time; on the wall clock admission asks
    itself."""
    scheduler: SchedulerStatus | None = None
    """The scheduler's answer to the enqueue, passed back up the chain to the clock."""
    batches: bool = False
    """Admission decides on each job by itself (its policy reads no other jobs, and none is
    held): jobs that arrived at different times may come in one request (`times`)."""


# --------------------------------------------------------------------------- scheduler


class EnqueueRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.enqueue`: admitted jobs (admission -> scheduler). Specs have ids and submit times."""

    now: float
    jobs: list[JobSpec]
    tick: bool = False
    """After enqueueing, run the scheduling round if one is due (the clock's tick, passed on)."""
    declined: int = 0
    """Arrivals of the same submission that admission declined: an event all the same for the
    policies that reschedule at every arrival (`Needs.decide_on_arrival`)."""
    times: list[float] = []
    """When each job was admitted, where at different times (`SubmitRequest.times`); empty: all
    at `now`. A time after `now`: the job arrives then (it is held until a request's time
    reaches it)."""
    until: float | None = None
    """With the tick: go on to the held arrivals before this time (`SubmitRequest.until`)."""


class SchedulerStatus(Struct, kw_only=True):
    """The scheduler's reply to clock-driven requests: when it next needs a tick, and its counts."""

    wake_at: float | None = None
    busy_gpus: int = 0
    queued: int = 0
    running: int = 0
    finished: int = 0
    ran_round: bool = False
    rejected: dict[str, str] = {}
    """Jobs of an enqueue that were refused (duplicate ids), with the reason."""
    commands: int = 0
    """The number of the last `clock.cmds` placement published for the scheduler's applies
    (`ApplyReply.commands`): a simulation's clock handles those before it goes on."""
    quiet_until: float | None = None
    """Jobs that arrive or end before this time are decided on at it at the earliest (rounds: the
    next round boundary; slots: the end of the slot): a clock may tell of them together, at the
    last of their instants, each with its own time (`SubmitRequest.times`, `JobExit.ended_at`).
    None: what comes is decided on when it comes."""
    exit_decides: bool = False
    """An exit would make a decision due (the policy decides at every exit, or jobs wait): a
    quiet window with an exit ends with a decision (a clock tells of the window with it)."""
    changes: list[CountsChange] = []
    """What a request telling of earlier instants (`quiet_until`) changed in the counts, at each
    of those instants, in time order: a clock's timeline has their points."""
    reached: float | None = None
    """The instant the scheduler went on to (`until`), deciding at each held arrival on the way,
    when later than the request's `now`: the counts and the round are of that instant, and
    `changes` has those of the ones before it. None: the request's `now`."""
    wakes: list[float] = []
    """With `reached`: the instants of its own (its policy's wakes, no arrival or exit there)
    the scheduler decided at on the way, up to `reached`, in time order: a clock visits them as
    it would have to tick there (its timeline has their points)."""
    runs_ahead: bool = False
    """A clock may submit jobs ahead of their arrival and ask the scheduler to go on through them
    (`until`): its decisions at an arrival depend on nothing a clock does between instants
    (events or rounds mode, a policy that does not decide on declined arrivals, state not
    stored)."""


class CountsChange(Struct, array_like=True):
    """The change in the scheduler's counts at `time`."""

    time: float
    busy_gpus: int
    queued: int
    running: int


class ClusterChanged(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.cluster_changed`: nodes came or went; decide again."""

    now: float
    lost_jobs: list[str] = []
    """Jobs that were running on nodes that left (placement has stopped them): requeue them."""
    tick: bool = False
    """Also the clock's tick: run the round if one is due (`ExitReport.tick`)."""


class TickRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.tick`: time is `now`; run a round if one is due."""

    now: float
    resolve: bool = False
    """Ask the policy again even if the round mechanism would not yet (Gavel's simulator does
    when nothing runs and nothing more will arrive)."""
    until: float | None = None
    """Go on to the held arrivals before this time (`SubmitRequest.until`)."""
    least_run_s: float | None = None
    """With `until`: no job waiting now (arrived, not running) ends sooner than this after its
    start (a simulation's clock knows: its work left at its most GPUs on the fastest type).
    With this or `least_end`, the scheduler may go on through decisions that only start jobs,
    short of each start's bound; with neither, it stops at the first that commands a node."""
    least_end: float | None = None
    """With `until`: no job that arrives after now ends before this time, however soon it
    starts (None: none is to arrive, or, with `least_run_s` None too, not known)."""
    foreseen: list[ForeseenExits] = []
    """With `until`: the exits the clock foresees, instant by instant (in time order, after now,
    before `until`), which hold if the scheduler decides nothing before them that stops a job
    or starts one that could end by then (`least_run_s`): going on, the scheduler takes each
    instant's at that instant, before its arrivals; stopping sooner, it drops those after where
    it stopped (the clock tells of them again). A simulation's only."""
    steps: dict[str, StepsReport] = {}
    """The simulated nodes' word on jobs' progress since the clock's last request (the steps of
    the jobs their commands stopped, the progress restart pauses took), taken before the round;
    what a real cluster's node agents tell in their command replies and heartbeats."""


class JobExit(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    job_id: str
    node_id: str = ""
    status: Literal["completed", "failed", "stopped", "timeout"]
    """`stopped`: the part was told to stop (preempted, cancelled, fenced) and its processes are
    gone (a job being cancelled ends once each of its nodes said so); `timeout`: the part ran
    out of its launch's `time_limit_s` and was stopped."""
    exit_code: int = 0
    steps_done: float | None = None
    attempt: int | None = None
    """The run that exited (`Launch.attempt`); an exit of an earlier run is stale and ignored."""
    reason: str = ""
    ended_at: float | None = None
    """When the job's work ended, if before the report's `now` (Gavel's rounds: a job's last
    micro-task ends before the round does, while its GPUs stay held until the round's end)."""


class ForeseenExits(Struct, kw_only=True, forbid_unknown_fields=True):
    """The exits a simulation's clock foresees at one instant (`TickRequest.foreseen`)."""

    at: float
    exits: list[JobExit]


class ExitReport(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.exited`: jobs that ended on their own (node agents -> scheduler)."""

    now: float
    exits: list[JobExit]
    tick: bool = False
    """After recording the exits, run the scheduling round if one is due."""
    until: float | None = None
    """With the tick: go on to the held arrivals before this time (`SubmitRequest.until`)."""
    least_run_s: float | None = None
    """With `until`: go on through starts (`TickRequest.least_run_s`)."""
    least_end: float | None = None
    """With `until`: `TickRequest.least_end`."""
    foreseen: list[ForeseenExits] = []
    """With `until`: the exits of the next completions, told of ahead (`TickRequest.foreseen`)."""
    steps: dict[str, StepsReport] = {}
    """The simulation's clock only (`TickRequest.steps`), taken before the exits; a node agent
    reports its jobs' progress in its heartbeats, and may not send this."""


class FinishedQuery(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.finished`: the jobs that ended, in the order they ended, from `taken` on."""

    taken: int = 0
    """How many the caller holds already (it asks again with its count): a scheduler that hands
    its results over forgets those."""
    limit: int = 2000


class FinishedPage(Struct, kw_only=True):
    jobs: list[JobRecord]
    """The jobs that ended from `FinishedQuery.taken` on, in the order they ended."""
    total: int
    """Jobs that ended so far."""
    forgets: bool
    """The scheduler forgets the jobs its caller took (`SchedulerConfig.hand_over_results`):
    they are in no other page from then on."""


class JobsPage(Struct, kw_only=True, omit_defaults=True):
    jobs: list[JobRecord]
    total: int
    next_decision: float | None = None
    """A query with the caller's time (`JobQuery.now`): when the scheduler would first decide on
    a job admitted then (the next round boundary, or the end of the current slot when it merges
    events); None when its rounds run on their own clock."""


class JobQuery(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.query`: jobs by id and/or state (no filter: all), in admission order."""

    job_ids: list[str] = []
    states: list[JobState] = []
    offset: int = 0
    limit: int = 2000
    now: float | None = None
    """The caller's time, for `JobsPage.next_decision` (admission's deadline plans start then)."""
    reasons: bool = False
    """Give each waiting job that never started the reason that holds it now: `Resources` (not
    enough GPUs of a type it can use are free) or `Priority` (they are: the policy starts others
    first, or has not decided since it came), as a person reads it; the stored one otherwise."""


class CancelRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.cancel`: stop these jobs for good (a running one is preempted by the next apply):
    those named, or without names every job not ended that the filters choose (`user`, `states`:
    at least one of them; as `scancel -u U -t S`)."""

    job_ids: list[str] = []
    user: str | None = None
    states: list[Literal["queued", "running"]] = []
    now: float | None = None


class CancelReply(Struct, kw_only=True):
    cancelled: list[str]
    refused: dict[str, str] = {}
    """Jobs that could not be cancelled (unknown, already ended), with the reason."""


class HoldRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.hold`: these waiting jobs start no more until released (`release`: released). A
    user's hold (`JobHeldUser`) its owner may release; an operator's (`JobHeldAdmin`) only an
    operator."""

    job_ids: list[str]
    release: bool = False
    now: float | None = None


class RequeueRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.requeue`: these running jobs stop (checkpointed, as a preemption stops them) and wait
    again; held as well with `hold` (a waiting job named with `hold` is only held)."""

    job_ids: list[str]
    hold: bool = False
    now: float | None = None


class DoneReply(Struct, kw_only=True):
    """What a request about some jobs or nodes did: those it was done to, and those refused with
    the reason."""

    done: list[str]
    refused: dict[str, str] = {}


# --------------------------------------------------------------------------- placement


class RegisterNode(Struct, kw_only=True, forbid_unknown_fields=True):
    """`place.register`: a node agent announces itself (again after a restart)."""

    now: float
    node: NodeSpec
    jobs: list[str] | None = None
    """The jobs the agent was told to launch since it started, whether their parts still run or
    ended (None: not said, as by the simclock)."""
    lease_s: float | None = None
    """The agent's lease: with no answer from placement this long, it stops its jobs (fencing)."""
    grace_s: float | None = None
    """The agent's SIGTERM-to-SIGKILL grace: a fenced node's jobs are gone `lease_s + grace_s`
    after its last contact (placement's `heartbeat_timeout_s` must be longer)."""
    heartbeat_s: float | None = None
    """How often the agent heartbeats: one whose heartbeats are late by a few of these is not
    responding (`gpuyard nodes` marks it), long before it is declared lost."""


class NodesChanged(Struct, kw_only=True, forbid_unknown_fields=True):
    """`place.nodes`: nodes joined (`up`) or left (`gone`: drained, failed, taken back).

    Used by the simclock to replay node churn, many nodes at a time.
    """

    now: float
    up: list[NodeSpec] = []
    gone: list[str] = []
    reason: str = ""


class NodesChangedReply(Struct, kw_only=True):
    lost_jobs: list[str]
    """Jobs that ran on a departed node and were stopped everywhere; the scheduler requeues them."""
    capacity: dict[str, int]
    commands: int = 0
    """The number of the last `clock.cmds` placement published (`ApplyReply.commands`)."""


class ApplyRequest(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """`place.apply`: make the cluster run exactly `allocations` (scheduler -> placement).

    `specs` carries the spec of every allocated job not running now (the node agents need it to
    launch). `released` lists jobs that ended on their own since the last apply.

    With a `base`, the request tells only what changed since that apply: `allocations` are the
    jobs whose allocation changed or that do not run (placed again), `stop` the running jobs no
    longer allocated, and every other job running keeps its GPUs. A base that is not placement's
    last apply (it restarted without its state) is refused (field `$.base`): send every
    allocation then.
    """

    now: float
    allocations: list[Allocation]
    base: int = 0
    """The number of the apply (`ApplyReply.applied`) this one changes; 0: none, `allocations`
    are every allocated job's."""
    stop: list[str] = []
    """With a `base`: the jobs it allocated that this one does not."""
    specs: dict[str, JobSpec] = {}
    released: list[str] = []
    attempts: dict[str, int] = {}
    """The attempt number of each allocated job's next launch (how often it was launched before;
    absent: 0), told to the job and reported back with its exit."""
    time_left: dict[str, float] = {}
    """For each allocated job with a time limit (`JobSpec.time_limit_s`): the seconds it may
    still run, its limit less its runs so far (its next launch's `Launch.time_limit_s`)."""
    batches: dict[str, BatchChoice] = {}
    """For each allocated adaptive job (`JobSpec.adaptive_batch`): the batch its next launch
    trains with (`Launch.batch`)."""


class BatchChoice(Struct, array_like=True, frozen=True):
    """The batch an adaptive job's launch trains with: `batch_size` in all, `local_bsz` per GPU
    and step, `accum_steps` accumulation steps before each optimizer step (batch_size = GPUs x
    local_bsz x (accum_steps + 1)). The job reads it from `GPUYARD_BATCH_SIZE`,
    `GPUYARD_LOCAL_BATCH_SIZE` and `GPUYARD_ACCUM_STEPS`."""

    batch_size: int
    local_bsz: int
    accum_steps: int


class StepsReport(Struct, array_like=True):
    """A job's progress: `steps` done as of time `at` (the clock's), and `rate`: the steps/s its
    current run showed by the job's own clock (real nodes: `JobProgress.rate`; 0 = not measured,
    the scheduler then measures between the reports it receives). `goodput`: the job's goodput
    hints, from a job that adapts its batch size (a simulated one fits them itself); `profile`:
    what a real adaptive job measured (`JobProgress.goodput`), which the scheduler fits hints
    to."""

    steps: float
    at: float
    rate: float = 0.0
    goodput: GoodputHints | None = None
    profile: GoodputProfile | None = None


class StepsUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """`sched.steps`: the progress of running jobs that made less than their rate says (a
    simulated node's restart pauses), at `now`; what a real node agent's heartbeats tell."""

    now: float
    jobs: dict[str, StepsReport]


class ApplyReply(Struct, kw_only=True, omit_defaults=True):
    placed: dict[str, list[GpuRef]]
    """The GPUs of each job started by this apply."""
    started: dict[str, str]
    """Jobs launched by this apply, with the GPU type they got."""
    stopped: list[str]
    unplaced: list[str]
    lost: list[str]
    """Jobs stopped since the last apply because a node they ran on went away."""
    capacity: dict[str, int]
    """Usable GPUs per type now."""
    lost_why: dict[str, str] = {}
    """Why each of `lost` stopped: its node's going (`node gpu7 gone: agent stopped`)."""
    progress: dict[str, StepsReport] = {}
    """What the node agents last reported of the jobs stopped by this apply (at the stop) and of
    those running (from their heartbeats)."""
    settled: bool = False
    """Placement's policy rearranges, placed every allocation, and would place them again where
    they run now (`PlacementPolicy.settled`): applying the same allocations would move nothing."""
    commands: int = 0
    """Simulated nodes: the number of the last `clock.cmds` placement published (0: none yet).
    Those commands are published, not answered: the stopped jobs' progress reaches the scheduler
    from the clock, and the clock handles them before it goes on."""
    applied: int = 0
    """This apply's number (counted across placement's restarts, where it is durable): the base
    of the next apply that tells only what changed (`ApplyRequest.base`)."""
    assures_fit: bool = False
    """Placement places any allocation of whole GPUs of a named type, for a job that asks for
    nothing more, while the capacity counts that many GPUs of the type free (its policy's
    `places_what_fits`, with no node draining, no job lost and no GPU shared): a simulation's
    scheduler may then send its next launches of such jobs at several instants in one request
    (`place.stages`), knowing what each instant's decision leaves free."""


class ApplyStages(Struct, kw_only=True, forbid_unknown_fields=True):
    """`place.stages`: the applies of successive instants in one request (scheduler ->
    placement), applied in order as if sent one after another: the first stage's `base` is
    placement's last apply, each other stage's the one before it. A simulation's scheduler
    sends them where it went on through instants whose decisions only launch jobs that
    placement assured it would place (`ApplyReply.assures_fit`)."""

    stages: list[ApplyRequest]


class ApplyStagesReply(Struct, kw_only=True):
    replies: list[ApplyReply]
    """Each stage's reply, in order."""


class ClusterInfo(Struct, kw_only=True):
    nodes: list[NodeSpec]
    capacity: dict[str, int]
    busy: dict[str, list[GpuRef]]
    down: dict[str, float] = {}
    """Nodes that were up and left, with the time they left (until they come back)."""
    down_why: dict[str, str] = {}
    """Why each of `down` left (`agent stopped`, `no heartbeat for 15 s`, ...)."""
    rearranges: bool = False
    """Placement's policy moves running jobs at every apply (`PlacementPolicy.rearranges`): an
    apply of the allocations that run now may still change where they run."""
    draining: dict[str, str] = {}
    """Nodes an operator drains (`place.drain`), with the reason: they take no new jobs, and those
    running there go on (DRAIN; DRAINED once none is left)."""


class DrainRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """`place.drain`: these nodes take no new jobs while the jobs running there go on
    (`resume`: they take jobs again)."""

    node_ids: list[str]
    resume: bool = False
    reason: str = ""
    now: float | None = None


# --------------------------------------------------------------------------- node agents


class Launch(Struct, kw_only=True, omit_defaults=True):
    """Start this node's part of a job."""

    job_id: str
    spec: JobSpec | None = None
    """What to run. Absent only in a simulation's launches (`clock.cmds`: the simclock has every
    job's spec from the workload); a node agent refuses a launch without it."""
    gpus: list[int]
    world_size: int
    rank_offset: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    attempt: int = 0
    """How often the job was stopped before (its restart count)."""
    share_with: str | None = None
    """Space sharing: the job already running on these GPUs that this one runs beside (its
    processes start at once); without it, a launch waits for the GPUs' holders to exit."""
    time_limit_s: float | None = None
    """Stop this part after it ran this long (its job's time limit less its earlier runs) and
    report its exit as `timeout`."""
    batch: BatchChoice | None = None
    """An adaptive job's batch for this run (`ApplyRequest.batches`), told to its processes in
    `GPUYARD_BATCH_SIZE`, `GPUYARD_LOCAL_BATCH_SIZE` and `GPUYARD_ACCUM_STEPS`."""


class NodeCommand(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """`node.<id>.cmd`: stop these jobs (preempt: checkpoint and exit), then launch those."""

    now: float
    node_id: str
    preempt: list[str] = []
    launch: list[Launch] = []


class NodeCommandReply(Struct, kw_only=True, omit_defaults=True):
    preempted: list[str] = []
    launched: list[str] = []
    progress: dict[str, float] = {}
    """Steps done by each preempted job, as last reported (a simulated node: exactly)."""


class NodeCommands(Struct, kw_only=True, forbid_unknown_fields=True):
    """`clock.cmds`: the commands of one apply (or nodes change) to simulated nodes, published in
    one message (the simclock plays every node: no round trip per node, nor per apply)."""

    commands: list[NodeCommand]
    seq: int
    """This message's number among placement's (from 1; kept across its restarts): the clock
    handles each number once, and waits for the number a reply names (`ApplyReply.commands`)."""


class GpuMetrics(Struct, kw_only=True, omit_defaults=True):
    index: int
    utilization: float | None = None
    """Percent of time a kernel ran over the last sample period (NVML)."""
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None


class JobProgress(Struct, kw_only=True, omit_defaults=True):
    """What a job reported through `gpuyard.jobclient` (one entry per process)."""

    job_id: str
    rank: int = 0
    iterations: int = 0
    samples: int = 0
    metrics: dict[str, float] = {}
    attempt: int = 0
    time: float = 0.0
    rate: float = 0.0
    """Steps/s of this run so far by the job's own clock, from its first report of the run to this
    one (the node agent computes it; 0 until the run has reported twice)."""
    goodput: GoodputProfile | None = None
    """An adaptive job's step times and gradient statistics (`JobClient.profile_step`)."""


class Heartbeat(Struct, kw_only=True, omit_defaults=True):
    """`node.<id>.hb` (publish, node agent -> placement): alive, with GPU metrics and job progress."""

    now: float
    node_id: str
    boot_id: str = ""
    nvml: bool = False
    gpus: list[GpuMetrics] = []
    jobs: list[JobProgress] = []


class HeartbeatsPage(Struct, kw_only=True):
    """`place.heartbeats`: the last heartbeat of every node that sent one, and when it arrived."""

    beats: list[Heartbeat]
    received: dict[str, float]
    every: dict[str, float] = {}
    """How often each node's agent said it heartbeats (`RegisterNode.heartbeat_s`)."""


LOGS_TAIL_MAX = 1 << 20
"""The most bytes of each rank's log one `logs` request asks for (a reply fits in a message)."""


class LogsRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """`node.<id>.logs`: the tail of a job's log files on that node."""

    job_id: Name
    """A job id as jobs are named (no `/`, never `.` or `..`, at most 128 characters): the
    agent reads its own folder for the job, never another."""
    tail_bytes: Annotated[int, Meta(ge=0, le=LOGS_TAIL_MAX)] = 65536


class LogsReply(Struct, kw_only=True):
    lines: list[str] = []


class LogLine(Struct, kw_only=True):
    """`logs.<job_id>` (publish, node agent -> anyone): one line a job process wrote."""

    job_id: str
    node_id: str
    rank: int
    line: str
    time: float


# --------------------------------------------------------------------------- simclock


class RunRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """`clock.run`: start the simulation; the end is the event `clock.done`."""


class Progress(Struct, kw_only=True):
    now: float
    submitted: int
    finished: int
    total: int
    instants: int
    done: bool = False
    error: str | None = None
    compute_gpu_s: float | None = None
    """Round-based simulations (Gavel's semantics): GPU-seconds jobs spent computing (a GPU that
    idles after its job's last step of a round is not counted), for the utilisation."""
    steps_done: float = 0.0
    """Steps (BFTrainer: samples) trained by every job (costs deducted), in the last report
    (`done`) only: the sum over every job is not worth paying at each report."""
    rescale_steps: float = 0.0
    """Steps lost to growing and shrinking jobs (`JobSpec.rescale_up_s`, `rescale_down_s`)."""
    preemption_steps: float = 0.0
    """Steps lost by jobs whose nodes left (`JobSpec.rescale_down_s` of the rate they ran at)."""
    declined: dict[str, str] = msgspec.field(default_factory=dict)
    """The jobs admission declined since the previous report, each with its reason: they have
    no record in the scheduler, and the results (partial ones too) must still list them."""


class TimelinePoint(Struct, array_like=True):
    time: float
    busy_gpus: int
    queued: int
    running: int
    gpus: int
    """Usable GPUs (nodes present) at that time."""


class QueueGpus(Struct, array_like=True):
    """A simulation with queues: the GPUs a queue's jobs hold from `time` on."""

    time: float
    queue: str
    gpus: int


class TimelinePage(Struct, kw_only=True):
    points: list[TimelinePoint]
    total: int
    queues: list[QueueGpus] = []
    """A simulation with queues (`SimClockConfig.queues`): each queue's GPUs where they changed,
    from this page's first point's time to the next page's first point's (the first page's
    from the start, the last's to the end)."""


# --------------------------------------------------------------------------- events


EventType = Literal[
    "job.submitted",
    "job.admitted",
    "job.held",
    "job.rejected",
    "job.queued",
    "job.started",
    "job.preempted",
    "job.resized",
    "job.completed",
    "job.failed",
    "job.cancelled",
    "job.timeout",
    "job.on_hold",
    "job.released",
    "job.requeued",
    "node.up",
    "node.lost",
    "node.draining",
    "node.drained",
    "node.resumed",
    "policy.changed",
]


class Event(Struct, kw_only=True, omit_defaults=True):
    """A fact, published on `evt.<type>` (e.g. `gpuyard.c1.evt.job.started`)."""

    type: EventType
    now: float
    job_id: str | None = None
    node_id: str | None = None
    gpus: list[GpuRef] = []
    reason: str = ""
    service: str = ""
    user: str = ""
    """Admission's job events: who submitted the job (`JobSpec.user`)."""


MESSAGES: tuple[type[Struct], ...] = (
    ErrorReply, Ack, Ping, Pong, ServiceStats, Empty, PageQuery, SubmitRequest, SubmitResult, SubmitReply,
    EnqueueRequest, SchedulerStatus, CountsChange, ClusterChanged, TickRequest, JobExit, ForeseenExits, ExitReport, JobRecord, JobsPage,
    RegisterNode, NodesChanged, NodesChangedReply, ApplyRequest, BatchChoice, StepsReport, StepsUpdate, ApplyReply, ClusterInfo, Launch,
    ApplyStages, ApplyStagesReply, NodeCommand, NodeCommandReply, NodeCommands, RunRequest, Progress, TimelinePoint, QueueGpus, TimelinePage, Event,
    JobQuery, CancelRequest, CancelReply, HoldRequest, RequeueRequest, DoneReply, DrainRequest, FinishedQuery, FinishedPage, GpuMetrics, JobProgress, Heartbeat, HeartbeatsPage,
    LogsRequest, LogsReply, LogLine,
    SetPolicy, PolicyInfo,
)  # fmt: skip


def json_schema() -> dict[str, Any]:
    """The JSON Schema of every message, for other languages and for drift checks."""
    schemas, components = msgspec.json.schema_components(MESSAGES)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"gpuyard wire contract v{CONTRACT_VERSION}",
        "version": CONTRACT_VERSION,
        "messages": {s["$ref"].rsplit("/", 1)[1]: s for s in schemas},
        "$defs": components,
    }

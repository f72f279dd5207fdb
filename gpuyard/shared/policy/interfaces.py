"""The three policy interfaces, what each declares it needs, and what each returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from msgspec import Struct

from ..model import Allocation, GpuRef, JobRecord, JobSpec
from .views import AdmissionInput, NodeView, SchedulingInput


class NoParams(Struct, forbid_unknown_fields=True):
    """Parameters of a policy that takes none."""


@dataclass(frozen=True, kw_only=True)
class Needs:
    """What a policy needs from the service that runs it, beyond the basics (the active jobs for
    scheduling, the job and the GPUs per type for admission, the free GPUs for placement).

    Declared once per class (`needs = Needs(nodes=True)`), or per instance where the parameters
    decide; the service fetches and builds only what is asked for, so a policy that needs little
    costs little.
    """

    jobs: bool = False
    """Admission: the admitted jobs that have not ended (`AdmissionInput.jobs`)."""
    finished_jobs: bool = False
    """Scheduling: the jobs that ended too (`SchedulingInput.finished`)."""
    nodes: bool = False
    """The node list (`ClusterView.nodes`: type, GPUs, up or down)."""
    throughputs: bool = False
    """A measured throughput model: the service refuses to start with the built-in default."""
    decide_on_exit: bool = False
    """Scheduling: decide again whenever a job ends, even when none waits (elastic policies,
    which hand the freed GPUs to running jobs)."""
    job_nodes: bool = False
    """Scheduling: reads where running jobs run (`JobView.nodes`). Without it, a simulation may go
    on through several instants before placement says where the jobs started there run (their
    `nodes` are empty until it has; `ApplyReply.assures_fit`)."""
    decide_on_arrival: bool = False
    """Scheduling: decide again whenever a job arrives, even one that admission declined
    (ElasticFlow, whose every arrival is a scheduling event that restarts the running jobs)."""


class Decision(Struct):
    """A scheduling policy's answer.

    `allocations` (the `allocations` mechanism): run exactly these from now on, most important
    first; running jobs left out are preempted. `shares` (the `time_shares` mechanism): the
    fraction of time each job should spend on each GPU type, e.g. Gavel's allocation X; the
    scheduler's round mechanism turns them into each round's allocations. `pair_shares`: the same
    for two jobs sharing the same GPUs (space sharing), keyed by the pair of job ids.
    """

    allocations: list[Allocation] = []
    shares: dict[str, dict[str, float]] = {}
    pair_shares: dict[tuple[str, str], dict[str, float]] = {}
    only_allocated: bool = False
    """Time shares: a job with no share waits (Gavel's FIFO); otherwise it may use GPUs that the
    jobs with shares leave idle in a round."""
    shuffle_types: bool = False
    """Time shares: walk the GPU types in a random order each round (Gavel's agnostic policies)
    rather than in the cluster's order."""
    keep_running: bool = False
    """`allocations` tell only what changes (only where the input has `changed`): running jobs
    named neither there nor in `stop` keep their GPUs, and come before the named ones (among
    themselves, in the order the scheduler last had them). A decision over a long queue then
    costs what it changes, not what the queue holds."""
    stop: list[str] = []
    """With `keep_running`: the running jobs to preempt."""
    reasons: dict[str, str] = {}
    """Why running jobs it stops are stopped, where the policy says more than the scheduler's
    `preempted by <policy> for <the jobs started in their place>` (Kueue's `reclaimed by queue
    team-b for j40`)."""


class AdmissionDecision(Struct, frozen=True):
    verdict: Literal["admit", "hold", "reject"]
    reason: str = ""
    retry_at: float | None = None
    """A held job: when to decide on it again (None: when other jobs leave, or on the service's
    own retry timer)."""


class PlacementInput(Struct, kw_only=True):
    """What to place and where it can go.

    Normally (`PlacementPolicy.rearranges` False) the service keeps every running job whose
    allocation did not change on its GPUs, and the policy sees only the other allocations and
    the GPUs they may use: the free ones plus those of jobs being stopped or resized (nodes with
    none are left out). A policy that rearranges sees every allocation and every healthy GPU.
    Allocations that share GPUs (`share_with`) are placed by the service on their partner's GPUs.
    """

    now: float
    allocations: list[Allocation]
    """What to place, most important first (with the scheduler's `nodes` hints)."""
    current: dict[str, list[GpuRef]]
    """Where the jobs among `allocations` run now, if they run."""
    nodes: list[NodeView]
    specs: dict[str, JobSpec] = {}
    """The specs of the jobs among `allocations` (a share of a GPU, the GPU types, CPUs and
    memory each asks for)."""
    deadlines: dict[str, float] = {}
    """The deadlines of the jobs among `allocations` that have one (absolute, the clock's)."""
    ended: list[str] = []
    """Jobs that ended on their own since the last placement, in the order they ended."""
    changed_nodes: list[str] | None = None
    """The nodes whose views may differ from those of the last input this policy was given
    (the others are the same `NodeView` objects); None: any may. A policy that keeps a map of
    the nodes from one decision to the next looks at these alone (`StandingMap`)."""


class Policy:
    """Base of every policy: typed parameters, a registry name, what it needs, optional state.

    A policy that keeps state between decisions declares its type (`State`, a msgspec Struct) and
    implements `snapshot()` / `restore()`: the service stores the snapshot with its own state, so
    a restarted service decides exactly as the one that died would have.
    """

    Params: ClassVar[type[Struct]] = NoParams
    State: ClassVar[type[Struct] | None] = None
    kind: ClassVar[str] = ""
    needs: Needs = Needs()

    def __init__(self, params: Struct | None = None) -> None:
        self.params: Any = params if params is not None else self.Params()

    def snapshot(self) -> Struct | None:
        """The state this policy keeps between decisions (an instance of `State`), or None."""
        return None

    def restore(self, state: Any) -> None:
        """Take up a `snapshot()` (an instance of `State`)."""


class SchedulingPolicy(Policy):
    kind = "scheduling"
    mechanism: ClassVar[Literal["allocations", "time_shares"]] = "allocations"
    """How the scheduler acts on the decision: run its `allocations` as they are, or turn its
    `shares` into allocations round by round (priorities from the share each job received, lease
    extension; see the scheduler's `mechanism` module)."""

    def schedule(self, inp: SchedulingInput) -> Decision | list[Allocation]:
        """The decision; a plain list of allocations is `Decision(allocations=...)`."""
        raise NotImplementedError

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        """The earliest time at which the decision may change with time alone (None: only events).

        Called after each decision, with the jobs as it left them (those it started running)."""
        return None

    def accepts(self, spec: JobSpec) -> JobSpec | str:
        """A submitted job as this policy will run it (e.g. with its queue's default time limit),
        or why it never will: the submitter is told, and the job is refused."""
        if spec.priority_class is not None:
            return (f"priority class {spec.priority_class!r} is not defined: this cluster's "
                    "scheduling policy has no priority classes")  # fmt: skip
        return spec

    def waiting_reason(self, record: JobRecord) -> str:
        """Why a waiting job that never ran waits, where the policy knows better than the
        scheduler's `Resources` or `Priority` (e.g. `QuotaExceeded`); "" where it does not. Asked
        only when a person looks (`JobQuery.reasons`), so it may take its time."""
        return ""


class AdmissionPolicy(Policy):
    kind = "admission"
    in_order: ClassVar[bool] = True
    """Held jobs are admitted strictly in arrival order (a FIFO overflow queue, as in Blox); with
    False, any held job that the policy now admits goes ahead."""

    @property
    def all_or_none(self) -> bool:
        """The jobs decided in one request (one instant's arrivals, with the held jobs decided
        again then) are admitted together or declined together: one that is declined declines
        the others, best-effort jobs excepted (ElasticFlow's simulator decides each merged
        event's arrivals so)."""
        return False

    def decide(self, inp: AdmissionInput) -> AdmissionDecision:
        raise NotImplementedError


class PlacementPolicy(Policy):
    kind = "placement"

    @property
    def rearranges(self) -> bool:
        """True if the policy may move jobs whose allocation did not change (see PlacementInput)."""
        return False

    @property
    def chooses_types(self) -> bool:
        """True if the policy may place a job on any GPU type its spec allows, not only on the
        one its allocation names (for a job that allows several, a type-agnostic scheduler's
        count of free GPUs, not a choice); placement reports the type each job runs on."""
        return False

    @property
    def places_what_fits(self) -> bool:
        """True if the policy places every allocation of whole GPUs of a named type, for a job
        that asks for nothing more (no share of a GPU, no CPUs or memory, no layout, no hinted
        nodes), whenever that many GPUs of the type are free (spanning nodes as it must). A
        simulation's scheduler then counts on it: it goes on through instants that only start
        such jobs before placement has said where (`ApplyReply.assures_fit`)."""
        return False

    @property
    def settled(self) -> bool:
        """True if the policy would place the allocations of its last placement again exactly
        where that placement put them (it is its own fixed point). A simulation then spares a
        rearranging policy the apply of a decision that changes nothing."""
        return False

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        """GPUs for each allocation it can place; an allocation left out stays queued."""
        raise NotImplementedError

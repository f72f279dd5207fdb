"""The simclock's configuration: the workload, the cluster, and the simulator semantics to follow."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from gpuyard.services.simclock.costs import PreemptionCost
from gpuyard.shared.model import ClusterSpec


class QueueMap(Struct, kw_only=True, forbid_unknown_fields=True):
    """The queues a run's jobs go to by their submitter (the `kueue` policy's queues file): the
    clock counts the GPUs each queue's jobs hold (`timeline.QueueGpus`), the results group the
    jobs by it."""

    names: list[str]
    """The queues, in the file's order."""
    users: dict[str, str] = {}
    """Each listed user's queue."""
    default_queue: str = ""
    """The queue of the users listed in none ("": those have none)."""

    def queue_of(self, user: str) -> str:
        """The queue of `user`'s jobs ("": none)."""
        return self.users.get(user, self.default_queue)


class GoodputSettings(Struct, kw_only=True, forbid_unknown_fields=True):
    """Jobs whose progress is their goodput (Pollux's model, `gpuyard.shared.goodput`): a job
    whose type is a model profiled in `profiles` trains epoch by epoch at the goodput of its
    placement and batch size, as Pollux's simulator advances it."""

    profiles: str
    """A folder of per-model profiles (Pollux's `traces/`: `<model>/placements.csv`, ...)."""
    step_s: Annotated[float, Meta(gt=0)] = 60.0
    """A running job's progress is made every this many seconds of the clock (and when its
    GPUs change): where it may pick a batch size again (Pollux's simulator: its 60 s round)."""
    restart_s: Annotated[float, Meta(ge=0)] = 30.0
    """Seconds a job makes no progress after each (re)start (Pollux's simulator: 30), unless
    `model_restart_s` names its model."""
    per_type: bool = False
    """The profiles are per GPU type (Sia's layout: `<model>/placements-<type>.csv` and
    `scalability-<type>.csv`, `validation-*.csv` shared): a job trains on the profile of the
    type it runs on, with a profile and a fitted model per type (`shared.typed_goodput`)."""
    adaptive: bool = False
    """Every job picks its own batch size, up to its model's largest, whatever its spec's
    `batch_size` (Sia's jobs: that is only its scheduler's bound); False: a job with a
    `batch_size` trains at it, one without picks its own (Pollux's)."""
    model_restart_s: dict[str, Annotated[float, Meta(ge=0)]] = {}
    """Per model (job type): seconds of no progress after each (re)start, instead of
    `restart_s` (Sia's simulator: cifar10 50, deepspeech2 25, bert 120, yolov3 80, imagenet
    250, ncf 15)."""
    slowdowns: dict[str, Annotated[float, Meta(gt=0)]] = {}
    """Per model: a job progresses at its goodput divided by this (Sia's simulator's
    calibration to its real cluster: cifar10 1.8, ...); others at their goodput."""

    def __post_init__(self) -> None:
        if self.slowdowns and not self.per_type:
            raise ValueError("slowdowns apply to per-type profiles (per_type = true)")

    def restart_of(self, model: str) -> float:
        """The restart delay of a job of `model`."""
        return self.model_restart_s.get(model, self.restart_s)


class SimClockConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    workload: str
    """JSON-lines file of job specs (each with job_id and submit_time)."""
    cluster: ClusterSpec
    """Nodes present from the start."""
    throughputs: str = "default"
    """Throughput model: a Gavel JSON, ElasticFlow table(s), BFTrainer JNPs CSV, or "default"."""
    node_events: str | None = None
    """CSV `time,node,up` (seconds): nodes that join and leave (see gpuyard.workloads.churn)."""
    churn_node_gpus: int = 1
    churn_node_type: str = "gpu"
    """GPUs per node and their type, for nodes that only appear in `node_events`."""
    completion_quantum: float | None = None
    """If set, a job's exit is reported at the next multiple of this (Blox: the round length;
    ElasticFlow: 1 s, its ends being rounded up to whole seconds)."""
    completion_origin: Literal["zero", "first_arrival"] = "zero"
    """Where the multiples of `completion_quantum` start: at 0, or at the workload's first
    arrival (ElasticFlow's Themis ends a job at the end of its slot, slots counted from its
    first event)."""
    completion_grid_s: Annotated[float, Meta(gt=0)] | None = None
    """ElasticFlow's simulator: a job's end is an event at the end of the last slot of this
    length its run reaches (slots counted from its last restart, after the restart's pause: the
    end its plan predicted), or at the first instant after its finish at which anything else
    happens, whichever comes first; its JCT counts to its finish."""
    predicted_ends: Literal["real", "planned"] | None = None
    """ElasticFlow's simulator as it runs (with `completion_grid_s`; a reference bug): a
    restart's pause does not move the real end the job's plan predicted when it restarted (then
    plus its steps left at its rate, rounded up to a second): the job progresses until then
    only, its pause taken out of that, and ends at its planned end event whatever it has left
    (which, with a pause, is nearly always). Its end is recorded at that predicted real end
    (`real`: how `ef-accessctrl` judges deadlines), or, where it ended at its planned end event
    short of its work, there (`planned`: `ef`). None: a pause delays the finish."""
    arrival_quantum: float | None = None
    """If set, jobs are submitted at the next multiple of this (Blox admits at round starts);
    their submit_time, and so their JCT, stays the true arrival."""
    at_node_events: bool = False
    """BFTrainer's replayer: jobs are submitted, and their exits reported, only at node events
    (the first at or after their arrival, completion); their submit_time, and so their JCT,
    stays the true arrival, and a finished job holds its nodes until that event."""
    gavel_round_s: Annotated[float, Meta(gt=0)] | None = None
    """Gavel's simulator semantics, rounds of this length (Gavel: 360 s): every round, each
    running job runs `min(int(rate * round), steps left)` steps; the round ends when the last of
    those micro-tasks ends (so a round ends early when every job finishes), a job that finished
    leaves its GPUs idle until then, completions are reported and arrivals submitted at round
    ends, and with nothing running time jumps to the next arrival."""
    preemption_cost: PreemptionCost = msgspec.field(default_factory=PreemptionCost)
    goodput: GoodputSettings | None = None
    """Jobs of profiled models progress at their goodput (None: every job at its throughput)."""
    queues: QueueMap | None = None
    """A run with queues: the timeline has the GPUs each queue's jobs hold (`TimelinePage.queues`)."""
    window: tuple[Annotated[int, Meta(ge=0)], Annotated[int, Meta(ge=1)]] | None = None
    """Gavel's measurement window (its `jobs_to_complete`): jobs `window[0]` to `window[1] - 1`
    of the workload in arrival order; the run ends as soon as they have all ended, the jobs
    still running or queued then left as they are."""
    progress_interval_s: float = 0.25
    call_timeout_s: float | None = None
    """How long one request to the services may go unanswered (None: the connection's default)."""
    retry_for_s: float = 0.0
    """Durable runs: send a request again while its service restarts (it was killed), this long."""

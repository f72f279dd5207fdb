"""The reference simulators' semantics, one class each: what `gpuyard sim --blox` (`--gavel`,
`--elasticflow`, `--bftrainer`; a sweep's `preset = "..."`) changes, in one place: its defaults,
its checks, the policies and parameters it sets, and the settings it gives the services.
`Semantics` is gpuyard's own, which a preset departs from where its reference does."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import msgspec

from gpuyard.run.spec import PresetName, RunSpec
from gpuyard.services.simclock.costs import PreemptionCost, RestartCost
from gpuyard.shared.model import ClusterSpec, JobSpec
from gpuyard.shared.policy import scheduling_policies

if TYPE_CHECKING:
    from gpuyard.run.simulate import SimOptions

Params = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]
"""Scheduling, admission and placement parameters."""


class Semantics:
    """gpuyard's own: decisions at events (or rounds, `--mode`), jobs admitted as they arrive and
    seen finished as they finish."""

    name: ClassVar[PresetName | None] = None
    title: ClassVar[str] = ""
    """The reference's name in captions (`Gavel's simulator semantics`)."""
    help: ClassVar[str] = ""
    """What its option says (`gpuyard sim --help`)."""
    round_s: ClassVar[float] = 300.0
    """The round's length unless the run gives one."""
    intended: ClassVar[str] = ""
    """What `--as-intended` mends of the reference's bugs ("": it has none to mend)."""

    def check(self, spec: RunSpec) -> None:
        """ValueError naming an option the preset refuses."""

    def scheduling_name(self, policy: str) -> str:
        """The scheduling policy `--policy NAME` means."""
        return policy

    def check_policy(self, spec: RunSpec) -> None:
        """PolicyError (ValueError) if the run's scheduling policy is unknown."""
        scheduling_policies.get(self.scheduling_name(spec.policy))

    def mode(self, spec: RunSpec) -> Literal["rounds", "events", "slots"]:
        return spec.mode or "events"

    def fill(self, options: SimOptions, spec: RunSpec) -> SimOptions:
        """`options`, built from `spec`, with what the preset sets on top."""
        return options

    def jobs(self, options: SimOptions, jobs: list[JobSpec]) -> list[JobSpec]:
        """The workload's jobs as the preset runs them under `options`' policy."""
        return jobs

    def with_workload(self, options: SimOptions, jobs: list[JobSpec]) -> SimOptions:
        """`options` with what the preset takes from the workload itself."""
        return options

    def elastic_traces(self) -> bool:
        """Whether ElasticFlow and ITP traces are read with elastic GPU counts."""
        return False

    def scheduler_settings(self, options: SimOptions) -> dict[str, Any]:
        """SchedulerConfig fields the preset sets."""
        return {}

    def clock_settings(self, options: SimOptions) -> dict[str, Any]:
        """SimClockConfig fields the preset sets."""
        return {}

    def describe(self) -> str | None:
        """How captions name the semantics (None: by its mode)."""
        return f"{self.title}'s simulator semantics" if self.title else None


class Blox(Semantics):
    name = "blox"
    title = "Blox"
    help = "Blox semantics: rounds mode, jobs admitted and seen finished at round starts"

    def check(self, spec: RunSpec) -> None:
        if spec.mode not in (None, "rounds"):
            raise ValueError(f"--mode {spec.mode}: --blox decides at round ends (rounds)")

    def mode(self, spec: RunSpec) -> Literal["rounds", "events", "slots"]:
        return "rounds"

    def clock_settings(self, options: SimOptions) -> dict[str, Any]:
        return {"completion_quantum": options.round_s, "arrival_quantum": options.round_s}


class Gavel(Semantics):
    name = "gavel"
    title = "Gavel"
    help = (
        "Gavel semantics: 360 s rounds of int(rate x round) steps that end with their last "
        "micro-task, arrivals and completions at round ends; `--policy fifo` is Gavel's FIFO "
        "(gavel_fifo)"
    )
    round_s = 360.0
    """Gavel's round length (`--time_per_iteration`)."""
    NAMES: ClassVar[dict[str, str]] = {"fifo": "gavel_fifo"}
    """Gavel's names for the policies whose names gpuyard uses for others."""
    PARAMS: ClassVar[dict[str, Any]] = {"costs": {}}
    """The scheduling policy's parameters as Gavel's simulator sets them, where the policy has
    them and the run does not give them: its driver passes no price table, so the
    cost-normalised policies see every GPU type cost 1 (and allocate as
    `max_sum_throughput_perf`)."""

    def scheduling_name(self, policy: str) -> str:
        return self.NAMES.get(policy, policy)

    def fill(self, options: SimOptions, spec: RunSpec) -> SimOptions:
        made = scheduling_policies.create(options.policy, options.policy_params).params
        fields = made.__struct_fields__ if made is not None else ()
        extra = {k: v for k, v in self.PARAMS.items()
                 if k in fields and k not in options.policy_params}  # fmt: skip
        return msgspec.structs.replace(options, policy_params={**options.policy_params, **extra})

    def scheduler_settings(self, options: SimOptions) -> dict[str, Any]:
        from gpuyard.services.scheduler.mechanism import TimeShareConfig

        return {"mode": "clock", "time_shares": TimeShareConfig(credit_whole_steps=True)}

    def clock_settings(self, options: SimOptions) -> dict[str, Any]:
        return {"gavel_round_s": options.round_s}


class BFTrainer(Semantics):
    name = "bftrainer"
    title = "BFTrainer"
    help = (
        "BFTrainer's replayer: jobs admitted and seen finished only at --node-events' "
        "events; with --policy bftrainer, --param reference_step=true solves its MILP as it runs"
    )

    def clock_settings(self, options: SimOptions) -> dict[str, Any]:
        return {"at_node_events": True}

    def describe(self) -> str | None:
        return None  # (a run's captions name its replay with the nodes' label)


class ElasticFlow(Semantics):
    name = "elasticflow"
    title = "ElasticFlow"
    help = (
        "ElasticFlow's simulator: --policy names its scheme (ef-accessctrl, ef, edf, "
        "edf-accessctrl, gandiva, dlas-gpu, themis, chronus), --round its scheduling slot"
    )
    intended = (
        "a restart's pause moves the end a job's plan predicted, ef judges deadlines by real "
        "ends, gandiva time-slices node sets in proportion to demand (gandiva-ts), themis ends "
        "jobs at their finish"
    )

    def check_policy(self, spec: RunSpec) -> None:
        elasticflow_scheme(spec.policy)

    def fill(self, options: SimOptions, spec: RunSpec) -> SimOptions:
        cluster = options.cluster
        scheme = elasticflow_options(
            spec.policy, options.round_s, cluster.total_gpus,
            switch_nodes=elasticflow_switch_nodes(cluster), as_intended=spec.as_intended,
        )  # fmt: skip
        params: Params = (spec.policy_params, spec.admission_params, spec.placement_params)
        filled = preset_filled(scheme, mode=spec.mode, admission=spec.admission,
                               placement=spec.placement, params=params)  # fmt: skip
        return msgspec.structs.replace(options, **filled)

    def with_workload(self, options: SimOptions, jobs: list[JobSpec]) -> SimOptions:
        # ElasticFlow's Gandiva loop runs at arrivals until the last one, then every slot, and
        # charges restarts at those arrival events only.
        if options.scheme != "gandiva" or options.policy != "gandiva-ef" or not jobs:
            return options
        last = max(j.submit_time or 0.0 for j in jobs)
        params = {"last_arrival": last, **options.policy_params}
        cost = options.preemption_cost
        if cost.restart is not None and cost.restart.until_s is None:
            restart = msgspec.structs.replace(cost.restart, until_s=last)
            cost = msgspec.structs.replace(cost, restart=restart)
        return msgspec.structs.replace(options, policy_params=params, preemption_cost=cost)

    def elastic_traces(self) -> bool:
        return True  # ElasticFlow chooses the GPU counts itself

    def scheduler_settings(self, options: SimOptions) -> dict[str, Any]:
        settings: dict[str, Any] = {}
        if options.event_storage == "none":  # (ElasticFlow's results are read from the stream)
            settings["event_storage"] = "memory"
        if options.scheme == "themis" and not options.as_intended:
            # Its Themis decides every slot from its first event, whatever comes between.
            settings["round_origin"] = "first_decision"
        return settings

    def clock_settings(self, options: SimOptions) -> dict[str, Any]:
        # ElasticFlow rounds a job's end up to the second; its own scheduling ends a job at its
        # planned end (or at the next event after it), as its bug leaves that end (where `ef`
        # judges deadlines), unless `--as-intended`. Its Themis ends a job at the end of the slot
        # it finishes in, slots counted from its first event (it records that end, and judges
        # the deadline there), unless `--as-intended`.
        if options.scheme == "themis" and not options.as_intended:
            return {"completion_quantum": options.round_s, "completion_origin": "first_arrival"}
        if options.scheme not in ("ef", "ef-accessctrl"):
            return {"completion_quantum": 1.0}
        predicted = None if options.as_intended else "planned" if options.scheme == "ef" else "real"
        return {"completion_quantum": 1.0, "completion_grid_s": options.round_s,
                "predicted_ends": predicted}  # fmt: skip


class Pollux(Semantics):
    name = "pollux"
    title = "Pollux"
    help = (
        "Pollux's simulator: 60 s rounds, jobs submitted and seen finished at round starts, "
        "training at their goodput with 30 s restarts, on 16 nodes of 4 GPUs unless "
        "--cluster-spec; --policy optimus|tiresias are its artifact's Optimus+Oracle and "
        "Tiresias+TunedJobs; --profiles defaults to the traces/ folder beside the workload's"
    )
    round_s = 60.0
    """The artifact's scheduling interval (`--interval`)."""
    CLUSTER = "16x4"
    """The artifact's cluster (`--min-nodes 16 --num-gpus 4`)."""
    NAMES: ClassVar[dict[str, str]] = {"optimus": "pollux-optimus", "tiresias": "pollux-tiresias"}
    PROFILED: ClassVar[frozenset[str]] = frozenset({"pollux", "pollux-optimus"})
    """The policies that read the models' profiles (their `profiles` parameter)."""
    ADAPTIVE: ClassVar[frozenset[str]] = frozenset({"pollux"})
    """The policies whose jobs choose their batch sizes (AdaptDL's jobs)."""
    FIXED_BATCH: ClassVar[dict[str, int]] = {"ncf": 32768}
    """The models the artifact trains at one batch size under Pollux all the same."""

    def check(self, spec: RunSpec) -> None:
        if spec.mode not in (None, "rounds"):
            raise ValueError(f"--mode {spec.mode}: --pollux decides every round (rounds)")
        profiles = self.profiles(spec)
        if profiles is None:
            raise ValueError(
                "--pollux needs the models' profiles: --profiles FOLDER (Pollux's traces/), "
                "or a --trace in a folder beside it"
            )
        if not Path(profiles).is_dir():
            raise ValueError(f"--profiles {profiles}: no such folder")

    def scheduling_name(self, policy: str) -> str:
        return self.NAMES.get(policy, policy)

    def mode(self, spec: RunSpec) -> Literal["rounds", "events", "slots"]:
        return "rounds"

    @staticmethod
    def profiles(spec: RunSpec) -> str | None:
        """The profiles the run reads: `--profiles`, else Pollux's layout's (`traces/` beside
        the folder of the workload); None: neither."""
        if spec.profiles is not None:
            return spec.profiles
        if spec.trace is None:
            return None
        beside = Path(spec.trace).resolve().parent.parent / "traces"
        return str(beside) if beside.is_dir() else None

    def fill(self, options: SimOptions, spec: RunSpec) -> SimOptions:
        from gpuyard.services.simclock.config import GoodputSettings

        self.check(spec)  # (a comparison builds every run's options before it checks them)
        profiles = self.profiles(spec)
        assert profiles is not None
        changes: dict[str, Any] = {
            "goodput": GoodputSettings(profiles=str(Path(profiles).resolve()),
                                       step_s=options.round_s),
        }  # fmt: skip
        changes |= profiled_defaults(options, spec, self.CLUSTER, self.PROFILED, profiles)
        return msgspec.structs.replace(options, **changes)

    def jobs(self, options: SimOptions, jobs: list[JobSpec]) -> list[JobSpec]:
        """Under Pollux's own policy, a job picks its batch size (the workload's are the
        baselines' users' choices), but for the models the artifact fixes."""
        if options.policy not in self.ADAPTIVE:
            return jobs
        fixed = self.FIXED_BATCH
        return [msgspec.structs.replace(j, batch_size=fixed.get(j.job_type)) for j in jobs]

    def clock_settings(self, options: SimOptions) -> dict[str, Any]:
        return {"arrival_quantum": options.round_s}


def profiled_defaults(
    options: SimOptions, spec: RunSpec, cluster: str, profiled: Collection[str], profiles: str
) -> dict[str, Any]:
    """What the goodput presets (Pollux's, Sia's) fill in alike where the run leaves it: their
    cluster, the most free node first (their simulators'), and the profiles of a policy that
    reads them."""
    from gpuyard.workloads import load_cluster

    changes: dict[str, Any] = {}
    if spec.cluster_spec is None:
        changes["cluster"] = load_cluster(cluster)
    if spec.placement is None:
        changes["placement"] = "most-free"
    if options.policy in profiled and "profiles" not in options.policy_params:
        changes["policy_params"] = {**options.policy_params, "profiles": profiles}
    return changes


class Sia(Semantics):
    name = "sia"
    title = "Sia"
    help = (
        "Sia's simulator (siasosp23/artifacts, sia-simulator/): 6x4:aws,2x8:dgx-ext,3x8:rtx "
        "unless --cluster-spec, 60 s rounds (360 s for Gavel's policies), jobs training at their "
        "goodput on each GPU type's profile, with per-model restarts and slowdowns; --profiles "
        "(the artifact's traces/, not shipped) defaults to traces/ two folders above the workload's"
    )
    round_s = 60.0
    """The artifact's scheduling interval for Sia (`run_experiment.sh`: `--interval=60`)."""
    GAVEL_ROUND_S = 360.0
    """... and for Gavel (`--interval=360`)."""
    CLUSTER = "6x4:aws,2x8:dgx-ext,3x8:rtx"
    """The artifact's cluster (`simulator_config.cluster_nnodes`), its GPU types in its order
    (Sia projects a job's goodput from the first type in this order it ran on)."""
    PROFILED: ClassVar[frozenset[str]] = frozenset({"sia"})
    """The policies that read the per-type profiles (their `profiles` parameter)."""
    ADAPTIVE: ClassVar[frozenset[str]] = frozenset({"sia"})
    """The policies whose jobs choose their batch sizes (the workload's is Sia's bound)."""
    WHERE = "point --profiles at a copy of siasosp23/artifacts' sia-simulator/traces"
    """Where the profiles are (the artifact has no licence: gpuyard does not ship them)."""

    def check(self, spec: RunSpec) -> None:
        if spec.mode not in (None, "rounds"):
            raise ValueError(f"--mode {spec.mode}: --sia decides every round (rounds)")
        profiles = self.profiles(spec)
        if profiles is None:
            raise ValueError(
                f"--sia needs the models' per-GPU-type profiles, which gpuyard does not ship: "
                f"{self.WHERE}"
            )
        folder = Path(profiles)
        if not folder.is_dir():
            raise ValueError(f"--profiles {profiles}: no such folder ({self.WHERE})")
        if next(folder.glob("*/placements-*.csv"), None) is None:
            raise ValueError(
                f"--profiles {profiles}: no per-GPU-type profiles (<model>/placements-<type>.csv)"
                f" there ({self.WHERE})"
            )

    def mode(self, spec: RunSpec) -> Literal["rounds", "events", "slots"]:
        return "rounds"

    @staticmethod
    def profiles(spec: RunSpec) -> str | None:
        """The profiles the run reads: `--profiles`, else the artifact's layout's (`traces/`
        two folders above the workload's: `workloads/saturn/workload-N.csv`); None: neither."""
        if spec.profiles is not None:
            return spec.profiles
        if spec.trace is None:
            return None
        beside = Path(spec.trace).resolve().parent.parent.parent / "traces"
        return str(beside) if beside.is_dir() else None

    @staticmethod
    def gavels(policy: str) -> bool:
        """Whether `policy` is one of Gavel's (the artifact runs Gavel in 360 s rounds)."""
        made = scheduling_policies.get(policy)
        return made.__module__.startswith("gpuyard.policies.gavel")

    def fill(self, options: SimOptions, spec: RunSpec) -> SimOptions:
        from gpuyard.services.simclock.config import GoodputSettings
        from gpuyard.shared.typed_goodput import SIA_DEFAULT_RESTORE_S, SIA_RESTORE_S, SIA_SLOWDOWNS

        self.check(spec)  # (a comparison builds every run's options before it checks them)
        given = self.profiles(spec)
        assert given is not None
        profiles = str(Path(given).resolve())
        gavel = self.gavels(options.policy)
        round_s = options.round_s
        if spec.round_s is None and gavel:
            round_s = self.GAVEL_ROUND_S
        changes: dict[str, Any] = {
            "round_s": round_s,
            "goodput": GoodputSettings(
                profiles=profiles, step_s=round_s, per_type=True,
                adaptive=options.policy in self.ADAPTIVE, restart_s=SIA_DEFAULT_RESTORE_S,
                model_restart_s=dict(SIA_RESTORE_S), slowdowns=dict(SIA_SLOWDOWNS),
            ),
        }  # fmt: skip
        changes |= profiled_defaults(options, spec, self.CLUSTER, self.PROFILED, profiles)
        if gavel and spec.throughputs == "default":
            # The artifact's Gavel sees each rigid job's rate on each type, predicted from the
            # profiles at its batch size (`TypedThroughputs`; job types `<model>@<batch>`).
            changes["throughputs"] = profiles
        return msgspec.structs.replace(options, **changes)

    def jobs(self, options: SimOptions, jobs: list[JobSpec]) -> list[JobSpec]:
        """Under Gavel's policies a job is rigid at its batch size: its type names it
        (`cifar10@4096`), for the throughputs the policy sees."""
        if not self.gavels(options.policy):
            return jobs
        return [
            msgspec.structs.replace(j, job_type=f"{j.job_type}@{j.batch_size}")
            if j.batch_size and "@" not in j.job_type
            else j
            for j in jobs
        ]

    def scheduler_settings(self, options: SimOptions) -> dict[str, Any]:
        if not self.gavels(options.policy):
            return {}
        from gpuyard.services.scheduler.mechanism import TimeShareConfig

        # The artifact's Gavel: one queue over all types, the policy asked again whenever jobs
        # come or go, time received counted from each job's arrival (no reset, no deficits).
        shares = TimeShareConfig(min_resolve_s=0.0, global_queue=True, reset_on_decision=False)
        return {"time_shares": shares}

    def clock_settings(self, options: SimOptions) -> dict[str, Any]:
        return {"arrival_quantum": options.round_s}


OWN = Semantics()
PRESETS: dict[PresetName, Semantics] = {
    p.name: p
    for p in (Blox(), Gavel(), BFTrainer(), ElasticFlow(), Pollux(), Sia())
    if p.name is not None
}
"""Each preset by name, in the order `gpuyard sim --help` lists them."""


def semantics(name: PresetName | None) -> Semantics:
    """The preset `name` (None: gpuyard's own)."""
    return OWN if name is None else PRESETS[name]


def preset_filled(
    preset: dict[str, Any], *, mode: str | None, admission: str | None, placement: str | None,
    params: Params,
) -> dict[str, Any]:  # fmt: skip
    """`preset` (`--elasticflow`'s scheme: its policies with their parameters, its `mode`, and
    more) with what the run sets: an `admission` or `placement` named replaces the preset's,
    with only the parameters given for it; parameters given alone (`--param`, and those of a
    policy the preset names) go on top of the preset's; a `mode` given replaces its mode.
    `params`: the scheduling, admission and placement parameters given."""
    policy_params, admission_params, placement_params = params
    filled = {**preset, "policy_params": {**preset["policy_params"], **policy_params}}
    if mode is not None:
        filled["mode"] = mode
    for kind, named, given in (("admission", admission, admission_params),
                               ("placement", placement, placement_params)):  # fmt: skip
        if named is not None:
            filled[kind], filled[f"{kind}_params"] = named, given
        else:
            filled[f"{kind}_params"] = {**preset[f"{kind}_params"], **given}
    return filled


# --------------------------------------------------------------------------- ElasticFlow's schemes

ELASTICFLOW_SCHEMES: dict[str, tuple[str, dict[str, Any], str]] = {
    "ef-accessctrl": ("elasticflow", {}, "elasticflow"),
    "ef": ("elasticflow", {}, "accept-all"),
    "edf": ("edf", {}, "accept-all"),
    "edf-accessctrl": ("edf", {}, "edf"),
    "gandiva": ("gandiva-ef", {}, "accept-all"),
    "dlas-gpu": ("tiresias", {"thresholds": [3250.0, 7200.0], "promote_knob": 0.0}, "accept-all"),
    "themis": ("themis", {}, "accept-all"),
    "chronus": ("chronus", {}, "accept-all"),
}
"""ElasticFlow's schemes: (scheduling policy, its parameters, admission policy), as its
simulator runs them."""

AS_INTENDED: dict[str, tuple[str, dict[str, Any], str]] = {
    "gandiva": ("gandiva-ts", {}, "accept-all"),
}
"""The schemes whose simulator code departs from what it aims at, done as intended
(`elasticflow_options(as_intended=True)`)."""


def elasticflow_scheme(scheme: str, as_intended: bool = False) -> tuple[str, dict[str, Any], str]:
    """A scheme's (scheduling policy, its parameters, admission policy); ValueError if unknown."""
    if scheme not in ELASTICFLOW_SCHEMES:
        raise ValueError(
            f"unknown ElasticFlow scheme {scheme!r}; known: {', '.join(ELASTICFLOW_SCHEMES)}"
        )
    if as_intended and scheme in AS_INTENDED:
        return AS_INTENDED[scheme]
    return ELASTICFLOW_SCHEMES[scheme]


def elasticflow_switch_nodes(cluster: ClusterSpec) -> int:
    """Nodes per switch of a cluster given as equal groups (ElasticFlow's cluster specs: a group
    per switch); 0 for one switch."""
    groups = cluster.groups
    return groups[0].count if len(groups) > 1 and all(g == groups[0] for g in groups) else 0


def elasticflow_options(
    scheme: str, round_s: float, total_gpus: int, *, at_events: bool = True,
    switch_nodes: int = 0, as_intended: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """SimOptions fields for an ElasticFlow scheme, as its simulator runs it (`--elasticflow`).

    Decisions come at events (arrivals, declined ones included, and completions), at most once a
    scheduling slot (the round): what comes within a slot of the last decision waits until that
    slot ends (`mode="slots"`), as ElasticFlow merges events; Tiresias (`dlas-gpu`), Themis
    and Chronus, whose ElasticFlow versions run in rounds, decide on a grid of slots
    (`mode="rounds"`; Chronus only at its 240 s leases). `gandiva` is ElasticFlow's own loop
    (`gandiva-ef`, quirks included): the policy hears of every event (`mode="events"`) and acts
    only at the iterations of that loop, at arrivals until the last one, then every slot (its
    `last_arrival`, which `ElasticFlow.with_workload` takes from the workload). Placement is
    ElasticFlow's node sets (`node-sets`), buddy blocks for `dlas-gpu` and `chronus`,
    `gandiva-ef`'s own node sets as hints to `consolidated` for `gandiva`; the deadline
    admission policies plan on the same slot, from the scheduler's next decision, and decide an
    event's arrivals there, as ElasticFlow's simulator does
    (`decide_at="event"`; `ef-accessctrl` all or none: `together`). `at_events=False` (`gpuyard
    up --elasticflow`) answers each submission at once instead. Restarts cost what ElasticFlow's
    simulator charges, where it charges them (`RestartCost`): `ef`, `ef-accessctrl` and
    `edf-accessctrl` restart every running job at every scheduling decision (its executor
    restarts them all whenever an allocation changes), warm on GPU sets used before; `gandiva`
    every running job at every instant at which a job starts, never warm, and none from the last
    arrival on (ElasticFlow charges at its arrival events: `RestartCost.until_s`, which
    `with_workload` sets); `dlas-gpu` only the jobs it starts; Chronus 0.5 s per (1 + log2
    GPUs) at each resume; `edf` and `themis` nothing. Cold starts come every `round_s`-th decision
    (ElasticFlow counts events against its slot length there). `switch_nodes`: the cluster's
    nodes per switch (`elasticflow_switch_nodes`). A job ends at the next whole second, as
    ElasticFlow's simulator rounds its ends; under `ef` and `ef-accessctrl` that end is an event
    where its plan predicted it (the end of the last slot its run reaches), or at the next event
    after it, whichever comes first (`SimClockConfig.completion_grid_s`).

    `as_intended`: the schemes whose simulator code departs from what it aims at run as intended
    (`AS_INTENDED`): `gandiva` as `gandiva-ts` (node sets in proportion to demand, round-robin
    time slicing every slot), deciding at events at most once a slot, on buddy blocks,
    restarting every running job at every decision.
    """
    policy, params, admission = elasticflow_scheme(scheme, as_intended)
    if scheme == "ef" and not as_intended:  # (its placement order: ElasticFlow's `ef` loop's)
        params = {**params, "listed": "started"}
    large = total_gpus >= 256  # ElasticFlow's figures for large clusters
    every = RestartCost(
        base_s=7.0 if large else 2.0, cold_s=47.0 if large else 27.0,
        cold_every=max(int(round_s), 1), scope="decisions", decision_gap_s=round_s,
        warm_key="first_rank",
    )  # fmt: skip
    restart = {
        "ef-accessctrl": every,
        "ef": every,
        "edf-accessctrl": every,
        "gandiva": msgspec.structs.replace(
            every, warm_ranks=False, scope="decisions" if as_intended else "changes"
        ),
        "dlas-gpu": msgspec.structs.replace(
            every, warm_ranks=False, scope="launched", cold_every=0
        ),
        "chronus": RestartCost(base_s=0.0, per_doubling_s=0.5, cold_s=0.0, warm_ranks=False),
    }.get(scheme)
    rounds = policy in ("tiresias", "themis", "chronus")
    # Where a job lands decides whether its restart is warm: ElasticFlow's own placement
    # (`node-sets`; EDF's jobs in the order its policy lists them). `dlas-gpu` charges only the
    # jobs it starts, never a move: `buddy` keeps running jobs where they are, as ElasticFlow's
    # charges assume. Its Gandiva places on node sets of its own (`gandiva-ef` keeps them and
    # hints them; `consolidated` honours the hints and always fits what the sets hold); Chronus
    # is another simulator.
    placement = "buddy"
    placement_params: dict[str, Any] = {}
    if policy == "gandiva-ef":
        placement = "consolidated"
    elif scheme not in ("gandiva", "chronus", "dlas-gpu"):
        order = "given" if policy == "edf" or params.get("listed") == "started" else "largest-first"
        placement, placement_params = "node-sets", {"order": order}
        if switch_nodes:
            placement_params["switch_nodes"] = switch_nodes
    admission_params: dict[str, Any] = {}
    if admission in ("elasticflow", "edf"):
        admission_params = {"slot_s": round_s}
        if at_events:
            admission_params |= {"decide_at": "event", "together": admission == "elasticflow"}
    return {
        "policy": policy, "policy_params": dict(params), "admission": admission,
        "admission_params": admission_params,
        "placement": placement, "placement_params": placement_params,
        "mode": "rounds" if rounds else "events" if policy == "gandiva-ef" else "slots",
        "preset": "elasticflow", "scheme": scheme,
        "preemption_cost": PreemptionCost(restart=restart),
    }  # fmt: skip

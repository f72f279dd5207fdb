"""One simulation run: start the services on a NATS server, replay the workload through the
simclock, collect the results over NATS, write them."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec
import numpy as np
from msgspec import Struct

from gpuyard.ops import read_events, show_policies
from gpuyard.plotter import Plotter
from gpuyard.report import JobRun, QueueLayout, efficiency_frame, write_results
from gpuyard.results import JobRows, Table, TimelineRows, job_rows
from gpuyard.run.embedded import EmbeddedNats
from gpuyard.run.launcher import ServiceSet
from gpuyard.run.presets import semantics
from gpuyard.run.spec import PresetName
from gpuyard.services.simclock.config import GoodputSettings, QueueMap
from gpuyard.services.simclock.service import PreemptionCost, SimClockConfig, write_workload
from gpuyard.services.simclock.workload import workload_specs
from gpuyard.shared.connection import Bus, NatsAuth, connect
from gpuyard.shared.contract import (
    Empty,
    FinishedQuery,
    PageQuery,
    PolicyInfo,
    Progress,
    RunRequest,
    ServiceStats,
)
from gpuyard.shared.endpoints import (
    FINISHED,
    JOBS,
    PROGRESS,
    RUN,
    STATS,
    TIMELINE,
    Endpoint,
    Subjects,
)
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.identity import ANONYMOUS
from gpuyard.shared.model import ClusterSpec, JobRecord, JobSpec
from gpuyard.shared.policy import PolicyChoice, PolicySet
from gpuyard.shared.roster import CONTROL_PLANE, SERVICE_TOKENS
from gpuyard.shared.throughput import load_throughputs
from gpuyard.sharing import MILLI, allocation_frame, ask_of

T = TypeVar("T")

RETRY_FOR_S = 60.0
"""Durable runs: how long a call is sent again while its callee restarts."""


class SimOptions(Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything that determines a simulation's results (plus where to write them)."""

    cluster: ClusterSpec
    policy: str = "fifo"
    policy_params: dict[str, Any] = {}
    admission: str = "accept-all"
    admission_params: dict[str, Any] = {}
    placement: str = "consolidated"
    placement_params: dict[str, Any] = {}
    round_s: float = 300.0
    mode: Literal["rounds", "events", "slots"] = "events"
    """rounds: decide at round ends only; events: also at every arrival and completion; slots: at
    those, at most once a round (what comes within a round of the last decision waits for its end:
    ElasticFlow's scheduling slot)."""
    preset: PresetName | None = None
    """A reference simulator's semantics (`gpuyard.run.presets`): `blox` (jobs admitted and seen
    finished only at round starts), `gavel` (rounds of `round_s`, 360 s there, in which each
    running job runs `int(rate * round)` steps, rounds that end when their last micro-task does,
    completions and arrivals at round ends, the utilisation of the GPUs' compute time over the
    whole run), `bftrainer` (jobs admitted, and seen finished, only at node events; a finished
    job holds its nodes until the next one), `elasticflow` (its `scheme`)."""
    scheme: str | None = None
    """The ElasticFlow scheme this run reproduces (`elasticflow_options` set the rest)."""
    as_intended: bool = False
    """The preset's reference with its bugs mended (`Semantics.intended` says which)."""
    window: tuple[int, int] | None = None
    """Gavel's measurement window: the run ends once jobs `window[0]` to `window[1] - 1` (in
    arrival order) have ended, and the JCT figures of `summary.json` are theirs."""
    throughputs: str = "default"
    goodput: GoodputSettings | None = None
    """Jobs of profiled models train at their goodput (`--profiles`, `--pollux`)."""
    """Throughput model file (Gavel JSON, ElasticFlow table or folder, BFTrainer JNPs CSV)."""
    node_events: str | None = None
    """Normalised node events CSV `time,node,up` (see gpuyard.workloads.churn)."""
    preemption_cost: PreemptionCost = msgspec.field(default_factory=PreemptionCost)
    min_run_s: float = 0.0
    """The preemption guard (`SchedulerConfig.min_run_s`): a started or resumed job runs at
    least this long before a decision may stop it; 0: off."""
    default_time_limit_s: float | None = None
    """`AdmissionConfig.default_time_limit_s`: the limit of a job without one."""
    max_time_limit_s: float | None = None
    """`AdmissionConfig.max_time_limit_s`: a job asking for more is declined."""
    churn_node_gpus: int = 1
    churn_node_type: str = "gpu"
    event_storage: Literal["file", "memory", "none"] = "file"
    """Where the run's event stream is kept: on the server's disk (a private server's goes with
    it), not in its memory, where a million-job replay's events take some 2 GB; "none":
    published, not stored (a sweep's runs, whose streams went with them; ElasticFlow's results
    are read from the stream, so its runs keep it)."""
    durable: bool = False
    """Admission, scheduler and placement keep their state in JetStream key-value buckets, as on a
    real cluster (slower; use a cluster name not used before on that server). The services' calls
    to each other are then sent again while the callee restarts: kill -9 one of them mid-run (with
    `simulate(processes=True)`), start it again, and the run goes on (tests/test_recovery_sim.py)."""
    call_timeout_s: float = 10.0
    """Durable runs: how long the scheduler waits for placement before it sends the request again
    (its callee may have been killed); admission waits twice that for the scheduler, and the clock
    four times that for any service, so that an inner retry ends before an outer one starts."""

    @property
    def policies(self) -> PolicySet:
        """The scheduling, admission and placement policies, with their parameters."""
        return PolicySet(
            scheduling=PolicyChoice(name=self.policy, params=self.policy_params),
            admission=PolicyChoice(name=self.admission, params=self.admission_params),
            placement=PolicyChoice(name=self.placement, params=self.placement_params),
        )

    def with_policies(self, policies: PolicySet) -> SimOptions:
        return msgspec.structs.replace(
            self,
            policy=policies.scheduling.name, policy_params=policies.scheduling.params,
            admission=policies.admission.name, admission_params=policies.admission.params,
            placement=policies.placement.name, placement_params=policies.placement.params,
        )  # fmt: skip


class SimResult(Struct, kw_only=True):
    summary: dict[str, Any]
    jobs: list[JobRecord]
    timeline: Table
    wall_s: float
    stats: list[ServiceStats]


def service_configs(
    options: SimOptions, workload_path: Path, *, dependencies: bool = False
) -> dict[str, Any]:
    # Imported here: the configs belong to their services, and only the launcher needs them all.
    from gpuyard.services.admission.service import AdmissionConfig
    from gpuyard.services.placement.service import PlacementConfig
    from gpuyard.services.scheduler.mechanism import TimeShareConfig
    from gpuyard.services.scheduler.service import SchedulerConfig

    # Durable: calls are sent again while their callee restarts, inner calls first (see
    # SimOptions.call_timeout_s); the retried requests are idempotent.
    timeout = options.call_timeout_s if options.durable else None
    retry = RETRY_FOR_S if options.durable else 0.0
    preset = semantics(options.preset)
    queues = run_queues(options)  # (the clock counts each queue's GPUs)
    return {
        "placement": PlacementConfig(
            policy=options.placement,
            params=options.placement_params,
            durable=options.durable,
            simulated=True,
            command_timeout_s=None,  # virtual time: every answer is awaited
        ),
        "scheduler": SchedulerConfig(
            **{
                "policy": options.policy,
                "params": options.policy_params,
                "throughputs": options.throughputs,
                "round_s": options.round_s,
                "min_run_s": options.min_run_s,
                "mode": options.mode,
                "time_shares": TimeShareConfig(),
                "event_storage": options.event_storage,
                "durable": options.durable,
                "call_timeout_s": timeout,
                "retry_for_s": retry,
                "hand_over_results": not options.durable,
                "remember_ended": dependencies,
                **preset.scheduler_settings(options),
            }
        ),
        "admission": AdmissionConfig(
            policy=options.admission,
            params=options.admission_params,
            throughputs=options.throughputs,
            durable=options.durable,
            call_timeout_s=timeout and 2 * timeout,
            retry_for_s=retry,
            default_time_limit_s=options.default_time_limit_s,
            max_time_limit_s=options.max_time_limit_s,
        ),
        "simclock": SimClockConfig(
            workload=str(workload_path),
            cluster=options.cluster,
            throughputs=options.throughputs,
            node_events=options.node_events,
            churn_node_gpus=options.churn_node_gpus,
            churn_node_type=options.churn_node_type,
            preemption_cost=options.preemption_cost,
            goodput=options.goodput,
            queues=queues.queues if queues is not None else None,
            window=options.window,
            call_timeout_s=timeout and 4 * timeout,
            retry_for_s=retry,
            **preset.clock_settings(options),
        ),
    }


def run_queues(options: SimOptions, file: str | None = None) -> QueueLayout | None:
    """A run with queues (the `kueue` policy's, whose parameters are its queues file): its
    queues as its results show them (`file`: the queues file, for the plot's title). None:
    a run without."""
    if options.policy != "kueue" or not options.policy_params.get("queue"):
        return None
    from gpuyard.policies.kueue import Queues

    queues = msgspec.convert(options.policy_params, Queues)
    users = {user: q.name for q in queues.queue for user in q.users}
    mapping = QueueMap(names=[q.name for q in queues.queue], users=users,
                       default_queue=queues.default_queue)  # fmt: skip
    return QueueLayout(
        queues=mapping, cohorts=[q.cohort for q in queues.queue],
        quotas=[sum(q.quota.values()) for q in queues.queue], file=Path(file).name if file else "",
    )  # fmt: skip


class WrittenWorkload(Struct, frozen=True):
    """A run's jobs as written into its folder (`workload.jsonl`, which the clock reads), so that
    the driver of a long replay holds none of them while it runs."""

    path: Path
    jobs: int
    dependencies: bool = False
    """Some job depends on others (`JobSpec.depends_on`)."""
    shares: bool = False
    """Some job asks for a share of a GPU (`JobSpec.gpu_milli`)."""

    def specs(self) -> Iterator[JobSpec]:
        """The jobs, read again one at a time, in the order they were written."""
        return workload_specs(str(self.path))


def written_workload(jobs: list[JobSpec], out: Path) -> WrittenWorkload:
    out.mkdir(parents=True, exist_ok=True)
    write_workload(jobs, out / "workload.jsonl")
    dependencies = any(job.depends_on for job in jobs)
    shares = any(job.gpu_milli is not None for job in jobs)
    return WrittenWorkload(out / "workload.jsonl", len(jobs), dependencies, shares)


def prepare_run(
    options: SimOptions, jobs: list[JobSpec] | WrittenWorkload, out: Path,
    workload: dict[str, Any] | None = None,
) -> WrittenWorkload:  # fmt: skip
    """The output folder with the exact workload and options of the run."""
    written = jobs if isinstance(jobs, WrittenWorkload) else written_workload(jobs, out)
    write_options(options, out, workload)
    return written


def write_options(options: SimOptions, out: Path, workload: dict[str, Any] | None) -> None:
    """`options.json`: the options, and (`workload`) how the jobs were made or read."""
    record = msgspec.to_builtins(options) | ({"workload": workload} if workload else {})
    (out / "options.json").write_bytes(msgspec.json.format(msgspec.json.encode(record)))


async def fetch_pages(bus: Bus, endpoint: Endpoint[PageQuery, Any], field: str) -> list[Any]:
    """Every item of a paged endpoint (`sched.jobs`)."""
    items: list[Any] = []
    async for batch in pages_of(bus, endpoint, field):
        items += batch
    return items


async def fetch_timeline(bus: Bus) -> TimelineRows:
    """The clock's timeline, in columns as its pages come (with queues, each page's rows of
    the GPUs they hold too)."""
    points = TimelineRows()
    while True:
        page = await bus.call(TIMELINE, PageQuery(offset=len(points)))
        points.extend(page.points)
        points.extend_queues(page.queues)
        if not page.points or len(points) >= page.total:
            return points


async def pages_of(
    bus: Bus, endpoint: Endpoint[PageQuery, Any], field: str
) -> AsyncIterator[list[Any]]:
    """The items of a paged endpoint, a page at a time."""
    count = 0
    while True:
        page = await bus.call(endpoint, PageQuery(offset=count))
        batch = getattr(page, field)
        count += len(batch)
        yield batch
        if not batch or count >= page.total:
            return


def ran_options(options: SimOptions, ran: dict[str, PolicyInfo | str]) -> SimOptions:
    """`options` with the policies and parameters (defaults included) the services say they run."""
    changes: dict[str, Any] = {}
    for service, field in (("scheduler", "policy"), ("admission", "admission"),
                           ("placement", "placement")):  # fmt: skip
        info = ran.get(service)
        if isinstance(info, PolicyInfo) and info.policy is not None:
            changes[field] = info.policy
            changes[f"{field}_params" if field != "policy" else "policy_params"] = info.params
    return msgspec.structs.replace(options, **changes)


CLUSTER_LABEL_GROUPS = 8
"""A cluster of more groups (a node list such as openb's) is labelled by its GPU types."""


def cluster_label(cluster: ClusterSpec) -> str:
    """`36x4:v100,36x4:p100 (288 GPUs)`, or for many groups
    `1,213 nodes in 404 groups, GPUs G2:4392,T4:842 (5234 GPUs)`."""
    if len(cluster.groups) > CLUSTER_LABEL_GROUPS:
        nodes = sum(g.count for g in cluster.groups)
        types = ",".join(f"{t}:{n}" for t, n in cluster.gpus_by_type().items())
        groups = f"{nodes:,} nodes in {len(cluster.groups)} groups, GPUs {types}"
    else:
        groups = ",".join(f"{g.count}x{g.gpus_per_node}:{g.gpu_type}" for g in cluster.groups)
    return f"{groups or 'no fixed nodes'} ({cluster.total_gpus} GPUs)"


def workload_label(workload: dict[str, Any] | None) -> str:
    """`blox generator: 400 jobs, 20 jobs/h, seed 0` or `trace cluster04.csv (itp, 5,233 jobs)`."""
    if not workload:
        return "given jobs"
    if "trace" in workload:
        how = workload["format"]
        if "philly_reading" in workload:
            how += f", {workload['philly_reading']} reading"
        label = f"trace {Path(workload['trace']).name} ({how}, {workload['jobs']:,} jobs)"
        return label + node_events_label(workload)
    label = (
        f"{workload['generator']} generator: {workload['jobs']:,} jobs, "
        f"{workload['load']:g} jobs/h, seed {workload['seed']}"
    )
    label += ", multi-GPU" if workload.get("multi_gpu") else ""
    if "deadline_factor" in workload:  # (the elasticflow generator)
        least, most = workload["deadline_factor"]
        label += f", deadline factor {least:g}" + (f" to {most:g}" if most != least else "")
        label += f", {100 * workload['best_effort_share']:g}% best-effort"
    return label + node_events_label(workload)


def node_events_label(workload: dict[str, Any]) -> str:
    """`; idle nodes of node_events.csv.gz: 64 of replay_nodes_64.txt from 2021-02-10 20:21:15`."""
    churn = workload.get("node_events")
    if not churn:
        return ""
    label = f"; nodes from {Path(churn['file']).name}"
    if churn.get("nodes_from"):
        label += f": the {churn['nodes']:,} of {Path(churn['nodes_from']).name}"
    if churn.get("start"):
        label += f" from {churn['start']}"
    return label + (", BFTrainer's replayer semantics" if churn.get("bftrainer") else "")


def policies_label(options: SimOptions, queues: QueueLayout | None = None) -> str:
    """`scheduling las (key=rounds), admission accept-all, placement consolidated; 300 s rounds,
    events mode`; with `queues`, the scheduling policy's queues as their count and file (not
    every queue's line)."""

    def one(name: str, params: dict[str, Any], queued: bool = False) -> str:
        said = [f"{k}={v}" for k, v in params.items() if not (queued and k == "queue")]
        if queued and queues is not None:
            of = f" of {queues.file}" if queues.file else ""
            said.insert(0, f"{len(queues.queues.names)} queues{of}")
        shown = " ".join(said)
        return f"{name} ({shown})" if shown else name

    cost = options.preemption_cost
    described = semantics(options.preset).describe() or f"{options.mode} mode"
    return (
        f"scheduling {one(options.policy, options.policy_params, queues is not None)}, admission "
        f"{one(options.admission, options.admission_params)}, placement "
        f"{one(options.placement, options.placement_params)}; {options.round_s:g} s rounds, "
        f"{described}"
        + (
            f", preemption cost {cost.checkpoint_s:g} s + {cost.restore_s:g} s"
            if cost.checkpoint_s or cost.restore_s
            else ""
        )
        + (f", min. run {options.min_run_s:g} s" if options.min_run_s else "")
    )


class ServiceLost(RuntimeError):
    """A service of the run died and was not started again: the run ended, partial."""


TAKE_EVERY_S = 1.0
"""How often the driver takes the jobs that ended from the scheduler while a run goes."""


class TakenJobs:
    """The jobs that ended, taken from the scheduler while the run goes (`sched.finished`). Where
    it hands its results over (`SchedulerConfig.hand_over_results`) it forgets what was taken, so
    that a long replay's scheduler holds only the jobs still active, and the driver only each
    job's row of `jobs.csv` (and its record, with `keep_records`)."""

    def __init__(self, bus: Bus, keep_records: bool) -> None:
        self.bus = bus
        self.keep_records = keep_records
        self.rows = JobRows()
        """The row of each job taken."""
        self.records: list[JobRecord] = []
        self.taken = 0
        self.forgotten = 0
        """Of the jobs taken, those the scheduler forgot (the others it still lists)."""
        self.forgets: bool | None = None  # (not asked yet)

    async def take(self, *, forget_all: bool = False) -> None:
        """Take what ended since the last take; `forget_all`: and have the scheduler forget it
        all (at the end of a run: what it lists then are the jobs that did not end)."""
        while True:
            page = await self.bus.call(FINISHED, FinishedQuery(taken=self.taken, limit=5000))
            self.forgets = page.forgets
            if not page.forgets:
                self.rows, self.records = JobRows(), []  # (its pages of every job give them)
                return
            self.forgotten = self.taken
            for record in page.jobs:
                self.rows.add(record)
                if self.keep_records:
                    self.records.append(record)
            self.taken += len(page.jobs)
            if not page.jobs or (self.taken >= page.total and not forget_all):
                return

    async def keep_taking(self) -> None:
        """While the run goes (a task, cancelled when it ends): take what ended every
        `TAKE_EVERY_S`, as long as the scheduler forgets it and answers."""
        while self.forgets is not False:
            await asyncio.sleep(TAKE_EVERY_S)
            try:
                await self.take()
            except RemoteError:  # (a service is going: the run's end or its loss says why)
                return

    def with_the_rest(self, rest: list[JobRecord]) -> tuple[JobRows, list[JobRecord]]:
        """Every job's row and (`keep_records`) its record, in admission order: those taken and
        `rest`, the scheduler's list of those it did not forget (or of every job), added to the
        rows taken (once, at the end of a run)."""
        if not self.forgets:
            return job_rows(rest), rest if self.keep_records else []
        listed_too = set(self.rows.job_ids(self.forgotten))
        rest = [r for r in rest if r.job_id not in listed_too]
        for record in rest:
            self.rows.add(record)
        records: list[JobRecord] = []
        if self.keep_records:
            records = sorted([*self.records, *rest], key=lambda r: r.seq)
        return self.rows, records


async def collect_partial(
    bus: Bus, subjects: Subjects, taken: TakenJobs, within_s: float = 30.0, *,
    durable: bool = False,
) -> tuple[JobRows, list[JobRecord], TimelineRows, float]:  # fmt: skip
    """What an interrupted run got to: the timeline so far, the jobs that had ended by its last
    instant (the clock may still be moving while we ask: their rows, among which `write_results`
    counts those that ended by then, and records where `taken` keeps them), and that instant.
    Whichever of the two a dead service cannot give (the timeline is the clock's, the jobs the
    scheduler's), the other still is, and the jobs taken before always are (all there is when
    the server is gone: a sweep's private server with its sweep); a `durable` run's jobs are read
    from the scheduler's bucket then."""

    async def within(fetch: Awaitable[T]) -> T | None:
        try:
            async with asyncio.timeout(within_s):
                return await fetch
        except (TimeoutError, RemoteError):
            return None

    points = TimelineRows()
    listed: list[JobRecord] | None = None
    if bus.nc.is_connected:
        points = await within(fetch_timeline(bus)) or TimelineRows()
        if taken.forgets:
            with contextlib.suppress(TimeoutError, RemoteError):
                async with asyncio.timeout(within_s):
                    await taken.take(forget_all=True)
        listed = await within(fetch_pages(bus, JOBS, "jobs"))
        if listed is None and durable:
            listed = await stored_jobs(bus, within_s)
    rows, records = taken.with_the_rest(listed or [])
    # (no timeline: the clock is dead, and stopped where the last job it saw end ended)
    reached = points.last_time() if len(points) else rows.last_end()
    records = [r for r in records if r.end_time is not None and r.end_time <= reached]
    return rows, records, points, reached


async def stored_jobs(bus: Bus, within_s: float) -> list[JobRecord]:
    """The jobs as a durable run's scheduler last stored them (it cannot answer: dead)."""
    import nats.errors

    from gpuyard.services.scheduler.durability import SchedulerStore
    from gpuyard.shared.store import KvStore

    store = KvStore(bus.nc, bus.subjects.cluster, "scheduler")
    try:
        async with asyncio.timeout(within_s):
            await store.open()
            return SchedulerStore(store).read(await store.load()).records
    except (TimeoutError, nats.errors.Error):
        return []


async def until_done(
    finished: asyncio.Future[Progress], services: ServiceSet, grace_s: float
) -> Progress:
    """The run's last progress report; ServiceLost when one of its service processes died first
    and was not started again within `grace_s` (services in this process die with it)."""
    if not services.processes:
        return await finished
    lost = asyncio.ensure_future(services.lost(grace_s))
    try:
        either: list[asyncio.Future[Any]] = [finished, lost]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost.cancel()
    if not finished.done():
        name, code = lost.result()
        raise ServiceLost(f"the {name} service {_ended(code)} and was not started again "
                          f"within {grace_s:g} s")  # fmt: skip
    final = finished.result()
    if final.error:  # a call found nobody to answer it: if a service died, say which
        for _ in range(20):  # (its exit may be seen an instant after the failed call)
            if ended := services.ended():
                name, code = ended[0]
                raise ServiceLost(f"the {name} service {_ended(code)} and the run cannot go on")
            await asyncio.sleep(0.05)
    return final


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _ended(code: int) -> str:
    return f"was killed (signal {-code})" if code < 0 else f"exited ({code})"


async def simulate(
    options: SimOptions,
    jobs: list[JobSpec] | WrittenWorkload,
    out: Path,
    *,
    nats_url: str | None = None,
    cluster_name: str = "sim",
    processes: bool = False,
    external: frozenset[str] = frozenset(),
    on_progress: Callable[[Progress], None] | None = None,
    log_level: str = "warning",
    auth: NatsAuth | None = None,
    on_services: Callable[[ServiceSet], object] | None = None,
    workload: dict[str, Any] | None = None,
    on_policies: Callable[[dict[str, PolicyInfo | str]], object] | None = None,
    on_summary: Callable[[dict[str, Any]], object] | None = None,
    plots: bool = True,
    plotter: Plotter | None = None,
    lost_after_s: float = 5.0,
    keep_jobs: bool = True,
) -> SimResult:
    """Run one simulation of `jobs` (or of those `written_workload` wrote into `out`) and write its
    results into `out`. Without `nats_url`, on a private server.

    `external` names services already running on the server (e.g. in their own containers) for
    this cluster namespace: they are used as they are, with their own policies. Every run asks
    the services which policies they run and records those (with every parameter) in
    `options.json` and `summary.json`; `on_policies` is given their answers before the run starts.
    `auth`: who we and the services started here are to `nats_url`'s server. `on_services` is
    called with the services once they answer, before the run starts (tests: to kill one mid-run
    and start it again with `ServiceSet.replace`, in a durable run with `processes=True`).
    `workload`: how the jobs were made (generator, load, seed, or trace and format), for
    `options.json` and the plots' captions. `plots=False`: result files without the PNGs;
    `plotter`: the process that draws them (else they are drawn in this one, in a thread).
    `on_summary` is given the summary as soon as it is known, before the other result files are
    written (a thread's call: it may print, not touch the event loop).
    `keep_jobs=False`: `SimResult.jobs` is empty, and the jobs' records leave memory as they end
    (a long replay's results are written from their rows).

    Cancelled mid-run (Ctrl-C, SIGTERM), it writes what the run got to (`collect_partial`) with
    `"partial": true` and the simulated time reached in `summary.json`, stops everything and
    raises CancelledError. So it does, raising ServiceLost (naming it), when a service process
    (`processes=True`) dies and is not started again within `lost_after_s` seconds.
    """
    if not isinstance(jobs, WrittenWorkload):  # (a written one's options came from `build`)
        jobs = semantics(options.preset).jobs(options, jobs)
        options = semantics(options.preset).with_workload(options, jobs)
    written = await asyncio.to_thread(prepare_run, options, jobs, out, workload)
    del jobs  # (a long replay's jobs live in their file and in the clock from here on)
    started = time.perf_counter()
    interrupted: asyncio.CancelledError | ServiceLost | None = None
    async with contextlib.AsyncExitStack() as stack:
        url = nats_url if nats_url else await stack.enter_async_context(EmbeddedNats(runs=1))
        subjects = Subjects(cluster_name)
        configs = service_configs(options, written.path, dependencies=written.dependencies)
        services = ServiceSet(
            url, cluster_name, {k: v for k, v in configs.items() if k not in external},
            processes=processes, log_file=out / "services.log", log_level=log_level,
            expect=external, auth=auth if nats_url else None,
        )  # fmt: skip
        try:
            await stack.enter_async_context(services)
        except RuntimeError as exc:  # (a service that does not answer, or a policy that raised)
            raise RuntimeError(f"{exc}{where_logged(out / 'services.log', external)}") from None
        if on_services is not None:
            on_services(services)
        ours = auth if nats_url else None
        nc = await connect(url, name=f"gpuyard-sim-{cluster_name}", auth=ours)
        bus = Bus(nc, subjects, caller=ours.caller if ours is not None else ANONYMOUS)
        stack.push_async_callback(bus.close)
        ran = await show_policies(bus)
        options = ran_options(options, ran)
        await asyncio.to_thread(write_options, options, out, workload)
        if on_policies is not None:
            on_policies(ran)
        finished: asyncio.Future[Progress] = asyncio.get_running_loop().create_future()
        decoder = msgspec.json.Decoder(Progress)
        declined: dict[str, str] = {}  # (the clock tells each report's new ones)

        async def on_progress_msg(msg: Any) -> None:
            progress = decoder.decode(msg.data)
            declined.update(progress.declined)
            if on_progress is not None:
                on_progress(progress)
            if progress.done and not finished.done():
                finished.set_result(progress)

        await nc.subscribe(subjects.of(PROGRESS), cb=on_progress_msg)
        await bus.call(RUN, RunRequest())
        # (ElasticFlow's figures read the jobs' types from their records)
        taken = TakenJobs(bus, keep_records=keep_jobs or options.preset == "elasticflow")
        taking = asyncio.create_task(taken.keep_taking())
        stack.push_async_callback(_cancelled, taking)
        runs: list[JobRun] = []
        try:
            final = await until_done(finished, services, lost_after_s)
        except (asyncio.CancelledError, ServiceLost) as stopped:
            interrupted = stopped
            await _cancelled(taking)
            rows, records, points, reached = await collect_partial(
                bus, subjects, taken, durable=options.durable
            )
            stats: list[ServiceStats] = []
        else:
            await _cancelled(taking)
            if final.error:
                raise RuntimeError(
                    f"simulation {cluster_name!r} failed: {final.error}"
                    f"{where_logged(out / 'services.log', external)}"
                )
            if taken.forgets is not False:
                await taken.take(forget_all=True)
            rows, records = taken.with_the_rest(await fetch_pages(bus, JOBS, "jobs"))
            points = await fetch_timeline(bus)
            stats = [
                await bus.call(STATS, Empty(), svc=token)
                for token in (
                    SERVICE_TOKENS["simclock"],
                    *(SERVICE_TOKENS[s] for s in CONTROL_PLANE),
                )
            ]
            await asyncio.to_thread(write_stats, stats, out)
            reached = final.now
            if options.preset == "elasticflow" or (
                written.shares and options.event_storage != "none"
            ):
                runs = await job_runs(bus)
    if declined:  # (no service keeps them: the clock heard admission's verdicts)
        rows.add_declined((s for s in written.specs() if s.job_id in declined), declined)
    wall = time.perf_counter() - started
    labels = {
        "cluster": cluster_label(options.cluster),
        "workload": workload_label(workload),
    }
    extra: dict[str, Any] = {
        "partial": interrupted is not None,
        "policy": options.policy,
        "policy_params": options.policy_params,
        "admission": options.admission,
        "admission_params": options.admission_params,
        "placement": options.placement,
        "placement_params": options.placement_params,
        "round_s": options.round_s,
        "mode": options.mode,
        **labels,
        "preemption_cost_s": options.preemption_cost.checkpoint_s
        + options.preemption_cost.restore_s,
        "min_run_s": options.min_run_s,
        "simulated_s": reached,
        "wall_s": round(wall, 3),
        "jobs_in_workload": written.jobs,
    }
    if interrupted is None:
        extra["instants"] = final.instants
        if final.compute_gpu_s is not None:
            extra["compute_gpu_s"] = final.compute_gpu_s
        if options.node_events is not None:
            extra |= churn_figures(final, stats)
    deadlines: dict[str, Any] = {}
    if options.preset == "elasticflow" and interrupted is None:
        model = await asyncio.to_thread(load_throughputs, options.throughputs)
        node_types = {n.node_id: n.gpu_type for n in options.cluster.nodes()}
        job_types = {r.job_id: r.spec.job_type for r in records}
        efficiency = efficiency_frame(
            runs, job_types, model, node_types, options.cluster.total_gpus
        )
        # `--policy` named the scheme: comparisons list runs by it
        extra |= {"policy": options.scheme, "scheme": options.scheme,
                  "scheduling_policy": options.policy}  # fmt: skip
        deadlines = {"efficiency": efficiency}
    if written.shares and options.event_storage != "none" and interrupted is None:
        deadlines["allocation"] = await asyncio.to_thread(allocation_of, runs, written, options)
    if options.window is not None:
        first, end = options.window
        in_order = sorted(written.specs(), key=lambda spec: spec.submit_time or 0.0)  # as the clock
        deadlines["measured"] = {spec.job_id for spec in in_order[first:end]}
        extra["window"] = [first, end]
    queues = run_queues(options, (workload or {}).get("queues"))
    caption = (
        f"{policies_label(options, queues)}\n{labels['workload']}; cluster {labels['cluster']}"
    )
    if options.window is not None:
        caption += f"; JCT of jobs {first} to {end - 1} in arrival order (measurement window)"
    if options.preset == "elasticflow":
        mended = ", as intended" if options.as_intended else ""
        caption = (
            f"ElasticFlow scheme {options.scheme}{mended}, {options.round_s:g} s slots\n{caption}"
        )
    if isinstance(interrupted, ServiceLost):
        extra["stopped_by"] = str(interrupted)
    if interrupted is not None:
        caption += f"\nPARTIAL: interrupted at t = {reached / 3600:,.1f} h"
    summary = await asyncio.to_thread(
        write_results, rows, points, out, extra, caption,
        reached if interrupted is not None else None, **deadlines, plots=plots,
        plotter=plotter, on_summary=on_summary,
        node_churn=options.node_events is not None, queues=queues,
    )  # fmt: skip
    if isinstance(interrupted, ServiceLost):
        raise ServiceLost(
            f"{interrupted}: stopped at t = {reached / 3600:,.1f} h simulated, "
            f"{summary['completed']:,} of {written.jobs:,} jobs completed; partial results "
            f'("partial": true) in {out}/'
        )
    if interrupted is not None:
        raise interrupted
    kept = records if keep_jobs else []
    return SimResult(summary=summary, jobs=kept, timeline=points.table(), wall_s=wall, stats=stats)


def write_stats(stats: list[ServiceStats], out: Path) -> None:
    """`stats.json`: each service's own counters (requests handled, requests it made per subject
    with the seconds it waited for their replies, decisions), for benchmarks and for whoever
    wonders where a run's time went."""

    def one(s: ServiceStats) -> dict[str, Any]:
        requests = {subject: {"count": int(count), "wait_s": wait}
                    for subject, (count, wait) in s.requests.items()}  # fmt: skip
        return {"handled": s.handled, "handler_s": s.handler_s, "policy_s": s.policy_s,
                "decisions": len(s.decision_s), "decisions_of_changes": s.decisions_of_changes,
                "requests": requests}  # fmt: skip

    record = {s.service: one(s) for s in stats}
    (out / "stats.json").write_bytes(msgspec.json.format(msgspec.json.encode(record)))


def churn_figures(final: Progress, stats: list[ServiceStats]) -> dict[str, Any]:
    """Node-churn runs (BFTrainer): steps trained and lost, and each decision's policy time."""
    decisions = np.array(next((s.decision_s for s in stats if s.service == "scheduler"), []))
    return {
        "samples_trained": final.steps_done,
        "rescale_cost_samples": final.rescale_steps,
        "preemption_cost_samples": final.preemption_steps,
        "decisions": len(decisions),
        "decision_s_p50": float(np.percentile(decisions, 50)) if len(decisions) else None,
        "decision_s_p99": float(np.percentile(decisions, 99)) if len(decisions) else None,
        "decision_s_total": float(decisions.sum()),
    }


def allocation_of(
    runs: list[JobRun], written: WrittenWorkload, options: SimOptions
) -> tuple[Table, int]:
    """The run's GPU allocation and stranded GPUs over time (`gpuyard.sharing`), and the
    cluster's GPUs in thousandths."""
    nodes = options.cluster.nodes()
    capacity: dict[str, int] = {}
    for node in nodes:
        capacity[node.gpu_type] = capacity.get(node.gpu_type, 0) + node.num_gpus
    asks, arrivals, shares = {}, {}, {}
    for spec in written.specs():
        job_id = spec.job_id or ""
        asks[job_id] = ask_of(spec, capacity)
        arrivals[job_id] = spec.submit_time or 0.0
        shares[job_id] = spec.gpu_milli
    node_types = {n.node_id: n.gpu_type for n in nodes}
    frame = allocation_frame(runs, asks, arrivals, shares, node_types, capacity)
    return frame, MILLI * sum(capacity.values())


async def job_runs(bus: Bus) -> list[JobRun]:
    """From the run's event stream: every job's runs (the GPUs it runs on from each start or
    resize, none from each stop)."""
    js = bus.nc.jetstream()
    last = -1
    while True:  # events are published, not acknowledged: let the stream take the last ones in
        state = (await js.stream_info(bus.subjects.stream_name)).state.last_seq
        if state == last:
            break
        last = state
        await asyncio.sleep(0.05)
    kinds = ["job.started", "job.resized", "job.preempted", "job.completed", "job.failed",
             "job.cancelled", "job.timeout"]  # fmt: skip
    runs: list[JobRun] = []
    async for stored in read_events(bus.nc, bus.subjects, types=kinds):
        event = stored.event
        if event is not None and event.job_id is not None:
            runs.append((event.now, event.job_id, list(event.gpus)))
    return runs


def where_logged(log: Path, external: frozenset[str]) -> str:
    """Where a failed run's tracebacks are: `; tracebacks in results/services.log` (and the logs
    of the services run elsewhere); nothing when the services started here log elsewhere too."""
    if not log.is_file():  # (a caller that did not point the logs there)
        return ""
    elsewhere = f" and the logs of the {', '.join(sorted(external))}" if external else ""
    return f"; tracebacks in {log}{elsewhere}"


class ProgressBar:
    """One line, redrawn in place on a terminal; a line every few seconds otherwise. Past a few
    seconds it says how long the run has taken and about how long is left (from the share of
    jobs that ended: a replay's jobs end at a fairly steady pace once it is under way)."""

    def __init__(self, label: str, stream: Any = None) -> None:
        self.label = label
        self.stream = stream = stream or sys.stderr  # (the one of now, not of the import)
        self.tty = stream.isatty()
        self.last = 0.0
        self.started = time.monotonic()

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if not (p.done or self.tty or now - self.last >= 5):
            return
        self.last = now
        frac = p.finished / p.total if p.total else 1.0
        bar = "#" * int(30 * frac)
        line = (
            f"{self.label} [{bar:<30}] {p.finished:,}/{p.total:,} jobs  "
            f"t={p.now / 3600:,.1f} h  {p.instants:,} instants"
        )
        elapsed = now - self.started
        if elapsed >= ETA_AFTER_S and not p.done:
            line += f"  {_duration(elapsed)}"
            if frac >= 0.01:
                line += f", about {_duration(elapsed * (1 - frac) / frac)} left"
        if self.tty:  # (what a longer line left behind goes)
            line += "\x1b[K"
        end = "\n" if p.done or not self.tty else "\r"
        print(line, end=end, file=self.stream, flush=True)


ETA_AFTER_S = 3.0
"""A run shorter than this shows no time taken or left."""


def _duration(seconds: float) -> str:
    """`45 s`, `3 min 05 s`, `2 h 07 min`."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"

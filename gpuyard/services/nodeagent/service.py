"""The node agent: one per machine. It registers the machine's GPUs with placement, heartbeats with
GPU metrics and job progress, launches and preempts job parts as placement commands, streams their
logs and reports their exits to the scheduler.

Subjects (all under `gpuyard.<cluster>.`): it serves `node.<id>.cmd` (NodeCommand), `node.<id>.logs`
(LogsRequest), `node.<id>.register` (placement asks it to register again), `node.<id>.ping`/`.stats`;
it publishes `logs.<job_id>.<id>` (LogLine); it requests `node.<id>.hb` (Heartbeat: placement's
answer renews its lease), `place.register.node.<id>`, `place.nodes.node.<id>` (when it stops) and
`sched.exited.node.<id>`: every subject it sends on names it, and a secured server lets it send on
no other node's.

Fencing (as a Kubernetes node lease): an agent that has had no answer from placement for `lease_s`,
or whose credentials the server refuses, stops every job part (placement declares it lost, and its
jobs run elsewhere, only after the lease and the grace are over), and registers afresh, with no
jobs and a new boot id, once placement answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from gpuyard.shared.connection import Bus
from gpuyard.shared.contract import (
    Empty,
    ExitReport,
    Heartbeat,
    JobExit,
    Launch,
    LogLine,
    LogsReply,
    LogsRequest,
    NodeCommand,
    NodeCommandReply,
    NodesChanged,
    RegisterNode,
)
from gpuyard.shared.endpoints import (
    EXITED,
    HEARTBEAT,
    LOG_LINE,
    NODE_COMMAND,
    NODE_LOGS,
    NODES,
    PING,
    REGISTER,
    REREGISTER,
    STATS,
    Endpoint,
)
from gpuyard.shared.errors import BadRequest, RemoteError
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import NodeSpec
from gpuyard.shared.service import Handler, Service

from .accounts import JobAccounts
from .nvml import Nvml, gpu_type_name
from .procs import JobPart, Places, Starter
from .sdnotify import SystemdNotifier


class NodeAgentConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    node_id: str
    gpus: int | None = None
    """GPUs to offer where NVML is absent (or to override it with `use_nvml=False`)."""
    gpu_type: str | None = None
    address: str = ""
    """Where other nodes reach this one (the rendezvous address of jobs it is master of)."""
    use_nvml: bool = True
    heartbeat_s: float = 1.0
    grace_s: float = 30.0
    """Seconds between SIGTERM and SIGKILL when a job is preempted."""
    log_dir: str = "/var/lib/gpuyard/logs"
    """A job's logs go to `<log_dir>/<cluster>/<job id>/`."""
    checkpoint_root: str = "/var/lib/gpuyard/checkpoints"
    """Shared by all nodes (NFS or similar) so a job resumes from its checkpoint anywhere; a job's
    checkpoints go to `<checkpoint_root>/<cluster>/<job id>/`."""
    exit_retry_s: float = 0.5
    labels: dict[str, str] = {}
    lease_s: Annotated[float, Meta(gt=0)] = 60.0
    """With no answer from placement this long (to a heartbeat or a registration), or with its
    credentials refused, the agent stops every job part (fencing): placement declares a silent
    node lost only after this plus `grace_s` (its `heartbeat_timeout_s`). An outage shorter than
    this stops no job."""
    register_every_s: Annotated[float, Meta(ge=0)] = 5.0
    """At most one registration per this many seconds: placement's asks, repeated after an
    outage, are answered by one."""
    job_user: str = ""
    """The Unix account jobs run as when their submitter is not in `user_accounts` (an agent
    running as root; "": `gpuyard-job` where it exists, else `nobody`)."""
    user_accounts: dict[str, str] = {}
    """Submitter (a job's `user`: `alice`, `op.admin`) -> the Unix account their jobs run as."""
    jobs_as_agent_user: bool = False
    """An agent that is not root runs its jobs as itself only when told so (they can read its
    credentials)."""
    credentials: list[str] = []
    """The agent's secret files (its profile, seed, key): no job may read them."""
    control_planes: list[str] = []
    """Control planes' state on this machine (files or folders): no job may read a file of it."""


class NodeAgent(Service):
    name = "nodeagent"
    answered_elsewhere = frozenset({HEARTBEAT.name})  # (ours, under our prefix: placement answers)

    def __init__(
        self, bus: Bus, config: NodeAgentConfig, accounts: JobAccounts | None = None
    ) -> None:
        super().__init__(bus)
        bus.caller = Caller("node", config.node_id)  # our requests act for this node
        self.config = config
        self.node_id = config.node_id
        self.boot_id = uuid.uuid4().hex[:12]
        self.places = Places(
            Path(config.log_dir), Path(config.checkpoint_root), bus.subjects.cluster
        )
        self.accounts = accounts or job_accounts(config, self.places)
        """Who its jobs run as (checked: ValueError if no one can safely)."""
        self.starter = Starter.find()
        """How it starts their processes (ValueError where it cannot)."""
        self.environment = dict(os.environ)
        """The agent's environment, read once: what its jobs inherit of it (`job_environment`)."""
        self.nvml: Nvml | None = None
        self.node = self._discover()
        self.parts: dict[str, JobPart] = {}
        self.holders: dict[
            int, list[JobPart]
        ] = {}  # GPU index -> the parts whose processes hold it
        self.stopping: dict[str, JobPart] = {}  # job id -> its part told to stop, until it exits
        self.pending_exits: list[JobExit] = []
        self.launched: dict[tuple[Any, ...], None] = {}  # launches handled (the latest, in order)
        self._exits_ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._register_lock = asyncio.Lock()
        self.leaving = False  # stopping: never register again (placement may still ask us to)
        self._registering: asyncio.Task[None] | None = None  # the registration in flight or due
        self._register_started = -float("inf")  # (monotonic) when the last registration began
        self.registered = asyncio.Event()
        self.contact = time.monotonic()
        """When the last request that placement answered was sent (the lease runs from there)."""
        self._renewing: asyncio.Task[None] | None = (
            None  # the heartbeat awaiting placement's answer
        )
        self.fenced = ""
        """Why the agent stopped its jobs on its own, until it registers again."""
        self.notifier = SystemdNotifier()
        self.log = self.log.bind(node_id=self.node_id)

    @property
    def token(self) -> str:
        return f"node.{self.node_id}"

    def subject_params(self) -> dict[str, str]:
        return {"svc": self.token, "node": self.node_id}

    def routes(self) -> dict[Endpoint[Any, Any], Handler]:
        return {
            NODE_COMMAND: self.command, NODE_LOGS: self.logs, REREGISTER: self._reregister,
            PING: self.ping, STATS: self.stats,
        }  # fmt: skip

    @property
    def micro_name(self) -> str:
        return "gpuyard-nodeagent"

    # ------------------------------------------------------------------ GPUs

    def _discover(self) -> NodeSpec:
        """The node's GPUs from NVML, or from the configuration where NVML is absent."""
        cfg = self.config
        labels = {**cfg.labels, "boot": self.boot_id}
        nvml, why = Nvml.open() if cfg.use_nvml else (None, "disabled by configuration")
        if nvml is not None and nvml.handles:
            gpus = nvml.gpus()
            self.nvml = nvml
            labels |= {"gpu_source": "nvml", "gpu_model": gpus[0].name}
            node = NodeSpec(
                node_id=cfg.node_id, num_gpus=len(gpus),
                gpu_type=cfg.gpu_type or gpu_type_name(gpus[0].name), address=cfg.address,
                gpu_memory_mib=gpus[0].memory_mib, gpu_uuids=[g.uuid for g in gpus], labels=labels,
            )  # fmt: skip
            self.log.info("gpus.discovered", source="nvml", count=len(gpus), model=gpus[0].name)
            return node
        if nvml is not None:
            nvml.close()
            why = "NVML found no GPU"
        if cfg.gpus is None:
            raise ValueError(f"{why}: give the GPUs with --gpus N [--gpu-type T]")
        labels["gpu_source"] = "flags"
        self.log.warning("gpus.from_flags", reason=why, count=cfg.gpus, gpu_type=cfg.gpu_type)
        return msgspec.convert(
            {"node_id": cfg.node_id, "num_gpus": cfg.gpus, "gpu_type": cfg.gpu_type or "gpu",
             "address": cfg.address, "labels": labels},
            NodeSpec,
        )  # fmt: skip

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        # One subscription: commands, log requests and re-registrations in arrival order.
        await self.listen(self.prefix, self.routes())
        await self._serve_discovery()
        self.log.info("service.started", prefix=self.prefix, gpus=self.node.num_gpus)
        self.contact = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._heartbeats()),
            asyncio.create_task(self._report_exits()),
        ]
        self.register_soon()

    async def stop(self) -> None:
        """Stop every job part (they checkpoint), tell placement the node is gone, disconnect."""
        self.notifier.notify("STOPPING=1")
        self.leaving = True
        self.log.info("node.leaving", jobs=sorted(self.parts), grace_s=self.config.grace_s)
        for part in list(self.parts.values()):
            part.stop()
        if self.parts:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.grace_s + 5):
                    await asyncio.gather(*(part.done.wait() for part in self.parts.values()))
        if self.registered.is_set():
            with contextlib.suppress(RemoteError):
                await self.bus.call(
                    NODES,
                    NodesChanged(now=time.time(), gone=[self.node_id], reason="agent stopped"),
                    within_s=5.0,
                )
        for task in self._tasks:
            task.cancel()
        if self.nvml is not None:
            self.nvml.close()
        await super().stop()

    async def halt(self) -> None:
        """The connection is gone for good: wait for the parts told to stop, stop the tasks."""
        waiting = [part.done.wait() for part in [*self.parts.values(), *self.stopping.values()]]
        if waiting:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.grace_s + 5):
                    await asyncio.gather(*waiting)
        for task in self._tasks:
            task.cancel()
        if self.nvml is not None:
            self.nvml.close()
        self.log.info("service.stopped", reason=self.fenced)

    def register_soon(self) -> None:
        """Register (again): at once, unless a registration is in flight or due (it answers this
        ask too), or one began less than `register_every_s` ago (then once, when that is over)."""
        if self._registering is not None and not self._registering.done():
            return
        wait = self._register_started + self.config.register_every_s - time.monotonic()
        self._registering = asyncio.create_task(self.register(after_s=max(wait, 0.0)))

    async def register(self, after_s: float = 0.0) -> None:
        """Announce the node until placement answers; then stop parts placement does not know of."""
        if after_s > 0:
            await asyncio.sleep(after_s)
        if self.fenced:  # what placement will requeue (and a cancel wait for) is gone first
            await asyncio.gather(*(part.done.wait() for part in list(self.stopping.values())))
        async with self._register_lock:
            self._register_started = time.monotonic()
            while True:
                if self.leaving:
                    return
                sent = time.monotonic()
                told = {
                    *self.parts,
                    *(e.job_id for e in self.pending_exits),
                    *(k[0] for k in self.launched),
                }
                request = RegisterNode(
                    now=time.time(), node=self.node, jobs=sorted(told),
                    lease_s=self.config.lease_s, grace_s=self.config.grace_s,
                    heartbeat_s=self.config.heartbeat_s,
                )  # fmt: skip
                try:
                    info = await self.bus.call(REGISTER, request, within_s=5.0)
                except RemoteError as exc:
                    self.log.warning("register.failed", error=str(exc))
                    await asyncio.sleep(1.0)
                    continue
                if request.node.labels.get("boot") == self.boot_id:
                    break  # (else it fenced meanwhile: register as its new boot)
            self._renew(sent)
            self.fenced = ""
            self.registered.set()
            self.notifier.notify("READY=1", f"STATUS=registered {self.node.num_gpus} GPUs")
            self.log.info("node.registered", gpus=self.node.num_gpus, gpu_type=self.node.gpu_type)
            placed_here = {
                job
                for job, gpus in info.busy.items()
                if any(g.node_id == self.node_id for g in gpus)
            }
            for job_id, part in list(self.parts.items()):
                if job_id not in placed_here and part.created < sent:
                    self.log.warning("part.orphaned", job_id=job_id)
                    self._stop_part(job_id)

    async def _reregister(self, _: Empty) -> None:
        # A leaving agent's last heartbeats can reach placement after its departure, and
        # placement then asks it to register again: it must not come back as it exits.
        if not self.leaving:
            self.register_soon()

    async def on_reconnect(self) -> None:
        """The NATS connection came back: placement may have restarted meanwhile."""
        self.register_soon()

    # ------------------------------------------------------------------ the lease

    def _renew(self, sent: float) -> None:
        """Placement answered a request sent at `sent` (monotonic): the lease runs from there (an
        answer that was held up, e.g. while this process was paused, renews only up to then)."""
        self.contact = max(self.contact, sent)
        if self.fenced:
            self.register_soon()  # back in contact: join again, as a new boot with no jobs

    def lease_left_s(self) -> float:
        return self.config.lease_s - (time.monotonic() - self.contact)

    def check_lease(self) -> None:
        if self.lease_left_s() < 0 and not self.fenced:
            self.fence(f"no answer from the control plane for {self.config.lease_s:g} s")

    def fence(self, reason: str) -> None:
        """Stop every job part (they checkpoint, as when preempted): placement will declare this
        node lost, or has, and run its jobs elsewhere. Until the node registers again it takes
        no launch, and then as a new boot, so that placement requeues what it placed here."""
        if self.fenced:
            return
        self.fenced = reason
        self.log.warning("node.fenced", reason=reason, jobs=sorted(self.parts))
        for job_id in list(self.parts):
            self._stop_part(job_id)
        self.boot_id = uuid.uuid4().hex[:12]
        self.node = msgspec.structs.replace(
            self.node, labels={**self.node.labels, "boot": self.boot_id}
        )
        self.launched.clear()
        self.registered.clear()

    # ------------------------------------------------------------------ commands

    async def command(self, cmd: NodeCommand) -> NodeCommandReply:
        """Preempt, then launch. Returns at once: a launch waits in the background for its GPUs'
        previous holders to exit, so the control plane never waits out a grace period."""
        self.check_lease()  # (a command held up while this process was paused comes late)
        if self.fenced and cmd.launch:
            raise BadRequest(
                f"node {self.node_id!r} is fenced ({self.fenced}): no launch until it registers again"
            )
        for i, launch in enumerate(cmd.launch):
            if launch.spec is None:
                raise BadRequest(
                    f"the launch of job {launch.job_id!r} carries no job spec",
                    field=f"$.launch[{i}].spec",
                )
        progress: dict[str, float] = {}
        for job_id in cmd.preempt:
            part = self.parts.get(job_id)
            steps = [p.iterations for p in part.progress()] if part is not None else []
            if steps:
                progress[job_id] = float(min(steps))  # what every rank has reached
        for job_id in cmd.preempt:
            if job_id not in self.parts and job_id not in self.stopping:
                # Nothing of it runs here (it never came, or ended): say so, as of a part stopped.
                self.pending_exits.append(
                    JobExit(job_id=job_id, node_id=self.node_id, status="stopped")
                )
                self._exits_ready.set()
        preempted = [job_id for job_id in cmd.preempt if self._stop_part(job_id)]
        launched = []
        for launch in cmd.launch:
            key = _launch_key(launch)
            if key in self.launched:  # the same command again (its answer was lost): done already
                launched.append(launch.job_id)
                continue
            if launch.job_id in self.parts:
                self._stop_part(launch.job_id)  # moved within the node: a fresh start
            self._start_part(launch)
            self.launched[key] = None
            while len(self.launched) > 10_000:
                del self.launched[next(iter(self.launched))]
            launched.append(launch.job_id)
        return NodeCommandReply(preempted=preempted, launched=launched, progress=progress)

    def _stop_part(self, job_id: str) -> bool:
        part = self.parts.pop(job_id, None)
        if part is None:
            return False
        self.log.info("job.preempting", job_id=job_id, grace_s=self.config.grace_s)
        part.stop()
        self.stopping[job_id] = part
        return True

    def _time_out(self, part: JobPart) -> None:
        """The part ran out of its time limit: stopped as a preemption is (SIGTERM, the grace
        period, SIGKILL), its exit reported as `timeout`."""
        if part.stopping:
            return  # (told to stop already: that stop is its end)
        self.log.info("job.time_limit", job_id=part.job_id, grace_s=self.config.grace_s)
        part.timed_out = True
        part.stop()

    def _start_part(self, launch: Launch) -> None:
        assert launch.spec is not None  # (`command` refused a launch without one)
        part = JobPart(
            launch, self.node_id, self.places, self._publish_line, self.config.grace_s,
            self.starter, self.node.gpu_type, self.accounts.for_user(launch.spec.user),
        )  # fmt: skip
        # It starts once the GPUs' holders have exited (but the running job it is to share them
        # with, and, for a job asking for a share of a GPU, the others that hold shares of it),
        # and this job's own part told to stop (resized or moved here): that part writes the
        # checkpoint the new one resumes from.
        share = launch.spec.gpu_milli is not None
        earlier = [
            holder for g in launch.gpus for holder in self.holders.get(g, ())
            if holder.stopping or not (
                holder.job_id == launch.share_with
                or (share and holder.launch.spec is not None and holder.launch.spec.gpu_milli)
            )
        ]  # fmt: skip
        if (previous := self.stopping.get(launch.job_id)) is not None:
            earlier.append(previous)
        before = [p.done for p in dict.fromkeys(earlier)]
        for g in launch.gpus:
            self.holders.setdefault(g, []).append(part)
        self.parts[launch.job_id] = part
        self._tasks.append(asyncio.create_task(self._run_part(part, before)))

    async def _run_part(self, part: JobPart, before: list[asyncio.Event]) -> None:
        job_id = part.job_id
        failure: tuple[int, int] = (-1, 0)
        reason = ""
        try:
            for event in before:
                await event.wait()
            if part.stopping:
                return
            try:
                await part.spawn(self.environment)
            except (OSError, ValueError) as exc:
                failure, reason = (part.launch.rank_offset, 127), f"launch failed: {exc}"
                part.stop()  # whatever did start
                self.log.error("job.launch_failed", job_id=job_id, error=str(exc))
                await part.wait()
            else:
                self.log.info(
                    "job.launched", job_id=job_id, gpus=part.launch.gpus, ranks=part.ranks,
                    attempt=part.launch.attempt,
                )  # fmt: skip
                limit = part.launch.time_limit_s
                timer = None
                if limit is not None:
                    timer = asyncio.get_running_loop().call_later(limit, self._time_out, part)
                try:
                    failure = await part.wait()
                finally:
                    if timer is not None:
                        timer.cancel()
                if failure[0] >= 0:
                    reason = f"rank {failure[0]} exited with {failure[1]}"
        finally:
            part.done.set()
            for g in part.launch.gpus:
                holders = self.holders.get(g, [])
                if part in holders:
                    holders.remove(part)
                if not holders:
                    self.holders.pop(g, None)
            if self.parts.get(job_id) is part:
                del self.parts[job_id]
            if self.stopping.get(job_id) is part:
                del self.stopping[job_id]
        finished = bool(part.procs) and failure[0] < 0  # every process ran and exited 0
        if part.timed_out and not finished:
            self.log.info("job.timed_out", job_id=job_id, time_limit_s=part.launch.time_limit_s)
            self.pending_exits.append(
                JobExit(job_id=job_id, node_id=self.node_id, status="timeout",
                        steps_done=part.steps_done(), attempt=part.launch.attempt)
            )  # fmt: skip
            self._exits_ready.set()
            return
        if part.stopping and not finished and not reason.startswith("launch failed"):
            self.log.info("job.stopped", job_id=job_id)
            # (a job being cancelled ends when each of its nodes said its part is gone)
            self.pending_exits.append(
                JobExit(job_id=job_id, node_id=self.node_id, status="stopped",
                        steps_done=part.steps_done(), attempt=part.launch.attempt)
            )  # fmt: skip
            self._exits_ready.set()
            return
        if part.stopping and finished:  # it was told to stop just as it finished: report that
            reason = "finished as it was being stopped"
        status: Literal["failed", "completed"] = "failed" if failure[0] >= 0 else "completed"
        self.log.info("job.exited", job_id=job_id, status=status, exit_code=failure[1])
        self.pending_exits.append(
            JobExit(job_id=job_id, node_id=self.node_id, status=status, exit_code=failure[1],
                    steps_done=part.steps_done(), attempt=part.launch.attempt, reason=reason)
        )  # fmt: skip
        self._exits_ready.set()

    async def _report_exits(self) -> None:
        """Tell the scheduler every exit, retrying until it answers: no exit is lost."""
        while True:
            await self._exits_ready.wait()
            self._exits_ready.clear()
            while self.pending_exits:
                batch = list(self.pending_exits)
                try:
                    await self.bus.call(
                        EXITED, ExitReport(now=time.time(), exits=batch), within_s=10.0
                    )
                except RemoteError as exc:
                    self.log.warning("exit.report_failed", error=str(exc), jobs=len(batch))
                    await asyncio.sleep(self.config.exit_retry_s)
                    continue
                del self.pending_exits[: len(batch)]

    # ------------------------------------------------------------------ logs and heartbeats

    async def _publish_line(self, job_id: str, rank: int, line: str) -> None:
        msg = LogLine(job_id=job_id, node_id=self.node_id, rank=rank, line=line, time=time.time())
        with contextlib.suppress(Exception):  # logs are best effort; the file keeps everything
            await self.bus.publish(LOG_LINE, msg, job=job_id, node=self.node_id)

    async def logs(self, req: LogsRequest) -> LogsReply:
        try:
            folder = self.places.job_logs(req.job_id)
        except ValueError as exc:  # (the contract's type refuses these already)
            raise BadRequest(str(exc), field="$.job_id") from None
        lines = await asyncio.to_thread(_tail_logs, folder, req.tail_bytes, self.node_id)
        return LogsReply(lines=lines)

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(
            now=time.time(),
            node_id=self.node_id,
            boot_id=self.boot_id,
            nvml=self.nvml is not None,
            gpus=self.nvml.metrics() if self.nvml is not None else [],
            jobs=[p for part in self.parts.values() for p in part.progress()],
        )

    async def _heartbeats(self) -> None:
        """Heartbeat; one at a time asks for placement's answer (the lease's renewal), the others
        are published while it is awaited. Fence when the lease is over."""
        every = self.config.heartbeat_s
        watchdog = self.notifier.watchdog_interval_s()
        if watchdog is not None:
            every = min(every, watchdog)
        while True:
            beat = self.heartbeat()
            if self._renewing is None or self._renewing.done():
                self._renewing = asyncio.create_task(self._renew_with(beat))
            else:
                with contextlib.suppress(Exception):
                    await self.bus.publish(HEARTBEAT, beat, node=self.node_id)
            self.check_lease()
            self.notifier.notify("WATCHDOG=1")
            await asyncio.sleep(every)

    async def _renew_with(self, beat: Heartbeat) -> None:
        sent = time.monotonic()
        try:  # (any failure, a closed connection's too, only leaves the lease as it was)
            await self.bus.call(
                HEARTBEAT,
                beat,
                node=self.node_id,
                within_s=min(max(self.config.lease_s / 4, 1.0), 10.0),
            )
        except Exception:
            return
        self._renew(sent)


def job_accounts(config: NodeAgentConfig, places: Places) -> JobAccounts:
    """Who this node's jobs run as, checked (ValueError: one line): the folders its jobs write
    to made first, so that a job account that cannot enter them is found now, not at a launch."""
    folders = [places.log_dir / places.cluster, places.checkpoint_root / places.cluster]
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cannot make {folder}: {exc.strerror}") from None
    return JobAccounts.resolve(
        config.job_user, config.user_accounts, config.jobs_as_agent_user,
        credentials=config.credentials, control_planes=config.control_planes,
        job_folders=[str(f) for f in folders],
    )  # fmt: skip


def _launch_key(launch: Launch) -> tuple[Any, ...]:
    """What makes a launch this one: the job's run (attempt) on these GPUs, in this shape."""
    return (
        launch.job_id,
        launch.attempt,
        tuple(launch.gpus),
        launch.rank_offset,
        launch.world_size,
    )


def _tail_logs(folder: Path, tail_bytes: int, node_id: str) -> list[str]:
    """The last `tail_bytes` of each rank's log, each line prefixed with where it came from."""
    lines: list[str] = []
    for path in sorted(folder.glob("rank*.log")):
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - tail_bytes, 0))
            data = f.read()
        text = data.decode(errors="replace").splitlines()
        if size > tail_bytes and text:
            text = text[1:]  # a partial first line
        lines += [f"[{node_id} {path.stem}] {line}" for line in text]
    return lines

"""Placement: owns the cluster map (nodes, GPUs, which job holds which GPU) and applies the
placement policy. It turns the scheduler's decision into commands to node agents: preempt the jobs
that lost their GPUs, launch the ones that gained some."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import msgspec
from msgspec import Struct

from gpuyard.shared.connection import Bus, encode
from gpuyard.shared.contract import (
    Ack,
    ApplyReply,
    ApplyRequest,
    ApplyStages,
    ApplyStagesReply,
    BatchChoice,
    ClusterInfo,
    DoneReply,
    DrainRequest,
    Empty,
    Event,
    Heartbeat,
    HeartbeatsPage,
    Launch,
    NodeCommand,
    NodeCommandReply,
    NodeCommands,
    NodesChanged,
    NodesChangedReply,
    RegisterNode,
    StepsReport,
)
from gpuyard.shared.endpoints import (
    APPLY,
    APPLY_STAGES,
    CLUSTER,
    DRAIN,
    HEARTBEAT,
    HEARTBEATS,
    NODE_COMMAND,
    NODE_COMMANDS,
    NODES,
    REGISTER,
    REREGISTER,
    Endpoint,
)
from gpuyard.shared.errors import BadRequest, RemoteError
from gpuyard.shared.identity import Caller
from gpuyard.shared.leader import LEASE_S, LeaseSeconds
from gpuyard.shared.model import ANY_GPU, Allocation, GpuRef, JobSpec, NodeSpec
from gpuyard.shared.policy import NodeView, PlacementInput, PlacementPolicy, placement_policies
from gpuyard.shared.service import Handler, Service
from gpuyard.shared.store import Replicas

Q = TypeVar("Q")
R = TypeVar("R")


class PlacementConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    policy: str = "consolidated"
    params: dict[str, Any] = {}
    heartbeat_timeout_s: float = 95.0
    """A node agent silent this long (its heartbeats come every second) is declared lost and its
    jobs requeued. It must exceed the agents' lease (`lease_s`, 60 s) plus their grace
    (`grace_s`, 30 s): an agent that heard nothing from placement for its lease stops its jobs
    (fencing), so by then no process of them runs; an outage shorter than the lease requeues
    nothing. A registering agent whose lease and grace do not fit is warned of. Nodes that never
    sent a heartbeat (simulated ones) are never declared lost."""
    heartbeat_check_s: float = 0.5
    """How often the heartbeat checker looks."""
    command_timeout_s: float | None = 3.0
    """Real node agents (those that heartbeat): placement sends them their commands without
    waiting (one slow or dead agent must not hold up the cluster) and watches for the answers in
    the background. An agent that has not answered within this (it answers at once: launches
    run in the background) gets no new jobs; one that still heartbeats is sent the command once
    more, then declared lost, its jobs requeued; a silent one is sent it again until it answers
    or the heartbeat check declares it lost (it may be cut off, its jobs still running until its
    lease ends). Other nodes' answers are awaited this long. None (`gpuyard sim`): wait for every
    answer, as for simulated nodes, which answer in virtual time."""
    durable: bool = False
    """Keep the cluster map in a JetStream key-value bucket: a restarted placement goes on."""
    replicas: Replicas = 1
    lease_s: LeaseSeconds = LEASE_S
    """Durable: the leader lease (`shared.leader`): a standby takes over this long after the
    active instance stopped renewing it."""
    simulated: bool = False
    """The nodes are the simclock's: the commands of an apply go to it in one request
    (`clock.cmds`) rather than one per node (a simulation's round trips are its cost)."""


class StoredPlacement(Struct, kw_only=True):
    """Placement's state in its bucket: small (bounded by the cluster), so one key."""

    nodes: list[NodeSpec] = []
    running: dict[str, list[GpuRef]] = {}
    specs: dict[str, JobSpec] = {}
    lost: list[str] = []
    lost_why: dict[str, str] = {}
    down: dict[str, float] = {}
    down_why: dict[str, str] = {}
    last_request: str = ""
    """`<route>:<sha256 of the request>` of the last apply or nodes change, and its reply (JSON):
    the same request again is a retry whose first attempt was stored but not answered."""
    last_reply: str = ""
    commands_sent: int = 0
    """The number of the last `clock.cmds` published (simulated nodes)."""
    applied: int = 0
    """The number of the last apply."""
    policy_state: str = ""
    """The placement policy's own state (its `snapshot()`, JSON), for one that keeps any."""
    draining: dict[str, str] = {}
    """Nodes an operator drains, with the reason (kept while they are down, until resumed)."""


STATE_KEY = "state"


def master_port(job_id: str) -> int:
    """A stable port per job for the distributed rendezvous (torchrun's MASTER_PORT)."""
    return 20000 + zlib.crc32(job_id.encode()) % 20000


class Placement(Service):
    name = "placement"
    policies = placement_policies

    def __init__(self, bus: Bus, config: PlacementConfig) -> None:
        super().__init__(bus)
        self.config = config
        self.policy: PlacementPolicy
        self.install_policy(config.policy, config.params)
        self.nodes: dict[str, NodeSpec] = {}
        self._totals: dict[str, int] | None = None  # GPUs per type, while nodes do not change
        self._capacity: dict[str, int] | None = None
        """`capacity()`, while nodes and the GPUs held on draining nodes do not change."""
        self.draining: dict[str, str] = {}  # node -> reason: no new jobs there (`place.drain`)
        self._drained: set[str] = set()  # draining nodes just emptied: `node.drained` to emit
        self._every_view: list[NodeView] | None = None  # `_all_views`, while nodes do not change
        self._free_views: dict[str, NodeView] | None = None
        """`_views`' node views, of the nodes with free GPUs, while nodes do not change: made
        again for the nodes whose free GPUs changed (`_free_changed`)."""
        self._free_changed: set[str] = set()
        self._node_order: dict[str, int] = {}  # each node's place in `nodes`
        self._listed: list[NodeView] = []  # `_free_views` in node order ...
        self._listed_at: list[int] = []  # ... and their places in it
        self._shown_last: set[str] = set()  # nodes the last `_views` showed with extra GPUs
        self._told: object | None = None
        """The policy the last `PlacementInput` went to (None: none, or it raised)."""
        self._every_told: list[NodeView] | None = None  # the `_every_view` it was shown
        self.running: dict[str, list[GpuRef]] = {}
        self.held_at: dict[str, int] = {}  # when each running job took its GPUs (`running`'s order)
        self._holds = 0
        self.applied = 0  # the number of the last apply (`ApplyReply.applied`)
        self.free: dict[str, set[int]] = {}  # free GPU indices per node
        self.holders: dict[GpuRef, int] = {}  # how many running jobs hold each busy GPU
        self.shared_milli: dict[str, dict[int, int]] = {}
        """Per node, the GPUs jobs hold shares of (`JobSpec.gpu_milli`): index -> thousandths
        held (never among `free`; not in `holders`)."""
        self.holding: dict[str, dict[int, int]] = {}  # node -> jobs by GPUs held there (0: a share)
        self.cpu_used: dict[str, int] = {}  # thousandths of CPUs the running jobs ask per node
        self.memory_used: dict[str, int] = {}
        self.shared = 0  # GPUs two jobs hold
        self.specs: dict[str, JobSpec] = {}  # of the jobs placed, for relaunching them
        self.down: dict[str, float] = {}  # nodes that left, and when (until they come back)
        self.down_why: dict[str, str] = {}  # why each of them left
        self.last_seen: dict[str, float] = {}  # node agents that heartbeat: when last heard of
        self.beats_every: dict[str, float] = {}  # how often each said it heartbeats
        self.beats: dict[str, Heartbeat] = {}
        self._checker: asyncio.Task[None] | None = None
        self.unresponsive: set[str] = (
            set()
        )  # nodes that did not answer a command, until they register
        self._lease_warned: set[str] = set()  # nodes warned of a lease longer than our timeout
        self._watchers: set[asyncio.Task[None]] = set()  # real agents' answers to commands
        self._last_command: dict[str, asyncio.Task[None]] = {}  # per node: its commands in order
        self.lost: dict[str, str] = {}
        """Jobs stopped by a node's departure, not yet told to the scheduler, with why (which
        node went, and why; "" for those an earlier placement stored without)."""
        self.unconfirmed: dict[str, set[str]] = {}
        """After a restart, per node agent: the jobs the stored map places there that we have sent
        it no command about since. Its next registration says which it was told to launch: one
        our previous instance stored just before it died may never have been sent."""
        self.changed = False  # the request in hand changed the state to store
        self.last_request = ""
        self.last_reply = ""
        self.commands_sent = 0  # `clock.cmds` published (simulated nodes)

    async def persist(self) -> None:
        if not self.changed or not self.store.durable:  # (build nothing that is not written)
            self.changed = False
            return
        state = StoredPlacement(
            nodes=list(self.nodes.values()), running=self.running, specs=self.specs,
            lost=list(self.lost), lost_why={j: why for j, why in self.lost.items() if why},
            down=self.down, down_why=self.down_why,
            last_request=self.last_request, last_reply=self.last_reply,
            commands_sent=self.commands_sent, applied=self.applied,
            policy_state=self._policy_state(), draining=self.draining,
        )  # fmt: skip
        await self.store.put_many({STATE_KEY: state})
        self.changed = False  # (left set when the write failed: the next request writes)

    def _policy_state(self) -> str:
        state = self.policy.snapshot()
        return "" if state is None else encode(state).decode()

    async def restore(self, values: dict[str, bytes]) -> None:
        """Take the map back; agents register again (stopping parts we do not know of)."""
        if STATE_KEY not in values:
            return
        state = msgspec.json.decode(values[STATE_KEY], type=StoredPlacement)
        self.specs, self.down = dict(state.specs), dict(state.down)
        self.lost = {job_id: state.lost_why.get(job_id, "") for job_id in state.lost}
        self.down_why = dict(state.down_why)
        self.draining = dict(state.draining)
        for job_id, gpus in state.running.items():
            self._hold(job_id, gpus)
        self.last_request, self.last_reply = state.last_request, state.last_reply
        self.commands_sent, self.applied = state.commands_sent, state.applied
        if state.policy_state and self.policy.State is not None:
            try:
                policy_state = msgspec.json.decode(state.policy_state, type=self.policy.State)
            except (msgspec.ValidationError, msgspec.DecodeError):  # another policy's: start afresh
                self.log.warning("state.policy_state_ignored", policy=self.policy_name)
            else:
                self.policy.restore(policy_state)
        now = time.time()
        for node in state.nodes:
            self._add_node(node)
            if node.labels.get("boot"):
                self.last_seen[node.node_id] = now  # silent from now on: lost after the timeout
        for job_id, gpus in state.running.items():
            for node_id in {g.node_id for g in gpus} & self.last_seen.keys():
                self.unconfirmed.setdefault(node_id, set()).add(job_id)
        self._drained.clear()  # (taken back, not newly emptied: announced before)
        for node_id in self.nodes:
            await self.bus.publish(REREGISTER, Empty(), node=node_id)
        self.log.info("state.cluster_restored", nodes=len(self.nodes), running=len(self.running))

    async def hand_over(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            self._checker = None
        for task in list(self._watchers):
            task.cancel()

    def routes(self) -> dict[Endpoint[Any, Any], Handler]:
        return {
            REGISTER: self.register, NODES: self.nodes_request, APPLY: self.apply_request,
            APPLY_STAGES: self.stages_request,
            CLUSTER: self.cluster, HEARTBEATS: self.heartbeats, DRAIN: self.drain,
        }  # fmt: skip

    async def apply_request(self, req: ApplyRequest) -> ApplyReply:
        return await self._once("apply", req, self.apply, ApplyReply)

    async def stages_request(self, req: ApplyStages) -> ApplyStagesReply:
        return await self._once("stages", req, self.apply_stages, ApplyStagesReply)

    async def apply_stages(self, req: ApplyStages) -> ApplyStagesReply:
        """Each stage applied in turn, as that many applies (`ApplyStages`): a first base that
        is not the last apply is refused (`apply`'s check) before anything is applied."""
        if not req.stages or not req.stages[0].base:
            raise BadRequest("stages need a first stage with a base", field="$.stages")
        return ApplyStagesReply(replies=[await self.apply(stage) for stage in req.stages])

    async def nodes_request(self, req: NodesChanged, caller: Caller) -> NodesChangedReply:
        if caller.role == "node" and (req.up or req.gone != [caller.name]):
            raise BadRequest(f"node {caller.name!r} may only report itself gone", field="$.gone")
        return await self._once("nodes", req, self.nodes_changed, NodesChangedReply)

    async def _once(
        self, route: str, req: Q, handler: Callable[[Q], Awaitable[R]], reply_type: type[R]
    ) -> R:
        """Durable: the last request again (a caller's retry after we stored its effect but died
        before the reply) gets the same reply, without applying it a second time."""
        if not self.durable:
            return await handler(req)
        key = f"{route}:{hashlib.sha256(encode(req)).hexdigest()}"
        if key == self.last_request and self.last_reply:
            self.log.info("request.repeated", route=route)
            return msgspec.json.decode(self.last_reply, type=reply_type)
        reply = await handler(req)
        self.last_request, self.last_reply = key, encode(reply).decode()
        return reply

    def _add_node(self, node: NodeSpec) -> None:
        """A node joins, or registers again (after an agent restart: what runs there stays)."""
        arrived = node.node_id not in self.nodes
        self.nodes[node.node_id] = node
        self._totals = self._capacity = None
        self._nodes_changed()
        self.down.pop(node.node_id, None)
        self.down_why.pop(node.node_id, None)
        busy = {g.index for g in self.holders if g.node_id == node.node_id}
        busy |= self.shared_milli.get(node.node_id, {}).keys()
        self.free[node.node_id] = set(range(node.num_gpus)) - busy
        if arrived and node.node_id in self.draining and not busy:
            self._drained.add(node.node_id)  # back from a loss with its jobs gone: DRAINED

    def capacity(self) -> dict[str, int]:
        """GPUs per type that jobs may run on (every apply's reply carries it): a draining node's
        only as many as its jobs still hold, so the scheduler plans no new job there yet counts
        those running. Summed over the nodes again only when nodes change; the draining ones
        (few) again when the GPUs held there change."""
        if self._capacity is None:
            if self._totals is None:
                totals: dict[str, int] = {}
                for node in self.nodes.values():
                    totals[node.gpu_type] = totals.get(node.gpu_type, 0) + node.num_gpus
                self._totals = totals
            capacity = dict(self._totals)
            for node_id in self.draining.keys() & self.nodes.keys():
                capacity[self.nodes[node_id].gpu_type] -= len(self.free[node_id])
            self._capacity = capacity
        return dict(self._capacity)

    async def cluster(self, _: Empty) -> ClusterInfo:
        return ClusterInfo(
            nodes=list(self.nodes.values()), capacity=self.capacity(), busy=dict(self.running),
            down=dict(self.down), down_why=dict(self.down_why),
            rearranges=self.policy.rearranges, draining=dict(self.draining),
        )  # fmt: skip

    async def drain(self, req: DrainRequest, caller: Caller) -> DoneReply:
        """Operators: these nodes take no new jobs, those running there go on (`node.draining`,
        and `node.drained` once none is left); or, with `resume`, take jobs again. A node that is
        down may be drained too: it stays draining when it comes back."""
        if caller.role != "op":
            raise BadRequest(f"only operators drain or resume nodes, not {caller}")
        if not req.resume and not req.reason.strip():
            raise BadRequest("a drain needs a reason", field="$.reason")
        now = time.time() if req.now is None else req.now
        done: list[str] = []
        refused: dict[str, str] = {}
        for node_id in dict.fromkeys(req.node_ids):
            if req.resume and node_id not in self.draining:
                refused[node_id] = "not draining"
                continue
            if not req.resume and node_id not in self.nodes and node_id not in self.down:
                refused[node_id] = "no such node"
                continue
            done.append(node_id)
            self.changed = True
            if req.resume:
                del self.draining[node_id]
            else:
                if node_id not in self.draining:  # (again: only its reason changes)
                    self._drained.add(node_id)  # DRAINED at once if nothing runs there
                self.draining[node_id] = req.reason
            self._drain_changed(node_id)
            self.log.info("node.drain", node_id=node_id, resume=req.resume, reason=req.reason,
                          by=str(caller))  # fmt: skip
            # The scheduler hears these (`evt.node.>`) and decides again on the new capacity.
            await self.bus.emit(
                Event(type="node.resumed" if req.resume else "node.draining", now=now,
                      node_id=node_id, reason=req.reason, service=self.name)
            )  # fmt: skip
        await self._announce_drained(now)
        return DoneReply(done=done, refused=refused)

    def _drain_changed(self, node_id: str) -> None:
        """A node started or stopped draining, or the GPUs held on a draining node changed: what
        it offers (views) and counts for (capacity) changed."""
        self._capacity = self._every_view = None
        self._free_changed.add(node_id)

    async def _announce_drained(self, now: float) -> None:
        """`node.drained` for the draining nodes the last job just left (of those noted since the
        last request, the ones that are still here, draining and empty)."""
        if not self._drained:
            return
        drained, self._drained = sorted(self._drained), set()
        for node_id in drained:
            node, free = self.nodes.get(node_id), self.free.get(node_id)
            if node_id in self.draining and node is not None and len(free or ()) == node.num_gpus:
                await self.bus.emit(
                    Event(type="node.drained", now=now, node_id=node_id,
                          reason=self.draining[node_id], service=self.name)
                )  # fmt: skip

    async def register(self, req: RegisterNode, caller: Caller) -> ClusterInfo:
        if caller.role == "node" and req.node.node_id != caller.name:
            raise BadRequest(
                f"node {caller.name!r} may only register itself, not {req.node.node_id!r}",
                field="$.node.node_id",
            )
        self.changed = True
        self.unresponsive.discard(req.node.node_id)
        self._nodes_changed()
        self._check_lease(req)
        if req.heartbeat_s is not None:
            self.beats_every[req.node.node_id] = req.heartbeat_s
        old = self.nodes.get(req.node.node_id)
        # A node agent's own registration: it must heartbeat, or it is declared lost.
        boot = req.node.labels.get("boot") or ("agent" if caller.role == "node" else None)
        if old is not None and boot and old.labels.get("boot") != boot:
            # The agent restarted: the job parts it ran died with it.
            await self.nodes_changed(
                NodesChanged(
                    now=req.now, gone=[old.node_id], up=[req.node], reason="agent restarted"
                )
            )
            self.last_seen[req.node.node_id] = time.time()
            return await self.cluster(Empty())
        if boot:
            self.last_seen[req.node.node_id] = time.time()
        placed, told = self.unconfirmed.pop(req.node.node_id, set()), req.jobs
        missing = sorted(
            j for j in placed if j in self.running and told is not None and j not in told
        )
        if missing:
            # Stored as launched there by our previous instance, which died before sending it.
            self.log.warning("jobs.not_on_node", node_id=req.node.node_id, jobs=missing)
            why = f"not on node {req.node.node_id}: its launch was stored, never sent"
            await self._lose(req.now, dict.fromkeys(missing, why))
        self._add_node(req.node)
        await self.bus.emit(
            Event(type="node.up", now=req.now, node_id=req.node.node_id, service=self.name)
        )
        await self._announce_drained(req.now)
        return await self.cluster(Empty())

    def _check_lease(self, req: RegisterNode) -> None:
        """Warn (once per node) of an agent that may still run its jobs when declared lost."""
        if req.lease_s is None or req.node.node_id in self._lease_warned:
            return
        fenced_after_s = req.lease_s + (req.grace_s or 0.0)
        if fenced_after_s >= self.config.heartbeat_timeout_s:
            self._lease_warned.add(req.node.node_id)
            self.log.warning(
                "node.lease_too_long", node_id=req.node.node_id, lease_s=req.lease_s,
                grace_s=req.grace_s, heartbeat_timeout_s=self.config.heartbeat_timeout_s,
                why="declared lost before it stops its jobs: they may run twice",
            )  # fmt: skip

    async def nodes_changed(self, req: NodesChanged) -> NodesChangedReply:
        self.changed = True
        unknown = [n for n in req.gone if n not in self.nodes]
        if unknown and self.config.command_timeout_s is not None:  # (declared lost twice)
            req = msgspec.structs.replace(req, gone=[n for n in req.gone if n in self.nodes])
        elif unknown:
            raise BadRequest(f"unknown nodes {unknown[:5]}", field="$.gone")
        gone = set(req.gone)
        for node_id in req.gone:
            self.unresponsive.discard(node_id)
            self.unconfirmed.pop(node_id, None)
            del self.nodes[node_id]
            self._totals = self._capacity = None
            self._nodes_changed()
            del self.free[node_id]
            self.down[node_id] = req.now
            if req.reason:
                self.down_why[node_id] = req.reason
        why: dict[str, str] = {}  # job -> the first of its nodes that went, and why
        for job_id, gpus in self.running.items():
            if (went := next((g.node_id for g in gpus if g.node_id in gone), None)) is not None:
                why[job_id] = f"node {went} gone" + (f": {req.reason}" if req.reason else "")
        why = dict(sorted(why.items()))
        await self._lose(req.now, why)
        for node in req.up:
            self._add_node(node)
        for node_id in req.gone:
            await self.bus.emit(
                Event(type="node.lost", now=req.now, node_id=node_id, reason=req.reason,
                      service=self.name)
            )  # fmt: skip
        for node in req.up:
            await self.bus.emit(
                Event(type="node.up", now=req.now, node_id=node.node_id, service=self.name)
            )
        await self._announce_drained(req.now)
        return NodesChangedReply(
            lost_jobs=list(why), capacity=self.capacity(), commands=self.commands_sent
        )

    async def _lose(self, now: float, why: dict[str, str]) -> None:
        """These jobs no longer run where we placed them (their node left, or never got them; in
        `why`'s order, with why): free their GPUs and stop their other parts (they cannot go on
        without their peers); the scheduler hears of them in the next apply's `lost` and
        requeues them."""
        stopped = {j: self.running[j] for j in why}
        for job_id in why:
            self._free(job_id)
        await self._command(now, stopped, {}, {})  # (their progress: reported at relaunch)
        self.lost |= why

    # ------------------------------------------------------------------ real node agents

    async def start(self) -> None:
        await super().start()
        await self.serve(HEARTBEAT, self._heartbeat)
        self._checker = asyncio.create_task(self._check_heartbeats())

    async def stop(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
        for task in list(self._watchers):
            task.cancel()
        await super().stop()

    async def heartbeats(self, _: Empty) -> HeartbeatsPage:
        return HeartbeatsPage(
            beats=list(self.beats.values()), received=dict(self.last_seen),
            every=dict(self.beats_every),
        )  # fmt: skip

    async def _heartbeat(self, hb: Heartbeat, caller: Caller) -> Ack:
        """`node.<id>.hb`, on its own subscription: only records (no await before the record).
        The answer renews the agent's lease."""
        if hb.node_id != caller.name:
            self.log.warning("heartbeat.forged", subject_node=caller.name, node_id=hb.node_id)
            return Ack(ok=False)
        if hb.node_id not in self.nodes:
            # Declared lost, or this placement started after the agent: have it register again.
            await self.bus.publish(REREGISTER, Empty(), node=hb.node_id)
            return Ack()
        self.last_seen[hb.node_id] = time.time()
        self.beats[hb.node_id] = hb
        return Ack()

    async def _check_heartbeats(self) -> None:
        """Declare silent node agents lost, through our own subject (it queues behind applies)."""
        timeout = self.config.heartbeat_timeout_s
        while True:
            await asyncio.sleep(self.config.heartbeat_check_s)
            now = time.time()
            silent = sorted(
                n for n, seen in self.last_seen.items() if now - seen > timeout and n in self.nodes
            )
            if not silent:
                continue
            for node_id in silent:
                del self.last_seen[node_id]
            self.log.warning("node.silent", nodes=silent, timeout_s=timeout)
            lost = NodesChanged(now=now, gone=silent, reason=f"no heartbeat for {timeout:g} s")
            await self.bus.nc.publish(self.bus.subject(NODES), encode(lost))

    def _stop_released(self, released: list[str]) -> dict[str, list[GpuRef]]:
        """Jobs that ended on several real nodes: their other parts may still run (one part failed)."""
        ended: dict[str, list[GpuRef]] = {}
        for job_id in released:
            gpus = self.running.get(job_id)
            if (
                gpus
                and len({g.node_id for g in gpus}) > 1
                and any(g.node_id in self.last_seen for g in gpus)
            ):
                ended[job_id] = gpus
        return ended

    def _nodes_changed(self) -> None:
        """Nodes came, went, or stopped or started answering: their views are made again."""
        self._every_view = self._free_views = None

    def _views(
        self, extra: dict[str, list[int]] | None = None
    ) -> tuple[list[NodeView], set[str] | None]:
        """Nodes with GPUs this decision may give out, in node order: the free ones plus `extra`;
        and the nodes whose views differ from the last call's (None: every node's was made
        again). Costs the nodes whose free GPUs changed since the last call, and `extra`."""
        views, order = self._free_views, self._node_order
        rebuilt = views is None
        if views is None:  # (nodes changed: every node's view again)
            views = self._free_views = {}
            order = self._node_order = {node_id: i for i, node_id in enumerate(self.nodes)}
            self._free_changed = set(self.nodes)
            self._listed, self._listed_at = [], []
        changed, self._free_changed = self._free_changed, set()
        listed, listed_at = self._listed, self._listed_at
        for node_id in changed:
            usable = self.free.get(node_id)
            at = order.get(node_id)
            if at is None:  # (gone: never listed since the views were made)
                continue
            i = bisect.bisect_left(listed_at, at)
            there = i < len(listed_at) and listed_at[i] == at
            if (
                (usable or self.shared_milli.get(node_id))
                and node_id not in self.unresponsive and node_id not in self.draining
            ):  # fmt: skip
                view = views[node_id] = self._view(node_id, usable or set())
                if there:
                    listed[i] = view
                else:
                    listed.insert(i, view)
                    listed_at.insert(i, at)
            elif there:
                del views[node_id], listed[i], listed_at[i]
        found, found_at = list(listed), listed_at
        shown: set[str] = set()  # the nodes shown with `extra` GPUs
        for node_id, more in (extra or {}).items():
            if (
                not more or node_id not in self.nodes
                or node_id in self.unresponsive or node_id in self.draining
            ):  # fmt: skip
                continue
            if not shown:
                found_at = list(listed_at)
            shown.add(node_id)
            at = order[node_id]
            i = bisect.bisect_left(found_at, at)
            view = self._view(node_id, self.free[node_id] | set(more))
            if i < len(found_at) and found_at[i] == at:
                found[i] = view
            else:
                found.insert(i, view)
                found_at.insert(i, at)
        differ = None if rebuilt else changed | shown | self._shown_last
        self._shown_last = shown
        return found, differ

    def _view(self, node_id: str, usable: set[int]) -> NodeView:
        """The node as the policy sees it: `usable` GPUs, the shares left on those jobs share,
        and its CPUs and memory left where it counts them."""
        node = self.nodes[node_id]
        shared = self.shared_milli.get(node_id)
        return NodeView(
            node_id=node_id, gpu_type=node.gpu_type, usable=sorted(usable),
            shares={i: 1000 - held for i, held in shared.items()} if shared else {},
            cpu_milli=node.cpu_milli - self.cpu_used.get(node_id, 0) if node.cpu_milli else None,
            memory_mib=(
                node.memory_mib - self.memory_used.get(node_id, 0) if node.memory_mib else None
            ),
            num_gpus=node.num_gpus, holding=dict(self.holding.get(node_id, {})),
        )  # fmt: skip

    def _all_views(self) -> list[NodeView]:
        """Every responsive node with all its GPUs, a draining one with only those its jobs hold
        (they may stay, no other comes): a rearranging policy's view at every apply, made again
        only when nodes, or the GPUs held on draining nodes, change."""
        if self._every_view is None:
            views: list[NodeView] = []
            for n in self.nodes.values():
                if n.node_id in self.unresponsive:
                    continue
                usable = list(range(n.num_gpus))
                if n.node_id in self.draining:
                    usable = [i for i in usable if i not in self.free[n.node_id]]
                if usable:
                    views.append(NodeView(
                        node_id=n.node_id, gpu_type=n.gpu_type, usable=usable,
                        cpu_milli=n.cpu_milli or None, memory_mib=n.memory_mib or None,
                        num_gpus=n.num_gpus,
                    ))  # fmt: skip
            self._every_view = views
        return list(self._every_view)

    async def apply(self, req: ApplyRequest) -> ApplyReply:
        if req.base and req.base != self.applied:
            raise BadRequest(
                f"apply #{req.base} is not the last one applied here (#{self.applied}): send "
                "every allocation", field="$.base",
            )  # fmt: skip
        if req.base and (
            self.policy.rearranges or self.shared or any(a.share_with for a in req.allocations)
        ):
            raise BadRequest(
                "a policy that rearranges, and jobs that share GPUs, need every allocation",
                field="$.base",
            )
        self.changed = True
        self.applied += 1
        reported = self._reported_progress()  # (before the jobs it stops leave `running`)
        ended = self._stop_released(req.released)
        for job_id in req.released:
            self._free(job_id)
            self.specs.pop(job_id, None)
        running = self.running
        if self.lost:
            # The scheduler decided before it learnt of these: they wait for the next round.
            waiting = set(self.lost)
            allocations = [
                a
                for a in req.allocations
                if a.job_id not in waiting or a.job_id in running or a.job_id in req.specs
            ]
            req = msgspec.structs.replace(req, allocations=allocations)
        # Jobs that share GPUs go where their partner goes; the policy places the others.
        own: list[Allocation] = []
        sharing: list[Allocation] = []
        for a in req.allocations:
            if a.job_id not in running and a.job_id not in req.specs:
                raise BadRequest(
                    f"job {a.job_id!r} is not running and has no spec", field="$.specs"
                )
            (own if a.share_with is None else sharing).append(a)
        if self.policy.rearranges:
            keep: dict[str, list[GpuRef]] = {}
            to_place = own
            nodes = self._all_views()
            differ: set[str] | None = set() if self._every_told is self._every_view else None
            self._every_told = self._every_view
        else:
            keep, to_place, held = self._split(own)
            for a in sharing:  # a job that goes on sharing its kept partner's GPUs
                gpus = running.get(a.job_id)
                if a.share_with in keep and gpus is not None and gpus == keep[a.share_with]:
                    keep[a.job_id] = gpus
            movable: dict[str, list[int]] = {}
            for job_id in self._affected(req) - keep.keys():  # (a stopped job's partner may stay)
                if self._share_of(job_id) is not None:
                    continue  # (its share of a GPU is free for the next apply)
                for g in running[job_id]:
                    if g not in held:
                        movable.setdefault(g.node_id, []).append(g.index)
            nodes, differ = self._views(movable)
        self.specs.update(req.specs)  # a running job that is resized is launched again
        specs = {a.job_id: spec for a in to_place if (spec := self.specs.get(a.job_id))}
        deadlines = {j: d for j, spec in specs.items() if (d := spec.deadline) is not None}
        inp = PlacementInput(
            now=req.now,
            allocations=to_place,
            current={a.job_id: running[a.job_id] for a in to_place if a.job_id in running},
            nodes=nodes,
            specs=specs,
            deadlines=deadlines,
            ended=list(req.released),
            changed_nodes=(
                sorted(differ, key=lambda n: self._node_order.get(n, -1)) if differ is not None
                and self._told is self.policy else None
            ),
        )  # fmt: skip
        started_at = time.perf_counter()
        self._told = None  # (until it answered: one that raised starts afresh)
        moved = self.policy.place(inp)
        self._told = self.policy
        self.policy_s += time.perf_counter() - started_at
        started = {j: gpus for j, gpus in moved.items() if running.get(j) != gpus}
        placed = {**moved, **keep}
        for a in sharing:
            if a.share_with in placed:
                gpus = placed[a.job_id] = placed[a.share_with]
                if running.get(a.job_id) != gpus:
                    started[a.job_id] = gpus
        affected: Iterable[str] = (
            running if not req.base else sorted(self._affected(req), key=self.held_at.__getitem__)
        )
        stopped = {j: running[j] for j in affected if j not in placed or j in started}
        for job_id in stopped:
            self._free(job_id)
        if started:
            for job_id in self._check([*to_place, *sharing], started):
                del started[job_id]  # (no room for its CPUs or memory: it stays unplaced)
        shares = {a.job_id: a.share_with for a in sharing if a.share_with is not None}  # (all)
        failed, progress = await self._command(
            req.now, {**ended, **stopped}, started, self.specs, req.attempts, shares, req.time_left,
            req.batches,
        )  # fmt: skip
        launched = {j: g for j, g in started.items() if j not in failed}
        for job_id, gpus in launched.items():
            self._hold(job_id, gpus)
        lost, self.lost = self.lost, {}
        # Jobs the scheduler thinks are not running but run here as allocated: it asked before
        # (a retried apply, or it restarted before storing our reply). Report them started.
        for job_id in req.specs:
            if job_id in placed and job_id not in launched and job_id in self.running:
                launched[job_id] = self.running[job_id]
        unplaced = [a.job_id for a in req.allocations if a.job_id not in self.running]
        placed_all = not (failed or unplaced or lost or sharing)
        await self._announce_drained(req.now)
        return ApplyReply(
            placed=launched,
            started={j: self.nodes[g[0].node_id].gpu_type for j, g in launched.items()},
            stopped=sorted(stopped),
            unplaced=unplaced,
            lost=list(lost),
            lost_why={j: why for j, why in lost.items() if why},
            capacity=self.capacity(),
            progress={**reported, **self._with_rates(progress, reported)},
            settled=self.policy.rearranges and self.policy.settled and placed_all,
            commands=self.commands_sent,
            applied=self.applied,
            assures_fit=(
                self.config.simulated and self.policy.places_what_fits and not self.policy.rearranges
                and not self.policy.chooses_types and not self.draining and not self.lost
                and not self.unresponsive and not self.shared
                and not any(self.shared_milli.values())
            ),
        )  # fmt: skip

    def _affected(self, req: ApplyRequest) -> set[str]:
        """The running jobs an apply may stop or move: every one, or, where it tells only what
        changed (`base`), those it names (the others keep their GPUs)."""
        if not req.base:
            return set(self.running)
        named = (*req.stop, *(a.job_id for a in req.allocations))
        return {j for j in named if j in self.running}

    def _reported_progress(self) -> dict[str, StepsReport]:
        """What the node agents' last heartbeats said of the running jobs (rank 0's steps, and
        the rate its run showed), from the nodes they run on: a job that moved may still be
        reported by its old node while its old part stops, at the old GPU type's rate."""
        progress: dict[str, StepsReport] = {}
        for beat in self.beats.values():
            for p in beat.jobs:
                gpus = self.running.get(p.job_id, ())
                here = any(g.node_id == beat.node_id for g in gpus)
                if p.rank == 0 and here and p.iterations:
                    progress[p.job_id] = StepsReport(
                        float(p.iterations), beat.now, p.rate, profile=p.goodput
                    )
        return progress

    @staticmethod
    def _with_rates(
        final: dict[str, StepsReport], reported: dict[str, StepsReport]
    ) -> dict[str, StepsReport]:
        """The steps stopped jobs had done, with the rate their run showed in the heartbeats."""
        return {
            job_id: StepsReport(r.steps, r.at, seen.rate, profile=seen.profile)
            if (seen := reported.get(job_id))
            else r
            for job_id, r in final.items()
        }

    def _split(
        self, allocations: list[Allocation]
    ) -> tuple[dict[str, list[GpuRef]], list[Allocation], set[GpuRef]]:
        """Running jobs whose allocation did not change (they stay put), the rest to place, and
        the GPUs the first keep.

        Of two jobs that shared GPUs and now run apart, the first in the allocation's order
        keeps them."""
        keep: dict[str, list[GpuRef]] = {}
        to_place: list[Allocation] = []
        claimed: set[GpuRef] = set()
        for a in allocations:
            gpus = self.running.get(a.job_id)
            if (
                gpus is not None
                and len(gpus) == a.num_gpus
                and (a.gpu_type == ANY_GPU or a.gpu_type == self.nodes[gpus[0].node_id].gpu_type)
                and claimed.isdisjoint(gpus)
            ):
                keep[a.job_id] = gpus
                claimed.update(gpus)
            else:
                to_place.append(a)
        return keep, to_place, claimed

    def _share_of(self, job_id: str) -> int | None:
        """The thousandths of a GPU the job asks for, if it asks for a share of one."""
        spec = self.specs.get(job_id)
        return spec.gpu_milli if spec is not None else None

    def _charge(self, job_id: str, gpus: list[GpuRef], sign: int) -> None:
        """Count the job in (1) or out (-1) of its nodes' `holding`, and its CPUs and memory
        there, as its GPUs spread."""
        spec = self.specs.get(job_id)
        share = spec is not None and spec.gpu_milli is not None
        per_node: dict[str, int] = {}
        for g in gpus:
            per_node[g.node_id] = per_node.get(g.node_id, 0) + 1
        for node_id, count in per_node.items():
            kind = 0 if share else count
            held = self.holding.setdefault(node_id, {})
            held[kind] = left = held.get(kind, 0) + sign
            if left <= 0:
                del held[kind]
                if not held:
                    del self.holding[node_id]
            self._free_changed.add(node_id)
        if spec is None or not (spec.cpu_milli or spec.memory_mib):
            return
        for node_id, (cpu, memory) in self._asked(spec, gpus).items():
            self.cpu_used[node_id] = self.cpu_used.get(node_id, 0) + sign * cpu
            self.memory_used[node_id] = self.memory_used.get(node_id, 0) + sign * memory
            self._free_changed.add(node_id)

    def _hold(self, job_id: str, gpus: list[GpuRef]) -> None:
        """`job_id` runs on `gpus` (which a job sharing them may hold too)."""
        self.running[job_id] = gpus
        self.held_at[job_id] = self._holds = self._holds + 1
        self._charge(job_id, gpus, 1)
        if (share := self._share_of(job_id)) is not None:
            for g in gpus:
                shared = self.shared_milli.setdefault(g.node_id, {})
                shared[g.index] = shared.get(g.index, 0) + share
                self._free_changed.add(g.node_id)
                if g.node_id in self.free:
                    self.free[g.node_id].discard(g.index)
                    if g.node_id in self.draining:
                        self._drain_changed(g.node_id)
            return
        for g in gpus:
            held = self.holders[g] = self.holders.get(g, 0) + 1
            self.shared += held == 2
            if g.node_id in self.free:
                self.free[g.node_id].discard(g.index)
                self._free_changed.add(g.node_id)
                if g.node_id in self.draining:
                    self._drain_changed(g.node_id)

    def _free(self, job_id: str) -> None:
        """`job_id` no longer runs: its GPUs are free unless a job sharing them still holds them."""
        self.held_at.pop(job_id, None)
        gpus = self.running.pop(job_id, [])
        self._charge(job_id, gpus, -1)
        share = self._share_of(job_id)
        for g in gpus:
            if share is not None:
                shared = self.shared_milli.get(g.node_id, {})
                shared[g.index] = left = shared.get(g.index, 0) - share
                self._free_changed.add(g.node_id)
                if left > 0:
                    continue
                del shared[g.index]
                if not shared:
                    self.shared_milli.pop(g.node_id, None)
            else:
                left = self.holders.get(g, 0) - 1
            self.shared -= left == 1
            if left > 0:
                self.holders[g] = left
                continue
            self.holders.pop(g, None)
            if g.node_id in self.free:
                free = self.free[g.node_id]
                free.add(g.index)
                self._free_changed.add(g.node_id)
                if g.node_id in self.draining:
                    self._drain_changed(g.node_id)
                    if len(free) == self.nodes[g.node_id].num_gpus:  # the last job left
                        self._drained.add(g.node_id)

    def _check(self, allocations: list[Allocation], started: dict[str, list[GpuRef]]) -> list[str]:
        """Newly placed jobs must get free, existing GPUs, once each, of the allocated count and a
        type they allow (a job sharing GPUs: exactly its partner's; one asking for a share of a
        GPU: one GPU with that much left; a policy that `chooses_types`: any type the job's spec
        allows). `allocations`: those of the jobs that did not keep
        their GPUs. Returns the jobs placed where their CPUs or memory do not fit (a policy that
        does not count them): they stay unplaced.

        Jobs that keep their GPUs need no check: they hold exactly the GPUs missing from `free`.
        """
        wanted = {a.job_id: a for a in allocations}
        # A job may join the GPUs of a job that will share them with it and stays where it is.
        joined: dict[str, set[GpuRef]] = {}
        for alloc in allocations:
            if alloc.share_with is not None and alloc.job_id in self.running:
                joined.setdefault(alloc.share_with, set()).update(self.running[alloc.job_id])
        chooses = self.policy.chooses_types
        used: set[GpuRef] = set()
        shares: dict[GpuRef, int] = {}  # thousandths of GPUs the jobs checked so far take
        cpu, memory = dict(self.cpu_used), dict(self.memory_used)
        over: list[str] = []
        for job_id, gpus in started.items():
            a = wanted.get(job_id)
            if a is not None and a.share_with is not None:
                if gpus != started.get(a.share_with, self.running.get(a.share_with)):
                    raise RuntimeError(f"{job_id!r} does not share {a.share_with!r}'s GPUs: {gpus}")
                continue
            spec = self.specs.get(job_id)
            share = spec.gpu_milli if spec is not None else None
            ok = (
                a is not None
                and len(gpus) == a.num_gpus
                and used.isdisjoint(gpus)
                and len(set(gpus)) == len(gpus)
            )
            gpu_type = None  # the one type of its GPUs: each on a known node, and free
            extra = joined.get(job_id, ())
            for g in gpus if ok else ():
                node = self.nodes.get(g.node_id)
                if node is None or not 0 <= g.index < node.num_gpus:
                    ok = False
                    break
                if share is None:  # a whole GPU: free (or its partner's), no share taken of it
                    fits = (g.index in self.free[g.node_id] or g in extra) and g not in shares
                else:  # its one GPU: free, or shared with that much left
                    fits = (
                        len(gpus) == 1
                        and (g.index in self.free[g.node_id]
                             or g.index in self.shared_milli.get(g.node_id, {}))
                        and self._share_left(g) >= shares.get(g, 0) + share
                    )  # fmt: skip
                if not fits or gpu_type not in (None, node.gpu_type):
                    ok = False
                    break
                gpu_type = node.gpu_type
            if not (
                ok and a is not None and gpu_type is not None
                and (a.gpu_type in (ANY_GPU, gpu_type) or (chooses and spec is not None))
                and (spec is None or spec.allows(gpu_type))
            ):  # fmt: skip
                raise RuntimeError(
                    f"placement policy {self.policy_name!r} placed {job_id!r} wrongly: {gpus}"
                )
            if spec is not None and (spec.cpu_milli or spec.memory_mib):
                asked = self._asked(spec, gpus)
                if any(
                    (total := getattr(self.nodes[n], field)) and taken.get(n, 0) + k > total
                    for n, per in asked.items()
                    for field, taken, k in (("cpu_milli", cpu, per[0]), ("memory_mib", memory, per[1]))
                ):  # fmt: skip
                    over.append(job_id)
                    continue
                for n, (c, m) in asked.items():
                    cpu[n], memory[n] = cpu.get(n, 0) + c, memory.get(n, 0) + m
            if share is not None:
                shares[gpus[0]] = shares.get(gpus[0], 0) + share
            else:
                used.update(gpus)
        if over:
            self.log.warning(
                "placement.no_room", jobs=over[:5], count=len(over), policy=self.policy_name,
                why="placed where their CPUs or memory do not fit: they stay unplaced",
            )  # fmt: skip
        return over

    def _share_left(self, g: GpuRef) -> int:
        """Thousandths left on a GPU for a job asking for a share (a free GPU: all of it)."""
        return 1000 - self.shared_milli.get(g.node_id, {}).get(g.index, 0)

    @staticmethod
    def _asked(spec: JobSpec, gpus: list[GpuRef]) -> dict[str, tuple[int, int]]:
        """The job's CPUs and memory per node, spread as its GPUs are (rounded up)."""
        per_node: dict[str, int] = {}
        for g in gpus:
            per_node[g.node_id] = per_node.get(g.node_id, 0) + 1
        n = len(gpus)
        return {
            node: (-(-spec.cpu_milli * k // n), -(-spec.memory_mib * k // n))
            for node, k in per_node.items()
        }

    async def _command(
        self,
        now: float,
        stop: dict[str, list[GpuRef]],
        start: dict[str, list[GpuRef]],
        specs: dict[str, JobSpec],
        attempts: dict[str, int] | None = None,
        shares: dict[str, str] | None = None,
        time_left: dict[str, float] | None = None,
        batches: dict[str, BatchChoice] | None = None,
    ) -> tuple[set[str], dict[str, StepsReport]]:
        """Send each affected node one command (preempts, then launches; `shares`: the job each
        started one shares its GPUs with; `time_left`: how long each may run; `batches`: the
        batch each adaptive one trains with). Returns the jobs whose launch failed, and the
        progress the nodes reported of the jobs they stopped."""
        commands: dict[str, NodeCommand] = {}

        def command(node_id: str) -> NodeCommand:
            if node_id not in commands:
                commands[node_id] = NodeCommand(now=now, node_id=node_id)
            return commands[node_id]

        for job_id, gpus in stop.items():
            for node_id in dict.fromkeys(g.node_id for g in gpus):
                if node_id in self.nodes:
                    command(node_id).preempt.append(job_id)
        for job_id, gpus in start.items():
            by_node: dict[str, list[int]] = {}
            for g in gpus:
                by_node.setdefault(g.node_id, []).append(g.index)
            master = self.nodes[gpus[0].node_id]
            spec = None if self.config.simulated else specs[job_id]  # (the simclock has them)
            offset = 0
            for rank, (node_id, indices) in enumerate(by_node.items()):
                command(node_id).launch.append(
                    Launch(
                        job_id=job_id, spec=spec, gpus=indices, world_size=len(gpus),
                        rank_offset=offset, node_rank=rank, num_nodes=len(by_node),
                        master_addr=master.address or master.node_id, master_port=master_port(job_id),
                        attempt=(attempts or {}).get(job_id, 0),
                        share_with=(shares or {}).get(job_id),
                        time_limit_s=(time_left or {}).get(job_id),
                        batch=(batches or {}).get(job_id),
                    )
                )  # fmt: skip
                offset += len(indices)
        for node_id, cmd in commands.items():  # (after a restart: told, from now on)
            if unconfirmed := self.unconfirmed.get(node_id):
                unconfirmed.difference_update([*cmd.preempt, *(x.job_id for x in cmd.launch)])
        failed, progress, done = await self._send(commands)
        # A job whose launch failed on one node must not go on with its parts elsewhere.
        stragglers: dict[str, NodeCommand] = {}
        for node_id in sorted(done):
            again = [x.job_id for x in commands[node_id].launch if x.job_id in failed]
            if again:
                stragglers[node_id] = NodeCommand(now=now, node_id=node_id, preempt=again)
        if stragglers:
            await self._send(stragglers)
        return failed, progress

    async def _send(
        self, commands: dict[str, NodeCommand]
    ) -> tuple[set[str], dict[str, StepsReport], set[str]]:
        """Send the commands at once: returns the jobs whose launch failed, the progress reported
        of stopped jobs, and the nodes that answered. Simulated nodes' commands are published in
        one message, which the clock handles before it goes on (it tells the scheduler the
        stopped jobs' progress itself). Real agents' answers are not awaited (see
        `command_timeout_s`): `_watch` declares a silent one lost."""
        order = sorted(commands)
        watched = self.config.command_timeout_s is not None
        # A real agent's commands queue behind its unanswered one (it may be cut off for a while:
        # a stop must still reach it when it is back within its lease).
        real = [n for n in order if watched and n in self.last_seen]
        for node_id in order:
            if node_id in self.unresponsive and node_id not in real:
                self.log.warning("node.command_skipped", node_id=node_id, reason="unresponsive")
        order = [n for n in order if n in real or n not in self.unresponsive]
        for node_id in real:
            before = self._last_command.get(node_id)
            task = asyncio.create_task(self._watch(node_id, commands[node_id], before))
            self._watchers.add(task)
            task.add_done_callback(self._watchers.discard)
            self._last_command[node_id] = task
        awaited = [n for n in order if n not in real]
        if self.config.simulated and awaited:
            self.commands_sent += 1
            batch = NodeCommands(commands=[commands[n] for n in awaited], seq=self.commands_sent)
            await self.bus.publish(NODE_COMMANDS, batch)
            return set(), {}, {*real, *awaited}
        replies: list[NodeCommandReply | BaseException] = await asyncio.gather(
            *(
                self.bus.call(
                    NODE_COMMAND, commands[n], node=n, within_s=self.config.command_timeout_s
                )
                for n in awaited
            ),
            return_exceptions=True,
        )
        failed: set[str] = set()
        progress: dict[str, StepsReport] = {}
        done: set[str] = set(real)
        for node_id, reply in zip(awaited, replies, strict=True):
            if isinstance(reply, NodeCommandReply):
                done.add(node_id)
                for job_id, steps in reply.progress.items():
                    seen = progress.get(job_id)
                    if seen is None or steps < seen.steps:  # parts of one job: the slowest rank
                        progress[job_id] = StepsReport(steps, commands[node_id].now)
                continue
            self.log.error("node.command_failed", node_id=node_id, error=str(reply))
            failed.update(launch.job_id for launch in commands[node_id].launch)
        for node_id in set(commands) - set(order):  # unresponsive: its launches did not happen
            failed.update(launch.job_id for launch in commands[node_id].launch)
        return failed, progress, done

    async def _watch(
        self, node_id: str, command: NodeCommand, before: asyncio.Task[None] | None
    ) -> None:
        """Deliver `command` to a real agent, after the node's earlier commands (order matters:
        a launch must not overtake an earlier preempt), and watch for its answer. Sent again
        while nobody listens (the agent reconnects), and once more if it went unanswered while the
        agent kept heartbeating (the answer was lost, e.g. in a NATS restart: a repeated launch is
        a no-op for the agent); if that goes unanswered too, the node is declared lost (through
        our own subject, in order with the other requests) and its jobs requeued. A silent agent
        (no heartbeat either: paused, or cut off) gets no new jobs and the command again until it
        answers or the heartbeat check declares it lost: before its lease ran out it may still run
        its jobs, which must not start elsewhere."""
        if before is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(before)
        assert self.config.command_timeout_s is not None
        timeout = self.config.command_timeout_s
        deadline = time.monotonic() + timeout
        resent = False
        while node_id in self.nodes:
            sent = time.time()
            try:
                await self.bus.call(
                    NODE_COMMAND,
                    command,
                    node=node_id,
                    within_s=max(deadline - time.monotonic(), 0.1),
                )
                if node_id in self.unresponsive and node_id in self.nodes:
                    self.unresponsive.discard(node_id)  # it was silent, and is back
                    self._nodes_changed()
                return
            except RemoteError as exc:
                error = exc
            alive = self.last_seen.get(node_id, 0.0) > sent
            if error.reply.error == "no service is listening" and time.monotonic() + 0.1 < deadline:
                await asyncio.sleep(0.1)  # not delivered: safe to send again
                continue
            if not alive and node_id in self.last_seen:  # silent: lost only by its heartbeats
                if node_id not in self.unresponsive:
                    self.unresponsive.add(node_id)
                    self._nodes_changed()
                    self.log.warning("node.unresponsive", node_id=node_id, error=str(error))
                deadline = time.monotonic() + timeout
                await asyncio.sleep(0.1)
                continue
            if alive and not resent:
                resent, deadline = True, time.monotonic() + timeout
                self.log.warning("node.command_resent", node_id=node_id, error=str(error))
                continue
            break
        else:
            return  # the node is gone already (declared lost, or left)
        if node_id not in self.unresponsive:
            self.unresponsive.add(node_id)  # no more commands or jobs meanwhile
            self._nodes_changed()
            self.log.error("node.command_failed", node_id=node_id, error=str(error))
            lost = NodesChanged(
                now=time.time(),
                gone=[node_id],
                reason=f"no answer to a command ({error.reply.error})",
            )
            await self.bus.nc.publish(self.bus.subject(NODES), encode(lost))

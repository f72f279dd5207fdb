"""Placement: owns the cluster map (nodes, GPUs, which job holds which GPU) and applies the
placement policy. It turns the scheduler's decision into commands to node agents: preempt the jobs
that lost their GPUs, launch the ones that gained some."""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from msgspec import Struct

from gpuyard.shared.bus import BadRequest, Bus, RemoteError, Route, Service
from gpuyard.shared.contract import (
    ApplyReply,
    ApplyRequest,
    ClusterInfo,
    Empty,
    Event,
    Launch,
    NodeCommand,
    NodeCommandReply,
    NodeGone,
    NodeGoneReply,
    RegisterNode,
)
from gpuyard.shared.model import ANY_GPU, GpuRef, JobSpec, NodeSpec
from gpuyard.shared.policy import NodeView, PlacementInput, PlacementPolicy, placement_policies


class PlacementConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    policy: str = "consolidated"
    params: dict[str, Any] = {}


def master_port(job_id: str) -> int:
    """A stable port per job for the distributed rendezvous (torchrun's MASTER_PORT)."""
    return 20000 + zlib.crc32(job_id.encode()) % 20000


class Placement(Service):
    name = "placement"

    def __init__(self, bus: Bus, config: PlacementConfig) -> None:
        super().__init__(bus)
        self.config = config
        self.policy: PlacementPolicy = placement_policies.create(config.policy, config.params)
        self.nodes: dict[str, NodeSpec] = {}
        self.running: dict[str, list[GpuRef]] = {}
        self.lost: list[str] = []  # jobs stopped by a node's departure, not yet told to the scheduler

    def describe_policy(self) -> str:
        return self.config.policy

    def routes(self) -> dict[str, Route]:
        return {
            "register": Route(self.register, RegisterNode),
            "node_gone": Route(self.node_gone, NodeGone),
            "apply": Route(self.apply, ApplyRequest),
            "cluster": Route(self.cluster, Empty),
        }

    def capacity(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for node in self.nodes.values():
            totals[node.gpu_type] = totals.get(node.gpu_type, 0) + node.num_gpus
        return totals

    async def cluster(self, _: Empty) -> ClusterInfo:
        return ClusterInfo(
            nodes=list(self.nodes.values()), capacity=self.capacity(), busy=dict(self.running)
        )

    async def register(self, req: RegisterNode) -> ClusterInfo:
        self.nodes[req.node.node_id] = req.node
        await self.bus.emit(
            Event(type="node.up", now=req.now, node_id=req.node.node_id, service=self.name)
        )
        return await self.cluster(Empty())

    async def node_gone(self, req: NodeGone) -> NodeGoneReply:
        if self.nodes.pop(req.node_id, None) is None:
            raise BadRequest(f"unknown node {req.node_id!r}", field="$.node_id")
        hit = sorted(j for j, gpus in self.running.items() if any(g.node_id == req.node_id for g in gpus))
        # The job's processes on the other nodes cannot go on without their peers: stop them.
        await self._command(req.now, {j: self.running.pop(j) for j in hit}, {}, {})
        self.lost += hit
        await self.bus.emit(
            Event(type="node.lost", now=req.now, node_id=req.node_id, reason=req.reason,
                  service=self.name)
        )  # fmt: skip
        return NodeGoneReply(lost_jobs=hit)

    async def apply(self, req: ApplyRequest) -> ApplyReply:
        for job_id in req.released:
            self.running.pop(job_id, None)
        for a in req.allocations:
            if a.job_id not in self.running and a.job_id not in req.specs:
                raise BadRequest(f"job {a.job_id!r} is not running and has no spec", field="$.specs")
        inp = PlacementInput(
            now=req.now,
            allocations=req.allocations,
            current={a.job_id: self.running[a.job_id] for a in req.allocations if a.job_id in self.running},
            nodes=[
                NodeView(node_id=n.node_id, gpu_type=n.gpu_type, usable=list(range(n.num_gpus)))
                for n in self.nodes.values()
            ],
        )
        placed = self.policy.place(inp)
        self._check(req, placed)
        stopped = {j: gpus for j, gpus in self.running.items() if placed.get(j) != gpus}
        started = {j: gpus for j, gpus in placed.items() if self.running.get(j) != gpus}
        failed = await self._command(req.now, stopped, started, req.specs)
        for job_id in stopped:
            del self.running[job_id]
        for job_id, gpus in started.items():
            if job_id not in failed:
                self.running[job_id] = gpus
        lost, self.lost = self.lost, []
        return ApplyReply(
            placed=dict(self.running),
            started={j: self.nodes[g[0].node_id].gpu_type for j, g in started.items() if j not in failed},
            stopped=sorted(stopped),
            unplaced=[a.job_id for a in req.allocations if a.job_id not in self.running],
            lost=lost,
            capacity=self.capacity(),
        )

    def _check(self, req: ApplyRequest, placed: dict[str, list[GpuRef]]) -> None:
        """The policy's answer must use existing GPUs once each, of the allocated count and type."""
        wanted = {a.job_id: a for a in req.allocations}
        used: set[GpuRef] = set()
        for job_id, gpus in placed.items():
            a = wanted.get(job_id)
            types = {self.nodes[g.node_id].gpu_type for g in gpus if g.node_id in self.nodes}
            ok = (
                a is not None
                and len(gpus) == a.num_gpus
                and all(g.node_id in self.nodes and 0 <= g.index < self.nodes[g.node_id].num_gpus for g in gpus)
                and len(types) == 1
                and (a.gpu_type == ANY_GPU or types == {a.gpu_type})
                and used.isdisjoint(gpus)
                and len(set(gpus)) == len(gpus)
            )
            if not ok:
                raise RuntimeError(f"placement policy {self.config.policy!r} placed {job_id!r} wrongly: {gpus}")
            used.update(gpus)

    async def _command(
        self,
        now: float,
        stop: dict[str, list[GpuRef]],
        start: dict[str, list[GpuRef]],
        specs: dict[str, JobSpec],
    ) -> set[str]:
        """Send each affected node one command (preempts, then launches). Returns jobs whose launch failed."""
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
            offset = 0
            for rank, (node_id, indices) in enumerate(by_node.items()):
                command(node_id).launch.append(
                    Launch(
                        job_id=job_id, spec=specs[job_id], gpus=indices, world_size=len(gpus),
                        rank_offset=offset, node_rank=rank, num_nodes=len(by_node),
                        master_addr=master.address or master.node_id, master_port=master_port(job_id),
                    )
                )  # fmt: skip
                offset += len(indices)
        order = sorted(commands)
        replies = await asyncio.gather(
            *(
                self.bus.request(f"{self.bus.subjects.node(n)}.cmd", commands[n], NodeCommandReply)
                for n in order
            ),
            return_exceptions=True,
        )
        failed: set[str] = set()
        for node_id, reply in zip(order, replies, strict=True):
            if isinstance(reply, RemoteError | Exception):
                self.log.error("node.command_failed", node_id=node_id, error=str(reply))
                failed.update(launch.job_id for launch in commands[node_id].launch)
        return failed

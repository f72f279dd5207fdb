"""A simulation's launches at several instants, told to placement in one request.

Going on through the instants the clock told of ahead (`Scheduler._advance`), the scheduler
applies each decision before it makes the next, since the next depends on what placement did.
Where placement assured that it places any job of whole GPUs of a type while that many of the
type are free (`ApplyReply.assures_fit`), a decision that only launches such jobs (within the
capacity: the guard checked) is placed for certain, and only where is unknown: the scheduler
keeps its apply back (a stage) and goes on as if it had been answered, the jobs running from
that instant on nodes not known yet. The stages go to placement in one request (`place.stages`)
before the scheduler answers the clock, or before it asks placement anything else; then the jobs
get their nodes, and the events held meanwhile (`job.started` names the GPUs) are published in
their order. A run gives the same results and events as with one apply per instant, with one
request where there were as many as instants.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from gpuyard.shared.contract import ApplyReply, ApplyRequest, Event
from gpuyard.shared.model import ANY_GPU, Allocation, GpuRef, JobSpec

MAX_STAGED_LAUNCHES = 2000
"""Launches kept back at most before they are sent (a request well under NATS's payload limit)."""
NODE_LOST = "node lost"
"""Why a job waits again whose node went, where placement did not say why (a simulated node)."""
UNKNOWN_GPU = GpuRef(node_id="", index=-1)
"""Each of a staged job's GPUs until placement has said which (never sent, never stored)."""


@dataclass
class Staged:
    """One instant's apply, kept back."""

    request: ApplyRequest
    released: dict[str, Allocation]
    """The allocations of the jobs it releases (those that ended since the stage before)."""


@dataclass
class Stages:
    """The applies kept back while the scheduler goes on (`open`), and the events held."""

    open: bool = False
    """The scheduler goes on through instants it answers the clock for at once: it may stage."""
    assured: bool = False
    """Placement's last reply assured it places what fits (`assures_fit`)."""
    staged: list[Staged] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    launches: int = 0
    """Allocations in the stages kept back."""

    def can_stage(
        self, allocations: list[Allocation], specs: dict[str, JobSpec], *, stops: bool,
        limited: Iterable[str], adaptive: bool,
    ) -> bool:  # fmt: skip
        """Whether an apply of what changed (`allocations`, with `specs` for those not running)
        may be kept back: it only launches jobs of whole GPUs of a named type that ask for
        nothing more, none with a time limit (`limited`: their time left goes with the launch)
        nor an adaptive batch, and stops nothing (the guard saw that they fit: `guard.check`)."""
        if not (self.open and self.assured) or stops or adaptive or not allocations:
            return False
        limits = set(limited)
        for a in allocations:
            spec = specs.get(a.job_id)
            if (
                spec is None or a.num_gpus < 1 or a.gpu_type == ANY_GPU or a.share_with
                or a.nodes or a.layout or a.job_id in limits or spec.gpu_milli or spec.cpu_milli
                or spec.memory_mib or not spec.allows(a.gpu_type)
            ):  # fmt: skip
                return False
        return True

    def stage(
        self, request: ApplyRequest, released: dict[str, Allocation], capacity: dict[str, int],
        commands: int,
    ) -> ApplyReply:  # fmt: skip
        """Keep `request` back (its base the stage before): the reply placement will give, but
        for where the jobs run (`UNKNOWN_GPU`)."""
        self.staged.append(Staged(request, released))
        self.launches += len(request.allocations)
        return ApplyReply(
            placed={a.job_id: [UNKNOWN_GPU] * a.num_gpus for a in request.allocations},
            started={a.job_id: a.gpu_type for a in request.allocations},
            stopped=[], unplaced=[], lost=[], capacity=capacity, commands=commands,
            applied=request.base + 1, assures_fit=True,
        )  # fmt: skip

    def full(self) -> bool:
        """Enough is kept back for one request (`MAX_STAGED_LAUNCHES`): send it."""
        return self.launches >= MAX_STAGED_LAUNCHES

    def hold(self, event: Event) -> bool:
        """Hold `event` while stages wait (published once they are placed, in order)."""
        if not self.staged:
            return False
        self.events.append(event)
        return True

    def take(self) -> tuple[list[Staged], list[Event]]:
        staged, events = self.staged, self.events
        self.staged, self.events, self.launches = [], [], 0
        return staged, events

    def put_back(self, staged: list[Staged], events: list[Event]) -> None:
        """What `take` took, not sent after all (to be sent with the next request)."""
        self.staged, self.events = staged + self.staged, events + self.events
        self.launches = sum(len(s.request.allocations) for s in self.staged)

    @staticmethod
    def placed(
        staged: list[Staged], replies: list[ApplyReply]
    ) -> tuple[dict[str, list[GpuRef]], dict[str, tuple[float, str]]]:
        """Where placement put each job it ran, as of the last stage; and the jobs it did not run
        as staged, each with the instant and why: left out (which its assurance rules out,
        unless the cluster changed since: an operator's drain, a policy swapped in during a
        simulation), stopped, or lost with their node. A later stage's word on a job wins."""
        if len(replies) != len(staged):
            raise RuntimeError(f"placement answered {len(replies)} of {len(staged)} stages")
        placed: dict[str, list[GpuRef]] = {}
        undone: dict[str, tuple[float, str]] = {}
        for stage, reply in zip(staged, replies, strict=True):
            now = stage.request.now
            gone = [(j, reply.lost_why.get(j, NODE_LOST)) for j in reply.lost]
            gone += [(j, "stopped by placement") for j in reply.stopped]
            gone += [
                (a.job_id, "placement did not place it")
                for a in stage.request.allocations
                if a.job_id not in reply.placed
            ]
            for job_id, why in gone:
                placed.pop(job_id, None)
                undone[job_id] = (now, why)
            for job_id, gpus in reply.placed.items():
                undone.pop(job_id, None)
                placed[job_id] = gpus
        return placed, undone

    @staticmethod
    def whole_as_of(
        staged: list[Staged], k: int, allocations: dict[str, Allocation]
    ) -> list[Allocation]:
        """Every allocation as of stage `k`, from `allocations` as of the last: those the later
        stages started leave, those they released come back."""
        whole = dict(allocations)
        for stage in reversed(staged[k + 1 :]):
            for a in stage.request.allocations:
                whole.pop(a.job_id, None)
            whole.update(stage.released)
        return list(whole.values())

    @staticmethod
    def with_gpus(events: list[Event], placed: dict[str, list[GpuRef]]) -> list[Event]:
        """The held events, each staged job's start naming its GPUs (none where placement did
        not run it)."""
        return [
            msgspec.structs.replace(e, gpus=placed.get(e.job_id or "", []))
            if e.type == "job.started" and UNKNOWN_GPU in e.gpus
            else e
            for e in events
        ]

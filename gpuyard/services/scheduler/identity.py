"""What the scheduler believes from whom (the caller is named by the request's subject; see
gpuyard.shared.identity): a node agent reports exits only of its own job parts, and a submitter
cancels, holds and requeues only their own jobs and reads only their own jobs' environment. Operators and services act
for anyone; the server's permissions decide who may send what at all."""

from __future__ import annotations

import msgspec

from gpuyard.shared.contract import ExitReport, JobExit
from gpuyard.shared.errors import BadRequest
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import JobRecord


def check_exits(req: ExitReport, caller: Caller) -> None:
    """A node reports its own exits only: BadRequest naming the first exit of another node (or
    progress, which only a simulation's clock sends with exits)."""
    if caller.role != "node":
        return
    if req.steps:
        raise BadRequest(
            f"node {caller.name!r} reports progress in its heartbeats, not with exits",
            field="$.steps",
        )
    for i, ex in enumerate(req.exits):
        if ex.node_id != caller.name:
            raise BadRequest(
                f"node {caller.name!r} may only report exits on itself, not on {ex.node_id!r}",
                field=f"$.exits[{i}].node_id",
            )


def ran_there(record: JobRecord, ex: JobExit, caller: Caller) -> bool:
    """A node's exit is about a job it was given (now, or in an earlier run)."""
    return caller.role != "node" or ex.node_id in record.ran_on


def may_change(record: JobRecord, caller: Caller) -> str | None:
    """None when `caller` may cancel, hold, release or requeue the job, else why not."""
    if caller.role == "user" and record.spec.user != caller.name:
        return "not your job"
    return None


def shown_to(caller: Caller, records: list[JobRecord]) -> list[JobRecord]:
    """The records as `caller` may read them: a job's `env` (tokens, passwords) only to its owner,
    operators and services; to anyone else it shows none."""
    if caller.role in ("op", "svc"):
        return records
    mine = caller.name if caller.role == "user" else None
    return [
        r if r.spec.user == mine or not r.spec.env
        else msgspec.structs.replace(r, spec=msgspec.structs.replace(r.spec, env={}))
        for r in records
    ]  # fmt: skip

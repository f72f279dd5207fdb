"""Who submits: a submitter's jobs carry their name (`JobSpec.user`), which the scheduler checks
when someone cancels them."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gpuyard.shared.contract import SubmitRequest
from gpuyard.shared.errors import BadRequest
from gpuyard.shared.identity import ANONYMOUS, Caller


def owned_by(req: SubmitRequest, caller: Caller) -> SubmitRequest:
    """A submitter's jobs are theirs: `user` is set to their name (a job naming someone else is
    refused). Operators and services may submit for anyone; an operator's job that names no
    user is the operator's."""
    if caller.role == "op" and caller != ANONYMOUS:
        jobs = [
            spec if spec.user else msgspec.structs.replace(spec, user=str(caller))
            for spec in req.jobs
        ]
        return msgspec.structs.replace(req, jobs=jobs)
    if caller.role != "user":
        return req
    for i, spec in enumerate(req.jobs):
        if spec.user and spec.user != caller.name:
            raise BadRequest(
                f"you submit as {caller.name!r}, not as {spec.user!r}", field=f"$.jobs[{i}].user"
            )
    jobs = [msgspec.structs.replace(spec, user=caller.name) for spec in req.jobs]
    return msgspec.structs.replace(req, jobs=jobs)


def named_for(caller: Caller, asked: set[str], users: dict[str, str]) -> Callable[[str], bool]:
    """Which jobs a submit's reply may name to `caller`: those it submitted (`asked`) and its own
    (`users`: each job's user), such as its held jobs decided on with it; never another user's.
    Services and anonymous callers (a simulation's clock, an open server) get every job."""
    if caller.role == "user":
        owner = caller.name
    elif caller.role == "op" and caller != ANONYMOUS:
        owner = str(caller)  # (an operator's own jobs are named so: `owned_by`)
    else:
        return lambda _: True
    return lambda job_id: job_id in asked or users.get(job_id) == owner

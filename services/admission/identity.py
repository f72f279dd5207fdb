"""Who submits: a submitter's jobs carry their name (`JobSpec.user`), which the scheduler checks
when someone cancels them."""

from __future__ import annotations

import msgspec

from gpuyard.shared.contract import SubmitRequest
from gpuyard.shared.errors import BadRequest
from gpuyard.shared.identity import Caller


def owned_by(req: SubmitRequest, caller: Caller) -> SubmitRequest:
    """A submitter's jobs are theirs: `user` is set to their name (a job naming someone else is
    refused). Operators and services may submit for anyone."""
    if caller.role != "user":
        return req
    for i, spec in enumerate(req.jobs):
        if spec.user and spec.user != caller.name:
            raise BadRequest(
                f"you submit as {caller.name!r}, not as {spec.user!r}", field=f"$.jobs[{i}].user"
            )
    jobs = [msgspec.structs.replace(spec, user=caller.name) for spec in req.jobs]
    return msgspec.structs.replace(req, jobs=jobs)

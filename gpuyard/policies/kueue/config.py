"""The queues an operator defines (one TOML file), as Kueue's ClusterQueues: each a nominal quota
of GPUs per GPU type, the users whose jobs go there, and a cohort whose queues lend one another
what they leave unused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from gpuyard.shared.model import Name

Gpus = Annotated[int, Meta(ge=0)]
Preemption = Literal["never", "lower_priority", "any"]


class QueueSpec(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One queue (Kueue's ClusterQueue with its LocalQueue)."""

    name: Name
    quota: dict[str, Gpus]
    """Nominal quota: GPUs per GPU type its jobs may hold without borrowing."""
    users: list[str] = []
    """Whose jobs go here (a job's queue comes from who submitted it, never from the job)."""
    cohort: str = ""
    """Queues of one cohort lend one another the quota they leave unused ("": none)."""
    borrowing_limit: dict[str, Gpus] = {}
    """The most GPUs of a type it may borrow beyond its quota (a type not named: no limit)."""
    lending_limit: dict[str, Gpus] = {}
    """The most GPUs of its quota of a type it lends (a type not named: all of it)."""
    reclaim_within_cohort: Preemption = "never"
    """Whether a job within this queue's quota preempts jobs of queues that borrow it (Kueue's
    `reclaimWithinCohort`): never, those of lower priority, or any."""
    within_queue: Literal["never", "lower_priority"] = "never"
    """Whether a job preempts the queue's own jobs of lower priority (`withinClusterQueue`)."""

    def borrow_limit(self, gpu_type: str) -> float:
        return self.borrowing_limit.get(gpu_type, math.inf)

    def lendable(self, gpu_type: str) -> int:
        quota = self.quota.get(gpu_type, 0)
        return min(quota, self.lending_limit.get(gpu_type, quota))


class Queues(Struct, kw_only=True, forbid_unknown_fields=True):
    """The queues file: `[[queue]]` tables, and the queue of users listed in none."""

    queue: list[QueueSpec]
    default_queue: str = ""

    def __post_init__(self) -> None:
        names = [q.name for q in self.queue]
        if len(set(names)) != len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"queue {twice!r} is defined twice")
        seen: dict[str, str] = {}
        for q in self.queue:
            for user in q.users:
                if user in seen:
                    raise ValueError(f"user {user!r} is in queues {seen[user]!r} and {q.name!r}")
                seen[user] = q.name
            if unknown := sorted(set(q.borrowing_limit) - set(q.quota)):
                raise ValueError(f"queue {q.name!r}: borrowing_limit names {unknown[0]!r}, which "
                                 "its quota does not")  # fmt: skip
            if unknown := sorted(set(q.lending_limit) - set(q.quota)):
                raise ValueError(f"queue {q.name!r}: lending_limit names {unknown[0]!r}, which "
                                 "its quota does not")  # fmt: skip
            if (q.borrowing_limit or q.lending_limit) and not q.cohort:
                raise ValueError(f"queue {q.name!r}: borrowing and lending need a cohort")
        if self.default_queue and self.default_queue not in names:
            raise ValueError(f"default_queue {self.default_queue!r} is not a queue")


def load_queues(path: str | Path) -> Queues:
    """The queues file at `path`; ValueError in one line naming the file and the mistake."""
    from gpuyard.workloads.core import read_document

    try:
        data = read_document(path)
    except OSError as exc:
        raise ValueError(f"queues file {path}: {exc.strerror or exc}") from None
    try:
        return msgspec.convert(data, Queues)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path}: {exc}") from None


def queue_params(path: str | Path) -> dict[str, Any]:
    """The `kueue` policy's parameters from the queues file at `path` (checked: ValueError in one
    line)."""
    params: dict[str, Any] = msgspec.to_builtins(load_queues(path))
    return params

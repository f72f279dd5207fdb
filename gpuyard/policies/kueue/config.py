"""The queues an operator defines (one TOML file), as Kueue's ClusterQueues: each a nominal quota
of GPUs per GPU type, the users whose jobs go there, and a cohort whose queues lend one another
what they leave unused; priority classes by name, and fair sharing between queues and users."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from gpuyard.shared.model import Name

Gpus = Annotated[int, Meta(ge=0)]
Weight = Annotated[float, Meta(ge=0)]
Seconds = Annotated[float, Meta(gt=0)]
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
    weight: Weight = 1.0
    """Its weight in fair sharing (`fairSharing.weight`): its share is divided by it (0: the
    last to be served, the first to give back)."""
    default_time_limit_s: Seconds | None = None
    """The time limit of its jobs that ask for none (Slurm's partition DefaultTime)."""
    max_time_limit_s: Seconds | None = None
    """The longest time limit its jobs may ask for: a job asking for more is refused when it is
    submitted (Slurm's partition MaxTime, enforced at submission)."""

    def borrow_limit(self, gpu_type: str) -> float:
        return self.borrowing_limit.get(gpu_type, math.inf)

    def lendable(self, gpu_type: str) -> int:
        quota = self.quota.get(gpu_type, 0)
        return min(quota, self.lending_limit.get(gpu_type, quota))


class FairSharing(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Fair sharing (the `[fair_sharing]` table; without it, none): queues that compete for
    their cohort's unused quota are served, and reclaim from one another, by their share, and
    a queue's jobs of one priority by their users' shares.

    With `half_life_s` 0, a queue's share is what it borrows now, over what its cohort lends, as
    Kueue's fair sharing (dominant resource share), and a user's is the GPUs they hold now; with
    a half-life, both are the GPU-seconds used, decayed with it (Kueue's admission fair sharing,
    Slurm's PriorityDecayHalfLife). Each divided by its weight."""

    half_life_s: Annotated[float, Meta(ge=0)] = 0.0
    users: bool = False
    """Order each queue's jobs of one priority by their users' shares (else by submission)."""
    user_weights: dict[str, Weight] = {}
    """Users' weights (a user not named: 1)."""


class Queues(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The queues file: `[[queue]]` tables, the queue of users listed in none, the priority
    classes jobs may name, and fair sharing."""

    queue: list[QueueSpec]
    default_queue: str = ""
    priority_classes: dict[str, int] = {}
    """Priorities by name (Kueue's WorkloadPriorityClass): `submit --priority-class NAME` runs a
    job at that priority; a name not here is refused at submission."""
    fair_sharing: FairSharing | None = None

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
            longest, default = q.max_time_limit_s, q.default_time_limit_s
            if longest is not None and default is not None and default > longest:
                raise ValueError(f"queue {q.name!r}: default_time_limit_s is over "
                                 "max_time_limit_s")  # fmt: skip
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

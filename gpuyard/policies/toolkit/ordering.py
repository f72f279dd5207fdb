"""The ordering walk: turn an order of jobs (most important first) into allocations.

Most scheduling policies are an order plus this walk (Blox's round walk); elastic ones build on it
for their minimum shares. Which GPU type a job gets is the walk's `type_order`: among the types
where the job can run at all (no policy ever starts a job where its throughput is 0),
`agnostic_types` tries them in a random order fixed per job (as Gavel's agnostic FIFO picks a
random type among those with room), `fastest_types` fastest first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from gpuyard.shared.model import Allocation, JobRecord
from gpuyard.shared.policy import ClusterView, JobView

TypeOrder = Callable[[JobView, list[str], int], list[str]]
"""(job, the types where it can run, GPUs it needs) -> the order in which to try them."""
K = TypeVar("K", bound=Any)  # a job's place in the order (its index, or its sort entry)


def held_or_requested(job: JobView) -> int:
    """GPUs a job asks for in a rigid policy: what it holds while running (when within its
    [min, max] range, e.g. after an elastic policy resized it), else `num_gpus`."""
    r = job.record  # (the walk's hot path: the record's fields, not the view's properties)
    spec = r.spec
    low, high = spec.min_gpus or spec.num_gpus, spec.max_gpus or spec.num_gpus
    if r.state == "running" and r.gpus and low <= r.gpus <= high:
        return r.gpus
    return spec.num_gpus


def held_milli(record: JobRecord) -> int:
    """Thousandths of a GPU a running job holds (its share of one GPU, or 1,000 a GPU): the
    walk counts GPUs in these, so that jobs asking for a share of a GPU pack."""
    return record.spec.milli(record.gpus)


def agnostic_types(job: JobView, types: list[str], need: int) -> list[str]:
    """A random order of the types, fixed per job: the first type with room is then uniformly
    random among those with room, and the same job prefers the same type every round; the types
    placement could not place it on since it last started come last (`JobRecord.unplaced_on`:
    its CPUs, memory or share may fit another type's nodes)."""
    if len(types) < 2:
        return types
    tried = job.record.unplaced_on
    return sorted(
        types,
        key=lambda t: (t in tried, hashlib.blake2b(f"{job.job_id}\0{t}".encode()).digest()),
    )


def fastest_types(cluster: ClusterView) -> TypeOrder:
    """Fastest type for the job first (its throughput at the GPUs it needs); ties in type order."""

    def order(job: JobView, types: list[str], need: int) -> list[str]:
        return sorted(types, key=lambda t: -cluster.rate(job, t, need))

    return order


def runnable_types(job: JobView, cluster: ClusterView, need: int) -> list[str]:
    """The types (with usable GPUs) where `job` can run on `need` GPUs, in type order."""
    spec = job.spec
    return [
        t for t in cluster.types
        if spec.allows(t) and cluster.capacity.get(t, 0) > 0 and cluster.supports(job, t, need)
    ]  # fmt: skip


def fill_in_order(
    order: list[JobView],
    cluster: ClusterView | Mapping[str, int],
    *,
    backfill: bool = False,
    demand: Callable[[JobView], int] = held_or_requested,
    type_order: TypeOrder = agnostic_types,
) -> list[Allocation]:
    """Walk `order` (most important first), giving each job `demand(job)` GPUs of one type.

    This is Blox's round walk: running jobs hold their GPUs; a job that is not running takes free
    GPUs, else preempts the running jobs *after it* in the order, last first (jobs placed earlier
    in this walk are not preemptible); a running job reached by the walk keeps its GPUs and type
    (resized to `demand(job)`, taking more from free GPUs or later running jobs if it grows).
    Without `backfill` the walk stops at the first job that cannot be placed even by preempting
    (head-of-line blocking, as Blox and Gavel do) and running jobs after that point keep running
    (they were not needed to make room). With `backfill`, the walk skips such a job and goes on
    (Tiresias's simulator does this). A job is only given a type where it can run (`cluster.rate`
    > 0) and that it allows, tried in `type_order`. GPUs are counted in thousandths: jobs that ask
    for a share of one GPU (`JobSpec.gpu_milli`) pack, placement finding the GPUs they fit on (a
    job that fits the count but not a GPU waits). Returns allocations in order; running jobs left
    out are to be preempted. O(n) in the number of jobs. `cluster` may be just the GPUs per type
    (every job then runs on every type).
    """
    if not isinstance(cluster, ClusterView):
        cluster = ClusterView(capacity=dict(cluster))
    free, running, after = holdings(enumerate(order), cluster)
    walked = walk(enumerate(order), cluster, free, running, after, backfill, demand, type_order)
    return [a for _, a in walked]


def holdings(
    placed: Iterable[tuple[K, JobView]], cluster: ClusterView
) -> tuple[dict[str, int], dict[str, list[tuple[K, JobView]]], dict[str, int]]:
    """Where a walk over jobs in this order (each with its place, `K`) starts: the thousandths of
    GPUs per type no running job holds, the running jobs per type in walk order (entries the walk
    has not reached may be preempted from the tail), and the thousandths they hold per type."""
    free = {t: 1000 * n for t, n in cluster.capacity.items()}
    running: dict[str, list[tuple[K, JobView]]] = {}
    after: dict[str, int] = {}
    for pos, job in placed:
        r = job.record
        t = r.gpu_type
        if r.state == "running" and r.gpus > 0 and t in free:
            held = held_milli(r)
            free[t] -= held
            running.setdefault(t, []).append((pos, job))
            after[t] = after.get(t, 0) + held
    return free, running, after


class RunningHolds:
    """What the running jobs hold, kept across decisions by an order that walks from its first
    waiting job on (`StandingOrder`, `WaitingOrder`): each job's GPU type and thousandths of
    GPUs as it came in, the thousandths used per type, and the running jobs the walk might not
    keep as they are (`irregular`: then every job is walked). Made anew with another cluster
    or throughput model (the jobs' runnable types are kept per kind of job)."""

    def __init__(self) -> None:
        self.of: dict[str, tuple[str, int]] = {}
        self.used: dict[str, int] = {}
        self.irregular: set[str] = set()
        self._runnable: dict[tuple[str | int, ...], list[str]] = {}

    def add(self, view: JobView, cluster: ClusterView) -> bool:
        """Count a running job in; False if it holds no GPUs of a type the cluster has (the
        walk sees it as waiting)."""
        r = view.record
        t = r.gpu_type
        if t is None or r.gpus <= 0 or t not in cluster.capacity:
            self.irregular.add(r.job_id)
            return False
        held = held_milli(r)
        self.of[r.job_id] = (t, held)
        self.used[t] = self.used.get(t, 0) + held
        if not (
            r.shares_with is None
            and held_or_requested(view) == r.gpus
            and t in self._runnable_types(view, cluster, r.gpus)
        ):
            self.irregular.add(r.job_id)
        return True

    def remove(self, job_id: str) -> bool:
        """Count a job out; False if it held nothing counted."""
        self.irregular.discard(job_id)
        holds = self.of.pop(job_id, None)
        if holds is None:
            return False
        self.used[holds[0]] -= holds[1]
        return True

    def free(self, capacity: Mapping[str, int]) -> dict[str, int] | None:
        """The thousandths of GPUs per type no running job holds; None where the walk must
        pass over every job (a running job it might not keep, a type overcommitted)."""
        free = {t: 1000 * n - self.used.get(t, 0) for t, n in capacity.items()}
        if self.irregular or any(n < 0 for n in free.values()):
            return None
        return free

    def _runnable_types(self, view: JobView, cluster: ClusterView, gpus: int) -> list[str]:
        spec = view.record.spec
        kind: tuple[str | int, ...] = (spec.gpu_type, spec.job_type, gpus, *spec.gpu_types)
        types = self._runnable.get(kind)
        if types is None:
            types = self._runnable[kind] = runnable_types(view, cluster, gpus)
        return types


def walk(
    sequence: Iterable[tuple[K, JobView]],
    cluster: ClusterView,
    free: dict[str, int],
    running: dict[str, list[tuple[K, JobView]]],
    after: dict[str, int],
    backfill: bool,
    demand: Callable[[JobView], int] = held_or_requested,
    type_order: TypeOrder = agnostic_types,
) -> list[tuple[K, Allocation]]:
    """The walk of `fill_in_order` from some point of the order on: `sequence` is the jobs from
    there (each with its place in the order, `K`), `free` the thousandths of GPUs per type that
    no running job holds, `running` the running jobs from there on per type (in order) and
    `after` what they hold per type, in thousandths. Returns the allocations of the jobs walked (and of running jobs left after a
    blocking job), each with its place, in order."""
    known: dict[tuple[str | int, ...], list[str]] = {}  # (type asked, job type, GPUs): runnable on

    def runnable(job: JobView, need: int) -> list[str]:
        spec = job.record.spec
        key: tuple[str | int, ...] = (spec.gpu_type, spec.job_type, need, *spec.gpu_types)
        types = known.get(key)
        if types is None:
            types = known[key] = runnable_types(job, cluster, need)
        return types

    head = dict.fromkeys(running, 0)
    result: list[tuple[K, Allocation]] = []
    stopped = False
    for pos, job in sequence:
        need = demand(job)
        r = job.record
        cost = r.spec.milli(need)
        t = r.gpu_type  # None for a job that holds no GPUs: not among the running
        lst = running.get(t) if t is not None else None
        if t is not None and lst is not None and head[t] < len(lst) and lst[head[t]][1] is job:
            # Running and not preempted: it competes for its own GPUs first, on its own type.
            head[t] += 1
            held = held_milli(r)
            after[t] -= held
            ok = t in runnable(job, need)
            if ok and need == r.gpus and free[t] >= 0:  # it keeps them (most of a long walk)
                result.append((pos, Allocation(r.job_id, need, t)))
                continue
            free[t] += held
            cands = [t] if ok else []
        else:
            cands = runnable(job, need)
            if len(cands) > 1:
                cands = type_order(job, cands, need)
        chosen = None
        for c in cands:  # a type with room, else one where preempting later jobs makes room
            if free.get(c, 0) >= cost:
                chosen = c
                break
        else:
            for c in cands:
                if free.get(c, 0) + after.get(c, 0) >= cost:
                    chosen = c
                    break
        if chosen is None:
            if not backfill:
                stopped = True
                break
            if not any(n > 0 for n in free.values()) and not any(after.values()):
                break  # no GPU left to take or to preempt: no later job can be placed
            continue
        while free[chosen] < cost:  # preempt the last running job after this one
            _, victim = running[chosen].pop()
            held = held_milli(victim.record)
            free[chosen] += held
            after[chosen] -= held
        free[chosen] -= cost
        result.append((pos, Allocation(job.record.job_id, need, chosen)))
    if stopped:  # running jobs after the blocking job keep running
        for t, lst in running.items():
            result.extend(
                (p, Allocation(j.record.job_id, j.record.gpus, t)) for p, j in lst[head[t] :]
            )
        result.sort(key=lambda pa: pa[0])
    return result

"""What stopping and (re)starting a job costs in a simulation: the cost models (`PreemptionCost`,
`RestartCost`) and the restart charges they make as time goes (`Restarts`). Pure: no I/O, no
NATS."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Set
from typing import Literal

from msgspec import Struct

from gpuyard.shared.model import NodeSpec

GpuSet = frozenset[tuple[str, int]]
"""A job's GPUs: (node, GPU index) each."""


class RestartCost(Struct, kw_only=True, forbid_unknown_fields=True):
    """ElasticFlow's restart model: a job whose processes (re)start makes no progress for a while.

    A launch (a start, a resume, a resize or a move: a resize is a preemption and a relaunch of
    the same job at the same instant) costs `base_s`, plus `per_doubling_s * (log2(GPUs) + 1)`
    while its workers set up and join, plus `cold_s` if its processes must start from scratch.
    With `warm_ranks`, a job on a set of GPUs that some job used since the last cold start keeps
    its warm processes and pays `base_s` only. Every `cold_every`-th instant at which launches
    happen (0: never) is a cold start: jobs not on warm GPUs pay `cold_s` too, and the warm sets
    are forgotten. Which jobs restart (`scope`): `launched`, only those; `changes`, every running
    job at an instant with any launch (ElasticFlow's executor stops and relaunches them all);
    `decisions`, every running job at every scheduling decision, changed or not, decisions being
    counted at least `decision_gap_s` apart (ElasticFlow's simulator: at every event, events a
    slot apart).

    ElasticFlow's simulator (`utils.estimate_overhead`): base 2 s (7 s on 256 GPUs or more), 2 s
    per doubling, cold 27 s (47 s on 256 or more), every 240th scheduling event.
    """

    base_s: float = 2.0
    per_doubling_s: float = 2.0
    cold_s: float = 27.0
    cold_every: int = 0
    warm_ranks: bool = True
    warm_key: Literal["gpus", "first_rank"] = "gpus"
    """What makes a job's processes warm: a set of the very same GPUs (`gpus`), or, as
    ElasticFlow's simulator keys its cache, one of the same size starting at the same rank (the
    position of its first GPU in the cluster's order, as if its GPUs were contiguous)."""
    scope: Literal["launched", "changes", "decisions"] = "launched"
    decision_gap_s: float = 0.0
    until_s: float | None = None
    """No restart is charged from this instant on (ElasticFlow's Gandiva charges at its arrival
    events only, none from its last arrival on); None: always."""

    def seconds(self, gpus: int, *, warm: bool, cold: bool) -> float:
        if warm:
            return self.base_s
        return (
            self.base_s
            + self.per_doubling_s * (math.log2(max(gpus, 1)) + 1)
            + (self.cold_s if cold else 0.0)
        )


class PreemptionCost(Struct, kw_only=True, forbid_unknown_fields=True):
    """What a preemption costs, charged as lost progress (the references charge nothing).

    A preempted job loses the work of its last `checkpoint_s` seconds (saving it), and a resumed
    job runs `restore_s` seconds before it progresses again. `by_job_type` overrides both per
    job type (model): {"resnet50": [checkpoint_s, restore_s]}. `restart`: ElasticFlow's model of
    the time a (re)launched job spends starting (`RestartCost`), on top of these. A job stopped
    before it progresses again loses no more than it had.
    """

    checkpoint_s: float = 0.0
    restore_s: float = 0.0
    by_job_type: dict[str, tuple[float, float]] = {}
    restart: RestartCost | None = None

    def of(self, job_type: str) -> tuple[float, float]:
        return self.by_job_type.get(job_type, (self.checkpoint_s, self.restore_s))


class Restarts:
    """The restart pauses `RestartCost` charges, instant after instant: which processes are warm,
    and which instant is a cold start. `node_specs` is the cluster's nodes in their order (it
    may grow: nodes that join later come after)."""

    def __init__(self, model: RestartCost | None, node_specs: Mapping[str, NodeSpec]) -> None:
        self.model = model
        self.node_specs = node_specs
        self.warm: set[Hashable] = set()  # GPU sets with warm processes (`RestartCost.warm_key`)
        self.rank_offsets: dict[str, int] = {}  # each node's first rank (`first_rank`)
        self.instants = 0  # instants at which restarts were charged
        self.charged: float | None = None  # the last decision at which restarts were charged

    def pauses(
        self, now: float, *, decided: float | None, launched: Set[str], running: Set[str],
        gpu_set: Callable[[str], GpuSet | None],
    ) -> dict[str, float]:  # fmt: skip
        """Seconds each job spends (re)starting at `now`, if it restarts: `launched` are the jobs
        launched at `now`, `running` those with GPUs, `decided` the last instant the scheduler
        decided at; `gpu_set(job)` a job's GPUs (None: it has none)."""
        model = self.model
        if model is None or (model.until_s is not None and now >= model.until_s):
            return {}
        if model.scope == "decisions":
            due = decided == now and (
                self.charged is None or now >= self.charged + model.decision_gap_s
            )
            if not due:
                return {}
            self.charged = now
        elif not launched:
            return {}
        # ElasticFlow's count: a cold start at every `cold_every`-th instant after the first
        every = model.cold_every
        cold = every > 0 and self.instants > 0 and self.instants % every == 0
        self.instants += 1
        scope = launched if model.scope == "launched" else running
        pauses: dict[str, float] = {}
        for job_id in sorted(scope):
            ranks = gpu_set(job_id)
            if ranks is None:
                continue
            key: Hashable = ranks if model.warm_key == "gpus" else self.first_rank(ranks)
            warm = model.warm_ranks and key in self.warm
            self.warm.add(key)
            pauses[job_id] = model.seconds(len(ranks), warm=warm, cold=cold)
        if cold:
            self.warm.clear()
        return pauses

    def first_rank(self, ranks: GpuSet) -> tuple[int, int]:
        """(the rank of the set's first GPU in the cluster's order of nodes, its size)."""
        offsets = self.rank_offsets
        if len(offsets) < len(self.node_specs):
            total = 0
            for node_id, spec in self.node_specs.items():
                offsets[node_id] = total
                total += spec.num_gpus
        return min(offsets[node] + gpu for node, gpu in ranks), len(ranks)

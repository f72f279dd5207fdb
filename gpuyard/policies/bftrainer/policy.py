"""BFTrainer's scheduling policies: elastic jobs on the idle nodes of a supercomputer.

Nodes come (the batch scheduler leaves them idle) and go (it takes them back, preempting the part
of the job that ran there); at every such event, and when jobs arrive or finish, the policy
re-allocates the idle nodes among the first `max_jobs` jobs in admission order (BFTrainer's
queue, `maxJ`). `bftrainer` solves the MILP (`milp.solve_milp`), `bftrainer-equal` hands out
equal shares (the reference's heuristic). Both grow and shrink jobs without migrating them and
give placement the exact nodes of every job (`Allocation.nodes`).

A job's node count is its GPU count: BFTrainer's nodes are the unit (a node of several GPUs
counts as that many units, placed together where they fit). The policy remembers which nodes each
job held after its last decision (`BFTrainerState`): a job that lost a node was stopped by
placement and is queued again, and its remaining nodes are what the MILP's no-migration and
rescale-cost terms start from.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Annotated, Literal

import numpy as np
from msgspec import Meta, Struct

from gpuyard.shared.model import ANY_GPU, Allocation
from gpuyard.shared.policy import JobView, Needs, SchedulingInput, SchedulingPolicy

from .milp import Problem, equal_share, node_map, reference_step, solve_milp


class BFTrainerState(Struct, kw_only=True):
    nodes: dict[str, list[str]] = {}
    """The nodes each job held after the last decision (a node once per GPU)."""
    decided: bool = False
    """A decision was made (`reference_step` spares the first)."""


class EqualShareParams(Struct, forbid_unknown_fields=True):
    max_jobs: Annotated[int, Meta(ge=1)] = 10
    """At most this many jobs run at once, the first in admission order (BFTrainer's maxJ)."""


class BFTrainerParams(EqualShareParams, forbid_unknown_fields=True):
    tfwd: Annotated[float, Meta(ge=0)] = 10.0
    """Forward-looking time (s): the MILP weighs Tfwd x throughput against the rescale costs."""
    time_limit_s: Annotated[float, Meta(gt=0)] = 10.0
    """The solver's time limit per decision; with no solution by then, the allocation stays."""
    solver: Literal["cp_sat", "scip", "highs"] = "cp_sat"
    """OR-Tools backend (single-threaded, fixed seed: deterministic)."""
    table_cells: Annotated[int, Meta(ge=0)] = 2_000_000
    """Find the MILP's optimum by dynamic programming over node counts (exact; `milp.best_counts`)
    when its table has at most this many cells (job sizes x idle nodes the jobs can take), the
    solver otherwise; 0: always the solver. A solver's fixed cost per call (~6 ms for CP-SAT)
    is most of a decision's time on small problems."""
    reference_step: bool = False
    """Solve the reference's MILP as it is, big-M flaw included: a job grows or shrinks by at
    most (idle nodes + 1) / 2 at one event (`milp.reference_step`, docs/fidelity.md); the first
    decision is spared, as the reference's initial map does not come from its MILP."""


class EqualShare(SchedulingPolicy):
    """Equal shares of the idle nodes, leftovers first come first served, no migration.

    Registry name `bftrainer-equal`: the reference's heuristic baseline (`re_allocate_ndf`)."""

    Params = EqualShareParams
    State = BFTrainerState
    needs = Needs(nodes=True, decide_on_exit=True, job_nodes=True)

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self._nodes: dict[str, list[str]] = {}
        self._decided = False

    def snapshot(self) -> BFTrainerState:
        return BFTrainerState(
            nodes={j: list(n) for j, n in self._nodes.items()}, decided=self._decided
        )

    def restore(self, state: BFTrainerState) -> None:
        self._nodes = {j: list(n) for j, n in state.nodes.items()}
        self._decided = state.decided

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        slots = [n.node_id for n in inp.cluster.nodes if n.up for _ in range(n.num_gpus)]
        queue = inp.jobs[: self.params.max_jobs]
        current = self._current(queue, slots)
        held = [node for nodes in current for node in nodes]
        free = _minus(slots, held)
        gpu_type = inp.cluster.types[0] if inp.cluster.types else ANY_GPU
        problem = _problem(queue, current, len(slots), gpu_type)
        counts = self.counts(problem)
        self._decided = True
        mapping = node_map(current, counts, free)
        self._nodes = {j.job_id: nodes for j, nodes in zip(queue, mapping, strict=True) if nodes}
        return [
            Allocation(j.job_id, len(nodes), ANY_GPU, nodes=sorted(set(nodes)))
            for j, nodes in zip(queue, mapping, strict=True)
            if nodes
        ]

    def counts(self, problem: Problem) -> np.ndarray:
        return equal_share(problem)

    def _current(self, queue: Sequence[JobView], slots: list[str]) -> list[list[str]]:
        """The nodes each queued job holds now: what it runs on, or, for a job stopped because
        a node of its was taken back, what it held less the nodes that left."""
        pool = Counter(slots)  # what is still up and not claimed by a job before
        current: list[list[str]] = []
        for job in queue:
            if job.running and job.nodes and set(job.nodes) != set(self._nodes.get(job.job_id, ())):
                mine = [n for n in job.nodes for _ in range(max(job.gpus // len(job.nodes), 1))]
            else:
                mine = self._nodes.get(job.job_id, [])
            kept = []
            for node in mine:
                if pool[node] > 0:
                    pool[node] -= 1
                    kept.append(node)
            current.append(kept)
        return current


class BFTrainer(EqualShare):
    """BFTrainer's MILP (`milp.solve_milp`): maximise Tfwd x throughput less rescale costs.

    Registry name `bftrainer`. The solve runs off the scheduler's event loop (the scheduler moves
    a policy to a thread once a decision takes long); with no solution within `time_limit_s` the
    allocation stays as it is (jobs that fell below their minimum stop)."""

    Params = BFTrainerParams
    MEMO_SIZE = 4096

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        # Replays meet the same problem again and again (half the events of the 64-node one):
        # a solve is deterministic, so its answer is kept (not state: it changes no decision).
        self._memo: OrderedDict[bytes, np.ndarray] = OrderedDict()

    def counts(self, problem: Problem) -> np.ndarray:
        p = self.params
        if p.reference_step and self._decided:  # (its first map is not the MILP's)
            problem = dataclasses.replace(problem, max_step=reference_step(problem.nodes))
        key = problem.key()
        if (known := self._memo.get(key)) is not None:
            self._memo.move_to_end(key)
            return known.copy()
        outcome = solve_milp(
            problem, tfwd=p.tfwd, time_limit_s=p.time_limit_s, solver=p.solver,
            table_cells=p.table_cells,
        )  # fmt: skip
        if outcome.solved:  # (a timed-out solve may succeed another time)
            self._memo[key] = outcome.counts
            if len(self._memo) > self.MEMO_SIZE:
                self._memo.popitem(last=False)
        return outcome.counts.copy()


def _problem(
    queue: Sequence[JobView], current: list[list[str]], nodes: int, gpu_type: str
) -> Problem:
    top = [min(j.spec.gpu_range[1], nodes) for j in queue]
    return Problem(
        nodes=nodes,
        jmin=np.array([j.spec.gpu_range[0] for j in queue], dtype=np.int64),
        jmax=np.array([j.spec.gpu_range[1] for j in queue], dtype=np.int64),
        current=np.array([len(c) for c in current], dtype=np.int64),
        rates=[
            np.array([0.0, *(j.rate(gpu_type, k) for k in range(1, t + 1))])
            for j, t in zip(queue, top, strict=True)
        ],
        up_s=np.array([j.spec.rescale_up_s for j in queue], dtype=np.float64),
        down_s=np.array([j.spec.rescale_down_s for j in queue], dtype=np.float64),
        done=np.array([j.steps_done for j in queue], dtype=np.float64),
    )


def _minus(slots: list[str], taken: list[str]) -> list[str]:
    """`slots` less `taken` (as multisets), in `slots`' order."""
    out = Counter(taken)
    left = []
    for node in slots:
        if out.get(node, 0) > 0:
            out[node] -= 1
        else:
            left.append(node)
    return left

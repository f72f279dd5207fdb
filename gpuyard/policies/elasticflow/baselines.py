"""The baselines of ElasticFlow's paper as its simulator runs them: Themis (finish-time fairness)
and Gandiva (time slicing on node sets of same-size jobs). Both run jobs at the GPU count they
asked for (`num_gpus`); Tiresias (`dlas-gpu`) is the `tiresias` policy with ElasticFlow's
thresholds, and Chronus is in `chronus`.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from msgspec import Struct

from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import JobView, Needs, SchedulingInput, SchedulingPolicy

from .demand import main_type

# --------------------------------------------------------------------------- Themis


class Accrued(Struct, array_like=True):
    """A job's finish-time-fairness bookkeeping at the last decision."""

    remaining: float
    """Its remaining steps then."""
    isolated_rate: float
    """What its isolated share was worth then (see ThemisParams.isolated)."""
    isolated_time: float
    """The isolated time it has accrued (C_j)."""


class ThemisState(Struct, kw_only=True):
    jobs: dict[str, Accrued] = {}


class ThemisParams(Struct, forbid_unknown_fields=True):
    isolated: Literal["reference", "throughput"] = "reference"
    """A job's isolated finish time (the yardstick of its fairness ratio): `reference` as
    ElasticFlow's code computes it, remaining steps over its isolated *share* of time
    (min(ceil(GPUs / jobs) / its GPUs, 1)), so that a faster job looks more patient; `throughput`
    as Themis and Gavel mean it, over the throughput that share gives."""


class Themis(SchedulingPolicy):
    """Themis as ElasticFlow's simulator runs it: finish-time fairness, rigid jobs.

    Registry name `themis`. Every decision solves the finish-time-fairness program of the Gavel
    family (`gavel.programs.finish_time_fairness`: minimise the largest ratio of a job's expected
    finish time under the allocation X to its isolated finish time) over the active jobs at
    their requested GPU counts on the cluster's GPU type, then runs jobs in descending X, each if
    its GPUs fit (ElasticFlow's priorities divide X by rounds received, a counter it never
    increments: the order is X's). It decides again every round while jobs wait (ElasticFlow's
    Themis is round-based: run it with `--mode rounds`; `--elasticflow` counts the rounds from
    the first arrival and ends jobs at the end of their slot, as ElasticFlow does).

    The isolated finish time is C_j + R_j / iso_j with C_j the isolated time accrued so far
    (C_j += (R_j before - R_j now) / iso_j before, as ElasticFlow keeps it). ElasticFlow's iso_j
    is a share of time, not steps/s (`ThemisParams.isolated`); the program takes the throughput
    form, so the reference's denominator is passed through C_j (C'_j = C_j + R_j / share_j -
    R_j / iso_j, at least 0).
    """

    Params = ThemisParams
    State = ThemisState
    needs = Needs(throughputs=True)

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.accrued: dict[str, Accrued] = {}

    def snapshot(self) -> ThemisState:
        return ThemisState(jobs=dict(self.accrued))

    def restore(self, state: ThemisState) -> None:
        self.accrued = dict(state.jobs)

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        from gpuyard.policies.gavel.programs import finish_time_fairness, isolated_throughputs

        gpu_type, total = main_type(inp.cluster)
        jobs: list[JobView] = []
        rates: list[float] = []
        for j in inp.jobs:
            rate = j.rate(gpu_type, j.spec.num_gpus)
            left = j.remaining_steps
            if rate > 0 and left is not None and left > 0 and j.spec.num_gpus <= total:
                jobs.append(j)
                rates.append(rate)
        live = {j.job_id for j in jobs}
        self.accrued = {k: v for k, v in self.accrued.items() if k in live}
        if not jobs:
            return []
        n = len(jobs)
        sf = np.array([j.spec.num_gpus for j in jobs], dtype=float)
        throughputs = np.array(rates)[:, None]
        remaining = np.array([j.remaining_steps for j in jobs], dtype=float)
        iso = isolated_throughputs(throughputs, sf, np.array([float(total)]))
        share = np.minimum(math.ceil(total / n) / sf, 1.0)
        yardstick = share if self.params.isolated == "reference" else iso
        accrued = np.zeros(n)
        for i, j in enumerate(jobs):
            before = self.accrued.get(j.job_id)
            if before is not None and before.isolated_rate > 0:
                accrued[i] = (
                    before.isolated_time + (before.remaining - remaining[i]) / before.isolated_rate
                )
        elapsed = np.array([max(inp.now - j.submit_time, 0.0) for j in jobs])
        passed = accrued
        if self.params.isolated == "reference":
            passed = np.maximum(accrued + remaining / share - remaining / iso, 0.0)
        x = finish_time_fairness(
            throughputs, sf, np.ones(n), np.array([float(total)]), remaining, elapsed,
            isolated_time_elapsed=passed,
        ).shares[:, 0]  # fmt: skip
        self.accrued = {
            j.job_id: Accrued(float(remaining[i]), float(yardstick[i]), float(accrued[i]))
            for i, j in enumerate(jobs)
        }
        order = sorted(range(n), key=lambda i: (-round(float(x[i]), 9), jobs[i].seq))
        free = total
        chosen: list[Allocation] = []
        for i in order:
            if free <= 0:
                break
            need = jobs[i].spec.num_gpus
            if need <= free:
                chosen.append(Allocation(jobs[i].job_id, need, gpu_type))
                free -= need
        return chosen

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        waiting = any(not j.running for j in inp.jobs)
        return inp.now + inp.cluster.round_s if waiting else None


# --------------------------------------------------------------------------- Gandiva


class GandivaParams(Struct, forbid_unknown_fields=True):
    pass


class Gandiva(SchedulingPolicy):
    """Gandiva's time slicing on node sets of same-size jobs, as ElasticFlow compares against it.

    Registry name `gandiva-ts`. Jobs run at their requested GPU count, grouped by it. Each group
    gets node sets (ceil(size / node) nodes each, holding node GPUs / size jobs at once when
    smaller than a node) in proportion to its GPU demand (jobs x size), never more than it can
    use; whole nodes left over give a set to each group without one, then go to the groups with
    the most unmet demand. Inside a group, more
    jobs than its sets hold share them by time slicing: every decision the jobs that waited take
    the place of those that ran longest since they last started (round robin, one slot a turn).
    Decisions come at events, at most once a slot (the scheduler's `slots` mode), and
    every slot while a group time-slices.

    ElasticFlow's own Gandiva (`gandiva-ef`, what `--elasticflow --policy gandiva` runs) resizes
    node sets at every event by a rule that counts a set as one GPU per job of the group and
    switches jobs only at events that fall on a whole minute; this is the behaviour those rules
    aim at (`elasticflow_options(as_intended=True)`).
    """

    Params = GandivaParams
    needs = Needs(nodes=True)

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self._slicing = False

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        gpu_type, total = main_type(inp.cluster)
        node = max(
            (n.num_gpus for n in inp.cluster.nodes if n.up and n.gpu_type == gpu_type),
            default=total,
        )
        node = max(node, 1)
        groups: dict[int, list[JobView]] = {}
        for j in inp.jobs:
            size = j.spec.num_gpus
            if 0 < size <= total and j.rate(gpu_type, size) > 0:
                groups.setdefault(size, []).append(j)
        sets = _node_sets(groups, node, total // node)
        chosen: list[Allocation] = []
        self._slicing = False
        for size in sorted(groups, reverse=True):
            jobs = groups[size]
            per_set = max(node // size, 1)
            room = sets.get(size, 0) * per_set
            self._slicing |= len(jobs) > room
            # Waiting jobs first (longest waiting first), then running ones, those that started
            # last first: those that ran longest since their start give way.
            order = sorted(
                jobs,
                key=lambda j: (
                    (1, -(j.record.run_start), j.seq)
                    if j.running
                    else (0, j.queued_since or j.submit_time, j.seq)
                ),
            )
            chosen += [Allocation(j.job_id, size, gpu_type) for j in order[:room]]
        return chosen

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        return inp.now + inp.cluster.round_s if self._slicing else None


def _node_sets(groups: dict[int, list[JobView]], node: int, nodes: int) -> dict[int, int]:
    """Node sets per group size: in proportion to GPU demand, capped by what the group can use;
    the whole nodes left over first give a set to each group that has none, then go to the
    groups with the most unmet demand (ties: larger jobs first)."""
    span = {s: math.ceil(s / node) for s in groups}  # nodes per set
    hold = {s: max(node // s, 1) for s in groups}  # jobs per set
    need = {s: math.ceil(len(js) / hold[s]) for s, js in groups.items()}
    demand = {s: len(js) * s for s, js in groups.items()}
    total = sum(demand.values())
    sets = (
        {s: min(need[s], int(demand[s] / total * nodes) // span[s]) for s in groups}
        if total
        else {}
    )
    left = nodes - sum(sets[s] * span[s] for s in sets)
    for s in sorted(groups, key=lambda s: (-demand[s], -s)):  # every group a set, if any is left
        if sets[s] == 0 and span[s] <= left:
            sets[s] = 1
            left -= span[s]
    while left > 0:
        short = [s for s in groups if sets[s] < need[s] and span[s] <= left]
        if not short:
            break
        s = max(short, key=lambda s: ((need[s] - sets[s]) * hold[s] * s, s))
        sets[s] += 1
        left -= span[s]
    return sets

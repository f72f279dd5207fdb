"""Gandiva as ElasticFlow's simulator runs it (`gandiva_sim_jobs` with `--scheme=gandiva`), quirks
included: the baseline behind the paper's Gandiva figures. `gandiva-ts` (in `baselines`) does
what this code aims at.

ElasticFlow's Gandiva keeps *node sets*: whole nodes (one for a job of a node or less, ceil(size /
node) otherwise) that hold jobs of one size, `capacity` = GPUs of the set / size of them at once.
Its loop runs at *iterations*: at every arrival event (arrivals within a slot of the last
iteration wait until that slot ends, merged, except the very last one) and, once every job has
arrived, every slot. Nothing happens between two iterations: a job that finishes keeps its GPUs
idle until the next one. An iteration, in the reference's order:

1. resizes the node sets (`adjust`), which decides who ran since the last iteration;
2. takes the jobs that finished out of their sets; at an iteration on a whole minute (only
   there), a set with more jobs than its capacity sends the jobs that ran to the back of its
   list (the others take their turn); a set left empty gives its nodes back;
3. places the arrivals, one at a time, in arrival order (`place`); a job that finds no set
   waits (pending), and the pending jobs are tried again when a set gave its nodes back.

The first `capacity` jobs of each set run until the next iteration. Step 1 of the next iteration
depends only on the sets as step 3 leaves them, so this policy resizes at the end of each
iteration, so that what it runs until the next iteration is what the reference credits.

The reference's quirks, kept: `adjust` counts a set of a size's group as one GPU per job of the
group (a group of small jobs grabs every free node, and at the next iteration shrinks to one
set); its expansion re-spreads the group's jobs over its sets unless its last new set was of one
node (the loop variable is reused by an inner loop), and a set left empty is freed at once; a
set's load (`util`, one per job since it was last re-spread) never drops when jobs end; a set
takes a job only while its load stays below its capacity (so a 1-node set of 1-GPU jobs opens a
new node at its 8th job); a job that finds no room goes to the set after the least loaded one
when the least loaded one was full; and retrying the pending jobs skips the job after each one
that starts (it removes from the list it walks).
"""

from __future__ import annotations

import math
from typing import Annotated

from msgspec import Meta, Struct

from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import Needs, SchedulingInput, SchedulingPolicy

from .demand import main_type


class GandivaEfParams(Struct, forbid_unknown_fields=True):
    last_arrival: float | None = None
    """When the workload's last job arrives: ElasticFlow's loop runs at arrivals only until then,
    and every slot after it. None (unknown, as on a real cluster): every slot throughout.
    `gpuyard sim --elasticflow` sets it from the trace."""
    switch_period_s: Annotated[float, Meta(gt=0)] = 60.0
    """Jobs take turns only at iterations whose time is a multiple of this (ElasticFlow: `int(t
    % 60) == 0`); iterations elsewhere leave each set's order as it is."""


class NodeSet(Struct, array_like=True):
    """A node set: its nodes, the jobs it holds at once, its load count and its jobs in turn
    order (the first `capacity` run)."""

    nodes: list[str]
    capacity: int
    util: int
    jobs: list[str]


class GandivaEfState(Struct, kw_only=True):
    free: list[str] = []
    """Free nodes, in the order the reference's list has them."""
    sets: dict[int, list[NodeSet]] = {}
    """Each job size's node sets, in list order."""
    pending: list[str] = []
    """Jobs that found no set, in the order they are tried again."""
    last_iteration: float | None = None


class GandivaEf(SchedulingPolicy):
    """Registry name `gandiva-ef`: Gandiva as ElasticFlow's simulator runs it (module docstring).

    Decides at events (`mode="events"`, every arrival and completion): an event that is not an
    iteration of the reference's loop leaves every set as it is (finished jobs' GPUs stay idle),
    and the policy asks to be woken at the next iteration that no arrival brings (a merged
    event's slot end; every slot after the last arrival). Jobs run at their requested size, with
    their set's nodes as a placement hint. One GPU type (the one with the most GPUs) and the
    nodes present at the first decision.
    """

    Params = GandivaEfParams
    State = GandivaEfState
    needs = Needs(nodes=True)

    def __init__(self, params: Struct | None = None) -> None:
        super().__init__(params)
        self.state = GandivaEfState()

    def snapshot(self) -> GandivaEfState:
        return self.state

    def restore(self, state: GandivaEfState) -> None:
        self.state = state

    # ------------------------------------------------------------------ decisions

    def schedule(self, inp: SchedulingInput) -> list[Allocation]:
        gpu_type, total = main_type(inp.cluster)
        nodes = [n for n in inp.cluster.nodes if n.up and n.gpu_type == gpu_type]
        node_gpus = max((n.num_gpus for n in nodes), default=0)
        state = self.state
        if state.last_iteration is None and not state.free and not state.sets:
            state.free = [n.node_id for n in nodes]
        due = self._next_iteration(inp)
        if due is not None and due <= inp.now and node_gpus > 0:
            self._iterate(inp, node_gpus, total)
        return self._running(inp, gpu_type)

    def next_decision_time(self, inp: SchedulingInput) -> float | None:
        due = self._next_iteration(inp)
        return due if due is not None and due > inp.now else None

    def _next_iteration(self, inp: SchedulingInput) -> float | None:
        """When the reference's loop next runs an iteration, as far as the jobs seen so far
        tell (None: at the next arrival)."""
        state = self.state
        known = self._known()
        arrivals = [j.submit_time for j in inp.jobs if j.job_id not in known]
        last = state.last_iteration
        if last is None:
            return min(arrivals, default=None)
        slot = inp.cluster.round_s
        final = self.params.last_arrival
        times: list[float] = []
        if arrivals:
            first = min(arrivals)
            # An arrival more than a slot after the last iteration is an event at its own time,
            # as is the run's very last one (the reference merges events only while two are
            # left); the others wait for the slot's end, merged.
            times.append(first if int(first - last) > slot or first == final else last + slot)
        stepping = final is None or last >= final  # every job has arrived: every slot
        if stepping and any(j.job_id in known for j in inp.jobs):
            times.append(last + slot)
        return min(times, default=None)

    def _known(self) -> set[str]:
        state = self.state
        known = set(state.pending)
        for sets in state.sets.values():
            for node_set in sets:
                known.update(node_set.jobs)
        return known

    def _running(self, inp: SchedulingInput, gpu_type: str) -> list[Allocation]:
        """The first `capacity` jobs of every set (a finished one keeps its place, idle, until
        the next iteration)."""
        active = {j.job_id for j in inp.jobs}
        chosen: list[Allocation] = []
        for size in sorted(self.state.sets):
            for node_set in self.state.sets[size]:
                for job_id in node_set.jobs[: node_set.capacity]:
                    if job_id in active:
                        chosen.append(
                            Allocation(job_id, size, gpu_type, nodes=list(node_set.nodes))
                        )
        return chosen

    # ------------------------------------------------------------------ an iteration

    def _iterate(self, inp: SchedulingInput, node_gpus: int, total: int) -> None:
        state = self.state
        known = self._known()
        active = {j.job_id for j in inp.jobs}
        turn = int(inp.now % self.params.switch_period_s) == 0
        released = False
        for size in sorted(state.sets):
            kept: list[NodeSet] = []
            for node_set in state.sets[size]:
                ran = min(len(node_set.jobs), node_set.capacity)
                if turn and len(node_set.jobs) > ran:
                    node_set.jobs = node_set.jobs[ran:] + node_set.jobs[:ran]
                node_set.jobs = [j for j in node_set.jobs if j in active]
                if node_set.jobs:
                    kept.append(node_set)
                else:
                    state.free += node_set.nodes
                    released = True
            state.sets[size] = kept
        state.pending = [j for j in state.pending if j in active]
        arrivals = sorted(
            (j for j in inp.jobs if j.job_id not in known), key=lambda j: (j.submit_time, j.seq)
        )
        sizes = {j.job_id: j.spec.num_gpus for j in inp.jobs}
        for job in arrivals:
            if not self._place(job.job_id, sizes[job.job_id], node_gpus):
                state.pending.append(job.job_id)
        if released:
            # The reference removes a job that starts from the list it walks: the next one is
            # skipped.
            i = 0
            while i < len(state.pending):
                job_id = state.pending[i]
                if self._place(job_id, sizes[job_id], node_gpus):
                    del state.pending[i]
                i += 1
        self._adjust(node_gpus, total)
        state.last_iteration = inp.now

    def _place(self, job_id: str, size: int, node_gpus: int) -> bool:
        """`gandiva_placement`: the least loaded set of the job's size if its load stays below
        its capacity, else a new set on the first free nodes, else (time slicing) the set first
        in line, else nowhere (False)."""
        sets = self.state.sets.setdefault(size, [])
        if sets:
            first = sets.pop(0)
            if first.util + 1 < first.capacity:
                _add(sets, first, job_id)
                return True
            sets.append(first)
        span = math.ceil(size / node_gpus)
        free = self.state.free
        if span <= len(free):
            new = NodeSet(free[:span], span * node_gpus // size, 1, [job_id])
            del free[:span]
            sets.append(new)
            sets.sort(key=_load)
            return True
        if sets:
            _add(sets, sets.pop(0), job_id)
            return True
        return False

    def _adjust(self, node_gpus: int, total: int) -> None:
        """`gandiva_node_set_adjust`: each size's GPUs in proportion to its demand (jobs x size),
        at most that demand, against what its sets occupy (whole nodes), a set counted as
        `size` GPUs when it grows or shrinks."""
        sets = self.state.sets
        demand = {s: sum(len(x.jobs) for x in sets[s]) * s for s in sorted(sets)}
        occupied = {s: sum(len(x.nodes) for x in sets[s]) * node_gpus for s in sorted(sets)}
        all_demand = sum(demand.values())
        if all_demand == 0:
            return
        for size in sorted(sets):
            if demand[size] == 0:
                continue
            target = min(math.floor((demand[size] / all_demand) * total), demand[size])
            diff = target - occupied[size]
            if diff > 0:
                self._expand(size, math.ceil(diff / size), node_gpus)
            elif diff < 0:
                self._shrink(size, math.ceil(-diff / size))

    def _expand(self, size: int, count: int, node_gpus: int) -> None:
        """New empty sets on free nodes, while they last; then the group's jobs are spread over
        its sets again, least loaded first, unless the last new set was of a single node (the
        reference's loop variable, reused by its inner loop, is then 0). Empty sets are freed at
        the next iteration."""
        sets, free = self.state.sets[size], self.state.free
        span = math.ceil(size / node_gpus)
        made_last = False
        for _ in range(count):
            made_last = span <= len(free)
            if made_last:
                sets.append(NodeSet(free[:span], span * node_gpus // size, 0, []))
                del free[:span]
        if made_last and span == 1:
            return
        jobs: list[str] = []
        for node_set in sets:
            if node_set.jobs:
                jobs += node_set.jobs
                node_set.jobs, node_set.util = [], 0
        for job_id in jobs:
            _add(sets, sets[0], job_id, popped=False)

    def _shrink(self, size: int, count: int) -> None:
        """The first sets of the group give their nodes back (one set always stays); their jobs
        go one by one to the least loaded set."""
        sets = self.state.sets[size]
        count = min(count, len(sets) - 1)
        if count <= 0:
            return
        jobs: list[str] = []
        for _ in range(count):
            gone = sets.pop(0)
            jobs += gone.jobs
            self.state.free += gone.nodes
        for job_id in jobs:
            _add(sets, sets[0], job_id, popped=False)


def _load(node_set: NodeSet) -> int:
    return node_set.util


def _add(sets: list[NodeSet], node_set: NodeSet, job_id: str, *, popped: bool = True) -> None:
    """Give `job_id` to `node_set` (taken off the front of `sets` if `popped`: it goes back at
    the end) and sort the sets by load, stably, as the reference does."""
    node_set.util += 1
    node_set.jobs.append(job_id)
    if popped:
        sets.append(node_set)
    sets.sort(key=_load)

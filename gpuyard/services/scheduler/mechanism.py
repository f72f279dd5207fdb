"""Round mechanisms: how the scheduler turns a policy's decision into what runs now.

`AllocationsMechanism` runs the decision's allocations as they are (event-driven policies: FIFO,
LAS, Tiresias, ...). `TimeShareMechanism` is Gavel's round-based mechanism: the policy says which
fraction of time each job (or pair of jobs sharing GPUs) should spend on each GPU type, and every
round the mechanism picks what runs so that the time each receives tracks those fractions:

- time received is counted per job (pair) and GPU type since the last reset, each job starting
  with `initial_credit_rounds` of a round on every type (Gavel credits half a round);
- priority[j, k] = X[j, k] / (j's share of the time type k was used since the reset), X[j, k] x 1e9
  when j has not run on k yet, 0 where j cannot run on k;
- each round, per GPU type in order, the (job, type) entries are taken in descending (priority,
  deficit, X) order while GPUs of that type are left, each job at most once;
- a job that arrived since the last allocation waits for one that includes it: as in Gavel, it
  takes its place in the walk (priority 0) but gets no GPUs, which stay idle that round
  (`new_jobs_wait`);
- the policy is asked again when jobs came or went, at most every `min_resolve_s` (Gavel: 1920 s);
  on a real cluster, whose scheduler learns throughputs from progress reports, also when it
  learned something since the last decision (`resolve_on_learning`; Gavel re-solves on arrivals
  and completions only, so what it learns waits for the next of those);
  a new allocation resets the counts, carrying each job's deficit X * elapsed - received;
- allocations are handed to placement largest first, and a job that keeps its type and GPU count
  keeps its GPUs (placement's lease extension).

A policy chooses its mechanism (`SchedulingPolicy.mechanism`). Mechanisms keep their state in a
Struct that the scheduler stores with the jobs, so a restarted scheduler goes on identically.
"""

from __future__ import annotations

import random
from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from gpuyard.shared.model import Allocation, JobRecord
from gpuyard.shared.policy import Decision, SchedulingInput

PAIR = "+"
"""Joins two job ids into a pair key (job ids never contain it)."""
UNSEEN_PRIORITY = 1e9
"""Gavel's stand-in for 'no time received yet' (large, but finite so that 2x it is larger)."""


class TimeShareConfig(Struct, kw_only=True, forbid_unknown_fields=True):
    min_resolve_s: Annotated[float, Meta(ge=0)] = 1920.0
    """Ask the policy again (when jobs came or went) at most this often (Gavel: 1920 s)."""
    resolve_on_learning: bool = True
    """A learning throughput model (real clusters) that learned since the last decision counts as
    a change, as an arrival or a completion does: the allocation follows the measured rates
    within `min_resolve_s` even when no job comes or goes. Simulations do not learn."""
    initial_credit_rounds: Annotated[float, Meta(ge=0)] = 0.5
    """Time credited to every job on every type at its arrival and at each reset, in rounds."""
    global_queue: bool = False
    """Sort the entries of all GPU types together (Gavel's `--enable_global_queue`) rather than
    type by type."""
    credit_whole_steps: bool = False
    """Credit a running job, for each round, the time its whole steps of the round take at its
    rate, `int(rate * round) / rate` (Gavel's simulator, whose micro-tasks run whole steps and
    credit each job the time its own took), rather than the time since the last round. The
    difference is a fraction of a second a round, and it orders jobs of equal allocations."""
    reset_on_decision: bool = True
    """A new allocation resets the time counts, carrying each job's deficit (Gavel); False: each
    job's time received accumulates from its arrival and deficits stay 0 (the Gavel of Sia's
    artifact, whose reset is commented out)."""
    new_jobs_wait: bool = True
    """A job that arrived since the last allocation runs once an allocation includes it, as in
    Gavel (whose round walk counts it but then gives it no workers, so the GPUs it was counted
    on stay idle); False: it may run meanwhile on GPUs the allocated jobs leave free."""


class AllocationsMechanism:
    """Run the policy's allocations as they are."""

    def wants_decision(self, now: float, changed: bool) -> bool:
        return True

    def allocations(self, decision: Decision | None, inp: SchedulingInput) -> list[Allocation]:
        return decision.allocations if decision is not None else []

    def next_round(self, now: float, round_s: float, active: bool) -> float | None:
        return None

    def snapshot(self) -> Struct | None:
        return None

    def restore(self, data: bytes) -> None:
        pass


class TimeShareState(Struct, kw_only=True):
    shares: dict[str, dict[str, float]] = {}
    """The policy's X per job, or pair key `a+b` (space sharing), and GPU type."""
    received: dict[str, dict[str, float]] = {}
    """Seconds each job (pair) ran on each type since the last reset, initial credit included."""
    type_time: dict[str, float] = {}
    """Seconds of all jobs on each type since the last reset (the denominators)."""
    deficits: dict[str, dict[str, float]] = {}
    last_reset: float | None = None
    last_round: float | None = None
    only_allocated: bool = False
    shuffle_types: bool = False
    """The decision's flags (see `Decision`)."""
    allocated: list[str] | None = None
    """The jobs the last allocation was computed for (None: not known, every job counts)."""


class TimeShareMechanism:
    """Gavel's round-based mechanism (module docstring)."""

    def __init__(self, config: TimeShareConfig, round_s: float) -> None:
        self.config = config
        self.round_s = round_s
        self.state = TimeShareState()

    # ------------------------------------------------------------------ the scheduler's hooks

    def wants_decision(self, now: float, changed: bool) -> bool:
        last = self.state.last_reset
        # As Gavel's `_update_priorities`: a reset at time 0 counts as none (its
        # `_last_reset_time == 0` test), so a trace starting at 0 re-solves at its next change.
        return last is None or (changed and (now - last >= self.config.min_resolve_s or last == 0))

    def next_round(self, now: float, round_s: float, active: bool) -> float | None:
        """Rounds come every `round_s` while jobs are active."""
        if not active:
            return None
        last = self.state.last_round
        return now if last is None else max(last + round_s, now)

    def snapshot(self) -> Struct:
        return self.state

    def restore(self, data: bytes) -> None:
        self.state = msgspec.json.decode(data, type=TimeShareState)

    def allocations(self, decision: Decision | None, inp: SchedulingInput) -> list[Allocation]:
        now, state = inp.now, self.state
        self._account(inp)
        live = {j.job_id for j in inp.jobs}
        gone = [
            k for k in state.received
            if (k not in live if PAIR not in k else not live.issuperset(k.split(PAIR)))
        ]  # fmt: skip
        for key in gone:
            state.received.pop(key)
            state.deficits.pop(key, None)
        credit = self.config.initial_credit_rounds * self.round_s
        types = list(inp.cluster.capacity)
        for job_id in live:
            if job_id not in state.received:  # a new job: credited on every type
                state.received[job_id] = dict.fromkeys(types, credit)
                for t in types:
                    state.type_time[t] = state.type_time.get(t, 0.0) + credit
        if decision is not None:
            if self.config.reset_on_decision:
                self._reset(now, types, credit)
            else:
                state.last_reset = now
            state.shares = {**decision.shares}
            for (a, b), x in decision.pair_shares.items():
                state.shares[f"{a}{PAIR}{b}"] = x
            state.only_allocated = decision.only_allocated
            state.shuffle_types = decision.shuffle_types
            state.allocated = sorted(live)
        state.last_round = now
        return self._select(inp, types)

    # ------------------------------------------------------------------ steps

    def _account(self, inp: SchedulingInput) -> None:
        """Credit the time each running job (pair) ran since the last round."""
        state = self.state
        if state.last_round is None:
            return
        records = [j.record for j in inp.jobs]  # (the records' fields: this runs every round)
        sharing = {r.shares_with for r in records if r.shares_with}
        now, last_round = inp.now, state.last_round
        received, type_time = state.received, state.type_time
        by_id = {r.job_id: r for r in records} if self.config.credit_whole_steps else None
        for r in records:
            if r.state != "running" or r.gpu_type is None or r.job_id in sharing:
                continue
            ran = now - max(r.run_start, last_round)
            if ran <= 0:
                continue
            if by_id is not None:  # a pair's micro-task lasts as long as its longer half
                whole = self._whole_steps_s(r)
                if r.shares_with:
                    whole = max(whole, self._whole_steps_s(by_id.get(r.shares_with, r)))
                ran = min(ran, whole)
            key = f"{r.shares_with}{PAIR}{r.job_id}" if r.shares_with else r.job_id
            got = received.setdefault(key, {})
            got[r.gpu_type] = got.get(r.gpu_type, 0.0) + ran
            type_time[r.gpu_type] = type_time.get(r.gpu_type, 0.0) + ran

    def _whole_steps_s(self, record: JobRecord) -> float:
        """How long a round's whole steps take at the job's rate (Gavel's micro-task)."""
        rate = record.rate
        return int(rate * self.round_s) / rate if rate > 0 else self.round_s

    def _reset(self, now: float, types: list[str], credit: float) -> None:
        """A new allocation: carry each job's deficit, start counting afresh."""
        state = self.state
        elapsed = now - state.last_reset if state.last_reset is not None else 0.0
        for key, got in state.received.items():
            should = state.shares.get(key, {})
            deficit = state.deficits.setdefault(key, {})
            for t in types:
                received = got.get(t, 0.0) - credit
                deficit[t] = deficit.get(t, 0.0) + should.get(t, 0.0) * elapsed - received
            state.received[key] = dict.fromkeys(types, credit)
        state.type_time = {t: credit * len(state.received) for t in types}
        state.last_reset = now

    def _select(self, inp: SchedulingInput, types: list[str]) -> list[Allocation]:
        state = self.state
        by_id = {j.job_id: j.record for j in inp.jobs}
        if state.shuffle_types:  # seeded by the time: the same order after a restart
            types = list(types)
            random.Random(f"gpuyard-types:{inp.now!r}").shuffle(types)
        # Pairs are rare: a key is a job id or, with PAIR in it, a pair's.
        pairs: dict[str, tuple[str, ...]] = {}
        for key in state.shares:
            if PAIR in key:
                members = tuple(key.split(PAIR))
                if all(m in by_id for m in members):
                    pairs[key] = members
        known = (
            None
            if state.allocated is None or not self.config.new_jobs_wait
            else set(state.allocated)
        )
        model = inp.cluster.throughputs
        # (job type, GPUs) -> whether it runs on each of `types`, in their order this round
        runs: dict[tuple[str, int], list[bool]] = {}

        def runs_on(job: JobRecord) -> list[bool]:
            spec = job.spec
            k = (spec.job_type, spec.num_gpus)
            if (ok := runs.get(k)) is None:
                ok = runs[k] = [model.throughput(k[0], t, k[1]) > 0 for t in types]
            return ok

        # Entries (type's place, -priority, -deficit, -X, place in the walk, type, key): sorted as
        # tuples they come per type (or all types together: `global_queue`) in descending
        # (priority, deficit, X) order, ties in the order the walk met them.
        entries: list[tuple[int, float, float, float, int, str, str]] = []
        none: dict[str, float] = {}
        only_allocated, type_time = state.only_allocated, state.type_time
        used = [type_time.get(t, 0.0) for t in types]

        def enter(place: int, t: str, key: str, x: float, received: dict[str, float],
                  deficits: dict[str, float]) -> None:  # fmt: skip
            got = received.get(t, 0.0)
            priority = (
                x / (got / used[place]) if used[place] > 0 and got > 0 else x * UNSEEN_PRIORITY
            )
            entries.append((place, -priority, -deficits.get(t, 0.0), -x, len(entries), t, key))

        places = list(enumerate(types))
        for key, job in by_id.items():  # single jobs, in the input's order
            shares = state.shares.get(key, none)
            received = state.received.get(key, none)
            deficits = state.deficits.get(key, none)
            for (place, t), ok in zip(places, runs_on(job), strict=True):
                x = shares.get(t, 0.0)
                if ok and (x > 0 or not only_allocated):
                    enter(place, t, key, x, received, deficits)
        for key, (a, b) in pairs.items():  # then pairs, in the allocation's order
            shares = state.shares[key]
            received = state.received.get(key, none)
            deficits = state.deficits.get(key, none)
            first, second = by_id[a], by_id[b]
            for (place, t), ok_a, ok_b in zip(
                enumerate(types), runs_on(first), runs_on(second), strict=True
            ):
                x = shares.get(t, 0.0)
                if x <= 0 or not (ok_a and ok_b):
                    continue
                if min(model.colocated(first.spec.job_type, second.spec.job_type, t,
                                       first.spec.num_gpus)) <= 0:  # fmt: skip
                    continue  # a pair that cannot share this type (Gavel: 0 throughput) waits
                enter(place, t, key, x, received, deficits)
        if self.config.global_queue:
            entries.sort(key=lambda e: e[1:5])
        else:
            entries.sort()
        left = dict(inp.cluster.capacity)
        free = sum(n for n in left.values() if n > 0)
        taken: set[str] = set()
        chosen: list[tuple[int, str, str]] = []
        for *_, t, key in entries:
            if free <= 0:  # (every type is full: nothing further is taken)
                break
            pair = pairs.get(key)
            members = pair or (key,)
            if left.get(t, 0) <= 0 or (
                key in taken if pair is None else not taken.isdisjoint(pair)
            ):
                continue
            if pair is None:
                size = by_id[key].spec.num_gpus
            else:
                sizes = {by_id[m].spec.num_gpus for m in pair}
                if len(sizes) != 1:
                    continue  # only jobs of the same size share GPUs
                size = sizes.pop()
            if size > left[t]:
                continue
            left[t] -= size
            free -= size
            taken.update(members)
            job = by_id[members[0]]
            new = known is not None and not known.issuperset(members)
            if new and not (job.state == "running" and job.gpu_type == t):
                continue  # new since the allocation: counted, but no GPUs (lease aside)
            chosen.append((size, t, key))
        chosen.sort(key=lambda c: -c[0])  # largest first: placement keeps them on few servers
        out: list[Allocation] = []
        for size, t, key in chosen:
            lead, *rest = pairs.get(key) or (key,)
            out.append(Allocation(lead, size, t))
            out += [Allocation(other, size, t, share_with=lead) for other in rest]
        return out


def make_mechanism(
    kind: str, config: TimeShareConfig, round_s: float
) -> AllocationsMechanism | TimeShareMechanism:
    """The mechanism a policy asks for (`SchedulingPolicy.mechanism`)."""
    if kind == "time_shares":
        return TimeShareMechanism(config, round_s)
    return AllocationsMechanism()

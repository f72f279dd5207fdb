"""The waiting order (`toolkit.waiting`): SRTF and LAS kept from what changed decide as a sort
of every job would, told as what changes.

A small scheduler whose running jobs make progress drives them through hundreds of decisions
(arrivals of several priorities, preemptions, exits, steps reported for stopped jobs, a short
starvation guard, a throughput model replaced, a type's GPUs that come and go) and checks each
decision against the same policy handed no `changed`, which sorts every job.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from gpuyard.policies.blox import Las, LasParams, Srtf, SrtfParams
from gpuyard.policies.toolkit.starvation import next_starvation
from gpuyard.shared.model import ANY_GPU, Allocation, JobSpec
from gpuyard.shared.policy import Decision, SchedulingPolicy
from gpuyard.shared.throughput import LinearModel

from .test_standing import MiniScheduler, in_full, same_as_whole


class Progressing(MiniScheduler):
    """Running jobs progress at their rate; a stopped job's steps are settled when it stops."""

    def apply(self, allocations: list[Allocation]) -> None:
        allocated = {a.job_id: a for a in allocations}
        for view in self.views.values():
            r = view.record
            if r.state == "running" and r.job_id not in allocated:
                self._settle(view.record)
                r.state, r.gpus, r.gpu_type, r.rate = "queued", 0, None, 0.0
                r.queued_since = self.now
                self.changed[r.job_id] = None
        for a in allocations:
            view = self.views[a.job_id]
            r = view.record
            if r.state == "running":
                continue
            r.state, r.gpus, r.gpu_type = "running", a.num_gpus, a.gpu_type
            r.rate = view.rate(a.gpu_type, a.num_gpus) * self.rng.choice([0.5, 1.0, 1.0])
            r.run_start = r.progress_at = self.now
            r.queued_since = None
            self.changed[r.job_id] = None

    def hear_late_steps(self, amounts: list[float]) -> None:
        """Now and then a waiting job's steps, heard after it stopped (it changed)."""
        waiting = [v.record for v in self.views.values() if v.record.state == "queued"]
        if waiting and self.rng.random() < 0.2:
            record = self.rng.choice(waiting)
            record.steps_done += self.rng.choice(amounts)
            self.changed[record.job_id] = None

    def _settle(self, r) -> None:
        ran = self.now - r.run_start
        r.executed_time += ran
        r.gpu_seconds += ran * r.gpus
        r.steps_done += r.rate * (self.now - r.progress_at)
        r.run_start = r.progress_at = self.now


POLICIES = [
    pytest.param(lambda: Srtf(SrtfParams(starvation_s=900.0)), id="srtf-starving"),
    pytest.param(lambda: Srtf(SrtfParams(backfill=True, starvation_s=None)), id="srtf-backfill"),
    pytest.param(lambda: Srtf(), id="srtf-blox"),
    pytest.param(lambda: Las(LasParams(starvation_s=1200.0)), id="las-starving"),
    pytest.param(lambda: Las(LasParams(key="rounds", backfill=True)), id="las-rounds"),
]


@pytest.mark.parametrize("make", POLICIES)
@pytest.mark.parametrize("seed", [1, 2])
def test_kept_from_what_changed_it_decides_as_a_sort_of_every_job(make, seed) -> None:
    rng = random.Random(seed)
    sim = Progressing(rng, {"a": 24, "b": 16})
    fed: SchedulingPolicy = make()
    whole: SchedulingPolicy = make()
    keyed = active = told_changes = 0
    last: list[str] = []
    for step in range(400):
        sim.step()
        sim.hear_late_steps([1.0, 50.0])
        if step % 97 == 50:  # nodes come or go (running jobs may hold more than there is)
            gpus = rng.choice([0, 8, 16, 24])
            if gpus:
                sim.capacity["b"] = gpus
            else:  # (the type's last node went)
                sim.capacity.pop("b", None)
        if step == 200:  # another model: every waiting job's rate may differ
            sim.model = LinearModel({"a": 0.5, "b": 2.0, ANY_GPU: 0.7})
            sim.context.model = sim.model
        if step > 0 and rng.random() < 0.3:  # asked with no decision taken since the last
            unheard = sim.input(fed=True)
            assert fed.order.next_starvation(unheard) == next_starvation(  # type: ignore[attr-defined]
                unheard.jobs,
                sim.now,
                fed.params.starvation_s,  # type: ignore[attr-defined]
            ), f"before decision {step}"
        expected = whole.schedule(sim.input(fed=False))
        assert isinstance(expected, list)
        inp = sim.input(fed=step > 0)
        decision = fed.schedule(inp)
        sim.changed.clear()
        if isinstance(decision, Decision):
            told_changes += 1
            got = same_as_whole(decision, expected, last, sim.views, step)
        else:
            assert step == 0  # (told nothing of what changed: every allocation)
            got = decision
            assert got == expected
        keyed += fed.order.keyed  # type: ignore[attr-defined]
        active += len(sim.views)
        last = [a.job_id for a in got]
        sim.apply(got)
        # When to decide again, asked as the scheduler does: the jobs as the decision left them.
        after = msgspec.structs.replace(inp, jobs=list(sim.views.values()))
        starvation_s = fed.params.starvation_s  # type: ignore[attr-defined]
        assert fed.order.next_starvation(after) == next_starvation(  # type: ignore[attr-defined]
            after.jobs, sim.now, starvation_s
        ), f"decision {step}"
    assert told_changes == 399
    # Most of the waiting jobs' keys were kept, not computed again.
    assert keyed < 0.5 * active, (keyed, active)


def test_without_changes_every_job_is_keyed() -> None:
    sim = Progressing(random.Random(5), {"a": 8})
    for _ in range(40):
        sim.arrive()
    policy = Srtf()
    assert policy.schedule(sim.input(fed=False))
    assert policy.order.keyed == 40


def test_a_job_a_rounding_away_from_starving_starves_at_the_next_decision() -> None:
    """At `queued_since + starvation_s` a job may not have waited `starvation_s` yet (floating
    point): asked when to decide again then, the order still keys it again at the next
    decision, where it moves up and preempts a running job."""
    since, starvation_s = 13436.424411240123, 3.3
    assert (since + starvation_s) - since < starvation_s  # (the rounding this is about)
    sim = Progressing(random.Random(1), {"a": 1})
    sim.now = since
    for _ in range(2):  # the first runs, the second (longer) waits
        sim.arrive()
    for i, view in enumerate(sim.views.values()):
        r = view.record
        r.spec = JobSpec(job_id=r.job_id, num_gpus=1, gpu_type="a", duration=100.0 * (i + 1))
    fed = Srtf(SrtfParams(starvation_s=starvation_s))
    decisions = []
    for now in (since, since + starvation_s, since + starvation_s + 1.0):
        sim.now = now
        inp = sim.input(fed=now > since)
        decision = fed.schedule(inp)
        expected = Srtf(SrtfParams(starvation_s=starvation_s)).schedule(sim.input(fed=False))
        sim.changed.clear()
        got = decision if isinstance(decision, list) else in_full(decision, ["j0"], sim.views)
        assert sorted(got, key=str) == sorted(expected, key=str), now  # type: ignore[arg-type]
        decisions.append(got)
        sim.apply(got)  # type: ignore[arg-type]
        fed.order.next_starvation(msgspec.structs.replace(inp, jobs=list(sim.views.values())))
    assert [[a.job_id for a in d] for d in decisions] == [["j0"], ["j0"], ["j1"]]

"""Tiresias kept from what changed: the waiting jobs sorted across decisions and their
promotions from a heap decide, promote and wake exactly as the walk over every job.

The waiting order's small scheduler (`toolkit/test_waiting.py`) drives each variant through
hundreds of decisions (arrivals, exits, preemptions across queues, promotions, steps heard for
stopped jobs, GPUs that come and go); a second policy handed no `changed` sorts every job at
every decision, and the two must agree on each decision, each promotion and each wake.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from gpuyard.policies.tiresias import (
    Tiresias,
    TiresiasGittins,
    TiresiasGittinsParams,
    TiresiasParams,
)
from gpuyard.shared.model import Allocation
from gpuyard.shared.policy import Decision

from ..toolkit.test_standing import in_full, same_as_whole
from ..toolkit.test_waiting import Progressing


class Started(Progressing):
    """Progressing jobs that remember their first start (Tiresias counts pending time from it)."""

    def apply(self, allocations: list[Allocation]) -> None:
        super().apply(allocations)
        for view in self.views.values():
            r = view.record
            if r.state == "running" and r.first_start is None:
                r.first_start = self.now


VARIANTS = [
    pytest.param(TiresiasParams(thresholds=[400.0, 3000.0]), id="three-queues"),
    pytest.param(TiresiasParams(thresholds=[300.0], promote_knob=0.5), id="eager-promotion"),
    pytest.param(
        TiresiasParams(thresholds=[600.0], backfill=False, running_first=False, promote_knob=1.0),
        id="no-backfill-no-running-first",
    ),
    pytest.param(TiresiasParams(thresholds=[500.0], promote_knob=0.0), id="never-promotes"),
    pytest.param(
        TiresiasGittinsParams(thresholds=[400.0, 3000.0], gittins_delta=500.0, window=30),
        id="gittins",
    ),
    pytest.param(
        TiresiasGittinsParams(
            thresholds=[300.0],
            promote_knob=0.5,
            samples=[200.0, 900.0, 4000.0],
            wake_at_sizes=True,
        ),
        id="gittins-prior-waking-at-sizes",
    ),
]


@pytest.mark.parametrize("params", VARIANTS)
@pytest.mark.parametrize("seed", [1, 2])
def test_kept_from_what_changed_it_decides_promotes_and_wakes_as_over_every_job(
    params: TiresiasParams, seed: int
) -> None:
    """(`tiresias-gittins` too: its index moves with the sizes it learns from the jobs that
    end, so it keys every job again after one ends, and keeps what it learns in `_last` as the
    walk over every job does, in admission order.)"""
    rng = random.Random(seed)
    sim = Started(rng, {"a": 24, "b": 16})
    cls = TiresiasGittins if isinstance(params, TiresiasGittinsParams) else Tiresias
    fed, whole = cls(params), cls(params)
    keyed = active = told_changes = promotions = 0
    last: list[str] = []
    for step in range(400):
        sim.step()
        sim.hear_late_steps([1.0])
        if step % 97 == 50:  # nodes come or go
            sim.capacity["b"] = rng.choice([8, 16, 24])
        expected = whole.schedule(sim.input(fed=False))
        assert isinstance(expected, list)
        whole_decision = step == 0 or step % 50 == 25  # (now and then a scheduler tells all)
        inp = sim.input(fed=not whole_decision)
        decision = fed.schedule(inp)
        sim.changed.clear()
        assert fed.snapshot() == whole.snapshot(), f"promotions at decision {step}"
        if isinstance(fed, TiresiasGittins):
            assert list(fed._last) == list(whole._last)  # type: ignore[attr-defined]
        promotions += sum(e.at == sim.now for e in fed._epochs.values())
        if isinstance(decision, Decision):
            told_changes += 1
            got = same_as_whole(decision, expected, last, sim.views, step)
        else:
            assert whole_decision  # (told nothing of what changed: every allocation)
            got = decision
            assert got == expected
        keyed += fed.order.keyed
        active += len(sim.views)
        last = [a.job_id for a in got]
        sim.apply(got)
        # When to decide again, as the scheduler asks: the jobs as the decision left them.
        after = msgspec.structs.replace(inp, jobs=list(sim.views.values()))
        wake = fed.next_decision_time(after)
        assert wake == whole.next_decision_time(msgspec.structs.replace(after, changed=None)), (
            f"wake after decision {step}"
        )
    assert told_changes == 391
    assert (promotions > 0) == (whole.knob > 0), promotions
    # Most of the waiting jobs' keys were kept, not computed again (Gittins's fewer: here a job
    # ends at most decisions, and every job is keyed again after one does).
    assert keyed < (0.8 if cls is TiresiasGittins else 0.5) * active, (keyed, active)


def test_a_restored_policy_rebuilds_what_it_keeps_and_decides_the_same() -> None:
    """A policy restored from another's snapshot, after a history of its own: what it kept
    from what changed is built again from the promotions restored (a waiting job's queue
    reads them), and it decides, promotes and wakes as the one it replaces would have."""
    params = TiresiasParams(thresholds=[300.0], promote_knob=0.5)
    elsewhere = Started(random.Random(99), {"a": 16})
    other = Tiresias(params)
    ran: list[str] = []
    for step in range(100):  # (its own jobs, promotions and order)
        elsewhere.step()
        decision = other.schedule(elsewhere.input(fed=step > 0))
        elsewhere.changed.clear()
        if isinstance(decision, Decision):
            decision = in_full(decision, ran, elsewhere.views)
        ran = [a.job_id for a in decision]
        elsewhere.apply(decision)
    rng = random.Random(7)
    sim = Started(rng, {"a": 16})
    fed, whole = Tiresias(params), Tiresias(params)
    last: list[str] = []
    for step in range(300):
        sim.step()
        if step == 150:  # the other takes over from the snapshot
            state = msgspec.json.decode(msgspec.json.encode(fed.snapshot()), type=Tiresias.State)
            other.restore(state)
            fed = other
        expected = whole.schedule(sim.input(fed=False))
        inp = sim.input(fed=step > 0)
        decision = fed.schedule(inp)
        sim.changed.clear()
        got = decision if isinstance(decision, list) else in_full(decision, last, sim.views)
        assert sorted(got, key=str) == sorted(expected, key=str), f"decision {step}"  # type: ignore[arg-type]
        assert fed.snapshot() == whole.snapshot()
        last = [a.job_id for a in got]
        sim.apply(got)
        after = msgspec.structs.replace(inp, jobs=list(sim.views.values()))
        assert fed.next_decision_time(after) == whole.next_decision_time(
            msgspec.structs.replace(after, changed=None)
        )

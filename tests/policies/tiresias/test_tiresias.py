"""Tiresias's discretised 2D-LAS and its Gittins variant as pure functions."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.policies.tiresias import (
    Tiresias,
    TiresiasGittins,
    TiresiasGittinsParams,
    TiresiasParams,
)
from gpuyard.shared.policy import JobView

from ..views import ids, inp, job

# --------------------------------------------------------------------------- Tiresias


def test_tiresias_queues_and_demotion_at_threshold():
    pol = Tiresias(TiresiasParams(thresholds=[3250, 7200], promote_knob=0))
    a = job("a", 2, running=True, submit=0, attained_service=3249.0, executed_time=1624.5)
    b = job("b", 1, submit=10)
    # a is still in Q0 and ahead of b (running first / earlier submit)
    assert ids(pol.schedule(inp([a, b], gpus=2))) == ["a"]
    # a demotes after (3250 - 3249) / 2 = 0.5 s
    assert pol.next_decision_time(inp([a, b], gpus=2, now=100.0)) == pytest.approx(100.5)
    a2 = job(
        "a", 2, running=True, submit=0, attained_service=3250.0, executed_time=1625.0, seq=a.seq
    )
    assert ids(pol.schedule(inp([a2, b], gpus=2))) == ["b"]  # b in Q0 preempts a in Q1
    assert pol.queue_of(a2, 0.0) == 1
    a3 = job("a", 2, running=True, attained_service=7200.0, executed_time=3600.0)
    assert pol.queue_of(a3, 0.0) == 2


def test_tiresias_fifo_inside_queue_and_backfill():
    pol = Tiresias(TiresiasParams(promote_knob=0))
    jobs = [
        job("late", 1, submit=5),
        job("big", 4, submit=1),
        job("early", 1, submit=0),
    ]
    # queue 0: early, big, late; big does not fit in 3 GPUs -> skipped (backfill)
    assert ids(pol.schedule(inp(jobs, gpus=3))) == ["early", "late"]


def test_tiresias_no_preemption_inside_a_queue():
    pol = Tiresias(TiresiasParams(promote_knob=0))
    run = job("run", 1, running=True, submit=10, attained_service=100.0, executed_time=100.0)
    old = job("old", 1, submit=0, attained_service=50.0, executed_time=50.0, first_start=0.0)
    assert ids(pol.schedule(inp([run, old], gpus=1, now=200.0))) == ["run"]
    fifo = Tiresias(TiresiasParams(promote_knob=0, running_first=False))
    assert ids(fifo.schedule(inp([run, old], gpus=1, now=200.0))) == ["old"]


def test_tiresias_never_promotes_jobs_that_never_ran():
    pol = Tiresias(TiresiasParams(thresholds=[100], promote_knob=1))
    fresh = job("fresh", 1, submit=0, queued_since=0.0)
    assert pol.queue_of(fresh, 1e9) == 0
    hog = job("hog", 1, running=True, attained_service=500.0, executed_time=500.0, first_start=0)
    assert ids(pol.schedule(inp([hog, fresh], gpus=1, now=1e9))) == ["fresh"]
    # A job in Q1 that has run is promoted only once pending >= knob * executed.
    assert pol.next_decision_time(inp([fresh], gpus=1, now=5.0)) is None


def test_tiresias_promotion_rule_and_reset():
    pol = Tiresias(TiresiasParams(thresholds=[100], promote_knob=2))
    top = job("top", 1, submit=50)  # a waiting Q0 job submitted later than "w"

    def waiting(now: float, **kw: Any) -> JobView:
        # ran 200 s from t=0 to 200 (1 GPU), waiting since 200: pending = now - 0 - 200
        return job(
            "w",
            1,
            submit=0,
            seq=1,
            attained_service=200.0,
            executed_time=200.0,
            first_start=0.0,
            queued_since=200.0,
            **kw,
        )

    w = waiting(599.0)
    assert pol.queue_of(w, 599.0) == 1
    assert ids(pol.schedule(inp([top, w], gpus=1, now=599.0))) == ["top"]
    assert pol.next_decision_time(inp([top, w], gpus=1, now=599.0)) == pytest.approx(600.0)
    # at 600 the pending time (400) reaches 2 * 200: promoted to Q0, ahead of the later "top"
    # (a running Q0 job would stay ahead: the reference appends promoted jobs to Q0)
    assert ids(pol.schedule(inp([top, waiting(600.0)], gpus=1, now=600.0))) == ["w"]
    # After promotion its counters restart: it runs 99 GPU-s more and is still in Q0 ...
    w_run = job(
        "w",
        1,
        running=True,
        submit=0,
        seq=1,
        attained_service=299.0,
        executed_time=299.0,
        first_start=0.0,
    )
    assert pol.queue_of(w_run, 699.0) == 0
    assert pol.next_decision_time(inp([w_run], gpus=1, now=699.0)) == pytest.approx(700.0)
    w_run2 = job(
        "w",
        1,
        running=True,
        submit=0,
        seq=1,
        attained_service=300.0,
        executed_time=300.0,
        first_start=0.0,
    )
    assert pol.queue_of(w_run2, 700.0) == 1  # ... and demoted after 100 GPU-s since promotion


def test_tiresias_default_knob_is_number_of_queues():
    assert Tiresias().knob == 2.0
    assert Tiresias(TiresiasParams(thresholds=[3250, 7200])).knob == 3.0
    assert Tiresias().limits == [3600.0]


def test_tiresias_gittins_index_and_order():
    pol = TiresiasGittins(
        TiresiasGittinsParams(
            thresholds=[10_000], promote_knob=0, gittins_delta=100, samples=[50, 1000, 1000, 5000]
        )
    )
    # a=0 is evaluated at 49 (next sample - 1): all 4 alive, {50} finishes within 100;
    # P = 1/4, E[min(S - a, 100)] = (1 + 3 * 100) / 4 -> index = 1/301
    assert pol.gittins_index(0.0) == pytest.approx(1 / 301)
    # a=60 -> 999: alive {1000, 1000, 5000}, two finish; P = 2/3, E = (1 + 1 + 100) / 3
    assert pol.gittins_index(60.0) == pytest.approx((2 / 3) / (102 / 3))
    assert pol.gittins_index(1e9) == 0.0
    # A job at 950 GPU-s (about to finish a 1000-GPU-s job) outranks a fresh one.
    near = job("near", 1, submit=5, attained_service=950.0, executed_time=950.0, first_start=0.0)
    fresh = job("fresh", 1, submit=0)
    assert pol.gittins_index(950.0) > pol.gittins_index(0.0)
    assert ids(pol.schedule(inp([fresh, near], gpus=1, now=1000.0))) == ["near"]


def test_tiresias_gittins_exact_value_and_learning():
    pol = TiresiasGittins(
        TiresiasGittinsParams(thresholds=[10_000], promote_knob=0, gittins_delta=100)
    )
    assert pol.gittins_index(0.0) == 0.0  # nothing known yet
    a = job("a", 1, running=True, attained_service=150.0, executed_time=150.0)
    b = job("b", 1, running=True, attained_service=300.0, executed_time=300.0)
    pol.schedule(inp([a, b], gpus=2, now=0.0))
    pol.schedule(inp([b], gpus=2, now=50.0))  # a finished: size 150 + 1 * 50 = 200
    pol.schedule(inp([], gpus=2, now=100.0))  # b finished: 300 + 50 = 350
    # step evaluation at the next sample minus 1: a = 199; survivors {200, 350}; within 100: {200}
    # P = 1/2, E = ((200 - 199) + 100) / 2 -> index = 0.5 / 50.5
    assert pol.gittins_index(0.0) == pytest.approx(0.5 / 50.5)


def test_tiresias_gittins_with_no_window_keeps_its_samples_alone():
    """`window=0`: the reference's fixed distribution; nothing learned from the jobs that end."""
    params: dict[str, Any] = dict(thresholds=[10_000], promote_knob=0, gittins_delta=100)
    fixed = TiresiasGittins(TiresiasGittinsParams(**params, samples=[200, 350], window=0))
    learning = TiresiasGittins(TiresiasGittinsParams(**params, samples=[200, 350]))
    a = job("a", 1, running=True, attained_service=150.0, executed_time=150.0)
    for pol in (fixed, learning):
        pol.schedule(inp([a], gpus=2, now=0.0))
        pol.schedule(inp([], gpus=2, now=50.0))  # a finished: size 200
    assert fixed.gittins_index(0.0) == pytest.approx(0.5 / 50.5)  # (as the test above)
    assert learning.gittins_index(0.0) != fixed.gittins_index(0.0)  # ({200, 200, 350})
    assert fixed._sizes == 0  # (the sizes never moved: no job is keyed again for an exit)


def test_tiresias_gittins_decides_at_known_sizes_only_when_asked():
    """As the reference's `dlas-gpu-gittins`, a running job's index is evaluated at the decisions
    that come anyway (here its demotion, (10,000 - 400) / 2 s on); `wake_at_sizes` wakes where it
    moves too."""
    params: dict[str, Any] = dict(thresholds=[10_000], promote_knob=0, samples=[50, 1000, 5000])
    running = job("r", 2, running=True, attained_service=400.0, executed_time=200.0)
    waiting = job("w", 1, submit=5)
    reference = TiresiasGittins(TiresiasGittinsParams(**params))
    assert reference.next_decision_time(inp([running, waiting], gpus=2, now=100.0)) == 4900.0
    woken = TiresiasGittins(TiresiasGittinsParams(**params, wake_at_sizes=True))
    # (1000 - 400) GPU-s at 2 GPUs: 300 s on
    assert woken.next_decision_time(inp([running, waiting], gpus=2, now=100.0)) == 400.0


def test_state_survives_a_snapshot_and_decides_the_same_afterwards():
    """A restarted scheduler restores the policy's state: the restored policy makes the same
    decisions as the one that never stopped; a fresh one (no state) does not."""
    import msgspec

    params = TiresiasParams(thresholds=[100], promote_knob=1)
    pol = Tiresias(params)
    hog = job("hog", 1, submit=0, seq=1, attained_service=200.0, executed_time=200.0,
              first_start=0.0, queued_since=200.0)  # fmt: skip
    top = job("top", 1, submit=50, seq=2)
    assert ids(pol.schedule(inp([top, hog], gpus=1, now=400.0))) == ["hog"]  # promoted at 400
    data = msgspec.json.encode(pol.snapshot())
    restored = Tiresias(params)
    restored.restore(msgspec.json.decode(data, type=Tiresias.State))
    # At 450, hog has run 50 more GPU-seconds since its promotion: still in the top queue.
    ran = job("hog", 1, running=True, submit=0, seq=1, attained_service=250.0,
              executed_time=250.0, first_start=0.0)  # fmt: skip
    later = [top, ran]
    assert ids(pol.schedule(inp(later, gpus=1, now=450.0))) == ["hog"]
    assert ids(restored.schedule(inp(later, gpus=1, now=450.0))) == ["hog"]
    assert ids(Tiresias(params).schedule(inp(later, gpus=1, now=450.0))) == ["top"]

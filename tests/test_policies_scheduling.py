"""Pure tests of the built-in scheduling policies (no services)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuyard.policies.scheduling import (
    Fifo,
    Las,
    LasParams,
    Optimus,
    Sjf,
    SjfParams,
    Srtf,
    Tiresias,
    TiresiasGittins,
    TiresiasGittinsParams,
    TiresiasParams,
    fill_in_order,
)
from gpuyard.shared.model import ANY_GPU, Allocation, JobSpec
from gpuyard.shared.policy import (
    ClusterView,
    JobView,
    PolicyError,
    SchedulingInput,
    scheduling_policies,
)

_seq = iter(range(10**9))


def job(
    job_id: str,
    gpus: int = 1,
    *,
    running: bool = False,
    submit: float = 0.0,
    gpu_type: str = "gpu",
    spec: dict[str, Any] | None = None,
    **view: Any,
) -> JobView:
    s = JobSpec(num_gpus=gpus, job_id=job_id, **(spec or {}))
    if running:
        view.setdefault("gpus", gpus)
        view.setdefault("gpu_type", gpu_type)
    else:
        view.setdefault("queued_since", submit)
    return JobView(
        job_id=job_id,
        seq=view.pop("seq", next(_seq)),
        spec=s,
        state="running" if running else "queued",
        submit_time=submit,
        **view,
    )


def inp(jobs: list[JobView], gpus: int | dict[str, int] = 4, now: float = 0.0, round_s=300.0):
    cap = gpus if isinstance(gpus, dict) else {"gpu": gpus}
    return SchedulingInput(now=now, jobs=jobs, cluster=ClusterView(capacity=cap, round_s=round_s))


def ids(allocs: list[Allocation]) -> list[str]:
    return [a.job_id for a in allocs]


# --------------------------------------------------------------------------- the shared walk


def test_walk_preempts_last_running_job_after_it():
    order = [
        job("new", 2),
        job("r1", 1, running=True),
        job("r2", 1, running=True),
        job("r3", 2, running=True),
    ]
    # 4 GPUs all held; "new" needs 2: the tail job r3 is preempted, r1 and r2 keep theirs.
    assert ids(fill_in_order(order, {"gpu": 4})) == ["new", "r1", "r2"]


def test_walk_hol_stop_keeps_later_running_jobs():
    order = [
        job("r1", 2, running=True),
        job("big", 3),  # cannot fit even preempting r2
        job("r2", 1, running=True),
        job("small", 1),
    ]
    out = fill_in_order(order, {"gpu": 4})
    assert ids(out) == ["r1", "r2"]  # stops at big; r2 keeps running; small is blocked
    out = fill_in_order(order, {"gpu": 4}, backfill=True)
    assert ids(out) == ["r1", "r2", "small"]


def test_walk_placed_jobs_are_not_preempted_by_later_ones():
    order = [job("a", 2), job("b", 3)]
    assert ids(fill_in_order(order, {"gpu": 4})) == ["a"]


def test_walk_keeps_gpu_type_and_respects_type_capacity():
    order = [
        job("r", 2, running=True, gpu_type="k80"),
        job("v", 2, spec={"gpu_type": "v100"}),
        job("any", 3),
    ]
    out = fill_in_order(order, {"k80": 4, "v100": 2})
    assert [(a.job_id, a.num_gpus, a.gpu_type) for a in out] == [
        ("r", 2, "k80"),
        ("v", 2, "v100"),
    ]  # "any" needs 3 on one type: k80 has 2 left, v100 none -> blocked
    assert sum(a.num_gpus for a in out if a.gpu_type == "k80") <= 4


# --------------------------------------------------------------------------- FIFO / SJF / SRTF


def test_fifo_priority_then_submit_time():
    jobs = [
        job("late", submit=5),
        job("early", submit=1),
        job("vip", submit=9, spec={"priority": 1}),
    ]
    assert ids(Fifo().schedule(inp(jobs, gpus=2))) == ["vip", "early"]


def test_sjf_orders_by_duration_and_is_non_preemptive_by_default():
    jobs = [
        job("long", running=True, spec={"duration": 1000}),
        job("short", spec={"duration": 10}),
        job("unknown"),
        job("mid", spec={"duration": 100}),
    ]
    assert ids(Sjf().schedule(inp(jobs, gpus=2))) == ["long", "short"]
    pre = Sjf(SjfParams(preemptive=True)).schedule(inp(jobs, gpus=2))
    assert ids(pre) == ["short", "mid"]  # the long running job is preempted


def test_srtf_preempts_longer_remaining():
    jobs = [
        job("r", running=True, remaining_time=500.0),
        job("q", remaining_time=50.0),
        job("u"),  # unknown remaining: last
    ]
    assert ids(Srtf().schedule(inp(jobs, gpus=1))) == ["q"]
    assert ids(Srtf().schedule(inp(jobs, gpus=2))) == ["q", "r"]


def test_srtf_starvation_moves_job_up_a_class_at_threshold():
    jobs = [
        job("r", running=True, remaining_time=10.0),
        job("old", remaining_time=1e9, queued_since=0.0),
    ]
    pol = Srtf()
    assert ids(pol.schedule(inp(jobs, gpus=1, now=3.6e6 - 1))) == ["r"]
    assert pol.next_decision_time(inp(jobs, gpus=1, now=100.0)) == 3.6e6
    assert ids(pol.schedule(inp(jobs, gpus=1, now=3.6e6))) == ["old"]


# --------------------------------------------------------------------------- LAS


def test_las_gpu_seconds_vs_rounds():
    jobs = [
        job("wide", 4, running=True, attained_service=4 * 600.0, rounds_run=2),
        job("narrow", 1, attained_service=900.0, rounds_run=3),
    ]
    # GPU-seconds: narrow (900) < wide (2400); rounds: wide (2) < narrow (3).
    assert ids(Las().schedule(inp(jobs, gpus=4))) == ["narrow"]
    assert ids(Las(LasParams(key="rounds")).schedule(inp(jobs, gpus=4))) == ["wide"]


def test_las_priority_class_before_service_and_stable_ties():
    jobs = [
        job("a", attained_service=0.0, seq=2),
        job("b", attained_service=0.0, seq=1),
        job("hi", attained_service=1e6, spec={"priority": 1}),
    ]
    assert ids(Las().schedule(inp(jobs, gpus=2))) == ["hi", "b"]


def test_las_starvation_guard_timing_and_next_decision():
    pol = Las(LasParams(starvation_s=1000.0))
    jobs = [
        job("r", running=True, attained_service=10.0, queued_since=None),
        job("w", attained_service=5000.0, queued_since=200.0),
    ]
    assert ids(pol.schedule(inp(jobs, gpus=1, now=1199.0))) == ["r"]
    assert ids(pol.schedule(inp(jobs, gpus=1, now=1200.0))) == ["w"]
    # queued + running: re-decide after a round, or at the starvation crossing if sooner
    assert pol.next_decision_time(inp(jobs, gpus=1, now=1000.0, round_s=300.0)) == 1200.0
    assert pol.next_decision_time(inp(jobs, gpus=1, now=0.0, round_s=300.0)) == 300.0
    assert pol.next_decision_time(inp([jobs[0]], gpus=1, now=0.0)) is None


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


# --------------------------------------------------------------------------- Optimus


def test_optimus_minimum_first_then_spare_to_most_remaining_work():
    def ej(name: str, rem: float, submit: float) -> JobView:
        return job(name, 1, submit=submit, remaining_time=rem, spec={"min_gpus": 1, "max_gpus": 4})

    jobs = [ej("small", 100.0, 0), ej("big", 10_000.0, 1), ej("mid", 1000.0, 2)]
    out = {a.job_id: a.num_gpus for a in Optimus().schedule(inp(jobs, gpus=8))}
    assert sum(out.values()) == 8
    assert out["big"] == 4  # most remaining work, capped at max_gpus
    assert out["mid"] == 3 and out["small"] == 1
    assert Optimus.elastic


def test_optimus_shrinks_running_job_to_admit_others():
    big = job("big", 4, running=True, remaining_time=10.0, spec={"min_gpus": 1, "max_gpus": 4})
    new = job("new", 2, submit=1, remaining_time=1000.0, spec={"min_gpus": 2})
    out = {a.job_id: a.num_gpus for a in Optimus().schedule(inp([big, new], gpus=4))}
    assert out == {"big": 2, "new": 2}


def test_optimus_respects_minimum_and_capacity():
    jobs = [job(f"j{i}", 2, submit=i, spec={"min_gpus": 2, "max_gpus": 3}) for i in range(3)]
    out = Optimus().schedule(inp(jobs, gpus=5))
    assert [(a.job_id, a.num_gpus) for a in out] == [("j0", 3), ("j1", 2)]


# --------------------------------------------------------------------------- registry


@pytest.mark.parametrize(
    "name", ["fifo", "sjf", "srtf", "las", "tiresias", "tiresias-gittins", "optimus"]
)
def test_registry_and_capacity_invariant(name: str):
    pol = scheduling_policies.create(name)
    jobs = [
        job(
            f"j{i}",
            1 + i % 3,
            running=i % 4 == 0,
            submit=float(i),
            attained_service=float(i * 37 % 500),
            executed_time=float(i * 37 % 500),
            remaining_time=float(1000 - i),
            spec={"duration": 2000.0 - i},
        )
        for i in range(40)
    ]
    out = pol.schedule(inp(jobs, gpus={"gpu": 16}, now=1000.0))
    assert sum(a.num_gpus for a in out) <= 16
    assert len({a.job_id for a in out}) == len(out)
    for a in out:
        lo, hi = next(j for j in jobs if j.job_id == a.job_id).spec.gpu_range
        assert lo <= a.num_gpus <= hi
    nxt = pol.next_decision_time(inp(jobs, gpus={"gpu": 16}, now=1000.0))
    assert nxt is None or nxt > 1000.0


def test_registry_rejects_unknown_params():
    with pytest.raises(PolicyError):
        scheduling_policies.create("las", {"nope": 1})
    assert scheduling_policies.create("las", {"key": "rounds"}).params.key == "rounds"


# --------------------------------------------------------------------------- property test


@st.composite
def random_inputs(draw):
    cap = {"a": draw(st.integers(0, 12)), "b": draw(st.integers(0, 12))}
    used = dict.fromkeys(cap, 0)
    jobs = []
    for i in range(draw(st.integers(0, 25))):
        n = draw(st.integers(1, 6))
        low = draw(st.integers(1, n))
        t = draw(st.sampled_from(["a", "b"]))
        run = draw(st.booleans()) and used[t] + n <= cap[t]
        used[t] += n if run else 0
        executed = draw(st.floats(0, 1e4))
        jobs.append(
            job(
                f"j{i}",
                n,
                running=run,
                gpu_type=t,
                submit=float(draw(st.integers(0, 100))),
                seq=i,
                spec={
                    "min_gpus": low,
                    "max_gpus": n + draw(st.integers(0, 3)),
                    "gpu_type": draw(st.sampled_from([ANY_GPU, t])),
                    "priority": draw(st.integers(0, 1)),
                },
                attained_service=executed * n,
                executed_time=executed,
                first_start=0.0 if executed else None,
                remaining_time=draw(st.one_of(st.none(), st.floats(1, 1e5))),
                queued_since=None if run else float(draw(st.integers(0, 5000))),
            )
        )
    return inp(jobs, gpus=cap, now=5000.0)


@pytest.mark.parametrize(
    "name", ["fifo", "sjf", "srtf", "las", "tiresias", "tiresias-gittins", "optimus"]
)
@settings(max_examples=200, deadline=None)
@given(data=random_inputs())
def test_allocations_always_valid(name: str, data: SchedulingInput):
    out = scheduling_policies.create(name).schedule(data)
    by_id = {j.job_id: j for j in data.jobs}
    used: dict[str, int] = {}
    assert len({a.job_id for a in out}) == len(out)
    for a in out:
        j = by_id[a.job_id]
        lo, hi = j.spec.gpu_range
        assert lo <= a.num_gpus <= hi
        assert j.spec.gpu_type in (ANY_GPU, a.gpu_type)
        if j.state == "running" and a.gpu_type != j.gpu_type:
            # only a job preempted by a more important one may restart on another type
            assert j.spec.gpu_type == ANY_GPU
        used[a.gpu_type] = used.get(a.gpu_type, 0) + a.num_gpus
    assert all(used[t] <= data.cluster.capacity.get(t, 0) for t in used)

"""Blox's policies as pure functions: FIFO, SJF, SRTF, LAS and Optimus."""

from __future__ import annotations

from gpuyard.policies.blox import Fifo, FifoParams, Las, LasParams, Optimus, Sjf, SjfParams, Srtf
from gpuyard.shared.policy import JobView

from ..views import ids, inp, job

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
        job("wide", 4, running=True, attained_service=4 * 600.0, executed_time=600.0),
        job("narrow", 1, attained_service=900.0, executed_time=900.0),
    ]
    assert [j.rounds_run for j in inp(jobs, gpus=4).jobs] == [2, 3]  # 300 s rounds
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


# --------------------------------------------------------------------------- Optimus


def test_optimus_minimum_first_then_spare_to_most_remaining_work():
    def ej(name: str, rem: float, submit: float) -> JobView:
        return job(name, 1, submit=submit, remaining_time=rem, spec={"min_gpus": 1, "max_gpus": 4})

    jobs = [ej("small", 100.0, 0), ej("big", 10_000.0, 1), ej("mid", 1000.0, 2)]
    out = {a.job_id: a.num_gpus for a in Optimus().schedule(inp(jobs, gpus=8))}
    assert sum(out.values()) == 8
    assert out["big"] == 4  # most remaining work, capped at max_gpus
    assert out["mid"] == 3 and out["small"] == 1
    assert Optimus.needs.decide_on_exit


def test_optimus_shrinks_running_job_to_admit_others():
    big = job("big", 4, running=True, remaining_time=10.0, spec={"min_gpus": 1, "max_gpus": 4})
    new = job("new", 2, submit=1, remaining_time=1000.0, spec={"min_gpus": 2})
    out = {a.job_id: a.num_gpus for a in Optimus().schedule(inp([big, new], gpus=4))}
    assert out == {"big": 2, "new": 2}


def test_optimus_respects_minimum_and_capacity():
    jobs = [job(f"j{i}", 2, submit=i, spec={"min_gpus": 2, "max_gpus": 3}) for i in range(3)]
    out = Optimus().schedule(inp(jobs, gpus=5))
    assert [(a.job_id, a.num_gpus) for a in out] == [("j0", 3), ("j1", 2)]


def test_fifo_backfill_never_preempts_for_an_equal_priority_job():
    """A job started by backfill keeps its GPUs when the earlier job it jumped could only start
    by preempting it; a job of higher priority still preempts."""
    late = job("late", 2, running=True, submit=5)
    early = job("early", 4, submit=0)
    assert ids(Fifo(FifoParams(backfill=True)).schedule(inp([early, late], gpus=4))) == ["late"]
    # Without backfill FIFO is Blox's: the walk takes the head of the queue first.
    assert ids(Fifo().schedule(inp([early, late], gpus=4))) == ["early"]
    vip = job("vip", 4, submit=9, spec={"priority": 1})
    out = Fifo(FifoParams(backfill=True)).schedule(inp([early, late, vip], gpus=4))
    assert ids(out) == ["vip"]

"""EASY backfill as a pure policy (no NATS): the first job that does not fit gets a reservation by
the running jobs' time limits, and a later job starts ahead of it only if it ends by then or fits
in the GPUs left over at that time."""

from __future__ import annotations

import math

from gpuyard.policies.slurm import EasyBackfill, reserve
from gpuyard.shared.policy import JobView

from ..views import inp, job


def started(
    policy: EasyBackfill, jobs: list[JobView], gpus: int | dict[str, int], now: float
) -> list[str]:
    """The jobs the decision runs (running ones first, then those it starts, in its order)."""
    return [a.job_id for a in policy.schedule(inp(jobs, gpus, now=now))]


def limited(job_id: str, gpus: int, limit: float | None, **kw: object) -> JobView:
    return job(job_id, gpus, spec={"time_limit_s": limit}, **kw)  # type: ignore[arg-type]


def test_the_classic_case_a_wide_job_at_the_head_keeps_its_reserved_start() -> None:
    """8 GPUs at t=100; B holds 4 until t=200 by its limit; W (8 GPUs) waits at the head: it is
    reserved t=200. C (would end t=150) starts ahead of it; D (t=250) and E (no limit) do not."""
    easy = EasyBackfill()
    b = limited("b", 4, 100.0, running=True)
    w, c = limited("w", 8, 1000.0, submit=1.0), limited("c", 4, 50.0, submit=2.0)
    d, e = limited("d", 4, 150.0, submit=3.0), limited("e", 4, None, submit=4.0)
    assert started(easy, [b, w, c, d, e], 8, now=100.0) == ["b", "c"]
    assert started(easy, [b, w, d, e], 8, now=100.0) == ["b"]  # (either would delay W)
    # A job of higher priority than W comes first: it is the one reserved (it fits at t=200 as
    # well), and C still ends before then.
    urgent = job("u", 8, submit=9.0, spec={"time_limit_s": 10.0, "priority": 5})
    assert started(easy, [b, w, c, d, urgent], 8, now=100.0) == ["b", "c"]
    # With nothing reserved ahead of them, jobs start in order while they fit: a plain FIFO.
    assert started(easy, [b, c, d], 8, now=100.0) == ["b", "c"]


def test_a_job_that_ends_later_may_use_the_gpus_the_reserved_job_leaves_over() -> None:
    """10 GPUs, B holds 4 until t=200: W (8) is reserved t=200 with 2 GPUs to spare then; a 2-GPU
    job that runs past t=200 takes them, the next one no longer may."""
    easy = EasyBackfill()
    b = limited("b", 4, 200.0, running=True)
    w = limited("w", 8, 1000.0, submit=1.0)
    long1, long2 = limited("l1", 2, 5000.0, submit=2.0), limited("l2", 2, 5000.0, submit=3.0)
    assert started(easy, [b, w, long1, long2], 10, now=0.0) == ["b", "l1"]
    reserved = reserve(w, ["gpu"], 8, 0.0, {"gpu": 6}, {"gpu": [(200.0, 4)]})
    assert (reserved.at, reserved.extra) == (200.0, 2)


def test_limits_count_the_runs_together_and_a_job_without_one_takes_the_default() -> None:
    """A running job that already ran 150 s of its 200 s limit ends 50 s from now; with no limit
    and no default its GPUs never count as freed."""
    b = limited("b", 4, 200.0, running=True, executed_time=150.0)
    w = limited("w", 8, 1000.0, submit=1.0)
    c = limited("c", 4, 60.0, submit=2.0)
    assert started(EasyBackfill(), [b, w, c], 8, now=0.0) == ["b"]  # (C would end at 60 > 50)
    unlimited = limited("b", 4, None, running=True)
    w_never = reserve(w, ["gpu"], 8, 0.0, {"gpu": 4}, {"gpu": [(math.inf, 4)]})
    assert w_never.at == math.inf
    assert started(EasyBackfill(), [unlimited, w, c], 8, now=0.0) == ["b", "c"]
    # With no limit anywhere there is nothing to plan by: jobs start in order (plain FIFO).
    c_unlimited = limited("c", 4, None, submit=2.0)
    assert started(EasyBackfill(), [unlimited, w, c_unlimited], 8, now=0.0) == ["b"]
    default = EasyBackfill(EasyBackfill.Params(default_limit_s=100.0))
    assert started(default, [unlimited, w, c], 8, now=0.0) == ["b", "c"]  # (C ends by t=100)
    c_late = limited("c", 4, None, submit=2.0)  # (takes the default: ends at t=100 too)
    assert started(default, [unlimited, w, c_late], 8, now=0.0) == ["b", "c"]
    c_later = limited("c", 4, 101.0, submit=2.0)
    assert started(default, [unlimited, w, c_later], 8, now=0.0) == ["b"]


def test_gpus_of_a_type_the_reserved_job_does_not_use_are_backfilled_freely() -> None:
    easy = EasyBackfill()
    b = limited("b", 4, 200.0, running=True, gpu_type="a")
    w = job("w", 8, submit=1.0, spec={"time_limit_s": 100.0, "gpu_type": "a"})
    c = job("c", 4, submit=2.0, spec={"time_limit_s": 5000.0, "gpu_type": "b"})
    d = job("d", 4, submit=3.0, spec={"time_limit_s": 5000.0, "gpu_type": "a"})
    assert started(easy, [b, w, c, d], {"a": 8, "b": 4}, now=0.0) == ["b", "c"]


def test_running_jobs_are_never_preempted_and_a_job_that_can_never_fit_blocks_nobody() -> None:
    easy = EasyBackfill()
    b = limited("b", 4, 100.0, running=True, seq=0)
    huge = limited("huge", 16, 10.0, submit=1.0)
    c = limited("c", 4, 5000.0, submit=2.0)
    assert started(easy, [b, huge, c], 8, now=0.0) == ["b", "c"]


def test_multifactor_priority_ages_jobs_and_serves_the_user_who_used_least() -> None:
    """Slurm's multifactor priority: age over `max_age_s` and the classic fair-share factor
    2^(-U/S) with usage decayed with `half_life_s`; all weights 0, FIFO by priority."""
    import msgspec

    from gpuyard.policies.slurm.backfill import EasyParams

    def easy(**kw: object) -> EasyBackfill:
        return EasyBackfill(msgspec.convert(kw, EasyParams))

    # Age: the older job of lower priority passes the newer one once it has waited long enough.
    old = job("old", 1, submit=0.0, spec={"priority": 0})
    new = job("new", 1, submit=900.0, spec={"priority": 5})
    assert started(easy(), [old, new], 1, now=1000.0) == ["new"]
    assert started(easy(weight_age=10.0, max_age_s=1000.0), [old, new], 1, now=1000.0) == ["old"]
    # Fair share: x held 4 GPUs for an hour, y nothing; then one GPU frees for their jobs.
    fair = easy(weight_fairshare=100.0, half_life_s=3600.0, shares={"x": 1.0, "y": 1.0})
    assert fair.needs.decide_on_exit and not easy().needs.decide_on_exit
    ran = [job(f"r{i}", 1, running=True, spec={"user": "x"}) for i in range(4)]
    fair.schedule(inp(ran, 4, now=0.0))
    x_next = job("x1", 1, submit=3500.0, spec={"user": "x"})
    y_next = job("y1", 1, submit=3590.0, spec={"user": "y"})
    assert started(easy(), [x_next, y_next], 1, now=3600.0) == ["x1"]
    restored = easy(weight_fairshare=100.0, half_life_s=3600.0, shares={"x": 1.0, "y": 1.0})
    state = fair.snapshot()
    assert state is not None and easy().snapshot() is None
    restored.restore(msgspec.json.decode(msgspec.json.encode(state), type=EasyBackfill.State))
    # x used everything: U = 1 against S = 1/2, a factor 2^-2; y's is 1.
    assert restored.fairshare(3600.0, {"x", "y"}) == {"x": 0.25, "y": 1.0}
    assert started(fair, [x_next, y_next], 1, now=3600.0) == ["y1"]
    assert started(restored, [x_next, y_next], 1, now=3600.0) == ["y1"]

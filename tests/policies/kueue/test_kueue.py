"""Kueue's quotas as a pure policy (no NATS): nominal quota, borrowing within a cohort up to its
limits, reclaim and preemption within a queue by priority, jobs passed over (BestEffortFIFO), the
queue a job's user gives, and the queues file's mistakes in one line each."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuyard.policies.kueue import Kueue, Queues, load_queues
from gpuyard.shared.policy import JobView

from ..views import inp, job


def queues(*specs: dict[str, Any], **kw: Any) -> Kueue:
    return Kueue(msgspec.convert({"queue": list(specs), **kw}, Queues))


def q(name: str, quota: int, **kw: Any) -> dict[str, Any]:
    return {"name": name, "quota": {"gpu": quota}, "users": [name], **kw}


def of(user: str, job_id: str, gpus: int = 1, running: bool = False, priority: int = 0,
       submit: float = 0.0, **kw: Any) -> JobView:  # fmt: skip
    return job(job_id, gpus, running=running, submit=submit,
               spec={"user": user, "priority": priority}, **kw)  # fmt: skip


def ran(policy: Kueue, jobs: list[JobView], gpus: int = 8) -> list[str]:
    return sorted(a.job_id for a in policy.schedule(inp(jobs, gpus)).allocations)


def test_a_queue_alone_runs_within_its_quota() -> None:
    policy = queues(q("a", 3))
    jobs = [of("a", f"a{i}", submit=i) for i in range(5)]
    assert ran(policy, jobs) == ["a0", "a1", "a2"]


def test_a_cohort_lends_what_its_queues_leave_unused_within_their_limits() -> None:
    jobs = [of("a", f"a{i}", submit=i) for i in range(8)]
    free = queues(q("a", 4, cohort="c"), q("b", 4, cohort="c"))
    assert len(ran(free, jobs)) == 8
    limited = queues(q("a", 4, cohort="c", borrowing_limit={"gpu": 2}), q("b", 4, cohort="c"))
    assert len(ran(limited, jobs)) == 6
    lends_one = queues(q("a", 4, cohort="c"), q("b", 4, cohort="c", lending_limit={"gpu": 1}))
    assert len(ran(lends_one, jobs)) == 5
    other_cohort = queues(q("a", 4, cohort="c"), q("b", 4, cohort="d"))
    assert len(ran(other_cohort, jobs)) == 4


def test_a_lender_reclaims_its_quota_from_the_newest_borrowers() -> None:
    borrowing = [of("a", f"a{i}", running=True, submit=i) for i in range(8)]
    wants = [of("b", "b0", submit=10.0), of("b", "b1", submit=11.0)]
    reclaims = queues(q("a", 4, cohort="c"), q("b", 4, cohort="c", reclaim_within_cohort="any"))
    assert ran(reclaims, [*borrowing, *wants]) == ["a0", "a1", "a2", "a3", "a4", "a5", "b0", "b1"]
    decision = reclaims.schedule(inp([*borrowing, *wants], 8))
    assert decision.reasons == {
        "a7": "reclaimed by queue b for b0",
        "a6": "reclaimed by queue b for b1",
    }
    never = queues(q("a", 4, cohort="c"), q("b", 4, cohort="c"))
    assert ran(never, [*borrowing, *wants]) == [f"a{i}" for i in range(8)]
    # Only lower priority: a's jobs of higher priority stay.
    high = [of("a", f"a{i}", running=True, priority=9, submit=i) for i in range(8)]
    lower = queues(
        q("a", 4, cohort="c"), q("b", 4, cohort="c", reclaim_within_cohort="lower_priority")
    )
    assert ran(lower, [*high, *wants]) == [f"a{i}" for i in range(8)]


def test_a_job_preempts_its_own_queues_lower_priority_jobs_never_to_borrow() -> None:
    low = [of("a", f"l{i}", running=True, submit=i) for i in range(4)]
    urgent = of("a", "u", gpus=2, priority=5, submit=9.0)
    policy = queues(q("a", 4, within_queue="lower_priority"))
    assert ran(policy, [*low, urgent], gpus=4) == ["l0", "l1", "u"]  # (the newest two leave)
    reasons = policy.schedule(inp([*low, urgent], 4)).reasons
    assert reasons == {j: "preempted in queue a for u (priority 5)" for j in ("l2", "l3")}
    assert ran(queues(q("a", 4)), [*low, urgent], gpus=4) == ["l0", "l1", "l2", "l3"]
    wide = of("a", "w", gpus=6, priority=5, submit=9.0)  # (beyond its quota: no preemption)
    assert ran(policy, [*low, wide], gpus=8) == ["l0", "l1", "l2", "l3"]


def test_jobs_that_do_not_fit_are_passed_over_and_users_choose_the_queue() -> None:
    policy = queues(q("a", 4), q("b", 2), default_queue="b")
    jobs = [of("a", "wide", gpus=8, submit=0.0), of("a", "small", submit=1.0),
            of("nobody", "elsewhere", gpus=2, submit=2.0), of("nobody", "more", submit=3.0)]  # fmt: skip
    assert ran(policy, jobs) == ["elsewhere", "small"]
    assert ran(queues(q("a", 4)), [of("nobody", "x")]) == []  # (no queue takes it)


def test_the_queues_file_says_each_mistake_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "queues.toml"
    good.write_text('[[queue]]\nname = "a"\nquota = { gpu = 4 }\nusers = ["alice"]\n')
    assert load_queues(good).queue[0].quota == {"gpu": 4}
    for text, said in [
        ('[[queue]]\nname = "a"\nquota = { gpu = 4 }\n[[queue]]\nname = "a"\nquota = {}\n',
         "queue 'a' is defined twice"),
        ('[[queue]]\nname = "a"\nquota = { gpu = 4 }\nusers = ["x"]\n'
         '[[queue]]\nname = "b"\nquota = { gpu = 4 }\nusers = ["x"]\n', "user 'x' is in queues"),
        ('[[queue]]\nname = "a"\nquota = { gpu = 4 }\nborrowing_limit = { gpu = 2 }\n',
         "borrowing and lending need a cohort"),
        ('[[queue]]\nname = "a"\nquota = { gpu = -1 }\n', "Expected `int` >= 0"),
        ('[[queue]]\nname = "a"\nquota = { gpu = 4 }\nbogus = 1\n', "unknown field `bogus`"),
        ('default_queue = "z"\n[[queue]]\nname = "a"\nquota = { gpu = 4 }\n', "not a queue"),
    ]:  # fmt: skip
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ValueError) as exc:
            load_queues(bad)
        line = str(exc.value)
        assert said in line and "\n" not in line and str(bad) in line, line


def test_a_decision_from_what_changed_is_the_decision_from_every_job() -> None:
    """Jobs come, start as decided and end, step by step: the policy told only what changed each
    time decides as a new one shown every job does."""
    import random

    from gpuyard.shared.policy import ClusterView, SchedulingInput

    rng = random.Random(3)
    config = dict(cohort="c", reclaim_within_cohort="any", within_queue="lower_priority")
    kept = queues(q("a", 4, **config), q("b", 4, **config))
    cluster = ClusterView(capacity={"gpu": 8})
    active: dict[str, JobView] = {}
    for step in range(40):
        changed: dict[str, JobView | None] = {}
        for k in range(rng.randint(0, 3)):  # arrivals
            user = rng.choice("ab")
            view = of(user, f"{user}{step}-{k}", gpus=rng.choice([1, 1, 2, 4]),
                      priority=rng.choice([0, 5]), submit=float(step))  # fmt: skip
            active[view.job_id] = changed[view.job_id] = view
        for job_id in [j for j, v in active.items() if v.running and rng.random() < 0.2]:
            del active[job_id]  # (ended)
            changed[job_id] = None
        fresh = queues(q("a", 4, **config), q("b", 4, **config))
        jobs = list(active.values())
        told = kept.schedule(SchedulingInput(now=float(step), jobs=jobs, cluster=cluster,
                                             changed=changed if step else None))  # fmt: skip
        whole = fresh.schedule(
            SchedulingInput(now=float(step), jobs=jobs, cluster=cluster)
        ).allocations
        runs = {a.job_id: a.num_gpus for a in told.allocations}
        if told.keep_running:  # (what changes: the running jobs not stopped go on)
            assert step > 0
            runs |= {j: v.record.gpus for j, v in active.items()
                     if v.running and j not in told.stop}  # fmt: skip
        assert runs == {a.job_id: a.num_gpus for a in whole}
        # The decision takes effect: the jobs it names run, the others wait.
        for job_id, view in active.items():
            r = view.record
            was = r.state
            if job_id in runs:
                r.state, r.gpus, r.gpu_type = "running", runs[job_id], "gpu"
            else:
                r.state, r.gpus, r.gpu_type = "queued", 0, None
            if r.state != was:
                changed[job_id] = view
        kept.schedule(SchedulingInput(now=float(step), jobs=jobs, cluster=cluster, changed={
            j: active.get(j) for j in changed}))  # fmt: skip


def test_gpuyard_queues_counts_each_queues_gpus_borrowed_lent_and_jobs() -> None:
    from gpuyard.cli.ops import format_queues, queue_rows

    config = queues(q("a", 2, cohort="c"), q("b", 4, cohort="c"), q("l", 3, cohort="c")).params
    jobs = [of("a", "a0", gpus=5, running=True, gpu_type="gpu"), of("a", "a1"),
            of("b", "b0", running=True, gpu_type="gpu"), of("x", "x0")]  # fmt: skip
    jobs[1].record.reason = "QuotaExceeded (queue a holds 5 of its 2 gpu GPUs; it asks for 1)"
    rows = {r["queue"]: r for r in queue_rows(config, [j.record for j in jobs])}
    assert rows["a"] == {"queue": "a", "cohort": "c", "quota": {"gpu": 2}, "held": {"gpu": 5},
                         "borrowed": {"gpu": 3}, "lent": {}, "running": 1, "waiting": 1,
                         "why": {"QuotaExceeded": 1}}  # fmt: skip
    # a borrows 3: b leaves 3 unused, l 3, so each lends about half (the remainder to b)
    assert (rows["b"]["lent"], rows["l"]["lent"]) == ({"gpu": 2}, {"gpu": 1})
    assert (rows["b"]["held"], rows["b"]["borrowed"], rows["b"]["waiting"]) == ({"gpu": 1}, {}, 0)
    assert format_queues(list(rows.values())).splitlines()[1].split() == [
        "a", "c", "gpu:2", "gpu:5", "gpu:3", "-", "1", "1", "QuotaExceeded:1"]  # fmt: skip


# ---------------------------------------------------------------------- fair sharing


def borrowers(reclaim: str = "any", **fair: Any) -> Kueue:
    """A lender with 8 GPUs it does not use, and two queues of no quota that borrow them."""
    config = {"cohort": "c", "reclaim_within_cohort": reclaim}
    weights = fair.pop("weights", {})
    return queues(
        q("lender", 8, cohort="c"),
        {**q("a", 0, **config), "weight": weights.get("a", 1.0)},
        {**q("b", 0, **config), "weight": weights.get("b", 1.0)},
        **({"fair_sharing": fair} if fair or weights else {}),
    )


def test_fair_sharing_gives_the_borrowed_gpus_by_the_queues_weights() -> None:
    """Both queues' next jobs are admitted one each in turn while GPUs are free; then only
    fair sharing lets the queue of the lesser share take from the other."""
    jobs = [of("a", f"a{i}", running=i < 4, submit=i) for i in range(12)]
    jobs += [of("b", f"b{i}", submit=20 + i) for i in range(8)]

    def held(policy: Kueue) -> tuple[int, int]:
        started = ran(policy, jobs)
        return sum(j[0] == "a" for j in started), sum(j[0] == "b" for j in started)

    assert held(borrowers()) == (6, 2)
    assert held(borrowers(half_life_s=0)) == (4, 4)
    assert held(borrowers(weights={"a": 3.0})) == (6, 2)  # (6/3 = 2/1)
    assert held(borrowers(weights={"b": 3.0})) == (2, 6)
    # Weight 0: the first to give back (all but the two it started in this decision).
    assert held(borrowers(weights={"a": 0.0})) == (2, 6)


def test_under_fair_sharing_a_queue_reclaims_borrowed_gpus_down_to_an_equal_share() -> None:
    running = [of("a", f"a{i}", running=True, submit=i) for i in range(8)]
    waiting = [of("b", f"b{i}", submit=10 + i) for i in range(8)]
    assert ran(borrowers(), [*running, *waiting]) == [f"a{i}" for i in range(8)]  # (none)
    fair = borrowers(half_life_s=0)
    decision = fair.schedule(inp([*running, *waiting], 8))
    started = sorted(a.job_id for a in decision.allocations)
    assert started == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]
    assert decision.reasons == {f"a{7 - i}": f"reclaimed by queue b for b{i}" for i in range(4)}
    # At equal shares, neither takes from the other: the next decision changes nothing.
    after = [of("a", f"a{i}", running=True, submit=i) for i in range(4)]
    after += [of("b", f"b{i}", running=True, submit=10 + i) for i in range(4)]
    after += [of("a", f"a{i}", submit=i) for i in range(4, 8)]
    after += [of("b", f"b{i}", submit=10 + i) for i in range(4, 8)]
    again = fair.schedule(inp(after, 8))
    assert sorted(a.job_id for a in again.allocations) == started and not again.reasons


def test_decayed_usage_serves_the_queue_that_used_less_and_survives_a_restart() -> None:
    """Both queues borrow alike now, but a used more in the hour before: the GPU that frees goes
    to b by their histories, to a by what they borrow now."""
    decayed, now_only = borrowers("never", half_life_s=3600.0), borrowers("never", half_life_s=0)
    assert decayed.needs.decide_on_exit and not now_only.needs.decide_on_exit
    old = [of("a", f"old{i}", running=True) for i in range(8)]
    decayed.schedule(inp(old, 8, now=0.0))  # (a holds 8 from 0 to 1800)
    b = [of("b", f"b{i}", submit=1000.0 + i) for i in range(4)]
    decayed.schedule(inp([*old[:4], *b], 8, now=1800.0))  # (the other four ended)
    state = msgspec.json.decode(msgspec.json.encode(decayed.snapshot()), type=Kueue.State)
    u = state.queues["a"]  # 8 GPUs for half an hour, then 4 (decayed with an hour's half-life)
    assert (u.gpus, u.since) == (4, 1800.0) and state.queues["b"].gpus == 4
    assert u.value == pytest.approx(8 * 3600.0 / math.log(2) * (1 - 2**-0.5))
    restored = borrowers("never", half_life_s=3600.0)
    restored.restore(state)
    # At 3600 one of a's ends: a holds 3, b 4; each has a job waiting for the free GPU.
    running = [*old[:3], *[of("b", f"b{i}", running=True) for i in range(4)]]
    waiting = [of("a", "a-next", submit=3000.0), of("b", "b-next", submit=3100.0)]
    jobs = [*running, *waiting]

    def chosen(p: Kueue) -> str:
        started = {a.job_id for a in p.schedule(inp(jobs, 8, now=3600.0)).allocations}
        (job,) = started & {"a-next", "b-next"}
        return job

    assert chosen(decayed) == chosen(restored) == "b-next"
    assert chosen(now_only) == chosen(borrowers("never")) == "a-next"
    assert borrowers(half_life_s=0).snapshot() is None


def test_fair_sharing_by_users_orders_a_queues_jobs_of_one_priority() -> None:
    jobs = [of("x", f"x{i}", running=True, submit=i) for i in range(3)]
    jobs += [of("x", "x-next", submit=5.0), of("y", "y-next", submit=6.0)]
    jobs += [of("y", "y-urgent", priority=1, submit=7.0)]
    shared = {"name": "team", "quota": {"gpu": 5}, "users": ["x", "y"]}
    by_users = queues(shared, fair_sharing={"users": True})
    assert ran(by_users, jobs) == ["x0", "x1", "x2", "y-next", "y-urgent"]
    assert ran(queues(shared), jobs) == ["x-next", "x0", "x1", "x2", "y-urgent"]
    weighted = queues(shared, fair_sharing={"users": True, "user_weights": {"x": 4.0}})
    assert ran(weighted, jobs) == ["x-next", "x0", "x1", "x2", "y-urgent"]  # (3/4 < 1)


# ---------------------------------------------------------------------- submission, reasons


def test_a_job_gets_its_priority_class_and_its_queues_time_limits_or_one_line() -> None:
    from gpuyard.shared.model import JobSpec
    from gpuyard.shared.policy.interfaces import SchedulingPolicy

    policy = queues(
        {**q("a", 4), "default_time_limit_s": 600.0, "max_time_limit_s": 3600.0},
        {**q("b", 4), "max_time_limit_s": 7200.0},
        priority_classes={"high": 100, "low": -5},
    )
    spec = JobSpec(num_gpus=1, user="a", priority_class="high")
    got = policy.accepts(spec)
    assert not isinstance(got, str)
    assert (got.priority, got.time_limit_s) == (100, 600.0)
    b = policy.accepts(JobSpec(num_gpus=1, user="b"))
    assert not isinstance(b, str) and b.time_limit_s == 7200.0  # (Slurm: MaxTime by default)
    for bad, said in [
        (JobSpec(num_gpus=1, user="a", priority_class="urgent"),
         "priority class 'urgent' is not defined (defined: high, low)"),
        (JobSpec(num_gpus=1, user="a", time_limit_s=7200.0),
         "time limit of 2:00:00 is over queue a's maximum of 1:00:00"),
        (JobSpec(num_gpus=1, user="nobody"), "user 'nobody' has no queue"),
    ]:  # fmt: skip
        why = policy.accepts(bad)
        assert isinstance(why, str) and why.startswith(said) and "\n" not in why
    plain = SchedulingPolicy().accepts(JobSpec(num_gpus=1, priority_class="high"))
    assert isinstance(plain, str) and "no priority classes" in plain


def test_a_job_its_queue_cannot_take_waits_for_quota_not_for_gpus() -> None:
    policy = queues(q("a", 2, cohort="c", borrowing_limit={"gpu": 1}), q("b", 2, cohort="c"))
    running = [of("a", f"a{i}", running=True) for i in range(3)]
    waiting = of("a", "next", submit=5.0)
    policy.schedule(inp([*running, waiting], 8))
    said = policy.waiting_reason(waiting.record)
    assert said.startswith("QuotaExceeded (queue a holds 3 of its 2 gpu GPUs, may borrow 1")
    assert policy.waiting_reason(of("b", "b0").record) == ""  # (b has quota: not quota)
    full = queues(q("a", 8))
    full.schedule(inp([*[of("a", f"f{i}", running=True) for i in range(8)], waiting], 8))
    assert full.waiting_reason(waiting.record) == ""  # (no GPU free: Resources, not quota)
    assert full.waiting_reason(of("z", "z0").record).startswith("NoQueue")

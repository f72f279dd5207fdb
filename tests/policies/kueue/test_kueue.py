"""Kueue's quotas as a pure policy (no NATS): nominal quota, borrowing within a cohort up to its
limits, reclaim and preemption within a queue by priority, jobs passed over (BestEffortFIFO), the
queue a job's user gives, and the queues file's mistakes in one line each."""

from __future__ import annotations

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
                                             changed=changed if step else None)).allocations  # fmt: skip
        whole = fresh.schedule(
            SchedulingInput(now=float(step), jobs=jobs, cluster=cluster)
        ).allocations
        assert sorted(told, key=lambda a: a.job_id) == sorted(whole, key=lambda a: a.job_id)
        # The decision takes effect: the jobs it names run, the others wait.
        names = {a.job_id: a for a in told}
        for job_id, view in active.items():
            r = view.record
            was = r.state
            if job_id in names:
                r.state, r.gpus, r.gpu_type = "running", names[job_id].num_gpus, "gpu"
            else:
                r.state, r.gpus, r.gpu_type = "queued", 0, None
            if r.state != was:
                changed[job_id] = view
        kept.schedule(SchedulingInput(now=float(step), jobs=jobs, cluster=cluster, changed={
            j: active.get(j) for j in changed}))  # fmt: skip


def test_gpuyard_queues_counts_each_queues_gpus_borrowed_and_jobs() -> None:
    from gpuyard.cli.ops import format_queues, queue_rows

    config = queues(q("a", 2, cohort="c"), q("b", 4, cohort="c")).params
    jobs = [of("a", "a0", gpus=3, running=True, gpu_type="gpu"), of("a", "a1"),
            of("b", "b0", running=True, gpu_type="gpu"), of("x", "x0")]  # fmt: skip
    rows = {r["queue"]: r for r in queue_rows(config, [j.record for j in jobs])}
    assert rows["a"] == {"queue": "a", "cohort": "c", "quota": {"gpu": 2}, "held": {"gpu": 3},
                         "borrowed": {"gpu": 1}, "running": 1, "waiting": 1}  # fmt: skip
    assert (rows["b"]["held"], rows["b"]["borrowed"], rows["b"]["waiting"]) == ({"gpu": 1}, {}, 0)
    assert format_queues(list(rows.values())).splitlines()[1].split() == [
        "a", "c", "gpu:2", "gpu:3", "gpu:1", "1", "1"]  # fmt: skip

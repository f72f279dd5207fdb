"""ElasticFlow's planning on hand-computed cases: Minimum Satisfactory Share, leftovers, EDF."""

from __future__ import annotations

import math
import random

import pytest

from gpuyard.policies.elasticflow.planner import (
    NO_DEADLINE,
    Demand,
    Plan,
    Timeline,
    align_up,
    plan_all_edf,
    plan_all_mss,
    plan_edf,
    plan_mss,
    release,
    share_leftovers,
)

LEVELS = (1, 2, 4)
RATES = (1.0, 1.8, 3.2)  # steps/s at 1, 2, 4 GPUs: sublinear


def demand(remaining: float, deadline: float, rates: tuple[float, ...] = RATES) -> Demand:
    return Demand(remaining, deadline, LEVELS[: len(rates)], rates)


def test_align_up_is_relative_to_the_start():
    assert align_up(0, 61, 60) == 120
    assert align_up(7, 67, 60) == 67
    assert align_up(7, 68, 60) == 127
    assert align_up(100, 50, 60) == 100  # a deadline less than a slot past: the start itself


def test_smallest_level_that_meets_the_deadline_wins():
    # 100 steps by t=60: 1 GPU does 60 (too few), 2 GPUs do 108 -> 2 GPUs from now.
    plan, after = plan_mss(Timeline.empty(0, 4), demand(100, 60), 0, 10, 4)
    assert (plan.starts, plan.gpus) == ([0], [2])
    assert plan.finish == math.ceil(100 / 1.8) == 56
    assert plan.end == 60  # the finish rounded up to a slot: when the GPUs come back
    assert plan.feasible
    assert (after.times, after.free) == ([0, 60], [2, 4])


def test_backward_fill_starts_a_job_as_late_as_its_deadline_allows():
    # The first job holds 4 GPUs until t=50; the second (30 steps by t=100 on one GPU) is filled
    # backwards from its deadline, so it idles until 50 and runs 50..80.
    busy = demand(160, 50)  # only 4 GPUs make it: done at 50 exactly
    late = Demand(30, 100, (1,), (1.0,))
    (first, second), timeline = plan_all_mss([busy, late], 0, 10, 4)
    assert (first.starts, first.gpus, first.end) == ([0], [4], 50)
    assert (second.starts, second.gpus) == ([0, 50], [0, 1])
    assert (second.finish, second.end) == (80, 80)
    assert second.at(10) == 0 and second.at(60) == 1 and second.at(80) == 0
    assert second.next_change(0) == 50
    assert (timeline.times, timeline.free) == ([0, 50, 80], [0, 3, 4])


def test_the_level_below_runs_before_the_point_the_backward_fill_stopped_at():
    # 1 GPU free in 0..50, 4 from 50; 150 steps by t=100. Level 1 covers 100, level 2 140 (only
    # 1 GPU fits before 50): both fail. Level 4 covers them within 50..100 (160), so it runs from
    # 50 and the level tried before it (2, capped to the 1 GPU free) runs before: 50 steps by 50,
    # the other 100 on 4 GPUs in 32 s.
    timeline = Timeline([0, 50], [1, 4])
    plan, after = plan_mss(timeline, demand(150, 100), 0, 10, 4)
    assert (plan.starts, plan.gpus) == ([0, 50], [1, 4])
    assert (plan.finish, plan.end) == (82, 90)
    assert (after.times, after.free) == ([0, 90], [0, 4])
    # Where no level is needed beyond what fits, the smallest wins and runs from now.
    plan, _ = plan_mss(timeline, demand(80, 100), 0, 10, 4)
    assert (plan.starts, plan.gpus, plan.finish) == ([0], [1], 80)
    # 200 steps: level 4 fills 50..100 (160) and 0..50 at the 1 GPU that fits (50): from now.
    plan, _ = plan_mss(timeline, demand(200, 100), 0, 10, 4)
    assert (plan.starts, plan.gpus) == ([0, 50], [1, 4])
    assert plan.finish == 50 + math.ceil((200 - 50) / 3.2)


def test_only_the_segment_ending_at_the_aligned_deadline_counts_to_the_real_deadline():
    # Deadline 95 is aligned to 100; one GPU covers 95 steps, not 100.
    plan, _ = plan_mss(Timeline.empty(0, 4), demand(96, 95), 0, 10, 4)
    assert plan.gpus == [2]
    plan, _ = plan_mss(Timeline.empty(0, 4), demand(95, 95), 0, 10, 4)
    assert plan.gpus == [1]


def test_a_job_no_level_can_save_runs_at_its_largest_level_past_its_deadline():
    plan, after = plan_mss(Timeline.empty(0, 4), demand(1000, 100), 0, 10, 4)
    assert not plan.feasible
    assert plan.gpus[0] == 4
    assert plan.finish == math.ceil(1000 / 3.2)
    assert after.at(0) == 0


def test_a_best_effort_job_waits_for_everything_with_a_deadline():
    urgent = Demand(320, 100, LEVELS, RATES)  # needs all 4 GPUs until 100
    (_, best), _ = plan_all_mss([urgent, demand(10, NO_DEADLINE)], 0, 10, 4)
    assert best.at(0) == 0 and best.at(100) == 1


def test_release_gives_a_plan_back():
    plans, timeline = plan_all_mss([demand(100, 60)], 0, 10, 4)
    assert (release(timeline, plans[0]).times, release(timeline, plans[0]).free) == ([0], [4])


def test_leftovers_go_first_to_jobs_with_nothing_now():
    # 'waits' is planned to start later (backward fill); the spare GPUs reach it before 'runs'.
    runs = Demand(100, 1000, LEVELS, RATES)
    waits = Demand(50, 2000, LEVELS, RATES)
    plans, timeline = plan_all_mss([runs, waits], 0, 10, 4)
    assert [p.at(0) for p in plans] == [1, 0]
    gpus, _ = share_leftovers([runs, waits], plans, timeline, 0, 10, 4)
    assert gpus[1] > 0
    assert sum(gpus) <= 4


@pytest.mark.parametrize(("order", "winner"), [("reference", 0), ("saving", 1)])
def test_marginal_order_reference_serves_the_largest_gpu_time_increase_first(order, winner):
    # Two running jobs with 3 spare GPUs after their minimum shares (1 each of 5): one more level
    # for 'flat' (no speed-up) costs GPU-time, for 'linear' it costs nothing. ElasticFlow's code
    # serves the costly one first; the paper's marginal return the free one.
    flat = Demand(600, 600, (1, 2), (1.0, 1.0))
    linear = Demand(600, 601, (1, 2), (1.0, 2.0))
    plans, timeline = plan_all_mss([flat, linear], 0, 60, 3)
    assert [p.at(0) for p in plans] == [1, 1]
    gpus, served = share_leftovers([flat, linear], plans, timeline, 0, 60, 3, order=order)
    assert gpus[winner] == 2 and gpus[1 - winner] == 1
    assert served[0] == winner  # (its price ranks first: ElasticFlow places it first)


def test_leftovers_never_exceed_the_cluster():
    jobs = [Demand(500.0 * (i + 1), 2000.0 + i, LEVELS, RATES) for i in range(5)]
    plans, timeline = plan_all_mss(jobs, 0, 10, 8)
    gpus, _ = share_leftovers(jobs, plans, timeline, 0, 10, 8)
    assert sum(gpus) == 8
    assert all(g in (0, *LEVELS) for g in gpus)


def test_edf_gives_the_earliest_deadline_as_much_as_it_can_use():
    first = demand(320, 200)  # 4 GPUs: done at 100
    second = demand(180, 300)  # waits for first: 4 GPUs from 100, done at 100 + 57
    (a, b), _ = plan_all_edf([first, second], 0, 10, 4)
    assert (a.starts, a.gpus, a.finish, a.end) == ([0], [4], 100, 100)
    assert b.at(0) == 0 and b.at(100) == 4
    assert b.finish == 100 + math.ceil(180 / 3.2)
    assert a.feasible and b.feasible


def test_edf_takes_the_largest_level_that_fits():
    (a, b), _ = plan_all_edf([Demand(10000, 10**6, (1, 2), (1.0, 2.0)), demand(10, 100)], 0, 10, 5)
    assert a.at(0) == 2
    assert b.at(0) == 2  # 3 free: its largest level that fits


def test_edf_reference_overwrites_a_breakpoint_it_ends_on():
    # Jobs end at 100 (4 GPUs back) and the next one (on the 1 GPU left) ends exactly there too:
    # ElasticFlow's code writes the count free before it started (1) at 100.
    timeline = Timeline([0, 100], [1, 4])
    job = Demand(95, 1000, (1,), (1.0,))
    _, ours = plan_edf(timeline, job, 0, 10, 4, reference=False)
    _, theirs = plan_edf(timeline, job, 0, 10, 4)
    assert ours.at(100) == 4
    assert theirs.at(100) == 1


def test_gpu_time_counts_each_count_until_the_next_start():
    plan = Plan([0, 50], [0, 2], end=80, finish=75)
    assert plan.gpu_time() == 2 * 30


def test_lazy_leftovers_stay_within_the_cluster_and_the_levels():
    jobs = [Demand(500.0 * (i + 1), 2000.0 + 50 * i, LEVELS, RATES) for i in range(7)]
    plans, timeline = plan_all_mss(jobs, 0, 10, 12)
    gpus, _ = share_leftovers(jobs, plans, timeline, 0, 10, 12, lazy=True)
    assert sum(gpus) <= 12 and all(g in (0, *LEVELS) for g in gpus)
    assert [p.at(0) for p in plans] == gpus  # each job's plan starts at the GPUs it got


def _plain_price(
    job: Demand, plan: Plan, gpus: int, spare: int, timeline: Timeline, now: float, slot: float,
    total: int, order: str,
) -> tuple[float, tuple[Plan, Timeline] | None]:  # fmt: skip
    """A job's price for its next level and the plan and timeline it would leave, as ElasticFlow
    writes it: re-planned held at that level until the next breakpoint."""
    step = job.above(gpus)
    if step == gpus or step - gpus > spare:
        return -math.inf, None
    new, after = plan_mss(release(timeline, plan), job, now, slot, total, first=step)
    gain = (new.gpu_time() - plan.gpu_time()) / (step - gpus)
    return (math.inf if gpus == 0 else (gain if order == "reference" else -gain)), (new, after)


def _plain_serve(
    i: int, jobs: list[Demand], plans: list[Plan], gpus: list[int],
    pending: list[tuple[Plan, Timeline] | None], spare: int,
) -> tuple[Timeline, int]:  # fmt: skip
    """Job `i` takes its next level and its priced plan: (the timeline it leaves, GPUs spare)."""
    entry = pending[i]
    assert entry is not None
    plans[i], timeline = entry
    step = jobs[i].above(gpus[i])
    spare -= step - gpus[i]
    gpus[i] = step
    return timeline, spare


def _plain_walk(jobs: list[Demand], plans: list[Plan], timeline: Timeline, now: float,
                slot: float, total: int, order: str) -> tuple[list[int], list[int]]:  # fmt: skip
    """ElasticFlow's leftover walk as it is written: every job priced again after every step
    (and nothing sorted when no GPU is free)."""
    gpus = [p.at(now) for p in plans]
    spare = total - sum(gpus)
    if spare <= 0:
        return gpus, list(range(len(jobs)))
    score = [-math.inf] * len(jobs)
    pending: list[tuple[Plan, Timeline] | None] = [None] * len(jobs)

    def price(i: int) -> None:
        score[i], pending[i] = _plain_price(jobs[i], plans[i], gpus[i], spare, timeline, now,
                                            slot, total, order)  # fmt: skip

    for i in range(len(jobs)):
        price(i)
    queue = sorted(range(len(jobs)), key=lambda i: -score[i])
    while spare > 0:
        grows = [i for i in queue if gpus[i] < jobs[i].above(gpus[i]) <= gpus[i] + spare]
        if not grows:
            break
        chosen = grows[0]
        timeline, spare = _plain_serve(chosen, jobs, plans, gpus, pending, spare)
        for i in queue:
            if jobs[i].above(gpus[i]) > gpus[i]:
                price(i)
        queue.sort(key=lambda i: -score[i])
    return gpus, queue


def _plain_lazy_walk(jobs: list[Demand], plans: list[Plan], timeline: Timeline, now: float,
                     slot: float, total: int, order: str) -> list[int]:  # fmt: skip
    """The lazy walk as it is described: every job priced first; the job at the head of the line
    is priced again if a level went out since its price, and served if it still ranks first."""
    gpus = [p.at(now) for p in plans]
    spare = total - sum(gpus)
    score = [-math.inf] * len(jobs)
    pending: list[tuple[Plan, Timeline] | None] = [None] * len(jobs)
    priced = [0] * len(jobs)
    steps = 0

    def price(i: int) -> None:
        priced[i] = steps
        score[i], pending[i] = _plain_price(jobs[i], plans[i], gpus[i], spare, timeline, now,
                                            slot, total, order)  # fmt: skip

    for i in range(len(jobs)):
        price(i)
    line = sorted((-score[i], i) for i in range(len(jobs)) if score[i] > -math.inf)
    while line and spare > 0:
        _, i = line.pop(0)
        if priced[i] != steps:
            price(i)
            if score[i] == -math.inf:
                continue
            if line and (-score[i], i) > line[0]:
                line = sorted([*line, (-score[i], i)])
                continue
        timeline, spare = _plain_serve(i, jobs, plans, gpus, pending, spare)
        steps += 1
        price(i)
        if score[i] > -math.inf:
            line = sorted([*line, (-score[i], i)])
    return gpus


def _random_walks(seed: int):
    """Random clusters, deadlines and speed-ups: (jobs, plans, timeline, now, slot, total,
    order) before a leftover walk."""
    rng = random.Random(seed)
    for _ in range(150):
        total, slot, now = rng.choice([8, 32, 256]), rng.choice([60.0, 240.0]), 1234.5
        jobs = []
        for _ in range(rng.randint(1, 12)):
            levels = rng.choice([(1, 2, 4), (1, 2, 4, 8), (1, 2, 4, 8, 16, 32)])
            base = rng.uniform(0.5, 5)
            rates = tuple(base * g ** rng.uniform(0.3, 1.0) for g in levels)
            remaining = rng.uniform(100, 50_000)
            deadline = now + rng.uniform(0.05, 4) * remaining / rates[0]
            jobs.append(Demand(remaining, deadline if rng.random() < 0.9 else NO_DEADLINE,
                               levels, rates))  # fmt: skip
        jobs.sort(key=lambda job: job.deadline)
        plans, timeline = plan_all_mss(jobs, now, slot, total)
        yield jobs, plans, timeline, now, slot, total, rng.choice(["reference", "saving"])


@pytest.mark.parametrize("seed", range(4))
def test_the_leftover_walk_keeps_only_prices_that_hold(seed):
    """The walk re-plans only the jobs whose price a step may have changed: on random clusters,
    deadlines and speed-ups it hands out the same GPUs, leaves the same plans and the jobs in the
    same order as the walk that prices every job after every step."""
    for jobs, expected, timeline, now, slot, total, order in _random_walks(seed):
        walked = [Plan(list(p.starts), list(p.gpus), p.end, p.finish, p.deadline) for p in expected]
        want = _plain_walk(jobs, expected, timeline, now, slot, total, order)
        assert share_leftovers(jobs, walked, timeline, now, slot, total, order=order) == want
        assert walked == expected


@pytest.mark.parametrize("seed", range(4))
def test_the_lazy_walk_prices_only_what_it_serves(seed):
    """The lazy walk leaves unpriced the jobs with no GPUs until it serves them, and keeps no
    scopes: it hands out the same GPUs and leaves the same plans as the lazy walk that prices
    every job first and each job it is about to serve again."""
    for jobs, expected, timeline, now, slot, total, order in _random_walks(seed):
        walked = [Plan(list(p.starts), list(p.gpus), p.end, p.finish, p.deadline) for p in expected]
        want = _plain_lazy_walk(jobs, expected, timeline, now, slot, total, order)
        got, _ = share_leftovers(jobs, walked, timeline, now, slot, total, order=order, lazy=True)
        assert got == want
        assert walked == expected

"""End-to-end simulations: every decision crosses a real NATS server between the services."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
from pathlib import Path

import msgspec
import pandas as pd
import pytest

from gpuyard.ops import read_events
from gpuyard.run.embedded import EmbeddedNats
from gpuyard.run.simulate import SimOptions, SimResult, simulate
from gpuyard.services.scheduler.service import Scheduler
from gpuyard.services.scheduler.stages import Stages
from gpuyard.services.simclock.instants import AHEAD_JOBS
from gpuyard.shared.connection import connect
from gpuyard.shared.contract import ServiceStats
from gpuyard.shared.endpoints import Subjects
from gpuyard.shared.model import ClusterSpec, JobSpec
from gpuyard.shared.throughput import load_throughputs
from gpuyard.workloads import blox, gavel
from tests.polling import run_gpuyard


def poisson_workload(n: int, load: float, seed: int, gpu_demand=None) -> list[JobSpec]:
    return blox(n, load, seed, gpu_demand).jobs


def job(job_id: str, gpus: int, duration: float, arrival: float, **kw) -> JobSpec:
    return JobSpec(job_id=job_id, num_gpus=gpus, duration=duration, submit_time=arrival, **kw)


# A 2-GPU job holds the whole 1x2 cluster; two 1-GPU jobs queue behind it.
HAND_MADE = [job("a", 2, 100.0, 0.0), job("b", 1, 50.0, 10.0), job("c", 1, 30.0, 20.0)]


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def clock_requests(result: SimResult) -> dict[str, int]:
    """The request/replies the simulation's clock made, by subject."""
    requests = next(s for s in result.stats if s.service == "simclock").requests
    return {subject: int(n) for subject, (n, _) in requests.items()}


async def test_a_server_private_to_simulations_runs_go_on_one_thread_per_four_runs() -> None:
    """Its Go threads follow the runs it carries; a real cluster's server keeps Go's default."""
    for runs, expected in ((1, "1"), (4, "1"), (6, "2"), (None, os.environ.get("GOMAXPROCS"))):
        server = EmbeddedNats(runs=runs)
        async with server:
            environ = (
                await asyncio.to_thread(Path(f"/proc/{server.pid}/environ").read_bytes)
            ).split(b"\0")
        found = [v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"GOMAXPROCS=")]
        assert (found[0] if found else None) == expected, runs


async def test_fifo_exact_times(tmp_path: Path, nats_url: str) -> None:
    options = SimOptions(cluster=ClusterSpec.parse("1x2"), mode="events")
    result = await simulate(options, HAND_MADE, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert (by_id["a"].first_start, by_id["a"].end_time) == (0.0, 100.0)
    assert (by_id["b"].first_start, by_id["b"].end_time) == (100.0, 150.0)
    assert (by_id["c"].first_start, by_id["c"].end_time) == (100.0, 130.0)
    assert by_id["a"].gpu_seconds == 200.0
    assert result.summary["mean_jct"] == pytest.approx((100 + 140 + 110) / 3)
    assert result.summary["makespan"] == 150.0


async def test_a_decision_that_changes_nothing_is_not_sent_to_placement(
    tmp_path: Path, nats_url: str
) -> None:
    """Arrivals behind a blocked FIFO queue change no allocation: the scheduler does not ask
    placement to apply them, unless placement re-places running jobs at every apply. Either
    way the jobs run exactly as before."""
    jobs = poisson_workload(40, 60.0, seed=3)

    async def run(name: str, **placement: object) -> tuple[int, int, list[tuple]]:
        options = SimOptions(cluster=ClusterSpec.parse("2x2"), **placement)
        result = await simulate(options, jobs, tmp_path / name, nats_url=nats_url, plots=False)
        scheduler = next(s for s in result.stats if s.service == "scheduler")
        applies = sum(
            int(c) for subject, (c, _) in scheduler.requests.items() if "apply" in subject
        )
        times = [(r.job_id, r.first_start, r.end_time) for r in result.jobs]
        return applies, len(scheduler.decision_s), times

    applies, decisions, times = await run("kept")
    assert all(end is not None for _, _, end in times)
    assert applies < decisions * 0.9, (applies, decisions)
    moved_applies, moved_decisions, moved_times = await run(
        "moved", placement="first-fit", placement_params={"keep_running": False}
    )
    assert moved_applies == moved_decisions
    # (Moved jobs' runs are settled at every move: the sums agree to rounding.)
    assert [j for j, *_ in moved_times] == [j for j, *_ in times]
    assert [t for _, *ts in moved_times for t in ts] == pytest.approx(
        [t for _, *ts in times for t in ts]
    )


async def test_a_job_that_ends_is_released_with_the_next_apply_that_changes_something(
    tmp_path: Path, nats_url: str
) -> None:
    """When a job ends and the others run on as allocated, the scheduler does not ask placement
    to apply that: the ended job's GPUs go back with the next apply, before it places anything.
    Here `a` ends at 50 s beside `b` while `d` (2 GPUs) waits at the head of the FIFO queue: the
    decision at 50 s changes nothing. At 100 s `b` ends and `d` gets both GPUs, `a`'s too."""
    jobs = [job("a", 1, 50.0, 0.0), job("b", 1, 100.0, 0.0), job("d", 2, 20.0, 10.0),
            job("c", 1, 30.0, 60.0)]  # fmt: skip
    options = SimOptions(cluster=ClusterSpec.parse("1x2"), mode="events")
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url, plots=False)
    by_id = {r.job_id: r for r in result.jobs}
    assert [(by_id[j].first_start, by_id[j].end_time) for j in "abdc"] == [
        (0.0, 50.0),
        (0.0, 100.0),
        (100.0, 120.0),
        (120.0, 150.0),
    ]
    scheduler = next(s for s in result.stats if s.service == "scheduler")
    asked = scheduler.requests  # (place.stages: c's, kept back until the clock is answered)
    applies = sum(int(asked[s][0]) for s in ("place.apply", "place.stages") if s in asked)
    assert (applies, len(scheduler.decision_s)) == (3, 6)  # a and b; d with a's release; c


async def test_blox_round_semantics(tmp_path: Path, nats_url: str) -> None:
    """Blox: jobs are admitted and seen finished only at round starts (here every 60 s)."""
    options = SimOptions(
        cluster=ClusterSpec.parse("1x2"), mode="rounds", preset="blox", round_s=60.0
    )
    result = await simulate(options, HAND_MADE, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert (by_id["a"].first_start, by_id["a"].end_time) == (0.0, 120.0)
    # b and c arrive at 10 and 20, are admitted at 60, start when a's end is seen at 120.
    assert (by_id["b"].first_start, by_id["b"].end_time) == (120.0, 180.0)
    assert (by_id["c"].first_start, by_id["c"].end_time) == (120.0, 180.0)
    assert by_id["b"].submit_time == 10.0  # JCT counts from the true arrival


async def test_rounds_mode_decides_only_at_boundaries(tmp_path: Path, nats_url: str) -> None:
    jobs = [job("x", 1, 10.0, 5.0), job("y", 1, 10.0, 7.0)]
    options = SimOptions(cluster=ClusterSpec.parse("1x4"), mode="rounds", round_s=50.0)
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    starts = sorted(r.first_start for r in result.jobs)
    ends = sorted(r.end_time for r in result.jobs)
    assert starts == [50.0, 50.0]
    assert ends == [60.0, 60.0]  # exact completions, between rounds


async def test_rounds_mode_tells_a_rounds_arrivals_and_exits_together(
    tmp_path: Path, nats_url: str
) -> None:
    """Between two boundaries nothing is decided: the clock tells the scheduler of a round's
    exits and arrivals in one request each, at the last of their instants, each with its own
    time; the timeline still has a point at every one of those instants, with its counts."""
    jobs = [job("a", 2, 20.0, 5.0), job("b", 1, 30.0, 10.0), job("c", 1, 500.0, 20.0),
            job("d", 1, 10.0, 160.0), job("e", 1, 10.0, 170.0), job("f", 1, 10.0, 180.0)]  # fmt: skip
    options = SimOptions(cluster=ClusterSpec.parse("1x4"), mode="rounds", round_s=100.0)
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert [by_id[j].admit_time for j in "abcdef"] == [5.0, 10.0, 20.0, 160.0, 170.0, 180.0]
    assert [by_id[j].first_start for j in "abcdef"] == [100.0] * 3 + [200.0] * 3
    assert [by_id[j].end_time for j in "abcdef"] == [120.0, 130.0, 600.0, 210.0, 210.0, 210.0]
    t = result.timeline
    points = list(zip(t["time"].tolist(), t["busy_gpus"].tolist(), t["queued"].tolist(),
                      t["running"].tolist(), strict=True))  # fmt: skip
    assert points == [
        (5.0, 0, 1, 0), (10.0, 0, 2, 0), (20.0, 0, 3, 0), (100.0, 4, 0, 3),
        (120.0, 2, 0, 2), (130.0, 1, 0, 1), (160.0, 1, 1, 1), (170.0, 1, 2, 1), (180.0, 1, 3, 1),
        (200.0, 4, 0, 4), (210.0, 1, 0, 1), (600.0, 0, 0, 0),
    ]  # fmt: skip
    # The first arrival comes alone (no quiet window known yet); 10 and 20 come at 100, where
    # the scheduler decides (it asked to: a job waits), with its tick, and with them the later
    # arrivals, submitted ahead; so the exits at 120 and 130 come at 200 with the round's tick
    # (the jobs that arrived at 160, 170 and 180 join the queue then, at their own times: the
    # round decides on them); then the exits at 210 and 600. (Submitting only the arrivals of
    # each instant, 180 would be a submission and 200 a tick of their own.)
    assert clock_requests(result) == {
        "place.nodes.{caller}": 1, "adm.submit.{caller}": 2, "sched.exited.{caller}": 3,
    }  # fmt: skip


async def test_events_mode_goes_on_through_arrivals_that_change_nothing(
    tmp_path: Path, nats_url: str
) -> None:
    """In events mode the clock submits jobs ahead of their arrival and the scheduler goes on
    through them, deciding at each, until a decision starts something or the next completion
    comes: the same decisions and timeline as one request per arrival, in fewer requests."""
    jobs = [job("a", 1, 100.0, 0.0), job("b", 1, 50.0, 10.0), job("c", 1, 10.0, 20.0),
            job("d", 1, 10.0, 30.0), job("e", 2, 10.0, 40.0), job("f", 1, 10.0, 45.0)]  # fmt: skip
    options = SimOptions(cluster=ClusterSpec.parse("1x2"), mode="events")
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert [by_id[j].first_start for j in "abcdef"] == [0.0, 10.0, 60.0, 70.0, 100.0, 110.0]
    assert [by_id[j].end_time for j in "abcdef"] == [100.0, 60.0, 70.0, 80.0, 110.0, 120.0]
    t = result.timeline
    points = list(zip(t["time"].tolist(), t["busy_gpus"].tolist(), t["queued"].tolist(),
                      t["running"].tolist(), strict=True))  # fmt: skip
    assert points == [
        (0.0, 1, 0, 1), (10.0, 2, 0, 2), (20.0, 2, 1, 2), (30.0, 2, 2, 2), (40.0, 2, 3, 2),
        (45.0, 2, 4, 2), (60.0, 2, 3, 2), (70.0, 2, 2, 2), (80.0, 1, 2, 1), (100.0, 2, 1, 1),
        (110.0, 1, 0, 1), (120.0, 0, 0, 0),
    ]  # fmt: skip
    assert result.summary["instants"] == len(points)
    # 0 and 10 are submitted at their instants (10 with c to f, ahead: the first reply said
    # the scheduler may go on), b starts at 10; the tick at 20 goes on through 30, 40 and 45
    # (the queue is blocked) to b's end at 60, told of ahead, where c starts; then one exit
    # report per completion.
    assert clock_requests(result) == {
        "place.nodes.{caller}": 1, "adm.submit.{caller}": 2, "sched.tick": 1,
        "sched.exited.{caller}": 5,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("e_arrives", "e_runs", "exit_reports"), [(40.0, 100.0, 2), (40.0, 5.0, 2), (25.0, 2.0, 3)]
)
async def test_events_mode_goes_on_through_starts_short_of_their_least_run(
    tmp_path: Path, nats_url: str, e_arrives: float, e_runs: float, exit_reports: int
) -> None:
    """Where a decision only starts jobs, the scheduler goes on through the arrivals after it
    while no job it started could have ended: the clock says how soon one could at the least
    (the least work left of any job waiting, at the fastest rate, `least_run_s`; the soonest
    end of any job still to arrive, `least_end`). Five jobs arriving from 0 on each start as
    they arrive, in one tick from 20 on, e too where it ends after the last start (e arriving
    at 40: 140 or 45); where it ends before (arriving at 25, ending at 27), the tick stops at
    its start, and d's start at 30 goes with e's exit report. The same starts, ends and
    timeline either way."""
    arrivals = {"a": 0.0, "b": 10.0, "c": 20.0, "d": 30.0, "e": e_arrives}
    runs = {"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0, "e": e_runs}
    jobs = [job(j, 1, runs[j], arrivals[j]) for j in sorted(arrivals, key=arrivals.__getitem__)]
    options = SimOptions(cluster=ClusterSpec.parse("1x5"), mode="events")
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert {j: by_id[j].first_start for j in arrivals} == arrivals
    assert {j: by_id[j].end_time for j in arrivals} == {j: arrivals[j] + runs[j] for j in runs}
    t = result.timeline
    points = list(zip(t["time"].tolist(), t["busy_gpus"].tolist(), t["running"].tolist(),
                      strict=True))  # fmt: skip
    events = sorted([(arrivals[j], 1) for j in runs] + [(arrivals[j] + runs[j], -1) for j in runs])
    expected, running = [], 0
    for time, change in events:
        running += change
        expected.append((time, running, running))
    assert points == expected
    # a alone at 0, b at 10 with c to e ahead (a submission stops at its start); then one tick
    # at 20; then an exit report at e's end at 27 (going on to d's start), the first
    # completion's with the completions after it told of ahead but the last (where going on
    # ends), and one for the last.
    assert clock_requests(result) == {
        "place.nodes.{caller}": 1, "adm.submit.{caller}": 2, "sched.tick": 1,
        "sched.exited.{caller}": exit_reports,
    }  # fmt: skip


async def test_events_mode_goes_on_through_the_policys_own_wakes_that_change_nothing(
    tmp_path: Path, nats_url: str
) -> None:
    """Tiresias wakes at each demotion (a at 50, 100, 150; b at 60, 110, 160: queue limits of
    50, 100 and 150 GPU-seconds), where nothing waits and nothing changes: the scheduler goes on
    through them, and the clock visits them all the same (a point each on the timeline). c's
    arrival at 200 (the top queue) stops b, which resumes at c's end. The same starts, ends and
    timeline as a durable run, which never goes on and has the clock tick at each wake."""
    jobs = [job("a", 1, 300.0, 0.0), job("b", 1, 300.0, 10.0), job("c", 1, 20.0, 200.0)]
    going_on, ticking = await going_on_and_ticking(jobs, tmp_path, nats_url)
    by_id = {r.job_id: r for r in going_on.jobs}
    assert {j: (by_id[j].first_start, by_id[j].end_time) for j in "abc"} == {
        "a": (0.0, 300.0), "b": (10.0, 330.0), "c": (200.0, 220.0),
    }  # fmt: skip
    assert by_id["b"].preemptions == 1
    t = going_on.timeline
    points = list(zip(t["time"].tolist(), t["busy_gpus"].tolist(), t["queued"].tolist(),
                      strict=True))  # fmt: skip
    assert points == [
        (0.0, 1, 0), (10.0, 2, 0), (50.0, 2, 0), (60.0, 2, 0), (100.0, 2, 0), (110.0, 2, 0),
        (150.0, 2, 0), (160.0, 2, 0), (200.0, 2, 1), (220.0, 2, 0), (300.0, 1, 0),
        (330.0, 0, 0),
    ]  # fmt: skip
    assert going_on.summary["instants"] == len(points)
    # Going on: b's start ends the submission at 10; the tick at a's first wake, 50, goes on
    # through the five after it to c's arrival at 200 (its decision stops b). The ticking run
    # asks at each of the six.
    assert clock_requests(going_on)["sched.tick"] == 1
    assert clock_requests(ticking)["sched.tick"] == 6


async def test_a_wake_after_an_arrival_not_told_of_yet_is_not_gone_through(
    tmp_path: Path, nats_url: str
) -> None:
    """a's wakes at 50, 100 and 150; b arrives at 120, and the clock has not submitted it ahead
    (the first submission, at 0, goes alone). The tick at 50 must not go on to 100 and 150,
    past b's arrival: only the arrivals and exits the clock told of ahead vouch for what comes
    before them."""
    jobs = [job("a", 1, 300.0, 0.0), job("b", 1, 30.0, 120.0)]
    going_on, _ = await going_on_and_ticking(jobs, tmp_path, nats_url)
    times = going_on.timeline["time"].tolist()
    assert times == [0.0, 50.0, 100.0, 120.0, 150.0, 300.0]


async def going_on_and_ticking(
    jobs: list[JobSpec], tmp_path: Path, nats_url: str
) -> tuple[SimResult, SimResult]:
    """The jobs under Tiresias (queue limits 50, 100 and 150 GPU-seconds, no promotions) on 2
    GPUs, going on as a simulation does and durable (every instant a request of its own): the
    same jobs.csv and timeline.csv, byte for byte, and as many instants."""
    params = {"thresholds": [50.0, 100.0, 150.0], "promote_knob": 0.0}
    results = []
    for durable in (False, True):
        options = SimOptions(
            cluster=ClusterSpec.parse("1x2"), mode="events", policy="tiresias",
            policy_params=params, durable=durable,
        )  # fmt: skip
        results.append(await simulate(options, jobs, tmp_path / str(durable), nats_url=nats_url))
    for name in ("jobs.csv", "timeline.csv"):
        assert (tmp_path / "False" / name).read_bytes() == (tmp_path / "True" / name).read_bytes()
    going_on, ticking = results
    assert going_on.summary["instants"] == ticking.summary["instants"]
    return going_on, ticking


async def test_a_short_job_waiting_bounds_going_on_through_starts(
    tmp_path: Path, nats_url: str
) -> None:
    """A job that waits (x, 3 GPUs for 10 s, blocked while a runs) could start at any decision
    and end 10 s later: the tick at 10 that backfills b goes on no further than 20, and c's
    start at 20 is a tick of its own (with x's bound ignored it would be the same tick)."""
    jobs = [job("a", 1, 100.0, 0.0), job("x", 3, 10.0, 5.0), job("b", 1, 100.0, 10.0),
            job("c", 1, 50.0, 20.0), job("d", 1, 30.0, 40.0)]  # fmt: skip
    options = SimOptions(
        cluster=ClusterSpec.parse("1x3"), mode="events", policy_params={"backfill": True}
    )
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: (r.first_start, r.end_time) for r in result.jobs}
    assert by_id == {"a": (0.0, 100.0), "x": (110.0, 120.0), "b": (10.0, 110.0),
                     "c": (20.0, 70.0), "d": (70.0, 100.0)}  # fmt: skip
    assert clock_requests(result) == {
        "place.nodes.{caller}": 1, "adm.submit.{caller}": 2, "sched.tick": 2,
        "sched.exited.{caller}": 3,
    }  # fmt: skip


async def test_exits_told_ahead_are_told_again_where_the_scheduler_stopped_sooner(
    tmp_path: Path, nats_url: str
) -> None:
    """A tick going on through arrivals carries the next completion's exits; where a decision
    before it starts a job (e, backfilled at 40), the scheduler stops there and the clock tells
    of c's exit at 50 again, ahead, with e's exit at 45: one exit report for the two."""
    jobs = [job("a", 1, 100.0, 0.0), job("b", 3, 10.0, 10.0), job("c", 1, 30.0, 20.0),
            job("d", 3, 10.0, 30.0), job("e", 1, 5.0, 40.0)]  # fmt: skip
    options = SimOptions(
        cluster=ClusterSpec.parse("1x3"), mode="events", policy_params={"backfill": True}
    )
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert [by_id[j].first_start for j in "abcde"] == [0.0, 100.0, 20.0, 110.0, 40.0]
    assert [by_id[j].end_time for j in "abcde"] == [100.0, 110.0, 50.0, 120.0, 45.0]
    t = result.timeline
    assert t["time"].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 45.0, 50.0, 100.0, 110.0, 120.0]
    assert t["busy_gpus"].tolist() == [1, 1, 2, 2, 3, 2, 1, 3, 3, 0]
    assert clock_requests(result) == {
        "place.nodes.{caller}": 1, "adm.submit.{caller}": 2, "sched.tick": 1,
        "sched.exited.{caller}": 4,
    }  # fmt: skip


async def test_multi_gpu_jobs_on_partly_free_nodes(tmp_path: Path, nats_url: str) -> None:
    """Two 1-GPU jobs leave each 4-GPU node with 3 free; a 6-GPU job must span both nodes."""
    jobs = [job("s1", 1, 1000.0, 0.0), job("s2", 1, 1000.0, 0.0), job("big", 6, 100.0, 1.0)]
    options = SimOptions(cluster=ClusterSpec.parse("2x4"), mode="events", placement="consolidated")
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert by_id["big"].first_start == 1.0
    assert by_id["big"].end_time == 101.0
    timeline = pd.read_csv(tmp_path / "timeline.csv")
    assert timeline["busy_gpus"].max() == 8


@pytest.mark.slow
async def test_result_files(tmp_path: Path, nats_url: str) -> None:
    jobs = poisson_workload(60, 30.0, seed=3, gpu_demand={1: 0.5, 2: 0.3, 4: 0.2})
    options = SimOptions(cluster=ClusterSpec.parse("4x4"))
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    table = pd.read_csv(tmp_path / "jobs.csv", dtype={"job_id": str})
    assert len(table) == 60 and (table["state"] == "completed").all()
    assert ((table["jct"] - (table["end"] - table["arrival"])).abs() < 1e-6).all()
    assert (table["queueing_delay"] >= 0).all()
    # Each job ran exactly its duration at its requested GPU count (FIFO never preempts here).
    durations = {s.job_id: s.duration for s in jobs}
    assert all(abs(row.executed_time - durations[row.job_id]) < 1e-6 for row in table.itertuples())
    assert result.summary["completed"] == 60
    assert 0 < result.summary["utilization"] <= 1
    for name in ("timeline.csv", "summary.json", "jct_cdf.png", "timeline.png", "workload.jsonl"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.slow
async def test_same_seed_same_results(tmp_path: Path, nats_url: str) -> None:
    jobs = poisson_workload(80, 40.0, seed=7, gpu_demand={1: 0.6, 4: 0.4})
    options = SimOptions(cluster=ClusterSpec.parse("3x4"), mode="rounds", round_s=120.0)
    await simulate(options, jobs, tmp_path / "one", nats_url=nats_url, cluster_name="one")
    await simulate(options, jobs, tmp_path / "two", nats_url=nats_url, cluster_name="two")
    for name in ("jobs.csv", "timeline.csv"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


@pytest.mark.slow
async def test_two_simulations_share_one_server(tmp_path: Path, nats_url: str) -> None:
    """Run concurrently on one server under two namespaces: each gives what it gives alone."""
    loads = {"low": poisson_workload(50, 10.0, seed=1), "high": poisson_workload(50, 60.0, seed=2)}
    options = SimOptions(cluster=ClusterSpec.parse("2x4"), mode="events")
    for name, jobs in loads.items():
        await simulate(
            options, jobs, tmp_path / f"alone-{name}", nats_url=nats_url, cluster_name=name
        )
    await asyncio.gather(
        *(
            simulate(
                options, jobs, tmp_path / f"shared-{name}", nats_url=nats_url, cluster_name=name
            )
            for name, jobs in loads.items()
        )
    )
    for name in loads:
        alone = (tmp_path / f"alone-{name}" / "jobs.csv").read_bytes()
        assert (tmp_path / f"shared-{name}" / "jobs.csv").read_bytes() == alone
    low = pd.read_csv(tmp_path / "alone-low" / "jobs.csv")
    high = pd.read_csv(tmp_path / "alone-high" / "jobs.csv")
    assert low["queueing_delay"].mean() < high["queueing_delay"].mean()


@pytest.mark.slow
async def test_one_process_per_service_gives_the_same_results(
    tmp_path: Path, nats_url: str
) -> None:
    jobs = poisson_workload(40, 30.0, seed=5, gpu_demand={1: 0.5, 2: 0.5})
    options = SimOptions(cluster=ClusterSpec.parse("2x4"), mode="events")
    await simulate(options, jobs, tmp_path / "inproc", nats_url=nats_url, cluster_name="inproc")
    await simulate(
        options, jobs, tmp_path / "procs", nats_url=nats_url, cluster_name="procs", processes=True
    )
    for name in ("jobs.csv", "timeline.csv"):
        assert (tmp_path / "procs" / name).read_bytes() == (tmp_path / "inproc" / name).read_bytes()


async def test_embedded_server_by_default(tmp_path: Path) -> None:
    result = await simulate(SimOptions(cluster=ClusterSpec.parse("1x2")), HAND_MADE, tmp_path)
    assert result.summary["completed"] == 3


async def test_job_that_can_never_fit_is_rejected_not_lost(tmp_path: Path, nats_url: str) -> None:
    jobs = [job("ok", 1, 10.0, 0.0), job("huge", 16, 10.0, 1.0)]
    result = await simulate(
        SimOptions(cluster=ClusterSpec.parse("2x4")), jobs, tmp_path, nats_url=nats_url
    )
    assert [r.job_id for r in result.jobs] == ["ok"]
    assert result.summary["completed"] == 1


@pytest.mark.slow
async def test_load_admission_holds_then_admits_in_order(tmp_path: Path, nats_url: str) -> None:
    """Blox's load-based admission: b and c wait in the overflow queue until a's GPUs free up."""
    options = SimOptions(
        cluster=ClusterSpec.parse("1x2"), admission="load", admission_params={"threshold": 1.0}
    )
    result = await simulate(options, HAND_MADE, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert by_id["a"].admit_time == 0.0
    assert (by_id["b"].admit_time, by_id["c"].admit_time) == (100.0, 100.0)
    assert (by_id["b"].end_time, by_id["c"].end_time) == (150.0, 130.0)
    assert by_id["c"].submit_time == 20.0


@pytest.mark.slow
async def test_preemption_cost_is_charged_as_lost_progress(tmp_path: Path, nats_url: str) -> None:
    """A high-priority arrival preempts a running job at t=10; it resumes at 60."""
    from gpuyard.services.simclock.service import PreemptionCost

    jobs = [job("low", 1, 100.0, 0.0), job("high", 1, 50.0, 10.0, priority=5)]
    free = SimOptions(cluster=ClusterSpec.parse("1x1"))
    costly = SimOptions(
        cluster=ClusterSpec.parse("1x1"),
        preemption_cost=PreemptionCost(checkpoint_s=4.0, restore_s=6.0),
    )
    for name, options, low_end in (("free", free, 150.0), ("costly", costly, 160.0)):
        result = await simulate(
            options, jobs, tmp_path / name, nats_url=nats_url, cluster_name=name
        )
        by_id = {r.job_id: r for r in result.jobs}
        assert (by_id["high"].first_start, by_id["high"].end_time) == (10.0, 60.0)
        assert by_id["low"].preemptions == 1
        assert by_id["low"].end_time == low_end  # 10 s done, -4 checkpoint, -6 restore


@pytest.mark.parametrize("mode", ["events", "rounds"])
async def test_time_limits_stop_jobs_their_runs_together(
    tmp_path: Path, nats_url: str, mode: str
) -> None:
    """`long` may run 50 s of its 100: preempted at 10 by `high` (which runs 10 to 40) and
    resumed at 40 with 40 s left, it is stopped at 80 and ends `timeout` with the steps it made;
    `short` (90 to 100) ends within its limit. Rounds of 10 s: the same instants."""
    jobs = [job("long", 1, 100.0, 0.0, time_limit_s=50.0),
            job("high", 1, 30.0, 10.0, priority=5, time_limit_s=60.0),
            job("short", 1, 10.0, 90.0, time_limit_s=10.5)]  # fmt: skip
    options = SimOptions(cluster=ClusterSpec.parse("1x1"), mode=mode, round_s=10.0)
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert [by_id[j].state for j in ("long", "high", "short")] == [
        "timeout",
        "completed",
        "completed",
    ]
    long = by_id["long"]
    assert (long.preemptions, long.end_time, long.executed_time) == (1, 80.0, 50.0)
    assert long.steps_done == 50.0 and long.reason == "time limit of 0:50 reached"
    table = pd.read_csv(tmp_path / "jobs.csv", dtype={"job_id": str})
    assert table.set_index("job_id").loc["long", "state"] == "timeout"
    assert result.summary["timeout"] == 1 and result.summary["completed"] == 2


@pytest.mark.slow
async def test_node_churn_preempts_and_jobs_resume(tmp_path: Path, nats_url: str) -> None:
    """gpu-0000 leaves at 50 (taking job a's GPU) and returns at 80.

    FIFO puts a (older) first: at 50 it takes b's GPU on gpu-0001 and finishes at 100 with its 50 s
    of progress kept; b waits and resumes at 80 on the returning node: 50 + 150 s -> 230.
    """
    events = tmp_path / "node_events.csv"
    events.write_text("time,node,up\n50,gpu-0000,0\n80,gpu-0000,1\n")
    jobs = [job("a", 1, 100.0, 0.0), job("b", 1, 200.0, 0.0)]
    options = SimOptions(cluster=ClusterSpec.parse("2x1"), node_events=str(events))
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert (by_id["a"].end_time, by_id["a"].preemptions) == (100.0, 1)
    assert (by_id["b"].end_time, by_id["b"].preemptions) == (230.0, 1)
    timeline = pd.read_csv(tmp_path / "out" / "timeline.csv")
    assert timeline.loc[timeline["time"] == 50.0, "gpus"].item() == 1
    assert timeline.loc[timeline["time"] == 80.0, "gpus"].item() == 2


@pytest.mark.slow
async def test_job_without_throughput_anywhere_is_rejected_with_a_reason(
    tmp_path: Path, nats_url: str
) -> None:
    """An ElasticFlow-style table with no figure for 2 GPUs: that job can run nowhere, so admission
    rejects it (no policy would ever start it); the others go on."""
    table = tmp_path / "throughputs_A100"  # the GPU type comes from the folder name
    table.mkdir()
    (table / "toy.csv").write_text("global_batch_size,1,2,4\n64,10.0,,35.0\n")
    jobs = [
        JobSpec(job_id="ok", num_gpus=1, job_type="toy@64", total_steps=1000.0, submit_time=0.0),
        JobSpec(job_id="bad", num_gpus=2, job_type="toy@64", total_steps=1000.0, submit_time=0.0),
    ]
    options = SimOptions(cluster=ClusterSpec.parse("1x4:a100"), throughputs=str(table))
    result = await simulate(options, jobs, tmp_path / "out", nats_url=nats_url)
    assert [(r.job_id, r.state, r.end_time) for r in result.jobs] == [("ok", "completed", 100.0)]
    nc = await connect(nats_url, name="test")
    rejected = [e.event async for e in read_events(nc, Subjects("sim"), types=["job.rejected"])]
    await nc.drain()
    assert [(e.job_id, e.reason) for e in rejected] == [
        (
            "bad",
            "can never run here: the throughput model has no figure for 'toy@64' on 2 GPUs of a100",
        )
    ]


async def test_no_wake_up_after_the_last_job(tmp_path: Path, nats_url: str) -> None:
    """A policy's next decision time is computed from the jobs as the round left them: SRTF's
    starvation timer of a job that has just started must not run the clock (and the utilisation
    span) past the last completion."""
    jobs = [job("a", 1, 100.0, 0.0), job("b", 1, 50.0, 10.0)]
    options = SimOptions(cluster=ClusterSpec.parse("1x1"), policy="srtf")
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    assert result.summary["simulated_s"] == 150.0
    assert result.summary["utilization"] == pytest.approx(1.0)


@pytest.mark.slow
async def test_fifo_backfill_runs_without_preemptions(tmp_path: Path, nats_url: str) -> None:
    """Multi-GPU jobs under FIFO with backfill: jobs jump ahead of ones that do not fit, and none
    is ever preempted (only priority preempts under FIFO)."""
    jobs = poisson_workload(150, 12.0, 3, {1: 0.4, 2: 0.2, 4: 0.3, 8: 0.1})
    options = SimOptions(
        cluster=ClusterSpec.parse("2x4"), policy="fifo", policy_params={"backfill": True}
    )
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    assert result.summary["completed"] == 150
    starts = sorted(result.jobs, key=lambda r: r.first_start or 0.0)
    assert any(a.submit_time > b.submit_time for a, b in itertools.pairwise(starts))  # backfilled
    assert sum(r.preemptions for r in result.jobs) == 0


@pytest.mark.slow
async def test_heterogeneous_cluster_uses_every_type_and_never_fails_a_job(
    tmp_path: Path, nats_url: str, data
) -> None:
    """Gavel's templates on three GPU types at a light load (most jobs find every type free): an
    agnostic policy spreads jobs over the types where they can run (not alphabetically, K80
    first), and no job is started where its throughput is 0 (some templates have no K80 figure)."""
    throughputs = str(data("gavel/simulation_throughputs.json"))
    model = load_throughputs(throughputs)
    jobs = gavel(120, 3.0, 1, multi_gpu=True, throughputs=model).jobs
    options = SimOptions(
        cluster=ClusterSpec.parse("4x4:v100,4x4:p100,4x4:k80"), throughputs=throughputs
    )
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    assert result.summary["failed"] == 0 and result.summary["completed"] == len(jobs)
    nc = await connect(nats_url, name="test")
    started = [e.event async for e in read_events(nc, Subjects("sim"), types=["job.started"])]
    await nc.drain()
    first_type = {e.job_id: e.gpus[0].node_id.split("-")[0] for e in reversed(started)}
    counts = {t: list(first_type.values()).count(t) for t in ("v100", "p100", "k80")}
    assert min(counts.values()) >= len(jobs) // 6, counts


async def test_the_clock_waits_for_the_node_commands_a_reply_names(
    tmp_path: Path, nats_url: str
) -> None:
    """Placement publishes simulated nodes' commands (`clock.cmds`); the clock handles each
    number once and, before it goes on, waits for the number a reply names: a command it cannot
    carry out, or one that never comes, ends the run with one line rather than a hang."""
    from gpuyard.services.simclock.service import SimClock, SimClockConfig
    from gpuyard.shared.connection import Bus
    from gpuyard.shared.contract import NodeCommand, NodeCommands

    bus = Bus(await connect(nats_url, name="test"), Subjects("cmds"))
    config = SimClockConfig(
        workload=str(tmp_path / "none.jsonl"), cluster=ClusterSpec.parse("1x1"), call_timeout_s=0.2
    )
    clock = SimClock(bus, config)
    try:
        clock.commands_due = 1
        with pytest.raises(RuntimeError, match=r"commands #1 did not come within 0\.2 s"):
            await clock._commands_handled()
        node = NodeCommand(now=0.0, node_id="gpu-0000")  # (nothing to stop or launch)
        await clock.node_commands(NodeCommands(commands=[node], seq=1))
        await clock._commands_handled()  # (handled: no wait)
        wrong = NodeCommands(commands=[NodeCommand(now=0.0, node_id="nowhere")], seq=1)
        await clock.node_commands(wrong)  # the same number again: already handled, ignored
        assert clock.command_error is None
        await clock.node_commands(NodeCommands(commands=wrong.commands, seq=2))
        clock.commands_due = 2
        with pytest.raises(RuntimeError, match="#2: no simulated node 'nowhere'"):
            await clock._commands_handled()
    finally:
        await bus.close()


@pytest.mark.parametrize(
    ("policy", "params"),
    [("fifo", {}), ("fifo", {"backfill": True}), ("sjf", {"preemptive": True, "backfill": True})],
)
@pytest.mark.slow
async def test_a_long_queue_is_decided_from_what_changed(
    tmp_path: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch, policy: str, params: dict
) -> None:
    """Ordering policies over a queue far longer than the cluster (some jobs of a higher
    priority, which preempt): nearly every decision tells only what changed, the running jobs
    it does not name keeping their GPUs, and the jobs run exactly as when every decision names
    every allocation."""
    jobs = [
        msgspec.structs.replace(j, priority=1 if i % 7 == 3 else 0)
        for i, j in enumerate(poisson_workload(300, 40.0, 5, {1: 0.5, 2: 0.2, 4: 0.2, 8: 0.1}))
    ]
    options = SimOptions(cluster=ClusterSpec.parse("2x4"), policy=policy, policy_params=params)

    async def run(name: str) -> tuple[ServiceStats, list[tuple]]:
        result = await simulate(options, jobs, tmp_path / name, nats_url=nats_url, plots=False)
        scheduler = next(s for s in result.stats if s.service == "scheduler")
        runs = [(r.job_id, r.first_start, r.end_time, r.preemptions) for r in result.jobs]
        return scheduler, runs

    # (each decision applied alone, so that the applies can be counted: `test_stages.py`)
    monkeypatch.setattr(Stages, "can_stage", lambda *_, **__: False)
    told, runs = await run("changes")
    assert told.decisions_of_changes >= 0.9 * len(told.decision_s), told
    assert sum(p for *_, p in runs) > 0  # (preemptions happened: stops were told too)
    monkeypatch.setattr(Scheduler, "_feed", lambda self: None)  # (every allocation, every time)
    whole, whole_runs = await run("whole")
    assert whole.decisions_of_changes == 0
    assert runs == whole_runs
    assert {s: c for s, (c, _) in told.requests.items()} == {
        s: c for s, (c, _) in whole.requests.items()
    }  # (the same applies, and as many)


@pytest.mark.parametrize("mode", ["events", "rounds"])
async def test_dependencies_make_pipelines_and_cancel_what_can_never_run(
    tmp_path: Path, nats_url: str, mode: str
) -> None:
    """b runs after a completes, c after b; g needs f to complete, but f fails at 30: g is
    cancelled then, and h (after f fails) starts then; s2, a singleton, waits for s1 of the same
    user and name. Rounds of 10 s: the same instants."""
    jobs = [job("a", 1, 100.0, 0.0), job("b", 1, 50.0, 0.0, depends_on="afterok:a"),
            job("c", 1, 10.0, 0.0, depends_on="afterok:b"),
            job("f", 1, 30.0, 0.0, outcome="failed"), job("g", 1, 10.0, 0.0, depends_on="afterok:f"),
            job("h", 1, 20.0, 0.0, depends_on="afternotok:f"),
            job("s1", 1, 40.0, 0.0, user="u", name="n"),
            job("s2", 1, 40.0, 0.0, user="u", name="n", depends_on="singleton")]  # fmt: skip
    options = SimOptions(cluster=ClusterSpec.parse("1x4"), mode=mode, round_s=10.0)
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    starts = {j: by_id[j].first_start for j in by_id}
    assert starts == {"a": 0.0, "b": 100.0, "c": 150.0, "f": 0.0, "g": None, "h": 30.0,
                      "s1": 0.0, "s2": 40.0}  # fmt: skip
    assert (by_id["g"].state, by_id["g"].reason, by_id["g"].end_time) == (
        "cancelled", "DependencyNeverSatisfied", 30.0,
    )  # fmt: skip
    assert by_id["c"].end_time == 160.0 and result.summary["cancelled"] == 1
    table = pd.read_csv(tmp_path / "jobs.csv", dtype={"job_id": str}).set_index("job_id")
    assert (
        table.loc["g", "state"] == "cancelled"
        and table.loc["g", "reason"] == "DependencyNeverSatisfied"
    )


async def test_a_default_time_limit_stops_jobs_without_one_and_a_maximum_declines_more(
    tmp_path: Path, nats_url: str
) -> None:
    """Default 50 s, maximum 60 s (Slurm's DefaultTime, MaxTime): `long` (100 s of work, no limit)
    ends TIMEOUT at 50; `asks` (limit 70 s) is declined at submission; `fits` (limit 60) runs."""
    jobs = [job("long", 1, 100.0, 0.0), job("asks", 1, 10.0, 0.0, time_limit_s=70.0),
            job("fits", 1, 30.0, 0.0, time_limit_s=60.0)]  # fmt: skip
    options = SimOptions(
        cluster=ClusterSpec.parse("1x2"), default_time_limit_s=50.0, max_time_limit_s=60.0
    )
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url)
    by_id = {r.job_id: r for r in result.jobs}
    assert (by_id["long"].state, by_id["long"].end_time) == ("timeout", 50.0)
    assert by_id["fits"].state == "completed" and "asks" not in by_id
    table = pd.read_csv(tmp_path / "jobs.csv", dtype={"job_id": str}).set_index("job_id")
    assert table.loc["asks", "admission"] == "declined"
    assert (
        table.loc["asks", "reason"] == "time limit of 1:10 is over this cluster's maximum of 1:00"
    )


@pytest.mark.slow
def test_a_rounds_replay_is_told_in_few_requests(tmp_path: Path) -> None:
    """Issue 39's replay at a twentieth of its jobs (`gpuyard sim`, its own process), counted by
    the services' own counters: arrivals go ahead in batches rather than a submission a round,
    and every decision costs at most 4 request/replies whatever happens in its round."""
    jobs = 5000
    run_gpuyard(
        "sim", "--jobs", str(jobs), "--load", "360", "--gpu-demand", "1:0.7,2:0.1,4:0.15,8:0.05",
        "--cluster-spec", "256x8", "--mode", "rounds", "--policy", "fifo", "--seed", "1",
        "--out", str(tmp_path / "run"), cwd=tmp_path,
    )  # fmt: skip
    stats = json.loads((tmp_path / "run" / "stats.json").read_text())
    made: dict[str, int] = {}
    for service in stats.values():
        for subject, request in service["requests"].items():
            made[subject] = made.get(subject, 0) + request["count"]
    total = sum(made.values())
    assert made["adm.submit.{caller}"] <= 2 + math.ceil(jobs / AHEAD_JOBS)
    assert made["sched.enqueue"] == made["adm.submit.{caller}"]
    assert total <= 4 * stats["scheduler"]["decisions"]
    assert total <= 0.3 * jobs, made

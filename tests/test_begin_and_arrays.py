"""Slurm's `--begin` (`JobSpec.begin_time`, a trace's `begin_s`) and job arrays in simulated
workloads (a trace's `array`): the scheduler's table keeps jobs that may not begin yet out of the
active ones, in a heap by begin time, and takes in only those whose time came; a simulation starts
such a job no sooner, though the cluster is idle (the scheduler asks the clock for a tick then);
an `array` line is one job per task, `<id>_<index>`, at most `%N` at once, and the run ends when
every task has."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pandas as pd
import pytest

from gpuyard.cli.options import parse_begin
from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.services.scheduler.jobs import JobTable
from gpuyard.shared.model import ClusterSpec, JobRecord, JobSpec
from gpuyard.workloads import load_workload
from gpuyard.workloads.core import WorkloadError


def spec(job_id: str, **kw) -> JobSpec:  # type: ignore[no-untyped-def]
    return JobSpec(job_id=job_id, num_gpus=1, **kw)


def reloaded(table: JobTable) -> JobTable:
    """The table a restarted scheduler makes of the stored records."""
    again = JobTable()
    records = list(table.jobs.values())
    again.load(msgspec.json.decode(msgspec.json.encode(records), type=list[JobRecord]))
    return again


# --------------------------------------------------------------------------- the job table


def test_jobs_wait_for_their_begin_time_in_a_heap_and_only_those_due_are_touched() -> None:
    table = JobTable()
    waiting = [table.admit(spec(f"j{i}", begin_time=100.0 + i), 0.0, 1.0) for i in range(1000)]
    table.admit(spec("now", begin_time=0.0), 0.0, 1.0)  # (its time is its arrival: at once)
    assert list(table.active) == ["now"] and table.queued == 1
    assert waiting[0].reason == "BeginTime" and table.begins.next_time() == 100.0
    table.touched.clear()
    table.moved.clear()
    assert table.begin(99.9) == [] and not table.touched  # (none due: none looked at)
    begun = table.begin(105.5)
    due = [f"j{i}" for i in range(6)]
    assert [r.job_id for r in begun] == due and [r.reason for r in begun] == [""] * 6
    # Only the jobs due changed, and left the heap: the other 994 were not looked at.
    assert table.touched == set(due) and list(table.moved) == due
    assert (len(table.begins.heap), len(table.begins.waiting)) == (994, 994)
    assert list(table.active) == [*due, "now"] and table.begins.next_time() == 106.0  # (in order)


def test_a_job_not_begun_is_held_released_cancelled_judged_and_restored() -> None:
    table = JobTable()
    first = table.admit(spec("first"), 0.0, 1.0)
    held = table.admit(spec("held", begin_time=10.0), 0.0, 1.0)
    freed = table.admit(spec("freed", begin_time=10.0), 0.0, 1.0)
    gone = table.admit(spec("gone", begin_time=5.0), 0.0, 1.0)
    after = table.admit(spec("after", begin_time=10.0, depends_on="afterok:first"), 0.0, 1.0)
    table.hold(held, "user")
    table.hold(freed, "admin")
    table.release(freed)  # (not begun yet: it waits for its time again)
    assert (held.reason, freed.reason) == ("JobHeldUser", "BeginTime")
    assert table.end(gone, 1.0, "cancelled", "cancelled by user.alice")
    assert list(table.active) == ["first"] and table.begins.next_time() == 10.0  # (gone: dropped)
    # Stored and loaded back: the same jobs wait for their time.
    again = reloaded(table)
    assert list(again.active) == ["first"] and list(again.begins.waiting) == [
        "held", "freed", "after",
    ]  # fmt: skip
    for t in (table, again):
        assert [r.job_id for r in t.begin(10.0)] == ["held", "freed", "after"]
        # Held: held now; the dependent waits for `first` from now on; the other may start.
        assert (list(t.active), list(t.held), list(t.deps.blocked)) == (
            ["first", "freed"], ["held"], ["after"],
        )  # fmt: skip
    assert (after.reason, held.reason) == ("Dependency", "JobHeldUser")
    table.end(first, 11.0, "completed")
    table.release(held)
    assert list(table.active) == ["held", "freed", "after"]  # (in admission order)
    assert reloaded(table).begins.next_time() is None  # (begun: active after a restart)


# --------------------------------------------------------------------------- the CLI's forms


def test_begin_takes_slurms_forms_and_names_them_otherwise() -> None:
    now = time.mktime((2026, 12, 4, 10, 0, 0, 0, 0, -1))  # 10:00, local time
    hour = 3600.0
    assert parse_begin("now", now) == now
    assert parse_begin("now+10min", now) == now + 600
    assert parse_begin("now+2h", now) == now + 2 * hour
    assert parse_begin("now+90", now) == now + 90  # (seconds without a unit, as Slurm's)
    assert parse_begin("18:30", now) == now + 8.5 * hour
    assert parse_begin("09:00", now) == now + 23 * hour  # (past today: tomorrow)
    assert parse_begin("2026-12-04T18:30", now) == now + 8.5 * hour
    assert parse_begin("tomorrow", now) == parse_begin("midnight", now) == now + 14 * hour
    for bad in ("soon", "now+10x", "25:00", "2026-13-01", "now-5min"):
        with pytest.raises(ValueError, match="is not a begin time; forms: now"):
            parse_begin(bad, now)


# --------------------------------------------------------------------------- traces


def test_a_traces_begin_s_is_not_before_its_arrival_and_an_array_is_checked(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(
        "job_id,num_gpus,duration,submit_time,begin_s,array\n"
        "a,1,10,20,5,\n"
        "b,1,10,0,,0-x\n"
        "c,1,10,0,,0-1\n"
        "c_1,1,10,0,,\n"
    )
    with pytest.raises(WorkloadError) as caught:
        load_workload(trace)
    assert str(caught.value) == (
        f"{trace}: 3 broken rows: line 2, field 'begin_s': 5 is before the job's arrival at 20 "
        "(submit_time): it begins at its arrival or later; line 3, field 'array': array '0-x': "
        "'0-x' is not N, N-M or N-M:STEP; line 5, field 'job_id': duplicate job id 'c_1'"
    )


# --------------------------------------------------------------------------- simulations


@pytest.mark.parametrize(("mode", "later_starts"), [("events", 25.0), ("rounds", 30.0)])
async def test_a_job_starts_no_sooner_than_its_begin_time_though_the_cluster_is_idle(
    tmp_path: Path, nats_url: str, mode: str, later_starts: float
) -> None:
    """`later` may begin at 25 s: the cluster is idle from 10 s, and nothing else happens until
    `x` arrives at 40 s, yet it starts then (events; the scheduler going on through the arrivals
    submitted ahead stops at its time), or at the next round (rounds of 10 s). `after` may begin
    at 5 s, then waits for `a` to complete (10 s)."""
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "job_id,num_gpus,duration,submit_time,begin_s,depends_on\n"
        "a,1,10,0,,\n"
        "later,1,10,0,25,\n"
        "after,1,10,0,5,afterok:a\n"
        "x,1,10,40,,\n"
    )
    jobs = load_workload(trace).jobs
    assert [j.begin_time for j in jobs] == [None, 25.0, 5.0, None]
    options = SimOptions(cluster=ClusterSpec.parse("1x2"), mode=mode, round_s=10.0)
    result = await simulate(options, jobs, tmp_path / "run", nats_url=nats_url, plots=False)
    starts = {r.job_id: r.first_start for r in result.jobs}
    assert starts == {"a": 0.0, "later": later_starts, "after": 10.0, "x": 40.0}
    assert all(r.state == "completed" for r in result.jobs)


@pytest.mark.parametrize(("mode", "later_starts"), [("events", 25.0), ("rounds", 30.0)])
async def test_a_scheduler_going_on_through_arrivals_stops_at_a_begin_time(
    tmp_path: Path, nats_url: str, mode: str, later_starts: float
) -> None:
    """From `y`'s arrival at 10 s (it waits for 2 GPUs) the scheduler goes on through the
    arrivals submitted ahead (`x` at 40 s), its decisions changing nothing, but stops at 25 s:
    `later` may begin then, and starts on the GPU `long` leaves free (at the round after it)."""
    jobs = [
        JobSpec(job_id="long", num_gpus=1, duration=100.0, submit_time=0.0),
        JobSpec(job_id="later", num_gpus=1, duration=10.0, submit_time=0.0, begin_time=25.0),
        JobSpec(job_id="y", num_gpus=2, duration=10.0, submit_time=10.0),
        JobSpec(job_id="x", num_gpus=1, duration=10.0, submit_time=40.0),
    ]
    options = SimOptions(cluster=ClusterSpec.parse("1x2"), mode=mode, round_s=10.0)
    result = await simulate(options, jobs, tmp_path, nats_url=nats_url, plots=False)
    starts = {r.job_id: r.first_start for r in result.jobs}
    assert starts == {"long": 0.0, "later": later_starts, "y": 100.0, "x": 110.0}


@pytest.mark.parametrize("mode", ["events", "rounds"])
async def test_an_array_line_is_one_job_per_task_at_most_its_limit_at_once(
    tmp_path: Path, nats_url: str, mode: str
) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "job_id,num_gpus,duration,submit_time,array\n"
        "arr,1,10,0,0-5%2\n"
        'odd,1,7,3,"1,3,5"\n'
        "one,1,5,4,\n"
    )
    jobs = load_workload(trace).jobs
    options = SimOptions(cluster=ClusterSpec.parse("1x4"), mode=mode, round_s=10.0)
    await simulate(options, jobs, tmp_path / "run", nats_url=nats_url, plots=False)
    table = pd.read_csv(tmp_path / "run" / "jobs.csv", dtype={"job_id": str})
    tasks = [f"arr_{i}" for i in range(6)]
    assert sorted(table["job_id"]) == sorted([*tasks, "odd_1", "odd_3", "odd_5", "one"])
    assert (table["state"] == "completed").all()  # (the run ended once every task had)
    arr = table.set_index("job_id").loc[tasks]
    # At most 2 of the array's tasks run at any instant (and 2 do: the limit is what holds).
    at_once = [
        int(((arr["start"] <= t) & (t < arr["end"])).sum()) for t in sorted(set(arr["start"]))
    ]
    assert max(at_once) == 2, at_once

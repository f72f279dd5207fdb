"""`gpuyard acct`: the rows and sums built from hand-made job records (states, exit codes, waits,
GPU-hours and the GPU types of the nodes a job ran on, the time window, the filters, the sums per
user and per queue), bad input refused in one line, and accounting on a real cluster."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from gpuyard.cli import main
from gpuyard.cli.acct import (
    acct_row,
    format_acct,
    format_summary,
    gpu_hours,
    job_gpu_type,
    node_types,
    overlaps,
    select_rows,
    summarize,
)
from gpuyard.shared.contract import ClusterInfo
from gpuyard.shared.model import JobRecord, JobSpec, JobState, NodeSpec

from .test_cluster_views import Views, counter, views  # noqa: F401

NOW = 10_000.0
TYPES = {"a": "t4", "b": "t4", "c": "v100"}


def record(
    job_id: str, state: JobState = "completed", *, user: str = "alice", tenant: str = "",
    submit: float = 100.0, start: float | None = 160.0, end: float | None = 460.0,
    ran_on: tuple[str, ...] = ("a",), gpus: int = 1, **kw: Any,
) -> JobRecord:  # fmt: skip
    """A job that waited a minute and ran 5 minutes on `gpus` GPUs, unless told otherwise."""
    ran = (end - start) if start is not None and end is not None else 0.0
    fields: dict[str, Any] = {
        "executed_time": ran, "gpu_seconds": ran * gpus, "ran_on": list(ran_on),
        "exit_code": 0 if state == "completed" else None,
    } | kw  # fmt: skip
    spec = JobSpec(job_id=job_id, num_gpus=gpus, user=user, tenant=tenant, command=["train"])
    return JobRecord(
        job_id=job_id, seq=0, spec=spec, state=state, submit_time=submit, admit_time=submit,
        first_start=start, end_time=end, **fields,
    )  # fmt: skip


# --------------------------------------------------------------------------- rows


def test_rows_carry_slurm_states_exit_codes_waits_and_gpu_hours() -> None:
    done = acct_row(record("j1", gpus=2), TYPES, NOW)
    assert (done.job_state, done.exit_code, done.state_reason) == ("COMPLETED", 0, "")
    assert (done.wait_s, done.elapsed_s, done.num_gpus) == (60.0, 300.0, 2)
    assert done.gpu_hours == pytest.approx(600.0 / 3600) and done.gpu_type == "t4"
    assert (done.user, done.queue, done.name, done.node_list) == ("alice", "-", "train", ["a"])
    failed = acct_row(record("j2", "failed", exit_code=1, reason="exit 1 on a"), TYPES, NOW)
    assert (failed.job_state, failed.exit_code, failed.state_reason) == ("FAILED", 1, "exit 1 on a")
    # Cancelled before it started: no exit code, no wait, no GPU time, no type.
    never = record("j3", "cancelled", start=None, ran_on=(), reason="cancelled by user.bob")
    row = acct_row(never, TYPES, NOW)
    assert (row.job_state, row.exit_code, row.wait_s, row.gpu_hours, row.gpu_type) == (
        "CANCELLED", None, None, 0.0, None,
    )  # fmt: skip
    # Waiting: PENDING (never ran, "Resources") or REQUEUED (ran, then was preempted).
    waiting = acct_row(record("j4", "queued", start=None, end=None, ran_on=()), TYPES, NOW)
    assert (waiting.job_state, waiting.state_reason, waiting.wait_s) == (
        "PENDING",
        "Resources",
        None,
    )
    again = record("j5", "queued", end=None, attempt=1, preemptions=1, reason="preempted by fifo")
    assert acct_row(again, TYPES, NOW).job_state == "REQUEUED"
    # Running: its current run counts, in time and in GPU-hours.
    running = record("j6", "running", end=None, run_start=NOW - 1800, gpus=2, executed_time=0.0,
                     gpu_seconds=0.0)  # fmt: skip
    running.gpus = 2
    row = acct_row(running, TYPES, NOW)
    assert (row.elapsed_s, row.gpu_hours) == (1800.0, 1.0)
    assert gpu_hours(running, NOW + 1800) == 2.0

    table = format_acct([done, failed, acct_row(never, TYPES, NOW)], NOW).splitlines()
    assert table[0].split() == [
        "JOBID", "NAME", "USER", "QUEUE", "STATE", "EXIT", "SUBMIT", "START", "END", "WAIT",
        "ELAPSED", "GPUS", "GPU-HOURS", "GPU-TYPE", "PREEMPT", "REASON",
    ]  # fmt: skip
    assert table[1].split()[4:6] == ["COMPLETED", "0"] and " 1:00 " in table[1]
    assert " 5:00 " in table[1] and " 0.17 " in table[1]
    assert table[3].split()[4:6] == ["CANCELLED", "-"]


def test_gpu_types_come_from_the_nodes_a_job_ran_on() -> None:
    info = ClusterInfo(
        nodes=[NodeSpec(node_id=n, num_gpus=1, gpu_type=t) for n, t in TYPES.items()],
        capacity={}, busy={}, down={"gone": 5.0},
    )  # fmt: skip
    types = node_types(info)
    assert types == TYPES
    assert job_gpu_type(record("j", ran_on=("a", "b")), types) == "t4"
    assert job_gpu_type(record("j", ran_on=("a", "c")), types) == "mixed"
    assert job_gpu_type(record("j", ran_on=("gone",)), types) == "unknown"
    assert job_gpu_type(record("j", ran_on=("gone", "a")), types) == "mixed"
    assert job_gpu_type(record("j", ran_on=()), types) is None
    # A node gone, for a job that asked for a type: placement put it on that type.
    asked = record("j", ran_on=("gone",))
    asked.spec = JobSpec(job_id="j", num_gpus=1, gpu_type="a100")
    assert job_gpu_type(asked, types) == "a100"


# --------------------------------------------------------------------------- filters


def test_a_job_counts_when_submission_to_end_meets_the_window() -> None:
    row = acct_row(record("j"), TYPES, NOW)  # submitted at 100, ended at 460
    assert overlaps(row, None, None, NOW)
    assert overlaps(row, 460.0, None, NOW) and not overlaps(row, 461.0, None, NOW)
    assert overlaps(row, None, 100.0, NOW) and not overlaps(row, None, 99.0, NOW)
    assert overlaps(row, 200.0, 300.0, NOW)  # it ran through the whole window
    # Not ended: it lasts until now.
    running = acct_row(record("r", "running", end=None, run_start=160.0), TYPES, NOW)
    assert overlaps(running, NOW - 1, None, NOW) and not overlaps(running, NOW + 1, None, NOW)


def test_filters_choose_users_queues_states_and_times() -> None:
    rows = [
        acct_row(r, TYPES, NOW)
        for r in (
            record("late", user="bob", tenant="vision", submit=5000.0, start=5010.0, end=5100.0),
            record("early", submit=100.0),
            record("fail", "failed", tenant="vision", submit=200.0, exit_code=2),
            record("wait", "queued", user="bob", submit=300.0, start=None, end=None, ran_on=()),
        )
    ]  # fmt: skip
    ids = lambda chosen: [r.job_id for r in chosen]  # noqa: E731
    assert ids(select_rows(rows, now=NOW)) == ["early", "fail", "wait", "late"]  # by submission
    assert ids(select_rows(rows, users=["bob"], now=NOW)) == ["wait", "late"]
    assert ids(select_rows(rows, queues=["vision"], now=NOW)) == ["fail", "late"]
    assert ids(select_rows(rows, queues=["-"], now=NOW)) == ["early", "wait"]
    assert ids(select_rows(rows, states={"FAILED", "PENDING"}, now=NOW)) == ["fail", "wait"]
    assert ids(select_rows(rows, since=1000.0, now=NOW)) == ["wait", "late"]  # wait: not ended
    assert ids(select_rows(rows, until=250.0, now=NOW)) == ["early", "fail"]
    assert ids(select_rows(rows, users=["alice"], since=1000.0, now=NOW)) == []


# --------------------------------------------------------------------------- summaries


def test_summaries_count_states_sum_gpu_hours_by_type_and_average_waits() -> None:
    rows = [
        acct_row(r, TYPES, NOW)
        for r in (
            record("a1", gpus=2, start=130.0, end=1930.0),  # 1 GPU-hour on t4, waited 30 s
            record("a2", "failed", ran_on=("c",), start=190.0, end=3790.0, tenant="q"),  # v100
            record("a3", "timeout", ran_on=("a", "c"), start=100.0, end=3700.0),  # mixed
            record("b1", "cancelled", user="bob", start=None, ran_on=()),
            record("b2", "queued", user="bob", attempt=1, end=None, ran_on=("b",),
                   start=400.0, gpu_seconds=3600.0),  # requeued: waits again
            record("b3", "running", user="bob", end=None, run_start=NOW, start=NOW - 100),
        )
    ]  # fmt: skip
    summary = summarize(rows)
    assert list(summary.users) == ["alice", "bob"] and list(summary.queues) == ["-", "q"]
    alice, bob = summary.users["alice"], summary.users["bob"]
    assert alice.jobs == 3 and alice.states == {
        "COMPLETED": 1, "FAILED": 1, "CANCELLED": 0, "TIMEOUT": 1, "PENDING": 0, "RUNNING": 0,
    }  # fmt: skip
    assert alice.gpu_hours_by_type == pytest.approx({"mixed": 1.0, "t4": 1.0, "v100": 1.0})
    assert alice.gpu_hours == pytest.approx(3.0)
    assert (alice.started, alice.mean_wait_s) == (3, pytest.approx((30 + 90 + 0) / 3))
    assert bob.states["CANCELLED"] == 1 and bob.states["PENDING"] == 1
    assert bob.states["RUNNING"] == 1 and bob.started == 2
    assert bob.gpu_hours_by_type == pytest.approx({"t4": 1.0})
    assert bob.mean_wait_s == pytest.approx((300.0 + (NOW - 100 - 100.0)) / 2)
    assert summary.queues["q"].jobs == 1 and summary.queues["-"].jobs == 5
    assert summarize([]).users == {}

    users, queues = format_summary(summary).split("\n\n")
    header, *lines = users.splitlines()
    assert header.split() == [
        "USER", "JOBS", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PENDING", "RUNNING",
        "GPU-HOURS", "GPU-HOURS[mixed]", "GPU-HOURS[t4]", "GPU-HOURS[v100]", "MEAN-WAIT",
    ]  # fmt: skip
    assert lines[0].split() == ["alice", "3", "1", "1", "0", "1", "0", "0", "3.00", "1.00",
                                "1.00", "1.00", "0:40"]  # fmt: skip
    assert queues.splitlines()[0].startswith("QUEUE ")


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--state", "bogus"], "--state 'bogus' is not a job state"),
        (["--state", "rejected"], "--state REJECTED: jobs admission rejected never reach"),
        (["--since", "yesterday"], "--since 'yesterday' is neither a duration ago"),
        (["--until", "2026-13-01"], "--until '2026-13-01' is neither a duration ago"),
        (["--since", "99999999999d"], "--since '99999999999d' is neither"),
        (["--since", "1h", "--until", "2h"], "--since '1h' is after --until '2h'"),
        (["--summary", "--limit", "3"], "--limit lists the most recent jobs"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # (refused before connecting: nothing listens on this port)
    assert main(["acct", "--nats", "nats://127.0.0.1:9", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"gpuyard acct: {says}")


def test_an_unreachable_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acct", "--nats", "nats://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuyard acct: cannot connect to NATS")


# --------------------------------------------------------------------------- a real cluster


def last_json(out: str) -> Any:
    """The command's JSON: stdout carries the control plane's log lines too."""
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))


@pytest.mark.slow
async def test_acct_on_a_real_cluster(
    views: Views,  # noqa: F811
) -> None:
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    done = await views.submit("user.alice", "--name", "count", *counter(5))
    failed = await views.submit("user.alice", "--", "false")
    cancelled = await views.submit("user.bob", *counter(100000))
    code, _, err = await views.gpuyard("user.bob", "cancel", cancelled)
    assert code == 0, err
    await views.until_row(done, "COMPLETED")
    await views.until_row(failed, "FAILED")
    await views.until_row(cancelled, "CANCELLED")

    async def acct(*args: str, identity: str = "user.alice") -> Any:
        code, out, err = await views.gpuyard(identity, "acct", "--json", *args)
        assert code == 0, err
        return last_json(out)

    rows = {r["job_id"]: r for r in (await acct())["jobs"]}
    assert set(rows) == {done, failed, cancelled}  # every job's, to everyone
    assert (rows[done]["job_state"], rows[done]["exit_code"]) == ("COMPLETED", 0)
    assert rows[done]["gpu_hours"] > 0 and rows[done]["gpu_type"] == "t4"
    assert rows[done]["wait_s"] >= 0 and rows[done]["name"] == "count"
    assert (rows[failed]["job_state"], rows[failed]["exit_code"]) == ("FAILED", 1)
    assert rows[cancelled]["job_state"] == "CANCELLED" and rows[cancelled]["user"] == "bob"
    assert [r["job_id"] for r in (await acct("--user", "bob"))["jobs"]] == [cancelled]

    summary = await acct("--summary", identity="user.bob")
    alice, bob = summary["users"]["alice"], summary["users"]["bob"]
    assert (alice["jobs"], alice["states"]["COMPLETED"], alice["states"]["FAILED"]) == (2, 1, 1)
    assert (bob["jobs"], bob["states"]["CANCELLED"]) == (1, 1)
    assert alice["gpu_hours_by_type"]["t4"] > 0 and summary["queues"]["-"]["jobs"] == 3

    assert len((await acct("--since", "1h"))["jobs"]) == 3
    assert (await acct("--until", before.isoformat()))["jobs"] == []
    code, out, _ = await views.gpuyard("user.alice", "acct", "--state", "completed")
    assert code == 0 and any(line.startswith(f"{done} ") for line in out.splitlines())
    code, _, err = await views.gpuyard("user.alice", "acct", "--state", "bogus")
    assert code == 2 and [line for line in err.splitlines() if "gpuyard acct" in line] == [
        "gpuyard acct: --state 'bogus' is not a job state; states: PENDING, REQUEUED, RUNNING, "
        "COMPLETED, FAILED, CANCELLED, TIMEOUT, REJECTED (any case)"
    ]

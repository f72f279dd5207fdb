"""`gpuyard submit --begin` on a real cluster (two one-GPU agents, the CLI as each identity, under
auth): a job admitted with a begin time waits with reason BeginTime while GPUs are free, then
runs on its own (the scheduler wakes up for it); one not begun yet is held, released and
cancelled as any waiting job; a malformed time never leaves the CLI."""

from __future__ import annotations

import time

import pytest

from .test_cluster_views import Views, counter, views  # noqa: F401 (the fixture)
from .test_hold import said

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)


async def test_a_job_waits_for_its_begin_time_then_runs_and_can_be_held_or_cancelled_before(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    asked = time.time()
    later = await views.submit("user.alice", "--begin", "now+3s", *counter(5))
    row = (await views.rows(later))[later]
    assert (row["job_state"], row["state_reason"]) == ("PENDING", "BeginTime")
    begin = row["spec"]["begin_time"]
    assert asked + 3 <= begin <= time.time() + 3
    code, out, err = await views.gpuyard("user.alice", "jobs", "--state", "pending")
    assert code == 0 and later in out and "BeginTime" in out, err

    # Not begun yet: held (the hold outlasts its time), released (it waits for its time
    # again), cancelled.
    other = await views.submit("user.alice", "--begin", "now+1h", *counter(5))
    code, out, err = await views.gpuyard("user.alice", "hold", other)
    assert (code, said(out)) == (0, [f"held {other}"]), err
    assert (await views.rows(other))[other]["state_reason"] == "JobHeldUser"
    code, out, err = await views.gpuyard("user.alice", "release", other)
    assert (code, said(out)) == (0, [f"released {other}"]), err
    assert (await views.rows(other))[other]["state_reason"] == "BeginTime"
    code, out, err = await views.gpuyard("user.alice", "cancel", other)
    assert (code, said(out)) == (0, [f"cancelled {other}"]), err
    assert (await views.rows(other))[other]["job_state"] == "CANCELLED"

    # Its time comes with nothing else happening: it runs, never before its begin time.
    done = await views.until_row(later, "COMPLETED")
    assert done["first_start"] >= begin

    # A malformed time: one line, the usage status, nothing submitted.
    code, out, err = await views.gpuyard("user.alice", "submit", "--begin", "soon", *counter(1))
    assert code == 2 and not said(out)
    assert len(err.strip().splitlines()) == 1
    assert "argument --begin/-b: 'soon' is not a begin time; forms: now+N" in err

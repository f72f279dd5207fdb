"""Hold, release, requeue and cancel by filter on a real cluster, as Slurm users do them: real node
agents (two one-GPU agents, subprocesses), the CLI as each identity, under auth. A held job never
starts (reason JobHeldUser, or JobHeldAdmin when an operator held it) until released; a user holds
and releases only their own jobs, and not an operator's hold; `requeue` stops a running job (it
checkpoints) and it runs again from its checkpoint, or waits held with `--hold`; `cancel --user
--state` cancels what the filters choose, a user's own jobs only."""

from __future__ import annotations

import re

import pytest

from gpuyard.natsauth import OPERATOR
from gpuyard.ops import read_events

from .jobaccount import JOB_PYTHON
from .test_cluster_views import Views, counter, views  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)


def said(out: str) -> list[str]:
    """The command's lines of `out` (the control plane, in this process, logs there too)."""
    return [line for line in out.splitlines() if not re.match(r"\d{4}-\d\d-\d\d ", line)]


async def test_a_held_job_never_starts_until_released_and_users_release_only_their_own_hold(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    both = await views.submit("user.alice", "--gpus", "2", *counter(100000))
    await views.until_row(both, "RUNNING")
    held = await views.submit("user.alice", *counter(10))
    code, out, err = await views.gpuyard("user.alice", "hold", held)
    assert (code, said(out)) == (0, [f"held {held}"]), err
    row = (await views.rows(held))[held]
    assert (row["job_state"], row["state_reason"], row["hold"]) == (
        "PENDING",
        "JobHeldUser",
        "user",
    )
    code, out, _ = await views.gpuyard("user.alice", "jobs", "--state", "pending")
    assert held in out and "JobHeldUser" in out

    # Someone else's job, a running one, an unknown one: refused, each in one line.
    code, _, err = await views.gpuyard("user.bob", "hold", held)
    assert code == 1 and err.strip() == f"not held {held}: not your job"
    code, _, err = await views.gpuyard("user.alice", "hold", both, "j999")
    assert code == 1
    assert err.splitlines() == [
        f"not held {both}: it is running: only a waiting job is held (requeue --hold stops a "
        "running one and holds it)",
        "not held j999: no such job",
    ]

    # GPUs free up: a job submitted after it starts, the held one does not.
    code, _, err = await views.gpuyard("user.alice", "cancel", both)
    assert code == 0, err
    later = await views.submit("user.alice", *counter(100000))
    await views.until_row(later, "RUNNING")
    assert (await views.rows(held))[held]["job_state"] == "PENDING"

    # An operator's hold on top: the owner cannot release it, an operator can.
    code, out, err = await views.gpuyard("op.admin", "hold", held)
    assert (code, said(out)) == (0, [f"held {held}"]), err
    assert (await views.rows(held))[held]["state_reason"] == "JobHeldAdmin"
    code, _, err = await views.gpuyard("user.alice", "release", held)
    assert code == 1
    assert err.strip() == f"not released {held}: held by an operator: only an operator releases it"
    code, out, err = await views.gpuyard("op.admin", "release", held)
    assert (code, said(out)) == (0, [f"released {held}"]), err
    done = await views.until_row(held, "COMPLETED")
    assert done["hold"] == "" and done["state_reason"] == ""
    code, _, err = await views.gpuyard("user.alice", "release", held)
    assert code == 1 and err.strip() == f"not released {held}: it is not held"

    op = await views.c.client(OPERATOR.token)
    events = [
        (s.event.type, s.event.reason)
        async for s in read_events(op.bus.nc, op.bus.subjects, types=["job.on_hold", "job.released"])
        if s.event is not None and s.event.job_id == held
    ]  # fmt: skip
    assert events == [
        ("job.on_hold", "JobHeldUser"),
        ("job.on_hold", "JobHeldAdmin"),
        ("job.released", "released by op.admin"),
    ]


async def test_a_requeued_job_stops_and_runs_again_from_its_checkpoint_or_waits_held(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    job = await views.submit("user.alice", "--gpus", "2", *counter(100000))
    await views.until_row(job, "RUNNING")

    async def stepped() -> bool:
        return ((await views.rows(job))[job]["progress"]["steps_done"] or 0) > 20

    await views.c.until(stepped, "steps from the heartbeats", 20)
    code, out, err = await views.gpuyard("user.bob", "requeue", job)
    assert code == 1 and err.strip() == f"not requeued {job}: not your job"
    code, out, err = await views.gpuyard("user.alice", "requeue", job)
    assert (code, said(out)) == (0, [f"requeued {job}"]), err

    # It stops (its agents say so), waits again, and runs again: its second attempt, from the
    # checkpoint its first saved.
    async def again() -> bool:
        row = (await views.rows(job))[job]
        return row["job_state"] == "RUNNING" and row["attempt"] == 2

    await views.c.until(again, f"{job} running again", 30)
    row = (await views.rows(job))[job]
    assert row["preemptions"] == 1 and row["state_reason"] == ""
    assert "attempt 1" in views.job_log(job)

    # With --hold it stops and waits, held, until released.
    code, out, err = await views.gpuyard("user.alice", "requeue", "--hold", job)
    assert (code, said(out)) == (0, [f"requeued {job}"]), err
    held = await views.until_row(job, "REQUEUED")
    assert (held["state_reason"], held["hold"], held["preemptions"]) == ("JobHeldUser", "user", 2)
    small = await views.submit("user.alice", *counter(5))
    await views.until_row(small, "COMPLETED")  # (GPUs were free: the held job stayed put)
    assert (await views.rows(job))[job]["job_state"] == "REQUEUED"
    code, _, err = await views.gpuyard("user.alice", "requeue", small)
    assert (
        code == 1
        and err.strip() == f"not requeued {small}: it is completed: only a running job is requeued"
    )
    code, out, err = await views.gpuyard("user.alice", "release", job)
    assert code == 0, err
    await views.until_row(job, "RUNNING")
    code, _, err = await views.gpuyard("user.alice", "cancel", job)
    assert code == 0, err
    await views.until_row(job, "CANCELLED")


async def test_cancel_by_user_and_state_cancels_only_what_they_choose(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    running = await views.submit("user.alice", "--gpus", "2", *counter(100000))
    await views.until_row(running, "RUNNING")
    alice_waiting = [await views.submit("user.alice", *counter(10)) for _ in range(2)]
    bob_waiting = await views.submit("user.bob", *counter(10))

    # Alice's waiting jobs: not her running one, not Bob's, whatever user she names.
    code, out, err = await views.gpuyard(
        "user.alice", "cancel", "--state", "pending", "--user", "bob"
    )
    assert code == 0, err
    assert said(out) == [f"cancelled {j}" for j in alice_waiting]
    rows = await views.rows()
    assert [rows[j]["job_state"] for j in alice_waiting] == ["CANCELLED", "CANCELLED"]
    assert rows[running]["job_state"] == "RUNNING" and rows[bob_waiting]["job_state"] == "PENDING"

    # An operator cancels Bob's; then Alice's running one by state.
    code, out, err = await views.gpuyard("op.admin", "cancel", "--user", "bob")
    assert (code, said(out)) == (0, [f"cancelled {bob_waiting}"]), err
    code, out, err = await views.gpuyard("user.alice", "cancel", "--state", "running")
    assert (code, said(out)) == (0, [f"cancelled {running}"]), err
    await views.until_row(running, "CANCELLED")
    code, out, err = await views.gpuyard("user.alice", "cancel", "--state", "pending")
    assert (code, said(out), err.strip()) == (0, [], "no job to cancel")

    # Bad asks: one line each, nothing sent.
    for args, expected in [
        ((), "name the jobs, or choose them with --user and/or --state"),
        (
            ("--state", "completed"),
            "--state COMPLETED: only waiting (PENDING, REQUEUED) or RUNNING",
        ),
        (("--state", "gone"), "--state 'gone' is not a job state"),
        ((running, "--user", "bob"), "name jobs, or choose them with --user/--state: not both"),
    ]:
        code, out, err = await views.gpuyard("user.alice", "cancel", *args)
        assert code == 2 and not said(out) and len(err.splitlines()) == 1, (args, err)
        assert expected in err, (args, err)


async def test_dependencies_hold_jobs_until_the_jobs_they_name_end_as_asked(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    first = await views.submit("user.alice", *counter(40))
    then = await views.submit("user.alice", "--dependency", f"afterok:{first}", *counter(5))
    row = (await views.rows(then))[then]
    assert (row["job_state"], row["state_reason"]) == ("PENDING", "Dependency")
    failing = await views.submit("user.bob", "--", "false")
    never = await views.submit("user.alice", "-d", f"afterok:{failing}", *counter(5))
    cleanup = await views.submit("user.alice", "-d", f"afternotok:{failing}", *counter(5))
    done = await views.until_row(then, "COMPLETED")
    assert done["first_start"] >= (await views.rows(first))[first]["end_time"]
    cancelled = await views.until_row(never, "CANCELLED")
    assert cancelled["state_reason"] == "DependencyNeverSatisfied"
    await views.until_row(cleanup, "COMPLETED")

    # A job that names no job there, or itself, is refused; a malformed one never leaves the CLI.
    code, _, err = await views.gpuyard("user.alice", "submit", "-d", "afterok:j999", *counter(1))
    assert code == 1 and "dependency on j999: no such job" in err
    code, out, err = await views.gpuyard("user.alice", "submit", "-d", "later:j1", *counter(1))
    assert code == 2 and not said(out)
    assert "dependency 'later:j1': not one of after, afterany, afterok, afternotok" in err


ARRAY_TASK = """
import os, time
names = ("GPUYARD_ARRAY_JOB_ID", "GPUYARD_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_ID",
         "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX")
print("array", *(os.environ.get(n, "-") for n in names), flush=True)
time.sleep(float(os.environ["SLEEP"]))
"""


async def test_an_array_runs_a_job_per_index_at_most_its_limit_at_once(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    """`--array 1,3,5-7%1`: five jobs `<id>_<index>`, each told its index (as Slurm names it too),
    one at a time though two GPUs are free (the limit holds them back); the array's id stands for
    its tasks (listed, held, cancelled)."""
    code, out, err = await views.gpuyard(
        "user.alice", "submit", "--array", "1,3,5-7%1", "--env", "SLEEP=0.5",
        "--", *JOB_PYTHON, "-c", ARRAY_TASK,
    )  # fmt: skip
    assert code == 0, err
    tasks = [line.split()[-1] for line in said(out)]
    array_id = tasks[0].rsplit("_", 1)[0]
    assert tasks == [f"{array_id}_{i}" for i in (1, 3, 5, 6, 7)]
    rows = await views.rows(array_id)  # (an array's id stands for its tasks)
    assert sorted(rows) == sorted(tasks)
    assert sum(r["state_reason"] == "JobArrayTaskLimit" for r in rows.values()) >= 3
    for job_id in tasks:
        await views.until_row(job_id, "COMPLETED")
    rows = await views.rows(array_id)
    for i, job_id in zip((1, 3, 5, 6, 7), tasks, strict=True):
        assert f"array {array_id} {i} {i} 5 1 7" in views.job_log(job_id), views.job_log(job_id)
    runs = sorted((r["first_start"], r["end_time"]) for r in rows.values())
    most = max(sum(s <= t < e for s, e in runs) for t, _ in runs)
    assert most == 1  # (its limit, not the GPUs)

    # Another array: held and cancelled by its id; a malformed one never leaves the CLI.
    code, out, err = await views.gpuyard(
        "user.alice", "submit", "-a", "0-3%1", "--env", "SLEEP=60", "--", *JOB_PYTHON, "-c", ARRAY_TASK
    )  # fmt: skip
    assert code == 0, err
    second = said(out)[0].split()[-1].rsplit("_", 1)[0]
    await views.until_row(f"{second}_0", "RUNNING")
    code, out, err = await views.gpuyard("user.alice", "hold", f"{second}_3")
    assert code == 0 and said(out) == [f"held {second}_3"], err
    assert (await views.rows(f"{second}_3"))[f"{second}_3"]["state_reason"] == "JobHeldUser"
    code, out, err = await views.gpuyard("user.alice", "cancel", second)
    assert code == 0 and said(out) == [f"cancelled {second}_{i}" for i in range(4)], err
    for i in range(4):
        await views.until_row(f"{second}_{i}", "CANCELLED")
    code, out, err = await views.gpuyard("user.alice", "submit", "--array", "3-1", "--", "true")
    assert code == 2 and not said(out) and "array '3-1'" in err and len(err.splitlines()) == 1


async def test_a_waiting_job_says_whether_gpus_or_the_jobs_ahead_of_it_hold_it(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    """One of the two GPUs busy: a 2-GPU job waits for `Resources`; a 1-GPU job behind it waits
    though a GPU is free: FIFO starts the 2-GPU job first (`Priority`, as Slurm says)."""
    first = await views.submit("user.alice", *counter(100000))
    await views.until_row(first, "RUNNING")
    wide = await views.submit("user.alice", "--gpus", "2", *counter(5))
    narrow = await views.submit("user.bob", *counter(5))
    rows = await views.rows()
    assert (rows[wide]["state_reason"], rows[narrow]["state_reason"]) == ("Resources", "Priority")
    code, out, _ = await views.gpuyard("user.bob", "jobs", "--state", "pending")
    assert any(line.startswith(narrow) and line.rstrip().endswith("Priority") for line in said(out))
    code, _, err = await views.gpuyard("user.alice", "cancel", first)
    assert code == 0, err
    await views.until_row(narrow, "COMPLETED")

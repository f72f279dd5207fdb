"""A real cluster as its users see it, under auth: real node agents (subprocesses, GPUs from flags)
and the CLI as separate processes. Jobs start in the submitter's directory (or `--chdir`); a job
with no command is refused at submission by the CLI and by admission; `gpuyard jobs` shows
Slurm's states with the reason that holds now, users, nodes, elapsed time and progress, rejected
jobs too; `gpuyard nodes` shows a lost node DOWN since when; `gpuyard status` lists no simclock;
a preemption names the job it made room for."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.cli import main
from gpuyard.natsauth import OPERATOR
from gpuyard.ops import read_events
from gpuyard.shared.contract import Empty, SubmitRequest
from gpuyard.shared.endpoints import CLUSTER, SUBMIT
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import JobSpec

from .jobaccount import AGENT_ARGS, JOB_PYTHON, open_to_jobs
from .secured import Secured, secured_cluster

SERVICE_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")
"""A line the control plane, running in this process, logs to the same stdout meanwhile."""


def without_logs(out: str) -> str:
    """A command's output without the lines the services logged while it ran (a node command
    that timed out on a loaded machine, say)."""
    return "".join(
        line for line in out.splitlines(keepends=True) if not SERVICE_LOG_LINE.match(line)
    )


pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)

CLUSTER_IDENTITIES = ["node.a", "node.b", "user.alice", "user.bob"]
COUNTER = """
import os, sys, time
from gpuyard.jobclient import JobClient
job = JobClient.from_env()
state = job.load_checkpoint() or {"step": 0}
print("cwd", os.getcwd(), "attempt", job.attempt, flush=True)
while state["step"] < int(sys.argv[1]):
    time.sleep(0.02)
    state["step"] += 1
    job.report(iterations=state["step"], force=True)
    if job.preempted:
        job.save_checkpoint(state)
        job.exit_preempted()
"""


class Views:
    """The secured control plane, two real one-GPU agents, and the CLI as each identity."""

    def __init__(self, c: Secured, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.c = c
        self.root = root
        self.capsys = capsys
        self.cli = asyncio.Lock()
        self.agents: dict[str, asyncio.subprocess.Process] = {}

    def profile(self, identity: str) -> str:
        return str(self.c.creds.profile_path(Caller.parse(identity)))

    async def start_agent(self, node: str) -> None:
        log = (self.root / f"{node}.log").open("ab")
        self.agents[node] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuyard.cli", "nodeagent", "--nats-config",
            self.profile(f"node.{node}"), "--gpus", "1", "--gpu-type", "t4", "--no-nvml", "--heartbeat",
            "0.2", "--grace", "5", "--address", "127.0.0.1", "--state-dir",
            str(self.root / node), "--checkpoint-root", str(self.root / "ckpt"), *AGENT_ARGS,
            stdout=log, stderr=log,
        )  # fmt: skip
        log.close()

    async def gpuyard(
        self, identity: str, command: str, *args: str, cwd: Path | None = None
    ) -> tuple[int, str, str]:
        """`gpuyard COMMAND --nats-config <identity's profile> ARGS` run in `cwd` (in this
        process, beside the control plane's event loop): status, stdout, stderr."""
        argv = [command, "--nats-config", self.profile(identity), *args]

        def run() -> int:
            with contextlib.chdir(cwd or self.root):
                try:
                    return main(argv)
                except SystemExit as exc:  # argparse
                    return int(exc.code or 0)

        async with self.cli:  # one at a time: they share stdout and stderr
            code = await asyncio.to_thread(run)
            captured = self.capsys.readouterr()
        return code, without_logs(captured.out), captured.err

    async def submit(self, identity: str, *args: str, cwd: Path | None = None) -> str:
        code, out, err = await self.gpuyard(identity, "submit", *args, cwd=cwd)
        assert code == 0, err
        return out.split()[-1]

    async def rows(self, *args: str, identity: str = "user.alice") -> dict[str, dict[str, Any]]:
        code, out, err = await self.gpuyard(identity, "jobs", "--json", *args)
        assert code == 0, err
        return {row["job_id"]: row for row in json.loads(out)["jobs"]}

    async def until_row(self, job_id: str, state: str, within_s: float = 30.0) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            row = (await self.rows(job_id)).get(job_id)
            return row if row is not None and row["job_state"] == state else None

        return await self.c.until(check, f"{job_id} {state}", within_s)

    def job_log(self, job_id: str) -> str:
        return "".join(
            p.read_text() for p in sorted(self.root.glob(f"*/logs/*/{job_id}/rank*.log"))
        )


@pytest.fixture
async def views(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Views]:
    async with secured_cluster(tmp_path, CLUSTER_IDENTITIES) as c:
        v = Views(c, tmp_path, capsys)
        try:
            await asyncio.gather(v.start_agent("a"), v.start_agent("b"))
            op = await c.client(OPERATOR.token)

            async def registered() -> bool:
                return len((await op.bus.call(CLUSTER, Empty())).nodes) == 2

            await c.until(registered, "both agents registered", 30)
            capsys.readouterr()  # (the control plane's lines so far: no command's output)
            yield v
        finally:
            for proc in v.agents.values():
                if proc.returncode is None:
                    proc.terminate()
            for proc in v.agents.values():
                async with asyncio.timeout(15):
                    await proc.wait()


def counter(steps: int) -> list[str]:
    return ["--", *JOB_PYTHON, "-c", COUNTER, str(steps)]


async def test_jobs_start_where_they_were_submitted_and_need_a_command(
    views: Views, tmp_path: Path
) -> None:
    project, other = tmp_path / "project", tmp_path / "other"
    project.mkdir()
    other.mkdir()
    (project / "train.py").write_text("import os; print('ran in', os.getcwd())\n")
    # The README's `gpuyard submit -- python examples/train.py`: a path relative to the checkout.
    here = await views.submit("user.alice", "--", *JOB_PYTHON, "train.py", cwd=project)
    there = await views.submit("user.alice", "--chdir", str(other), *counter(1), cwd=project)
    nowhere = await views.submit("user.alice", "--chdir", str(tmp_path / "nope"), *counter(1))
    for job_id in (here, there):
        row = await views.until_row(job_id, "COMPLETED")
        assert row["spec"]["workdir"] in (str(project), str(other))
    assert f"ran in {project}" in views.job_log(here)
    assert f"cwd {other} " in views.job_log(there)
    failed = await views.until_row(nowhere, "FAILED")
    assert failed["state_reason"].startswith("launch failed: working directory ")
    assert str(tmp_path / "nope") in failed["state_reason"]

    # No command: the CLI refuses a job file without one, before sending anything ...
    (tmp_path / "job.toml").write_text("num_gpus = 1\n")
    code, _, err = await views.gpuyard("user.alice", "submit", "--file", str(tmp_path / "job.toml"))
    assert code == 2 and err.strip().endswith(
        "job.toml: the job has no `command`: nothing would run"
    )
    code, _, err = await views.gpuyard("user.alice", "submit")
    assert code == 2 and "give the job's command after `--`" in err
    # ... and admission refuses one that another client sends.
    alice = await views.c.client("user.alice")
    reply = await alice.bus.call(SUBMIT, SubmitRequest(jobs=[JobSpec(num_gpus=1)]))
    (result,) = reply.results
    assert result.verdict == "reject" and result.reason.startswith("no command")
    rejected = (await views.rows("--state", "Rejected"))[result.job_id]
    assert rejected["job_state"] == "REJECTED" and rejected["state_reason"] == result.reason
    assert rejected["user"] == "alice"
    code, out, _ = await views.gpuyard("user.alice", "jobs", result.job_id)
    assert code == 0 and "REJECTED" in out and "no command" in out
    # A file of jobs with one malformed: that one refused by its place and field, the rest run.
    jobs = [{"num_gpus": 1, "command": ["true"]}, {"num_gpus": "two", "command": ["true"]},
            {"num_gpus": 1, "command": ["true"]}]  # fmt: skip
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    code, out, err = await views.gpuyard(
        "user.alice", "submit", "--file", str(tmp_path / "jobs.json")
    )
    assert code == 1 and out.count("submitted ") == 2, (out, err)
    assert "rejected a job: Expected `int`, got `str` (at $.jobs[1].num_gpus)" in err


async def test_jobs_show_current_states_reasons_users_and_progress(views: Views) -> None:
    # alice's job holds both GPUs; bob's, more important, takes one: alice's is preempted for it.
    long = await views.submit("user.alice", "--gpus", "2", "--name", "long", *counter(200))
    row = await views.until_row(long, "RUNNING")
    assert sorted(row["node_list"]) == ["a", "b"] and row["num_gpus"] == 2
    assert row["state_reason"] == "" and row["user"] == "alice"

    async def progressing() -> dict[str, Any] | None:
        r = (await views.rows(long))[long]
        return r if (r["progress"]["steps_done"] or 0) > 0 and r["elapsed_s"] > 0 else None

    await views.c.until(progressing, "steps from the heartbeats", 20)
    urgent = await views.submit("user.bob", "--priority", "10", "--gpus", "1", *counter(100))
    requeued = await views.until_row(long, "REQUEUED")
    assert requeued["state_reason"] == f"preempted by fifo for {urgent}"
    for state in ("pending", "REQUEUED"):  # (a requeued job waits too, as in Slurm)
        code, out, _ = await views.gpuyard("user.alice", "jobs", "--state", state)
        assert code == 0 and long in out and f"preempted by fifo for {urgent}" in out
        assert not any(line.startswith(f"{urgent} ") for line in out.splitlines())  # RUNNING

    done = await views.until_row(long, "COMPLETED", within_s=60)
    assert done["state_reason"] == "" and done["preemptions"] >= 1  # not "preempted" any more
    assert done["progress"]["steps_done"] > 0 and done["progress"]["total_steps"] is None
    op = views.c
    events = [
        s.event async for s in read_events(
            (await op.client(OPERATOR.token)).bus.nc, (await op.client(OPERATOR.token)).bus.subjects,
            types=["job.preempted"],
        )
        if s.event is not None and s.event.job_id == long
    ]  # fmt: skip
    assert events and events[0].reason == f"preempted by fifo for {urgent}"

    # Filters: users, states in any case, the most recent; an unknown id is an error.
    assert set(await views.rows("--user", "bob")) == {urgent}
    assert set(await views.rows("--state", "completed", "--limit", "1")) == {urgent}
    code, out, _ = await views.gpuyard("user.bob", "jobs", "--state", "Completed")
    header, *lines = out.splitlines()
    assert header.split() == ["JOBID", "NAME", "USER", "STATE", "GPUS", "NODES", "ELAPSED",
                              "PROGRESS", "SUBMIT", "START", "END", "PREEMPT", "REASON"]  # fmt: skip
    mine = next(line for line in lines if line.startswith(long))
    assert " alice " in mine and " COMPLETED " in mine and "100%" not in mine
    code, _, err = await views.gpuyard("user.alice", "jobs", "--state", "preempted")
    assert code == 2 and "--state 'preempted' is not a job state" in err and "REQUEUED" in err
    code, _, err = await views.gpuyard("user.alice", "jobs", long, "j999")
    assert code == 1 and err.strip() == "gpuyard jobs: no such job: j999"
    code, _, err = await views.gpuyard("user.bob", "logs", "j999")
    assert code == 1 and err.strip() == "gpuyard logs: no such job: j999"

    # A cancellation says who cancelled.
    again = await views.submit("user.alice", *counter(100000))
    await views.until_row(again, "RUNNING")
    code, _, err = await views.gpuyard("user.alice", "cancel", again)
    assert code == 0, err
    assert (await views.until_row(again, "CANCELLED"))["state_reason"] == "cancelled by user.alice"


async def test_a_job_past_its_time_limit_is_stopped_and_ends_timeout(views: Views) -> None:
    """`--time-limit 0:02` (Slurm's M:SS): the agent stops the job 2 s after it started (SIGTERM:
    it checkpoints and exits), and it ends TIMEOUT, with its steps and why."""
    slow = await views.submit("user.alice", "--time-limit", "0:02", *counter(100000))
    row = await views.until_row(slow, "TIMEOUT")
    assert row["state_reason"] == "time limit of 0:02 reached"
    assert 2.0 <= row["elapsed_s"] < 2.0 + 5.0  # (its grace: it exits on SIGTERM at once)
    assert row["progress"]["steps_done"] > 0
    code, out, _ = await views.gpuyard("user.alice", "jobs", "--state", "timeout")
    assert code == 0 and slow in out and " TIMEOUT " in out


async def test_a_lost_node_is_down_since_then_and_status_lists_no_simclock(views: Views) -> None:
    async def both_up() -> bool:
        code, out, _ = await views.gpuyard("user.alice", "nodes")
        return code == 0 and len([line for line in out.splitlines() if " IDLE " in line]) == 2

    await views.c.until(both_up, "two idle nodes", 20)
    views.agents["b"].send_signal(signal.SIGKILL)
    await views.agents["b"].wait()

    async def b_down() -> str | None:
        code, out, _ = await views.gpuyard("user.alice", "nodes")
        lines = [line for line in out.splitlines() if line.startswith("b ")]
        return lines[0] if code == 0 and lines and " DOWN " in lines[0] else None

    line = await views.c.until(b_down, "b declared lost", 20)
    assert line.split()[1] == "DOWN" and " ago)" in line
    assert " DOWN (no heartbeat for " in line and " s) since " in line  # (why it is down)
    code, out, _ = await views.gpuyard("op.admin", "status")
    assert code == 0 and "simclock" not in out
    assert "nodes: 1 up (1 t4), 1 down" in out


SHARE = """
import os, sys, time
print("milli", os.environ.get("GPUYARD_GPU_MILLI"), "mps",
      os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "cuda",
      os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
deadline = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.05)
"""


async def test_two_shares_of_a_gpu_run_side_by_side_on_one_agent(
    views: Views, tmp_path: Path
) -> None:
    # Two halves of a GPU run at once on one agent's GPU, each told its share; a whole-GPU job
    # runs beside them on the other agent; a 0.6 share waits: no GPU has that much left.
    (tmp_path / "signals").mkdir()
    done = open_to_jobs(tmp_path / "signals") / "go"
    hold = ["--", *JOB_PYTHON, "-c", SHARE, str(done)]
    halves = [await views.submit("user.alice", "--gpus", "0.5", *hold) for _ in range(2)]
    whole = await views.submit("user.alice", "--gpus", "1", *hold)
    rows = [await views.until_row(j, "RUNNING") for j in (*halves, whole)]
    assert rows[0]["node_list"] == rows[1]["node_list"] != rows[2]["node_list"]
    more = await views.submit("user.alice", "--gpus", "0.6", *hold)
    await asyncio.sleep(1.0)  # (decisions have come and gone: it still waits)
    waiting = (await views.rows(more))[more]
    assert waiting["job_state"] == "PENDING" and waiting["spec"]["gpu_milli"] == 600
    code, out, _ = await views.gpuyard("user.alice", "jobs", *halves)
    lines = out.splitlines()[1:]
    assert code == 0 and len(lines) == 2 and all(" RUNNING  0.5  " in line for line in lines)
    done.write_text("")
    for job_id in (*halves, whole, more):
        await views.until_row(job_id, "COMPLETED")
    for job_id in halves:
        assert "milli 500 mps 50 " in views.job_log(job_id)
    assert "milli None mps None " in views.job_log(whole)

"""Jobs run as nobody who holds a secret. A real job of a submitter, on a node agent running as
root beside the control plane's state (the README's one-machine setup), tries every file and
every key it can find, the agent's environment and process, and the agent's own folders: it
finds no secret, cannot touch the agent, and the agent keeps running its jobs. An agent whose
job account could read a secret, or that would run jobs as root, refuses to start."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from gpuyard.natsauth import OPERATOR
from gpuyard.services.nodeagent.accounts import Account, JobAccounts, readable_files
from gpuyard.shared.contract import SubmitRequest
from gpuyard.shared.endpoints import SUBMIT
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import JobSpec

from .jobaccount import AS_ROOT, JOB_PYTHON
from .polling import run_gpuyard
from .secured import Secured, secured_cluster

pytestmark = pytest.mark.skipif(not AS_ROOT, reason="switching a job's account needs root")

CANARY = "agent-env-canary-7f3a"

ATTACK = r"""
import json, os, signal, stat, sys, time
report_path, agent_logs, *roots = sys.argv[1:]
agent = os.getppid()
found = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
         "env": dict(os.environ), "read": {}, "denied": 0, "refused": {}}

def read(path):
    try:
        with open(path, "rb") as f:
            found["read"][path] = f.read(4096).decode(errors="replace")
    except OSError:
        found["denied"] += 1

for root in roots + [f"/proc/{agent}/environ", f"/proc/{agent}/mem"]:
    if os.path.isdir(root):
        for base, dirs, files in os.walk(root):
            for name in files:
                read(os.path.join(base, name))
        if not os.access(root, os.R_OK | os.X_OK):
            found["denied"] += 1
    else:
        read(root)

def attempt(name, action):
    try:
        action()
        found["refused"][name] = False
    except OSError:
        found["refused"][name] = True

attempt("signal the agent", lambda: os.kill(agent, signal.SIGTERM))
attempt("plant a link among the agent's logs",
        lambda: os.symlink("/etc/passwd", os.path.join(agent_logs, "rank7.log")))
attempt("write the agent's logs folder",
        lambda: open(os.path.join(agent_logs, "mine.txt"), "w").close())
# Make the progress file the agent reads a link to a secret, then a pipe that would block it.
progress = os.environ["GPUYARD_PROGRESS_FILE"]
os.symlink(roots[0], progress)
time.sleep(1.0)
os.unlink(progress)
os.mkfifo(progress)
time.sleep(1.0)
with open(report_path, "w") as f:
    json.dump(found, f)
"""


def _node_profile(c: Secured, node: str, where: Path) -> Path:
    """The node's profile as `gpuyard auth add-node --out` leaves it: mode 600, root's."""
    path = where / f"{node}.json"
    shutil.copy(c.creds.profile_path(Caller("node", node)), path)
    path.chmod(0o600)
    return path


@pytest.mark.slow
async def test_a_job_finds_no_secret_and_cannot_touch_its_agent(tmp_path: Path) -> None:
    async with secured_cluster(tmp_path, ["user.alice", "user.bob", "node.n1"]) as c:
        state = c.creds.root
        profile = _node_profile(c, "n1", tmp_path)
        agent_state = tmp_path / "n1"
        log = (tmp_path / "agent.log").open("w")
        env = {**os.environ, "GPUYARD_NATS_CONFIG": str(profile), "AGENT_SECRET": CANARY}
        agent = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuyard.cli", "nodeagent", "--gpus", "2", "--no-nvml",
            "--heartbeat", "0.2", "--grace", "2", "--address", "127.0.0.1",
            "--state-dir", str(agent_state), "--checkpoint-root", str(tmp_path / "ckpt"),
            "--protect", str(state), stdout=log, stderr=log, env=env,
        )  # fmt: skip
        try:
            attack = tmp_path / "attack.py"
            attack.write_text(ATTACK)
            alice = await c.client("user.alice")
            bob = await c.client("user.bob")
            reply = await bob.bus.call(SUBMIT, SubmitRequest(jobs=[JobSpec(
                num_gpus=1, command=[*JOB_PYTHON, "-c", "import time; time.sleep(4)"],
            )]))  # fmt: skip
            (victim,) = [r.job_id for r in reply.results]
            report = tmp_path / "report.json"
            logs_of = agent_state / "logs" / "sec"
            # (the attacker learns its own job id only once submitted: its logs folder by glob)
            reply = await alice.bus.call(SUBMIT, SubmitRequest(jobs=[JobSpec(
                num_gpus=1, command=[
                    *JOB_PYTHON, str(attack), str(report), str(logs_of / victim),
                    str(state), str(profile), str(agent_state), str(logs_of / victim / "rank0.log"),
                ],
            )]))  # fmt: skip
            (attacker,) = [r.job_id for r in reply.results]

            async def ended(job: str) -> str | None:
                record = await c.job(job)
                return record.state if record.state in ("completed", "failed") else None

            assert await c.until(lambda: ended(attacker), "the attack ran", 60) == "completed", (
                await c.job(attacker)
            ).reason
            assert await c.until(lambda: ended(victim), "the victim's job ended", 60) == "completed"
            assert agent.returncode is None  # the agent lives on, neither killed nor blocked
        finally:
            agent.terminate()
            await asyncio.wait_for(agent.wait(), 30)
            log.close()

        found = json.loads(report.read_text())
        nobody = Account.named("nobody")
        assert (found["uid"], found["gid"]) == (nobody.uid, nobody.gid)
        assert found["read"] == {}, sorted(found["read"])
        assert found["denied"] > 0  # it did try
        assert all(found["refused"].values()), found["refused"]
        # Nothing of the agent's environment but the harmless, nothing naming its credentials.
        assert CANARY not in json.dumps(found["env"])
        assert not [k for k in found["env"] if k.startswith(("GPUYARD_NATS", "NATS_"))]
        # nobody's home is /nonexistent: the job's own `run` folder takes its place
        assert found["env"]["USER"] == "nobody"
        assert found["env"]["HOME"] == str(logs_of / attacker / "run")
        # No key of any identity anywhere in what it saw.
        seeds = [json.loads(p.read_text())["seed"] for p in (state / "profiles").glob("*.json")]
        assert seeds and not [s for s in seeds if s in report.read_text()]
        # The agent's logs folder holds only what the agent wrote.
        assert sorted(p.name for p in (logs_of / victim).iterdir()) == ["rank0.log", "run"]


@pytest.mark.slow
def test_the_agent_refuses_job_accounts_that_could_read_a_secret(tmp_path: Path) -> None:
    secret = tmp_path / "cp" / "profiles" / "op.admin.json"
    secret.parent.mkdir(parents=True)
    secret.write_text('{"seed": "SU..."}')
    os.chmod(secret.parent.parent, 0o755)
    os.chmod(secret.parent, 0o755)
    secret.chmod(0o644)  # readable by others: a job would become the operator
    base = ["nodeagent", "--gpus", "1", "--no-nvml", "--nats", "nats://127.0.0.1:1",
            "--state-dir", str(tmp_path / "n"), "--checkpoint-root", str(tmp_path / "ck")]  # fmt: skip
    refused = run_gpuyard(*base, "--protect", str(tmp_path / "cp"), cwd=tmp_path, check=False)
    assert refused.returncode == 2
    assert f"can read {secret}" in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) <= 2  # usage, and the one line
    secret.chmod(0o600)
    assert list(readable_files([tmp_path / "cp"], Account.named("nobody"))) == []

    for option, said in [
        (["--job-user", "root"], "has uid 0: no job runs as root"),
        (["--jobs-as-agent-user"], "no job runs as root"),
        (["--job-user", "no-such-account"], "there is no Unix account 'no-such-account'"),
        (["--map-user", "alice"], "--map-user 'alice' is not KEY=VALUE"),
    ]:
        out = run_gpuyard(*base, *option, cwd=tmp_path, check=False)
        assert out.returncode == 2 and said in out.stderr, (option, out.stderr)
        assert "Traceback" not in out.stderr


def test_a_job_account_that_cannot_reach_its_folders_is_refused(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(ValueError, match=r"job account 'nobody' cannot enter .*closed"):
        JobAccounts.resolve(
            "nobody", {}, False, credentials=[], control_planes=[],
            job_folders=[str(closed / "logs")],
        )  # fmt: skip
    accounts = JobAccounts.resolve(
        "nobody", {"op.admin": "nobody"}, False, credentials=[], control_planes=[],
        job_folders=[str(tmp_path)],
    )  # fmt: skip
    assert accounts.for_user("bob") == accounts.for_user("op.admin") == Account.named("nobody")


async def test_progress_files_are_read_without_following_links_or_blocking(tmp_path: Path) -> None:
    from gpuyard.services.nodeagent.procs import _read_progress

    secret = tmp_path / "secret"
    secret.write_text("{}")
    link = tmp_path / "p.json"
    link.symlink_to(secret)
    with pytest.raises(OSError):
        _read_progress(link)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.to_thread(_read_progress, fifo), 5)
    plain = tmp_path / "ok.json"
    plain.write_bytes(b"x" * 200_000)
    assert len(_read_progress(plain)) == 64 * 1024


def test_the_operator_profile_is_not_among_what_jobs_may_read(tmp_path: Path) -> None:
    """`gpuyard auth init` leaves nothing a job account can read (the state folder is 700)."""
    from gpuyard.natsauth import Credentials

    creds = Credentials(tmp_path / "state", "x")
    creds.init()
    assert creds.profile_path(OPERATOR).exists()
    assert list(readable_files([creds.root], Account.named("nobody"))) == []

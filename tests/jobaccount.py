"""Real jobs in the tests run as a node's jobs do: an agent running as root (as in CI) runs them
as its job account (`nobody` here), one that is not runs them as itself when told so
(`--jobs-as-agent-user`). What a job runs and writes must then be open to that account: its
interpreter (the venv's may live in root's home, closed to others), gpuyard.jobclient (from this
checkout, on PYTHONPATH) and the test's folder (`tmp_path` is made so by conftest)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from gpuyard.services.nodeagent.accounts import Account, reachable

REPO = Path(__file__).resolve().parents[1]
AS_ROOT = os.geteuid() == 0
AGENT_ARGS: list[str] = [] if AS_ROOT else ["--jobs-as-agent-user"]
"""What `gpuyard nodeagent` needs here to run jobs at all."""
AGENT_CONFIG: dict[str, bool] = {} if AS_ROOT else {"jobs_as_agent_user": True}
"""The same, as NodeAgentConfig's fields."""
JOB_ACCOUNT = Account.named("nobody") if AS_ROOT else None


def _job_python() -> list[str]:
    """A Python every job account can run, with this checkout's gpuyard.jobclient importable."""
    if JOB_ACCOUNT is None:
        return [sys.executable]
    for candidate in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        if candidate and reachable(Path(candidate), JOB_ACCOUNT, os.X_OK):
            return ["/usr/bin/env", f"PYTHONPATH={REPO}", candidate]
    raise RuntimeError("no Python here that an unprivileged account may run")


JOB_PYTHON = _job_python()
"""The command that starts a job's Python: `[*JOB_PYTHON, script, ...]`."""


def open_to_jobs(folder: Path) -> Path:
    """Let job accounts pass through every folder above `folder` (o+x) and write in it."""
    if AS_ROOT:
        temp = Path(tempfile.gettempdir()).resolve()
        for parent in folder.resolve().parents:
            if parent != temp and temp in parent.parents and not parent.stat().st_mode & 0o001:
                parent.chmod(parent.stat().st_mode | 0o001)
        folder.chmod(0o777)
    return folder

"""What the benchmarks measure of the machine itself."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpuyard.services.nodeagent.accounts import Account, reachable


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine so far (Linux). A sweep's workers and a comparison's
    runs are forked by a fork server that reaps them itself, so `getrusage` of the command would
    not count them: measure on an otherwise idle machine."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def open_to_jobs(folder: Path) -> Path:
    """A benchmark's temporary folder, made so that the job account a node agent running as root
    starts jobs as (`nobody` here) can enter it and write there (tests/jobaccount.py does the
    same for the tests)."""
    if os.geteuid() == 0:
        folder.chmod(0o777)
    return folder


def job_python() -> list[str]:
    """How a job starts this checkout's Python where the agent runs jobs as an unprivileged
    account, which may not reach the venv's interpreter (it may live in root's home): the
    system's, with gpuyard.jobclient (standard library only) from this checkout."""
    if os.geteuid() != 0 or reachable(Path(sys.executable), Account.named("nobody"), os.X_OK):
        return [sys.executable]
    return ["/usr/bin/env", f"PYTHONPATH={Path(__file__).resolve().parents[1]}", "/usr/bin/python3"]

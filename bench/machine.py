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


PARTS = ("nodeagent", "scheduler", "placement", "admission", "nats-server")
"""What `cpu_by_part` tells apart, by the command line of the process."""


def cpu_by_part() -> dict[str, float]:
    """CPU seconds so far (Linux) of this process and those below it, by part: each of `PARTS`
    (its own, and `<part> children` for what it started and reaped: a node agent's jobs), and
    `bench` (this process). Take two and subtract: a process that ended between them and was
    reaped by one of them counts in its parent's children."""
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, float, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        own = (int(fields[11]) + int(fields[12])) / tick
        reaped = (int(fields[13]) + int(fields[14])) / tick
        procs[int(entry)] = (int(fields[1]), own, reaped, cmdline)
    below = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, (parent, *_) in procs.items() if parent in below} - below
        below |= found
        grew = bool(found)
    out: dict[str, float] = {}
    for pid in below:
        if pid not in procs:
            continue
        _, own, reaped, cmdline = procs[pid]
        part = "bench" if pid == os.getpid() else next((p for p in PARTS if p in cmdline), "")
        if part:
            out[part] = out.get(part, 0.0) + own
            out[f"{part} children"] = out.get(f"{part} children", 0.0) + reaped
    return out

"""What the benchmarks measure of the machine itself."""

from __future__ import annotations

import os


def machine_cpu_s() -> float:
    """Busy CPU seconds of the whole machine so far (Linux). A sweep's workers and a comparison's
    runs are forked by a fork server that reaps them itself, so `getrusage` of the command would
    not count them: measure on an otherwise idle machine."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")

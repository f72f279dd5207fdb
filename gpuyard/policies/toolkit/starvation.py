"""The starvation guard (Blox's): a job that has waited long enough in a row moves up a class."""

from __future__ import annotations

from collections.abc import Iterable

from gpuyard.shared.policy import JobView

BLOX_STARVATION_S = 3.6e6
"""Blox's starvation threshold: seconds waited in a row before a job moves up one priority class."""


def is_starved(job: JobView, now: float, starvation_s: float | None) -> bool:
    """The job has waited `starvation_s` seconds in a row."""
    r = job.record  # (every job, every decision: the record's fields, not the view's properties)
    return (
        starvation_s is not None
        and r.state == "queued"
        and r.queued_since is not None
        and now - r.queued_since >= starvation_s
    )


def priority_class(job: JobView, now: float, starvation_s: float | None) -> int:
    """Sort key part (smaller first): the job's priority, one class better once starved."""
    return -(job.record.spec.priority + (1 if is_starved(job, now, starvation_s) else 0))


def next_starvation(
    jobs: Iterable[JobView], now: float, starvation_s: float | None
) -> float | None:
    """When the next waiting job crosses the starvation threshold (None if none will)."""
    if starvation_s is None:
        return None
    times = [
        since + starvation_s
        for j in jobs
        if (since := j.record.queued_since) is not None
        and j.record.state == "queued"
        and since + starvation_s > now
    ]
    return min(times, default=None)


def earliest(*times: float | None) -> float | None:
    """The earliest of the given times, ignoring None."""
    present = [t for t in times if t is not None]
    return min(present, default=None)

"""Submissions that come together on a real cluster reach the scheduler together: admission tells
it of a group's jobs in one request (one decision for a burst, not one each), and every
submitter still gets its own verdict, the scheduler's refusals included, and every job its
events."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.natsauth import OPERATOR
from gpuyard.shared.contract import Empty, SubmitRequest
from gpuyard.shared.endpoints import STATS, SUBMIT
from gpuyard.shared.model import JobSpec

from .test_cluster_views import Views, views  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow

BURST = 24


async def test_a_burst_of_submissions_reaches_the_scheduler_in_few_requests(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    alice = await views.c.client("user.alice")
    op = await views.c.client(OPERATOR.token)

    async def enqueues() -> int:
        stats = await op.bus.call(STATS, Empty(), svc="adm")
        return int(stats.requests.get("sched.enqueue", [0, 0.0])[0])

    before = await enqueues()
    jobs = [JobSpec(num_gpus=1, command=["true"], name=f"burst{i}") for i in range(BURST)]
    # Refused by the scheduler, not by admission: its policy (fifo) has no priority classes.
    jobs[7] = JobSpec(num_gpus=1, command=["true"], name="classy", priority_class="urgent")
    replies = await asyncio.gather(
        *(alice.bus.call(SUBMIT, SubmitRequest(jobs=[job])) for job in jobs)
    )
    results = [reply.results[0] for reply in replies]
    assert [r.verdict for r in results].count("admit") == BURST - 1
    assert results[7].verdict == "reject" and "priority class 'urgent'" in results[7].reason
    assert all(reply.scheduler is not None for reply in replies)  # (each told what it heard)
    assert await enqueues() - before <= BURST // 4  # (a group shares one request)
    rows = await views.rows("--state", "Rejected")
    assert rows[results[7].job_id]["state_reason"] == results[7].reason
    for r in results:
        if r.verdict == "admit":
            await views.until_row(r.job_id, "COMPLETED")

"""Held jobs on a secured real cluster (issue 40, item 7): admission decides on them again when
capacity or policy changes (a job exits, a node joins, a quota changes), not only when someone
else submits; a submit's reply names only its caller's jobs; a job's environment is shown only to
its owner and to operators."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpuyard.natsauth import OPERATOR
from gpuyard.shared.contract import (
    CancelRequest,
    ExitReport,
    JobExit,
    JobQuery,
    PageQuery,
    SetPolicy,
    SubmitReply,
    SubmitRequest,
)
from gpuyard.shared.endpoints import CANCEL, EXITED, JOBS, POLICY_SET, QUERY, SUBMIT
from gpuyard.shared.model import JobSpec

from .secured import Client, Secured, fake_agent, secured_cluster

USERS = ["user.alice", "user.bob", "node.n1", "node.n2"]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Secured]:
    async with secured_cluster(tmp_path, USERS) as c:
        yield c


async def admission_policy(c: Secured, policy: str, **params: Any) -> None:
    op = await c.client(OPERATOR.token)
    await op.bus.call(POLICY_SET, SetPolicy(policy=policy, params=params), svc="adm")


async def submit(user: Client, gpus: int = 2, tenant: str = "a", **spec: Any) -> SubmitReply:
    job = JobSpec(num_gpus=gpus, tenant=tenant, command=["train"], **spec)
    return await user.bus.call(SUBMIT, SubmitRequest(jobs=[job]))


async def held_then_admitted(c: Secured, alice: Client) -> tuple[str, str]:
    """Alice's first job (2 GPUs of tenant a) runs on n1; her second is held."""
    first = (await submit(alice)).results[0]
    assert first.verdict == "admit", first.reason
    await c.until(lambda: running_on(c, first.job_id, "n1"), f"{first.job_id} running")
    reply = await submit(alice)
    (second,) = reply.results
    assert second.verdict == "hold" and reply.held == 1, reply
    return first.job_id, second.job_id


async def running_on(c: Secured, job_id: str, node: str) -> bool:
    op = await c.client(OPERATOR.token)
    page = await op.bus.call(QUERY, JobQuery(job_ids=[job_id]))
    return bool(page.jobs) and page.jobs[0].state == "running" and page.jobs[0].nodes == [node]


async def admitted(c: Secured, job_id: str) -> bool:
    op = await c.client(OPERATOR.token)
    return bool((await op.bus.call(QUERY, JobQuery(job_ids=[job_id]))).jobs)


async def cancelled(c: Secured, job_id: str) -> bool:
    """The cancel reached the job's processes (its node agent said so): its GPUs are free."""
    op = await c.client(OPERATOR.token)
    page = await op.bus.call(QUERY, JobQuery(job_ids=[job_id]))
    return bool(page.jobs) and page.jobs[0].state == "cancelled"


async def test_a_held_job_is_admitted_when_a_job_exits(cluster: Secured) -> None:
    await admission_policy(cluster, "tenant-quota", quotas={"a": 2})
    n1 = await cluster.client("node.n1")
    beat = await fake_agent(n1, "n1")
    alice = await cluster.client("user.alice")
    first, second = await held_then_admitted(cluster, alice)

    # Nobody submits: the exit alone frees the quota, and the held job runs like any other.
    done = JobExit(job_id=first, node_id="n1", status="completed", attempt=0)
    await n1.bus.call(EXITED, ExitReport(now=time.time(), exits=[done]))
    await cluster.until(lambda: running_on(cluster, second, "n1"), f"{second} admitted and run")
    beat.cancel()


async def test_a_held_job_is_admitted_when_a_node_joins(cluster: Secured) -> None:
    await admission_policy(cluster, "load", threshold=1.0)  # demand <= the cluster's GPUs
    beat = await fake_agent(await cluster.client("node.n1"), "n1")
    alice = await cluster.client("user.alice")
    _, second = await held_then_admitted(cluster, alice)
    assert not await admitted(cluster, second)

    more = await fake_agent(await cluster.client("node.n2"), "n2")
    await cluster.until(lambda: running_on(cluster, second, "n2"), f"{second} run on n2")
    beat.cancel()
    more.cancel()


async def test_a_held_job_is_admitted_when_its_quota_is_raised(cluster: Secured) -> None:
    await admission_policy(cluster, "tenant-quota", quotas={"a": 2})
    beat = await fake_agent(await cluster.client("node.n1"), "n1", gpus=4)
    alice = await cluster.client("user.alice")
    _, second = await held_then_admitted(cluster, alice)
    assert not await admitted(cluster, second)

    await admission_policy(cluster, "tenant-quota", quotas={"a": 4})
    await cluster.until(lambda: running_on(cluster, second, "n1"), f"{second} admitted")
    beat.cancel()


async def test_a_submit_reply_names_only_the_callers_jobs(tmp_path: Path) -> None:
    def by_submits_only(configs: dict[str, Any]) -> None:
        # Held jobs decided on at the next submit only (as before events did it), so that bob's
        # submit is the one that admits alice's held job.
        configs["admission"].reconsider_on_events = False

    async with secured_cluster(tmp_path, USERS, by_submits_only) as c:
        await admission_policy(c, "tenant-quota", quotas={"a": 2})
        beat = await fake_agent(await c.client("node.n1"), "n1")
        alice, bob = await c.client("user.alice"), await c.client("user.bob")
        first, second = await held_then_admitted(c, alice)
        await alice.bus.call(CANCEL, CancelRequest(job_ids=[first]))
        await c.until(lambda: cancelled(c, first), f"{first} cancelled")
        assert not await admitted(c, second)

        reply = await submit(bob, gpus=1, tenant="b")
        assert [r.job_id for r in reply.results] != [] and second not in {
            r.job_id for r in reply.results
        }, reply
        assert [r.verdict for r in reply.results] == ["admit"] and reply.held == 0
        assert await admitted(c, second)  # admitted by bob's submit, told to nobody but alice

        # Alice's own held job decided on with her submit is named to her.
        third = (await submit(alice)).results[0].job_id  # held: the quota is in use again
        await alice.bus.call(CANCEL, CancelRequest(job_ids=[second]))
        await c.until(lambda: cancelled(c, second), f"{second} cancelled")
        reply = await submit(alice, gpus=1, tenant="c")
        assert {r.job_id: r.verdict for r in reply.results}[third] == "admit", reply
        beat.cancel()


async def test_a_jobs_env_is_shown_only_to_its_owner_and_operators(cluster: Secured) -> None:
    alice, bob = await cluster.client("user.alice"), await cluster.client("user.bob")
    op = await cluster.client(OPERATOR.token)
    secret = {"WANDB_API_KEY": "s3cret"}
    (result,) = (await submit(alice, tenant="", env=secret)).results
    job = result.job_id

    async def env_seen_by(client: Client) -> list[dict[str, str]]:
        by_id = await client.bus.call(QUERY, JobQuery(job_ids=[job]))
        listed = await client.bus.call(JOBS, PageQuery())
        return [r.spec.env for r in [*by_id.jobs, *listed.jobs] if r.job_id == job]

    assert await env_seen_by(alice) == [secret, secret]
    assert await env_seen_by(op) == [secret, secret]
    assert await env_seen_by(bob) == [{}, {}]  # the job itself, without its environment

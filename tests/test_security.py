"""Every attack of issue 10 against a secured cluster, each asserted to fail (docs/security.md):
the server refuses what an identity may not send or read at all, and the services refuse what a
subject allows but the body contradicts (a node acting for another, a user for another)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.aio.msg import Msg
from structlog.testing import capture_logs

from gpuyard.natsauth import OPERATOR
from gpuyard.ops import read_events
from gpuyard.shared.connection import NatsAuth, connect
from gpuyard.shared.contract import (
    ApplyRequest,
    CancelRequest,
    ClusterInfo,
    Empty,
    Event,
    ExitReport,
    Heartbeat,
    JobExit,
    JobQuery,
    LogLine,
    LogsReply,
    NodeCommand,
    NodesChanged,
    RegisterNode,
    SetPolicy,
    StepsReport,
    SubmitRequest,
    TickRequest,
)
from gpuyard.shared.endpoints import (
    APPLY,
    CANCEL,
    CLUSTER,
    EVENT,
    EXITED,
    HEARTBEAT,
    HEARTBEATS,
    LOG_LINE,
    NODE_COMMAND,
    NODE_LOGS,
    NODES,
    POLICY_SET,
    QUERY,
    REGISTER,
    SUBMIT,
    TAKEOVER,
    TICK,
)
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import JobSpec, NodeSpec

from .secured import S, Secured, fake_agent, secured_cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Secured]:
    identities = ["user.alice", "user.bob", "node.n1", "node.n2", "node.n3", "node.good"]
    async with secured_cluster(tmp_path, [*identities, "node.stuck"]) as c:
        yield c


async def submit(c: Secured, identity: str, gpus: int = 2) -> str:
    user = await c.client(identity)
    reply = await user.bus.call(SUBMIT, SubmitRequest(jobs=[JobSpec(num_gpus=gpus, command=["x"])]))
    (result,) = reply.results
    assert result.verdict == "admit", result.reason
    return result.job_id


async def running_on(c: Secured, job_id: str) -> str:
    async def placed() -> str | None:
        record = await c.job(job_id)
        return record.nodes[0] if record.state == "running" else None

    return await c.until(placed, f"{job_id} running")


async def test_nobody_gets_in_without_credentials(cluster: Secured, tmp_path: Path) -> None:
    # No credentials at all: not even a connection (so no command to a node, no takeover, no
    # cancel, no forged event, for anyone who merely reaches the server).
    with pytest.raises(Exception, match=r"[Aa]uthorization"):
        await connect(cluster.url, name="x", max_reconnect_attempts=0, allow_reconnect=False)
    # A well-formed key the server never issued.
    from gpuyard.natsauth import new_seed

    seed, _ = new_seed()
    with pytest.raises(Exception, match=r"[Aa]uthorization"):
        await connect(
            cluster.url, name="x", auth=NatsAuth(identity="op.admin", seed=seed),
            max_reconnect_attempts=0, allow_reconnect=False,
        )  # fmt: skip


@pytest.mark.slow
async def test_a_node_acts_only_for_itself_and_its_jobs(cluster: Secured) -> None:
    n1, n2 = await cluster.client("node.n1"), await cluster.client("node.n2")
    beats = [await fake_agent(n1, "n1"), await fake_agent(n2, "n2")]
    job = await submit(cluster, "user.alice")
    victim = await running_on(cluster, job)
    other = "n2" if victim == "n1" else "n1"
    attacker = n2 if victim == "n1" else n1
    before = await cluster.job(job)

    # Report the job's exit: as the other node (refused by the scheduler) ...
    forged = JobExit(job_id=job, node_id=victim, status="failed", attempt=0)
    with pytest.raises(RemoteError, match="may only report exits on itself"):
        await attacker.bus.call(EXITED, ExitReport(now=time.time(), exits=[forged]))
    # ... on the other node's subject (refused by the server) ...
    await attacker.publish(S.of(EXITED, caller=f"node.{victim}"), ExitReport(now=0, exits=[forged]))
    # ... with forged progress of the job (only a simulation's clock sends that) ...
    steps = {job: StepsReport(0.0, time.time())}
    with pytest.raises(RemoteError, match="reports progress in its heartbeats"):
        await attacker.bus.call(EXITED, ExitReport(now=time.time(), exits=[], steps=steps))
    # ... or as itself, for a job it does not run (ignored).
    mine = JobExit(job_id=job, node_id=other, status="completed", attempt=0)
    await attacker.bus.call(EXITED, ExitReport(now=time.time(), exits=[mine]))
    mine = JobExit(job_id=job, node_id=other, status="completed", attempt=None)
    await attacker.bus.call(EXITED, ExitReport(now=time.time(), exits=[mine]))

    # Register as the other node, or invent one.
    for node_id in (victim, "fake"):
        with pytest.raises(RemoteError, match="may only register itself"):
            await attacker.bus.call(
                REGISTER, RegisterNode(now=0, node=NodeSpec(node_id=node_id, num_gpus=64))
            )
    await attacker.publish(S.of(REGISTER, caller=f"node.{victim}"))
    # Declare the other node gone.
    with pytest.raises(RemoteError, match="only report itself gone"):
        await attacker.bus.call(NODES, NodesChanged(now=time.time(), gone=[victim]))
    # Heartbeat for it: on its subject (refused), or on our own naming it (ignored).
    await attacker.publish(S.of(HEARTBEAT, node=victim))
    await attacker.bus.publish(
        HEARTBEAT, Heartbeat(now=time.time(), node_id=victim, boot_id="forged"), node=other
    )
    # Write into the job's log as the node that runs it.
    line = LogLine(job_id=job, node_id=victim, rank=0, line="forged", time=0)
    await attacker.publish(S.of(LOG_LINE, job=job, node=victim), line)
    # Command another node, read its commands, publish events, read others' replies.
    await attacker.publish(S.of(NODE_COMMAND, node=victim), NodeCommand(now=0, node_id=victim))
    await attacker.subscribe(f"{S.node(victim)}.cmd")
    await attacker.publish(S.of(EVENT, type="job.completed"), Event(type="job.completed", now=0))
    await attacker.subscribe("_INBOX.>")
    await attacker.subscribe("_INBOX.op.admin.>")
    # Call what only services call.
    await attacker.publish(S.of(APPLY), ApplyRequest(now=0, allocations=[]))

    await asyncio.sleep(0.5)  # rounds went on meanwhile
    after = await cluster.job(job)
    assert (after.state, after.nodes, after.attempt) == ("running", [victim], before.attempt)
    op = await cluster.client(OPERATOR.token)
    info: ClusterInfo = await op.bus.call(CLUSTER, Empty())
    assert sorted(n.node_id for n in info.nodes) == ["n1", "n2"]
    assert [g.node_id for g in info.busy[job]] == [victim, victim]
    page = await op.bus.call(HEARTBEATS, Empty())
    assert "forged" not in {b.boot_id for b in page.beats}
    for beat in beats:
        beat.cancel()


@pytest.mark.slow
async def test_a_node_that_registers_itself_must_heartbeat(cluster: Secured) -> None:
    """A node credential registering a big node that never heartbeats: declared lost."""
    n3 = await cluster.client("node.n3")
    await n3.bus.call(REGISTER, RegisterNode(now=0, node=NodeSpec(node_id="n3", num_gpus=64)))
    op = await cluster.client(OPERATOR.token)

    async def gone() -> bool:
        info = await op.bus.call(CLUSTER, Empty())
        return "n3" in info.down and not info.nodes

    await cluster.until(gone, "n3 declared lost", within_s=10)


async def test_a_stale_exit_of_an_earlier_run_on_the_same_node_is_ignored(cluster: Secured) -> None:
    """Attempt numbers: n3's agent restarts (its job is requeued, "agent restarted") and the job
    runs again on n3. A `failed` exit of the earlier run, reported late by n3 as itself, is
    ignored and logged (`exit.stale`): the new run goes on. A `completed` exit of the earlier run
    does end the job, by design (docs/security.md: the runs share the checkpoint, the work is
    done)."""
    n3 = await cluster.client("node.n3")
    beat = await fake_agent(n3, "n3")
    job = await submit(cluster, "user.alice")
    assert await running_on(cluster, job) == "n3"
    first = (await cluster.job(job)).attempt
    beat.cancel()
    await n3.bus.close()  # the agent dies; it comes back with a new boot id
    n3 = await cluster.client("node.n3")
    beat = await fake_agent(n3, "n3", boot="n3-boot-2")

    async def relaunched() -> bool:
        record = await cluster.job(job)
        return record.state == "running" and record.attempt == first + 1

    await cluster.until(relaunched, "the job running again on n3")
    assert (await cluster.job(job)).nodes == ["n3"]

    earlier = first - 1  # (JobRecord.attempt counts the launches; Launch.attempt from 0)
    stale = JobExit(job_id=job, node_id="n3", status="failed", exit_code=137, attempt=earlier)
    with capture_logs() as logs:
        await n3.bus.call(EXITED, ExitReport(now=time.time(), exits=[stale], tick=True))
    record = await cluster.job(job)
    assert (record.state, record.nodes, record.attempt) == ("running", ["n3"], first + 1)
    (logged,) = [e for e in logs if e["event"] == "exit.stale"]
    assert (logged["log_level"], logged["service"], logged["job_id"], logged["node_id"]) == (
        "warning", "scheduler", job, "n3",
    )  # fmt: skip
    assert (logged["attempt"], logged["current"]) == (earlier, first)

    done = JobExit(job_id=job, node_id="n3", status="completed", attempt=earlier)
    await n3.bus.call(EXITED, ExitReport(now=time.time(), exits=[done]))
    assert (await cluster.job(job)).state == "completed"
    beat.cancel()


async def test_a_submitter_acts_only_for_themselves(cluster: Secured) -> None:
    n1 = await cluster.client("node.n1")
    beat = await fake_agent(n1, "n1", gpus=1)
    alice, bob = await cluster.client("user.alice"), await cluster.client("user.bob")
    mine = await submit(cluster, "user.alice", gpus=1)
    theirs = await submit(cluster, "user.bob", gpus=1)
    assert (await cluster.job(mine)).spec.user == "alice"
    # A submitter reads the jobs (gpuyard jobs) ...
    page = await alice.bus.call(QUERY, JobQuery())
    assert {j.job_id for j in page.jobs} == {mine, theirs}
    # ... cancels only their own.
    reply = await alice.bus.call(CANCEL, CancelRequest(job_ids=[theirs, mine]))
    assert reply.cancelled == [mine] and reply.refused == {theirs: "not your job"}
    assert (await cluster.job(theirs)).state in ("queued", "running")
    # Submits as nobody else, neither in the job nor on the subject.
    with pytest.raises(RemoteError) as exc:
        await alice.bus.call(SUBMIT, SubmitRequest(jobs=[JobSpec(num_gpus=1, user="bob")]))
    assert exc.value.reply.field == "$.jobs[0].user"
    await alice.publish(S.of(SUBMIT, caller="user.bob"), SubmitRequest(jobs=[]))
    await alice.publish(S.of(CANCEL, caller="op.admin"), CancelRequest(job_ids=[theirs]))
    # No control, no scheduler driving, no events, no other replies.
    await alice.publish(S.of(POLICY_SET, svc="sched"), SetPolicy(policy="las"))
    await alice.publish(S.of(TAKEOVER, svc="sched"))
    await alice.publish(S.of(TICK), TickRequest(now=0))
    await alice.publish(S.of(EVENT, type="job.completed"), Event(type="job.completed", now=0))
    await alice.subscribe("_INBOX.>")
    await alice.subscribe("_INBOX.user.bob.>")
    assert (await cluster.job(theirs)).state in ("queued", "running")
    # An operator cancels anyone's job.
    op = await cluster.client(OPERATOR.token)
    assert (await op.bus.call(CANCEL, CancelRequest(job_ids=[theirs]))).cancelled == [theirs]
    # The event stream (gpuyard tail) is readable, and holds only the services' events.
    events = [e async for e in read_events(bob.bus.nc, bob.bus.subjects)]
    assert events and {e.event.service for e in events if e.event} <= {
        "admission", "scheduler", "placement",
    }  # fmt: skip
    beat.cancel()


async def test_an_operator_sends_no_node_command_and_publishes_no_event(cluster: Secured) -> None:
    op = await cluster.client(OPERATOR.token)
    await op.publish(S.of(NODE_COMMAND, node="n1"), NodeCommand(now=0, node_id="n1"))
    await op.publish(S.of(EVENT, type="node.up"), Event(type="node.up", now=0))
    await op.publish(S.of(EXITED, caller="node.n1"), ExitReport(now=0, exits=[]))
    # ... but swaps policies.
    info = await op.bus.call(POLICY_SET, SetPolicy(policy="las"), svc="sched")
    assert (info.previous, info.policy) == ("fifo", "las")


async def test_a_removed_identity_is_refused(cluster: Secured) -> None:
    alice = await cluster.client("user.alice")
    profile = cluster.creds.profile(Caller("user", "alice"))
    cluster.creds.remove(Caller("user", "alice"))
    assert cluster.creds.reload_server()

    async def dropped() -> bool:
        return not alice.bus.nc.is_connected

    await cluster.until(dropped, "alice's connection closed")
    with pytest.raises(Exception, match=r"[Aa]uthorization"):
        await connect(
            cluster.url, name="x", auth=NatsAuth.from_profile(profile),
            max_reconnect_attempts=0, allow_reconnect=False,
        )  # fmt: skip


@pytest.mark.slow
async def test_a_stuck_node_agent_does_not_stall_the_rounds(cluster: Secured) -> None:
    """An agent that stops answering in the middle of a command (as one killed there, or hung):
    placement does not wait for it, other jobs start elsewhere at once, and the silent node is
    declared lost after its command went unanswered twice (`command_timeout_s`, 1 s here), though
    it still heartbeats, its job requeued."""
    good, stuck = await cluster.client("node.good"), await cluster.client("node.stuck")
    await fake_agent(good, "good", gpus=2)
    stuck_beat = await fake_agent(stuck, "stuck", gpus=4, answer=False)
    op = await cluster.client(OPERATOR.token)
    big = await submit(cluster, "user.alice", gpus=4)  # only `stuck` has 4 GPUs
    assert await running_on(cluster, big) == "stuck"  # (as placement believes)
    started = time.monotonic()
    small = await submit(cluster, "user.alice", gpus=1)
    assert await running_on(cluster, small) == "good"
    assert time.monotonic() - started < 1.0  # nobody waited for `stuck`

    async def lost() -> bool:
        return "stuck" in (await op.bus.call(CLUSTER, Empty())).down

    await cluster.until(lost, "the stuck node declared lost", within_s=5)
    assert time.monotonic() - started < 4.0
    record = await cluster.job(big)
    assert (record.state, record.preemptions) == ("queued", 1)
    assert record.reason.startswith("node stuck gone: no answer to a command"), record.reason
    stuck_beat.cancel()
    # Rounds still run: another job starts on the good node (once the 4-GPU job, which no longer
    # fits anywhere, is out of FIFO's way).
    await op.bus.call(CANCEL, CancelRequest(job_ids=[big]))
    assert await running_on(cluster, await submit(cluster, "user.bob", gpus=1)) == "good"


@pytest.mark.slow
async def test_logs_follow_believes_only_the_nodes_a_job_runs_on(cluster: Secured) -> None:
    """`gpuyard logs -f`: a node may write log lines only as itself (the server), and the command
    asks for the job's files only the nodes it ran on and shows live lines only from a node the
    job is placed on."""
    import sys

    n1, n2 = await cluster.client("node.n1"), await cluster.client("node.n2")
    beats = [await fake_agent(n1, "n1"), await fake_agent(n2, "n2")]
    job = await submit(cluster, "user.alice")
    victim = await running_on(cluster, job)
    runs, other = (n1, n2) if victim == "n1" else (n2, n1)
    other_id = "n2" if victim == "n1" else "n1"
    # Both nodes answer for the job's log files (`node.<id>.logs`), the other one with made-up lines.
    for client, node, text in ((runs, victim, "genuine file"), (other, other_id, "forged file")):
        reply = msgspec.json.encode(LogsReply(lines=[text]))

        async def files(msg: Msg, reply: bytes = reply) -> None:
            await msg.respond(reply)

        await client.bus.nc.subscribe(S.of(NODE_LOGS, node=node), cb=files)
    profile = cluster.creds.profile_path(Caller("user", "alice"))
    follow = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuyard.cli", "logs", "-f", job, "--nats-config", str(profile),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    # It subscribes before it asks for the files: once it has printed them, it follows.
    assert follow.stdout is not None
    first = (await asyncio.wait_for(follow.stdout.readline(), 30)).decode()
    for client, node, text in ((runs, victim, "genuine"), (other, other_id, "forged")):
        line = LogLine(job_id=job, node_id=node, rank=0, line=text, time=time.time())
        await client.bus.publish(LOG_LINE, line, job=job, node=node)
    await asyncio.sleep(0.5)
    op = await cluster.client(OPERATOR.token)
    await op.bus.call(CANCEL, CancelRequest(job_ids=[job]))
    rest, err = await asyncio.wait_for(follow.communicate(), 30)
    out = first + rest.decode()
    assert follow.returncode == 0, err.decode()
    assert f"[{victim} rank0] genuine" in out and "forged" not in out
    assert first.strip() == "genuine file"
    for beat in beats:
        beat.cancel()

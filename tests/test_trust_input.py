"""Input that cannot hurt, and each cluster's own agent state (issue 40, items 6 and 10): a
`logs` request names a job, never a path; two clusters on one machine never see each other's job
logs."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from gpuyard.services.nodeagent.service import NodeAgent, NodeAgentConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import Launch, LogsRequest, NodeCommand
from gpuyard.shared.endpoints import NODE_LOGS, Subjects
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.model import JobSpec

from .polling import until_async


async def start_agent(stack: AsyncExitStack, url: str, cluster: str, root: Path) -> NodeAgent:
    """A real node agent `n1` of `cluster`, its state in `root` (the same for every cluster)."""
    config = NodeAgentConfig(
        node_id="n1", gpus=1, use_nvml=False, grace_s=1, log_dir=str(root / "logs"),
        checkpoint_root=str(root / "ckpt"),
    )  # fmt: skip
    agent = NodeAgent(Bus(await connect(url, name=f"agent-{cluster}"), Subjects(cluster)), config)
    await agent.start()
    stack.push_async_callback(agent.stop)
    return agent


async def client(stack: AsyncExitStack, url: str, cluster: str) -> Bus:
    bus = Bus(await connect(url, name=f"client-{cluster}"), Subjects(cluster), request_timeout=5)
    stack.push_async_callback(bus.close)
    return bus


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as s:
        yield s


def run_job(job_id: str, *command: str) -> NodeCommand:
    spec = JobSpec(job_id=job_id, num_gpus=1, command=list(command))
    launch = Launch(
        job_id=job_id, spec=spec, gpus=[0], world_size=1, rank_offset=0, node_rank=0,
        num_nodes=1, master_addr="127.0.0.1", master_port=20000,
    )  # fmt: skip
    return NodeCommand(now=0.0, node_id="n1", launch=[launch])


async def test_a_logs_request_naming_a_path_gets_one_error_and_no_file(
    nats_url: str, tmp_path: Path, stack: AsyncExitStack
) -> None:
    """`node.<id>.logs` with a job id that is a path (`../..`, absolute, a `/`, too long) is
    refused naming `$.job_id`, and nothing of the `rank*.log` files it points at comes back."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "rank0.log").write_text("TOP SECRET\n")
    (secret / "rank0.log").chmod(0o600)
    state = tmp_path / "agent"
    await start_agent(stack, nats_url, "logs", state)
    bus = await client(stack, nats_url, "logs")
    (state / "logs" / "logs").mkdir(parents=True)
    relative = str(Path("..") / ".." / ".." / "secret")  # from <state>/logs/<cluster>/<job id>
    for attempt in (relative, str(secret), "..", ".", "a/../../../secret", "j" * 129, ""):
        with pytest.raises(RemoteError) as refused:
            await bus.call(NODE_LOGS, LogsRequest(job_id=attempt), node="n1")
        assert refused.value.reply.field == "$.job_id", refused.value.reply
        assert "SECRET" not in str(refused.value)
    # A job id is still a job id, and the size asked for is bounded.
    assert (await bus.call(NODE_LOGS, LogsRequest(job_id="j1.a:b-c_d"), node="n1")).lines == []
    with pytest.raises(RemoteError) as refused:
        await bus.call(NODE_LOGS, LogsRequest(job_id="j1", tail_bytes=1 << 30), node="n1")
    assert refused.value.reply.field == "$.tail_bytes"
    # The agent goes on serving.
    assert (await bus.call(NODE_LOGS, LogsRequest(job_id="j1"), node="n1")).lines == []


async def test_two_clusters_on_one_machine_keep_their_own_job_logs(
    nats_url: str, tmp_path: Path, stack: AsyncExitStack
) -> None:
    """Two clusters' agents on one machine share one state directory (root's default): job `j1`
    of each writes to its cluster's own folder, and each cluster's `logs j1` returns its own."""
    state = tmp_path / "var-lib-gpuyard"
    for cluster in ("first", "second"):
        agent = await start_agent(stack, nats_url, cluster, state)
        await agent.command(run_job("j1", sys.executable, "-c", f"print('I am j1 of {cluster}')"))
    for cluster, other in (("first", "second"), ("second", "first")):
        bus = await client(stack, nats_url, cluster)

        async def logged(bus: Bus = bus) -> list[str]:
            return (await bus.call(NODE_LOGS, LogsRequest(job_id="j1"), node="n1")).lines

        lines = await until_async(logged, f"{cluster}'s j1 logged")
        assert lines == [f"[n1 rank0] I am j1 of {cluster}"], lines
        assert not any(other in line for line in lines)
    assert sorted(p.parent.parent.name for p in (state / "logs").glob("*/j1/rank0.log")) == [
        "first", "second",
    ]  # fmt: skip


async def test_a_submitter_reads_events_only_through_bounded_ephemeral_consumers(
    tmp_path: Path,
) -> None:
    """`gpuyard tail` works for a submitter; a durable consumer is refused by whichever subject
    it is asked on, an ephemeral one may not outlive its reader past the stream's limit, nobody
    deletes another reader's consumer, and the stream bounds how many there are."""
    from nats.js.api import ConsumerConfig
    from nats.js.errors import BadRequestError

    from gpuyard.ops import read_events
    from gpuyard.shared.connection import EVENT_READER_IDLE_MAX_S, EVENT_READERS_MAX
    from gpuyard.shared.contract import SubmitRequest
    from gpuyard.shared.endpoints import SUBMIT

    from .secured import S, secured_cluster

    async with secured_cluster(tmp_path, ["user.alice"]) as c:
        alice = await c.client("user.alice")
        await alice.bus.call(SUBMIT, SubmitRequest(jobs=[JobSpec(num_gpus=1, command=["x"])]))
        events = [e async for e in read_events(alice.bus.nc, alice.bus.subjects)]
        assert "job.submitted" in {e.event.type for e in events if e.event}
        stream = S.stream_name
        js = alice.bus.nc.jetstream()
        info = await js.stream_info(stream)
        assert info.config.max_consumers == EVENT_READERS_MAX
        limits = info.config.consumer_limits
        assert limits is not None and limits.inactive_threshold == EVENT_READER_IDLE_MAX_S

        # Durable, by the subject that names it, or by a consumer's name: not allowed at all.
        durable = b'{"stream_name": "%s", "config": {"durable_name": "mine"}}' % stream.encode()
        for subject in (
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.mine",
            f"$JS.API.CONSUMER.CREATE.{stream}.mine",
            f"$JS.API.CONSUMER.CREATE.{stream}.mine.{S.events}.>",
        ):
            assert await alice.publish(subject, durable)
        # ... and on the subject ephemeral consumers are made on, the server refuses the name.
        reply = await alice.bus.nc.request(f"$JS.API.CONSUMER.CREATE.{stream}", durable, timeout=5)
        assert b"expected to be ephemeral" in reply.data, reply.data
        # An ephemeral one that would stay an hour after its reader left: beyond the limit.
        with pytest.raises(BadRequestError, match="inactive threshold exceeds"):
            await js.add_consumer(stream, ConsumerConfig(inactive_threshold=3600))
        # Another reader's consumer is not ours to delete.
        mine = await js.add_consumer(stream, ConsumerConfig())
        assert await alice.publish(f"$JS.API.CONSUMER.DELETE.{stream}.{mine.name}")

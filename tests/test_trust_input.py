"""Issue 40, items 2, 6 and 10 against real servers and agents: a `logs` request names a job,
never a path; two clusters on one machine never see each other's job logs; readers of the event
stream get bounded ephemeral consumers only; every identity's permissions are what the endpoint
table gives its role, and a real cluster has no simclock identity. (TLS failures:
tests/test_ops_auth.py; malformed messages on every subject: tests/test_fuzz.py.)"""

from __future__ import annotations

import asyncio
import itertools
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import ConsumerConfig
from nats.js.errors import BadRequestError
from structlog.testing import capture_logs

from gpuyard.natsauth import OPERATOR, SIMCLOCK, permissions
from gpuyard.ops import read_events
from gpuyard.services.nodeagent.service import NodeAgent, NodeAgentConfig
from gpuyard.shared.connection import EVENT_READER_IDLE_MAX_S, EVENT_READERS_MAX, Bus, connect
from gpuyard.shared.contract import Launch, LogsRequest, NodeCommand, Ping, SubmitRequest
from gpuyard.shared.endpoints import (
    ENDPOINTS,
    NODE_LOGS,
    PING,
    SUBMIT,
    TAKEOVER,
    Subjects,
    subject_matches,
)
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import JobSpec
from gpuyard.shared.roster import SERVICE_TOKENS

from .jobaccount import AGENT_CONFIG, JOB_PYTHON
from .polling import until_async
from .secured import S, secured_cluster


async def start_agent(stack: AsyncExitStack, url: str, cluster: str, root: Path) -> NodeAgent:
    """A real node agent `n1` of `cluster`, its state in `root` (the same for every cluster)."""
    config = NodeAgentConfig(
        **AGENT_CONFIG,
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
    assert (state / "logs" / "logs").is_dir()  # (made at start: jobs must be able to enter it)
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
    # `gpuyard logs` says so before it asks anyone.
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gpuyard.cli", "logs", "--nats", nats_url,
                         "--cluster", "logs", relative],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "is not a job id" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not done.stdout


async def test_two_clusters_on_one_machine_keep_their_own_job_logs(
    nats_url: str, tmp_path: Path, stack: AsyncExitStack
) -> None:
    """Two clusters' agents on one machine share one state directory (root's default): job `j1`
    of each writes to its cluster's own folder, and each cluster's `logs j1` returns its own."""
    state = tmp_path / "var-lib-gpuyard"
    for cluster in ("first", "second"):
        agent = await start_agent(stack, nats_url, cluster, state)
        await agent.command(run_job("j1", *JOB_PYTHON, "-c", f"print('I am j1 of {cluster}')"))
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
    deletes another reader's consumer, and the stream bounds how many there are. A consumer that
    delivers the events onto a takeover subject stops no service."""
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
        # A consumer pointed at a service's takeover subject: the server delivers the events
        # there (a plain subscription; the services' others are queue subscriptions, which
        # it does not deliver to), with a reply subject; each is refused, nothing handed over.
        with capture_logs() as logs:
            config = ConsumerConfig(deliver_subject=S.of(TAKEOVER, svc="sched"))
            await js.add_consumer(stream, config)

            async def refused() -> list[Any]:
                return [e for e in logs if e["event"] == "takeover.refused"]

            await until_async(refused, "the delivered events refused")
        assert not [e for e in logs if e["event"] == "service.handing_over"]
        op = await c.client(OPERATOR.token)
        assert await op.bus.call(PING, Ping(), svc="sched")


# --------------------------------------------------------------------------- least privilege

IDENTITIES = [
    "op.admin", "user.alice", "node.n1", "svc.admission", "svc.scheduler", "svc.placement",
    "svc.simclock",
]  # fmt: skip
VALUES = {
    "caller": ["op.admin", "user.alice", "user.bob", "node.n1", "node.n2", "svc.admission",
               "svc.scheduler", "svc.placement", "svc.simclock"],
    "node": ["n1", "n2"],
    "svc": ["adm", "sched", "place", "clock", "node.n1", "node.n2"],
    "type": ["job.submitted", "node.up"],
    "job": ["j1"],
}  # fmt: skip
TABLE_EXTRAS = ("$JS.", "$KV.", "$SRV.", "_INBOX.")
"""What the permissions grant beyond the endpoint table: JetStream, replies, discovery."""


def samples(endpoint: Any) -> list[tuple[dict[str, str], str]]:
    """Concrete subjects of `endpoint` in cluster `c`, with the values they were made from."""
    names = re.findall(r"{(\w+)}", endpoint.pattern)
    out = []
    for combo in itertools.product(*(VALUES[n] for n in names)):
        params = dict(zip(names, combo, strict=True))
        out.append((params, Subjects("c").of(endpoint, **params)))
    return out


def may_send(identity: str, endpoint: Any, params: dict[str, str]) -> bool:
    """The rule, stated once more: a listed caller, as itself; a node for itself only; a
    service to itself where it serves the endpoint, anyone else to those that serve it."""
    role, name = identity.split(".")
    who = name if role == "svc" else role
    if who not in endpoint.callers:
        return False
    if endpoint.sender == "caller" and params["caller"] != identity:
        return False
    if role == "node" and (params.get("node", name), params.get("svc", f"node.{name}")) != (
        name, f"node.{name}",
    ):  # fmt: skip
        return False
    if "svc" not in params:
        return True
    if who in endpoint.serves:
        return params["svc"] == SERVICE_TOKENS[who]
    servers = [*SERVICE_TOKENS, "nodeagent"] if "*" in endpoint.serves else endpoint.serves
    return any(
        params["svc"].startswith("node.")
        if s == "nodeagent"
        else params["svc"] == SERVICE_TOKENS[s]
        for s in servers
    )


def may_hear(identity: str, endpoint: Any, params: dict[str, str], subject: str) -> bool:
    """Everything under its own prefix (a service, a node agent, subscribes to its own at once
    and routes by the rest), what it serves elsewhere as itself (a takeover; the simclock every
    node's commands), and the publishes it is listed to listen to."""
    role, name = identity.split(".")
    token = f"node.{name}" if role == "node" else SERVICE_TOKENS.get(name, "")
    if role in ("node", "svc") and subject.startswith(f"gpuyard.c.{token}."):
        return True
    if role == "node":
        return False
    who = name if role == "svc" else role
    if role == "svc" and who in endpoint.serves:
        return params.get("svc", token) == token
    return who in endpoint.listeners


@pytest.mark.parametrize("identity", IDENTITIES)
def test_each_identity_may_send_and_hear_what_the_endpoint_table_gives_its_role_only(
    identity: str,
) -> None:
    """Every endpoint x every identity x concrete subjects (as itself, as another; to its own
    node, another's; to each service): the generated permissions allow exactly what the table's
    `callers`, `serves` and `listeners` give, and nothing of the namespace beyond."""
    perms = permissions(Caller.parse(identity), "c")
    publish, subscribe = perms["publish"]["allow"], perms["subscribe"]["allow"]
    used: set[str] = set()
    for endpoint in ENDPOINTS:
        for params, subject in samples(endpoint):
            sent = [p for p in publish if subject_matches(p, subject)]
            heard = [p for p in subscribe if subject_matches(p, subject)]
            assert bool(sent) == may_send(identity, endpoint, params), (
                endpoint.pattern,
                subject,
                sent,
            )
            assert bool(heard) == may_hear(identity, endpoint, params, subject), (
                endpoint.pattern,
                subject,
                heard,
            )
            used |= {*sent, *heard}
    # Nothing granted in the cluster's namespace that no endpoint of the table needs.
    stray = [p for p in {*publish, *subscribe} if p not in used and not p.startswith(TABLE_EXTRAS)]
    assert not stray, stray
    assert not any(p.startswith("gpuyard.c.>") or p == ">" for p in {*publish, *subscribe})


async def test_a_real_cluster_has_no_simclock_and_the_server_refuses_beyond_each_role(
    tmp_path: Path,
) -> None:
    """A real cluster's credentials hold no simclock identity (nor keep one from before), and
    the server enforces the derived permissions: a service may not call what it does not call
    (as the hand-written ones let it: a whole prefix), nor a node hear another node's commands."""
    async with secured_cluster(tmp_path, ["node.n1"]) as c:
        assert SIMCLOCK.token not in {i.identity for i in c.creds.index().identities}
        assert not c.creds.profile_path(SIMCLOCK).exists()
        assert '"seed"' not in c.creds.users_conf.read_text()
        scheduler, admission = await c.client("svc.scheduler"), await c.client("svc.admission")
        placement, node = await c.client("svc.placement"), await c.client("node.n1")
        assert await scheduler.publish(f"{S.root}.place.nodes.svc.scheduler")
        assert await scheduler.publish(f"{S.root}.sched.jobs")  # its own prefix: not a caller
        assert await admission.publish(f"{S.root}.adm.policy.set")
        assert await admission.publish(f"{S.root}.place.apply")
        assert await placement.publish(f"{S.root}.sched.enqueue")
        assert await placement.subscribe(f"{S.root}.evt.>")
        assert await node.subscribe(f"{S.root}.node.n2.cmd")
        op = await c.client(OPERATOR.token)
        assert await op.publish(f"{S.root}.clock.run")  # a simulation's driver's
    # Credentials made with the simclock's (a simulation's) lose it on a real cluster's init.
    creds = type(c.creds)(tmp_path / "sim-then-real", "sec")
    creds.init(simulation=True)
    assert creds.profile_path(SIMCLOCK).exists()
    creds.init()
    assert not creds.profile_path(SIMCLOCK).exists()
    assert {i.identity for i in creds.index().identities} == {
        OPERATOR.token, "svc.admission", "svc.scheduler", "svc.placement",
    }  # fmt: skip

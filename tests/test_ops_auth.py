"""Access control on a real nats-server with gpuyard's users (gpuyard.natsauth), and TLS."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import msgspec
import pytest

from gpuyard.embedded import EmbeddedNats
from gpuyard.launcher import service_class
from gpuyard.natsauth import default_users, server_config
from gpuyard.services.admission.service import AdmissionConfig
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.shared.connection import Bus, NatsAuth, connect
from gpuyard.shared.contract import (
    Empty,
    ExitReport,
    JobExit,
    NodeCommand,
    NodeCommandReply,
    PageQuery,
    Ping,
    RegisterNode,
    SubmitRequest,
    TickRequest,
)
from gpuyard.shared.endpoints import (
    CLUSTER as CLUSTER_INFO,
)
from gpuyard.shared.endpoints import (
    EXITED,
    JOBS,
    PING,
    REGISTER,
    SERVICE_TOKENS,
    SUBMIT,
    TICK,
    Subjects,
)
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.model import JobSpec, NodeSpec

CLUSTER = "sec"
PASSWORD = "test-password"
S = Subjects(CLUSTER)


class Client:
    """One identity's connection, with the permission errors the server sent it."""

    def __init__(self, bus: Bus, errors: list[str]) -> None:
        self.bus = bus
        self.errors = errors

    async def violations(self, within_s: float = 2.0) -> list[str]:
        """Permission errors arrive asynchronously: wait a little for one."""
        async with asyncio.timeout(within_s):
            while not any("permissions violation" in e.lower() for e in self.errors):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        return [e.lower() for e in self.errors]


async def client(stack: AsyncExitStack, url: str, user: str, **options) -> Client:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await connect(
        url, name=user, auth=NatsAuth(user=user, password=PASSWORD, **options),
        error_cb=on_error, max_reconnect_attempts=0,
    )  # fmt: skip
    bus = Bus(nc, S, request_timeout=5)
    stack.push_async_callback(bus.close)
    return Client(bus, errors)


async def node_agent(c: Client, node: str) -> None:
    """A node agent that launches and preempts at once, on its own command subject."""
    decoder = msgspec.json.Decoder(NodeCommand)

    async def answer(msg) -> None:
        cmd = decoder.decode(msg.data)
        reply = NodeCommandReply(preempted=cmd.preempt, launched=[x.job_id for x in cmd.launch])
        await msg.respond(msgspec.json.encode(reply))

    await c.bus.nc.subscribe(f"{S.node(node)}.cmd", cb=answer)
    await c.bus.call(REGISTER, RegisterNode(now=0.0, node=NodeSpec(node_id=node, num_gpus=2)))


@pytest.fixture
async def secured() -> AsyncIterator[tuple[str, AsyncExitStack]]:
    """A server with gpuyard's users; the control plane runs each service as its own user."""
    config = server_config(CLUSTER, default_users(["n1", "n2"], password=PASSWORD))
    async with EmbeddedNats(extra_config=config) as url, AsyncExitStack() as stack:
        configs = {
            "placement": PlacementConfig(),
            "scheduler": SchedulerConfig(event_storage="memory"),
            "admission": AdmissionConfig(),
        }
        for name, cfg in configs.items():
            nc = await connect(url, name=name, auth=NatsAuth(user=name, password=PASSWORD))
            service = service_class(name)(Bus(nc, S), cfg)
            await service.start()
            stack.push_async_callback(service.stop)
        yield url, stack


async def test_roles(secured: tuple[str, AsyncExitStack]) -> None:
    url, stack = secured
    operator = await client(stack, url, "operator")
    for name in ("admission", "scheduler", "placement"):
        pong = await operator.bus.call(PING, Ping(), svc=SERVICE_TOKENS[name])
        assert pong.service == name
    n1 = await client(stack, url, "node-n1")
    await node_agent(n1, "n1")

    # A submitter submits; the whole chain (admission -> scheduler -> placement -> n1) runs under
    # each service's own permissions.
    submitter = await client(stack, url, "submitter")
    reply = await submitter.bus.call(
        SUBMIT,
        SubmitRequest(jobs=[JobSpec(job_id="ok1", num_gpus=2, duration=10)], now=1.0, tick=True),
    )
    assert [r.verdict for r in reply.results] == ["admit"]
    page = await submitter.bus.call(JOBS, PageQuery())
    assert [(j.job_id, j.state) for j in page.jobs] == [("ok1", "running")]
    # ... but may not drive the scheduler.
    with pytest.raises(RemoteError, match="timed out"):
        await submitter.bus.call(TICK, TickRequest(now=2.0), within_s=0.5)
    assert "permissions violation for publish" in " ".join(await submitter.violations())

    # The node agent reports its job's exit.
    status = await n1.bus.call(
        EXITED, ExitReport(now=11.0, exits=[JobExit(job_id="ok1", node_id="n1", status="completed")]),
    )  # fmt: skip
    assert status.finished == 1
    # An agent cannot submit jobs: the server refuses the publish, admission never sees it.
    with pytest.raises(RemoteError, match="timed out"):
        await n1.bus.call(
            SUBMIT, SubmitRequest(jobs=[JobSpec(num_gpus=1, duration=5)]), within_s=0.5
        )
    assert "gpuyard.sec.adm.submit" in " ".join(await n1.violations())
    page = await operator.bus.call(JOBS, PageQuery())
    assert [j.job_id for j in page.jobs] == ["ok1"]


async def test_node_cannot_pose_as_another(secured: tuple[str, AsyncExitStack]) -> None:
    url, stack = secured
    operator = await client(stack, url, "operator")
    heard: list[str] = []

    async def hear(msg) -> None:
        heard.append(msg.subject)

    async def ignore(msg) -> None:
        pass

    sub = await operator.bus.nc.subscribe(f"{S.root}.node.*.hb", cb=hear)
    n1 = await client(stack, url, "node-n1")
    await n1.bus.nc.publish(f"{S.node('n1')}.hb", b"{}")
    await n1.bus.nc.publish(f"{S.node('n2')}.hb", b"{}")  # another node's heartbeat: refused
    errors = " ".join(await n1.violations())
    assert "gpuyard.sec.node.n2.hb" in errors
    await operator.bus.nc.flush()
    await asyncio.sleep(0.2)
    assert heard == ["gpuyard.sec.node.n1.hb"]
    await sub.unsubscribe()

    # Nor read another node's commands.
    n1.errors.clear()
    await n1.bus.nc.subscribe(f"{S.node('n2')}.cmd", cb=ignore)
    assert "permissions violation for subscription" in " ".join(await n1.violations())
    # Nor call the services' other requests (e.g. make placement forget a node).
    n1.errors.clear()
    with pytest.raises(RemoteError, match="timed out"):
        await n1.bus.call(CLUSTER_INFO, Empty(), within_s=0.5)
    await n1.violations()


async def test_wrong_password_is_refused(secured: tuple[str, AsyncExitStack]) -> None:
    url, _ = secured
    with pytest.raises(Exception, match=r"[Aa]uthorization"):
        await connect(
            url, name="bad", auth=NatsAuth(user="operator", password="nope"),
            max_reconnect_attempts=0, allow_reconnect=False,
        )  # fmt: skip


def make_certificate(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "server.pem", folder / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_tls_and_password(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    tls = f'tls {{ cert_file: "{cert}", key_file: "{key}" }}\n'
    users = server_config(CLUSTER, default_users([], password=PASSWORD))
    async with EmbeddedNats(extra_config=tls + users) as url, AsyncExitStack() as stack:
        secure_url = url.replace("nats://", "tls://")
        c = await client(stack, secure_url, "operator", tls_ca=str(cert))
        assert c.bus.nc.is_connected
        with pytest.raises(Exception):  # noqa: B017 (nats-py raises several kinds here)
            await connect(url, name="plain", auth=NatsAuth(user="operator", password=PASSWORD),
                          max_reconnect_attempts=0, allow_reconnect=False, connect_timeout=2)  # fmt: skip

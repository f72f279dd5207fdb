"""A secured control plane for the security tests: gpuyard's credentials in a temporary state
directory, an embedded server that requires them, the durable services each as its own identity,
and clients (node agents, submitters, operators) as theirs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from gpuyard.cli.cluster import control_plane_configs
from gpuyard.natsauth import OPERATOR, Credentials
from gpuyard.run.embedded import EmbeddedNats
from gpuyard.run.launcher import ServiceSet
from gpuyard.shared.connection import Bus, NatsAuth, connect
from gpuyard.shared.contract import (
    ExitReport,
    Heartbeat,
    JobExit,
    JobQuery,
    NodeCommand,
    NodeCommandReply,
    RegisterNode,
)
from gpuyard.shared.endpoints import EXITED, HEARTBEAT, NODE_COMMAND, QUERY, REGISTER, Subjects
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import JobRecord, NodeSpec

from .polling import until_async

CLUSTER = "sec"
S = Subjects(CLUSTER)


class Client:
    """One identity's connection, with the errors (permission violations) the server sent it."""

    def __init__(self, bus: Bus, errors: list[str]) -> None:
        self.bus = bus
        self.errors = errors

    async def violation(self, subject: str, within_s: float = 3.0) -> str:
        """The server's permission error naming `subject` (they arrive asynchronously)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for error in self.errors:
                if "permissions violation" in error.lower() and subject.lower() in error.lower():
                    return error
            await asyncio.sleep(0.02)
        raise AssertionError(f"no permissions violation for {subject}; errors: {self.errors}")

    async def publish(self, subject: str, body: Any = b"{}") -> str:
        """Publish raw on `subject` and return the server's refusal."""
        data = body if isinstance(body, bytes) else msgspec.json.encode(body)
        await self.bus.nc.publish(subject, data)
        return await self.violation(subject)

    async def subscribe(self, subject: str) -> str:
        async def ignore(_: Any) -> None:
            pass

        await self.bus.nc.subscribe(subject, cb=ignore)
        return await self.violation(subject)


@dataclass
class Secured:
    url: str
    creds: Credentials
    stack: AsyncExitStack

    async def client(self, identity: str) -> Client:
        """A connection as `identity` (`user.alice`, `node.n1`, `op.admin`)."""
        caller = Caller.parse(identity)
        return await connect_as(
            self.stack, self.url, NatsAuth.from_profile(self.creds.profile(caller))
        )

    async def job(self, job_id: str) -> JobRecord:
        op = await self.client(OPERATOR.token)
        (record,) = (await op.bus.call(QUERY, JobQuery(job_ids=[job_id]))).jobs
        return record

    async def until(self, check: Any, what: str, within_s: float = 15.0) -> Any:
        return await until_async(check, what, within_s)


async def connect_as(stack: AsyncExitStack, url: str, auth: NatsAuth) -> Client:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await connect(
        url, name=auth.identity or "anonymous", auth=auth, error_cb=on_error,
        max_reconnect_attempts=0, allow_reconnect=False,
    )  # fmt: skip
    bus = Bus(nc, S, request_timeout=5, caller=auth.caller)
    stack.push_async_callback(bus.close)
    return Client(bus, errors)


async def fake_agent(
    c: Client, node: str, gpus: int = 2, *, answer: bool = True, beat_s: float = 0.1,
    boot: str = "",
) -> asyncio.Task[None]:  # fmt: skip
    """A node agent over `c`'s connection: it registers, heartbeats, and answers its commands at
    once (or never, with `answer=False`: an agent stuck in the middle of a command), reporting
    the jobs it preempts stopped. Its boot id is `boot` (default `<node>-boot`): another one is
    the agent restarted."""
    boot = boot or f"{node}-boot"
    decoder = msgspec.json.Decoder(NodeCommand)

    async def on_command(msg: Any) -> None:
        if answer:
            cmd = decoder.decode(msg.data)
            reply = NodeCommandReply(preempted=cmd.preempt, launched=[x.job_id for x in cmd.launch])
            await msg.respond(msgspec.json.encode(reply))
            if cmd.preempt:
                stopped = [JobExit(job_id=j, node_id=node, status="stopped") for j in cmd.preempt]
                await c.bus.call(EXITED, ExitReport(now=time.time(), exits=stopped))

    await c.bus.nc.subscribe(S.of(NODE_COMMAND, node=node), cb=on_command)
    spec = NodeSpec(node_id=node, num_gpus=gpus, gpu_type="t4", labels={"boot": boot})
    await c.bus.call(REGISTER, RegisterNode(now=time.time(), node=spec))

    async def beat() -> None:
        while True:
            hb = Heartbeat(now=time.time(), node_id=node, boot_id=boot)
            await c.bus.publish(HEARTBEAT, hb, node=node)
            await asyncio.sleep(beat_s)

    return asyncio.create_task(beat())


@asynccontextmanager
async def secured_cluster(
    root: Path, identities: list[str], configure: Callable[[dict[str, Any]], None] | None = None
) -> AsyncIterator[Secured]:
    """The control plane of `gpuyard up` (durable, fast rounds) on a server requiring gpuyard's
    credentials; each service connects as itself; `identities` get credentials too; `configure`
    may change the services' configurations first."""
    creds = Credentials(root / "state", CLUSTER)
    creds.init()
    for identity in identities:
        creds.add(Caller.parse(identity))
    configs = control_plane_configs(round_s=0.5, heartbeat_timeout_s=1.5)
    configs["placement"].heartbeat_check_s = 0.1
    configs["placement"].command_timeout_s = 1.0
    configs["scheduler"].event_storage = "memory"
    if configure is not None:
        configure(configs)
    server = EmbeddedNats(state_dir=creds.root, auth=creds.users_conf)
    async with server as url, AsyncExitStack() as stack:
        creds.set_server(url, None)

        def auth(caller: Caller) -> NatsAuth:
            return NatsAuth.from_profile(creds.profile(caller))

        services = ServiceSet(
            url, CLUSTER, configs, auth=auth(OPERATOR),
            service_auth={n: auth(Caller("svc", n)) for n in configs},
        )  # fmt: skip
        await services.start()
        stack.push_async_callback(services.stop)
        yield Secured(url, creds, stack)

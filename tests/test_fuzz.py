"""Hardening: random and malformed messages to every subject of the endpoint table, `ctl.*`
included, each sent to every service that serves or hears it (the control plane, a node agent and
a simulation clock), as requests and as publishes with no reply subject. No service stops: every
one still answers afterwards, every request with a reply subject is answered, and error replies
name the field to blame."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuyard.cli.cluster import control_plane_configs
from gpuyard.run.launcher import ServiceSet
from gpuyard.services.nodeagent.service import NodeAgent, NodeAgentConfig
from gpuyard.services.simclock.service import SimClockConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import STATUS_HEADER, Empty, ErrorReply, Ping
from gpuyard.shared.endpoints import ENDPOINTS, PING, TAKEOVER, Endpoint, Subjects
from gpuyard.shared.model import ClusterSpec
from gpuyard.shared.roster import SERVICE_TOKENS

from .jobaccount import AGENT_CONFIG

CLUSTER = "fuzz"
S = Subjects(CLUSTER)
NODE = "n1"
TARGETS = {
    "admission": CLUSTER, "scheduler": CLUSTER, "placement": CLUSTER,
    "nodeagent": "fuzznode", "simclock": "fuzzsim",
}  # fmt: skip
"""Each service fuzzed, and its cluster: the node agent and the clock run alone in clusters of
their own (no control plane there places a fuzzed job on a real node, or drives a simulation)."""
TOKENS = {**SERVICE_TOKENS, "nodeagent": f"node.{NODE}"}
CALLERS = ["op.fuzz", "user.fuzz", f"node.{NODE}", "svc.simclock", "nobody.x", "user.-"]
"""The identities fuzzed subjects name (the last two invalid)."""


def serving(endpoint: Endpoint[Any, Any], service: str) -> bool:
    """Whether `service` gets `endpoint`'s messages: it serves it, or it is a publish nobody
    serves (heartbeats, events, log lines: whoever listens, hears it)."""
    return service in endpoint.serves or "*" in endpoint.serves or not endpoint.serves


def routes(service: str) -> list[Endpoint[Any, Any]]:
    return [e for e in ENDPOINTS if serving(e, service)]


def subjects(service: str, endpoint: Endpoint[Any, Any]) -> st.SearchStrategy[str]:
    """Concrete subjects of `endpoint` as sent to `service`, placeholders filled with values it
    knows and with others."""
    names = re.findall(r"{(\w+)}", endpoint.pattern)
    values = {
        "svc": st.just(TOKENS[service]),
        "node": st.sampled_from([NODE, "ghost"]) if service != "nodeagent" else st.just(NODE),
        "caller": st.sampled_from(CALLERS),
        "type": st.sampled_from(["node.up", "node.lost", "job.submitted", "x"]),
        "job": st.sampled_from(["j1", "x"]),
    }
    subjects = Subjects(TARGETS[service])
    return st.fixed_dictionaries({n: values[n] for n in names}).map(
        lambda params: subjects.of(endpoint, **params)
    )


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.sampled_from([2**63, -(2**63) - 1, 10**400, 1e308, -1, 0])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def shaped(request_type: type) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with the request's own field names (some of them) holding anything, plus strangers."""
    names = [f.name for f in msgspec.structs.fields(request_type)]
    known = (
        st.dictionaries(st.sampled_from(names), json_values, max_size=len(names))
        if names
        else st.just({})
    )
    unknown = st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=2)
    return st.tuples(known, unknown).map(lambda kv: {**kv[1], **kv[0]})


def payloads(request_type: type) -> st.SearchStrategy[bytes]:
    text = st.one_of(
        shaped(request_type).map(json.dumps),
        json_values.map(json.dumps),
        st.text(max_size=50),
    )
    return st.one_of(text.map(str.encode), st.binary(max_size=100))


@dataclass(frozen=True)
class Message:
    endpoint: Endpoint[Any, Any]
    subject: str
    data: bytes
    reply: bool
    """Sent as a request (False: published with no reply subject)."""

    @property
    def is_object(self) -> bool:
        try:
            return isinstance(json.loads(self.data), dict)
        except ValueError:
            return False


def messages(service: str) -> st.SearchStrategy[Message]:
    def for_endpoint(endpoint: Endpoint[Any, Any]) -> st.SearchStrategy[Message]:
        reply = st.booleans() if endpoint.reply is not None else st.just(False)
        return st.builds(
            Message, st.just(endpoint), subjects(service, endpoint), payloads(endpoint.request),
            reply,
        )  # fmt: skip

    return st.sampled_from(routes(service)).flatmap(for_endpoint)


def a_takeover(message: Message) -> bool:
    """A well-formed takeover request: the handover a replacement asks for, which stops the
    instance asked by design (tests/test_recovery.py tries it); fuzzing sends every other one."""
    if message.endpoint is not TAKEOVER or not message.reply:
        return False
    try:
        msgspec.json.decode(message.data or b"{}", type=Empty)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return False
    return True


@dataclass
class Plane:
    bus: Bus
    """The fuzzer's connection (no cluster of its own: it sends raw subjects)."""
    services: dict[str, Bus]
    """A connection in each service's cluster, to ping it."""

    async def answering(self) -> list[str]:
        """The services that answer a ping."""
        alive = []
        for service, bus in self.services.items():
            try:
                await bus.call(PING, Ping(), within_s=5, svc=TOKENS[service])
            except Exception:
                continue
            alive.append(service)
        return alive


@pytest.fixture
async def plane(nats_url: str, tmp_path: Path) -> AsyncIterator[Plane]:
    configs: dict[str, Any] = control_plane_configs(round_s=0.5, heartbeat_timeout_s=2.0)
    configs["scheduler"].event_storage = "memory"
    workload = tmp_path / "jobs.jsonl"
    workload.write_text('{"job_id": "j1", "num_gpus": 1, "duration": 10, "submit_time": 0}\n')
    clock = SimClockConfig(workload=str(workload), cluster=ClusterSpec.parse("1x1"))
    agent_config = NodeAgentConfig(
        **AGENT_CONFIG, node_id=NODE, gpus=1, use_nvml=False, grace_s=1, log_dir=str(tmp_path / "logs"),
        checkpoint_root=str(tmp_path / "ckpt"),
    )  # fmt: skip
    async with (
        ServiceSet(nats_url, CLUSTER, configs, log_level="error"),
        ServiceSet(nats_url, TARGETS["simclock"], {"simclock": clock}, log_level="error"),
    ):
        agent = NodeAgent(
            Bus(await connect(nats_url, name="agent"), Subjects(TARGETS["nodeagent"])), agent_config
        )
        await agent.start()
        buses = {
            service: Bus(await connect(nats_url, name=f"pinger-{service}"), Subjects(cluster))
            for service, cluster in TARGETS.items()
        }
        bus = Bus(await connect(nats_url, name="fuzzer"), S)
        try:
            yield Plane(bus, buses)
        finally:
            await agent.stop()
            for b in [bus, *buses.values()]:
                await b.close()


async def send(bus: Bus, message: Message) -> None:
    if not message.reply:
        await bus.nc.publish(message.subject, message.data)
        await bus.nc.flush()
        return
    reply = await bus.nc.request(message.subject, message.data, timeout=10)  # raises on no answer
    if reply.headers and reply.headers.get(STATUS_HEADER) == "error":
        error = msgspec.json.decode(reply.data, type=ErrorReply)
        assert error.error and error.subject == message.subject
        if message.is_object and error.error.startswith(
            ("Expected `", "Object contains unknown field", "Object missing required field")
        ):
            assert error.field is not None and error.field.startswith("$"), error


def fuzz_service(bus: Bus, loop: asyncio.AbstractEventLoop, service: str) -> None:
    """Hypothesis drives from a worker thread; each message is sent on the test's event loop."""

    @settings(
        max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(messages(service))
    def one(message: Message) -> None:
        assume(not a_takeover(message))
        asyncio.run_coroutine_threadsafe(send(bus, message), loop).result(timeout=15)

    one()


def test_every_endpoint_is_fuzzed() -> None:
    """Each endpoint of the table reaches a fuzzed service (a new one is covered, or fails here)."""
    fuzzed = {e.pattern for service in TARGETS for e in routes(service)}
    assert fuzzed == {e.pattern for e in ENDPOINTS}
    served = {s for e in ENDPOINTS for s in e.serves} - {"*"}
    assert served <= set(TARGETS), served - set(TARGETS)


@pytest.mark.slow
@pytest.mark.parametrize("service", sorted(TARGETS))
async def test_services_survive_garbage(plane: Plane, service: str) -> None:
    await asyncio.to_thread(fuzz_service, plane.bus, asyncio.get_running_loop(), service)
    assert await plane.answering() == list(TARGETS)


async def test_a_malformed_takeover_stops_no_service(plane: Plane) -> None:
    """`ctl.<svc>.takeover` with a body that is not a takeover's, or with no reply subject, is
    refused (an error reply where it can go) and the service goes on serving."""
    for service in ("admission", "scheduler", "placement"):
        subject = S.of(TAKEOVER, svc=SERVICE_TOKENS[service])
        for data in (b"garbage", b"{}", b'{"x": 1}', b""):
            await plane.bus.nc.publish(subject, data)  # no reply subject
        reply = await plane.bus.nc.request(subject, b"\xff{", timeout=5)
        assert reply.headers and reply.headers.get(STATUS_HEADER) == "error"
        assert "JSON is malformed" in msgspec.json.decode(reply.data, type=ErrorReply).error
    assert await plane.answering() == list(TARGETS)


@pytest.mark.parametrize(
    ("subject", "payload", "field"),
    [
        (
            f"{S.service('placement')}.register",
            {"now": 0, "node": {"node_id": "big", "num_gpus": 10**12}},
            "$.node.num_gpus",
        ),
        (f"{S.service('scheduler')}.tick", {"now": "soon"}, "$.now"),
        (f"{S.service('scheduler')}.jobs", {"offset": 2**70, "limit": [1]}, "$.limit"),
        (
            f"{S.service('admission')}.policy.set",
            {"policy": "accept-all", "params": {"x": 1}},
            "$.params.x",
        ),
        (f"{S.service('scheduler')}.policy.set", {"policy": 3}, "$.policy"),
    ],
)
async def test_field_named(plane: Plane, subject: str, payload: dict, field: str) -> None:
    reply = await plane.bus.nc.request(subject, json.dumps(payload).encode(), timeout=5)
    error = msgspec.json.decode(reply.data, type=ErrorReply)
    assert error.field == field, error

"""Hardening: random and malformed messages to every public subject of admission, scheduler and
placement. No service dies, every request is answered, and error replies name the field to blame."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.launcher import ServiceSet
from gpuyard.services.admission.service import AdmissionConfig
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import STATUS_HEADER, ErrorReply, Ping
from gpuyard.shared.endpoints import ENDPOINTS, PING, SERVICE_TOKENS, Subjects

CLUSTER = "fuzz"
S = Subjects(CLUSTER)
ROUTES: dict[str, dict[str, type]] = {
    S.service(name): {
        e.pattern.format(svc=token, caller="op.fuzz").removeprefix(f"{token}."): e.request
        for e in ENDPOINTS
        if e.reply is not None and (name in e.serves or "*" in e.serves) and "ctl." not in e.pattern
        and "{node}" not in e.pattern  # (a node's subject, which placement answers: heartbeats)
    }
    for name, token in SERVICE_TOKENS.items()
    if name != "simclock"
}
"""Every request route of admission, scheduler and placement, from the endpoint table."""

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


def messages(prefix: str) -> st.SearchStrategy[tuple[str, bytes, bool]]:
    """(subject, payload, payload is a JSON object) for one service's routes."""
    routes = ROUTES[prefix]

    def for_route(suffix: str) -> st.SearchStrategy[tuple[str, bytes, bool]]:
        def tag(data: bytes) -> tuple[str, bytes, bool]:
            try:
                is_object = isinstance(json.loads(data), dict)
            except ValueError:
                is_object = False
            return f"{prefix}.{suffix}", data, is_object

        return payloads(routes[suffix]).map(tag)

    return st.sampled_from(sorted(routes)).flatmap(for_route)


@pytest.fixture
async def plane(nats_url: str) -> AsyncIterator[Bus]:
    configs = {
        "placement": PlacementConfig(),
        "scheduler": SchedulerConfig(event_storage="memory"),
        "admission": AdmissionConfig(),
    }
    async with ServiceSet(nats_url, CLUSTER, configs, log_level="error"):
        bus = Bus(await connect(nats_url, name="fuzzer"), S)
        yield bus
        await bus.close()


async def send(bus: Bus, subject: str, data: bytes, is_object: bool) -> None:
    reply = await bus.nc.request(subject, data, timeout=10)  # raises when nobody answers
    if reply.headers and reply.headers.get(STATUS_HEADER) == "error":
        error = msgspec.json.decode(reply.data, type=ErrorReply)
        assert error.error and error.subject == subject
        if is_object and error.error.startswith(
            ("Expected `", "Object contains unknown field", "Object missing required field")
        ):
            assert error.field is not None and error.field.startswith("$"), error


def fuzz_service(bus: Bus, loop: asyncio.AbstractEventLoop, prefix: str) -> None:
    """Hypothesis drives from a worker thread; each message is sent on the test's event loop."""

    @settings(
        max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(messages(prefix))
    def one(message: tuple[str, bytes, bool]) -> None:
        asyncio.run_coroutine_threadsafe(send(bus, *message), loop).result(timeout=15)

    one()


@pytest.mark.parametrize("prefix", sorted(ROUTES))
async def test_services_survive_garbage(plane: Bus, prefix: str) -> None:
    await asyncio.to_thread(fuzz_service, plane, asyncio.get_running_loop(), prefix)
    for service in ("admission", "scheduler", "placement"):
        pong = await plane.call(PING, Ping(), within_s=5, svc=SERVICE_TOKENS[service])
        assert pong


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
        (f"{S.service('admission')}.policy.set", {"policy": "accept-all", "params": {"x": 1}}, "$.params.x"),
        (f"{S.service('scheduler')}.policy.set", {"policy": 3}, "$.policy"),
    ],
)
async def test_field_named(plane: Bus, subject: str, payload: dict, field: str) -> None:
    reply = await plane.nc.request(subject, json.dumps(payload).encode(), timeout=5)
    error = msgspec.json.decode(reply.data, type=ErrorReply)
    assert error.field == field, error

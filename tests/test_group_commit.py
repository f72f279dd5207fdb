"""Group commit (`Service.commits_in_groups`): under load a durable service handles the requests
already queued, writes its state once and then answers them all; every answer still comes after
the write that holds its request's effect. On a real NATS server with JetStream."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import Ping, Pong
from gpuyard.shared.endpoints import PING, Endpoint, Subjects
from gpuyard.shared.service import Handler, Service

REQUESTS = 40


class Counter(Service):
    """Counts the requests it handled; the count is its durable state."""

    name = "admission"  # any service's subjects will do

    def __init__(self, bus: Bus, *, grouped: bool) -> None:
        super().__init__(bus)
        self.config = SimpleNamespace(durable=True)
        self.commits_in_groups = grouped  # type: ignore[misc]
        self.count = 0
        self.writes = 0

    def routes(self) -> dict[Endpoint[Any, Any], Handler]:
        return {PING: self.bump}

    async def bump(self, _: Ping) -> Pong:
        self.count += 1
        await asyncio.sleep(0.005)  # some work: the next requests queue up meanwhile
        return await self.ping(_)

    async def persist(self) -> None:
        self.writes += 1
        await self.store.put_many({"count": self.count})


async def _burst(url: str, cluster: str, grouped: bool) -> tuple[int, list[int]]:
    """REQUESTS at once: the service's writes, and the stored count each answer found."""
    service = Counter(Bus(await connect(url, name="counter"), Subjects(cluster)), grouped=grouped)
    await service.start()
    client = Bus(await connect(url, name="client"), Subjects(cluster), request_timeout=30)
    kv = await client.nc.jetstream().key_value(f"gpuyard_{cluster}_admission")
    answered = 0
    seen: list[int] = []

    async def one() -> None:
        nonlocal answered
        await client.call(PING, Ping(), svc="adm")
        answered += 1
        stored = int((await kv.get("count")).value or b"0")
        seen.append(stored - answered)  # >= 0: written before it was answered

    try:
        await asyncio.gather(*(one() for _ in range(REQUESTS)))
    finally:
        await client.close()
        await service.stop()
    return service.writes, seen


@pytest.mark.parametrize("grouped", [True, False])
async def test_answers_come_after_their_write_and_a_queue_shares_one(
    nats_url: str, grouped: bool
) -> None:
    writes, seen = await _burst(nats_url, f"gc{int(grouped)}", grouped)
    assert len(seen) == REQUESTS and min(seen) >= 0
    if grouped:
        assert writes <= REQUESTS // 4  # the requests queued behind one share its write
    else:
        assert writes == REQUESTS  # one write per request

"""The services answer the NATS micro discovery protocol (`nats micro ls`, `nats micro info`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gpuyard.run.launcher import ServiceSet
from gpuyard.services.admission.service import AdmissionConfig
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import RegisterNode, SubmitRequest
from gpuyard.shared.endpoints import REGISTER, SUBMIT, Subjects
from gpuyard.shared.model import JobSpec, NodeSpec

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)


async def ask_all(bus: Bus, subject: str, wait_s: float = 0.5) -> list[dict[str, Any]]:
    """Every answer to a discovery request (each service instance answers)."""
    inbox = bus.nc.new_inbox()
    answers: list[dict[str, Any]] = []

    async def collect(msg) -> None:  # type: ignore[no-untyped-def]
        answers.append(json.loads(msg.data))

    sub = await bus.nc.subscribe(inbox, cb=collect)
    await bus.nc.publish(subject, b"", reply=inbox)
    await asyncio.sleep(wait_s)
    await sub.unsubscribe()
    return answers


async def test_services_are_listed_with_their_endpoints_and_stats(nats_url: str) -> None:
    configs = {
        "placement": PlacementConfig(), "scheduler": SchedulerConfig(event_storage="memory"),
        "admission": AdmissionConfig(),
    }  # fmt: skip
    async with ServiceSet(nats_url, "disco", configs):
        bus = Bus(await connect(nats_url, name="test"), Subjects("disco"))
        pings = await ask_all(bus, "$SRV.PING")
        assert sorted(p["name"] for p in pings) == [
            "gpuyard-admission", "gpuyard-placement", "gpuyard-scheduler",
        ]  # fmt: skip
        assert {p["type"] for p in pings} == {"io.nats.micro.v1.ping_response"}
        assert {p["metadata"]["cluster"] for p in pings} == {"disco"}

        (info,) = await ask_all(bus, "$SRV.INFO.gpuyard-scheduler")
        subjects = {e["subject"]: e for e in info["endpoints"]}
        assert subjects["gpuyard.disco.sched.enqueue"]["metadata"] == {
            "request": "EnqueueRequest", "reply": "SchedulerStatus",
        }  # fmt: skip
        assert "gpuyard.disco.sched.policy.set" in subjects
        assert info["metadata"]["policy"] == "fifo"

        await bus.call(REGISTER, RegisterNode(now=0.0, node=NodeSpec(node_id="n", num_gpus=1)))
        await bus.call(SUBMIT, SubmitRequest(now=0.0, jobs=[JobSpec(num_gpus=1, duration=5.0)]))
        await bus.nc.publish(bus.subject(SUBMIT), b"{broken", reply=bus.nc.new_inbox())
        await asyncio.sleep(0.2)
        admission_id = next(p["id"] for p in pings if p["name"] == "gpuyard-admission")
        (stats,) = await ask_all(bus, f"$SRV.STATS.gpuyard-admission.{admission_id}")
        submit = next(
            e for e in stats["endpoints"] if e["subject"] == "gpuyard.disco.adm.submit.*.*"
        )
        assert (submit["num_requests"], submit["num_errors"]) == (2, 1)
        assert "malformed" in submit["last_error"].lower()
        await bus.close()

"""Real clusters learn throughputs from progress reports: node agents' heartbeats carry each job's
steps, placement passes them to the scheduler with every apply, and the scheduler measures the
run's rate and teaches its model (here over a real NATS server, agents played by the test)."""

from __future__ import annotations

import asyncio
import time

import msgspec

from gpuyard.launcher import ServiceSet
from gpuyard.services.admission.service import AdmissionConfig
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import (
    Heartbeat,
    JobProgress,
    JobQuery,
    NodeCommand,
    NodeCommandReply,
    RegisterNode,
    SubmitRequest,
)
from gpuyard.shared.endpoints import HEARTBEAT, NODE_COMMAND, QUERY, REGISTER, SUBMIT, Subjects
from gpuyard.shared.model import JobRecord, JobSpec, NodeSpec


async def test_heartbeat_steps_become_the_runs_measured_rate(nats_url: str) -> None:
    configs = {
        "placement": PlacementConfig(heartbeat_timeout_s=60.0),
        "scheduler": SchedulerConfig(
            event_storage="memory", learn_throughputs=True, clock="wall", round_s=0.1
        ),
        "admission": AdmissionConfig(),
    }
    async with ServiceSet(nats_url, "learn", configs):
        bus = Bus(await connect(nats_url, name="test"), Subjects("learn"))
        decoder = msgspec.json.Decoder(NodeCommand)

        async def agent(msg) -> None:  # type: ignore[no-untyped-def]
            cmd = decoder.decode(msg.data)
            reply = NodeCommandReply(preempted=cmd.preempt, launched=[x.job_id for x in cmd.launch])
            await msg.respond(msgspec.json.encode(reply))

        await bus.nc.subscribe(bus.subjects.every(NODE_COMMAND), cb=agent)
        node = NodeSpec(node_id="n1", num_gpus=1, gpu_type="a", labels={"boot": "x"})
        await bus.call(REGISTER, RegisterNode(now=0.0, node=node))
        spec = JobSpec(job_id="j", num_gpus=1, job_type="t", total_steps=1e6)
        await bus.call(SUBMIT, SubmitRequest(now=0.0, jobs=[spec], tick=True))
        start = time.time()

        async def beat(at: float, steps: int) -> None:
            progress = JobProgress(job_id="j", rank=0, iterations=steps)
            hb = Heartbeat(now=start + at, node_id="n1", boot_id="x", jobs=[progress])
            await bus.publish(HEARTBEAT, hb, node="n1")
            await bus.nc.flush()

        async def record() -> JobRecord:
            (found,) = (await bus.call(QUERY, JobQuery(job_ids=["j"]))).jobs
            return found

        async def until(check) -> JobRecord:  # type: ignore[no-untyped-def]
            async with asyncio.timeout(10):
                while True:  # polling a remote service: no local event to wait for
                    found = await record()
                    if check(found):
                        return found
                    await asyncio.sleep(0.05)

        # The default model says 1 step/s per GPU; the job does 0.25. The rounds (every 0.1 s)
        # bring each heartbeat's report to the scheduler.
        await until(lambda r: r.state == "running")
        await beat(10.0, 100)
        await until(lambda r: r.steps_done == 100.0)
        await beat(50.0, 110)
        found = await until(lambda r: r.steps_done == 110.0)
        assert found.rate == 0.25 and found.progress_at == start + 50.0
        await bus.close()


async def test_an_agents_measured_rate_counts_from_a_runs_first_report(nats_url: str) -> None:
    """A run that lasts one round (Gavel's mechanism moves jobs every round) reaches the
    scheduler in one report: the rate its node agent measured from the job's own reports is the
    run's rate. A node the job does not run on (its old part still stopping) is not heard."""
    configs = {
        "placement": PlacementConfig(heartbeat_timeout_s=60.0),
        "scheduler": SchedulerConfig(
            event_storage="memory", learn_throughputs=True, clock="wall", round_s=0.1
        ),
        "admission": AdmissionConfig(),
    }
    async with ServiceSet(nats_url, "learn1", configs):
        bus = Bus(await connect(nats_url, name="test"), Subjects("learn1"))
        decoder = msgspec.json.Decoder(NodeCommand)

        async def agent(msg) -> None:  # type: ignore[no-untyped-def]
            cmd = decoder.decode(msg.data)
            reply = NodeCommandReply(preempted=cmd.preempt, launched=[x.job_id for x in cmd.launch])
            await msg.respond(msgspec.json.encode(reply))

        await bus.nc.subscribe(bus.subjects.every(NODE_COMMAND), cb=agent)
        for node_id, gpus in (("n1", 1), ("n2", 0)):
            node = NodeSpec(node_id=node_id, num_gpus=gpus, gpu_type="a", labels={"boot": "x"})
            await bus.call(REGISTER, RegisterNode(now=0.0, node=node))
        spec = JobSpec(job_id="j", num_gpus=1, job_type="t", total_steps=1e6)
        await bus.call(SUBMIT, SubmitRequest(now=0.0, jobs=[spec], tick=True))
        start = time.time()

        async def beat(node_id: str, at: float, steps: int, rate: float) -> None:
            progress = JobProgress(job_id="j", iterations=steps, time=start + at, rate=rate)
            hb = Heartbeat(now=start + at, node_id=node_id, boot_id="x", jobs=[progress])
            await bus.publish(HEARTBEAT, hb, node=node_id)
            await bus.nc.flush()

        async def until(check) -> JobRecord:  # type: ignore[no-untyped-def]
            async with asyncio.timeout(10):
                while True:  # polling a remote service: no local event to wait for
                    (found,) = (await bus.call(QUERY, JobQuery(job_ids=["j"]))).jobs
                    if check(found):
                        return found
                    await asyncio.sleep(0.05)

        found = await until(lambda r: r.state == "running")
        assert found.nodes == ["n1"]
        await beat("n1", 10.0, 100, 0.4)  # the run's first report to reach the scheduler
        found = await until(lambda r: r.steps_done == 100.0)
        assert found.rate == 0.4
        await beat("n2", 20.0, 900, 999.0)  # not where the job runs: not heard
        await beat("n1", 30.0, 110, 0.5)
        found = await until(lambda r: r.steps_done == 110.0)
        assert found.rate == 0.5
        await bus.close()

"""Real clusters learn throughputs from progress reports: node agents' heartbeats carry each job's
steps, placement passes them to the scheduler with every apply, and the scheduler measures the
run's rate and teaches its model (here over a real NATS server, agents played by the test)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest

from gpuyard.run.launcher import ServiceSet
from gpuyard.services.admission.service import AdmissionConfig
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import (
    Empty,
    ExitReport,
    Heartbeat,
    JobExit,
    JobProgress,
    JobQuery,
    NodeCommand,
    NodeCommandReply,
    RegisterNode,
    SubmitRequest,
)
from gpuyard.shared.endpoints import (
    EXITED,
    HEARTBEAT,
    NODE_COMMAND,
    QUERY,
    REGISTER,
    STATS,
    SUBMIT,
    Subjects,
)
from gpuyard.shared.model import JobRecord, JobSpec, NodeSpec
from gpuyard.shared.throughput import GavelThroughputs, LearnedThroughputs, split_job_type


def learning_control_plane() -> dict[str, Any]:
    """Services on the wall clock, in fast rounds, whose scheduler learns throughputs."""
    return {
        "placement": PlacementConfig(heartbeat_timeout_s=60.0),
        "scheduler": SchedulerConfig(
            event_storage="memory", learn_throughputs=True, clock="wall", round_s=0.1
        ),
        "admission": AdmissionConfig(),
    }


async def answer_node_commands(bus: Bus) -> None:
    """Answer every node command as an agent would: launched and preempted as asked."""
    decoder = msgspec.json.Decoder(NodeCommand)

    async def agent(msg) -> None:  # type: ignore[no-untyped-def]
        cmd = decoder.decode(msg.data)
        reply = NodeCommandReply(preempted=cmd.preempt, launched=[x.job_id for x in cmd.launch])
        await msg.respond(msgspec.json.encode(reply))

    await bus.nc.subscribe(bus.subjects.every(NODE_COMMAND), cb=agent)


async def test_heartbeat_steps_become_the_runs_measured_rate(nats_url: str) -> None:
    async with ServiceSet(nats_url, "learn", learning_control_plane()):
        bus = Bus(await connect(nats_url, name="test"), Subjects("learn"))
        await answer_node_commands(bus)
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
    async with ServiceSet(nats_url, "learn1", learning_control_plane()):
        bus = Bus(await connect(nats_url, name="test"), Subjects("learn1"))
        await answer_node_commands(bus)
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


# --------------------------------------------------------------------------- unseen job types

TABLE = {  # Gavel's format: steps/s of one-GPU jobs on each type
    "v100": {"('ResNet-50 (batch size 64)', 1)": {"null": 10.0},
             "('ResNet-50 (batch size 128)', 1)": {"null": 6.0},
             "('LM (batch size 20)', 1)": {"null": 4.0},
             "('Small', 1)": {"null": 1.0}},
    "p100": {"('ResNet-50 (batch size 64)', 1)": {"null": 6.0},
             "('ResNet-50 (batch size 128)', 1)": {"null": 3.5},
             "('LM (batch size 20)', 1)": {"null": 3.6},
             "('Small', 1)": {"null": 0.9}},
    "k80": {"('ResNet-50 (batch size 64)', 1)": {"null": 2.0},
            "('ResNet-50 (batch size 128)', 1)": {"null": 1.1},
            "('LM (batch size 20)', 1)": {"null": 3.2},
            "('Small', 1)": {"null": 0.0}},  # does not fit on a K80
}  # fmt: skip


def learned() -> LearnedThroughputs:
    return LearnedThroughputs(GavelThroughputs(TABLE))


@pytest.mark.slow
async def test_a_part_that_stopped_as_it_was_told_asks_for_no_round(nats_url: str) -> None:
    """On the wall clock a change asks for a round at once. An agent's word that a part it was
    told to stop is gone changes nothing and asks for none: a round at every such exit had
    Gavel's time shares swap two jobs back and forth within milliseconds."""
    control = learning_control_plane()
    control["scheduler"] = SchedulerConfig(event_storage="memory", clock="wall", round_s=60.0)
    async with ServiceSet(nats_url, "stopped", control):
        bus = Bus(await connect(nats_url, name="test"), Subjects("stopped"))
        await answer_node_commands(bus)
        node = NodeSpec(node_id="n1", num_gpus=1, gpu_type="a", labels={"boot": "x"})
        await bus.call(REGISTER, RegisterNode(now=time.time(), node=node))
        spec = JobSpec(job_id="j", num_gpus=1, total_steps=1e6)
        await bus.call(SUBMIT, SubmitRequest(now=time.time(), jobs=[spec], tick=True))
        async with asyncio.timeout(10):
            while True:  # polling a remote service: no local event to wait for
                if (await bus.call(QUERY, JobQuery(job_ids=["j"]))).jobs[0].state == "running":
                    break
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # (the rounds its start asked for are done)
        decisions = len((await bus.call(STATS, Empty(), svc="sched")).decision_s)
        for _ in range(5):
            stopped = JobExit(job_id="j", node_id="n1", status="stopped", attempt=0)
            await bus.call(EXITED, ExitReport(now=time.time(), exits=[stopped]))
        await asyncio.sleep(1.0)
        assert len((await bus.call(STATS, Empty(), svc="sched")).decision_s) == decisions
        await bus.close()


def test_split_job_type_reads_the_reference_tables_names() -> None:
    assert split_job_type("ResNet-50 (batch size 64)") == ("resnet-50", 64)
    assert split_job_type("resnet50@256") == ("resnet50", 256)
    assert split_job_type("CycleGAN") == ("cyclegan", None)


def test_a_known_job_type_follows_its_own_prior_row() -> None:
    model = learned()
    assert model.reference("LM (batch size 20)") == "LM (batch size 20)"
    model.observe("LM (batch size 20)", "v100", 1, 2.0)  # half the table's figure
    assert model.throughput("LM (batch size 20)", "k80", 1) == pytest.approx(1.6)
    assert model.throughput("Small", "k80", 1) == 0.0  # unsupported stays so


def test_an_unknown_job_type_follows_the_type_with_its_ratios() -> None:
    """Measured on two GPU types, it is estimated from the listed type whose throughputs have
    the same ratios there (the nearest neighbour), scaled to its measurements."""
    model = learned()
    model.observe("Mystery", "v100", 1, 2.0)
    model.observe("Mystery", "k80", 1, 1.6)  # v100 / k80 = 1.25, as LM's 4.0 / 3.2
    assert model.reference("Mystery") == "LM (batch size 20)"
    assert model.throughput("Mystery", "p100", 1) == pytest.approx(1.8)  # 3.6 x 0.5
    assert model.throughput("Mystery", "k80", 1) == 1.6  # measured: as measured
    # A ResNet-like one: five times faster on v100 than on k80.
    model.observe("Other", "v100", 1, 20.0)
    model.observe("Other", "k80", 1, 4.0)
    assert model.reference("Other") == "ResNet-50 (batch size 64)"
    assert model.throughput("Other", "p100", 1) == pytest.approx(12.0)
    assert model.throughput("Other", "any", 1) == 20.0  # the reference type (v100)


def test_measured_on_one_type_the_closest_figures_decide() -> None:
    """One measurement says nothing about ratios: the listed type closest to it there is taken;
    types that cannot run where it ran are not alike."""
    model = learned()
    model.observe("Mystery", "v100", 1, 5.5)  # nearest: ResNet-50 at batch 128 (6.0)
    assert model.reference("Mystery") == "ResNet-50 (batch size 128)"
    assert model.throughput("Mystery", "k80", 1) == pytest.approx(1.1 * 5.5 / 6.0)
    model.observe("Tiny", "v100", 1, 1.0)
    assert model.reference("Tiny") == "Small"  # exactly its figure
    model.observe("Tiny", "k80", 1, 0.3)  # Small does not fit on a K80: not alike after all
    assert model.reference("Tiny") == "ResNet-50 (batch size 64)"  # the closest ratio (3.3 vs 5)
    # Measured where no listed type runs: by name, as if unmeasured.
    model = LearnedThroughputs(GavelThroughputs({"v100": TABLE["v100"], "k80": TABLE["k80"]}))
    model.observe("Small (batch size 4)", "a100", 1, 3.0)
    assert model.reference("Small (batch size 4)") == "Small"


def test_an_unmeasured_unknown_job_type_is_estimated_by_name_or_as_a_typical_job() -> None:
    model = learned()
    # The same model at the nearest batch size (log scale), as is.
    assert model.reference("ResNet-50 (batch size 96)") == "ResNet-50 (batch size 128)"
    assert model.reference("ResNet-50 (batch size 80)") == "ResNet-50 (batch size 64)"
    assert model.throughput("ResNet-50 (batch size 80)", "k80", 1) == 2.0
    assert model.reference("lm") == "LM (batch size 20)"  # no batch size: the same model
    # Nothing alike: a typical job, the geometric mean of the types that run there.
    assert model.reference("Mystery") is None
    assert model.throughput("Mystery", "v100", 1) == pytest.approx((10 * 6 * 4 * 1) ** 0.25)
    assert model.throughput("Mystery", "k80", 1) == pytest.approx((2 * 1.1 * 3.2) ** (1 / 3))
    # Once measured, its measurements choose (and scale) its reference row.
    model.observe("Mystery", "v100", 1, 8.0)
    model.observe("Mystery", "k80", 1, 6.4)
    assert model.reference("Mystery") == "LM (batch size 20)"
    assert model.throughput("Mystery", "p100", 1) == pytest.approx(7.2)


def test_estimates_are_deterministic_and_survive_a_restore() -> None:
    observations = [("A", "v100", 1, 3.0), ("A", "k80", 1, 2.5), ("B", "p100", 1, 5.0),
                    ("A", "v100", 1, 3.2)]  # fmt: skip
    first, second = learned(), learned()
    for obs in observations:
        first.observe(*obs)
        second.observe(*obs)
    entries = [(j, t, 1) for j in ("A", "B", "C (batch size 8)") for t in ("v100", "p100", "k80")]
    answers = [first.throughput(*e) for e in entries]
    assert answers == [second.throughput(*e) for e in entries]
    again = learned()
    again.restore(first.snapshot())
    assert [again.throughput(*e) for e in entries] == answers

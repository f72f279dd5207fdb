"""Operations: swapping a policy at runtime, tailing the event stream, cluster status, the CLI."""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import AsyncIterator

import msgspec
import pytest

from gpuyard.cli import main
from gpuyard.ops import (
    NoEventStream,
    cluster_status,
    format_event,
    matches,
    parse_since,
    read_events,
    set_policy,
    show_policies,
)
from gpuyard.run.launcher import ServiceSet
from gpuyard.services.admission.service import AdmissionConfig
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import (
    Empty,
    Event,
    ExitReport,
    JobExit,
    NodeCommand,
    NodeCommandReply,
    PageQuery,
    RegisterNode,
    SchedulerStatus,
    SubmitReply,
    SubmitRequest,
    TickRequest,
)
from gpuyard.shared.endpoints import (
    EVENT,
    EXITED,
    JOBS,
    NODE_COMMAND,
    REGISTER,
    STATUS,
    SUBMIT,
    TICK,
    Subjects,
)
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.model import JobSpec, NodeSpec

CLUSTER = "ops"


async def fake_node_agent(bus: Bus) -> None:
    """Answer every node command at once, as a node agent that launches and preempts instantly."""
    decoder = msgspec.json.Decoder(NodeCommand)

    async def answer(msg) -> None:
        cmd = decoder.decode(msg.data)
        reply = NodeCommandReply(preempted=cmd.preempt, launched=[x.job_id for x in cmd.launch])
        await msg.respond(msgspec.json.encode(reply))

    await bus.nc.subscribe(bus.subjects.every(NODE_COMMAND), cb=answer)


@pytest.fixture
async def plane(nats_url: str) -> AsyncIterator[Bus]:
    """admission, scheduler (fifo) and placement, one 1-GPU node answered by a fake agent."""
    configs = {
        "placement": PlacementConfig(),
        "scheduler": SchedulerConfig(event_storage="memory"),
        "admission": AdmissionConfig(),
    }
    async with ServiceSet(nats_url, CLUSTER, configs):
        bus = Bus(await connect(nats_url, name="test-ops"), Subjects(CLUSTER), request_timeout=10)
        await fake_node_agent(bus)
        await bus.call(REGISTER, RegisterNode(now=0.0, node=NodeSpec(node_id="n0", num_gpus=1)))
        yield bus
        await bus.close()


async def submit(bus: Bus, now: float, *jobs: tuple[str, float]) -> SubmitReply:
    specs = [JobSpec(job_id=j, num_gpus=1, duration=d) for j, d in jobs]
    return await bus.call(SUBMIT, SubmitRequest(jobs=specs, now=now, tick=True))


async def finish(bus: Bus, now: float, job_id: str) -> SchedulerStatus:
    report = ExitReport(now=now, exits=[JobExit(job_id=job_id, status="completed")], tick=True)
    return await bus.call(EXITED, report)


async def states(bus: Bus) -> dict[str, str]:
    page = await bus.call(JOBS, PageQuery())
    return {j.job_id: j.state for j in page.jobs}


async def test_swap_scheduling_policy_mid_run(plane: Bus) -> None:
    bus = plane
    await submit(bus, 0.0, ("a", 1000.0))
    await submit(bus, 1.0, ("b", 500.0), ("c", 10.0))
    assert await states(bus) == {"a": "running", "b": "queued", "c": "queued"}
    # FIFO keeps the long job on the GPU ...
    await bus.call(TICK, TickRequest(now=1.5))
    assert (await states(bus))["a"] == "running"

    info = await set_policy(bus, "scheduler", "sjf", {"preemptive": "true"}, now=2.0)
    assert (info.previous, info.policy, info.params["preemptive"]) == ("fifo", "sjf", True)
    # ... preemptive SJF gives it to the shortest job at the next decision.
    status = await bus.call(TICK, TickRequest(now=2.0))
    assert status.ran_round
    assert await states(bus) == {"a": "queued", "b": "queued", "c": "running"}
    await finish(bus, 12.0, "c")
    assert await states(bus) == {"a": "queued", "b": "running", "c": "completed"}
    await finish(bus, 512.0, "b")
    await finish(bus, 1600.0, "a")
    status = await bus.call(STATUS, Empty())
    assert (status.finished, status.queued, status.running) == (3, 0, 0)  # no job lost

    events = [s.event async for s in read_events(bus.nc, bus.subjects)]
    kinds = [(e.type, e.job_id) for e in events if e is not None]
    assert ("job.preempted", "a") in kinds
    changed = [e for e in events if e is not None and e.type == "policy.changed"]
    assert len(changed) == 1 and changed[0].service == "scheduler" and changed[0].now == 2.0
    assert "fifo -> sjf" in changed[0].reason
    started = [j for t, j in kinds if t == "job.started"]
    assert started == ["a", "c", "b", "a"]


@pytest.mark.parametrize(
    ("service", "policy", "params", "field", "words"),
    [
        ("scheduler", "no-such-policy", {}, "$.policy", "unknown scheduling policy"),
        ("scheduler", "sjf", {"preemptive": "maybe"}, "$.params.preemptive", "expected `bool`"),
        ("scheduler", "sjf", {"speed": "1"}, "$.params.speed", "unknown field"),
        ("admission", "queue-cap", {"max_jobs": "lots"}, "$.params", "bad parameter"),
        ("placement", "nope", {}, "$.policy", "unknown placement policy"),
    ],
)
async def test_bad_policy_swaps_keep_the_old_policy(
    plane: Bus, service, policy, params, field, words
) -> None:
    before = (await show_policies(plane))[service]
    with pytest.raises(RemoteError) as err:
        await set_policy(plane, service, policy, params)
    reply = err.value.reply
    assert reply.field is not None and reply.field.startswith(field)
    assert words.lower() in reply.error.lower()
    assert (await show_policies(plane))[service] == before


async def test_simclock_has_no_policy_and_show_lists_all(plane: Bus) -> None:
    infos = await show_policies(plane)
    assert {s: i.policy for s, i in infos.items()} == {
        "admission": "accept-all", "scheduler": "fifo", "placement": "consolidated",
    }  # fmt: skip
    assert infos["scheduler"].params == {"backfill": False}
    await set_policy(plane, "placement", "first-fit", {})
    await set_policy(plane, "admission", "queue-cap", {})
    infos = await show_policies(plane)
    assert (infos["placement"].policy, infos["admission"].policy) == ("first-fit", "queue-cap")


async def test_tail_filters_and_follow(plane: Bus) -> None:
    bus = plane
    await submit(bus, 0.0, ("x", 100.0), ("y", 100.0))
    everything = [s async for s in read_events(bus.nc, bus.subjects)]
    assert {s.event.type for s in everything if s.event} >= {
        "node.up",
        "job.submitted",
        "job.started",
    }
    only_started = [s async for s in read_events(bus.nc, bus.subjects, types=["job.started"])]
    assert [s.event.job_id for s in only_started] == ["x"]
    assert "gpus=n0:0" in format_event(only_started[0])
    jobs = [s async for s in read_events(bus.nc, bus.subjects, types=["job.*"])]
    assert all(s.event.type.startswith("job.") for s in jobs)
    assert {s.event.job_id for s in jobs if matches(s, job="y")} == {"y"}
    assert [s.event.type for s in everything if matches(s, node="n0")] == ["node.up", "job.started"]
    later = [s async for s in read_events(bus.nc, bus.subjects, start=parse_since("1h"))]
    assert len(later) == len(everything)

    got: asyncio.Queue = asyncio.Queue()

    async def follow() -> None:
        async for s in read_events(bus.nc, bus.subjects, start="new", follow=True):
            await got.put(s)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.3)
    await bus.emit(Event(type="node.drained", now=5.0, node_id="n9", reason="maintenance"))
    stored = await asyncio.wait_for(got.get(), 5)
    assert stored.event.type == "node.drained" and stored.event.node_id == "n9"
    task.cancel()


async def test_a_cluster_storing_no_events_is_followed_live(nats_url: str) -> None:
    """`event_storage = "none"` (a sweep's runs): no stream; reading without --follow says so,
    following shows the events published from then on, of the types asked for."""
    configs = {
        "placement": PlacementConfig(),
        "scheduler": SchedulerConfig(event_storage="none"),
        "admission": AdmissionConfig(),
    }
    async with ServiceSet(nats_url, "unstored", configs):
        bus = Bus(await connect(nats_url, name="test-ops"), Subjects("unstored"))
        try:
            with pytest.raises(NoEventStream, match="--follow"):
                [s async for s in read_events(bus.nc, bus.subjects)]
            got: asyncio.Queue = asyncio.Queue()

            async def follow() -> None:
                async for s in read_events(bus.nc, bus.subjects, types=["job.*"], follow=True):
                    await got.put(s)

            task = asyncio.create_task(follow())
            await asyncio.sleep(0.3)
            await bus.call(REGISTER, RegisterNode(now=0.0, node=NodeSpec(node_id="n0", num_gpus=1)))
            await submit(bus, 1.0, ("live", 100.0))
            seen = [await asyncio.wait_for(got.get(), 5) for _ in range(2)]
            assert [(s.event.type, s.event.job_id, s.seq) for s in seen] == [
                ("job.submitted", "live", 0), ("job.queued", "live", 0)]  # fmt: skip
            assert format_event(seen[0]).startswith("#-")
            task.cancel()
        finally:
            await bus.close()


async def test_status(plane: Bus) -> None:
    await submit(plane, 0.0, ("s1", 100.0), ("s2", 100.0))
    status = await cluster_status(plane)
    up = {s.service: s for s in status.services}
    assert up["scheduler"].up and up["scheduler"].policy == "fifo" and up["scheduler"].version
    assert "simclock" not in up  # a cluster without one (a real one) does not list it
    assert status.scheduler is not None and (status.scheduler.queued, status.scheduler.running) == (
        1,
        1,
    )
    assert status.nodes is not None and [n.node_id for n in status.nodes.nodes] == ["n0"]


async def test_cli_commands(plane: Bus, nats_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--nats", nats_url, "--cluster", CLUSTER]
    await submit(plane, 0.0, ("k1", 100.0))

    async def cli(*argv: str) -> tuple[int, str]:
        code = await asyncio.to_thread(main, list(argv))
        return code, capsys.readouterr().out

    code, out = await cli("policy", "set", "scheduler", "las", "--param", "starvation_s=60", *base)
    assert code == 0 and "fifo -> las" in out
    code, out = await cli("policy", "show", *base)
    assert code == 0 and "scheduler  las" in out
    code, _ = await cli("policy", "set", "scheduler", "bogus", *base)
    assert code == 1
    code, out = await cli("status", *base)
    assert code == 0 and "scheduler   up" in out and "1 running" in out and "n0" in out
    code, out = await cli("tail", "--job", "k1", "--json", *base)
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [x["type"] for x in lines] == [
        "job.submitted", "job.queued", "job.started", "job.admitted",
    ]  # fmt: skip
    code, out = await cli("tail", "--type", "policy.changed", *base)
    assert code == 0 and "policy.changed" in out and "fifo -> las" in out
    code, _ = await cli("tail", "--nats", nats_url, "--cluster", "nosuchcluster")
    assert code == 1
    # On an open server no identity names the submitter: the login does, and `jobs` shows it.
    code, out = await cli("submit", *base, "--", "true")
    job_id = out.split()[-1]
    code, out = await cli("jobs", *base, "--json", job_id)
    (row,) = json.loads(next(x for x in out.splitlines() if x.startswith('{"jobs"')))["jobs"]
    assert code == 0 and row["user"] == getpass.getuser() == row["spec"]["user"]


async def test_jobs_lists_held_jobs_until_admitted(
    plane: Bus, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job admission holds never reaches the scheduler: `gpuyard jobs` lists it from
    admission's events, PENDING with admission's reason, and from the scheduler once admitted."""
    await set_policy(plane, "admission", "queue-cap", {"cap": 1})
    await submit(plane, 0.0, ("h1", 100.0), ("h2", 100.0))

    async def row(job_id: str) -> dict[str, object]:
        code = await asyncio.to_thread(
            main, ["jobs", "--nats", nats_url, "--cluster", CLUSTER, "--json", job_id]
        )
        out = capsys.readouterr().out  # (the services' log lines too)
        (found,) = json.loads(next(x for x in out.splitlines() if x.startswith('{"jobs"')))["jobs"]
        assert code == 0
        return found

    held = await row("h2")
    assert (held["job_state"], held["state"]) == ("PENDING", "held")
    assert str(held["state_reason"]).startswith("held by admission: ")
    await finish(plane, 100.0, "h1")
    await plane.call(SUBMIT, SubmitRequest(jobs=[], now=100.0, tick=True))  # held ones again
    admitted = await row("h2")
    assert (admitted["job_state"], admitted["state_reason"]) == ("RUNNING", "")


@pytest.mark.slow
async def test_a_follower_stops_when_cancelled_however_busy_the_stream(nats_url: str) -> None:
    """Ctrl-C stops `tail --follow` even while events pour in: on Python 3.11 `asyncio.wait_for`
    (ours once, nats-py's JetStream calls still) drops a cancellation that comes as its item or
    reply arrives, and the follower read on for good. Cancelled at moments spread over its start
    (the stream lookup) and its reading."""
    nc = await connect(nats_url, name="test-follow-cancel")
    subjects = Subjects("cancel-follow")  # (no stream: the events as they are published)
    publishing = True

    async def publish() -> None:
        while publishing:
            await nc.publish(subjects.of(EVENT, type="job.started"), b"{}")
            await asyncio.sleep(0)

    async def follow() -> None:
        async for _ in read_events(nc, subjects, follow=True, check_s=0.5):
            pass

    publisher = asyncio.create_task(publish())
    try:
        for moment in range(200):
            follower = asyncio.create_task(follow())
            await asyncio.sleep(0.02 if moment % 10 == 9 else 0.0003 * (moment % 10))
            follower.cancel()
            done, _ = await asyncio.wait({follower}, timeout=2)
            assert done, f"the follower read on after it was cancelled (try {moment})"
    finally:
        publishing = False
        await publisher
        await nc.close()


async def test_new_parameters_of_the_same_policy_keep_its_state(plane: Bus) -> None:
    """Fair share by decayed usage: z used the GPU for 1,000 s before the policy was set again
    (new parameters, the same policy); x used it 300 s after. When both wait, x goes first: z's
    usage from before the change still counts."""
    bus = plane
    fair = {"weight_fairshare": "100", "half_life_s": "3600"}

    async def send(now: float, *jobs: tuple[str, str, float]) -> None:
        specs = [JobSpec(job_id=j, user=u, num_gpus=1, duration=d) for j, u, d in jobs]
        await bus.call(SUBMIT, SubmitRequest(jobs=specs, now=now, tick=True))

    await set_policy(bus, "scheduler", "easy-backfill", fair, now=0.0)
    await send(0.0, ("z0", "z", 1000.0))
    await finish(bus, 1000.0, "z0")
    await set_policy(bus, "scheduler", "easy-backfill", {**fair, "weight_age": "1"}, now=1000.0)
    await send(1000.0, ("x0", "x", 300.0))
    await send(1100.0, ("x1", "x", 10.0), ("z1", "z", 10.0))
    await finish(bus, 1300.0, "x0")
    assert (await states(bus))["x1"] == "running" and (await states(bus))["z1"] == "queued"

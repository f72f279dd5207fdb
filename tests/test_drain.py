"""Draining nodes (`gpuyard drain NODE --reason R`, `gpuyard resume NODE`, as Slurm's `scontrol
update state=drain|resume`): a draining node takes no new jobs while those running there go on;
`gpuyard nodes` shows it DRAIN, then DRAINED once no job is left; only operators may; placement
keeps the drain across its restarts and counts a draining node's capacity only for the GPUs its
jobs hold; events `node.draining`, `node.drained`, `node.resumed`. A node that went says why
(down, and its jobs' reason), across placement's restarts too."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import msgspec
import pytest

from gpuyard.natsauth import OPERATOR
from gpuyard.ops import read_events
from gpuyard.run.launcher import ServiceSet
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import (
    ApplyRequest,
    DrainRequest,
    Empty,
    Event,
    NodesChanged,
)
from gpuyard.shared.endpoints import APPLY, CLUSTER, DRAIN, EVENT, NODES, Subjects
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.identity import Caller
from gpuyard.shared.model import Allocation, JobSpec, NodeSpec

from .test_cluster_views import Views, counter, views  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)

OP = OPERATOR.token
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")
"""The control plane's log lines, which run in this process too and share the CLI's output."""


async def drain(v: Views, identity: str, *args: str) -> tuple[int, list[str], list[str]]:
    """`gpuyard drain|resume ARGS` as `identity`: status, and its own stdout and stderr lines."""
    code, out, err = await v.gpuyard(identity, *args)
    return code, cli_lines(out), cli_lines(err)


def cli_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not LOG_LINE.match(line)]


async def node_line(v: Views, node: str) -> str:
    """`gpuyard nodes`' line of `node` (as a user: anyone may look)."""
    code, out, err = await v.gpuyard("user.alice", "nodes")
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith(f"{node} ")]
    return line


async def until_state(v: Views, node: str, state: str, within_s: float = 15.0) -> str:
    """Until `node`'s STATE column (and what follows) starts with `state`."""

    async def check() -> str | None:
        line = await node_line(v, node)
        return line if line.split(None, 1)[1].startswith(f"{state} ") else None

    return await v.c.until(check, f"{node} {state}", within_s)


async def node_events(v: Views, node: str) -> list[Event]:
    op = await v.c.client(OP)
    types = ["node.draining", "node.drained", "node.resumed"]
    return [
        s.event
        async for s in read_events(op.bus.nc, op.bus.subjects, types=types)
        if s.event is not None and s.event.node_id == node
    ]


async def test_a_drained_node_keeps_its_job_takes_no_new_one_until_resumed(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    long = await views.submit("user.alice", "--gpus", "1", *counter(100000))
    (node,) = (await views.until_row(long, "RUNNING"))["node_list"]
    other = "b" if node == "a" else "a"

    assert await drain(views, OP, "drain", node, "--reason", "maintenance") == (
        0, [f"draining {node}"], [],
    )  # fmt: skip
    line = await node_line(views, node)
    assert line.split()[1:3] == ["DRAIN", "(maintenance)"], line
    assert "DRAIN" not in await node_line(views, other)

    # A new job goes to the other node; the drained node's job runs on.
    second = await views.submit("user.alice", "--gpus", "1", *counter(100000))
    assert (await views.until_row(second, "RUNNING"))["node_list"] == [other]
    assert (await views.rows(long))[long]["job_state"] == "RUNNING"

    # A third waits: the drained node's GPU, once free, is not given out.
    third = await views.submit("user.alice", "--gpus", "1", *counter(100000))
    code, _, err = await views.gpuyard("user.alice", "cancel", long)
    assert code == 0, err
    await views.until_row(long, "CANCELLED")
    line = await until_state(views, node, "DRAINED")
    assert line.split()[1:3] == ["DRAINED", "(maintenance)"], line
    await asyncio.sleep(2.0)  # (rounds every 0.5 s: several decide meanwhile)
    assert (await views.rows(third))[third]["job_state"] == "PENDING"

    assert await drain(views, OP, "resume", node) == (0, [f"resumed {node}"], [])
    assert (await views.until_row(third, "RUNNING"))["node_list"] == [node]
    assert "DRAIN" not in await node_line(views, node)

    events = await node_events(views, node)
    assert [e.type for e in events] == ["node.draining", "node.drained", "node.resumed"]
    assert events[0].reason == "maintenance" and events[1].reason == "maintenance"
    assert events[0].now <= events[1].now <= events[2].now
    for job_id in (second, third):  # (the agents stop sooner with nothing to stop)
        code, _, err = await views.gpuyard("user.alice", "cancel", job_id)
        assert code == 0, err


async def test_only_operators_drain_known_nodes(
    views: Views,  # noqa: F811 (the fixture imported)
) -> None:
    # A user: refused by the server, in one line, and nothing drains.
    code, out, err = await drain(views, "user.alice", "drain", "a", "--reason", "mine now")
    assert code == 1 and out == [] and len(err) == 1, err
    assert err[0].startswith("gpuyard drain: the server refused: permissions violation"), err
    assert err[0].endswith("(identity user.alice)"), err
    op = await views.c.client(OP)
    assert (await op.bus.call(CLUSTER, Empty())).draining == {}
    code, _, err = await drain(views, "user.alice", "resume", "a")
    assert code == 1 and len(err) == 1 and "the server refused" in err[0], err

    # An unknown node is refused by name, the known one drains (DRAINED at once: it is idle).
    assert await drain(views, OP, "drain", "nope", "a", "--reason", "disk") == (
        1, ["draining a"], ["not drained nope: no such node"],
    )  # fmt: skip
    assert (await until_state(views, "a", "DRAINED")).split()[1:3] == ["DRAINED", "(disk)"]
    # Drained again: a new reason; a node that is not draining cannot be resumed.
    assert await drain(views, OP, "drain", "a", "--reason", "new disk") == (0, ["draining a"], [])
    assert (await op.bus.call(CLUSTER, Empty())).draining == {"a": "new disk"}
    assert await drain(views, OP, "resume", "b", "a") == (
        1, ["resumed a"], ["not resumed b: not draining"],
    )  # fmt: skip
    # A reason is required, as Slurm requires one.
    for args in ((), ("--reason", " ")):
        code, _, err = await drain(views, OP, "drain", "a", *args)
        assert code == 2 and len(err) == 1 and "--reason" in err[0], err
    assert (await op.bus.call(CLUSTER, Empty())).draining == {}

    types = [e.type for e in await node_events(views, "a")]
    assert types == ["node.draining", "node.drained", "node.draining", "node.resumed"]


def spec(job_id: str, gpus: int) -> JobSpec:
    return JobSpec(job_id=job_id, num_gpus=gpus, duration=100.0)


def apply(now: float, jobs: dict[str, int], released: tuple[str, ...] = ()) -> ApplyRequest:
    return ApplyRequest(
        now=now, allocations=[Allocation(j, n, "v100") for j, n in jobs.items()],
        specs={j: spec(j, n) for j, n in jobs.items()}, released=list(released),
    )  # fmt: skip


async def test_placement_counts_and_keeps_a_drain_across_its_restart(nats_url: str) -> None:
    """Placement alone (simulated nodes, durable): a draining node counts in the capacity only for
    the GPUs its jobs hold, gives out none, and drains still after placement restarted."""
    configs = {
        "placement": PlacementConfig(simulated=True, command_timeout_s=None, durable=True),
    }
    bus = Bus(await connect(nats_url, name="test"), Subjects("drain"), request_timeout=5)
    seen: list[Event] = []

    async def on_event(msg: Any) -> None:
        seen.append(msgspec.json.decode(msg.data, type=Event))

    await bus.nc.subscribe(bus.subjects.of(EVENT, type="node.>"), cb=on_event)
    try:
        async with ServiceSet(nats_url, "drain", configs, log_level="error"):
            nodes = [NodeSpec(node_id=f"n{i}", num_gpus=4, gpu_type="v100") for i in (1, 2)]
            await bus.call(NODES, NodesChanged(now=0.0, up=nodes))
            first = await bus.call(APPLY, apply(1.0, {"j1": 2}))
            (n1,) = {g.node_id for g in first.placed["j1"]}
            n2 = "n2" if n1 == "n1" else "n1"
            reply = await bus.call(DRAIN, DrainRequest(node_ids=[n1], reason="fans", now=2.0))
            assert reply.done == [n1] and not reply.refused
            info = await bus.call(CLUSTER, Empty())
            assert info.draining == {n1: "fans"} and info.capacity == {"v100": 2 + 4}
            # j2 fits beside j1 but goes to the other node.
            second = await bus.call(APPLY, apply(3.0, {"j1": 2, "j2": 2}))
            assert {g.node_id for g in second.placed["j2"]} == {n2}
            assert second.capacity == {"v100": 6}
        async with ServiceSet(nats_url, "drain", configs, log_level="error"):  # restarted
            info = await bus.call(CLUSTER, Empty())
            assert info.draining == {n1: "fans"} and info.capacity == {"v100": 6}
            # j1 ends: the drained node counts for nothing, and a 4-GPU job waits.
            third = await bus.call(APPLY, apply(4.0, {"j2": 2, "j3": 4}, released=("j1",)))
            assert third.unplaced == ["j3"] and third.capacity == {"v100": 4}
            assert [e.type for e in seen if e.node_id == n1] == [
                "node.up", "node.draining", "node.drained",
            ]  # fmt: skip
            # Only operators (on a server without auth the subject names the caller).
            user = Bus(bus.nc, bus.subjects, request_timeout=5, caller=Caller("user", "bob"))
            with pytest.raises(RemoteError, match="only operators"):
                await user.call(DRAIN, DrainRequest(node_ids=[n1], resume=True))
            reply = await bus.call(DRAIN, DrainRequest(node_ids=[n1], resume=True, now=5.0))
            assert reply.done == [n1]
            fourth = await bus.call(APPLY, apply(6.0, {"j2": 2, "j3": 4}))
            assert {g.node_id for g in fourth.placed["j3"]} == {n1}
            assert fourth.capacity == {"v100": 8}
            info = await bus.call(CLUSTER, Empty())
            assert info.draining == {}
            # A node that leaves while draining drains still when it comes back.
            await bus.call(DRAIN, DrainRequest(node_ids=[n2], reason="psu", now=7.0))
            await bus.call(NODES, NodesChanged(now=8.0, gone=[n2]))
            await bus.call(NODES, NodesChanged(now=9.0, up=[NodeSpec(node_id=n2, num_gpus=4,
                                                                     gpu_type="v100")]))  # fmt: skip
            info = await bus.call(CLUSTER, Empty())
            assert info.draining == {n2: "psu"} and info.capacity == {"v100": 4}
        await asyncio.sleep(0.1)  # (the last events' delivery)
        assert [e.type for e in seen if e.node_id == n2] == [
            "node.up", "node.draining", "node.lost", "node.up", "node.drained",
        ]  # fmt: skip
    finally:
        await bus.close()


async def test_why_a_node_went_outlives_placement_s_restart(nats_url: str) -> None:
    """A node's going, told why (`NodesChanged.reason`): the node is down with that reason, and
    its jobs come back lost with it in the next apply, after a placement restart too; the
    reason goes once the node comes back."""
    configs = {
        "placement": PlacementConfig(simulated=True, command_timeout_s=None, durable=True),
    }
    bus = Bus(await connect(nats_url, name="test"), Subjects("why"), request_timeout=5)
    try:
        async with ServiceSet(nats_url, "why", configs, log_level="error"):
            nodes = [NodeSpec(node_id=f"n{i}", num_gpus=4, gpu_type="v100") for i in (1, 2)]
            await bus.call(NODES, NodesChanged(now=0.0, up=nodes))
            first = await bus.call(APPLY, apply(1.0, {"j1": 4, "j2": 4}))
            on = {j: gpus[0].node_id for j, gpus in first.placed.items()}
            reply = await bus.call(
                NODES, NodesChanged(now=2.0, gone=[on["j1"]], reason="agent stopped")
            )
            assert reply.lost_jobs == ["j1"]
        async with ServiceSet(nats_url, "why", configs, log_level="error"):  # restarted
            info = await bus.call(CLUSTER, Empty())
            assert info.down_why == {on["j1"]: "agent stopped"}
            second = await bus.call(APPLY, apply(3.0, {"j2": 4}))
            assert second.lost == ["j1"]
            assert second.lost_why == {"j1": f"node {on['j1']} gone: agent stopped"}
            again = NodeSpec(node_id=on["j1"], num_gpus=4, gpu_type="v100")
            await bus.call(NODES, NodesChanged(now=4.0, up=[again]))
            info = await bus.call(CLUSTER, Empty())
            assert info.down == {} and info.down_why == {}
            assert (await bus.call(APPLY, apply(5.0, {"j2": 4}))).lost_why == {}
    finally:
        await bus.close()


def test_a_node_whose_heartbeats_are_late_is_marked_not_responding() -> None:
    """`*` after the state once the agent missed 3 of its heartbeats."""
    import time as clock

    from gpuyard.cli.cluster import format_nodes
    from gpuyard.shared.contract import ClusterInfo, HeartbeatsPage

    now = clock.time()
    nodes = [NodeSpec(node_id=f"n{i}", num_gpus=4, gpu_type="v100") for i in range(1, 6)]
    info = ClusterInfo(nodes=nodes, capacity={}, busy={}, draining={"n3": "fans"})
    beats = HeartbeatsPage(
        beats=[], received={"n1": now - 4, "n2": now - 1, "n3": now - 4, "n4": now - 40},
        every={"n1": 1.0, "n2": 0.5, "n3": 1.0, "n4": 15.0},
    )  # fmt: skip
    header, *lines = format_nodes(info, beats, now).splitlines()
    column = slice(header.index("STATE"), header.index("TYPE"))
    states = {line.split()[0]: line[column].strip() for line in lines}
    assert states == {
        "n1": "IDLE*",  # 4 s: over 3 beats of 1 s
        "n2": "IDLE",  # 1 s: 2 beats of 0.5 s
        "n3": "DRAINED* (fans)",
        "n4": "IDLE",  # 40 s: under 3 beats of 15 s
        "n5": "IDLE",  # never heard of (no interval told: the simclock's nodes)
    }


def test_a_draining_node_that_is_down_says_both() -> None:
    import time as clock

    from gpuyard.cli.cluster import format_nodes
    from gpuyard.shared.contract import ClusterInfo, HeartbeatsPage

    now = clock.time()
    info = ClusterInfo(
        nodes=[], capacity={}, busy={}, down={"n1": now - 100, "n2": now - 5, "n3": now - 1},
        down_why={"n1": "agent stopped", "n2": "no heartbeat for 15 s"},
        draining={"n1": "disk swap"},
    )  # fmt: skip
    rows = {
        line.split()[0]: line
        for line in format_nodes(info, HeartbeatsPage(beats=[], received={}), now).splitlines()
    }
    assert " DOWN+DRAIN (disk swap; agent stopped) since " in rows["n1"]
    assert "(1:40 ago)" in rows["n1"]
    assert " DOWN (no heartbeat for 15 s) since " in rows["n2"]
    assert " DOWN since " in rows["n3"]  # (no reason told)

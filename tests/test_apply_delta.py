"""Applies that tell placement only what changed (`ApplyRequest.base`): jobs not named keep their
GPUs, the named ones are stopped or placed, and a base that is not placement's last apply is
refused by field, so the scheduler sends every allocation instead."""

from __future__ import annotations

import pytest

from gpuyard.run.launcher import ServiceSet
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import ApplyRequest, Empty, NodesChanged
from gpuyard.shared.endpoints import APPLY, CLUSTER, NODES, Subjects
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.model import Allocation, JobSpec, NodeSpec


def spec(job_id: str, gpus: int) -> JobSpec:
    return JobSpec(job_id=job_id, num_gpus=gpus, duration=100.0)


async def test_an_apply_of_what_changed_leaves_the_others_where_they_run(nats_url: str) -> None:
    configs = {"placement": PlacementConfig(simulated=True, command_timeout_s=None)}
    async with ServiceSet(nats_url, "delta", configs, log_level="error"):
        bus = Bus(await connect(nats_url, name="test"), Subjects("delta"), request_timeout=5)
        try:
            nodes = [NodeSpec(node_id=f"n{i}", num_gpus=4, gpu_type="v100") for i in (1, 2)]
            await bus.call(NODES, NodesChanged(now=0.0, up=nodes))
            jobs = {"a": 2, "b": 2, "c": 4}
            full = ApplyRequest(
                now=1.0, allocations=[Allocation(j, n, "v100") for j, n in jobs.items()],
                specs={j: spec(j, n) for j, n in jobs.items()},
            )  # fmt: skip
            first = await bus.call(APPLY, full)
            assert sorted(first.started) == ["a", "b", "c"] and first.applied == 1
            before = (await bus.call(CLUSTER, Empty())).busy
            # a stops, d takes its GPUs; b and c are not named: they stay where they are.
            delta = ApplyRequest(
                now=2.0, base=1, allocations=[Allocation("d", 2, "v100")],
                specs={"d": spec("d", 2)}, stop=["a"],
            )  # fmt: skip
            second = await bus.call(APPLY, delta)
            assert second.stopped == ["a"] and list(second.started) == ["d"]
            assert second.applied == 2 and not second.unplaced
            after = (await bus.call(CLUSTER, Empty())).busy
            assert sorted(after) == ["b", "c", "d"]
            assert after["b"] == before["b"] and after["c"] == before["c"]
            assert sorted(after["d"]) == sorted(before["a"])  # (the only GPUs free)
            # A base that is not the last apply: refused by field, nothing changes.
            stale = ApplyRequest(now=3.0, base=1, allocations=[], stop=["b"])
            with pytest.raises(RemoteError) as refused:
                await bus.call(APPLY, stale)
            assert refused.value.reply.field == "$.base"
            assert sorted((await bus.call(CLUSTER, Empty())).busy) == ["b", "c", "d"]
            # The full form still works from any state, and numbers on.
            again = ApplyRequest(now=4.0, allocations=[Allocation("c", 4, "v100")])
            third = await bus.call(APPLY, again)
            assert sorted(third.stopped) == ["b", "d"] and third.applied == 3
            # Jobs sharing GPUs are placed with their partners: a delta is refused while any do.
            pair = ApplyRequest(
                now=5.0, allocations=[Allocation("c", 4, "v100"), Allocation("e", 4, "v100", "c")],
                specs={"e": spec("e", 4)},
            )  # fmt: skip
            assert list((await bus.call(APPLY, pair)).started) == ["e"]
            with pytest.raises(RemoteError) as refused:
                await bus.call(APPLY, ApplyRequest(now=6.0, base=4, allocations=[], stop=["e"]))
            assert refused.value.reply.field == "$.base"
        finally:
            await bus.close()


async def test_the_scheduler_sends_every_allocation_to_a_placement_that_lost_its_state(
    nats_url: str,
) -> None:
    """Placement restarted without its state: it refuses the scheduler's apply of what changed
    (the base is not its last apply), and the scheduler sends every allocation instead, at the
    same round: the job it starts runs."""
    from gpuyard.services.scheduler.service import SchedulerConfig
    from gpuyard.shared.contract import CancelRequest, EnqueueRequest, JobQuery, TickRequest
    from gpuyard.shared.endpoints import CANCEL, ENQUEUE, QUERY, TICK

    node = NodeSpec(node_id="n1", num_gpus=4, gpu_type="v100")
    placement = {"placement": PlacementConfig(simulated=True, command_timeout_s=None)}
    scheduler = {"scheduler": SchedulerConfig(event_storage="none")}
    async with ServiceSet(nats_url, "refused", scheduler, log_level="error"):
        bus = Bus(await connect(nats_url, name="test"), Subjects("refused"), request_timeout=5)
        try:
            async with ServiceSet(nats_url, "refused", placement, log_level="error"):
                await bus.call(NODES, NodesChanged(now=0.0, up=[node]))
                status = await bus.call(
                    ENQUEUE, EnqueueRequest(now=1.0, jobs=[spec("j1", 4)], tick=True)
                )
                assert status.running == 1
            async with ServiceSet(nats_url, "refused", placement, log_level="error"):
                await bus.call(NODES, NodesChanged(now=2.0, up=[node]))
                await bus.call(CANCEL, CancelRequest(job_ids=["j1"], now=3.0))
                status = await bus.call(
                    ENQUEUE, EnqueueRequest(now=3.0, jobs=[spec("j2", 2)], tick=True)
                )
                if not status.running:  # (the cancel's round may come with the next tick)
                    status = await bus.call(TICK, TickRequest(now=3.0))
                assert status.running == 1
                page = await bus.call(QUERY, JobQuery(job_ids=["j2"]))
                assert page.jobs[0].state == "running"
                assert list((await bus.call(CLUSTER, Empty())).busy) == ["j2"]
        finally:
            await bus.close()

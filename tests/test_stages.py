"""A simulation's applies of several instants in one request (`place.stages`): where placement
assures it places what fits, the scheduler goes on through the instants that only start jobs and
tells placement of them together, with the same results, the same events, and fewer round trips;
jobs a placement that breaks the assurance left out wait again; a policy that reads where jobs run
gets no stages; a placement that restarted without its state gets every allocation, as with a
single apply."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from gpuyard.ops import read_events
from gpuyard.policies.blox.ordering import Fifo
from gpuyard.policies.placement.strategies import Consolidated
from gpuyard.run.embedded import EmbeddedNats
from gpuyard.run.launcher import ServiceSet
from gpuyard.run.simulate import SimOptions, SimResult, simulate
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler import stages
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.services.scheduler.stages import Staged, Stages
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import (
    ApplyReply,
    ApplyRequest,
    Empty,
    EnqueueRequest,
    ExitReport,
    JobExit,
    JobQuery,
    NodesChanged,
)
from gpuyard.shared.endpoints import CLUSTER, ENQUEUE, EXITED, NODES, QUERY, STATS, Subjects
from gpuyard.shared.model import Allocation, ClusterSpec, GpuRef, JobSpec, NodeSpec
from gpuyard.shared.policy import (
    Decision,
    Needs,
    PlacementInput,
    SchedulingInput,
    placement_policies,
    scheduling_policies,
)
from gpuyard.workloads import blox


class Unassured(Consolidated):
    """`consolidated` without the assurance: each decision's apply goes alone."""

    @property
    def places_what_fits(self) -> bool:
        return False


class Overpromising(Consolidated):
    """Assures it, and places nothing on a node where fewer GPUs are free than half of them."""

    def place(self, inp: PlacementInput) -> dict[str, list[GpuRef]]:
        placed = super().place(inp)
        crowded = {n.node_id for n in inp.nodes if 2 * len(n.usable) < n.num_gpus}
        return {j: g for j, g in placed.items() if j in inp.current or g[0].node_id not in crowded}


class NodesSeen(Fifo):
    """FIFO, noting at each decision the running jobs whose nodes it is not told."""

    unknown: ClassVar[list[str]] = []

    def schedule(self, inp: SchedulingInput) -> Decision | list[Allocation]:
        self.unknown.extend(j.job_id for j in inp.jobs if j.state == "running" and not j.nodes)
        return super().schedule(inp)


class NodesRead(NodesSeen):
    """The same, declaring that it reads where jobs run."""

    needs = Needs(job_nodes=True)
    unknown: ClassVar[list[str]] = []


@pytest.fixture
def policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(placement_policies._classes, "test-unassured", Unassured)
    monkeypatch.setitem(placement_policies._classes, "test-overpromising", Overpromising)
    monkeypatch.setitem(scheduling_policies._classes, "test-nodes-seen", NodesSeen)
    monkeypatch.setitem(scheduling_policies._classes, "test-nodes-read", NodesRead)
    NodesSeen.unknown.clear()
    NodesRead.unknown.clear()


async def run(tmp_path: Path, placement: str, jobs: list[JobSpec]) -> tuple[SimResult, list]:
    """A run on a server of its own, with its events as stored (`job.*`, in order)."""
    options = SimOptions(cluster=ClusterSpec.parse("8x4"), mode="events", placement=placement)
    async with EmbeddedNats() as url:
        result = await simulate(options, jobs, tmp_path / placement, nats_url=url, plots=False)
        nc = await connect(url, name="test")
        events = [
            (e.event.type, e.event.now, e.event.job_id, e.event.gpus)
            async for e in read_events(nc, Subjects("sim"), types=["job.>"])
        ]
        await nc.drain()
    return result, events


def placement_requests(result: SimResult) -> dict[str, int]:
    asked = next(s for s in result.stats if s.service == "scheduler").requests
    return {s: int(n) for s, (n, _) in asked.items() if s in ("place.apply", "place.stages")}


async def test_stages_give_the_same_run_with_fewer_round_trips(
    tmp_path: Path, policies: None
) -> None:
    jobs = blox(300, 6.0, seed=4, gpu_demand={1: 0.8, 2: 0.1, 4: 0.1}).jobs
    alone, alone_events = await run(tmp_path, "test-unassured", jobs)
    staged, staged_events = await run(tmp_path, "consolidated", jobs)
    for name in ("jobs.csv", "timeline.csv"):
        assert (tmp_path / "consolidated" / name).read_bytes() == (
            tmp_path / "test-unassured" / name
        ).read_bytes(), name
    assert staged_events == alone_events  # (`job.started` names the GPUs placement chose)
    assert any(e[0] == "job.started" and e[3] for e in staged_events)
    one_by_one, together = placement_requests(alone), placement_requests(staged)
    assert "place.stages" not in one_by_one
    assert together["place.stages"] > 0
    # Every apply of the first run is in the second, a stage of several at a time.
    assert sum(together.values()) < 0.75 * one_by_one["place.apply"], (together, one_by_one)


@pytest.mark.slow
async def test_stages_go_in_requests_of_a_bounded_size(
    tmp_path: Path, policies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept-back launches go once there are `MAX_STAGED_LAUNCHES` of them: more requests, the
    same run."""
    jobs = blox(300, 6.0, seed=4, gpu_demand={1: 0.8, 2: 0.1, 4: 0.1}).jobs
    unbounded, _ = await run(tmp_path / "unbounded", "consolidated", jobs)
    monkeypatch.setattr(stages, "MAX_STAGED_LAUNCHES", 2)
    bounded, _ = await run(tmp_path / "bounded", "consolidated", jobs)
    assert (tmp_path / "bounded" / "consolidated" / "jobs.csv").read_bytes() == (
        tmp_path / "unbounded" / "consolidated" / "jobs.csv"
    ).read_bytes()
    assert (
        placement_requests(bounded)["place.stages"] > placement_requests(unbounded)["place.stages"]
    )


async def test_jobs_a_placement_did_not_run_as_staged_wait_again(
    tmp_path: Path, policies: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A placement that breaks its assurance (a wrong `places_what_fits`, or a cluster changed
    under a simulation) leaves jobs out of stages: they wait again from their stage's instant,
    and the run goes on to its end."""
    jobs = [
        JobSpec(job_id=f"j{i}", num_gpus=1, duration=100.0, submit_time=10.0 * i) for i in range(6)
    ]
    options = SimOptions(cluster=ClusterSpec.parse("1x4"), placement="test-overpromising")
    async with EmbeddedNats() as url:
        result = await simulate(options, jobs, tmp_path, nats_url=url, plots=False)
    assert [r.state for r in result.jobs] == ["completed"] * 6
    requeued = [r for r in result.jobs if r.preemptions]
    assert requeued and all(r.end_time > r.first_start + 100.0 for r in requeued)
    log = capsys.readouterr().out
    assert "stages.not_run" in log and "places_what_fits" in log


@pytest.mark.slow
async def test_a_policy_that_reads_where_jobs_run_is_told_at_every_decision(
    tmp_path: Path, policies: None
) -> None:
    """Staged jobs run on nodes not known until placement answers: a policy that reads them
    (`Needs.job_nodes`) has every decision applied before the next, and always sees them."""
    jobs = blox(200, 6.0, seed=2, gpu_demand={1: 0.8, 2: 0.2}).jobs
    results = {}
    for policy in ("test-nodes-seen", "test-nodes-read"):
        options = SimOptions(cluster=ClusterSpec.parse("8x4"), policy=policy)
        async with EmbeddedNats() as url:
            result = await simulate(options, jobs, tmp_path / policy, nats_url=url, plots=False)
        results[policy] = placement_requests(result)
    assert NodesSeen.unknown and results["test-nodes-seen"].get("place.stages")
    assert not NodesRead.unknown and "place.stages" not in results["test-nodes-read"]
    assert (tmp_path / "test-nodes-seen" / "jobs.csv").read_bytes() == (
        tmp_path / "test-nodes-read" / "jobs.csv"
    ).read_bytes()


def test_a_stage_in_full_holds_what_ran_then() -> None:
    """A placement that lost its state gets every allocation as of a stage: those the later
    stages started leave, those they released come back."""
    a, b, c, d = (Allocation(j, 1, "v100") for j in "abcd")
    first = Staged(ApplyRequest(now=1.0, allocations=[c], base=4), released={})
    second = Staged(ApplyRequest(now=2.0, allocations=[d], base=5, released=["b"]), {"b": b})
    final = {"a": a, "c": c, "d": d}
    assert Stages.whole_as_of([first, second], 0, final) == [a, c, b]
    assert Stages.whole_as_of([first, second], 1, final) == [a, c, d]


def test_a_later_stage_has_the_last_word_on_a_job() -> None:
    """A job one stage stopped and a later one placed again runs; one left out is not run."""
    a, b = Allocation("a", 1, "v100"), Allocation("b", 1, "v100")
    gpu = [GpuRef("n1", 0)]
    stages = [
        Staged(ApplyRequest(now=1.0, allocations=[a, b], base=4), released={}),
        Staged(ApplyRequest(now=2.0, allocations=[a], base=5), released={}),
    ]
    replies = [
        ApplyReply(placed={"b": gpu}, started={"b": "v100"}, stopped=[], unplaced=["a"], lost=[],
                   capacity={}),
        ApplyReply(placed={"a": gpu}, started={"a": "v100"}, stopped=["b"], unplaced=[], lost=[],
                   capacity={}),
    ]  # fmt: skip
    placed, undone = Stages.placed(stages, replies)
    assert placed == {"a": gpu} and undone == {"b": (2.0, "stopped by placement")}


async def test_stages_refused_by_a_placement_that_lost_its_state_go_one_by_one(
    nats_url: str,
) -> None:
    """Placement restarted without its state: the stages' first base is refused, and the
    scheduler sends the first stage with every allocation, then the others: the jobs run."""
    node = NodeSpec(node_id="n1", num_gpus=4, gpu_type="v100")
    placement = {"placement": PlacementConfig(simulated=True, command_timeout_s=None)}
    scheduler = {"scheduler": SchedulerConfig(event_storage="none")}

    def spec(job_id: str, at: float) -> JobSpec:
        return JobSpec(job_id=job_id, num_gpus=1, duration=100.0, submit_time=at, gpu_type="v100")

    async with ServiceSet(nats_url, "staged", scheduler, log_level="error"):
        bus = Bus(await connect(nats_url, name="test"), Subjects("staged"), request_timeout=5)
        try:
            async with ServiceSet(nats_url, "staged", placement, log_level="error"):
                await bus.call(NODES, NodesChanged(now=0.0, up=[node]))
                status = await bus.call(
                    ENQUEUE, EnqueueRequest(now=0.0, jobs=[spec("j0", 0.0)], tick=True)
                )
                assert status.running == 1
            async with ServiceSet(nats_url, "staged", placement, log_level="error"):
                await bus.call(NODES, NodesChanged(now=1.0, up=[node]))
                arrivals = EnqueueRequest(
                    now=1.0, jobs=[spec("j1", 2.0), spec("j2", 3.0)], times=[2.0, 3.0]
                )
                await bus.call(ENQUEUE, arrivals)
                exit_j0 = ExitReport(
                    now=1.0, exits=[JobExit(job_id="j0", node_id="n1", status="completed")],
                    tick=True, until=50.0, least_run_s=100.0, least_end=100.0,
                )  # fmt: skip
                status = await bus.call(EXITED, exit_j0)
                assert (status.running, status.finished) == (2, 1)
                page = await bus.call(QUERY, JobQuery(job_ids=["j1", "j2"]))
                assert [(j.job_id, j.state, j.first_start) for j in page.jobs] == [
                    ("j1", "running", 2.0), ("j2", "running", 3.0),
                ]  # fmt: skip
                assert all(j.nodes == ["n1"] for j in page.jobs)
                assert sorted((await bus.call(CLUSTER, Empty())).busy) == ["j1", "j2"]
                asked = (await bus.call(STATS, Empty(), svc="sched")).requests
                # j0 alone; the stages of j1 and j2, refused; j1 with every allocation; j2.
                assert {s: int(asked[s][0]) for s in ("place.apply", "place.stages")} == {
                    "place.apply": 3, "place.stages": 1,
                }  # fmt: skip
        finally:
            await bus.close()

"""A simulation's results handed over as jobs end (`sched.finished`): the scheduler forgets the
jobs its driver took, so a long replay holds only what is active, and the results are the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuyard.run import simulate as sim
from gpuyard.run.launcher import ServiceSet
from gpuyard.services.placement.service import PlacementConfig
from gpuyard.services.scheduler.service import SchedulerConfig
from gpuyard.shared.connection import Bus, connect
from gpuyard.shared.contract import (
    CancelRequest,
    EnqueueRequest,
    FinishedQuery,
    JobQuery,
    NodesChanged,
    PageQuery,
)
from gpuyard.shared.endpoints import CANCEL, ENQUEUE, FINISHED, JOBS, NODES, QUERY, Subjects
from gpuyard.shared.errors import RemoteError
from gpuyard.shared.model import ClusterSpec, JobSpec, NodeSpec
from gpuyard.workloads import blox


def spec(job_id: str) -> JobSpec:
    return JobSpec(job_id=job_id, num_gpus=4, duration=100.0)


@pytest.mark.parametrize("hand_over", [True, False])
async def test_the_scheduler_forgets_the_jobs_that_ended_once_they_were_taken(
    nats_url: str, hand_over: bool
) -> None:
    configs = {
        "placement": PlacementConfig(simulated=True, command_timeout_s=None),
        "scheduler": SchedulerConfig(event_storage="none", hand_over_results=hand_over),
    }
    async with ServiceSet(nats_url, "handover", configs, log_level="error"):
        bus = Bus(await connect(nats_url, name="test"), Subjects("handover"), request_timeout=5)
        try:
            await bus.call(
                NODES,
                NodesChanged(now=0.0, up=[NodeSpec(node_id="n1", num_gpus=4, gpu_type="v100")]),
            )
            jobs = [spec(j) for j in ("j1", "j2", "j3", "j4")]
            status = await bus.call(ENQUEUE, EnqueueRequest(now=1.0, jobs=jobs, tick=True))
            assert (status.running, status.queued) == (1, 3)
            await bus.call(CANCEL, CancelRequest(job_ids=["j3", "j2"], now=2.0))
            page = await bus.call(FINISHED, FinishedQuery())
            assert [r.job_id for r in page.jobs] == ["j3", "j2"]  # (in the order they ended)
            assert (page.total, page.forgets) == (2, hand_over)
            assert (await bus.call(JOBS, PageQuery())).total == 4  # (not told it was taken yet)
            page = await bus.call(FINISHED, FinishedQuery(taken=2))
            assert page.jobs == [] and page.total == 2
            listed = await bus.call(JOBS, PageQuery())
            if not hand_over:
                assert listed.total == 4
                return
            assert [r.job_id for r in listed.jobs] == ["j1", "j4"]  # the jobs still active
            assert (await bus.call(QUERY, JobQuery(job_ids=["j2"]))).jobs == []
            with pytest.raises(RemoteError) as refused:  # (taken and forgotten: gone)
                await bus.call(FINISHED, FinishedQuery(taken=1))
            assert refused.value.reply.field == "$.taken"
            await bus.call(CANCEL, CancelRequest(job_ids=["j4"], now=3.0))
            page = await bus.call(FINISHED, FinishedQuery(taken=2))
            assert [r.job_id for r in page.jobs] == ["j4"] and page.total == 3
        finally:
            await bus.close()


@pytest.mark.slow
async def test_results_taken_while_the_run_goes_are_those_taken_at_its_end(
    tmp_path: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver takes the jobs that ended every `TAKE_EVERY_S`: taken at every instant or
    only at the end, the same `jobs.csv` and summary."""
    jobs = blox(400, 30.0, 7, {1: 0.6, 2: 0.2, 4: 0.2}).jobs
    options = sim.SimOptions(cluster=ClusterSpec.parse("2x4"))

    async def run(name: str, every_s: float) -> tuple[tuple[bytes, dict], int]:
        monkeypatch.setattr(sim, "TAKE_EVERY_S", every_s)
        out = tmp_path / name
        result = await sim.simulate(
            options, jobs, out, nats_url=nats_url, plots=False, keep_jobs=False
        )
        assert result.jobs == []
        summary = {k: v for k, v in result.summary.items() if k != "wall_s"}
        handled = next(s.handled for s in result.stats if s.service == "scheduler")
        return ((out / "jobs.csv").read_bytes(), summary), handled

    often, handled_often = await run("often", 0.001)
    at_the_end, handled_at_the_end = await run("end", 3600.0)
    assert often == at_the_end
    assert often[1]["completed"] == 400
    assert handled_often > handled_at_the_end  # (it took jobs while the run went)

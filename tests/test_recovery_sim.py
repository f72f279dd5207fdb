"""Crash recovery in simulation: a durable run with one OS process per service; `kill -9` one of
admission, scheduler and placement mid-run and start it again: the run carries on to the end with
every job completed exactly once, and the same results as an uninterrupted run.

The policy is Tiresias: it keeps state between decisions (the counters of the jobs it promoted;
this workload promotes a dozen), which the scheduler stores with its jobs; without it a restarted
scheduler would decide differently."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import msgspec
import pytest

from gpuyard.run.launcher import ServiceSet
from gpuyard.run.simulate import SimOptions, simulate
from gpuyard.shared.contract import Progress
from gpuyard.shared.model import ClusterSpec, JobSpec
from gpuyard.workloads import blox

pytestmark = pytest.mark.slow  # (integration: `pytest -m "not slow"` leaves it out)

CLUSTER = ClusterSpec.parse("2x4")
POLICY = "tiresias"
PARAMS = {"thresholds": [3000.0], "promote_knob": 1.0}


def _jobs() -> list[JobSpec]:
    return list(blox(160, jobs_per_hour=8.0, seed=1).jobs)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the same workload, in memory, in one process, never interrupted."""
    out = tmp_path_factory.mktemp("plain")
    options = SimOptions(cluster=CLUSTER, policy=POLICY, policy_params=PARAMS)
    asyncio.run(simulate(options, _jobs(), out))
    return out


@pytest.mark.parametrize("victim", ["scheduler", "placement", "admission"])
async def test_a_service_killed_mid_simulation_restarts_and_the_run_goes_on(
    nats_url: str, tmp_path: Path, uninterrupted: Path, victim: str
) -> None:
    """The victim is killed once a third of the jobs have arrived and some have finished (the run
    is then at a third of its wall time, and every service still busy), whatever it is doing then
    (handling a request, or waiting for the next one), and started again 0.2 s later.

    Why the results are the same (jobs.csv byte for byte): the clock sends its request again until
    it is answered (and the services theirs to each other: inner calls time out before outer ones);
    the restarted service loads the state it stored before its last reply, and
    - a request whose effect was stored but not answered is answered from the stored state (the
      scheduler ignores exits of ended jobs and, its `dirty` flag and policy wake-up stored too, runs
      no second round; placement answers the same apply or nodes change with the stored reply;
      admission holds no job twice, and the scheduler enqueues no job twice);
    - a request that died before its write runs again on the state before it, at the same virtual
      time: the scheduler stored its jobs and its policy's state before the round's decision, so
      it decides the same way again and sends the same apply, which placement, if it had applied
      it, answers with the reply it stored.
    The node agents (the clock) take a relaunch of a part already running as a no-op at the same
    instant. Only events (a job.submitted published twice) and the services' request counters can
    tell that a service was restarted.
    """
    killed: dict[str, int] = {}
    tasks: list[asyncio.Task[None]] = []
    holder: list[ServiceSet] = []
    old: list[asyncio.subprocess.Process] = []

    async def restart(services: ServiceSet) -> None:
        await asyncio.sleep(0.2)
        await services.replace(victim)

    def on_progress(p: Progress) -> None:
        if not killed and not p.done and p.finished > 0 and p.submitted * 3 >= p.total:
            (services,) = holder
            proc = services.process(victim)
            os.kill(proc.pid, signal.SIGKILL)
            old.append(proc)
            killed["finished"] = p.finished
            tasks.append(asyncio.ensure_future(restart(services)))

    options = SimOptions(
        cluster=CLUSTER, policy=POLICY, policy_params=PARAMS, durable=True, call_timeout_s=0.5
    )
    result = await simulate(
        options, _jobs(), tmp_path, nats_url=nats_url, cluster_name=f"kill_{victim}",
        processes=True, on_progress=on_progress, on_services=holder.append,
    )  # fmt: skip
    await asyncio.gather(*tasks)
    assert killed, "the run ended before the kill"
    assert 0 < killed["finished"] < len(_jobs())
    assert await old[0].wait() == -signal.SIGKILL
    (stats,) = [s for s in result.stats if s.service == victim]
    assert stats.handled > 0  # the new process served the rest of the run
    # Every job ended exactly once, completed.
    ids = [j.job_id for j in result.jobs]
    assert sorted(ids) == sorted(j.job_id for j in _jobs())
    assert len(set(ids)) == len(ids)
    assert {j.state for j in result.jobs} == {"completed"}
    assert all(j.end_time is not None for j in result.jobs)
    # The same results as without the crash.
    plain = msgspec.json.decode((uninterrupted / "summary.json").read_bytes())
    assert result.summary["jobs"] == plain["jobs"]
    assert (tmp_path / "jobs.csv").read_bytes() == (uninterrupted / "jobs.csv").read_bytes()
